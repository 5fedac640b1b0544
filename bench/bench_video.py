#!/usr/bin/env python3
"""stoker.VideoDataset against the ways people load video clips today, side by side in one run.

Two profiles, each with videos made once in bench/data/video/ (git-ignored) from real photographs
(scikit-image's) with camera motion (a pan across a larger canvas), a few classes in subfolders:
* kinetics: 200 videos of 10 s, 340x256, 30 fps, H.264 (libx264, preset medium, 3 B-frames, a
  keyframe every 60-150 frames: 2-5 s). Clips of 16 frames at stride 4, RandomResizedCrop(224),
  horizontal flip, float32, Normalize; batch 8, shuffled.
* robot: 40 videos of 5 s, 640x480, 30 fps, AV1 (libsvtav1, crf 30, a keyframe every 2 frames:
  LeRobot's encoding). Clips of 2 consecutive frames, Resize((240, 320)), float32; batch 8.

Contenders, each in a fresh process (its peak RSS summed over it and its workers):
* stoker: ``VideoDataset`` in ``stoker.DataLoader`` (num_workers="auto").
* torch-pyav:<w>, torch-torchcodec:<w>, torch-decord:<w>: torch's DataLoader at w workers
  (persistent) over a map-style dataset that, per clip, draws the same kind of start (torch's
  generator, which the DataLoader seeds per worker),
  decodes the clip's frames with the library and runs torchvision v2 once on the [T, C, H, W]
  video tensor (the same parameters for every frame, as v2 does): PyAV seeking to the keyframe
  before the first frame and decoding forward; torchcodec's ``VideoDecoder(seek_mode=
  "approximate").get_frames_at``; decord's ``VideoReader.get_batch``. Each is skipped when its
  library does not import (``pip install torchcodec decord``; torchcodec needs the system's
  libavdevice too). A peer's best worker count is its figure.
* bound: FFmpeg decoding each clip from its keyframe to its last frame, every frame, nothing
  converted, in a bare C++ loop on as many threads as Stoker's workers
  (``stoker._video.testing.decode_bound``: a STOKER_TESTING build, as ``make install`` makes):
  what a decoder that throws nothing away cannot beat. It decodes the very clips that the same
  round's Stoker run timed (Stoker returns its frames' timestamps), so that both do the same work;
  stoker / bound is the median of the rounds' ratios.
Also reported: frames decoded per frame delivered (Stoker's counts; PyAV's and the bound's by
counting), for the contenders that can tell.

Each measurement warms up (one batch: workers, indexes, page cache), then times --batches
batches; --repeat runs interleave and the median is shown.

Targets (issue 37): kinetics: stoker >= 0.85x the bound, >= 1.5x the best peer, the fewest
frames decoded per frame delivered, peak RSS <= 0.5x the best peer's; robot: >= 3x the best
peer.

    python bench/bench_video.py [--profiles kinetics,robot] [--repeat 3] [--batches 40]
                                [--workers 0,1,2,4] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import harness
from harness import median_of, run_measured

HERE = os.path.abspath(__file__)
DATA = Path(__file__).resolve().parent / "data" / "video"
MEAN = (0.45, 0.45, 0.45)  # Kinetics' usual normalization
STD = (0.225, 0.225, 0.225)
PEERS = ("pyav", "torchcodec", "decord")

PROFILES = {
    "kinetics": dict(videos=200, seconds=10, width=340, height=256, fps=30, codec="libx264",
                     gop=(60, 150), frames=16, stride=4, batch=8, classes=8),
    "robot": dict(videos=40, seconds=5, width=640, height=480, fps=30, codec="libsvtav1",
                  gop=(2, 2), frames=2, stride=1, batch=8, classes=4),
}


# --- data -----------------------------------------------------------------------------------

def canvas(k, width, height):
    """Photograph k (scikit-image's colour ones, in turn), scaled up to at least twice the
    frame on each side: what the camera pans across."""
    from skimage import data
    photos = [data.astronaut, data.coffee, data.chelsea, data.rocket, data.immunohistochemistry,
              data.hubble_deep_field, data.retina, data.colorwheel]
    img = photos[k % len(photos)]()[..., :3]
    scale = max(1, int(np.ceil(max(2 * height / img.shape[0], 2 * width / img.shape[1]))))
    return np.ascontiguousarray(np.kron(img, np.ones((scale, scale, 1), np.uint8)))


def encode(path, canvas_img, p, rng):
    """One video: a pan across the canvas along a smooth random path."""
    import av
    w, h, n = p["width"], p["height"], p["seconds"] * p["fps"]
    room_y, room_x = canvas_img.shape[0] - h, canvas_img.shape[1] - w
    phase = rng.uniform(0, 2 * np.pi, 2)
    speed = rng.uniform(0.5, 2.0, 2) / n
    gop = int(rng.integers(p["gop"][0], p["gop"][1] + 1))
    with av.open(str(path), "w") as c:
        s = c.add_stream(p["codec"], rate=p["fps"])
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        s.codec_context.gop_size = gop
        if p["codec"] == "libx264":
            s.codec_context.max_b_frames = 3
            s.options = {"preset": "medium", "x264-params": f"keyint={gop}:min-keyint={gop}:"
                                                            f"scenecut=0"}
        else:
            s.options = {"preset": "12", "crf": "30"}
        for i in range(n):
            y = int((0.5 + 0.5 * np.sin(phase[0] + 2 * np.pi * speed[0] * i)) * room_y)
            x = int((0.5 + 0.5 * np.sin(phase[1] + 2 * np.pi * speed[1] * i)) * room_x)
            frame = av.VideoFrame.from_ndarray(
                np.ascontiguousarray(canvas_img[y:y + h, x:x + w]), format="rgb24")
            for packet in s.encode(frame):
                c.mux(packet)
        for packet in s.encode():
            c.mux(packet)


def make_videos(name, p):
    """The profile's videos (made once): ``root/<class>/<k>.mp4``."""
    root = DATA / f"{name}-{p['videos']}x{p['seconds']}s"
    done = root / ".complete"
    if done.exists():
        return root
    os.environ.setdefault("SVT_LOG", "1")
    rng = np.random.default_rng(0)
    t0 = time.time()
    for k in range(p["videos"]):
        cls = root / f"class{k % p['classes']:02d}"
        cls.mkdir(parents=True, exist_ok=True)
        encode(cls / f"{k:04d}.mp4", canvas(k % p["classes"], p["width"], p["height"]), p, rng)
    done.write_text(f"{p}\n")
    print(f"made {p['videos']} videos in {root} ({time.time() - t0:.0f} s)", flush=True)
    return root


def video_list(root):
    """[(path, label, frame times)] of the profile's videos, in the class-folder order."""
    import stoker
    from stoker.sources.video import probe
    ds = stoker.VideoDataset(root, frames=1)
    return [(path, label, probe(path)["seconds"]) for path, label, _, _ in ds.videos]


# --- the peers' dataset -----------------------------------------------------------------------

def clip_frames(n, frames, stride, start_draw):
    """A clip's frame indices: a start drawn uniformly from the possible ones by
    ``start_draw(count)`` (the same rule as Stoker's), the last frame repeated when the video is
    short."""
    span = (frames - 1) * stride + 1
    start = int(start_draw(max(0, n - span) + 1))
    return [min(start + t * stride, n - 1) for t in range(frames)]


class PeerClips:
    """torch's map-style dataset of clips, decoded by one of the peers' libraries."""

    def __init__(self, videos, p, library):
        import torch
        from torchvision.transforms import v2
        self.videos, self.p, self.library = videos, p, library
        if p["frames"] > 2:
            steps = [v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()]
        else:
            steps = [v2.Resize((240, 320), antialias=True)]
        self.transform = v2.Compose(steps + [v2.ToDtype(torch.float32, scale=True)] +
                                    ([v2.Normalize(MEAN, STD)] if p["frames"] > 2 else []))

    def __len__(self):
        return len(self.videos)

    def __getitem__(self, i):
        import torch
        path, label, seconds = self.videos[i]
        # torch's generator, which the DataLoader seeds per worker and epoch, as users draw.
        wanted = clip_frames(len(seconds), self.p["frames"], self.p["stride"],
                             lambda count: torch.randint(0, count, ()).item())
        frames, decoded = getattr(self, "_" + self.library)(path, seconds, wanted)
        return self.transform(frames), label, decoded

    def _pyav(self, path, seconds, wanted):
        """Seek to the keyframe before the first frame, decode forward to the last."""
        import av
        import torch
        times = [round(seconds[f], 6) for f in wanted]
        keep, decoded = {}, 0
        with av.open(path) as c:
            s = c.streams.video[0]
            c.seek(int(seconds[wanted[0]] / s.time_base), stream=s, backward=True,
                   any_frame=False)
            for frame in c.decode(s):
                decoded += 1
                t = round(float(frame.time), 6)
                if t in times:
                    keep[t] = torch.from_numpy(frame.to_ndarray(format="rgb24"))
                if t >= times[-1]:
                    break
        return torch.stack([keep[t] for t in times]).permute(0, 3, 1, 2), decoded

    def _torchcodec(self, path, seconds, wanted):
        from torchcodec.decoders import VideoDecoder
        return VideoDecoder(path, seek_mode="approximate").get_frames_at(wanted).data, -1

    def _decord(self, path, seconds, wanted):
        import decord
        import torch
        batch = decord.VideoReader(path, num_threads=1).get_batch(wanted).asnumpy()
        return torch.from_numpy(batch).permute(0, 3, 1, 2), -1


def peer_available(library):
    try:
        if library == "torchcodec":
            from torchcodec.decoders import VideoDecoder  # noqa: F401  (loads FFmpeg)
            import torchcodec._core  # noqa: F401
        else:
            __import__({"pyav": "av"}.get(library, library))
        return None
    except Exception as e:  # noqa: BLE001 - any failure to load means the peer cannot run
        return f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"


# --- measurement children ---------------------------------------------------------------------

def timed(batches, warm_up, count, n_batches):
    """Times n_batches batches from the iterator factory ``batches`` (epochs follow one
    another) after one batch of warm-up; returns (clips/s, clips, first batch seconds)."""
    t0 = time.perf_counter()
    it = batches(0)
    epoch = 0

    def take():
        nonlocal it, epoch
        try:
            return next(it)
        except StopIteration:
            epoch += 1
            it = batches(epoch)
            return next(it)

    warm_up(take())
    first = time.perf_counter() - t0
    clips = 0
    t1 = time.perf_counter()
    for _ in range(n_batches):
        clips += count(take())
    return clips / (time.perf_counter() - t1), clips, first


def child_stoker(args, p, videos):
    import stoker
    import stoker.transforms as T
    if p["frames"] > 2:
        transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                               T.Normalize(MEAN, STD)])
    else:
        transform = T.Compose([T.Resize((240, 320)), T.ToTensor()])
    # Each video labelled by its position and its frames' times returned, so that the clips
    # timed can be told to the bound, which then decodes the same ones.
    ds = stoker.VideoDataset([(v[0], i) for i, v in enumerate(videos)], frames=p["frames"],
                             stride=p["stride"], transform=transform, timestamps=True)
    loader = stoker.DataLoader(ds, batch_size=p["batch"], shuffle=True, seed=0)

    def batches(epoch):
        loader.set_epoch(epoch)
        return iter(loader)

    before = {}
    clips = []  # (video, first frame, last frame) of each clip timed

    def warm_up(batch):
        before.update(ds.stats())

    def count(batch):
        _, labels, times = batch
        clips.extend(zip(labels.tolist(), times[:, 0].tolist(), times[:, -1].tolist()))
        return len(labels)

    rate, n, first = timed(batches, warm_up, count, args.batches)
    after = ds.stats()
    delivered = after["frames_delivered"] - before["frames_delivered"]
    if args.clips:
        frame_at = [{t: k for k, t in enumerate(v[2])} for v in videos]
        Path(args.clips).write_text(json.dumps(
            [(videos[v][0], frame_at[v][t0], frame_at[v][t1]) for v, t0, t1 in clips]))
    return {"clips_per_s": rate, "first_batch_s": first,
            "decoded_per_delivered": (after["frames_decoded"] - before["frames_decoded"]) /
            max(1, delivered)}


