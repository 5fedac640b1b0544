"""stoker.LeRobotDataset: item for item lerobot's own LeRobotDataset on datasets lerobot's writer
made, exactly once and the same whatever the workers, resumable, split across ranks, and bad
datasets named (episode, camera, timestamp).

lerobot comes from requirements-lerobot.txt, installed without its dependencies into
.venv/lerobot (its pins clash with .venv's): appended to sys.path here."""

import json
import os
import pickle
import shutil
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import stoker
import stoker.transforms as T

torch = pytest.importorskip("torch")
pytest.importorskip("stoker._video")
pytest.importorskip("torchcodec")
_LEROBOT = Path(__file__).resolve().parents[2] / ".venv" / "lerobot"
if _LEROBOT.is_dir() and str(_LEROBOT) not in sys.path:
    sys.path.append(str(_LEROBOT))  # after site-packages: its draccus' `tests` shadows nothing
lerobot_dataset = pytest.importorskip("lerobot.datasets.lerobot_dataset")

H, W = 48, 64
TOP, WRIST = "observation.images.top", "observation.images.wrist"
EPISODES = (12, 17, 9)
TASKS = ("pick the cube", "place the cube")


def frame(rng, t, shift):
    """A smooth picture that moves with t (AV1 keeps it close)."""
    y, x = np.mgrid[0:H, 0:W]
    img = np.stack([(x * 4 + t * 7 + shift) % 256, (y * 5 + t * 3) % 256,
                    ((x + y) * 2 + shift) % 256], axis=-1)
    return (img + rng.integers(0, 8, img.shape)).clip(0, 255).astype(np.uint8)


def make_dataset(root, episodes=EPISODES):
    """A LeRobot v3.0 dataset written by lerobot: two AV1 cameras, state and action."""
    features = {
        "observation.state": {"dtype": "float32", "shape": (6,), "names": None},
        "action": {"dtype": "float32", "shape": (4,), "names": None},
        TOP: {"dtype": "video", "shape": (H, W, 3), "names": ["height", "width", "channels"]},
        WRIST: {"dtype": "video", "shape": (H, W, 3), "names": ["height", "width", "channels"]},
    }
    ds = lerobot_dataset.LeRobotDataset.create("stoker/test", fps=30, root=root,
                                               features=features, use_videos=True)
    rng = np.random.default_rng(0)
    for e, steps in enumerate(episodes):
        for t in range(steps):
            ds.add_frame({"observation.state": rng.standard_normal(6).astype(np.float32),
                          "action": rng.standard_normal(4).astype(np.float32),
                          TOP: frame(rng, t, 40 * e), WRIST: frame(rng, 2 * t, 90 + 40 * e),
                          "task": TASKS[e % 2]})
        ds.save_episode()
    ds.finalize()
    return Path(root)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("lerobot") / "ds")


def theirs(root, **kwargs):
    return lerobot_dataset.LeRobotDataset("stoker/test", root=root, video_backend="torchcodec",
                                          **kwargs)


def assert_items_equal(ours, lerobots, indices):
    for i in indices:
        a, b = ours[i], lerobots[i]
        assert set(a) == set(b), set(a) ^ set(b)
        for k, want in b.items():
            got = a[k]
            if isinstance(want, str):
                assert got == want, (i, k)
                continue
            assert got.dtype == want.dtype and got.shape == want.shape, (i, k, got, want)
            if k in (TOP, WRIST):
                assert (got - want).abs().mean().item() <= 1 / 255, (i, k)
            else:
                assert torch.equal(got, want), (i, k, got, want)


DELTAS = {TOP: [-2 / 30, 0.0, 1 / 30], WRIST: [0.0, -1 / 30], "action": [0.0, 1 / 30, 2 / 30],
          "observation.state": [-1 / 30]}


@pytest.mark.parametrize("delta_timestamps,episodes", [(None, None), (DELTAS, None),
                                                        (DELTAS, [2, 0])])
def test_items_equal_lerobots(root, delta_timestamps, episodes):
    ours = stoker.LeRobotDataset(root, delta_timestamps=delta_timestamps, episodes=episodes)
    lerobots = theirs(root, delta_timestamps=delta_timestamps, episodes=episodes)
    assert len(ours) == len(lerobots)
    assert_items_equal(ours, lerobots, range(len(ours)))


def test_uint8_frames_are_the_float_frames_times_255(root):
    floats = stoker.LeRobotDataset(root, delta_timestamps={TOP: [0.0, 1 / 30]})
    bytes_ = stoker.LeRobotDataset(root, delta_timestamps={TOP: [0.0, 1 / 30]},
                                   frame_dtype="uint8")
    for i in (0, 11, 12, 37):
        a, b = floats[i], bytes_[i]
        assert b[TOP].dtype == torch.uint8 and b[TOP].shape == (2, 3, H, W)
        assert torch.equal((a[TOP] * 255).round().to(torch.uint8), b[TOP])
        assert torch.equal(a["action"], b["action"])


