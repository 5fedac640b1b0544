"""Object storage input: Stoker against WebDataset, Mosaic Streaming and LitData, side by side,
every loader reading the same data from S3 over the same slow link, on the same cores.

Setup (one invocation, nothing beyond 127.0.0.1): moto's S3 server and the fault proxy run in this
process: ``S3Server`` and ``FaultProxy`` of tests/python/remote_servers.py, the servers Stoker's
remote tests use, imported from there (test infrastructure reused, not copied). The proxy is the
link: ``--latency`` seconds before each answer and ``--bandwidth`` bytes/s of response bodies shared
by all connections. Data is uploaded to moto directly; every loader reads through the proxy.

Why 24 MB/s by default: Pillow decodes these photos (plus Resize(64), CenterCrop(56)) at ~36 MB/s
of JPEG per core here, and moto and the proxy share the 2 cores with the loaders; at 24 MB/s every
loader's 2 workers have headroom, so the link, not the CPU, bounds the first epoch.

Workloads (each loader gets a fresh cache directory and a fresh process):
- images: tar shards of the sample photos (``<key>.jpg`` + ``<key>.cls``); decode, Resize(64),
  CenterCrop(56), ToTensor; batch 64; shuffled; num_workers=2 for everyone. Small outputs keep
  the CPU work light so that epoch 1 measures the network path.
- tokens: a flat uint16 corpus cut into shards; windows of seq_len 1024 (+1 target token);
  batch 16; shuffled; num_workers=2.

Loaders:
- stoker: ``TarShards("s3://.../train-{0000..NNNN}.tar")`` / ``TokenDataset("s3://...")`` with
  ``cache_dir``, ``cache_budget`` and ``storage_options``; ``DataLoader(shuffle=True)`` (for
  remote shards: the shard order). Tar shards carry their sidecar ``.idx.json`` (as ``stoker
  index`` writes).
- stoker-local: the same data on local disk (page-cached), ``shuffle="shards"``: the same order as
  the remote run, so its epoch 2 is the bar for the cached epoch.
- webdataset: ``wds.WebDataset(urls, cache_dir=, cache_size=budget, shardshuffle=)`` over the same
  tar shards as Stoker's, read by ``pipe:curl --aws-sigv4 ...`` through the proxy (one curl per
  shard; moto refuses presigned URLs, which WebDataset's ``http`` handler would take);
  ``.shuffle(1000).decode("pil")``, batched in the pipeline, torch DataLoader with
  batch_size=None. Tokens: tar shards whose members ``<key>.bin`` hold 8 windows of 1025 raw
  uint16 tokens each (a member per window would add ~50% tar padding and headers), split into
  windows in the pipeline. WebDataset has no resume: "n/a".
- mosaic: MDS written from the same samples (columns ``jpg: bytes``, ``cls: int``; tokens:
  ``ndarray:uint16:1025`` per window), shards of the tar shards' size, StreamingDataset with
  ``cache_limit=budget``, StreamingDataLoader; S3 through S3_ENDPOINT_URL. Its forked workers
  are given their own boto3 client (as spawned ones get): see _mosaic_own_client.
- litdata: ``litdata.optimize`` from the same samples (images: ``(jpeg bytes, label)``; tokens:
  TokensLoader, uint16 tokens, block 1025), chunks of the tar shards' size, StreamingDataset with
  ``max_cache_size=budget``, StreamingDataLoader; S3 through AWS_ENDPOINT_URL (boto3 for the
  index, obstore for chunks, told ``allow_http`` for the local endpoint).
Peers decode with Pillow and torchvision's transforms in their DataLoader workers; they run in
.venv-peers/remote (``bash bench/setup_peers.sh remote``); a peer that fails is reported, not fatal.

Reported per loader: epoch 1 (cold cache, loader construction included) samples/s and MB/s of
the link (bytes through the proxy / its time), epoch 2 (same loader, warm cache) samples/s and its
ratio to stoker-local's epoch 2, bytes downloaded again in epoch 2, requests per GB in epoch 1
(the proxy's counters, reset per run: every request, metadata included), the cache directory's
peak bytes (polled by this process) against the budget, and the time to resume mid-epoch: in a
new process on the same node (warm cache), from constructing the dataset and loader with the
state saved half-way through an epoch (each library's own ``state_dict``) to the first batch.
Every loader gets the same cache budget (Stoker's cache_budget, WebDataset's cache_size, Mosaic's
cache_limit, LitData's max_cache_size). Where a peer's own handling of that budget costs it its
cached epoch or its first one (Mosaic failing or stalling, LitData downloading again), that is
printed under the table and the peer is measured again without a limit: its row then shows that
run.

Targets: epoch 1 >= 0.8x the link; epoch 2 >= 0.9x stoker-local; Stoker ahead of every peer on
every figure.

Usage (from the repository root, with the .venv that has stoker, moto and obstore):
    python bench/bench_remote.py --quick                  # smoke run, tiny data
    python bench/bench_remote.py                          # full run (~5-10 min on 2 cores)
    python bench/bench_remote.py --workloads tokens --loaders stoker,mosaic --bandwidth 40e6
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import (PEERS, REPO, PeakPoll, cores, machine_line, peer_python,  # noqa: E402
                     samples_in, write_json)

TESTS = REPO / "tests" / "python"  # remote_servers.py: moto and the proxy

BUCKET = "bench"
SIZE = 64  # Resize(64), CenterCrop(56)
CROP = 56
IMAGE_BATCH = 64
SEQ_LEN = 1024
TOKEN_BATCH = 16
WORKERS = 2
WDS_WINDOWS_PER_MEMBER = 8
LOADERS = ("stoker-local", "stoker", "webdataset", "mosaic", "litdata")
LABELS = {"stoker-local": "stoker, local files", "stoker": "stoker", "webdataset": "WebDataset",
          "mosaic": "Mosaic Streaming", "litdata": "LitData"}


# ---- data, made once and kept ----------------------------------------------------------------

def sizes(quick):
    if quick:
        return {"classes": 4, "per_class": 40, "image_shards": 4, "token_shards": 4,
                "tokens_per_shard": 300_000}
    return {"classes": 10, "per_class": 200, "image_shards": 16, "token_shards": 8,
            "tokens_per_shard": 8_000_000}


def make_data(data, quick):
    """Local tar shards of the sample photos and a uint16 token corpus, under ``data``."""
    import numpy as np

    from stoker.sample_data import make_sample
    s = sizes(quick)
    make_sample(data / "sample", num_classes=s["classes"], images_per_class=s["per_class"],
                shards=s["image_shards"])
    tars = sorted(str(p) for p in (data / "sample" / "shards").glob("*.tar"))
    tok_dir = data / "tokens"
    tok_dir.mkdir(exist_ok=True)
    bins = []
    rng = np.random.default_rng(0)
    for i in range(s["token_shards"]):
        path = tok_dir / f"tok-{i:03d}.bin"
        if not path.exists():
            rng.integers(0, 50257, s["tokens_per_shard"], dtype=np.uint16).tofile(
                str(path) + ".tmp")
            os.replace(str(path) + ".tmp", path)
        bins.append(str(path))
    return tars, bins


def wds_token_shards(bins, out):
    """WebDataset tar shards of the token corpus: per source shard, members ``<key>.bin`` of
    WDS_WINDOWS_PER_MEMBER windows of SEQ_LEN + 1 tokens."""
    import numpy as np
    out.mkdir(exist_ok=True)
    paths = []
    w = SEQ_LEN + 1
    for b in bins:
        path = out / (Path(b).stem + ".tar")
        paths.append(str(path))
        if path.exists():
            continue
        tokens = np.fromfile(b, np.uint16)
        n = len(tokens) // w
        with tarfile.open(str(path) + ".tmp", "w") as tar:
            for k in range(0, n, WDS_WINDOWS_PER_MEMBER):
                data = tokens[k * w:min(n, k + WDS_WINDOWS_PER_MEMBER) * w].tobytes()
                info = tarfile.TarInfo(f"{Path(b).stem}-{k:08d}.bin")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        os.replace(str(path) + ".tmp", path)
    return paths


def prepare_peer_formats(data, tars, bins, python):
    """MDS and LitData copies of both workloads, written by the peers' own environment."""
    chunk = max(os.path.getsize(t) for t in tars)
    token_chunk = max(os.path.getsize(b) for b in bins)
    done = {}
    for fmt in ("mosaic", "litdata"):
        for workload, src, size in (("images", tars, chunk), ("tokens", bins, token_chunk)):
            out = data / f"{fmt}-{workload}"
            if not (out / ".ok").exists():
                spec = {"format": fmt, "workload": workload, "src": src, "out": str(out),
                        "chunk_bytes": size}
                r = subprocess.run([python, __file__, "--child",
                                    json.dumps(spec | {"phase": "prepare"})],
                                   capture_output=True, text=True, timeout=1800)
                if r.returncode != 0:
                    log = data / "logs" / f"prepare-{fmt}-{workload}.log"
                    log.parent.mkdir(exist_ok=True)
                    log.write_text(r.stderr)
                    done[(fmt, workload)] = f"preparing failed: {_error_line(r.stderr)} ({log})"
                    continue
                (out / ".ok").touch()
            done[(fmt, workload)] = str(out)
    return done


