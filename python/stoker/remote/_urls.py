"""What a path names: a remote URL or a local file; brace and glob expansion of both."""

from __future__ import annotations

import fnmatch
import os
import re
import urllib.parse
from dataclasses import dataclass

SCHEMES = ("s3", "gs", "az", "http", "https", "hf")
_WILDCARDS = re.compile(r"[*?\[]")
_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)")
MAX_BRACE_EXPANSION = 10_000_000  # a typo such as {0..99999999999} fails fast instead of hanging


def is_url(path) -> bool:
    """True for ``s3://``, ``gs://``, ``az://``, ``http(s)://`` and ``hf://``; ``file://`` and
    plain paths are local (False)."""
    if not isinstance(path, str):
        return False
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.lower() in SCHEMES


def local_path(path) -> str:
    """A local path with any ``file://`` prefix removed."""
    path = os.fspath(path)
    return path[len("file://"):] if path.startswith("file://") else path


@dataclass(frozen=True)
class Location:
    """A remote URL taken apart: `authority` picks the client (bucket, host or Hub endpoint
    repo), `key` is the object's path inside it."""

    scheme: str
    authority: str
    key: str
    # hf:// only: "datasets/<org>/<name>" and the revision ("" when the URL names none: main)
    repo: str = ""
    revision: str = ""


def parse(url: str) -> Location:
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in SCHEMES:
        raise ValueError(f"{url!r} is not a remote URL (schemes: {', '.join(SCHEMES)})")
    if scheme in ("http", "https"):
        if "?" in rest or "#" in rest:
            raise ValueError(f"{url}: query strings and fragments are not supported in http(s) "
                             "URLs (each URL must name one object by its path)")
        host, _, key = rest.partition("/")
        return Location(scheme, f"{scheme}://{host}", key)
    if scheme == "hf":
        parts = rest.split("/", 3)
        if len(parts) < 3 or parts[0] != "datasets" or not parts[1] or not parts[2]:
            raise ValueError(f"{url}: expected hf://datasets/<org>/<name>[@<revision>]/<path>")
        name, _, revision = parts[2].partition("@")
        revision = urllib.parse.unquote(revision)
        if "/" in revision or revision == "refs":
            # object_store encodes each path segment: no request can carry refs%2Fpr%2F1
            raise ValueError(f"{url}: revisions with a slash (refs/convert/parquet, refs/pr/1) "
                             "are not supported; name the revision by its commit hash")
        return Location(scheme, "", parts[3] if len(parts) > 3 else "",
                        repo=f"datasets/{parts[1]}/{name}", revision=revision)
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ValueError(f"{url}: no bucket or container")
    return Location(scheme, bucket, key)


def expand_braces(pattern: str) -> list[str]:
    """``{a,b}`` alternatives and ``{007..010}`` ranges (zero padding kept), several per pattern,
    the first varying slowest, as bash does. Nested braces are not expanded; a brace with neither
    a comma nor a range stays as it is."""
    pos = 0
    while m := _BRACE.search(pattern, pos):
        alternatives = _alternatives(m.group(1), pattern)
        if alternatives is None:
            pos = m.end()
            continue
        head, tails = pattern[:m.start()], expand_braces(pattern[m.end():])
        if len(alternatives) * len(tails) > MAX_BRACE_EXPANSION:
            raise ValueError(f"{pattern!r} expands to more than {MAX_BRACE_EXPANSION:,} paths")
        return [head + a + t for a in alternatives for t in tails]
    return [pattern]


def _alternatives(body: str, pattern: str) -> list[str] | None:
    if m := _RANGE.fullmatch(body):
        a, b = m.groups()
        lo, hi = int(a), int(b)
        if abs(hi - lo) >= MAX_BRACE_EXPANSION:
            raise ValueError(f"{pattern!r} expands to more than {MAX_BRACE_EXPANSION:,} paths")
        padded = any(len(s.lstrip("-")) > 1 and s.lstrip("-").startswith("0") for s in (a, b))
        width = max(len(a), len(b)) if padded else 0
        step = 1 if hi >= lo else -1
        return [f"{i:0{width}d}" for i in range(lo, hi + step, step)]
    if "," in body:
        return body.split(",")
    return None


def has_wildcard(path: str) -> bool:
    return bool(_WILDCARDS.search(path))


def matches(pattern: str, path: str) -> bool:
    """Glob match in which ``*``, ``?`` and ``[..]`` stay inside one path segment, as the
    local filesystem's glob does."""
    p, s = pattern.split("/"), path.split("/")
    return len(p) == len(s) and all(fnmatch.fnmatchcase(b, a) for a, b in zip(p, s))
