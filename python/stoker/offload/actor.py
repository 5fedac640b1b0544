"""What runs in a Ray actor for stoker.RayOffload (see producer.py), and what travels between it
and the consumer: batches as NumPy arrays that Ray's object store holds and maps back without a
copy, errors pickled with their cause."""

from __future__ import annotations

import hashlib
import os
import pickle
import warnings

import numpy as np

from .. import _state
from .._tree import tree_leaves, tree_map
from ..sources.base import is_native


class _Tensor:
    """A torch tensor in transit: its data as a NumPy array (which Ray's serializer places in the
    object store and maps back without a copy) and its dtype."""

    __slots__ = ("array", "dtype")

    def __init__(self, array, dtype):
        self.array = array
        self.dtype = dtype

    def __reduce__(self):
        return _Tensor, (self.array, self.dtype)


def _pack_tensor(t):
    t = t.detach()
    try:
        return _Tensor(t.numpy(), None)
    except TypeError:  # no NumPy dtype (bfloat16, ...): travels as raw integers
        import torch
        raw = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        return _Tensor(t.view(raw[t.element_size()]).numpy(), str(t.dtype).split(".")[1])


def _pack(obj):
    """``obj`` with every torch tensor replaced by a _Tensor (run in the actor)."""
    import torch
    return tree_map(_pack_tensor, obj, torch.Tensor)


def unpack(obj, torch_out):
    """The batch the consumer gets: tensors (or, for output="numpy", arrays) over the object
    store's memory."""
    if not torch_out:
        return tree_map(lambda x: x.array, obj, _Tensor)
    import torch

    def tensor(x):
        with warnings.catch_warnings():  # the object store's memory is shared, read-only to NumPy
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(x.array)
        return t if x.dtype is None else t.view(getattr(torch, x.dtype))
    return tree_map(tensor, obj, _Tensor)


def _pack_error(exc):
    """An exception as (pickled exception, pickled cause) for the consumer; what does not pickle
    travels as a RuntimeError naming it."""
    def dump(e):
        if e is None:
            return None
        try:
            return pickle.dumps(e)
        except Exception:
            return pickle.dumps(RuntimeError(f"{type(e).__qualname__}: {e}"))
    return dump(exc), dump(exc.__cause__)


def unpack_error(packed):
    exc, cause = (pickle.loads(p) if p is not None else None for p in packed)
    if cause is not None:
        exc.__cause__ = cause
    return exc


def fingerprint(dataset):
    """What must be equal where a dataset is rebuilt: its length and, for a native dataset, the
    files it lists (a Python dataset travels whole, pickled)."""
    h = hashlib.sha1()
    if is_native(dataset):
        h.update(repr(dataset._identity()).encode())  # sources/base.py
    return len(dataset), h.hexdigest()


class BatchActor:
    """The body of a Ray actor: the batches of one loader configuration, by streams."""

    def __init__(self, dataset, config):
        if fingerprint(dataset) != config["fingerprint"]:
            raise RuntimeError(
                f"the dataset rebuilt on the Ray node ({len(dataset)} samples) differs from the "
                f"training process's ({config['fingerprint'][0]} samples, or other files): the "
                f"files must be readable at the same paths on every node")
        self.native = is_native(dataset)
        kw = config["loader"]
        try:
            import torch  # noqa: F401
            self.torch = True
        except ImportError:
            self.torch = False
        from ..loader import DataLoader  # an actor runs a whole loader

        if self.native:
            self.loader = DataLoader(dataset, num_workers=config["threads"], prefetch_factor=1,
                                     output="torch" if self.torch else "numpy", **kw)
        else:
            self.loader = DataLoader(dataset, num_workers=0, output="torch", **kw,
                                     **config["python"])
        self.streams = {}
        self.skipped = 0

    def ready(self):
        return os.getpid()

    def open(self, stream, epoch, start, first, step, stripes=0):
        """Stream ``stream``: batches first, first + step, ... of the epoch's plan that starts at
        global position ``start`` (a block order arranged for ``stripes`` ranks, 0: the
        loader's world size)."""
        source = None
        if self.native:
            plan = _state.plan(self.loader, start).strided(first, step)
            source = self.loader._producer.epoch_source(epoch, 0, plan, stripes)
        self.streams[stream] = [source, epoch, start, first, step, 0]

    def close(self, stream):
        """Called in the "control" concurrency group: at once, so that the requests of an
        abandoned stream still queued behind the running one cost nothing."""
        self.streams.pop(stream, None)

    def next(self, stream):
        """("batch" | "error", batch number, payload, skipped records) of the stream's next
        batch; ("closed", ...) for a stream closed meanwhile."""
        entry = self.streams.get(stream)
        if entry is None:
            return ("closed", None, None, [])
        source, epoch, start, first, step, j = entry
        entry[5] += 1
        b = first + j * step
        try:
            if self.native:
                # Fields as tensors (zero-copy from the engine's buffer) or arrays, in transit as
                # arrays that the object store holds.
                fields = tuple(_pack(f) if self.torch else _Tensor(f, None)
                               for f in source.next(self.torch))
                producer = self.loader._producer
                batch = producer.assemble(fields) if producer.assemble is not None else \
                    fields[0] if producer.single else fields
            else:
                state = self.loader.state_dict()
                state.update(epoch=epoch, batch=b, start=start)
                self.loader.load_state_dict(state)
                batch = _pack(next(iter(self.loader)))
            reply = ("batch", b, batch)
        except Exception as e:  # the consumer raises it at this batch's turn
            reply = ("error", b, _pack_error(e))
        stats = self.loader.stats()
        new = stats["skipped"] - self.skipped
        self.skipped = stats["skipped"]
        return reply + (list(stats["skipped_samples"][-new:]) if new > 0 else [],)


def nbytes(payload):
    """Bytes of the arrays in a batch in transit."""
    return sum(x.array.nbytes if isinstance(x, _Tensor) else x.nbytes
               for x in tree_leaves(payload, (_Tensor, np.ndarray)))
