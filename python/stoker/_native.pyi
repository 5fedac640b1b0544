# Type stubs of stoker._native, generated from the extension by nanobind's stubgen:
#   .venv/bin/python -m nanobind.stubgen -m stoker._native -o python/stoker/_native.pyi
# (then this header put back). Regenerate after changing a binding.
"""Stoker's native engine"""

from collections.abc import Mapping, Sequence, Set
from typing import Annotated, overload

import numpy
from numpy.typing import NDArray


class Source:
    def __len__(self) -> int: ...

    @property
    def field_names(self) -> list[str]: ...

    def labels(self) -> object:
        """
        Every sample's class label when the source knows them without reading (an int64 array), else None.
        """

class ArraySource(Source):
    def __init__(self, arrays: Sequence[Annotated[NDArray, dict(device='cpu', writable=False)]], names: Sequence[str], guards: Sequence[object] = []) -> None: ...

class TokenSource(Source):
    def __init__(self, path: str, dtype: str, seq_len: int) -> None: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def data_offset(self) -> int: ...

    @property
    def format(self) -> str: ...

class NpyFile:
    """
    A .npy file mapped read-only (Stoker's own header parser). Pass it as an ArraySource guard so that reads survive the file being truncated.
    """

    def __init__(self, path: str) -> None: ...

    @property
    def path(self) -> str: ...

    @property
    def array(self) -> object:
        """
        The file's array: read-only, over the mapping (reading it from Python is not guarded).
        """

class FileMapping:
    """
    A whole file mapped read-only by Stoker. Arrays rebuilt over its bytes (a file NumPy mapped, mapped again) pass it as their ArraySource guard, so that reads survive the file being truncated.
    """

    def __init__(self, path: str) -> None: ...

    @property
    def path(self) -> str: ...

    @property
    def bytes(self) -> object:
        """
        The file's bytes as mapped: a read-only uint8 array (reading it from Python is not guarded).
        """

class FaultySource(Source):
    def __init__(self, size: int, width: int = 1, fail: Set[int] = ..., delay_us: int = 0) -> None: ...

class EpochIterator:
    def next(self, torch: bool) -> tuple:
        """The next batch as a tuple of arrays; StopIteration at the end."""

    @property
    def position(self) -> int: ...

    @property
    def epoch(self) -> int: ...

class Loader:
    def __init__(self, source: Source, batch_size: int, shuffle: bool, seed: int, drop_last: bool, num_workers: int, prefetch_factor: int, pin_memory: str, memory_budget: int, rank: int, world_size: int, on_error: str, cpu_budget: int = 0, classes: ClassGroups | None = None, class_weights: Sequence[float] = []) -> None: ...

    def __len__(self) -> int: ...

    @property
    def samples_per_rank(self) -> int: ...

    @property
    def num_workers(self) -> int: ...

    @property
    def prefetch_factor(self) -> int: ...

    @property
    def memory_budget(self) -> int: ...

    @property
    def pinned(self) -> bool: ...

    def iterate(self, epoch: int, start_batch: int = 0, plan: BatchPlan | None = None) -> EpochIterator:
        """
        The batches of `epoch` from `start_batch` on, following `plan` (a _native.BatchPlan: an elastic start, a strided view) or the loader's own.
        """

    def stats(self) -> dict: ...

    def epoch_indices(self, epoch: int) -> Annotated[NDArray[numpy.uint64], dict(shape=(None,))]:
        """The samples the epoch reads, batch after batch, as a uint64 array."""

def cuda_available() -> bool:
    """True when a CUDA driver and device are present."""

def usable_cores() -> int:
    """Cores this process may run on."""

def physical_memory_bytes() -> int: ...

class ImageFiles:
    def __len__(self) -> int: ...

    def label(self, index: int) -> int: ...

    def path(self, index: int) -> str: ...

    @property
    def labels(self) -> list[int]: ...

    def read(self, index: int) -> bytes:
        """The file bytes of sample `index`."""

class ImageFolderFiles(ImageFiles):
    def __init__(self, samples: Sequence[tuple[str, int]]) -> None: ...

class TarShardFiles(ImageFiles):
    def __init__(self, paths: Sequence[str]) -> None: ...

    @property
    def num_shards(self) -> int: ...

class ImageSource(Source):
    def __init__(self, files: ImageFiles, pipeline: list, max_pixels: int) -> None: ...

    @property
    def image_shape(self) -> list[int]: ...

    @property
    def image_dtype(self) -> str: ...

    def sample(self, index: int, seed: int, epoch: int) -> list:
        """Raw bytes of each field of one sample (image, label)."""

