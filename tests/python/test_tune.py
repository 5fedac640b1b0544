"""stoker tune, stoker.diagnose and the online autotune: the C++ search through its bindings on
synthetic callbacks, the CLI's JSON and PNG, verdicts for slow and fast consumers, and autotune
within the memory budget with a bounded decision log."""

import json
import logging
import random
import sys
import time

import numpy as np
import pytest

import stoker
from stoker import _native
from faulty import FaultyDataset
from stoker.tuning.tune import main as tune_main, tune_loader


def plateau_model(config):
    w = config["num_workers"]
    p = config["prefetch_factor"]
    return 100.0 * min(w, 3) * (1.0 if p >= 2 else 0.8)


KNOBS = [{"name": "num_workers", "values": [1, 2, 3, 4, 6, 8], "start": 2, "min": 0, "max": 256},
         {"name": "prefetch_factor", "values": [1, 2, 4], "start": 1, "min": 1, "max": 64}]


def test_tuner_finds_the_plateau_with_seeded_noise_and_stops():
    rng = random.Random(3)
    calls = []

    def measure(config):
        calls.append(dict(config))
        return plateau_model(config) * rng.uniform(0.99, 1.01)

    r = _native.tuning.tune_callback(KNOBS, measure, None, {"repeats": 3})
    assert r["recommended"] == {"num_workers": 3, "prefetch_factor": 2}
    assert r["stopped"] == "converged"
    assert len(r["points"]) == len(calls) and len(calls) % 3 == 0
    assert all("samples_per_s" in p and "num_workers" in p for p in r["points"])
    assert len(calls) // 3 < 6 * 3  # fewer configurations than the grid


def test_tuner_respects_the_memory_budget():
    def memory(config):
        return _native.tuning.estimate_loader_memory(config, 1000, 10)

    budget = memory({"num_workers": 2, "prefetch_factor": 2})
    seen = []
    r = _native.tuning.tune_callback(KNOBS, lambda c: seen.append(dict(c)) or plateau_model(c), memory,
                              {"repeats": 1, "memory_budget": budget})
    assert seen and all(memory(c) <= budget for c in seen)
    assert r["over_budget"]
    assert memory(r["recommended"]) <= budget


def test_tune_loader_native_measurements():
    ds = stoker.ArrayDataset(np.zeros((2000, 64), np.float32))
    knobs = [{"name": "num_workers", "values": [1, 2], "start": 1},
             {"name": "prefetch_factor", "values": [1, 2], "start": 2}]
    r = tune_loader(ds, batch_size=50, knobs=knobs, repeats=1, seconds=0.02, shuffle=False)
    assert set(r["recommended"]) == {"num_workers", "prefetch_factor"}
    assert all(p["samples_per_s"] > 0 for p in r["points"])


def test_cli_tune_writes_json_and_png(tmp_path, capsys):
    root = tmp_path / "imgs"
    from PIL import Image
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(8):
            Image.new("RGB", (64, 48), (i * 20, 100, 50)).save(root / c / f"{i}.jpg")
    out_json, out_png = tmp_path / "t.json", tmp_path / "t.png"
    rc = tune_main([str(root), "--batch-size", "4", "--repeats", "1", "--seconds", "0.02",
                    "--max-workers", "2", "--json", str(out_json), "--plot", str(out_png)])
    assert rc == 0
    data = json.loads(out_json.read_text())
    assert {"recommended", "points"} <= set(data)
    assert {"num_workers", "prefetch_factor", "pin_memory"} <= set(data["recommended"])
    assert data["points"] and all("samples_per_s" in p for p in data["points"])
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "recommended:" in capsys.readouterr().out
    # The recommendation is usable as DataLoader keyword arguments.
    stoker.DataLoader(stoker.ArrayDataset(np.arange(10)), **data["recommended"])


class FakeClock:
    """stoker.diagnose's clock (time.perf_counter, time.thread_time): it moves only when the test
    moves it, so the wait fraction is the one the test sets, not what sleeps happen to give."""

    def __init__(self):
        self.now = self.cpu = 0.0

    def perf_counter(self):
        return self.now

    def thread_time(self):
        return self.cpu

    def advance(self, seconds, cpu=0.0):
        self.now += seconds
        self.cpu += cpu


class PacedLoader(stoker.DataLoader):
    """A loader whose batches each take `wait` seconds of the fake clock to arrive (a
    stoker.DataLoader, so that diagnose reads the engine's own figures)."""

    def __init__(self, dataset, clock, wait, **kwargs):
        super().__init__(dataset, **kwargs)
        self.clock, self.wait = clock, wait

    def __iter__(self):
        for batch in super().__iter__():
            self.clock.advance(self.wait)
            yield batch


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(sys.modules["stoker.tuning.diagnose"], "time", fake)
    return fake


