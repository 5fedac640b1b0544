"""stoker.VideoDataset: clips held to PyAV's frames at the same timestamps, exactly once per
epoch, resumable, the same whatever the workers, and bad videos named or skipped.

The videos are made here with PyAV (its wheel's FFmpeg has the encoders); Stoker decodes them
with the system's FFmpeg (stoker._video)."""

import csv
import io
import os
import pickle
import tarfile
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import stoker
import stoker.transforms as T
from stoker.sources.remote import RemoteIndexWarning

av = pytest.importorskip("av")
video = pytest.importorskip("stoker._video")

W, H = 96, 64


def make_video(path, frames=40, codec="libx264", gop=12, b_frames=2, fps=25, size=(W, H),
               still=False, options=None):
    """A video of a moving pattern (or one still image), in the container of path's suffix."""
    w, h = size
    with av.open(str(path), "w") as c:
        s = c.add_stream(codec, rate=fps)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        s.codec_context.gop_size = gop
        if b_frames is not None:
            s.codec_context.max_b_frames = b_frames
        if options:
            s.options = options
        yy, xx = np.mgrid[0:h, 0:w]
        for i in range(frames):
            k = 0 if still else i
            img = np.stack([(xx * 2 + k * 5) % 256, (yy * 3 + k * 3) % 256,
                            (xx + yy + k * 7) % 256], -1).astype(np.uint8)
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return str(path)


def pyav_frames(path):
    """PyAV's frames of the video: {presentation time: HWC uint8 RGB}."""
    with av.open(path) as c:
        return {round(float(f.time), 6): f.to_ndarray(format="rgb24") for f in c.decode(video=0)}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Three classes of two or three videos each, of different lengths and codecs."""
    root = tmp_path_factory.mktemp("videos")
    specs = {"jump": [("a.mp4", 40, "libx264"), ("b.mkv", 30, "libx264")],
             "run": [("c.mp4", 50, "libx264"), ("d.avi", 36, "mpeg4"), ("e.mp4", 6, "libx264")],
             "swim": [("f.webm", 32, "libvpx-vp9")]}
    for cls, videos in specs.items():
        (root / cls).mkdir()
        for name, n, codec in videos:
            make_video(root / cls / name, frames=n, codec=codec,
                       b_frames=None if codec == "libvpx-vp9" else 2)
    return root


def clip_frames(clip, layout="TCHW"):
    """A clip's frames as HWC arrays."""
    frames = clip if layout == "TCHW" else clip.transpose(1, 0, 2, 3)
    return [f.transpose(1, 2, 0) for f in frames]


def test_frames_equal_pyavs_at_the_same_timestamps_in_every_container(folder):
    ds = stoker.VideoDataset(folder, frames=6, stride=3, clips_per_video=3, timestamps=True)
    assert ds.classes == ["jump", "run", "swim"]
    assert len(ds) == 6 * 3
    for i in range(len(ds)):
        clip, label, stamps = ds[i]
        assert clip.shape == (6, 3, H, W) and clip.dtype == np.uint8
        assert label == ds.targets[i]
        ref = pyav_frames(ds.path(i))
        for t, frame in zip(stamps, clip_frames(clip)):
            assert round(float(t), 6) in ref, (ds.path(i), t, sorted(ref)[:5])
            diff = np.abs(frame.astype(int) - ref[round(float(t), 6)]).mean()
            assert diff <= 1.0, (ds.path(i), t, diff)


@pytest.mark.parametrize("codec,suffix", [("hevc", "mp4"), ("libsvtav1", "mkv")])
def test_hevc_and_av1_decode_as_pyav_does(tmp_path, codec, suffix):
    try:
        path = make_video(tmp_path / f"v.{suffix}", frames=12, codec=codec, gop=4, b_frames=None,
                          size=(64, 64), options={"preset": "12"} if codec == "libsvtav1" else None)
    except av.error.FFmpegError as e:  # pragma: no cover - depends on PyAV's build
        pytest.skip(f"PyAV cannot encode {codec}: {e}")
    ds = stoker.VideoDataset([path], frames=4, stride=2, timestamps=True)
    clip, _, stamps = ds[0]
    ref = pyav_frames(path)
    for t, frame in zip(stamps, clip_frames(clip)):
        assert np.abs(frame.astype(int) - ref[round(float(t), 6)]).mean() <= 1.0


