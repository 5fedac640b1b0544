"""``stoker tune``: the offline sweep of num_workers, prefetch_factor, pin_memory, device (with a
GPU) and batch_size (when allowed) for Stoker's loader or a user's ``torch.utils.data.DataLoader``.

The search (coordinate hill-climbing with repeats, noise-aware moves, plateau rule, memory budget)
runs in C++ (``stoker/tuning/tuner.h``). For Stoker's loader the measurements run natively too
(the bare loader, no model, no Python per batch); for torch, C++ calls back into Python, which
times ``torch.utils.data.DataLoader`` over the user's Dataset.

Result (also the ``--json`` file): ``recommended`` (knob -> value, usable as DataLoader keyword
arguments), ``points`` (one entry per measurement: the knobs and ``samples_per_s``), plus
``samples_per_s`` and ``noise`` of the recommendation, ``best``, ``over_budget``,
``measuring_seconds``, ``rounds``, ``stopped``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time

from .. import _native
from ..sources.base import StokerDataset
from .datasets import add_dataset_arguments

__all__ = ["tune_loader", "tune_torch", "write_plot", "print_table", "main"]

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _worker_values(max_workers):
    values, v = [], 1
    while v <= max_workers:
        values.append(v)
        v = v + 1 if v < 4 else v + v // 2
    if values[-1] != max_workers:
        values.append(max_workers)
    return values


def _torch_cuda():
    """True when PyTorch sees a CUDA device (without importing torch if it is not loaded yet and
    the engine sees no CUDA driver)."""
    if not _native.gpu.cuda_available():
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def default_knobs(max_workers=None, batch_sizes=None, batch_size=64, torch=False, gpu=None):
    """The knob specifications: explicit values within hard caps. With a GPU (``gpu``; None:
    CUDA present) Stoker's knobs include pin_memory and device (0: CPU batches that the training
    loop copies with ``x.to("cuda", non_blocking=True)``, 1: ``device="cuda"``)."""
    cores = _native.engine.usable_cores()
    max_workers = max_workers or max(2, 2 * cores)
    workers = _worker_values(min(max_workers, _native.engine.MAX_WORKERS))
    if torch:
        workers = [0] + workers
    knobs = [
        {"name": "num_workers", "values": workers, "start": min(cores, workers[-1]),
         "min": 0, "max": _native.engine.MAX_WORKERS},
        {"name": "prefetch_factor", "values": [1, 2, 4, 8], "start": 2, "min": 1,
         "max": _native.engine.MAX_PREFETCH_FACTOR},
    ]
    cuda = _torch_cuda() if gpu is None else gpu
    knobs.append({"name": "pin_memory", "values": [0, 1] if cuda else [0], "start": int(cuda),
                  "min": 0, "max": 1})
    if cuda and not torch:
        knobs.append({"name": "device", "values": [0, 1], "start": 1, "min": 0, "max": 1})
    if batch_sizes:
        values = sorted(set(batch_sizes) | {batch_size})
        knobs.append({"name": "batch_size", "values": values, "start": batch_size, "min": 1,
                      "max": 1 << 20})
    return knobs


def sample_dataset(root=None):
    """The built-in sample data with the standard ImageNet training pipeline (the sample data's
    own module makes it: tune names no dataset)."""
    from .. import transforms as T
    from ..sample_data import sample_dataset as make
    return make(root, T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                                 T.ToTensor(), T.Normalize(MEAN, STD)]))


def _open_dataset(spec, image=None, label=None):
    """The dataset a command names, with the standard ImageNet training pipeline for images."""
    from .. import transforms as T
    from .datasets import open_dataset
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(MEAN, STD)])
    return open_dataset(spec, transform=transform, image=image, label=label)


def _options(repeats, memory_budget, time_budget, noise_floor=0.02, plateau=0.03,
             max_rounds=4):
    return {"repeats": repeats, "memory_budget": memory_budget or 0,
            "time_budget_s": time_budget or 0.0, "noise_floor": noise_floor,
            "plateau_tolerance": plateau, "max_rounds": max_rounds}


def _finish(result, kind):
    rec = dict(result["recommended"])
    if "pin_memory" in rec:
        rec["pin_memory"] = bool(rec["pin_memory"])
    if "device" in rec:
        rec["device"] = "cuda" if rec["device"] else "cpu"
    if kind == "torch":
        if rec.get("num_workers", 0) == 0:
            rec.pop("prefetch_factor", None)  # torch rejects prefetch_factor without workers
        rec["persistent_workers"] = rec.get("num_workers", 0) > 0
    result["recommended"] = rec
    result["loader"] = kind
    return result


def tune_loader(dataset=None, *, batch_size=64, batch_sizes=None, memory_budget=None,
                repeats=3, seconds=0.4, time_budget=None, max_workers=None, knobs=None,
                progress=None, shuffle=True, seed=0, min_batches=2, gpu=None):
    """Tunes ``stoker.DataLoader`` over ``dataset`` (default: the built-in sample data); returns
    the result dict (see the module docstring). Without a GPU the measurements run in C++ (the
    bare loader). With one (``gpu``; None: when PyTorch sees CUDA), each measurement delivers the
    batches into GPU memory, as training needs them: ``device="cuda"``, or CPU batches copied by
    the loop with ``x.to("cuda", non_blocking=True)``, the knobs including pin_memory and device;
    the GPU is synchronized before the clock stops."""
    from .._options import parse_bytes as _parse_bytes
    dataset = sample_dataset() if dataset is None else dataset
    gpu = _torch_cuda() if gpu is None else gpu
    knobs = knobs or default_knobs(max_workers, batch_sizes, batch_size, gpu=gpu)
    budget = _parse_bytes(memory_budget) if memory_budget is not None else 0
    remote = dataset._remote if isinstance(dataset, StokerDataset) else None
    before = remote.stats() if remote is not None else None
    result = _tune_stoker(dataset, knobs, gpu, budget, batch_size, shuffle, seed, seconds,
                          min_batches, repeats, time_budget, progress)
    if remote is not None:  # a remote dataset: what the network gave while measuring
        from ..sources.remote import network_figures
        result["network"] = network_figures(before, remote.stats())
    return result


def _tune_stoker(dataset, knobs, gpu, budget, batch_size, shuffle, seed, seconds, min_batches,
                 repeats, time_budget, progress):
    if gpu:
        measure = _gpu_measure(dataset, batch_size, shuffle, seed, budget, seconds, min_batches)
        sample_bytes = _sample_bytes_of(dataset)

        def memory(config):
            return _native.tuning.estimate_loader_memory(config, sample_bytes, batch_size)

        result = _native.tuning.tune_callback(knobs, measure, memory,
                                       _options(repeats, budget, time_budget), progress)
        return _finish(result, "stoker")
    result = _native.tuning.tune_loader(
        dataset._source, knobs,
        {"batch_size": batch_size, "shuffle": shuffle, "seed": seed, "min_batches": min_batches},
        _options(repeats, budget, time_budget), seconds, progress)
    return _finish(result, "stoker")


def _sample_bytes_of(dataset):
    """Bytes one sample takes in a batch buffer (all fields)."""
    from ..loader import DataLoader
    one = DataLoader(dataset, batch_size=1, num_workers=0, pin_memory=False)
    return one.stats()["batch_bytes"]


def _gpu_measure(dataset, batch_size, shuffle, seed, budget, seconds, min_batches, target=None):
    """measure(config) -> samples/s delivered into GPU memory (see tune_loader). ``target``:
    torch's current CUDA device when None (tests pass the CPU)."""
    import torch
    from .._tree import tree_map
    from ..loader import DataLoader
    if target is None:
        target = torch.device("cuda", torch.cuda.current_device())
    on_cuda = target.type == "cuda"

    def synchronize():
        if on_cuda:
            torch.cuda.synchronize(target)

    def to_gpu(batch):  # what a training loop does with CPU batches
        return tree_map(lambda t: t.to(target, non_blocking=True), batch, torch.Tensor)

    def measure(config):
        on_gpu = bool(config.get("device", 1))
        loader = DataLoader(dataset, batch_size=config.get("batch_size", batch_size),
                            shuffle=shuffle, seed=seed, num_workers=config["num_workers"],
                            prefetch_factor=config["prefetch_factor"],
                            pin_memory=bool(config.get("pin_memory", on_cuda)),
                            memory_budget=budget or None, device=target if on_gpu else None)
        move = (lambda b: b) if on_gpu else to_gpu

        def stream():  # epochs back to back, as training runs them
            epoch = 0
            while True:
                loader.set_epoch(epoch)
                epoch += 1
                yield from loader

        batches = stream()
        move(next(batches))  # the first batch: start-up, not timed
        synchronize()
        samples = n = 0
        start = time.perf_counter()
        while n < min_batches or time.perf_counter() - start < seconds:
            b = move(next(batches))
            first = b[0] if isinstance(b, (tuple, list)) else b
            samples += len(first)
            n += 1
            del b, first
        synchronize()
        elapsed = time.perf_counter() - start
        batches.close()
        return samples / elapsed

    return measure


