#!/usr/bin/env python3
"""stoker.TableDataset against the ways a table user loads data today, side by side in one run.

Two tables, made once in bench/data/tables/ (git-ignored):
* photos.parquet: the 1,000 sample photos (stoker's sample data) as a Hugging Face image
  dataset on the Hub: ``datasets.Dataset`` with an ``Image()`` column (the JPEG bytes embedded)
  and a ``ClassLabel``, its Arrow table written to Parquet in row groups of 100 images.
* tokens.parquet: 1M rows of a token-classification-like table: ``input_ids`` (list<int32>,
  16-64 ids, log-uniform), ``features`` (fixed_size_list<float32>[16]), ``label`` (int64);
  row groups of 64k rows.

Images (batch 64, RandomResizedCrop(224) + horizontal flip + normalize, float32 CHW, shuffled):
* stoker-table: ``TableDataset(photos.parquet, image="image", label="label", transform=...)``,
  ``num_workers="auto"``.
* stoker-folder: ``ImageFolder`` over the same photos as JPEG files (Stoker's native path).
* hf-torch:<w>: ``datasets.load_dataset("parquet")`` + ``set_transform`` with the same transform
  in PIL/NumPy (torchvision's RandomResizedCrop parameters), torch's DataLoader at w workers; its
  best is the baseline.
* stoker-python:<w>: the same HF dataset through ``stoker.DataLoader``'s Python path (part 2 of
  the issue: "auto" against the best static worker count).
* ray-data: ``ray.data.read_parquet`` + ``map_batches`` (the same PIL transform) +
  ``iter_torch_batches(local_shuffle_buffer_size=256)`` (Ray's advice for training:
  ``random_shuffle()`` instead ran at 112 images/s and 6.2 GiB peak RSS), on a local Ray with
  the machine's cores.
Tokens (batch 256, input_ids padded to 64, shuffled unless said):
* stoker-tokens (shuffled, block order), stoker-tokens-seq (unshuffled), stoker-tokens-full
  (``shuffle_window`` = the table: a full permutation; its row groups stay in the cache).
* hf-torch-tokens:<w>: ``load_dataset("parquet").with_format("numpy")`` in torch's DataLoader
  (HF's batched ``__getitems__``) with a padding collate.
* arrow-scan: ``pyarrow.dataset`` scanning the file in order, batches padded in NumPy (no
  shuffle: the floor of what a sequential Arrow reader costs).
Each measurement runs in a fresh process (peak RSS summed over it and its workers), warms up, then
times a fixed number of samples (epochs follow one another); --repeat runs interleave and the
median is shown.

Targets (issue 23): stoker-table >= 3x hf-torch's best, >= 0.9x stoker-folder; stoker-tokens
>= 5x hf-torch-tokens' best; stoker-python's auto >= 0.97x its best static.

    python bench/bench_tables.py [--repeat 3] [--only images,tokens] [--configs A,B] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

import harness
from harness import median_of, run_measured

HERE = os.path.abspath(__file__)
DATA = Path(__file__).resolve().parent / "data" / "tables"
MEAN = np.array(harness.MEAN, np.float32)
STD = np.array(harness.STD, np.float32)
TOKEN_ROWS = 1_000_000
SEQ = 64


# --- data -----------------------------------------------------------------------------------

def photo_paths():
    import stoker
    from stoker.sample_data import default_sample_root, make_sample
    make_sample()
    folder = stoker.ImageFolder(os.path.join(default_sample_root(), "train"))
    return folder.samples, os.path.join(default_sample_root(), "train")


def make_photos(quick):
    path = DATA / ("photos-quick.parquet" if quick else "photos.parquet")
    if path.exists():
        return path
    import datasets
    samples, _ = photo_paths()
    if quick:
        samples = samples[::10]
    import pyarrow.parquet as pq
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(num_classes=10)})
    # As on the Hub: the image bytes embedded (push_to_hub embeds them; to_parquet would keep
    # the paths), row groups of 100 images (datasets' writer batch size for images).
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": open(p, "rb").read(), "path": os.path.basename(p)}
                   for p, _ in samples],
         "label": [c for _, c in samples]}, features=features)
    DATA.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    pq.write_table(ds.data.table, tmp, row_group_size=100)
    os.replace(tmp, path)
    return path


def make_tokens(quick):
    rows = TOKEN_ROWS // 20 if quick else TOKEN_ROWS
    path = DATA / (f"tokens-{rows}.parquet")
    if path.exists():
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(0)
    lengths = np.exp(rng.uniform(np.log(16), np.log(SEQ), rows)).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ids = rng.integers(0, 50257, offsets[-1], dtype=np.int32)
    table = pa.table({
        "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)),
        "features": pa.FixedSizeListArray.from_arrays(
            pa.array(rng.random(rows * 16, dtype=np.float32)), 16),
        "label": pa.array(rng.integers(0, 10, rows)),
    })
    DATA.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp, row_group_size=65536)
    os.replace(tmp, path)
    return path


# --- the PIL/NumPy transform a datasets user writes -----------------------------------------

def pil_train(image):
    """RandomResizedCrop(224) (torchvision's parameters: bench_images.rrc_params), flip,
    normalize, in PIL and NumPy."""
    from PIL import Image
    from bench_images import rrc_params
    image = image.convert("RGB")
    y, x, ch, cw = rrc_params(*image.size)
    image = image.resize((224, 224), Image.BILINEAR, box=(x, y, x + cw, y + ch))
    if random.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    a = (np.asarray(image, np.float32) / 255.0 - MEAN) / STD
    return np.ascontiguousarray(a.transpose(2, 0, 1))


def hf_set_transform(batch):
    import torch
    batch["image"] = [torch.from_numpy(pil_train(im)) for im in batch["image"]]
    return batch


def stoker_train():
    from stoker import transforms as T
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(MEAN.tolist(), STD.tolist())])


def pad_collate(items):
    """HF token rows -> padded tensors (what DataCollatorWithPadding does, in NumPy)."""
    import torch
    n = len(items)
    ids = np.zeros((n, SEQ), np.int32)
    lengths = np.empty(n, np.int64)
    for i, item in enumerate(items):
        t = item["input_ids"]
        ids[i, :len(t)] = t
        lengths[i] = len(t)
    return {"input_ids": torch.from_numpy(ids), "input_ids_length": torch.from_numpy(lengths),
            "features": torch.from_numpy(np.stack([it["features"] for it in items])),
            "label": torch.from_numpy(np.array([it["label"] for it in items]))}


# --- measurement children -------------------------------------------------------------------

def timed(batches, samples_of, total, warmup):
    """(samples/s, seconds to the first batch) over `total` samples after `warmup` batches."""
    start = time.perf_counter()
    first = None
    seen = 0
    t0 = None
    for batch in batches():
        if first is None:
            first = time.perf_counter() - start
        seen += 1
        if seen == warmup:
            t0, n = time.perf_counter(), 0
        elif t0 is not None:
            n += samples_of(batch)
            if n >= total:
                break
    return {"samples_s": n / (time.perf_counter() - t0), "first_s": first}


def epochs(make_loader):
    """Batches of one loader's epochs, one after another."""
    def gen():
        loader = make_loader()
        while True:
            yield from loader
    return gen


def child(kind, workers, args):
    import torch
    import stoker
    photos = make_photos(args.quick)
    tokens = make_tokens(args.quick)
    w = workers if workers == "auto" else int(workers)
    total = args.samples
    if kind in ("stoker-table", "stoker-folder"):
        if kind == "stoker-table":
            ds = stoker.TableDataset(str(photos), image="image", label="label",
                                     transform=stoker_train())
        else:
            ds = stoker.ImageFolder(photo_paths()[1], transform=stoker_train())
        out = timed(epochs(lambda: stoker.DataLoader(ds, batch_size=64, shuffle=True,
                                                     num_workers=w)),
                    lambda b: len(b[1]), total, 3)
    elif kind in ("hf-torch", "stoker-python"):
        import datasets
        ds = datasets.load_dataset("parquet", data_files=str(photos), split="train",
                                   cache_dir=str(DATA / "hf-cache"))
        ds.set_transform(hf_set_transform)
        if kind == "hf-torch":
            make = lambda: torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True,  # noqa
                                                       num_workers=w)
        else:
            make = lambda: stoker.DataLoader(ds, batch_size=64, shuffle=True,  # noqa
                                             num_workers=w)
        out = timed(epochs(make), lambda b: len(b["label"]), total, 3)
    elif kind == "ray-data":
        import ray
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        import io
        from PIL import Image

        def transform(batch):
            images = [pil_train(Image.open(io.BytesIO(im["bytes"]))) for im in batch["image"]]
            return {"image": np.stack(images), "label": batch["label"]}

        def gen():
            data = ray.data.read_parquet(str(photos)).map_batches(transform, batch_size=64)
            while True:  # Ray's advice for training: a local shuffle buffer, not random_shuffle
                yield from data.iter_torch_batches(batch_size=64, local_shuffle_buffer_size=256)
        out = timed(gen, lambda b: len(b["label"]), total, 3)
        ray.shutdown()
    elif kind.startswith("stoker-tokens"):
        window = {"stoker-tokens-full": TOKEN_ROWS}.get(kind)
        ds = stoker.TableDataset(str(tokens), columns=["input_ids", "features", "label"],
                                 max_length=SEQ, shuffle_window=window)
        shuffle = kind != "stoker-tokens-seq"
        out = timed(epochs(lambda: stoker.DataLoader(ds, batch_size=256, shuffle=shuffle,
                                                     num_workers=w)),
                    lambda b: len(b["label"]), total, 5)
        out["block_reads"] = ds.cache_stats()["block_reads"]
    elif kind == "hf-torch-tokens":
        import datasets
        ds = datasets.load_dataset("parquet", data_files=str(tokens), split="train",
                                   cache_dir=str(DATA / "hf-cache")).with_format("numpy")
        out = timed(epochs(lambda: torch.utils.data.DataLoader(
            ds, batch_size=256, shuffle=True, num_workers=w, collate_fn=pad_collate)),
            lambda b: len(b["label"]), total, 5)
    elif kind == "arrow-scan":
        import pyarrow.dataset as pds

        def gen():
            while True:
                for rb in pds.dataset(str(tokens)).to_batches(batch_size=256):
                    ids = rb.column("input_ids")
                    offsets = ids.offsets.to_numpy()
                    values = ids.values.to_numpy()
                    lengths = np.diff(offsets)
                    padded = np.zeros((len(rb), SEQ), np.int32)
                    mask = np.arange(SEQ) < lengths[:, None]
                    padded[mask] = values[offsets[0]:offsets[-1]]
                    yield {"input_ids": torch.from_numpy(padded),
                           "features": torch.from_numpy(
                               rb.column("features").values.to_numpy().reshape(-1, 16)),
                           "label": torch.from_numpy(rb.column("label").to_numpy())}
        out = timed(gen, lambda b: len(b["label"]), total, 5)
    else:
        raise ValueError(kind)
    return out


