"""stoker.DataLoader vs torch.utils.data.DataLoader on Python datasets, side by side.

Two datasets: "heavy" (PIL JPEG decode + NumPy augmentation, CPU-bound) and "light" (returns
small tensors). For each: both loaders at equal num_workers, each at its best num_workers, and
Stoker's default (num_workers="auto"). Reports samples/s, time to first batch and peak RSS summed
over the main process and its workers (polled every 10 ms from the parent: harness.py). Each
measurement runs in a fresh subprocess; every configuration runs --repeat times, the rounds
interleaved (so a slow spell of this shared machine hits all of them alike), and the median of
each figure is shown.

    python bench/bench_python_datasets.py [--repeat 3] [--datasets heavy,light]
        [--baseline OTHER_VENV/bin/python]

``--baseline``: also runs Stoker as another interpreter has it installed (e.g. a checkout of an
earlier commit with its own ``make install``), interleaved with the rest, and compares this
Stoker with it at equal workers and at each one's best ("base" rows).
"""

import argparse
import gc
import io
import json
import statistics
import os
import sys
import time

import numpy as np

from harness import median_of, run_measured

HERE = os.path.abspath(__file__)


def make_datasets():
    import torch
    from PIL import Image
    from torch.utils.data import Dataset

    rng = np.random.default_rng(0)
    jpegs = []
    for _ in range(16):
        img = Image.fromarray(rng.integers(0, 255, (256, 256, 3), dtype=np.uint8).repeat(
            1, axis=0))
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        jpegs.append(buf.getvalue())

    class Heavy(Dataset):
        def __len__(self):
            return 1536

        def __getitem__(self, i):
            img = np.asarray(Image.open(io.BytesIO(jpegs[i % len(jpegs)])).convert("RGB"))
            y, x = np.random.randint(0, 32, 2)
            crop = img[y:y + 224, x:x + 224].astype(np.float32) / 255.0
            if np.random.rand() < 0.5:
                crop = crop[:, ::-1]
            crop = (crop - 0.45) / 0.25
            return torch.from_numpy(np.ascontiguousarray(crop.transpose(2, 0, 1))), i % 1000

    class Light(Dataset):
        def __len__(self):
            return 100_000

        def __getitem__(self, i):
            return torch.full((16,), float(i)), i

    return {"heavy": (Heavy(), 32), "light": (Light(), 256)}


def measure_steady(kind, which, workers, epochs):
    """Samples/s of each epoch after the first, workers kept between epochs."""
    import torch

    import stoker
    ds, bs = make_datasets()[which]
    if kind == "torch":
        loader = torch.utils.data.DataLoader(ds, batch_size=bs, shuffle=True,
                                             num_workers=workers,
                                             persistent_workers=workers > 0)
    else:
        loader = stoker.DataLoader(ds, batch_size=bs, shuffle=True, num_workers=workers,
                                   worker_type="process", persistent_workers=True)
    rates = []
    for _ in range(epochs + 1):
        start, n = time.perf_counter(), 0
        for batch in loader:
            n += len(batch[1])
        rates.append(n / (time.perf_counter() - start))
    return {"samples_s": rates[1:]}


def measure(kind, which, workers):  # workers: an int, or "auto" (stoker's default)
    """One run in this process: returns samples/s and first-batch seconds (run_child adds the
    peak RSS, polled from the parent)."""
    import torch

    import stoker
    datasets = make_datasets()
    ds, bs = datasets[which]
    # Every loader starts from the same collector state. A full collection of the heap torch's
    # import leaves takes ~100 ms here; where the next one falls depends on what was imported
    # before, and it landed inside the light dataset's 0.2 s in-process epoch for one Stoker
    # build and not for another (a 0.65x "regression" that gc.collect() here made vanish).
    gc.collect()
    start = time.perf_counter()
    if kind == "torch":
        loader = torch.utils.data.DataLoader(ds, batch_size=bs, shuffle=True,
                                             num_workers=workers)
    else:
        loader = stoker.DataLoader(ds, batch_size=bs, shuffle=True, num_workers=workers,
                                   worker_type="process", seed_samples=kind == "stoker")
    first = None
    n = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - start
        n += len(batch[1])
    elapsed = time.perf_counter() - start
    return {"samples_s": n / elapsed, "first_s": first}