def test_evenly_spaced_clips_without_shuffle_and_random_starts_with_it(folder):
    ds = stoker.VideoDataset(folder, frames=4, stride=2, clips_per_video=3, timestamps=True)
    fps = 25.0
    even = [ds[i][2] for i in range(3)]  # a.mp4's three clips: 40 frames, a clip spans 7
    assert [round(s[0] * fps) for s in even] == [0, 17, 33]
    for s in even:
        assert np.allclose(np.diff(s), 2 / fps)

    def starts(seed, epoch):
        loader = stoker.DataLoader(ds, batch_size=3, shuffle=True, seed=seed, output="numpy")
        loader.set_epoch(epoch)
        out = {}
        for clips, labels, stamps in loader:
            for s in stamps:
                out.setdefault(round(s[0] * fps), 0)
        return out

    assert starts(1, 0) == starts(1, 0)
    assert starts(1, 0) != starts(1, 1)


def test_every_clip_exactly_once_per_epoch_and_the_same_whatever_the_workers(folder):
    transform = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize([0.5] * 3, [0.25] * 3)])
    ds = stoker.VideoDataset(folder, frames=4, stride=2, clips_per_video=2, transform=transform,
                             timestamps=True)

    def epoch(workers):
        loader = stoker.DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=workers,
                                   output="numpy")
        return [tuple(np.array(f) for f in b) for b in loader]

    one = epoch(0)
    assert one[0][0].shape == (4, 4, 3, 32, 32) and one[0][0].dtype == np.float32
    labels = Counter(int(l) for _, ls, _ in one for l in ls)
    assert labels == Counter(ds.targets)
    # Each sample's clip is its own: (label, first timestamp) of every clip of the epoch.
    for workers in (1, 2):
        other = epoch(workers)
        assert len(other) == len(one)
        for a, b in zip(one, other):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)


def test_a_clip_draws_its_transform_once_for_every_frame(tmp_path):
    path = make_video(tmp_path / "still.mp4", frames=20, still=True)
    transform = T.Compose([T.RandomResizedCrop(24, scale=(0.1, 0.5)), T.RandomHorizontalFlip(),
                           T.ColorJitter(0.4, 0.4, 0.4), T.ToTensor()])
    ds = stoker.VideoDataset([path], frames=5, stride=3, transform=transform)
    loader = stoker.DataLoader(ds, batch_size=1, shuffle=True, seed=0, output="numpy")
    for epoch in range(4):
        loader.set_epoch(epoch)
        (clip, _), = list(loader)
        frames = clip[0]
        for f in frames[1:]:  # the same still image, the same crop, flip and jitter
            assert np.abs(f - frames[0]).mean() < 2 / 255


def test_cthw_layout_and_resume_mid_epoch(folder):
    ds = stoker.VideoDataset(folder, frames=3, stride=4, clips_per_video=2, layout="CTHW",
                             transform=T.Compose([T.Resize((32, 48)), T.ToTensor("uint8")]))
    assert ds[0][0].shape == (3, 3, 32, 48)
    full = [b for b in stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=9, output="numpy")]
    loader = stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=9, output="numpy")
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    del it
    resumed = stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=9, output="numpy")
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(head) + len(rest) == len(full)
    for (a, la), (b, lb) in zip(head + rest, full):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)


def test_ranks_split_the_clips(folder):
    ds = stoker.VideoDataset(folder, frames=2, stride=1, clips_per_video=2, timestamps=True)
    seen = Counter()
    for rank in range(2):
        loader = stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=4, rank=rank,
                                   world_size=2, output="numpy")
        for clips, labels, stamps in loader:
            seen.update(int(l) for l in labels)
    assert seen == Counter(ds.targets)


