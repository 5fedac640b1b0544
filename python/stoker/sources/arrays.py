"""Native datasets: the samples are read by C++ threads, never by Python code."""

from __future__ import annotations

import functools
import mmap
import os

import numpy as np

from .. import _native
from . import remote as _remote
from .base import StokerDataset

_SUPPORTED_KINDS = "biufc"  # bool, signed, unsigned, float, complex


def _as_array(a, position):
    """``a`` as a NumPy array, and the mapping that guards reads of it (Stoker's own mapping of the
    file, so that a file truncated under it raises instead of SIGBUS): an ``_native.sources.NpyFile``
    for a .npy path, an ``_native.sources.FileMapping`` for an array NumPy mapped read-only, else None."""
    guard = None
    if isinstance(a, (str, os.PathLike)):
        path = os.fspath(a)
        if not path.endswith(".npy"):
            raise ValueError(f"array {position}: a path must name a .npy file, got {path!r}")
        guard = _native.sources.NpyFile(path)  # memory-mapped, read-only; the header parsed natively
        a = guard.array
    elif isinstance(a, np.ndarray):
        again = _mapped_again(a)
        if again is not None:
            a, guard = again
    else:
        a = np.asarray(a)  # zero-copy for torch CPU tensors and anything with __array__
    if a.ndim == 0:
        raise ValueError(f"array {position} is a scalar; arrays need a first dimension of samples")
    if a.dtype.kind not in _SUPPORTED_KINDS:
        raise ValueError(
            f"array {position} has dtype {a.dtype}; supported are bool, integer, float and "
            "complex dtypes")
    if not a.dtype.isnative:
        raise ValueError(
            f"array {position} has non-native byte order ({a.dtype}); convert it with "
            "a.astype(a.dtype.newbyteorder('='))")
    return a, guard


def _numpy_mapping(a):
    """The np.memmap whose file mapping ``a``'s memory lies in, when NumPy mapped the file
    read-only (``np.load(path, mmap_mode="r")``, ``np.memmap(path, mode="r")``, or a view of
    either), else None. A view of a memmap is a memmap sharing its parent's mapping."""
    while isinstance(a, np.ndarray):
        if isinstance(a, np.memmap) and isinstance(getattr(a, "_mmap", None), mmap.mmap):
            return a if a.mode == "r" and a.filename else None
        a = a.base
    return None


def _mapped_again(a):
    """``a`` rebuilt over Stoker's own mapping of the file NumPy mapped it from, at the same
    place with the same strides, and that ``_native.sources.FileMapping``; None when ``a`` is not a
    read-only NumPy mapping of a file (writable and copy-on-write mappings are read as they are:
    the user may write through them) or the file changed since NumPy mapped it."""
    m = _numpy_mapping(a)
    if m is None or a.size == 0:
        return None
    try:
        mapped_at = np.frombuffer(m._mmap, dtype=np.uint8).ctypes.data
        mapping = _native.sources.FileMapping(os.fspath(m.filename))
    except (OSError, ValueError):  # NumPy's mapping closed, or the file gone
        return None
    # NumPy maps from the file offset rounded down to the allocation granularity.
    file_start = m.offset - m.offset % mmap.ALLOCATIONGRANULARITY
    low, high = _byte_bounds(a)
    first = low - mapped_at + file_start  # the file offset of a's lowest byte
    data = mapping.bytes
    if first < 0 or first + (high - low) > data.size:
        return None  # the file shrank since NumPy mapped it
    b = np.ndarray(a.shape, a.dtype, buffer=data, offset=first + a.ctypes.data - low,
                   strides=a.strides)
    if not (np.array_equal(a[:1], b[:1]) and np.array_equal(a[-1:], b[-1:])):
        return None  # another file at that path now
    return b, mapping


def _byte_bounds(a):
    """The addresses of ``a``'s lowest byte and one past its highest."""
    bounds = getattr(np.lib, "array_utils", np).byte_bounds  # NumPy 2 moved it
    return bounds(a)


def _guarded_spec(a, guard):
    """How an array travels in a pickle: a .npy path as its path, an array over a FileMapping as
    its place in the file (mapped again where it is unpickled), anything else as its data."""
    if isinstance(guard, _native.sources.NpyFile):
        return guard.path
    if isinstance(guard, _native.sources.FileMapping):
        offset = a.ctypes.data - guard.bytes.ctypes.data
        return _Mapped((guard.path, a.dtype.str, a.shape, offset, a.strides))
    return a


class _Mapped(tuple):
    """An array's place in a file: (path, dtype, shape, offset, strides); unpickles as a view of a
    read-only NumPy mapping of the file (which ArrayDataset maps again)."""

    def __reduce__(self):
        return _map_again, tuple(self)


