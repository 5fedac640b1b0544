"""Batch transforms: MixUp, CutMix and a random choice between them, for
``stoker.DataLoader(dataset, ..., batch_transform=...)`` over an image dataset with labels.

Semantics are ``torchvision.transforms.v2``'s MixUp, CutMix and RandomChoice on a batch
``(images, labels)``: the labels become one-hot float32 rows of ``num_classes``, mixed with the
same lambda as the images; MixUp blends each image with the one before it in the batch (the batch
rolled by one), CutMix pastes the previous image's box (torchvision's box rule) and adjusts lambda
to the area left; lambda ~ Beta(alpha, alpha), one draw (and box) per batch. A loader yields
``(images, soft_labels)``.

Like :mod:`stoker.transforms`, these classes are descriptions: the engine runs them in C++, on the
worker thread that finishes each batch (include/stoker/batch_transform.h), or, with
``device="cuda"``, on the GPU after the copy (:mod:`stoker.gpu.batch_transform`), with the
parameters drawn by the same C++ function, so the two agree. The draws come from Stoker's
counter-based generator keyed by (seed, epoch, batch), so batches do not depend on num_workers
and a resumed loader reproduces them. torchvision's own ``v2.MixUp``, ``v2.CutMix`` and
``v2.RandomChoice`` of them are accepted too: their parameters are read from the objects.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

from ._checks import is_integral

__all__ = ["CutMix", "MixUp", "RandomChoice"]


def _alpha(name, alpha):
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or \
            not (math.isfinite(float(alpha)) and float(alpha) > 0):
        raise ValueError(f"{name} alpha must be a positive finite number (lambda ~ Beta(alpha, "
                         f"alpha)), got {alpha!r}")
    return float(alpha)


def _num_classes(name, num_classes):
    if num_classes is None:
        raise ValueError(f"{name} needs num_classes: a Stoker batch's labels are class indices, "
                         f"made one-hot over num_classes (torchvision needs it for them too)")
    if not is_integral(num_classes) or \
            num_classes < 1:
        raise ValueError(f"{name} num_classes must be a positive integer, got {num_classes!r}")
    return int(num_classes)


def _labels_getter(name, labels_getter):
    if not (isinstance(labels_getter, str) and labels_getter == "default"):
        raise ValueError(f"{name} labels_getter={labels_getter!r} is not supported: a Stoker "
                         f"batch is (images, labels), whose labels the default getter finds")


class BatchTransform:
    """Base of Stoker's batch transforms."""


class _MixTransform(BatchTransform):
    def __init__(self, *, alpha=1.0, num_classes=None, labels_getter="default"):
        name = type(self).__name__
        self.alpha = _alpha(name, alpha)
        self.num_classes = _num_classes(name, num_classes)
        _labels_getter(name, labels_getter)
        self.labels_getter = labels_getter

    def __repr__(self):
        return f"{type(self).__name__}(alpha={self.alpha}, num_classes={self.num_classes})"


class MixUp(_MixTransform):
    """Each image becomes ``lam * itself + (1 - lam) * the previous image`` of the batch (the
    first mixes with the last), and so do the one-hot labels; ``lam ~ Beta(alpha, alpha)``, one
    draw per batch. Needs float images (``ToTensor(dtype="float32")`` or float16/bfloat16).

    Args (keyword-only, as torchvision's): alpha, num_classes (required: the labels are class
    indices), labels_getter (only "default").
    """


class CutMix(_MixTransform):
    """A box of the previous image of the batch is pasted over each image (the first takes the
    last's): ``lam ~ Beta(alpha, alpha)``, centre uniform over the image, half-sides
    ``int(r * W)`` and ``int(r * H)`` for ``r = sqrt(1 - lam) / 2``, clamped to the image; the
    one-hot labels mix with ``1 - box area / image area``. Works on uint8 images too.

    Args: as :class:`MixUp`.
    """


