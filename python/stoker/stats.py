"""Per-channel mean and std of an image dataset, in one parallel pass of the engine.

``channel_stats(dataset)`` decodes every image at full size in Stoker's worker threads; each
sample contributes the sums and sums of squares of its R, G, B values (scaled to [0, 1]) and its
pixel count, and the batches are summed in float64. The result is ready for
``transforms.Normalize(mean, std)``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

from . import _native
from .images import ImageFolder, TarShards
from .loader import DataLoader

__all__ = ["channel_stats", "main"]


class _StatsDataset:
    def __init__(self, dataset):
        self._source = _native.ChannelStatsSource(dataset._files, dataset.max_pixels)

    def __len__(self):
        return len(self._source)


def channel_stats(dataset, num_workers="auto", batch_size=64):
    """``{"mean": [r, g, b], "std": [r, g, b], "images": n, "pixels": p}`` over every image of
    ``dataset`` (an :class:`ImageFolder` or :class:`TarShards`; its transform is ignored).
    Pixels are weighted equally, so larger images count more, as in a pixel-level statistic."""
    if not isinstance(dataset, (ImageFolder, TarShards)):
        raise ValueError(
            f"channel_stats needs a stoker.ImageFolder or stoker.TarShards, got "
            f"{type(dataset).__name__}")
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


def _open_dataset(spec):
    if spec is None:
        from .sample_data import default_sample_root, make_sample
        make_sample()
        return ImageFolder(os.path.join(default_sample_root(), "train"))
    if os.path.isdir(spec):
        return ImageFolder(spec)
    return TarShards(spec)


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="stoker stats",
        description="Per-channel mean and std of an image dataset (for Normalize).")
    p.add_argument("dataset", nargs="?", default=None,
                   help="an ImageFolder root, or a tar shard path or glob such as "
                        "'shards/train-*.tar' (default: the built-in sample data)")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON to PATH")
    p.add_argument("--num-workers", default="auto",
                   help="decoding threads (default: auto)")
    args = p.parse_args(argv)
    workers = args.num_workers
    if workers != "auto":
        try:
            workers = int(workers)
        except ValueError:
            p.error(f"--num-workers must be 'auto' or an integer, got {workers!r}")
    try:
        dataset = _open_dataset(args.dataset)
        result = channel_stats(dataset, num_workers=workers)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"stoker stats: error: {e}", file=sys.stderr)
        return 2
    where = getattr(dataset, "root", None) or f"{len(dataset.paths)} tar shards"
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
