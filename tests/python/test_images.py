"""ImageFolder, TarShards, transforms and `stoker stats` on the built-in sample data."""

import json
import os
import shutil
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

import stoker
from stoker import transforms as T
from stoker.sample_data import make_sample
from stoker.tuning.stats import channel_stats
from stoker.tuning.stats import main as stats_main

CLASSES = ["c000_astronaut", "c001_chelsea", "c002_coffee"]
PER_CLASS = 8


@pytest.fixture(scope="session")
def sample(tmp_path_factory):
    root = tmp_path_factory.mktemp("images") / "sample"
    make_sample(root, num_classes=3, images_per_class=PER_CLASS, shards=2)
    return root


def train(sample):
    return str(sample / "train")


def shards(sample):
    return str(sample / "shards" / "train-*.tar")


def batches(ds, **kw):
    kw.setdefault("batch_size", 5)
    return list(stoker.DataLoader(ds, output="numpy", **kw))


# --------------------------------------------------------------------------- ImageFolder rules


def test_image_folder_attributes_follow_torchvision(sample):
    ds = stoker.ImageFolder(train(sample))
    root = train(sample)
    assert ds.root == root
    assert ds.classes == CLASSES
    assert ds.class_to_idx == {"c000_astronaut": 0, "c001_chelsea": 1, "c002_coffee": 2}
    expected = [(os.path.join(root, name, f"{name}_{j:05d}.JPEG"), c)
                for c, name in enumerate(CLASSES) for j in range(PER_CLASS)]
    assert ds.samples == expected
    assert ds.imgs == expected
    assert ds.targets == [c for c in range(3) for _ in range(PER_CLASS)]
    assert len(ds) == 3 * PER_CLASS


def test_image_folder_scan_rules(tmp_path):
    root = tmp_path / "tree"
    for rel in ["b/z.png", "b/a.JPG", "b/sub/deep/c.jpeg", "b/sub/b.webp", "b/notes.txt",
                "b/noext", "a/x.Png", "a/.hidden.jpg", "c/y.bmp"]:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    (root / "top.jpg").write_bytes(b"x")  # files beside the class folders are not samples
    ds = stoker.ImageFolder(root)
    r = str(root)
    assert ds.classes == ["a", "b", "c"]
    assert ds.samples == [
        (f"{r}/a/.hidden.jpg", 0), (f"{r}/a/x.Png", 0),
        (f"{r}/b/a.JPG", 1), (f"{r}/b/z.png", 1), (f"{r}/b/sub/b.webp", 1),
        (f"{r}/b/sub/deep/c.jpeg", 1),
        (f"{r}/c/y.bmp", 2),
    ]
    (root / "d").mkdir()
    (root / "d" / "readme.txt").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="Found no valid file for the classes d"):
        stoker.ImageFolder(root)
    with pytest.raises(FileNotFoundError, match="Couldn't find any class folder"):
        stoker.ImageFolder(root / "a")
    with pytest.raises(FileNotFoundError, match="Couldn't find any class folder"):
        stoker.ImageFolder(tmp_path / "missing")


def test_getitem_without_transform_is_the_decoded_image(sample):
    ds = stoker.ImageFolder(train(sample))
    for i in (0, 9, -1):
        image, label = ds[i]
        path, target = ds.samples[i]
        assert label == target
        with Image.open(path) as im:
            ref = np.asarray(im.convert("RGB"))
        assert image.dtype == np.uint8 and image.shape == ref.shape
        # Same libjpeg decode as PIL's: at most rounding differences in chroma upsampling.
        assert np.abs(image.astype(int) - ref).mean() < 0.5
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_dataloader_needs_a_fixed_size_transform(sample):
    for ds in (stoker.ImageFolder(train(sample)), stoker.TarShards(shards(sample))):
        with pytest.raises(ValueError, match="transform.*CenterCrop"):
            stoker.DataLoader(ds, batch_size=4)
    with pytest.raises(ValueError, match="fixed size"):
        stoker.ImageFolder(train(sample), transform=T.Compose([T.Resize(256), T.ToTensor()]))


