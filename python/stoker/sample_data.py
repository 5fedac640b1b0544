"""Built-in, realistic sample data: an ImageNet-like dataset made from real photographs.

``make_sample(root)`` writes, deterministically for a given seed:

* ``root/train/<class>/<key>.JPEG``   torchvision ``ImageFolder`` layout,
* ``root/shards/train-NNNN.tar``      WebDataset shards (``<key>.jpg`` + ``<key>.cls``)
                                      holding the very same JPEG bytes, shuffled across classes,
* ``root/manifest.json``              parameters, classes, counts and size statistics.

``profile="large"`` builds a second kind of dataset from the same photographs: 640-1024 px on
the long side, ~15% progressive, ~8% grayscale (photos as today's cameras and crawls save them;
bench/bench_images.py reports both).

Why real photos and not noise: JPEG decode cost, file size and entropy-coder behaviour depend
on image content. Noise images decode at a different speed and compress badly, so benchmarks
on them mislead. Every image here is a random crop / flip / colour jitter / rescale of a
real photograph, encoded with ImageNet-like statistics (about 500x375 on average, ~100 KB,
quality 75-95, ~5% progressive, ~3% grayscale, the rest baseline RGB 4:2:0).

Source photographs ship inside the scikit-image wheel (``skimage/data/``); nothing is
downloaded at run time. scikit-image is located on disk but never imported, so only its files
are needed. Licenses (from the scikit-image ``skimage.data`` docstrings):

* astronaut.png          NASA (Eileen Collins), public domain
* chelsea.png            Stefan van der Walt, CC0
* coffee.png             Rachel Michetti / Pikolo Espresso Bar, CC0
* rocket.jpg             SpaceX (DSCOVR launch), released into the public domain
* hubble_deep_field.jpg  NASA, public domain
* retina.jpg             Mikael Haggstrom, CC0 1.0
* ihc.png                CMMI, no known copyright restrictions

(scikit-learn's china.jpg / flower.jpg are CC BY 2.0, not public domain, so they are not used.)

Run-time dependencies: numpy, Pillow, and the scikit-image package files.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import importlib.util
import io
import json
import math
import os
import shutil
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

__all__ = ["FORMAT_VERSION", "default_sample_root", "make_sample", "main"]

# Bump whenever the bytes a given seed produces change (pipeline, layout, manifest schema):
# a cache with another version is rebuilt.
FORMAT_VERSION = 1

_GENERATOR = "stoker.sample_data"

# (short name, file inside skimage/data, license). Order is fixed: class names derive from it.
_SOURCES = (
    ("astronaut", "astronaut.png", "public domain (NASA)"),
    ("chelsea", "chelsea.png", "CC0 (Stefan van der Walt)"),
    ("coffee", "coffee.png", "CC0 (Rachel Michetti)"),
    ("rocket", "rocket.jpg", "public domain (SpaceX)"),
    ("hubble", "hubble_deep_field.jpg", "public domain (NASA)"),
    ("retina", "retina.jpg", "CC0 1.0 (Mikael Haggstrom)"),
    ("ihc", "ihc.png", "no known copyright restrictions (CMMI)"),
)

# Statistics of the generated files, tuned so a default build lands near ImageNet's train set
# (mean ~500x375). The source photos are smoother than typical Flickr shots, so quality is
# skewed high and grain/sharpening are added to bring the mean file size toward ~100 KB.
# Per profile: long side range (None: ImageNet's distribution, _draw_size), progressive and
# grayscale fractions.
_PROFILES = {
    "imagenet": {"long_side": None, "progressive": 0.05, "grayscale": 0.03},
    "large": {"long_side": (640, 1024), "progressive": 0.15, "grayscale": 0.08},
}
_QUALITY_RANGE = (75, 95)  # inclusive
_MIN_SIDE, _MAX_SIDE = 200, 800
_ASPECTS = (4 / 3, 3 / 2, 5 / 4, 16 / 9, 1.0)  # long side / short side
_ASPECT_P = (0.40, 0.38, 0.05, 0.12, 0.05)
_PORTRAIT_FRACTION = 0.10
_SECONDARY_PHOTO_FRACTION = 0.25  # a class draws this share from its second photo
_NOISE_SIGMA = (3.0, 8.0)  # sensor grain, in 8-bit levels
_QUALITY_SKEW = 6.0
_QUALITY_UNIFORM = 0.2  # with the skew: mean quality ~91, all of 75-95 used
_CROP_AREA = (0.45, 1.0)  # fraction of the largest crop with the output aspect
_SHARPEN = (120, 220)  # unsharp-mask percent


def default_sample_root(profile: str = "imagenet") -> Path:
    """``$STOKER_SAMPLE_DIR`` if set, else ``~/.cache/stoker/sample-v1`` (shared by checkouts);
    other profiles live beside it (``sample-large-v1``)."""
    _check_profile(profile)
    name = "sample-v1" if profile == "imagenet" else f"sample-{profile}-v1"
    env = os.environ.get("STOKER_SAMPLE_DIR")
    if env:
        base = Path(os.path.expanduser(env))
        return base if profile == "imagenet" else base.with_name(f"{base.name}-{profile}")
    return Path(os.path.expanduser(f"~/.cache/stoker/{name}"))


def _check_profile(profile: str) -> None:
    if profile not in _PROFILES:
        raise ValueError(f"profile must be one of {sorted(_PROFILES)}, got {profile!r}")


# --------------------------------------------------------------------------- source photos


def _skimage_data_dir() -> Path:
    # find_spec on a top-level package locates it without executing it: we need its files only.
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "stoker sample data needs the photographs shipped in the scikit-image wheel; "
            "install it with `pip install scikit-image`"
        )
    for location in spec.submodule_search_locations:
        d = Path(location) / "data"
        if d.is_dir():
            return d
    raise RuntimeError("scikit-image is installed but has no skimage/data directory")


_photo_lock = threading.Lock()
_photo_cache: dict[str, Image.Image] = {}


def _source_paths() -> list[Path]:
    d = _skimage_data_dir()
    paths = [d / fname for _, fname, _ in _SOURCES]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise RuntimeError(
            "scikit-image is installed but lacks sample photographs: " + ", ".join(missing)
        )
    return paths


def _load_photos() -> dict[str, Image.Image]:
    with _photo_lock:
        if not _photo_cache:
            for (name, _, _), path in zip(_SOURCES, _source_paths()):
                with Image.open(path) as im:
                    _photo_cache[name] = im.convert("RGB")
        return _photo_cache


# --------------------------------------------------------------------------- the plan


def _class_names(num_classes: int) -> list[str]:
    # Zero-padded index first, so sorted(names) (ImageFolder's order) equals the label order.
    width = max(3, len(str(num_classes - 1)))
    return [f"c{c:0{width}d}_{_SOURCES[c % len(_SOURCES)][0]}" for c in range(num_classes)]


def _class_styles(num_classes: int, seed: int) -> list[dict]:
    """Per-class photo subset and colour distortion, so that classes really differ."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 0x51A55])))
    n = len(_SOURCES)
    styles = []
    for c in range(num_classes):
        primary = c % n
        secondary = (primary + 1 + 2 * (c // n)) % n
        # Mixing matrix close to identity plus a per-class tint; gamma per class.
        mix = np.eye(3) + rng.uniform(-0.06, 0.06, size=(3, 3))
        tint = rng.uniform(-10.0, 10.0, size=3)
        styles.append(
            {
                "photos": (_SOURCES[primary][0], _SOURCES[secondary][0]),
                "mix": [[float(v) for v in row] for row in mix],
                "tint": [float(v) for v in tint],
                "gamma": float(rng.uniform(0.85, 1.18)),
                # Preferred crop centre (fractions of the photo), so same-photo classes differ.
                "centre": [float(v) for v in rng.uniform(0.3, 0.7, size=2)],
            }
        )
    return styles


def _draw_size(rng: np.random.Generator, profile: str) -> tuple[int, int]:
    long_range = _PROFILES[profile]["long_side"]
    if long_range is not None:
        long_side = float(rng.uniform(*long_range))
    elif rng.random() < 0.55:
        long_side = 500.0  # Flickr "medium" size: the most common long side in ImageNet
    else:
        long_side = float(np.clip(rng.lognormal(math.log(510.0), 0.22), 260.0, _MAX_SIDE))
    aspect = float(rng.choice(_ASPECTS, p=_ASPECT_P)) * float(rng.uniform(0.98, 1.02))
    short_side = max(_MIN_SIDE, min(long_side, long_side / aspect))
    w, h = int(round(long_side)), int(round(short_side))
    if rng.random() < _PORTRAIT_FRACTION:
        w, h = h, w
    return w, h


def _draw_quality(rng: np.random.Generator) -> int:
    # Most Flickr-sourced ImageNet files are saved at high quality: Beta(a, 1) (mean
    # a / (a + 1)) skews toward the top, and a uniform share keeps the whole range in use.
    lo, hi = _QUALITY_RANGE
    if rng.random() < _QUALITY_UNIFORM:
        u = float(rng.random())
    else:
        u = float(rng.beta(_QUALITY_SKEW, 1.0))
    return lo + min(hi - lo, int(math.floor((hi - lo + 1) * u)))


def _make_plan(num_classes: int, images_per_class: int, seed: int,
               profile: str = "imagenet") -> list[dict]:
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 0x97A4])))
    names = _class_names(num_classes)
    total = num_classes * images_per_class
    plan = []
    for c in range(num_classes):
        for j in range(images_per_class):
            w, h = _draw_size(rng, profile)
            plan.append(
                {
                    "label": c,
                    "class_name": names[c],
                    # ImageNet-like key, unique over the dataset, no dots (WebDataset splits there).
                    "key": f"{names[c]}_{j:05d}",
                    "size": (w, h),
                    "quality": _draw_quality(rng),
                    "secondary": bool(rng.random() < _SECONDARY_PHOTO_FRACTION),
                    "seed": int(rng.integers(0, 2**63 - 1)),
                    "progressive": False,
                    "grayscale": False,
                }
            )
    # Exact fractions (not coin flips) so even small builds contain both kinds of odd files.
    n_prog = max(1, round(_PROFILES[profile]["progressive"] * total))
    n_gray = max(1, round(_PROFILES[profile]["grayscale"] * total))
    for i in rng.permutation(total)[:n_prog]:
        plan[int(i)]["progressive"] = True
    for i in rng.permutation(total)[:n_gray]:
        plan[int(i)]["grayscale"] = True
    return plan


