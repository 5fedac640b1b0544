"""``stoker.Budget``: batches by a budget of tokens, seconds or pixels instead of a sample count.

``DataLoader(ds, batch_size=stoker.Budget(tokens=16384))`` forms each epoch's batches so that a
batch's cost (by default its padded size: the batch's sample count times its longest sample)
never exceeds the budget, from the samples' lengths, known without reading a sample: a
``TokenDataset(pack=None)``'s document lengths from its index, or ``lengths=`` for any dataset.
Samples are bucketed by length; each step gives every rank one batch of one bucket, so every
rank has the same number of batches (no DDP hang) and their costs differ little. The plan is a
pure function of (lengths, the budget, seed, epoch, world size): C++ (include/stoker/budget.h),
a few seconds for millions of samples. docs/budget.md says the rules.
"""

from __future__ import annotations

import collections.abc
import math

import numpy as np

from . import _native
from ._checks import is_int
from .sources.base import StokerDataset

__all__ = ["Budget"]

_UNITS = ("tokens", "seconds", "pixels", "samples")
_COSTS = ("padded", "sum", "quadratic")
_REMAINDERS = ("drop", "repeat")


class Budget:
    """A batch's budget, for ``DataLoader(batch_size=...)``.

    Args:
        tokens, seconds, pixels, samples: the budget, exactly one of them, in the unit of the
            samples' lengths (a token count, a duration, an image's height x width; a sample
            counts 1: ``samples=N`` is N samples a batch, each batch from one bucket, what a
            dataset in buckets of its own, such as images in aspect-ratio buckets, makes of
            ``batch_size=N``).
        cost: how a batch is charged against the budget: ``"padded"`` (its sample count times
            its longest length: what padding costs), ``"sum"`` (its lengths' sum) or
            ``"quadratic"`` (count x (L + L^2 / quadratic_length), L the longest: attention's
            cost, Lhotse's quadratic duration). A batch never costs more than the budget.
        buckets: ``"auto"`` (up to 32 buckets chosen from the lengths, each holding about the same
            total length) or increasing upper bounds of the buckets (the last bucket is open).
        max_batch_size: the most samples a batch holds, whatever the budget (None: no limit).
        lengths: the samples' lengths: an array (one a sample), or a callable ``index -> length``
            (called once per sample when the loader is made); None: the dataset's own.
        pad_to_multiple_of: a variable-length field's padded length rounds up to this (8 for
            tensor cores).
        remainder: what happens to a bucket's last batches that do not make a whole step for
            every rank: ``"drop"`` (they wait for the next epoch; counted in
            ``stats()["budget"]``) or ``"repeat"`` (the bucket's first batches are repeated to
            make up the step; counted too).
        quadratic_length: ``cost="quadratic"``'s length scale (None: the longest sample's).
    """

    def __init__(self, tokens=None, seconds=None, pixels=None, samples=None, *, cost="padded",
                 buckets="auto",
                 max_batch_size=None, lengths=None, pad_to_multiple_of=1, remainder="drop",
                 quadratic_length=None):
        given = {u: v for u, v in zip(_UNITS, (tokens, seconds, pixels, samples)) if v is not None}
        if len(given) != 1:
            raise ValueError(f"Budget takes one of tokens=, seconds=, pixels= or samples=, got "
                             f"{', '.join(given) or 'none'}")
        (self.unit, value), = given.items()
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value) or value <= 0:
            raise ValueError(f"Budget({self.unit}=...) must be a positive number, got {value!r}")
        self.value = value
        if cost not in _COSTS:
            raise ValueError(f"cost must be one of {', '.join(map(repr, _COSTS))}, got {cost!r}")
        self.cost = cost
        if isinstance(buckets, str):
            if buckets != "auto":
                raise ValueError(f'buckets must be "auto" or increasing bounds, got {buckets!r}')
            bounds = None
        else:
            try:
                bounds = [float(b) for b in buckets]
            except (TypeError, ValueError):
                raise ValueError(f'buckets must be "auto" or increasing bounds, got '
                                 f"{buckets!r}") from None
            if not bounds or any(not math.isfinite(b) or b <= 0 for b in bounds) or any(
                    b <= a for a, b in zip(bounds, bounds[1:])):
                raise ValueError(f"buckets must be positive, increasing bounds, got {buckets!r}")
        self.buckets = bounds
        if max_batch_size is not None and not (is_int(max_batch_size) and max_batch_size >= 1):
            raise ValueError(f"max_batch_size must be None or a positive integer, got "
                             f"{max_batch_size!r}")
        self.max_batch_size = max_batch_size
        if lengths is not None and not callable(lengths) and not isinstance(
                lengths, (collections.abc.Sequence, np.ndarray)) and not hasattr(lengths, "__array__"):
            raise ValueError(f"lengths must be None, an array (one length a sample) or a callable "
                             f"index -> length, got {type(lengths).__name__}")
        self.lengths = lengths
        if not (is_int(pad_to_multiple_of) and pad_to_multiple_of >= 1):
            raise ValueError(f"pad_to_multiple_of must be a positive integer, got "
                             f"{pad_to_multiple_of!r}")
        self.pad_to_multiple_of = pad_to_multiple_of
        if remainder not in _REMAINDERS:
            raise ValueError(f"remainder must be \"drop\" or \"repeat\", got {remainder!r}")
        self.remainder = remainder
        if quadratic_length is not None and (isinstance(quadratic_length, bool) or not isinstance(
                quadratic_length, (int, float)) or not quadratic_length > 0):
            raise ValueError(f"quadratic_length must be None or a positive number, got "
                             f"{quadratic_length!r}")
        self.quadratic_length = quadratic_length

    def describe(self):
        """The budget as the resume state records it (JSON; a state loads only with the same)."""
        return {self.unit: self.value, "cost": self.cost,
                "buckets": "auto" if self.buckets is None else self.buckets,
                "max_batch_size": self.max_batch_size,
                "pad_to_multiple_of": self.pad_to_multiple_of, "remainder": self.remainder,
                "quadratic_length": self.quadratic_length}

    def __repr__(self):
        args = [f"{self.unit}={self.value!r}"]
        if self.cost != "padded":
            args.append(f"cost={self.cost!r}")
        if self.buckets is not None:
            args.append(f"buckets={self.buckets!r}")
        for name in ("max_batch_size", "quadratic_length"):
            if getattr(self, name) is not None:
                args.append(f"{name}={getattr(self, name)!r}")
        if self.pad_to_multiple_of != 1:
            args.append(f"pad_to_multiple_of={self.pad_to_multiple_of}")
        if self.remainder != "drop":
            args.append(f"remainder={self.remainder!r}")
        return f"Budget({', '.join(args)})"

    def __eq__(self, other):
        return isinstance(other, Budget) and self.describe() == other.describe()

    def __hash__(self):
        return hash(repr(self))

    def lengths_of(self, dataset):
        """Every sample's length (float64) in this budget's unit: ``lengths`` as given, else the
        dataset's own (``_lengths(unit)``, sources/base.py). ValueError where there are none."""
        given = self.lengths
        if given is None and self.unit == "samples":
            given = np.ones(len(dataset))
        if given is None:
            if not isinstance(dataset, StokerDataset):
                raise ValueError(f"Budget({self.unit}=...) needs the samples' lengths: pass "
                                 f"Budget(..., lengths=...) (an array, or a callable index -> "
                                 f"length) for a {type(dataset).__name__}")
            values = dataset._lengths(self.unit)
        elif callable(given):
            values = [given(i) for i in range(len(dataset))]
        else:
            values = given
        out = np.ascontiguousarray(np.asarray(values, dtype=np.float64).reshape(-1))
        n = len(dataset)
        if out.shape[0] != n:
            raise ValueError(f"Budget lengths: {out.shape[0]} given for {n} samples")
        bad = np.flatnonzero(~np.isfinite(out) | (out < 0))
        if bad.size:
            raise ValueError(f"Budget lengths: sample {int(bad[0])} has length {out[bad[0]]!r}; "
                             f"lengths must be finite and >= 0")
        return out

    def plan(self, lengths, bucket_of=None):
        """The native plan (``_native.engine.BudgetPlan``) of samples with these ``lengths``: its
        ``epoch(seed, epoch, shuffle, rank, world_size, consumed)`` lays out an epoch.
        ``bucket_of``: each sample's bucket where a dataset gives them (no bounds then)."""
        lengths = np.ascontiguousarray(np.asarray(lengths, dtype=np.float64).reshape(-1))
        if bucket_of is not None and self.buckets is not None:
            raise ValueError(f"{self!r}: the dataset puts its samples in buckets of its own "
                             f"(aspect ratios); give no bucket bounds")
        return _native.engine.BudgetPlan(
            lengths, float(self.value), self.cost, float(self.quadratic_length or 0.0),
            self.buckets or [], self.max_batch_size or 0, self.remainder,
            [] if bucket_of is None else [int(b) for b in bucket_of])


