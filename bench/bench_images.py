"""Image classification input: Stoker against the CPU loaders people use, side by side.

Workload (what most users tune num_workers for): decode a JPEG, RandomResizedCrop(224) (scale
0.08-1, ratio 3/4-4/3), random horizontal flip, float32, Normalize, batch of 64, shuffled. Every
loader reads the same files (page-cached) on the same cores in one invocation; each
configuration runs in a fresh process (no loader inherits another's heap or warm caches).

Datasets: the built-in ImageNet-like sample data (mean ~494x372) and its "large" profile
(640-1024 px on the long side, 15% progressive, 8% grayscale), both made from the sample photos.

Loaders:
- stoker: ``stoker.DataLoader(stoker.ImageFolder(root, transform=...))``, num_workers "auto" and
  explicit (1, 2, cores + 1); the best explicit one is the "best static".
- torchvision: ``torch.utils.data.DataLoader`` over ``torchvision.datasets.ImageFolder`` with
  torchvision's transforms on Pillow, num_workers 0-4 (persistent workers, prefetch_factor 2).
  The same with Pillow-SIMD when it built.
- torchdata.nodes: ParallelMapper over threads and over processes, Batcher, Prefetcher.
- DALI: NVIDIA DALI's CPU pipeline (device_id=None): file reader, image_random_crop,
  resize, crop_mirror_normalize, num_threads = cores.
- SPDL: its pipeline (threads) with FFmpeg decode, crop and scale filters.
- tf.data: decode_and_crop_jpeg with sample_distorted_bounding_box, AUTOTUNE (NHWC output).
- bound: libjpeg-turbo full-size decode of the same files (in memory) on all cores, no
  transforms.

The peers run in environments of their own (`make bench-peers` builds .venv-peers/); a peer
whose environment is missing or fails is reported as unavailable, not fatal.

Reported per configuration: images/s in the steady state (a warm-up epoch, then whole timed
epochs), CPU ms per image (all processes of the configuration), peak RSS summed over its
processes (polled by the parent), time to the first batch. For Stoker, also a short epoch of 8
batches with a freshly built loader (the first in its process, then built again on the same
data), auto against the best static.

Targets: stoker auto >= 1.05x the full-decode bound on both datasets, >= 2x the best peer,
auto >= 0.97x the best static (steady state and a whole short epoch), peak RSS <= 0.5x torch's
best configuration (torchvision on Pillow at its best images/s).

Usage:
    python bench/bench_images.py --quick          # smoke run: every loader, one short repeat
    python bench/bench_images.py                  # the full run (a quiet machine: ~15 min)
    python bench/bench_images.py --json out.json --datasets imagenet,large
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import (MEAN, PEERS, STD, cores, cpu_seconds, emit, link_files,  # noqa: E402
                     machine_line, median_of, peer_python, read_files, run_measured,
                     samples_in, write_json)

BATCH = 64
SHORT_BATCHES = 8  # the short epoch: a loader built for 8 batches


# ---- measurement, in the child process -------------------------------------------------------

def steady(make_epoch, epochs):
    """Time to the first batch; then, after the rest of that warm-up epoch, images/s and CPU
    s/image over `epochs` whole epochs (no batch prefetched before the clock starts counts)."""
    start = time.perf_counter()
    it = iter(make_epoch())
    batch = next(it)
    first = time.perf_counter() - start
    for batch in it:  # as a training loop: the previous batch is dropped when the next comes
        pass
    del batch, it
    cpu0, t0, n = cpu_seconds(), time.perf_counter(), 0
    for _ in range(epochs):
        for batch in make_epoch():
            n += samples_in(batch)
    elapsed = time.perf_counter() - t0
    return {"images_per_s": n / elapsed, "cpu_ms_per_image": (cpu_seconds() - cpu0) / n * 1e3,
            "first_batch_s": first}


def samples_of(root):
    """(path, label) in torchvision ImageFolder's order, from the class folders."""
    classes = sorted(d.name for d in os.scandir(root) if d.is_dir())
    out = []
    for label, c in enumerate(classes):
        for dirpath, _, names in sorted(os.walk(os.path.join(root, c))):
            out += [(os.path.join(dirpath, n), label) for n in sorted(names)]
    return out


# ---- the loaders (each imports only what its environment has) --------------------------------

