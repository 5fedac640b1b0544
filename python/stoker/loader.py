"""``stoker.DataLoader``: the one front of every dataset and every option.

The constructor checks the options once (_options.py ``parse``, after torch's own checks for a
Python dataset), then hands the immutable ``Options`` to one of three producers (_producer.py
declares what the front reads of them), chosen by the dataset and ``offload``:

- native.py, :class:`NativeProducer`: a Stoker dataset (sources/base.py ``StokerDataset``), read
  by the C++ engine's threads;
- pydata/producer.py, :class:`PythonProducer`: any Python (torch) dataset, in worker processes;
- offload/producer.py, :class:`RayProducer`: either kind, on Ray actors.

Each iteration starts at its first ``next()`` (so ``iter()`` alone starts nothing, and a
``set_epoch`` between ``iter()`` and the first batch applies, as Lightning calls them): then it
resolves the ranks (_ranks.py: a process group made after the loader counts; the first
iteration checks that all ranks agree), and runs from the loader's pending ``_state.Position``
with a ``_state.Cursor`` that its iterator owns and advances (_state.py: the resume state). The loader
wraps whatever the producer yields in the GPU feed (gpu/feed.py) when ``device`` is a GPU (with
the producer's ``device_mixing`` and ``device_output`` around it), and builds ``stats()`` and
``state_dict()`` in one place.
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref

from . import _native, _options, _ranks, _state, balance
from ._checks import is_int
from .gpu import feed as _feed
from ._producer import Offload
from .native import NativeProducer
from .sources.base import StokerDataset, is_native

# The attributes torch freezes once a loader is made.
_FROZEN_AFTER_INIT = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset",
                      "persistent_workers")
# Stoker's own options, read from the frozen Options: fixed once the loader is made too (setting
# one used to change a copy that nothing read).
_OPTIONS = ("output", "on_error", "class_weights", "offload", "repeats", "shard_window")


def _producer_kind(dataset, offload):
    """Which producer makes the batches: "offload" (Ray actors), "native" (a Stoker dataset, the
    engine's threads) or "python" (any other dataset, worker processes)."""
    if offload is not None:
        if not isinstance(offload, Offload):
            raise TypeError(f"offload must be a stoker.RayOffload, got {offload!r}")
        return "offload"
    return "python" if dataset is not None and not is_native(dataset) else "native"


def _make_producer(kind, dataset, options):
    if kind == "offload":  # an offload makes its producer (offload/producer.py RayOffload)
        return options.offload.make_producer(dataset, options)
    if kind == "python":
        from .pydata.producer import PythonProducer  # imports torch: only when needed
        return PythonProducer(dataset, options)
    return NativeProducer(dataset, options)


class DataLoader:
    """Batches of a dataset, produced ahead of the consumer.

    Every knob defaults to ``"auto"``. Batches depend only on (dataset, batch_size, shuffle, seed,
    epoch, drop_last, rank, world_size, repeats, batch_transform): never on ``num_workers`` or
    ``prefetch_factor``.

    Args:
        dataset: a Stoker dataset (``ArrayDataset``, ``TokenDataset``, ``ImageFolder``,
            ``TarShards``, ``TableDataset``, a ``Mixture`` of them: docs/mixtures.md), read by
            C++ threads; or any Python dataset (a map-style one with ``__getitem__`` and
            ``__len__``, or an ``IterableDataset``), read in worker processes with torch's
            keywords and semantics (docs/python-datasets.md).
        batch_size: samples per batch (Python datasets: None yields samples unbatched).
        shuffle: visit samples in a seeded random order, new for every epoch. "stratified":
            also hold every class in every batch (and every rank's batch) within one sample of
            its share of the dataset; needs labels (below). "shards": for a dataset in shards
            (remote storage: each shard a request), each rank reads about ``shard_window``
            shards at a time, their samples shuffled together, every sample still once an
            epoch (stoker/block_order.h; docs/remote.md, "Shuffle quality"). A dataset
            whose ``default_shuffle`` is "shards" takes shuffle=True to mean it.
        seed: the seed of the order (and of per-sample randomness).
        drop_last: drop the final partial batch (and, across ranks, the uneven tail).
        num_workers: worker threads (Python datasets: processes); 0 produces batches on the
            calling thread.
        prefetch_factor: batches in flight per worker.
        pin_memory: page-locked batch buffers; "auto" pins when a CUDA device is present.
        memory_budget: bytes (or a size like "2GiB") that batch buffers may use together;
            None means half of physical memory.
        rank, world_size: this process's share of each epoch, resolved when each iteration
            starts: integers as given; ``rank=`` a torch.distributed process group, a 1-D
            DeviceMesh (``mesh["dp"]``) or ``(mesh, "dp")`` (the data-parallel dimensions, as
            torchtitan and FSDP2 name them); by default the initialized default process group,
            else torchrun's RANK and WORLD_SIZE, else 0 and 1. WORLD_SIZE > 1 with no rank to
            be found raises. Where the ranks come from a process group, the first iteration
            checks (one all-gather) that all ranks agree on the dataset's length, seed,
            batch_size, drop_last and epoch (stoker/_ranks.py).
        output: "torch" (tensors; NumPy arrays when torch is not installed) or "numpy".
        on_error: "raise" (default) or "skip" (replace a failed sample deterministically, count
            it in ``stats()``).
        cpu_budget: cores the online autotune may give to workers when num_workers is "auto"
            (None: usable cores). With num_workers and/or prefetch_factor "auto", a controller
            starts at one active worker and sets both while the loader runs; its decisions are
            in ``stats()["autotune"]`` and logged to the "stoker.autotune" logger.
        device: None or "cpu" (CPU batches), or "cuda", "cuda:N", a torch.device: batches are
            copied to that GPU ahead of the consumer, on a copy stream, and yielded there (see
            stoker/gpu/feed.py for the stream contract). Raises RuntimeError without CUDA.
        gpu_prefetch: batches copied to the GPU ahead of the one the consumer holds ("auto": 2).
        gpu_prefetch_bytes: GPU memory those batches may take (bytes or a size like "2GiB";
            None: a tenth of the device's memory).
        class_weights: draw the classes in these proportions instead: "balanced" (each class
            equally often), a mapping {label: weight} for every class, or a sequence indexed by
            label. Rare classes repeat, frequent ones are subsampled; every sample of a class
            is drawn before any is drawn again, across epochs. An epoch has len(dataset) draws
            (``class_plan()`` says how many of each class). Needs shuffle=True or "stratified".
        labels: the class of every sample, for shuffle="stratified" and class_weights; by
            default the dataset's (``targets``, or the label array of an ArrayDataset).
        offload: a ``stoker.RayOffload``: batches are produced by Ray actors (see
            ``stoker.offload``), the same batches as here, bit for bit.
        repeats: repeated augmentation (DeiT's RASampler): every sample ``repeats`` times an
            epoch, at that many consecutive positions of the epoch's global order (so torchrun's
            ranks get different copies), each copy with its own augmentation (copy r of epoch e
            draws as "cycle" e * repeats + r). An epoch, len(loader) and the resume state count
            ``len(dataset) * repeats`` samples; a state must be loaded with the same repeats.
            Not with shuffle="stratified", class_weights, a Mixture, a sampler, an
            IterableDataset or offload.
        batch_transform: MixUp, CutMix or a RandomChoice of them (``stoker.batch_transforms``,
            or torchvision.transforms.v2's, read from the objects), applied to every batch of
            an image dataset with labels (ImageFolder, TarShards, TableDataset(image=...,
            label=...)), which then yields ``(images, soft_labels)``: float32 one-hot labels of
            ``num_classes`` mixed with the images' lambda. It runs in C++ on the worker thread
            that finishes each batch, or with a ``device`` on the GPU after the copy (the same
            parameters); one draw per batch from (seed, epoch, batch), so batches stay the same
            whatever num_workers, and on resume. docs/recipes.md says what runs where.
        shard_window: with shuffle="shards", the shards each rank keeps open ("auto": 8). The
            resume state records it (a state loads only with the same shard_window) and the
            world size each epoch's shard order is arranged for.
        **python_options: torch's keywords for Python datasets (sampler, batch_sampler,
            collate_fn, worker_init_fn, timeout, persistent_workers, generator,
            multiprocessing_context, in_order, pin_memory_device) and Stoker's (worker_type,
            seed_samples, consumer_helps); see docs/python-datasets.md.
    """

    def __class_getitem__(cls, item):  # DataLoader[T] in annotations, as torch's is generic
        return cls

    def __init__(self, dataset, batch_size=1, shuffle=None, seed=0, drop_last=False,
                 num_workers="auto", prefetch_factor="auto", pin_memory="auto",
                 memory_budget=None, rank=None, world_size=None, output="torch",
                 on_error="raise", cpu_budget=None, device=None, gpu_prefetch="auto",
                 gpu_prefetch_bytes=None, class_weights=None, labels=None, offload=None,
                 repeats=1, batch_transform=None, shard_window="auto", **python_options):
        kind = _producer_kind(dataset, offload)
        if kind == "python":  # torch's own checks first, with torch's messages
            from .pydata.producer import validate
            validate(dataset, batch_size, shuffle, python_options, drop_last, num_workers,
                     prefetch_factor)
        options = _options.parse(
            dataset, kind, batch_size, shuffle, seed, drop_last, num_workers, prefetch_factor,
            pin_memory, memory_budget, rank, world_size, output, on_error, cpu_budget, device,
            gpu_prefetch, gpu_prefetch_bytes, class_weights, labels, offload, python_options,
            repeats, batch_transform, shard_window)
        self._kind = kind
        self._dataset_given = dataset
        self._options = options
        self._producer = None
        # What torch-based trainers read at loader.sampler and loader.batch_sampler (Lightning
        # calls sampler.set_epoch) where the loader orders the samples itself.
        self._epoch_sampler = EpochSampler(self)
        self._set_producer(_make_producer(kind, dataset, options))
        self._batch_transform = batch_transform  # as given (options hold its parsed form)
        self._device = options.device
        self._copy_stage = None  # the GPU copy stage (one copy stream), made at the first iteration
        self._gpu_stats = {}
        self._next = _state.Position()  # where the next iteration starts
        # The latest iteration's _state.Cursor, owned by its iterator: read for state_dict(), so
        # the loader holds no reference to the iterator (dropping it stops its threads).
        self._cursor = None
        self._loaded = None  # the state loaded since the last iteration started (re-read when
        # the ranks resolve to another share)
        self._agreed = False  # the ranks' agreement was checked (_ranks.check_agreement)
        self._initialized = True

    def _set_producer(self, producer):
        self._producer = producer
        set_ = object.__setattr__  # the attributes torch freezes after __init__
        for name, value in producer.attributes().items():
            set_(self, name, value)
        if self.sampler is None and self.batch_sampler is None and \
                producer.order_kind in ("engine", "stratified", "mixture"):
            set_(self, "sampler", self._epoch_sampler)
            set_(self, "batch_sampler", self._epoch_sampler.batches)

    def _share(self, strict):
        """The ranks now (_ranks.py): where they differ from the producer's, the producer is
        made again for the new share (and a loaded state read again for it)."""
        share = self._options.rank_spec.resolve(strict)
        o = self._options
        if (share.rank, share.world_size) != (o.rank, o.world_size):
            self._options = dataclasses.replace(o, rank=share.rank, world_size=share.world_size)
            self._producer.shutdown()
            self._set_producer(_make_producer(self._kind, self._dataset_given, self._options))
            if self._loaded is not None:
                self._load(self._loaded)
        return share

    def _settings(self):
        """What the resume state is a function of (_state.Settings): the frozen options as the
        producer resolved them, the latest cursor and the pending position."""
        p, o = self._producer, self._options
        try:
            num_batches = p.num_batches()
        except TypeError:  # an IterableDataset without __len__
            num_batches = None
        return _state.Settings(
            dataset=self.dataset, seed=p.seed, shuffle=self.shuffle, batch_size=self.batch_size,
            drop_last=self.drop_last, rank=self.rank, world_size=self.world_size, repeats=o.repeats,
            order=p.order_kind, classes=p.classes, weights=p.weights,
            block_window=p.block_window, num_batches=num_batches, cursor=self._cursor,
            next=self._next, producer=p)

    def _load(self, state):
        self._next = _state.load(self._settings(), state)
        self._producer.restore_own_states(state, self._next)

    def __setattr__(self, name, value):
        if name in _FROZEN_AFTER_INIT + _OPTIONS + ("batch_transform",) and \
                self.__dict__.get("_initialized", False):
            raise ValueError(f"{name} attribute should not be set after "
                             f"{type(self).__name__} is initialized")
        object.__setattr__(self, name, value)

    # Stoker's options, as given and checked (one home: the frozen _options.Options).
    @property
    def output(self):
        return self._options.output

    @property
    def on_error(self):
        return self._options.on_error

    @property
    def class_weights(self):
        return self._options.class_weights

    @property
    def offload(self):
        return self._options.offload

    @property
    def repeats(self):
        return self._options.repeats

    @property
    def shard_window(self):
        return self._options.shard_window

    @property
    def batch_transform(self):
        return self._batch_transform

    # The knobs as resolved: "auto" replaced by the value in use.
    @property
    def num_workers(self):
        return self._producer.knobs()["num_workers"]

    @property
    def prefetch_factor(self):
        """Batches in flight per worker; None without workers, as torch has it."""
        if self.num_workers == 0:
            return None
        return self._producer.knobs()["prefetch_factor"]

    @property
    def pin_memory(self):
        return self._producer.knobs()["pin_memory"]

    @property
    def memory_budget(self):
        return self._producer.knobs()["memory_budget"]

    @property
    def seed(self):
        """The seed of the order and of per-sample randomness (with a ``generator``: drawn from
        it once, at first use)."""
        return self._producer.seed

    @property
    def multiprocessing_context(self):
        return self._producer.context

    @property
    def _iterator(self):
        """The latest iterator while workers persist (as torch keeps it); setting None stops
        them."""
        return self._producer.persistent_iterator()

    @_iterator.setter
    def _iterator(self, value):
        if value is None:
            self._producer.stop_workers()

    @property
    def _auto_collation(self):
        """Whether samples are batched (torch's name): False only for a Python dataset read
        with batch_size=None."""
        return self._producer.auto_collation

    @property
    def _order_kind(self):
        return self._producer.order_kind

    def __len__(self):
        self._share(strict=False)
        if self._producer.budget_order is not None:  # the pending epoch's own count
            return _state.budget_epoch(self._settings(), self._next).num_batches
        return self._producer.num_batches()

    def set_epoch(self, epoch):
        """Makes the next iteration run epoch ``epoch`` from its start; right after
        ``load_state_dict`` positioned the loader inside epoch ``epoch``, keeps that position
        (so a torch-style loop that calls set_epoch every epoch resumes where it stopped)."""
        if not is_int(epoch) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        at = self._next
        if at.resumed and (at.batch or at.start) and epoch != at.epoch:
            warnings.warn(f"set_epoch({epoch}) discards the position load_state_dict gave the "
                          f"loader, inside epoch {at.epoch}: epoch {epoch} starts from its first "
                          f"batch (a trainer resuming mid-epoch sets the loaded epoch)",
                          stacklevel=2)
        self._next = at.for_epoch(epoch)

    def __iter__(self):
        """An iterator over the next epoch's batches (see the module docstring: it starts at its
        first ``next()``)."""
        self._producer.iteration_made()
        return Iteration(self)

    def _start(self):
        """Starts the pending iteration: its batches (``Iteration`` calls this once)."""
        share = self._share(strict=True)
        if share.groups and not self._agreed:
            _ranks.check_agreement(share, _ranks.agreement_values(
                _state.num_samples(self.dataset), self.seed, self.batch_size, self.drop_last,
                self._next.epoch))
            self._agreed = True
        cursor, self._next = _state.begin(self._settings())
        self._cursor = cursor
        self._loaded = None
        batches = self._producer.batches(cursor)
        if self._device is None:
            return batches
        if self._copy_stage is None:
            self._copy_stage = self._producer.copy_stage(self._device) or \
                _feed.CopyStage(self._device)
        stage = self._copy_stage
        mixing = self._producer.device_mixing  # a batch transform, on the GPU
        if mixing is not None:
            batches, stage = mixing.tag(batches, cursor), mixing.stage(stage)
        feed = _feed.DeviceFeed(batches, self._device, self._options.gpu_prefetch,
                                self._options.gpu_prefetch_bytes, stage=stage,
                                cursor=cursor, stats=self._gpu_stats)
        output = self._producer.device_output  # ToTensor on the GPU
        if output is not None:
            feed = output.finish(feed, tagged=mixing is not None)
        return feed if mixing is None else mixing.finish(feed)

    def _pending_len(self):
        """Batches the pending iteration will yield; TypeError for an IterableDataset, whose
        len() is the user's to ask (torch warns once it was: not a length hint's to ask)."""
        cursor, _ = _state.begin(self._settings())
        if cursor.num_batches is None:
            raise TypeError("the length of an IterableDataset's iteration is unknown")
        return cursor.num_batches - cursor.batch

    def state_dict(self):
        """Where the next batch comes from, as a small JSON-serializable dict: the epoch, the
        batches each rank delivered and the global position the epoch's plan started at, with
        the settings that must match to resume (O(1): no list of samples)."""
        return _state.save(self._settings())

    def load_state_dict(self, state, weights=None):
        """Makes the next iteration resume exactly where ``state`` was taken, whatever the
        num_workers and prefetch_factor of this loader. With the world size that saved it, the
        same batches follow; with another world size (elastic resume; rank is free too), the
        samples the saving job's ranks had delivered together are not repeated and the rest of
        the epoch is split among this job's ranks with equal batch counts (padding, with
        drop_last=False, repeats fewer samples than there are ranks). Raises ValueError where
        that cannot hold: another seed, shuffle, batch_size, drop_last or dataset length, or,
        across world sizes, samples ordered by a custom sampler or an IterableDataset.

        A ``stoker.Mixture``: ``weights`` (as ``Mixture(weights=...)`` takes them) replace the
        mixture's weights first (``dataset.weights = weights`` does the same). With other
        weights than the saved plan used, or another world size, the batches from the saved
        step on follow the weights in force at each step, and each source's stream goes on
        exactly where the saving job left it: no sample lost or repeated."""
        if weights is not None:
            if self._producer.order_kind != "mixture":
                raise ValueError("load_state_dict(weights=...) is for a loader of a "
                                 "stoker.Mixture")
            self.dataset.weights = weights
        self._share(strict=False)
        self._load(state)
        self._cursor = None
        self._loaded = state

    def class_plan(self):
        """For a stratified or weighted loader, one dict a class: ``label``, ``samples``,
        ``draws_per_epoch`` (over all ranks; the same every epoch) and ``per_batch`` (its
        expected count in a full batch; every batch holds it rounded down or up)."""
        classes = self._producer.classes
        if classes is None:
            raise ValueError('class_plan() is for a loader with shuffle="stratified" or '
                             'class_weights')
        weights = self._producer.weights
        plan = _native.engine.StratifiedPlan(classes, weights, self.seed, self.batch_size,
                                      self.drop_last, self.rank, self.world_size)
        return balance.class_plan(classes, weights, plan.class_draws, self.batch_size)

    def stats(self):
        """Counters since the loader was made: batches, samples, skipped samples (and the most
        recent ones described), the knobs in use, the device, and each producer's own figures
        (the native engine's stage times and autotune decisions, worker processes, Ray actors;
        docs/ says which)."""
        s = self._producer.stats()
        if self._producer.order_kind == "mixture":
            s["mixture"] = _state.mixture_stats(self._settings(),
                                                s.pop("mixture_samples", None))
        for key in ("batches", "samples", "skipped"):
            s.setdefault(key, 0)
        order = self._producer.budget_order
        if order is not None:  # batches by a budget: the running (or pending) epoch's figures
            cursor = self._cursor
            epoch = cursor.budget if cursor is not None and cursor.budget is not None else \
                _state.budget_epoch(self._settings(), self._next)
            s["budget"] = order.stats(epoch, s)
            s["skipped"] += order.oversized  # left out of every epoch (on_error="skip")
        s.setdefault("skipped_samples", [])
        if isinstance(self.dataset, StokerDataset):
            s.update(self.dataset._stats())  # the dataset's own sections (sources/base.py)
        s.update(self._producer.knobs())
        s["device"] = str(self._device or "cpu")
        s.update(self._gpu_stats)
        if self._copy_stage is not None:  # a GPU decode stage counts its skips too
            self._copy_stage.add_stats(s)
        return s

    def shutdown(self):
        """Stops this loader's workers (processes, Ray actors) now; the next iteration starts
        new ones. Threads of the native engine stop with their iterator."""
        self._producer.shutdown()


class Iteration:
    """One iteration of a ``stoker.DataLoader``: it starts at its first ``next()`` (its epoch,
    ranks and producer are fixed then), so ``iter()`` alone starts nothing and ``set_epoch``
    after ``iter()`` applies to it. Other attributes are its running batches' (torch's iterator
    attributes of a Python dataset's, e.g. ``_workers``), which starts it."""

    __slots__ = ("_loader", "_batches", "__weakref__")

    def __init__(self, loader):
        self._loader = loader
        self._batches = None

    def __iter__(self):
        return self

    def _running(self):
        if self._batches is None:
            self._batches = self._loader._start()
            self._loader = None
        return self._batches

    def __next__(self):
        return next(self._running())

    def __len__(self):
        if self._batches is None:
            return self._loader._pending_len()
        return len(self._batches)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._running(), name)


