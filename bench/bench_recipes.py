"""torchvision's ImageNet recipes: Stoker against torch's DataLoader, DALI CPU and FFCV.

Stoker runs torchvision's reference transforms (the v2 pipeline object itself), side by side with
the peers in one invocation.

Recipes (torchvision's references/classification presets, as its "new recipe" trains ResNet-50:
train crop 176, val resize 232 / crop 224):
- train: RandomResizedCrop(176, bilinear, antialias), RandomHorizontalFlip(0.5),
  TrivialAugmentWide(bilinear), PILToTensor, ToDtype(float32, scale=True), Normalize(ImageNet),
  RandomErasing(0.1), ToPureTensor; batch 64, shuffled.
- val: Resize(232, bilinear, antialias), CenterCrop(224), PILToTensor, ToDtype(float32,
  scale=True), Normalize, ToPureTensor; batch 64, in order.
- rrc (Stoker only): Stoker's own RandomResizedCrop(176), RandomHorizontalFlip, ToTensor,
  Normalize: the plain crop-and-flip pipeline that the train recipe is held against.

Loaders, on the same files (page-cached) and cores in one invocation, each configuration in a
fresh process:
- stoker: ``stoker.DataLoader(stoker.ImageFolder(root, transform=<the torchvision v2 pipeline
  object>), batch_size=64, num_workers=...)``, "auto" and static 1, 2, cores + 1. Stoker compiles
  the pipeline into its native one; what ran natively and what in Python (stats()["transforms"])
  is printed, and a recipe that did not run wholly natively is marked.
- torch: ``torch.utils.data.DataLoader`` over ``torchvision.datasets.ImageFolder`` with the same
  v2 pipeline on PIL images (as the reference scripts run it), num_workers 0-4 (persistent
  workers, prefetch_factor 2); its best is the one compared.
- DALI CPU (device_id=None, num_threads = cores): its operators for the same steps; what differs
  from torchvision's recipe is in DALI_NOTES below (and printed with the results).
- FFCV: its Loader over a .beton written from the same files (re-encoded JPEGs, quality 90, full
  size; written before the measurements, not timed), num_workers = cores; it has no
  TrivialAugment or erasing (FFCV_NOTES).

Reported per recipe and loader: images/s in the steady state (a warm-up epoch, then whole timed
epochs), CPU ms per image (all processes of the configuration), peak RSS summed over its
processes (polled by the parent), time to the first batch. Targets (the issue's): stoker auto
>= 3x torch's best and >= 2x DALI CPU on each recipe; stoker's train recipe >= 0.8x Stoker's own
RRC+flip+normalize (both auto).

Environments: stoker and torch run in this interpreter, which needs torch and torchvision (the
project's .venv has them; or PYTHONPATH=build/site with another environment that does). DALI and
FFCV run in .venv-peers/dali and .venv-peers/ffcv (`bash bench/setup_peers.sh dali ffcv`); a peer
whose environment is missing or fails is reported as unavailable, not fatal.

Usage:
    python bench/bench_recipes.py --quick         # smoke run: 256 images, one short repeat
    python bench/bench_recipes.py                 # the full run (a quiet machine: ~20 min)
    python bench/bench_recipes.py --recipes val --peers torch,dali --json out.json
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_images import dali_epoch, samples_of, steady  # noqa: E402  (after the path)
from harness import (MEAN, PEERS, STD, cores, emit, link_files, machine_line,  # noqa: E402
                     median_of, peer_python, read_files, run_measured, write_json)

BATCH = 64
TRAIN_CROP, VAL_RESIZE, VAL_CROP = 176, 232, 224
ERASE_P = 0.1
RECIPES = ("train", "val")

DALI_NOTES = [
    "decode and crop fused (fn.decoders.image_random_crop: torchvision's area 0.08-1 and ratio "
    "3/4-4/3, 10 tries, DALI's own fallback), then fn.resize to 176x176 (linear, antialias)",
    "TrivialAugmentWide: nvidia.dali.auto_aug.trivial_augment.trivial_augment_wide on the "
    "176x176 uint8 image (fill 0, linear): the same 14 operations, 31 bins and magnitude ranges "
    "as torchvision's wide space (translations up to 32 px; solarize's threshold 256..0 where "
    "torchvision's is 255..0), done by DALI's own operators, not torchvision's kernels",
    "the flip is crop_mirror_normalize's mirror, after TrivialAugment (torchvision flips before "
    "it: the same distribution, as every geometric augmentation is drawn with either sign)",
    "RandomErasing(0.1): fn.erase under a coin flip, area 0.02-0.33 of the image and log-uniform "
    "ratio 0.3-3.3 as torchvision, the rectangle clipped to the image where torchvision "
    "redraws it (up to 10 tries)",
    "val: fn.decoders.image, fn.resize(resize_shorter=232, linear, antialias), "
    "crop_mirror_normalize(crop 224x224, centre): the same steps as torchvision",
]
FFCV_NOTES = [
    "reads a .beton of the same images re-encoded (JPEG quality 90, full size), not the files; "
    "it maps the .beton (os_cache=True), so its peak RSS counts the file's pages it touched",
    "train: RandomResizedCropRGBImageDecoder(176) (decode, crop, OpenCV INTER_AREA resize), "
    "RandomHorizontalFlip, NormalizeImage(float32): no TrivialAugment and no RandomErasing "
    "(FFCV has neither), so its train figure is for less work than the recipe",
    "val: CenterCropRGBImageDecoder(224, ratio 224/232): the centre crop of 224/232 of the short "
    "side, resized to 224 (torchvision resizes to 232, then crops 224: the same region)",
]


# ---- the pipelines ----------------------------------------------------------------------------

def reference_transform(recipe):
    """torchvision's v2 pipeline of a recipe, as references/classification/presets.py builds it
    (use_v2, PIL backend)."""
    import torch
    from torchvision.transforms import v2
    bilinear = v2.InterpolationMode.BILINEAR
    if recipe == "train":
        steps = [v2.RandomResizedCrop(TRAIN_CROP, interpolation=bilinear, antialias=True),
                 v2.RandomHorizontalFlip(0.5),
                 v2.TrivialAugmentWide(interpolation=bilinear)]
    else:
        steps = [v2.Resize(VAL_RESIZE, interpolation=bilinear, antialias=True),
                 v2.CenterCrop(VAL_CROP)]
    steps += [v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    if recipe == "train":
        steps.append(v2.RandomErasing(ERASE_P))
    steps.append(v2.ToPureTensor())
    return v2.Compose(steps)


def stoker_own_transform():
    from stoker import transforms as T
    return T.Compose([T.RandomResizedCrop(TRAIN_CROP), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(MEAN, STD)])


# ---- the loaders (each imports only what its environment has) --------------------------------

def stoker_epochs(root, recipe, workers, notes):
    import torch  # noqa: F401  (a training script has it loaded; stoker's tensors need it)

    import stoker
    transform = stoker_own_transform() if recipe == "rrc" else reference_transform(recipe)
    loader = stoker.DataLoader(stoker.ImageFolder(root, transform=transform), batch_size=BATCH,
                               shuffle=recipe != "val", num_workers=workers)

    def what_ran():  # asked after the measurement, which it cannot then disturb
        ran = loader.stats().get("transforms") or {}
        notes["native"] = list(ran.get("native", []))
        notes["python"] = list(ran.get("python", []))
    notes["after"] = what_ran
    return lambda: loader


def torch_epochs(root, recipe, workers):
    import torch
    import torchvision
    torch.set_num_threads(1)  # as in the workers (torch sets 1 there); no intra-op pool at 0
    ds = torchvision.datasets.ImageFolder(root, transform=reference_transform(recipe))
    kw = dict(prefetch_factor=2, persistent_workers=True) if workers else {}
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=recipe == "train",
                                         num_workers=workers, **kw)
    return lambda: loader


def dali_epochs(root, recipe):
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.auto_aug import trivial_augment
    n_files = len(samples_of(root))
    mean = [m * 255 for m in MEAN]
    std = [s * 255 for s in STD]
    common = dict(batch_size=BATCH, num_threads=cores(), device_id=None, prefetch_queue_depth=2)

    # Conditionals (DALI's per-sample `if`): TrivialAugment's choice of operation and erasing.
    @pipeline_def(enable_conditionals=True, **common)
    def train():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0],
                                               random_aspect_ratio=[3 / 4, 4 / 3],
                                               num_attempts=10)
        images = fn.resize(images, resize_x=TRAIN_CROP, resize_y=TRAIN_CROP,
                           interp_type=types.INTERP_LINEAR, antialias=True)
        # Without `shape`, translations are bounded by 32 px (its default), as torchvision's
        images = trivial_augment.trivial_augment_wide(images, fill_value=0,
                                                      interp_type=types.INTERP_LINEAR)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mirror=fn.random.coin_flip(), mean=mean, std=std)
        if fn.random.coin_flip(probability=ERASE_P, dtype=types.BOOL):
            images = dali_erase(images)
        return images, labels

    @pipeline_def(**common)
    def val():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=False, name="Reader")
        images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_shorter=VAL_RESIZE, interp_type=types.INTERP_LINEAR,
                           antialias=True)
        images = fn.crop_mirror_normalize(images, crop=(VAL_CROP, VAL_CROP), dtype=types.FLOAT,
                                          output_layout="CHW", mean=mean, std=std)
        return images, labels

    return dali_epoch(train() if recipe == "train" else val(), n_files)


def dali_erase(images):
    """torchvision's RandomErasing(scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0) with DALI's
    operators, on a normalized CHW float image: a rectangle of that area fraction and log-uniform
    aspect ratio at a uniform position, clipped to the image (torchvision redraws instead)."""
    from nvidia.dali import fn
    from nvidia.dali import math as dmath
    area = fn.random.uniform(range=[0.02, 0.33])
    ratio = dmath.exp(fn.random.uniform(range=[math.log(0.3), math.log(3.3)]))
    h = dmath.min(dmath.sqrt(area * ratio), 1.0)
    w = dmath.min(dmath.sqrt(area / ratio), 1.0)
    top = fn.random.uniform(range=[0.0, 1.0]) * (1.0 - h)
    left = fn.random.uniform(range=[0.0, 1.0]) * (1.0 - w)
    return fn.erase(images, anchor=fn.stack(top, left), shape=fn.stack(h, w), axis_names="HW",
                    normalized_anchor=True, normalized_shape=True, fill_value=0.0)


def ffcv_write(root, beton):
    """The .beton FFCV reads: every image of `root` (as RGB, full size) re-encoded as JPEG of
    quality 90, with its label."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter
    from PIL import Image

    class Files:
        def __init__(self, samples):
            self.samples = samples

        def __len__(self):
            return len(self.samples)

        def __getitem__(self, i):
            path, label = self.samples[i]
            with Image.open(path) as im:
                return im.convert("RGB"), label

    writer = DatasetWriter(beton, {"image": RGBImageField(write_mode="jpg", jpeg_quality=90),
                                   "label": IntField()}, num_workers=cores())
    writer.from_indexed_dataset(Files(samples_of(root)))
    return {"written": os.path.getsize(beton)}


