"""Fault injection: files that change under a running epoch, a consumer that keeps every batch,
SIGINT and SIGTERM during worker start-up and during the first batch, the parent killed.

Each fault gives a clear error naming the sample, or a counted skip, never a hang or a crash.
Every test runs under a hard timeout (faulthandler: a hang dumps every thread's stack and ends the
run as a failure); the signal cases run in subprocesses, waited on with timeouts. A fault is
injected only once the state it must hit is observed (the first batch delivered, a worker inside
``worker_init_fn`` or ``__getitem__``, the consumer blocked), never after a sleep.
"""

import faulthandler
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap

import numpy as np
import psutil
import pytest

import stoker
from stoker import transforms as T
from stoker.sample_data import make_sample

from conftest import ASAN_LANE, blocked_in_futex, wait_until

TIMEOUT = 300 if ASAN_LANE else 120  # seconds, for a whole test


@pytest.fixture(autouse=True)
def hard_timeout():
    # The real stderr: under pytest's capture sys.stderr may have no file descriptor.
    faulthandler.dump_traceback_later(TIMEOUT, exit=True, file=sys.__stderr__)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """24 sample JPEGs (2 classes of 12) in ImageFolder layout; tests copy them before harm."""
    root = tmp_path_factory.mktemp("faults") / "sample"
    make_sample(root, num_classes=2, images_per_class=12, shards=1)
    return root / "train"


@pytest.fixture
def folder(photos, tmp_path):
    root = tmp_path / "train"
    shutil.copytree(photos, root)
    return root


TRANSFORM = T.Compose([T.CenterCrop(32), T.ToTensor()])
LAST = 22  # the faulty sample: in the last of 12 batches of 2, far ahead of the workers


def run_epoch(ds, inject, on_error):
    """One epoch in order, batches of 2, one worker one batch ahead: `inject` runs after the first
    batch arrived. Returns (loader, batches, SampleErrors) with the epoch run to its end."""
    loader = stoker.DataLoader(ds, batch_size=2, num_workers=1, prefetch_factor=1,
                               on_error=on_error, output="numpy")
    it = iter(loader)
    got, errors = [next(it)], []
    inject()
    while True:
        try:
            got.append(next(it))
        except StopIteration:
            break
        except stoker.SampleError as e:
            errors.append(e)
    return loader, got, errors


# --------------------------------------------------------------------------- files under an epoch

def _delete(p):
    os.remove(p)