# --------------------------------------------------------------------------- rendering


def _render(item: dict, style: dict, photos: dict[str, Image.Image]) -> bytes:
    rng = np.random.Generator(np.random.PCG64(item["seed"]))
    photo = photos[style["photos"][1 if item["secondary"] else 0]]
    pw, ph = photo.size
    w, h = item["size"]

    # Random crop with the output's aspect (slightly jittered), random scale and position,
    # biased toward the class's preferred centre.
    aspect = (w / h) * float(rng.uniform(0.93, 1.07))
    max_cw = min(pw, ph * aspect)
    scale = math.sqrt(float(rng.uniform(*_CROP_AREA)))
    cw = max(16.0, max_cw * scale)
    ch = min(float(ph), cw / aspect)
    cx = style["centre"][0] * pw + float(rng.normal(0.0, 0.18)) * pw
    cy = style["centre"][1] * ph + float(rng.normal(0.0, 0.18)) * ph
    left = min(max(0.0, cx - cw / 2), pw - cw)
    top = min(max(0.0, cy - ch / 2), ph - ch)
    box = (left, top, left + cw, top + ch)
    img = photo.resize((w, h), Image.Resampling.BICUBIC, box=box)
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    # Upscaled crops are soft; a camera's in-body sharpening puts the detail back.
    img = img.filter(ImageFilter.UnsharpMask(radius=1.0, percent=int(rng.integers(*_SHARPEN)),
                                             threshold=2))

    # Colour: class mixing matrix + tint, then per-image brightness/contrast/saturation jitter.
    # Elementwise float ops only (no BLAS, no transcendental ufuncs) so bytes are reproducible.
    a = np.asarray(img, dtype=np.float32)
    mix = style["mix"]
    out = np.empty_like(a)
    for k in range(3):
        out[..., k] = (
            a[..., 0] * np.float32(mix[k][0])
            + a[..., 1] * np.float32(mix[k][1])
            + a[..., 2] * np.float32(mix[k][2])
            + np.float32(style["tint"][k])
        )
    brightness = np.float32(rng.uniform(0.88, 1.12))
    contrast = np.float32(rng.uniform(0.9, 1.1))
    saturation = np.float32(rng.uniform(0.85, 1.15))
    grey = (out[..., 0] * np.float32(0.299) + out[..., 1] * np.float32(0.587)
            + out[..., 2] * np.float32(0.114))[..., None]
    out = grey + (out - grey) * saturation
    mean = np.float32(grey.mean(dtype=np.float64))
    out = (out - mean) * contrast + mean * brightness
    # Sensor grain: real photos carry noise, and it brings file sizes to ImageNet's.
    sigma = float(rng.uniform(*_NOISE_SIGMA))
    out += rng.standard_normal(out.shape, dtype=np.float32) * np.float32(sigma)
    np.clip(out, 0, 255, out=out)
    img = Image.fromarray(np.rint(out).astype(np.uint8), "RGB")

    gamma = style["gamma"]
    lut = [min(255, int(round(255.0 * math.pow(i / 255.0, gamma)))) for i in range(256)]
    img = img.point(lut * 3)
    if item["grayscale"]:
        img = img.convert("L")

    buf = io.BytesIO()
    params = {"quality": item["quality"], "progressive": item["progressive"]}
    if img.mode == "RGB":
        params["subsampling"] = "4:2:0"
    img.save(buf, format="JPEG", **params)
    return buf.getvalue()