def _load_torch_spec(spec):
    module, _, func = spec.partition(":")
    if not module or not func:
        raise ValueError(f"--torch needs MODULE:FUNCTION, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    made = getattr(importlib.import_module(module), func)()
    if isinstance(made, tuple):
        dataset, kwargs = made
    else:
        dataset, kwargs = made, {}
    return dataset, dict(kwargs)


def _sample_bytes(sample):
    import numpy as np
    if hasattr(sample, "element_size") and hasattr(sample, "nelement"):
        return sample.element_size() * sample.nelement()
    if isinstance(sample, np.ndarray):
        return sample.nbytes
    if isinstance(sample, (tuple, list)):
        return sum(_sample_bytes(s) for s in sample)
    if isinstance(sample, dict):
        return sum(_sample_bytes(s) for s in sample.values())
    return 8


def tune_torch(dataset, loader_kwargs=None, *, memory_budget=None, repeats=2, seconds=1.0,
               time_budget=None, max_workers=None, progress=None):
    """Tunes ``torch.utils.data.DataLoader(dataset, **loader_kwargs)`` over num_workers,
    prefetch_factor and pin_memory (persistent_workers is recommended whenever workers are used:
    it saves the worker start at every epoch). The search is the same C++ tuner; each
    measurement is a Python callback timing the DataLoader (first batch untimed)."""
    import torch
    from .._options import parse_bytes as _parse_bytes
    kwargs = dict(loader_kwargs or {})
    batch_size = kwargs.pop("batch_size", 64)
    for k in ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers"):
        kwargs.pop(k, None)
    knobs = default_knobs(max_workers, None, batch_size, torch=True)
    sample_bytes = _sample_bytes(dataset[0])

    def measure(config):
        w = config["num_workers"]
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, num_workers=w,
            prefetch_factor=config["prefetch_factor"] if w > 0 else None,
            pin_memory=bool(config["pin_memory"]), persistent_workers=w > 0, **kwargs)
        it = iter(loader)
        next(it)
        samples, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            try:
                b = next(it)
            except StopIteration:
                it = iter(loader)
                continue
            first = b[0] if isinstance(b, (tuple, list)) else b
            samples += len(first)
        elapsed = time.perf_counter() - start
        del it, loader
        return samples / elapsed

    def memory(config):
        return _native.tuning.estimate_loader_memory(config, sample_bytes, batch_size)

    budget = _parse_bytes(memory_budget) if memory_budget is not None else 0
    result = _native.tuning.tune_callback(knobs, measure, memory, _options(repeats, budget, time_budget),
                                   progress)
    result = _finish(result, "torch")
    result["recommended"]["batch_size"] = batch_size
    return result


