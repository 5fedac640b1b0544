"""The resume state that every ``stoker.DataLoader`` front shares (native datasets, Python
datasets, Ray offload): where an epoch is, as a small JSON-serializable dict, and how a loader
with another world size continues it (elastic resume).

A state names the epoch, the global position at which that epoch's plan started (``start``: 0
unless the epoch was itself resumed elastically) and the batches each rank has delivered of
that plan (``batch``). The ranks of a job deliver their batches in step and save at the same
step, so what they consumed together is a prefix of the epoch's order,
``[0, plan.position_after(batch))``: a loader of any world size resumes from there, splitting
what is left among its ranks with equal batch counts (``_native.engine.BatchPlan``, which states the
padding rule). Loaded with the world size that saved it, a state resumes with the saved plan
itself: the same batches, numbered as before. With ``repeats=k`` (repeated augmentation) an
epoch's order has ``len(dataset) * k`` positions, a sample's k copies adjacent, and positions
count them; the state records ``repeats``, which the loading loader must have too.

A block order (``shuffle="shards"``, or a shuffled dataset in blocks such as Parquet row groups;
stoker/block_order.h) adds ``"shard_window"`` (the blocks a rank keeps open, which the
loading loader must have too) and ``"stripes"``: the world size the running epoch's order is
arranged for. A loader of another world size finishes that epoch with the saved stripes, so that
it reads exactly the rest of the epoch, and arranges the epochs after it for its own world size.
States of versions 1 and 2 predate stripes: their block orders were unstriped (stripes 1).

A mixture (``stoker.Mixture``, docs/mixtures.md) adds ``"mixture"``: the optimizer step of the
next batch, each source's stream position there (``draws``), and where the epoch's running plan
began (its step and draws) with a digest of the weights it used since. Loaded with the world
size and weights that saved it, the saved plan resumes (the same batches); otherwise a plan starts
at the saved point, every stream continuing exactly where it stopped.

The position is one typed value. :class:`Position` is where an iteration starts (the epoch, the
batches of its plan already delivered, the plan's start, a block order's stripes, a mixture's
carried start); the loader holds the pending one, which ``set_epoch`` and ``load_state_dict``
replace. :class:`Cursor` is a running iteration's progress, owned by its iterator, which advances
``cursor.batch`` as it delivers; the loader keeps a reference to the latest one only to answer
``state_dict()``. ``begin``, ``save`` and ``load`` are the only functions that turn one into the
other, and none of them writes the loader.
"""

from __future__ import annotations

import dataclasses

from . import _native
from .budget import Budget
from ._checks import is_int as _is_int

VERSION = 3
# version 1: no "start" (always 0), no "order" (always the engine's); versions 1 and 2: no
# "shard_window" and "stripes" (block orders were unstriped)
_READABLE = (1, 2, 3)
_MATCHING = ("seed", "shuffle", "batch_size", "drop_last", "num_samples", "repeats",
             "class_weights", "shard_window")
_DEFAULTS = {"repeats": 1, "shard_window": 0}  # what a state saved before the key existed had


@dataclasses.dataclass(frozen=True)
class MixtureStart:
    """Where a mixture's plan of ``epoch`` starts: the global position (an elastic resume), the
    optimizer step of its first batch and each source's stream position (draws) there."""
    epoch: int
    position: int
    first_step: int
    bases: tuple

    @classmethod
    def after(cls, plan, epoch):
        """The start of ``epoch``, which follows ``plan`` (the epoch before, run to its end)."""
        return cls(epoch, 0, plan.first_step + plan.num_batches,
                   tuple(plan.draws_after(plan.num_batches)))


