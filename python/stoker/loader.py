"""``stoker.DataLoader``: the Python front of the native loader."""

from __future__ import annotations

import gc
import os
import re
import warnings

from . import _native, _state, balance
from . import device as _device
from .errors import MemoryBudgetError

_MAX_WORKERS = _native.engine.MAX_WORKERS
_MAX_PREFETCH = _native.engine.MAX_PREFETCH_FACTOR
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _parse_bytes(value, name="memory_budget"):
    if value is None:
        return 0  # the engine's default: half of physical memory
    if _is_int(value) and value > 0:
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS:
            n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
            if n > 0:
                return n
    raise ValueError(
        f"{name} must be None, a positive number of bytes, or a size such as '4GiB' or "
        f"'512MB', got {value!r}")


def _knob(name, value, low, high):
    if value == "auto":
        return -1
    if not _is_int(value) or not low <= value <= high:
        raise ValueError(f'{name} must be "auto" or an integer in [{low}, {high}], got {value!r}')
    return value


def _env_int(name, default):
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def _ranks(rank, world_size):
    """(rank, world_size), from torchrun's RANK and WORLD_SIZE where not given; checked."""
    rank = _env_int("RANK", 0) if rank is None else rank
    world_size = _env_int("WORLD_SIZE", 1) if world_size is None else world_size
    if not _is_int(world_size) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if not _is_int(rank) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in [0, {world_size}), got {rank!r}")
    return rank, world_size


def _feed_options(device, output, gpu_prefetch, gpu_prefetch_bytes):
    """(torch.device or None, GPU prefetch depth, GPU byte cap or None) of a loader's device=,
    gpu_prefetch= and gpu_prefetch_bytes=; checked (a CUDA device yields torch tensors)."""
    resolved = _device.resolve_device(device)
    if resolved is not None and output != "torch":
        raise ValueError(f'device={device!r} yields torch tensors: output must be "torch", '
                         f"got {output!r}")
    cap = None if gpu_prefetch_bytes is None else \
        _parse_bytes(gpu_prefetch_bytes, "gpu_prefetch_bytes")
    return resolved, _device.resolve_prefetch(gpu_prefetch), cap


def _torch_available():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


_PY_DEFAULTS = {"sampler": None, "batch_sampler": None, "collate_fn": None,
                "worker_init_fn": None, "timeout": 0, "persistent_workers": False,
                "generator": None, "worker_type": "auto", "seed_samples": True,
                "consumer_helps": None, "multiprocessing_context": None, "in_order": True,
                "pin_memory_device": ""}


def _is_native(dataset):
    """A Stoker dataset (read by the engine), including one that cannot be batched as made (an
    ImageFolder without a transform: the native loader explains why)."""
    return (isinstance(getattr(dataset, "_source", None), _native.sources.Source)
            or getattr(dataset, "_unbatchable", None) is not None)


