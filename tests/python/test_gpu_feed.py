"""The GPU feed without a GPU: the device= argument, the copy stage's ordering and bounds, and the
pinned-buffer recycling protocol, driven by a fake copy stage whose copies run when the test says
(tests/python/test_gpu.py runs the same on a real GPU)."""

import collections
import gc
import sys

import numpy as np
import pytest
import torch

import stoker
from stoker import _native
from stoker.gpu import feed as stoker_device
from stoker._tree import tree_map
from stoker.gpu.feed import DeviceFeed

ROW = 1024  # floats per sample: 4 KiB rows, 16 KiB batches of 4


def row_dataset(n):
    """Row i is the value i, everywhere: a batch's content is a known function of its samples."""
    return stoker.ArrayDataset(np.repeat(np.arange(n, dtype=np.float32)[:, None], ROW, axis=1))


def expected(indices):
    return torch.tensor(indices, dtype=torch.float32)[:, None].expand(len(indices), ROW)


# ---- device= ---------------------------------------------------------------------------------------

def test_device_cpu_changes_nothing():
    ds = row_dataset(40)
    plain = stoker.DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=2)
    cpu = stoker.DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=2, device="cpu")
    cpu_torch = stoker.DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=2,
                                  device=torch.device("cpu"))
    reference = [b.clone() for b in plain]
    for loader in (cpu, cpu_torch):
        it = iter(loader)
        assert type(it) is type(iter(plain))  # no copy stage at all
        got = list(it)
        assert len(got) == len(reference)
        assert all(torch.equal(a, b) and a.device.type == "cpu" for a, b in zip(got, reference))
        assert loader.stats()["device"] == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3", torch.device("cuda")])
def test_device_cuda_without_cuda_raises_a_clear_error(device):
    with pytest.raises(RuntimeError, match=r"needs CUDA, but CUDA is not available: .*CUDA"):
        stoker.DataLoader(row_dataset(8), batch_size=4, device=device)


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cuda:-1", "mps", 0, 1.5, "CUDA"])
def test_device_rejects_what_it_does_not_know(device):
    with pytest.raises(ValueError, match=r'device must be None, "cpu", "cuda", "cuda:N" or a '
                                         r"torch.device"):
        stoker.DataLoader(row_dataset(8), batch_size=4, device=device)


@pytest.mark.parametrize("kw, message", [
    (dict(gpu_prefetch=-1), "gpu_prefetch must be"),
    (dict(gpu_prefetch=65), "gpu_prefetch must be"),
    (dict(gpu_prefetch=True), "gpu_prefetch must be"),
    (dict(gpu_prefetch="2"), "gpu_prefetch must be"),
    (dict(gpu_prefetch_bytes=0), "gpu_prefetch_bytes must be"),
    (dict(gpu_prefetch_bytes="lots"), "gpu_prefetch_bytes must be"),
])
def test_gpu_prefetch_arguments_are_checked(kw, message):
    with pytest.raises(ValueError, match=message):
        stoker.DataLoader(row_dataset(8), batch_size=4, **kw)


def test_stats_report_pinned_memory():
    loader = stoker.DataLoader(row_dataset(40), batch_size=4, num_workers=2)
    list(loader)
    s = loader.stats()
    assert s["pinned_bytes"] == (s["buffer_bytes"] if loader.pin_memory else 0)
    assert s["fenced_buffers"] == 0


# ---- the copy stage, faked ------------------------------------------------------------------------

class ListStage:
    """Copies instantly; records what it was asked to do."""

    fences = ()

    def __init__(self, nbytes=100):
        self.nbytes = nbytes
        self.log = []

    def default_cap(self):
        return 1 << 40

    def copy(self, batch):
        self.log.append(("copy", batch))
        return ("gpu", batch), ("event", batch), self.nbytes, []

    def hand_over(self, gpu, event):
        assert event == ("event", gpu[1])
        self.log.append(("hand_over", gpu[1]))

    def add_stats(self, stats):
        pass


class CountingSource:
    def __init__(self, n, fail_at=()):
        self.n, self.fail_at, self.pulled = n, set(fail_at), 0

    def __iter__(self):
        return self

    def __len__(self):
        return self.n - self.pulled

    def __next__(self):
        if self.pulled >= self.n:
            raise StopIteration
        self.pulled += 1
        if self.pulled - 1 in self.fail_at:
            raise KeyError(f"batch {self.pulled - 1}")
        return self.pulled - 1


