"""The GPU feed on a real GPU (skipped without CUDA): the race of pinned buffers recycled under a
queued copy, device="cuda", pinned memory bounds, fork after CUDA, NVML diagnosis, tune.

The race tests fail on a Stoker without fences: a pinned buffer whose CPU tensor was dropped
right after `x.to("cuda", non_blocking=True)` went back to the pool at once, and a worker wrote
a later batch into it while the copy still waited behind the GPU's queued work."""

import gc
import os
import time

import numpy as np
import pytest
import torch

import stoker
from stoker import _native
from stoker.gpu.feed import DeviceFeed

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and stoker.cuda_available()), reason="needs a CUDA GPU")

BATCH = 64
ROW = 32768  # float32: 128 KiB rows, 8 MiB batches
BATCHES_PER_EPOCH = 16
RACE_BATCHES = 1000


@pytest.fixture(scope="module")
def rows():
    """Row i holds the value i everywhere: every batch's content is a known function of the
    indices of its samples (128 MiB, 16 batches an epoch)."""
    n = BATCH * BATCHES_PER_EPOCH
    return stoker.ArrayDataset(np.repeat(np.arange(n, dtype=np.float32)[:, None], ROW, axis=1))


def expected_indices(epochs, seed=7):
    """[epoch][batch] -> the sample indices of that batch, on the GPU (uploaded before the timed
    loop, so that checking a batch queues no host-to-device copy)."""
    ids = stoker.DataLoader(stoker.ArrayDataset(np.arange(BATCH * BATCHES_PER_EPOCH,
                                                          dtype=np.float32)),
                            batch_size=BATCH, shuffle=True, seed=seed, num_workers=0)
    out = []
    for e in range(epochs):
        ids.set_epoch(e)
        out.append([b.cuda() for b in ids])
    return out


class BusyGpu:
    """A few large matmuls queued on the current stream before each copy: the copy then waits
    behind milliseconds of work while the host (and Stoker's workers) run ahead."""

    def __init__(self, n=4096, times=3):
        self.a = torch.randn(n, n, device="cuda")
        self.out = torch.empty_like(self.a)
        self.times = times

    def __call__(self):
        for _ in range(self.times):
            torch.mm(self.a, self.a, out=self.out)


def check_all(bad):
    torch.cuda.synchronize()
    failed = bad.nonzero().flatten().tolist()
    assert not failed, (f"{len(failed)} of {len(bad)} GPU batches hold other data than their "
                        f"samples (first: {failed[:10]}): a pinned buffer was rewritten while "
                        f"its copy was still queued")


