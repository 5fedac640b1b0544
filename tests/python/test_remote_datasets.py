"""Remote datasets end to end: TarShards and TokenDataset over S3 (moto on 127.0.0.1) and HTTP,
through the fault proxy, against the same data read locally. Nothing here leaves this machine.
"""

import io
import json
import os
import subprocess
import tarfile
import sys
import warnings

import numpy as np
import pytest

import stoker
from stoker import transforms as T
from stoker.sample_data import make_sample
from stoker.sources.tar_index import tar_index_document
from stoker.sources.remote import INDEX_SUFFIX, RemoteIndexWarning

pytest.importorskip("obstore")
pytest.importorskip("moto")

TRANSFORM = T.Compose([T.Resize(40), T.CenterCrop(32), T.ToTensor()])


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """6 local tar shards of 36 sample photos (3 classes)."""
    root = tmp_path_factory.mktemp("remote") / "sample"
    make_sample(root, num_classes=3, images_per_class=12, shards=6)
    return sorted(str(p) for p in (root / "shards").glob("*.tar"))


def upload(s3_server, bucket, paths, *, index=True, suffix=""):
    """Uploads local files to s3://bucket/<name>, tar indexes beside them when asked."""
    files = {}
    for p in paths:
        name = os.path.basename(p) + suffix
        files[name] = open(p, "rb").read()
        if index and p.endswith(".tar"):
            members = stoker._native.remote.index_tar(p)
            files[name + INDEX_SUFFIX] = json.dumps(
                tar_index_document(os.path.getsize(p), members)).encode()
    s3_server.put(bucket, files)
    return [f"s3://{bucket}/{os.path.basename(p)}" for p in paths]


@pytest.fixture
def s3_env(s3_server, monkeypatch, tmp_path):
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    return s3_server


def epoch(ds, **kw):
    kw.setdefault("batch_size", 5)
    kw.setdefault("num_workers", 2)
    loader = stoker.DataLoader(ds, **kw)
    return loader, [tuple(np.asarray(f).copy() for f in batch) for batch in loader]


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("shuffle", [False, True])
def test_tar_shards_from_s3_equal_local_batches(s3_env, shards, shuffle):
    urls = upload(s3_env, "tars", shards)
    remote = stoker.TarShards("s3://tars/train-{0000..0005}.tar", transform=TRANSFORM)
    local = stoker.TarShards(shards, transform=TRANSFORM)
    assert remote.paths == urls and len(remote) == len(local) == 36
    assert remote.labels == local.labels
    assert remote.path(0) == urls[0] + ":" + local.path(0).split(":", 1)[1]
    loader, got = epoch(remote, shuffle=shuffle, seed=3)  # True: the shard order, remote
    _, want = epoch(local, shuffle="shards" if shuffle else False, seed=3)
    same(got, want)
    s = remote._remote.stats()
    assert s["fetched"] == 6 and s["failures"] == 0
    assert s["bytes_fetched"] == sum(os.path.getsize(p) for p in shards)


