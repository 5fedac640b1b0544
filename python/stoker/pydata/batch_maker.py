"""Turning a task into a batch (Python datasets): fetch the samples, collate them.

One BatchMaker per producing thread of a process: the training process (num_workers=0, or
num_workers="auto" while it produces), each worker process, each worker thread. It fetches a
map-style batch's samples with the native, per-sample seeded SampleFetcher, or the next samples of
its copy of an IterableDataset, and collates them with batch_structure.collate.
"""

from __future__ import annotations

import dataclasses

from . import batch_structure, seeding
from .remote_errors import local_exception


@dataclasses.dataclass(frozen=True)
class ProducerConfig:
    """What producing a batch needs, the same in every process (pickled to spawned workers)."""
    seed: int  # the sample keys' seed
    seed_samples: object  # True | "always" | False
    collate_fn: object  # None: the default collate
    auto_collation: bool  # False: batch_size=None (each "batch" is one sample)
    batch_size: int | None  # IterableDataset: samples a batch
    drop_last: bool  # IterableDataset: drop a worker's last partial batch
    on_error: str  # "raise" | "skip"
    size: int  # on_error="skip": len(dataset), the range replacements come from


class BatchMaker:
    def __init__(self, dataset, config, leave_alone=(False, False, False), seed_samples=None):
        self.dataset = dataset
        self.config = config
        mode = config.seed_samples if seed_samples is None else seed_samples
        self.fetcher = seeding.fetcher(config.seed, mode, leave_alone,
                                       config.on_error == "skip", config.size)
        self.stream = None  # IterableDataset: (epoch, iterator) of this producer's copy

    def fetch(self, epoch, draws, batch_no):
        """[dataset[i] for i in draws.indices], each seeded for its sample (batch_order.Draws).
        A sample's exception carries its index as ``_stoker_index``."""
        return self.fetcher.fetch(self.dataset, epoch, draws.indices, batch_no, draws.first_row,
                                  draws.cycles)

    def take_skipped(self):
        """(index, "Type: message") of the samples on_error="skip" replaced since the last call."""
        return self.fetcher.take_skipped()

    def next_samples(self, epoch):
        """The next samples of this producer's copy of an IterableDataset ([] at its end): a
        batch's worth, or one without auto-collation."""
        if self.stream is None or self.stream[0] != epoch:
            self.stream = (epoch, iter(self.dataset))
        c = self.config
        out = []
        for _ in range(c.batch_size if c.auto_collation else 1):
            try:
                out.append(next(self.stream[1]))
            except StopIteration:
                break
        if c.auto_collation and c.drop_last and len(out) < c.batch_size:
            return []
        return out

    def collate(self, samples, writer=None):
        c = self.config
        return batch_structure.collate(samples, c.collate_fn, c.auto_collation,
                                       writer or batch_structure.HeapWriter())

    def produce_here(self, epoch, draws, batch_no):
        """A batch produced in the training process (its callers keep their generator states):
        the batch, or None at the end of an IterableDataset. Raises a sample's error as a
        SampleError naming the sample."""
        with seeding.caller_states_kept(self.config.seed_samples is not False):
            try:
                samples = self.next_samples(epoch) if draws is None else \
                    self.fetch(epoch, draws, batch_no)
            except Exception as e:
                raise local_exception(e) from e
        if not samples:
            return None
        return self.collate(samples)
