"""stoker.TableDataset: Parquet, Arrow IPC, Arrow tables, polars/DuckDB and Hugging Face datasets,
made here with the real libraries (no network)."""

import os
import pickle

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import stoker  # noqa: E402
from stoker import transforms as T  # noqa: E402

N = 1000


def numbers_table(n=N):
    rng = np.random.default_rng(0)
    return pa.table({
        "id": np.arange(n, dtype=np.int64),
        "x": rng.random(n).astype(np.float32),
        "v": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(3 * n, dtype=np.float64)), 3),
        "tokens": pa.array([list(range(i, i + i % 11)) for i in range(n)], pa.list_(pa.int32())),
        "flag": pa.array([i % 3 == 0 for i in range(n)]),
        "text": [f"row {i}" for i in range(n)],
    })


@pytest.fixture(scope="module")
def numbers_parquet(tmp_path_factory):
    path = tmp_path_factory.mktemp("tables") / "numbers.parquet"
    pq.write_table(numbers_table(), path, row_group_size=64)
    return str(path)


def epoch(loader, key="id"):
    return [b[key].numpy().copy() for b in loader]


def test_columns_become_a_dict_of_tensors(numbers_parquet):
    ds = stoker.TableDataset(numbers_parquet)
    assert ds.columns == ["id", "x", "v", "tokens", "flag"]  # text only when asked (it can't)
    assert len(ds) == N
    table = numbers_table()
    batches = list(stoker.DataLoader(ds, batch_size=100))
    b = batches[3]
    assert set(b) == {"id", "x", "v", "tokens", "tokens_length", "flag"}
    rows = range(300, 400)
    assert b["id"].tolist() == list(rows)
    np.testing.assert_array_equal(b["x"].numpy(), table["x"].to_numpy()[300:400])
    assert b["v"].shape == (100, 3) and b["v"][0].tolist() == [900.0, 901.0, 902.0]
    assert b["tokens"].shape == (100, 10)  # the longest list
    for r, toks, n in zip(rows, b["tokens"].tolist(), b["tokens_length"].tolist()):
        assert n == r % 11 and toks == list(range(r, r + n)) + [0] * (10 - n)
    assert b["flag"].tolist() == [r % 3 == 0 for r in rows]
    cut = stoker.TableDataset(numbers_parquet, columns=["tokens"], max_length=4, pad_value=-1)
    assert cut[10]["tokens"].tolist() == [10, 11, 12, 13] and cut[10]["tokens_length"] == 4
    assert cut[2]["tokens"].tolist() == [2, 3, -1, -1] and cut[2]["tokens_length"] == 2


def test_text_columns_come_as_lists_when_asked_for(numbers_parquet, tmp_path):
    table = numbers_table()
    for source in (numbers_parquet, table):
        ds = stoker.TableDataset(source, columns=["id", "text"])
        assert ds[7] == {"id": 7, "text": "row 7"}
        for b in stoker.DataLoader(ds, batch_size=64, shuffle=True, num_workers=2):
            assert b["text"] == [f"row {i}" for i in b["id"].tolist()]
        only = stoker.TableDataset(source, columns=["text"])
        assert [t for b in stoker.DataLoader(only, batch_size=100) for t in b["text"]] == \
            [f"row {i}" for i in range(N)]