class ProgressBar:
    """One terminal line: a bar over the expected measurements (or the time budget), the last
    configuration and its throughput."""

    def __init__(self, expected, time_budget=None, stream=sys.stderr):
        self.expected = max(expected, 1)
        self.time_budget = time_budget
        self.stream = stream
        self.n = 0
        self.start = time.perf_counter()

    def __call__(self, point):
        self.n += 1
        elapsed = time.perf_counter() - self.start
        frac = self.n / max(self.expected, self.n + 1)
        if self.time_budget:
            frac = max(frac, min(1.0, elapsed / self.time_budget))
        width = 24
        fill = int(frac * width)
        knobs = " ".join(f"{k}={v}" for k, v in point.items()
                         if k not in ("samples_per_s", "repeat", "seconds", "memory_estimate"))
        line = (f"\r[{'#' * fill}{'.' * (width - fill)}] {self.n:3d} runs {elapsed:5.1f}s  "
                f"{knobs}  {point['samples_per_s']:8.0f} samples/s")
        self.stream.write(line.ljust(110)[:110])
        self.stream.flush()

    def close(self):
        self.stream.write("\n")
        self.stream.flush()


def _aggregate(points, knob_names):
    groups = {}
    for p in points:
        key = tuple(p[k] for k in knob_names)
        groups.setdefault(key, []).append(p["samples_per_s"])
    return groups