def _truncate(p):
    os.truncate(p, os.path.getsize(p) // 3)


def _empty(p):
    os.truncate(p, 0)


def _directory(p):
    os.remove(p)
    os.mkdir(p)


def _fifo(p):
    os.remove(p)
    os.mkfifo(p)  # a worker that opened it without O_NONBLOCK would wait for a writer forever


def _unreadable(p):
    os.chmod(p, 0)


FILE_FAULTS = {
    "deleted": (_delete, OSError, "No such file or directory"),
    "truncated": (_truncate, stoker.DecodeError, "JPEG: "),
    "emptied": (_empty, stoker.DecodeError, "unsupported image format (empty input)"),
    "a directory": (_directory, OSError, "not a regular file"),
    "a FIFO": (_fifo, OSError, "not a regular file"),
    "unreadable": (_unreadable, OSError, "Permission denied"),
}


@pytest.mark.parametrize("fault", FILE_FAULTS)
def test_image_file_harmed_mid_epoch_raises_naming_it_and_the_epoch_goes_on(folder, fault):
    harm, cause, message = FILE_FAULTS[fault]
    if fault == "unreadable" and os.geteuid() == 0:
        pytest.skip("root reads a file whatever its mode")
    ds = stoker.ImageFolder(folder, transform=TRANSFORM)
    path = ds.samples[LAST][0]
    _, got, errors = run_epoch(ds, lambda: harm(path), "raise")
    assert len(errors) == 1
    e = errors[0]
    assert e.index == LAST and e.path == path
    assert f"sample {LAST} ({path})" in str(e)
    assert isinstance(e.__cause__, cause) and message in str(e.__cause__), repr(e.__cause__)
    assert len(got) == 11  # every batch but the one with the harmed file


@pytest.mark.parametrize("fault", ["deleted", "truncated", "a FIFO"])
def test_image_file_harmed_mid_epoch_is_skipped_and_counted(folder, fault):
    harm = FILE_FAULTS[fault][0]
    ds = stoker.ImageFolder(folder, transform=TRANSFORM)
    path = ds.samples[LAST][0]
    loader, got, errors = run_epoch(ds, lambda: harm(path), "skip")
    assert errors == [] and len(got) == 12
    assert sum(len(labels) for _, labels in got) == 24
    stats = loader.stats()
    assert stats["skipped"] == 1
    assert len(stats["skipped_samples"]) == 1 and path in stats["skipped_samples"][0]


def make_shard(folder, path):
    """A WebDataset shard of the folder's images, in ImageFolder's order: (path, member names)."""
    ds = stoker.ImageFolder(folder)
    names = []
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i, (image, label) in enumerate(ds.samples):
            for name, data in ((f"s{i:03d}.jpg", open(image, "rb").read()),
                               (f"s{i:03d}.cls", str(label).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
                names.append(name)
    return path


def shard_member_offset(path, name):
    with tarfile.open(path) as tf:
        return tf.getmember(name).offset_data


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_tar_shard_truncated_mid_epoch(folder, tmp_path, on_error):
    shard = make_shard(folder, tmp_path / "train-0000.tar")
    ds = stoker.TarShards(str(shard), transform=TRANSFORM)
    cut = shard_member_offset(shard, f"s{LAST:03d}.jpg") + 100  # inside sample 22's image

    loader, got, errors = run_epoch(ds, lambda: os.truncate(shard, cut), on_error)
    if on_error == "raise":
        assert len(errors) == 1 and len(got) == 11
        e = errors[0]
        assert e.index == LAST and e.path == f"{shard}:s{LAST:03d}.jpg"
        assert isinstance(e.__cause__, OSError)
        assert str(e.__cause__) == f"cannot read {shard}:s{LAST:03d}.jpg: the tar shard was truncated"
    else:
        assert errors == [] and len(got) == 12
        stats = loader.stats()
        assert stats["skipped"] == 2  # samples 22 and 23 lie past the cut
        assert all("the tar shard was truncated" in s for s in stats["skipped_samples"])


def test_token_file_shorter_than_its_header_says(tmp_path):
    path = tmp_path / "shard_000.bin"
    header = np.zeros(256, np.int32)
    header[:3] = (20240520, 1, 100_000)  # llm.c / modded-nanogpt: magic, version, tokens
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.arange(60_000, dtype=np.uint16).tobytes())  # a download cut short
    with pytest.raises(ValueError, match=r"shard_000.bin is shorter than its header says: "
                                         r"100000 tokens \(200000 bytes\) after the 1024-byte "
                                         r"header, found 120000 bytes"):
        stoker.TokenDataset(path, dtype="uint16", seq_len=64)


def test_token_file_truncated_mid_epoch_raises_naming_it_instead_of_sigbus(tmp_path):
    path = tmp_path / "train.bin"
    np.arange(64 * 1024 + 1, dtype=np.uint16).tofile(path)  # 64 windows of 1024 tokens
    ds = stoker.TokenDataset(path, dtype="uint16", seq_len=1024)
    loader = stoker.DataLoader(ds, batch_size=2, num_workers=1, prefetch_factor=1,
                               output="numpy")
    it = iter(loader)
    next(it)
    os.truncate(path, 4096)  # what is mapped past the first page is gone
    errors = []
    for _ in range(len(loader) - 1):
        try:
            next(it)
        except stoker.SampleError as e:
            errors.append(e)
    assert errors, "no window past the cut failed"
    for e in errors:
        assert e.path == str(path) and isinstance(e.__cause__, OSError)
        assert f"token file {path} was truncated while being read" in str(e.__cause__)
    # Each failed batch names its first failed sample: its first, or its second when the cut
    # came while the worker was between the two (seen in the ASan lane). Every batch the worker
    # had not produced before the cut fails, in order, to the last (the worker is at most two
    # batches ahead of the consumer).
    assert [e.index // 2 for e in errors] == list(range(32 - len(errors), 32))
    assert len(errors) >= 29


# How the rows reach ArrayDataset: each way but the path is an array NumPy mapped, which Stoker
# maps again. Rows are 4 KiB apart in the file, row i at 128 + 4096 i in the .npy (header first)
# and at 4096 i in the raw file.
MAPPED_ROWS = {
    "path": "{npy!r}",
    "np.load": "np.load({npy!r}, mmap_mode='r')",
    "a view": "np.load({npy!r}, mmap_mode='r')[:, 512:]",  # strided: half of each row
    "np.memmap": "np.memmap({raw!r}, dtype=np.float32, mode='r', shape=(64, 1024))",
}


@pytest.mark.parametrize("given", list(MAPPED_ROWS))
def test_file_truncated_mid_epoch_raises_naming_it(tmp_path, given):
    # In a child process: were the read unguarded, the SIGBUS would kill the test run.
    npy, raw = tmp_path / "rows.npy", tmp_path / "rows.bin"
    np.save(npy, np.zeros((64, 1024), np.float32))
    np.zeros((64, 1024), np.float32).tofile(raw)
    path = raw if given == "np.memmap" else npy
    array = MAPPED_ROWS[given].format(npy=str(npy), raw=str(raw))
    script = textwrap.dedent(f"""
        import os, numpy as np, stoker
        ds = stoker.ArrayDataset({array})
        it = iter(stoker.DataLoader(ds, batch_size=2, num_workers=1, prefetch_factor=1,
                                    output="numpy"))
        next(it)
        os.truncate({str(path)!r}, 4096)
        try:
            for _ in it:
                pass
        except stoker.SampleError as e:
            print("SampleError", e.index, e.path, flush=True)
            print(e.__cause__, flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=TIMEOUT / 2)
    assert proc.returncode == 0, f"died with {proc.returncode}: {proc.stderr[-2000:]}"
    first, cause = proc.stdout.splitlines()
    # The worker is at most two batches ahead of the consumer: batches 0..2 may have been read
    # before the cut, and every row after the first lies past it.
    kind, index, named = first.split(" ", 2)
    assert kind == "SampleError" and int(index) in (2, 4, 6) and named == str(path)
    what, size = ("file", 64 * 4096) if path == raw else (".npy file", 64 * 4096 + 128)
    assert cause == f"{what} {path} was truncated while being read (it had {size} bytes when it " \
                    "was opened)"


def test_read_only_numpy_mappings_are_mapped_again(tmp_path):
    path = tmp_path / "rows.npy"
    data = np.arange(64 * 4, dtype=np.int32).reshape(64, 4)
    np.save(path, data)
    raw = tmp_path / "rows.bin"
    data.tofile(raw)
    for a, expected, file in (
            (np.load(path, mmap_mode="r"), data, path),
            (np.load(path, mmap_mode="r")[::2], data[::2], path),  # views, strides of any sign
            (np.load(path, mmap_mode="r")[::-3, 1:3], data[::-3, 1:3], path),
            (np.load(path, mmap_mode="r").T[1], data[:, 1], path),
            (np.asarray(np.load(path, mmap_mode="r"))[5:], data[5:], path),  # a plain ndarray
            # a raw file, from an offset that is not a multiple of the page size
            (np.memmap(raw, dtype=np.int32, mode="r", shape=(60, 4), offset=64), data[4:], raw)):
        ds = stoker.ArrayDataset(a)
        assert isinstance(ds._files[0], stoker._native.sources.FileMapping)
        assert ds._files[0].path == str(file)
        assert np.array_equal(ds.arrays[0], expected) and not ds.arrays[0].flags.writeable
        assert ds.arrays[0].strides == a.strides
        batches = list(stoker.DataLoader(ds, batch_size=7, output="numpy"))
        assert np.array_equal(np.concatenate(batches), expected)
    for a in (np.load(path, mmap_mode="r+"),  # writable: the user may write through it
              np.load(path, mmap_mode="c"),  # copy-on-write: the user's writes are private
              np.load(path)):  # in memory
        ds = stoker.ArrayDataset(a)
        assert ds._files[0] is None and ds.arrays[0] is a


def test_npy_file_truncated_mid_epoch_skips_the_rows_that_are_gone(tmp_path):
    path = tmp_path / "rows.npy"
    np.save(path, np.arange(64 * 256, dtype=np.int32).reshape(64, 256))  # 1 KiB rows
    ds = stoker.ArrayDataset(path, np.arange(64), names=["x", "label"])
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, prefetch_factor=1,
                               output="numpy", on_error="skip", seed=5)
    it = iter(loader)
    got = [next(it)]
    # 15 pages stay: the 128-byte header and rows 0..58; rows 59..63 reach past the cut.
    os.truncate(path, 15 * 4096)
    got += list(it)
    x = np.concatenate([b[0] for b in got])
    labels = np.concatenate([b[1] for b in got])
    assert len(labels) == 64 and set(labels[59:]) <= set(range(59))  # replaced by readable rows
    assert list(labels[:59]) == list(range(59))
    assert np.array_equal(x, np.arange(64 * 256, dtype=np.int32).reshape(64, 256)[labels])
    stats = loader.stats()
    assert stats["skipped"] == 5
    assert all(str(path) in s and "was truncated while being read" in s
               for s in stats["skipped_samples"])


# --------------------------------------------------------------------------- Python datasets

class FileDataset:
    """A Python dataset that reads one file per sample, as user datasets do."""

    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            return np.frombuffer(f.read(), np.uint8).astype(np.int64)[:4].copy(), i


@pytest.fixture
def sample_files(tmp_path):
    paths = []
    for i in range(48):
        p = tmp_path / f"{i:03d}.bin"
        p.write_bytes(bytes([i, i, i, i]))
        paths.append(str(p))
    return paths


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_python_dataset_file_deleted_mid_epoch(sample_files, on_error):
    loader = stoker.DataLoader(FileDataset(sample_files), batch_size=4, num_workers=2,
                               on_error=on_error)
    it = iter(loader)
    got, errors = [next(it)], []
    os.remove(sample_files[45])
    while True:
        try:
            got.append(next(it))
        except StopIteration:
            break
        except stoker.SampleError as e:
            errors.append(e)
    if on_error == "raise":
        assert len(errors) == 1 and len(got) == 11
        assert errors[0].index == 45 and isinstance(errors[0], FileNotFoundError)
        assert sample_files[45] in str(errors[0])
    else:
        assert errors == [] and len(got) == 12
        stats = loader.stats()
        assert stats["skipped"] == 1 and "sample 45: FileNotFoundError" in \
            stats["skipped_samples"][0]


def test_native_consumer_keeping_every_batch_under_a_small_budget_gets_an_error(folder):
    ds = stoker.ImageFolder(folder, transform=TRANSFORM)
    batch_bytes = 2 * 3 * 32 * 32 * 4 + 2 * 8
    loader = stoker.DataLoader(ds, batch_size=2, num_workers=2, memory_budget=4 * batch_bytes,
                               output="numpy")
    kept = []
    with pytest.raises(stoker.MemoryBudgetError, match="consumer holds all of them"):
        for batch in loader:
            kept.append(batch)
    assert len(kept) >= 3  # it raised once the budget was spent, not before


class Wide:
    def __len__(self):
        return 48

    def __getitem__(self, i):
        return np.full(1024, i, np.int64)  # 8 KiB: a batch of 4 is 32 KiB


def test_python_consumer_keeping_every_batch_under_a_small_budget_completes():
    loader = stoker.DataLoader(Wide(), batch_size=4, num_workers=2, memory_budget=2 * 32768)
    kept = list(loader)  # every batch kept alive: the two buffers the budget allows are held
    assert [b[:, 0].tolist() for b in kept] == [list(range(i, i + 4)) for i in range(0, 48, 4)]
    assert all((b == b[:, :1]).all() for b in kept)
    assert loader.stats()["pickled_batches"] > 0  # the rest came through the pipe


# --------------------------------------------------------------------------- signals

def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def shm_mapped(pids):
    """The /dev/shm files the processes map."""
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                found |= {line.split(maxsplit=5)[5].strip() for line in f
                          if len(line.split(maxsplit=5)) == 6 and "/dev/shm/" in line}
        except OSError:
            pass
    return {p for p in found if not p.endswith("(deleted)")}


PYTHON_CHILD = """
import os, signal, sys, time
import numpy as np
import stoker

signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored

MARKS = sys.argv[1]
PHASE = sys.argv[2]


def mark(what):
    with open(os.path.join(MARKS, f"{what}-{os.getpid()}"), "w"):
        pass


class Blocking:
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if PHASE == "first-batch":
            mark("getitem")
            time.sleep(3600)  # the test signals the parent meanwhile
        return np.full(4, i)


def init(worker_id):
    if PHASE == "startup":
        mark("init")
        time.sleep(3600)


loader = stoker.DataLoader(Blocking(), batch_size=4, num_workers=2, worker_init_fn=init,
                           consumer_helps=False, persistent_workers=PHASE == "persistent")
try:
    for batch in loader:
        if PHASE == "persistent":
            mark("batch")
            time.sleep(3600)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
    del loader
    import gc
    gc.collect()
    import psutil
    print("children left:", len(psutil.Process().children()), flush=True)
    sys.exit(3)
"""


def start_python_child(tmp_path, phase):
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "child.py"
    script.write_text(PYTHON_CHILD)
    proc = subprocess.Popen([sys.executable, str(script), str(marks), phase],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    want = {"startup": "init", "first-batch": "getitem", "persistent": "batch"}[phase]
    seen = lambda: [m for m in os.listdir(marks) if m.startswith(want)]  # noqa: E731
    assert wait_until(lambda: len(seen()) >= (1 if phase == "persistent" else 2)
                      or proc.poll() is not None, TIMEOUT / 2), "the child never got there"
    assert proc.poll() is None, proc.communicate()
    workers = [p.pid for p in psutil.Process(proc.pid).children()]
    assert len(workers) == 2
    return proc, workers


@pytest.mark.parametrize("phase", ["startup", "first-batch"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_a_python_dataset_consumer_leaves_no_worker(tmp_path, phase, sig):
    proc, workers = start_python_child(tmp_path, phase)
    shm = shm_mapped([proc.pid] + workers)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=TIMEOUT / 2)
    if sig == signal.SIGINT:
        assert proc.returncode == 3, err[-3000:]
        assert out.splitlines() == ["KeyboardInterrupt", "children left: 0"], out
    else:
        assert proc.returncode == -signal.SIGTERM, err[-3000:]
    assert wait_until(lambda: not any(alive(p) for p in workers)), "orphaned workers"
    assert not any(os.path.exists(p) for p in shm), shm


@pytest.mark.parametrize("phase", ["first-batch", "persistent"])
def test_parent_killed_leaves_no_worker_and_nothing_in_dev_shm(tmp_path, phase):
    proc, workers = start_python_child(tmp_path, phase)
    shm = shm_mapped([proc.pid] + workers)
    proc.kill()
    proc.communicate(timeout=TIMEOUT / 2)
    assert proc.returncode == -signal.SIGKILL
    assert wait_until(lambda: not any(alive(p) for p in workers)), "orphaned workers"
    assert not any(os.path.exists(p) for p in shm), shm


NATIVE_CHILD = """
import os, signal
import stoker
from faulty import FaultyDataset

signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored

before = len(os.listdir("/proc/self/task"))
# 2 s a sample on the engine's threads: the consumer waits for its first batch.
loader = stoker.DataLoader(FaultyDataset(100, delay_us=2_000_000), batch_size=4, num_workers=2)
print("iterating", flush=True)
try:
    for batch in loader:
        pass
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
print("threads left:", len(os.listdir("/proc/self/task")) - before, flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_while_the_native_consumer_waits_for_its_first_batch(sig):
    proc = subprocess.Popen([sys.executable, "-c", NATIVE_CHILD], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "iterating"
    assert wait_until(lambda: blocked_in_futex(proc.pid, proc.pid), TIMEOUT / 2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=TIMEOUT / 2)
    if sig == signal.SIGINT:  # interrupted, threads stopped and joined
        assert proc.returncode == 0, err
        assert out.splitlines() == ["KeyboardInterrupt", "threads left: 0"], out
    else:  # Python's default: the process ends at once
        assert proc.returncode == -signal.SIGTERM, err
