"""Image(buckets=...): images in aspect-ratio buckets, the SDXL way (stoker.image_text)."""

import io
import json
import tarfile

import numpy as np
import pytest

import stoker
from stoker import transforms as T
from stoker.image_text import AspectBuckets, Image, Json

PIL = pytest.importorskip("PIL.Image")
pytest.importorskip("stoker._text")

BUCKETS = AspectBuckets(sizes=[(32, 32), (24, 48), (48, 24)])
# (width, height): square, wide, tall, in between, and a 1:2.3 image nearer the tall bucket.
SIZES = [(64, 64), (40, 96), (96, 40), (50, 70), (70, 50), (64, 128), (33, 77), (45, 45)]


def image_bytes(rng, w, h, fmt):
    buf = io.BytesIO()
    PIL.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, fmt)
    return buf.getvalue()


def write_shards(tmp, n_shards=3, per=8, fmt="PNG", bad=()):
    rng = np.random.default_rng(1)
    paths = []
    for s in range(n_shards):
        path = tmp / f"b-{s}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(per):
                n = s * per + i
                w, h = SIZES[n % len(SIZES)]
                members = {"png" if fmt == "PNG" else "jpg":
                           b"\x89PNG broken" if n in bad else image_bytes(rng, w, h, fmt),
                           "json": json.dumps({"id": n}).encode()}
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{n:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("buckets"))


def fields(crop="random", transform=None):
    return {"pixel_values": Image(transform, buckets=BUCKETS, crop=crop), "id": Json("id", "int64")}


def nearest(w, h):
    return min(range(len(BUCKETS.sizes)),
               key=lambda b: abs(np.log(w / h) - np.log(BUCKETS.sizes[b][1] / BUCKETS.sizes[b][0])))


def test_each_image_is_in_the_nearest_bucket_resized_to_cover_and_cropped(shards):
    """The pixels are PIL's resize to cover the bucket (BILINEAR) cropped at the recorded
    offset, within one level (the crop is resampled from its box, not the whole image)."""
    for crop in ("random", "center"):
        ds = stoker.TarShards(shards[:1], fields=fields(crop))
        with tarfile.open(shards[0]) as tar:
            pngs = [m for m in tar.getmembers() if m.name.endswith(".png")]
            for i, m in enumerate(pngs):
                im = PIL.open(tar.extractfile(m)).convert("RGB")
                x = ds[i]
                bh, bw = BUCKETS.sizes[nearest(im.width, im.height)]
                assert x["pixel_values"].shape == (3, bh, bw)
                assert x["original_sizes"].tolist() == [im.height, im.width]
                top, left = x["crop_top_lefts"].tolist()
                s = max(bh / im.height, bw / im.width)
                rw, rh = max(bw, round(im.width * s)), max(bh, round(im.height * s))
                assert 0 <= top <= rh - bh and 0 <= left <= rw - bw
                if crop == "center":
                    assert (top, left) == (round((rh - bh) / 2), round((rw - bw) / 2))
                ref = np.asarray(im.resize((rw, rh), PIL.BILINEAR))[top:top + bh, left:left + bw]
                diff = np.abs(ref.transpose(2, 0, 1).astype(int) - x["pixel_values"].astype(int))
                assert diff.max() <= 1 and diff.mean() < 0.3, (i, diff.max(), diff.mean())
    assert ds._buckets().tolist() == [nearest(*SIZES[i]) for i in range(8)]


def batches(ds, **kw):
    return list(stoker.DataLoader(ds, **{"output": "numpy", **kw}))


