"""A dataset for testing failure handling and shutdown (a test double: never in the package; its
native source is in ``_native.testing``, built with STOKER_TESTING=ON).

``FaultyDataset(size, width=1, fail=(), delay_us=0, shards=())``: sample ``i`` is ``width`` int64
values all equal to ``i``; samples in ``fail`` raise a DecodeError with path ``sample-<i>.bin``;
each read sleeps ``delay_us`` microseconds in the native worker (a slow stage, no GIL held);
``shards`` (sizes summing to ``size``) declares the samples in those shards, as a remote dataset
does (``shuffle="shards"``).
"""

from stoker import _native
from stoker.sources.base import StokerDataset


class FaultyDataset(StokerDataset):
    def __init__(self, size, width=1, fail=(), delay_us=0, shards=()):
        self._spec = (size, width, tuple(sorted(fail)), delay_us, tuple(shards))
        self._source = _native.testing.FaultySource(size, width, set(fail), delay_us,
                                                    list(shards))

    def __reduce__(self):
        return FaultyDataset, self._spec

    def __len__(self):
        return len(self._source)
