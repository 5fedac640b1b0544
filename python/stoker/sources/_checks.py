"""The argument rules datasets of every modality share (images, video, tables, LeRobot)."""

from __future__ import annotations

from .. import _native
from .._checks import check_positive_int, is_integral

DEFAULT_MAX_PIXELS = _native.image.DEFAULT_MAX_PIXELS  # PIL's Image.MAX_IMAGE_PIXELS (stoker/image/decode.h)


def check_max_pixels(max_pixels):
    return check_positive_int("max_pixels", max_pixels)


def check_index(index, n):
    """``index`` (negative ones from the end) checked against ``n`` samples."""
    if not is_integral(index):
        raise TypeError(f"index must be an integer, got {type(index).__name__}")
    i = int(index) + n if index < 0 else int(index)
    if not 0 <= i < n:
        raise IndexError(f"index {index} out of range for {n} samples")
    return i
