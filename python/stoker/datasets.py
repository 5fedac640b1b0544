"""Native datasets: the samples are read by C++ threads, never by Python code."""

from __future__ import annotations

import functools
import mmap
import os

import numpy as np

from . import _native

_SUPPORTED_KINDS = "biufc"  # bool, signed, unsigned, float, complex


def _as_array(a, position):
    """``a`` as a NumPy array, and the ``_native.NpyFile`` it lies in when it was given as a
    path (Stoker maps it, and guards reads of it against the file being truncated), else None."""
    npy = None
    if isinstance(a, (str, os.PathLike)):
        path = os.fspath(a)
        if not path.endswith(".npy"):
            raise ValueError(f"array {position}: a path must name a .npy file, got {path!r}")
        npy = _native.NpyFile(path)  # memory-mapped, read-only; the header parsed natively
        a = npy.array
    elif isinstance(a, np.memmap):
        npy = _npy_mapped_again(a)
        if npy is not None:
            a = npy.array
    elif not isinstance(a, np.ndarray):
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
    return a, npy


def _mapped_array_spec(a):
    """How to map ``a`` again: a spec for _map_again when ``a`` is a whole read-only
    memory-mapped file (not a view of one), else None."""
    if isinstance(a, np.memmap) and isinstance(a.base, mmap.mmap) and a.filename and \
            a.mode == "r" and (a.flags.c_contiguous or a.flags.f_contiguous):
        order = "C" if a.flags.c_contiguous else "F"
        return _Mapped((a.filename, a.dtype.str, a.shape, a.offset, order))
    return None


def _npy_mapped_again(a):
    """A whole .npy file that NumPy mapped read-only (``np.load(path, mmap_mode="r")``), mapped
    again by Stoker so that reads of it are guarded as those of a path are: the ``NpyFile``, or
    None for anything else (a view, a raw ``np.memmap``, a writable mapping), read as it is."""
    spec = _mapped_array_spec(a)
    path = os.fspath(spec[0]) if spec is not None else ""
    if not path.endswith(".npy"):
        return None
    try:
        npy = _native.NpyFile(path)
        same_place = a.offset == os.path.getsize(path) - a.nbytes  # .npy data ends the file
    except (OSError, ValueError):  # changed since NumPy mapped it: read NumPy's mapping
        return None
    b = npy.array
    if not same_place or (b.dtype, b.shape, b.strides) != (a.dtype, a.shape, a.strides):
        return None
    return npy


class _Mapped(tuple):
    """A memory-mapped array's spec: (path, dtype, shape, offset, order); unpickles as the
    mapped array."""

    def __reduce__(self):
        return _map_again, tuple(self)


def _map_again(path, dtype, shape, offset, order):
    return np.memmap(path, dtype=np.dtype(dtype), mode="r", shape=shape, offset=offset,
                     order=order)


class ArrayDataset:
    """Samples are rows of NumPy arrays: sample ``i`` is ``(arrays[0][i], arrays[1][i], ...)``.

    Arrays may be memory-mapped (``np.load(path, mmap_mode="r")``, or just the ``.npy`` path, which
    Stoker maps itself):
    worker threads read rows straight from the mapping into batch buffers, and every thread shares
    the one mapping. A loader yields one tensor per array, or a single tensor for one array.
    A ``.npy`` path given here is read under a guard: if the file is truncated while an epoch
    runs, the rows that are gone raise ``SampleError`` naming the file (or are skipped with
    ``on_error="skip"``). So is a whole ``.npy`` file NumPy mapped read-only (Stoker maps it
    again). Other arrays you map yourself (a view of a mapping, a raw ``np.memmap``, a writable
    mapping) have no such guard: a row read past the end of their truncated file kills the
    process with SIGBUS.

    ``targets`` (torchvision's name) is the class label array, which ``shuffle="stratified"`` and
    ``class_weights`` group samples by: the array named "label", "labels", "target", "targets"
    or "y" when ``names`` are given, else the last of two or more arrays if it is 1-D with an
    integer dtype, else None.
    """

    def __init__(self, *arrays, names=None):
        if not arrays:
            raise ValueError("ArrayDataset needs at least one array")
        arrays_and_files = [_as_array(a, i) for i, a in enumerate(arrays)]
        self.arrays = tuple(a for a, _ in arrays_and_files)
        self._files = tuple(npy for _, npy in arrays_and_files)
        lengths = {len(a) for a in self.arrays}
        if len(lengths) != 1:
            raise ValueError(
                "all arrays need the same number of samples (first dimension), got "
                + ", ".join(str(len(a)) for a in self.arrays))
        names = list(names) if names is not None else [str(i) for i in range(len(arrays))]
        self._names = names
        self._source = _native.ArraySource(list(self.arrays), names, list(self._files))

    @property
    def targets(self):
        for name in ("label", "labels", "target", "targets", "y"):
            if name in self._names:
                return self.arrays[self._names.index(name)]
        last = self.arrays[-1]
        if len(self.arrays) > 1 and last.ndim == 1 and last.dtype.kind in "iu":
            return last
        return None

    def __reduce__(self):
        # Pickled (for a Ray offload actor, say) as its spec: a .npy path travels as the path, a
        # whole memory-mapped file as its path and mapping, to be mapped again where it is
        # unpickled (the file must be readable at the same path there); any other array travels
        # as its data.
        return functools.partial(ArrayDataset, names=self._names), tuple(
            npy.path if npy is not None else _mapped_array_spec(a) or a
            for a, npy in zip(self.arrays, self._files))

    def __len__(self):
        return len(self.arrays[0])

    def __getitem__(self, index):
        rows = tuple(a[index] for a in self.arrays)
        return rows[0] if len(rows) == 1 else rows


class TokenDataset:
    """Windows over a file of token ids: raw (nanoGPT's ``train.bin``), with llm.c's 1024-byte
    header (llm.c's and modded-nanogpt's shards), or a 1-d ``.npy`` array; told by its first bytes.

    Sample ``i`` is ``(tokens[i*L : i*L+L], tokens[i*L+1 : i*L+L+1])`` as int64, ``L = seq_len``;
    there are ``(num_tokens - 1) // seq_len`` samples. The file is memory-mapped once.
    """

    def __init__(self, path, dtype="uint16", seq_len=None):
        if dtype not in ("uint16", "uint32"):
            raise ValueError(f'dtype must be "uint16" or "uint32", got {dtype!r}')
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
        self.path = os.fspath(path)
        self.dtype = dtype
        self.seq_len = seq_len
        self._source = _native.TokenSource(self.path, dtype, seq_len)
        self.num_tokens = self._source.num_tokens
        self.format = self._source.format  # "raw", "llm.c" or "npy"

    def __reduce__(self):  # pickled as its spec: the file must be readable at the same path
        return TokenDataset, (self.path, self.dtype, self.seq_len)

    def __len__(self):
        return len(self._source)

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        tokens = np.memmap(self.path, dtype=self.dtype, mode="r",
                           offset=self._source.data_offset, shape=(self.num_tokens,))
        start = index * self.seq_len
        window = tokens[start:start + self.seq_len + 1].astype(np.int64)
        return window[:-1], window[1:]
