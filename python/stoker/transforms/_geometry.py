"""Crops, resizes, flips, padding and warps (torchvision's arguments and rules)."""

from __future__ import annotations

import math

from ._base import (Transform, byte_fill, check_interpolation, check_resize_interpolation, fill3,
                    float_pair, is_int, is_number, number_or_range, probability, size_pair)

PADDING_MODES = ("constant", "edge", "reflect", "symmetric")


def _round_tuple(values):
    return tuple(round(v, 4) for v in values)


class RandomResizedCrop(Transform):
    """A random crop of area fraction in ``scale`` and aspect ratio (w/h) in ``ratio``, resized
    to ``size`` with ``interpolation`` "bilinear" (default) or "bicubic": PIL's antialiased
    filters, bit for bit. ``antialias=False`` is torch's plain bilinear interpolation of tensors
    (what torchvision does to a tensor with antialias=False; bilinear only); PIL images are
    always antialiased."""

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), antialias=True,
                 interpolation="bilinear"):
        self.size = size_pair("RandomResizedCrop", size)
        self.scale = float_pair("RandomResizedCrop", "scale", scale)
        self.ratio = float_pair("RandomResizedCrop", "ratio", ratio)
        if not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise ValueError(f"RandomResizedCrop scale must satisfy 0 < min <= max <= 1, got "
                             f"{scale!r}")
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"RandomResizedCrop ratio must satisfy 0 < min <= max, got {ratio!r}")
        self.antialias = bool(antialias)
        self.interpolation = check_resize_interpolation("RandomResizedCrop", interpolation,
                                                        self.antialias)

    def _spec(self):
        return ("RandomResizedCrop", {"height": self.size[0], "width": self.size[1],
                                      "scale": self.scale, "ratio": self.ratio,
                                      "antialias": self.antialias,
                                      "interpolation": self.interpolation})

    def __repr__(self):
        aa = "" if self.antialias else ", antialias=False"
        return (f"{type(self).__name__}(size={self.size}, scale={_round_tuple(self.scale)}, "
                f"ratio={_round_tuple(self.ratio)}, interpolation={self.interpolation}{aa})")


class Resize(Transform):
    """``Resize(n)`` scales the shorter side to n (keeping the aspect ratio, as torchvision);
    ``Resize((h, w))`` resizes to exactly h x w. ``interpolation`` "bilinear" (default) or
    "bicubic", and ``antialias``, as RandomResizedCrop."""

    def __init__(self, size, antialias=True, interpolation="bilinear"):
        if is_int(size) or (isinstance(size, (tuple, list)) and len(size) == 1):
            n = size_pair("Resize", size)[0]
            self.size = int(size) if is_int(size) else [n]
            self._params = {"shorter_side": n, "height": 0, "width": 0}
        else:
            try:
                self.size = size_pair("Resize", size)
            except ValueError:
                raise ValueError(f"Resize size must be a positive int (the shorter side) or a "
                                 f"(height, width) pair of positive ints, got {size!r}") from None
            self._params = {"shorter_side": 0, "height": self.size[0], "width": self.size[1]}
        self.antialias = bool(antialias)
        self.interpolation = check_resize_interpolation("Resize", interpolation, self.antialias)

    def _spec(self):
        return ("Resize", {**self._params, "antialias": self.antialias,
                           "interpolation": self.interpolation})

    def __repr__(self):
        aa = "" if self.antialias else ", antialias=False"
        return f"{type(self).__name__}(size={self.size}, interpolation={self.interpolation}{aa})"


