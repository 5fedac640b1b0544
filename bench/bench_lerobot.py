#!/usr/bin/env python3
"""stoker.LeRobotDataset against lerobot's own LeRobotDataset in torch's DataLoader, side by side
in one run.

The dataset is written once into bench/data/lerobot/ (git-ignored) by lerobot's own writer
(``LeRobotDataset.create``, ``add_frame``, ``save_episode``; its default encoding: AV1 with
libsvtav1, crf 30, a keyframe every 2 frames, encoded as frames arrive): 2 cameras at 640x480,
30 fps, 50 episodes of 10 s, each camera panning across a real photograph (scikit-image's, as
bench_video.py's videos), 6-value state and action.

Contenders, each in a fresh process (peak RSS summed over it and its workers), all reading the
same steps with ``delta_timestamps`` of 2 frames per camera (the step and the one before), frames
float32 [C, H, W] in [0, 1], batch 8, shuffled:
* stoker: ``stoker.LeRobotDataset`` in ``stoker.DataLoader`` (num_workers="auto");
  stoker-no-deltas, the same without ``delta_timestamps`` (one frame per camera); stoker-uint8,
  with ``frame_dtype="uint8"`` (frames left for a GPU-side conversion: not lerobot's item).
* bound: FFmpeg decoding, for each camera of each step, every frame from the keyframe before the
  step's first frame to its last, nothing converted, in a bare C++ loop on as many threads as
  cores (``stoker._video.testing.decode_bound``, as bench_video.py's; a STOKER_TESTING build): the
  cost no loader that delivers these frames avoids.
* lerobot-torchcodec:<w>: lerobot's ``LeRobotDataset(video_backend="torchcodec")`` in torch's
  DataLoader at w workers (persistent). lerobot's other backend, "pyav", goes through
  ``torchvision.io.VideoReader``, which torchvision no longer has (0.29 here): it is reported
  unavailable, not hidden. A peer's best worker count is its figure.

lerobot runs from .venv/lerobot (requirements-lerobot.txt: without its pins, which clash with
.venv's). Each measurement warms up (one batch), then times --batches batches; --repeat runs
interleave and the median is shown.

Targets (issue 38): stoker >= 3x the best peer, peak RSS <= 0.5x the best peer's.

    python bench/bench_lerobot.py [--repeat 3] [--batches 30] [--workers 0,1,2,4] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

import harness
from harness import median_of, run_measured

HERE = os.path.abspath(__file__)
DATA = Path(__file__).resolve().parent / "data" / "lerobot"
LEROBOT = harness.REPO / ".venv" / "lerobot"
CAMERAS = ("observation.images.front", "observation.images.wrist")
FULL = dict(episodes=50, seconds=10, width=640, height=480, fps=30)
BATCH = 8


def deltas(fps):
    return {cam: [-1 / fps, 0.0] for cam in CAMERAS}


def lerobot_module():
    if LEROBOT.is_dir() and str(LEROBOT) not in sys.path:
        sys.path.append(str(LEROBOT))
    from lerobot.datasets import lerobot_dataset
    return lerobot_dataset


# --- data -----------------------------------------------------------------------------------

def make_dataset(p):
    """The dataset (made once), written by lerobot."""
    root = DATA / f"robot-{p['episodes']}x{p['seconds']}s-{p['width']}x{p['height']}"
    done = root / ".complete"
    if done.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    os.environ.setdefault("SVT_LOG", "1")
    from bench_video import canvas
    lr = lerobot_module()
    w, h, fps = p["width"], p["height"], p["fps"]
    features = {"observation.state": {"dtype": "float32", "shape": (6,), "names": None},
                "action": {"dtype": "float32", "shape": (6,), "names": None}}
    for cam in CAMERAS:
        features[cam] = {"dtype": "video", "shape": (h, w, 3),
                         "names": ["height", "width", "channels"]}
    t0 = time.time()
    ds = lr.LeRobotDataset.create("stoker/bench", fps=fps, root=root, features=features,
                                  use_videos=True, streaming_encoding=True)
    rng = np.random.default_rng(0)
    n = p["seconds"] * fps
    for e in range(p["episodes"]):
        views = [canvas(e + 3 * c, w, h) for c in range(len(CAMERAS))]
        paths = []
        for view in views:
            room_y, room_x = view.shape[0] - h, view.shape[1] - w
            phase, speed = rng.uniform(0, 2 * np.pi, 2), rng.uniform(0.5, 2.0, 2) / n
            paths.append([(int((0.5 + 0.5 * np.sin(phase[0] + 2 * np.pi * speed[0] * i))
                                * room_y),
                           int((0.5 + 0.5 * np.sin(phase[1] + 2 * np.pi * speed[1] * i))
                               * room_x)) for i in range(n)])
        for i in range(n):
            step = {"observation.state": rng.standard_normal(6).astype(np.float32),
                    "action": rng.standard_normal(6).astype(np.float32),
                    "task": ("pick the cube", "stack the cubes")[e % 2]}
            for cam, view, path in zip(CAMERAS, views, paths):
                y, x = path[i]
                step[cam] = np.ascontiguousarray(view[y:y + h, x:x + w])
            ds.add_frame(step)
        ds.save_episode()
    ds.finalize()
    done.write_text(f"{p}\n")
    print(f"made {p['episodes']} episodes in {root} ({time.time() - t0:.0f} s)", flush=True)
    return root


# --- the measurements -------------------------------------------------------------------------

def timed(batches, n_batches):
    """Steps/s over n_batches batches after one of warm-up (bench_video.py's timing)."""
    from bench_video import timed as timed_batches
    rate, _, first = timed_batches(batches, lambda batch: None, lambda batch: len(batch["task"]),
                                   n_batches)
    return {"steps_per_s": rate, "first_batch_s": first}


def child_stoker(args, variant):
    import stoker
    ds = stoker.LeRobotDataset(args.root, delta_timestamps=None if variant == "no-deltas" else
                               deltas(args.fps),
                               frame_dtype="uint8" if variant == "uint8" else "float32")
    loader = stoker.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=0)

    def batches(epoch):
        loader.set_epoch(epoch)
        return iter(loader)

    before = ds.stats()
    out = timed(batches, args.batches)
    after = ds.stats()
    delivered = after["frames_delivered"] - before["frames_delivered"]
    out["decoded_per_delivered"] = (after["frames_decoded"] - before["frames_decoded"]) / \
        max(1, delivered)
    return out


