"""Batches produced on a Ray cluster: ``stoker.DataLoader(..., offload=stoker.RayOffload(...))``.
(The actor's side is in actor.py.)

Each Ray actor runs Stoker's own engine on its share of the rank's epoch: for a native dataset,
the dataset's spec (class, paths, transform) travels (pickled by its ``__reduce__``) and is
rebuilt in the actor, so the files must be readable at the same paths there (shared storage);
a Python dataset is pickled by Ray and runs in the actor through a ``stoker.DataLoader`` with
``num_workers=0``, positioned at each batch with ``load_state_dict``. The training process
receives finished batches, zero-copy from Ray's object store.

How an epoch is shared. The rank's epoch is its BatchPlan (the same as local loading: rank,
world size, elastic start); the epoch's remaining batches are dealt to S streams, stream k
taking batches first + k, first + k + S, ... (a strided view of the plan, iterated by the
actor's engine with ``cpus_per_actor`` threads running ahead), one stream per actor. The
consumer asks each stream for at most ``prefetch_factor`` batches ahead and takes the batches
in order, so they are the local loader's batches bit for bit (order, augmentation and per-sample
seeding depend only on (seed, epoch, index)), ``state_dict()`` is the local loader's (either
loads the other's state), and memory in flight is bounded.

When an actor dies, the batches of its streams that were not delivered yet are produced again:
each of its streams is opened anew, from its next undelivered batch, on the surviving actor with
the fewest streams (on a replacement, when none survives), and a replacement actor is started for
the epochs after it. ``stats()["retries"]`` counts the batches asked for again,
``stats()["actor_failures"]`` the actors lost. A batch whose production killed more than
``max_retries`` actors in a row raises WorkerError.
"""

from __future__ import annotations

import collections
import itertools
import time
import warnings

from .. import _native, balance
from .._checks import is_int
from .._extras import require
from ..errors import WorkerError
from .._producer import Offload
from ..native import EngineOrdered
from ..sources.base import is_native
from .actor import BatchActor, fingerprint, nbytes, unpack, unpack_error

_POLL_S = 0.5  # ray.get waits this long at a time, so that Ctrl-C is seen
_SLOW_START_S = 30.0  # waiting this long for actors to start: warn


def _import_ray():
    return require("ray", "ray", "stoker.RayOffload")


class RayOffload(Offload):
    """Produce a DataLoader's batches on a Ray cluster.

    Args:
        actors: Ray actors producing batches for this loader (each one a stream of the epoch).
        cpus_per_actor: CPUs each actor reserves and runs engine threads on (a Python dataset
            runs on one of them: give it more actors instead).
        address: the Ray cluster to join; None joins a running one (``ray.init(address="auto")``)
            or starts a local one. Not used when Ray is already initialized in this process.
        max_retries: times a batch is produced again after the actor producing it died; one
            more death raises WorkerError (a sample that crashes its process, say).

    Raises ImportError, saying how to install Ray, when Ray is not installed.
    """

    def __init__(self, actors=1, cpus_per_actor=1, address=None, *, max_retries=3):
        _import_ray()
        for name, value in (("actors", actors), ("cpus_per_actor", cpus_per_actor),
                            ("max_retries", max_retries)):
            if not is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if address is not None and not isinstance(address, str):
            raise ValueError(f"address must be None or a Ray address string, got {address!r}")
        self.actors = actors
        self.cpus_per_actor = cpus_per_actor
        self.address = address
        self.max_retries = max_retries

    def __repr__(self):
        return (f"RayOffload(actors={self.actors}, cpus_per_actor={self.cpus_per_actor}, "
                f"address={self.address!r})")

    def make_producer(self, dataset, options):
        """The producer of a ``stoker.DataLoader(dataset, offload=self)`` (the offload protocol:
        loader.py calls it with the parsed options)."""
        return RayProducer(dataset, options)

    def _connect(self):
        ray = _import_ray()
        if not ray.is_initialized():
            if self.address is None:
                try:
                    ray.init(address="auto")
                except ConnectionError:  # no running cluster: a local one
                    ray.init()
            else:
                ray.init(address=self.address)
        return ray


# -- the consumer's side -----------------------------------------------------------------------

