"""Where a dataset's files are: one rule for every dataset that reads many files (token shards,
tar shards, tables).

A dataset's ``paths`` is a path, a directory (its files with one of the dataset's suffixes), a
pattern, or a list of these, expanded in that order. Patterns are braces, then globs:
``train-{000..127}.bin`` (a numeric range keeps its zero padding), ``{train,extra}-*.bin``
(alternatives, kept in the order written), then ``*``, ``?`` and ``[...]`` (matches sorted).
"""

from __future__ import annotations

import glob
import os
import re

__all__ = ["expand", "expand_braces"]

_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def _closing_brace(text, start):
    """The index of the ``}`` that closes the ``{`` at ``start``, or -1."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _split_top(body):
    """``body``'s comma-separated alternatives, commas inside nested braces kept."""
    parts, depth, last = [], 0, 0
    for i, c in enumerate(body):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(body[last:i])
            last = i + 1
    parts.append(body[last:])
    return parts


def expand_braces(pattern):
    """``pattern`` with its first brace group expanded, recursively: ``a{1..3}`` -> a1, a2, a3;
    ``{x,y}z`` -> xz, yz; ``{08..10}`` -> 08, 09, 10. A brace group without a comma or a range is
    kept as it is (a literal ``{}`` in a file name)."""
    start = pattern.find("{")
    while start != -1:
        end = _closing_brace(pattern, start)
        if end == -1:
            return [pattern]
        body = pattern[start + 1:end]
        head, tail = pattern[:start], pattern[end + 1:]
        match = _RANGE.match(body)
        if match:
            lo, hi = match.group(1), match.group(2)
            width = max(len(lo.lstrip("-")), len(hi.lstrip("-"))) \
                if lo.lstrip("-").startswith("0") or hi.lstrip("-").startswith("0") else 0
            a, b = int(lo), int(hi)
            step = 1 if b >= a else -1
            items = [f"{v:0{width}d}" for v in range(a, b + step, step)]
        elif "," in body:
            items = _split_top(body)
        else:
            start = pattern.find("{", end + 1)
            continue
        return [out for item in items for out in expand_braces(head + item + tail)]
    return [pattern]


def expand(paths, what, suffixes=(), exists=os.path.exists):
    """The files ``paths`` names, in order (see the module's docstring). ``what`` names them in
    errors ("token shard", "table file"); ``suffixes`` are the ones a directory is listed for;
    ``exists`` says whether a plain path names something (a Megatron dataset is named by the
    prefix of its two files). Raises FileNotFoundError naming a path or pattern that matches
    nothing, ValueError when nothing is given."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files = []
    for item in items:
        for path in expand_braces(os.path.expanduser(os.fspath(item))):
            if os.path.isdir(path):
                found = sorted(os.path.join(path, f) for f in os.listdir(path)
                               if f.lower().endswith(tuple(suffixes)))
                if not found:
                    raise FileNotFoundError(f"no {what} ({', '.join(suffixes)}) in {path}")
            elif glob.has_magic(path):
                found = sorted(glob.glob(path))
                if not found:
                    raise FileNotFoundError(f"no {what} matches {path!r}")
            else:
                if not exists(path):
                    raise FileNotFoundError(f"no such {what}: {path}")
                found = [path]
            files += found
    if not files:
        raise ValueError(f"no {what} given")
    return files