def ffcv_epochs(beton, recipe):
    import numpy as np
    from ffcv.fields.decoders import (CenterCropRGBImageDecoder, IntDecoder,
                                      RandomResizedCropRGBImageDecoder)
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import (NormalizeImage, RandomHorizontalFlip, Squeeze, ToTensor,
                                 ToTorchImage)
    mean = np.array(MEAN) * 255
    std = np.array(STD) * 255
    if recipe == "train":
        image = [RandomResizedCropRGBImageDecoder((TRAIN_CROP, TRAIN_CROP)),
                 RandomHorizontalFlip()]
    else:
        image = [CenterCropRGBImageDecoder((VAL_CROP, VAL_CROP), ratio=VAL_CROP / VAL_RESIZE)]
    image += [NormalizeImage(mean, std, np.float32), ToTensor(), ToTorchImage()]
    loader = Loader(beton, batch_size=BATCH, num_workers=cores(), os_cache=True,
                    order=OrderOption.RANDOM if recipe == "train" else OrderOption.SEQUENTIAL,
                    drop_last=False,
                    pipelines={"image": image, "label": [IntDecoder(), ToTensor(), Squeeze()]})
    return lambda: loader


def child(spec, root, epochs, beton):
    """One measurement in a fresh process; prints its figures (or the error that stopped it) as
    JSON, the last line."""
    import warnings
    warnings.simplefilter("ignore")
    kind, recipe, arg = spec.split(":")
    notes = {}
    try:
        if kind == "ffcv-write":
            out = ffcv_write(root, beton)
        else:
            make = {
                "stoker": lambda: stoker_epochs(root, recipe, arg if arg == "auto" else int(arg),
                                                notes),
                "torch": lambda: torch_epochs(root, recipe, int(arg)),
                "dali": lambda: dali_epochs(root, recipe),
                "ffcv": lambda: ffcv_epochs(beton, recipe),
            }[kind]
            out = steady(make(), epochs)
    except Exception as e:  # the figures' place says why: the parent reports it unavailable
        traceback.print_exc()
        out = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:200]}
    after = notes.pop("after", None)
    if after is not None:
        try:
            after()
        except Exception:  # the figures (or the error) still go out
            traceback.print_exc()
    emit(out | notes)