def test_every_batch_is_one_bucket_every_sample_once_whatever_the_workers(shards):
    ds = stoker.TarShards(shards, fields=fields(transform=T.Compose(
        [T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize([0.5] * 3, [0.5] * 3)])))
    kw = {"batch_size": 3, "shuffle": True, "seed": 4}
    runs = [batches(ds, num_workers=w, **kw) for w in (0, 2)]
    for a, b in zip(*runs, strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    buckets = ds._buckets()
    ids = []
    for b in runs[0]:
        assert b["pixel_values"].dtype == np.float32 and len(b["id"]) <= 3
        assert len({int(buckets[i]) for i in b["id"]}) == 1
        assert b["pixel_values"].shape[2:] == BUCKETS.sizes[buckets[b["id"][0]]]
        ids += b["id"].tolist()
    assert sorted(ids) == list(range(24))
    other = batches(ds, **{**kw, "seed": 5})
    assert [b["id"].tolist() for b in other] != [b["id"].tolist() for b in runs[0]]


def test_a_pixel_budget_and_resume_mid_epoch(shards):
    ds = stoker.TarShards(shards, fields=fields())
    budget = stoker.Budget(pixels=3 * 32 * 32)
    kw = {"batch_size": budget, "shuffle": True, "seed": 2, "num_workers": 2}
    whole = batches(ds, **kw)
    for b in whole:
        assert b["pixel_values"].shape[0] * np.prod(b["pixel_values"].shape[2:]) <= budget.value
    assert sorted(i for b in whole for i in b["id"].tolist()) == list(range(24))
    loader = stoker.DataLoader(ds, output="numpy", **kw)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = stoker.DataLoader(ds, output="numpy", **{**kw, "num_workers": 1})
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(whole) - 3
    for a, b in zip(whole[3:], rest, strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_ranks_take_whole_steps_of_one_bucket(shards):
    ds = stoker.TarShards(shards, fields=fields())
    kw = {"batch_size": 2, "shuffle": True, "seed": 1, "world_size": 2}
    ranks = [batches(ds, rank=r, **kw) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1])
    buckets = ds._buckets()
    seen = []
    for a, b in zip(*ranks):  # a step: both ranks' batches from one bucket
        assert {int(buckets[i]) for i in a["id"]} == {int(buckets[i]) for i in b["id"]}
        seen += a["id"].tolist() + b["id"].tolist()
    assert len(seen) == len(set(seen))
    dropped = stoker.DataLoader(ds, rank=0, **kw).stats()["budget"]["dropped_samples"]
    assert len(seen) + dropped == 24


def test_bad_images_are_errors_naming_the_sample_or_skips_from_the_same_bucket(tmp_path):
    paths = write_shards(tmp_path, n_shards=1, per=8, bad=(3,))
    ds = stoker.TarShards(paths, fields=fields())
    assert ds.bucket_sizes()[1][3].tolist() == [0, 0]  # no header: planned as 1:1, fails on read
    with pytest.raises(stoker.SampleError, match=r"b-0\.tar:0003"):
        batches(ds, batch_size=2)
    loader = stoker.DataLoader(ds, batch_size=2, on_error="skip", output="numpy")
    got = list(loader)
    assert loader.stats()["skipped"] == 1
    buckets = ds._buckets()
    for b in got:
        assert 3 not in b["id"].tolist()
        assert len({int(buckets[i]) for i in b["id"]}) == 1


def test_aspect_buckets_for_a_pixel_budget_and_bad_specs(shards):
    sdxl = AspectBuckets(pixels=1024 * 1024, step=64)
    assert (1024, 1024) in sdxl.sizes and (512, 2048) in sdxl.sizes and (2048, 512) in sdxl.sizes
    assert all(h % 64 == 0 and w % 64 == 0 and h * w <= 1024 * 1024 for h, w in sdxl.sizes)
    assert all(512 <= min(s) and max(s) <= 2048 for s in sdxl.sizes)
    ratios = [w / h for h, w in sdxl.sizes]
    assert ratios == sorted(ratios)
    assert AspectBuckets(sizes=[(32, 32)]) == AspectBuckets(sizes=[[32, 32]])
    for bad in ({}, {"pixels": 0}, {"pixels": 100, "sizes": [(1, 1)]}, {"sizes": []},
                {"sizes": [(0, 4)]}, {"sizes": [(4, 4), (4, 4)]}, {"pixels": 4096, "step": 8192}):
        with pytest.raises(ValueError):
            AspectBuckets(**bad)
    with pytest.raises(ValueError, match="crop"):
        Image(buckets=BUCKETS, crop="left")
    with pytest.raises(ValueError, match="change its size"):
        stoker.TarShards(shards, fields={"pixel_values": Image(T.CenterCrop(8), buckets=BUCKETS)})
    with pytest.raises(ValueError, match="one Image field"):
        stoker.TarShards(shards, fields={"a": Image(buckets=BUCKETS), "b": Image(buckets=BUCKETS)})
    ds = stoker.TarShards(shards, fields=fields())
    with pytest.raises(ValueError, match="bucket bounds"):
        stoker.DataLoader(ds, batch_size=stoker.Budget(pixels=4096, buckets=[1000]))
