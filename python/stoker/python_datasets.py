"""``stoker.DataLoader`` for Python datasets: any map-style ``torch.utils.data.Dataset`` (or any
object with ``__getitem__`` and ``__len__``) and ``IterableDataset``.

Order: without a ``sampler``/``batch_sampler``, batches follow the engine's EpochOrder/BatchPlan
(the same indices a native dataset with the same settings visits; shuffle is a seeded permutation,
not torch's RandomSampler). With a ``sampler`` or ``batch_sampler``, its order, exactly as torch.

Workers: ``worker_type="process"`` forks ``num_workers`` processes (see ``workers.py`` for how a
batch travels through shared memory); ``"thread"`` runs ``__getitem__`` on threads (for datasets
whose work releases the GIL; global RNGs are then not re-seeded per sample, since threads share
them); ``"auto"`` picks processes, except for a dataset that declares ``thread_safe = True``:
threads on a free-threaded interpreter, or when a trial in the first batch shows the work
releases the GIL and no seeding is asked for (see _THREAD_GAIN). With ``num_workers="auto"``,
the consumer starts alone and forks when measured work pays for it (see _FORK_NOW_S).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import gc
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import weakref

import torch
from torch.utils.data import BatchSampler, IterableDataset, SequentialSampler
from torch.utils.data._utils.collate import default_convert

from . import _native, _state, workers
from . import loader as _loader
from .loader import DataLoader
from .errors import SampleError, WorkerError

_POLL_S = 0.05
_STOP_GRACE_S = 0.5
_MIN_SLOTS = 8
_AUTO_PREFETCH_BYTES = 4 << 20
# num_workers="auto": the consumer starts an epoch alone and forks workers only when the epoch's
# projected work pays for a fork (the parent's page tables are copied while it waits, ~7 ms for
# 300 MB, then the child's first writes fault its pages in): at once when the rest of the first
# batch would take longer than _FORK_NOW_S at the pace of the faster of its first two chunks
# of 1/16 (the first pays one-time costs), else after a later batch when the rest of the epoch would
# take longer than _FORK_EPOCH_S at the fastest batch's pace so far. On the light bench (1.4 us
# a sample), forking after the second batch of its 0.25 s epoch gained nothing (564k against
# 565k samples/s, medians of 5 fresh runs) and cost 164 MiB of RSS. With
# persistent_workers the fork is paid once for every later epoch: _FORK_PERSISTENT_S.
_FORK_NOW_S = 0.02
_FORK_EPOCH_S = 0.5
_FORK_PERSISTENT_S = 0.1
# worker_type="auto", for a dataset with `thread_safe = True` and without per-sample seeding
# (threads cannot seed the process-global generators per sample): during that first batch, two
# threads produce two chunks each side by side; when their pace is under _THREAD_GAIN of one
# thread's, the dataset's work releases the GIL enough and the epoch runs on threads (no fork,
# no second process's RSS, no pipe).
_THREAD_GAIN = 0.75


def _free_threaded():
    return hasattr(sys, "_is_gil_enabled") and not sys._is_gil_enabled()


def _thread_safe(dataset):
    """Whether the dataset declares that its __getitem__ may run on several threads at once (a
    file object shared across calls, seek then read, would not allow it)."""
    return getattr(dataset, "thread_safe", False) is True


_ERROR_CLASSES = {}


def _error_class(exc_type):
    """A SampleError that is also an instance of the worker's exception type (so ``except
    ValueError`` catches it, as with torch), or plain SampleError when the two cannot mix."""
    if exc_type is None or not issubclass(exc_type, Exception) or issubclass(exc_type,
                                                                              SampleError):
        return SampleError
    cls = _ERROR_CLASSES.get(exc_type)
    if cls is None:
        try:
            cls = type("SampleError", (SampleError, exc_type),
                       {"__module__": "stoker.errors", "__str__": SampleError.__str__,
                        "__reduce__": lambda self: (SampleError, (str(self), self.index))})
            cls("probe", 0)
        except Exception:
            cls = SampleError
        _ERROR_CLASSES[exc_type] = cls
    return cls


def _remote_error(packed):
    index, module, qualname, message, tb, blob, worker_id, pid = packed
    cause = None
    if blob is not None:
        try:
            cause = pickle.loads(blob)
        except Exception:
            cause = None
    if not isinstance(cause, BaseException):
        cause = RuntimeError(f"{module}.{qualname}: {message}")
    where = f"worker {worker_id} (pid {pid})" if worker_id is not None else "the main process"
    what = f"sample {index}" if index is not None else "a batch"
    text = (f"{what}: {qualname}: {message}\n\nCaught in {where}. Original traceback:\n{tb}")
    err = _error_class(type(cause))(text, index)
    err.__cause__ = cause
    return err


class DataLoaderTimeout(RuntimeError, TimeoutError):
    """No batch within ``timeout`` seconds (a RuntimeError, as torch raises)."""


def validate(dataset, batch_size, shuffle, sampler, batch_sampler, drop_last, num_workers,
             timeout, persistent_workers, worker_type):
    """torch.utils.data.DataLoader's argument checks, with its messages."""
    if isinstance(dataset, IterableDataset):
        if shuffle not in (False, None):
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
    elif isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size should be a positive integer value, but got "
                         f"batch_size={batch_size}")
    if num_workers != "auto" and (not isinstance(num_workers, int) or num_workers < 0):
        raise ValueError("num_workers option should be non-negative; use num_workers=0 to "
                         "disable multiprocessing.")
    if not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError("timeout option should be non-negative")
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers option needs num_workers > 0")
    if worker_type not in ("auto", "process", "thread"):
        raise ValueError(f'worker_type must be "auto", "process" or "thread", got '
                         f'{worker_type!r}')


