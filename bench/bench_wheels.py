"""One Stoker built two ways, side by side: the shipped wheel (`make wheels`: zig's clang for
glibc 2.28, manylinux_2_28) against the GCC wheel (`make wheel`: this machine's GCC and glibc,
manylinux_2_34). Same source, same CPython, each wheel installed in a clean virtual environment
of its own (numpy from the index, nothing else), measured in one invocation.

Workloads (each measurement a fresh process; the two builds alternate within every repeat, so
that a slow spell of this shared machine hits both alike; the median of the repeats is shown):
- images: bench_images.py's Stoker pipeline on the built-in sample data: JPEG decode,
  RandomResizedCrop(224), random flip, float32, Normalize, batch of 64, shuffled,
  num_workers = the usable cores, NumPy output; images/s over whole epochs after a warm-up one.
  Decode (libjpeg-turbo: C and NASM) and the resize kernels (Stoker's C++) dominate it.
- png: the same pipeline on PNG copies of 256 of those images (libpng and zlib).
- tokens: TokenDataset windows of 2048 uint16 tokens, batch 64, shuffled, from a 512 MB file in
  the page cache; GB/s of batches (a copy-bound path).

    python bench/bench_wheels.py BASELINE.whl CANDIDATE.whl [--repeats 5] [--quick]
    make bench-wheels    # builds the two cp311 wheels (build/wheels/dist-{gcc,zig}/), then this

Each build's `stoker.info.summary()` line heads the table: the figures say which build they
measured. Run with the checkout's .venv (make install: the sample data is made with Pillow);
the clean environments live in build/bench-wheels/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BATCH = 64
MEAN = (0.485, 0.456, 0.406)  # harness.MEAN / STD: the child imports nothing of the checkout
STD = (0.229, 0.224, 0.225)


# ---- the child: runs in a clean environment (stoker from a wheel, numpy) ----------------------

def cpu_seconds():
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def image_epochs(root, epochs):
    import stoker
    from stoker import transforms as T
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(MEAN, STD)])
    workers = len(os.sched_getaffinity(0))
    loader = stoker.DataLoader(stoker.ImageFolder(root, transform=transform), batch_size=BATCH,
                               shuffle=True, num_workers=workers, output="numpy")
    for _ in loader:  # warm-up epoch: page cache, pools, threads
        pass
    cpu0, t0, n = cpu_seconds(), time.perf_counter(), 0
    for _ in range(epochs):
        for x, _ in loader:
            n += len(x)
    seconds = time.perf_counter() - t0
    return {"per_s": n / seconds, "unit": "images/s",
            "cpu_ms_per_item": (cpu_seconds() - cpu0) / n * 1e3}


def token_epochs(path, epochs):
    import stoker
    ds = stoker.TokenDataset(path, dtype="uint16", seq_len=2048)
    loader = stoker.DataLoader(ds, batch_size=BATCH, shuffle=True, output="numpy",
                               num_workers=len(os.sched_getaffinity(0)))
    for _ in loader:
        pass
    cpu0, t0, nbytes = cpu_seconds(), time.perf_counter(), 0
    for _ in range(epochs):
        for x, y in loader:
            nbytes += x.nbytes + y.nbytes
    seconds = time.perf_counter() - t0
    return {"per_s": nbytes / seconds / 1e9, "unit": "GB/s",
            "cpu_ms_per_item": (cpu_seconds() - cpu0) / max(nbytes / 1e9, 1e-9) * 1e3}


def child(kind, data, epochs):
    import stoker.info
    out = (token_epochs(data, epochs) if kind == "tokens" else image_epochs(data, epochs))
    out["build"] = stoker.info.summary()
    print(json.dumps(out), flush=True)
    os._exit(0)


# ---- the parent ------------------------------------------------------------------------------

def clean_env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LD_PRELOAD", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(LD_LIBRARY_PATH="", PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def environment(wheel, python):
    """build/bench-wheels/<wheel's hash>/venv: `python` with the wheel and numpy (made once)."""
    digest = hashlib.sha256(Path(wheel).read_bytes()).hexdigest()[:16]
    venv = REPO / "build" / "bench-wheels" / digest / "venv"
    py = venv / "bin" / "python"
    if not (venv / ".ok").exists():
        env = clean_env()
        subprocess.run([python, "-m", "venv", "--clear", str(venv)], check=True, env=env)
        subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, env=env)
        (venv / ".ok").write_text(str(wheel))
    return str(py)