# --------------------------------------------------------------------------- decode correctness


def pil_resize_center_crop(path, short, crop):
    """torchvision Resize(short) + CenterCrop(crop) on PIL, bilinear."""
    with Image.open(path) as im:
        img = im.convert("RGB")
    w, h = img.size
    if w <= h:
        new_w, new_h = short, int(short * h / w)
    else:
        new_w, new_h = int(short * w / h), short
    img = img.resize((new_w, new_h), Image.BILINEAR)
    top = int(round((new_h - crop) / 2.0))
    left = int(round((new_w - crop) / 2.0))
    return np.asarray(img)[top:top + crop, left:left + crop]


def test_resize_center_crop_matches_pil(sample):
    ds = stoker.ImageFolder(
        train(sample), transform=T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor("uint8")]))
    diffs = []
    for i, (path, _) in enumerate(ds.samples):
        image, _ = ds[i]
        assert image.shape == (3, 224, 224) and image.dtype == np.uint8
        ref = pil_resize_center_crop(path, 256, 224).transpose(2, 0, 1)
        diffs.append(np.abs(image.astype(np.int16) - ref.astype(np.int16)).mean())
    mad = float(np.mean(diffs))
    print(f"mean absolute difference vs PIL: {mad:.4f} (worst image {max(diffs):.4f})")
    assert mad <= 1.0, diffs


@pytest.fixture(scope="session")
def large_sample(tmp_path_factory):
    """A few 640-1024 px photos (the benchmark's second dataset, in small)."""
    root = tmp_path_factory.mktemp("images") / "large"
    make_sample(root, num_classes=2, images_per_class=6, shards=1, profile="large")
    return root


def test_large_profile_has_large_progressive_and_grayscale_photos(large_sample):
    m = json.loads((large_sample / "manifest.json").read_text())
    assert m["params"]["profile"] == "large"
    assert m["counts"]["progressive"] == 2 and m["counts"]["grayscale"] == 1  # 15%, 8% of 12
    for path, _ in stoker.ImageFolder(train(large_sample)).samples:
        with Image.open(path) as im:
            assert 640 <= max(im.size) <= 1024, (path, im.size)
    with pytest.raises(ValueError, match="profile must be one of"):
        make_sample(large_sample.parent / "x", profile="huge")


def test_random_resized_crop_stays_within_one_level_of_full_decode_crop_resize(
        sample, large_sample):
    # Stoker decodes only the crop, at 1/2, 1/4 or 1/8 size when the crop is at least that many
    # times the output; the reference decodes the whole file with PIL, then crops and resizes.
    for root in (sample, large_sample):
        ds = stoker.ImageFolder(train(root), transform=T.Compose(
            [T.RandomResizedCrop(224), T.ToTensor("uint8", "HWC")]))
        diffs = []
        for i, (path, _) in enumerate(ds.samples):
            image, _ = ds[i]
            with Image.open(path) as im:
                img = im.convert("RGB")
            top, left, h, w = stoker._native.testing.random_resized_crop_box(
                img.height, img.width, (224, 224), (0.08, 1.0), (3 / 4, 4 / 3), 0, 0, i)
            ref = np.asarray(img.crop((left, top, left + w, top + h)).resize((224, 224),
                                                                              Image.BILINEAR))
            diffs.append(np.abs(image.astype(np.int16) - ref.astype(np.int16)).mean())
        mad = float(np.mean(diffs))
        print(f"{root.name}: mean absolute difference vs PIL {mad:.4f} (worst {max(diffs):.4f})")
        assert mad <= 1.0, diffs