def child_peer(args, p, videos, library, workers):
    import torch
    ds = PeerClips(videos, p, library)
    loader = torch.utils.data.DataLoader(ds, batch_size=p["batch"], shuffle=True,
                                         num_workers=workers, persistent_workers=workers > 0,
                                         generator=torch.Generator().manual_seed(0))
    counts = [0, 0]  # frames decoded, frames delivered

    def batches(epoch):
        return iter(loader)

    def count(batch):
        if int(batch[2][0]) >= 0:
            counts[0] += int(batch[2].sum())
            counts[1] += len(batch[1]) * p["frames"]
        return len(batch[1])

    rate, clips, first = timed(batches, lambda b: None, count, args.batches)
    out = {"clips_per_s": rate, "first_batch_s": first}
    if counts[1]:
        out["decoded_per_delivered"] = counts[0] / counts[1]
    return out


def child_bound(args, p, videos, threads):
    """The bound on the clips Stoker's measurement of this round timed (--clips), else on as
    many clips drawn by the same rule."""
    import stoker._video as V
    if args.clips and Path(args.clips).exists():
        jobs = [tuple(j) for j in json.loads(Path(args.clips).read_text())]
        which = "stoker's"
    else:
        rng = np.random.default_rng(1)
        jobs = []
        for i in rng.integers(0, len(videos), args.batches * p["batch"]):
            path, _, seconds = videos[i]
            f = clip_frames(len(seconds), p["frames"], p["stride"],
                            lambda count: rng.integers(count))
            jobs.append((path, f[0], f[-1]))
        which = "drawn"
    V.testing.decode_bound(jobs[:p["batch"]], threads)  # warm up: page cache, libraries
    seconds, decoded = V.testing.decode_bound(jobs, threads)
    return {"clips_per_s": len(jobs) / seconds, "decoded_per_delivered":
            decoded / (len(jobs) * p["frames"]), "threads": threads, "clips": which}


