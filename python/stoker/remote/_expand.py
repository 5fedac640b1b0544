"""Expansion of URL and path patterns: braces (_urls.py), then globs by listing the store."""

from __future__ import annotations

import glob as _glob
import os

from ._store import Store
from ._urls import _WILDCARDS, expand_braces, has_wildcard, is_url, local_path, matches, parse


def expand(urls, storage_options=None) -> list[str]:
    """Expands braces, then globs, in each of `urls` (a str or a list of str), remote or local.

    A glob's matches come sorted; the inputs keep their order. A remote glob lists the objects
    under the prefix before its first wildcard (http(s) has no listing: ValueError). A pattern
    that matches nothing raises FileNotFoundError naming it. Paths without a wildcard are not
    checked. Local results lose any ``file://`` prefix and are files only.
    """
    if isinstance(urls, (str, os.PathLike)):
        urls = [urls]
    out: list[str] = []
    for given in urls:
        given = os.fspath(given)
        for pattern in expand_braces(given):
            remote = is_url(pattern)
            if not has_wildcard(pattern):
                out.append(pattern if remote else local_path(pattern))
                continue
            found = _remote_glob(pattern, storage_options) if remote else _local_glob(pattern)
            if not found:
                origin = "" if pattern == given else f" (from {given!r})"
                raise FileNotFoundError(f"no file matches {pattern!r}{origin}")
            out.extend(sorted(found))
    return out


def _local_glob(pattern: str) -> list[str]:
    return [p for p in _glob.glob(local_path(pattern)) if os.path.isfile(p)]


def _remote_glob(pattern: str, storage_options) -> list[str]:
    location = parse(pattern)
    if location.scheme in ("http", "https"):
        raise ValueError(f"{pattern}: http(s) servers have no listing, so a glob cannot be "
                         "expanded; name the URLs, or use braces: train-{000..127}.tar")
    if has_wildcard(location.authority) or has_wildcard(location.repo + location.revision):
        raise ValueError(f"{pattern}: wildcards are allowed in the object path only, "
                         "not in the bucket, host or repository")
    prefix = pattern[:_WILDCARDS.search(pattern).start()]
    listed = Store.for_url(pattern, storage_options).list(prefix)
    return [url for url in listed if matches(pattern, url)]
