"""``stoker demo``: token windows for LLM pre-training, loaded the Stoker way.

Builds a sample token file once (cached), then shows what Stoker promises: throughput, exact
epochs, batches that do not depend on the worker count, and an exact mid-epoch resume.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import numpy as np

import stoker

NUM_TOKENS = 50_000_000
VOCAB = 50_257


def sample_tokens(root):
    """A uint16 token file with a Zipf-like unigram distribution, built once."""
    path = os.path.join(root, f"tokens-{NUM_TOKENS}.u16")
    if not os.path.exists(path):
        os.makedirs(root, exist_ok=True)
        rng = np.random.default_rng(0)
        ranks = rng.zipf(1.2, NUM_TOKENS) % VOCAB
        tmp = path + ".tmp"
        ranks.astype(np.uint16).tofile(tmp)
        os.replace(tmp, path)
    return path


def digest(batches):
    h = hashlib.sha256()
    for x, y in batches:
        h.update(np.ascontiguousarray(x).tobytes())
        h.update(np.ascontiguousarray(y).tobytes())
    return h.hexdigest()[:16]


def run_demo(root=None):
    root = root or os.path.join(os.path.expanduser("~"), ".cache", "stoker")
    path = sample_tokens(root)
    ds = stoker.TokenDataset(path, dtype="uint16", seq_len=2048)
    print(f"sample data: {path} ({ds.num_tokens / 1e6:.0f}M tokens, {len(ds)} windows of 2048)")

    loader = stoker.DataLoader(ds, batch_size=32, shuffle=True, seed=1, output="numpy")
    print(f"loader: {len(loader)} batches/epoch, num_workers={loader.num_workers} (auto), "
          f"prefetch_factor={loader.prefetch_factor} (auto), pin_memory={loader.pin_memory}")
    start = time.perf_counter()
    seen = 0
    for x, y in loader:
        seen += len(x)
    elapsed = time.perf_counter() - start
    out_bytes = seen * 2048 * 8 * 2
    print(f"epoch 0: {seen} windows in {elapsed:.2f} s = {seen / elapsed:,.0f} samples/s, "
          f"{out_bytes / elapsed / 1e9:.2f} GB/s of int64 batches")
    s = loader.stats()
    print(f"stats: read {s['read_s']:.2f} s, consumer waited {s['consumer_wait_s']:.2f} s, "
          f"buffer peak {s['buffer_bytes_peak'] / 2**20:.0f} MiB")

    first = {}
    for workers in (0, 1, 2):
        l = stoker.DataLoader(ds, batch_size=32, shuffle=True, seed=1, num_workers=workers,
                              output="numpy")
        l.set_epoch(3)
        it = iter(l)
        first[workers] = digest(next(it) for _ in range(20))
    same = len(set(first.values())) == 1
    print(f"epoch 3, first 20 batches, sha256 by num_workers: {first} -> "
          f"{'identical' if same else 'DIFFERENT'}")

    l = stoker.DataLoader(ds, batch_size=32, shuffle=True, seed=1, num_workers=2, output="numpy")
    l.set_epoch(3)
    it = iter(l)
    for _ in range(12):
        next(it)
    state = json.loads(json.dumps(l.state_dict()))
    expected = digest(next(it) for _ in range(8))
    resumed = stoker.DataLoader(ds, batch_size=32, shuffle=True, seed=1, num_workers=1,
                                output="numpy")
    resumed.load_state_dict(state)
    got = digest(next(iter(resumed)) for _ in range(1))
    it2 = iter(resumed)
    got = digest(next(it2) for _ in range(8))
    print(f"resume from {state['epoch']=}, {state['batch']=} with another worker count: "
          f"{'identical' if got == expected else 'DIFFERENT'} batches")
    tune_demo()
    return 0 if same and got == expected else 1


def tune_demo():
    """A short `stoker tune --quick` on the built-in image sample data."""
    from stoker.tune import ProgressBar, default_knobs, print_table, tune_loader
    print("\nstoker tune --quick (bare loader on the built-in ImageNet-like sample data, "
          "RandomResizedCrop(224) + flip + Normalize, batch 64):")
    knobs = default_knobs()
    bar = ProgressBar(8, time_budget=6.0)
    result = tune_loader(batch_size=64, knobs=knobs, repeats=2, seconds=0.15, time_budget=6.0,
                         progress=bar, min_batches=2)
    bar.close()
    print_table(result)
    rec = ", ".join(f"{k}={v!r}" for k, v in result["recommended"].items())
    print(f"recommended: stoker.DataLoader(dataset, batch_size=64, {rec})  "
          f"({result['samples_per_s']:.0f} samples/s; {len(result['points'])} runs, "
          f"{result['measuring_seconds']:.1f} s measuring)")