def child_lerobot(args, backend, workers):
    import torch
    lr = lerobot_module()
    ds = lr.LeRobotDataset("stoker/bench", root=args.root, delta_timestamps=deltas(args.fps),
                           video_backend=backend)
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers,
                                         persistent_workers=workers > 0,
                                         generator=torch.Generator().manual_seed(0))
    return timed(lambda epoch: iter(loader), args.batches)


def child_bound(args, threads):
    """The decode bound: each (camera, step) decoded from the keyframe before its first frame to
    its last, for the steps of --batches batches drawn at random."""
    import pyarrow.parquet as pq
    import stoker._video as V
    info = json.loads((Path(args.root) / "meta" / "info.json").read_text())
    episodes = pq.read_table(next((Path(args.root) / "meta" / "episodes").rglob("*.parquet")))
    episodes = episodes.to_pylist()
    rng = np.random.default_rng(1)
    jobs = []
    for _ in range(args.batches * BATCH):
        ep = episodes[int(rng.integers(len(episodes)))]
        t = int(rng.integers(ep["length"]))
        for cam in CAMERAS:
            path = Path(args.root) / info["video_path"].format(
                video_key=cam, chunk_index=ep[f"videos/{cam}/chunk_index"],
                file_index=ep[f"videos/{cam}/file_index"])
            first = round(ep[f"videos/{cam}/from_timestamp"] * args.fps) + max(0, t - 1)
            last = round(ep[f"videos/{cam}/from_timestamp"] * args.fps) + t
            jobs.append((str(path), first, last))
    V.testing.decode_bound(jobs[:BATCH * len(CAMERAS)], threads)  # warm up: page cache, libraries
    seconds, decoded = V.testing.decode_bound(jobs, threads)
    steps = args.batches * BATCH
    return {"steps_per_s": steps / seconds, "first_batch_s": 0.0,
            "decoded_per_delivered": decoded / (steps * 2 * len(CAMERAS))}


def child(args):
    kind, _, workers = args.child.partition(":")
    if kind == "bound":
        figures = child_bound(args, int(workers))
    elif kind.startswith("stoker"):
        figures = child_stoker(args, kind.removeprefix("stoker").removeprefix("-"))
    else:
        figures = child_lerobot(args, kind.removeprefix("lerobot-"), int(workers))
    harness.emit(figures)