# --- the parent -------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="images,tokens")
    ap.add_argument("--quick", action="store_true", help="small data, one run (smoke test)")
    ap.add_argument("--samples", type=int, default=0)
    ap.add_argument("--configs", default=None,
                    help="only these loaders (comma-separated, e.g. stoker-python:auto,...)")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args)))
        return 0
    if args.quick:
        args.repeat = 1
    make_photos(args.quick)
    make_tokens(args.quick)
    cores = os.cpu_count()
    workers = [1, 2] if cores <= 2 else [1, 2, 4]
    plans = {
        "images": (["stoker-table:auto", "stoker-folder:auto", "ray-data:auto"]
                   + [f"hf-torch:{w}" for w in workers]
                   + ["stoker-python:auto"] + [f"stoker-python:{w}" for w in workers],
                   300 if args.quick else 3000),
        "tokens": (["stoker-tokens:auto", "stoker-tokens-seq:auto", "stoker-tokens-full:auto",
                    "arrow-scan:0"] + [f"hf-torch-tokens:{w}" for w in [0] + workers],
                   20000 if args.quick else 300000),
    }
    print(f"cores: {cores}, python {sys.version.split()[0]}, median of {args.repeat} "
          f"interleaved runs, each in a fresh process")
    results = {}
    for part in args.only.split(","):
        configs, samples = plans[part]
        if args.configs:
            configs = [c for c in configs if c in args.configs.split(",")]
            if not configs:
                continue
        samples = args.samples or samples
        rounds = []
        for _ in range(args.repeat):
            one = {}
            for config in configs:
                kind, w = config.split(":")
                cmd = [sys.executable, HERE, "--child", kind, w, "--samples", str(samples)]
                if args.quick:
                    cmd.append("--quick")
                try:
                    one[config] = run_measured(cmd, timeout=900)
                except RuntimeError as e:
                    print(f"  {config}: {e}", flush=True)
            rounds.append(one)
        for config in configs:
            got = [r[config] for r in rounds if config in r]
            if got:
                results[config] = median_of(got)
        print(f"\n== {part} ({samples} samples timed per run)")
        print(f"{'loader':>24} {'samples/s':>10} {'first batch':>12} {'peak RSS':>10}")
        for config in configs:
            if config in results:
                r = results[config]
                extra = f"  row groups decoded {r['block_reads']:.0f}" if "block_reads" in r \
                    else ""
                print(f"{config:>24} {r['samples_s']:>10.0f} {r['first_s'] * 1e3:>10.0f}ms "
                      f"{r['peak_rss'] / 2**20:>8.0f}MiB{extra}", flush=True)

    def best(prefix):
        options = [c for c in results if c.split(":")[0] == prefix and c.split(":")[1] != "auto"]
        return max(options, key=lambda c: results[c]["samples_s"]) if options else None

    def ratio(a, b, target=None):
        if a not in results or b is None or b not in results:
            return
        r = results[a]["samples_s"] / results[b]["samples_s"]
        rss = results[a]["peak_rss"] / results[b]["peak_rss"]
        verdict = "" if target is None else f" (target >= {target}x: " \
            f"{'met' if r >= target else 'MISSED'})"
        print(f"{a} vs {b}: {r:.2f}x throughput, {rss:.2f}x peak RSS{verdict}")

    print("\n== ratios")
    ratio("stoker-table:auto", best("hf-torch"), 3.0)
    ratio("stoker-table:auto", "stoker-folder:auto", 0.9)
    ratio("stoker-table:auto", "ray-data:auto")
    ratio("stoker-python:auto", best("stoker-python"), 0.97)
    ratio("stoker-python:auto", best("hf-torch"))
    ratio("stoker-tokens:auto", best("hf-torch-tokens"), 5.0)
    ratio("stoker-tokens:auto", "arrow-scan:0")
    ratio("stoker-tokens:auto", "stoker-tokens-seq:auto")
    ratio("stoker-tokens-full:auto", "stoker-tokens:auto")
    return 0


if __name__ == "__main__":
    import record  # bench/record.py: this output also goes to bench/results/
    sys.exit(record.run(main))