class ChannelStatsSource(Source):
    def __init__(self, files: ImageFiles, max_pixels: int) -> None: ...

def check_pipeline(pipeline: list) -> tuple[list[int], str]:
    """(output shape, dtype name); ValueError when the pipeline is invalid."""

@overload
def decode_file(path: str, max_pixels: int = 89478485) -> NDArray[numpy.uint8]: ...

@overload
def decode_file(data: bytes, max_pixels: int = 89478485) -> NDArray[numpy.uint8]:
    """Decodes a whole image to an HWC uint8 RGB array."""

def random_resized_crop_box(height: int, width: int, size: tuple[int, int], scale: tuple[float, float], ratio: tuple[float, float], seed: int, epoch: int, index: int) -> tuple[int, int, int, int]:
    """
    (top, left, height, width) that RandomResizedCrop draws for sample `index` of `epoch` when it is the pipeline's first random transform.
    """

def decode_only(paths: Sequence[str], threads: int, min_seconds: float) -> dict:
    """
    Decode-only throughput bound: every file in memory, full-size decodes on `threads` threads for at least min_seconds.
    """

class ExecutorPolicy:
    """
    num_workers="auto" for a Python dataset: stay, or start worker processes or threads, from measured timings (include/stoker/executor_policy.h). Decisions are (kind, workers, reason) tuples.
    """

    def __init__(self, cores: int, forked: bool = True, persistent: bool = False, threads_allowed: bool = False) -> None: ...

    @property
    def cores(self) -> int: ...

    @property
    def pace(self) -> float: ...

    @property
    def start_s(self) -> float: ...

    @property
    def persistent(self) -> bool: ...

    @property
    def threads_allowed(self) -> bool: ...

    def wants_thread_trial(self) -> bool: ...

    def first_chunks(self, seconds_per_sample: float, rest_of_batch: float) -> tuple: ...

    def thread_trial(self, one_thread_s: float, two_threads_s: float) -> tuple: ...

    def after_batch(self, seconds_per_sample: float, samples_left: float) -> tuple: ...

    @staticmethod
    def stay() -> tuple: ...

    FORK_NOW_S: float = 0.02

    FORK_EPOCH_S: float = 0.5

    FORK_PERSISTENT_S: float = 0.1

    SPAWN_START_S: float = 2.0

    THREAD_GAIN: float = 0.75

def tune_loader(source: Source, knobs: list, base: dict, options: dict, min_seconds: float, progress: object | None = None) -> dict:
    """Tunes Stoker's loader over `source`; measurements run natively."""

def tune_callback(knobs: list, measure: object, memory: object | None = None, options: dict, progress: object | None = None) -> dict:
    """
    Tunes with a Python measurement callback: measure(config) -> samples/s.
    """

def estimate_loader_memory(config: Mapping[str, int], sample_bytes: int, batch_size: int) -> int: ...

def read_system() -> dict: ...

def diagnose(figures: dict) -> dict:
    """The verdict for the figures of a run (see stoker/diagnosis.h)."""

class BatchPlan:
    def __init__(self, n: int, batch_size: int, drop_last: bool, rank: int, world_size: int, start: int = 0) -> None:
        """
        A rank's batches of an epoch of n samples, from global position `start` on.
        """

    @property
    def num_samples(self) -> int: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def start(self) -> int: ...

    @property
    def num_batches(self) -> int: ...

    @property
    def samples_per_rank(self) -> int: ...

    def __len__(self) -> int: ...

    def batch_length(self, batch: int) -> int: ...

    def position_after(self, batches: int) -> int:
        """
        The global position the job reached once each of its ranks delivered `batches` batches of this plan (num_samples when that finishes it).
        """

    def strided(self, first: int, step: int) -> BatchPlan:
        """The view whose batch j is this plan's batch first + j * step."""

    def indices(self, shuffle: bool, seed: int, epoch: int, batch: int) -> list[int]:
        """The sample indices of batch `batch` of the plan in `epoch`."""

def plan_num_batches(n: int, batch_size: int, drop_last: bool, rank: int, world_size: int, start: int = 0) -> int: ...

def batch_indices(n: int, batch_size: int, shuffle: bool, seed: int, epoch: int, drop_last: bool, rank: int, world_size: int, batch: int, start: int = 0) -> list[int]:
    """
    The sample indices of batch `batch` of an epoch, exactly as the native loader visits them (from global position `start` on, for an elastic resume).
    """

