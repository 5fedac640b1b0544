"""A transform as the image datasets run it: the native part (Stoker's transforms, or
torchvision's compiled into them) and what is left for Python.

``compile_transform(t)`` takes a :mod:`stoker.transforms` pipeline, a ``torchvision.transforms``
(v2 or v1) pipeline, or a mix, flattened through ``Compose``. Every transform of the list that
Stoker knows, with parameters it supports, becomes a Stoker transform; the first one it does not
know ends the native part, and it and everything after it run in Python on each decoded image
(a torchvision v2 transform receives a ``tv_tensors.Image`` of uint8, anything else a PIL
image, as torchvision's own ImageFolder hands it). The result says which ran where.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ._augment import AutoAugment, RandAugment, RandomErasing, TrivialAugmentWide
from ._base import Compose, RandomApply, Transform
from ._color import ColorJitter, GaussianBlur, RandomGrayscale
from ._geometry import (CenterCrop, Pad, RandomAffine, RandomCrop, RandomHorizontalFlip,
                        RandomResizedCrop, RandomRotation, RandomVerticalFlip, Resize)
from ._output import Normalize, ToDtype, ToTensor

# Transforms whose place in a pipeline is the output tensor (after every image transform).
_OUTPUT = (ToTensor, Normalize)


@dataclass
class Compiled:
    """``native``: Stoker transforms, run in C++ (their specs: ``specs``); ``python``: the
    transforms after them, as given, run in Python on each image (empty: all native);
    ``native_names`` / ``python_names``: what ran where, for ``stats()`` and the notice;
    ``alpha``: what decoding does with a PNG's transparency, "drop" (torchvision's loader) or
    "white" (composited on white, for a transform that declares ``decode_alpha = "white"``, as
    the Hugging Face processors of stoker.image_text do)."""
    native: list = field(default_factory=list)
    python: list = field(default_factory=list)
    native_names: list = field(default_factory=list)
    python_names: list = field(default_factory=list)
    alpha: str = "drop"

    @property
    def specs(self):
        return [s for t in self.native for s in t._specs()]

    def report(self):
        return {"native": list(self.native_names), "python": list(self.python_names)}


class _Skip:
    """A torchvision transform with nothing to do natively (PILToTensor, ToImage, ToPureTensor:
    the native pipeline's image is already a uint8 tensor)."""


_SKIP = _Skip()


def _is_torchvision(t):
    return type(t).__module__.startswith("torchvision.transforms")


def _tv_name(t):
    return type(t).__name__


def _flatten(t):
    """The leaves of a pipeline in order: Compose (Stoker's or torchvision's) and lists are
    opened; RandomApply stays one item."""
    if isinstance(t, (list, tuple)):
        return [x for item in t for x in _flatten(item)]
    if isinstance(t, Compose):
        return [x for item in t.transforms for x in _flatten(item)]
    if _is_torchvision(t) and _tv_name(t) == "Compose":
        return [x for item in t.transforms for x in _flatten(item)]
    return [t]


def _interp(value):
    """torchvision's interpolation as "nearest"/"bilinear", or None (not native)."""
    v = getattr(value, "value", value)
    if isinstance(v, str) and v.lower() in ("nearest", "bilinear"):
        return v.lower()
    if isinstance(v, int):  # a PIL constant: 0 nearest, 2 bilinear
        return {0: "nearest", 2: "bilinear"}.get(v)
    return None


def _resize_interp(t):
    """A torchvision resize's interpolation as "bilinear" or "bicubic" (PIL's filters, as
    torchvision applies them to PIL images), or None (not native): bicubic without antialias is
    torch's own kernel (a = -0.75), not PIL's."""
    v = getattr(t.interpolation, "value", t.interpolation)
    if isinstance(v, int) and not isinstance(v, bool):
        v = {2: "bilinear", 3: "bicubic"}.get(v)
    if not isinstance(v, str) or v.lower() not in ("bilinear", "bicubic"):
        return None
    if v.lower() == "bicubic" and getattr(t, "antialias", True) is False:
        return None
    return v.lower()


def _tv_fill(t):
    """The fill torchvision uses for an image: its per-type dict (v2: _fill) or plain value."""
    fill = getattr(t, "_fill", getattr(t, "fill", None))
    if isinstance(fill, dict):
        for key, value in fill.items():
            if getattr(key, "__name__", key) in ("Image", "Tensor", "others"):
                return value
        return None
    return fill


def _tv_dtype(t):
    dtype = t.dtype
    if isinstance(dtype, dict):
        for key, value in dtype.items():
            if getattr(key, "__name__", key) in ("Image", "Tensor", "others") and value is not None:
                return value
        return None
    return dtype


def _from_torchvision(t):
    """The Stoker transform of a torchvision transform, _SKIP, or None when Stoker has no
    native equivalent of it with these parameters (it then runs in Python)."""
    name = _tv_name(t)
    try:
        if name == "RandomResizedCrop":
            interp = _resize_interp(t)
            if interp is None:
                return None
            antialias = getattr(t, "antialias", True)
            return RandomResizedCrop(list(t.size), t.scale, t.ratio,
                                     antialias=antialias is not False, interpolation=interp)
        if name == "Resize":
            interp = _resize_interp(t)
            if interp is None or getattr(t, "max_size", None) is not None:
                return None
            size = t.size
            if size is None:
                return None
            antialias = getattr(t, "antialias", True)
            return Resize(size, antialias=antialias is not False, interpolation=interp)
        if name == "CenterCrop":
            return CenterCrop(list(t.size))
        if name == "RandomHorizontalFlip":
            return RandomHorizontalFlip(t.p)
        if name == "RandomVerticalFlip":
            return RandomVerticalFlip(t.p)
        if name == "Pad":
            return Pad(t.padding, _tv_fill(t), t.padding_mode)
        if name == "RandomCrop":
            padding = t.padding
            if padding and type(t).__module__.startswith("torchvision.transforms.v2"):
                # v2 keeps its padding parsed, as [left, right, top, bottom]
                padding = [padding[0], padding[2], padding[1], padding[3]]
            return RandomCrop(list(t.size), padding, t.pad_if_needed, _tv_fill(t),
                              t.padding_mode)
        if name == "ColorJitter":
            return ColorJitter(t.brightness or 0, t.contrast or 0, t.saturation or 0, t.hue or 0)
        if name == "RandomGrayscale":
            return RandomGrayscale(t.p)
        if name == "GaussianBlur":
            return GaussianBlur(tuple(t.kernel_size), tuple(t.sigma))
        if name == "RandomRotation":
            interp = _interp(t.interpolation)
            if interp is None or t.expand:
                return None
            return RandomRotation(tuple(t.degrees), interp, False, t.center, _tv_fill(t))
        if name == "RandomAffine":
            interp = _interp(t.interpolation)
            if interp is None:
                return None
            return RandomAffine(tuple(t.degrees), t.translate, t.scale, t.shear, interp,
                                _tv_fill(t), t.center)
        if name == "TrivialAugmentWide":
            interp = _interp(t.interpolation)
            return interp and TrivialAugmentWide(t.num_magnitude_bins, interp, _tv_fill(t))
        if name == "RandAugment":
            interp = _interp(t.interpolation)
            return interp and RandAugment(t.num_ops, t.magnitude, t.num_magnitude_bins, interp,
                                          _tv_fill(t))
        if name == "AutoAugment":
            interp = _interp(t.interpolation)
            return interp and AutoAugment(t.policy, interp, _tv_fill(t))
        if name == "RandomErasing":
            value = "random" if t.value is None or t.value == "random" else t.value
            return RandomErasing(t.p, tuple(t.scale), tuple(t.ratio), value)
        if name in ("PILToTensor", "ToImage", "ToPureTensor"):
            return _SKIP
        if name == "ToTensor":  # v1's and v2's deprecated one: PILToTensor + scaled float32
            return ToDtype("float32", scale=True)
        if name == "ToDtype":
            dtype = _tv_dtype(t)
            return None if dtype is None else ToDtype(dtype, scale=t.scale)
        if name == "ConvertImageDtype":
            return ToDtype(t.dtype, scale=True)
        if name == "Normalize":
            return Normalize(list(t.mean), list(t.std))
        if name == "RandomApply":
            inner = [_convert(x) for x in _flatten(list(t.transforms))]
            if any(x is None for x in inner):
                return None
            inner = [x for x in inner if x is not _SKIP]
            if not inner or any(isinstance(x, _OUTPUT) for x in inner):
                return None
            return RandomApply(inner, t.p)
    except (ValueError, TypeError, AttributeError):
        return None  # parameters Stoker does not take natively: torchvision runs it
    return None


def _convert(t):
    if isinstance(t, Transform):
        return t
    if _is_torchvision(t):
        return _from_torchvision(t)
    return None


def _name(t):
    return type(t).__name__


def _is_output(converted, before):
    """Whether a converted transform belongs to the output tensor: ToTensor, Normalize, or a
    RandomErasing after a ToTensor."""
    return isinstance(converted, _OUTPUT) or (
        isinstance(converted, RandomErasing) and any(isinstance(x, ToTensor) for x in before))


def compile_transform(transform):
    """The :class:`Compiled` form of ``transform``; ValueError for what cannot run at all."""
    items = _flatten(transform)
    converted = []
    for t in items:
        c = _convert(t)
        if c is None:
            if not callable(t):
                raise ValueError(f"transform must be a stoker.transforms or torchvision "
                                 f"transform (or a callable), got {t!r}")
            break
        converted.append(c)
    split = len(converted)
    if split < len(items):
        # Python takes the image from the first transform Stoker cannot run; the native part
        # then also stops before the output conversion (it hands Python an 8-bit image).
        kept = [c for c in converted if c is not _SKIP]
        for k, c in enumerate(converted):
            if c is not _SKIP and _is_output(c, kept[:kept.index(c)]):
                split = k
                break
    out = Compiled()
    for t, c in zip(items[:split], converted[:split]):
        if c is not _SKIP:
            out.native.append(c)
            out.native_names.append(_name(t))
    out.python = items[split:]
    for t in out.python:
        if isinstance(t, Transform):
            raise ValueError(
                f"{t!r} would run after {_name(items[len(converted)])}, which has no native form "
                f"and runs in Python; Stoker's transforms run natively only before it (use "
                f"torchvision's equivalent there)")
    out.python_names = [_name(t) for t in out.python]
    out.alpha = getattr(transform, "decode_alpha", "drop")
    return out


def python_input_kind(python):
    """What the Python part takes first: "tensor" (a torchvision v2 transform) or "pil"."""
    first = python[0]
    module = type(first).__module__
    return "tensor" if module.startswith("torchvision.transforms.v2") else "pil"


def describe_cost(native_ms, python_ms):
    if native_ms is None or python_ms is None or not math.isfinite(python_ms):
        return ""
    return (f" (on the first image: {python_ms:.2f} ms in Python after {native_ms:.2f} ms "
            f"native)")
