"""The audio wing's sources of audio inside other files (stoker/audio/shards.py): WebDataset tar
shards, local and on object storage, and Hugging Face audio tables (Parquet, Arrow, a pyarrow
Table), decoded from memory. Each sample equals the same audio read as a file, bit for bit; every
key once an epoch whatever the workers, resume, Budget(seconds=...); bad members named
``shard.tar:key`` or skipped and counted; keys without audio under missing="error"|"skip".

Test audio is made as test_audio.py makes it (PyAV encodes FLAC, MP3, Opus)."""

import io
import json
import os
import pickle
import shutil
import tarfile
import warnings

import numpy as np
import pytest

import stoker

pytest.importorskip("stoker._audio", reason="this build has no audio module")
from stoker import audio  # noqa: E402
from test_audio import encode, sweep, write_wav  # noqa: E402

# (key, codec, seconds, rate, transcript as .txt, .json or none)
CODEC_SUFFIXES = (".flac", ".wav", ".mp3", ".opus")
CLIPS = [("a", "flac", 0.50, 16000, "txt"), ("b", "wav", 0.30, 16000, "json"),
         ("c", "mp3", 0.60, 22050, "txt"), ("d", "opus", 0.40, 48000, "json"),
         ("e", "flac", 0.70, 16000, None), ("f", "wav", 0.45, 8000, "txt")]


