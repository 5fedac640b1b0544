"""One sample of a native source as NumPy arrays, read on the calling thread (``__getitem__`` of
Stoker's datasets: for inspection, never on the loader's path)."""

from __future__ import annotations

import numpy as np


def read_sample(source, index, seed=0, epoch=0):
    """Sample ``index`` of ``source`` (a ``_native.sources.Source``) with ``(seed, epoch)``'s
    randomness: one array a field, with the field's dtype and the sample's shape (a ragged
    field's first dimension the sample's own length, a bucketed field's its bucket's)."""
    raw = source.sample(index, seed, epoch)
    return [np.frombuffer(data, dtype=dtype).reshape(shape).copy()
            for data, dtype, shape in zip(raw, source.field_dtypes, source.sample_shapes(index))]