@pytest.mark.parametrize("depth", [0, 1, 2, 5])
def test_feed_copies_depth_batches_ahead_of_the_consumer(depth):
    source, stage = CountingSource(10), ListStage()
    feed = DeviceFeed(source, None, depth, stage=stage)
    got = []
    for b in feed:
        got.append(b[1])
        # Copies for the next `depth` batches are queued before this one is handed over.
        assert source.pulled == min(10, len(got) + depth)
    assert got == list(range(10))
    copies = [b for op, b in stage.log if op == "copy"]
    handed = [b for op, b in stage.log if op == "hand_over"]
    assert copies == handed == list(range(10))
    # Every batch is copied before it is handed over, and handed over in order.
    for b in range(10):
        assert stage.log.index(("copy", b)) < stage.log.index(("hand_over", b))
    with pytest.raises(StopIteration):
        next(feed)


def test_feed_bounds_the_gpu_memory_of_batches_copied_ahead():
    source, stage = CountingSource(10), ListStage(nbytes=100)
    feed = DeviceFeed(source, None, 8, 250, stage=stage)  # room for two batches ahead
    next(feed)
    assert source.pulled == 3
    next(feed)
    assert source.pulled == 4
    small = DeviceFeed(CountingSource(10), None, 8, 50, stage=ListStage(nbytes=100))
    next(small)
    assert small._source.pulled == 1  # one batch exceeds the cap: copied only when asked for


def test_feed_raises_an_error_at_its_batchs_turn_then_goes_on():
    feed = DeviceFeed(CountingSource(6, fail_at={2, 3}), None, 2, stage=ListStage())
    assert next(feed)[1] == 0 and next(feed)[1] == 1
    with pytest.raises(KeyError, match="batch 2"):
        next(feed)
    with pytest.raises(KeyError, match="batch 3"):
        next(feed)
    assert [b[1] for b in feed] == [4, 5]


def test_feed_len_counts_batches_not_yet_yielded():
    feed = DeviceFeed(CountingSource(5), None, 2, stage=ListStage())
    assert len(feed) == 5
    next(feed)
    assert len(feed) == 4
    list(feed)
    assert len(feed) == 0


class BaseInterrupt(BaseException):
    pass


def test_feed_does_not_defer_interrupts():
    class Interrupted(CountingSource):
        def __next__(self):
            if self.pulled == 2:
                raise BaseInterrupt
            return super().__next__()

    feed = DeviceFeed(Interrupted(5), None, 3, stage=ListStage())
    with pytest.raises(BaseInterrupt):
        next(feed)


def test_feed_maps_nested_batches_and_passes_other_leaves_through():
    Pair = collections.namedtuple("Pair", "x y")
    moved = []

    class TensorStage(ListStage):
        def copy(self, batch):
            out = tree_map(lambda t: moved.append(t) or t + 1, batch,
                                             torch.Tensor)
            return out, None, 0, []

        def hand_over(self, gpu, event):
            pass

    batch = {"a": Pair(torch.zeros(2), "name"), "b": [torch.ones(1), 3], "c": (torch.ones(1),)}
    out = next(DeviceFeed(iter([batch]), None, 1, stage=TensorStage()))
    assert isinstance(out["a"], Pair) and out["a"].y == "name" and torch.equal(out["a"].x,
                                                                              torch.ones(2))
    assert out["b"][1] == 3 and torch.equal(out["b"][0], torch.full((1,), 2.0))
    assert isinstance(out["c"], tuple) and len(moved) == 3


# ---- the recycling protocol, end to end through the C++ engine's pool -----------------------------

class FakeDmaStage:
    """A copy stage whose copies run late: copy() queues a FakeCopy that reads the CPU buffer
    only when it completes, which is when the consumer is handed the batch (as a DMA queued behind
    busy GPU work runs long after the CPU tensor was dropped)."""

    fences = ()

    def __init__(self):
        self.completed = 0

    def default_cap(self):
        return 1 << 40

    def copy(self, batch):
        dst = torch.empty_like(batch)
        nbytes = batch.numel() * batch.element_size()
        fake = _native.testing.FakeCopy(batch.data_ptr(), dst.data_ptr(), nbytes)
        return dst, fake, nbytes, [fake]

    def hand_over(self, gpu, fake):
        assert not fake.completed
        fake.complete()
        self.completed += 1

    def add_stats(self, stats):
        pass


@pytest.fixture
def pageable_fences():
    """Fences for pageable buffers too, so the protocol runs without CUDA."""
    _native.gpu.set_fence_provider(stoker_device._fence_streams)
    _native.testing.fence_pageable_buffers(True)
    yield
    _native.testing.fence_pageable_buffers(False)
    _native.gpu.set_fence_provider(stoker_device._fence_streams if stoker_device._installed else None)


def fake_gpu_loader(ds, **kw):
    loader = stoker.DataLoader(ds, **kw)
    loader._device, loader._copy_stage = "fake-gpu", FakeDmaStage()  # the feed, on a fake stage
    return loader