def test_every_step_once_the_same_whatever_the_workers_and_batches_as_lerobots_collate(root):
    ds = stoker.LeRobotDataset(root, delta_timestamps=DELTAS)
    runs = []
    for workers in (1, 3):
        loader = stoker.DataLoader(ds, batch_size=5, shuffle=True, seed=7, num_workers=workers)
        runs.append(list(loader))
    for a, b in zip(*runs):
        assert a.keys() == b.keys()
        for k in a:
            assert (a[k] == b[k]) if k == "task" else torch.equal(a[k], b[k]), k
    index = torch.cat([b["index"] for b in runs[0]])
    assert sorted(index.tolist()) == list(range(sum(EPISODES)))
    batch = runs[0][0]
    single = ds[int(batch["index"][0])]
    for k, v in single.items():
        if k == "task":
            assert batch["task"][0] == v and len(batch["task"]) == 5
        else:
            assert batch[k].shape == (5,) + tuple(v.shape) and torch.equal(batch[k][0], v), k


def test_resume_mid_epoch_and_ranks_split_the_steps(root):
    ds = stoker.LeRobotDataset(root, delta_timestamps={TOP: [-1 / 30, 0.0]})
    full = list(stoker.DataLoader(ds, batch_size=4, shuffle=True, seed=3))
    loader = stoker.DataLoader(ds, batch_size=4, shuffle=True, seed=3)
    it = iter(loader)
    head = [next(it) for _ in range(4)]
    state = loader.state_dict()
    del it
    resumed = stoker.DataLoader(ds, batch_size=4, shuffle=True, seed=3)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(head) + len(rest) == len(full)
    for a, b in zip(head + rest, full):
        assert torch.equal(a[TOP], b[TOP]) and torch.equal(a["index"], b["index"])
    seen = Counter()
    for rank in range(2):
        for b in stoker.DataLoader(ds, batch_size=4, shuffle=True, seed=3, rank=rank,
                                   world_size=2):
            seen.update(b["index"].tolist())
    assert sorted(seen) == list(range(sum(EPISODES))) and set(seen.values()) == {1}


def test_stratified_by_task_or_episode(root):
    for stratify, key in (("task", "task_index"), ("episode", "episode_index")):
        ds = stoker.LeRobotDataset(root, stratify=stratify)
        assert ds.targets.tolist() == [int(ds[i][key]) for i in range(len(ds))]
        loader = stoker.DataLoader(ds, batch_size=4, shuffle="stratified", seed=1)
        index = torch.cat([b["index"] for b in loader])
        assert sorted(index.tolist()) == list(range(sum(EPISODES)))


def test_a_transform_runs_per_camera_once_per_sample_on_every_delta(root):
    transform = T.Compose([T.RandomResizedCrop(24, scale=(0.3, 1.0)), T.RandomHorizontalFlip(),
                           T.ToTensor()])
    ds = stoker.LeRobotDataset(root, delta_timestamps={TOP: [0.0, 0.0]}, transform=transform)
    item = ds[5]
    assert item[TOP].shape == (2, 3, 24, 24) and item[WRIST].shape == (3, 24, 24)
    assert torch.equal(item[TOP][0], item[TOP][1])  # one draw for both deltas' (equal) frames
    again = stoker.LeRobotDataset(root, delta_timestamps={TOP: [0.0, 0.0]}, transform=transform)
    assert torch.equal(again[5][TOP], item[TOP])
    loader = stoker.DataLoader(ds, batch_size=4, shuffle=True, seed=2, num_workers=2)
    assert next(iter(loader))[TOP].shape == (4, 2, 3, 24, 24)


def test_pickles_and_reports_decoding(root):
    ds = stoker.LeRobotDataset(root, delta_timestamps={WRIST: [0.0, 1 / 30]}, episodes=[1])
    back = pickle.loads(pickle.dumps(ds))
    assert len(back) == EPISODES[1] and torch.equal(back[3][WRIST], ds[3][WRIST])
    stats = ds.stats()
    assert stats["clips"] >= 2 and stats["frames_delivered"] >= 3 and stats["index_builds"] == 2
    assert "episode 1, step 3" in ds.path(3)


def copy_of(root, tmp_path):
    dest = tmp_path / "ds"
    shutil.copytree(root, dest)
    return dest


def test_a_missing_video_names_the_episode_and_camera(root, tmp_path):
    bad = copy_of(root, tmp_path)
    os.remove(bad / "videos" / WRIST / "chunk-000" / "file-000.mp4")
    ds = stoker.LeRobotDataset(bad)
    with pytest.raises(stoker.SampleError) as e:
        next(iter(stoker.DataLoader(ds, batch_size=2, num_workers=2)))
    text = str(e.value)
    assert "episode 0" in text and WRIST in text and "file-000.mp4" in text, text