def _error_line(text):
    """The exception line of a traceback in ``text`` (else its last line)."""
    lines = [x for x in text.strip().splitlines() if x.strip()]
    for line in reversed(lines):
        if not line.startswith((" ", "\t")) and ("Error" in line or "Exception" in line):
            return line[:200]
    return lines[-1][:200] if lines else "(no output)"


def _last_line(text):
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1][:200] if lines else "(no output)"


def prepare(spec):
    """In the peers' environment: writes MDS or LitData from the local tars or token files."""
    fmt, workload, out = spec["format"], spec["workload"], spec["out"]
    if fmt == "mosaic":
        import_peer_libraries()
        from streaming import MDSWriter
        columns = ({"jpg": "bytes", "cls": "int"} if workload == "images"
                   else {"tokens": f"ndarray:uint16:{SEQ_LEN + 1}"})
        with MDSWriter(out=out, columns=columns, size_limit=spec["chunk_bytes"]) as w:
            if workload == "images":
                for key, jpg, cls in tar_samples(spec["src"]):
                    w.write({"jpg": jpg, "cls": cls})
            else:
                for window in token_windows(spec["src"]):
                    w.write({"tokens": window})
        return 0
    import_peer_libraries()
    import litdata as ld
    if workload == "images":
        ld.optimize(fn=_litdata_images, inputs=list(spec["src"]), output_dir=out,
                    chunk_bytes=spec["chunk_bytes"], num_workers=1, mode="overwrite")
    else:
        from litdata.streaming.item_loader import TokensLoader
        ld.optimize(fn=_litdata_tokens, inputs=list(spec["src"]), output_dir=out,
                    chunk_size=(SEQ_LEN + 1) * (spec["chunk_bytes"] // 2 // (SEQ_LEN + 1)),
                    item_loader=TokensLoader(), num_workers=1, mode="overwrite")
    return 0


def tar_samples(tars):
    """(key, jpeg bytes, label) of every sample of the tar shards, in order."""
    for path in tars:
        with tarfile.open(path) as tar:
            pending = {}
            for m in tar:
                key, _, ext = m.name.rpartition(".")
                pending.setdefault(key, {})[ext] = tar.extractfile(m).read()
                if {"jpg", "cls"} <= pending[key].keys():
                    s = pending.pop(key)
                    yield key, s["jpg"], int(s["cls"])


def token_windows(bins):
    import numpy as np
    w = SEQ_LEN + 1
    for b in bins:
        tokens = np.fromfile(b, np.uint16)
        for k in range(len(tokens) // w):
            yield tokens[k * w:(k + 1) * w]


def _litdata_images(path):
    for _, jpg, cls in tar_samples([path]):
        yield jpg, cls


def _litdata_tokens(path):
    import numpy as np
    import torch
    yield torch.from_numpy(np.fromfile(path, np.uint16))


def upload(s3, prefix, files, root=None):
    """Uploads files (or every file under ``root``) to s3://BUCKET/prefix/, one at a time."""
    for f in files:
        name = os.path.relpath(f, root) if root else os.path.basename(f)
        with open(f, "rb") as fh:
            s3.put(BUCKET, {f"{prefix}/{name}": fh.read()})


def upload_all(s3, tars, bins, wds_tokens, peer_dirs):
    from stoker.cli import main as stoker_cli
    upload(s3, "images", tars)
    upload(s3, "tokens", bins)
    # As a user would: `stoker index` over the uploaded shards writes each one's sidecar and the
    # directory's manifest (sizes, ETags, indexes: one request at construction), straight from
    # the server (not through the proxy).
    saved = dict(os.environ)
    os.environ.update(s3.env())
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            for pattern in (f"s3://{BUCKET}/images/*.tar", f"s3://{BUCKET}/tokens/*.bin"):
                if stoker_cli(["index", pattern]) != 0:
                    raise RuntimeError(f"stoker index {pattern} failed")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    upload(s3, "wds-tokens", wds_tokens)
    for (fmt, workload), d in peer_dirs.items():
        if os.path.isdir(d):
            files = [os.path.join(dp, f) for dp, _, fs in os.walk(d) for f in fs if f != ".ok"]
            upload(s3, f"{fmt}-{workload}", files, root=d)


# ---- the loaders, in measurement children ----------------------------------------------------

_TORCHVISION_FIRST = False


def import_peer_libraries():
    """torchvision's import shim (see bench_images.import_torchvision) before Mosaic and LitData,
    which import torchvision themselves."""
    global _TORCHVISION_FIRST
    if not _TORCHVISION_FIRST:
        from bench_images import import_torchvision
        import_torchvision()
        _TORCHVISION_FIRST = True


def peer_transform():
    import_peer_libraries()
    from torchvision import transforms as T
    return T.Compose([T.Resize(SIZE), T.CenterCrop(CROP), T.ToTensor()])


def pil_image(data):
    from PIL import Image
    return Image.open(io.BytesIO(data)).convert("RGB")


def stack_windows(rows):
    import torch
    return torch.stack([torch.as_tensor(r) for r in rows])


def _stoker_loader(spec):
    import torch  # noqa: F401  (stoker's tensors need it)

    import stoker
    from stoker import transforms as T
    remote = spec["loader"] == "stoker"
    kw = dict(cache_dir=spec["cache_dir"], cache_budget=spec["budget"],
              storage_options=spec["storage_options"]) if remote else {}
    if spec["workload"] == "images":
        transform = T.Compose([T.Resize(SIZE), T.CenterCrop(CROP), T.ToTensor()])
        ds = stoker.TarShards(spec["url"] if remote else spec["local"], transform=transform, **kw)
        batch = IMAGE_BATCH
    else:
        ds = stoker.TokenDataset(spec["url"] if remote else spec["local"], seq_len=SEQ_LEN, **kw)
        batch = TOKEN_BATCH
    loader = stoker.DataLoader(ds, batch_size=batch, shuffle=True if remote else "shards",
                               seed=0, num_workers=WORKERS)
    return ds, loader


def _wds_loader(spec):
    import numpy as np
    import torch
    import_peer_libraries()
    import webdataset as wds
    torch.set_num_threads(1)
    urls = spec["urls"]
    ds = wds.WebDataset(urls, cache_dir=spec["cache_dir"], cache_size=spec["budget"],
                        shardshuffle=len(urls), nodesplitter=None, seed=0)
    if spec["workload"] == "images":
        transform = peer_transform()
        ds = (ds.shuffle(1000).decode("pil").to_tuple("jpg", "cls")
              .map_tuple(transform, int).batched(IMAGE_BATCH))
    else:
        def windows(samples):
            for s in samples:
                rows = np.frombuffer(s["bin"], np.uint16).reshape(-1, SEQ_LEN + 1)
                yield from (torch.from_numpy(r.astype(np.int64)) for r in rows)
        ds = ds.compose(windows).shuffle(1000).batched(TOKEN_BATCH, collation_fn=stack_windows)
    return ds, torch.utils.data.DataLoader(ds, batch_size=None, num_workers=WORKERS)


def _mosaic_loader(spec, state=None):
    import numpy as np
    import torch
    import_peer_libraries()
    from streaming import StreamingDataLoader, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    torch.set_num_threads(1)
    clean_stale_shared_memory()
    images = spec["workload"] == "images"
    transform = peer_transform() if images else None
    batch = IMAGE_BATCH if images else TOKEN_BATCH

    class Dataset(StreamingDataset):
        def __getitem__(self, i):
            s = super().__getitem__(i)
            if images:
                return transform(pil_image(s["jpg"])), s["cls"]
            return torch.from_numpy(s["tokens"].astype(np.int64))

    ds = Dataset(remote=spec["url"], local=spec["cache_dir"], shuffle=True, shuffle_seed=0,
                 batch_size=batch, cache_limit=spec["budget"])
    loader = StreamingDataLoader(ds, batch_size=batch, num_workers=WORKERS,
                                 worker_init_fn=_mosaic_own_client)
    if state is not None:
        loader.load_state_dict(state)
    return ds, loader


def _mosaic_own_client(worker_id):
    """A forked worker inherits Mosaic's boto3 client, with the parent's open connection (the
    one that fetched index.json): two processes on one connection then read each other's
    answers (over this plain-http endpoint: shards cut short, IndexError "Relative sample index
    ... is not present", or a 60 s stall). Mosaic drops the client when pickled (a spawned worker
    makes its own); this does the same for a forked one."""
    import torch
    for stream in torch.utils.data.get_worker_info().dataset.streams:
        downloader = getattr(stream, "_downloader", None)
        if hasattr(downloader, "_s3_client"):
            downloader._s3_client = None


def _litdata_loader(spec, state=None):
    import torch
    import_peer_libraries()
    import litdata as ld
    from litdata.streaming import downloader
    from litdata.streaming.item_loader import TokensLoader
    torch.set_num_threads(1)
    # LitData fetches chunks with obstore, whose client refuses plain http unless told: the
    # local endpoint is http (a real bucket is https). Nothing else of its path changes.
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"
    images = spec["workload"] == "images"
    transform = peer_transform() if images else None

    class Dataset(ld.StreamingDataset):
        def __getitem__(self, i):
            s = super().__getitem__(i)
            if images:
                return transform(pil_image(s[0])), s[1]
            return s.long()

    kw = {} if images else {"item_loader": TokensLoader(block_size=SEQ_LEN + 1)}
    ds = Dataset(spec["url"], cache_dir=spec["cache_dir"], shuffle=True, seed=0,
                 max_cache_size=spec["budget"], **kw)
    loader = ld.StreamingDataLoader(ds, batch_size=IMAGE_BATCH if images else TOKEN_BATCH,
                                    num_workers=WORKERS)
    if state is not None:
        loader.load_state_dict(state)
    return ds, loader


def build(spec, state=None):
    kind = spec["loader"]
    if kind.startswith("stoker"):
        ds, loader = _stoker_loader(spec)
        if state is not None:
            loader.load_state_dict(state)
        return ds, loader
    if kind == "webdataset":
        return _wds_loader(spec)
    return {"mosaic": _mosaic_loader, "litdata": _litdata_loader}[kind](spec, state)


def say(**kw):
    print(json.dumps(kw), flush=True)


def child(spec):
    """Epochs 1 and 2 of one loader, then half an epoch whose state is saved for the resume
    child. Each phase's end is announced on stdout: the parent reads the proxy's counters then."""
    import warnings
    warnings.simplefilter("ignore")
    say(mark="start")
    t0 = time.perf_counter()
    ds, loader = build(spec)
    for epoch in (1, 2):
        n = 0
        for batch in loader:
            n += samples_in(batch)
        t1 = time.perf_counter()
        say(mark=f"epoch{epoch}", samples=n, seconds=t1 - t0)
        t0 = t1
    out = {}
    if spec["loader"] == "stoker":
        out["stoker_stats"] = {k: v for k, v in ds._remote.stats().items()
                               if isinstance(v, (int, float, type(None)))}
    if spec["loader"] != "webdataset":
        it, half = iter(loader), n // count_per_batch(spec) // 2
        for _ in range(max(1, half)):
            next(it)
        with open(spec["state_file"], "wb") as f:
            pickle.dump(loader.state_dict(), f)
        out["resume_after_batches"] = max(1, half)
        del it
    say(mark="done", **out)
    os._exit(0)  # skip teardown: peers' worker pools have hung in it


def count_per_batch(spec):
    return IMAGE_BATCH if spec["workload"] == "images" else TOKEN_BATCH


def resume_child(spec):
    """A new process on the same node: the loader built with the saved state, to its first
    batch."""
    import warnings
    warnings.simplefilter("ignore")
    with open(spec["state_file"], "rb") as f:
        state = pickle.load(f)
    if spec["loader"].startswith("stoker"):
        import torch  # noqa: F401  (imports are not the resume's cost: the peers' import it too)

        import stoker  # noqa: F401
    else:
        import_peer_libraries()
    say(mark="start")
    t0 = time.perf_counter()
    _, loader = build(spec, state)
    next(iter(loader))
    say(mark="done", seconds=time.perf_counter() - t0)
    os._exit(0)


# ---- the parent: servers, runs, the table ----------------------------------------------------

def dir_bytes(path):
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, f))
            except OSError:
                pass
    return total


