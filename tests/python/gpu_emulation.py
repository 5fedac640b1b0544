"""The decode="cuda" path with its GPU stage emulated on the CPU, for tests and
``bench/bench_gpu_decode.py --cpu-smoke`` (never part of the package): the same staging, the same
stage logic, the kernels' own code over host memory, libjpeg for nvJPEG. Its native half is
``_native.testing.emulated_gpu_decoder`` (built only with STOKER_TESTING=ON)."""

from stoker import DataLoader
from stoker.gpu import decode as gpu_decode
from stoker.gpu.decode import _torch_dtype, merge_stats
from stoker.gpu.feed import DeviceFeed
from stoker import _native
from stoker.sources.base import StokerDataset


class emulation:
    """Within the block, decode="cuda" datasets can be made without a GPU (the dataset's check
    for CUDA, nvJPEG and NVRTC is skipped); they can then be read through emulated_loader() (a
    DataLoader(device="cuda") still needs CUDA)."""

    def __enter__(self):
        self._check = gpu_decode.require_gpu_decode
        gpu_decode.require_gpu_decode = lambda: None
        return self

    def __exit__(self, *exc):
        gpu_decode.require_gpu_decode = self._check
        return False


class CpuCopyStage:
    """The copy-stage protocol (gpu/feed.py's CopyStage) with the "device" being the CPU: copies
    are clones. For the device paths' logic (batch transforms on the device, the output
    conversion) without a GPU."""

    fences = ()

    def default_cap(self):
        return 1 << 40

    def copy(self, batch):
        out = tuple(t.clone() for t in batch)
        return out, None, sum(t.numel() * t.element_size() for t in out), []

    def hand_over(self, gpu, event):
        pass

    def add_stats(self, stats):
        pass


class EmulatedDecodeStage:
    """The same copy-stage protocol with the GPU stage emulated on the CPU (its kernels' own code
    over host memory, libjpeg for nvJPEG): for tests and ``bench_gpu_decode.py --cpu-smoke``.
    Batches are CPU tensors. ``reject``: sample indices whose "GPU" decode fails."""

    fences = ()

    def __init__(self, source, on_error, reject=()):
        import torch
        self.torch = torch
        self.shape = tuple(source.output_shape)
        self.dtype = _torch_dtype(torch, source.output_dtype)
        self.decoder = _native.testing.emulated_gpu_decoder(source, skip=on_error == "skip",
                                                            reject=list(reject))

    def default_cap(self):
        return 1 << 40

    def copy(self, batch):
        torch = self.torch
        payload, labels, records = batch
        n = labels.shape[0]
        images = torch.empty((n, *self.shape), dtype=self.dtype)
        out_labels = torch.empty((n,), dtype=torch.int64)
        self.decoder.decode(payload, labels, records, images.data_ptr(), out_labels.data_ptr(), 0)
        return (images, out_labels), None, images.numel() * images.element_size() + n * 8, []

    def hand_over(self, gpu, event):
        pass

    def add_stats(self, stats):
        pass

    def stats(self):
        return {"gpu_decode": self.decoder.stats(), "gpu_batches_ahead_bytes": 0}

    def add_stats(self, stats):
        pass


class _Staged(StokerDataset):
    """A decode="cuda" dataset seen as its staging source (raw staged batches)."""

    def __init__(self, dataset):
        self._source = dataset._source

    def __len__(self):
        return len(self._source)


def emulated_loader(dataset, reject=(), **loader_kwargs):
    """Test/smoke helper: iterating the result runs the decode="cuda" path with the GPU stage
    emulated on the CPU (same staging, same stage logic, the kernels' code on the host). Takes
    DataLoader keyword arguments (no device); yields (images, labels) CPU tensors."""
    if getattr(dataset, "decode", "cpu") != "cuda":
        raise ValueError('emulated_loader needs a dataset made with decode="cuda"')
    loader = DataLoader(_Staged(dataset), **loader_kwargs)
    stage = EmulatedDecodeStage(dataset._source, loader.on_error, reject)

    class _Emulated:
        def __iter__(self):
            return DeviceFeed(iter(loader), None, stage=stage, cursor=None)

        def __len__(self):
            return len(loader)

        def stats(self):
            s = loader.stats()
            merge_stats(s, stage.stats())
            return s

    return _Emulated()
