"""Lhotse Shar (``CutSet.from_shar``'s format, written by Lhotse's ``SharWriter``) as AudioDataset
reads it: a directory of ``cuts.NNNNNN.jsonl.gz`` shards, one line a cut, and beside each a
``recording.NNNNNN.tar`` holding, for each of its cuts in the same order, the cut's audio as a
member ``<cut_id>.<format>`` (flac, wav, opus, mp3) followed by its Recording manifest
``<cut_id>.json``; a cut without audio has the placeholders ``<cut_id>.nodata`` and
``<cut_id>.nometa``. Or the shards given as Lhotse's ``fields=`` takes them,
``{"cuts": [...], "recording": [...]}``, paths or URLs of object storage.

SharWriter stores each cut's own audio (``cut.load_audio()``: the stretch of its recording, its
channels) and writes the cut with ``start=0``, so a sample is ``duration`` seconds from ``start``
of its member, read as Lhotse reads it (``cut.recording`` becomes the member's bytes;
``cut.load_audio()`` reads ``duration`` from ``start`` of them). Durations come from the cuts, so
nothing is probed or decoded when the dataset is made; the transcript is the supervisions' texts
joined by spaces, as for a CutSet manifest (manifests.py).

Other fields (``features``, custom arrays and JSON-lines fields) are not read. The members are
indexed by the one tar indexer (TarShardSet, through ``_native.remote.index_tar_keys``) and read
by TarAudioMembers, as WebDataset shards are (shards.py).
"""

from __future__ import annotations

import gzip
import json
import os
import zlib

from .. import _native
from ..sources import remote as _remote_shards
from .files import audio_module
from .manifests import Clip, as_text, check_cut_type, cut_text
from .shards import Members

_PLACEHOLDER = "nodata"  # SharWriter's member for a cut without audio (with its ".nometa")
_NOT_AUDIO = ("json", "nometa", _PLACEHOLDER)  # a member's manifest, and the placeholders


def _is_cuts(name):
    base = os.path.basename(name)
    return base.split(".")[0] == "cuts" and ".jsonl" in base


def _remote_dir(source):
    """A URL that names a directory (no file suffix), "/"-terminated; else None."""
    if not isinstance(source, str) or not _remote_shards.is_remote(source):
        return None
    last = source.rstrip("/").rsplit("/", 1)[-1]
    return None if "." in last or any(c in source for c in "*?[{") else \
        source.rstrip("/") + "/"


def is_shar(source, storage_options=None):
    """A Shar: a ``fields`` dict with ``"cuts"``, or a directory (local, or a URL: one listing)
    holding cuts shards."""
    if isinstance(source, dict):
        return "cuts" in source
    directory = _remote_dir(source)
    if directory is not None:
        try:
            return bool(_remote_shards.expand_shards(directory + "cuts.*.jsonl*",
                                                     storage_options))
        except (ValueError, OSError):  # no listing (http), or nothing there
            return False
    if isinstance(source, (str, os.PathLike)):
        path = os.path.expanduser(os.fspath(source))
        return os.path.isdir(path) and any(_is_cuts(n) for n in os.listdir(path))
    return False


def shar_fields(source, storage_options=None):
    """``{"cuts": [...], "recording": [...]}`` of a Shar directory (as Lhotse lists it: each
    field's files sorted by name; a URL's listed) or of a ``fields`` dict (its lists as given)."""
    if isinstance(source, dict):
        fields = {k: [os.fspath(p) for p in v] for k, v in source.items()}
        where = "fields"
    elif _remote_dir(source) is not None:
        where = _remote_dir(source)
        fields = {"cuts": _remote_shards.expand_shards(where + "cuts.*.jsonl*", storage_options),
                  "recording": _remote_shards.expand_shards(where + "recording.*.tar",
                                                            storage_options)}
    else:
        root = os.path.expanduser(os.fspath(source))
        names = sorted(os.listdir(root))
        fields = {"cuts": [os.path.join(root, n) for n in names if _is_cuts(n)],
                  "recording": [os.path.join(root, n) for n in names
                                if n.split(".")[0] == "recording"]}
        where = root
    if "recording" not in fields or not fields["recording"]:
        raise ValueError(f"Lhotse Shar {where}: no recording shards (recording.NNNNNN.tar); the "
                         f"audio is read from them (other fields such as features are not)")
    cuts, recs = fields["cuts"], fields["recording"]
    if not cuts:
        raise ValueError(f"Lhotse Shar {where}: no cuts shards (cuts.NNNNNN.jsonl.gz)")
    if len(cuts) != len(recs):
        raise ValueError(f"Lhotse Shar {where}: {len(cuts)} cuts shards but {len(recs)} "
                         f"recording shards; each cuts shard has its recording shard")
    bad = [r for r in recs if not r.split("?")[0].endswith(".tar")]
    if bad:
        raise ValueError(f"Lhotse Shar {where}: recording shard {bad[0]} is not a .tar")
    return {"cuts": list(cuts), "recording": list(recs)}


def _cut_lines(data, name):
    """The cuts of a cuts shard's bytes (gzip-compressed where its name ends .gz), each with its
    line number; a ValueError naming the shard (and the line) where it does not read."""
    if name.split("?")[0].endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise ValueError(f"{name}: not a readable gzip file ({e})") from None
    out = []
    for n, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            cut = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{name}:{n}: not JSON ({e})") from None
        if not isinstance(cut, dict) or not isinstance(cut.get("id"), str):
            raise ValueError(f"{name}:{n}: not a cut (a JSON object with an 'id')")
        out.append((n, cut))
    return out