class _ProcessWorkers:
    """``n`` forked worker processes, each with a task pipe and a result pipe. ``start`` of them
    are forked at once, more by ``start()``."""

    def __init__(self, dataset, n, cfg, pool, arena, start):
        self.n = n
        self.closed = False
        self.pids, self.tasks, self.results = [], [], []
        self.status = {}  # pid -> wait status of workers already reaped
        self.args = (dataset, cfg, pool, arena)
        self.parent = os.getpid()
        if cfg["seed_samples"]:
            workers.sample_seeder()  # locate the generators once, before the fork
        self._fork(start)

    @property
    def started(self):
        return len(self.pids)

    def start(self, upto=None):
        """Forks workers up to number ``upto`` (all ``n`` by default)."""
        self._fork(self.n if upto is None else min(upto, self.n))

    def _fork(self, upto):
        dataset, cfg, pool, arena = self.args
        first = len(self.pids)
        pipes = [(multiprocessing.Pipe(duplex=False), multiprocessing.Pipe(duplex=False))
                 for _ in range(first, upto)]
        fds = [c.fileno() for pair in pipes for p in pair for c in p] + \
            [c.fileno() for c in self.tasks + self.results]
        # Frozen objects are out of the children's collections, which would otherwise write
        # to every object's GC header and so copy every page of the parent's heap.
        gc.freeze()
        try:
            for w, ((task_r, task_w), (res_r, res_w)) in enumerate(pipes, first):
                close = [fd for fd in fds if fd not in (task_r.fileno(), res_w.fileno())]
                pid = os.fork()
                if pid == 0:
                    workers.worker_main(w, self.n, dataset, cfg, pool, arena, task_r, res_w,
                                        self.parent, close)
                task_r.close()
                res_w.close()
                self.pids.append(pid)
                self.tasks.append(task_w)
                self.results.append(res_r)
        except BaseException:
            self.shutdown()
            raise
        finally:
            gc.unfreeze()

    def send(self, w, task):
        self.tasks[w].send_bytes(pickle.dumps(task, 5))

    def recv(self, w, timeout):
        """The next message of worker w, or None after ``timeout`` seconds. Raises WorkerError
        when a worker died."""
        conn = self.results[w]
        try:
            if conn.poll(timeout):
                return pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            self._reap(self.pids[w], block=True)
        self.check_alive()
        return None

    def _reap(self, pid, block=False):
        if pid in self.status:
            return True
        try:
            got, status = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            got, status = pid, 0
        if got == pid:
            self.status[pid] = status
            return True
        return False

    def check_alive(self):
        for w, pid in enumerate(self.pids):
            if self._reap(pid):
                status = self.status[pid]
                if os.WIFSIGNALED(status):
                    sig = os.WTERMSIG(status)
                    try:
                        name = signal.Signals(sig).name
                    except ValueError:
                        name = str(sig)
                    why = f"was killed by signal {name}"
                else:
                    why = f"exited unexpectedly with exit code {os.waitstatus_to_exitcode(status)}"
                self.shutdown()
                raise WorkerError(f"DataLoader worker {w} (pid {pid}) {why}", worker=w, pid=pid)

    def shutdown(self):
        if self.closed:
            return
        self.closed = True
        for conn in self.results:
            conn.close()  # a worker blocked on sending gets EPIPE and exits
        for conn in self.tasks:
            try:
                conn.send_bytes(workers._STOP)
            except OSError:
                pass
            conn.close()
        deadline = time.monotonic() + _STOP_GRACE_S
        alive = [pid for pid in self.pids if not self._reap(pid)]
        while alive and time.monotonic() < deadline:
            time.sleep(0.002)
            alive = [pid for pid in alive if not self._reap(pid)]
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._reap(pid, block=True)