@pytest.mark.parametrize("workers", [0, 2])
def test_a_buffer_is_not_rewritten_before_its_late_copy_has_read_it(pageable_fences, workers):
    ds = row_dataset(64)
    batch_bytes = 4 * ROW * 4
    loader = fake_gpu_loader(ds, batch_size=4, shuffle=True, seed=11, num_workers=workers,
                             memory_budget=6 * batch_bytes, gpu_prefetch=2)
    reference = stoker.DataLoader(ds, batch_size=4, shuffle=True, seed=11, num_workers=0)
    for epoch in range(3):
        loader.set_epoch(epoch)
        reference.set_epoch(epoch)
        want = [b.clone() for b in reference]
        got = list(loader)
        assert len(got) == len(want) == 16
        for b, (g, w) in enumerate(zip(got, want)):
            assert torch.equal(g, w), f"epoch {epoch} batch {b}: a later batch overwrote it"
    assert loader._copy_stage.completed == 48
    s = loader.stats()
    assert s["buffer_bytes_peak"] <= 6 * batch_bytes
    assert s["gpu_batches"] == 48 and s["gpu_bytes"] == 48 * batch_bytes


def test_without_fences_the_late_copies_read_later_batches(pageable_fences):
    """The same run with fences off: what today's pinned batches do on a busy GPU. It must go
    wrong, or the test above would prove nothing."""
    _native.gpu.set_fence_provider(None)
    loader = fake_gpu_loader(row_dataset(64), batch_size=4, num_workers=0,
                             memory_budget=6 * 4 * ROW * 4, gpu_prefetch=2)
    got = list(loader)
    wrong = [b for b, g in enumerate(got) if not torch.equal(g, expected(range(4 * b, 4 * b + 4)))]
    assert wrong, "late copies read the right data without fences"


def test_a_fenced_buffer_comes_back_once_its_copy_completes(pageable_fences):
    batch_bytes = 4 * ROW * 4
    loader = stoker.DataLoader(row_dataset(16), batch_size=4, num_workers=0,
                               memory_budget=2 * batch_bytes)
    it = iter(loader)
    first = next(it)
    dst = torch.empty_like(first)
    copy = _native.testing.FakeCopy(first.data_ptr(), dst.data_ptr(), batch_bytes)
    with stoker_device.fenced_on([copy]):
        del first
    gc.collect()
    s = loader.stats()
    assert s["fenced_buffers"] == 1 and s["buffer_bytes"] == batch_bytes
    second = next(it)  # a second buffer, within the budget: the fenced one is not touched
    assert loader.stats()["buffer_bytes"] == 2 * batch_bytes
    del second
    third = next(it)  # the free one, not the fenced one
    assert torch.equal(third, expected(range(8, 12)))
    assert copy.polls > 0 and not copy.completed
    copy.complete()
    assert torch.equal(dst, expected(range(4)))  # the copy read batch 0, untouched
    del third
    assert torch.equal(next(it), expected(range(12, 16)))
    assert loader.stats()["fenced_buffers"] == 0
    assert loader.stats()["buffer_bytes_peak"] == 2 * batch_bytes


def test_a_consumer_holding_every_buffer_still_gets_the_budget_error(pageable_fences):
    """Fenced buffers come back by themselves and never count as held; held ones still do."""
    loader = stoker.DataLoader(row_dataset(40), batch_size=4, num_workers=0,
                               memory_budget=2 * 4 * ROW * 4)
    kept = []
    with pytest.raises(stoker.MemoryBudgetError):
        for b in loader:
            kept.append(b)


def test_a_failing_fence_provider_is_reported_and_the_buffer_still_recycled(pageable_fences,
                                                                            monkeypatch):
    def broken(devices):
        raise ZeroDivisionError("provider bug")

    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_value))
    _native.gpu.set_fence_provider(broken)
    loader = stoker.DataLoader(row_dataset(16), batch_size=4, num_workers=0)
    got = []
    for b in loader:  # each batch dies while the next is produced
        got.append(b.clone())
    del b
    assert [g[0, 0].item() for g in got] == [0.0, 4.0, 8.0, 12.0]
    assert len(reported) == 4 and all(isinstance(e, ZeroDivisionError) for e in reported)
    assert loader.stats()["fenced_buffers"] == 0


def test_state_dict_counts_batches_the_consumer_got_not_those_copied_ahead(pageable_fences):
    ds = row_dataset(64)
    loader = fake_gpu_loader(ds, batch_size=4, num_workers=2, gpu_prefetch=3)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    assert state["batch"] == 5
    resumed = fake_gpu_loader(ds, batch_size=4, num_workers=2)
    resumed.load_state_dict(state)
    assert torch.equal(next(iter(resumed)), expected(range(20, 24)))
    del it