def print_table(result, stream=sys.stdout):
    """The measured configurations: mean, spread, and the recommendation marked."""
    names = [k for k in result["points"][0] if k not in
             ("samples_per_s", "repeat", "seconds", "memory_estimate")] if result["points"] else []
    rec = result["recommended"]
    header = "".join(f"{n:>16}" for n in names) + f"{'samples/s':>12}{'spread':>9}{'runs':>6}"
    print(header, file=stream)
    for key, runs in sorted(_aggregate(result["points"], names).items()):
        mean = sum(runs) / len(runs)
        spread = (max(runs) - min(runs)) / mean if mean else 0
        mark = "  <- recommended" if all(int(rec.get(n, -1)) == v for n, v in zip(names, key)) \
            else ""
        print("".join(f"{v:>16}" for v in key) + f"{mean:>12.0f}{spread:>8.1%}{len(runs):>6}"
              + mark, file=stream)


def write_plot(result, path):
    """PNG: throughput against each knob tried (mean and every repeat), the recommendation
    marked with a star."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = result["points"]
    names = [k for k in points[0] if k not in
             ("samples_per_s", "repeat", "seconds", "memory_estimate")]
    varied = [n for n in names if len({p[n] for p in points}) > 1] or names[:1]
    rec = result["recommended"]
    fig, axes = plt.subplots(1, len(varied), figsize=(4.5 * len(varied), 3.6), squeeze=False)
    for ax, name in zip(axes[0], varied):
        others = [n for n in names if n != name]
        xs = [p[name] for p in points]
        ys = [p["samples_per_s"] for p in points]
        ax.scatter(xs, ys, s=10, color="0.75", label="every run")
        line = {}
        for p in points:  # the slice through the recommendation
            if all(p[o] == int(rec.get(o, p[o])) for o in others):
                line.setdefault(p[name], []).append(p["samples_per_s"])
        if line:
            lx = sorted(line)
            ax.plot(lx, [sum(line[x]) / len(line[x]) for x in lx], "o-", color="C0",
                    label="others as recommended")
        rx = int(rec.get(name, 0))
        if rx in line:
            ax.plot([rx], [sum(line[rx]) / len(line[rx])], "*", color="C3", markersize=16,
                    label="recommended")
        ax.set_xlabel(name)
        ax.set_ylabel("samples/s")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"stoker tune ({result.get('loader', 'stoker')}): "
                 f"{result['samples_per_s']:.0f} samples/s recommended")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _expected_runs(knobs, repeats):
    return repeats * (1 + sum(min(len(k["values"]) - 1, 3) for k in knobs))


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="stoker tune",
        description="Find num_workers, prefetch_factor, pin_memory (and batch_size) for the "
                    "bare loader, measuring as few configurations as possible.")
    add_dataset_arguments(p)
    p.add_argument("--torch", metavar="MODULE:FUNCTION",
                   help="tune torch.utils.data.DataLoader over the Dataset FUNCTION returns "
                        "(or a (dataset, DataLoader kwargs) tuple)")
    p.add_argument("--json", metavar="PATH", help="write every point and the recommendation")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of throughput against the knobs")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batch-sizes", metavar="N,N,...",
                   help="also tune batch_size over these values (allowed by you)")
    p.add_argument("--memory-budget", help="bytes or a size such as 2GiB; never exceeded")
    p.add_argument("--repeats", type=int, default=None, help="measurements per configuration")
    p.add_argument("--seconds", type=float, default=None, help="seconds per measurement")
    p.add_argument("--time-budget", type=float, default=None,
                   help="stop measuring after this many seconds")
    p.add_argument("--max-workers", type=int, default=None)
    p.add_argument("--quick", action="store_true",
                   help="short measurements, two repeats, a few seconds in all")
    args = p.parse_args(argv)
    repeats = args.repeats or (2 if args.quick else 3)
    seconds = args.seconds or (0.15 if args.quick else (1.0 if args.torch else 0.4))
    time_budget = args.time_budget or (6.0 if args.quick else None)
    batch_sizes = [int(x) for x in args.batch_sizes.split(",")] if args.batch_sizes else None
    try:
        if args.torch:
            dataset, kwargs = _load_torch_spec(args.torch)
            kwargs.setdefault("batch_size", args.batch_size)
            knobs = default_knobs(args.max_workers, torch=True)
            bar = ProgressBar(_expected_runs(knobs, repeats), time_budget)
            print(f"tuning torch.utils.data.DataLoader over {args.torch}", file=sys.stderr)
            result = tune_torch(dataset, kwargs, memory_budget=args.memory_budget,
                                repeats=repeats, seconds=seconds, time_budget=time_budget,
                                max_workers=args.max_workers, progress=bar)
        else:
            dataset = _open_dataset(args.dataset, args.image, args.label)
            gpu = _torch_cuda()
            knobs = default_knobs(args.max_workers, batch_sizes, args.batch_size, gpu=gpu)
            bar = ProgressBar(_expected_runs(knobs, repeats), time_budget)
            print(f"tuning stoker.DataLoader over {args.dataset or 'the built-in sample data'} "
                  f"({len(dataset)} samples"
                  f"{'; batches delivered into GPU memory' if gpu else ''})", file=sys.stderr)
            result = tune_loader(dataset, batch_size=args.batch_size, batch_sizes=batch_sizes,
                                 memory_budget=args.memory_budget, repeats=repeats,
                                 seconds=seconds, time_budget=time_budget,
                                 max_workers=args.max_workers, knobs=knobs, progress=bar,
                                 min_batches=2, gpu=gpu)
        bar.close()
    except (OSError, ValueError, RuntimeError, ImportError) as e:
        print(f"stoker tune: error: {e}", file=sys.stderr)
        return 2
    print_table(result)
    rec = ", ".join(f"{k}={v!r}" for k, v in result["recommended"].items())
    print(f"recommended: {rec}  ({result['samples_per_s']:.0f} samples/s, spread "
          f"{result['noise']:.1%}; {len({tuple(sorted((k, v) for k, v in pt.items() if k not in ('samples_per_s', 'repeat', 'seconds', 'memory_estimate'))) for pt in result['points']})} "
          f"configurations, {len(result['points'])} runs, {result['measuring_seconds']:.1f} s "
          f"measuring, {result['stopped']})")
    if "network" in result:
        n = result["network"]
        rate = f"{n['bytes_per_second'] / 1e6:.1f} MB/s" if n["bytes_per_second"] else "n/a"
        hits = f"{n['cache_hits'] / n['first_reads']:.0%}" if n["first_reads"] else "n/a"
        print(f"network: {n['bytes_fetched'] / 1e6:.1f} MB fetched at {rate}, "
              f"{n['requests']} requests, cache hit rate {hits} of {n['first_reads']} shard "
              f"reads; workers waited {n['wait_seconds']:.1f} s for shards")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        print(f"wrote {args.json}")
    if args.plot:
        write_plot(result, args.plot)
        print(f"wrote {args.plot}")
    return 0