# ---- the parent: environments, data, the table ----------------------------------------------

def python_of(kind):
    """The interpreter for a configuration: this one (stoker, torch), or the peer's."""
    env = {"dali": "dali", "ffcv": "ffcv", "ffcv-write": "ffcv"}.get(kind)
    return sys.executable if env is None else peer_python(env)


def configurations(recipe, quick):
    n = cores()
    stoker_static = sorted({1, 2, n + 1} if not quick else {2})
    torch_workers = (0, 1, 2, 3, 4) if not quick else (0, 2)
    out = [("stoker", "auto")] + [("stoker", str(w)) for w in stoker_static]
    out += [("torch", str(w)) for w in torch_workers] + [("dali", ""), ("ffcv", "")]
    return out


def measure(kind, recipe, arg, root, args, beton=""):
    py = python_of(kind)
    if py is None:
        return {"error": f"environment missing (bash bench/setup_peers.sh "
                         f"{'ffcv' if kind.startswith('ffcv') else kind})"}
    cmd = [py, os.path.abspath(__file__), "--child", f"{kind}:{recipe}:{arg}", "--root",
           str(root), "--epochs", str(args.epochs), "--beton", beton]
    try:
        return run_measured(cmd, timeout=args.timeout)
    except (RuntimeError, ValueError) as e:
        return {"error": str(e)}


