"""The output tensor: dtype, layout, scaling and normalisation, fused into the write to the
batch."""

from __future__ import annotations

import math

from ._base import Transform, is_number

DTYPES = ("uint8", "float32", "float16", "bfloat16")
LAYOUTS = ("CHW", "HWC")


def dtype_name(name, dtype):
    """A dtype as its name: "float32", or torch.float32 / numpy.float32 alike."""
    text = str(dtype).replace("torch.", "")
    text = {"float": "float32", "half": "float16"}.get(text, text)
    if text not in DTYPES:
        raise ValueError(f"{name} dtype must be one of {', '.join(map(repr, DTYPES))}, got "
                         f"{dtype!r}")
    return text


class ToTensor(Transform):
    """The output tensor: ``dtype`` "uint8" keeps 0..255, float dtypes hold value / 255;
    ``layout`` "CHW" (torchvision's) or "HWC"."""

    def __init__(self, dtype="float32", layout="CHW"):
        if dtype not in DTYPES:
            raise ValueError(f"ToTensor dtype must be one of {', '.join(map(repr, DTYPES))}, "
                             f"got {dtype!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"ToTensor layout must be 'CHW' or 'HWC', got {layout!r}")
        self.dtype = dtype
        self.layout = layout
        self.scale = True

    def _spec(self):
        return ("ToTensor", {"dtype": self.dtype, "layout": self.layout, "scale": self.scale})

    def __repr__(self):
        return f"{type(self).__name__}(dtype={self.dtype!r}, layout={self.layout!r})"


class ToDtype(ToTensor):
    """torchvision's ToDtype(dtype, scale): the output tensor in ``dtype`` (CHW), its values
    divided by 255 when ``scale`` and the dtype is a float one."""

    def __init__(self, dtype, scale=False):
        super().__init__(dtype_name("ToDtype", dtype))
        self.scale = bool(scale) or self.dtype == "uint8"

    def __repr__(self):
        return f"{type(self).__name__}(dtype={self.dtype!r}, scale={self.scale})"


class Normalize(Transform):
    """``(x - mean) / std`` per channel, after a float ``ToTensor``."""

    def __init__(self, mean, std):
        def triple(what, v):
            if is_number(v):
                v = (v, v, v)
            if (not isinstance(v, (tuple, list)) or len(v) != 3
                    or not all(is_number(x) for x in v)
                    or not all(math.isfinite(float(x)) for x in v)):
                raise ValueError(f"Normalize {what} must be 3 finite numbers (R, G, B), got {v!r}")
            return tuple(float(x) for x in v)

        self.mean = triple("mean", mean)
        self.std = triple("std", std)
        if any(s == 0 for s in self.std):
            raise ValueError(f"Normalize std must be non-zero, got {std!r}")

    def _spec(self):
        return ("Normalize", {"mean": list(self.mean), "std": list(self.std)})

    def __repr__(self):
        return f"{type(self).__name__}(mean={list(self.mean)}, std={list(self.std)})"