def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_shard(path, members):
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            add(tar, name, data)
    return str(path)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The clips as files (files/<key>.<ext>) and as 2 tar shards of 3 keys (shards/0.tar,
    1.tar), with their transcripts."""
    root = tmp_path_factory.mktemp("audio_sources")
    (root / "files").mkdir()
    (root / "shards").mkdir()
    files, texts, members = [], [], [[], []]
    for i, (key, codec, seconds, rate, kind) in enumerate(CLIPS):
        x = sweep(seconds, rate, noise=0.05, seed=i)
        path = root / "files" / f"{key}.{codec}"
        if codec == "wav":
            write_wav(path, x, rate)
        else:
            encode(path, x, rate, codec)
        files.append(str(path))
        text = f"clip {key}" if kind else None
        texts.append(text)
        shard = members[i // 3]
        shard.append((f"{key}.{codec}", path.read_bytes()))
        if kind == "txt":
            shard.append((f"{key}.txt", f" {text}\n".encode()))
        elif kind == "json":
            shard.append((f"{key}.json", json.dumps({"text": text, "id": i}).encode()))
    shards = [write_shard(root / "shards" / f"{s}.tar", m) for s, m in enumerate(members)]
    return {"root": root, "files": files, "texts": texts, "shards": shards}


def batches(loader):
    return [(np.asarray(b["audio"]), np.asarray(b["audio_lens"]), b.get("text")) for b in loader]


def same_as_local(remote, local, paths):
    """``remote`` has the ``paths``, and the texts, durations and (shuffled, 2 workers) batches of
    ``local``."""
    assert [remote.path(i) for i in range(len(remote))] == paths
    assert remote.texts == local.texts
    np.testing.assert_array_equal(remote._lengths("seconds"), local._lengths("seconds"))
    kw = dict(batch_size=2, shuffle=True, seed=4, output="numpy")
    same(batches(stoker.DataLoader(remote, num_workers=2, **kw)),
         batches(stoker.DataLoader(local, **kw)))


def same(a, b):
    assert len(a) == len(b)
    for (x, lx, tx), (y, ly, ty) in zip(a, b):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(lx, ly)
        assert tx == ty


def test_tar_samples_are_the_files_decoded_with_their_transcripts(made):
    ds = stoker.AudioDataset(os.path.join(made["root"], "shards", "{0..1}.tar"))
    files = stoker.AudioDataset(made["files"])
    assert len(ds) == len(CLIPS)
    assert [ds.path(i) for i in range(len(ds))] == \
        [f"{made['shards'][i // 3]}:{c[0]}" for i, c in enumerate(CLIPS)]
    np.testing.assert_array_equal(ds._lengths("seconds"), files._lengths("seconds"))
    assert ds.texts == made["texts"]
    for i in range(len(ds)):
        got, want = ds[i], files[i]
        np.testing.assert_array_equal(got["audio"], want["audio"])  # bit-identical
        assert got["text"] == made["texts"][i]
    again = pickle.loads(pickle.dumps(ds))  # as a worker process or another node rebuilds it
    assert again._identity() == ds._identity() and again.texts == ds.texts
    whole = audio.load(made["files"][2])
    np.testing.assert_array_equal(audio.load(open(made["files"][2], "rb").read()), whole)
    assert audio.probe(open(made["files"][3], "rb").read()) == audio.probe(made["files"][3])


def test_tar_epochs_hold_every_key_once_whatever_the_workers_and_resume(made):
    ds = stoker.AudioDataset(made["shards"], text=False)
    assert ds.texts is None
    runs = [batches(stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=5, num_workers=w,
                                      output="numpy")) for w in (1, 2)]
    same(*runs)
    want = sorted(round(float(d) * 16000) for d in ds._lengths("seconds"))
    assert sorted(int(n) for _, lens, _ in runs[0] for n in lens) == want
    loader = stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=5, output="numpy")
    it = iter(loader)
    head = [next(it)]
    state = loader.state_dict()
    del it
    resumed = stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=5, output="numpy")
    resumed.load_state_dict(state)
    same(batches(head) + batches(resumed), runs[0])
    budget = stoker.DataLoader(ds, batch_size=stoker.Budget(seconds=1.0), shuffle=True, seed=1,
                               output="numpy")
    seen = []
    for x, lens, _ in batches(budget):
        assert x.shape[0] * x.shape[1] <= 1.0 * 16000
        seen += lens.tolist()
    assert sorted(seen) == want


@pytest.fixture
def bad_shard(made, tmp_path):
    flac = open(made["files"][0], "rb").read()
    long = encode(tmp_path / "long.flac", sweep(1.0, 16000), 16000, "flac").read_bytes()
    return write_shard(tmp_path / "bad.tar", [
        ("good.flac", flac), ("good.txt", b"fine"),
        ("junk.flac", b"not audio at all\n" * 300), ("junk.txt", b"junk"),
        ("cut.flac", long[:len(long) // 3]), ("cut.txt", b"cut"),
        ("orphan.txt", b"a transcript without audio")])


def test_bad_members_are_named_by_shard_and_key_or_skipped_and_counted(bad_shard):
    with pytest.raises(ValueError, match=r"bad\.tar:orphan: no audio member"):
        stoker.AudioDataset(bad_shard)
    ds = stoker.AudioDataset(bad_shard, missing="skip")
    assert len(ds) == 3 and ds.stats()["skipped_keys"] == 1
    # (FFmpeg cannot open a FLAC cut short, file or member: its header is unreadable too)
    assert ds.unreadable == [f"{bad_shard}:junk", f"{bad_shard}:cut"]
    it = iter(stoker.DataLoader(ds, batch_size=1, output="numpy"))
    failed, good = {}, []
    while True:
        try:
            good.append(next(it)["text"])
        except StopIteration:
            break
        except stoker.SampleError as e:
            failed[e.path] = e
    assert good == [["fine"]]
    assert set(failed) == {f"{bad_shard}:junk", f"{bad_shard}:cut"}
    for path, e in failed.items():
        assert path in str(e) and isinstance(e.__cause__, stoker.DecodeError), str(e)
    assert "not audio FFmpeg can read" in str(failed[f"{bad_shard}:junk"])
    loader = stoker.DataLoader(ds, batch_size=2, on_error="skip", output="numpy")
    assert {t for b in loader for t in b["text"]} == {"fine"}  # the bad ones replaced
    assert loader.stats()["skipped"] == 2


def hf_table(made, rows=None):
    """The clips as `datasets` writes an Audio() column: {bytes, path} structs, and a text
    column."""
    pa = pytest.importorskip("pyarrow")
    rows = range(len(made["files"])) if rows is None else rows
    audio_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    cells = [{"bytes": open(made["files"][i], "rb").read(),
              "path": os.path.basename(made["files"][i])} for i in rows]
    return pa.table({"audio": pa.array(cells, type=audio_type),
                     "text": [made["texts"][i] for i in rows]})


def test_remote_tar_shards_with_sidecars_are_made_without_fetching_a_shard(
        made, s3_server, monkeypatch, tmp_path):
    """`stoker index` stores each audio member's duration and channels and its key's transcript
    members in the shard's sidecar (facts.audio): a dataset over the remote shards is made from
    the sidecars alone (no shard in the cache until the loader reads), equal to the local one."""
    pytest.importorskip("obstore")
    from stoker.cli import main
    from stoker.sources.remote import INDEX_SUFFIX
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    cache = tmp_path / "cache"
    monkeypatch.setenv("STOKER_CACHE_DIR", str(cache))
    shards = []
    for p in made["shards"]:
        shards.append(str(tmp_path / os.path.basename(p)))
        shutil.copy(p, shards[-1])
    assert main(["index", *shards]) == 0
    doc = json.load(open(shards[0] + INDEX_SUFFIX))
    facts = doc["facts"]["audio"]
    assert sorted(facts) == [c[0] for c in CLIPS[:3]]
    assert facts["a"][2].strip() == made["texts"][0] and facts["b"][3] is not None  # .txt, .json
    s3_server.put("sidecars", {os.path.basename(p): open(p, "rb").read()
                               for p in shards + [q + INDEX_SUFFIX for q in shards]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RemoteIndexWarning: nothing indexed here
        remote = stoker.AudioDataset("s3://sidecars/{0..1}.tar")
    assert not cache.exists() or not [f for f in os.listdir(cache) if f.endswith(".tar")]
    local = stoker.AudioDataset(made["shards"])
    assert remote.texts == local.texts
    np.testing.assert_array_equal(remote._lengths("seconds"), local._lengths("seconds"))
    kw = dict(batch_size=2, shuffle=True, seed=5, output="numpy")
    same(batches(stoker.DataLoader(remote, num_workers=2, **kw)),
         batches(stoker.DataLoader(local, **kw)))
    assert len([f for f in os.listdir(cache) if f.endswith(".tar")]) == 2


def test_remote_files_from_urls_and_manifests_equal_the_local_files(
        made, s3_server, monkeypatch, tmp_path):
    """Audio files on S3: a NeMo manifest whose paths are URLs (local, or on S3 with paths
    relative to it) makes the dataset from its durations without fetching a file; URLs without
    durations are fetched once and their headers read (a RemoteIndexWarning). Samples, texts and
    durations equal the local files', whatever the workers."""
    pytest.importorskip("obstore")
    from stoker.sources.remote import RemoteIndexWarning
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    names = [os.path.basename(p) for p in made["files"]]
    s3_server.put("files", {f"audio/{n}": open(p, "rb").read()
                            for n, p in zip(names, made["files"])})
    local = stoker.AudioDataset(made["files"], text=made["texts"])
    durations = local._lengths("seconds")
    rows = [{"audio_filepath": f"audio/{n}", "duration": float(d), "text": t}
            for n, d, t in zip(names, durations, made["texts"])]
    s3_server.put("files", {"train.jsonl": "\n".join(json.dumps(r) for r in rows).encode()})
    absolute = tmp_path / "absolute.jsonl"
    absolute.write_text("\n".join(json.dumps(dict(r, audio_filepath="s3://files/" +
                                                   r["audio_filepath"])) for r in rows))
    for n, source in enumerate(("s3://files/train.jsonl", str(absolute))):
        cache = tmp_path / f"cache{n}"
        monkeypatch.setenv("STOKER_CACHE_DIR", str(cache))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing fetched: no RemoteIndexWarning
            ds = stoker.AudioDataset(source)
        assert not cache.exists() or not [f for f in os.listdir(cache)
                                           if f.endswith(tuple(CODEC_SUFFIXES))]
        assert [ds.path(i) for i in range(len(ds))] == [f"s3://files/audio/{n}" for n in names]
        assert ds.texts == local.texts
        np.testing.assert_array_equal(ds._lengths("seconds"), durations)
        kw = dict(batch_size=2, shuffle=True, seed=6, output="numpy")
        same(batches(stoker.DataLoader(ds, num_workers=2, **kw)),
             batches(stoker.DataLoader(local, **kw)))
    with pytest.warns(RemoteIndexWarning, match="6 of 6 remote audio files have no duration"):
        urls = stoker.AudioDataset([f"s3://files/audio/{n}" for n in names], text=made["texts"])
    np.testing.assert_array_equal(urls._lengths("seconds"), durations)
    for i in range(len(urls)):
        np.testing.assert_array_equal(urls[i]["audio"], local[i]["audio"])
    with pytest.warns(RemoteIndexWarning):  # made again from its spec (the files cached now)
        assert pickle.loads(pickle.dumps(urls))._identity() == urls._identity()


