"""What a batch is made of (Python datasets): collation, and a batch's way through shared memory.

One collation path. ``collate(samples, collate_fn, writer)`` is what torch's DataLoader computes:
``collate_fn(samples)``, or with the default collate, ``default_collate(samples)``'s value, faster:
when every sample has sample 0's structure and leaf types (checked in C++:
``_native.pydata.gather_columns``), each array leaf is one ``torch.stack(..., out=)`` straight into memory
from ``writer``, and number columns go through NumPy. Samples that differ, or shapes that do not
stack, are collated by ``default_collate`` itself, so values and errors are torch's. In the
training process the writer allocates ordinary tensors; in a worker it carves the batch's slot of
the shared arena, so the stacked leaves are already where the training process reads them.

A batch crosses from a worker as an ``EncodedBatch``: ``encode`` flattens it into its structure,
its arrays (each in the slot: written there by collate, or copied; pickled only when no slot was
free or the batch does not fit) and its other leaves (pickled). ``decode`` rebuilds it in the
training process with tensors viewing the slot, without a copy.

Structures: the batch tree of stoker/pydata/column_gatherer.h, which defines it (its nodes, and the
tags, exported as ``_native.pydata.TREE_TAGS``); ``flatten`` builds it, ``rebuild`` reads it.
"""

from __future__ import annotations

import collections.abc
import dataclasses

import numpy as np
import torch
from torch.utils.data._utils.collate import default_collate, default_convert

from .. import _native

_ALIGN = _native.pydata.LEAF_ALIGNMENT
# In the training process, leaves above this many elements are stacked with NumPy: torch.stack
# would wake torch's intra-op thread pool, whose threads compete with the workers. Below it torch
# copies on the calling thread (at::internal::GRAIN_SIZE) and is faster (~0.15 us a tensor).
_SERIAL_STACK_ELEMENTS = 32768
_NOT_IN_NUMPY = (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.complex32)
_TENSOR, _NDARRAY, _OBJECT, _MAPPING, _NAMEDTUPLE, _TUPLE, _SEQUENCE = (
    _native.pydata.TREE_TAGS[name]
    for name in ("tensor", "ndarray", "object", "mapping", "namedtuple", "tuple", "sequence"))
_ARRAY_LEAF = (_TENSOR, _NDARRAY)


def flatten(obj, arrays, objects):
    """The structure of ``obj``; its array leaves appended to ``arrays``, others to ``objects``."""
    if isinstance(obj, torch.Tensor) and obj.layout == torch.strided and not obj.is_nested:
        arrays.append(obj)
        return (_TENSOR, len(arrays) - 1, obj.dtype, tuple(obj.shape))
    if type(obj) is np.ndarray and obj.dtype.kind in "biufc" and obj.dtype.isnative:
        arrays.append(obj)
        return (_NDARRAY, len(arrays) - 1, obj.dtype.str, obj.shape)
    if isinstance(obj, (str, bytes)):
        pass
    elif isinstance(obj, collections.abc.Mapping):
        keys = tuple(obj.keys())
        return (_MAPPING, type(obj), keys, tuple(flatten(obj[k], arrays, objects) for k in keys))
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return (_NAMEDTUPLE, type(obj), tuple(flatten(v, arrays, objects) for v in obj))
    elif isinstance(obj, tuple):
        return (_TUPLE, tuple(flatten(v, arrays, objects) for v in obj))
    elif isinstance(obj, list):
        return (_SEQUENCE, type(obj), tuple(flatten(v, arrays, objects) for v in obj))
    objects.append(obj)
    return (_OBJECT, len(objects) - 1, type(obj))


def rebuild(node, arrays, objects, collated):
    """The structure with its leaves put back. ``collated``: shaped as default_collate shapes a
    batch of samples of this structure (tuples become lists); otherwise exactly as flattened."""
    tag = node[0]
    if tag in _ARRAY_LEAF:
        return arrays[node[1]]
    if tag == _OBJECT:
        return objects[node[1]]
    if tag == _MAPPING:
        _, kind, keys, children = node
        d = {k: rebuild(c, arrays, objects, collated) for k, c in zip(keys, children)}
        if kind is dict:
            return d
        try:
            return kind(d)
        except TypeError:
            return d
    if tag == _NAMEDTUPLE:
        return node[1](*(rebuild(c, arrays, objects, collated) for c in node[2]))
    if tag == _TUPLE:
        items = [rebuild(c, arrays, objects, collated) for c in node[1]]
        return items if collated else tuple(items)
    kind, items = node[1], [rebuild(c, arrays, objects, collated) for c in node[2]]
    if kind is list:
        return items
    try:
        return kind(items)
    except TypeError:
        return items


# -- writers: where collated leaves go ------------------------------------------------------------

class HeapWriter:
    """Collated leaves as ordinary tensors (the training process, threads)."""

    main_process = True

    def empty(self, dtype, shape):
        return torch.empty(shape, dtype=dtype)


