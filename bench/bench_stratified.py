#!/usr/bin/env python3
"""Class-balanced epochs: the cost of the stratified order, and what it does to batches.

What is measured
----------------
1. Cost per index. The engine's own epoch order (``Engine.epoch_indices``: the indices a loader
   reads, computed as its workers compute them, without reading samples) for the plain shuffle
   (``shuffle=True``: a keyed Feistel permutation) and for ``shuffle="stratified"`` (and
   ``class_weights="balanced"``), over the same labels, batch size and seed. Time of a whole
   epoch (making the epoch's order included) divided by its indices, thread CPU time, the
   minimum of interleaved repeats. Label distributions: the issue's two classes (95% / 5%,
   1M samples, batch 32), ImageNet-like (1,000 classes of 1,281, batch 256) and a long tail
   (P(label > k) ~ k^-0.3, capped at 10,000: ~9,700 classes, most of a few samples, 1M samples,
   batch 256). Target: stratified <= 2x the plain shuffle's cost per index. (The plain
   shuffle's cost depends on n: its Feistel domain is the smallest power of 4 above n, so it
   walks ~1.05 times at n = 1M but ~3.3 times at 1.28M.)
2. Loader throughput. The same three label sets as rows (int64 labels + a 64-byte feature
   row) through stoker.DataLoader, shuffle=True against "stratified", num_workers="auto":
   samples/s, median of interleaved repeats. The order's cost inside a real loader.
3. The issue's scenario: two classes, 95% / 5%, batch 32, drop_last=True, N = 10,000, over 20
   epochs. torch's RandomSampler + BatchSampler (what DataLoader(shuffle=True) does) against
   Stoker's shuffle="stratified": the rare class's count per batch (min, max, sd, batches
   without it, batches within one of 1.6), and its share in each half of an epoch.
4. Oversampling: torch's WeightedRandomSampler (weights 1 / class count, replacement=True,
   num_samples=N) against Stoker's class_weights="balanced", over 5 epochs: the frequent
   class's samples never drawn, the rare class's most repeated sample, and the rare class per
   batch.

Usage:
    python bench/bench_stratified.py             # full run (about two minutes)
    python bench/bench_stratified.py --quick     # smoke test (a few seconds, smaller data)
    python bench/bench_stratified.py --json out.json
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch
import torch.utils.data

import stoker
from stoker import _native

from harness import write_json  # bench/harness.py, beside this file

COST_TARGET = 2.0


def label_sets(quick):
    rng = np.random.default_rng(0)
    scale = 10 if quick else 1
    two = np.zeros(1_000_000 // scale, dtype=np.int64)
    two[rng.choice(len(two), len(two) // 20, replace=False)] = 1
    imagenet = np.repeat(np.arange(1000), 1281 // scale).astype(np.int64)
    rng.shuffle(imagenet)
    n = 1_000_000 // scale
    u = rng.random(n)
    tail = np.minimum((1.0 / (1.0 - u)) ** (1 / 0.3), 10_000).astype(np.int64)  # P(>k) ~ k^-0.3
    return [("2 classes 95/5", two, 32), ("ImageNet-like 1000", imagenet, 256),
            ("long tail 10k", tail, 256)]


def native_loader(labels, batch_size, shuffle, groups=None, weights=()):
    source = _native.sources.ArraySource([labels], ["label"])
    return _native.engine.Engine(source, batch_size, shuffle, 0, True, 0, -1, "off", 0, 0, 1, "raise",
                                 classes=groups, class_weights=list(weights))


def cost_per_index(quick):
    reps = 3 if quick else 15
    rows = []
    for name, labels, batch in label_sets(quick):
        groups = _native.engine.ClassGroups(labels)
        loaders = {
            "plain": native_loader(labels, batch, True),
            "stratified": native_loader(labels, batch, True, groups),
            "balanced": native_loader(labels, batch, True, groups, [1.0] * groups.num_classes),
        }
        best = {k: float("inf") for k in loaders}
        for rep in range(reps):
            for key, loader in loaders.items():  # interleaved: drift hits every order alike
                t0 = time.thread_time()
                indices = loader.epoch_indices(rep)
                best[key] = min(best[key], (time.thread_time() - t0) / len(indices) * 1e9)
        rows.append({"labels": name, "classes": groups.num_classes, "samples": len(labels),
                     "batch_size": batch, "plain_ns": best["plain"],
                     "stratified_ns": best["stratified"], "balanced_ns": best["balanced"],
                     "order_bytes_per_sample": groups.memory_bytes / len(labels)})
    return rows


def loader_throughput(quick):
    reps = 1 if quick else 5
    budget = 0.5 if quick else 3.0
    rows = []
    for name, labels, batch in label_sets(quick):
        features = np.zeros((len(labels), 8), dtype=np.int64)
        ds = stoker.ArrayDataset(features, labels)
        rates = {"shuffle=True": [], 'shuffle="stratified"': []}
        for rep in range(reps):
            for key in rates:
                loader = stoker.DataLoader(ds, batch_size=batch, output="numpy",
                                           shuffle="stratified" if "strat" in key else True)
                samples, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < budget:
                    for x, _ in loader:
                        samples += len(x)
                        if time.perf_counter() - t0 >= budget:
                            break
                rates[key].append(samples / (time.perf_counter() - t0))
        rows.append({"labels": name, "batch_size": batch,
                     **{k: statistics.median(v) for k, v in rates.items()}})
    return rows


def spread(counts, expected):
    counts = np.asarray(counts)
    return {"min": int(counts.min()), "max": int(counts.max()), "mean": float(counts.mean()),
            "sd": float(counts.std()), "without": float(np.mean(counts == 0)),
            "within_one": float(np.mean(np.abs(counts - expected) < 1))}


def scenario(quick):
    n, batch, epochs = 10_000, 32, 5 if quick else 20
    labels = np.zeros(n, dtype=np.int64)
    labels[np.random.default_rng(1).choice(n, n // 20, replace=False)] = 1
    expected = batch * 0.05
    g = torch.Generator().manual_seed(0)
    sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(range(n), generator=g),
                                            batch, drop_last=True)
    loader = stoker.DataLoader(stoker.ArrayDataset(np.arange(n), labels), batch_size=batch,
                               shuffle="stratified", drop_last=True, output="numpy")
    torch_counts, stoker_counts, halves = [], [], {"torch": [], "stoker": []}
    for _ in range(epochs):
        t = [int(labels[b].sum()) for b in sampler]
        s = [int(y.sum()) for _, y in loader]
        torch_counts += t
        stoker_counts += s
        for key, c in (("torch", t), ("stoker", s)):  # the rare share in each half of the epoch
            half = len(c) // 2
            halves[key].append((sum(c[:half]) / (half * batch), sum(c[half:]) /
                                ((len(c) - half) * batch)))
    out = {"samples": n, "batch_size": batch, "epochs": epochs, "expected": expected,
           "torch RandomSampler": spread(torch_counts, expected),
           'stoker shuffle="stratified"': spread(stoker_counts, expected)}
    for key, name in (("torch", "torch RandomSampler"), ("stoker", 'stoker shuffle="stratified"')):
        gaps = [abs(a - b) for a, b in halves[key]]
        out[name]["half_epoch_share_gap"] = max(gaps)
    return out


def oversampling(quick):
    n, batch, epochs = 10_000, 32, 3 if quick else 5
    labels = np.zeros(n, dtype=np.int64)
    labels[np.random.default_rng(2).choice(n, n // 20, replace=False)] = 1
    counts = np.bincount(labels)
    g = torch.Generator().manual_seed(0)
    weighted = torch.utils.data.WeightedRandomSampler(
        torch.as_tensor(1.0 / counts[labels], dtype=torch.float64), n, replacement=True,
        generator=g)
    torch_batches = torch.utils.data.BatchSampler(weighted, batch, drop_last=True)
    loader = stoker.DataLoader(stoker.ArrayDataset(np.arange(n), labels), batch_size=batch,
                               shuffle=True, class_weights="balanced", drop_last=True,
                               output="numpy")
    out = {}
    for name, epochs_of in (("torch WeightedRandomSampler", lambda: [
            [list(b) for b in torch_batches] for _ in range(epochs)]),
            ('stoker class_weights="balanced"', lambda: [
                [x.tolist() for x, _ in loader] for _ in range(epochs)])):
        drawn = np.zeros(n, dtype=np.int64)
        rare_per_batch, unseen_first = [], None
        for e, batches in enumerate(epochs_of()):
            for b in batches:
                np.add.at(drawn, b, 1)
                rare_per_batch.append(int(labels[b].sum()))
            if e == 0:
                unseen_first = int(np.sum(drawn[labels == 0] == 0))
        rare = drawn[labels == 1]
        out[name] = {"frequent_unseen_after_1_epoch": unseen_first,
                     f"frequent_unseen_after_{epochs}_epochs": int(np.sum(drawn[labels == 0] == 0)),
                     "rare_draws_min": int(rare.min()), "rare_draws_max": int(rare.max()),
                     "rare_per_batch": spread(rare_per_batch, batch / 2)}
    out["epochs"] = epochs
    out["frequent_samples"] = int(counts[0])
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: smaller data, fewer reps")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    print(f"stoker {stoker.__version__}, torch {torch.__version__}, numpy {np.__version__}, "
          f"python {platform.python_version()}; {stoker.usable_cores()} usable cores; "
          f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results = {}

    print("\n== 1. Cost per index of the epoch order (thread CPU time, min of interleaved reps)")
    results["cost"] = cost_per_index(args.quick)
    print(f"   {'labels':<20} {'classes':>7} {'samples':>10} {'batch':>5}  {'plain':>8} "
          f"{'stratified':>10} {'ratio':>6}  {'balanced':>8} {'ratio':>6}  grouping")
    for r in results["cost"]:
        ratio = r["stratified_ns"] / r["plain_ns"]
        flag = "" if ratio <= COST_TARGET else f"  (> {COST_TARGET:g}x target)"
        print(f"   {r['labels']:<20} {r['classes']:>7,} {r['samples']:>10,} {r['batch_size']:>5}  "
              f"{r['plain_ns']:>6.1f}ns {r['stratified_ns']:>8.1f}ns {ratio:>5.2f}x  "
              f"{r['balanced_ns']:>6.1f}ns {r['balanced_ns'] / r['plain_ns']:>5.2f}x  "
              f"{r['order_bytes_per_sample']:.1f} B/sample{flag}")

    print('\n== 2. Loader throughput, rows of 64 B + label, shuffle=True vs "stratified" '
          '(samples/s, median)')
    results["loader"] = loader_throughput(args.quick)
    for r in results["loader"]:
        plain, strat = r["shuffle=True"], r['shuffle="stratified"']
        print(f"   {r['labels']:<20} batch {r['batch_size']:>3}: shuffle=True {plain:>12,.0f}   "
              f'"stratified" {strat:>12,.0f}   {strat / plain:.2f}x')

    print("\n== 3. The issue's scenario: 2 classes 95% / 5%, batch 32, drop_last=True")
    results["scenario"] = sc = scenario(args.quick)
    print(f"   N={sc['samples']:,}, {sc['epochs']} epochs; rare class per batch, expected "
          f"{sc['expected']:.2f}")
    print(f"   {'order':<30} {'min':>4} {'max':>4} {'sd':>5} {'without it':>11} "
          f"{'within 1':>9} {'half-epoch share gap':>21}")
    for name in ("torch RandomSampler", 'stoker shuffle="stratified"'):
        s = sc[name]
        print(f"   {name:<30} {s['min']:>4} {s['max']:>4} {s['sd']:>5.2f} {s['without']:>11.1%} "
              f"{s['within_one']:>9.1%} {s['half_epoch_share_gap']:>20.2%}")

    print("\n== 4. Oversampling the rare class (95% / 5%, equal class shares)")
    results["oversampling"] = ov = oversampling(args.quick)
    e = ov["epochs"]
    print(f"   {'sampler':<32} {'frequent unseen':>16} {'after ' + str(e) + ' epochs':>15} "
          f"{'rare draws min-max':>19} {'rare per batch sd':>18}")
    for name in ("torch WeightedRandomSampler", 'stoker class_weights="balanced"'):
        s = ov[name]
        unseen = s["frequent_unseen_after_1_epoch"]
        print(f"   {name:<32} {unseen:>9,} of {ov['frequent_samples']:,}"
              f" {s[f'frequent_unseen_after_{e}_epochs']:>11,} "
              f"{s['rare_draws_min']:>12} - {s['rare_draws_max']:<4} "
              f"{s['rare_per_batch']['sd']:>18.2f}")
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    import record  # bench/record.py: this output also goes to bench/results/
    sys.exit(record.run(main))