def child(args):
    p = PROFILES[args.profile]
    videos = json.loads(Path(args.videos).read_text())
    kind, _, workers = args.child.partition(":")
    if kind == "stoker":
        figures = child_stoker(args, p, videos)
    elif kind == "bound":
        figures = child_bound(args, p, videos, int(workers))
    else:
        figures = child_peer(args, p, videos, kind.removeprefix("torch-"), int(workers))
    harness.emit(figures)


# --- the run ----------------------------------------------------------------------------------

def measure(args, name, contender, videos_json, clips_json):
    cmd = [sys.executable, HERE, "--child", contender, "--profile", name, "--videos",
           str(videos_json), "--batches", str(args.batches), "--clips", str(clips_json)]
    try:
        return run_measured(cmd, timeout=1200)
    except RuntimeError as e:
        return {"error": str(e)}


def run_profile(args, name):
    p = dict(PROFILES[name])
    if args.quick:
        p.update(videos=max(2 * p["classes"], 8), seconds=2 if name == "kinetics" else 1)
    root = make_videos(name, p)
    videos = video_list(root)
    videos_json = DATA / f"{root.name}.json"
    videos_json.write_text(json.dumps(videos))
    harness.read_files([v[0] for v in videos])
    threads = harness.cores()
    contenders = ["stoker", f"bound:{threads}"]
    missing = {}
    for library in PEERS:
        why = peer_available(library)
        if why:
            missing[library] = why
            continue
        contenders += [f"torch-{library}:{w}" for w in args.workers]
    runs = {c: [] for c in contenders}
    clips_json = DATA / f"{root.name}.clips.json"  # the clips Stoker timed, for the bound
    for r in range(args.repeat):  # interleaved: each round measures every contender once
        clips_json.unlink(missing_ok=True)
        for c in contenders:
            runs[c].append(measure(args, name, c, videos_json, clips_json))
    clips_json.unlink(missing_ok=True)
    results = {c: median_of(rs) for c, rs in runs.items()}
    pairs = [s["clips_per_s"] / b["clips_per_s"]
             for s, b in zip(runs["stoker"], runs[contenders[1]])
             if "error" not in s and "error" not in b]
    if pairs:
        results["stoker"]["bound_ratio"] = statistics.median(pairs)
    report(name, p, results, missing)
    return results


