"""The integer rules every argument check shares, written once.

A bool is an int to Python, so each check excludes it. This module imports nothing from stoker,
so any module (the native-free ones too) may import it without a cycle.
"""

from __future__ import annotations

import numbers


def is_int(x):
    """A Python int that is not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_integral(x):
    """An integer of any kind (a Python or NumPy integer) that is not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_positive_int(name, value):
    """``value`` if it is a positive int, else ValueError naming ``name``."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value
