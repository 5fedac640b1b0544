"""The one place where a Python dataset's batch order is computed.

Without a sampler or batch_sampler: the engine's order (``_native.engine.BatchPlan.indices``, the
engine's one batch-draws routine, stoker/epoch_draws.h): the same indices a native dataset
with the same settings visits, ``shuffle=True`` a seeded permutation of (seed, epoch), split
across ranks as DistributedSampler splits it (with ``repeats``, a sample's copies at adjacent
positions, each keyed by its cycle: ``BatchPlan.repeated_draws``); an epoch resumed with another
world size (elastic, see _state.py) starts its plan at global position ``origin``. With
``shuffle="stratified"`` or class weights: the engine's stratified order (``stratified``, a
``_native.engine.StratifiedPlan``, balance.py). With a ``sampler`` or ``batch_sampler``: theirs,
exactly as torch iterates them (a fresh iterator each epoch; a sampler with a batch size is
grouped here as torch's BatchSampler groups it). An IterableDataset has no order: its workers'
streams are the order.

A user's order resumes mid-epoch in one of two ways. A stateful sampler (torchdata's contract:
the sampler, or the iterator it returns, has ``state_dict`` and ``load_state_dict``) is
snapshotted after every batch it yields (``note``), so the loader can save its state as of the
last batch delivered, however far ahead batches were prefetched; resumed, it is loaded
(``resume``) and goes on by itself. Any other sampler is replayed: a fresh iterator, its first
batches skipped (indices only, no sample is read).
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
    batch_sampler: object = None  # the user's batch_sampler
    sampler: object = None  # the user's sampler: batch_size keys a batch (None: one a batch)
    stratified: object = None  # a _native.engine.StratifiedPlan (shuffle="stratified", class_weights)
    repeats: int = 1  # every sample this many times an epoch (the engine's order only)
    budget: object = None  # batches by a stoker.Budget: the loader's budget.BudgetOrder
    # The next epoch's iterator of a user's sampler, made early by pending_state.
    _pending: object = dataclasses.field(default=None, repr=False, compare=False)

    def __len__(self):
        return self.num_batches()

    def num_batches(self, origin=0):
        """Batches of an epoch whose plan starts at global position ``origin`` (a budget's: its
        BudgetEpoch)."""
        if self.budget is not None:
            return (self.budget.epoch(0) if isinstance(origin, int) else origin).num_batches
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        if self.sampler is not None:
            n, size = len(self.sampler), self.batch_size or 1
            return n // size if self.drop_last else -(-n // size)
        if self.stratified is not None:
            return len(self.stratified)
        return len(self._plan(origin))

    def _plan(self, origin):
        """The engine's plan of this rank's batches from global position ``origin`` on."""
        return _native.engine.BatchPlan(len(self.dataset) * self.repeats, self.batch_size or 1,
                                        self.drop_last, self.rank, self.world_size, origin)

    def batches(self, seed, epoch, start=0, origin=0, resume=None, note=None):
        """(batch number, Draws) of the epoch from batch ``start`` on (of the plan that begins
        at global position ``origin``). Without auto-collation a batch draws one index (or
        sampler key). A user's order: ``resume``, a stateful sampler's state as of batch
        ``start`` (None: replay), and ``note(b, state)``, called with its state after each batch
        ``b`` it yields (and ``start - 1`` before the first)."""
        if self.budget is not None:
            plan = self.budget.epoch(epoch) if isinstance(origin, int) else origin  # BudgetEpoch
            for b in range(start, plan.num_batches):
                yield b, Draws([int(i) for i in plan.batch(b)])
        elif self.batch_sampler is not None or self.sampler is not None:
            yield from self._user_batches(start, resume, note)
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

    def _source(self):
        return self.batch_sampler if self.batch_sampler is not None else self.sampler

    def pending_state(self):
        """A stateful user's sampler's state at the start of the next epoch (None: not
        stateful). Where the state is its iterator's, the next epoch's iterator is made now
        and kept for that epoch (making one can draw from the sampler's generator)."""
        source = self._source()
        if source is None:
            return None
        if _has_state(source):
            return source.state_dict()
        if self._pending is None:
            self._pending = iter(source)
        return self._pending.state_dict() if _has_state(self._pending) else None

    def _user_batches(self, start, resume, note):
        source = self._source()
        it, self._pending = self._pending, None
        if resume is not None and _has_state(source):
            source.load_state_dict(resume)
            it = None  # an iterator made before the load would not see it
        if it is None:
            it = iter(source)
        owner = source if _has_state(source) else it if _has_state(it) else None
        if resume is not None and owner is it:
            it.load_state_dict(resume)
        if resume is not None and owner is None:
            raise ValueError(f"the state holds a sampler state, and this loader's sampler "
                             f"{type(source).__name__} has no load_state_dict")

        def snapshot(b):
            if note is not None and owner is not None:
                note(b, owner.state_dict())

        snapshot(start - 1)
        keys = it
        if self.batch_sampler is None and self.batch_size is not None:
            keys = _grouped(it, self.batch_size, self.drop_last)
        first = start if resume is not None else 0  # a loaded sampler goes on by itself
        for b, k in enumerate(keys, first):
            if b < start:
                continue
            snapshot(b)
            yield b, Draws(list(k) if self.batch_sampler is not None or
                           self.batch_size is not None else [k])

    def finish_state(self, state):
        """Loads ``state``, a stateful sampler's state at the end of an epoch, so that its next
        epoch follows it: into an iterator made and dropped (torchdata's samplers keep their
        randomness in the iterator, which advances the sampler's generator as it loads). A
        sampler whose own object holds the state is left as it is (its state at an epoch's end
        is a finished position, as torchdata's StatefulDataLoader treats it)."""
        source = self._source()
        self._pending = None
        if source is None or _has_state(source):
            return
        it = iter(source)
        if _has_state(it):
            it.load_state_dict(state)


def _has_state(obj):
    return callable(getattr(obj, "state_dict", None)) and \
        callable(getattr(obj, "load_state_dict", None))


def _grouped(keys, size, drop_last):
    """Batches of ``size`` keys, as torch's BatchSampler groups a sampler's."""
    batch = []
    for k in keys:
        batch.append(k)
        if len(batch) == size:
            yield batch
            batch = []
    if batch and not drop_last:
        yield batch