def test_hf_parquet_and_arrow_samples_are_the_files_decoded(made, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    pq.write_table(hf_table(made, [0, 1, 2]), tmp_path / "a.parquet", row_group_size=2)
    with pa.OSFile(str(tmp_path / "b.arrow"), "wb") as sink:  # as `datasets` caches it
        table = hf_table(made, [3, 4, 5])
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
    files = stoker.AudioDataset(made["files"])
    for source in ([str(tmp_path / "a.parquet"), str(tmp_path / "b.arrow")], hf_table(made)):
        ds = stoker.AudioDataset(source)
        assert len(ds) == len(CLIPS) and ds.texts == made["texts"]
        np.testing.assert_array_equal(ds._lengths("seconds"), files._lengths("seconds"))
        for i in range(len(ds)):
            np.testing.assert_array_equal(ds[i]["audio"], files[i]["audio"])
    assert ds.path(4) == "table:4"
    assert pickle.loads(pickle.dumps(ds))._identity() == ds._identity()
    assert stoker.AudioDataset([str(tmp_path / "a.parquet")]).path(2) == \
        f"{tmp_path / 'a.parquet'}:2"
    runs = [batches(stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=2, num_workers=w,
                                      output="numpy")) for w in (1, 2)]
    same(*runs)


def test_hf_tables_at_urls_equal_the_local_ones(made, s3_server, monkeypatch, tmp_path):
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("obstore")
    import pyarrow.parquet as pq
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    pq.write_table(hf_table(made, [0, 1, 2]), tmp_path / "a.parquet")
    with pa.OSFile(str(tmp_path / "b.arrow"), "wb") as sink:
        table = hf_table(made, [3, 4, 5])
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
    s3_server.put("tables", {n: (tmp_path / n).read_bytes() for n in ("a.parquet", "b.arrow")})
    remote = stoker.AudioDataset(["s3://tables/a.parquet", "s3://tables/b.arrow"])
    local = stoker.AudioDataset([str(tmp_path / "a.parquet"), str(tmp_path / "b.arrow")])
    assert remote.path(4) == "s3://tables/b.arrow:1" and remote.texts == local.texts
    np.testing.assert_array_equal(remote._lengths("seconds"), local._lengths("seconds"))
    for i in range(len(remote)):
        np.testing.assert_array_equal(remote[i]["audio"], local[i]["audio"])


