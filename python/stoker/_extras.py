"""Optional dependencies: the extras of pyproject.toml's [project.optional-dependencies].

``require("ray", "ray")`` imports an optional module where a feature first needs it (never at
``import stoker``), or raises ImportError saying which extra installs it. The original
ImportError is the ``__cause__``: a module that is installed but fails to import (a broken
build, a missing system library) shows why.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(module: str, extra: str, feature: str | None = None) -> ModuleType:
    """Returns the imported `module`, or raises ImportError naming ``pip install 'stoker[extra]'``.

    `feature` names what needs it in the message (``"stoker.RayOffload"``); by default the extra.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.partition(".")[0]
        what = feature or f"stoker[{extra}]"
        raise ImportError(f"{what} needs {top}, which is not installed: "
                          f"pip install 'stoker[{extra}]'") from e
