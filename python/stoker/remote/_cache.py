"""A node-local cache of whole objects: each is a complete file or absent, never partial.

A cached file's name is a hash of (url, etag, size) plus the URL's suffix, so a changed object is
another file. Processes on one node share a cache directory: the download of a name is guarded
by ``flock`` on ``<name>.lock``, so it runs once and the others wait for it, then find the file
complete. Bytes go to ``<name>.part.<pid>`` and reach the final name by ``os.replace`` only after
their total is checked. Which files to evict is decided elsewhere; ``evict`` only deletes.

Lock files stay (empty): deleting one could let a second downloader start on a fresh lock file
while the first still holds the old one.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import PurePosixPath

from .._process import pid_alive
from ._errors import RemoteError
from ._store import ObjectInfo, Store

MAX_CONCURRENCY = 64
_PART = re.compile(r"\.part\.(\d+)$")
_SUFFIX = re.compile(r"^[A-Za-z0-9._-]{1,32}$")


@dataclass(frozen=True)
class FetchResult:
    path: str  # the complete file
    hit: bool  # it was there already (nothing downloaded)
    bytes: int  # bytes downloaded by this call
    requests: int  # range requests sent by this call (obstore's own retries not counted)
    seconds: float


def cache_name(url: str, info: ObjectInfo) -> str:
    digest = hashlib.sha256(f"{url}\0{info.etag}\0{info.size}".encode()).hexdigest()[:32]
    suffix = "".join(PurePosixPath(url.rstrip("/").rpartition("/")[2]).suffixes)
    return digest + (suffix if _SUFFIX.match(suffix) else "")


def fetch_to_cache(url: str, info: ObjectInfo, cache_dir: str, *, store: Store | None = None,
                   part_size: int = 8 << 20, concurrency: int = 4) -> FetchResult:
    """Makes `url`'s bytes (as described by `info`, from ``Store.head``) a complete file in
    `cache_dir` and returns its path: a hit if it is there (its mtime is touched), else a download
    in ranged GETs of `part_size` bytes, `concurrency` at a time (at most concurrency * part_size
    bytes in memory). Every part must come from the object `info` describes (same size and ETag):
    an object replaced mid-download fails it. A failure leaves nothing behind but the lock file
    and raises RemoteError naming the URL, the cause chained."""
    if part_size < 1 or not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"part_size must be >= 1 and concurrency in [1, {MAX_CONCURRENCY}], "
                         f"not {part_size} and {concurrency}")
    began = time.monotonic()
    os.makedirs(cache_dir, exist_ok=True)
    final = os.path.join(cache_dir, cache_name(url, info))
    if _touch_if_complete(final, info.size):
        return FetchResult(final, True, 0, 0, time.monotonic() - began)
    lock = os.open(final + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held until os.close; another downloader waits here
        if _touch_if_complete(final, info.size):
            return FetchResult(final, True, 0, 0, time.monotonic() - began)
        _remove_dead_parts(final)
        part = f"{final}.part.{os.getpid()}"
        try:
            got, requests = _download(store or Store.for_url(url), url, info, part, part_size,
                                      concurrency)
            written = os.path.getsize(part)
            if written != info.size:
                raise RemoteError(f"{url}: {written} bytes written to the cache, the object has "
                                  f"{info.size}", url)
            os.replace(part, final)
        except BaseException as e:
            try:
                os.unlink(part)
            except FileNotFoundError:
                pass
            if isinstance(e, Exception) and not isinstance(e, RemoteError):
                raise RemoteError(f"{url}: download into {cache_dir} failed: {e}", url) from e
            raise
    finally:
        os.close(lock)
    return FetchResult(final, False, got, requests, time.monotonic() - began)


def _touch_if_complete(path: str, size: int) -> bool:
    try:
        if os.stat(path).st_size != size:
            return False
        os.utime(path)
        return True
    except FileNotFoundError:  # absent, or evicted between the two calls
        return False


def _remove_dead_parts(final: str) -> None:
    """Part files of this name left by processes that died mid-download (we hold the lock, so no
    live process writes one)."""
    directory, name = os.path.split(final)
    for entry in os.listdir(directory):
        if not entry.startswith(name + ".part."):
            continue
        m = _PART.search(entry)
        if m and not _alive(int(m.group(1))):
            try:
                os.unlink(os.path.join(directory, entry))
            except FileNotFoundError:
                pass


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # ours: a previous, failed call of this process
    return pid_alive(pid)


def _download(store: Store, url: str, info: ObjectInfo, part: str, part_size: int,
              concurrency: int) -> tuple[int, int]:
    """(bytes, requests)."""
    size = info.size
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        ranges = [(o, min(o + part_size, size)) for o in range(0, size, part_size)]

        def one(start, end):
            data, requests = store._read(url, start, end, expect=info)
            while data:  # pwrite on a regular file writes all unless the disk is full
                n = os.pwrite(fd, data, start)
                if n == 0:
                    raise OSError(errno.ENOSPC, "pwrite wrote nothing")
                data, start = data[n:], start + n
            return requests

        if len(ranges) <= 1 or concurrency == 1:
            requests = sum(one(s, e) for s, e in ranges)
        else:
            with ThreadPoolExecutor(min(concurrency, len(ranges)),
                                    thread_name_prefix="stoker-fetch") as pool:
                futures = [pool.submit(one, s, e) for s, e in ranges]
                try:
                    requests = sum(f.result() for f in as_completed(futures))
                except BaseException:
                    for f in futures:  # the queued parts; the running ones finish or fail
                        f.cancel()
                    raise
        return size, requests
    finally:
        os.close(fd)


def cache_usage(cache_dir: str) -> int:
    """Bytes of the complete files in `cache_dir` (lock and part files left out)."""
    total = 0
    try:
        entries = os.scandir(cache_dir)
    except FileNotFoundError:
        return 0
    with entries:
        for entry in entries:
            if entry.name.endswith(".lock") or _PART.search(entry.name):
                continue
            try:
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                pass
    return total


def evict(cache_dir: str, path: str) -> None:
    """Deletes a complete file of `cache_dir` (`path` as fetch_to_cache returned it, or its
    name); one already gone is fine. Readers that have it open keep reading it."""
    full = os.path.join(cache_dir, path)
    if os.path.dirname(os.path.abspath(full)) != os.path.abspath(cache_dir):
        raise ValueError(f"{path} is not a file of the cache {cache_dir}")
    if full.endswith(".lock") or _PART.search(full):
        raise ValueError(f"{path} is a lock or part file, not a cached object")
    try:
        os.unlink(full)
    except FileNotFoundError:
        pass