class DataLoader:
    """Batches of a native dataset, produced ahead of the consumer by C++ threads.

    Every knob defaults to ``"auto"``. Batches depend only on (dataset, batch_size, shuffle, seed,
    epoch, drop_last, rank, world_size): never on ``num_workers`` or ``prefetch_factor``.

    Args:
        dataset: a Stoker dataset (``ArrayDataset``, ``TokenDataset``, ``ImageFolder``,
            ``TarShards``).
        batch_size: samples per batch.
        shuffle: visit samples in a seeded random order, new for every epoch. "stratified":
            also hold every class in every batch (and every rank's batch) within one sample of
            its share of the dataset; needs labels (below).
        seed: the seed of the order (and of per-sample randomness).
        drop_last: drop the final partial batch (and, across ranks, the uneven tail).
        num_workers: worker threads; 0 produces batches on the calling thread.
        prefetch_factor: batches in flight per worker.
        pin_memory: page-locked batch buffers; "auto" pins when a CUDA device is present.
        memory_budget: bytes (or a size like "2GiB") that batch buffers may use together;
            None means half of physical memory.
        rank, world_size: this process's share of each epoch; default to the RANK and WORLD_SIZE
            environment variables (torchrun), else 0 and 1.
        output: "torch" (tensors; NumPy arrays when torch is not installed) or "numpy".
        on_error: "raise" (default) or "skip" (replace a failed sample deterministically, count
            it in ``stats()``).
        cpu_budget: cores the online autotune may give to workers when num_workers is "auto"
            (None: usable cores). With num_workers and/or prefetch_factor "auto", a controller
            starts at one active worker and sets both while the loader runs; its decisions are
            in ``stats()["autotune"]`` and logged to the "stoker.autotune" logger.
        device: None or "cpu" (CPU batches), or "cuda", "cuda:N", a torch.device: batches are
            copied to that GPU ahead of the consumer, on a copy stream, and yielded there (see
            stoker/device.py for the stream contract). Raises RuntimeError without CUDA.
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
    """

    # A stratified order's classes (_native.engine.ClassGroups) and weights ([] for the dataset's shares);
    # class attributes, so that every loader has them.
    _classes = None
    _weights = ()
    class_weights = None

    def __class_getitem__(cls, item):  # DataLoader[T] in annotations, as torch's is generic
        return cls

    def __new__(cls, dataset=None, *args, **kwargs):
        if cls is DataLoader and kwargs.get("offload") is not None:
            from .offload import OffloadLoader  # batches from Ray actors
            return super().__new__(OffloadLoader)
        if cls is DataLoader and dataset is not None and not _is_native(dataset):
            from .python_datasets import PythonLoader  # imports torch: only when needed
            return super().__new__(PythonLoader)
        return super().__new__(cls)

    def __init__(self, dataset, batch_size=1, shuffle=False, seed=0, drop_last=False,
                 num_workers="auto", prefetch_factor="auto", pin_memory="auto",
                 memory_budget=None, rank=None, world_size=None, output="torch",
                 on_error="raise", cpu_budget=None, device=None, gpu_prefetch="auto",
                 gpu_prefetch_bytes=None, class_weights=None, labels=None, offload=None,
                 **python_options):
        source = getattr(dataset, "_source", None)
        if source is None and getattr(dataset, "_unbatchable", None):
            raise ValueError(dataset._unbatchable)  # e.g. an ImageFolder without a transform
        if not isinstance(source, _native.sources.Source):
            raise TypeError(
                f"stoker.DataLoader needs a dataset: a Stoker dataset (ArrayDataset, "
                f"TokenDataset, ImageFolder, TarShards), or a Python one with __getitem__, "
                f"got {type(dataset).__name__}")
        for key, value in python_options.items():
            if key not in _PY_DEFAULTS:
                raise TypeError(f"DataLoader() got an unexpected keyword argument {key!r}")
            if value is not _PY_DEFAULTS[key] and value != _PY_DEFAULTS[key]:
                raise ValueError(f"{key} is for Python datasets; native datasets order, batch "
                                 f"and seed samples in the engine")
        if not _is_int(batch_size) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        stratified = balance.check_shuffle(shuffle, class_weights)
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last must be True or False, got {drop_last!r}")
        if not _is_int(seed) or not 0 <= seed < 2**64:
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        workers = _knob("num_workers", num_workers, 0, _MAX_WORKERS)
        prefetch = _knob("prefetch_factor", prefetch_factor, 1, _MAX_PREFETCH)
        pin = {"auto": "auto", True: "on", False: "off"}.get(pin_memory) \
            if isinstance(pin_memory, (bool, str)) else None
        if pin is None:
            raise ValueError(f'pin_memory must be "auto", True or False, got {pin_memory!r}')
        if pin == "on" and not _native.gpu.cuda_available():
            warnings.warn("pin_memory=True but no CUDA device was found; using pageable memory",
                          stacklevel=2)
            pin = "off"
        budget = _parse_bytes(memory_budget)
        rank, world_size = _ranks(rank, world_size)
        if output not in ("torch", "numpy"):
            raise ValueError(f'output must be "torch" or "numpy", got {output!r}')
        if on_error not in ("raise", "skip"):
            raise ValueError(f'on_error must be "raise" or "skip", got {on_error!r}')
        self._device, self._gpu_prefetch, self._gpu_cap = _feed_options(
            device, output, gpu_prefetch, gpu_prefetch_bytes)
        # A dataset that decodes on the GPU (decode="cuda") brings its own copy engine.
        self._engine_factory = getattr(dataset, "_device_engine", None)
        if self._engine_factory is not None and self._device is None:
            raise ValueError(f"{type(dataset).__name__}(decode=\"cuda\") decodes into GPU "
                             f"batches: pass device=\"cuda\" to the DataLoader")
        if self._device is not None and _native.gpu.cuda_available():
            _native.gpu.cuda_set_host_device(self._device.index)  # pin with the device's own context
        self._engine = None  # the copy engine (one copy stream), made at the first iteration
        self._gpu_stats = {}

        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.on_error = on_error
        self.output = output
        self._torch = output == "torch" and _torch_available()
        self.class_weights = class_weights
        self._classes = balance.class_groups(dataset, labels) if stratified else None
        self._weights = balance.weights_for(self._classes, class_weights) if stratified else []
        self._loader = _native.engine.Loader(source, batch_size, shuffle is not False, seed, drop_last,
                                      workers, prefetch, pin, budget, rank, world_size, on_error,
                                      cpu_budget=0 if cpu_budget is None else
                                      _knob("cpu_budget", cpu_budget, 1, _MAX_WORKERS),
                                      classes=self._classes, class_weights=self._weights)
        if self._loader.pinned:
            _device.install_fence_provider()
        self._single = len(source.field_names) == 1
        self._next_epoch = 0
        self._start_batch = 0
        self._next_start = 0  # global position the next epoch's plan starts at (elastic resume)
        # _state.Cursor of the latest iteration; shared with its iterator, so the loader holds
        # no reference to the iterator (dropping it stops its threads).
        self._cursor = None

    # The knobs as resolved: "auto" replaced by the value in use.
    @property
    def num_workers(self):
        return self._loader.num_workers

    @property
    def prefetch_factor(self):
        return self._loader.prefetch_factor

    @property
    def pin_memory(self):
        return self._loader.pinned

    @property
    def memory_budget(self):
        return self._loader.memory_budget

    def __len__(self):
        return len(self._loader)

    def set_epoch(self, epoch):
        """Makes the next iteration run epoch ``epoch`` from its start; right after
        ``load_state_dict`` positioned the loader inside epoch ``epoch``, keeps that position
        (so a torch-style loop that calls set_epoch every epoch resumes where it stopped)."""
        if not _is_int(epoch) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        if getattr(self, "_resumed", False) and epoch == self._next_epoch:
            return
        self._resumed = False
        self._next_epoch = epoch
        self._start_batch = 0
        self._next_start = 0

    def __iter__(self):
        start = self._next_start
        plan = _state.plan(self, start) if start else None
        native = self._loader.iterate(self._next_epoch, self._start_batch, plan)
        cursor = _state.begin(self)
        batches = _Iterator(self, native, cursor)
        if self._device is None:
            return batches
        if self._engine is None:
            self._engine = (self._engine_factory(self._device, self.on_error)
                            if self._engine_factory is not None
                            else _device.CudaCopyEngine(self._device))
        return _device.DeviceFeed(batches, self._device, self._gpu_prefetch, self._gpu_cap,
                                  engine=self._engine, cursor=cursor, stats=self._gpu_stats)
    def state_dict(self):
        """Where the next batch comes from, as a small JSON-serializable dict: the epoch, the
        batches each rank delivered and the global position the epoch's plan started at, with
        the settings that must match to resume (O(1): no list of samples)."""
        return _state.save(self)

    def load_state_dict(self, state):
        """Makes the next iteration resume exactly where ``state`` was taken, whatever the
        num_workers and prefetch_factor of this loader. With the world size that saved it, the
        same batches follow; with another world size (elastic resume; rank is free too), the
        samples the saving job's ranks had delivered together are not repeated and the rest of
        the epoch is split among this job's ranks with equal batch counts (padding, with
        drop_last=False, repeats fewer samples than there are ranks). Raises ValueError where
        that cannot hold: another seed, shuffle, batch_size, drop_last or dataset length, or,
        across world sizes, samples ordered by a custom sampler or an IterableDataset."""
        resume = _state.load(self, state)
        self._cursor = None
        self._next_epoch, self._start_batch, self._next_start = resume
        self._resumed = True

    def class_plan(self):
        """For a stratified or weighted loader, one dict a class: ``label``, ``samples``,
        ``draws_per_epoch`` (over all ranks; the same every epoch) and ``per_batch`` (its
        expected count in a full batch; every batch holds it rounded down or up)."""
        if self._classes is None:
            raise ValueError('class_plan() is for a loader with shuffle="stratified" or '
                             'class_weights')
        plan = _native.engine.StratifiedPlan(self._classes, self._weights, self.seed, self.batch_size,
                                      self.drop_last, self.rank, self.world_size)
        return balance.class_plan(self._classes, self._weights, plan.class_draws,
                                  self.batch_size)

    def stats(self):
        """Counters since the loader was made: batches, samples, skipped samples, seconds spent
        reading, waiting for buffers and waiting as the consumer, buffer memory and its peak."""
        s = self._loader.stats()
        s.update(num_workers=self.num_workers, prefetch_factor=self.prefetch_factor,
                 pin_memory=self.pin_memory, device=str(self._device or "cpu"))
        s.update(self._gpu_stats)
        if self._engine is not None and hasattr(self._engine, "stats"):
            from .gpu_decode import merge_stats
            merge_stats(s, self._engine.stats())
        return s


class _Iterator:
    __slots__ = ("_native", "_cursor", "_torch", "_single")

    def __init__(self, loader, native, cursor):
        self._native = native
        self._cursor = cursor
        self._torch = loader._torch
        self._single = loader._single

    def __iter__(self):
        return self

    def __len__(self):
        return self._cursor.num_batches - self._cursor[1]

    def __next__(self):
        if self._native is None:
            raise StopIteration
        try:
            try:
                fields = self._native.next(self._torch)
            except MemoryBudgetError:
                # Batches the consumer dropped may still sit in reference cycles: collect, retry.
                gc.collect()
                fields = self._native.next(self._torch)
        except StopIteration:
            self._native = None  # joins the worker threads now, not at garbage collection
            raise
        finally:
            if self._native is not None:
                self._cursor[1] = self._native.position  # a failed batch counts as consumed
        return fields[0] if self._single else fields