def run_child(cmd, env, proxy, timeout, log):
    """Runs a child, snapshotting the proxy's (requests, bytes, time) at each mark it prints;
    returns (marks: name -> (message, snapshot)), or raises RuntimeError (its standard error is
    then kept in ``log``)."""
    marks = {}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, 9))
    timer.start()
    err = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    reader.start()
    try:
        for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict) and "mark" in msg:
                with proxy.lock:
                    snap = (proxy.requests, proxy.bytes_served, time.perf_counter())
                marks[msg["mark"]] = (msg, snap)
        proc.wait()
    finally:
        timer.cancel()
    reader.join()
    if "done" not in marks:
        why = "timed out" if proc.returncode == -9 else f"exit {proc.returncode}"
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text(err[0] if err else "")
        raise RuntimeError(f"{why}: {_error_line(err[0] if err else '')} (log: {log})")
    return marks


def epochs(py, spec, env, proxy, args, log):
    """One epochs child over a fresh cache directory: (figures, None) or (None, error)."""
    cache = Path(spec["cache_dir"])
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir()
    try:
        with PeakPoll(lambda: dir_bytes(cache), interval=0.1) as poll:
            marks = run_child([py, __file__, "--child", json.dumps(spec | {"phase": "epochs"})],
                              env, proxy, args.timeout, log)
    except RuntimeError as e:
        return None, str(e)
    (_, s0), (e1, s1), (e2, s2), (done, _) = (marks[k] for k in ("start", "epoch1", "epoch2",
                                                                   "done"))
    return {"samples": e1["samples"], "epoch1_s": e1["seconds"], "epoch2_s": e2["seconds"],
            "epoch1_bytes": s1[1] - s0[1], "epoch2_bytes": s2[1] - s1[1],
            "epoch1_requests": s1[0] - s0[0], "epoch2_samples": e2["samples"],
            "peak_cache": poll.peak if not spec["loader"].endswith("local") else None,
            "stoker_stats": done.get("stoker_stats"), "note": None}, None