def contender_table(results, rate, rate_label, width):
    """One row per contender: its rate (results[c][rate]), frames decoded per frame delivered,
    first batch and peak RSS, or its error (bench_lerobot.py's table too)."""
    print(f"{'contender':>{width}} {rate_label:>9} {'frames decoded':>15} {'first batch':>12} "
          f"{'peak RSS':>10}")
    print(f"{'':>{width}} {'':>9} {'per delivered':>15}")
    for c, r in results.items():
        if "error" in r:
            print(f"{c:>{width}}  error: {r['error'][:100]}")
            continue
        dpd = f"{r['decoded_per_delivered']:.2f}" if "decoded_per_delivered" in r else "-"
        first = f"{r['first_batch_s'] * 1e3:.0f}ms" if r.get("first_batch_s") else "-"
        rss = f"{r['peak_rss'] / 2**20:.0f}MiB"
        print(f"{c:>{width}} {r[rate]:>9.1f} {dpd:>15} {first:>12} {rss:>10}")


def report(name, p, results, missing):
    print(f"\n== {name}: {p['videos']} videos of {p['seconds']} s, {p['width']}x{p['height']} "
          f"{p['codec']}; clips of {p['frames']} frames at stride {p['stride']}, batch "
          f"{p['batch']}")
    contender_table(results, "clips_per_s", "clips/s", 24)
    for library, why in missing.items():
        print(f"{'torch-' + library:>24}  not installed: {why}")
    ok = {c: r for c, r in results.items() if "error" not in r}
    stoker = ok.get("stoker")
    if stoker is None:
        return
    peers = {c: r for c, r in ok.items() if c.startswith("torch-")}
    bound = next((r for c, r in ok.items() if c.startswith("bound")), None)
    lines = []
    if bound:
        ratio = stoker.get("bound_ratio", stoker["clips_per_s"] / bound["clips_per_s"])
        lines.append(f"stoker / decode bound ({bound.get('clips', 'drawn')} clips): {ratio:.2f}x")
    if peers:
        best = max(peers, key=lambda c: peers[c]["clips_per_s"])
        lines.append(f"stoker / best peer ({best}): "
                     f"{stoker['clips_per_s'] / peers[best]['clips_per_s']:.2f}x")
        lines.append(f"peak RSS, stoker / best peer: "
                     f"{stoker['peak_rss'] / peers[best]['peak_rss']:.2f}x")
        libraries = {}
        for c, r in peers.items():  # each library's best worker count
            lib = c.split(":")[0]
            if lib not in libraries or r["clips_per_s"] > peers[libraries[lib]]["clips_per_s"]:
                libraries[lib] = c
        lines.append("each peer at its best: " + ", ".join(
            f"{c} {peers[c]['clips_per_s']:.1f} clips/s" for c in libraries.values()))
    for line in lines:
        print(line)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", default="kinetics,robot")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--workers", default="0,1,2,4")
    ap.add_argument("--quick", action="store_true", help="a few short videos, for a smoke run")
    ap.add_argument("--json", help="write every figure to this file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--profile", help=argparse.SUPPRESS)
    ap.add_argument("--videos", help=argparse.SUPPRESS)
    ap.add_argument("--clips", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    args.workers = [int(w) for w in args.workers.split(",")]
    print(harness.machine_line(), flush=True)
    print(f"median of {args.repeat} interleaved runs, each in a fresh process; "
          f"{args.batches} batches timed after one of warm-up", flush=True)
    figures = {name: run_profile(args, name) for name in args.profiles.split(",")}
    if args.json:
        harness.write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    import record
    sys.exit(record.run(main))