def test_shuffled_epochs_are_exact_and_identical_whatever_the_workers(numbers_parquet):
    runs = []
    for workers in (0, 1, 2):
        ds = stoker.TableDataset(numbers_parquet, columns=["id", "x"], shuffle_window=256)
        loader = stoker.DataLoader(ds, batch_size=50, shuffle=True, seed=3,
                                   num_workers=workers)
        batches = epoch(loader)
        assert sorted(np.concatenate(batches).tolist()) == list(range(N))
        runs.append(batches)
        # The block order decodes each row group once per epoch.
        assert ds.cache_stats()["block_reads"] == -(-N // 64)
    for other in runs[1:]:
        assert all((a == b).all() for a, b in zip(runs[0], other))
    # Not the file's order, and another epoch is another order.
    assert np.concatenate(runs[0]).tolist() != list(range(N))


def test_a_window_as_large_as_the_table_is_a_full_shuffle(numbers_parquet):
    local = stoker.TableDataset(numbers_parquet, columns=["id"], shuffle_window=128)
    full = stoker.TableDataset(numbers_parquet, columns=["id"], shuffle_window=N)
    first = np.concatenate(epoch(stoker.DataLoader(local, batch_size=N, shuffle=True)))
    whole = np.concatenate(epoch(stoker.DataLoader(full, batch_size=N, shuffle=True)))
    # The first 128 positions of the windowed order come from two row groups; the full order's
    # from most of them.
    assert len(set(first[:128] // 64)) <= 3
    assert len(set(whole[:128] // 64)) >= 10


def test_resume_mid_epoch_and_on_another_world_size(numbers_parquet):
    ds = stoker.TableDataset(numbers_parquet, columns=["id"])
    loader = stoker.DataLoader(ds, batch_size=32, shuffle=True, seed=5)
    full = epoch(loader)
    partial = stoker.DataLoader(ds, batch_size=32, shuffle=True, seed=5)
    it = iter(partial)
    head = [next(it)["id"].numpy().copy() for _ in range(7)]
    state = partial.state_dict()
    del it
    again = stoker.DataLoader(ds, batch_size=32, shuffle=True, seed=5)
    again.load_state_dict(state)
    rest = epoch(again)
    assert all((a == b).all() for a, b in zip(head + rest, full))
    # Two ranks take up the rest of the epoch: every row not yet seen, once.
    seen = set(np.concatenate(head).tolist())
    ranks = []
    for rank in range(2):
        r = stoker.DataLoader(ds, batch_size=32, shuffle=True, seed=5, rank=rank, world_size=2)
        r.load_state_dict(state)
        ranks.append(np.concatenate(epoch(r)).tolist())
    tail = ranks[0] + ranks[1]
    assert set(tail) == set(range(N)) - seen
    assert len(ranks[0]) == len(ranks[1])


def test_row_groups_are_striped_and_resume_elastically_exactly(numbers_parquet):
    # Row groups are visited in a block order arranged for the world size (stripes): a 4-rank
    # job that stops after 2 batches and a 3-rank job that finishes the epoch (still arranged
    # for 4) read every row exactly once; shuffle="shards" orders the row groups alike.
    ds = stoker.TableDataset(numbers_parquet, columns=["id"])
    for shuffle in (True, "shards"):
        kw = dict(batch_size=8, shuffle=shuffle, seed=3, num_workers=1)
        seen = []
        for rank in range(4):
            r = stoker.DataLoader(ds, rank=rank, world_size=4, **kw)
            it = iter(r)
            seen += [v for _ in range(2) for v in next(it)["id"].tolist()]
            state = r.state_dict()
            del it
        assert state["stripes"] == 4 and state["shard_window"] >= 1
        for rank in range(3):
            r = stoker.DataLoader(ds, rank=rank, world_size=3, **kw)
            r.load_state_dict(state)
            seen += np.concatenate(epoch(r)).tolist()
        assert sorted(seen) == list(range(N))


def test_ipc_files_and_in_memory_tables_read_alike(numbers_parquet, tmp_path):
    table = numbers_table()
    with pa.OSFile(str(tmp_path / "f.arrow"), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table, max_chunksize=300)
    with pa.OSFile(str(tmp_path / "s.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table, max_chunksize=128)
    cols = ["id", "v", "tokens"]
    expected = stoker.TableDataset(numbers_parquet, columns=cols)
    sources = [str(tmp_path / "f.arrow"), str(tmp_path / "s.arrow"), table,
               table.to_batches(max_chunksize=200)[0:5] and pa.Table.from_batches(
                   table.to_batches(max_chunksize=200))]
    for source in sources:
        ds = stoker.TableDataset(source, columns=cols)
        for i in (0, 17, 555, 999):
            for k in expected[i]:
                np.testing.assert_array_equal(ds[i][k], expected[i][k])
        got = np.concatenate(epoch(stoker.DataLoader(ds, batch_size=100, shuffle=True)))
        assert sorted(got.tolist()) == list(range(N))


def test_polars_and_duckdb_results(numbers_parquet):
    polars = pytest.importorskip("polars")
    duckdb = pytest.importorskip("duckdb")
    frame = polars.read_parquet(numbers_parquet)
    ds = stoker.TableDataset(frame, columns=["id", "x"])
    assert ds[42]["id"] == 42
    rel = duckdb.sql(f"SELECT id, x * 2 AS x2 FROM '{numbers_parquet}' WHERE id % 2 = 0")
    ds = stoker.TableDataset(rel)
    assert len(ds) == N // 2
    ids = np.concatenate(epoch(stoker.DataLoader(ds, batch_size=64)))
    assert sorted(ids.tolist()) == list(range(0, N, 2))


def test_many_files_a_directory_and_a_glob(tmp_path):
    table = numbers_table()
    for k in range(3):
        pq.write_table(table.slice(k * 400, 400), tmp_path / f"part-{k}.parquet",
                       row_group_size=100)
    for source in (str(tmp_path), str(tmp_path / "part-*.parquet"),
                   [tmp_path / f"part-{k}.parquet" for k in range(3)]):
        ds = stoker.TableDataset(source, columns=["id"])
        assert len(ds) == N and ds[450]["id"] == 450
    with pytest.raises(FileNotFoundError, match="no table file matches"):
        stoker.TableDataset(str(tmp_path / "nope-*.parquet"))


def test_bad_tables_say_which_file_column_and_row(numbers_parquet, tmp_path):
    with pytest.raises(ValueError, match=r"numbers.parquet has no column 'nope' \(its columns: "
                                         r"id, x, v, tokens, flag, text\)"):
        stoker.TableDataset(numbers_parquet, columns=["nope"])
    with pytest.raises(ValueError, match="column 'x' is float; an image column holds encoded"):
        stoker.TableDataset(numbers_parquet, image="x", transform=T.ToTensor())
    with pytest.raises(ValueError, match="'text' is string, not an integer column"):
        stoker.TableDataset(pa.table({"img": [b"x"], "text": ["a"]}), image="img", label="text")
    data = open(numbers_parquet, "rb").read()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cut.parquet is not a readable Parquet file"):
        stoker.TableDataset(str(cut))
    (tmp_path / "hello.parquet").write_text("hello")
    with pytest.raises(ValueError, match="neither a Parquet file nor an Arrow IPC file"):
        stoker.TableDataset(str(tmp_path / "hello.parquet"))
    with pytest.raises(TypeError, match="Arrow tables"):
        stoker.TableDataset(object())
    nulls = pa.table({"id": pa.array([1, None, 3] * 10, pa.int64())})
    pq.write_table(nulls, tmp_path / "nulls.parquet", row_group_size=10)
    loader = stoker.DataLoader(stoker.TableDataset(str(tmp_path / "nulls.parquet")),
                               batch_size=10)
    with pytest.raises(stoker.SampleError, match=r"sample 1 \(nulls.parquet: row group 0, row 1\): "
                                                 r"column 'id' is null"):
        epoch(loader)
    skip = stoker.DataLoader(stoker.TableDataset(str(tmp_path / "nulls.parquet")), batch_size=10,
                             on_error="skip")
    got = np.concatenate(epoch(skip))
    assert len(got) == 30 and None not in got.tolist()
    assert skip.stats()["skipped"] == 10


# --- image tables ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def photos():
    from stoker.sample_data import make_sample
    make_sample()
    folder = stoker.ImageFolder(os.path.join(str(_sample_root()), "train"))
    return folder.samples[::10]  # 100 photos of 10 classes


def _sample_root():
    from stoker.sample_data import default_sample_root
    return default_sample_root()


@pytest.fixture(scope="module")
def photo_parquet(photos, tmp_path_factory):
    """The photos as Hugging Face writes an image dataset: an Image struct and a label."""
    images = [{"bytes": open(p, "rb").read(), "path": os.path.basename(p)} for p, _ in photos]
    table = pa.table({"image": images, "label": pa.array([c for _, c in photos], pa.int64())})
    path = tmp_path_factory.mktemp("photos") / "photos.parquet"
    pq.write_table(table, path, row_group_size=16)
    return str(path)


VAL = T.Compose([T.Resize(64), T.CenterCrop(56), T.ToTensor()])


def test_image_tables_decode_as_image_folder(photos, photo_parquet, tmp_path):
    ds = stoker.TableDataset(photo_parquet, image="image", label="label", transform=VAL)
    folder = stoker.ImageFolder(os.path.join(str(_sample_root()), "train"), transform=VAL)
    index = {p: i for i, (p, _) in enumerate(folder.samples)}
    for i in (0, 37, 99):
        image, label = ds[i]
        ref, ref_label = folder[index[photos[i][0]]]
        assert label == ref_label == photos[i][1]
        np.testing.assert_array_equal(image, ref)
    images, labels = next(iter(stoker.DataLoader(ds, batch_size=32)))
    assert images.shape == (32, 3, 56, 56) and labels.tolist() == [c for _, c in photos[:32]]
    assert ds.targets.tolist() == [c for _, c in photos]
    # Stratified and class-weighted orders draw on the label column, no image decoded.
    loader = stoker.DataLoader(ds, batch_size=20, shuffle="stratified", seed=1)
    for _, labels in loader:
        assert sorted(np.bincount(labels.numpy(), minlength=10).tolist()) == [2] * 10
    # A binary column works as HF's struct does; without label=, a batch is the images.
    table = pq.read_table(photo_parquet)
    raw = pa.table({"jpeg": table["image"].combine_chunks().field("bytes")})
    images = next(iter(stoker.DataLoader(stoker.TableDataset(raw, image="jpeg", transform=VAL),
                                         batch_size=8)))
    np.testing.assert_array_equal(images[3].numpy(), ds[3][0])


def test_corrupt_images_in_a_table_are_named_or_skipped(photo_parquet, tmp_path):
    table = pq.read_table(photo_parquet)
    images = table["image"].to_pylist()
    images[21]["bytes"] = images[21]["bytes"][:200]  # truncated JPEG
    images[40]["bytes"] = b"not an image"
    bad = tmp_path / "bad.parquet"
    pq.write_table(table.set_column(0, "image", pa.array(images, table.schema.field(0).type)),
                   bad, row_group_size=16)
    ds = stoker.TableDataset(str(bad), image="image", label="label", transform=VAL)
    with pytest.raises(stoker.SampleError, match=r"bad.parquet: row group 1, row 5"):
        list(stoker.DataLoader(ds, batch_size=10))
    loader = stoker.DataLoader(ds, batch_size=10, on_error="skip")
    assert sum(len(b[1]) for b in loader) == 100
    assert loader.stats()["skipped"] == 2


def test_hugging_face_datasets(photos, tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(num_classes=10)})
    made = datasets.Dataset.from_dict(
        {"image": [p for p, _ in photos], "label": [c for _, c in photos]}, features=features)
    made = made.cast_column("image", datasets.Image())
    made.to_parquet(str(tmp_path / "hf.parquet"))
    hf = datasets.load_dataset("parquet", data_files=str(tmp_path / "hf.parquet"),
                               split="train", cache_dir=str(tmp_path / "cache"))
    ds = stoker.TableDataset(hf, image="image", label="label", transform=VAL)
    reference = stoker.TableDataset(str(tmp_path / "hf.parquet"), image="image", label="label",
                                    transform=VAL)
    assert len(ds) == 100
    for i in (0, 50, 99):
        np.testing.assert_array_equal(ds[i][0], reference[i][0])
        assert ds[i][1] == photos[i][1]
    # An indices mapping (shuffle, select, splits) is applied.
    shuffled = hf.shuffle(seed=0).select(range(30))
    order = shuffled._indices.column(0).to_pylist()
    sub = stoker.TableDataset(shuffled, image="image", label="label", transform=VAL)
    assert len(sub) == 30
    for i in (0, 29):
        np.testing.assert_array_equal(sub[i][0], reference[order[i]][0])
    # The images as paths (HF's Image with bytes=None) are read from their files.
    assert made.data.table["image"][0]["bytes"].as_py() is None
    on_disk = stoker.TableDataset(made, image="image", label="label", transform=VAL)
    np.testing.assert_array_equal(on_disk[5][0], reference[5][0])


def test_a_file_table_pickles_as_its_spec(numbers_parquet):
    ds = stoker.TableDataset(numbers_parquet, columns=["id", "tokens"], max_length=5)
    again = pickle.loads(pickle.dumps(ds))
    assert again.columns == ["id", "tokens"] and again[7]["tokens"].tolist() == [7, 8, 9, 10, 11]
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(stoker.TableDataset(numbers_table(), columns=["id"]))


def test_stats_tune_and_diagnose_accept_a_table(photo_parquet, numbers_parquet, capsys):
    from stoker.tuning import diagnose, stats, tune
    assert stats.main([photo_parquet, "--image", "image"]) == 0
    out = capsys.readouterr().out
    assert "TableDataset" in out and "photos.parquet: 100 images" in out and "Normalize(" in out
    assert stats.main([photo_parquet, "--image", "image", "--label", "label", "--classes"]) == 0
    assert "10 classes, 100 samples" in capsys.readouterr().out
    assert stats.main([numbers_parquet]) == 2
    assert "a TableDataset with an image column (--image COLUMN)" in capsys.readouterr().err
    assert stats.main([numbers_parquet, "--label", "id"]) == 2  # --label without --image
    assert "give --image too" in capsys.readouterr().err
    assert diagnose.main([photo_parquet, "--image", "image", "--seconds", "0.5"]) == 0
    assert "action:" in capsys.readouterr().out
    assert diagnose.main([numbers_parquet, "--seconds", "0.3", "--batch-size", "16"]) == 0
    assert tune.main([numbers_parquet, "--time-budget", "3", "--batch-size", "32"]) == 0
    assert "num_workers" in capsys.readouterr().out