def test_dropping_the_cpu_tensor_after_a_non_blocking_copy_is_safe(rows):
    """The loop every tutorial shows: x = x.to("cuda", non_blocking=True), the CPU tensor dies
    while its copy is queued. 1000 batches of 8 MiB, 4 workers, a busy stream."""
    epochs = -(-RACE_BATCHES // BATCHES_PER_EPOCH)
    want = expected_indices(epochs)
    loader = stoker.DataLoader(rows, batch_size=BATCH, shuffle=True, seed=7, num_workers=4,
                               pin_memory=True, memory_budget=32 * BATCH * ROW * 4)
    assert loader.pin_memory
    busy = BusyGpu()
    bad = torch.zeros(RACE_BATCHES, dtype=torch.bool, device="cuda")
    k = 0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for b, x in enumerate(loader):
            busy()
            x = x.to("cuda", non_blocking=True)  # the pinned CPU tensor dies here
            bad[k] = (x != want[epoch][b][:, None]).any()
            k += 1
            if k == RACE_BATCHES:
                break
    check_all(bad)
    s = loader.stats()
    assert s["pinned_bytes"] <= s["memory_budget"]


def test_device_cuda_delivers_every_batch_intact(rows):
    """device="cuda": copies on the loader's stream, 1000 batches, 4 workers, a busy consumer
    stream (which also checks that a batch's GPU memory is not reused by a later copy while the
    consumer's queued kernels still read it: record_stream)."""
    epochs = -(-RACE_BATCHES // BATCHES_PER_EPOCH)
    want = expected_indices(epochs)
    loader = stoker.DataLoader(rows, batch_size=BATCH, shuffle=True, seed=7, num_workers=4,
                               device="cuda", gpu_prefetch=4,
                               memory_budget=16 * BATCH * ROW * 4)
    busy = BusyGpu()
    bad = torch.zeros(RACE_BATCHES, dtype=torch.bool, device="cuda")
    k = 0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for b, x in enumerate(loader):
            assert x.is_cuda and x.shape == (BATCH, ROW)
            busy()
            bad[k] = (x != want[epoch][b][:, None]).any()
            k += 1
            if k == RACE_BATCHES:
                break
    check_all(bad)
    s = loader.stats()
    assert s["gpu_batches"] == RACE_BATCHES and s["device"] == "cuda:0"


def test_device_cuda_yields_the_cpu_loaders_batches():
    data = np.random.default_rng(0).standard_normal((300, 5)).astype(np.float32)
    labels = np.arange(300)
    kw = dict(batch_size=32, shuffle=True, seed=3, num_workers=2)
    cpu = [(x.clone(), y.clone()) for x, y in stoker.DataLoader(stoker.ArrayDataset(data, labels),
                                                                **kw)]
    gpu = list(stoker.DataLoader(stoker.ArrayDataset(data, labels), device="cuda", **kw))
    assert len(gpu) == len(cpu)
    for (gx, gy), (cx, cy) in zip(gpu, cpu):
        assert gx.device.type == gy.device.type == "cuda"
        assert torch.equal(gx.cpu(), cx) and torch.equal(gy.cpu(), cy)


def test_yielded_tensors_on_another_stream_follow_the_documented_contract(rows):
    loader = stoker.DataLoader(rows, batch_size=BATCH, num_workers=2, device="cuda")
    side = torch.cuda.Stream()
    busy = BusyGpu()
    sums = []
    for b, x in enumerate(loader):
        busy()
        side.wait_stream(torch.cuda.current_stream())
        x.record_stream(side)
        with torch.cuda.stream(side):
            sums.append(x[:, 0].sum())
    torch.cuda.synchronize()
    for b, s in enumerate(sums):
        first = b * BATCH
        assert s.item() == sum(range(first, first + BATCH))


def test_gpu_prefetch_bounds_and_state_dict(rows):
    batch_bytes = BATCH * ROW * 4
    loader = stoker.DataLoader(rows, batch_size=BATCH, num_workers=2, device="cuda",
                               gpu_prefetch=8, gpu_prefetch_bytes=batch_bytes // 2)
    it = iter(loader)
    for _ in range(3):
        next(it)
    assert len(it._queue) == 0  # one batch exceeds the cap: each is copied when asked for
    state = loader.state_dict()
    assert state["batch"] == 3
    loader = stoker.DataLoader(rows, batch_size=BATCH, num_workers=2, device="cuda",
                               gpu_prefetch=3)
    it = iter(loader)
    next(it)
    assert len(it._queue) == 3 and loader.state_dict()["batch"] == 1


def test_pinned_memory_stays_within_the_budget_and_goes_with_the_loader(rows):
    gc.collect()
    before = _native.gpu.cuda_pinned_bytes()
    batch_bytes = BATCH * ROW * 4
    loader = stoker.DataLoader(rows, batch_size=BATCH, num_workers=4, pin_memory=True,
                               memory_budget=3 * batch_bytes + 100)
    kept = []
    for x in loader:
        kept.append(x.to("cuda", non_blocking=True))
    s = loader.stats()
    assert 0 < s["pinned_bytes"] <= 3 * batch_bytes + 100
    assert _native.gpu.cuda_pinned_bytes() - before == s["pinned_bytes"]
    del loader, x
    gc.collect()
    torch.cuda.synchronize()
    assert _native.gpu.cuda_pinned_bytes() == before  # nothing kept after the loader is gone


class PidDataset(torch.utils.data.Dataset):
    """Each sample says which process made it and whether that process saw CUDA."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.tensor([i, os.getpid(), int(stoker.cuda_available())])


def test_workers_forked_after_cuda_init_do_not_touch_cuda():
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # a context exists in this process
    loader = stoker.DataLoader(PidDataset(), batch_size=8, num_workers=2,
                               worker_type="process", consumer_helps=False)
    batches = [b.clone() for b in loader]
    rows = torch.cat(batches)
    assert sorted(rows[:, 0].tolist()) == list(range(64))
    assert (rows[:, 1] != os.getpid()).all(), "samples were made in the training process"
    assert (rows[:, 2] == 0).all(), "a forked worker saw CUDA"
    # And through the copy stage, as the Python-dataset loader wraps it for device="cuda".
    feed = DeviceFeed(iter(loader), torch.device("cuda", torch.cuda.current_device()))
    on_gpu = torch.cat([b for b in feed])
    assert on_gpu.is_cuda and sorted(on_gpu[:, 0].tolist()) == list(range(64))


def test_python_dataset_batches_are_pinned_shared_buffers():
    """Process workers write into shared memory that this process registers as page-locked:
    the batches are pinned, equal to the pageable run's, and equal again on the device."""
    def run(**kw):
        loader = stoker.DataLoader(PidDataset(), batch_size=8, num_workers=2, shuffle=True,
                                   seed=3, worker_type="process", consumer_helps=False, **kw)
        return loader, list(loader)

    _, pageable = run()
    _, pinned = run(pin_memory=True)
    assert all(b.is_pinned() for b in pinned)
    assert [b[:, 0].tolist() for b in pinned] == [b[:, 0].tolist() for b in pageable]
    _, on_device = run(device="cuda")
    assert all(b.is_cuda for b in on_device)
    assert [b[:, 0].tolist() for b in on_device] == [b[:, 0].tolist() for b in pageable]


def test_diagnose_reads_the_gpu_through_nvml():
    figures = _native.tuning.GpuSampler(torch.cuda.current_device()).stop()
    if not figures["gpu_present"]:
        pytest.skip("NVML (libnvidia-ml.so.1) is not available")
    assert figures["gpu_memory_total"] > 0 and figures["gpu_samples"] >= 1


def test_diagnose_names_a_gpu_bound_step_and_an_input_bound_one():
    from faulty import FaultyDataset
    if not _native.tuning.GpuSampler(torch.cuda.current_device()).stop()["gpu_present"]:
        pytest.skip("NVML (libnvidia-ml.so.1) is not available")
    busy = BusyGpu(8192, 4)

    def heavy_step(batch):
        busy()
        torch.cuda.current_stream().synchronize()  # as loss.item() would

    fast = stoker.DataLoader(FaultyDataset(100_000, delay_us=0), batch_size=64, num_workers=2,
                             device="cuda")
    report = stoker.diagnose(fast, heavy_step, seconds=3.0)
    assert report.verdict == "compute-bound", report.summary()
    assert report["figures"]["gpu_utilization"] > 0.8

    slow = stoker.DataLoader(FaultyDataset(100_000, delay_us=3000), batch_size=16,
                             num_workers=1, device="cuda")
    report = stoker.diagnose(slow, lambda b: b.float().sum().item(), seconds=3.0)
    assert report.verdict == "input-bound", report.summary()
    assert report["figures"]["gpu_utilization"] < 0.5


def test_tune_recommends_pin_memory_and_device():
    from stoker.tuning.tune import tune_loader
    data = stoker.ArrayDataset(np.zeros((4096, 4096), dtype=np.float32))
    start = time.perf_counter()
    r = tune_loader(data, batch_size=64, repeats=1, seconds=0.2, max_workers=2, gpu=True)
    assert {"pin_memory", "device"} <= set(r["recommended"])
    assert r["recommended"]["device"] in ("cuda", "cpu")
    assert {p["device"] for p in r["points"]} <= {0, 1}
    assert time.perf_counter() - start < 300