def run_child(kind, which, workers, steady=0, python=None):
    return run_measured([python or sys.executable, HERE, "--child", kind, which, str(workers),
                         "--steady", str(steady)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=3)
    ap.add_argument("--workers", default="0,1,2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--datasets", default="heavy,light")
    ap.add_argument("--steady", type=int, default=5,
                    help="epochs after the first for the steady-state line (0: none)")
    ap.add_argument("--baseline", default=None,
                    help="python of another Stoker install to compare with (rows 'base')")
    args = ap.parse_args()
    if args.child:
        kind, which, workers = args.child
        workers = workers if workers == "auto" else int(workers)
        if args.steady and kind.startswith("steady-"):
            print(json.dumps(measure_steady(kind[7:], which, workers, args.steady)))
        else:
            print(json.dumps(measure(kind, which, workers)))
        return
    counts = [int(w) for w in args.workers.split(",")]
    print(f"cores: {os.cpu_count()}, python {sys.version.split()[0]}, "
          f"median of {args.repeat} interleaved runs")
    for which in args.datasets.split(","):
        print(f"\n== {which} dataset")
        print("(noseed: stoker with seed_samples=False)")
        print(f"{'workers':>7} {'loader':>7} {'samples/s':>10} {'first batch':>12} "
              f"{'peak RSS':>10}")
        kinds = ("torch", "stoker", "noseed") + (("base",) if args.baseline else ())
        runs = [(w, kind) for w in counts for kind in kinds]
        runs.append(("auto", "stoker"))
        if args.baseline:
            runs.append(("auto", "base"))

        def child(kind, w):
            if kind == "base":
                return run_child("stoker", which, w, python=args.baseline)
            return run_child(kind, which, w)
        rounds = [{(kind, w): child(kind, w) for w, kind in runs} for _ in range(args.repeat)]
        results = {key: median_of([r[key] for r in rounds]) for key in rounds[0]}
        for w, kind in runs:
            r = results[(kind, w)]
            print(f"{w:>7} {kind:>7} {r['samples_s']:>10.0f} {r['first_s'] * 1e3:>10.0f}ms "
                  f"{r['peak_rss'] / 2**20:>8.0f}MiB", flush=True)
        for w in counts:
            t, s = results[("torch", w)], results[("stoker", w)]
            print(f"equal workers={w}: throughput {s['samples_s'] / t['samples_s']:.2f}x, "
                  f"first batch {s['first_s'] / t['first_s']:.2f}x, "
                  f"peak RSS {s['peak_rss'] / t['peak_rss']:.2f}x")
        bt = max(counts, key=lambda w: results[("torch", w)]["samples_s"])
        for kind in ("stoker", "noseed"):
            options = counts + (["auto"] if kind == "stoker" else [])
            bs = max(options, key=lambda w: results[(kind, w)]["samples_s"])
            t, s = results[("torch", bt)], results[(kind, bs)]
            print(f"best vs best (torch {bt} workers, {kind} {bs}): throughput "
                  f"{s['samples_s'] / t['samples_s']:.2f}x, first batch "
                  f"{s['first_s'] / t['first_s']:.2f}x, peak RSS "
                  f"{s['peak_rss'] / t['peak_rss']:.2f}x")
        if args.baseline:  # this Stoker against the baseline install
            for w in counts + ["auto"]:
                b, s = results[("base", w)], results[("stoker", w)]
                print(f"stoker vs base, workers={w}: throughput "
                      f"{s['samples_s'] / b['samples_s']:.2f}x, first batch "
                      f"{s['first_s'] / b['first_s']:.2f}x, peak RSS "
                      f"{s['peak_rss'] / b['peak_rss']:.2f}x")
            options = counts + ["auto"]
            bb = max(options, key=lambda w: results[("base", w)]["samples_s"])
            bs = max(options, key=lambda w: results[("stoker", w)]["samples_s"])
            b, s = results[("base", bb)], results[("stoker", bs)]
            print(f"stoker vs base, each at its best (base {bb}, stoker {bs}): throughput "
                  f"{s['samples_s'] / b['samples_s']:.2f}x, first batch "
                  f"{s['first_s'] / b['first_s']:.2f}x, peak RSS "
                  f"{s['peak_rss'] / b['peak_rss']:.2f}x")
        s = results[("stoker", "auto")]
        print(f"stoker default (auto) vs torch best ({bt} workers): throughput "
              f"{s['samples_s'] / t['samples_s']:.2f}x, first batch "
              f"{s['first_s'] / t['first_s']:.2f}x, peak RSS {s['peak_rss'] / t['peak_rss']:.2f}x")
        if args.steady:  # epochs 2.. of one loader: no start-up (fork, first faults) in them
            tr = run_child("steady-torch", which, bt, args.steady)["samples_s"]
            sr = run_child("steady-stoker", which, "auto", args.steady)["samples_s"]
            t_med, s_med = statistics.median(tr), statistics.median(sr)
            print(f"steady state, median of {args.steady} epochs after the first (persistent "
                  f"workers): torch {bt} workers {t_med:.0f}/s, stoker auto {s_med:.0f}/s: "
                  f"{s_med / t_med:.2f}x")


if __name__ == "__main__":
    import record  # bench/record.py: this output also goes to bench/results/
    sys.exit(record.run(main))