def measure(kind, workload, spec, env, proxy, args, tmp):
    py = sys.executable if kind.startswith("stoker") else peer_python("remote")
    if py is None:
        return {"error": "environment missing (bash bench/setup_peers.sh remote)"}
    spec = dict(spec, loader=kind, workload=workload, budget=args.budget,
                cache_dir=str(Path(tmp) / f"cache-{workload}-{kind}"),
                state_file=str(Path(tmp) / f"state-{workload}-{kind}.pkl"))
    log = args.logs / f"{workload}-{kind}.log"
    r, error = epochs(py, spec, env, proxy, args, log)
    # The budget, as each peer applies it, has cost two of them their cached epoch; that is
    # reported, and the peer measured again with its default (no limit), so that its other
    # figures stay comparable:
    # - Mosaic, before its workers got their own S3 client (_mosaic_own_client), failed
    #   (IndexError: "Relative sample index ... is not present in the shard...") or stalled
    #   ~60 s in epoch 1; kept as a guard: a failure or stall with cache_limit is retried
    #   without one;
    # - LitData's max_cache_size at 1.25x the data has it delete chunks once read (epoch 2
    #   downloads everything again).
    why = None
    if kind == "mosaic" and error:
        why = f"with cache_limit={args.budget}: {error.split(' (log')[0]}"
    elif kind == "mosaic" and r and \
            r["epoch1_s"] > args.data_bytes[workload] / args.bandwidth + 30:
        why = (f"with cache_limit={args.budget}: epoch 1 took {r['epoch1_s']:.0f} s, "
               f"{args.data_bytes[workload] / args.bandwidth:.0f} s at the link's rate (a "
               f"stalled download waits out download_timeout, 60 s)")
    elif kind == "litdata" and r and r["epoch2_bytes"] > 0.1 * args.data_bytes[workload]:
        why = (f"with max_cache_size={args.budget}: epoch 2 downloaded "
               f"{r['epoch2_bytes'] / 1e6:.0f} MB again, {r['samples'] / r['epoch2_s']:,.0f} "
               f"samples/s")
    if why:
        spec["budget"] = None
        r, error = epochs(py, spec, env, proxy, args, log.with_suffix(".nolimit.log"))
        if r:
            r["note"] = why + "; the row: measured again without a limit"
        else:
            error = f"{error}; {why}"
    if r is None:
        return {"error": error}
    if kind == "webdataset":
        r["resume_s"] = None
        return r
    try:
        rm = run_child([py, __file__, "--child", json.dumps(spec | {"phase": "resume"})], env,
                       proxy, args.timeout, args.logs / f"{workload}-{kind}-resume.log")
        r["resume_s"] = rm["done"][0]["seconds"]
    except RuntimeError as e:
        r["resume_s"] = None
        r["resume_error"] = str(e)
    return r


