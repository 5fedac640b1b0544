"""Batches on the GPU: ``stoker.DataLoader(..., device="cuda")``, and the pinned-buffer fences
that make ``x.to("cuda", non_blocking=True)`` safe on Stoker's batches.

The copy stage (:class:`DeviceFeed`) wraps any iterator of CPU batches (tensors, or tuples,
lists, dicts and namedtuples of them; other leaves pass through). For each batch, on a copy stream
of its own, it queues the host-to-device copies and records an event, then drops the CPU batch:
its pinned buffer goes back to Stoker's pool fenced on the copy stream, so no worker writes the
next batch into it before the copy has read it. It keeps ``gpu_prefetch`` batches copied ahead
of the consumer (at most ``gpu_prefetch_bytes`` of GPU memory). When it hands a batch over, the
consumer's current stream waits on the copy's event (``Stream.wait_event``: the host never
blocks) and every tensor is marked used by that stream (``Tensor.record_stream``), so torch's
caching allocator does not give the memory to a later copy while the consumer's kernels may still
read it.

Contract for yielded tensors: they are ready on the stream that was current when ``next()``
returned them, exactly as if a kernel on that stream had produced them. To use one on another
stream ``s``, do what any torch tensor needs: ``s.wait_stream(torch.cuda.current_stream())`` and
``x.record_stream(s)``.

Fences (``install_fence_provider``). When the last tensor of a pinned Stoker batch dies, the
C++ engine asks :func:`_fence_streams` which CUDA streams may still read the buffer, records a
CUDA event on each, and reuses the buffer only once they have completed (``cuEventQuery``, no
synchronize). The streams are, unless the copy stage names its own copy stream for the batch it
drops: the current stream of every device this process uses (``x.to("cuda",
non_blocking=True)`` queues the copy on the destination device's current stream), and the copy
stream of every live ``DeviceFeed``. A copy queued on some other stream that is not current when
the tensor dies (``with torch.cuda.stream(s): y = x.to(...)``, then ``del x`` outside the block)
is not covered: drop the CPU tensor inside the block, or ``s.synchronize()`` first.
"""

from __future__ import annotations

import atexit
import collections
import re
import sys
import threading
import weakref

from .. import _native
from .._checks import is_int
from .._tree import tree_map

__all__ = ["DeviceFeed", "CopyStage", "resolve_device", "install_fence_provider", "fenced_on"]

MAX_GPU_PREFETCH = 64
AUTO_GPU_PREFETCH = 2  # double buffering: one batch copying while the consumer uses another
AUTO_CAP_FRACTION = 10  # default gpu_prefetch_bytes: a tenth of the device's memory

# ---- fences --------------------------------------------------------------------------------------

_local = threading.local()
_copy_streams = {}  # id(stage) -> (device index, raw stream handle) of every live CopyStage
_copy_streams_lock = threading.Lock()
_installed = False


def _current_raw_stream(torch, device):
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return get(device) if get is not None else torch.cuda.current_stream(device).cuda_stream


def _fence_streams(devices):
    """The fence provider of the C++ engine's batch pools: (device, stream handle) pairs whose
    queued work must finish before a pinned buffer whose last tensor just died may be rewritten.
    ``devices``: the CUDA devices whose primary context is active in this process."""
    override = getattr(_local, "items", None)
    if override is not None:
        return override
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():  # also False in a forked child
        return ()
    # An event recorded on a stream being captured into a CUDA graph would belong to the graph.
    capturing = torch.cuda.current_device() if torch.cuda.is_current_stream_capturing() else -1
    out = [(d, _current_raw_stream(torch, d)) for d in devices if d != capturing]
    with _copy_streams_lock:
        out.extend(_copy_streams.values())
    return out


def install_fence_provider():
    """Makes pinned Stoker batches fence their buffers when their last tensor dies (idempotent).
    A loader with pinned buffers calls it; so must any other front that exports pinned buffers."""
    global _installed
    if not _installed:
        _native.gpu.set_fence_provider(_fence_streams)
        # Let go of it before the interpreter tears modules down.
        atexit.register(_native.gpu.set_fence_provider, None)
        _installed = True