class _ThreadWorkers:
    """``n`` threads producing batches (claimed ones into ``pool``'s buffers when given)."""

    def __init__(self, dataset, n, cfg, pool=None, arena=None):
        self.n = self.started = n
        self.executor = concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="stoker-py")
        # Threads share the global generators: seeding them per sample would race.
        self.producer = workers.Producer(dataset, dict(cfg, seed_samples=False), pool, arena)
        self.futures = {}

    def send(self, w, task):
        self.futures[task[0]] = self.executor.submit(self._run, task)

    def _run(self, task):
        try:
            return (task[0],) + self.producer.produce(task) + (self.producer.take_skipped(),)
        except Exception as e:
            return (task[0], "error", workers.pack_error(e, None), self.producer.take_skipped())

    def recv_task(self, tid, timeout):
        try:
            msg = self.futures[tid].result(timeout)
        except concurrent.futures.TimeoutError:
            return None
        del self.futures[tid]
        return msg

    def shutdown(self):
        self.executor.shutdown(wait=True, cancel_futures=True)


class PythonDataLoader:
    """Mixin body of ``stoker.DataLoader`` for Python datasets (see loader.py)."""

    def _init_python(self, dataset, batch_size, shuffle, seed, drop_last, num_workers,
                     prefetch_factor, memory_budget, rank, world_size, output, on_error,
                     sampler, batch_sampler, collate_fn, worker_init_fn, timeout,
                     persistent_workers, generator, worker_type, seed_samples, consumer_helps,
                     parse_bytes, env_int):
        shuffle = bool(shuffle) if shuffle is not None else False
        validate(dataset, batch_size, shuffle, sampler, batch_sampler, drop_last, num_workers,
                 timeout, persistent_workers, worker_type)
        if not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        if output not in ("torch", "numpy"):
            raise ValueError(f'output must be "torch" or "numpy", got {output!r}')
        if on_error not in ("raise", "skip"):
            raise ValueError(f'on_error must be "raise" or "skip", got {on_error!r}')
        if on_error == "skip" and isinstance(dataset, IterableDataset):
            raise ValueError('on_error="skip" needs a map-style dataset (replacements are drawn '
                             'from range(len(dataset)))')
        if not (isinstance(seed_samples, bool) or seed_samples == "always"):
            raise ValueError(f'seed_samples must be True, False or "always", got '
                             f'{seed_samples!r}')
        if not isinstance(consumer_helps, bool):
            raise TypeError(f"consumer_helps must be True or False, got {consumer_helps!r}")
        if prefetch_factor != "auto" and (not isinstance(prefetch_factor, int)
                                          or not 1 <= prefetch_factor <= 64):
            raise ValueError(f'prefetch_factor must be "auto" or an integer in [1, 64], got '
                             f'{prefetch_factor!r}')
        self.dataset = dataset
        self._iterable = isinstance(dataset, IterableDataset)
        self.batch_size = batch_size if batch_sampler is None else None
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        self.collate_fn = collate_fn
        self.worker_init_fn = worker_init_fn
        self.timeout = timeout
        self.persistent_workers = persistent_workers
        self.output = output
        self.on_error = on_error
        self.seed_samples = seed_samples
        self.consumer_helps = consumer_helps
        user_order = sampler is not None or batch_sampler is not None
        self.rank = 0 if user_order or self._iterable else (
            env_int("RANK", 0) if rank is None else rank)
        self.world_size = 1 if user_order or self._iterable else (
            env_int("WORLD_SIZE", 1) if world_size is None else world_size)
        if not isinstance(self.world_size, int) or self.world_size < 1 or not (
                isinstance(self.rank, int) and 0 <= self.rank < self.world_size):
            raise ValueError(f"rank must be an integer in [0, world_size), got rank={rank!r}, "
                             f"world_size={world_size!r}")
        if batch_size is None and batch_sampler is None:
            self._auto_batch = False
        else:
            self._auto_batch = True
        worker_type_arg = worker_type
        if worker_type == "auto":
            worker_type = "thread" if _free_threaded() and _thread_safe(dataset) else "process"
        self.worker_type = worker_type
        # "auto": with process workers the consumer produces samples of the batches it waits for
        # (see _PythonIterator), so it counts as one of the cores' producers.
        cores = min(_native.usable_cores(), 16)
        helper = worker_type == "process" and consumer_helps and not timeout
        self._workers_n = max(1, cores - helper) if num_workers == "auto" else num_workers
        self._measured_fork = num_workers == "auto" and helper
        self._thread_trial = (self._measured_fork and worker_type_arg == "auto"
                              and seed_samples is False and _thread_safe(dataset))
        self._cores = cores
        # "auto": decided by the first batch's size (None until then), as the native autotune
        # starts: 2 batches a worker up to 4 MiB, 1 above, where memory matters more.
        self._prefetch = None if prefetch_factor == "auto" else prefetch_factor
        self._budget = parse_bytes(memory_budget) or _native.physical_memory_bytes() // 2
        self._pool = None
        self._arena = None
        self._persistent = None
        self._next_epoch = 0
        self._start_batch = 0
        self._next_start = 0
        self._cursor = None
        self._stats = collections.Counter()
        self._skipped_samples = collections.deque(maxlen=1000)  # the most recent, as native
        if user_order:
            if batch_sampler is None:
                self.batch_sampler = BatchSampler(sampler, batch_size, drop_last) \
                    if self._auto_batch else None
        self._finalizer = None

    # -- sizes and order ----------------------------------------------------------------------

    def _len_python(self):
        if self._iterable:
            n = len(self.dataset)  # TypeError when the dataset has no length, as with torch
            if not self._auto_batch:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        if self.sampler is not None:
            return len(self.sampler)
        bs = self.batch_size if self._auto_batch else 1
        return _native.plan_num_batches(len(self.dataset), bs, self.drop_last, self.rank,
                                        self.world_size)

    def _batches(self, epoch, start, origin=0):
        """(batch number, sample indices) of the epoch from ``start`` on (of the plan that
        begins at global position ``origin``: an elastic resume)."""
        if self.batch_sampler is not None:
            for b, indices in enumerate(self.batch_sampler):
                if b >= start:
                    yield b, list(indices)
        elif self.sampler is not None:
            for b, i in enumerate(self.sampler):
                if b >= start:
                    yield b, [i]
        else:
            n = len(self.dataset)
            bs = self.batch_size if self._auto_batch else 1
            for b in range(start, _native.plan_num_batches(n, bs, self.drop_last, self.rank,
                                                           self.world_size, origin)):
                yield b, _native.batch_indices(n, bs, self.shuffle, self.seed, epoch,
                                               self.drop_last, self.rank, self.world_size, b,
                                               origin)

    def _cfg(self, epoch):
        return {"seed": self.seed, "collate_fn": self.collate_fn if self.collate_fn is not None
                else (None if self._auto_batch else default_convert),
                "auto_batch": self._auto_batch, "seed_samples": self.seed_samples,
                "drop_last": self.drop_last, "worker_init_fn": self.worker_init_fn,
                "base_epoch": epoch, "on_error": self.on_error,
                "size": len(self.dataset) if self.on_error == "skip" else 0}

    def _shared_pool(self):
        if self._pool is None:
            slots = max(_MIN_SLOTS, 2 * (self._prefetch or 2) * self._workers_n + 2)
            buffer_bytes = max(4096, self._budget // slots // 4096 * 4096)
            self._pool = _native.SharedPool(buffer_bytes, buffer_bytes * slots)
            self._arena = self._pool.arena_array(True)
        return self._pool

    def _iter_python(self):
        epoch, start = _state.begin(self)
        if self._iterable and start:
            raise ValueError("resuming an IterableDataset mid-epoch is not supported")
        return _PythonIterator(self, epoch, start, self._cursor)

    def _stats_python(self):
        s = dict(self._stats)
        for k in ("batches", "samples", "pickled_batches", "skipped"):
            s.setdefault(k, 0)
        s["skipped_samples"] = list(self._skipped_samples)
        pool = self._pool
        s.setdefault("worker_processes", 0)
        s.setdefault("worker_threads", 0)
        s.update(num_workers=self._workers_n, prefetch_factor=self._prefetch,
                 worker_type=self.worker_type, memory_budget=self._budget,
                 buffer_bytes=pool.bytes_allocated if pool else 0,
                 buffer_bytes_peak=pool.peak_bytes_allocated if pool else 0,
                 batch_bytes=pool.buffer_bytes if pool else 0)
        return s


@contextlib.contextmanager
def _caller_rng_states_kept(keep=True):
    """Runs samples in this process (seeding the global generators per sample) and gives the
    caller its generator states back afterwards."""
    if not keep:
        yield
        return
    restore = workers.global_rng_states()
    try:
        yield
    finally:
        restore()


def _shutdown(holder):
    w = holder[0]
    holder[0] = None
    if w is not None:
        w.shutdown()


class _PythonIterator:
    def __init__(self, loader, epoch, start, cursor):
        self.loader = loader
        self.epoch = epoch
        self.cursor = cursor
        self.length = cursor.num_batches - start if not loader._iterable else None
        self.n = loader._workers_n
        self.prefetch = loader._prefetch or 1
        self.auto = loader._auto_batch
        self.iterable = loader._iterable
        self.batches = None if self.iterable else loader._batches(epoch, start, cursor.start)
        self.holder = [None]
        # tid -> (worker, lease, batch no, indices, claim counter or None)
        self.inflight = collections.OrderedDict()
        self.helped = {}  # tid -> this process's answers for chunks of a batch not yet due
        self.next_tid = 0
        self.rr = 0
        self.active = list(range(self.n))
        self.exhausted = False
        self.done = False
        self.measure = False  # this process produces the first batch alone and decides forks
        self.alone = False  # for now, this process produces the epoch; no worker is forked
        self.per_sample = float("inf")  # the fastest batch's seconds a sample while alone
        cfg = loader._cfg(epoch)
        if self.n == 0:
            self.producer = workers.Producer(loader.dataset, cfg)
            self.local_iter = None
            if self.iterable:
                from torch.utils.data._utils import worker as tw
                tw._worker_info = None
            return
        # Batches shared out by claims (see Producer.produce_claimed): this process helps produce
        # those it waits for, so the first batch comes at once and the consumer's idle time is a
        # producer's: fewer worker processes are needed. Not with consumer_helps=False, nor with
        # a timeout: a sample that hangs here could not be timed out.
        self.claims = (not self.iterable and self.auto and loader.collate_fn is None
                       and loader.worker_type == "process")
        self.helps = self.claims and loader.consumer_helps and not loader.timeout
        if loader.worker_type == "thread":
            self.workers = _ThreadWorkers(loader.dataset, self.n, cfg)
            self.pool = None
        else:
            self.pool = loader._shared_pool()
            persistent = loader._persistent
            loader._persistent = None
            if persistent is not None and not persistent.closed and persistent.started:
                self.workers = persistent
            else:
                if persistent is not None:
                    persistent.shutdown()
                # num_workers="auto": none before the first batch, which this process starts
                # alone and times (see _FORK_NOW_S). Otherwise one worker before the first batch
                # (which this process helps produce), the others once it is out: each fork
                # copies the page tables, ~7 ms for 300 MB.
                self.measure = self.helps and loader._measured_fork
                start = 0 if self.measure else 1 if self.helps else self.n
                self.workers = _ProcessWorkers(loader.dataset, self.n, cfg, self.pool,
                                               loader._arena, start)
            self.main_producer = workers.Producer(loader.dataset, cfg, self.pool,
                                                  loader._arena) if self.helps else None
        self.active = list(range(self.workers.started))
        self.fork_rest = not self.measure  # fork the other workers after the first batch
        self.try_threads = self.measure and loader._thread_trial
        threads = isinstance(self.workers, _ThreadWorkers)
        loader._stats["worker_processes"] = 0 if threads else self.workers.started
        loader._stats["worker_threads"] = self.workers.started if threads else 0
        self.delivered = False
        self.holder[0] = self.workers
        self.finalizer = weakref.finalize(self, _shutdown, self.holder)

    def __iter__(self):
        return self

    def __len__(self):
        if self.length is None:
            return len(self.loader)
        return self.cursor.num_batches - self.cursor[1]

    # -- dispatch -----------------------------------------------------------------------------

    def _next_worker(self):
        w = self.active[self.rr % len(self.active)]
        self.rr += 1
        return w

    def _lease(self):
        if self.pool is None:
            return None
        return self.pool.acquire(0)

    def _send(self, indices, batch_no):
        """Queues a batch: to a worker, or to none (None) while none is forked."""
        w = self._next_worker() if self.active else None
        lease = self._lease()
        tid = self.next_tid
        self.next_tid += 1
        counter = None
        if self.claims and lease is not None:
            counter = tid % self.pool.counters
            self.pool.reset_claims(counter)
        self.inflight[tid] = (w, lease, batch_no, indices, counter)
        if w is not None:
            self._dispatch(tid)
        return tid

    def _dispatch(self, tid):
        w, lease, _, indices, counter = self.inflight[tid]
        offset = lease.offset if lease is not None else None
        capacity = self.pool.buffer_bytes if lease is not None else 0
        self.workers.send(w, (tid, self.epoch, indices, offset, capacity, counter))

    def _start_workers(self, upto=None):
        self.workers.start(upto)
        self.active = list(range(self.workers.started))
        self.loader._stats["worker_processes"] = self.workers.started

    def _fill(self):
        while not self.exhausted and len(self.inflight) < max(1, self.prefetch *
                                                               len(self.active)):
            if self.iterable:
                if not self.active:
                    self.exhausted = True
                    break
                self._send(self.loader.batch_size if self.auto else 1, None)
                continue
            nxt = next(self.batches, None)
            if nxt is None:
                self.exhausted = True
                break
            self._send(nxt[1], nxt[0])

    # -- receiving ----------------------------------------------------------------------------

    def _receive(self, tid, poll_only=False):
        """Worker's answer to task ``tid``; with ``poll_only``, None unless it is already here."""
        w = self.inflight[tid][0]
        waited = 0.0
        timeout = self.loader.timeout
        while True:
            if isinstance(self.workers, _ThreadWorkers):
                msg = self.workers.recv_task(tid, 0 if poll_only else _POLL_S)
            else:
                msg = self.workers.recv(w, 0 if poll_only else _POLL_S)
            if msg is not None:
                if msg[0] == -1:  # worker_init_fn failed
                    raise _remote_error(msg[2])
                return msg
            if poll_only:
                return None
            waited += _POLL_S
            if timeout and waited >= timeout:
                raise DataLoaderTimeout(f"DataLoader timed out after {timeout} seconds")

    def __next__(self):
        if self.done:
            raise StopIteration
        try:
            if self.n == 0 or self.alone:
                batch = self._next_local()
            else:
                batch = self._next_remote()
        except StopIteration:
            self._finish(clean=True)
            raise
        except (KeyboardInterrupt, WorkerError, SystemExit, TimeoutError):
            self._finish(clean=False)
            raise
        return batch

    def _deliver(self, batch, samples, payload=None):
        """Hands ``batch`` out; ``payload``: the worker's description of it, when it has one."""
        if self.loader._prefetch is None and payload is not None:
            nbytes = sum(leaf[2] for leaf in payload[2] if leaf[0] == "shm")
            self.loader._prefetch = 2 if nbytes <= _AUTO_PREFETCH_BYTES else 1
            self.prefetch = self.loader._prefetch
        self.delivered = True
        self.cursor[1] += 1
        self.loader._stats["batches"] += 1
        self.loader._stats["samples"] += samples
        if self.loader.output == "numpy":
            batch = _to_numpy(batch)
        return batch

    def _help(self, indices, lease, counter, max_chunks=None, chunk=None):
        """This process's part of a claimed batch (all of what is left, or ``max_chunks``
        chunks of ``chunk`` samples), as a worker's message."""
        p = self.main_producer
        try:
            with _caller_rng_states_kept(self.loader.seed_samples):
                return (None, "batch", p.produce_claimed(
                    self.epoch, indices, lease.offset, self.pool.buffer_bytes, counter,
                    max_chunks, chunk), p.take_skipped())
        except Exception as e:
            return (None, "error", workers.pack_error(e, None), p.take_skipped())

    def _help_ahead(self, tid):
        """While the last chunks of batch ``tid`` are still with its worker, this process
        produces chunks of the batches after it, one at a time, so that it does not idle.
        Returns tid's answer as soon as it is here, None when nothing is left to help with."""
        for later, (_, lease, _, indices, counter) in list(self.inflight.items())[1:]:
            if counter is None:
                continue
            while True:
                part = self._help(indices, lease, counter, max_chunks=1)
                self.helped.setdefault(later, []).append(part)
                msg = self._receive(tid, poll_only=True)
                if msg is not None or part[1] == "error":
                    return msg
                if not part[2][1]:  # nothing left to claim here (or the samples differ)
                    break
        return None

    def _produce_here(self, tid, msgs):
        """Batch ``tid``, which no worker has: this process produces it (its answers appended to
        ``msgs``). While measuring (the epoch's first batch), it times two chunks and hands the
        rest of the batch to a newly forked worker when that pays (then returns the worker);
        otherwise the epoch goes on in this process (see _FORK_NOW_S)."""
        _, lease, batch_no, indices, counter = self.inflight[tid]
        if counter is None:  # no free buffer (the caller keeps many batches): pickled
            p = self.main_producer
            try:
                with _caller_rng_states_kept(self.loader.seed_samples):
                    msgs.append((None,) + p.produce((tid, self.epoch, indices, None, 0, None)) +
                                (p.take_skipped(),))
            except Exception as e:
                msgs.append((None, "error", workers.pack_error(e, None), p.take_skipped()))
            return None
        if not self.measure:
            msgs.append(self._help(indices, lease, counter, chunk=len(indices)))
            return None
        self.measure = False
        # Two chunks of 1/16 of the batch, timed one by one: the first pays one-time costs
        # (first calls, first page faults), so the faster of the two gives the pace.
        chunk = -(-len(indices) // 16)
        pace = float("inf")
        for _ in range(min(2, -(-len(indices) // chunk))):
            t0 = time.perf_counter()
            msgs.append(self._help(indices, lease, counter, max_chunks=1, chunk=chunk))
            if msgs[-1][1] == "error" or not msgs[-1][2][1]:
                # An error, or samples that differ (collated as torch's): the batches to come
                # are judged instead.
                self.alone = True
                self.producer = self.main_producer
                return None
            pace = min(pace, (time.perf_counter() - t0) / chunk)
        left = len(indices) - 2 * chunk
        if self.try_threads and left >= 4 * chunk:
            t0 = time.perf_counter()
            parts = self._side_by_side(indices, lease, counter, max_chunks=2, chunk=chunk)
            msgs += parts
            if any(m[1] == "error" or not m[2][1] for m in parts):
                self.alone = True
                self.producer = self.main_producer
                return None
            rows = sum(part[1] for m in parts for part in m[2][3])
            left -= rows
            if (time.perf_counter() - t0) / rows < _THREAD_GAIN * pace:
                self._switch_to_threads()
                msgs += self._side_by_side(indices, lease, counter, chunk=chunk)
                return None
        if pace * left > _FORK_NOW_S:
            self._start_workers(1)
            self.inflight[tid] = (0, lease, batch_no, indices, counter)
            self._dispatch(tid)
            self.fork_rest = True
            return 0
        t1 = time.perf_counter()
        msgs.append(self._help(indices, lease, counter, chunk=len(indices)))
        # The rest of the epoch as with num_workers=0 until a second batch confirms the pace.
        self.per_sample = (time.perf_counter() - t1) / max(1, left) if left > 0 else pace
        self.alone = True
        self.producer = self.main_producer
        return None

    def _side_by_side(self, indices, lease, counter, max_chunks=None, chunk=None):
        """This thread and a helper thread claim chunks of batch ``indices`` at once; returns
        both answers."""
        other = []
        helper = threading.Thread(target=lambda: other.append(
            self._help(indices, lease, counter, max_chunks, chunk)))
        helper.start()
        try:
            mine = self._help(indices, lease, counter, max_chunks, chunk)
        finally:
            helper.join()
        return [mine] + other

    def _switch_to_threads(self):
        """From now on this epoch's batches go to threads (one a core)."""
        self.workers.shutdown()  # the process workers, none of them forked
        n = self.loader._cores
        self.workers = _ThreadWorkers(self.loader.dataset, n, self.loader._cfg(self.epoch),
                                      self.pool, self.loader._arena)
        self.holder[0] = self.workers
        self.n = n
        self.active = list(range(n))
        self.fork_rest = False
        self.loader._stats["worker_threads"] = n

    def _next_remote(self):
        if self.workers.started < self.n and self.delivered and self.fork_rest:
            self._start_workers()
        while True:
            self._fill()
            if not self.inflight:
                raise StopIteration
            tid = next(iter(self.inflight))
            w, lease, _, indices, counter = self.inflight[tid]
            msgs = self.helped.pop(tid, [])
            msg = None
            if w is None:
                w = self._produce_here(tid, msgs)
                if w is None:
                    msg = msgs.pop()
            if msg is None and counter is not None and self.helps:
                msg = self._receive(tid, poll_only=True)
                if msg is None:  # not ready: produce what the worker has not claimed yet
                    msgs.append(self._help(indices, lease, counter))
                    msg = self._receive(tid, poll_only=True) or self._help_ahead(tid)
            if msg is None:
                msg = self._receive(tid)
            msgs.append(msg)
            del self.inflight[tid]
            errors = [m for m in msgs if m[1] == "error"]
            if errors:
                self._count_skipped(r for m in msgs for r in m[3])
                self.cursor[1] += 1
                raise _remote_error(errors[0][2])
            if msg[1] == "end":  # an IterableDataset worker ran out
                if w in self.active:
                    self.active.remove(w)
                continue
            count = len(indices) if not self.iterable else _batch_len(msg[2])
            if counter is not None:
                batch, payload = self._assemble_claimed(msgs, indices, lease)
                return self._deliver(batch, count, payload)
            self._count_skipped(r for m in msgs for r in m[3])
            payload = msg[2]
            if lease is None or not any(x[0] == "shm" for x in payload[2]):
                self.loader._stats["pickled_batches"] += 1
            return self._deliver(workers.assemble(payload, self.pool, lease), count, payload)

    def _assemble_claimed(self, msgs, indices, lease):
        """(batch, payload) of a claimed batch from the producers' messages."""
        payload = workers.merge_claimed([m[2] for m in msgs], len(indices))
        if payload is not None:
            self._count_skipped(r for m in msgs for r in m[3])
            return workers.assemble(payload, self.pool, lease), payload
        # The samples differ in structure or shapes: default_collate decides, as torch does.
        del lease
        self.loader._stats["pickled_batches"] += 1
        producer = workers.Producer(self.loader.dataset, self.loader._cfg(self.epoch))
        try:
            with _caller_rng_states_kept(self.loader.seed_samples):
                payload = producer.produce((0, self.epoch, indices, None, 0, None))[1]
        except Exception:
            self.cursor[1] += 1  # the batch is spent, as when a worker raises
            raise
        finally:  # the producers' replacements were of these samples too: counted once, here
            self._count_skipped(producer.take_skipped())
        return workers.assemble(payload, None, None), None

    def _count_skipped(self, records):
        for index, text in records:
            self.loader._stats["skipped"] += 1
            self.loader._skipped_samples.append(f"sample {index}: {text}")

    def _next_local(self):
        p = self.producer
        with _caller_rng_states_kept(self.loader.seed_samples):
            if self.iterable:
                if self.local_iter is None:
                    self.local_iter = iter(self.loader.dataset)
                samples = []
                for _ in range(self.loader.batch_size if self.auto else 1):
                    try:
                        samples.append(next(self.local_iter))
                    except StopIteration:
                        break
                if not samples or (self.auto and self.loader.drop_last
                                   and len(samples) < self.loader.batch_size):
                    raise StopIteration
                if not self.auto:
                    return self._deliver(p.collate(samples[0]), 1)
                cf = self.loader.collate_fn or workers.collate_samples
                return self._deliver(cf(samples), len(samples))
            if self.batches is None:
                raise StopIteration
            nxt = next(self.batches, None)
            if nxt is None:
                raise StopIteration
            _, indices = nxt
            t0 = time.perf_counter()
            try:
                samples = p.fetch(self.epoch, indices)
            except Exception as e:
                self.cursor[1] += 1
                i = getattr(e, "_stoker_index", None)
                raise _error_class(type(e))(
                    f"sample {i}: {type(e).__qualname__}: {e}", i) from e
            finally:
                self._count_skipped(p.take_skipped())
            if not self.auto:
                return self._deliver(p.collate(samples[0]), 1)
            cf = self.loader.collate_fn or workers.collate_samples
            batch = cf(samples)
            if self.alone:
                self._judge((time.perf_counter() - t0) / len(indices), len(indices))
            return self._deliver(batch, len(samples))

    def _judge(self, per_sample, batch_size):
        """Alone in an epoch with num_workers="auto": forks the workers (from the next batch
        on) once the fastest batch so far says that the rest of the epoch pays for them."""
        self.per_sample = min(self.per_sample, per_sample)
        pays = _FORK_PERSISTENT_S if self.loader.persistent_workers else _FORK_EPOCH_S
        if self.per_sample * (len(self) - 1) * batch_size > pays:
            self.alone = False
            self.fork_rest = True

    def _finish(self, clean):
        self.done = True
        if self.n == 0:
            return
        w = self.holder[0]
        self.holder[0] = None
        self.inflight.clear()
        self.helped.clear()
        if w is None:
            return
        if clean and self.loader.persistent_workers and isinstance(w, _ProcessWorkers):
            self.loader._persistent = w
        else:
            w.shutdown()


def _batch_len(payload):
    mode, struct, leaves, objects = payload
    for leaf in leaves:
        if leaf[0] == "shm":
            return leaf[4][0] if leaf[4] else 1
        if leaf[0] == "col":
            return len(leaf[1])
    for col in objects:
        return len(col) if mode == "fast" else 1
    return 1


def _to_numpy(x):
    if isinstance(x, torch.Tensor):
        return x.numpy()
    if isinstance(x, dict):
        return {k: _to_numpy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_to_numpy(v) for v in x]
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(_to_numpy(v) for v in x)
    return x


class PythonLoader(DataLoader, PythonDataLoader):
    """stoker.DataLoader over a Python dataset (see python_datasets.py)."""

    def __init__(self, dataset, batch_size=1, shuffle=False, seed=0, drop_last=False,
                 num_workers="auto", prefetch_factor="auto", pin_memory="auto",
                 memory_budget=None, rank=None, world_size=None, output="torch",
                 on_error="raise", *, sampler=None, batch_sampler=None, collate_fn=None,
                 worker_init_fn=None, timeout=0, persistent_workers=False, generator=None,
                 worker_type="auto", seed_samples=True, consumer_helps=True, offload=None):
        if not (hasattr(dataset, "__getitem__") or hasattr(dataset, "__iter__")):
            raise TypeError(
                f"stoker.DataLoader needs a dataset: a Stoker dataset (ArrayDataset, "
                f"TokenDataset), or a Python one with __getitem__, got {type(dataset).__name__}")
        if pin_memory not in ("auto", True, False):
            raise ValueError(f'pin_memory must be "auto", True or False, got {pin_memory!r}')
        self._init_python(dataset, batch_size, shuffle, seed, drop_last, num_workers,
                          prefetch_factor, memory_budget, rank, world_size, output, on_error,
                          sampler, batch_sampler, collate_fn, worker_init_fn, timeout,
                          persistent_workers, generator, worker_type, seed_samples,
                          consumer_helps, _loader._parse_bytes, _loader._env_int)

    @property
    def num_workers(self):
        return self._workers_n

    @property
    def prefetch_factor(self):
        return self._prefetch

    @property
    def pin_memory(self):
        return False

    @property
    def memory_budget(self):
        return self._budget

    def __len__(self):
        return self._len_python()

    def __iter__(self):
        return self._iter_python()

    def __del__(self):
        p = getattr(self, "_persistent", None)
        if p is not None:
            p.shutdown()

    def stats(self):
        return self._stats_python()