@dataclasses.dataclass(frozen=True)
class Position:
    """Where the loader's next iteration starts: ``epoch``, the batches of its plan already
    delivered (``batch``), the global position the plan starts at (``start``: 0 unless resumed
    with another world size), a block order's arrangement (``stripes``: the world size the epoch
    is laid out for, None for the loader's own) and a mixture's carried start (``mixture``, used
    when its epoch is the one that starts). ``resumed``: made by ``load_state_dict``, so that a
    ``set_epoch`` of the same epoch keeps it."""
    epoch: int = 0
    batch: int = 0
    start: int = 0
    stripes: int | None = None
    mixture: MixtureStart | None = None
    # A budget's epoch: the buckets' batches consumed when its plan starts (None: the epoch's
    # start), the BudgetEpoch's `consumed`.
    budget: tuple | None = None
    resumed: bool = False

    def for_epoch(self, epoch):
        """``set_epoch(epoch)``: the start of ``epoch``, keeping a resumed position inside it and
        a mixture's carried epoch start (not a loaded point inside an epoch)."""
        if self.resumed and epoch == self.epoch:
            return self
        carry = self.mixture if self.mixture is not None and self.mixture.position == 0 else None
        return Position(epoch, mixture=carry)


class Cursor:
    """One iteration's progress, owned by its iterator: ``batch`` counts the batches of the plan
    delivered (the iterator advances it), from ``start`` (the plan's global start position) to
    ``num_batches`` (None when unknown: an IterableDataset without a length). ``mixture`` is a
    mixture's MixturePlan of the epoch; ``stripes`` a block order's arrangement (None: the
    loader's world size)."""

    __slots__ = ("epoch", "batch", "start", "num_batches", "mixture", "stripes", "budget")

    def __init__(self, epoch, batch, start=0, num_batches=None, mixture=None, stripes=None,
                 budget=None):
        self.epoch = epoch
        self.batch = batch
        self.start = start
        self.num_batches = num_batches
        self.mixture = mixture
        self.stripes = stripes
        self.budget = budget  # a budget's BudgetEpoch of this iteration

    def running(self):
        """Whether batches of this iteration remain to be delivered."""
        return self.num_batches is None or self.batch < self.num_batches

    def __repr__(self):
        return (f"Cursor(epoch={self.epoch}, batch={self.batch}, start={self.start}, "
                f"num_batches={self.num_batches})")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a loader's resume state is a function of, besides the iteration's cursor: its frozen
    options as its producer resolved them ("auto" made concrete), the latest cursor and the
    pending position. The loader makes one for each call (``DataLoader._settings``); the
    functions below read nothing else (never the loader object)."""
    dataset: object
    seed: int
    shuffle: object
    batch_size: object
    drop_last: bool
    rank: int
    world_size: int
    repeats: int
    order: str  # one of _options.ORDERS
    classes: object  # a class-weighted order's ClassGroups, else None
    weights: list  # its class weights, else []
    block_window: int  # blocks a rank keeps open in a block order; 0: none
    num_batches: object  # batches of the loader's epoch on its rank; None: unknown (a stream)
    cursor: object  # the latest iteration's Cursor, or None
    next: object  # the pending Position
    producer: object  # for its own_states (a Python dataset's and sampler's state_dict)


def order_kind(settings):
    """Who orders the loader's samples: "engine" (EpochOrder + BatchPlan), "stratified" (the
    engine's class-stratified or class-weighted order, laid out for the loader's ranks),
    "sampler" (a sampler or batch_sampler of the user's) or "iterable" (an IterableDataset)."""
    return settings.order


def num_samples(dataset):
    try:
        return len(dataset)
    except TypeError:  # an IterableDataset without __len__
        return None


def batch_plan(dataset, batch_size, drop_last, rank, world_size, start=0, repeats=1):
    """The engine's plan of ``rank`` of ``world_size`` from global position ``start`` on
    (``batch_size`` None, no automatic batching, plans batches of 1), over the epoch's
    ``len(dataset) * repeats`` positions (repeated augmentation: order.h)."""
    return _native.engine.BatchPlan(num_samples(dataset) * repeats,
                                    batch_size if _is_int(batch_size) else 1, drop_last, rank,
                                    world_size, start)


def repeats(settings):
    """Copies of every sample an epoch (1 unless the loader repeats samples)."""
    return settings.repeats


def plan(settings, start=0, world_size=None, rank=None):
    """The engine's plan of the loader's rank (or of ``rank`` of ``world_size``) from global
    position ``start`` on."""
    return batch_plan(settings.dataset, settings.batch_size, settings.drop_last,
                      settings.rank if rank is None else rank,
                      settings.world_size if world_size is None else world_size, start,
                      repeats(settings))


def weights_state(settings):
    """``[[label, weight], ...]`` of a class-weighted order (JSON keeps no int keys), else
    None."""
    if not settings.weights:
        return None
    return [[label, w] for label, w in zip(settings.classes.labels, settings.weights)]


def block_window(settings):
    """Blocks a rank keeps open in the engine's block order (shuffle="shards", or a shuffled
    dataset in blocks); 0 when the loader's order is not by blocks."""
    return settings.block_window


def config(settings):
    """What a state must match to be resumed by ``loader``."""
    batch_size = settings.batch_size
    if isinstance(batch_size, Budget):
        batch_size = batch_size.describe()  # as JSON
    out = {"seed": settings.seed, "shuffle": settings.shuffle, "batch_size": batch_size,
           "drop_last": settings.drop_last, "num_samples": num_samples(settings.dataset),
           "repeats": repeats(settings), "rank": settings.rank, "world_size": settings.world_size,
           "order": order_kind(settings),
           "class_weights": weights_state(settings)}
    window = block_window(settings)
    if window:
        out["shard_window"] = window
    return out


def begin(settings):
    """``(cursor, pending)``: the cursor of the iteration that starts now at the loader's pending
    position, and the position after it (the next epoch's start)."""
    at = settings.next
    start, mixture, after = at.start, None, None
    if order_kind(settings) == "budget":
        epoch = budget_epoch(settings, at)
        return Cursor(at.epoch, at.batch, 0, epoch.num_batches, budget=epoch), \
            Position(at.epoch + 1)
    if order_kind(settings) == "mixture":
        mixture = mixture_plan(settings, at)
        start, num_batches = mixture.position, mixture.num_batches
        after = MixtureStart.after(mixture, at.epoch + 1)  # the next epoch starts where this ends
    elif start:
        num_batches = plan(settings, start).num_batches
    elif order_kind(settings) == "iterable":
        num_batches = None  # len() of an IterableDataset is the user's to ask (torch warns then)
    else:
        num_batches = settings.num_batches
    cursor = Cursor(at.epoch, at.batch, start, num_batches, mixture, at.stripes)
    return cursor, Position(at.epoch + 1, mixture=after)


def save(settings):
    """``loader.state_dict()``: where the next batch comes from."""
    if order_kind(settings) == "mixture":
        return _save_mixture(settings)
    if order_kind(settings) == "budget":
        return _save_budget(settings)
    cursor = settings.cursor
    if cursor is not None and cursor.running():
        epoch, batch, start, stripes = cursor.epoch, cursor.batch, cursor.start, cursor.stripes
    else:
        at = settings.next
        epoch, batch, start, stripes = at.epoch, at.batch, at.start, at.stripes
    state = {"version": VERSION, "epoch": epoch, "batch": batch, "start": start,
             **config(settings)}
    if block_window(settings):
        state["stripes"] = stripes or settings.world_size
    state.update(settings.producer.own_states(settings.cursor))
    return state


def load(settings, state):
    """``loader.load_state_dict(state)``: the :class:`Position` of the loader's next iteration.
    Raises ValueError for a state this loader cannot continue exactly."""
    if not isinstance(state, dict) or state.get("version") not in _READABLE:
        raise ValueError(f"not a stoker.DataLoader state (version {VERSION}): {state!r}")
    mine = config(settings)
    saved_order = state.get("order", "engine")
    if saved_order == "mixture" and mine["order"] == "mixture":
        return _load_mixture(settings, state, mine)
    if saved_order == "budget" and mine["order"] == "budget":
        return _load_budget(settings, state, mine)
    if saved_order != mine["order"]:
        raise ValueError(f"the state was saved by a loader ordered by "
                         f"{_ORDERS.get(saved_order, repr(saved_order))}, this loader is ordered "
                         f"by {_ORDERS[mine['order']]}")
    _check_matching(state, mine)
    epoch, batch, start = state.get("epoch"), state.get("batch"), state.get("start", 0)
    old_world = state.get("world_size")
    n = mine["num_samples"]
    if n is not None:
        n *= mine["repeats"]  # the epoch's global positions
    if not (_is_int(epoch) and epoch >= 0 and _is_int(batch) and batch >= 0 and _is_int(start)
            and 0 <= start <= (n or 0) and _is_int(old_world) and old_world >= 1
            and (start == 0 or mine["order"] == "engine")):
        raise ValueError(f"invalid position in state: epoch={epoch!r}, batch={batch!r}, "
                         f"start={start!r}, world_size={old_world!r}")
    stripes = None
    if "shard_window" in mine:  # a block order: the epoch goes on with its arrangement
        stripes = state.get("stripes", 1 if state["version"] < 3 else None)
        if not (_is_int(stripes) and stripes >= 1):
            raise ValueError(f"invalid stripes in state (the world size of the epoch's shard "
                             f"order): {stripes!r}")
    if old_world == settings.world_size:
        if mine["order"] in ("engine", "stratified"):
            last = plan(settings, start).num_batches
        else:
            last = settings.num_batches
        if last is not None and batch > last:
            raise ValueError(f"invalid position in state: batch {batch} of an epoch of {last}")
        return Position(epoch, batch, start, stripes, resumed=True)
    if mine["order"] != "engine":
        raise ValueError(
            f"the state was saved with world_size={old_world} and this loader has "
            f"world_size={settings.world_size}: resuming with another world size needs the "
            f"engine's order, and this loader is ordered by {_ORDERS[mine['order']]}, whose "
            f"consumed samples cannot be named by a position")
    old = plan(settings, start, world_size=old_world, rank=0)
    if batch > old.num_batches:
        raise ValueError(f"invalid position in state: batch {batch} of an epoch of "
                         f"{old.num_batches} (world_size={old_world})")
    reached = old.position_after(batch)
    if reached >= n:  # the old job finished the epoch
        return Position(epoch + 1, resumed=True)
    return Position(epoch, 0, reached, stripes, resumed=True)


def _check_matching(state, mine):
    for key in _MATCHING:
        saved = state.get(key, _DEFAULTS.get(key))
        if key == "shard_window" and "shard_window" not in state and state.get("version") < 3:
            saved = mine.get(key, 0)  # a block order then had the source's window: the same
        if saved != mine.get(key, _DEFAULTS.get(key)):
            raise ValueError(
                f"the state was saved with {key}={saved!r} but this loader has "
                f"{key}={mine.get(key, _DEFAULTS.get(key))!r}; resuming would not reproduce "
                f"the same batches")


# -- budgets ---------------------------------------------------------------------------------------

def budget_epoch(settings, at):
    """The BudgetEpoch of the loader's rank that position ``at`` starts (budget.BudgetOrder)."""
    return settings.producer.budget_order.epoch(at.epoch, at.budget)


def _save_budget(settings):
    """A budget's state: the epoch, the batches delivered of its plan and the buckets' counts the
    plan started from (with the buckets' bounds, which a loading plan must have too): O(buckets)."""
    cursor = settings.cursor
    if cursor is not None and cursor.running():
        epoch, batch, consumed = cursor.epoch, cursor.batch, list(cursor.budget.consumed)
    else:
        at = settings.next
        epoch, batch = at.epoch, at.batch
        consumed = list(at.budget) if at.budget is not None else \
            list(budget_epoch(settings, at).consumed)
    return {"version": VERSION, "epoch": epoch, "batch": batch, "start": 0, **config(settings),
            "budget": {"consumed": consumed,
                       "bounds": settings.producer.budget_order.bounds}}


def _load_budget(settings, state, mine):
    order = settings.producer.budget_order
    _check_matching(state, mine)
    saved = state.get("budget")
    epoch, batch, old_world = state.get("epoch"), state.get("batch"), state.get("world_size")
    consumed = saved.get("consumed") if isinstance(saved, dict) else None
    if not (isinstance(consumed, list) and len(consumed) == order.num_buckets
            and all(_is_int(c) and c >= 0 for c in consumed)):
        raise ValueError(f"invalid budget position in state: {saved!r}")
    if saved.get("bounds") != order.bounds:
        raise ValueError(f"the state was saved with the buckets {saved.get('bounds')!r}, this "
                         f"loader's budget has {order.bounds!r}: its batches differ")
    if not (_is_int(epoch) and epoch >= 0 and _is_int(batch) and batch >= 0
            and _is_int(old_world) and old_world >= 1):
        raise ValueError(f"invalid position in state: epoch={epoch!r}, batch={batch!r}, "
                         f"world_size={old_world!r}")
    old = order.epoch(epoch, consumed, rank=0, world_size=old_world)
    if batch > old.num_batches:
        raise ValueError(f"invalid position in state: batch {batch} of an epoch of "
                         f"{old.num_batches} (world_size={old_world})")
    if batch == old.num_batches:  # the saving job finished the epoch
        return Position(epoch + 1, resumed=True)
    if old_world == settings.world_size:  # the saved plan itself: the same batches
        return Position(epoch, batch, budget=tuple(consumed), resumed=True)
    # Another world size: a plan of the batches the saving job's ranks had not consumed together.
    return Position(epoch, 0, budget=tuple(old.consumed_after(batch)), resumed=True)


# -- mixtures ---------------------------------------------------------------------------------------

def mixture_start(settings, at):
    """The :class:`MixtureStart` of the loader's plan for position ``at``: the carried one (a
    loaded state, or the end of the epoch before), else as if every epoch before ran whole with
    these weights and world size."""
    if at.mixture is not None and at.mixture.epoch == at.epoch:
        return at.mixture
    m = settings.dataset
    steps = at.epoch * plan(settings).num_batches
    first, bases = _native.engine.mixture_epoch_start(
        m.sizes, m.phases(0, steps), settings.seed, settings.shuffle is not False, at.epoch,
        settings.batch_size, settings.drop_last, settings.world_size)
    return MixtureStart(at.epoch, 0, first, tuple(bases))


def mixture_plan(settings, at):
    """The loader's rank's MixturePlan of the epoch that position ``at`` starts."""
    m = settings.dataset
    start = mixture_start(settings, at)
    steps = plan(settings, start.position).num_batches
    return _native.engine.MixturePlan(
        m.sizes, m.phases(start.first_step, steps), settings.seed, settings.shuffle is not False,
        at.epoch, settings.batch_size, settings.drop_last, settings.rank, settings.world_size,
        start.position, start.first_step, list(start.bases))


def mixture_point(settings):
    """``(epoch, batch, plan)`` of the next batch: the running iteration's, or the pending one."""
    cursor = settings.cursor
    if cursor is not None and cursor.running() and cursor.mixture is not None:
        return cursor.epoch, cursor.batch, cursor.mixture
    at = settings.next
    return at.epoch, at.batch, mixture_plan(settings, at)


def mixture_stats(settings, samples):
    """``stats()["mixture"]``: per source, the samples this process delivered, its own epochs
    (completed passes over it, by the whole job) and its weight now."""
    m = settings.dataset
    _, batch, mplan = mixture_point(settings)
    draws = mplan.draws_after(batch)
    weights = m.weights_at(mplan.first_step + batch)
    return {name: {"samples": samples[c] if samples else 0,
                   "epochs": draws[c] // size if size else 0, "weight": weights[name]}
            for c, (name, size) in enumerate(zip(m.names, m.sizes))}


def _save_mixture(settings):
    m = settings.dataset
    epoch, batch, mplan = mixture_point(settings)
    step = mplan.first_step + batch
    return {"version": VERSION, "epoch": epoch, "batch": batch, "start": mplan.position,
            **config(settings),
            "mixture": {"sources": dict(zip(m.names, m.sizes)), "step": step,
                        "draws": dict(zip(m.names, mplan.draws_after(batch))),
                        "plan": {"step": mplan.first_step,
                                 "draws": dict(zip(m.names, mplan.bases))},
                        "weights": m.fingerprint(mplan.first_step, step)}}


def _load_mixture(settings, state, mine):
    m = settings.dataset
    saved = state.get("mixture")
    sources = dict(zip(m.names, m.sizes))
    if not isinstance(saved, dict) or saved.get("sources") != sources:
        got = saved.get("sources") if isinstance(saved, dict) else None
        raise ValueError(f"the state was saved by a Mixture of {got!r} (name: samples), this "
                         f"loader's is of {sources!r}")
    _check_matching(state, mine)

    def counts(d):
        if not (isinstance(d, dict) and set(d) == set(m.names)
                and all(_is_int(d[k]) and d[k] >= 0 for k in m.names)):
            raise ValueError(f"invalid mixture stream positions in state: {d!r}")
        return [d[k] for k in m.names]

    epoch, batch, start = state.get("epoch"), state.get("batch"), state.get("start")
    old_world, step = state.get("world_size"), saved.get("step")
    plan_state = saved.get("plan") if isinstance(saved.get("plan"), dict) else {}
    first_step = plan_state.get("step")
    draws, bases = counts(saved.get("draws")), counts(plan_state.get("draws"))
    n = mine["num_samples"]
    if not (_is_int(epoch) and epoch >= 0 and _is_int(batch) and batch >= 0 and _is_int(start)
            and 0 <= start <= n and _is_int(old_world) and old_world >= 1
            and _is_int(first_step) and _is_int(step) and step == first_step + batch):
        raise ValueError(f"invalid position in state: epoch={epoch!r}, batch={batch!r}, "
                         f"start={start!r}, world_size={old_world!r}, step={step!r}")
    old = plan(settings, start, world_size=old_world, rank=0)
    if batch > old.num_batches:
        raise ValueError(f"invalid position in state: batch {batch} of an epoch of "
                         f"{old.num_batches} (world_size={old_world})")
    if old_world == settings.world_size and saved.get("weights") == m.fingerprint(first_step, step):
        # The same ranks and weights: the saved plan itself, the same batches.
        return Position(epoch, batch, start,
                        mixture=MixtureStart(epoch, start, first_step, tuple(bases)),
                        resumed=True)
    # Another world size or other weights: a plan from the saved point, every stream going on
    # from where the saving job's ranks left it together.
    reached = old.position_after(batch)
    if reached >= n:
        return Position(epoch + 1, mixture=MixtureStart(epoch + 1, 0, step, tuple(draws)),
                        resumed=True)
    return Position(epoch, 0, reached, mixture=MixtureStart(epoch, reached, step, tuple(draws)),
                    resumed=True)


_ORDERS = {"engine": "the engine (shuffle and seed)",
           "budget": "a stoker.Budget (batches by their cost)",
           "mixture": "a Mixture's weights",
           "stratified": 'a stratified or class-weighted order (shuffle="stratified", '
                         'class_weights), laid out for the ranks that saved the state',
           "sampler": "a custom sampler or batch_sampler",
           "iterable": "an IterableDataset"}