def datasets(quick, tmp):
    """{workload: (path, epochs)}: the sample data's JPEGs, PNG copies of some, a token file."""
    import numpy as np
    from PIL import Image
    sys.path.insert(0, str(HERE))
    from harness import link_files, read_files
    from stoker.sample_data import default_sample_root, make_sample
    make_sample(default_sample_root("imagenet"), profile="imagenet")
    root = default_sample_root("imagenet") / "train"
    files = sorted(str(p) for p in root.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    if quick:
        files = files[:: max(1, len(files) // 128)]
    jpegs = link_files(files, root, Path(tmp) / "jpeg")
    pngs = Path(tmp) / "png"
    for f in files[:: max(1, len(files) // (32 if quick else 256))]:
        dst = pngs / Path(f).relative_to(root).with_suffix(".png")
        dst.parent.mkdir(parents=True, exist_ok=True)
        with Image.open(f) as im:
            im.convert("RGB").save(dst)
    tokens = Path(tmp) / "tokens.bin"
    n = (16 if quick else 512) << 20
    np.random.default_rng(0).integers(0, 50000, n // 2, dtype=np.uint16).tofile(tokens)
    read_files(files + [str(p) for p in pngs.rglob("*.png")] + [str(tokens)])
    epochs = 1 if quick else 3
    return {"images": (jpegs, epochs), "png": (pngs, epochs * 4), "tokens": (tokens, epochs)}


def measure(py, kind, data, epochs, timeout):
    cmd = [py, str(Path(__file__).resolve()), "--child", kind, "--data", str(data),
           "--epochs", str(epochs)]
    got = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), timeout=timeout,
                         cwd=tempfile.gettempdir())
    if got.returncode != 0:
        return {"error": got.stderr.strip().splitlines()[-1] if got.stderr.strip() else "failed"}
    return json.loads(got.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("baseline", nargs="?", help="the reference wheel (the GCC build)")
    p.add_argument("candidate", nargs="?", help="the wheel to compare with it (the shipped one)")
    p.add_argument("--python", default=getattr(sys, "_base_executable", sys.executable),
                   help="the CPython both environments are made of (default: this one's)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--workloads", default="images,png,tokens")
    p.add_argument("--quick", action="store_true", help="a smoke run: small data, one repeat")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--json", help="write every figure to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--epochs", type=int, default=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.data, args.epochs)
    if not (args.baseline and args.candidate):
        p.error("give the two wheels: BASELINE.whl CANDIDATE.whl")
    sys.path.insert(0, str(HERE))
    from harness import machine_line
    builds = {"baseline": args.baseline, "candidate": args.candidate}
    pythons = {k: environment(w, args.python) for k, w in builds.items()}
    repeats = 1 if args.quick else args.repeats
    kinds = args.workloads.split(",")
    print(machine_line(build=False) + "; the builds measured are named below")
    results = {(b, k): [] for b in builds for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        data = datasets(args.quick, tmp)
        for rep in range(repeats):
            for kind in kinds:
                order = list(builds) if rep % 2 == 0 else list(builds)[::-1]
                for b in order:
                    path, epochs = data[kind]
                    results[(b, kind)].append(measure(pythons[b], kind, path, epochs,
                                                      args.timeout))
                    print("." if "error" not in results[(b, kind)][-1] else "x", end="",
                          flush=True)
    print()
    summary = {}
    for b, wheel in builds.items():
        first = next((r for k in kinds for r in results[(b, k)] if "build" in r), {})
        print(f"{b:<9} {os.path.basename(wheel)}\n          {first.get('build', '?')}")
    print(f"\n{'workload':<8} {'baseline':>18} {'candidate':>18} {'ratio':>7}  (median of "
          f"{repeats}; min-max in brackets)")
    for kind in kinds:
        row, figures = [], {}
        for b in builds:
            ok = [r for r in results[(b, kind)] if "error" not in r]
            if not ok:
                row.append(f"{'error':>18}")
                figures[b] = {"error": results[(b, kind)][0]["error"]}
                continue
            rates = [r["per_s"] for r in ok]
            figures[b] = {"median": statistics.median(rates), "min": min(rates),
                          "max": max(rates), "unit": ok[0]["unit"],
                          "cpu_ms": statistics.median(r["cpu_ms_per_item"] for r in ok)}
            row.append(f"{figures[b]['median']:>9,.2f} {ok[0]['unit']:<8}")
        ratio = (figures["candidate"]["median"] / figures["baseline"]["median"]
                 if all("median" in f for f in figures.values()) else float("nan"))
        print(f"{kind:<8} {row[0]:>18} {row[1]:>18} {ratio:>6.3f}x")
        for b in builds:
            if "median" in figures[b]:
                f = figures[b]
                print(f"         {b}: [{f['min']:,.2f}-{f['max']:,.2f}] {f['unit']}, "
                      f"CPU {f['cpu_ms']:.3f} ms per {'image' if f['unit'] != 'GB/s' else 'GB'}")
        summary[kind] = figures | {"ratio": ratio}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"builds": builds, "figures": summary}, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    if "--child" in sys.argv:  # a clean environment: nothing of the checkout
        sys.exit(main())
    sys.path.insert(0, str(HERE))
    import record
    sys.exit(record.run(main))