MAX_WORKERS: int = 256

MAX_PREFETCH_FACTOR: int = 64

DEFAULT_PREFETCH_FACTOR: int = 2

SMALL_BATCH_BYTES: int = 4194304

DEFAULT_MAX_PIXELS: int = 89478485

LEAF_ALIGNMENT: int = 64

SKIPPED_LISTED: int = 1000

TREE_TAGS: dict = ...

def gather_columns(structure: object, samples: object, array_types: object, object_types: object, np_dtypes: object) -> object:
    """
    (array columns, object columns) of a batch whose samples all have `structure` (batch_structure.flatten's tree of sample 0) with leaves of the same types, else None (src/python/column_gatherer.h).
    """

class SharedArena:
    """Shared memory for batches: one memfd (include/stoker/shared_arena.h)."""

    @staticmethod
    def attach(fd: int) -> SharedArena:
        """
        Maps the arena of another process's memfd `fd` (this arena owns and closes it).
        """

    @property
    def fd(self) -> int: ...

    @property
    def size(self) -> int: ...

    def array(self, torch: bool) -> object:
        """The whole arena as one writable uint8 tensor (or NumPy array)."""

    def drop_pages(self, offset: int, bytes: int) -> None:
        """
        Drops this process's mapping of the whole pages in [offset, offset + bytes).
        """

class Lease:
    @property
    def offset(self) -> int: ...

class SharedPool:
    """Batch buffers carved from a SharedArena (src/python/shared_pool.h)."""

    def __init__(self, buffer_bytes: int, budget_bytes: int, pinned: bool = False) -> None: ...

    def acquire(self, timeout_ms: int) -> Lease:
        """A free buffer, or None after timeout_ms milliseconds."""

    def view(self, lease: Lease, regions: Sequence[tuple[int, int]], torch: bool) -> list:
        """
        uint8 arrays over (offset, nbytes) regions of the lease's buffer, without a copy; the buffer returns to the pool when the last of them (and the lease) dies.
        """

    @property
    def arena(self) -> SharedArena: ...

    @property
    def buffer_bytes(self) -> int: ...

    @property
    def capacity(self) -> int: ...

    @property
    def bytes_allocated(self) -> int: ...

    @property
    def peak_bytes_allocated(self) -> int: ...

    @property
    def pinned(self) -> bool: ...

    @property
    def pinned_bytes(self) -> int: ...

    @property
    def fenced_buffers(self) -> int: ...

def hash_key(a: int, b: int, c: int) -> int:
    """
    random.h's hash_key(a, b, c): 64 bits (on_error="skip" draws replacements with it).
    """

def sample_key(seed: int, epoch: int, index: int) -> int:
    """
    The 63-bit key of sample `index` of `epoch` (what torch.initial_seed() reports in it).
    """

def position_key(seed: int, epoch: int, batch: int, row: int) -> int:
    """The key of a sample fetched by a non-integer index, from its place."""

SEED_MASK: int = 9223372036854775807

def mt19937_state(key: int, generator: str) -> list[int]:
    """
    The 624-word MT19937 state a sample key gives `generator` ("random", "numpy" or "torch").
    """

class GlobalSeeder:
    """
    Writes the global generators' states in place (src/python/global_seeder.h); made by rng_fields.py only.
    """

    def __init__(self, py_index: int, py_state: int, py_dict: dict, np_key: int, np_pos: int, np_has_gauss: int, np_gauss: int, torch_mt: int, torch_float_engaged: int, torch_double_engaged: int) -> None: ...

    def seed(self, key: int, generators: Sequence[str]) -> None:
        """Seeds the named generators for the sample of `key`."""

    def save(self) -> object: ...

    def restore(self, saved: object) -> None: ...

class SampleFetcher:
    """
    Runs __getitem__ for chunks of samples, each seeded (src/python/sample_fetcher.h).
    """

    def __init__(self, seed: int, seeding: str, seeder: GlobalSeeder | None, slow_seed: object | None, leave_alone: Sequence[bool], skip: bool = False, size: int = 0) -> None: ...

    def fetch(self, dataset: object, epoch: int, indices: object, batch: int = 0, first_row: int = 0, cycles: Sequence[int] | None = None) -> object:
        """
        [dataset[i] for i in indices], each with the global generators seeded for its sample: `indices` are the rows from `first_row` on of batch `batch`; `cycles` (one a sample) key the draws of a stratified order instead of the epoch.
        """

    def take_skipped(self) -> object: ...

    @property
    def modes(self) -> list[str]: ...