def subset_root(root, tmp, count):
    """A folder of symlinks to `count` files of `root`, every k-th in ImageFolder's order (all
    classes kept), for a smoke run."""
    samples = samples_of(root)
    step = max(1, len(samples) // count)
    return link_files([p for p, _ in samples[::step][:count]], root, Path(tmp) / "subset")


def run_dataset(profile, args):
    import stoker
    from stoker.sample_data import default_sample_root, make_sample
    manifest = make_sample(default_sample_root(profile), profile=profile)
    full = default_sample_root(profile) / "train"
    with tempfile.TemporaryDirectory() as tmp:
        root = subset_root(full, tmp, args.images) if args.images else full
        read_files(p for p, _ in samples_of(root))  # every loader reads from RAM
        f = manifest["files"]
        c = manifest["counts"]
        print(f"\n== {profile}: {len(samples_of(root))} of {c['images']} JPEGs in {full} (mean "
              f"{f['width']['mean']:.0f}x{f['height']['mean']:.0f}, "
              f"{f['bytes']['mean'] / 1024:.0f} KB, {c['progressive']} progressive, "
              f"{c['grayscale']} grayscale); {cores()} cores, batch {BATCH}; stoker "
              f"{stoker.__version__}", flush=True)
        beton, no_beton = "", "not asked for"
        if wanted("ffcv", args):
            beton = str(Path(tmp) / "images.beton")
            w = measure("ffcv-write", "-", "", root, args, beton)
            if "error" in w:
                beton, no_beton = "", w["error"]
            else:
                print(f"   FFCV's .beton: {w['written'] / 2**20:.0f} MB (written before the "
                      f"measurements, not timed)")
        results = {}
        for rep in range(args.repeats):
            for recipe in args.recipes:
                configs = configurations(recipe, args.quick)
                if recipe == "train":
                    configs.append(("stoker-own", "auto"))
                for kind, arg in configs:
                    if not wanted(kind, args):
                        continue
                    if kind == "ffcv" and not beton:
                        r = {"error": f"no .beton: {no_beton}"}
                    else:
                        r = measure(kind.replace("stoker-own", "stoker"),
                                    "rrc" if kind == "stoker-own" else recipe, arg, root, args,
                                    beton)
                    results.setdefault((recipe, kind, arg), []).append(r)
                    print("." if "error" not in r else "x", end="", flush=True)
        print()
    return {recipe: report(profile, recipe, {k[1:]: v for k, v in results.items()
                                             if k[0] == recipe})
            for recipe in args.recipes}


def wanted(kind, args):
    return kind.startswith("stoker") or not args.peers or kind.split("-")[0] in args.peers


def label(kind, arg, recipe):
    if kind == "stoker-own":
        return f"stoker own RRC+flip+normalize {arg}"
    names = {"stoker": "stoker (v2 pipeline)", "torch": "torch DataLoader+torchvision",
             "dali": "DALI CPU", "ffcv": "FFCV"}
    suffix = f"num_workers={arg}" if kind in ("stoker", "torch") else ""
    if kind == "ffcv" and recipe == "train":
        suffix = "(no TA/erasing)"
    return f"{names[kind]} {suffix}".strip()


def report(profile, recipe, results):
    # A configuration that failed keeps what ran where when the loader got that far.
    res = {k: median_of(v, keep=("error", "native", "python")) for k, v in results.items()}
    print(f"\n   {recipe} recipe ({profile})")
    print(f"   {'loader':<44} {'images/s':>9} {'(min-max)':>13} {'CPU ms/img':>10} "
          f"{'peak RSS':>9} {'1st batch':>9}")
    for key, r in res.items():
        if "error" in r:
            print(f"   {label(*key, recipe):<44} unavailable: {r['error']}")
            continue
        spread = f"{r['images_per_s_min']:,.0f}-{r['images_per_s_max']:,.0f}"
        mark = " (partly in Python)" if r.get("python") else ""
        print(f"   {label(*key, recipe):<44} {r['images_per_s']:>9,.0f} {spread:>13} "
              f"{r['cpu_ms_per_image']:>10.2f} {r.get('peak_rss', 0) / 2**20:>7.0f}MB "
              f"{r['first_batch_s']:>8.2f}s{mark}")
    auto = res.get(("stoker", "auto"), {"error": "not run"})
    if "native" in auto:
        print(f"   stoker ran natively: {', '.join(auto['native']) or 'nothing'}; in Python: "
              f"{', '.join(auto['python']) or 'nothing'}")
    ok = {k: r for k, r in res.items() if "error" not in r}
    statics = {k: r for k, r in ok.items() if k[0] == "stoker" and k[1] != "auto"}
    torch_keys = [k for k in ok if k[0] == "torch"]
    torch_best = max(torch_keys, key=lambda k: ok[k]["images_per_s"]) if torch_keys else None
    checks, infos = [], []
    if "error" not in auto:
        rate = auto["images_per_s"]
        if torch_best:
            checks.append((f"stoker auto vs torch best ({label(*torch_best, recipe)})",
                           rate / ok[torch_best]["images_per_s"], 3.0))
        if ("dali", "") in ok:
            checks.append(("stoker auto vs DALI CPU", rate / ok[("dali", "")]["images_per_s"],
                           2.0))
        if recipe == "train" and ("stoker-own", "auto") in ok:
            checks.append(("stoker train recipe vs Stoker's own RRC+flip+normalize (auto)",
                           rate / ok[("stoker-own", "auto")]["images_per_s"], 0.8))
        if ("ffcv", "") in ok:
            infos.append(("stoker auto vs FFCV" + (" (FFCV without TA/erasing)"
                                                   if recipe == "train" else ""),
                          rate / ok[("ffcv", "")]["images_per_s"]))
        if statics:
            best = max(statics, key=lambda k: ok[k]["images_per_s"])
            infos.append((f"stoker auto vs best static ({label(*best, recipe)})",
                          rate / ok[best]["images_per_s"]))
        if torch_best:
            infos.append((f"stoker auto peak RSS vs torch best",
                          auto["peak_rss"] / ok[torch_best]["peak_rss"]))
    print(f"   summary ({recipe}, {profile}):")
    for name, value, target in checks:
        print(f"     {name:<66} {value:6.2f}x  target >= {target:<4} "
              f"{'PASS' if value >= target else 'FAIL'}")
    for name, value in infos:
        print(f"     {name:<66} {value:6.2f}x")
    if not checks:
        print("     no ratio: stoker or every peer unavailable")
    return {"results": {f"{k}:{a}": r for (k, a), r in res.items()},
            "checks": [{"name": n, "value": v, "target": f">= {t}"} for n, v, t in checks]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 256 images, one repeat, one timed epoch, fewer "
                        "num_workers (not recorded)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--datasets", default="imagenet",
                   help="sample data profiles, comma-separated: imagenet, large")
    p.add_argument("--recipes", default="train,val")
    p.add_argument("--images", type=int, default=None,
                   help="measure on this many of the dataset's images (default: all; --quick: "
                        "256)")
    p.add_argument("--peers", default="", help="comma-separated subset of torch, dali, ffcv "
                   "(default: all)")
    p.add_argument("--json", help="write every figure to this file")
    p.add_argument("--timeout", type=float, default=900,
                   help="seconds a configuration may run before it is killed (default 900)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--beton", help=argparse.SUPPRESS)
    p.add_argument("--epochs", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.root, args.epochs, args.beton)
    if args.quick:
        args.repeats = 1
        args.images = args.images or 256
    args.epochs = args.epochs or (1 if args.quick else 3)
    args.peers = [x for x in args.peers.split(",") if x]
    args.recipes = [x for x in args.recipes.split(",") if x]
    for r in args.recipes:
        if r not in RECIPES:
            p.error(f"unknown recipe {r!r} (train, val)")
    print(f"{machine_line()}; peers from {PEERS}")
    if "train" in args.recipes and wanted("dali", args):
        print("DALI CPU's pipeline, where it differs from torchvision's:")
        for line in DALI_NOTES:
            print(f"  - {line}")
    if wanted("ffcv", args):
        print("FFCV's pipeline, where it differs from torchvision's:")
        for line in FFCV_NOTES:
            print(f"  - {line}")
    out = {d: run_dataset(d, args) for d in args.datasets.split(",")}
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    import record  # bench/record.py: this output also goes to bench/results/
    sys.exit(record.run(main))