class _Actors:
    """The loader's actors: ready ones, and replacements still starting."""

    def __init__(self, offload, dataset, config):
        self.ray = offload._connect()
        self.offload = offload
        # "control": close() runs on its own thread, at once, even while requests are queued.
        self.remote = self.ray.remote(concurrency_groups={"control": 1})(BatchActor).options(
            num_cpus=offload.cpus_per_actor, max_restarts=0, max_task_retries=0,
            scheduling_strategy="SPREAD")
        self.dataset_ref = self.ray.put(dataset)
        self.config = config
        self.ready = []
        self.starting = []  # (actor, ready ref)
        self.ever_ready = False
        self.pids = {}
        for _ in range(offload.actors):
            self.start()

    def start(self):
        actor = self.remote.remote(self.dataset_ref, self.config)
        self.starting.append((actor, actor.ready.remote()))
        return actor

    def promote(self, block):
        """Moves started actors to ``ready``. With ``block`` (an epoch starts; its streams are
        those of the actors ready then): the first time, waits for all of them up to
        _SLOW_START_S, then for one at least, with a warning (the cluster may have no free
        resources for them); later (replacements of dead actors), only while none is ready."""
        since = time.monotonic()
        warned = False
        while self.starting:
            waited = time.monotonic() - since > _SLOW_START_S
            slow = self.ever_ready or waited
            if block and waited and not warned:
                warned = True
                warnings.warn(
                    f"waited {_SLOW_START_S:.0f} s for Ray to start {len(self.starting)} "
                    f"actor(s) of {self.offload.cpus_per_actor} CPU(s): does the cluster have "
                    f"the free CPUs? (ray.available_resources(): "
                    f"{self.ray.available_resources()})", RuntimeWarning, stacklevel=4)
            wait = block and not (slow and self.ready)
            refs = [r for _, r in self.starting]
            done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=_POLL_S if wait else 0)
            for actor, ref in list(self.starting):
                if ref in done:
                    self.starting.remove((actor, ref))
                    self.pids[actor] = self.ray.get(ref)  # raises if its constructor did
                    self.ready.append(actor)
            if not wait:
                break
        self.ever_ready = self.ever_ready or bool(self.ready)

    def lost(self, actor):
        """Forgets a dead actor and starts its replacement."""
        if actor in self.ready:
            self.ready.remove(actor)
        self.starting = [(a, r) for a, r in self.starting if a != actor]
        self.pids.pop(actor, None)
        try:
            self.ray.kill(actor, no_restart=True)
        except Exception:
            pass
        return self.start()

    def shutdown(self):
        if self.ray.is_initialized():  # else the actors are gone with the cluster
            for actor in self.ready + [a for a, _ in self.starting]:
                try:
                    self.ray.kill(actor, no_restart=True)
                except Exception:
                    pass
        self.ready, self.starting = [], []