class RandomChoice(BatchTransform):
    """One of ``transforms`` (MixUp and CutMix objects, Stoker's or torchvision's) per batch,
    picked with probability ``p`` (normalized; None: equally likely), as torchvision's
    ``v2.RandomChoice``."""

    def __init__(self, transforms, p=None):
        if isinstance(transforms, (str, bytes)) or not hasattr(transforms, "__len__"):
            raise TypeError("RandomChoice transforms must be a sequence of MixUp and CutMix")
        transforms = list(transforms)
        if not transforms:
            raise ValueError("RandomChoice needs at least one transform")
        if p is None:
            p = [1] * len(transforms)
        p = list(p)
        if len(p) != len(transforms):
            raise ValueError(f"Length of p doesn't match the number of transforms: {len(p)} != "
                             f"{len(transforms)}")
        for x in p:
            if isinstance(x, bool) or not isinstance(x, numbers.Real) or \
                    not (math.isfinite(float(x)) and float(x) >= 0):
                raise ValueError(f"RandomChoice p must be non-negative numbers, got {p!r}")
        total = float(sum(p))
        if total <= 0:
            raise ValueError(f"RandomChoice p must not sum to 0, got {p!r}")
        for t in transforms:
            _not_nested(t)
            _choice(t)  # each one MixUp or CutMix, read now so errors come at construction
        self.transforms = transforms
        self.p = [float(x) / total for x in p]

    def __repr__(self):
        inner = ", ".join(repr(t) for t in self.transforms)
        return f"RandomChoice([{inner}], p={self.p})"


# ---- what the loader runs ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Spec:
    """A batch transform as the engine takes it: ``choices`` [(kind, alpha, weight), ...] and
    ``num_classes``; ``name`` describes it for messages."""
    choices: tuple
    num_classes: int
    name: str

    @property
    def mixes_images(self):
        """Whether some choice blends images (MixUp), which uint8 cannot hold."""
        return any(kind == "MixUp" for kind, _, _ in self.choices)

    def native(self, layout):
        from . import _native
        return _native.engine.BatchTransform(list(self.choices), self.num_classes, layout)


def _torchvision_kind(obj):
    """"MixUp", "CutMix", "RandomChoice" for torchvision.transforms.v2's classes, else None."""
    cls = type(obj)
    if not cls.__module__.startswith("torchvision.transforms.v2"):
        return None
    return cls.__name__ if cls.__name__ in ("MixUp", "CutMix", "RandomChoice") else None


def _not_nested(t):
    if isinstance(t, RandomChoice) or _torchvision_kind(t) == "RandomChoice":
        raise ValueError("a RandomChoice inside a RandomChoice is not supported: list its "
                         "transforms in the outer one, with their probabilities multiplied")


def _choice(t):
    """(kind, alpha, num_classes) of one MixUp or CutMix, Stoker's or torchvision's."""
    if type(t) in (MixUp, CutMix):
        return type(t).__name__, t.alpha, t.num_classes
    kind = _torchvision_kind(t)
    if kind in ("MixUp", "CutMix"):
        from torchvision.transforms.v2 import _utils as tv_utils
        name = f"torchvision's {kind}"
        if getattr(t, "_labels_getter", None) is not tv_utils._find_labels_default_heuristic:
            raise ValueError(f"{name} has a custom labels_getter, which Stoker cannot run: a "
                             f"Stoker batch is (images, labels); leave labels_getter at "
                             f'"default"')
        return kind, _alpha(name, t.alpha), _num_classes(name, t.num_classes)
    raise ValueError(f"batch_transform takes MixUp, CutMix or a RandomChoice of them (Stoker's "
                     f"or torchvision.transforms.v2's), got {t!r}")


def parse(batch_transform):
    """The :class:`Spec` of ``batch_transform`` (ValueError naming what cannot be honoured)."""
    if isinstance(batch_transform, RandomChoice) or \
            _torchvision_kind(batch_transform) == "RandomChoice":
        transforms, p = list(batch_transform.transforms), list(batch_transform.p)
        if not transforms or len(p) != len(transforms):
            raise ValueError(f"batch_transform {batch_transform!r} has no transforms or a p of "
                             f"another length")
        for t in transforms:
            _not_nested(t)
        choices = [_choice(t) for t in transforms]
        classes = {c for _, _, c in choices}
        if len(classes) != 1:
            raise ValueError(f"batch_transform: the transforms of a RandomChoice must share "
                             f"num_classes, got {sorted(classes)}")
        weights = [float(x) for x in p]
        if any(not (math.isfinite(w) and w >= 0) for w in weights) or sum(weights) <= 0:
            raise ValueError(f"batch_transform: RandomChoice p must be non-negative and not all "
                             f"0, got {p!r}")
        return Spec(tuple((k, a, w) for (k, a, _), w in zip(choices, weights)), classes.pop(),
                    repr(batch_transform))
    kind, alpha, classes = _choice(batch_transform)
    return Spec(((kind, alpha, 1.0),), classes, f"{kind}(alpha={alpha}, num_classes={classes})")
