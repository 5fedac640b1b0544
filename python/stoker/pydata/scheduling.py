"""One epoch of a Python dataset's batches: dispatch, wait, order, deliver.

A ``PythonBatches`` (one epoch's batches of a Python dataset) takes batches from the epoch's order (batch_order.py) and has them produced by
its worker pool (workers.py) and, when its plan says so, by the training process itself:

- ``num_workers=0``: every batch here, when it is asked for (torch's num_workers=0).
- ``num_workers=N``: every batch in the N workers, started before the first batch; batch k goes to
  worker k mod N (IterableDataset: round-robin over the workers whose stream has not ended), with
  ``prefetch_factor`` batches a worker in flight (torch's num_workers=N).
- ``num_workers="auto"`` (policy.py): this process produces the first batches while it measures;
  when workers pay, it starts them and keeps producing too: while the batch due is not ready, it
  produces the next batch no worker has yet. Each sample sees where it runs: get_worker_info() is
  None here (and worker_init_fn never ran here), a worker's info in a worker.

Batches are delivered in order (``in_order=False``: in the order they are ready). ``_deliver`` is
the one place a finished batch is handed to the caller (statistics, NumPy output, pinning).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
import warnings
import weakref

import torch

from .._tree import tree_map
from . import batch_structure, seeding
from ..errors import WorkerError
from .messages import BatchDone, Slot, StreamEnd, Task, TaskFailed
from .batch_maker import BatchMaker
from .remote_errors import local_exception, to_exception

_WAIT_SLICE_S = 1.0


class DataLoaderTimeout(RuntimeError, TimeoutError):
    """No batch within ``timeout`` seconds (a RuntimeError, as torch raises)."""


@dataclasses.dataclass
class _Pending:
    """A batch of the epoch on its way: with a worker (``worker``) or produced here."""
    batch_no: int
    worker: int | None
    lease: object = None
    answer: object = None  # the worker's BatchDone / TaskFailed / StreamEnd
    batch: object = None  # produced here: the batch, its sample count, or the error it raised
    samples: int = 0
    error: BaseException | None = None
    done: bool = False


class PoolSession:
    """A worker pool with what is still in flight on it: the answers of an epoch that ended early
    (``break``) are awaited before the pool serves the next epoch, so that no buffer is reused
    while a worker may still write it."""

    def __init__(self, pool, shared_pool):
        self.pool = pool
        self.shared_pool = shared_pool
        self.outstanding = {}  # task id -> _Pending of an epoch that ended early

    def drain(self):
        while self.outstanding:
            for _, answer in self.pool.wait(_WAIT_SLICE_S):
                self.outstanding.pop(answer.task_id, None)


def _close_epoch(session, pending, owned):
    """Ends an epoch's use of its pool: a pool it owns is stopped before the buffers of the batches
    still in flight are released; a persistent pool keeps them until their answers arrive."""
    if session is None:
        pending.clear()
        return
    if owned:
        session.pool.shutdown()
        pending.clear()
    else:
        session.outstanding.update((tid, p) for tid, p in pending.items() if p.worker is not None
                                   and not p.done)
        pending.clear()


class PythonBatches:
    def __init__(self, producer, epoch, start, plan, cursor):
        self._producer = producer  # the PythonProducer
        self.cursor = cursor  # this iteration's _state.Cursor: it advances cursor.batch
        self.epoch = epoch
        self.plan = plan
        self.iterable = plan.iterable
        self.order = None if plan.iterable else plan.order.batches(
            plan.seed, epoch, start, plan.origin, plan.sampler_resume, plan.note)
        self.total = None if plan.iterable else plan.order.num_batches(plan.origin)
        self.length = None if plan.iterable else self.total - start
        self.exhausted = False
        self.done = False
        self.pending = collections.OrderedDict()  # task id -> _Pending, in the epoch's order
        self.session = plan.session
        self.owned = plan.owns_session
        self.active = list(range(self.session.pool.size)) if self.session else []
        self.rr = 0
        self.next_batch_no = start
        self.local = None  # the BatchMaker of this process, made when it first produces
        self.policy = plan.policy if plan.measure else None
        self.measured = False  # the first batch was timed by chunks
        self.delivered = 0
        self.len_called = producer._len_called_at_iter  # as torch's iterator, when made
        self._finalizer = weakref.finalize(self, _close_epoch, self.session, self.pending,
                                           self.owned)
        if self.session is not None:
            self.session.drain()

    # -- torch's iterator attributes ---------------------------------------------------------------

    @property
    def _workers(self):
        return self.session.pool.processes if self.session is not None else []

    def _shutdown_workers(self):
        if self.session is not None:
            self.session.pool.shutdown()
        self.done = True

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._producer) if self.length is None else self.length - self.delivered

    # -- producing here ---------------------------------------------------------------------------

    def _local_maker(self):
        if self.local is None:
            self.local = BatchMaker(self._producer.dataset, self.plan.config)
        return self.local

    def _pull(self):
        """The next (batch number, Draws) of the order; (batch number, None) for an
        IterableDataset; None when the order is exhausted."""
        if self.iterable:
            b = self.next_batch_no
            self.next_batch_no += 1
            return b, None
        nxt = next(self.order, None)
        if nxt is None:
            self.exhausted = True
        return nxt

    def _produce_here(self):
        """Produces the next batch of the order in this process: a done _Pending (its batch or
        its error), or None when the epoch has no more."""
        nxt = self._pull()
        if nxt is None:
            return None
        b, draws = nxt
        state = _Pending(b, None, done=True)
        t0 = time.perf_counter()
        try:
            if self.policy is not None and self.session is None and draws is not None \
                    and not self.measured:
                self.measured = True
                batch = self._produce_measured(b, draws)
            else:
                batch = self._local_maker().produce_here(self.epoch, draws, b)
        except Exception as e:
            state.error = e
            return state
        if batch is None:  # the end of an IterableDataset
            self.exhausted = True
            return None
        state.batch = batch
        state.samples = (len(draws) if self.plan.config.auto_collation else 1) \
            if draws is not None else batch_structure.batch_len(batch)
        if self.policy is not None and self.session is None and draws:
            left = (self.total - b - 1) * len(draws)
            self._decide(self.policy.after_batch((time.perf_counter() - t0) / len(draws), left))
        return state

    def _produce_measured(self, b, draws):
        """The epoch's first batch here, in timed chunks: the policy may start workers (for the
        batches after this one) from the first two chunks' pace, after a thread trial if the
        dataset allows one."""
        p = self._local_maker()
        n = len(draws)
        chunk = -(-n // 16)
        bounds = [(k, min(k + chunk, n)) for k in range(0, n, chunk)]
        parts = [draws.part(*r) for r in bounds]
        samples, pace = [], float("inf")
        with seeding.caller_states_kept(self.plan.config.seed_samples is not False):
            try:
                for part in parts[:2]:
                    t0 = time.perf_counter()
                    samples += p.fetch(self.epoch, part, b)
                    pace = min(pace, (time.perf_counter() - t0) / len(part))
                rest = parts[2:]
                decision = None
                if self.policy.wants_thread_trial() and len(rest) >= 6:
                    # two chunks a thread: one chunk's time is too noisy on a busy machine
                    two = [draws.part(bounds[k][0], bounds[k + 1][1]) for k in (2, 4)]
                    got, seconds = self._thread_trial(*two, b)
                    samples += got
                    rest = rest[4:]
                    decision = self.policy.thread_trial(pace, seconds)
                if decision is None or decision.kind == "stay":
                    decision = self.policy.first_chunks(pace, sum(map(len, rest)))
                self._decide(decision)
                for part in rest:
                    samples += p.fetch(self.epoch, part, b)
            except Exception as e:
                raise local_exception(e) from e
        return p.collate(samples)

    def _thread_trial(self, mine, theirs, b):
        """Two threads fetch a chunk each side by side: (samples in order, wall seconds a
        sample)."""
        helper = BatchMaker(self._producer.dataset, self.plan.config, seed_samples=False)
        out, errors = [], []

        def run():
            try:
                out.append(helper.fetch(self.epoch, theirs, b))
            except Exception as e:
                errors.append(e)
        t0 = time.perf_counter()
        thread = threading.Thread(target=run)
        thread.start()
        try:
            got = self._local_maker().fetch(self.epoch, mine, b)
        finally:
            thread.join()
        seconds = (time.perf_counter() - t0) / (len(mine) + len(theirs))
        self._count_skipped(helper.take_skipped())
        if errors:
            raise errors[0]
        return got + out[0], seconds

    def _decide(self, decision):
        if decision.kind == "stay":
            return
        self.session = self._producer._start_workers(decision, self.epoch)
        self.owned = not self._producer.persistent_workers
        self.active = list(range(self.session.pool.size))
        self.policy = None
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _close_epoch, self.session, self.pending,
                                           self.owned)

    # -- dispatching and receiving ----------------------------------------------------------------

    def _in_flight(self):
        """Batches dispatched to workers and not yet delivered (done or not, as torch counts its
        outstanding tasks): each holds a buffer, so prefetch bounds the buffers in use too."""
        return sum(1 for p in self.pending.values() if p.worker is not None)

    def _fill(self):
        if self.session is None:
            return
        while not self.exhausted and self.active and \
                self._in_flight() < self._producer._prefetch_now() * len(self.active):
            nxt = self._pull()
            if nxt is None:
                break
            b, draws = nxt
            w = self.active[self.rr % len(self.active)]
            self.rr += 1
            shared = self.session.shared_pool
            lease = shared.acquire(0) if shared is not None else None
            slot = Slot(lease.offset, shared.buffer_bytes) if lease is not None else None
            tid = self._producer._new_task_id()
            self.pending[tid] = _Pending(b, w, lease)
            self.session.pool.submit(w, Task(tid, self.epoch, b, draws, slot,
                                             self.plan.stream_seed))

    def _collect(self, timeout):
        for _, answer in self.session.pool.wait(timeout):
            p = self.pending.get(answer.task_id)
            if p is not None:
                p.answer, p.done = answer, True

    def _ready(self):
        """The task id to deliver next, or None."""
        if not self.pending:
            return None
        if self.plan.in_order:
            tid, p = next(iter(self.pending.items()))
            return tid if p.done else None
        return next((tid for tid, p in self.pending.items() if p.done), None)

    def _take(self, tid):
        """(batch, samples) of done task ``tid``; None for an IterableDataset worker's end."""
        p = self.pending.pop(tid)
        if p.worker is None:
            if p.error is not None:
                raise p.error
            return p.batch, p.samples
        answer = p.answer
        if isinstance(answer, StreamEnd):
            if p.worker in self.active:
                self.active.remove(p.worker)
            if not self.active:
                self.exhausted = True
            return None
        self._count_skipped(answer.skipped)
        if isinstance(answer, TaskFailed):
            raise to_exception(answer.error)
        assert isinstance(answer, BatchDone)
        self._producer._note_batch_bytes(answer.batch.slot_bytes)
        if self.session.shared_pool is not None and any(
                isinstance(leaf, batch_structure.InlineLeaf) for leaf in answer.batch.leaves):
            self._producer._stats["pickled_batches"] += 1
        return batch_structure.decode(answer.batch, self.session.shared_pool, p.lease), \
            answer.samples

    def _count_skipped(self, records):
        for index, text in records:
            self._producer._stats["skipped"] += 1
            self._producer._skipped_samples.append(f"sample {index}: {text}")

    def _next(self):
        waited = 0.0
        while True:
            self._fill()
            if self.session is not None and self.pending:
                self._collect(0)
            tid = self._ready()
            if tid is not None:
                got = self._take(tid)
                if got is None:
                    continue
                return got
            if self.plan.consumer_produces and not self.exhausted:
                state = self._produce_here()
                if state is None:
                    continue
                if not self.pending and state.error is None:
                    self._count_skipped(self.local.take_skipped() if self.local else [])
                    return state.batch, state.samples
                if self.local is not None:
                    self._count_skipped(self.local.take_skipped())
                self.pending[self._producer._new_task_id()] = state
                continue
            if not self.pending:
                raise StopIteration
            timeout = self.plan.timeout
            if timeout and waited >= timeout:
                raise DataLoaderTimeout(f"DataLoader timed out after {timeout} seconds")
            slice_s = min(_WAIT_SLICE_S, timeout - waited) if timeout else _WAIT_SLICE_S
            t0 = time.monotonic()
            self._collect(slice_s)
            waited += time.monotonic() - t0

    def __next__(self):
        if self.done:
            raise StopIteration
        try:
            batch, samples = self._next()
        except StopIteration:
            self._finish()
            raise
        except (WorkerError, DataLoaderTimeout, KeyboardInterrupt, SystemExit):
            self._finish()
            raise
        return self._deliver(batch, samples)

    def _finish(self):
        self.done = True
        self._finalizer()

    # -- delivering --------------------------------------------------------------------------------

    def _deliver(self, batch, samples):
        """The one place a finished batch is handed to the caller."""
        producer = self._producer
        self.delivered += 1
        self.cursor.batch += 1
        producer._stats["batches"] += 1
        producer._stats["samples"] += samples
        if self.iterable and self.len_called is not None and self.delivered > self.len_called:
            text = (f"Length of IterableDataset {producer.dataset} was reported to be "
                    f"{self.len_called} (when accessing len(dataloader)), but {self.delivered} "
                    f"samples have been fetched. ")
            if producer._has_workers():
                text += ("For multiprocessing data-loading, this could be caused by not properly "
                         "configuring the IterableDataset replica at each worker. Please see "
                         "https://pytorch.org/docs/stable/data.html#torch.utils.data."
                         "IterableDataset for examples.")
            warnings.warn(text)
        if self.plan.pin_device is not None:
            from torch.utils.data._utils.pin_memory import pin_memory
            batch = pin_memory(batch, self.plan.pin_device)
        if producer.output == "numpy":
            batch = _to_numpy(batch)
        return batch


def _to_numpy(batch):
    """output="numpy": every tensor of the batch as a NumPy array over the same memory."""
    return tree_map(lambda t: t.numpy(), batch, torch.Tensor)
