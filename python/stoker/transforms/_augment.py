"""The auto-augment family and random erasing (torchvision's arguments and rules)."""

from __future__ import annotations

import math

from ._base import (Transform, check_interpolation, fill3, float_pair, is_int, is_number,
                    probability)

POLICIES = ("imagenet", "cifar10", "svhn")


def _bins(name, num_magnitude_bins):
    if not is_int(num_magnitude_bins) or not 2 <= num_magnitude_bins <= 1 << 16:
        raise ValueError(f"{name} num_magnitude_bins must be an int between 2 and 65536, got "
                         f"{num_magnitude_bins!r}")
    return int(num_magnitude_bins)


class TrivialAugmentWide(Transform):
    """One operation of TrivialAugment's wide space (identity, shears, translations, rotation,
    brightness, colour, contrast, sharpness, posterize, solarize, autocontrast, equalize),
    uniformly, at a uniformly drawn magnitude of ``num_magnitude_bins``."""

    def __init__(self, num_magnitude_bins=31, interpolation="nearest", fill=None):
        self.num_magnitude_bins = _bins("TrivialAugmentWide", num_magnitude_bins)
        self.interpolation = check_interpolation("TrivialAugmentWide", interpolation)
        self.fill = fill3("TrivialAugmentWide", fill)

    def _spec(self):
        return ("TrivialAugmentWide", {"num_magnitude_bins": self.num_magnitude_bins,
                                       "interpolation": self.interpolation, "fill": self.fill})

    def _repr_args(self):
        return {"num_magnitude_bins": self.num_magnitude_bins,
                "interpolation": self.interpolation, "fill": self.fill}


class RandAugment(Transform):
    """``num_ops`` operations of RandAugment's space, each drawn uniformly, at magnitude
    ``magnitude`` of ``num_magnitude_bins``."""

    def __init__(self, num_ops=2, magnitude=9, num_magnitude_bins=31, interpolation="nearest",
                 fill=None):
        if not is_int(num_ops) or not 0 <= num_ops <= 64:
            raise ValueError(f"RandAugment num_ops must be an int between 0 and 64, got "
                             f"{num_ops!r}")
        self.num_ops = int(num_ops)
        self.num_magnitude_bins = _bins("RandAugment", num_magnitude_bins)
        if not is_int(magnitude) or not 0 <= magnitude < self.num_magnitude_bins:
            raise ValueError(f"RandAugment magnitude must be an int in [0, num_magnitude_bins), "
                             f"got {magnitude!r}")
        self.magnitude = int(magnitude)
        self.interpolation = check_interpolation("RandAugment", interpolation)
        self.fill = fill3("RandAugment", fill)

    def _spec(self):
        return ("RandAugment", {"num_ops": self.num_ops, "magnitude": self.magnitude,
                                "num_magnitude_bins": self.num_magnitude_bins,
                                "interpolation": self.interpolation, "fill": self.fill})

    def _repr_args(self):
        return {"num_ops": self.num_ops, "magnitude": self.magnitude,
                "num_magnitude_bins": self.num_magnitude_bins,
                "interpolation": self.interpolation, "fill": self.fill}


class AutoAugment(Transform):
    """AutoAugment with a learned ``policy`` ("imagenet", "cifar10" or "svhn"; torchvision's
    AutoAugmentPolicy is accepted): one of its 25 sub-policies, each of its two operations
    applied with its probability."""

    def __init__(self, policy="imagenet", interpolation="nearest", fill=None):
        p = getattr(policy, "value", policy)
        if not isinstance(p, str) or p.lower() not in POLICIES:
            raise ValueError(f"AutoAugment policy must be one of {', '.join(POLICIES)}, got "
                             f"{policy!r}")
        self.policy = p.lower()
        self.interpolation = check_interpolation("AutoAugment", interpolation)
        self.fill = fill3("AutoAugment", fill)

    def _spec(self):
        return ("AutoAugment", {"policy": self.policy, "interpolation": self.interpolation,
                                "fill": self.fill})

    def _repr_args(self):
        return {"policy": self.policy, "interpolation": self.interpolation, "fill": self.fill}


class RandomErasing(Transform):
    """With probability ``p``, a rectangle of area fraction in ``scale`` and aspect ratio in
    ``ratio`` set to ``value`` (a number, 3 numbers, or "random" for standard normal noise), in
    the units of the tensor where it stands: after ToTensor and Normalize (torchvision's recipe),
    normalized units."""

    def __init__(self, p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0, inplace=False):
        self.p = probability("RandomErasing", p)
        self.scale = float_pair("RandomErasing", "scale", scale)
        if not 0 <= self.scale[0] <= self.scale[1] <= 1:
            raise ValueError(f"RandomErasing scale must satisfy 0 <= min <= max <= 1, got "
                             f"{scale!r}")
        self.ratio = float_pair("RandomErasing", "ratio", ratio)
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"RandomErasing ratio must satisfy 0 < min <= max, got {ratio!r}")
        if value == "random":
            self.value = "random"
        else:
            if is_number(value):
                value = [value]
            if (not isinstance(value, (tuple, list)) or len(value) not in (1, 3)
                    or not all(is_number(v) and math.isfinite(float(v)) for v in value)):
                raise ValueError(f"RandomErasing value must be a number, 3 numbers or "
                                 f"\"random\", got {value!r}")
            vals = [float(v) for v in value]
            self.value = tuple(vals * 3 if len(vals) == 1 else vals)
        self.inplace = bool(inplace)  # accepted for torchvision's signature: always in place

    def _spec(self):
        random = self.value == "random"
        return ("RandomErasing", {"p": self.p, "scale": self.scale, "ratio": self.ratio,
                                  "value": [0.0, 0.0, 0.0] if random else list(self.value),
                                  "random_value": random})

    def _repr_args(self):
        return {"p": self.p, "scale": self.scale, "ratio": self.ratio, "value": self.value}