def test_a_frame_outside_tolerance_names_the_timestamp(root, tmp_path):
    import pyarrow.parquet as pq
    bad = copy_of(root, tmp_path)
    path = bad / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(path)
    column = f"videos/{TOP}/from_timestamp"
    shifted = [v + (0.5 / 30 if e == 1 else 0.0)
               for e, v in zip(table.column("episode_index").to_pylist(),
                               table.column(column).to_pylist())]
    import pyarrow as pa
    table = table.set_column(table.column_names.index(column), column, pa.array(shifted))
    pq.write_table(table, path)
    ds = stoker.LeRobotDataset(bad)
    assert ds[EPISODES[0] - 1][TOP].shape == (3, H, W)  # episode 0 is as it was
    with pytest.raises(stoker.DecodeError) as e:
        ds[EPISODES[0] + 2]
    text = str(e.value)
    assert "episode 1" in text and TOP in text and "t=0.066667 s" in text and \
        "no frame within 0.000100 s" in text, text
    loader = stoker.DataLoader(ds, batch_size=3, on_error="skip")
    index = torch.cat([b["index"] for b in loader]).tolist()
    assert loader.stats()["skipped"] == EPISODES[1]
    assert not set(index) & set(range(EPISODES[0], EPISODES[0] + EPISODES[1]))


def test_data_that_disagrees_with_the_metadata_is_refused(root, tmp_path):
    bad = copy_of(root, tmp_path)
    info = json.loads((bad / "meta" / "info.json").read_text())
    info["features"]["action"]["shape"] = [5]
    (bad / "meta" / "info.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match=r"file-000.parquet: column 'action' holds values of "
                                         r"shape \[4\], but meta/info.json says \[5\]"):
        stoker.LeRobotDataset(bad)
    import pyarrow as pa
    import pyarrow.parquet as pq
    bad = copy_of(root, tmp_path / "b")
    path = bad / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(path)
    to = table.column("dataset_to_index").to_pylist()
    to[1] -= 1
    table = table.set_column(table.column_names.index("dataset_to_index"), "dataset_to_index",
                             pa.array(to, pa.int64()))
    pq.write_table(table, path)
    with pytest.raises(ValueError, match="episode 1 has 17 steps in the data files"):
        stoker.LeRobotDataset(bad)


def test_options_and_versions_are_checked(root, tmp_path):
    for kwargs, what in [({"frame_dtype": "int8"}, "frame_dtype"), ({"tolerance_s": 0},
                                                                   "tolerance_s"),
                         ({"stratify": "camera"}, "stratify"),
                         ({"delta_timestamps": {"action": [0.01]}}, "multiple of 1/fps"),
                         ({"delta_timestamps": {"nope": [0.0]}}, "not a feature"),
                         ({"episodes": [7]}, "no episodes")]:
        with pytest.raises(ValueError, match=what):
            stoker.LeRobotDataset(root, **kwargs)
    old = tmp_path / "old"
    (old / "meta").mkdir(parents=True)
    (old / "meta" / "info.json").write_text(json.dumps({"codebase_version": "v2.1"}))
    with pytest.raises(ValueError, match="format v2.1.*reads v3.0"):
        stoker.LeRobotDataset(old)
    with pytest.raises(FileNotFoundError, match="no meta/info.json"):
        stoker.LeRobotDataset(tmp_path)


def test_a_dataset_on_the_hub_reads_through_the_cache_as_the_local_one(root, http_server,
                                                                       monkeypatch, tmp_path):
    shutil.copytree(root, os.path.join(http_server.root, "datasets", "org", "robot"))
    monkeypatch.setenv("HF_ENDPOINT", http_server.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    cache = tmp_path / "cache"
    remote = stoker.LeRobotDataset("hf://datasets/org/robot", delta_timestamps=DELTAS,
                                   episodes=[1], cache_dir=str(cache))
    local = stoker.LeRobotDataset(root, delta_timestamps=DELTAS, episodes=[1])
    assert len(remote) == len(local) == EPISODES[1]
    for i in (0, 8, EPISODES[1] - 1):
        a, b = remote[i], local[i]
        for k in b:
            assert a[k] == b[k] if k == "task" else torch.equal(a[k], b[k]), k
    # (a file fetched again would be a new one, renamed into place: another inode)
    cached = {p: p.stat().st_ino for p in cache.rglob("*") if p.is_file()}
    assert len(cached) >= 6  # info, tasks, episodes, data, two videos
    again = stoker.LeRobotDataset("hf://datasets/org/robot", episodes=[1], cache_dir=str(cache))
    assert len(again) == EPISODES[1]
    assert {p: p.stat().st_ino for p in cache.rglob("*") if p.is_file()} == cached
    loader = stoker.DataLoader(remote, batch_size=4, shuffle=True, seed=1, num_workers=2)
    assert sorted(torch.cat([b["index"] for b in loader]).tolist()) == \
        [int(local[i]["index"]) for i in range(len(local))]
