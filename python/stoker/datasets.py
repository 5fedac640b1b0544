"""Native datasets: the samples are read by C++ threads, never by Python code."""

from __future__ import annotations

import os

import numpy as np

from . import _native

_SUPPORTED_KINDS = "biufc"  # bool, signed, unsigned, float, complex


def _as_array(a, position):
    if isinstance(a, (str, os.PathLike)):
        path = os.fspath(a)
        if not path.endswith(".npy"):
            raise ValueError(f"array {position}: a path must name a .npy file, got {path!r}")
        a = _native.load_npy(path)  # memory-mapped, read-only; the header parsed natively
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
    return a


class ArrayDataset:
    """Samples are rows of NumPy arrays: sample ``i`` is ``(arrays[0][i], arrays[1][i], ...)``.

    Arrays may be memory-mapped (``np.load(path, mmap_mode="r")``, or just the ``.npy`` path, which
    Stoker maps itself):
    worker threads read rows straight from the mapping into batch buffers, and every thread shares
    the one mapping. A loader yields one tensor per array, or a single tensor for one array.
    """

    def __init__(self, *arrays, names=None):
        if not arrays:
            raise ValueError("ArrayDataset needs at least one array")
        self.arrays = tuple(_as_array(a, i) for i, a in enumerate(arrays))
        lengths = {len(a) for a in self.arrays}
        if len(lengths) != 1:
            raise ValueError(
                "all arrays need the same number of samples (first dimension), got "
                + ", ".join(str(len(a)) for a in self.arrays))
        names = list(names) if names is not None else [str(i) for i in range(len(arrays))]
        self._source = _native.ArraySource(list(self.arrays), names)

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
