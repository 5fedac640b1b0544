"""The one place where a Python dataset's batch order is computed.

Without a sampler or batch_sampler: the engine's order (``_native.engine.BatchPlan.indices``, the
engine's one batch-draws routine, src/engine/epoch_draws.h): the same indices a native dataset
with the same settings visits, ``shuffle=True`` a seeded permutation of (seed, epoch), split
across ranks as DistributedSampler splits it (with ``repeats``, a sample's copies at adjacent
positions, each keyed by its cycle: ``BatchPlan.repeated_draws``); an epoch resumed with another
world size (elastic, see _state.py) starts its plan at global position ``origin``. With
``shuffle="stratified"`` or class weights: the engine's stratified order (``stratified``, a
``_native.engine.StratifiedPlan``, balance.py). With a ``sampler`` or ``batch_sampler``: theirs,
exactly as torch iterates them (a fresh iterator each epoch). An IterableDataset has no order:
its workers' streams are the order.
"""

from __future__ import annotations

import dataclasses

from .. import _native


@dataclasses.dataclass(frozen=True)
class Draws:
    """Samples of one batch, as the order draws them: ``indices`` (or sampler keys) at rows
    ``first_row`` on of the batch, and ``cycles``, one a sample in a stratified order (a draw's
    randomness is keyed by its cycle through its class, as the native loader keys it), else None
    (keyed by the epoch)."""
    indices: list
    cycles: list | None = None
    first_row: int = 0

    def __len__(self):
        return len(self.indices)

    def part(self, start, stop):
        """Rows [start, stop) of these draws."""
        return Draws(self.indices[start:stop],
                     None if self.cycles is None else self.cycles[start:stop],
                     self.first_row + start)


@dataclasses.dataclass
class BatchOrder:
    dataset: object
    batch_size: int | None  # None: no auto-collation (each "batch" is one index)
    shuffle: bool
    drop_last: bool
    rank: int
    world_size: int
    batch_sampler: object = None  # torch's BatchSampler(sampler, ...) or the user's
    sampler: object = None  # with batch_size=None: one index (or key) a batch
    stratified: object = None  # a _native.engine.StratifiedPlan (shuffle="stratified", class_weights)
    repeats: int = 1  # every sample this many times an epoch (the engine's order only)

    def __len__(self):
        return self.num_batches()

    def num_batches(self, origin=0):
        """Batches of an epoch whose plan starts at global position ``origin``."""
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        if self.sampler is not None:
            return len(self.sampler)
        if self.stratified is not None:
            return len(self.stratified)
        return len(self._plan(origin))

    def _plan(self, origin):
        """The engine's plan of this rank's batches from global position ``origin`` on."""
        return _native.engine.BatchPlan(len(self.dataset) * self.repeats, self.batch_size or 1,
                                        self.drop_last, self.rank, self.world_size, origin)

    def batches(self, seed, epoch, start=0, origin=0):
        """(batch number, Draws) of the epoch from batch ``start`` on (of the plan that begins
        at global position ``origin``). Without auto-collation a batch draws one index (or
        sampler key)."""
        if self.batch_sampler is not None:
            for b, indices in enumerate(self.batch_sampler):
                if b >= start:
                    yield b, Draws(list(indices))
        elif self.sampler is not None:
            for b, key in enumerate(self.sampler):
                if b >= start:
                    yield b, Draws([key])
        elif self.stratified is not None:
            for b in range(start, len(self.stratified)):
                yield b, Draws(*self.stratified.batch_draws(epoch, b))
        elif self.repeats > 1:
            plan = self._plan(origin)
            for b in range(start, len(plan)):
                yield b, Draws(*plan.repeated_draws(self.shuffle, seed, epoch, self.repeats, b))
        else:
            plan = self._plan(origin)
            for b in range(start, len(plan)):
                yield b, Draws(plan.indices(self.shuffle, seed, epoch, b))
