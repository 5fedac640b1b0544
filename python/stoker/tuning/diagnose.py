"""``stoker.diagnose(loader, step_fn)`` and ``stoker diagnose --step-ms N``: is the loader or the
model the bottleneck?

The pipeline runs with a consumer (your training step, or a simulated one that sleeps N ms as a
GPU step would), and the figures are measured: the fraction of wall time the consumer waited for
data, each stage's throughput and CPU time (Stoker's stages are fused: "workers" read, decode,
transform and collate; "consumer" is the step), CPU utilization per core (/proc/stat), RSS, pinned
memory, and GPU utilization and memory through NVML when a GPU is present (libnvidia-ml.so.1,
loaded at run time: no Python package needed), averaged over readings every 100 ms during the run.
The GPU read is the loader's ``device``, else torch's current device. The verdict rules live in
C++ (``stoker/tuning/diagnosis.h``): with GPU figures, a GPU busy >= 90% of the time makes the
run compute-bound even if the host waited for data (its waits overlapped queued GPU work).

The report is a dict that also allows attribute access: ``report.verdict == report["verdict"]``,
one of "input-bound", "compute-bound", "memory-bound", with ``limiting_stage``, ``action``,
``reasons`` and the figures behind them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from .. import _native
from ..loader import DataLoader
from ..native import NativeProducer
from ..sources.base import StokerDataset
from ..sources.remote import network_figures

__all__ = ["Report", "diagnose", "main"]


class Report(dict):
    """The diagnosis: a dict whose keys are also attributes (``report.verdict``)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def summary(self):
        lines = [f"verdict: {self['verdict']} (limiting stage: {self['limiting_stage']})"]
        lines += [f"  - {r}" for r in self["reasons"]]
        lines.append(f"action: {self['action']}")
        return "\n".join(lines)


def _length(batch):
    if isinstance(batch, dict):  # a table's columns
        batch = next(iter(batch.values()))
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    try:
        return len(first)
    except TypeError:
        return 1


def _gpu_index(loader):
    """The CUDA device whose NVML figures describe the run: the loader's, else torch's current
    device (without initializing CUDA), else 0."""
    device = loader._device if isinstance(loader, DataLoader) else None
    if device is not None:
        return device.index
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return 0


