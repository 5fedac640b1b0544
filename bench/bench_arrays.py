#!/usr/bin/env python3
"""Stoker against torch.utils.data.DataLoader on array data, side by side in one run.

What is measured
----------------
Two workloads, each read from a file in bench/data/ (generated once, git-ignored) that is read
through once before measuring, so both loaders read from the page cache, not from disk:

* tokens: windows of a flat uint16 token file of 100M tokens (nanoGPT's train.bin layout),
  seq_len 2048, batch 32. A sample is (x, y) = (tokens[s:s+L], tokens[s+1:s+L+1]) as int64, so a
  batch is two int64 tensors [32, 2048] = 1 MiB of output.
* rows: rows of a float32 array of 1M x 256 (a .npy file opened with mmap_mode="r"); a sample is
  one row (1 KiB), a batch is one float32 tensor [B, 256].

For each workload:

* torch: torch.utils.data.DataLoader over the Dataset a PyTorch user writes -- np.memmap opened
  lazily in whichever process calls __getitem__ (nanoGPT style), slicing plus torch.from_numpy,
  default collate, shuffle=True, pin_memory=False, persistent_workers=False, prefetch_factor=2
  when num_workers > 0 -- at num_workers in {0, 1, 2, 4}. Its best is the baseline.
* stoker: stoker.DataLoader over the native dataset (TokenDataset / ArrayDataset), shuffle=True,
  num_workers="auto" (the figure the targets apply to), plus num_workers 1 and 2, plus "auto"
  with output="numpy" (a diagnostic: the cost of handing batches out as torch tensors).
* memcpy bound: n threads (n = usable cores) each np.copyto-ing its share of preallocated,
  pre-faulted arrays whose size is the output bytes of >= 100 batches (at least 256 MiB, bigger
  than any cache). Its bytes/s is the memory bandwidth a loader writing the same output bytes on
  the same cores can hope for. Single-thread memcpy is shown for context.

Each side's Dataset is built once per workload, as in a training script, and every loader
configuration gets a fresh loader over it (torch: fresh worker processes, which map the file
anew, as persistent_workers=False does every epoch). It is iterated for a few warm-up batches,
then timed for a fixed number of batches (20,000) or a time limit (4 s), whichever comes first;
when an epoch ends inside that window the next one follows, its start-up amortized in the rate
(as in training). Start-up of the first epoch (building the loader and getting its first batch,
worker processes included) is reported on its own and is not part of the steady rate. Each batch
is consumed minimally (one element read) and dropped before the next is asked for. Every
measurement is repeated (3 times by default), the reps interleaving stoker, torch and memcpy so
that drift on a shared machine hits all of them; the median is reported with the min-max spread.

Reading the "% bound" column: the memcpy reference reads as many bytes as it writes and streams
them through DRAM. Token windows read 2 bytes (uint16) per 8 bytes written (int64), and a loader
that recycles a few MiB of batch buffers may write into cache, so that workload can exceed 100%.
Rows are gathered at random (one 1 KiB row per page), which costs more than a sequential copy.

Targets (from the issue): on tokens, stoker >= 5x torch's best and >= 60% of the memcpy bound;
on rows, >= 60% of the memcpy bound (its ratio to torch is reported too).

Usage:
    python bench/bench_arrays.py               # full run (a few minutes)
    python bench/bench_arrays.py --quick       # smoke test (~10 s, small files, both sides)
    python bench/bench_arrays.py --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import torch
import torch.utils.data

import stoker

from harness import cores as usable_cores, samples_in  # bench/harness.py, beside this file

DATA_DIR = Path(__file__).resolve().parent / "data"
TORCH_WORKERS = (0, 1, 2, 4)
TOKEN_TARGET_RATIO = 5.0
BOUND_TARGET_FRACTION = 0.60
GB = 1e9


# ---------------------------------------------------------------------------------------------
# Data files


def make_token_file(path: Path, num_tokens: int, vocab: int = 50257) -> None:
    """Random uint16 token ids, written in chunks (np.random.default_rng(0))."""
    if path.exists() and path.stat().st_size == 2 * num_tokens:
        return
    print(f"generating {path} ({num_tokens:,} uint16 tokens) ...", flush=True)
    rng = np.random.default_rng(0)
    tmp = path.with_suffix(path.suffix + ".tmp")
    chunk = 1 << 24
    with open(tmp, "wb") as f:
        for start in range(0, num_tokens, chunk):
            n = min(chunk, num_tokens - start)
            rng.integers(0, vocab, size=n, dtype=np.uint16).tofile(f)
    os.replace(tmp, path)


def make_rows_file(path: Path, rows: int, cols: int) -> None:
    """A float32 .npy array of random rows, filled in chunks through open_memmap."""
    if path.exists():
        try:
            a = np.load(path, mmap_mode="r")
            if a.shape == (rows, cols) and a.dtype == np.float32:
                return
        except ValueError:
            pass
    print(f"generating {path} ({rows:,} x {cols} float32) ...", flush=True)
    rng = np.random.default_rng(0)
    tmp = path.with_name(path.name + ".tmp.npy")
    a = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(rows, cols))
    chunk = max(1, (64 << 20) // (4 * cols))
    for start in range(0, rows, chunk):
        stop = min(rows, start + chunk)
        a[start:stop] = rng.random((stop - start, cols), dtype=np.float32)
    a.flush()
    del a
    os.replace(tmp, path)


def warm_page_cache(path: Path) -> float:
    """Reads the whole file once so that every loader reads it from RAM; returns seconds."""
    t0 = time.perf_counter()
    buf = bytearray(64 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(view):
            pass
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------
# The PyTorch side: the Datasets a PyTorch user writes


class TorchTokenWindows(torch.utils.data.Dataset):
    """nanoGPT-style windows: the memmap is opened lazily by whichever process reads."""

    def __init__(self, path, seq_len):
        self.path = str(path)
        self.seq_len = seq_len
        self.num_samples = (os.path.getsize(self.path) // 2 - 1) // seq_len
        self.tokens = None

    def __len__(self):
        return self.num_samples

    def __getitem__(self, i):
        if self.tokens is None:
            self.tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        s = i * self.seq_len
        x = torch.from_numpy(self.tokens[s:s + self.seq_len].astype(np.int64))
        y = torch.from_numpy(self.tokens[s + 1:s + 1 + self.seq_len].astype(np.int64))
        return x, y


class TorchRows(torch.utils.data.Dataset):
    """Rows of a memory-mapped .npy array, opened lazily by whichever process reads."""

    def __init__(self, path):
        self.path = str(path)
        self.num_samples = np.load(self.path, mmap_mode="r").shape[0]
        self.rows = None

    def __len__(self):
        return self.num_samples

    def __getitem__(self, i):
        if self.rows is None:
            self.rows = np.load(self.path, mmap_mode="r")
        return torch.from_numpy(np.array(self.rows[i]))


# ---------------------------------------------------------------------------------------------
# Workloads and configurations


@dataclass
class Workload:
    name: str
    path: Path
    batch_size: int
    sample_bytes: int  # output bytes of one sample
    torch_dataset: torch.utils.data.Dataset
    stoker_dataset: object  # stoker.TokenDataset or stoker.ArrayDataset
    num_samples: int = 0


@dataclass
class Config:
    side: str  # "stoker" or "torch"
    label: str
    kwargs: dict
    diagnostic: bool = False  # shown, but not a candidate for "best" or for the targets


@dataclass
class Run:
    samples_per_s: float
    startup_s: float
    batches: int
    stats: dict | None = None


@dataclass
class Result:
    config: Config
    runs: list = field(default_factory=list)

    def rates(self):
        return [r.samples_per_s for r in self.runs]

    @property
    def median(self):
        return statistics.median(self.rates())


def token_workload(path: Path, seq_len: int, batch_size: int) -> Workload:
    return Workload(
        name="tokens", path=path, batch_size=batch_size, sample_bytes=2 * seq_len * 8,
        torch_dataset=TorchTokenWindows(path, seq_len),
        stoker_dataset=stoker.TokenDataset(path, dtype="uint16", seq_len=seq_len),
        num_samples=(os.path.getsize(path) // 2 - 1) // seq_len)


def rows_workload(path: Path, batch_size: int) -> Workload:
    shape = np.load(path, mmap_mode="r").shape
    return Workload(
        name="rows", path=path, batch_size=batch_size, sample_bytes=int(np.prod(shape[1:])) * 4,
        torch_dataset=TorchRows(path),
        stoker_dataset=stoker.ArrayDataset(np.load(path, mmap_mode="r")),
        num_samples=shape[0])


def configs() -> list[Config]:
    """Interleaved order: stoker and torch alternate within every rep."""
    torch_cfgs = [Config("torch", f"torch num_workers={w}", {"num_workers": w})
                  for w in TORCH_WORKERS]
    stoker_cfgs = [
        Config("stoker", 'stoker num_workers="auto"', {"num_workers": "auto"}),
        Config("stoker", "stoker num_workers=1", {"num_workers": 1}),
        Config("stoker", "stoker num_workers=2", {"num_workers": 2}),
        Config("stoker", 'stoker "auto", output="numpy"',
               {"num_workers": "auto", "output": "numpy"}, diagnostic=True),
    ]
    order = []
    for s, t in zip(stoker_cfgs, torch_cfgs):
        order += [t, s]
    return order


def make_loader(work: Workload, cfg: Config):
    if cfg.side == "torch":
        w = cfg.kwargs["num_workers"]
        extra = {"prefetch_factor": 2} if w > 0 else {}
        return torch.utils.data.DataLoader(
            work.torch_dataset, batch_size=work.batch_size, shuffle=True, num_workers=w,
            persistent_workers=False, pin_memory=False, **extra)
    kwargs = {"output": "torch", **cfg.kwargs}
    return stoker.DataLoader(work.stoker_dataset, batch_size=work.batch_size,
                             shuffle=True, seed=0, **kwargs)


# ---------------------------------------------------------------------------------------------
# Measurement


def touch(batch):
    """Consumes a batch minimally: reads one element of its first tensor/array."""
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    return first[0, 0]


def wait_for_children(timeout=10.0):
    """Makes sure no worker process of a previous configuration is still alive."""
    me = psutil.Process()
    children = me.children(recursive=True)
    _, alive = psutil.wait_procs(children, timeout=timeout)
    if alive:
        raise RuntimeError(f"worker processes still alive after {timeout} s: "
                           f"{[p.pid for p in alive]}")


def measure(work: Workload, cfg: Config, warmup: int, max_batches: int,
            time_limit: float) -> Run:
    """One measurement: start-up (loader + first batch), warm-up, then the steady rate over
    `max_batches` batches or `time_limit` seconds, whichever comes first. An epoch that ends
    during the steady phase is followed by the next one, its start-up counted in the rate."""
    gc.collect()
    t0 = time.perf_counter()
    loader = make_loader(work, cfg)
    it = iter(loader)
    touch(next(it))
    startup = time.perf_counter() - t0
    for _ in range(warmup - 1):
        touch(next(it))
    batches = samples = 0
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    while batches < max_batches:
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)  # the next epoch (stoker advances its epoch, torch reshuffles)
            continue
        touch(batch)
        samples += samples_in(batch)
        del batch
        batches += 1
        if time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - t0
    stats = loader.stats() if cfg.side == "stoker" else None
    del it, loader  # stoker: joins its threads; torch: shuts its worker processes down
    gc.collect()
    if cfg.side == "torch":
        wait_for_children()
    return Run(samples_per_s=samples / elapsed, startup_s=startup, batches=batches, stats=stats)


def memcpy_rate(total_bytes: int, threads: int, repeats: int = 3, trials: int = 3) -> float:
    """Bytes/s written by `threads` threads each np.copyto-ing its share, best of `trials`."""
    src = np.ones(total_bytes, dtype=np.uint8)
    dst = np.ones(total_bytes, dtype=np.uint8)  # pre-faulted: page faults are not memcpy
    edges = np.linspace(0, total_bytes, threads + 1).astype(np.int64)
    parts = [(dst[a:b], src[a:b]) for a, b in zip(edges[:-1], edges[1:])]
    best = 0.0
    for _ in range(trials):
        barrier = threading.Barrier(threads + 1)

        def copy(d, s):
            barrier.wait()
            for _ in range(repeats):
                np.copyto(d, s)

        pool = [threading.Thread(target=copy, args=p) for p in parts]
        for t in pool:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in pool:
            t.join()
        best = max(best, total_bytes * repeats / (time.perf_counter() - t0))
    return best


# ---------------------------------------------------------------------------------------------
# Reporting


def fmt_rate(values):
    lo, hi = min(values), max(values)
    return f"{statistics.median(values):>12,.0f}  ({lo:,.0f}-{hi:,.0f})"


def report(work: Workload, results: list[Result], bound: dict, quick: bool) -> dict:
    torch_best = max((r for r in results if r.config.side == "torch"), key=lambda r: r.median)
    stoker_auto = results_by_label(results)['stoker num_workers="auto"']
    bound_bps = bound["multi_median"]
    print(f"\n== {work.name}: batch {work.batch_size}, {work.sample_bytes:,} output bytes/sample, "
          f"{work.num_samples:,} samples, file {work.path.name}")
    print(f"   memcpy bound ({bound['threads']} threads, {bound['bytes'] / 2**20:,.0f} MiB): "
          f"{bound_bps / GB:.2f} GB/s  (spread {min(bound['multi']) / GB:.2f}-"
          f"{max(bound['multi']) / GB:.2f});  1 thread: {bound['single_median'] / GB:.2f} GB/s")
    header = (f"   {'config':<32} {'start-up s':>10} {'samples/s median (min-max)':>36} "
              f"{'GB/s':>7} {'x torch':>8} {'% bound':>8}")
    print(header)
    print("   " + "-" * (len(header) - 3))
    rows = []
    for r in results:
        gbps = r.median * work.sample_bytes / GB
        ratio = r.median / torch_best.median
        frac = r.median * work.sample_bytes / bound_bps
        startup = statistics.median(x.startup_s for x in r.runs)
        mark = "  <- torch best" if r is torch_best else ""
        mark = "  (diagnostic)" if r.config.diagnostic else mark
        print(f"   {r.config.label:<32} {startup:>10.3f} {fmt_rate(r.rates()):>36} "
              f"{gbps:>7.2f} {ratio:>7.2f}x {frac:>7.0%}{mark}")
        rows.append({"config": r.config.label, "side": r.config.side,
                     "diagnostic": r.config.diagnostic,
                     "samples_per_s": r.rates(), "samples_per_s_median": r.median,
                     "bytes_per_s_median": r.median * work.sample_bytes,
                     "startup_s": [x.startup_s for x in r.runs],
                     "batches_measured": [x.batches for x in r.runs],
                     "ratio_to_torch_best": ratio, "fraction_of_memcpy_bound": frac,
                     "stoker_stats": [x.stats for x in r.runs if x.stats is not None]})

    s = stoker_auto.runs[len(stoker_auto.runs) // 2].stats
    if s and s["batches"]:
        print(f"   stoker auto stats (one rep): num_workers={s['num_workers']} "
              f"prefetch={s['prefetch_factor']} batches={s['batches']} "
              f"read {s['read_s'] / s['batches'] * 1e6:.0f} us/batch (all workers), "
              f"consumer waited {s['consumer_wait_s'] / s['batches'] * 1e6:.0f} us/batch, "
              f"workers waited for buffers {s['buffer_wait_s'] / s['batches'] * 1e6:.0f} us/batch")

    ratio = stoker_auto.median / torch_best.median
    frac = stoker_auto.median * work.sample_bytes / bound_bps
    checks = {"fraction_of_memcpy_bound": frac >= BOUND_TARGET_FRACTION}
    if work.name == "tokens":
        checks["ratio_to_torch_best"] = ratio >= TOKEN_TARGET_RATIO
    passed = all(checks.values())
    target = (f"targets >= {TOKEN_TARGET_RATIO:g}x, >= {BOUND_TARGET_FRACTION:.0%}"
              if work.name == "tokens" else f"target >= {BOUND_TARGET_FRACTION:.0%} of bound")
    summary = (f"{work.name}: stoker {stoker_auto.median:,.0f} samples/s = {ratio:.1f}x torch best "
               f"({torch_best.config.label.removeprefix('torch ')}), {frac:.0%} of memcpy bound  "
               f"[{target}] {'PASS' if passed else 'FAIL'}"
               f"{' (quick run: indicative only)' if quick else ''}")
    return {"workload": work.name, "file": str(work.path), "batch_size": work.batch_size,
            "sample_bytes": work.sample_bytes, "num_samples": work.num_samples,
            "memcpy": bound, "configs": rows, "torch_best": torch_best.config.label,
            "stoker_samples_per_s": stoker_auto.median, "ratio_to_torch_best": ratio,
            "fraction_of_memcpy_bound": frac, "checks": checks, "pass": passed,
            "summary": summary}


def results_by_label(results):
    return {r.config.label: r for r in results}


# ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="smoke test: small files, short runs, one rep (~10 s), still both sides")
    p.add_argument("--json", metavar="PATH", help="write every figure to PATH as JSON")
    p.add_argument("--reps", type=int, help="repetitions of every measurement (default 3; 1 quick)")
    p.add_argument("--time-limit", type=float,
                   help="seconds of steady iteration per measurement (default 4; 0.25 quick)")
    p.add_argument("--warmup", type=int, help="warm-up batches (default 5; 2 quick)")
    p.add_argument("--max-batches", type=int,
                   help="batches of the steady phase unless the time limit comes first "
                        "(default 20000; 200 quick)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--token-batch", type=int, default=32)
    p.add_argument("--rows-batch", type=int, default=256,
                   help="batch size of the rows workload (default 256)")
    p.add_argument("--workloads", default="tokens,rows", help="comma-separated: tokens,rows")
    p.add_argument("--check", action="store_true", help="exit with status 1 if a target fails")
    args = p.parse_args(argv)
    args.reps = args.reps or (1 if args.quick else 3)
    args.time_limit = args.time_limit or (0.25 if args.quick else 4.0)
    args.warmup = args.warmup or (2 if args.quick else 5)
    args.max_batches = args.max_batches or (200 if args.quick else 20_000)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    # torch warns that num_workers=4 exceeds the cores it suggests; measuring that is the point.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    cores = usable_cores()
    wanted = [w.strip() for w in args.workloads.split(",") if w.strip()]

    works = []
    if "tokens" in wanted:
        n_tokens = 8_000_000 if args.quick else 100_000_000
        path = DATA_DIR / f"tokens-{n_tokens // 1_000_000}M.u16"
        make_token_file(path, n_tokens)
        works.append(token_workload(path, args.seq_len, args.token_batch))
    if "rows" in wanted:
        n_rows = 65_536 if args.quick else 1_000_000
        path = DATA_DIR / (f"rows-{n_rows // 1024}Kx256.f32.npy" if args.quick
                           else "rows-1Mx256.f32.npy")
        make_rows_file(path, n_rows, 256)
        works.append(rows_workload(path, args.rows_batch))

    print(f"stoker {stoker.__version__}, torch {torch.__version__}, numpy {np.__version__}, "
          f"python {platform.python_version()}; {cores} usable cores, "
          f"torch intra-op threads {torch.get_num_threads()}; load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"reps {args.reps}, warm-up {args.warmup} batches, steady phase {args.max_batches:,} "
          f"batches or {args.time_limit:g} s, whichever first{' (QUICK)' if args.quick else ''}")
    for work in works:
        print(f"page cache: read {work.path.name} "
              f"({work.path.stat().st_size / 2**20:,.0f} MiB) in {warm_page_cache(work.path):.2f} s")

    out = {"argv": sys.argv[1:], "quick": args.quick, "cores": cores,
           "versions": {"stoker": stoker.__version__, "torch": torch.__version__,
                        "numpy": np.__version__, "python": platform.python_version()},
           "loadavg_start": os.getloadavg(), "workloads": []}
    failed = False
    for work in works:
        results = [Result(c) for c in configs()]
        copy_bytes = max(100 * work.batch_size * work.sample_bytes, 256 << 20)
        if args.quick:
            copy_bytes = 64 << 20
        bound = {"threads": cores, "bytes": copy_bytes, "multi": [], "single": []}
        for rep in range(args.reps):
            bound["multi"].append(memcpy_rate(copy_bytes, cores))
            bound["single"].append(memcpy_rate(copy_bytes, 1))
            for r in results:
                r.runs.append(measure(work, r.config, args.warmup, args.max_batches,
                                      args.time_limit))
            print(f"   [{work.name}] rep {rep + 1}/{args.reps} done", flush=True)
        bound["multi_median"] = statistics.median(bound["multi"])
        bound["single_median"] = statistics.median(bound["single"])
        summary = report(work, results, bound, args.quick)
        out["workloads"].append(summary)
        failed |= not summary["pass"]

    print()
    for w in out["workloads"]:
        print(w["summary"])
    out["loadavg_end"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str) + "\n")
        print(f"figures written to {args.json}")
    return 1 if (failed and args.check) else 0


if __name__ == "__main__":
    import record  # bench/record.py: this output also goes to bench/results/
    sys.exit(record.run(main))
