"""torchvision-style image transforms, run natively by Stoker's image datasets.

The transforms are descriptions, not Python code: ``ImageFolder`` and ``TarShards`` hand them to
the C++ pipeline, which decodes only the region the geometric transforms need and writes the
final tensor (flip, dtype, layout and normalisation fused in) straight into the batch. Semantics
follow ``torchvision.transforms`` on PIL images with bilinear interpolation.

For batching, a pipeline must end in a fixed size: ``RandomResizedCrop``, ``CenterCrop`` or
``Resize((h, w))``, e.g. ``Compose([Resize(256), CenterCrop(224), ToTensor()])``.
"""

from __future__ import annotations

import math
import numbers

__all__ = ["CenterCrop", "Compose", "Normalize", "RandomHorizontalFlip", "RandomResizedCrop",
           "Resize", "ToTensor"]

_DTYPES = ("uint8", "float32", "float16", "bfloat16")
_LAYOUTS = ("CHW", "HWC")
_MAX_SIDE = 1 << 16


def _is_int(x):
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _size_pair(name, size, allow_single=True):
    """torchvision's size: an int n (square n x n) or a sequence (h, w) of positive ints."""
    if _is_int(size):
        h = w = int(size)
    elif isinstance(size, (tuple, list)) and len(size) == 1 and allow_single and _is_int(size[0]):
        h = w = int(size[0])
    elif isinstance(size, (tuple, list)) and len(size) == 2 and all(_is_int(s) for s in size):
        h, w = int(size[0]), int(size[1])
    else:
        raise ValueError(f"{name} size must be a positive int or a (height, width) pair of "
                         f"positive ints, got {size!r}")
    if h <= 0 or w <= 0:
        raise ValueError(f"{name} size must be a positive int or a (height, width) pair of "
                         f"positive ints, got {size!r}")
    if h > _MAX_SIDE or w > _MAX_SIDE:
        raise ValueError(f"{name} size must be at most {_MAX_SIDE}, got {size!r}")
    return h, w


def _float_pair(name, what, value):
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)):
        raise ValueError(f"{name} {what} must be a (min, max) pair of numbers, got {value!r}")
    lo, hi = float(value[0]), float(value[1])
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"{name} {what} must be finite, got {value!r}")
    return lo, hi


class Transform:
    """Base of Stoker's transforms; ``_spec()`` is the native pipeline's description."""

    def _spec(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def _specs(self):
        return [self._spec()]


class RandomResizedCrop(Transform):
    """A random crop of area fraction in ``scale`` and aspect ratio (w/h) in ``ratio``, resized
    to ``size``."""

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
        self.size = _size_pair("RandomResizedCrop", size)
        self.scale = _float_pair("RandomResizedCrop", "scale", scale)
        self.ratio = _float_pair("RandomResizedCrop", "ratio", ratio)
        if not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise ValueError(f"RandomResizedCrop scale must satisfy 0 < min <= max <= 1, got "
                             f"{scale!r}")
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"RandomResizedCrop ratio must satisfy 0 < min <= max, got {ratio!r}")

    def _spec(self):
        return ("RandomResizedCrop", *self.size, *self.scale, *self.ratio)

    def __repr__(self):
        s = tuple(round(v, 4) for v in self.scale)
        r = tuple(round(v, 4) for v in self.ratio)
        return (f"{type(self).__name__}(size={self.size}, scale={s}, ratio={r}, "
                f"interpolation=bilinear)")


class Resize(Transform):
    """``Resize(n)`` scales the shorter side to n (keeping the aspect ratio, as torchvision);
    ``Resize((h, w))`` resizes to exactly h x w."""

    def __init__(self, size):
        if _is_int(size) or (isinstance(size, (tuple, list)) and len(size) == 1):
            n = _size_pair("Resize", size)[0]
            self.size = int(size) if _is_int(size) else [n]
            self._args = (n,)
        else:
            try:
                self.size = _size_pair("Resize", size)
            except ValueError:
                raise ValueError(f"Resize size must be a positive int (the shorter side) or a "
                                 f"(height, width) pair of positive ints, got {size!r}") from None
            self._args = self.size

    def _spec(self):
        return ("Resize", *self._args)

    def __repr__(self):
        return f"{type(self).__name__}(size={self.size}, interpolation=bilinear)"


