"""``stoker demo``: Stoker's main job on its built-in sample data.

1. Builds (once, cached) the ImageNet-like sample data from real photographs.
2. Runs the classic training input pipeline, RandomResizedCrop(224) + flip + ToTensor +
   Normalize, with every knob on "auto", and reports images/s and where the time went.
3. Shows the guarantees: augmented batches identical whatever the worker count, an exact
   mid-epoch resume with another worker count, and a corrupt file skipped and counted.
4. Loads LLM pre-training token windows from a flat token file.
5. Runs a short `stoker tune --quick` on the sample data and prints the recommendation.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time

import numpy as np

import stoker
from stoker import transforms as T
from stoker.sample_data import default_sample_root, make_sample

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
TRAIN = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                   T.Normalize(MEAN, STD)])


def digest(batches):
    h = hashlib.sha256()
    for batch in batches:
        for part in batch:
            h.update(np.ascontiguousarray(part).tobytes())
    return h.hexdigest()[:16]


def images(root):
    train = os.path.join(root, "train")
    ds = stoker.ImageFolder(train, transform=TRAIN)
    print(f"\n== Images: {len(ds)} JPEGs, {len(ds.classes)} classes, {TRAIN}")
    loader = stoker.DataLoader(ds, batch_size=64, shuffle=True, seed=0, output="numpy")
    print(f"loader: num_workers={loader.num_workers} (auto), prefetch_factor="
          f"{loader.prefetch_factor} (auto), pin_memory={loader.pin_memory} (auto)")
    start = time.perf_counter()
    n = 0
    for x, y in loader:
        n += len(y)
    elapsed = time.perf_counter() - start
    s = loader.stats()
    print(f"epoch 0: {n} images of {tuple(x.shape[1:])} {x.dtype} in {elapsed:.2f} s = "
          f"{n / elapsed:,.0f} images/s; workers read+decoded+augmented for {s['read_s']:.2f} s, "
          f"the consumer waited {s['consumer_wait_s']:.2f} s")

    by_workers = {}
    for workers in (0, 1, 2):
        l = stoker.DataLoader(ds, batch_size=64, shuffle=True, seed=0, num_workers=workers,
                              output="numpy")
        l.set_epoch(5)
        it = iter(l)
        by_workers[workers] = digest(next(it) for _ in range(3))
    same = len(set(by_workers.values())) == 1
    print(f"augmented batches of epoch 5, sha256 by num_workers: {by_workers} -> "
          f"{'identical' if same else 'DIFFERENT'}")

    l = stoker.DataLoader(ds, batch_size=64, shuffle=True, seed=0, num_workers=2, output="numpy")
    it = iter(l)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(l.state_dict()))
    expected = digest(next(it) for _ in range(3))
    del it
    resumed = stoker.DataLoader(ds, batch_size=64, shuffle=True, seed=0, num_workers=1,
                                output="numpy")
    resumed.load_state_dict(state)
    it = iter(resumed)
    got = digest(next(it) for _ in range(3))
    print(f"resume from {state['epoch']=}, {state['batch']=} with num_workers 2 -> 1: "
          f"{'identical' if got == expected else 'DIFFERENT'} batches")
    return same and got == expected


def bad_input(root):
    """A copy of two classes plus one corrupt and one truncated file: skipped, counted, named."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(root, "train")
        for cls in sorted(os.listdir(src))[:2]:
            shutil.copytree(os.path.join(src, cls), os.path.join(tmp, cls))
        first = sorted(os.listdir(os.path.join(tmp, cls)))[0]
        with open(os.path.join(tmp, cls, first), "rb") as f:
            data = f.read()
        with open(os.path.join(tmp, cls, "truncated.JPEG"), "wb") as f:
            f.write(data[: len(data) // 3])
        with open(os.path.join(tmp, cls, "corrupt.JPEG"), "wb") as f:
            f.write(b"\xff\xd8\xff\xe0 this is not a JPEG")
        ds = stoker.ImageFolder(tmp, transform=TRAIN)
        loader = stoker.DataLoader(ds, batch_size=32, on_error="skip", output="numpy")
        n = sum(len(y) for _, y in loader)
        s = loader.stats()
        print(f"\n== Bad input: {len(ds)} files, 2 of them broken, on_error=\"skip\": "
              f"{n} images delivered, {s['skipped']} skipped:")
        for line in s["skipped_samples"]:
            print(f"   {line}")
        try:
            for _ in stoker.DataLoader(ds, batch_size=32, output="numpy"):
                pass
        except stoker.SampleError as e:
            print(f"on_error=\"raise\" (default): stoker.SampleError: {e}")
        return s["skipped"] == 2 and n == len(ds)


def tokens(root):
    path = os.path.join(root, "tokens-20M.u16")
    if not os.path.exists(path):
        rng = np.random.default_rng(0)
        tmp = path + ".tmp"
        (rng.zipf(1.2, 20_000_000) % 50_257).astype(np.uint16).tofile(tmp)
        os.replace(tmp, path)
    ds = stoker.TokenDataset(path, dtype="uint16", seq_len=2048)
    loader = stoker.DataLoader(ds, batch_size=32, shuffle=True, output="numpy")
    start = time.perf_counter()
    n = sum(len(x) for x, _ in loader)
    elapsed = time.perf_counter() - start
    print(f"\n== Token windows: {ds.num_tokens / 1e6:.0f}M uint16 tokens, seq_len 2048: {n} "
          f"windows in {elapsed:.2f} s = {n / elapsed:,.0f} samples/s, "
          f"{n * 2048 * 16 / elapsed / 1e9:.2f} GB/s of int64 (input, target) batches")


def run_demo(root=None):
    root = root or str(default_sample_root())
    start = time.perf_counter()
    manifest = make_sample(root)
    files = manifest["files"]
    print(f"sample data: {root} ({manifest['counts']['images']} JPEGs, mean "
          f"{files['width']['mean']:.0f}x{files['height']['mean']:.0f}, "
          f"{files['bytes']['mean'] / 1024:.0f} KB; ready in {time.perf_counter() - start:.1f} s)")
    ok = images(root)
    ok = bad_input(root) and ok
    tokens(root)
    tune_demo(root)
    return 0 if ok else 1


def tune_demo(root):
    """A short `stoker tune --quick` on the built-in image sample data."""
    from stoker.tuning.tune import ProgressBar, default_knobs, print_table, tune_loader
    print("\n== stoker tune --quick (bare loader on the built-in ImageNet-like sample data, "
          "RandomResizedCrop(224) + flip + Normalize, batch 64):")
    knobs = default_knobs()
    bar = ProgressBar(8, time_budget=6.0)
    result = tune_loader(stoker.ImageFolder(os.path.join(root, "train"), transform=TRAIN),
                         batch_size=64, knobs=knobs, repeats=2, seconds=0.15, time_budget=6.0,
                         progress=bar, min_batches=2)
    bar.close()
    print_table(result)
    rec = ", ".join(f"{k}={v!r}" for k, v in result["recommended"].items())
    print(f"recommended: stoker.DataLoader(dataset, batch_size=64, {rec})  "
          f"({result['samples_per_s']:.0f} samples/s; {len(result['points'])} runs, "
          f"{result['measuring_seconds']:.1f} s measuring)")

