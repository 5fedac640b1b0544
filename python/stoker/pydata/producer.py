"""The producer of Python datasets' batches: torch's checks, the plan of each epoch, and which
executor runs it.

Any map-style ``torch.utils.data.Dataset`` (or any object with ``__getitem__`` and ``__len__``) or
``IterableDataset``, with torch's keywords, checks and messages. Where a dataset can observe it,
Stoker behaves as torch does; what it cannot observe is Stoker's (shared-memory batches written in
place, native collation, the engine's order). The modules, one concern each:

- producer.py (this): torch's checks of the options, the plan of each epoch;
- batch_order.py: the one place the batch order is computed;
- scheduling.py: an epoch's dispatch, waiting, ordering and the one place a batch is delivered;
- policy.py: num_workers="auto"'s decision between this process and workers, from timings;
- workers.py: the worker pool interface (processes, threads) and what a worker runs;
- batch_maker.py: fetching and collating a batch; batch_structure.py: collation and shared
  memory;
- seeding.py (+ rng_fields.py): worker and per-sample seeds; remote_errors.py: errors from workers;
- messages.py: the typed messages between the training process and its workers.

Which executor (decided before the first sample wherever a dataset could tell the difference):
``num_workers=0``: this process (torch's num_workers=0). ``num_workers=N``: N workers started up
front; every ``__getitem__`` runs in one (torch's num_workers=N). ``num_workers="auto"``: an
IterableDataset runs here (more workers would each replay an unsharded stream); with a
``worker_init_fn``, ``persistent_workers=True`` or a ``timeout``, workers from the start; otherwise
this process measures the first batches and starts workers when they pay (policy.py), then keeps
producing while it waits (each sample sees the process it runs in).
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import multiprocessing
import multiprocessing.context
import os
import sys
import warnings
import weakref
from dataclasses import dataclass

import torch
from torch.utils.data import BatchSampler, IterableDataset

from .. import _native, balance
from .._checks import is_int
from ..budget import Budget, BudgetOrder
from .._options import check_knobs
from .._producer import Producer
from ..sources.base import StokerDataset
from ..gpu import feed as _feed
from . import seeding
from .batch_order import BatchOrder
from .batch_structure import pad_collate
from .policy import Decision, ExecutorPolicy
from .batch_maker import ProducerConfig
from .scheduling import PythonBatches, PoolSession
from .workers import ProcessPool, ThreadPool, WorkerSetup, _ArenaHandle

_log = logging.getLogger("stoker")
_MIN_SLOTS = 8
_MAX_AUTO_WORKERS = 16
# prefetch_factor="auto": the engine's default, 1 batch a worker above the engine's small batch.
_AUTO_PREFETCH = _native.pydata.DEFAULT_PREFETCH_FACTOR
_AUTO_PREFETCH_BYTES = _native.pydata.SMALL_BATCH_BYTES


def _free_threaded():
    return hasattr(sys, "_is_gil_enabled") and not sys._is_gil_enabled()


def _thread_safe(dataset):
    """Whether the dataset declares that its __getitem__ may run on several threads at once (a
    file object shared across calls, seek then read, would not allow it)."""
    return getattr(dataset, "thread_safe", False) is True


def _has_state(obj):
    return callable(getattr(obj, "state_dict", None)) and \
        callable(getattr(obj, "load_state_dict", None))


def _is_datapipe(dataset):
    from torch.utils.data import IterDataPipe
    return isinstance(dataset, IterDataPipe)


def validate(dataset, batch_size, shuffle, python, drop_last, num_workers, prefetch_factor):
    """torch.utils.data.DataLoader's argument checks, with its messages (``python``: the
    Python-only keywords given; the loader calls this before ``_options.parse``)."""
    sampler, batch_sampler = python.get("sampler"), python.get("batch_sampler")
    timeout = python.get("timeout", 0)
    persistent_workers = python.get("persistent_workers", False)
    if isinstance(dataset, IterableDataset):
        if not _is_datapipe(dataset) and shuffle not in (False, None):
            raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle "
                             f"option, but got shuffle={shuffle}")
        if sampler is not None:
            raise ValueError(f"DataLoader with IterableDataset: expected unspecified sampler "
                             f"option, but got sampler={sampler}")
        if batch_sampler is not None:
            raise ValueError(f"DataLoader with IterableDataset: expected unspecified "
                             f"batch_sampler option, but got batch_sampler={batch_sampler}")
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                             "shuffle, sampler, and drop_last")
    elif batch_size is None:
        if drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually "
                             "exclusive with drop_last")
    elif not isinstance(batch_size, Budget) and (not is_int(batch_size) or batch_size <= 0):
        raise ValueError(f"batch_size should be a positive integer value, but got "
                         f"batch_size={batch_size}")
    if num_workers != "auto" and (not is_int(num_workers)
                                  or num_workers < 0):
        raise ValueError("num_workers option should be non-negative; use num_workers=0 to "
                         "disable multiprocessing.")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError("timeout option should be non-negative")
    if num_workers == 0 and prefetch_factor not in ("auto", None):
        raise ValueError("prefetch_factor option could only be specified in multiprocessing. "
                         "let num_workers > 0 to enable multiprocessing, otherwise set "
                         "prefetch_factor to None.")
    if prefetch_factor is not None:  # the engine's rule (None: torch's value without workers)
        check_knobs(prefetch_factor=prefetch_factor)
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers option needs num_workers > 0")


def _context(value, num_workers):
    """multiprocessing_context as torch checks it: None, a start method's name or a context."""
    if value is None:
        return None
    if num_workers == 0:
        raise ValueError(f"multiprocessing_context can only be used with multi-process loading "
                         f"(num_workers > 0), but got num_workers={num_workers}")
    if isinstance(value, str):
        methods = multiprocessing.get_all_start_methods()
        if value not in methods:
            raise ValueError(f"multiprocessing_context option should specify a valid start "
                             f"method in {methods!r}, but got multiprocessing_context={value!r}")
        value = multiprocessing.get_context(value)
    if not isinstance(value, multiprocessing.context.BaseContext):
        raise TypeError(f"multiprocessing_context option should be a valid context object or a "
                        f"string specifying the start method, but got "
                        f"multiprocessing_context={value}")
    return value