def stoker_epochs(root, workers):
    import torch  # noqa: F401  (a training script has it loaded; stoker's tensors need it)

    import stoker
    from stoker import transforms as T
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(MEAN, STD)])
    loader = stoker.DataLoader(stoker.ImageFolder(root, transform=transform), batch_size=BATCH,
                               shuffle=True, num_workers=workers)
    return lambda: loader


def stoker_short(root, workers, rebuilds):
    """Whole short epochs (SHORT_BATCHES batches) of freshly built loaders: the loader's
    construction, its first batch and every batch after, as a script that builds a loader per
    epoch or per evaluation pass sees it. The first loader is the first in this process; the
    next ones are built again on the same data (an autotuned one starts where the last ended)."""
    import torch  # noqa: F401  (a training script has it loaded; stoker's tensors need it)

    import stoker
    from stoker import transforms as T
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(MEAN, STD)])
    rates = []
    for _ in range(1 + rebuilds):
        t0 = time.perf_counter()
        loader = stoker.DataLoader(stoker.ImageFolder(root, transform=transform),
                                   batch_size=BATCH, shuffle=True, num_workers=workers)
        n = sum(len(y) for _, y in loader)
        rates.append(n / (time.perf_counter() - t0))
        del loader
    return {"first_loader_images_per_s": rates[0],
            "rebuilt_images_per_s": statistics.median(rates[1:]) if rebuilds else rates[0]}


_TORCHVISION_LIB = None


def import_torchvision():
    """torchvision's PyPI wheel is built against PyPI's (CUDA) torch: with the CPU build its C++
    ops (nms, decode_jpeg, ...) cannot load, and only its transforms on Pillow are used here.
    Its import then fails registering fake kernels for ops that do not exist; define their
    schemas (never called) first."""
    global _TORCHVISION_LIB
    import torch
    try:
        import torchvision
        return torchvision
    except RuntimeError as e:
        if "torchvision::nms" not in str(e):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    _TORCHVISION_LIB = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        _TORCHVISION_LIB.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision
    return torchvision


def torchvision_epochs(root, workers):
    import torch
    torchvision = import_torchvision()
    from torchvision import transforms as T
    torch.set_num_threads(1)
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(MEAN, STD)])
    ds = torchvision.datasets.ImageFolder(root, transform=transform)
    kw = dict(prefetch_factor=2, persistent_workers=True) if workers else {}
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True,
                                         num_workers=workers, **kw)
    return lambda: loader


def torchdata_epochs(root, method):
    import torch
    torchvision = import_torchvision()
    from torchdata import nodes
    from torchvision import transforms as T
    torch.set_num_threads(1)
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(MEAN, STD)])
    ds = torchvision.datasets.ImageFolder(root, transform=transform)
    sampler = torch.utils.data.RandomSampler(ds)
    node = nodes.SamplerWrapper(sampler)
    # Processes are spawned: forked from this threaded process they deadlocked (seen twice).
    # A spawned child imports torchvision when it unpickles the dataset: TORCHVISION_SHIM has
    # this module's import define the missing op schemas first (see import_torchvision).
    os.environ["BENCH_IMAGES_TORCHVISION_SHIM"] = "1"
    node = nodes.ParallelMapper(node, map_fn=ds.__getitem__, num_workers=cores(),
                                method=method, in_order=True,
                                multiprocessing_context="spawn" if method == "process" else None)
    node = nodes.Batcher(node, batch_size=BATCH, drop_last=False)
    node = nodes.ParallelMapper(node, map_fn=torch.utils.data.default_collate, num_workers=1,
                                method="thread")
    node = nodes.Prefetcher(node, prefetch_factor=2)
    loader = nodes.Loader(node)
    return lambda: loader


def dali_epochs(root):
    from nvidia.dali import fn, pipeline_def, types
    n_files = len(samples_of(root))

    @pipeline_def(batch_size=BATCH, num_threads=cores(), device_id=None, prefetch_queue_depth=2)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0],
                                               random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=224, resize_y=224)
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout="CHW", mirror=fn.random.coin_flip(),
            mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD])
        return images, labels

    return dali_epoch(pipe(), n_files)


def dali_epoch(p, n_files):
    """A built DALI pipeline's epoch over n_files samples: ceil(n_files / BATCH) batches, as
    arrays (shared with bench_recipes.py)."""
    p.build()
    batches = math.ceil(n_files / BATCH)

    def epoch():
        for _ in range(batches):
            images, labels = p.run()
            yield images.as_array(), labels.as_array()
    return epoch