def backend_available(backend):
    """None when lerobot's backend can run here, else why not."""
    try:
        if backend == "torchcodec":
            import torchcodec.decoders  # noqa: F401 -- loads the system's FFmpeg
        else:
            import torchvision.io
            if not hasattr(torchvision.io, "VideoReader"):
                import torchvision
                return (f"lerobot's pyav backend reads through torchvision.io.VideoReader, which "
                        f"torchvision {torchvision.__version__} no longer has")
    except Exception as e:  # noqa: BLE001 -- any failure to load is the reason
        return f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return None


def measure(args, root, contender, fps):
    cmd = [sys.executable, HERE, "--child", contender, "--root", str(root), "--fps", str(fps),
           "--batches", str(args.batches)]
    try:
        return run_measured(cmd, timeout=1800)
    except RuntimeError as e:
        return {"error": str(e)}


def report(p, results, missing):
    print(f"\n== {p['episodes']} episodes of {p['seconds']} s, 2 cameras {p['width']}x"
          f"{p['height']} AV1 at {p['fps']} fps (lerobot's writer); delta_timestamps: 2 frames "
          f"a camera; batch {BATCH}")
    from bench_video import contender_table
    contender_table(results, "steps_per_s", "steps/s", 22)
    for backend, why in missing.items():
        print(f"{'lerobot-' + backend:>22}  not available: {why}")
    ok = {c: r for c, r in results.items() if "error" not in r}
    stoker = ok.get("stoker")
    peers = {c: r for c, r in ok.items() if c.startswith("lerobot-")}
    bound = next((r for c, r in ok.items() if c.startswith("bound")), None)
    if stoker is None or not peers:
        return
    best = max(peers, key=lambda c: peers[c]["steps_per_s"])
    print(f"stoker / best peer ({best}): "
          f"{stoker['steps_per_s'] / peers[best]['steps_per_s']:.2f}x")
    if bound:
        print(f"stoker / decode bound: {stoker['steps_per_s'] / bound['steps_per_s']:.2f}x; "
              f"the bound / best peer: {bound['steps_per_s'] / peers[best]['steps_per_s']:.2f}x")
    print(f"peak RSS, stoker / best peer: {stoker['peak_rss'] / peers[best]['peak_rss']:.2f}x")
    if "stoker-uint8" in ok:
        print(f"stoker with uint8 frames: {ok['stoker-uint8']['steps_per_s']:.1f} steps/s "
              f"({ok['stoker-uint8']['steps_per_s'] / peers[best]['steps_per_s']:.2f}x the best "
              f"peer)")
    if "stoker-no-deltas" in ok:
        print(f"stoker without delta_timestamps: {ok['stoker-no-deltas']['steps_per_s']:.1f} "
              f"steps/s ({ok['stoker-no-deltas']['steps_per_s'] / stoker['steps_per_s']:.2f}x "
              f"with them)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--workers", default="0,1,2,4")
    ap.add_argument("--quick", action="store_true", help="4 episodes of 2 s, for a smoke run")
    ap.add_argument("--json", help="write every figure to this file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--fps", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    p = dict(FULL)
    if args.quick:
        p.update(episodes=4, seconds=2)
    print(harness.machine_line(), flush=True)
    print(f"median of {args.repeat} interleaved runs, each in a fresh process; "
          f"{args.batches} batches timed after one of warm-up", flush=True)
    root = make_dataset(p)
    harness.read_files([str(f) for f in root.rglob("*.mp4")])
    contenders = ["stoker", "stoker-no-deltas", "stoker-uint8", f"bound:{harness.cores()}"]
    missing = {}
    for backend in ("torchcodec", "pyav"):
        why = backend_available(backend)
        if why:
            missing[backend] = why
        else:
            contenders += [f"lerobot-{backend}:{w}" for w in args.workers.split(",")]
    runs = {c: [] for c in contenders}
    for _ in range(args.repeat):  # interleaved: each round measures every contender once
        for c in contenders:
            runs[c].append(measure(args, root, c, p["fps"]))
    results = {c: median_of(rs) for c, rs in runs.items()}
    report(p, results, missing)
    if args.json:
        harness.write_json(args.json, {"params": p, "results": results, "missing": missing})
    return 0


if __name__ == "__main__":
    import record
    sys.exit(record.run(main))