# --------------------------------------------------------------------------- building


def _params(num_classes: int, images_per_class: int, shards: int, seed: int,
            profile: str = "imagenet") -> dict:
    params = {
        "num_classes": int(num_classes),
        "images_per_class": int(images_per_class),
        "shards": int(shards),
        "seed": int(seed),
    }
    if profile != "imagenet":  # the default's parameters (and cache) stay as they were
        params["profile"] = profile
    return params


def _read_manifest(root: Path) -> dict | None:
    try:
        with open(root / "manifest.json", encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) else None


def _is_valid_cache(root: Path, params: dict) -> dict | None:
    m = _read_manifest(root)
    if (
        m is not None
        and m.get("generator") == _GENERATOR
        and m.get("format_version") == FORMAT_VERSION
        and m.get("params") == params
        and (root / "train").is_dir()
        and (root / "shards").is_dir()
    ):
        return m
    return None


def _build(tmp: Path, params: dict, workers: int) -> dict:
    num_classes = params["num_classes"]
    seed = params["seed"]
    names = _class_names(num_classes)
    styles = _class_styles(num_classes, seed)
    plan = _make_plan(num_classes, params["images_per_class"], seed,
                      params.get("profile", "imagenet"))
    photos = _load_photos()
    sources = []
    for (name, fname, lic), path in zip(_SOURCES, _source_paths()):
        sources.append({
            "name": name,
            "file": f"skimage/data/{fname}",
            "license": lic,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        })

    train = tmp / "train"
    for name in names:
        (train / name).mkdir(parents=True)

    def work(item: dict) -> int:
        data = _render(item, styles[item["label"]], photos)
        with open(train / item["class_name"] / f"{item['key']}.JPEG", "wb") as f:
            f.write(data)
        return len(data)

    # Threads, not processes: PIL (resize, filter, encode) and numpy release the GIL, and
    # threads avoid fork-with-threads and spawn-needs-__main__-guard pitfalls for callers.
    if workers <= 1:
        nbytes = [work(item) for item in plan]
    else:
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            nbytes = list(pool.map(work, plan))

    # Shards: a seeded shuffle interleaves classes; contiguous near-equal chunks per shard.
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 0x7A4])))
    order = rng.permutation(len(plan))
    shard_dir = tmp / "shards"
    shard_dir.mkdir()
    shard_info = []
    for s, chunk in enumerate(np.array_split(order, params["shards"])):
        name = f"train-{s:04d}.tar"
        with tarfile.open(shard_dir / name, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in chunk:
                item = plan[int(i)]
                data = (train / item["class_name"] / f"{item['key']}.JPEG").read_bytes()
                _add_member(tar, f"{item['key']}.jpg", data)
                _add_member(tar, f"{item['key']}.cls", str(item["label"]).encode("ascii"))
        shard_info.append({
            "name": name,
            "samples": int(len(chunk)),
            "bytes": (shard_dir / name).stat().st_size,
        })

    widths = [it["size"][0] for it in plan]
    heights = [it["size"][1] for it in plan]
    manifest = {
        "generator": _GENERATOR,
        "format_version": FORMAT_VERSION,
        "params": params,
        "seed": seed,
        "classes": names,
        "counts": {
            "images": len(plan),
            "classes": num_classes,
            "per_class": params["images_per_class"],
            "shards": params["shards"],
            "progressive": sum(it["progressive"] for it in plan),
            "grayscale": sum(it["grayscale"] for it in plan),
            "portrait": sum(h > w for w, h in zip(widths, heights)),
        },
        "files": {
            "total_bytes": int(sum(nbytes)),
            "bytes": {
                "mean": round(float(np.mean(nbytes)), 1),
                "min": int(min(nbytes)),
                "median": float(np.median(nbytes)),
                "max": int(max(nbytes)),
            },
            "width": {"mean": round(float(np.mean(widths)), 1), "min": min(widths),
                      "max": max(widths)},
            "height": {"mean": round(float(np.mean(heights)), 1), "min": min(heights),
                       "max": max(heights)},
            "quality": {"min": min(it["quality"] for it in plan),
                        "max": max(it["quality"] for it in plan)},
        },
        "layout": {
            "imagefolder": "train/<class>/<key>.JPEG",
            "shards": "shards/train-NNNN.tar: <key>.jpg + <key>.cls (ASCII decimal label)",
        },
        "shards": shard_info,
        "sources": sources,
    }
    # JSON round trip: a fresh build returns exactly what a cached call would.
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    with open(tmp / "manifest.json", "w", encoding="utf-8") as f:
        f.write(text)
    return json.loads(text)


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0  # fixed metadata so shards are byte-identical between builds
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def _replaceable(root: Path) -> bool:
    """Only an empty directory or an earlier sample build may be replaced, never user data."""
    if not root.exists():
        return True
    if not root.is_dir():
        return False
    if not any(root.iterdir()):
        return True
    m = _read_manifest(root)
    return m is not None and m.get("generator") == _GENERATOR


def sample_dataset(root=None, transform=None):
    """The built-in sample data (made if missing, under ``root`` or the default root) as a
    ``stoker.ImageFolder`` of its training split, with ``transform``."""
    from .sources.images import ImageFolder
    make_sample(root) if root else make_sample()
    base = root or default_sample_root()
    return ImageFolder(os.path.join(base, "train"), transform=transform)


def make_sample(
    root: str | os.PathLike | None = None,
    *,
    num_classes: int = 10,
    images_per_class: int = 100,
    shards: int = 4,
    seed: int = 0,
    workers: int | None = None,
    force: bool = False,
    profile: str = "imagenet",
) -> dict:
    """Build (or reuse) the sample dataset in ``root`` and return its manifest.

    ``root`` defaults to :func:`default_sample_root`. When ``root/manifest.json`` already
    describes a build with the same parameters and format version, it is returned without
    touching any file (unless ``force``). Otherwise the dataset is built in a temporary
    directory beside ``root`` and renamed into place, so an interrupted build never leaves a
    half-built cache. ``workers`` is the number of encoding threads (default: CPU count).
    ``profile``: "imagenet" (the default) or "large" (see the module docstring).
    """
    _check_profile(profile)
    if num_classes < 1 or images_per_class < 1:
        raise ValueError("num_classes and images_per_class must be >= 1")
    total = num_classes * images_per_class
    if not 1 <= shards <= total:
        raise ValueError(f"shards must be between 1 and the number of images ({total})")
    root = Path(root) if root is not None else default_sample_root(profile)
    root = Path(os.path.abspath(os.path.expanduser(root)))
    params = _params(num_classes, images_per_class, shards, seed, profile)

    if not force:
        cached = _is_valid_cache(root, params)
        if cached is not None:
            return cached
    if not _replaceable(root):
        raise FileExistsError(
            f"{root} exists and is not a stoker sample directory; refusing to overwrite it"
        )

    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        manifest = _build(tmp, params, workers or os.cpu_count() or 1)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        _install(tmp, root, params)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # Another process may have won the race with an identical build; either way the
    # directory now holds a complete build with our parameters.
    return _is_valid_cache(root, params) or manifest


def _install(tmp: Path, root: Path, params: dict) -> None:
    try:
        os.rename(tmp, root)  # atomic; also replaces an empty directory
        return
    except OSError:
        if not root.exists():
            raise
    if _is_valid_cache(root, params) is not None:
        shutil.rmtree(tmp, ignore_errors=True)  # a concurrent build got there first
        return
    if not _replaceable(root):
        raise FileExistsError(f"{root} is not a stoker sample directory; not replacing it")
    old = Path(tempfile.mkdtemp(prefix=f".{root.name}.old-", dir=root.parent))
    os.rename(root, old / "x")
    os.rename(tmp, root)
    shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """``make-sample [--root DIR] [--classes N] [--per-class N] [--shards N] [--seed S]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "make-sample":
        argv = argv[1:]
    p = argparse.ArgumentParser(
        prog="stoker make-sample",
        description="Build the ImageNet-like sample dataset (ImageFolder + WebDataset shards).",
    )
    p.add_argument("--root", default=None,
                   help="output directory (default: $STOKER_SAMPLE_DIR or ~/.cache/stoker/sample-v1)")
    p.add_argument("--classes", type=int, default=10, help="number of classes (default 10)")
    p.add_argument("--per-class", type=int, default=100, help="images per class (default 100)")
    p.add_argument("--shards", type=int, default=4, help="number of tar shards (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument("--workers", type=int, default=None, help="encoding threads (default: CPUs)")
    p.add_argument("--force", action="store_true", help="rebuild even if a cache exists")
    p.add_argument("--profile", choices=sorted(_PROFILES), default="imagenet",
                   help="imagenet (default): ImageNet-like sizes; large: 640-1024 px, "
                        "15%% progressive, 8%% grayscale")
    args = p.parse_args(argv)

    root = Path(os.path.abspath(os.path.expanduser(
        args.root or default_sample_root(args.profile))))
    params = _params(args.classes, args.per_class, args.shards, args.seed, args.profile)
    cached = not args.force and _is_valid_cache(root, params) is not None
    t0 = time.perf_counter()
    try:
        m = make_sample(root, num_classes=args.classes, images_per_class=args.per_class,
                        shards=args.shards, seed=args.seed, workers=args.workers,
                        force=args.force, profile=args.profile)
    except (ValueError, RuntimeError, FileExistsError) as e:
        print(f"stoker make-sample: error: {e}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - t0
    c, f = m["counts"], m["files"]
    print(f"sample data in {root}" + (" (cached, not rebuilt)" if cached else ""))
    print(f"  {c['images']} images, {c['classes']} classes x {c['per_class']}, "
          f"{c['shards']} shards, seed {m['seed']}")
    print(f"  mean size {f['width']['mean']:.0f}x{f['height']['mean']:.0f}, "
          f"mean {f['bytes']['mean'] / 1024:.1f} KB, "
          f"{c['progressive']} progressive, {c['grayscale']} grayscale")
    print(f"  total {f['total_bytes'] / 1e6:.1f} MB (images; shards hold a second copy)")
    print(f"  elapsed {elapsed:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