class RayProducer(EngineOrdered):
    """Batches made by Ray actors (see the module's docstring; _producer.py states the producer
    protocol)."""

    def __init__(self, dataset, options):
        o = options
        native = is_native(dataset)
        if native and dataset._unbatchable:
            raise ValueError(dataset._unbatchable)
        if not native:
            from torch.utils.data import IterableDataset
            if isinstance(dataset, IterableDataset) or not (
                    hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
                raise ValueError("offload needs a map-style dataset (__getitem__ and __len__): "
                                 "the actors produce batches by their sample indices")
        for key, value in o.python_given().items():
            if key not in ("collate_fn", "seed_samples"):
                raise ValueError(f"{key}={value!r} is not supported with offload: the actors "
                                 f"order and batch samples with the engine's plan")
        if native and o.python_given():
            raise ValueError("collate_fn and seed_samples are for Python datasets")
        if o.num_workers != "auto":
            raise ValueError('with offload, num_workers must be "auto": each actor runs '
                             'cpus_per_actor threads (RayOffload(cpus_per_actor=...))')
        if o.cpu_budget is not None:
            raise ValueError("cpu_budget is for local threads; with offload, see "
                             "RayOffload(actors=..., cpus_per_actor=...)")
        if o.pin_memory is True:
            raise ValueError("pin_memory=True is not supported with offload: batches arrive in "
                             "Ray's object store")
        for given, what in ((o.repeats != 1, "repeats"),
                            (o.batch_transform is not None, "batch_transform"),
                            (o.budget is not None, f"batch_size={o.budget!r}")):
            if given:
                raise ValueError(f"{what} is not supported with offload yet: load without "
                                 f"offload")
        # A stratified or weighted order: the actors build the same one from the same labels.
        super().__init__(dataset, o)
        if self.mixture is not None:
            raise ValueError("a Mixture cannot be offloaded to Ray yet: its batches are laid out "
                             "whole for the loader's ranks; load it without offload")
        if self.shuffle == "shards":
            raise ValueError('shuffle="shards" is not supported with offload yet: pass '
                             'shuffle=True')
        self.offload = o.offload
        # A dataset in blocks (Parquet row groups), shuffled: the actors' engines visit it in a
        # block order, whose arrangement the resume state records (_state.py).
        blocks = dataset._source.blocks() if native and self.order_kind == "engine" and \
            self.shuffle is not False else ([], 0)
        self.block_window = blocks[1] if blocks[0] else 0
        self._torch = o.torch_output
        self._prefetch = _native.pydata.DEFAULT_PREFETCH_FACTOR if o.prefetch_factor == "auto" \
            else o.prefetch_factor
        self._budget = _native.engine.resolve_memory_budget(o.memory_budget)
        loader_kw = dict(batch_size=o.batch_size, shuffle=self.shuffle, seed=o.seed,
                         drop_last=o.drop_last, rank=o.rank, world_size=o.world_size,
                         on_error=o.on_error, memory_budget=o.memory_budget or None)
        if o.stratified:
            loader_kw.update(class_weights=o.class_weights,
                             labels=None if o.labels is None else
                             balance.labels_of(dataset, o.labels))
        self._config = {"fingerprint": fingerprint(dataset), "loader": loader_kw,
                        "threads": self.offload.cpus_per_actor,
                        "python": {} if native else {
                            "collate_fn": o.python["collate_fn"],
                            "seed_samples": o.python["seed_samples"]}}
        self._actors = None
        self._stats = collections.Counter()
        self._skipped_samples = collections.deque(maxlen=_native.engine.SKIPPED_LISTED)

    def knobs(self):
        return {"num_workers": self.offload.actors * self.offload.cpus_per_actor,
                "prefetch_factor": self._prefetch, "pin_memory": False,
                "memory_budget": self._budget}

    def num_batches(self):
        return self.plan().num_batches

    def batches(self, cursor):
        if self._actors is None:
            self._actors = _Actors(self.offload, self.dataset, self._config)
        return _OffloadIterator(self, cursor)

    def shutdown(self):
        """Stops the actors now (they also stop when the loader is garbage collected). The next
        iteration starts new ones."""
        if self._actors is not None:
            self._actors.shutdown()
            self._actors = None

    def stats(self):
        """Counters since the loader was made: batches, samples, skipped samples, retries
        (batches asked for again after an actor died), actor failures, actors, batches in
        flight (peak), the consumer's wait and CPU time."""
        s = dict(self._stats)
        for key in ("batches", "samples", "skipped", "retries", "actor_failures",
                    "in_flight_peak", "batch_bytes"):
            s.setdefault(key, 0)
        for key in ("consumer_wait_s", "consumer_cpu_s"):
            s.setdefault(key, 0.0)
        s["skipped_samples"] = list(self._skipped_samples)
        actors = self._actors
        s.update(actors=len(actors.ready) if actors else 0,
                 actors_starting=len(actors.starting) if actors else 0)
        return s


class _Stream:
    """Every ``step``-th batch of the epoch from ``next_batch`` on, asked of one actor."""

    __slots__ = ("id", "actor", "next_batch", "step", "end", "pending")

    def __init__(self, stream_id, first, step, end):
        self.id = stream_id
        self.actor = None
        self.next_batch = first  # the next batch to ask for
        self.step = step
        self.end = end
        self.pending = collections.deque()  # (ref, batch number), in order


_stream_ids = itertools.count()


class _OffloadIterator:
    def __init__(self, producer, cursor):
        self.producer = producer
        self.cursor = cursor
        self.actors = producer._actors
        self.ray = self.actors.ray
        self.epoch = cursor.epoch
        self.start = cursor.start
        self.end = cursor.num_batches
        self.plan = producer.plan(self.start)
        self.failures = {}  # batch number -> actors it killed in a row
        self.done = cursor.batch >= self.end
        self.streams = []
        if self.done:
            return
        self.actors.promote(block=True)
        count = min(len(self.actors.ready), self.end - cursor.batch)
        self.first = cursor.batch
        for k in range(count):
            stream = _Stream(next(_stream_ids), cursor.batch + k, count, self.end)
            self.streams.append(stream)
            self._open(stream, self.actors.ready[k])

    def __iter__(self):
        return self

    def __len__(self):
        return self.end - self.cursor.batch

    def _depth(self):
        """Batches a stream may have in flight: prefetch_factor, fewer when all streams' would
        not fit in memory_budget."""
        size = self.producer._stats["batch_bytes"]
        if not size:
            return 1 if self.producer._stats["batches"] == 0 else self.producer._prefetch
        fit = self.producer._budget // (size * max(1, len(self.streams)))
        return max(1, min(self.producer._prefetch, fit))

    def _open(self, stream, actor):
        stream.actor = actor
        stream.pending.clear()
        actor.open.remote(stream.id, self.epoch, self.start, stream.next_batch, stream.step,
                          self.cursor.stripes or 0)
        self._top_up(stream)

    def _top_up(self, stream):
        depth = self._depth()
        while len(stream.pending) < depth and stream.next_batch < stream.end:
            stream.pending.append((stream.actor.next.remote(stream.id), stream.next_batch))
            stream.next_batch += stream.step
        in_flight = sum(len(s.pending) for s in self.streams)
        if in_flight > self.producer._stats["in_flight_peak"]:
            self.producer._stats["in_flight_peak"] = in_flight

    def _failed(self, stream, error):
        """The actor of ``stream`` died (or the batch's object was lost): its streams start
        again from their next undelivered batches on another actor."""
        ray = self.ray
        b = stream.pending[0][1]
        self.failures[b] = self.failures.get(b, 0) + 1
        died = isinstance(error, ray.exceptions.RayActorError)
        self.producer._stats["actor_failures"] += died
        if self.failures[b] > self.producer.offload.max_retries:
            self._finish()
            raise WorkerError(f"batch {b} of epoch {self.epoch}: the Ray actors producing it died "
                              f"{self.failures[b]} times in a row (last: {error})") from error
        dead = stream.actor
        if died:
            replacement = self.actors.lost(dead)
            orphans = [s for s in self.streams if s.actor == dead]
        else:  # ObjectLostError: the actor may live; this stream starts again
            replacement = None
            orphans = [stream]
        alive = [a for a in self.actors.ready if a != dead]
        for s in orphans:
            self.producer._stats["retries"] += len(s.pending)
            s.next_batch = s.pending[0][1] if s.pending else s.next_batch
            s.pending.clear()
            s.actor = None
            load = collections.Counter(x.actor for x in self.streams)
            target = min(alive, key=lambda a: load[a]) if alive else replacement or dead
            self._open(s, target)

    def __next__(self):
        if self.done:
            raise StopIteration
        if self.cursor.batch >= self.end:
            self._finish()
            raise StopIteration
        ray = self.ray
        b = self.cursor.batch
        stream = self.streams[(b - self.first) % len(self.streams)]
        cpu0, t0 = time.process_time(), time.perf_counter()
        while True:
            ref, expected = stream.pending[0]
            assert expected == b, (expected, b)
            try:
                reply = self._get(ref)
                break
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as e:
                self._failed(stream, e)
        stream.pending.popleft()
        self._top_up(stream)
        self.failures.pop(b, None)
        kind, got, payload, skipped = reply
        assert got == b, (got, b)
        st = self.producer._stats
        self.cursor.batch += 1
        for text in skipped:
            st["skipped"] += 1
            self.producer._skipped_samples.append(text)
        if kind == "error":
            st["consumer_cpu_s"] += time.process_time() - cpu0
            raise unpack_error(payload)
        batch = unpack(payload, self.producer._torch)
        st["batches"] += 1
        st["samples"] += self.plan.batch_length(b)
        if not st["batch_bytes"]:
            st["batch_bytes"] = nbytes(payload)
        st["consumer_wait_s"] += time.perf_counter() - t0
        st["consumer_cpu_s"] += time.process_time() - cpu0
        if self.cursor.batch >= self.end:
            self._finish()
        return batch

    def _get(self, ref):
        while True:
            try:
                return self.ray.get(ref, timeout=_POLL_S)
            except self.ray.exceptions.GetTimeoutError:
                self.actors.promote(block=False)

    def _finish(self):
        if self.done:
            return
        self.done = True
        # Not after ray.shutdown(): a remote call would start a new Ray instance.
        connected = self.ray.is_initialized()
        for s in self.streams:
            # close() runs at once on the actor's control thread; the requests still queued then
            # return at once (ray.cancel of a queued actor task would break the actor's order).
            s.pending.clear()
            if connected:
                try:
                    s.actor.close.options(concurrency_group="control").remote(s.id)
                except Exception:
                    pass

    def __del__(self):
        try:
            self._finish()
        except Exception:
            pass