def _tar_entries(path, name):
    """A recording shard's members by cut id, in the shard's order: ``{cut_id: {ext: (offset,
    size)}}``. A member's cut id is its name less its last extension, as Lhotse takes it
    (a cut id may hold dots); the indexer groups by the first dot, so its names are regrouped."""
    members = [m for _, ms in _native.remote.index_tar_keys(path) for m in ms]
    members.sort(key=lambda m: m[2])  # the shard's order
    entries = {}
    for _, member, offset, size in members:
        stem, dot, ext = member.rpartition(".")
        if not dot:
            continue
        entries.setdefault(stem, {}).setdefault(ext.lower(), (offset, size))
    return entries


def _shard_clips(s, cuts_name, lines, tar_name, entries, text, missing, refs, skipped):
    """The clips of shard ``s``: its cuts matched with its recording shard's members."""
    position = {}
    for n, cut in lines:
        if cut["id"] in position:
            raise ValueError(f"{cuts_name}:{n}: cut id {cut['id']!r} is there twice")
        position[cut["id"]] = len(position)
    last, last_id = -1, None
    for stem in entries:  # the members' order must be the cuts' (Lhotse reads them side by side)
        at = position.get(stem)
        if at is None:
            raise ValueError(f"{tar_name}: member {stem!r} is no cut of {cuts_name} (cuts and "
                             f"recording shards mismatched)")
        if at < last:
            raise ValueError(f"{tar_name}: cut {stem!r} comes after cut {last_id!r}, in the "
                             f"other order in {cuts_name}: the shards are not in step as "
                             f"Lhotse's SharWriter writes them")
        last, last_id = at, stem
    clips = []
    for n, cut in lines:
        cut_id = cut["id"]
        name = f"{tar_name}:{cut_id}"
        check_cut_type(cut, f"{cuts_name}:{n} (cut {cut_id!r})")
        try:
            start, duration = float(cut.get("start", 0.0)), float(cut["duration"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{cuts_name}:{n} (cut {cut_id!r}): no duration in seconds") \
                from None
        if not duration > 0 or not start >= 0:
            raise ValueError(f"{cuts_name}:{n} (cut {cut_id!r}): start {start!r} and duration "
                             f"{duration!r} must be seconds, the duration positive")
        found = entries.get(cut_id, {})
        # The cut's data member, whatever its extension (SharWriter(format="original") names
        # it .original); FFmpeg tells the codec by its content.
        ext = next((e for e in found if e not in _NOT_AUDIO), None)
        if ext is None:
            why = "a cut without audio (.nodata)" if _PLACEHOLDER in found else \
                "no audio member (<cut_id>.flac, .wav, .opus, .mp3, ...)"
            if missing == "error":
                raise ValueError(f"{name}: {why}; missing=\"skip\" leaves such cuts out")
            skipped.append(f"{name}: {why}")
            continue
        offset, size = found[ext]
        refs.append((s, offset, size))
        t = None if text is False else cut_text(cut)
        clips.append(Clip(name, start, duration, None if t is None else as_text(t),
                          len(refs) - 1))  # the member just listed
    return clips


def _channels(lines):
    for _, cut in lines:
        ids = (cut.get("recording") or {}).get("channel_ids")
        if ids:
            return len(ids)
    return 1


def shar_members(source, text, missing, storage_options=None, cache_dir=None,
                 cache_budget=None):
    """The samples of a Lhotse Shar (module docstring). ``text``: False (no transcripts) or
    anything else (the supervisions'). ``missing``: "error" (a cut without its audio member is a
    ValueError naming ``recording.NNNNNN.tar:cut_id``) or "skip" (left out, listed in
    ``skipped``)."""
    module = audio_module()
    fields = shar_fields(source, storage_options)
    cuts_names, names = fields["cuts"], fields["recording"]
    remote = None
    if _remote_shards.is_remote(names + cuts_names):
        remote = _remote_shards.RemoteShards(names, storage_options=storage_options,
                                             cache_dir=cache_dir, cache_budget=cache_budget)
        local = remote._map(remote.fetch, range(len(names)))
        cut_bytes = remote._map(remote.read, cuts_names)
    else:
        local = [os.path.expanduser(p) for p in names]
        cut_bytes = []
        for p in cuts_names:
            with open(os.path.expanduser(p), "rb") as f:
                cut_bytes.append(f.read())
    refs, clips, skipped, channels = [], [], [], None
    for s, (cuts_name, data) in enumerate(zip(cuts_names, cut_bytes)):
        lines = _cut_lines(data, cuts_name)
        channels = channels or (_channels(lines) if lines else None)
        clips += _shard_clips(s, cuts_name, lines, names[s], _tar_entries(local[s], names[s]),
                              text, missing, refs, skipped)
    native = module.tar_members(list(local), refs) if remote is None else \
        module.remote_tar_members(remote.native, refs)
    block_shards = None if remote is None else [[s] for s in range(len(names))]
    return Members(clips, [], native, skipped, channels or 1, remote, block_shards)