def _map_again(path, dtype, shape, offset, strides):
    whole = np.memmap(path, dtype=np.uint8, mode="r")
    return np.ndarray(shape, np.dtype(dtype), buffer=whole, offset=offset, strides=strides)


class ArrayDataset(StokerDataset):
    """Samples are rows of NumPy arrays: sample ``i`` is ``(arrays[0][i], arrays[1][i], ...)``.

    Arrays may be memory-mapped (``np.load(path, mmap_mode="r")``, or just the ``.npy`` path, which
    Stoker maps itself):
    worker threads read rows straight from the mapping into batch buffers, and every thread shares
    the one mapping. A loader yields one tensor per array, or a single tensor for one array.
    A ``.npy`` path given here is read under a guard: if the file is truncated while an epoch
    runs, the rows that are gone raise ``SampleError`` naming the file (or are skipped with
    ``on_error="skip"``). So is any array NumPy mapped read-only from a file
    (``np.load(path, mmap_mode="r")``, ``np.memmap(path, mode="r")``, or a view of either):
    Stoker maps the file again and reads the same bytes through its own mapping. A writable or
    copy-on-write mapping (``mode="r+"``, ``"c"``) is read as it is, without the guard: a row
    read past the end of its truncated file kills the process with SIGBUS.

    A ``.npy`` URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``hf://``; docs/remote.md)
    is copied into the local cache first (``cache_dir``, ``cache_budget``, ``storage_options``):
    every sample reads every array, so the files must fit the cache budget together.

    ``targets`` (torchvision's name) is the class label array, which ``shuffle="stratified"`` and
    ``class_weights`` group samples by: the array named "label", "labels", "target", "targets"
    or "y" when ``names`` are given, else the last of two or more arrays if it is 1-D with an
    integer dtype, else None.
    """

    def __init__(self, *arrays, names=None, storage_options=None, cache_dir=None,
                 cache_budget=None):
        if not arrays:
            raise ValueError("ArrayDataset needs at least one array")
        self._remote_options = {"storage_options": storage_options, "cache_dir": cache_dir,
                                "cache_budget": cache_budget}
        self._given = arrays
        remote = [i for i, a in enumerate(arrays) if isinstance(a, str) and _remote.is_remote(a)]
        if remote:  # .npy URLs: copied into the local cache, then mapped as local files
            _, local = _remote.stage([arrays[i] for i in remote], "ArrayDataset",
                                     **self._remote_options)
            arrays = list(arrays)
            for i, path in zip(remote, local):
                arrays[i] = path
        arrays_and_files = [_as_array(a, i) for i, a in enumerate(arrays)]
        self.arrays = tuple(a for a, _ in arrays_and_files)
        self._files = tuple(npy for _, npy in arrays_and_files)
        lengths = {len(a) for a in self.arrays}
        if len(lengths) != 1:
            raise ValueError(
                "all arrays need the same number of samples (first dimension), got "
                + ", ".join(str(len(a)) for a in self.arrays))
        self.names = tuple(names) if names is not None else None  # as given (None: unnamed)
        names = list(names) if names is not None else [str(i) for i in range(len(arrays))]
        self._names = names
        self._source = _native.sources.ArraySource(list(self.arrays), names, list(self._files))

    @property
    def targets(self):
        for name in ("label", "labels", "target", "targets", "y"):
            if name in self._names:
                return self.arrays[self._names.index(name)]
        last = self.arrays[-1]
        if len(self.arrays) > 1 and last.ndim == 1 and last.dtype.kind in "iu":
            return last
        return None

    def _batch_names(self):
        if self.names is None:
            raise ValueError(
                "an ArrayDataset without names yields tuples, and the model is called as "
                "model(**batch): name the arrays after the model's arguments, "
                "ArrayDataset(..., names=[\"input_ids\", \"labels\"])")
        return self.names

    def __reduce__(self):
        # Pickled (for a Ray offload actor, say) as its spec (_guarded_spec): mapped files are
        # mapped again where it is unpickled (readable at the same path there), any other array
        # travels as its data.
        return functools.partial(ArrayDataset, names=self._names, **self._remote_options), tuple(
            given if isinstance(given, str) and _remote.is_remote(given) else
            _guarded_spec(a, guard) for a, guard, given in zip(self.arrays, self._files,
                                                              self._given))

    def __len__(self):
        return len(self.arrays[0])

    def __getitem__(self, index):
        rows = tuple(a[index] for a in self.arrays)
        return rows[0] if len(rows) == 1 else rows
