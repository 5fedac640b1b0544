"""What every Stoker transform shares: the spec it hands to the native pipeline, argument checks
with torchvision's rules, Compose and RandomApply."""

from __future__ import annotations

import math
import numbers

from .._checks import is_integral as is_int  # transforms take NumPy integers too

_MAX_SIDE = 1 << 16
INTERPOLATIONS = ("nearest", "bilinear")
RESIZE_INTERPOLATIONS = ("bilinear", "bicubic")


def is_number(x):
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def size_pair(name, size, allow_single=True):
    """torchvision's size: an int n (square n x n) or a sequence (h, w) of positive ints."""
    if is_int(size):
        h = w = int(size)
    elif isinstance(size, (tuple, list)) and len(size) == 1 and allow_single and is_int(size[0]):
        h = w = int(size[0])
    elif isinstance(size, (tuple, list)) and len(size) == 2 and all(is_int(s) for s in size):
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


def float_pair(name, what, value):
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or not all(is_number(v) for v in value)):
        raise ValueError(f"{name} {what} must be a (min, max) pair of numbers, got {value!r}")
    lo, hi = float(value[0]), float(value[1])
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"{name} {what} must be finite, got {value!r}")
    return lo, hi


def number_or_range(name, what, value, center=None, bound=(-math.inf, math.inf)):
    """A number v (the range center - v .. center + v, or -v .. v without a center) or a
    (min, max) pair, within `bound`."""
    if is_number(value):
        v = float(value)
        if v < 0:
            raise ValueError(f"{name} {what}, a single number, must be non-negative, got {value!r}")
        lo, hi = ((center - v, center + v) if center is not None else (-v, v))
    else:
        lo, hi = float_pair(name, what, value)
    if not (bound[0] <= lo <= hi <= bound[1]):
        raise ValueError(f"{name} {what} must be a range within [{bound[0]}, {bound[1]}], got "
                         f"{value!r}")
    return lo, hi


def probability(name, p):
    if not is_number(p) or not 0 <= p <= 1:
        raise ValueError(f"{name} p must be a number in [0, 1], got {p!r}")
    return float(p)


def check_interpolation(name, value):
    """"nearest" or "bilinear" (torchvision's InterpolationMode of those names is accepted)."""
    v = getattr(value, "value", value)  # InterpolationMode.BILINEAR.value == "bilinear"
    if isinstance(v, str) and v.lower() in INTERPOLATIONS:
        return v.lower()
    raise ValueError(f"{name} interpolation must be \"nearest\" or \"bilinear\" (natively), got "
                     f"{value!r}")


def check_resize_interpolation(name, value, antialias):
    """"bilinear" or "bicubic" (PIL's filters; torchvision's InterpolationMode or a PIL constant,
    2 or 3, are accepted); bicubic needs antialias (torch's plain bicubic is another kernel)."""
    v = getattr(value, "value", value)
    if isinstance(v, int) and not isinstance(v, bool):
        v = {2: "bilinear", 3: "bicubic"}.get(v, v)
    if not (isinstance(v, str) and v.lower() in RESIZE_INTERPOLATIONS):
        raise ValueError(f"{name} interpolation must be \"bilinear\" or \"bicubic\" "
                         f"(natively), got {value!r}")
    v = v.lower()
    if v == "bicubic" and not antialias:
        raise ValueError(f"{name}: antialias=False is bilinear only (torch's plain bicubic is "
                         f"not PIL's)")
    return v


def fill3(name, fill, allow_none=True):
    """A fill: None (where allowed), a number, or 1 or 3 numbers, as 3 floats."""
    if fill is None:
        if not allow_none:
            raise ValueError(f"{name} fill must be a number or 3 numbers, got None")
        return None
    if is_number(fill):
        fill = [fill]
    if (isinstance(fill, (tuple, list)) and len(fill) in (1, 3)
            and all(is_number(v) and math.isfinite(float(v)) for v in fill)):
        vals = [float(v) for v in fill]
        return tuple(vals * 3) if len(vals) == 1 else tuple(vals)
    raise ValueError(f"{name} fill must be None, a number or 3 numbers (R, G, B), got {fill!r}")


def byte_fill(name, fill):
    """A padding fill of an 8-bit image: 1 or 3 integers in [0, 255]."""
    vals = fill3(name, fill, allow_none=False)
    if not all(0 <= v <= 255 and float(v).is_integer() for v in vals):
        raise ValueError(f"{name} fill must be integers in [0, 255] for 8-bit images, got "
                         f"{fill!r}")
    return tuple(int(v) for v in vals)


class Transform:
    """Base of Stoker's transforms. They are descriptions, not Python code: ``_spec()`` is the
    native pipeline's (name, params) pair (bindings/image.cc reads it)."""

    def _spec(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def _specs(self):
        return [self._spec()]

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self._repr_args().items())
        return f"{type(self).__name__}({args})"

    def _repr_args(self):
        return {}


class Compose(Transform):
    """Transforms applied in order."""

    def __init__(self, transforms):
        transforms = list(transforms)
        for t in transforms:
            if not isinstance(t, Transform):
                raise ValueError(
                    f"Compose takes stoker.transforms objects, got {t!r}; a torchvision "
                    f"pipeline goes to the dataset as it is (transform=v2.Compose([...]))")
        self.transforms = transforms

    def _specs(self):
        return [s for t in self.transforms for s in t._specs()]

    def __repr__(self):
        lines = [f"{type(self).__name__}("]
        lines += [f"    {t!r}".replace("\n", "\n    ") for t in self.transforms]
        return "\n".join(lines) + "\n)"


class RandomApply(Transform):
    """``transforms`` applied together with probability ``p``, or none of them (torchvision's
    RandomApply). They must be transforms of the image (not ToTensor or Normalize)."""

    def __init__(self, transforms, p=0.5):
        self.transforms = Compose(transforms).transforms
        if not self.transforms:
            raise ValueError("RandomApply needs at least one transform")
        self.p = probability("RandomApply", p)

    def _specs(self):
        inner = [s for t in self.transforms for s in t._specs()]
        return [("RandomApply", {"p": self.p, "count": len(inner)})] + inner

    def __repr__(self):
        inner = ", ".join(repr(t) for t in self.transforms)
        return f"{type(self).__name__}([{inner}], p={self.p})"
