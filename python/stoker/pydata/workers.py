"""The worker pool of a Python dataset: one interface, with process and thread implementations.

``WorkerPool``: ``submit(worker, task)`` hands a task (messages.Task) to one worker;
``wait(timeout)`` returns the answers that arrived (messages.BatchDone, TaskFailed, StreamEnd), as
(worker, answer) pairs; ``shutdown()`` stops the workers; ``processes`` are the worker processes
(torch's ``_workers``: join(), is_alive(), exitcode, pid). The pool holds no reference to the
loader or its iterator, and stops its workers when it is garbage collected or at exit.

``ProcessPool``: processes from a multiprocessing context (fork, spawn or forkserver), all started
at once. Each worker copies the dataset (inherits it, or unpickles it), sets torch's worker info and
seeds, runs ``worker_init_fn``, then produces the tasks it is sent, in order, into the batch
buffers of the shared arena (a memfd: inherited by a fork, handed over by file-descriptor passing
otherwise). A worker dies with the training process (PR_SET_PDEATHSIG, and a check of its parent
while it waits), ignores SIGINT (the training process stops it) and exits with code 0 when
stopped.

``ThreadPool``: threads in the training process, for datasets whose work releases the GIL. Threads
share the process's global generators, so their samples are not seeded per sample;
``worker_init_fn`` runs on each thread, and get_worker_info() is None there.
"""

from __future__ import annotations

import abc
import ctypes
import dataclasses
import gc
import multiprocessing.connection
import os
import pickle
import queue
import signal
import sys
import threading
import time
import weakref
from multiprocessing import reduction

import torch
from torch.utils.data._utils import worker as _torch_worker

from .. import _native
from .._process import pid_alive
from . import batch_structure, seeding
from .messages import STOP, BatchDone, InitFailed, StreamEnd, TaskFailed
from .batch_maker import BatchMaker, ProducerConfig
from .remote_errors import pack, to_exception, worker_died

_STOP_GRACE_S = 1.0
_PARENT_CHECK_S = 1.0
_PR_SET_PDEATHSIG = 1


class WorkerPool(abc.ABC):
    size: int

    @abc.abstractmethod
    def submit(self, worker, task):
        """Hands ``task`` to worker ``worker`` (its tasks run in the order sent)."""

    @abc.abstractmethod
    def wait(self, timeout):
        """[(worker, answer)] that arrived within ``timeout`` seconds ([] when none). Raises the
        error of a worker whose start-up failed, and WorkerError for a worker that died."""

    @abc.abstractmethod
    def shutdown(self):
        """Stops the workers (idempotent)."""

    @property
    def processes(self):
        return []

    @property
    def alive(self):
        """False once shut down (asked to, or after a worker died)."""
        return self._finalizer.alive


# -- what a worker runs ----------------------------------------------------------------------------

class _ArenaHandle:
    """The shared arena as a worker receives it: inherited by a fork; pickled (for spawn and
    forkserver) as its memfd, passed to the child process and mapped there."""

    def __init__(self, arena):
        self.arena = arena

    def __reduce__(self):
        return (_attach_arena, (reduction.DupFd(self.arena.fd),))


def _attach_arena(dup_fd):
    return _native.pydata.SharedArena.attach(dup_fd.detach())


@dataclasses.dataclass(frozen=True)
class WorkerSetup:
    """What a worker process starts with (pickled for spawn and forkserver)."""
    worker_id: int
    num_workers: int
    dataset: object
    config: ProducerConfig
    base_seed: int
    worker_init_fn: object
    arena: object  # _ArenaHandle, or (unpickled) the mapped _native.pydata.SharedArena; None: no arena
    parent_pid: int
    datapipe: bool  # an IterDataPipe: sharded per worker and seeded per epoch, as torch does


def run_task(producer, task, worker_id, arena=None, arena_tensor=None):
    """The answer to ``task``: BatchDone, TaskFailed or StreamEnd."""
    slot = task.slot if arena_tensor is not None else None
    writer = batch_structure.SlotWriter(arena_tensor, slot.offset, slot.capacity) \
        if slot is not None else None
    try:
        if task.draws is None:
            if task.stream_seed is not None and (producer.stream is None
                                                 or producer.stream[0] != task.epoch):
                _seed_datapipe(producer.dataset, task.stream_seed)
            samples = producer.next_samples(task.epoch)
            if not samples:
                return StreamEnd(task.task_id)
        else:
            samples = producer.fetch(task.epoch, task.draws, task.batch_no)
        batch = producer.collate(samples, writer)
        encoded = batch_structure.encode(batch, writer)
        if writer is not None:  # its pages count here only while written
            arena.drop_pages(slot.offset, writer.used)
        count = len(samples) if producer.config.auto_collation else 1
        return BatchDone(task.task_id, encoded, count, producer.take_skipped())
    except Exception as e:
        return TaskFailed(task.task_id, pack(e, worker_id), producer.take_skipped())


