"""GPU JPEG decode: ``ImageFolder(..., decode="cuda")`` / ``TarShards`` with
``DataLoader(device="cuda")``.

The loader's worker threads read each file, parse its JPEG header and draw its augmentation with
the CPU pipeline's own code (so crops and flips are the CPU path's, sample for sample); files
nvJPEG takes are staged in the batch with their plan, the others (PNG, CMYK, progressive, damaged
headers, ...) are decoded and resampled right there by the CPU path. The copy stage then hands
each staged batch to the native GPU stage (nvJPEG's batched decode, then resample / flip /
normalize kernels compiled at run time with NVRTC), which writes the batch tensor on the GPU, on
the loader's copy stream. See docs/gpu-decode.md.

CUDA libraries are loaded at run time: the driver (libcuda.so.1), nvJPEG (libnvjpeg.so.13/12/11)
and NVRTC (libnvrtc.so.13/12/11.2), from a library already loaded by torch or torchvision, the
pip wheels' directories (nvidia/*/lib, torch/lib, torchvision.libs), ``STOKER_CUDA_LIBRARY_PATH``
(directories separated by ``:``), ``$CUDA_HOME/lib64``, then the system's search path.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import weakref

from .. import _native
from .feed import CopyStage

__all__ = ["DECODE_CHOICES", "GpuDecodeStage", "check_decode", "library_dirs",
           "require_gpu_decode", "staging_source"]

DECODE_CHOICES = ("cpu", "cuda")
DEFAULT_DECODE_BUFFER_BYTES = _native.gpu.DEFAULT_DECODE_BUFFER_BYTES  # one batch's decode work
_MIN_FILE_BYTES = 64 << 10
_MAX_FILE_BYTES = 16 << 20
_SIZE_SAMPLES = 512

_DTYPES = {"uint8": "uint8", "float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def check_decode(decode):
    if decode not in DECODE_CHOICES:
        raise ValueError(f'decode must be "cpu" or "cuda", got {decode!r}')
    return decode


def library_dirs(search_path=None):
    """Directories that may hold libnvjpeg / libnvrtc, most specific first (existing ones only).

    The pip wheels' directories come from where the packages ``nvidia`` (a namespace: every
    site-packages holding one counts), ``torch`` and ``torchvision`` are found on
    `search_path` (default: ``sys.path``, as ``import`` finds them; tests pass fake
    site-packages). docs/gpu.md lists the order and why."""
    dirs = [d for d in os.environ.get("STOKER_CUDA_LIBRARY_PATH", "").split(os.pathsep) if d]
    roots = []
    for name in ("nvidia", "torch", "torchvision"):
        try:
            spec = (importlib.util.find_spec(name) if search_path is None
                    else importlib.machinery.PathFinder.find_spec(name, search_path))
        except (ImportError, ValueError):
            spec = None
        for loc in (getattr(spec, "submodule_search_locations", None) or []):
            roots.append((name, loc))
    for name, loc in roots:
        if name == "nvidia":  # CUDA 13 wheels: nvidia/cu13/lib; CUDA 12: nvidia/<lib>/lib
            for sub in ("cu13", "cu12", "nvjpeg", "cuda_nvrtc"):
                dirs.append(os.path.join(loc, sub, "lib"))
        elif name == "torch":
            dirs.append(os.path.join(loc, "lib"))
        else:  # auditwheel's directory beside the package: torchvision.libs
            dirs.append(os.path.join(os.path.dirname(loc), "torchvision.libs"))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            dirs.append(os.path.join(os.environ[var], "lib64"))
    dirs += ["/usr/local/cuda/lib64", f"/usr/local/cuda/targets/{os.uname().machine}-linux/lib"]
    seen, out = set(), []
    for d in dirs:
        if d not in seen and os.path.isdir(d):
            seen.add(d)
            out.append(d)
    return out


def require_gpu_decode():
    """Raises RuntimeError naming what decode="cuda" lacks here: CUDA (driver, device), nvJPEG or
    NVRTC. Returns (libnvjpeg path, libnvrtc path). A dataset made with decode="cuda" calls it."""
    if not _native.gpu.cuda_available():
        raise RuntimeError(
            'decode="cuda" needs CUDA and nvJPEG, but CUDA is not available: no NVIDIA driver '
            "(libcuda.so.1) or no visible GPU (check the driver and CUDA_VISIBLE_DEVICES); "
            'use decode="cpu"')
    try:
        return _native.gpu.gpu_decode_libraries(library_dirs())
    except RuntimeError as e:
        raise RuntimeError(f'decode="cuda": {e}') from None


def _file_sizes(files, paths):
    """Sizes of up to _SIZE_SAMPLES files spread over the dataset."""
    n = len(files)
    if paths is not None:
        return [os.path.getsize(paths[i]) for i in range(0, n, max(1, n // _SIZE_SAMPLES))]
    return [len(files.read(i)) for i in range(0, n, max(1, n // 128))]  # tar members: read


def payload_file_bytes(files, paths=None):
    """The largest JPEG a batch slot holds: 1.25x the 99th percentile of sampled file sizes
    (64 KiB to 16 MiB). Larger files are decoded by the CPU path (counted in stats())."""
    sizes = sorted(_file_sizes(files, paths))
    if not sizes:
        return _MIN_FILE_BYTES
    p99 = sizes[min(len(sizes) - 1, (len(sizes) * 99) // 100)]
    return int(min(_MAX_FILE_BYTES, max(_MIN_FILE_BYTES, p99 * 5 // 4)))


def staging_source(files, spec, max_pixels, paths=None):
    """The native staging source of a decode="cuda" dataset."""
    return _native.gpu.GpuDecodeSource(files, spec, max_pixels, payload_file_bytes(files, paths),
                                       DEFAULT_DECODE_BUFFER_BYTES)


def _torch_dtype(torch, name):
    return getattr(torch, _DTYPES[name])


class GpuDecodeStage(CopyStage):
    """The copy stage of a decode="cuda" loader: each staged batch is decoded on the GPU, into
    tensors allocated on the copy stream (torch's caching allocator owns them); the rest of the
    copy-stage protocol (events, hand-over, fences of the staged buffer) is CopyStage's."""

    def __init__(self, device, source, on_error):
        super().__init__(device)
        torch = self.torch
        self.shape = tuple(source.output_shape)
        self.dtype = _torch_dtype(torch, source.output_dtype)
        with torch.cuda.device(device):
            self.decoder = _native.gpu.GpuBatchDecoder(source, device.index, on_error,
                                                       library_dirs())
        self._ahead = {}  # id(images) -> (weakref, bytes): decoded, not handed over yet

    def copy(self, batch):
        torch = self.torch
        payload, labels, records = batch
        n = labels.shape[0]
        with torch.cuda.stream(self.stream):
            images = torch.empty((n, *self.shape), dtype=self.dtype, device=self.device)
            out_labels = torch.empty((n,), dtype=torch.int64, device=self.device)
            self.decoder.decode(payload, labels, records, images.data_ptr(),
                                out_labels.data_ptr(), self.stream.cuda_stream)
            event = torch.cuda.Event()
            event.record(self.stream)
        nbytes = images.numel() * images.element_size() + n * 8
        self._ahead[id(images)] = (weakref.ref(images), nbytes)
        return (images, out_labels), event, nbytes, self.fences

    def hand_over(self, gpu, event):
        self._ahead.pop(id(gpu[0]), None)
        super().hand_over(gpu, event)

    def stats(self):
        ahead = sum(n for ref, n in list(self._ahead.values()) if ref() is not None)
        return {"gpu_decode": self.decoder.stats(), "gpu_batches_ahead_bytes": ahead}

    def add_stats(self, stats):
        """Adds this stage's figures to a loader's stats() (the loader calls it)."""
        return merge_stats(stats, self.stats())


def merge_stats(stats, stage_stats):
    """Adds the GPU stage's figures to a loader's stats(): its skips count with the loader's."""
    g = stage_stats.get("gpu_decode")
    if g is None:
        return stats
    stats["gpu_decode"] = g
    stats["skipped"] = stats.get("skipped", 0) + g["skipped"]
    stats["skipped_samples"] = list(stats.get("skipped_samples", [])) + g["skipped_samples"]
    ahead = stage_stats.get("gpu_batches_ahead_bytes", 0)
    stats["gpu_memory_bytes"] = g["device_bytes"] + ahead
    return stats
