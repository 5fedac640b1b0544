"""Class-balanced epochs: the labels a stratified order groups samples by, and class weights.

``shuffle="stratified"`` makes every batch (of every rank) hold each class within one sample of
its share of the dataset, every sample exactly once an epoch. ``class_weights`` makes the epoch
draw the classes in given proportions instead (rare classes repeated, frequent ones subsampled,
no sample starved). The order is the engine's (``include/stoker/stratified_order.h``); this
module finds the labels and turns the weights into one number a class.
"""

from __future__ import annotations

import collections
import collections.abc
import numbers

import numpy as np

from . import _native

__all__ = ["SHUFFLE_MODES", "check_shuffle", "class_groups", "class_plan", "stratified_plan",
           "weights_for"]

SHUFFLE_MODES = (False, True, "stratified", "shards")

_NO_LABELS = (
    'shuffle="stratified" and class_weights need the class of every sample: pass labels= to the '
    'DataLoader, or use a dataset that has them (ImageFolder, TarShards, an ArrayDataset with a '
    'label array, or a dataset with a `targets` attribute, as torchvision\'s); {what}')


def check_shuffle(shuffle, class_weights):
    """Validates ``shuffle`` against ``class_weights``; True when the order is stratified."""
    if not (isinstance(shuffle, bool) or (isinstance(shuffle, str)
                                          and shuffle in ("stratified", "shards"))):
        raise ValueError(f'shuffle must be True, False, "stratified" or "shards", got '
                         f'{shuffle!r}')
    if class_weights is not None and shuffle in (False, "shards"):
        raise ValueError(f'class_weights draw a stratified order: pass shuffle=True or '
                         f'shuffle="stratified" with them, not shuffle={shuffle!r}')
    return shuffle == "stratified" or class_weights is not None


def _dataset_labels(dataset):
    from .sources.base import StokerDataset
    source = dataset._source if isinstance(dataset, StokerDataset) else None
    if isinstance(source, _native.sources.Source):
        native = source.labels()  # image folders and tar shards: from their index, no decode
        if native is not None:
            return native
    targets = getattr(dataset, "targets", None)
    if targets is None and hasattr(dataset, "indices") and hasattr(dataset, "dataset"):
        inner = _dataset_labels(dataset.dataset)  # torch.utils.data.Subset
        return np.asarray(inner)[np.asarray(dataset.indices, dtype=np.int64)]
    if targets is None:
        raise ValueError(_NO_LABELS.format(what=f"{type(dataset).__name__} has none"))
    return targets


def labels_of(dataset, labels=None):
    """The class of every sample of ``dataset`` as an int64 array, from ``labels`` when given,
    else from the dataset; no sample is read."""
    values = _dataset_labels(dataset) if labels is None else labels
    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"labels must be one integer a sample (a 1-D sequence), got shape "
                         f"{array.shape}")
    if array.dtype.kind not in "iub":
        integral = array.dtype.kind == "f" and np.all(np.isfinite(array)) and np.all(
            array == np.round(array))
        if integral:
            array = array.astype(np.int64)
        else:
            raise ValueError(f"labels must be integers (class indices or ids), got dtype "
                             f"{array.dtype}")
    if array.dtype.kind == "u" and array.size and int(array.max()) >= 2**63:
        raise ValueError("labels must fit in int64")
    n = len(dataset)
    if len(array) != n:
        raise ValueError(f"labels give {len(array)} classes for a dataset of {n} samples")
    return np.ascontiguousarray(array, dtype=np.int64)


def class_groups(dataset, labels=None):
    """The dataset's samples grouped by class (``_native.engine.ClassGroups``)."""
    return _native.engine.ClassGroups(labels_of(dataset, labels))


def weights_for(groups, class_weights):
    """One weight per class of ``groups`` (ascending labels), or [] for the dataset's shares.

    ``class_weights``: None; "balanced" (every class equally often: inverse frequency per
    sample); a mapping {label: weight} naming every class; or a sequence indexed by label."""
    if class_weights is None:
        return []
    labels = groups.labels
    if isinstance(class_weights, str):
        if class_weights != "balanced":
            raise ValueError(f'class_weights must be "balanced", a mapping {{label: weight}} or a '
                             f'sequence indexed by label, got {class_weights!r}')
        return [1.0] * len(labels)
    if isinstance(class_weights, collections.abc.Mapping):
        missing = [label for label in labels if label not in class_weights]
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
            raise ValueError(f"class_weights has no weight for the classes {shown} "
                             f"({len(missing)} of {len(labels)}); give every class a weight "
                             f"(0 leaves it out)")
        present = set(labels)
        absent = [k for k, w in class_weights.items() if k not in present and _weight(w, k) > 0]
        if absent:
            raise ValueError(f"class_weights names classes no sample has: "
                             f"{', '.join(map(str, absent[:10]))}")
        return [_weight(class_weights[label], label) for label in labels]
    if isinstance(class_weights, (collections.abc.Sequence, np.ndarray)) or hasattr(
            class_weights, "tolist"):
        seq = list(class_weights.tolist() if hasattr(class_weights, "tolist") else class_weights)
        bad = [label for label in labels if not 0 <= label < len(seq)]
        if bad:
            raise ValueError(f"class_weights is a sequence of {len(seq)} weights indexed by "
                             f"label, but some labels are outside [0, {len(seq)}): "
                             f"{', '.join(map(str, bad[:10]))}")
        return [_weight(seq[label], label) for label in labels]
    raise ValueError(f'class_weights must be "balanced", a mapping {{label: weight}} or a '
                     f'sequence indexed by label, got {type(class_weights).__name__}')


def _weight(w, label):
    if isinstance(w, bool) or not isinstance(w, numbers.Real) or not np.isfinite(w) or w < 0:
        raise ValueError(f"class_weights: the weight of class {label} must be a finite number "
                         f">= 0, got {w!r}")
    return float(w)


Stratified = collections.namedtuple("Stratified", "classes weights plan")


def stratified_plan(dataset, shuffle, class_weights, labels, seed, batch_size, drop_last, rank,
                    world_size):
    """The stratified order of a dataset read outside the native loader (a Python dataset):
    ``Stratified(classes, weights, plan)``, or None unless ``shuffle="stratified"`` or
    ``class_weights`` ask for one (other ``shuffle`` values are the caller's to check).
    ``len(plan)`` is the number of batches; ``plan.batch_indices(epoch, b)`` the samples of
    batch b, as the native loader's; ``plan.batch_draws(epoch, b)`` also each draw's cycle,
    which keys its randomness as (seed, cycle, index)."""
    if class_weights is None and not (isinstance(shuffle, str) and shuffle == "stratified"):
        return None
    check_shuffle(shuffle, class_weights)
    groups = class_groups(dataset, labels)
    weights = weights_for(groups, class_weights)
    plan = _native.engine.StratifiedPlan(groups, weights, seed, batch_size, drop_last, rank, world_size)
    return Stratified(groups, weights, plan)


def class_plan(groups, weights, draws, batch_size):
    """Per class: label, samples, draws per epoch (all ranks) and the expected count in a full
    batch."""
    counts = groups.counts
    total = sum(weights) if weights else sum(counts)
    shares = [w / total for w in weights] if weights else [c / total for c in counts]
    return [{"label": label, "samples": n, "draws_per_epoch": d, "per_batch": batch_size * s}
            for label, n, d, s in zip(groups.labels, counts, draws, shares)]
