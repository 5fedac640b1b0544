"""Store: one obstore client per (scheme, bucket or host, options, environment), shared by every
object under it, with its errors translated and its traffic counted.

Thread safety: a Store may be used from any number of threads at once (obstore's clients are, and
the counters are guarded by a lock); obstore releases the GIL while it waits on the network.

Retries: obstore retries what fails at the HTTP level (429, 5xx, timeouts, connections reset or
cut short) with exponential backoff, up to `max_retries` within `retry_timeout`; those retries
are invisible here. A body that still arrives shorter than asked is retried by `read` itself, up
to `max_retries`, and counted in ``stats()["retries"]``.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass

from . import _config
from ._errors import RemoteAuthError, RemoteError, RemoteNotFound
from ._urls import Location, parse

_AUTH_STATUS = re.compile(r"status code: (401|403)\b")
# No credentials found: obstore's S3 chain ends at the instance metadata address; Azure's builder
# wants an account.
_NO_CREDENTIALS = re.compile(r"169\.254\.169\.254|credential|account must be specified",
                             re.IGNORECASE)
_UNKNOWN_KEY = re.compile(r"Configuration key: '([^']+)' is not valid")


@dataclass(frozen=True)
class ObjectInfo:
    size: int
    etag: str | None


def _obstore():
    from .._extras import require

    return require("obstore", "remote", "stoker's remote storage (s3://, gs://, hf:// ...)")


class Store:
    """A client for the objects of one bucket, container, HTTP host or Hub endpoint. Build it
    with ``Store.for_url``; its methods take full URLs of that bucket or host."""

    _cache: dict = {}
    _cache_lock = threading.Lock()

    @classmethod
    def for_url(cls, url: str, storage_options: dict | None = None) -> Store:
        """The shared Store for `url`'s scheme and bucket (or host) under these options and the
        current environment: a changed AWS_* / HF_TOKEN ... makes a new client."""
        location = parse(url)
        options = storage_options or {}
        key = (location.scheme, location.authority,
               tuple(sorted((k, repr(v)) for k, v in options.items())),
               _config.env_snapshot(location.scheme))
        with cls._cache_lock:
            store = cls._cache.get(key)
            if store is None:
                store = cls._cache[key] = cls(url, location, options)
        return store

    def __init__(self, url: str, location: Location, storage_options: dict):
        self._scheme = location.scheme
        self._authority = location.authority
        self._config = _config.build(location.scheme, storage_options)
        self._client = self._make_client(url, location, self._config)
        self._lock = threading.Lock()
        self._stats = {"requests": 0, "bytes": 0, "retries": 0, "errors": 0}  # guarded by _lock

    def _make_client(self, url: str, location: Location, cfg: _config.StoreConfig):
        store = _obstore().store
        common = {"client_options": cfg.client_options or None,
                  "retry_config": cfg.retry_config or None}
        try:
            if cfg.scheme in ("http", "https"):
                return store.HTTPStore(location.authority, **common)
            if cfg.scheme == "hf":
                return store.HTTPStore(cfg.hf_endpoint, **common)
            make = {"s3": store.S3Store, "gs": store.GCSStore, "az": store.AzureStore}[cfg.scheme]
            return make(location.authority, config=cfg.config, **common)
        except _obstore().exceptions.UnknownConfigurationKeyError as e:
            m = _UNKNOWN_KEY.search(str(e))
            raise _config.unknown_keys_error(cfg.scheme, [m.group(1)] if m else cfg.config) from e
        except _obstore().exceptions.BaseError as e:
            raise self._error(e, url) from e

    # --- the calls ------------------------------------------------------------------------------

    def head(self, url: str) -> ObjectInfo:
        """The object's size and ETag (one HEAD request)."""
        path = self._path(url)
        self._count(requests=1)
        try:
            meta = _obstore().head(self._client, path)
        except Exception as e:
            raise self._failed(e, url) from e
        return ObjectInfo(size=int(meta["size"]), etag=meta.get("e_tag"))

    def read(self, url: str, start: int = 0, end: int | None = None) -> memoryview:
        """Bytes [start, end) of the object (to its end when `end` is None), exactly: a body that
        arrives shorter than asked is asked for again. A range past the object's end is an error."""
        return self._read(url, start, end)[0]

    def write(self, url: str, data: bytes) -> None:
        """Puts `data` as the object at `url` (one PUT; `stoker index` writes sidecars so)."""
        location = parse(url)
        if location.scheme in ("http", "https", "hf"):
            raise ValueError(f"{url}: {location.scheme}:// is read-only here; write the file "
                             "where the server serves it from")
        path = self._path(url)
        self._count(requests=1)
        try:
            _obstore().put(self._client, path, bytes(data))
        except Exception as e:
            raise self._failed(e, url) from e

    def list(self, prefix_url: str) -> list[str]:
        """The URLs of every object whose URL starts with `prefix_url` (a string prefix, not only
        a directory), in the store's order. http(s) has no listing: ValueError."""
        location = parse(prefix_url)
        if location.scheme in ("http", "https"):
            raise ValueError(f"{prefix_url}: http(s) servers have no listing")
        self._check_served(location, prefix_url)
        directory = location.key.rpartition("/")[0]
        if location.scheme == "hf":
            urls = self._list_hub(prefix_url, location, directory)
        else:
            urls = self._list_store(prefix_url, location, directory)
        return [u for u in urls if u.startswith(prefix_url)]

    def list_info(self, prefix_url: str) -> dict:
        """``{url: ObjectInfo}`` of every object under `prefix_url` (a string prefix), from the
        listing: sizes and ETags of many objects for a request per 1000 (a HEAD each otherwise).
        http(s) has no listing: ValueError."""
        location = parse(prefix_url)
        if location.scheme in ("http", "https", "hf"):
            raise ValueError(f"{prefix_url}: no listing with sizes for {location.scheme}://")
        self._check_served(location, prefix_url)
        directory = location.key.rpartition("/")[0]
        base = self._base(location)
        out = {}
        try:
            for chunk in _obstore().list(self._client, directory or None, chunk_size=1000):
                self._count(requests=1)
                for meta in chunk:
                    url = base + meta["path"]
                    if url.startswith(prefix_url):
                        out[url] = ObjectInfo(size=int(meta["size"]), etag=meta.get("e_tag"))
        except Exception as e:
            raise self._failed(e, prefix_url) from e
        return out

    def stats(self) -> dict:
        """Requests sent, body bytes received, short bodies retried and errors raised since this
        Store was made, as counted around each call (obstore's own retries are not seen)."""
        with self._lock:
            return dict(self._stats)

    # --- internals ------------------------------------------------------------------------------

    def _read(self, url: str, start: int, end: int | None,
              expect: ObjectInfo | None = None) -> tuple[memoryview, int]:
        """(the bytes, requests sent). With `expect`, a response from an object of another size
        or ETag (it changed since that head) is an error: the parts of one file must agree."""
        if start < 0 or (end is not None and end < start):
            raise ValueError(f"{url}: bad byte range [{start}, {end})")
        if end == start:
            return memoryview(b""), 0
        path = self._path(url)
        obstore = _obstore()
        options = {"range": (start, end) if end is not None else {"offset": start}}
        delay, attempts = self._config.backoff_initial, 0
        while True:
            attempts += 1
            self._count(requests=1)
            try:
                result = obstore.get(self._client, path, options=options)
                data = result.bytes()
            except Exception as e:
                raise self._failed(e, url) from e
            size, etag = int(result.meta["size"]), result.meta.get("e_tag")
            if expect is not None and (size != expect.size
                                       or (etag and expect.etag and etag != expect.etag)):
                raise self._failed(RemoteError(
                    f"{url} changed while being read: now {size} bytes, ETag {etag}; "
                    f"{expect.size} bytes, ETag {expect.etag} before", url))
            if end is not None and end > size:
                raise self._failed(RemoteError(
                    f"{url}: bytes [{start}, {end}) asked of an object of {size} bytes", url))
            want = (size if end is None else end) - start
            self._count(bytes=len(data))
            if len(data) == want:
                return memoryview(data), attempts
            if attempts > self._config.max_retries:
                raise self._failed(RemoteError(
                    f"{url}: bytes [{start}, {start + want}) came back {len(data)} bytes long "
                    f"{attempts} times", url))
            self._count(retries=1)
            time.sleep(delay)
            delay = min(delay * 2, self._config.backoff_max)

    def _list_store(self, prefix_url, location, directory):
        base = self._base(location)
        urls = []
        self._count(requests=1)
        try:
            for chunk in _obstore().list(self._client, directory or None, chunk_size=1000):
                urls.extend(base + meta["path"] for meta in chunk)
        except Exception as e:
            raise self._failed(e, prefix_url) from e
        return urls

    def _list_hub(self, prefix_url, location, directory):
        """The Hub's tree API, page by page (``Link: <...>; rel="next"``)."""
        revision = urllib.parse.quote(location.revision or "main", safe="")
        url = (f"{self._config.hf_endpoint}/api/{location.repo}/tree/{revision}/"
               f"{urllib.parse.quote(directory)}?recursive=true")
        base = self._base(location)
        urls = []
        while url:
            entries, url = self._get_json(url, prefix_url)
            urls.extend(base + e["path"] for e in entries if e.get("type") == "file")
        return urls

    def _get_json(self, url, named):
        import urllib.error  # here: urllib.request costs ~40 ms to import (ssl, email)
        import urllib.request

        delay = self._config.backoff_initial
        for attempt in range(self._config.max_retries + 1):
            self._count(requests=1)
            request = urllib.request.Request(url, headers=self._config.hf_headers)
            try:
                with urllib.request.urlopen(request, timeout=self._config.timeout) as response:
                    body = response.read()
                    link = response.headers.get("Link", "")
                break
            except urllib.error.HTTPError as e:
                retry = e.code == 429 or e.code >= 500
                error = e
            except (urllib.error.URLError, OSError) as e:
                retry, error = True, e
            if not retry or attempt == self._config.max_retries:
                raise self._failed(error, named) from error
            self._count(retries=1)
            time.sleep(delay)
            delay = min(delay * 2, self._config.backoff_max)
        self._count(bytes=len(body))
        m = re.search(r'<([^>]+)>;\s*rel="next"', link)
        return json.loads(body), (m.group(1) if m else None)

    def _base(self, location: Location) -> str:
        """The URL of this store's root, as the caller spells it: base + key = the URL."""
        if location.scheme == "hf":
            revision = f"@{location.revision}" if location.revision else ""
            return f"hf://{location.repo}{revision}/"
        if location.scheme in ("http", "https"):
            return location.authority + "/"
        return f"{location.scheme}://{location.authority}/"

    def _path(self, url: str) -> str:
        location = parse(url)
        self._check_served(location, url)
        if not location.key:
            raise ValueError(f"{url} names no object")
        if location.scheme == "hf":
            return f"{location.repo}/resolve/{location.revision or 'main'}/{location.key}"
        if location.scheme in ("http", "https"):
            return urllib.parse.unquote(location.key)
        return location.key

    def _check_served(self, location: Location, url: str) -> None:
        if (location.scheme, location.authority) != (self._scheme, self._authority):
            raise ValueError(f"{url} is not served by this store ({self._describe()})")

    def _describe(self) -> str:
        if self._scheme == "hf":
            return f"the Hub at {self._config.hf_endpoint}"
        if self._scheme in ("http", "https"):
            return self._authority
        return f"{self._scheme}://{self._authority}"

    def _count(self, **deltas) -> None:
        with self._lock:
            for key, value in deltas.items():
                self._stats[key] += value

    def _failed(self, error: BaseException, url: str = "") -> RemoteError:
        """Counts the error and returns it as a RemoteError naming `url`."""
        self._count(errors=1)
        return error if isinstance(error, RemoteError) else self._error(error, url)

    def _error(self, error: BaseException, url: str) -> RemoteError:
        said = str(error).split("\n\nDebug source")[0].strip()
        if len(said) > 600:
            said = said[:600] + "..."
        obstore = _obstore()
        status = getattr(error, "code", None)  # urllib's HTTPError
        if isinstance(error, FileNotFoundError) or status == 404:
            return RemoteNotFound(f"{url}: not found ({said})", url)
        if (isinstance(error, (obstore.exceptions.PermissionDeniedError,
                               obstore.exceptions.UnauthenticatedError))
                or status in (401, 403) or _AUTH_STATUS.search(said)
                or (self._scheme in ("s3", "gs", "az") and _NO_CREDENTIALS.search(said))):
            return RemoteAuthError(f"{url}: a credentials problem: {said}. "
                                   f"Credentials came from: {self._credential_sources()}", url)
        return RemoteError(f"{url}: {said}", url)

    def _credential_sources(self) -> str:
        if self._config.sources:
            return ", ".join(self._config.sources)
        hints = {"s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or "
                       "storage_options access_key_id / secret_access_key",
                 "gs": "GOOGLE_APPLICATION_CREDENTIALS or GOOGLE_SERVICE_ACCOUNT",
                 "az": "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY, or "
                       "AZURE_STORAGE_CONNECTION_STRING",
                 "hf": "HF_TOKEN or storage_options['token']"}
        hint = hints.get(self._scheme, "none are sent to plain http(s) servers")
        return f"nowhere (none found; set {hint})" if self._scheme in hints else hint