def spdl_epochs(root):
    import numpy as np
    import spdl.io
    from spdl.pipeline import PipelineBuilder
    samples = samples_of(root)
    mean = np.array(MEAN, np.float32) * 255
    std = np.array(STD, np.float32) * 255

    def load(item):
        path, label = item
        packets = spdl.io.demux_image(path)
        w, h = packets.width, packets.height
        i, j, ch, cw = rrc_params(w, h)
        flip = ",hflip" if random.random() < 0.5 else ""
        frames = spdl.io.decode_packets(
            packets, filter_desc=f"crop={cw}:{ch}:{j}:{i},scale=224:224:flags=bilinear{flip},"
                                 f"format=rgb24")
        x = np.asarray(spdl.io.to_numpy(spdl.io.convert_frames(frames)), np.float32)
        x = ((x.reshape(224, 224, 3) - mean) / std).transpose(2, 0, 1)
        return x, label

    def batch(items):
        return np.stack([x for x, _ in items]), np.array([y for _, y in items])

    def epoch():
        order = random.sample(samples, len(samples))
        pipeline = (PipelineBuilder().add_source(order)
                    .pipe(load, concurrency=cores())
                    .aggregate(BATCH, drop_last=False)
                    .pipe(batch)
                    .add_sink(2)
                    .build(num_threads=cores()))
        with pipeline.auto_stop():
            yield from pipeline.get_iterator(timeout=600)
    return epoch