class fenced_on:
    """Within the block, a pinned batch whose last tensor dies is fenced on exactly ``items``
    ((device, stream handle) pairs, or ``_native.testing.FakeCopy`` objects in tests) instead of
    the default streams: the copy stage drops a CPU batch inside it, naming its copy stream."""

    def __init__(self, items):
        self.items = list(items)

    def __enter__(self):
        self.previous = getattr(_local, "items", None)
        _local.items = self.items
        return self

    def __exit__(self, *exc):
        _local.items = self.previous
        return False


# ---- device argument -----------------------------------------------------------------------------

def resolve_device(device):
    """None for CPU batches (None, "cpu", torch.device("cpu")), else the torch.device("cuda", N)
    to copy batches to. Raises RuntimeError naming CUDA when CUDA is not available."""
    if device is None:
        return None
    is_torch_device = type(device).__name__ == "device" and type(device).__module__ == "torch"
    if not isinstance(device, str) and not is_torch_device:
        raise ValueError(f'device must be None, "cpu", "cuda", "cuda:N" or a torch.device, '
                         f"got {device!r}")
    spec = str(device)
    if spec == "cpu":
        return None
    m = re.fullmatch(r"cuda(?::(\d+))?", spec)
    if m is None:
        raise ValueError(f'device must be None, "cpu", "cuda", "cuda:N" or a torch.device, '
                         f"got {device!r}")
    try:
        import torch
    except ImportError:
        raise RuntimeError(f"device={spec!r} needs PyTorch with CUDA support; PyTorch is not "
                           f"installed") from None
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            why = f"this PyTorch build ({torch.__version__}) has no CUDA support"
        else:
            why = ("no CUDA device is visible (check the NVIDIA driver and "
                   "CUDA_VISIBLE_DEVICES)")
        raise RuntimeError(f"device={spec!r} needs CUDA, but CUDA is not available: {why}")
    count = torch.cuda.device_count()
    index = int(m.group(1)) if m.group(1) is not None else torch.cuda.current_device()
    if index >= count:
        raise ValueError(f"device={spec!r}: there is no CUDA device {index} ({count} visible)")
    return torch.device("cuda", index)


def resolve_prefetch(gpu_prefetch):
    if gpu_prefetch == "auto":
        return AUTO_GPU_PREFETCH
    if not is_int(gpu_prefetch) or \
            not 0 <= gpu_prefetch <= MAX_GPU_PREFETCH:
        raise ValueError(f'gpu_prefetch must be "auto" or an integer in [0, {MAX_GPU_PREFETCH}], '
                         f"got {gpu_prefetch!r}")
    return gpu_prefetch


# ---- the copy stage ------------------------------------------------------------------------------

class CopyStage:
    """Copies batches to one CUDA device on a stream of its own (torch.cuda).

    The copy-stage protocol, which :class:`DeviceFeed` drives (GPU decode's stage and the tests'
    fakes implement it too): ``default_cap()``, ``copy(batch) -> (GPU batch, event, bytes,
    fences)``, ``hand_over(GPU batch, event)``, ``add_stats(stats)``: its own counters into
    the loader's ``stats()`` (a plain copy has none), and ``fences``: the (device, stream) pairs
    its copies run on, which fence the CPU buffers they read (() for a stage with none)."""

    def __init__(self, device):
        import torch
        self.torch = torch
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.fences = [(device.index, self.stream.cuda_stream)]
        key = id(self)
        with _copy_streams_lock:
            _copy_streams[key] = self.fences[0]
        weakref.finalize(self, _forget_copy_stream, key)

    def add_stats(self, stats):
        pass

    def default_cap(self):
        total = self.torch.cuda.get_device_properties(self.device).total_memory
        return total // AUTO_CAP_FRACTION

    def copy(self, batch):
        """Queues the batch's copies on the copy stream: (GPU batch, event, bytes, fences)."""
        torch = self.torch
        nbytes = 0

        def move(t):
            nonlocal nbytes
            nbytes += t.numel() * t.element_size()
            return t.to(self.device, non_blocking=True)

        with torch.cuda.stream(self.stream):
            gpu = tree_map(move, batch, torch.Tensor)
            event = torch.cuda.Event()
            event.record(self.stream)
        return gpu, event, nbytes, self.fences

    def hand_over(self, gpu, event):
        """The consumer's current stream waits for the copy (on the GPU, not the host); the
        tensors are marked used by it, for the caching allocator."""
        current = self.torch.cuda.current_stream(self.device)
        current.wait_event(event)
        tree_map(lambda t: t.record_stream(current), gpu, self.torch.Tensor)