def test_a_table_with_labels_and_start_end_times(folder, tmp_path):
    table = tmp_path / "annotations.csv"
    a = os.path.relpath(folder / "run" / "c.mp4", tmp_path)
    with open(table, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "start", "end"])
        w.writerow([a, "running", "0.4", "1.2"])
        w.writerow([str(folder / "jump" / "a.mp4"), "jumping", "", ""])
    ds = stoker.VideoDataset(str(table), frames=4, stride=5, timestamps=True)
    assert ds.classes == ["jumping", "running"]
    clip, label, stamps = ds[0]
    assert label == 1
    assert 0.4 - 1e-6 <= stamps[0] and stamps[-1] < 1.2
    assert ds[1][1] == 0
    pa = pytest.importorskip("pyarrow")
    frame = pa.table({"path": [str(folder / "jump" / "a.mp4")], "label": [7]})
    assert stoker.VideoDataset(frame, frames=2)[0][1] == 7


def test_fps_resamples_by_timestamp(folder):
    ds = stoker.VideoDataset([str(folder / "run" / "c.mp4")], frames=5, fps=10, timestamps=True)
    _, _, stamps = ds[0]
    # 25 fps source, 10 fps clip: the frame shown at each 0.1 s step.
    steps = np.diff(stamps)
    assert np.all((np.abs(steps - 0.08) < 1e-6) | (np.abs(steps - 0.12) < 1e-6)), steps


def test_a_short_video_repeats_its_last_frame(folder):
    ds = stoker.VideoDataset([str(folder / "run" / "e.mp4")], frames=4, stride=3,
                             timestamps=True)
    clip, _, stamps = ds[0]  # 6 frames: 0, 3, then 5 twice
    assert np.allclose(stamps * 25, [0, 3, 5, 5])
    np.testing.assert_array_equal(clip[2], clip[3])


