"""stoker.remote against local servers only (remote_servers.py): moto's S3, a directory over
HTTP that also plays the Hugging Face Hub, and a fault-injecting proxy in front of either. Small
timeouts and backoffs keep each test under about 2 s."""

import multiprocessing
import os
import re
import sys
import threading
import time

import pytest
from conftest import wait_until

pytest.importorskip("obstore")

from stoker.remote import (  # noqa: E402
    ObjectInfo,
    RemoteAuthError,
    RemoteError,
    RemoteNotFound,
    Store,
    cache_usage,
    evict,
    expand,
    fetch_to_cache,
    is_url,
    local_path,
)

# Fast failure: a few retries, millisecond backoff, short timeouts.
FAST = {"max_retries": 3, "backoff_initial": 0.005, "backoff_max": 0.02, "timeout": 2,
        "connect_timeout": 1, "retry_timeout": 2}


def payload(n, seed=0):
    """`n` bytes that differ at every offset modulo 251 (a misplaced part shows)."""
    return bytes((i * 7 + seed) % 251 for i in range(n))


@pytest.fixture
def aws(monkeypatch, s3_server):
    """Points the AWS_* environment at the local S3 server (or a proxy of it: aws(proxy.url))
    and away from any real AWS configuration of this machine."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")

    def point(endpoint=None):
        for name, value in s3_server.env(endpoint).items():
            monkeypatch.setenv(name, value)

    point()
    return point


@pytest.fixture
def hub(monkeypatch, http_server):
    """The fake Hub with dataset org/ds (main: data/train-0..4.bin, data/val/v.bin, README.md)."""
    repo = os.path.join(http_server.root, "datasets", "org", "ds")
    os.makedirs(os.path.join(repo, "data", "val"))
    for i in range(5):
        with open(os.path.join(repo, "data", f"train-{i}.bin"), "wb") as f:
            f.write(payload(1000 + i, seed=i))
    for name in ("data/val/v.bin", "README.md"):
        with open(os.path.join(repo, name), "wb") as f:
            f.write(b"x" * 10)
    monkeypatch.setenv("HF_ENDPOINT", http_server.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    return http_server


def test_errors_are_typed_and_also_in_stoker_errors():
    import stoker.errors

    assert stoker.errors.RemoteError is RemoteError
    assert issubclass(RemoteAuthError, RemoteError) and issubclass(RemoteError, OSError)
    assert issubclass(RemoteNotFound, FileNotFoundError)


def test_without_obstore_names_the_extra_and_expansion_still_works(monkeypatch):
    monkeypatch.setitem(sys.modules, "obstore", None)
    assert expand("x-{1..2}") == ["x-1", "x-2"]
    with pytest.raises(ImportError, match=re.escape("pip install 'stoker[remote]'")):
        Store.for_url("s3://any-bucket/x", {"timeout": 1.5})


# --- names and expansion ------------------------------------------------------------------------

def test_is_url_and_local_path():
    for url in ("s3://b/k", "gs://b/k", "az://c/k", "http://h/p", "HTTPS://h/p",
                "hf://datasets/o/n/p"):
        assert is_url(url)
    for path in ("file:///data/x.tar", "/data/x.tar", "data/x.tar", "ftp://h/x"):
        assert not is_url(path)
    assert local_path("file:///data/x.tar") == "/data/x.tar"
    assert local_path("/data/x.tar") == "/data/x.tar"


def test_braces_expand_ranges_with_padding_lists_and_several_braces_in_order():
    assert expand("s3://b/train-{000008..000011}.tar") == [
        f"s3://b/train-{i:06d}.tar" for i in range(8, 12)]
    assert expand(["d/{b,a}-{1..2}", "first{x}"]) == ["d/b-1", "d/b-2", "d/a-1", "d/a-2",
                                                     "first{x}"]
    assert expand("{3..1}") == ["3", "2", "1"]
    with pytest.raises(ValueError, match="expands to more than"):
        expand("x{0..99999999999}")


def test_local_glob_sorted_within_a_pattern_inputs_in_order(tmp_path):
    for name in ("b.tar", "a.tar", "c.idx", "sub/d.tar"):
        os.makedirs(tmp_path / os.path.dirname(name), exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    got = expand([f"file://{tmp_path}/c.idx", f"{tmp_path}/*.tar"])
    assert got == [f"{tmp_path}/c.idx", f"{tmp_path}/a.tar", f"{tmp_path}/b.tar"]
    with pytest.raises(FileNotFoundError, match=r"\*\.zip"):
        expand(f"{tmp_path}/*.zip")


def test_s3_glob_lists_the_prefix_and_matches_within_one_segment(aws, s3_server):
    s3_server.put("globbed", {f"data/train-{i:03d}.tar": b"t" for i in (2, 0, 1)}
                  | {"data/train-notes.txt": b"n", "data/deeper/train-009.tar": b"d"})
    assert expand("s3://globbed/data/train-*.tar") == [
        f"s3://globbed/data/train-{i:03d}.tar" for i in range(3)]
    assert expand(["s3://globbed/data/train-00[12].tar", "s3://globbed/data/*/train-*"]) == [
        "s3://globbed/data/train-001.tar", "s3://globbed/data/train-002.tar",
        "s3://globbed/data/deeper/train-009.tar"]
    assert Store.for_url("s3://globbed/x").list("s3://globbed/data/train-0") == [
        f"s3://globbed/data/train-{i:03d}.tar" for i in range(3)]
    with pytest.raises(FileNotFoundError, match="val-"):
        expand("s3://globbed/data/val-{0..1}*.tar")


def test_http_has_no_listing_so_its_globs_are_refused():
    with pytest.raises(ValueError, match="no listing"):
        expand("http://127.0.0.1:9/shards/train-*.tar")


def test_hf_glob_goes_through_the_hub_tree_api_page_by_page(hub):
    hub.hub_page_size = 2  # the listing takes several pages (Link: rel="next")
    got = expand("hf://datasets/org/ds@v1.0/data/train-*.bin")
    assert got == [f"hf://datasets/org/ds@v1.0/data/train-{i}.bin" for i in range(5)]
    tree = [p for p in hub.paths if p.startswith("/api/")]
    assert len(tree) > 2 and all("/tree/v1.0/data" in p for p in tree)
    assert expand("hf://datasets/org/ds/*.md") == ["hf://datasets/org/ds/README.md"]
    with pytest.raises(ValueError, match="commit hash"):  # no request can carry refs%2Fpr%2F1
        expand("hf://datasets/org/ds@refs/pr/1/data/*.bin")


# --- head, read, list ---------------------------------------------------------------------------

def test_s3_head_read_list_and_stats(aws, s3_server):
    data = payload(5000)
    s3_server.put("objects", {"a/x.bin": data, "a/y.bin": b"yy", "b/z.bin": b"z"})
    store = Store.for_url("s3://objects/a/x.bin", FAST)
    assert Store.for_url("s3://objects/b/z.bin", FAST) is store  # one client per bucket
    assert Store.for_url("s3://objects/a/x.bin") is not store  # other options, other client
    info = store.head("s3://objects/a/x.bin")
    assert info.size == 5000 and info.etag
    assert bytes(store.read("s3://objects/a/x.bin", 100, 300)) == data[100:300]
    assert bytes(store.read("s3://objects/a/x.bin", 4000)) == data[4000:]
    assert bytes(store.read("s3://objects/a/x.bin")) == data
    assert store.list("s3://objects/a/") == ["s3://objects/a/x.bin", "s3://objects/a/y.bin"]
    stats = store.stats()
    assert stats["requests"] == 5 and stats["bytes"] == 200 + 1000 + 5000
    assert stats["errors"] == 0 and stats["retries"] == 0
    with pytest.raises(RemoteError, match="asked of an object of 5000 bytes"):
        store.read("s3://objects/a/x.bin", 4000, 6000)


def test_http_head_and_ranged_reads(http_server):
    data = payload(70000)
    with open(os.path.join(http_server.root, "s.bin"), "wb") as f:
        f.write(data)
    url = f"{http_server.url}/s.bin"
    store = Store.for_url(url, FAST)
    assert store.head(url) == ObjectInfo(70000, store.head(url).etag)
    assert bytes(store.read(url, 65536, 70000)) == data[65536:]
    assert bytes(store.read(url, 5, 6)) == data[5:6]
    assert bytes(store.read(url, 10, 10)) == b""
    with pytest.raises(RemoteNotFound, match="nothing-here") as e:
        store.head(f"{http_server.url}/nothing-here.bin")
    assert isinstance(e.value, FileNotFoundError)
    assert e.value.url == f"{http_server.url}/nothing-here.bin"


def test_hf_reads_resolve_urls_with_the_token_and_a_wrong_token_is_an_auth_error(
        hub, monkeypatch):
    hub.hf_token = "hf_right"
    monkeypatch.setenv("HF_TOKEN", "hf_right")
    url = "hf://datasets/org/ds@v1.0/data/train-3.bin"
    store = Store.for_url(url, FAST)
    assert store.head(url).size == 1003
    assert bytes(store.read(url, 1, 11)) == payload(1003, seed=3)[1:11]
    assert any(p.startswith("/datasets/org/ds/resolve/v1.0/data/train-3.bin")
               for p in hub.paths)
    assert store.list("hf://datasets/org/ds@v1.0/data/val") == [
        "hf://datasets/org/ds@v1.0/data/val/v.bin"]

    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    wrong = Store.for_url(url, FAST)
    assert wrong is not store  # the environment is part of the client's identity
    with pytest.raises(RemoteAuthError) as e:
        wrong.head(url)
    assert url in str(e.value) and "credentials" in str(e.value) and "HF_TOKEN" in str(e.value)
    assert "hf_wrong" not in str(e.value)
    with pytest.raises(RemoteAuthError):
        wrong.list("hf://datasets/org/ds/data/")
    with pytest.raises(RemoteNotFound):
        store.list("hf://datasets/org/ds/no-such-dir/x")


def test_wrong_s3_credentials_are_an_auth_error_naming_the_url(aws, s3_server, monkeypatch):
    s3_server.put("private", {"k.bin": b"k"})
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-at-all")
    url = "s3://private/k.bin"
    with pytest.raises(RemoteAuthError) as e:
        Store.for_url(url, FAST).head(url)
    message = str(e.value)
    assert url in message and "credentials" in message
    assert "AWS_SECRET_ACCESS_KEY" in message and "not-the-secret-at-all" not in message
    with pytest.raises(RemoteNotFound, match="s3://private/missing.bin"):
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
        Store.for_url(url, FAST).head("s3://private/missing.bin")


def test_aws_profile_from_the_shared_files(aws, s3_server, monkeypatch, tmp_path):
    s3_server.put("profiled", {"p.bin": b"pp"})
    (tmp_path / "credentials").write_text(
        f"[default]\naws_access_key_id = AKIAWRONG\naws_secret_access_key = wrong\n\n"
        f"[test]\naws_access_key_id = {s3_server.access_key}\n"
        f"aws_secret_access_key = {s3_server.secret_key}\n")
    (tmp_path / "config").write_text(f"[profile test]\nregion = us-east-1\n"
                                     f"endpoint_url = {s3_server.url}\n")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "test")
    assert bytes(Store.for_url("s3://profiled/p.bin").read("s3://profiled/p.bin")) == b"pp"
    monkeypatch.setenv("AWS_PROFILE", "absent")
    with pytest.raises(ValueError, match="'absent'"):
        Store.for_url("s3://profiled/p.bin")


def test_unknown_storage_options_are_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"bogus.*valid: .*backoff_initial.*timeout"):
        Store.for_url("http://127.0.0.1:9/x", {"bogus": 1})
    with pytest.raises(ValueError, match=r"bogus.*valid: .*endpoint.*secret_access_key"):
        Store.for_url("s3://some-bucket/x", {"bogus": 1, "skip_signature": True})


def test_gcs_and_azure_clients_are_configured_from_the_environment(monkeypatch):
    """No request is sent: these only build clients (no GCS or Azure server runs here)."""
    for name in list(os.environ):
        if name.startswith(("AZURE_", "GOOGLE_")):
            monkeypatch.delenv(name)
    assert Store.for_url("gs://some-bucket/x").stats()["requests"] == 0
    with pytest.raises(RemoteAuthError, match=r"az://box/x: a credentials problem.*"
                                              r"AZURE_STORAGE_CONNECTION_STRING"):
        Store.for_url("az://box/x")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
                       "AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:9/devstoreaccount1;")
    store = Store.for_url("az://box/x")
    assert "devstoreaccount1" in repr(store._client)
    with pytest.raises(ValueError, match=r"unknown storage_options for az://: bogus; valid: "):
        Store.for_url("az://box/x", {"bogus": 1})


# --- the cache ----------------------------------------------------------------------------------

def test_fetch_to_cache_downloads_in_parts_then_hits(aws, s3_server, tmp_path):
    data = payload(300_000)
    s3_server.put("cached", {"shards/train-0.tar": data, "empty.tar": b""})
    url = "s3://cached/shards/train-0.tar"
    store = Store.for_url(url, FAST)
    info = store.head(url)
    first = fetch_to_cache(url, info, str(tmp_path), part_size=64 << 10, concurrency=3)
    assert not first.hit and first.bytes == 300_000 and first.requests == 5
    assert first.path.endswith(".tar") and open(first.path, "rb").read() == data
    second = fetch_to_cache(url, info, str(tmp_path))
    assert second.hit and second.path == first.path and second.bytes == 0
    s3_server.put("cached", {"shards/train-0.tar": payload(300_000, seed=1)})  # replaced
    with pytest.raises(RemoteError, match="changed while being read"):
        fetch_to_cache(url, ObjectInfo(info.size, '"before"'), str(tmp_path))
    changed = fetch_to_cache(url, store.head(url), str(tmp_path))
    assert not changed.hit and changed.path != first.path  # another etag, another file
    assert open(changed.path, "rb").read() == payload(300_000, seed=1)
    assert cache_usage(str(tmp_path)) == 600_000
    evict(str(tmp_path), first.path)
    evict(str(tmp_path), first.path)  # already gone: fine
    assert cache_usage(str(tmp_path)) == 300_000
    assert sorted(n.rpartition(".")[2] for n in os.listdir(tmp_path)) == [
        "lock", "lock", "lock", "tar"]
    empty = fetch_to_cache("s3://cached/empty.tar", store.head("s3://cached/empty.tar"),
                           str(tmp_path))
    assert os.path.getsize(empty.path) == 0 and empty.requests == 0


def _fetch_in_child(url, info, cache_dir, environ, results):
    os.environ.update(environ)
    from stoker.remote import fetch_to_cache

    results.put(fetch_to_cache(url, info, cache_dir, part_size=64 << 10, concurrency=2,
                               store=Store.for_url(url, FAST)).hit)


def test_two_processes_racing_for_one_object_download_it_once(
        aws, s3_server, fault_proxy, tmp_path):
    data = payload(512 << 10)
    s3_server.put("raced", {"big.tar": data})
    proxy = fault_proxy(s3_server.url)
    aws(proxy.url)
    url = "s3://raced/big.tar"
    store = Store.for_url(url, FAST)
    info = store.head(url)
    proxy.requests = 0
    proxy.bandwidth = 1 << 20  # ~0.5 s of download, long enough to arrive in the middle of it
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_fetch_in_child, args=(
        url, info, str(tmp_path), {k: v for k, v in os.environ.items() if k.startswith("AWS_")},
        results))
    seen_partial, done = [], threading.Event()

    def watch():  # nothing under a final name is ever shorter than the object
        while not done.is_set():
            for name in os.listdir(tmp_path):
                if name.endswith(".tar"):
                    try:
                        size = os.path.getsize(tmp_path / name)
                    except FileNotFoundError:
                        continue
                    if size != info.size:
                        seen_partial.append((name, size))
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        child.start()
        # The child downloads; we come in while its part file grows and wait on its lock.
        assert wait_until(lambda: any(".part." in n for n in os.listdir(tmp_path)), timeout=60)
        ours = fetch_to_cache(url, info, str(tmp_path), part_size=64 << 10, concurrency=2,
                              store=store)
        child_hit = results.get(timeout=60)
        child.join(60)
    finally:
        done.set()
        watcher.join()
    assert child.exitcode == 0
    assert not child_hit and ours.hit and ours.requests == 0
    assert proxy.requests == 8  # 512 KiB in 64 KiB parts, once
    assert open(ours.path, "rb").read() == data
    assert not seen_partial
    assert not [n for n in os.listdir(tmp_path) if ".part." in n]


# --- faults through the proxy -------------------------------------------------------------------

def test_429s_then_success_are_retried(aws, s3_server, fault_proxy):
    s3_server.put("throttled", {"t.bin": payload(1000)})
    proxy = fault_proxy(s3_server.url)
    aws(proxy.url)
    url = "s3://throttled/t.bin"
    store = Store.for_url(url, FAST)
    proxy.fail_status, proxy.fail_next, proxy.retry_after = 429, 3, 0
    began = time.monotonic()
    assert bytes(store.read(url, 0, 1000)) == payload(1000)
    assert time.monotonic() - began < 2
    assert proxy.requests == 4 and proxy.faults == 3  # obstore retried three times
    assert store.stats()["requests"] == 1 and store.stats()["errors"] == 0


def test_resets_and_truncated_bodies_are_retried_to_the_right_bytes(
        http_server, fault_proxy, tmp_path):
    data = payload(400_000, seed=5)
    with open(os.path.join(http_server.root, "f.tar"), "wb") as f:
        f.write(data)
    proxy = fault_proxy(http_server.url)
    url = f"{proxy.url}/f.tar"
    store = Store.for_url(url, FAST)
    info = store.head(url)
    proxy.reset_next, proxy.reset_after = 2, 10_000
    proxy.truncate_next, proxy.truncate_after = 2, 50_000
    got = fetch_to_cache(url, info, str(tmp_path), store=store, part_size=100_000)
    assert open(got.path, "rb").read() == data
    assert proxy.faults == 4 and proxy.reset_next == 0 and proxy.truncate_next == 0


def test_a_body_shorter_than_its_range_is_asked_again_and_counted(http_server, fault_proxy):
    data = payload(50_000)
    with open(os.path.join(http_server.root, "s.bin"), "wb") as f:
        f.write(data)
    proxy = fault_proxy(http_server.url)
    url = f"{proxy.url}/s.bin"
    store = Store.for_url(url, FAST)
    proxy.short_next, proxy.short_by = 2, 100  # complete by HTTP's rules, short of the range
    assert bytes(store.read(url, 0, 50_000)) == data
    assert store.stats()["retries"] == 2 and store.stats()["requests"] == 3
    proxy.short_next = 100
    with pytest.raises(RemoteError, match=r"s\.bin: bytes \[0, 50000\) came back 49900 bytes"):
        store.read(url, 0, 50_000)
    assert store.stats()["errors"] == 1 and store.stats()["requests"] == 3 + FAST["max_retries"] + 1


def test_a_permanently_failing_url_raises_within_the_retry_limits(
        http_server, fault_proxy, tmp_path):
    for name in ("good.bin", "bad.bin"):
        with open(os.path.join(http_server.root, name), "wb") as f:
            f.write(payload(200_000))
    proxy = fault_proxy(http_server.url)
    store = Store.for_url(f"{proxy.url}/good.bin", FAST)
    info = store.head(f"{proxy.url}/good.bin")
    proxy.fail_pattern, proxy.fail_pattern_status = r"/bad\.bin$", 503
    url = f"{proxy.url}/bad.bin"
    began = time.monotonic()
    with pytest.raises(RemoteError, match="bad.bin") as e:
        fetch_to_cache(url, info, str(tmp_path), store=store, part_size=50_000, concurrency=2)
    assert time.monotonic() - began < 2
    assert e.value.url == url and e.value.__cause__ is not None
    assert proxy.paths.count("/bad.bin") <= 4 * (FAST["max_retries"] + 1)
    assert all(n.endswith(".lock") for n in os.listdir(tmp_path))  # no part file left
    assert store.stats()["errors"] >= 1


def test_a_slow_capped_link_still_delivers_the_right_bytes(http_server, fault_proxy, tmp_path):
    data = payload(600_000, seed=9)
    with open(os.path.join(http_server.root, "slow.tar"), "wb") as f:
        f.write(data)
    proxy = fault_proxy(http_server.url)
    url = f"{proxy.url}/slow.tar"
    store = Store.for_url(url, FAST)
    info = store.head(url)
    proxy.latency, proxy.bandwidth = 0.02, 1 << 20
    began = time.monotonic()
    got = fetch_to_cache(url, info, str(tmp_path), store=store, part_size=128 << 10,
                         concurrency=4)
    took = time.monotonic() - began
    assert open(got.path, "rb").read() == data and got.requests == 5
    assert took >= 0.9 * 600_000 / (1 << 20)  # the cap held across the 4 connections
    assert proxy.bytes_served == 600_000