def test_diagnose_reports_no_gpu_figures_without_a_gpu():
    loader = stoker.DataLoader(row_dataset(64), batch_size=4, num_workers=1, output="numpy")
    report = stoker.diagnose(loader, seconds=0.2)
    f = report["figures"]
    if not _native.gpu.cuda_available():
        assert f["gpu_present"] is False and f["gpu_samples"] == 0
    assert f["process_pinned_bytes"] == _native.gpu.cuda_pinned_bytes()
    assert {"gpu_utilization", "gpu_memory_used", "gpu_memory_total"} <= set(f)


# ---- stoker tune -----------------------------------------------------------------------------------

def test_tune_knobs_include_pin_memory_and_device_with_a_gpu():
    from stoker.tuning.tune import default_knobs
    with_gpu = {k["name"]: k for k in default_knobs(4, gpu=True)}
    assert with_gpu["pin_memory"]["values"] == [0, 1]
    assert with_gpu["device"]["values"] == [0, 1] and with_gpu["device"]["start"] == 1
    without = {k["name"]: k for k in default_knobs(4, gpu=False)}
    assert without["pin_memory"]["values"] == [0] and "device" not in without
    torch_side = {k["name"] for k in default_knobs(4, torch=True, gpu=True)}
    assert "pin_memory" in torch_side and "device" not in torch_side  # torch's has no device=


def test_tune_recommends_device_as_a_dataloader_argument():
    from stoker.tuning.tune import _finish
    result = _finish({"recommended": {"num_workers": 2, "pin_memory": 1, "device": 1}}, "stoker")
    assert result["recommended"] == {"num_workers": 2, "pin_memory": True, "device": "cuda"}
    result = _finish({"recommended": {"pin_memory": 0, "device": 0}}, "stoker")
    assert result["recommended"] == {"pin_memory": False, "device": "cpu"}


def test_tune_measures_batches_delivered_to_the_device_both_ways():
    """The GPU measurement, run against the CPU: device=0 copies in the loop, device=1 asks the
    loader; both deliver every batch."""
    from stoker.tuning.tune import _gpu_measure
    measure = _gpu_measure(row_dataset(64), 4, True, 0, 0, 0.05, 20, target=torch.device("cpu"))
    for device in (0, 1):
        rate = measure({"num_workers": 2, "prefetch_factor": 2, "pin_memory": 0,
                        "device": device})
        assert rate > 0


# ---- Python datasets -------------------------------------------------------------------------------

class RowDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 48

    def __getitem__(self, i):
        return torch.full((ROW,), float(i))


def test_python_dataset_shared_buffers_are_fenced_like_native_ones(pageable_fences):
    """Batches written by forked workers into shared memory: a late copy still reads its own
    batch (the buffers' fences are recorded when the last view of a batch dies)."""
    loader = stoker.DataLoader(RowDataset(), batch_size=4, num_workers=2, worker_type="process",
                               gpu_prefetch=2)
    loader._device, loader._copy_stage = "fake-gpu", FakeDmaStage()
    for epoch in range(2):
        got = list(loader)
        assert [int(g[0, 0]) for g in got] == list(range(0, 48, 4))
        for b, g in enumerate(got):
            assert torch.equal(g, expected(range(4 * b, 4 * b + 4))), f"batch {b} overwritten"
    assert loader._copy_stage.completed == 24
    assert loader.stats()["fenced_buffers"] == 0


def test_waiting_for_a_slow_copy_is_not_a_budget_error(pageable_fences):
    """A fence outlasting the loader's stall limit (1 s: a deep GPU queue ahead of the copy) is
    waited for: the buffer comes back by itself, the consumer holds nothing."""
    import threading
    batch_bytes = 4 * ROW * 4
    loader = stoker.DataLoader(row_dataset(8), batch_size=4, num_workers=0,
                               memory_budget=batch_bytes)
    it = iter(loader)
    first = next(it)
    copy = _native.testing.FakeCopy()
    with stoker_device.fenced_on([copy]):
        del first
    # The GPU finishes well after the stall limit, and after the front's retry (a gc, then
    # another stall limit): without the wait, MemoryBudgetError comes at about 2.2 s.
    finish = threading.Timer(3.0, copy.complete)
    finish.start()
    try:
        assert torch.equal(next(it), expected(range(4, 8)))
    finally:
        finish.cancel()
    assert copy.completed


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available")
def test_cli_diagnose_on_a_gpu_without_cuda_says_so(capsys):
    from stoker.tuning.diagnose import main
    assert main(["--device", "cuda", "--seconds", "0.1"]) == 2
    assert "needs CUDA" in capsys.readouterr().err