def _forget_copy_stream(key):
    with _copy_streams_lock:
        _copy_streams.pop(key, None)


class _Done:
    def __iter__(self):
        return self

    def __next__(self):
        raise StopIteration

    def __len__(self):
        return 0


_DONE = _Done()


class _Entry:
    __slots__ = ("batch", "event", "nbytes", "error", "position")

    def __init__(self, batch, event, nbytes, error, position):
        self.batch, self.event, self.nbytes, self.error, self.position = \
            batch, event, nbytes, error, position


class DeviceFeed:
    """Copies the batches of ``batches`` (an iterator of CPU batches) to a GPU ahead of the
    consumer and yields them there, in order.

    Args:
        batches: an iterator of CPU batches. Stoker's pinned batches are fenced on the copy
            stream when dropped; other pinned or pageable tensors copy as torch copies them.
        device: the torch.device("cuda", N) (see resolve_device).
        prefetch: batches copied ahead of the one the consumer holds ("auto": 2; 0 copies each
            batch when it is asked for).
        prefetch_bytes: GPU memory those batches may take together (None: a tenth of the
            device's memory); fewer are copied ahead when they would exceed it.
        stage: the copy stage (CopyStage(device) when None; tests pass a fake one).
        cursor: the loader's [epoch, batches delivered]: set to the position of each batch when
            it is yielded (not when it is pulled ahead), so state_dict() resumes after the last
            batch the consumer got.
        stats: a dict the feed adds its counters to.

    An exception raised while a batch is pulled is raised when that batch's turn comes.
    """

    def __init__(self, batches, device, prefetch="auto", prefetch_bytes=None, *, stage=None,
                 cursor=None, stats=None):
        self._source = batches
        self._stage = stage if stage is not None else CopyStage(device)
        self._depth = resolve_prefetch(prefetch)
        self._cap = prefetch_bytes if prefetch_bytes is not None else self._stage.default_cap()
        self._cursor = cursor
        self._stats = stats if stats is not None else {}
        self._queue = collections.deque()
        self._queued_bytes = 0
        self._last_bytes = 0
        self._exhausted = False
        for key in ("gpu_batches", "gpu_bytes"):
            self._stats.setdefault(key, 0)

    def __iter__(self):
        return self

    def __len__(self):
        n = len(self._source)
        return n if self._cursor is not None else n + len(self._queue)

    def __next__(self):
        if not self._queue:
            self._pull()
        if not self._queue:
            self._source = _DONE  # let the source go (a loader's iterator joins its threads)
            raise StopIteration
        entry = self._queue.popleft()
        self._queued_bytes -= entry.nbytes
        self._fill()  # copies queued now run while the consumer works on this batch
        if self._cursor is not None and entry.position is not None:
            self._cursor.batch = entry.position
        if entry.error is not None:
            raise entry.error
        self._stage.hand_over(entry.batch, entry.event)
        self._stats["gpu_batches"] += 1
        self._stats["gpu_bytes"] += entry.nbytes
        return entry.batch

    def close(self):
        """Drops the batches copied ahead and the source."""
        self._queue.clear()
        self._queued_bytes = 0
        self._exhausted = True
        self._source = _DONE

    def _fill(self):
        while (not self._exhausted and len(self._queue) < self._depth
               and self._queued_bytes + self._last_bytes <= self._cap):
            self._pull()

    def _pull(self):
        try:
            cpu = next(self._source)
        except StopIteration:
            self._exhausted = True
            return
        except Exception as e:  # raised at this batch's turn, as the loader would
            self._queue.append(_Entry(None, None, 0, e, self._position()))
            return
        position = self._position()
        try:
            gpu, event, nbytes, fences = self._stage.copy(cpu)
        except Exception as e:  # a stage that fails a batch (GPU decode): at its turn, too
            with fenced_on(self._stage.fences):
                del cpu  # work queued before the failure may still read the buffer
            self._queue.append(_Entry(None, None, 0, e, position))
            return
        with fenced_on(fences):
            del cpu  # the last reference: a pinned buffer is fenced on the copy, not reused early
        self._queue.append(_Entry(gpu, event, nbytes, None, position))
        self._queued_bytes += nbytes
        self._last_bytes = nbytes

    def _position(self):
        return self._cursor.batch if self._cursor is not None else None