@pytest.fixture(scope="module")
def bad_folder(tmp_path_factory, folder):
    root = tmp_path_factory.mktemp("bad_videos")
    (root / "x").mkdir()
    good = [make_video(root / "x" / f"good{i}.mp4", frames=20) for i in range(3)]
    whole = open(good[0], "rb").read()
    bad = {}
    # A truncated mp4 (no moov atom), an empty file, noise, and an audio-only file.
    (root / "x" / "cut.mp4").write_bytes(whole[: len(whole) // 3])
    (root / "x" / "empty.mp4").write_bytes(b"")
    (root / "x" / "noise.mkv").write_bytes(np.random.default_rng(0).bytes(5000))
    with av.open(str(root / "x" / "audio.mkv"), "w") as c:
        s = c.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16",
                                           layout="mono")
        frame.rate = 8000
        for p in s.encode(frame):
            c.mux(p)
        for p in s.encode():
            c.mux(p)
    bad = {"cut.mp4": "", "empty.mp4": "", "noise.mkv": "", "audio.mkv": "has no video stream"}
    return root, {str(root / "x" / k): v for k, v in bad.items()}


def test_bad_videos_raise_naming_the_file_or_are_skipped_and_counted(bad_folder):
    root, bad = bad_folder
    ds = stoker.VideoDataset(root, frames=2, stride=2,
                             transform=T.Compose([T.Resize((16, 16)), T.ToTensor("uint8")]))
    it = iter(stoker.DataLoader(ds, batch_size=1, num_workers=2, output="numpy"))
    failed, good = {}, 0
    while True:
        try:
            next(it)
            good += 1
        except StopIteration:
            break
        except stoker.SampleError as e:
            failed[e.path] = e
    assert good == 3
    assert set(failed) == set(bad)
    for path, e in failed.items():
        assert path in str(e) and isinstance(e.__cause__, stoker.DecodeError), str(e)
        assert bad[path] in str(e), str(e)
    loader = stoker.DataLoader(ds, batch_size=2, num_workers=2, on_error="skip", output="numpy")
    total = sum(len(x) for x, _ in loader)
    assert total == len(ds)
    assert loader.stats()["skipped"] == len(bad)


def test_corrupt_packets_mid_stream_never_crash(tmp_path):
    path = make_video(tmp_path / "v.avi", frames=40, codec="mpeg4")
    data = bytearray(open(path, "rb").read())
    rng = np.random.default_rng(1)
    for trial in range(6):
        broken = bytearray(data)
        for at in rng.integers(len(data) // 4, len(data), 30):
            broken[at] = int(rng.integers(0, 256))
        p = tmp_path / f"bad{trial}.avi"
        p.write_bytes(bytes(broken))
        try:
            ds = stoker.VideoDataset([str(p)], frames=8, stride=4)
            ds[0]
        except (stoker.DecodeError, OSError) as e:
            assert str(p) in str(e)


def test_options_are_checked_and_the_dataset_pickles(folder):
    for kwargs, what in [({"frames": 0}, "frames"), ({"stride": -1}, "stride"),
                         ({"fps": 0}, "fps"), ({"layout": "THWC"}, "layout"),
                         ({"clips_per_video": 1.5}, "clips_per_video")]:
        with pytest.raises(ValueError, match=what):
            stoker.VideoDataset(folder, **kwargs)
    with pytest.raises(FileNotFoundError):
        stoker.VideoDataset(str(folder / "nothing-*.mp4"))
    ds = stoker.VideoDataset(folder, frames=3, stride=2, clips_per_video=2,
                             transform=T.Compose([T.CenterCrop(32), T.ToTensor("uint8")]))
    copy = pickle.loads(pickle.dumps(ds))
    assert len(copy) == len(ds) and copy.targets == ds.targets
    np.testing.assert_array_equal(copy[5][0], ds[5][0])
    assert "VideoDataset" in repr(ds)


def test_frames_decoded_are_fewer_than_a_naive_decoder_needs(folder):
    path = str(folder / "run" / "c.mp4")
    ds = stoker.VideoDataset([path], frames=4, stride=4, clips_per_video=2, random_clips=False)
    loader = stoker.DataLoader(ds, batch_size=2, output="numpy")
    list(loader)
    stats = ds.stats()
    assert stats["clips"] == 2 and stats["frames_delivered"] == 8
    # A naive decoder goes from each clip's keyframe to its last frame: 50 frames, clips of 13
    # evenly spaced, starting at 0 and 37.
    seconds, naive = video.testing.decode_bound([(path, 0, 12), (path, 37, 49)], 1)
    assert stats["frames_decoded"] < naive


def test_diagnose_and_tune_take_a_video_pipeline(folder):
    from stoker.tuning.tune import tune_loader
    ds = stoker.VideoDataset(folder, frames=4, stride=2, clips_per_video=2,
                             transform=T.Compose([T.RandomResizedCrop(32), T.ToTensor()]))
    loader = stoker.DataLoader(ds, batch_size=2, shuffle=True, num_workers=2)
    report = stoker.diagnose(loader, max_batches=6, seconds=30)
    # The dataset's own figures, named with their units; decoding and transforming are stages.
    video_figures = {f["name"]: f for f in report.figures["source_figures"]}
    assert video_figures["decode seconds"]["stage"] == "decode"
    assert video_figures["decode seconds"]["unit"] == "s"
    assert "shorter GOP" in video_figures["decode seconds"]["advice"]
    # The window's figures are what the workers made while it lasted: they run ahead of the
    # consumer (prefetch), so the measured batches' 6 x 2 x 4 frames are no bound either way
    # (an ASan run once counted 40). Whole clips of 4 frames, within what the run made in all.
    delivered = video_figures["frames delivered"]["value"]
    assert 0 < delivered <= ds.stats()["frames_delivered"] and delivered % 4 == 0
    assert video_figures["frames decoded"]["value"] > 0
    assert video_figures["decode seconds"]["value"] > 0
    assert report.verdict in ("input-bound", "compute-bound")
    if report.limiting_stage == "decode":
        assert "frames decoded per frame delivered" in " ".join(report.reasons)
    result = tune_loader(ds, batch_size=2, max_workers=2, repeats=1, seconds=0.2, gpu=False)
    assert result["best"]["num_workers"] in (0, 1, 2)


def video_shards(folder, where):
    """Two WebDataset shards of three videos (<key>.<suffix> + <key>.cls) in `where`."""
    videos = [(folder / "jump" / "a.mp4", 0), (folder / "run" / "d.avi", 1),
              (folder / "swim" / "f.webm", 2)]
    shards = []
    for s, chunk in enumerate([videos[:2], videos[2:]]):
        path = where / f"train-{s}.tar"
        with tarfile.open(path, "w") as tar:
            for k, (video, label) in enumerate(chunk):
                key = f"sample{s}{k}"
                tar.add(video, arcname=f"{key}{video.suffix}")
                data = str(label).encode()
                info = tarfile.TarInfo(f"{key}.cls")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        shards.append(str(path))
    return videos, shards


def test_webdataset_tar_shards_of_videos(folder, tmp_path):
    videos, shards = video_shards(folder, tmp_path)
    ds = stoker.VideoDataset(str(tmp_path / "train-*.tar"), frames=3, stride=2,
                             clips_per_video=2, timestamps=True)
    assert len(ds) == 6 and ds.targets == [0, 0, 1, 1, 2, 2]
    assert ds.path(2).endswith("train-0.tar:sample01.avi")
    for i in range(len(ds)):
        clip, label, stamps = ds[i]
        ref = pyav_frames(str(videos[i // 2][0]))
        for t, frame in zip(stamps, clip_frames(clip)):
            assert np.abs(frame.astype(int) - ref[round(float(t), 6)]).mean() <= 1.0
    loader = stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=2, num_workers=2,
                               output="numpy")
    assert Counter(int(l) for _, labels, _ in loader for l in labels) == Counter(ds.targets)
    with pytest.raises(ValueError, match="not both"):
        stoker.VideoDataset(shards + [str(videos[0][0])])


def test_stoker_index_writes_sidecars_the_dataset_reads_instead_of_demuxing(folder, tmp_path):
    import shutil
    from stoker.cli.index import main as index_main
    for name in ("a.mp4", "b.mkv"):
        shutil.copy(folder / "jump" / name, tmp_path / name)
    videos = [str(tmp_path / "a.mp4"), str(tmp_path / "b.mkv")]
    fresh = stoker.VideoDataset(videos, frames=3, stride=2, timestamps=True)
    expected = [fresh[i] for i in range(2)]
    assert fresh.stats()["index_builds"] == 2
    assert index_main([str(tmp_path / "*.mp4"), str(tmp_path / "b.mkv")]) == 0
    assert sorted(os.listdir(tmp_path)) == ["a.mp4", "a.mp4.stoker-index", "b.mkv",
                                            "b.mkv.stoker-index"]
    indexed = stoker.VideoDataset(videos, frames=3, stride=2, timestamps=True)
    for i in range(2):
        for x, y in zip(indexed[i], expected[i]):
            np.testing.assert_array_equal(x, y)
    assert indexed.stats()["index_builds"] == 0
    # A sidecar of another version of the video (its size changed) is not used.
    with open(videos[0], "ab") as f:
        f.write(b"\0" * 16)
    stale = stoker.VideoDataset(videos, frames=3, stride=2)
    stale[0]
    assert stale.stats()["index_builds"] == 1


def test_video_shards_over_http_read_as_the_local_ones(folder, http_server, tmp_path, monkeypatch):
    from stoker.cli.index import main as index_main
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    root = Path(http_server.root)
    _, shards = video_shards(folder, root)
    assert index_main([str(root / "train-*.tar")]) == 0  # sidecars: no download
    urls = [f"{http_server.url}/train-{s}.tar" for s in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RemoteIndexWarning)  # indexed: nothing downloaded here
        remote = stoker.VideoDataset(urls, frames=3, stride=2, clips_per_video=2)
    local = stoker.VideoDataset(shards, frames=3, stride=2, clips_per_video=2)
    assert remote.default_shuffle == "shards" and remote.targets == local.targets
    kw = dict(batch_size=2, shuffle=True, seed=5, output="numpy")
    got = {(int(l), x.tobytes()) for xs, ls in stoker.DataLoader(remote, **kw)
           for x, l in zip(xs, ls)}
    want = {(int(l), x.tobytes()) for xs, ls in stoker.DataLoader(local, **kw)
            for x, l in zip(xs, ls)}
    assert got == want and len(got) == 6
