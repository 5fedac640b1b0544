"""Image classification input: Stoker against torch DataLoader + PIL, side by side.

Workload (what most users tune num_workers for): decode a JPEG, RandomResizedCrop to 224, random
horizontal flip, ToTensor, Normalize, batch of 64, shuffled. Both loaders read the same files
(the built-in ImageNet-like sample data, page-cached) on the same cores in one invocation, and the
measurements are interleaved so that drift on a shared machine hits both.

- torch: ``torch.utils.data.DataLoader`` over the Dataset a PyTorch user writes: PIL decode and
  the torchvision operations written with PIL and NumPy (torchvision has no CPU build here), at
  each num_workers in {0, 1, 2, 4} (persistent workers); the best is the reference.
- stoker: ``stoker.DataLoader(stoker.ImageFolder(root, transform=...))`` with every knob on auto.
- bound: libjpeg-turbo full-size decode of the same files on all cores, no transforms.

Each measurement runs in a fresh process, so that no loader inherits another's heap. Reported per
configuration: images/s (steady state, after the first batch), CPU seconds per image (all
processes), peak RSS summed over the loader's processes (main + workers), and time to the first
batch. Targets: >= 5x torch's best images/s, >= 0.9x the decode-only bound, peak RSS
<= 1/2 of torch's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time

import numpy as np
import psutil
import torch
from PIL import Image

import stoker
from peak_rss import run_measured
from stoker import transforms as T
from stoker.sample_data import default_sample_root, make_sample

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
BATCH = 64


# ---- the torch side: what a PyTorch user writes without torchvision ----------------------------

class PILImageFolder(torch.utils.data.Dataset):
    """ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize."""

    def __init__(self, samples, size=224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
        self.samples = samples
        self.size = size
        self.scale = scale
        self.log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
        self.mean = np.array(MEAN, np.float32)[:, None, None]
        self.std = np.array(STD, np.float32)[:, None, None]

    def __len__(self):
        return len(self.samples)

    def crop_params(self, width, height):  # torchvision's RandomResizedCrop.get_params
        area = width * height
        for _ in range(10):
            target = area * random.uniform(*self.scale)
            aspect = math.exp(random.uniform(*self.log_ratio))
            w = int(round(math.sqrt(target * aspect)))
            h = int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                return random.randint(0, height - h), random.randint(0, width - w), h, w
        w, h = min(width, height), min(width, height)
        return (height - h) // 2, (width - w) // 2, h, w

    def __getitem__(self, index):
        path, label = self.samples[index]
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        i, j, h, w = self.crop_params(*img.size)
        img = img.resize((self.size, self.size), Image.BILINEAR, box=(j, i, j + w, i + h))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = np.asarray(img, dtype=np.float32).transpose(2, 0, 1) / 255.0
        return torch.from_numpy((x - self.mean) / self.std), label


# ---- measurement ------------------------------------------------------------------------------

def cpu_seconds():
    """CPU time of this process and of its children, living and reaped."""
    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    return total


def run_one(make_loader, epochs):
    """In the measurement child: time to the first batch, then (after the rest of that warm-up
    epoch) images/s and CPU s/image over `epochs` whole epochs: a steady state that no batch
    prefetched before the clock started can inflate."""
    start = time.perf_counter()
    loader = make_loader()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - start
    for _ in it:
        pass
    cpu0, t0, n = cpu_seconds(), time.perf_counter(), 0
    for _ in range(epochs):
        for x, y in loader:
            n += len(y)
    elapsed = time.perf_counter() - t0
    cpu = cpu_seconds() - cpu0
    return {"images_per_s": n / elapsed, "cpu_s_per_image": cpu / n, "first_batch_s": first}


def measure(loader, workers, epochs):
    """Runs one configuration in a fresh process (so no loader inherits another's heap) and
    adds the peak RSS of that process and its workers."""
    return run_measured([sys.executable, os.path.abspath(__file__), "--child",
                         f"{loader}:{workers}", "--epochs", str(epochs)])


def torch_loader(samples, workers):
    def make():
        ds = PILImageFolder(samples)
        kw = dict(prefetch_factor=2, persistent_workers=True) if workers else {}
        return torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True,
                                           num_workers=workers, **kw)
    return make


def stoker_loader(root, workers="auto"):
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(MEAN, STD)])

    def make():
        return stoker.DataLoader(stoker.ImageFolder(root, transform=transform), batch_size=BATCH,
                                 shuffle=True, num_workers=workers)
    return make


def child(spec, epochs):
    """One measurement in a fresh process; prints its figures as JSON."""
    import warnings
    warnings.simplefilter("ignore")  # torch's note on more workers than cores
    name, workers = spec.split(":")
    root = os.path.join(default_sample_root(), "train")
    if name == "torch":
        make = torch_loader(stoker.ImageFolder(root).samples, int(workers))
    else:
        make = stoker_loader(root, workers if workers == "auto" else int(workers))
    print(json.dumps(run_one(make, epochs)))
    return 0


def median_of(runs):
    keys = runs[0].keys()
    return {k: statistics.median(r[k] for r in runs) for k in keys} | {
        "images_per_s_min": min(r["images_per_s"] for r in runs),
        "images_per_s_max": max(r["images_per_s"] for r in runs)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a short smoke run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", help="write every figure to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)  # LOADER:WORKERS, one measurement
    p.add_argument("--epochs", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.epochs)
    repeats = 1 if args.quick else args.repeats
    epochs = 1 if args.quick else 2

    manifest = make_sample(default_sample_root())
    root = os.path.join(default_sample_root(), "train")
    folder = stoker.ImageFolder(root)
    samples = folder.samples
    paths = [p for p, _ in samples]
    for path in paths:  # page cache: both sides read from RAM
        with open(path, "rb") as f:
            f.read()
    cores = stoker.usable_cores()
    files = manifest["files"]
    print(f"data: {len(samples)} JPEGs in {root} (mean {files['width']['mean']:.0f}x"
          f"{files['height']['mean']:.0f}, {files['bytes']['mean'] / 1024:.0f} KB), "
          f"{cores} cores, batch {BATCH}, "
          f"a warm-up epoch then {epochs} timed epoch(s) per measurement, {repeats} repeats")

    bound = stoker._native.decode_only(paths, cores, 1.0 if args.quick else 3.0)
    print(f"decode-only bound (libjpeg-turbo, full size, {cores} threads): "
          f"{bound['images_per_s']:,.0f} images/s, {bound['megapixels_per_s']:,.0f} MP/s")

    configs = [("torch", w) for w in (0, 1, 2, 4)] + [("stoker", "auto")]
    if not args.quick:
        configs += [("stoker", w) for w in (1, 2)]
    runs = {c: [] for c in configs}
    for _ in range(repeats):
        for name, w in configs:
            runs[(name, w)].append(measure(name, w, epochs))
            print(".", end="", flush=True)
    print()
    results = {key: median_of(r) for key, r in runs.items()}

    torch_best_key = max((k for k in results if k[0] == "torch"),
                         key=lambda k: results[k]["images_per_s"])
    torch_best = results[torch_best_key]
    print(f"\n{'loader':<8} {'workers':>7} {'images/s':>10} {'(min-max)':>15} {'CPU s/img':>10} "
          f"{'peak RSS':>10} {'1st batch':>9} {'vs torch':>8} {'vs bound':>8}")
    for (name, w), r in results.items():
        spread = f"{r['images_per_s_min']:,.0f}-{r['images_per_s_max']:,.0f}"
        print(f"{name:<8} {str(w):>7} {r['images_per_s']:>10,.0f} {spread:>15} "
              f"{r['cpu_s_per_image'] * 1e3:>8.2f}ms {r['peak_rss'] / 2**20:>8.0f}MB "
              f"{r['first_batch_s']:>8.2f}s {r['images_per_s'] / torch_best['images_per_s']:>7.2f}x "
              f"{r['images_per_s'] / bound['images_per_s']:>7.2f}x")

    st = results[("stoker", "auto")]
    speedup = st["images_per_s"] / torch_best["images_per_s"]
    of_bound = st["images_per_s"] / bound["images_per_s"]
    rss_ratio = st["peak_rss"] / torch_best["peak_rss"]
    checks = [("images/s vs torch best", speedup, speedup >= 5.0, ">= 5x"),
              ("images/s vs decode-only bound", of_bound, of_bound >= 0.9, ">= 0.9x"),
              ("peak RSS vs torch best", rss_ratio, rss_ratio <= 0.5, "<= 0.5x")]
    print(f"\nsummary: stoker (auto) {st['images_per_s']:,.0f} images/s; torch best "
          f"{torch_best['images_per_s']:,.0f} images/s at num_workers={torch_best_key[1]}")
    for label, value, ok, target in checks:
        print(f"  {label:<32} {value:6.2f}x  target {target:<8} {'PASS' if ok else 'FAIL'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bound": bound, "results": {f"{n}:{w}": r for (n, w), r in results.items()},
                       "torch_best_workers": torch_best_key[1]}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
