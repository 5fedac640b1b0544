"""A batch transform (MixUp, CutMix: :mod:`stoker.batch_transforms`) with ``device="cuda"``: it
runs on the GPU, after the copy, on the batch as the loader made it.

Why there: the copy then moves the images once, as the workers wrote them (a CPU mix would only
add a pass over every batch on the host), and the blend is one kernel on the device. The
parameters are not drawn here: for each CPU batch, before its copy, the C++ engine's own function
(``_native.engine.BatchTransform.draw``, keyed by (seed, epoch, the batch's first global
position), as the CPU path keys them) draws them, so the GPU batches equal the CPU path's
batches, parameter for parameter. The labels are checked on the CPU there too (a GPU check would
make the host wait for the device).

The pieces, around the feed of gpu/feed.py:

- :meth:`DeviceMixing.tag`: the CPU batches, each as ``(batch, params)``;
- :meth:`DeviceMixing.stage`: a copy stage that copies ``batch`` with the loader's copy stage and
  carries ``params`` past it (so a GPU decode stage sees its own batches);
- :meth:`DeviceMixing.finish`: the feed's GPU batches, transformed by :func:`mix_batch` on the
  consumer's current stream after the feed handed them over: ``(images, soft_labels)``.

:func:`mix_batch` is torchvision v2's arithmetic (``roll(1, 0).mul_(1 - lam).add_(x.mul(lam))``)
in torch, so on CPU tensors it gives the C++ path's bits; tests check it there.
"""

from __future__ import annotations

__all__ = ["DeviceMixing", "mix_batch", "check_labels"]


def check_labels(labels, num_classes, name):
    """Raises ValueError naming the first label outside [0, num_classes) (a CPU tensor or
    array of class indices)."""
    import torch
    labels = torch.as_tensor(labels)
    bad = (labels < 0) | (labels >= num_classes)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"label {int(labels[row])} (row {row} of the batch) is not a class of "
                         f"{name}: labels must lie in [0, num_classes) = [0, {num_classes})")


def mix_batch(images, labels, params, num_classes, layout):
    """``(images, soft_labels)`` of one batch by ``params`` (a ``BatchMixParams``): images
    ([n, 3, H, W] for layout "CHW", [n, H, W, 3] for "HWC") are mixed in place; labels are class
    indices (int64 [n]), which become float32 [n, num_classes]. Any device."""
    import torch
    lam = params.label_lam
    soft = torch.nn.functional.one_hot(labels.long(), num_classes).to(torch.float32)
    soft = soft.roll(1, 0).mul_(1.0 - lam).add_(soft.mul(lam))
    if params.kind == "MixUp":
        if not images.is_floating_point():
            raise ValueError(f"MixUp blends images, which {images.dtype} cannot hold: make float "
                             f'images, e.g. ToTensor(dtype="float32")')
        # torchvision: rolled * (1 - lam) + own * lam; each product rounded, then the sum (the
        # sum's operands commute exactly).
        rolled = images.roll(1, 0).mul_(1.0 - params.lam)
        images.mul_(params.lam).add_(rolled)
    else:
        x1, y1, x2, y2 = params.box
        if x2 > x1 and y2 > y1:
            every = slice(None)
            box = (every, every, slice(y1, y2), slice(x1, x2)) if layout == "CHW" else \
                (every, slice(y1, y2), slice(x1, x2), every)
            images[box] = images[box].roll(1, 0)
    return images, soft


class DeviceMixing:
    """A loader's batch transform on the device (see the module docstring).

    Args:
        native: the ``_native.engine.BatchTransform`` (its draw() keys the parameters).
        seed: the loader's seed.
        layout: "CHW" or "HWC", the images' layout.
        image_shape: one image's shape, as the loader makes it.
        plan_of: cursor -> the iteration's ``_native.engine.BatchPlan`` (its first_position(b)
            is batch b's key).
    """

    def __init__(self, native, seed, layout, image_shape, plan_of):
        self.native = native
        self.seed = seed
        self.layout = layout
        h, w = (image_shape[1], image_shape[2]) if layout == "CHW" else image_shape[:2]
        self.height, self.width = int(h), int(w)
        self.plan_of = plan_of
        self.name = repr(native)

    def tag(self, batches, cursor):
        return _Tagged(self, batches, cursor)

    def stage(self, stage):
        return _TaggedStage(stage)

    def finish(self, feed):
        return _Mixed(self, feed)

    def params(self, epoch, plan, batch):
        return self.native.draw(self.seed, epoch, plan.first_position(batch), self.height,
                                self.width)

    def apply(self, gpu, params):
        images, labels = gpu[0], gpu[1]
        return mix_batch(images, labels, params, self.native.num_classes, self.layout)


class _Tagged:
    """The CPU batches as (batch, params), batch b of the iteration keyed as the C++ engine keys it.
    Its own count of batches: the feed rewinds the cursor to what the consumer has, while it
    pulls ahead."""

    def __init__(self, mixing, batches, cursor):
        self._mixing = mixing
        self._batches = batches
        self._epoch = cursor.epoch
        self._next = cursor.batch
        self._plan = mixing.plan_of(cursor)

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._batches)

    def __next__(self):
        b = self._next
        try:
            batch = next(self._batches)
        except StopIteration:
            raise
        except Exception:
            self._next = b + 1  # a failed batch counts as delivered, as the loader counts it
            raise
        self._next = b + 1
        check_labels(batch[1], self._mixing.native.num_classes, self._mixing.name)
        return batch, self._mixing.params(self._epoch, self._plan, b)


class _TaggedStage:
    """Copies the batch of a (batch, params) pair with the loader's copy stage; params ride
    along."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):  # default_cap, fences, stats, ...: the loader's copy stage's
        return getattr(self._inner, name)

    def copy(self, tagged):
        batch, params = tagged
        gpu, event, nbytes, fences = self._inner.copy(batch)
        return (gpu, params), event, nbytes, fences

    def hand_over(self, tagged, event):
        self._inner.hand_over(tagged[0], event)


class _Mixed:
    """The feed's batches, transformed on the consumer's current stream once handed over."""

    def __init__(self, mixing, feed):
        self._mixing = mixing
        self._feed = feed

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._feed)

    def __next__(self):
        gpu, params = next(self._feed)
        return self._mixing.apply(gpu, params)

    def close(self):
        self._feed.close()