class CenterCrop(Transform):
    """The central ``size`` crop (zero padding where the image is smaller). Its offset is
    torchvision's ``round((H - h) / 2)`` (half to even), or with ``rounding="floor"`` Hugging
    Face image processors' ``(H - h) // 2``."""

    def __init__(self, size, rounding="round"):
        self.size = size_pair("CenterCrop", size)
        if rounding not in ("round", "floor"):
            raise ValueError(f'CenterCrop rounding must be "round" or "floor", got {rounding!r}')
        self.rounding = rounding

    def _spec(self):
        return ("CenterCrop", {"height": self.size[0], "width": self.size[1],
                               "floor": self.rounding == "floor"})

    def __repr__(self):
        r = "" if self.rounding == "round" else ", rounding='floor'"
        return f"{type(self).__name__}(size={self.size}{r})"


class RandomHorizontalFlip(Transform):
    """Flips left-right with probability ``p``."""

    def __init__(self, p=0.5):
        self.p = probability("RandomHorizontalFlip", p)

    def _spec(self):
        return ("RandomHorizontalFlip", {"p": self.p})

    def _repr_args(self):
        return {"p": self.p}


class RandomVerticalFlip(Transform):
    """Flips top-bottom with probability ``p``."""

    def __init__(self, p=0.5):
        self.p = probability("RandomVerticalFlip", p)

    def _spec(self):
        return ("RandomVerticalFlip", {"p": self.p})

    def _repr_args(self):
        return {"p": self.p}


def parse_padding(name, padding):
    """torchvision's padding: p (all sides), (left/right, top/bottom) or (left, top, right,
    bottom); returned as (left, top, right, bottom)."""
    if is_int(padding):
        padding = [padding]
    if (not isinstance(padding, (tuple, list)) or len(padding) not in (1, 2, 4)
            or not all(is_int(p) for p in padding)):
        raise ValueError(f"{name} padding must be an int or 1, 2 or 4 ints, got {padding!r}")
    p = [int(v) for v in padding]
    if any(v < 0 or v > 1 << 16 for v in p):
        raise ValueError(f"{name} padding must be between 0 and 65536, got {padding!r}")
    if len(p) == 1:
        return p[0], p[0], p[0], p[0]
    if len(p) == 2:
        return p[0], p[1], p[0], p[1]
    return tuple(p)


def check_padding_mode(name, mode):
    if mode not in PADDING_MODES:
        raise ValueError(f"{name} padding_mode must be one of {', '.join(PADDING_MODES)}, got "
                         f"{mode!r}")
    return mode


def _pad_params(ltrb, fill, mode):
    left, top, right, bottom = ltrb
    return {"left": left, "top": top, "right": right, "bottom": bottom, "fill": list(fill),
            "mode": mode}


class Pad(Transform):
    """Pads the image by ``padding`` (left/top/right/bottom, torchvision's forms) with ``fill``
    (constant mode) or by ``padding_mode`` "edge", "reflect" or "symmetric"."""

    def __init__(self, padding, fill=0, padding_mode="constant"):
        self.padding = parse_padding("Pad", padding)
        self.fill = byte_fill("Pad", fill)
        self.padding_mode = check_padding_mode("Pad", padding_mode)

    def _spec(self):
        return ("Pad", _pad_params(self.padding, self.fill, self.padding_mode))

    def _repr_args(self):
        return {"padding": self.padding, "fill": self.fill, "padding_mode": self.padding_mode}


class RandomCrop(Transform):
    """A ``size`` crop at a random place, after padding by ``padding`` (and, with
    ``pad_if_needed``, up to the crop's size), as torchvision's RandomCrop."""

    def __init__(self, size, padding=None, pad_if_needed=False, fill=0, padding_mode="constant"):
        self.size = size_pair("RandomCrop", size)
        self.padding = parse_padding("RandomCrop", padding) if padding else (0, 0, 0, 0)
        self.pad_if_needed = bool(pad_if_needed)
        self.fill = byte_fill("RandomCrop", fill)
        self.padding_mode = check_padding_mode("RandomCrop", padding_mode)

    def _spec(self):
        return ("RandomCrop", {"height": self.size[0], "width": self.size[1],
                               "pad_if_needed": self.pad_if_needed,
                               **_pad_params(self.padding, self.fill, self.padding_mode)})

    def _repr_args(self):
        return {"size": self.size, "padding": self.padding, "pad_if_needed": self.pad_if_needed,
                "fill": self.fill, "padding_mode": self.padding_mode}