def dataset_buckets(dataset):
    """The buckets a dataset puts its samples in (``_buckets()``, sources/base.py: images in
    aspect-ratio buckets), whose batches must not mix; None for most datasets."""
    return dataset._buckets() if isinstance(dataset, StokerDataset) else None


class BudgetOrder:
    """A loader's budget order (order kind "budget"): the plan of its dataset's lengths, made
    once, and the epochs it lays out, the last few kept (a producer owns one; ``_state`` asks it
    for the epoch of a position). Samples over the budget alone: a SampleError naming the first
    with ``on_error="raise"``, else left out and counted (``oversized``)."""

    def __init__(self, budget, dataset, seed, shuffle, rank, world_size, on_error, path=None):
        self.budget = budget
        self._seed, self.shuffle = seed, bool(shuffle)  # seed: an int, or a callable giving it
        self.rank, self.world_size = rank, world_size
        self.lengths = budget.lengths_of(dataset)
        self.plan = budget.plan(self.lengths, dataset_buckets(dataset))
        self.oversized = len(self.plan.oversized)
        if self.oversized and on_error == "raise":
            from .errors import SampleError
            i = int(self.plan.oversized[0])
            where = path(i) if path is not None else ""
            raise SampleError(
                f"sample {i}{f' ({where})' if where else ''} is {self.lengths[i]:g} "
                f"{budget.unit} long: alone it costs more than {budget!r} allows "
                f"({self.oversized} sample(s) do); raise the budget, or on_error=\"skip\" leaves "
                f"them out (counted)", i, where)
        self._epochs = {}  # (epoch, consumed, rank, world_size) -> BudgetEpoch, the last few

    @property
    def seed(self):
        return self._seed() if callable(self._seed) else self._seed

    @property
    def bounds(self):
        return list(self.plan.bucket_bounds)

    @property
    def num_buckets(self):
        return self.plan.num_buckets

    def epoch(self, epoch, consumed=None, rank=None, world_size=None):
        """The BudgetEpoch of ``rank`` (default: the loader's) of ``world_size`` for ``epoch``
        from the buckets' ``consumed`` counts (None: the epoch's start)."""
        rank = self.rank if rank is None else rank
        world_size = self.world_size if world_size is None else world_size
        key = (epoch, None if consumed is None else tuple(consumed), rank, world_size)
        if key not in self._epochs:
            if len(self._epochs) >= 4:
                self._epochs.pop(next(iter(self._epochs)))
            self._epochs[key] = self.plan.epoch(self.seed, epoch, self.shuffle, rank, world_size,
                                                list(consumed or []))
        return self._epochs[key]

    def stats(self, epoch, engine=None):
        """``loader.stats()["budget"]`` for the running (or pending) ``epoch`` (a BudgetEpoch);
        ``engine``: the engine's stats, whose delivered ragged rows give the padding measured."""
        padded = epoch.padded_length
        out = {"budget": self.budget.value, "unit": self.budget.unit, "cost": self.budget.cost,
               "buckets": self.plan.num_buckets, "batches": epoch.num_batches,
               "padding_fraction": 1 - epoch.real_length / padded if padded else 0.0,
               "mean_cost_spread": epoch.mean_cost_spread,
               "max_cost_spread": epoch.max_cost_spread,
               "repeated_batches": epoch.repeated_batches,
               "dropped_batches": epoch.dropped_batches,
               "dropped_samples": epoch.dropped_samples, "oversized": self.oversized}
        if engine and engine.get("ragged_padded_rows"):
            out["delivered_padding_fraction"] = \
                1 - engine["ragged_rows"] / engine["ragged_padded_rows"]
        return out