def test_second_epoch_and_second_dataset_reuse_the_cache(s3_env, shards, fault_proxy,
                                                         monkeypatch):
    upload(s3_env, "reuse", shards)
    proxy = fault_proxy(s3_env.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    ds = stoker.TarShards("s3://reuse/*.tar", transform=TRANSFORM)
    loader = stoker.DataLoader(ds, batch_size=6, shuffle=True, num_workers=2)
    first = [np.asarray(y).copy() for _, y in loader]
    served = proxy.bytes_served
    second = [np.asarray(y).copy() for _, y in loader]
    assert sorted(np.concatenate(first)) == sorted(np.concatenate(second))
    assert proxy.bytes_served == served  # nothing downloaded again
    s = ds._remote.stats()
    assert s["fetched"] == 6 and s["reuses"] == 6
    # Another dataset on the node (a second process would do the same): every shard found on
    # disk, only metadata requested.
    again = stoker.TarShards("s3://reuse/*.tar", transform=TRANSFORM)
    list(stoker.DataLoader(again, batch_size=6, num_workers=1))
    assert again._remote.stats()["disk_hits"] == 6
    assert again._remote.stats()["bytes_fetched"] == 0
    assert proxy.bytes_served - served < 64 << 10  # sidecar indexes, no shard


def test_a_cache_budget_below_the_dataset_evicts_and_stays_within_it(s3_env, shards, tmp_path):
    upload(s3_env, "tight", shards)
    biggest = max(os.path.getsize(p) for p in shards)
    ds = stoker.TarShards("s3://tight/*.tar", transform=TRANSFORM, cache_dir=str(tmp_path / "c"),
                          cache_budget=3 * biggest)
    _, got = epoch(ds, shuffle=False)
    _, want = epoch(stoker.TarShards(shards, transform=TRANSFORM), shuffle=False)
    same(got, want)
    s = ds._remote.stats()
    assert s["peak_bytes_on_disk"] <= 3 * biggest
    assert s["evictions"] >= 3
    on_disk = sum(os.path.getsize(os.path.join(tmp_path / "c", f))
                  for f in os.listdir(tmp_path / "c") if f.endswith(".tar"))
    assert on_disk <= 3 * biggest


def test_shards_without_an_index_are_indexed_once_and_the_index_kept(s3_env, shards):
    upload(s3_env, "noindex", shards, index=False)
    with pytest.warns(RemoteIndexWarning, match="6 of 6 remote tar shards have no index"):
        ds = stoker.TarShards("s3://noindex/*.tar", transform=TRANSFORM)
    assert ds.labels == stoker.TarShards(shards).labels
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = stoker.TarShards("s3://noindex/*.tar", transform=TRANSFORM)
    assert len(again) == 36


def test_wrong_credentials_fail_at_construction_naming_the_url(s3_env, shards, monkeypatch):
    upload(s3_env, "creds", shards[:1])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(stoker.remote.RemoteAuthError, match="s3://creds/.*a credentials problem"):
        stoker.TarShards("s3://creds/train-0000.tar", transform=TRANSFORM)


def test_transient_faults_are_retried_and_deliver_every_sample_once(s3_env, shards, fault_proxy,
                                                                     monkeypatch):
    upload(s3_env, "flaky", shards)
    proxy = fault_proxy(s3_env.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    options = {"max_retries": 5, "backoff_initial": 0.01, "backoff_max": 0.05, "timeout": 5}
    ds = stoker.TarShards("s3://flaky/*.tar", transform=TRANSFORM, storage_options=options)
    proxy.fail_next, proxy.fail_status = 4, 503
    proxy.reset_next, proxy.reset_after = 2, 1000
    proxy.truncate_next, proxy.truncate_after = 2, 5000
    _, got = epoch(ds, shuffle=True, seed=1)
    _, want = epoch(stoker.TarShards(shards, transform=TRANSFORM), shuffle="shards", seed=1)
    same(got, want)
    assert proxy.faults >= 8
    assert ds._remote.stats()["failures"] == 0


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_shard_that_keeps_failing_is_named_or_skipped(s3_env, shards, fault_proxy, monkeypatch,
                                                       on_error):
    upload(s3_env, "broken", shards)
    proxy = fault_proxy(s3_env.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    options = {"max_retries": 1, "backoff_initial": 0.01, "backoff_max": 0.02, "timeout": 5}
    ds = stoker.TarShards("s3://broken/*.tar", transform=TRANSFORM, storage_options=options)
    proxy.fail_pattern, proxy.fail_pattern_status = r"train-0003\.tar$", 500
    loader = stoker.DataLoader(ds, batch_size=6, num_workers=2, on_error=on_error)
    if on_error == "raise":
        with pytest.raises(stoker.SampleError, match=r"s3://broken/train-0003\.tar") as e:
            list(loader)
        assert "cannot fetch shard s3://broken/train-0003.tar" in str(e.value.__cause__)
        return
    batches = list(loader)
    assert sum(len(y) for _, y in batches) == 36
    stats = loader.stats()
    assert stats["skipped"] == 6  # the shard's six samples, each replaced
    assert all("train-0003.tar" in s for s in stats["skipped_samples"])


def test_tar_shards_over_http(http_server, shards, tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    for p in shards[:2]:
        with open(os.path.join(http_server.root, os.path.basename(p)), "wb") as f:
            f.write(open(p, "rb").read())
    urls = [f"{http_server.url}/{os.path.basename(p)}" for p in shards[:2]]
    with pytest.warns(RemoteIndexWarning):
        ds = stoker.TarShards(urls, transform=TRANSFORM)
    _, got = epoch(ds)
    _, want = epoch(stoker.TarShards(shards[:2], transform=TRANSFORM))
    same(got, want)


# --- tokens --------------------------------------------------------------------------------------

def write_tokens(tmp_path, n_shards=5, tokens=3001, eos=7):
    rng = np.random.default_rng(0)
    paths = []
    for s in range(n_shards):
        t = rng.integers(0, 1000, tokens + 13 * s).astype(np.uint16)
        t[rng.integers(0, len(t), 20)] = eos
        p = tmp_path / f"tok-{s:03d}.bin"
        t.tofile(p)
        paths.append(str(p))
    return paths


@pytest.mark.parametrize("eos", [None, 7])
def test_token_dataset_from_s3_equals_local(s3_env, tmp_path, eos):
    paths = write_tokens(tmp_path)
    upload(s3_env, "tokens", paths)
    remote = stoker.TokenDataset("s3://tokens/tok-*.bin", seq_len=64, eos=eos)
    local = stoker.TokenDataset(paths, seq_len=64, eos=eos)
    assert len(remote) == len(local) and remote.num_tokens == local.num_tokens
    for shuffle in (False, True):
        _, got = epoch(remote, batch_size=16, shuffle=shuffle, seed=5)
        _, want = epoch(local, batch_size=16, shuffle="shards" if shuffle else False, seed=5)
        same(got, want)


def test_document_packing_over_s3_indexes_documents_once(s3_env, tmp_path):
    paths = write_tokens(tmp_path, n_shards=3)
    upload(s3_env, "docs", paths)
    with pytest.warns(RemoteIndexWarning, match="token shards"):
        remote = stoker.TokenDataset("s3://docs/*.bin", seq_len=128, eos=7, pack="document")
    local = stoker.TokenDataset(paths, seq_len=128, eos=7, pack="document")
    assert remote.num_documents == local.num_documents
    got = [b for b in stoker.DataLoader(remote, batch_size=8, shuffle=True, num_workers=1)]
    want = [b for b in stoker.DataLoader(local, batch_size=8, shuffle=True, num_workers=1)]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for key in w:
            np.testing.assert_array_equal(np.asarray(g[key]), np.asarray(w[key]))


def test_megatron_pairs_from_s3(s3_env, tmp_path):
    from test_token_corpus_native import write_megatron  # the corpus tests' writer
    prefix = tmp_path / "mg"
    write_megatron(prefix, [[[1, 2, 3, 4], [5]], [[6, 7]], [[8, 9, 10, 11, 12]]] * 50, np.uint16)
    upload(s3_env, "megatron", [str(prefix) + ".bin", str(prefix) + ".idx"])
    remote = stoker.TokenDataset("s3://megatron/mg.idx", seq_len=16)
    local = stoker.TokenDataset(str(prefix), seq_len=16)
    assert remote.formats == ["megatron"] and remote.num_documents == local.num_documents
    same(epoch(remote, batch_size=4)[1], epoch(local, batch_size=4)[1])


def test_a_worker_process_rebuilds_a_remote_dataset_from_the_cache(s3_env, shards, tmp_path):
    upload(s3_env, "pickled", shards[:2])
    ds = stoker.TarShards("s3://pickled/*.tar", transform=TRANSFORM)
    list(stoker.DataLoader(ds, batch_size=6, num_workers=1))
    code = ("import pickle, sys, stoker; ds = pickle.loads(sys.stdin.buffer.read()); "
            "import numpy as np; list(stoker.DataLoader(ds, batch_size=6, num_workers=1)); "
            "print(ds._remote.stats()['disk_hits'], ds._remote.stats()['bytes_fetched'])")
    import pickle
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(ds), env=os.environ,
                         capture_output=True)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    out = out.stdout.split()
    assert out == [b"2", b"0"]


# --- the shard order over remote shards ----------------------------------------------------------

def test_remote_tar_shards_default_to_the_shard_order_and_equal_local(s3_env, shards):
    upload(s3_env, "order", shards)
    remote = stoker.TarShards("s3://order/*.tar", transform=TRANSFORM)
    local = stoker.TarShards(shards, transform=TRANSFORM)
    assert remote.default_shuffle == "shards" and local.default_shuffle is True
    _, got = epoch(remote, shuffle=True, seed=9, shard_window=2)
    _, want = epoch(local, shuffle="shards", seed=9, shard_window=2)
    same(got, want)
    _, full = epoch(local, shuffle=True, seed=9)
    assert not all(np.array_equal(a[1], b[1]) for a, b in zip(got, full))  # not the full shuffle


def test_elastic_resume_mid_epoch_with_a_cold_cache(s3_env, shards, tmp_path):
    """Two ranks read half an epoch and save; three ranks on fresh nodes (empty caches) finish
    it: every sample exactly once."""
    upload(s3_env, "elastic", shards)

    def rank_loader(rank, world, cache):
        ds = stoker.TarShards("s3://elastic/*.tar", transform=T.Compose([T.CenterCrop(8),
                              T.ToTensor()]), cache_dir=str(tmp_path / cache))
        return ds, stoker.DataLoader(ds, batch_size=3, shuffle=True, seed=4, rank=rank,
                                     world_size=world, shard_window=1, num_workers=1)

    seen, states = [], []
    for rank in range(2):
        ds, loader = rank_loader(rank, 2, "node-a")
        it = iter(loader)
        for _ in range(3):
            seen.append(next(it))
        states.append(loader.state_dict())
        del it
    assert {**states[0], "rank": 0} == {**states[1], "rank": 0}
    for rank in range(3):
        ds, loader = rank_loader(rank, 3, f"node-b{rank}")
        loader.load_state_dict(states[0])
        seen.extend(loader)
        assert ds._remote.stats()["bytes_fetched"] > 0  # a cold cache, filled
    images = np.concatenate([np.asarray(x).reshape(len(y), -1) for x, y in seen])
    local = stoker.TarShards(shards, transform=T.Compose([T.CenterCrop(8), T.ToTensor()]))
    want = np.stack([np.asarray(local[i][0]).reshape(-1) for i in range(len(local))])
    assert len(images) == len(want)
    assert sorted(map(bytes, images)) == sorted(map(bytes, want))


# --- tools ---------------------------------------------------------------------------------------

def test_diagnose_names_the_network_when_shards_arrive_slowly(s3_env, shards, fault_proxy,
                                                              monkeypatch):
    from stoker.tuning.diagnose import diagnose
    upload(s3_env, "slow", shards)
    proxy = fault_proxy(s3_env.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    ds = stoker.TarShards("s3://slow/*.tar", transform=TRANSFORM)
    proxy.bandwidth = 400_000  # bytes/s: a shard (~150 KB) takes about a third of a second
    loader = stoker.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2)
    report = diagnose(loader, seconds=2.0, warmup_batches=0)
    assert report.verdict == "input-bound" and report.limiting_stage == "network", report.summary()
    assert "the network is the bottleneck" in report.action
    assert any(r.startswith("network: ") and "MB/s" in r for r in report.reasons)
    net = report.figures["network"]
    assert net["bytes_fetched"] > 0 and net["wait_seconds"] > 0


def test_tune_reports_the_network_and_the_cache_hit_rate(s3_env, shards):
    from stoker.tuning.tune import tune_loader
    upload(s3_env, "tune", shards)
    ds = stoker.TarShards("s3://tune/*.tar", transform=TRANSFORM)
    result = tune_loader(ds, batch_size=6, max_workers=2, repeats=1, seconds=0.2, gpu=False)
    net = result["network"]
    assert net["bytes_fetched"] == sum(os.path.getsize(p) for p in shards)
    assert net["first_reads"] >= 6 and 0 <= net["cache_hits"] <= net["first_reads"]


def test_stoker_index_writes_sidecars_local_and_remote(s3_env, shards, tmp_path):
    from stoker.cli import main
    local = []
    for p in shards[:2]:  # local shards, indexed before their upload
        dest = tmp_path / os.path.basename(p)
        dest.write_bytes(open(p, "rb").read())
        local.append(str(dest))
    assert main(["index", str(tmp_path / "*.tar")]) == 0
    assert json.load(open(local[0] + INDEX_SUFFIX))["samples"][0][0].endswith(".jpg")
    upload(s3_env, "indexed", local + [p + INDEX_SUFFIX for p in local], index=False)
    upload(s3_env, "indexed", shards[2:], index=False)
    assert main(["index", "s3://indexed/train-{0002..0005}.tar"]) == 0  # remote: fetched, put
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = stoker.TarShards("s3://indexed/*.tar", transform=TRANSFORM)
    assert ds._remote.stats()["bytes_fetched"] == 0 and len(ds) == 36
    tokens = write_tokens(tmp_path, n_shards=2)
    upload(s3_env, "indexed-tokens", tokens, index=False)
    assert main(["index", "--eos", "7", "s3://indexed-tokens/*.bin"]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        remote = stoker.TokenDataset("s3://indexed-tokens/tok-*.bin", seq_len=64, eos=7,
                                     pack="document")
    assert remote.num_documents == stoker.TokenDataset(tokens, seq_len=64, eos=7,
                                                       pack="document").num_documents
    # The directories' manifests: one request gives every shard's size and index.
    ds = stoker.TarShards("s3://indexed/*.tar", transform=TRANSFORM)
    list(stoker.DataLoader(ds, batch_size=6, num_workers=1))
    # the manifest, a HEAD and a sidecar for each of the 2 shards indexed locally, the 6 shards
    assert ds._remote.stats()["requests"] == 1 + 2 + 2 + 6
    assert main(["index", "s3://indexed-tokens/*.bin"]) == 0  # without --eos: the layouts
    plain = stoker.TokenDataset("s3://indexed-tokens/tok-*.bin", seq_len=64)
    assert plain._remote.stats()["requests"] == 1  # the manifest: no HEAD, no header read
    same(epoch(plain, batch_size=8)[1], epoch(stoker.TokenDataset(tokens, seq_len=64),
                                               batch_size=8)[1])


# --- arrays and tables: copied into the cache, then read as local files ---------------------------

def test_array_dataset_from_s3_npy(s3_env, tmp_path):
    x = np.arange(600, dtype=np.float32).reshape(200, 3)
    y = np.arange(200, dtype=np.int64) % 7
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    upload(s3_env, "arrays", [str(tmp_path / "x.npy"), str(tmp_path / "y.npy")])
    remote = stoker.ArrayDataset("s3://arrays/x.npy", "s3://arrays/y.npy")
    local = stoker.ArrayDataset(str(tmp_path / "x.npy"), str(tmp_path / "y.npy"))
    same(epoch(remote, batch_size=16, shuffle=True)[1], epoch(local, batch_size=16, shuffle=True)[1])
    with pytest.raises(ValueError, match=r"exceed cache_budget=100 "):
        stoker.ArrayDataset("s3://arrays/x.npy", cache_budget=100)


def test_table_dataset_from_s3_parquet(s3_env, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    paths = []
    for f in range(3):
        t = pa.table({"x": np.arange(f * 100, f * 100 + 100, dtype=np.int64),
                      "y": np.full(100, f, dtype=np.float32)})
        paths.append(str(tmp_path / f"part-{f}.parquet"))
        pq.write_table(t, paths[-1], row_group_size=25)
    upload(s3_env, "tables", paths)
    remote = stoker.TableDataset("s3://tables/part-*.parquet")
    local = stoker.TableDataset(paths)
    assert remote.urls == [f"s3://tables/part-{f}.parquet" for f in range(3)]
    got = [b for b in stoker.DataLoader(remote, batch_size=32, shuffle=True, num_workers=1)]
    want = [b for b in stoker.DataLoader(local, batch_size=32, shuffle=True, num_workers=1)]
    for g, w in zip(got, want):
        for key in w:
            np.testing.assert_array_equal(np.asarray(g[key]), np.asarray(w[key]))


class _Double:
    def __call__(self, x):
        return x * 2


def test_a_python_transform_runs_in_clean_worker_processes(s3_env, shards):
    """A remote dataset with a Python transform: its worker processes start by forkserver (the
    fetcher threads and the client's runtime do not survive a fork) and read the node's cache."""
    import torch
    import torchvision.transforms.v2 as v2
    upload(s3_env, "python", shards[:2])
    transform = v2.Compose([v2.CenterCrop(16), v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                            _Double()])
    with pytest.warns(UserWarning, match="run in Python"):
        ds = stoker.TarShards("s3://python/*.tar", transform=transform)
    labels = [int(v) for _, y in stoker.DataLoader(ds, batch_size=4, num_workers=2) for v in y]
    assert labels == stoker.TarShards(shards[:2]).labels


def test_text_dataset_from_s3_equals_the_local_files(s3_env, tmp_path):
    """TextDataset over s3:// JSONL (.gz too) and Parquet: the files are fetched into the cache,
    tokenized, and give the local files' documents, their rows named by URL."""
    pytest.importorskip("stoker._text", reason="this build has no text module")
    import gzip
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.train_from_iterator(["remote rows of text"] * 10, trainer=trainers.BpeTrainer(
        vocab_size=280, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = stoker.Tokenizer.from_hf(hf)
    rows = [{"text": f"row {i} of text " * (i % 5 + 1)} for i in range(40)]
    plain = tmp_path / "a.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows[:7]) + "{broken\n")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet", row_group_size=16)
    local = [str(plain), str(tmp_path / "b.jsonl.gz"), str(tmp_path / "c.parquet")]
    urls = upload(s3_env, "text", local)
    got = stoker.TextDataset(urls[0::2], tok)
    want = stoker.TextDataset(local[0::2], tok)
    assert got.paths == urls[0::2]
    assert [got.document(d).tolist() for d in range(got.num_documents)] == \
        [want.document(d).tolist() for d in range(want.num_documents)]
    assert got._corpus.path(41) == urls[2] + ": row 1"
    with pytest.raises(stoker.SampleError, match=r"s3://text/b\.jsonl\.gz:8"):
        stoker.TextDataset(urls[1], tok)


def test_vlm_rows_from_s3_equal_the_local_files(s3_env, tmp_path):
    """VLMDataset over s3:// rows: a Parquet file holding its images' bytes, and LLaVA JSON
    whose images are in a local folder, a remote folder or remote tar shards; the samples equal
    the local files', bad rows and missing remote images named by URL."""
    pytest.importorskip("stoker._text")
    pytest.importorskip("transformers")
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image as PILImage
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.train_from_iterator(["what is in the picture a cat"] * 10, trainer=trainers.BpeTrainer(
        vocab_size=280, show_progress=False, special_tokens=["<image>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    (tmp_path / "model").mkdir()
    hf.save(str(tmp_path / "model" / "tokenizer.json"))
    (tmp_path / "model" / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['role'] }}: {% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}\n"
        "{% endfor %}")
    (tmp_path / "model" / "processor_config.json").write_text(json.dumps({
        "patch_size": 8, "image_processor": {
            "image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 16},
            "crop_size": {"height": 16, "width": 16}, "resample": 3}}))
    (tmp_path / "imgs").mkdir()
    rows, table = [], []
    for i in range(6):
        buf = io.BytesIO()
        PILImage.fromarray(np.full((20 + i, 24, 3), 40 * i, np.uint8)).save(buf, "PNG")
        (tmp_path / "imgs" / f"{i}.png").write_bytes(buf.getvalue())
        turns = [{"from": "human", "value": f"<image> what is in the picture {i}"},
                 {"from": "gpt", "value": "a cat " * (i + 1)}]
        rows.append({"image": f"{i}.png", "conversations": turns})
        table.append({"conversations": turns, "images": [buf.getvalue()]})
    (tmp_path / "rows.json").write_text(json.dumps(rows + [{"image": "x.png"}]))
    pq.write_table(pa.Table.from_pylist(table), tmp_path / "rows.parquet")
    local = [str(tmp_path / "rows.json"), str(tmp_path / "rows.parquet")]
    urls = upload(s3_env, "vlm", local)
    model = str(tmp_path / "model")
    want = stoker.VLMDataset(local[1], model)
    for got in (stoker.VLMDataset(urls[1], model),
                stoker.VLMDataset(urls[0], model, images=tmp_path / "imgs", on_error="skip")):
        assert len(got) == len(want) == 6
        for i in range(6):
            for k, v in want[i].items():
                np.testing.assert_array_equal(v, got[i][k])
    with pytest.raises(stoker.SampleError, match=r"s3://vlm/rows\.json: row 6"):
        stoker.VLMDataset(urls[0], model, images=tmp_path / "imgs")

    # Remote images: a folder (the images the rows name, fetched) and tar shards (whole).
    s3_env.put("vlm", {f"imgs/{i}.png": (tmp_path / "imgs" / f"{i}.png").read_bytes()
                       for i in range(6)})
    for k, names in enumerate(([0, 2, 4], [1, 3, 5])):
        with tarfile.open(tmp_path / f"shard{k}.tar", "w") as tar:
            for i in names:
                tar.add(tmp_path / "imgs" / f"{i}.png", arcname=f"{i}.png")
    shards = upload(s3_env, "vlm", [str(tmp_path / "shard0.tar"), str(tmp_path / "shard1.tar")],
                    index=False)
    for images in ("s3://vlm/imgs/", shards):
        for cache in (None, tmp_path / f"cache{len(str(images))}"):
            for _ in range(1 if cache is None else 2):  # built, then the kept index opened
                got = stoker.VLMDataset(urls[0], model, images=images, on_error="skip",
                                        cache_dir=cache)
                assert len(got) == 6
                for i in range(6):
                    for k, v in want[i].items():
                        np.testing.assert_array_equal(v, got[i][k])
    gone = rows[:2] + [{"image": "gone.png", "conversations": rows[0]["conversations"]}]
    (tmp_path / "gone.json").write_text(json.dumps(gone))
    with pytest.raises(stoker.SampleError, match=r"row 2\): cannot stat s3://vlm/imgs/gone\.png"):
        stoker.VLMDataset(str(tmp_path / "gone.json"), model, images="s3://vlm/imgs")
    with pytest.raises(stoker.SampleError, match=r"in none of the tar shards"):
        stoker.VLMDataset(str(tmp_path / "gone.json"), model, images=shards)


def test_tar_shards_with_fields_from_s3_equal_local(s3_env, tmp_path):
    """TarShards(fields=...) over S3: its keys from `stoker index`'s sidecars (or indexed once
    where a shard has none), batches equal to the same shards read locally."""
    pytest.importorskip("stoker._text")
    import io
    import tarfile
    from PIL import Image as PILImage
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from stoker.cli import main
    from stoker.image_text import Image, Json, Text
    rng = np.random.default_rng(9)
    local = []
    for s in range(3):
        path = tmp_path / f"pairs-{s}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(3):
                buf = io.BytesIO()
                h, w = [(24, 24), (24, 40), (40, 24)][i]
                PILImage.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(
                    buf, "JPEG")
                members = {"jpg": buf.getvalue(), "txt": f"a dog number {s * 3 + i}".encode(),
                           "json": json.dumps({"similarity": s * 3 + i}).encode()}
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{s}{i:03d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        local.append(str(path))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["a dog number 12345"] * 5, trainer=trainers.BpeTrainer(
        vocab_size=280, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fields = {"pixel_values": Image(TRANSFORM), "input_ids": Text(tok, max_length=6, pad_id=0),
              "similarity": Json("similarity")}
    assert main(["index", str(tmp_path / "*.tar")]) == 0
    assert json.load(open(local[0] + INDEX_SUFFIX))["keys"][0][0] == "0000"
    upload(s3_env, "pairs", local[:2] + [p + INDEX_SUFFIX for p in local[:2]], index=False)
    upload(s3_env, "pairs", local[2:], index=False)  # no sidecar: indexed once, with a warning
    with pytest.warns(RemoteIndexWarning, match="1 of 3"):
        ds = stoker.TarShards("s3://pairs/*.tar", fields=fields)
    assert isinstance(ds, stoker.TarShards) and len(ds) == 9
    assert ds.default_shuffle == "shards"
    want = stoker.TarShards(local, fields=fields)
    for shuffle in (False, "shards"):
        kw = {"batch_size": 4, "num_workers": 2, "output": "numpy", "shuffle": shuffle, "seed": 2}
        got = list(stoker.DataLoader(ds, **kw))
        expected = list(stoker.DataLoader(want, **kw))
        assert len(got) == len(expected) == 3
        for a, b in zip(got, expected):
            assert a.keys() == b.keys()
            for k in a:
                np.testing.assert_array_equal(a[k], b[k])
    assert ds.path(0) == "s3://pairs/pairs-0.tar:0000"
    # Aspect-ratio buckets plan by the images' sizes from the sidecars' facts, fetching nothing.
    from stoker.image_text import AspectBuckets
    bucketed = {"pixel_values": Image(buckets=AspectBuckets(sizes=[(16, 16), (16, 32), (32, 16)])),
                "similarity": Json("similarity")}
    ds = stoker.TarShards("s3://pairs/*.tar", fields=bucketed)  # the third's index: cached
    want = stoker.TarShards(local, fields=bucketed)
    assert ds._buckets().tolist() == want._buckets().tolist() == [0, 1, 2] * 3
    kw = {"batch_size": 2, "num_workers": 2, "output": "numpy", "shuffle": True, "seed": 2}
    for a, b in zip(stoker.DataLoader(ds, **kw), stoker.DataLoader(want, **kw), strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