def diagnose(loader, step_fn=None, *, seconds=10.0, max_batches=None, warmup_batches=2):
    """Runs ``step_fn(batch)`` on the batches of ``loader`` (a ``stoker.DataLoader``, or any
    iterable of batches such as a torch DataLoader) for ``seconds`` (or ``max_batches``), and
    returns a :class:`Report`. ``step_fn=None`` is a consumer that does nothing (the fastest)."""
    step_fn = step_fn or (lambda batch: None)
    stoker_loader = isinstance(loader, DataLoader)
    producer = loader._producer if stoker_loader else None
    # The engine's own stage figures, for a loader of a native dataset.
    native = producer.engine if isinstance(producer, NativeProducer) else None
    it = iter(loader)

    def next_batch():
        nonlocal it
        try:
            return next(it)
        except StopIteration:
            it = iter(loader)
            return next(it)

    for _ in range(warmup_batches):
        step_fn(next_batch())
    s0 = native.stats() if native is not None else None
    # The dataset's own figures (sources/base.py: its counters before and after the run).
    dataset = loader.dataset if stoker_loader and isinstance(loader.dataset, StokerDataset) \
        else None
    remote = dataset._remote if dataset is not None else None
    r0 = remote.stats() if remote is not None else None
    c0 = dataset._counters() if dataset is not None else None
    sys0 = _native.tuning.read_system()
    gpu = _native.tuning.GpuSampler(_gpu_index(loader))
    wait = step = step_cpu = 0.0
    samples = batches = 0
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        if t0 - start >= seconds or (max_batches is not None and batches >= max_batches):
            break
        batch = next_batch()
        t1 = time.perf_counter()
        c1 = time.thread_time()
        step_fn(batch)
        t2 = time.perf_counter()
        step_cpu += time.thread_time() - c1
        wait += t1 - t0
        step += t2 - t1
        samples += _length(batch)
        batches += 1
        del batch
    wall = time.perf_counter() - start
    sys1 = _native.tuning.read_system()
    gpu_figures = gpu.stop()
    cores = []
    for b0, t0_, b1, t1_ in zip(sys0["core_busy"], sys0["core_total"], sys1["core_busy"],
                                sys1["core_total"]):
        total = t1_ - t0_
        cores.append(min(1.0, max(0.0, (b1 - b0) / total)) if total > 0 else 0.0)

    stages = [{"name": "consumer", "threads": 1, "samples_per_s": samples / wall if wall else 0,
               "busy_seconds": step, "cpu_seconds": step_cpu}]
    buffer_wait = 0.0
    pinned = pinned_budget = peak = budget = 0
    if native is not None:
        s1 = native.stats()
        stages.insert(0, {
            "name": "workers", "threads": int(s1["active_workers"]) or 1,
            "samples_per_s": samples / wall if wall else 0,
            "busy_seconds": s1["read_s"] - s0["read_s"],
            "cpu_seconds": s1["worker_cpu_s"] - s0["worker_cpu_s"]})
        buffer_wait = s1["buffer_wait_s"] - s0["buffer_wait_s"]
        peak, budget = s1["buffer_bytes_peak"], s1["memory_budget"]
        if native.pinned:
            pinned, pinned_budget = s1["pinned_bytes"], s1["memory_budget"]
    figures = {
        "wall_seconds": wall, "consumer_wait_seconds": wait, "buffer_wait_seconds": buffer_wait,
        "stages": stages, "core_utilization": cores, "rss_bytes": sys1["rss_bytes"],
        "pinned_bytes": pinned, "pinned_budget_bytes": pinned_budget,
        "buffer_bytes_peak": peak, "memory_budget": budget,
        "process_pinned_bytes": _native.gpu.cuda_pinned_bytes(), **gpu_figures,
    }
    if remote is not None:
        figures["network"] = network_figures(r0, remote.stats())
    if c0 is not None:
        figures["source_figures"] = dataset._figures(c0, dataset._counters())
    verdict = _native.tuning.diagnose(figures)
    report = Report(verdict)
    report.update(figures=figures, batches=batches, samples=samples,
                  samples_per_s=samples / wall if wall else 0.0,
                  step_seconds=step, wait_seconds=wait)
    if stoker_loader and (budget := loader.stats().get("budget")) is not None:
        # Batches by a budget: the padding's share and how much a step's cost differs by rank.
        report["budget"] = budget
        report["reasons"].append(
            f"batches by {loader.batch_size!r}: padding {budget['padding_fraction']:.1%} of the "
            f"batches' size, the ranks' cost of a step within {budget['mean_cost_spread']:.1%} "
            f"on average ({budget['max_cost_spread']:.1%} at most)")
    return report


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="stoker diagnose",
        description="Run the loader with a simulated training step and say what limits it.")
    from .datasets import add_dataset_arguments
    add_dataset_arguments(p)
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="simulated training step per batch, in ms (sleeps, as a GPU step does)")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--num-workers", default="auto")
    p.add_argument("--device", default=None,
                   help='copy batches to this GPU ahead of the step ("cuda", "cuda:N")')
    p.add_argument("--json", metavar="PATH", help="write the report as JSON")
    args = p.parse_args(argv)
    from ..loader import DataLoader
    from .tune import _open_dataset
    workers = args.num_workers if args.num_workers == "auto" else int(args.num_workers)
    try:
        dataset = _open_dataset(args.dataset, args.image, args.label)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"stoker diagnose: error: {e}", file=sys.stderr)
        return 2
    try:
        loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                            num_workers=workers, output="torch" if args.device else "numpy",
                            device=args.device)
    except (RuntimeError, ValueError) as e:
        print(f"stoker diagnose: error: {e}", file=sys.stderr)
        return 2
    delay = args.step_ms / 1000.0
    report = diagnose(loader, (lambda b: time.sleep(delay)) if delay > 0 else None,
                      seconds=args.seconds)
    f = report["figures"]
    print(f"ran {report['batches']} batches in {f['wall_seconds']:.1f} s: "
          f"{report['samples_per_s']:.0f} samples/s; consumer waited "
          f"{report['wait_fraction']:.0%} of the time")
    for s in f["stages"]:
        print(f"  stage {s['name']:>8}: {s['threads']} thread(s), {s['samples_per_s']:.0f} "
              f"samples/s, busy {s['busy_seconds']:.2f} s, CPU {s['cpu_seconds']:.2f} s")
    print("  CPU per core: " + " ".join(f"{u:.0%}" for u in f["core_utilization"]))
    print(f"  RSS {f['rss_bytes'] / 2**20:.0f} MiB, pinned {f['pinned_bytes'] / 2**20:.0f} MiB, "
          f"batch buffers peak {f['buffer_bytes_peak'] / 2**20:.0f} MiB of "
          f"{f['memory_budget'] / 2**20:.0f} MiB budget")
    if f["gpu_present"]:
        print(f"  GPU {f['gpu_utilization']:.0%} busy (mean of {f['gpu_samples']} NVML readings), "
              f"peak {f['gpu_memory_used'] / 2**20:.0f} of {f['gpu_memory_total'] / 2**20:.0f} "
              f"MiB")
    else:
        print("  GPU: none found (NVML not available)")
    print(report.summary())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fp:
            json.dump(report, fp, indent=2)
            fp.write("\n")
    return 0