class CenterCrop(Transform):
    """The central ``size`` crop (zero padding where the image is smaller)."""

    def __init__(self, size):
        self.size = _size_pair("CenterCrop", size)

    def _spec(self):
        return ("CenterCrop", *self.size)

    def __repr__(self):
        return f"{type(self).__name__}(size={self.size})"


class RandomHorizontalFlip(Transform):
    """Flips left-right with probability ``p``."""

    def __init__(self, p=0.5):
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= p <= 1:
            raise ValueError(f"RandomHorizontalFlip p must be a number in [0, 1], got {p!r}")
        self.p = float(p)

    def _spec(self):
        return ("RandomHorizontalFlip", self.p)

    def __repr__(self):
        return f"{type(self).__name__}(p={self.p})"


class ToTensor(Transform):
    """The output tensor: ``dtype`` "uint8" keeps 0..255, float dtypes hold value / 255;
    ``layout`` "CHW" (torchvision's) or "HWC"."""

    def __init__(self, dtype="float32", layout="CHW"):
        if dtype not in _DTYPES:
            raise ValueError(f"ToTensor dtype must be one of {', '.join(map(repr, _DTYPES))}, "
                             f"got {dtype!r}")
        if layout not in _LAYOUTS:
            raise ValueError(f"ToTensor layout must be 'CHW' or 'HWC', got {layout!r}")
        self.dtype = dtype
        self.layout = layout

    def _spec(self):
        return ("ToTensor", self.dtype, self.layout)

    def __repr__(self):
        return f"{type(self).__name__}(dtype={self.dtype!r}, layout={self.layout!r})"


class Normalize(Transform):
    """``(x - mean) / std`` per channel, after a float ``ToTensor``."""

    def __init__(self, mean, std):
        def triple(what, v):
            if isinstance(v, numbers.Real) and not isinstance(v, bool):
                v = (v, v, v)
            if (not isinstance(v, (tuple, list)) or len(v) != 3
                    or not all(isinstance(x, numbers.Real) and not isinstance(x, bool) for x in v)
                    or not all(math.isfinite(float(x)) for x in v)):
                raise ValueError(f"Normalize {what} must be 3 finite numbers (R, G, B), got {v!r}")
            return tuple(float(x) for x in v)

        self.mean = triple("mean", mean)
        self.std = triple("std", std)
        if any(s == 0 for s in self.std):
            raise ValueError(f"Normalize std must be non-zero, got {std!r}")

    def _spec(self):
        return ("Normalize", self.mean, self.std)

    def __repr__(self):
        return f"{type(self).__name__}(mean={list(self.mean)}, std={list(self.std)})"


class Compose(Transform):
    """Transforms applied in order."""

    def __init__(self, transforms):
        transforms = list(transforms)
        for t in transforms:
            if not isinstance(t, Transform):
                raise ValueError(
                    f"Compose takes stoker.transforms objects (RandomResizedCrop, Resize, "
                    f"CenterCrop, RandomHorizontalFlip, ToTensor, Normalize), got {t!r}")
        self.transforms = transforms

    def _specs(self):
        return [s for t in self.transforms for s in t._specs()]

    def __repr__(self):
        lines = [f"{type(self).__name__}("]
        lines += [f"    {t}" for t in self.transforms]
        return "\n".join(lines) + "\n)"


def _pipeline_spec(transform):
    """The native pipeline description of ``transform`` (a Transform, or a list of them)."""
    if isinstance(transform, (list, tuple)):
        transform = Compose(transform)
    if not isinstance(transform, Transform):
        raise ValueError(
            f"transform must be a stoker.transforms transform (e.g. Compose([Resize(256), "
            f"CenterCrop(224), ToTensor()])), got {transform!r}")
    return transform._specs()
