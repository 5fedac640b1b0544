"""Image transforms, run natively by Stoker's image datasets.

The transforms are descriptions, not Python code: ``ImageFolder``, ``TarShards`` and
``TableDataset`` hand them to the C++ pipeline, which decodes only the region the leading crops
and resizes need, runs the image transforms (colour, blur, warps, auto-augment) on the 8-bit
image in memory, and writes the final tensor (dtype, layout and normalisation fused in) straight
into the batch. Randomness is drawn with torchvision's rules from (seed, epoch, sample index), so
batches are bit-identical whatever the worker count.

A ``torchvision.transforms.v2`` pipeline (or v1) works as written: pass it as ``transform=``.
Stoker compiles the transforms it knows into the native pipeline (the names below, with
torchvision's arguments); from the first one it does not know, the rest runs in Python on each
image, with a one-line notice (``stats()["transforms"]`` says what ran where).

For batching, a pipeline must end in a fixed size: ``RandomResizedCrop``, ``CenterCrop``,
``RandomCrop`` or ``Resize((h, w))``, e.g. ``Compose([Resize(256), CenterCrop(224),
ToTensor()])``. Batch transforms (MixUp, CutMix) go to ``DataLoader(batch_transform=...)``.
"""

from __future__ import annotations

from ._augment import AutoAugment, RandAugment, RandomErasing, TrivialAugmentWide
from ._base import Compose, RandomApply, Transform
from ._color import ColorJitter, GaussianBlur, RandomGrayscale
from ._compile import Compiled, compile_transform
from ._geometry import (CenterCrop, Pad, RandomAffine, RandomCrop, RandomHorizontalFlip,
                        RandomResizedCrop, RandomRotation, RandomVerticalFlip, Resize)
from ._output import Normalize, ToDtype, ToTensor
from ..batch_transforms import CutMix, MixUp, RandomChoice  # DataLoader(batch_transform=...)

__all__ = ["AutoAugment", "CenterCrop", "ColorJitter", "Compose", "CutMix", "GaussianBlur",
           "MixUp", "Normalize", "Pad", "RandAugment", "RandomAffine", "RandomApply",
           "RandomChoice", "RandomCrop", "RandomErasing", "RandomGrayscale",
           "RandomHorizontalFlip", "RandomResizedCrop", "RandomRotation", "RandomVerticalFlip",
           "Resize", "ToDtype", "ToTensor", "TrivialAugmentWide"]


def _pipeline_spec(transform):
    """The native pipeline description of a transform that runs wholly natively (a Stoker
    transform, a list of them, or a torchvision pipeline Stoker knows every part of)."""
    compiled = compile_transform(transform)
    if compiled.python:
        raise ValueError(f"{compiled.python_names[0]} has no native form; this path needs a "
                         f"pipeline that runs wholly natively")
    return compiled.specs
