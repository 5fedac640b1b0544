"""Colour, grayscale and blur (torchvision's arguments and rules)."""

from __future__ import annotations

import math

from ._base import Transform, is_int, is_number, probability


def _jitter_range(name, what, value, center, bound, clip_first_on_zero):
    """torchvision ColorJitter._check_input: a number v gives [center - v, center + v] (the
    lower end clipped at 0 for the factors), a pair is taken as it is; a range that is the
    identity is None (not applied)."""
    if is_number(value):
        if value < 0:
            raise ValueError(f"{name} {what}, a single number, must be non-negative, got "
                             f"{value!r}")
        lo, hi = center - float(value), center + float(value)
        if clip_first_on_zero:
            lo = max(lo, 0.0)
    elif (isinstance(value, (tuple, list)) and len(value) == 2
          and all(is_number(v) for v in value)):
        lo, hi = float(value[0]), float(value[1])
    else:
        raise ValueError(f"{name} {what} must be a number or a (min, max) pair, got {value!r}")
    if not (bound[0] <= lo <= hi <= bound[1]) or not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"{name} {what} values should be between {bound}, got {value!r}")
    return None if lo == hi == center else (lo, hi)


class ColorJitter(Transform):
    """Brightness, contrast, saturation and hue, each by a factor drawn from its range, in a
    random order (torchvision's ColorJitter: ``brightness=0.4`` means [0.6, 1.4], ``hue=0.1``
    means [-0.1, 0.1])."""

    def __init__(self, brightness=0, contrast=0, saturation=0, hue=0):
        inf = math.inf
        self.brightness = _jitter_range("ColorJitter", "brightness", brightness, 1, (0, inf), True)
        self.contrast = _jitter_range("ColorJitter", "contrast", contrast, 1, (0, inf), True)
        self.saturation = _jitter_range("ColorJitter", "saturation", saturation, 1, (0, inf),
                                        True)
        self.hue = _jitter_range("ColorJitter", "hue", hue, 0, (-0.5, 0.5), False)

    def _spec(self):
        return ("ColorJitter", {"brightness": self.brightness, "contrast": self.contrast,
                                "saturation": self.saturation, "hue": self.hue})

    def _repr_args(self):
        return {"brightness": self.brightness, "contrast": self.contrast,
                "saturation": self.saturation, "hue": self.hue}


class RandomGrayscale(Transform):
    """With probability ``p``, every channel becomes the luma (0.2989 R + 0.587 G + 0.114 B)."""

    def __init__(self, p=0.1):
        self.p = probability("RandomGrayscale", p)

    def _spec(self):
        return ("RandomGrayscale", {"p": self.p})

    def _repr_args(self):
        return {"p": self.p}


class GaussianBlur(Transform):
    """A Gaussian blur with an odd ``kernel_size`` (int, or (width, height)) and a sigma drawn
    from ``sigma`` (a number, or (min, max)); reflect padding at the borders."""

    def __init__(self, kernel_size, sigma=(0.1, 2.0)):
        if is_int(kernel_size):
            kernel_size = (kernel_size, kernel_size)
        if (not isinstance(kernel_size, (tuple, list)) or len(kernel_size) != 2
                or not all(is_int(k) and k > 0 and k % 2 == 1 and k <= 1023
                           for k in kernel_size)):
            raise ValueError(f"GaussianBlur kernel_size must be an odd positive int (at most "
                             f"1023) or two of them (width, height), got {kernel_size!r}")
        self.kernel_size = (int(kernel_size[0]), int(kernel_size[1]))
        if is_number(sigma):
            sigma = (sigma, sigma)
        if (not isinstance(sigma, (tuple, list)) or len(sigma) != 2
                or not all(is_number(s) and math.isfinite(float(s)) for s in sigma)
                or not 0 < sigma[0] <= sigma[1]):
            raise ValueError(f"GaussianBlur sigma must be a positive number or a (min, max) pair "
                             f"with 0 < min <= max, got {sigma!r}")
        self.sigma = (float(sigma[0]), float(sigma[1]))

    def _spec(self):
        return ("GaussianBlur", {"kernel_width": self.kernel_size[0],
                                 "kernel_height": self.kernel_size[1], "sigma": self.sigma})

    def _repr_args(self):
        return {"kernel_size": self.kernel_size, "sigma": self.sigma}
