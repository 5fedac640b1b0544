"""``stoker stats``: per-channel mean and std of an image dataset, or (``--classes``) its class
counts and how batches would mix them under each shuffle mode.

``channel_stats(dataset)`` decodes every image at full size in Stoker's worker threads; each
sample contributes the sums and sums of squares of its R, G, B values (scaled to [0, 1]) and its
pixel count, and the batches are summed in float64. The result is ready for
``transforms.Normalize(mean, std)``.

``class_mix(labels, batch_size, ...)`` counts each class in every batch of the engine's own
epoch order (the indices the loader would read; nothing is decoded) for shuffle=False, True and
"stratified" (and class_weights, when given), so that a user sees before training whether a rare
class vanishes from batches.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

from .. import _native
from .. import balance
from ..sources.base import StokerDataset
from ..sources.images import HoldsImages
from ..loader import DataLoader
from .datasets import add_dataset_arguments, open_dataset, where as describe_where

__all__ = ["channel_stats", "class_mix", "main"]


class _StatsDataset(StokerDataset):
    """Every image of a dataset of images, read as its channel sums (no transform)."""

    def __init__(self, dataset):
        self._source = _native.sources.ChannelStatsSource(dataset._files, dataset.max_pixels)

    def __len__(self):
        return len(self._source)


def channel_stats(dataset, num_workers="auto", batch_size=64):
    """``{"mean": [r, g, b], "std": [r, g, b], "images": n, "pixels": p}`` over every image of
    ``dataset`` (an :class:`ImageFolder` or :class:`TarShards`; its transform is ignored).
    Pixels are weighted equally, so larger images count more, as in a pixel-level statistic."""
    if not isinstance(dataset, HoldsImages) or dataset._images is None:
        raise ValueError(
            f"channel_stats needs a stoker.ImageFolder, TarShards or a TableDataset with an "
            f"image column (--image COLUMN), got {type(dataset).__name__}"
            + (" of columns" if isinstance(dataset, HoldsImages) else ""))
    if len(dataset) == 0:
        raise ValueError("channel_stats needs a dataset with at least one image")
    loader = DataLoader(_StatsDataset(dataset), batch_size=batch_size, num_workers=num_workers,
                        output="numpy")
    total = np.zeros(7, dtype=np.float64)
    images = 0
    for batch in loader:
        total += batch.sum(axis=0, dtype=np.float64)
        images += len(batch)
    pixels = total[6]
    mean = total[0:3] / pixels
    var = np.maximum(total[3:6] / pixels - mean * mean, 0.0)
    return {"mean": [float(v) for v in mean], "std": [float(math.sqrt(v)) for v in var],
            "images": images, "pixels": int(pixels)}


def _mix_of_mode(labels, classes, shares, batch_size, drop_last, world_size, seed, epochs,
                 shuffle, weights):
    """Per-batch counts of every class, summarized, over `epochs` epochs of every rank."""
    source = _native.sources.ArraySource([np.arange(len(labels), dtype=np.int64)], ["i"])
    groups = _native.engine.ClassGroups(labels) if shuffle == "stratified" or weights else None
    class_index = np.searchsorted(classes, labels)
    expected = batch_size * np.asarray(shares)
    per_class = {"min": None, "max": None, "sum": 0.0, "sum_sq": 0.0, "without": 0}
    batches = within = 0
    worst = 0.0
    for rank in range(world_size):
        engine = _native.engine.Engine(source, batch_size, shuffle is not False, seed, drop_last,
                                       0, -1, "off", 0, rank, world_size, "raise",
                                       classes=groups, class_weights=weights)
        if len(engine) == 0:
            continue
        for epoch in range(epochs):
            order = engine.epoch_indices(epoch)
            full = len(engine) if len(order) == len(engine) * batch_size else len(engine) - 1
            # Full batches only: a short last batch is judged against a smaller expectation.
            rows = class_index[order[:full * batch_size]].reshape(full, batch_size)
            counts = np.zeros((full, len(classes)), dtype=np.int64)
            np.add.at(counts, (np.repeat(np.arange(full), batch_size), rows.ravel()), 1)
            deviation = np.abs(counts - expected)
            worst = max(worst, float(deviation.max(initial=0.0)))
            within += int((deviation < 1 + 1e-9).all(axis=1).sum())
            batches += full
            lo, hi = counts.min(axis=0), counts.max(axis=0)
            per_class["min"] = lo if per_class["min"] is None else np.minimum(per_class["min"], lo)
            per_class["max"] = hi if per_class["max"] is None else np.maximum(per_class["max"], hi)
            per_class["sum"] = per_class["sum"] + counts.sum(axis=0)
            per_class["sum_sq"] = per_class["sum_sq"] + (counts.astype(np.float64) ** 2).sum(axis=0)
            per_class["without"] = per_class["without"] + (counts == 0).sum(axis=0)
    if batches == 0:
        return None
    mean = per_class["sum"] / batches
    sd = np.sqrt(np.maximum(per_class["sum_sq"] / batches - mean ** 2, 0.0))
    return {"batches": batches, "all_within_one": within, "worst_deviation": worst,
            "per_class": [{"min": int(a), "max": int(b), "mean": float(m), "sd": float(d),
                           "batches_without": int(w), "expected": float(e)}
                          for a, b, m, d, w, e in zip(per_class["min"], per_class["max"], mean,
                                                      sd, per_class["without"], expected)]}


def class_mix(labels, batch_size=32, drop_last=True, world_size=1, seed=0, epochs=1,
              class_weights=None):
    """How the batches of each shuffle mode hold each class.

    ``labels``: the class of every sample. Returns ``{"classes": [{"label", "samples",
    "share"}], "modes": {name: summary}}`` with modes "shuffle=False", "shuffle=True",
    'shuffle="stratified"' and, with ``class_weights``, "class_weights=...". A summary covers
    the full batches of ``epochs`` epochs of every rank: ``batches``, ``all_within_one`` (batches
    where every class is within one sample of batch_size * share), ``worst_deviation`` and, per
    class, min / max / mean / sd of its count in a batch, ``batches_without`` it and the
    ``expected`` count."""
    labels = np.ascontiguousarray(np.asarray(labels), dtype=np.int64)
    if labels.ndim != 1 or len(labels) == 0:
        raise ValueError("class_mix needs one label a sample, and at least one sample")
    classes, counts = np.unique(labels, return_counts=True)
    shares = counts / len(labels)
    out = {"samples": int(len(labels)), "batch_size": batch_size, "drop_last": drop_last,
           "world_size": world_size, "seed": seed, "epochs": epochs,
           "classes": [{"label": int(c), "samples": int(n), "share": float(s)}
                       for c, n, s in zip(classes, counts, shares)],
           "modes": {}}
    modes = [("shuffle=False", False, [], shares), ("shuffle=True", True, [], shares),
             ('shuffle="stratified"', "stratified", [], shares)]
    if class_weights is not None:
        weights = balance.weights_for(_native.engine.ClassGroups(labels), class_weights)
        total = sum(weights)
        name = (f"class_weights={class_weights!r}" if isinstance(class_weights, str)
                else "class_weights")
        modes.append((name, True, weights, [w / total for w in weights]))
    for name, shuffle, weights, mode_shares in modes:
        out["modes"][name] = _mix_of_mode(labels, classes, mode_shares, batch_size, drop_last,
                                          world_size, seed, epochs, shuffle, weights)
    return out


def _print_class_mix(mix, names, where):
    classes = mix["classes"]
    print(f"{where}: {len(classes)} classes, {mix['samples']:,} samples")
    order = sorted(range(len(classes)), key=lambda c: classes[c]["samples"])
    shown = order if len(order) <= 12 else order[:8] + order[-4:]
    width = max([len("class")] + [len(names(classes[c]["label"])) for c in shown])
    print(f"  {'class':<{width}}  {'samples':>10}  {'share':>7}  {'per batch':>9}")
    for k, c in enumerate(shown):
        if len(order) > 12 and k == 8:
            print(f"  {'...':<{width}}  ({len(order) - 12} classes in between)")
        cl = classes[c]
        print(f"  {names(cl['label']):<{width}}  {cl['samples']:>10,}  {cl['share']:>7.2%}  "
              f"{mix['batch_size'] * cl['share']:>9.2f}")
    rare = order[0]
    some = next(iter(v for v in mix["modes"].values() if v), None)
    if some is None:
        print(f"\nNo full batch of {mix['batch_size']}: nothing to mix.")
        return
    print(f"\nBatches of {mix['batch_size']} ({'drop_last, ' if mix['drop_last'] else ''}"
          f"world_size {mix['world_size']}, seed {mix['seed']}, {mix['epochs']} epoch(s), "
          f"{some['batches']:,} full batches): the rarest class, "
          f"{names(classes[rare]['label'])}, per batch (expected "
          f"{some['per_class'][rare]['expected']:.2f} without weights)")
    mode_width = max(len(m) for m in mix["modes"])
    print(f"  {'order':<{mode_width}}  {'min':>4} {'max':>4} {'mean':>6} {'sd':>5}  "
          f"{'batches without it':>19}  {'every class within 1':>20}  {'worst':>6}")
    for mode, m in mix["modes"].items():
        if m is None:
            continue
        r = m["per_class"][rare]
        without = f"{r['batches_without']:,} ({r['batches_without'] / m['batches']:.1%})"
        within = f"{m['all_within_one'] / m['batches']:.1%}"
        print(f"  {mode:<{mode_width}}  {r['min']:>4} {r['max']:>4} {r['mean']:>6.2f} "
              f"{r['sd']:>5.2f}  {without:>19}  {within:>20}  {m['worst_deviation']:>6.2f}")
    print("  (every class within 1: the batches in which every class is within one sample of "
          "batch_size x its share;\n   worst: the largest distance from it, any class, any "
          "batch)")


def _classes_main(p, args):
    try:
        if args.dataset is not None and args.dataset.endswith(".npy"):
            labels = np.load(args.dataset, mmap_mode="r")
            where, names = args.dataset, str
        else:
            dataset = open_dataset(args.dataset, image=args.image, label=args.label)
            labels = balance.labels_of(dataset)
            where = f"{type(dataset).__name__} {describe_where(dataset)}"
            classes = getattr(dataset, "classes", None)
            names = (lambda label: classes[label]) if classes else str
        weights = args.class_weights
        if weights is not None and weights != "balanced":
            weights = [float(w) for w in weights.split(",")]
        mix = class_mix(labels, batch_size=args.batch_size, drop_last=not args.keep_last,
                        world_size=args.world_size, seed=args.seed, epochs=args.epochs,
                        class_weights=weights)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"stoker stats: error: {e}", file=sys.stderr)
        return 2
    _print_class_mix(mix, names, where)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(mix, f, indent=2)
            f.write("\n")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="stoker stats",
        description="Per-channel mean and std of an image dataset (for Normalize); with "
                    "--classes, its class counts and how batches would mix them under each "
                    "shuffle mode.")
    add_dataset_arguments(p, help="an ImageFolder root, tar shards (a path or glob such as "
                             "'shards/train-*.tar'), or a table: a .parquet/.arrow file, glob or "
                             "directory of them with --image (default: the built-in sample "
                             "data); with --classes also a .npy file of labels, one a sample")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON to PATH")
    p.add_argument("--num-workers", default="auto",
                   help="decoding threads (default: auto)")
    g = p.add_argument_group("--classes")
    g.add_argument("--classes", action="store_true",
                   help="class counts and per-batch class mix under shuffle=False, True, "
                        "\"stratified\" (reads labels only, decodes nothing)")
    g.add_argument("--batch-size", type=int, default=32, help="(default: 32)")
    g.add_argument("--keep-last", action="store_true",
                   help="drop_last=False (default: drop_last=True)")
    g.add_argument("--world-size", type=int, default=1, help="ranks (default: 1)")
    g.add_argument("--seed", type=int, default=0, help="(default: 0)")
    g.add_argument("--epochs", type=int, default=1, help="epochs to count (default: 1)")
    g.add_argument("--class-weights", metavar="W",
                   help="also show class_weights: 'balanced', or weights by label, "
                        "comma-separated (e.g. 1,1,4)")
    args = p.parse_args(argv)
    if args.classes:
        for name in ("batch_size", "world_size", "epochs"):
            if getattr(args, name) < 1:
                p.error(f"--{name.replace('_', '-')} must be at least 1")
        return _classes_main(p, args)
    workers = args.num_workers
    if workers != "auto":
        try:
            workers = int(workers)
        except ValueError:
            p.error(f"--num-workers must be 'auto' or an integer, got {workers!r}")
    try:
        dataset = open_dataset(args.dataset, image=args.image, label=args.label)
        result = channel_stats(dataset, num_workers=workers)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"stoker stats: error: {e}", file=sys.stderr)
        return 2
    where = describe_where(dataset)
    mean = ", ".join(f"{v:.4f}" for v in result["mean"])
    std = ", ".join(f"{v:.4f}" for v in result["std"])
    print(f"{type(dataset).__name__} {where}: {result['images']} images, "
          f"{result['pixels'] / 1e6:.1f} megapixels")
    print(f"mean = [{mean}]")
    print(f"std  = [{std}]")
    print(f"Normalize(mean=[{mean}], std=[{std}])")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0