def wds_urls(s3_server, proxy_url, keys):
    """WebDataset's ``pipe:`` URLs of the objects: curl signing its GET (``--aws-sigv4``) through
    the proxy. (Presigned URLs for its ``http`` handler would be lighter, but moto's IAM check
    refuses query-string signatures.)"""
    auth = (f"--aws-sigv4 aws:amz:us-east-1:s3 --user "
            f"{s3_server.access_key}:{s3_server.secret_key} "
            f"-H 'x-amz-content-sha256: UNSIGNED-PAYLOAD'")
    return [f"pipe:curl -s -S -f {auth} {proxy_url}/{BUCKET}/{k}" for k in keys]


def specs(workload, s3_server, proxy, tars, bins, wds_tokens, peer_dirs):
    options = {"endpoint": proxy.url, "access_key_id": s3_server.access_key,
               "secret_access_key": s3_server.secret_key, "region": "us-east-1"}
    if workload == "images":
        local, names = tars, [f"images/{os.path.basename(t)}" for t in tars]
        url = f"s3://{BUCKET}/images/train-{{0000..{len(tars) - 1:04d}}}.tar"
    else:
        local, names = bins, [f"wds-tokens/{os.path.basename(t)}" for t in wds_tokens]
        url = f"s3://{BUCKET}/tokens/tok-{{000..{len(bins) - 1:03d}}}.bin"
    common = {"local": local, "storage_options": options}
    out = {"stoker-local": common, "stoker": dict(common, url=url),
           "webdataset": dict(common, urls=wds_urls(s3_server, proxy.url, names))}
    for fmt in ("mosaic", "litdata"):
        d = peer_dirs.get((fmt, workload), "")
        out[fmt] = (dict(common, url=f"s3://{BUCKET}/{fmt}-{workload}") if os.path.isdir(d)
                    else {"error": d or "not prepared"})
    return out