def test_float_and_normalize_equal_the_uint8_path_scaled(sample):
    geometry = [T.Resize(160), T.CenterCrop((128, 112))]
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    u8 = stoker.ImageFolder(train(sample), transform=T.Compose(geometry + [T.ToTensor("uint8")]))
    f32 = stoker.ImageFolder(train(sample), transform=T.Compose(geometry + [T.ToTensor()]))
    norm = stoker.ImageFolder(train(sample),
                              transform=T.Compose(geometry + [T.ToTensor(), T.Normalize(mean, std)]))
    hwc = stoker.ImageFolder(
        train(sample), transform=T.Compose(geometry + [T.ToTensor("float16", "HWC")]))
    m = np.array(mean, np.float32)[:, None, None]
    s = np.array(std, np.float32)[:, None, None]
    for i in (0, 7, 13, 23):
        a = u8[i][0].astype(np.float32) / 255
        assert f32[i][0].dtype == np.float32
        np.testing.assert_allclose(f32[i][0], a, rtol=0, atol=1e-7)
        np.testing.assert_allclose(norm[i][0], (a - m) / s, rtol=0, atol=1e-5)
        h = hwc[i][0]
        assert h.dtype == np.float16 and h.shape == (128, 112, 3)
        np.testing.assert_allclose(h.astype(np.float32), a.transpose(1, 2, 0), rtol=1e-3)


# --------------------------------------------------------------------------- determinism


AUGMENT = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                     T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])


def test_augmented_batches_are_bit_identical_across_worker_counts(sample):
    ds = stoker.TarShards(shards(sample), transform=AUGMENT)
    runs = {}
    for workers in (0, 1, 2, 4):
        loader = stoker.DataLoader(ds, batch_size=5, shuffle=True, seed=3, num_workers=workers,
                                   output="numpy")
        runs[workers] = [b for b in loader]
    base = runs[0]
    assert [x.shape for x, _ in base] == [(5, 3, 224, 224)] * 4 + [(4, 3, 224, 224)]
    for workers, run in runs.items():
        for (x, y), (bx, by) in zip(run, base):
            assert x.tobytes() == bx.tobytes(), f"num_workers={workers}"
            np.testing.assert_array_equal(y, by)
    # A new epoch draws new crops for the same samples.
    loader = stoker.DataLoader(ds, batch_size=len(ds), num_workers=2, output="numpy")
    (e0, y0), (e1, y1) = next(iter(loader)), next(iter(loader))
    np.testing.assert_array_equal(y0, y1)
    assert all(not np.array_equal(e0[i], e1[i]) for i in range(len(ds)))
    # __getitem__ draws with seed 0, epoch 0, the sample index.
    for i in (0, 5, 23):
        np.testing.assert_array_equal(ds[i][0], e0[i])


def test_image_folder_and_tar_shards_hold_the_same_samples(sample):
    t = T.Compose([T.Resize((48, 40)), T.ToTensor("uint8")])
    folder = stoker.ImageFolder(train(sample), transform=t)
    tars = stoker.TarShards(shards(sample), transform=t)
    assert len(folder) == len(tars) == 3 * PER_CLASS
    assert sorted(tars.labels) == sorted(folder.targets)

    def collect(ds):
        out = []
        for x, y in batches(ds, num_workers=2):
            out += [(img.tobytes(), int(label)) for img, label in zip(x, y)]
        return sorted(out)

    assert collect(folder) == collect(tars)
    # The raw files too: every tar member is byte-identical to its ImageFolder file.
    by_key = {os.path.splitext(os.path.basename(p))[0]: (p, c) for p, c in folder.samples}
    for i in range(len(tars)):
        member = tars.path(i).rsplit(":", 1)[1]
        path, label = by_key[os.path.splitext(member)[0]]
        assert tars.labels[i] == label
        np.testing.assert_array_equal(stoker.TarShards(shards(sample))[i][0],
                                      stoker.ImageFolder(train(sample))[folder.samples.index(
                                          (path, label))][0])