def set_fence_provider(provider: object | None, pageable: bool = False) -> None:
    """
    Registers provider(devices) -> [(device, stream handle) | FakeCopy, ...], called (with the GIL) when the last array of a pinned batch dies: a fence is recorded for each item, and the buffer is reused only once all have completed. pageable=True (tests) fences pageable batches too. None unregisters.
    """

class FakeCopy:
    """
    A fence for tests that completes when complete() is called; given addresses, complete() first copies nbytes from src to dst (a fake DMA).
    """

    def __init__(self, src: int = 0, dst: int = 0, nbytes: int = 0) -> None: ...

    def complete(self) -> None: ...

    @property
    def completed(self) -> bool: ...

    @property
    def polls(self) -> int: ...

def cuda_device_count() -> int: ...

def cuda_set_host_device(device: int) -> None:
    """
    The device whose primary context pins host memory (a loader's device="cuda:N").
    """

def cuda_pinned_bytes() -> int:
    """Bytes this process holds page-locked through Stoker (every pool)."""

def cuda_active_devices() -> list[int]: ...

def cuda_device_memory(device: int) -> tuple:
    """(free, total) bytes of a device in use."""

class GpuSampler:
    """
    Samples a GPU's utilization and memory through NVML on a thread until stop(), which returns the figures.
    """

    def __init__(self, cuda_device: int, period_ms: int = 100) -> None: ...

    def stop(self) -> dict: ...

class ClassGroups:
    def __init__(self, labels: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> None:
        """The samples grouped by their labels (an int64 array)."""

    def __len__(self) -> int: ...

    @property
    def num_classes(self) -> int: ...

    @property
    def labels(self) -> list[int]: ...

    @property
    def counts(self) -> list[int]: ...

    @property
    def memory_bytes(self) -> int: ...

class StratifiedPlan:
    def __init__(self, classes: ClassGroups, class_weights: Sequence[float], seed: int, batch_size: int, drop_last: bool, rank: int, world_size: int) -> None: ...

    def __len__(self) -> int: ...

    def batch_length(self, arg: int, /) -> int: ...

    @property
    def class_draws(self) -> list[int]: ...

    def batch_indices(self, epoch: int, batch: int) -> list[int]:
        """
        The sample indices of batch `batch` of an epoch, as the native loader visits them.
        """

    def batch_draws(self, epoch: int, batch: int) -> tuple[list[int], list[int]]:
        """
        (indices, cycles) of batch `batch`: a draw's randomness is keyed by (seed, cycle, index), as the native loader keys it (the cycle is the epoch without class weights; the repeats of an oversampled sample have different cycles).
        """

DEFAULT_DECODE_BUFFER_BYTES: int = 536870912

class GpuDecodeSource(Source):
    def __init__(self, files: ImageFiles, pipeline: list, max_pixels: int, file_bytes: int, decode_buffer_bytes: int) -> None: ...

    @property
    def output_shape(self) -> list[int]: ...

    @property
    def output_dtype(self) -> str: ...

    @property
    def payload_bytes(self) -> int: ...

    @property
    def decode_buffer_bytes(self) -> int: ...

class GpuBatchDecoder:
    """The GPU stage of decode="cuda": one call per staged batch."""

    def __init__(self, source: GpuDecodeSource, device: int, on_error: str, library_dirs: Sequence[str], emulate: bool = False, reject: Sequence[int] = []) -> None:
        """
        emulate=True runs the stage on the CPU (tests): images/labels are host addresses.
        """

    def decode(self, payload: Annotated[NDArray, dict(order='C', device='cpu')], labels: Annotated[NDArray, dict(order='C', device='cpu')], records: Annotated[NDArray, dict(order='C', device='cpu')], images: int, out_labels: int, stream: int) -> None:
        """
        Queues the batch's decode on `stream` into the device addresses images/out_labels.
        """

    def stats(self) -> dict: ...

def gpu_decode_libraries(library_dirs: Sequence[str]) -> tuple[str, str]:
    """
    (libnvjpeg path, libnvrtc path); RuntimeError saying what is missing and what was tried.
    """

def classify_jpeg(data: bytes) -> str:
    """Where GPU decode sends this file: "gpu", or why not."""