_NOT_A_TORCH_SAMPLER = (
    "stoker.DataLoader orders and batches its samples itself (in the engine, by seed and epoch, "
    "for this rank): its sampler and batch_sampler are there for trainers to call set_epoch, "
    "and a torch DataLoader rebuilt from them (accelerate's skip_first_batches or "
    "prepare_data_loader) would give other batches. Iterate the stoker.DataLoader itself; to "
    "resume mid-epoch, load its state: loader.load_state_dict(state) (with Accelerate, "
    "accelerator.register_for_checkpointing(loader) saves it in save_state and restores it in "
    "load_state). docs/integrations.md has each framework's recipe.")


class EpochSampler:
    """``loader.sampler`` (and ``loader.batch_sampler.sampler``) of a loader that orders its own
    samples: what torch-based trainers call ``set_epoch`` on (Lightning does, every epoch, after
    ``iter()`` and before the first batch). ``set_epoch(e)`` is ``loader.set_epoch(e)``;
    ``len()`` is the samples of this rank's epoch. Iterating it raises TypeError naming the
    Stoker way: its order is the engine's, not a sampler's to replay. Holds the loader weakly."""

    def __init__(self, loader):
        self._loader = weakref.ref(loader)
        self.batches = EpochBatchSampler(self)

    def loader(self):
        loader = self._loader()
        if loader is None:
            raise ReferenceError("the stoker.DataLoader of this sampler is gone")
        return loader

    def set_epoch(self, epoch):
        self.loader().set_epoch(epoch)

    @property
    def epoch(self):
        """The epoch the loader's next iteration starts."""
        return self.loader()._next.epoch

    def __len__(self):
        loader = self.loader()
        if loader._producer.budget_order is not None:  # this rank's samples of the epoch
            epoch = _state.budget_epoch(loader._settings(), loader._next)
            return sum(len(epoch.batch(b)) for b in range(epoch.num_batches))
        return _state.plan(loader._settings()).num_samples if loader.batch_size is not None \
            else len(loader)

    def __iter__(self):
        raise TypeError(_NOT_A_TORCH_SAMPLER)


class EpochBatchSampler:
    """``loader.batch_sampler`` of a loader that orders its own samples: ``sampler`` (the
    :class:`EpochSampler`), ``batch_size``, ``drop_last`` and ``len()`` as the loader's;
    iterating it raises TypeError naming the Stoker way."""

    def __init__(self, sampler):
        self.sampler = sampler

    @property
    def batch_size(self):
        return self.sampler.loader().batch_size

    @property
    def drop_last(self):
        return self.sampler.loader().drop_last

    def __len__(self):
        return len(self.sampler.loader())

    def __iter__(self):
        raise TypeError(_NOT_A_TORCH_SAMPLER)