def test_tar_shards_accepts_lists_and_globs(sample):
    paths = sorted(str(p) for p in (sample / "shards").glob("*.tar"))
    assert len(paths) == 2
    a, b = stoker.TarShards(paths), stoker.TarShards(shards(sample))
    assert a.paths == b.paths == paths and a.labels == b.labels == b.targets
    reversed_ = stoker.TarShards(paths[::-1])
    assert len(reversed_) == len(a) and reversed_.path(0).startswith(paths[1] + ":")
    with pytest.raises(FileNotFoundError, match="no tar shard matches"):
        stoker.TarShards(str(sample / "shards" / "nothing-*.tar"))


# --------------------------------------------------------------------------- bad inputs


def png_header_only(width, height):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


@pytest.fixture
def bad_folder(sample, tmp_path):
    root = tmp_path / "bad"
    shutil.copytree(sample / "train", root)
    cls = root / CLASSES[1]
    good = sorted(cls.iterdir())[0].read_bytes()
    rng = np.random.default_rng(0)
    # name -> (bytes, what the decoder says)
    bad = {
        "bad_corrupt.jpg": (good[:600] + rng.integers(0, 256, 4000, dtype=np.uint8).tobytes()
                            + good[4600:], "JPEG"),
        "bad_truncated.jpg": (good[: len(good) // 4], "JPEG"),
        "bad_empty.jpg": (b"", "empty input"),
        "bad_text.jpg": (b"this is not an image\n" * 10, "unsupported image format"),
        "bad_huge.png": (png_header_only(100_000, 100_000), "exceeds the pixel limit"),
        "bad_gif.jpg": (b"GIF89a\x01\x00\x01\x00\x80\x00\x00" + bytes(20), "unsupported image format"),
        "bad_bmp.jpg": (b"BM" + bytes(60), "unsupported image format"),
    }
    for name, (data, _) in bad.items():
        (cls / name).write_bytes(data)
    expected = {str(cls / name): message for name, (_, message) in bad.items()}
    return root, expected


SMALL = T.Compose([T.Resize(64), T.CenterCrop(64), T.ToTensor("uint8")])


def test_on_error_raise_names_path_index_and_decoder_message(bad_folder):
    root, bad = bad_folder
    ds = stoker.ImageFolder(root, transform=SMALL)
    assert len(ds) == 3 * PER_CLASS + len(bad)
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
    assert good == 3 * PER_CLASS
    assert set(failed) == set(bad)
    for path, e in failed.items():
        index = [p for p, _ in ds.samples].index(path)
        msg = str(e)
        assert e.index == index
        assert path in msg and f"sample {index}" in msg, msg
        assert isinstance(e.__cause__, stoker.DecodeError)
        assert bad[path] in str(e.__cause__) and str(e.__cause__) in msg, msg


def test_on_error_skip_completes_the_epoch_with_every_good_image(bad_folder, sample):
    root, bad = bad_folder
    ds = stoker.ImageFolder(root, transform=SMALL)
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, on_error="skip", output="numpy")
    seen = set()
    total = 0
    for x, y in loader:
        total += len(x)
        seen.update((img.tobytes(), int(label)) for img, label in zip(x, y))
    clean = stoker.ImageFolder(train(sample), transform=SMALL)
    expected = {(img.tobytes(), int(label)) for x, y in batches(clean) for img, label in zip(x, y)}
    assert total == len(ds)  # failed samples are replaced, the epoch keeps its length
    assert seen == expected
    stats = loader.stats()
    assert stats["skipped"] == len(bad)
    for path in bad:
        assert any(path in s for s in stats["skipped_samples"]), (path, stats["skipped_samples"])


def test_small_max_pixels_fails_normal_images_naming_the_limit(sample):
    ds = stoker.ImageFolder(train(sample), transform=SMALL, max_pixels=10_000)
    with pytest.raises(stoker.SampleError, match="exceeds the pixel limit of 10000 pixels"):
        next(iter(stoker.DataLoader(ds, batch_size=2, num_workers=0)))
    plain = stoker.TarShards(shards(sample), max_pixels=10_000)
    with pytest.raises(stoker.DecodeError, match="pixel limit of 10000"):
        plain[0]
    with pytest.raises(ValueError, match="max_pixels"):
        stoker.ImageFolder(train(sample), max_pixels=0)


# --------------------------------------------------------------------------- transforms


def test_transform_validation_and_repr():
    for bad, match in [
        (lambda: T.RandomResizedCrop(0), "positive int"),
        (lambda: T.RandomResizedCrop(224, scale=(0.5, 0.1)), "scale"),
        (lambda: T.RandomResizedCrop(224, ratio=(0, 1)), "ratio"),
        (lambda: T.Resize((1, 2, 3)), "shorter side"),
        (lambda: T.CenterCrop("224"), "positive int"),
        (lambda: T.RandomHorizontalFlip(1.5), r"\[0, 1\]"),
        (lambda: T.ToTensor("int32"), "'uint8', 'float32', 'float16', 'bfloat16'"),
        (lambda: T.ToTensor(layout="NCHW"), "'CHW' or 'HWC'"),
        (lambda: T.Normalize((0.5, 0.5), (1, 1, 1)), "3 finite numbers"),
        (lambda: T.Normalize(0.5, (1, 0, 1)), "non-zero"),
        (lambda: T.Compose([lambda x: x]), "stoker.transforms"),
    ]:
        with pytest.raises(ValueError, match=match):
            bad()
    assert repr(T.CenterCrop(224)) == "CenterCrop(size=(224, 224))"
    assert repr(T.Resize(256)) == "Resize(size=256, interpolation=bilinear)"
    assert repr(T.RandomHorizontalFlip()) == "RandomHorizontalFlip(p=0.5)"
    assert repr(T.RandomResizedCrop(224)) == (
        "RandomResizedCrop(size=(224, 224), scale=(0.08, 1.0), ratio=(0.75, 1.3333), "
        "interpolation=bilinear)")
    assert repr(T.Compose([T.Resize(256), T.CenterCrop(224)])) == (
        "Compose(\n    Resize(size=256, interpolation=bilinear)\n    CenterCrop(size=(224, 224))\n)")


def test_normalize_without_float_tensor_is_rejected(sample):
    with pytest.raises(ValueError):
        stoker.ImageFolder(train(sample), transform=T.Compose(
            [T.CenterCrop(32), T.ToTensor("uint8"), T.Normalize(0.5, 0.5)]))


# --------------------------------------------------------------------------- stats


def test_stoker_stats_matches_numpy_over_pil(sample, tmp_path, capsys):
    total = np.zeros(3)
    squares = np.zeros(3)
    pixels = 0
    for path, _ in stoker.ImageFolder(train(sample)).samples:
        with Image.open(path) as im:
            a = np.asarray(im.convert("RGB"), dtype=np.float64) / 255.0
        total += a.sum(axis=(0, 1))
        squares += (a * a).sum(axis=(0, 1))
        pixels += a.shape[0] * a.shape[1]
    mean = total / pixels
    std = np.sqrt(squares / pixels - mean * mean)

    out = tmp_path / "stats.json"
    assert stats_main([train(sample), "--json", str(out), "--num-workers", "2"]) == 0
    printed = capsys.readouterr().out
    assert "Normalize(mean=[" in printed
    result = json.loads(out.read_text())
    assert result["images"] == 3 * PER_CLASS and result["pixels"] == pixels
    np.testing.assert_allclose(result["mean"], mean, rtol=0, atol=1e-6)
    np.testing.assert_allclose(result["std"], std, rtol=0, atol=1e-6)

    tar_result = channel_stats(stoker.TarShards(shards(sample)), num_workers=0)
    np.testing.assert_allclose(tar_result["mean"], result["mean"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(tar_result["std"], result["std"], rtol=0, atol=1e-12)


def test_decode_only_bound(sample):
    paths = [p for p, _ in stoker.ImageFolder(train(sample)).samples]
    r = stoker._native.testing.decode_only(paths, 2, 0.2)
    assert r["images"] >= len(paths) and r["failures"] == 0
    assert r["images_per_s"] > 0 and r["megapixels_per_s"] > 0 and r["seconds"] >= 0.2