class SlotWriter:
    """Collated leaves carved from one slot of the shared arena (a worker process): the bytes
    [offset, offset + capacity) of ``arena`` (a uint8 tensor over the whole arena)."""

    main_process = False

    def __init__(self, arena, offset, capacity):
        self.arena, self.offset, self.capacity = arena, offset, capacity
        self.used = 0

    def empty(self, dtype, shape):
        """A tensor in the slot, or None when it does not fit."""
        n = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        at = (self.used + _ALIGN - 1) // _ALIGN * _ALIGN
        if at + n > self.capacity:
            return None
        self.used = at + n
        start = self.offset + at
        return self.arena[start:start + n].view(dtype).view(shape)

    def place(self, t):
        """(offset in the slot, nbytes) of tensor ``t`` when its memory is this slot's."""
        if t.numel() == 0:
            return (0, 0)
        if not t.is_contiguous():
            return None
        base = self.arena.data_ptr() + self.offset
        at = t.data_ptr() - base
        n = t.element_size() * t.numel()
        return (at, n) if 0 <= at and at + n <= self.capacity else None


# -- collation ----------------------------------------------------------------------------------

def _columns(samples):
    """(structure of sample 0, its array leaves, array columns, object columns), or None when a
    sample differs from sample 0 in structure or leaf types."""
    arrays0, objects0 = [], []
    struct = flatten(samples[0], arrays0, objects0)
    got = _native.pydata.gather_columns(
        struct, samples, tuple(type(a) for a in arrays0), tuple(type(o) for o in objects0),
        tuple(None if isinstance(a, torch.Tensor) else a.dtype for a in arrays0))
    return None if got is None else (struct, arrays0, *got)


def _stack(col, a, writer):
    """The leaves of column ``col`` (leaves like ``a``) stacked into one tensor from ``writer``."""
    dtype = a.dtype if isinstance(a, torch.Tensor) else torch.from_numpy(a[:0]).dtype
    out = writer.empty(dtype, (len(col), *a.shape))
    if out is None:  # no room left in the slot: an ordinary tensor (encode pickles it)
        out = torch.empty((len(col), *a.shape), dtype=dtype)
    if isinstance(a, torch.Tensor) and (not writer.main_process or a.dtype in _NOT_IN_NUMPY
                                        or out.numel() < _SERIAL_STACK_ELEMENTS):
        torch.stack(col, out=out)
    else:
        if isinstance(a, torch.Tensor):
            col = [t.detach().numpy() for t in col]
        np.stack(col, out=out.numpy())
    return out


def _collate_column(col):
    """default_collate of a column of one object leaf. Python ints or floats (gather_columns
    checked that every sample's leaf has sample 0's exact type) go through NumPy: the same int64
    or float64 tensor as torch.tensor(col), 5x faster. Anything else, and ints beyond int64
    (torch's own overflow error), through default_collate."""
    kind = type(col[0])
    if kind is int or kind is float:
        try:
            return torch.from_numpy(np.array(col, np.int64 if kind is int else np.float64))
        except OverflowError:
            pass
    return default_collate(col)


def default_collate_fast(samples, writer):
    """default_collate(samples)'s value; array leaves stacked straight into ``writer``'s memory
    when every sample has sample 0's structure and leaf types, else default_collate's own."""
    got = _columns(samples)
    if got is not None:
        struct, arrays0, columns, ocolumns = got
        try:
            arrays = [_stack(col, a, writer) for col, a in zip(columns, arrays0)]
        except (RuntimeError, ValueError, TypeError):
            arrays = None  # shapes differ: default_collate raises torch's own error
        if arrays is not None:
            return rebuild(struct, arrays, [_collate_column(c) for c in ocolumns], collated=True)
    return default_collate(samples)


