"""Tests for the built-in sample data (stoker.sample_data).

Run before the package is built with: PYTHONPATH=python pytest tests/python/test_sample_data.py
"""

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from PIL import Image

pytest.importorskip("numpy")
sd = pytest.importorskip("stoker.sample_data")

SMALL = dict(num_classes=3, images_per_class=8, shards=2, seed=0)


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _read_shards(root: Path) -> list[tuple[str, bytes, int]]:
    samples = []
    for shard in sorted((root / "shards").glob("train-*.tar")):
        with tarfile.open(shard) as tar:
            members = tar.getmembers()
            # WebDataset: a sample's files are adjacent, .jpg then .cls
            assert len(members) % 2 == 0
            for jpg, cls in zip(members[0::2], members[1::2]):
                key, ext = jpg.name.split(".", 1)
                assert ext == "jpg"
                assert cls.name == f"{key}.cls"
                label_text = tar.extractfile(cls).read().decode("ascii")
                assert label_text.isdigit()
                samples.append((key, tar.extractfile(jpg).read(), int(label_text)))
    return samples


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("small") / "sample"
    manifest = sd.make_sample(root, **SMALL)
    return root, manifest


def test_imagefolder_layout(small):
    root, manifest = small
    train = root / "train"
    classes = sorted(d.name for d in train.iterdir() if d.is_dir())
    assert classes == manifest["classes"]
    assert len(classes) == 3
    assert all(f.is_dir() for f in train.iterdir())  # nothing but class folders
    for c in classes:
        files = sorted((train / c).iterdir())
        assert len(files) == 8
        for f in files:
            assert f.suffix == ".JPEG"
            with Image.open(f) as im:
                assert im.format == "JPEG"
                assert im.mode in ("RGB", "L")
                im.load()
                assert 150 <= im.width <= 800 and 150 <= im.height <= 800
    assert manifest["counts"]["images"] == 24
    assert manifest["format_version"] == sd.FORMAT_VERSION
    assert manifest["seed"] == 0
    assert json.loads((root / "manifest.json").read_text()) == manifest


def test_shards_match_folder(small):
    root, manifest = small
    shards = sorted((root / "shards").iterdir())
    assert [p.name for p in shards] == ["train-0000.tar", "train-0001.tar"]
    samples = _read_shards(root)
    keys = [k for k, _, _ in samples]
    assert len(keys) == len(set(keys)) == 24
    folder = {}
    for label, c in enumerate(manifest["classes"]):
        for f in (root / "train" / c).iterdir():
            folder[f.stem] = (f.read_bytes(), label)
    assert set(folder) == set(keys)
    for key, data, label in samples:
        assert folder[key] == (data, label)
    # interleaved: the first shard is not one class after another
    labels = [label for _, _, label in samples]
    assert labels != sorted(labels)
    assert sum(s["samples"] for s in manifest["shards"]) == 24


def test_deterministic(tmp_path):
    a = sd.make_sample(tmp_path / "a", **SMALL)
    b = sd.make_sample(tmp_path / "b", **SMALL)
    assert a == b
    assert _tree_bytes(tmp_path / "a") == _tree_bytes(tmp_path / "b")
    c = sd.make_sample(tmp_path / "c", **{**SMALL, "seed": 1})
    assert _tree_bytes(tmp_path / "a") != _tree_bytes(tmp_path / "c")


def test_cached_not_rebuilt(tmp_path):
    root = tmp_path / "cache"
    first = sd.make_sample(root, **SMALL)
    stamps = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    os.utime(root / "manifest.json", ns=(1, 1))  # any rewrite would change this
    stamps[root / "manifest.json"] = 1
    second = sd.make_sample(root, **SMALL)
    assert second == first
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == stamps
    # different parameters rebuild in place; no temp dirs are left beside root
    third = sd.make_sample(root, **{**SMALL, "images_per_class": 4})
    assert third["counts"]["images"] == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


def test_refuses_to_overwrite_foreign_dir(tmp_path):
    root = tmp_path / "mine"
    root.mkdir()
    (root / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        sd.make_sample(root, **SMALL)
    assert (root / "precious.txt").read_text() == "keep me"


def test_default_root(monkeypatch, tmp_path):
    monkeypatch.setenv("STOKER_SAMPLE_DIR", str(tmp_path / "x"))
    assert sd.default_sample_root() == tmp_path / "x"
    monkeypatch.delenv("STOKER_SAMPLE_DIR")
    assert sd.default_sample_root() == Path(os.path.expanduser("~/.cache/stoker/sample-v1"))


def test_cli(tmp_path, capsys):
    rc = sd.main(["make-sample", "--root", str(tmp_path / "cli"), "--classes", "2",
                  "--per-class", "3", "--shards", "1", "--seed", "5"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "6 images" in out and "progressive" in out and "MB" in out
    assert (tmp_path / "cli" / "shards" / "train-0000.tar").is_file()


def test_statistics_default_build(tmp_path):
    m = sd.make_sample(tmp_path / "big", num_classes=10, images_per_class=60, shards=4, seed=0)
    files = sorted((tmp_path / "big" / "train").rglob("*.JPEG"))
    assert len(files) == 600 == m["counts"]["images"]
    sizes, kbytes, progressive, gray = [], [], 0, 0
    for f in files:
        with Image.open(f) as im:
            sizes.append(im.size)
            progressive += bool(im.info.get("progressive") or im.info.get("progression"))
            gray += im.mode == "L"
            if im.mode == "RGB" and not im.info.get("progressive"):
                assert im.layer[1][1:3] == (1, 1) and im.layer[0][1:3] == (2, 2)  # 4:2:0
        kbytes.append(f.stat().st_size / 1024)
    mean_w = sum(w for w, _ in sizes) / len(sizes)
    mean_h = sum(h for _, h in sizes) / len(sizes)
    assert 400 <= mean_w <= 600 and 300 <= mean_h <= 450
    assert any(h > w for w, h in sizes) and any(w > h for w, h in sizes)
    assert 60 <= sum(kbytes) / len(kbytes) <= 160
    assert progressive >= 1 and gray >= 1
    assert progressive == m["counts"]["progressive"] and gray == m["counts"]["grayscale"]
    assert len(set(sizes)) > 50  # varied, not a fixed size


def test_interrupted_build_leaves_nothing(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sd, "_render", boom)
    with pytest.raises(KeyboardInterrupt):
        sd.make_sample(tmp_path / "half", **SMALL)
    assert list(tmp_path.iterdir()) == []  # neither root nor a temp dir beside it