def run_workload(workload, args, s3_server, proxy, data_files, tmp):
    tars, bins, wds_tokens, peer_dirs = data_files
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AWS_") and k.lower() not in ("http_proxy", "https_proxy")}
    env.update(s3_server.env(proxy.url), AWS_DEFAULT_REGION="us-east-1",
               AWS_EC2_METADATA_DISABLED="true", S3_ENDPOINT_URL=proxy.url,
               NO_PROXY="127.0.0.1,localhost", PYTHONWARNINGS="ignore",
               TOKENIZERS_PARALLELISM="false")
    all_specs = specs(workload, s3_server, proxy, tars, bins, wds_tokens, peer_dirs)
    results = {}
    for kind in args.loaders:
        spec = all_specs[kind]
        if "error" in spec:
            results[kind] = {"error": spec["error"]}
        else:
            proxy.latency, proxy.bandwidth = args.latency, args.bandwidth
            results[kind] = measure(kind, workload, spec, env, proxy, args, tmp)
        print("." if "error" not in results[kind] else "x", end="", flush=True)
    print()
    return results


def report(workload, results, args, data_bytes):
    link = args.bandwidth / 1e6
    unit = "images" if workload == "images" else "tokens"
    per = 1 if workload == "images" else SEQ_LEN
    local = results.get("stoker-local", {})
    local_rate = local["samples"] / local["epoch2_s"] if "samples" in local else None
    print(f"\n== {workload}: {data_bytes / 1e6:.0f} MB in S3; link {link:.0f} MB/s, "
          f"{args.latency * 1e3:.0f} ms per request; cache budget {args.budget / 1e6:.0f} MB; "
          f"{WORKERS} workers, {cores()} cores")
    print(f"| loader | epoch 1 {unit}/s | epoch 1 MB/s (x link) | epoch 2 {unit}/s | "
          f"x stoker-local | epoch 2 MB again | requests/GB | peak cache MB (x budget) | "
          f"resume s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = {}
    for kind, r in results.items():
        if "error" in r:
            print(f"| {LABELS[kind]} | unavailable: {r['error'][:100]} |||||||| ")
            continue
        e1 = r["samples"] * per / r["epoch1_s"]
        e2 = r["epoch2_samples"] * per / r["epoch2_s"]
        mbs = r["epoch1_bytes"] / r["epoch1_s"] / 1e6
        rpg = r["epoch1_requests"] / (r["epoch1_bytes"] / 1e9) if r["epoch1_bytes"] else None
        rows[kind] = {"epoch1": e1, "link": mbs / link, "epoch2": e2,
                      "vs_local": (r["epoch2_samples"] / r["epoch2_s"]) / local_rate
                      if local_rate else None,
                      "again": r["epoch2_bytes"] / 1e6, "rpg": rpg, "peak": r["peak_cache"],
                      "resume": r["resume_s"]}
        x = rows[kind]
        remote = kind != "stoker-local"
        print(f"| {LABELS[kind]} | {e1:,.0f} | "
              + (f"{mbs:.1f} ({x['link']:.2f}x)" if remote else "local") + f" | {e2:,.0f} | "
              + (f"{x['vs_local']:.2f}x" if x["vs_local"] else "-") + " | "
              + (f"{x['again']:.1f}" if remote else "-") + " | "
              + (f"{rpg:,.0f}" if remote and rpg else "-") + " | "
              + (f"{x['peak'] / 1e6:.0f} ({x['peak'] / args.budget:.2f}x)" if remote else "-")
              + " | " + (f"{x['resume']:.2f}" if x["resume"] is not None else
                         "n/a" + (f" ({r['resume_error'][:60]})" if "resume_error" in r else ""))
              + " |")
    s = results.get("stoker", {}).get("stoker_stats")
    if s:
        print(f"stoker's own cache stats: fetched {s.get('fetched')}, reuses {s.get('reuses')}, "
              f"misses {s.get('misses')}, requests/GB {s.get('requests_per_gb') or 0:,.0f}, "
              f"peak on disk {s.get('peak_bytes_on_disk', 0) / 1e6:.0f} MB of budget "
              f"{s.get('budget', 0) / 1e6:.0f} MB, hit rate {s.get('hit_rate')}")
    if "webdataset" in rows:
        print("WebDataset has no mid-epoch resume: n/a.")
    for kind, r in results.items():
        if r.get("note"):
            print(f"{LABELS[kind]}: {r['note']}")
    return checks(workload, rows)


def checks(workload, rows):
    st = rows.get("stoker")
    if not st:
        return []
    out = [("stoker epoch 1 vs the link", st["link"], ">=", 0.8)]
    if st["vs_local"] is not None:
        out.append(("stoker epoch 2 vs stoker-local", st["vs_local"], ">=", 0.9))
    higher = {"epoch1": "epoch-1 rate", "epoch2": "epoch-2 rate"}
    lower = {"rpg": "requests/GB", "peak": "peak cache bytes", "resume": "resume time"}
    for kind, r in rows.items():
        if kind in ("stoker", "stoker-local"):
            continue
        for k, name in higher.items():
            out.append((f"stoker vs {LABELS[kind]}: {name}", st[k] / r[k], ">=", 1.0))
        for k, name in lower.items():
            if r[k] and st[k] is not None:
                out.append((f"stoker vs {LABELS[kind]}: {name}", st[k] / r[k], "<=", 1.0))
    print(f"summary ({workload}):")
    for name, value, op, target in out:
        ok = value >= target if op == ">=" else value <= target
        print(f"  {name:<58} {value:6.2f}x  target {op} {target:<4} {'PASS' if ok else 'FAIL'}")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smoke run on tiny data")
    p.add_argument("--workloads", default="images,tokens")
    p.add_argument("--loaders", default=",".join(LOADERS),
                   help=f"comma-separated subset of {', '.join(LOADERS)}")
    p.add_argument("--latency", type=float, default=0.020, help="seconds per request (0.020)")
    p.add_argument("--bandwidth", type=float, default=24e6,
                   help="the link's bytes/s, shared by all connections (24e6)")
    p.add_argument("--budget", type=float, default=None,
                   help="every loader's cache budget in bytes (default 1.25x the largest "
                        "workload's data: it all fits, so epoch 2 can be cached)")
    p.add_argument("--data", default=None, help="where the data is made and kept (default "
                   "~/.cache/stoker/bench-remote[-quick])")
    p.add_argument("--timeout", type=float, default=600, help="seconds per child (600)")
    p.add_argument("--json", help="write every figure to this file")
    # A measurement child (bench/record.py does not record it): {"phase": "epochs" | "resume" |
    # "prepare", ...}.
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        spec = json.loads(args.child)
        return {"epochs": child, "resume": resume_child, "prepare": prepare}[spec["phase"]](spec)
    args.loaders = [x for x in args.loaders.split(",") if x]
    workloads = [x for x in args.workloads.split(",") if x]
    data = Path(args.data or Path.home() / ".cache" / "stoker" /
                ("bench-remote-quick" if args.quick else "bench-remote"))
    data.mkdir(parents=True, exist_ok=True)
    args.logs = data / "logs"  # a failed child's standard error
    sys.path.insert(0, str(TESTS))
    from remote_servers import FaultProxy, S3Server

    import stoker
    print(f"{machine_line()}; stoker {stoker.__version__}; peers from {PEERS / 'remote'}",
          flush=True)
    t0 = time.perf_counter()
    tars, bins = make_data(data, args.quick)
    wds_tokens = wds_token_shards(bins, data / "wds-tokens")
    py = peer_python("remote")
    peer_dirs = prepare_peer_formats(data, tars, bins, py) if py else {}
    sizes_of = {"images": sum(map(os.path.getsize, tars)),
                "tokens": sum(map(os.path.getsize, bins))}
    args.data_bytes = sizes_of
    if args.budget is None:
        args.budget = int(1.25 * max(sizes_of.values()))
    args.budget = int(args.budget)
    s3_server = S3Server().start()
    proxy = FaultProxy(s3_server.url).start()
    # A loader that closes a connection mid-body (a worker ends, curl stops) is no error here.
    proxy._httpd.handle_error = lambda request, address: None
    try:
        upload_all(s3_server, tars, bins, wds_tokens, peer_dirs)
        print(f"data ready in {time.perf_counter() - t0:.0f} s: {len(tars)} tar shards, "
              f"{len(bins)} token shards in {data}", flush=True)
        out = {}
        with tempfile.TemporaryDirectory(prefix="bench-remote-") as tmp:
            for w in workloads:
                results = run_workload(w, args, s3_server, proxy,
                                       (tars, bins, wds_tokens, peer_dirs), tmp)
                out[w] = {"results": results, "checks": report(w, results, args, sizes_of[w])}
    finally:
        proxy.stop()
        s3_server.stop()
    if args.json:
        write_json(args.json, out, default=str)
    return 0


if __name__ == "__main__":
    import record  # bench/record.py: this output also goes to bench/results/
    sys.exit(record.run(main))