def _padded(values, multiple, pad):
    """``values`` (one leaf of every sample) stacked, padded along the first dimension to the
    longest rounded up to ``multiple``, with their lengths; None where they are not arrays or
    tensors of one rank and one trailing shape that differ in length."""
    if not values or not all(isinstance(v, (torch.Tensor, np.ndarray)) for v in values):
        return None
    shapes = {tuple(v.shape[1:]) for v in values}
    if values[0].ndim == 0 or len(shapes) != 1 or len({v.ndim for v in values}) != 1:
        return None
    lengths = [v.shape[0] for v in values]
    if len(set(lengths)) == 1:
        return None
    longest = -(-max(lengths) // multiple) * multiple
    tensors = [torch.as_tensor(v) for v in values]
    out = torch.full((len(values), longest, *tensors[0].shape[1:]), pad, dtype=tensors[0].dtype)
    for row, t in enumerate(tensors):
        out[row, :t.shape[0]] = t
    return out, torch.tensor(lengths, dtype=torch.int64)


def pad_collate(samples, pad_to_multiple_of=1):
    """The default collate of a loader batching by a ``stoker.Budget``: torch's default collate,
    but leaves of unequal lengths (sequences, a document's token ids, audio) are padded along
    their first dimension to the batch's longest (rounded up to ``pad_to_multiple_of``) with 0,
    ``labels`` with -100. Dict samples with ``input_ids`` also get ``attention_mask`` (1 on
    tokens, 0 on padding) where they have none."""
    first = samples[0]
    if isinstance(first, collections.abc.Mapping):
        out = {}
        for key in first:
            values = [s[key] for s in samples]
            got = _padded(values, pad_to_multiple_of, -100 if key == "labels" else 0)
            out[key] = default_collate(values) if got is None else got[0]
        if "input_ids" in out and "attention_mask" not in out:
            ids = [s["input_ids"] for s in samples]
            lengths = torch.tensor([len(x) for x in ids], dtype=torch.int64)
            positions = torch.arange(out["input_ids"].shape[1])
            out["attention_mask"] = (positions[None, :] < lengths[:, None]).long()
        return out
    if isinstance(first, (tuple, list)):
        columns = list(zip(*samples))
        out = []
        for values in columns:
            got = _padded(list(values), pad_to_multiple_of, 0)
            out.append(default_collate(list(values)) if got is None else got[0])
        return type(first)(out) if isinstance(first, tuple) and not hasattr(first, "_fields") \
            else out
    got = _padded(list(samples), pad_to_multiple_of, 0)
    return default_collate(samples) if got is None else got[0]


def collate(samples, collate_fn, auto_collation, writer):
    """The batch of ``samples`` as torch's DataLoader makes it: ``collate_fn`` (None: the default
    collate) of the list of samples, or, without auto-collation (batch_size=None), of the one
    sample (default: default_convert)."""
    if not auto_collation:
        return (collate_fn or default_convert)(samples[0])
    if collate_fn is None:
        return default_collate_fast(samples, writer)
    return collate_fn(samples)


# -- crossing processes ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SlotLeaf:
    """An array leaf in the batch's slot: ``nbytes`` at ``offset`` from the slot's start."""
    offset: int
    nbytes: int
    dtype: object  # torch dtype, or NumPy dtype str when ``numpy``
    shape: tuple
    numpy: bool


@dataclasses.dataclass(frozen=True)
class InlineLeaf:
    """An array leaf that travels pickled (no slot, or no room left in it)."""
    array: object


@dataclasses.dataclass(frozen=True)
class EncodedBatch:
    structure: tuple
    leaves: list  # SlotLeaf | InlineLeaf, the structure's array leaves in order
    objects: list  # the other leaves

    @property
    def slot_bytes(self):
        return sum(leaf.nbytes for leaf in self.leaves if isinstance(leaf, SlotLeaf))


def encode(batch, writer):
    """``batch`` (a collated batch) as it travels: array leaves in ``writer``'s slot (None: no
    slot; they are pickled), the rest pickled."""
    arrays, objects = [], []
    structure = flatten(batch, arrays, objects)
    leaves = []
    for a in arrays:
        leaf = None
        if writer is not None:
            t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
            place = writer.place(t)
            if place is None:
                copy = writer.empty(t.dtype, tuple(t.shape))
                if copy is not None:
                    copy.copy_(t)
                    place = writer.place(copy)
            if place is not None:
                is_numpy = not isinstance(a, torch.Tensor)
                leaf = SlotLeaf(place[0], place[1], a.dtype.str if is_numpy else a.dtype,
                                tuple(a.shape), is_numpy)
        leaves.append(leaf if leaf is not None else InlineLeaf(_compact(a)))
    return EncodedBatch(structure, leaves, objects)


def _compact(a):
    """``a``, or a copy of it when it views a larger storage (pickling a view pickles all of its
    storage: a leaf stacked into a full slot's fallback, a slice of a dataset's big tensor)."""
    if isinstance(a, torch.Tensor) and \
            a.untyped_storage().nbytes() > a.element_size() * a.numel():
        return a.clone()
    return a


def decode(encoded, pool, lease):
    """The batch, its slot leaves viewing the lease's buffer of ``pool`` (no copy): the buffer
    returns to the pool when the last of them dies."""
    slot = [leaf for leaf in encoded.leaves if isinstance(leaf, SlotLeaf)]
    views = iter(pool.view(lease, [(leaf.offset, leaf.nbytes) for leaf in slot], True)
                 if slot else ())
    arrays = []
    for leaf in encoded.leaves:
        if isinstance(leaf, SlotLeaf):
            v = next(views)
            arrays.append(v.numpy().view(leaf.dtype).reshape(leaf.shape) if leaf.numpy
                          else v.view(leaf.dtype).view(leaf.shape))
        else:
            arrays.append(leaf.array)
    return rebuild(encoded.structure, arrays, encoded.objects, collated=False)


def batch_len(batch):
    """The number of samples in a collated batch (its first array leaf's first dimension), for
    counting samples of IterableDataset batches; 1 when it has none."""
    arrays = []
    flatten(batch, arrays, [])
    for a in arrays:
        return int(a.shape[0]) if len(a.shape) else 1
    return 1