def _seed_datapipe(datapipe, shared_seed):
    from torch.utils.data.graph_settings import apply_random_seed
    rng = torch.Generator()
    rng.manual_seed(shared_seed)
    apply_random_seed(datapipe, rng)


def _unpicklable(answer):
    """The answer to send instead of ``answer``, which does not pickle: the error names the type
    of the object that cannot be sent."""
    culprit = None
    for obj in answer.batch.objects if isinstance(answer, BatchDone) else ():
        try:
            pickle.dumps(obj, 5)
        except Exception:
            culprit = obj
            break
    what = f"an object of type {type(culprit).__qualname__}" if culprit is not None else \
        "an object"
    try:
        pickle.dumps(culprit, 5)
    except Exception as e:
        reason = f"{type(e).__qualname__}: {e}"
    else:
        reason = "it does not pickle"
    err = pickle.PicklingError(
        f"the batch holds {what} that cannot be sent from the worker to the training process "
        f"({reason}); a dataset used with worker processes must return picklable samples")
    return TaskFailed(answer.task_id, pack(err, _torch_worker._worker_info.id), answer.skipped)


def _die_with_parent(parent):
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass
    if not pid_alive(parent):  # the parent died before prctl took effect
        os._exit(0)


def worker_main(setup, task_conn, result_conn):
    """A worker process's whole life. Exit code 0 when stopped, 1 when its start-up failed."""
    _die_with_parent(setup.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the training process decides; it stops us
    torch.set_num_threads(1)
    arena = setup.arena.arena if isinstance(setup.arena, _ArenaHandle) else setup.arena
    arena_tensor = arena.array(True) if arena is not None else None
    wid, dataset = setup.worker_id, setup.dataset
    seed = seeding.seed_worker(setup.base_seed, wid)
    _torch_worker._worker_info = _torch_worker.WorkerInfo(
        id=wid, num_workers=setup.num_workers, seed=seed, dataset=dataset)
    before = seeding.snapshot()
    try:
        if setup.datapipe:
            from torch.utils.data.graph_settings import apply_sharding
            apply_sharding(dataset, setup.num_workers, wid)
        if setup.worker_init_fn is not None:
            setup.worker_init_fn(wid)
    except BaseException as e:
        result_conn.send_bytes(pickle.dumps(InitFailed(pack(e, wid)), 5))
        return 1
    # A generator that worker_init_fn seeded (or drew from) is its own from now on.
    leave_alone = seeding.changed(before) if setup.worker_init_fn is not None else \
        (False, False, False)
    producer = BatchMaker(dataset, setup.config, leave_alone)
    while True:
        try:
            while not task_conn.poll(_PARENT_CHECK_S):
                if not pid_alive(setup.parent_pid):
                    return 0
            raw = task_conn.recv_bytes()
        except (EOFError, OSError):
            return 0
        if raw == STOP:
            return 0
        answer = run_task(producer, pickle.loads(raw), wid, arena, arena_tensor)
        try:
            blob = pickle.dumps(answer, 5)
        except Exception:
            blob = pickle.dumps(_unpicklable(answer), 5)
        try:
            result_conn.send_bytes(blob)
        except (BrokenPipeError, OSError):
            return 0


def _worker_process(setup, task_conn, result_conn):
    """The target of a worker Process: worker_main, whose return is the exit code."""
    code = worker_main(setup, task_conn, result_conn)
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        sys.exit(code)


# -- processes -------------------------------------------------------------------------------------

def _stop(processes, task_conns, result_conns, grace=_STOP_GRACE_S):
    """Asks every worker to stop, waits up to ``grace`` seconds, then kills the rest."""
    for conn in task_conns:
        try:
            conn.send_bytes(STOP)
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + grace
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.exitcode is None:
            p.kill()
            p.join()
    for conn in task_conns + result_conns:
        conn.close()
    task_conns.clear()
    result_conns.clear()


class ProcessPool(WorkerPool):
    """``n`` worker processes from ``context``; ``setup(w)`` is worker w's WorkerSetup."""

    def __init__(self, n, context, setup):
        self.size = n
        self._procs, self._tasks, self._results = [], [], []
        fork = context.get_start_method() == "fork"
        # Frozen objects stay out of a forked child's collections, which would otherwise write
        # to every object's GC header and so copy every page of the parent's heap.
        if fork:
            gc.freeze()
        try:
            for w in range(n):
                task_r, task_w = context.Pipe(duplex=False)
                result_r, result_w = context.Pipe(duplex=False)
                p = context.Process(target=_worker_process, args=(setup(w), task_r, result_w),
                                    name=f"stoker-worker-{w}", daemon=True)
                p.start()
                task_r.close()
                result_w.close()
                self._procs.append(p)
                self._tasks.append(task_w)
                self._results.append(result_r)
        except BaseException:
            _stop(self._procs, self._tasks, self._results, grace=0)
            raise
        finally:
            if fork:
                gc.unfreeze()
        self._finalizer = weakref.finalize(self, _stop, self._procs, self._tasks, self._results)

    @property
    def processes(self):
        return list(self._procs)

    def submit(self, worker, task):
        try:
            self._tasks[worker].send_bytes(pickle.dumps(task, 5))
        except OSError:
            # The worker is gone (its worker_init_fn raised, or it died) before it read the task:
            # the error is why, as wait() reports it, not the broken pipe.
            p = self._procs[worker]
            p.join(_STOP_GRACE_S)
            self.wait(0)
            self.shutdown()
            raise worker_died(worker, p.pid, p.exitcode) from None

    def wait(self, timeout):
        if not self._finalizer.alive:
            raise RuntimeError("the DataLoader's workers were shut down")
        sentinels = {p.sentinel: w for w, p in enumerate(self._procs)}
        conns = {id(c): w for w, c in enumerate(self._results)}
        ready = multiprocessing.connection.wait(self._results + list(sentinels), timeout)
        out, dead = [], []
        for r in ready:
            if isinstance(r, int):
                dead.append(sentinels[r])
                continue
            w = conns[id(r)]
            try:
                out.append((w, pickle.loads(r.recv_bytes())))
            except (EOFError, OSError):
                dead.append(w)
        for w in dead:  # answers it sent before it died come first
            conn = self._results[w]
            try:
                while conn.poll(0):
                    out.append((w, pickle.loads(conn.recv_bytes())))
            except (EOFError, OSError):
                pass
        for _, answer in out:
            if isinstance(answer, InitFailed):
                self.shutdown()
                raise to_exception(answer.error)
        for w in dead:
            p = self._procs[w]
            p.join(_STOP_GRACE_S)
            self.shutdown()
            raise worker_died(w, p.pid, p.exitcode)
        return out

    def shutdown(self):
        self._finalizer()


# -- threads ---------------------------------------------------------------------------------------

class ThreadPool(WorkerPool):
    """``n`` threads of this process producing tasks of ``dataset`` (not seeded per sample)."""

    def __init__(self, n, dataset, config, worker_init_fn):
        self.size = n
        self._answers = queue.Queue()
        self._queues = [queue.Queue() for _ in range(n)]
        self._threads = [threading.Thread(target=_thread_main, name=f"stoker-worker-{w}",
                                          args=(w, dataset, config, worker_init_fn,
                                                self._queues[w], self._answers), daemon=True)
                         for w in range(n)]
        for t in self._threads:
            t.start()
        self._finalizer = weakref.finalize(self, _stop_threads, self._threads, self._queues)

    def submit(self, worker, task):
        self._queues[worker].put(task)

    def wait(self, timeout):
        out = []
        try:
            out.append(self._answers.get(timeout=timeout) if timeout else
                       self._answers.get_nowait())
            while True:
                out.append(self._answers.get_nowait())
        except queue.Empty:
            pass
        for _, answer in out:
            if isinstance(answer, InitFailed):
                self.shutdown()
                raise to_exception(answer.error)
        return out

    def shutdown(self):
        self._finalizer()


def _thread_main(w, dataset, config, worker_init_fn, tasks, answers):
    try:
        if worker_init_fn is not None:
            worker_init_fn(w)
        producer = BatchMaker(dataset, config, seed_samples=False)
    except BaseException as e:
        answers.put((w, InitFailed(pack(e, w))))
        return
    while True:
        task = tasks.get()
        if task is None:
            return
        answers.put((w, run_task(producer, task, w)))


def _stop_threads(threads, queues):
    for q in queues:
        q.put(None)
    for t in threads:
        if t is not threading.current_thread():
            t.join()