def _center(name, center):
    if center is None:
        return None
    if (isinstance(center, (tuple, list)) and len(center) == 2
            and all(is_number(c) and math.isfinite(float(c)) for c in center)):
        return float(center[0]), float(center[1])
    raise ValueError(f"{name} center must be None or 2 numbers (x, y), got {center!r}")


class RandomRotation(Transform):
    """A rotation by an angle drawn from ``degrees`` (d: [-d, d]; or (min, max)), about
    ``center`` (default the image centre), with ``interpolation`` "nearest" or "bilinear" and
    ``fill`` outside the image; the size is kept (expand=False)."""

    def __init__(self, degrees, interpolation="nearest", expand=False, center=None, fill=0):
        self.degrees = number_or_range("RandomRotation", "degrees", degrees)
        self.interpolation = check_interpolation("RandomRotation", interpolation)
        if expand:
            raise ValueError("RandomRotation expand=True changes the image size per sample and "
                             "cannot be batched; use expand=False")
        self.center = _center("RandomRotation", center)
        self.fill = fill3("RandomRotation", fill)

    def _spec(self):
        return ("RandomRotation", {"degrees": self.degrees, "interpolation": self.interpolation,
                                   "fill": self.fill, "center": self.center})

    def _repr_args(self):
        return {"degrees": self.degrees, "interpolation": self.interpolation,
                "center": self.center, "fill": self.fill}


class RandomAffine(Transform):
    """torchvision's RandomAffine: rotation from ``degrees``, translation up to ``translate``
    (fractions of width and height), scale from ``scale``, shear from ``shear`` (x range, or x
    and y ranges), with ``interpolation``, ``fill`` and ``center``."""

    def __init__(self, degrees, translate=None, scale=None, shear=None, interpolation="nearest",
                 fill=0, center=None):
        name = "RandomAffine"
        self.degrees = number_or_range(name, "degrees", degrees)
        if translate is not None:
            translate = float_pair(name, "translate", translate)
            if not all(0 <= t <= 1 for t in translate):
                raise ValueError(f"{name} translate values must be between 0 and 1, got "
                                 f"{translate!r}")
        self.translate = translate
        if scale is not None:
            scale = float_pair(name, "scale", scale)
            if not 0 < scale[0] <= scale[1]:
                raise ValueError(f"{name} scale must satisfy 0 < min <= max, got {scale!r}")
        self.scale = scale
        self.shear = None
        if shear is not None:
            if is_number(shear) or (isinstance(shear, (tuple, list)) and len(shear) == 2):
                self.shear = number_or_range(name, "shear", shear)
            elif isinstance(shear, (tuple, list)) and len(shear) == 4:
                self.shear = (float_pair(name, "shear", shear[:2])
                              + float_pair(name, "shear", shear[2:]))
            else:
                raise ValueError(f"{name} shear must be a number or 2 or 4 numbers, got "
                                 f"{shear!r}")
        self.interpolation = check_interpolation(name, interpolation)
        self.fill = fill3(name, fill)
        self.center = _center(name, center)

    def _spec(self):
        shear_x = self.shear[:2] if self.shear else None
        shear_y = self.shear[2:] if self.shear and len(self.shear) == 4 else None
        return ("RandomAffine", {"degrees": self.degrees, "translate": self.translate,
                                 "scale": self.scale, "shear_x": shear_x, "shear_y": shear_y,
                                 "interpolation": self.interpolation, "fill": self.fill,
                                 "center": self.center})

    def _repr_args(self):
        return {"degrees": self.degrees, "translate": self.translate, "scale": self.scale,
                "shear": self.shear, "interpolation": self.interpolation, "fill": self.fill,
                "center": self.center}