def _warn_worker_count(n):
    """torch's warning for more workers than this machine suggests."""
    cores = _native.engine.usable_cores()
    if n > cores:
        warnings.warn(f"This DataLoader will create {n} worker processes in total. This machine "
                      f"has {cores} usable cores, fewer than the workers: excessive worker "
                      f"creation might get DataLoader running slow or even freeze; lower the "
                      f"worker number to avoid slowness or freezing if necessary.", stacklevel=5)


@dataclass
class _Plan:
    """What an epoch's iterator runs with (scheduling.PythonBatches)."""
    iterable: bool
    order: BatchOrder | None
    seed: int
    config: ProducerConfig
    session: PoolSession | None
    owns_session: bool
    measure: bool
    policy: ExecutorPolicy | None
    in_order: bool
    timeout: float
    consumer_produces: bool
    stream_seed: int | None
    pin_device: str | None
    origin: int  # the global position the epoch's plan starts at (an elastic resume)
    sampler_resume: object = None  # a stateful sampler's state as of the resumed batch
    note: object = None  # note(b, state): a stateful sampler's state after batch b


class PythonProducer(Producer):
    """Batches of a Python dataset (see the module docstring; _producer.py states the
    protocol)."""

    def __init__(self, dataset, options):
        o = options
        py = o.python
        batch_size, shuffle, drop_last = o.batch_size, o.shuffle, o.drop_last
        num_workers, prefetch_factor = o.num_workers, o.prefetch_factor
        sampler, batch_sampler = py["sampler"], py["batch_sampler"]
        if not (hasattr(dataset, "__getitem__") or hasattr(dataset, "__iter__")):
            raise TypeError(
                f"stoker.DataLoader needs a dataset: a Stoker dataset (ArrayDataset, "
                f"TokenDataset), or a Python one with __getitem__, got {type(dataset).__name__}")
        if o.shuffle == "shards" or o.shard_window != "auto":
            raise ValueError('shuffle="shards" and shard_window order the shards of a Stoker '
                             f'dataset that has them; {type(dataset).__name__} is a Python '
                             'dataset: pass shuffle=True')
        drop_last = o.drop_last
        iterable = isinstance(dataset, IterableDataset)
        if o.on_error == "skip" and iterable:
            raise ValueError('on_error="skip" needs a map-style dataset (replacements are drawn '
                             'from range(len(dataset)))')
        if not (isinstance(py["seed_samples"], bool) or py["seed_samples"] == "always"):
            raise ValueError(f'seed_samples must be True, False or "always", got '
                             f'{py["seed_samples"]!r}')
        if py["consumer_helps"] not in (None, True, False):
            raise TypeError(f"consumer_helps must be None, True or False, got "
                            f"{py['consumer_helps']!r}")
        if py["worker_type"] not in ("auto", "process", "thread"):
            raise ValueError(f'worker_type must be "auto", "process" or "thread", got '
                             f'{py["worker_type"]!r}')
        if not isinstance(py["in_order"], bool):
            raise ValueError(f"in_order must be True or False, got {py['in_order']!r}")
        stratified = o.stratified
        if stratified and (iterable or sampler is not None or batch_sampler is not None):
            raise ValueError('shuffle="stratified" and class_weights order the samples of a '
                             'map-style dataset: not with an IterableDataset, a sampler or a '
                             'batch_sampler')
        if stratified and batch_size is None:
            raise ValueError('shuffle="stratified" and class_weights need batch_size (batches '
                             'are what they balance)')
        if o.batch_transform is not None:
            raise ValueError(f"batch_transform={o.batch_transform.name} is for Stoker's image "
                             f"datasets (ImageFolder, TarShards, TableDataset), whose batches the "
                             f"engine makes; for a Python dataset, apply torchvision's MixUp or "
                             f"CutMix to each batch (in collate_fn or the training loop)")
        context = _context(py["multiprocessing_context"], num_workers)
        if context is None and isinstance(dataset, StokerDataset) and dataset._remote is not None:
            # A remote dataset's fetcher threads and its client's runtime do not survive a fork:
            # its worker processes start clean and rebuild it (from the node's cache).
            context = multiprocessing.get_context("forkserver")
        if isinstance(num_workers, int) and num_workers > 0:
            _warn_worker_count(num_workers)
        if _is_datapipe(dataset) and shuffle is not None:
            from torch.utils.data.graph_settings import apply_shuffle_settings
            dataset = apply_shuffle_settings(dataset, shuffle=shuffle)
        shuffle_arg = shuffle
        shuffle = bool(shuffle) if not iterable else False

        user_order = sampler is not None or batch_sampler is not None
        # A user's sampler or an IterableDataset orders every sample itself: no sharding.
        rank, world_size = (0, 1) if user_order or iterable else (o.rank, o.world_size)
        users_batch_sampler = batch_sampler  # BatchOrder groups a sampler's keys itself
        if sampler is not None and batch_sampler is None and batch_size is not None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)  # torch's attribute

        self.options = o
        self.dataset = dataset
        self.batch_size = batch_size if batch_sampler is None else None
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.persistent_workers = py["persistent_workers"]
        self._seed = None if py["generator"] is not None else o.seed
        self.generator = py["generator"]
        self.shuffle = shuffle
        self.rank, self.world_size = rank, world_size
        self.collate_fn = py["collate_fn"]
        self.worker_init_fn = py["worker_init_fn"]
        self.timeout = py["timeout"]
        self.output = o.output
        self.on_error = o.on_error
        self.seed_samples = py["seed_samples"]
        self.consumer_helps = py["consumer_helps"]
        self.worker_type = py["worker_type"]
        self.in_order = py["in_order"]
        self.pin_memory_device = py["pin_memory_device"]
        self._pin = o.pin_memory is True
        # Page-locked shared buffers (cuMemHostRegister, bounded by memory_budget, fenced when
        # their last tensor dies): with pin_memory=True or a CUDA device, when CUDA is present.
        # Registered in this process only: workers never touch CUDA.
        self._pinned_pool = (o.pin_memory is True or o.device is not None) and \
            _native.gpu.cuda_available()
        if self._pinned_pool:
            _feed.install_fence_provider()
        self._iterable = iterable
        self._auto_collation = batch_sampler is not None or batch_size is not None
        self.context = context
        self._num_workers_arg = num_workers
        self._prefetch_arg = None if prefetch_factor in ("auto", None) else prefetch_factor
        self._prefetch_auto = _AUTO_PREFETCH
        self._budget = _native.engine.resolve_memory_budget(o.memory_budget)
        plan = balance.stratified_plan(dataset, shuffle_arg, o.class_weights, o.labels,
                                       self.seed, batch_size, drop_last, rank, world_size) \
            if stratified else None
        self.classes, self.weights = (plan.classes, plan.weights) if plan is not None \
            else (None, [])
        if plan is not None:
            self.shuffle = shuffle_arg
        self.order_kind = o.order
        if o.budget is not None:  # batches by a budget: the plan of the lengths (budget.py)
            self.budget_order = BudgetOrder(o.budget, dataset, lambda: self.seed, shuffle, rank,
                                            world_size, o.on_error)
        self._order = None if iterable else BatchOrder(
            dataset, batch_size if users_batch_sampler is None else None, shuffle, drop_last,
            rank, world_size, batch_sampler=users_batch_sampler,
            sampler=sampler if users_batch_sampler is None else None,
            stratified=plan.plan if plan is not None else None, repeats=o.repeats,
            budget=self.budget_order)
        self._shared_pool = None
        self._session = None  # the persistent workers, when there are
        self._policy = None
        self._auto_decision = None  # num_workers="auto": what the first epoch decided
        self._task_ids = itertools.count()
        self._next_epoch = 0  # the epoch of the iteration that starts next (worker seeds)
        self._last_iterator = None
        self._IterableDataset_len_called = None
        self._len_called_at_iter = None  # its value when iter() made the latest iteration
        # A stateful user's sampler: its state after each batch of the running iteration
        # (batch -> state, the delivered one's and those ahead of it), and the state a loaded
        # resume state gives the next iteration (own_states, restore_own_states).
        self._sampler_states = {}
        self._sampler_resume = None
        self._stream_resume = None  # an IterableDataset resumed mid-epoch: "state" or "replay"
        self._stats = collections.Counter()
        self._skipped_samples = collections.deque(maxlen=_native.engine.SKIPPED_LISTED)
        self._mode, self._kind, self._workers_n, self._consumer_produces = self._executor()

    def attributes(self):
        """The loader's attributes as torch names them."""
        return {"dataset": self.dataset, "batch_size": self.batch_size,
                "shuffle": self.shuffle, "drop_last": self.drop_last, "rank": self.rank,
                "world_size": self.world_size, "sampler": self.sampler,
                "batch_sampler": self.batch_sampler,
                "persistent_workers": self.persistent_workers, "generator": self.generator,
                "collate_fn": self.collate_fn, "worker_init_fn": self.worker_init_fn,
                "timeout": self.timeout, "seed_samples": self.seed_samples,
                "consumer_helps": self.consumer_helps, "worker_type": self.worker_type,
                "in_order": self.in_order, "pin_memory_device": self.pin_memory_device}

    @property
    def seed(self):
        """The seed of the order and of the sample keys (drawn once from ``generator``)."""
        if self._seed is None:
            self._seed = int(torch.empty((), dtype=torch.int64).random_(
                generator=self.generator).item()) & _native.pydata.SEED_MASK
        return self._seed

    @property
    def prefetch_factor(self):
        return self._prefetch_arg if self._prefetch_arg is not None else self._prefetch_auto

    def knobs(self):
        return {"num_workers": self._workers_n, "prefetch_factor": self.prefetch_factor,
                "pin_memory": self._pin, "memory_budget": self._budget}

    def persistent_iterator(self):
        """The latest iterator, with persistent workers (as torch keeps it)."""
        it = self._last_iterator() if self._last_iterator is not None else None
        return it if self.persistent_workers else None

    def stop_workers(self):
        self._last_iterator = None
        if self._session is not None:
            self._session.pool.shutdown()
            self._session = None

    def shutdown(self):
        self.stop_workers()

    @property
    def auto_collation(self):
        return self._auto_collation

    # -- which executor ----------------------------------------------------------------------------

    def _executor(self):
        """(mode, worker kind, worker count, whether this process produces while workers run).
        mode: "local" (this process), "pool" (workers from the start) or "measure" (auto)."""
        n = self._num_workers_arg
        cores = min(_native.engine.usable_cores(), _MAX_AUTO_WORKERS)
        threads = self.worker_type == "thread" or (
            self.worker_type == "auto" and _free_threaded() and _thread_safe(self.dataset))
        kind = "threads" if threads else "processes"
        helps = self.consumer_helps
        if n == 0:
            return "local", None, 0, True
        if n != "auto":  # an IterableDataset's stream is the workers' own: no help with it
            return "pool", kind, n, helps is True and not self._iterable
        if self._iterable:
            return "local", None, 0, True
        if self.worker_init_fn is not None or self.persistent_workers or self.timeout or \
                helps is False or threads:
            return "pool", kind, cores if threads or not helps else max(1, cores - 1), \
                helps is True
        return "measure", "processes", max(1, cores - 1), True

    def _has_workers(self):
        return self._mode != "local"

    def _new_task_id(self):
        return next(self._task_ids)

    def _prefetch_now(self):
        return self.prefetch_factor

    def _note_batch_bytes(self, nbytes):
        if self._prefetch_arg is None and nbytes > _AUTO_PREFETCH_BYTES:
            self._prefetch_auto = 1

    def _config(self):
        threads = self._kind == "threads" or (self._auto_decision is not None and
                                              self._auto_decision.kind == "threads")
        collate_fn, batch_size = self.collate_fn, self.batch_size
        if self.budget_order is not None:  # unequal lengths: padded unless the user collates
            batch_size = None  # (an IterableDataset's count; a budget is never one's)
            if collate_fn is None:
                collate_fn = functools.partial(pad_collate,
                                               pad_to_multiple_of=self.options.budget.pad_to_multiple_of)
        return ProducerConfig(
            seed=self.seed, seed_samples=False if threads else self.seed_samples,
            collate_fn=collate_fn, auto_collation=self._auto_collation,
            batch_size=batch_size, drop_last=self.drop_last, on_error=self.on_error,
            size=len(self.dataset) if self.on_error == "skip" else 0)

    def _shared(self, workers):
        """The loader's shared-memory batch buffers (made once, sized for ``workers``)."""
        if self._shared_pool is None:
            slots = max(_MIN_SLOTS, 2 * self.prefetch_factor * workers + 2)
            buffer_bytes = max(4096, self._budget // slots // 4096 * 4096)
            self._shared_pool = _native.pydata.SharedPool(buffer_bytes, buffer_bytes * slots,
                                                   pinned=self._pinned_pool)
        return self._shared_pool

    def _start_workers(self, decision, epoch=None):
        """A PoolSession of ``decision.workers`` processes or threads, kept by the loader when
        its workers persist."""
        n = decision.workers
        if decision.kind == "threads":
            pool = ThreadPool(n, self.dataset, self._config(), self.worker_init_fn)
            session = PoolSession(pool, None)
            self._stats["worker_threads"] = n
        else:
            context = self.context or multiprocessing.get_context()
            shared = self._shared(n)
            base = seeding.base_seed(self.seed, self._next_epoch - 1 if epoch is None else epoch)
            config = self._config()
            parent = os.getpid()
            datapipe = _is_datapipe(self.dataset)
            handle = _ArenaHandle(shared.arena)
            pool = ProcessPool(n, context, lambda w: WorkerSetup(
                w, n, self.dataset, config, base, self.worker_init_fn, handle, parent, datapipe))
            session = PoolSession(pool, shared)
            self._stats["worker_processes"] = n
        if self._mode == "measure":
            self._auto_decision = decision
            self._workers_n = n
        if self.persistent_workers:
            self._session = session
        return session

    def _plan(self, epoch, origin):
        session, owned, measure, policy = None, False, False, None
        consumer = self._consumer_produces
        if self._mode == "pool" or (self._mode == "measure" and self._auto_decision is not None
                                    and self._auto_decision.kind != "stay"):
            if self._session is not None and self._session.pool.alive:
                session = self._session
            else:
                decision = Decision(self._kind, self._workers_n, "asked for") \
                    if self._mode == "pool" else self._auto_decision
                session = self._start_workers(decision, epoch)
            owned = not self.persistent_workers
            if self._mode == "measure" and self._auto_decision.workers >= self._policy.cores:
                # One worker a core (heavy batches, policy.py): this process's help with a
                # batch would hold up the ones workers finish meanwhile; it only waits.
                consumer = False
        elif self._mode == "measure" and self._auto_decision is None:
            measure = True
            if self._policy is None:
                context = self.context or multiprocessing.get_context()
                self._policy = ExecutorPolicy(
                    min(_native.engine.usable_cores(), _MAX_AUTO_WORKERS),
                    forked=context.get_start_method() == "fork",
                    persistent=self.persistent_workers,
                    threads_allowed=(self.worker_type == "auto" and self.seed_samples is False
                                     and _thread_safe(self.dataset)),
                    batch_size=self.budget_order.plan.max_batch_size
                    if self.budget_order is not None else self.batch_size or 1)
            policy = self._policy
        stream_seed = None
        if _is_datapipe(self.dataset):  # torch's shared seed, drawn for every epoch
            stream_seed = int(torch.empty((), dtype=torch.int64).random_(
                generator=self.generator).item())
            if session is None:
                from .workers import _seed_datapipe
                _seed_datapipe(self.dataset, stream_seed)
        pin = None
        if self._pin and torch.cuda.is_available():
            pin = self.pin_memory_device or "cuda"
        return _Plan(self._iterable, self._order, self.seed, self._config(), session, owned,
                     measure, policy, self.in_order, self.timeout, consumer, stream_seed, pin,
                     origin)

    # -- iteration ---------------------------------------------------------------------------------

    def num_batches(self):
        if self._iterable:
            n = self._IterableDataset_len_called = len(self.dataset)  # TypeError without a len
            if not self._auto_collation:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return len(self._order)

    __len__ = num_batches  # the epoch iterator's len() when the length is the dataset's

    def batches(self, cursor):
        epoch, start = cursor.epoch, cursor.batch
        self._next_epoch = epoch + 1
        plan = self._plan(epoch, cursor.budget if cursor.budget is not None else cursor.start)
        states = self._sampler_states = {}
        resume, self._sampler_resume = self._sampler_resume, None

        def note(b, state):  # keeps the delivered batch's state and those ahead of it
            states[b] = state
            for k in [k for k in states if k < cursor.batch - 1]:
                del states[k]

        plan.sampler_resume, plan.note = resume, note
        if not (self._iterable and start):
            it = PythonBatches(self, epoch, start, plan, cursor)
        else:
            it = self._resume_stream(epoch, start, plan, cursor)
        self._last_iterator = weakref.ref(it)
        return it

    def iteration_made(self):
        self._len_called_at_iter = self._IterableDataset_len_called

    def _resume_stream(self, epoch, start, plan, cursor):
        """An IterableDataset's iteration resumed at batch ``start``: through the dataset's own
        state when it was saved where the stream ran (restore_own_states loaded it, and the
        stream goes on from there), else by replaying: the first ``start`` batches are made
        again and dropped (their cost: reading those samples again), counted in
        ``stats()["replayed_batches"]``."""
        mode, self._stream_resume = self._stream_resume or "replay", None
        if mode == "state":
            return PythonBatches(self, epoch, start, plan, cursor)
        _log.info("resuming %s at batch %d by replaying the stream (the dataset has no "
                  "state_dict, or its state was saved with workers)",
                  type(self.dataset).__name__, start)
        cursor.batch = 0
        it = PythonBatches(self, epoch, 0, plan, cursor)
        for _ in range(start):
            next(it)  # StopIteration: the stream is shorter than the saved position
            self._stats["replayed_batches"] += 1
        self._stats["batches"] -= start
        return it

    # -- the states of the user's objects (torchdata's StatefulDataLoader contract) ----------------

    def own_states(self, cursor):
        """What the loader's state carries of the user's objects, given the running iteration's
        ``cursor`` (None between iterations): a stateful sampler's state as of the last batch
        delivered, the dataset's ``state_dict()`` (an IterableDataset's only mid-epoch, and
        only from this process: "stream" says whether it resumes through it or by replay)."""
        out = {}
        ds = self.dataset
        # The same keys whenever the user's objects are stateful, iterated or not: Distributed
        # Checkpoint loads the keys of the loading loader's own state_dict() only.
        if self._order is not None:
            if cursor is not None and cursor.batch - 1 in self._sampler_states:
                out["sampler_state"] = self._sampler_states[cursor.batch - 1]
                out["sampler_finished"] = not cursor.running()
            elif self._sampler_resume is not None:  # loaded, not yet iterated
                out["sampler_state"] = self._sampler_resume
                out["sampler_finished"] = False
            else:  # before the first epoch
                pending = self._order.pending_state()
                if pending is not None:
                    out["sampler_state"], out["sampler_finished"] = pending, False
        stateful_ds = _has_state(ds) and not isinstance(ds, StokerDataset)
        if self._iterable:
            mid = cursor is not None and cursor.running() and cursor.batch
            by_state = stateful_ds and self._mode == "local"
            out["stream"] = ("state" if by_state else "replay") if mid else None
            if stateful_ds:  # loaded only when the stream resumes through it
                out["dataset_state"] = ds.state_dict()
        elif stateful_ds:
            out["dataset_state"] = ds.state_dict()
        return out

    def restore_own_states(self, state, position):
        """Loads what ``own_states`` saved in ``state`` for the iteration that resumes at
        ``position`` (an ``_state.Position``)."""
        ds = self.dataset
        stream = state.get("stream") if self._iterable and position.batch else None
        if "dataset_state" in state and (stream == "state" or not self._iterable):
            if not _has_state(ds):
                raise ValueError(f"the state holds a dataset state, and this loader's dataset "
                                 f"{type(ds).__name__} has no load_state_dict")
            ds.load_state_dict(state["dataset_state"])
            self.stop_workers()  # workers start again with the restored dataset
        if self._iterable:
            self._stream_resume = stream
        if "sampler_state" in state:
            if state.get("sampler_finished"):
                self._order.finish_state(state["sampler_state"])
            else:  # mid-epoch, or an epoch's start: its iterator goes on from the state
                self._sampler_resume = state["sampler_state"]

    def stats(self):
        s = dict(self._stats)
        for k in ("batches", "samples", "pickled_batches", "skipped", "worker_processes",
                  "worker_threads"):
            s.setdefault(k, 0)
        s["skipped_samples"] = list(self._skipped_samples)
        pool = self._shared_pool
        s.update(pinned_bytes=pool.pinned_bytes if pool else 0,
                 fenced_buffers=pool.fenced_buffers if pool else 0,
                 worker_type=self.worker_type,
                 auto_decision=(self._auto_decision.kind if self._auto_decision else None),
                 buffer_bytes=pool.bytes_allocated if pool else 0,
                 buffer_bytes_peak=pool.peak_bytes_allocated if pool else 0,
                 batch_bytes=pool.buffer_bytes if pool else 0)
        return s