def test_hf_rows_without_audio_bytes_under_missing(made):
    pa = pytest.importorskip("pyarrow")
    table = hf_table(made, [0, 1])
    cells = table.column("audio").to_pylist()
    cells[0]["bytes"] = None
    table = table.set_column(0, "audio", pa.array(cells, type=table.schema.field("audio").type))
    with pytest.raises(ValueError, match=r"table:0: no audio bytes"):
        stoker.AudioDataset(table)
    ds = stoker.AudioDataset(table, missing="skip")
    assert len(ds) == 1 and ds.texts == [made["texts"][1]] and ds.stats()["skipped_keys"] == 1
    want = stoker.AudioDataset([made["files"][1]])[0]["audio"]
    np.testing.assert_array_equal(ds[0]["audio"], want)
    with pytest.raises(ValueError, match="no column 'speech'"):
        stoker.AudioDataset(table, audio="speech")


def test_hf_cells_with_a_path_alone_read_the_file(made, tmp_path, monkeypatch):
    """A cell without bytes is its `path`'s file, as datasets' Audio() opens it (a relative path
    from the current directory); cells with bytes and cells with a path alone mix in one table;
    a path to no file is a missing row."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    table = hf_table(made)
    cells = table.column("audio").to_pylist()
    monkeypatch.chdir(os.path.dirname(made["files"][0]))
    for i in (0, 2, 3):  # relative, absolute, absolute
        cells[i]["bytes"] = None
        cells[i]["path"] = os.path.basename(made["files"][i]) if i == 0 else made["files"][i]
    table = table.set_column(0, "audio", pa.array(cells, type=table.schema.field("audio").type))
    pq.write_table(table, tmp_path / "mixed.parquet")
    files = stoker.AudioDataset(made["files"])
    for source in (table, str(tmp_path / "mixed.parquet")):
        ds = stoker.AudioDataset(source)
        assert len(ds) == len(CLIPS) and ds.texts == made["texts"]
        assert ds.path(0) == os.path.basename(made["files"][0])
        assert ds.path(2) == made["files"][2] and ds.path(1).endswith(":1")
        np.testing.assert_array_equal(ds._lengths("seconds"), files._lengths("seconds"))
        for i in range(len(ds)):
            np.testing.assert_array_equal(ds[i]["audio"], files[i]["audio"])
    runs = [batches(stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=4, num_workers=w,
                                      output="numpy")) for w in (1, 2)]
    same(*runs)
    every = stoker.AudioDataset(table.set_column(0, "audio", pa.array(
        [{"bytes": None, "path": p} for p in made["files"]],
        type=table.schema.field("audio").type)))  # a path in every cell: files only
    for i in range(len(every)):
        np.testing.assert_array_equal(every[i]["audio"], files[i]["audio"])
    cells[3]["path"] = str(tmp_path / "gone.flac")
    gone = table.set_column(0, "audio", pa.array(cells, type=table.schema.field("audio").type))
    with pytest.raises(ValueError, match=r"table:3: no audio bytes, and no file at '.*gone.flac'"):
        stoker.AudioDataset(gone)
    ds = stoker.AudioDataset(gone, missing="skip")
    assert len(ds) == len(CLIPS) - 1 and ds.stats()["skipped_keys"] == 1
    assert ds.texts == [t for i, t in enumerate(made["texts"]) if i != 3]


def test_remote_tar_shards_equal_the_local_ones(made, s3_server, monkeypatch, tmp_path):
    pytest.importorskip("obstore")
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    s3_server.put("audio", {os.path.basename(p): open(p, "rb").read() for p in made["shards"]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        remote = stoker.AudioDataset("s3://audio/{0..1}.tar")
    same_as_local(remote, stoker.AudioDataset(made["shards"]),
                  [f"s3://audio/{i // 3}.tar:{c[0]}" for i, c in enumerate(CLIPS)])