def rrc_params(width, height, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's RandomResizedCrop.get_params: (top, left, height, width)."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * random.uniform(*scale)
        aspect = math.exp(random.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return random.randint(0, height - h), random.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def tfdata_epochs(root):
    import tensorflow as tf
    samples = samples_of(root)
    paths = [p for p, _ in samples]
    labels = [y for _, y in samples]
    mean = tf.constant(MEAN) * 255
    std = tf.constant(STD) * 255

    def load(path, label):
        data = tf.io.read_file(path)
        shape = tf.io.extract_jpeg_shape(data)
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape, tf.zeros([0, 0, 4]), min_object_covered=0.0,
            aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
            use_image_if_no_bounding_boxes=True)
        offset_y, offset_x, _ = tf.unstack(begin)
        h, w, _ = tf.unstack(size)
        image = tf.image.decode_and_crop_jpeg(data, tf.stack([offset_y, offset_x, h, w]),
                                              channels=3)
        image = tf.image.resize(image, (224, 224), method="bilinear", antialias=True)
        image = tf.image.random_flip_left_right(image)
        return (image - mean) / std, label

    ds = (tf.data.Dataset.from_tensor_slices((paths, labels))
          .shuffle(len(paths), reshuffle_each_iteration=True)
          .map(load, num_parallel_calls=tf.data.AUTOTUNE)
          .batch(BATCH)
          .prefetch(tf.data.AUTOTUNE))

    def epoch():
        for x, y in ds.as_numpy_iterator():
            yield x, y
    return epoch


def bound(root, seconds):
    import stoker
    paths = [p for p, _ in samples_of(root)]
    cpu0 = cpu_seconds()
    r = stoker._native.testing.decode_only(paths, cores(), seconds)
    return {"images_per_s": r["images_per_s"], "megapixels_per_s": r["megapixels_per_s"],
            "cpu_ms_per_image": (cpu_seconds() - cpu0) / max(r["images"], 1) * 1e3,
            "first_batch_s": 0.0}


def child(spec, root, epochs, short_root, rebuilds, bound_seconds):
    """One measurement in a fresh process; prints its figures as JSON (the last line)."""
    import warnings
    warnings.simplefilter("ignore")
    kind, _, arg = spec.partition(":")
    if kind == "bound":
        out = bound(root, bound_seconds)
    elif kind == "stoker-short":
        out = stoker_short(short_root, arg if arg == "auto" else int(arg), rebuilds)
    else:
        make = {
            "stoker": lambda: stoker_epochs(root, arg if arg == "auto" else int(arg)),
            "torchvision": lambda: torchvision_epochs(root, int(arg)),
            "pillow-simd": lambda: torchvision_epochs(root, int(arg)),
            "torchdata": lambda: torchdata_epochs(root, arg),
            "dali": lambda: dali_epochs(root),
            "spdl": lambda: spdl_epochs(root),
            "tfdata": lambda: tfdata_epochs(root),
        }[kind]()
        out = steady(make, epochs)
    emit(out)


# ---- the parent: environments, datasets, the table ------------------------------------------

def python_of(kind):
    """The interpreter for a configuration: Stoker's own (.venv), or its peer environment."""
    env = {"torchvision": "torchvision", "torchdata": "torchvision", "pillow-simd": "pillow-simd",
           "dali": "dali", "spdl": "spdl", "tfdata": "tfdata"}.get(kind)
    return sys.executable if env is None else peer_python(env)


def configurations(quick):
    n = cores()
    stoker_static = sorted({1, 2, n + 1} if not quick else {2})
    torch_workers = (0, 1, 2, 3, 4) if not quick else (0, 2)
    return ([("stoker", "auto")] + [("stoker", str(w)) for w in stoker_static]
            + [("torchvision", str(w)) for w in torch_workers]
            + [("pillow-simd", str(w)) for w in torch_workers]
            + [("torchdata", "thread"), ("torchdata", "process"), ("dali", ""), ("spdl", ""),
               ("tfdata", "")])


def measure(kind, arg, root, args, short_root=None):
    py = python_of(kind)
    if py is None:
        return {"error": "environment missing (make bench-peers)"}
    cmd = [py, os.path.abspath(__file__), "--child", f"{kind}:{arg}", "--root", str(root),
           "--epochs", str(args.epochs), "--rebuilds", str(args.rebuilds),
           "--bound-seconds", str(args.bound_seconds)]
    if short_root:
        cmd += ["--short-root", str(short_root)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    try:
        return run_measured(cmd, env=env, timeout=args.timeout)
    except RuntimeError as e:
        return {"error": str(e)}


def short_epoch_root(root, tmp):
    """A folder of symlinks to the first SHORT_BATCHES * BATCH files (same classes)."""
    return link_files([p for p, _ in samples_of(root)[:SHORT_BATCHES * BATCH]], root,
                      Path(tmp) / "short")


def run_dataset(profile, args):
    import stoker
    from stoker.sample_data import default_sample_root, make_sample
    manifest = make_sample(default_sample_root(profile), profile=profile)
    root = default_sample_root(profile) / "train"
    read_files(p for p, _ in samples_of(root))  # every loader reads from RAM
    f = manifest["files"]
    c = manifest["counts"]
    print(f"\n== {profile}: {c['images']} JPEGs in {root} (mean {f['width']['mean']:.0f}x"
          f"{f['height']['mean']:.0f}, {f['bytes']['mean'] / 1024:.0f} KB, {c['progressive']} "
          f"progressive, {c['grayscale']} grayscale); {cores()} cores, batch {BATCH}; stoker "
          f"{stoker.__version__}", flush=True)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        short = short_epoch_root(root, tmp)
        for rep in range(args.repeats):
            for kind, arg in [("bound", "")] + configurations(args.quick):
                if args.peers and kind not in ("bound", "stoker") and kind not in args.peers:
                    continue
                r = measure(kind, arg, root, args)
                results.setdefault((kind, arg), []).append(r)
                print("." if "error" not in r else "x", end="", flush=True)
            for w in ("auto",) + tuple(str(w) for w in sorted({2, cores()})):
                r = measure("stoker-short", w, root, args, short_root=short)
                results.setdefault(("stoker-short", w), []).append(r)
                print(".", end="", flush=True)
    print()
    return report(profile, results)


def label(kind, arg):
    names = {"stoker": "stoker", "torchvision": "torchvision+Pillow",
             "pillow-simd": "torchvision+Pillow-SIMD", "torchdata": "torchdata.nodes",
             "dali": "DALI CPU", "spdl": "SPDL", "tfdata": "tf.data", "bound": "decode-only bound"}
    suffix = {"stoker": f"num_workers={arg}", "torchvision": f"num_workers={arg}",
              "pillow-simd": f"num_workers={arg}", "torchdata": arg}.get(kind, "")
    return f"{names[kind]} {suffix}".strip()


def report(profile, results):
    res = {k: median_of(v) for k, v in results.items()}
    b = res[("bound", "")]
    print(f"   {'loader':<38} {'images/s':>9} {'(min-max)':>13} {'CPU ms/img':>10} "
          f"{'peak RSS':>9} {'1st batch':>9} {'vs bound':>8}")
    for key, r in res.items():
        if key[0] == "stoker-short":
            continue
        if "error" in r:
            print(f"   {label(*key):<38} unavailable: {r['error'][:60]}")
            continue
        spread = f"{r['images_per_s_min']:,.0f}-{r['images_per_s_max']:,.0f}"
        print(f"   {label(*key):<38} {r['images_per_s']:>9,.0f} {spread:>13} "
              f"{r['cpu_ms_per_image']:>10.2f} {r.get('peak_rss', 0) / 2**20:>7.0f}MB "
              f"{r['first_batch_s']:>8.2f}s {r['images_per_s'] / b['images_per_s']:>7.2f}x")
    auto = res[("stoker", "auto")]
    statics = {k: r for k, r in res.items() if k[0] == "stoker" and k[1] != "auto"
               and "error" not in r}
    best_static = max(statics.values(), key=lambda r: r["images_per_s"])
    peers = {k: r for k, r in res.items()
             if k[0] not in ("stoker", "stoker-short", "bound") and "error" not in r}
    best_peer_key = max(peers, key=lambda k: peers[k]["images_per_s"]) if peers else None
    torch_keys = [k for k in peers if k[0] == "torchvision"]
    torch_best_key = max(torch_keys, key=lambda k: peers[k]["images_per_s"]) if torch_keys else None
    short = {k[1]: r for k, r in res.items() if k[0] == "stoker-short" and "error" not in r}
    short_static = max((r for w, r in short.items() if w != "auto"),
                       key=lambda r: r["first_loader_images_per_s"], default=None)
    print("   short epoch (8 batches, loader built for it):", ", ".join(
        f"num_workers={w}: first {r['first_loader_images_per_s']:,.0f}, rebuilt "
        f"{r['rebuilt_images_per_s']:,.0f} images/s" for w, r in short.items()))
    checks = [("stoker auto vs decode-only bound", auto["images_per_s"] / b["images_per_s"],
               ">=", 1.05),
              ("stoker auto vs best static (steady)",
               auto["images_per_s"] / best_static["images_per_s"], ">=", 0.97)]
    if short_static and "auto" in short:
        for which in ("first_loader_images_per_s", "rebuilt_images_per_s"):
            checks.append((f"auto vs best static, short epoch ({which.split('_')[0]})",
                           short["auto"][which] / short_static[which], ">=", 0.97))
    if best_peer_key:
        checks.append((f"stoker auto vs best peer ({label(*best_peer_key)})",
                       auto["images_per_s"] / peers[best_peer_key]["images_per_s"], ">=", 2.0))
    if torch_best_key:
        checks.append((f"peak RSS vs torch best ({label(*torch_best_key)})",
                       auto["peak_rss"] / peers[torch_best_key]["peak_rss"], "<=", 0.5))
    print(f"   summary ({profile}):")
    for name, value, op, target in checks:
        ok = value >= target if op == ">=" else value <= target
        print(f"     {name:<60} {value:6.2f}x  target {op} {target:<5} "
              f"{'PASS' if ok else 'FAIL'}")
    return {"results": {f"{k}:{a}": r for (k, a), r in res.items()},
            "checks": [{"name": n, "value": v, "target": f"{o} {t}"} for n, v, o, t in checks]}


if os.environ.get("BENCH_IMAGES_TORCHVISION_SHIM") and __name__ != "__main__":
    import_torchvision()  # a torchdata worker spawned by a measurement child


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a short smoke run of every loader")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--datasets", default="imagenet,large")
    p.add_argument("--peers", default="", help="comma-separated subset of torchvision, "
                   "pillow-simd, torchdata, dali, spdl, tfdata (default: all)")
    p.add_argument("--json", help="write every figure to this file")
    p.add_argument("--timeout", type=float, default=900,
                   help="seconds a configuration may run before it is killed (default 900)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--short-root", help=argparse.SUPPRESS)
    p.add_argument("--epochs", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--rebuilds", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--bound-seconds", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.root, args.epochs, args.short_root, args.rebuilds,
                     args.bound_seconds)
    if args.quick:
        args.repeats = 1
    args.epochs = args.epochs or (1 if args.quick else 3)
    args.rebuilds = args.rebuilds if args.rebuilds is not None else (2 if args.quick else 4)
    args.bound_seconds = args.bound_seconds or (1.0 if args.quick else 4.0)
    args.peers = [x for x in args.peers.split(",") if x]
    print(f"{machine_line()}; peers from {PEERS}")
    out = {p: run_dataset(p, args) for p in args.datasets.split(",")}
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    import record  # bench/record.py: this output also goes to bench/results/
    sys.exit(record.run(main))