def diagnose_paced(clock, wait, step):
    loader = PacedLoader(FaultyDataset(100_000), clock, wait, batch_size=4, num_workers=2,
                         output="numpy")
    return stoker.diagnose(loader,
                           lambda batch: clock.advance(step, cpu=step), seconds=1.0)


def test_diagnose_slow_consumer_is_compute_bound(clock):
    report = diagnose_paced(clock, wait=0.0, step=0.02)  # batches ready, 20 ms steps
    assert report.verdict == report["verdict"] == "compute-bound"
    assert report["wait_fraction"] == 0.0
    assert report.batches == 50 and report.samples == 200  # 1 s of 20 ms steps
    assert report.limiting_stage == "consumer" and "mixed precision" in report.action
    consumer = {s["name"]: s for s in report["figures"]["stages"]}["consumer"]
    assert consumer["busy_seconds"] == pytest.approx(1.0)
    assert consumer["samples_per_s"] == pytest.approx(200)


def test_diagnose_fast_consumer_is_input_bound(clock):
    report = diagnose_paced(clock, wait=0.004, step=0.001)  # 4 ms waits, 1 ms steps
    assert report.verdict == "input-bound"
    assert report["wait_fraction"] == pytest.approx(0.8)
    assert report.limiting_stage == "workers"
    stages = {s["name"]: s for s in report["figures"]["stages"]}
    assert stages["workers"]["samples_per_s"] == pytest.approx(800)
    assert report["figures"]["core_utilization"]


def test_diagnose_verdict_from_synthetic_figures():
    figures = {"wall_seconds": 10.0, "consumer_wait_seconds": 0.2, "buffer_wait_seconds": 0.0,
               "stages": [{"name": "workers", "threads": 2, "samples_per_s": 1000,
                           "busy_seconds": 19.0, "cpu_seconds": 18.5},
                          {"name": "consumer", "threads": 1, "samples_per_s": 1000,
                           "busy_seconds": 9.8, "cpu_seconds": 0.5}],
               "core_utilization": [0.95, 0.97], "rss_bytes": 2**30,
               "pinned_bytes": 0, "pinned_budget_bytes": 0, "buffer_bytes_peak": 2**20,
               "memory_budget": 2**30, "gpu_present": False, "gpu_utilization": 0.0,
               "gpu_memory_used": 0, "gpu_memory_total": 0}
    assert _native.tuning.diagnose(figures)["verdict"] == "compute-bound"
    slow = dict(figures, consumer_wait_seconds=6.0)
    verdict = _native.tuning.diagnose(slow)
    assert verdict["verdict"] == "input-bound" and verdict["wait_fraction"] == pytest.approx(0.6)
    assert verdict["limiting_stage"] == "workers"


def test_autotune_stays_within_the_memory_budget_and_logs(caplog):
    ds = FaultyDataset(100_000, width=256, delay_us=300)  # 2 KiB samples
    batch_bytes = 8 * 256 * 8
    budget = 8 * batch_bytes  # room for a third worker only with a shallower prefetch
    loader = stoker.DataLoader(ds, batch_size=8, memory_budget=budget, cpu_budget=4,
                               output="numpy")
    # Run until the controller has decided something (it decides every 0.2 s while the consumer
    # waits for workers that sleep): the state observed, not a time window. What it decides from
    # which figures is autotune_test.cc's, with synthetic figures.
    deadline = time.monotonic() + 120  # a controller that never decides fails, not hangs
    with caplog.at_level(logging.INFO, logger="stoker.autotune"):
        for epoch in range(100_000):
            loader.set_epoch(epoch)
            for i, _ in enumerate(loader):
                if i % 50 == 49 and (loader.stats()["autotune"] or time.monotonic() > deadline):
                    break
            if loader.stats()["autotune"] or time.monotonic() > deadline:
                break
    s = loader.stats()
    assert s["autotune_enabled"]
    assert s["buffer_bytes_peak"] <= budget
    assert 1 <= len(s["autotune"]) <= 200
    assert all("reason" in d for d in s["autotune"])
    # It starts at the idle cores (a learned start aside): never above what the machine has.
    assert 1 <= s["autotune"][0]["num_workers"][0] <= stoker.usable_cores()
    assert all(a["num_workers"][1] * a["prefetch_factor"][1] + a["num_workers"][1] + 1 <= 8
               for a in s["autotune"])
    assert any("num_workers" in r.getMessage() for r in caplog.records)


def test_autotune_batches_identical_to_fixed_workers():
    ds = stoker.ArrayDataset(np.arange(5000, dtype=np.int64))
    fixed = [b.tolist() for b in stoker.DataLoader(ds, batch_size=7, shuffle=True, seed=2,
                                                    num_workers=2, output="numpy")]
    auto = [b.tolist() for b in stoker.DataLoader(ds, batch_size=7, shuffle=True, seed=2,
                                                   cpu_budget=4, output="numpy")]
    assert fixed == auto
