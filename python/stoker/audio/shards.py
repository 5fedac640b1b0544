"""AudioDataset's sources whose audio lives inside other files, decoded from memory by the C++
source (include/stoker/audio/audio_members.h):

- WebDataset tar shards (paths, brace patterns, or URLs of object storage): a sample is a key with
  an audio member (the key's first member among ``AUDIO_MEMBERS``), its transcript the key's
  ``.txt`` member (UTF-8, surrounding whitespace stripped), else the value under ``text`` in its
  ``.json`` member. Indexed by the one tar indexer (TarShardSet, through
  ``_native.remote.index_tar_keys``). Each audio member's header (its duration, channels) and
  its key's .txt and .json members are what ``describe_shard`` finds, and what ``stoker index``
  stores in a shard's sidecar (``facts.audio``, sources/tar_index.py): a dataset over remote
  shards with sidecars is made from them without fetching a shard; a shard without one is
  fetched once into the node's cache and described there.
- Hugging Face audio tables (Parquet or Arrow files, or a ``pyarrow.Table``): a column of
  ``{"bytes", "path"}`` structs as ``datasets``' ``Audio()`` writes it (or a binary column), its
  bytes gathered once into one buffer with offsets, handed to C++: no Python per sample once
  made. A cell with a ``path`` alone is that file, read from disk (each Clip says which: a
  member, or a file).

Either way every member's header is probed at construction (on C++ threads, from the mapped
shard or the buffer), so that durations are known without decoding, as for files; a member whose
header cannot be read is kept with the longest readable duration and fails when read, a
DecodeError naming it (``shard.tar:key``, ``file.parquet:row``), which ``on_error="skip"`` counts.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from .. import _native
from ..sources import paths as _paths
from ..sources import remote as _remote_shards
from ..sources import tar_index as _tar_index
from . import manifests
from .files import audio_module
from .manifests import Clip, as_text

AUDIO_MEMBERS = ("flac", "wav", "mp3", "opus", "ogg", "m4a")
_TABLE_SUFFIXES = (".parquet", ".arrow")
_PROBE_THREADS = 8


@dataclasses.dataclass
class Members:
    """What a source of members makes: the clips (``path`` names each member), those whose
    header could not be read, the native AudioMembers, the keys or rows left out
    (missing="skip"), the first readable member's channels, and for remote shards their
    RemoteShards and the shards each block reads."""
    clips: list
    unreadable: list
    native: object
    skipped: list
    channels: int
    remote: object = None
    block_shards: list = None


def _items(source):
    return [source] if isinstance(source, (str, os.PathLike)) else \
        list(source) if isinstance(source, (list, tuple)) else None


def is_table(source):
    """Whether ``source`` is a pyarrow Table, or Parquet or Arrow files."""
    if type(source).__module__.startswith("pyarrow") and hasattr(source, "column_names"):
        return True
    items = _items(source)
    return bool(items) and all(isinstance(p, (str, os.PathLike)) and
                               os.fspath(p).lower().endswith(_TABLE_SUFFIXES) for p in items)


def is_tar(source):
    """Whether ``source`` names WebDataset tar shards: paths, patterns or URLs ending in .tar."""
    items = _items(source)
    return bool(items) and all(isinstance(p, (str, os.PathLike)) and
                               os.fspath(p).lower().endswith(".tar") for p in items)


def _probe(native, names, sample_rate):
    """Durations (the longest readable one where a header cannot be read), the names whose
    header cannot be read, and the first readable member's channels."""
    infos = native.probe(names, min(_PROBE_THREADS, os.cpu_count() or 1))
    durations, unreadable, channels = [], [], None
    for name, info in zip(names, infos):
        d = info["duration"] if isinstance(info, dict) else 0.0
        if not d > 0:
            unreadable.append(name)
        elif channels is None:
            channels = info["channels"]
        durations.append(d)
    longest = max(durations, default=0.0) or 1.0 / sample_rate
    return [d if d > 0 else longest for d in durations], unreadable, channels or 1


def _audio_member(members):
    """A key's audio member (its first among AUDIO_MEMBERS), or None."""
    return next((m for m in members if m[0] in AUDIO_MEMBERS), None)


def describe_shard(path, keys):
    """The audio facts of the local tar shard at ``path`` with ``keys`` (its sidecar's
    ``facts.audio``, sources/tar_index.py): for each key with an audio member, ``[duration
    (0: its header cannot be read), channels, its .txt member's text or None, its .json
    member's text or None]``. None where no key has an audio member or this build has no audio
    module."""
    found = [(k, m, _audio_member(m)) for k, m in keys]
    found = [(k, m, a) for k, m, a in found if a is not None]
    if not found:
        return None
    try:
        module = audio_module()
    except ImportError:
        return None
    members = module.tar_members([path], [(0, a[2], a[3]) for _, _, a in found])
    infos = members.probe([f"{path}:{k}" for k, _, _ in found],
                          min(_PROBE_THREADS, os.cpu_count() or 1))
    facts = {}
    with open(path, "rb") as f:
        def text_of(ms, ext):
            m = next((m for m in ms if m[0] == ext), None)
            if m is None:
                return None
            f.seek(m[2])
            return as_text(f.read(m[3]))

        for (k, ms, _), info in zip(found, infos):
            ok = isinstance(info, dict) and info["duration"] > 0
            facts[k] = [info["duration"] if ok else 0.0, info["channels"] if ok else 0,
                        text_of(ms, "txt"), text_of(ms, "json")]
    return facts


_tar_index.register_facts("audio", describe_shard)


def _transcript(txt, js, key, name):
    """A key's transcript: its .txt member, else ``key`` of its .json object; None without."""
    if txt is not None:
        return txt.strip()
    if js is not None:
        try:
            doc = json.loads(js)
        except ValueError as e:
            raise ValueError(f"{name}: its .json member does not parse ({e})") from None
        value = doc.get(key) if isinstance(doc, dict) else None
        return None if value is None else as_text(value)
    return None


def tar_members(source, text, missing, sample_rate, storage_options=None, cache_dir=None,
                cache_budget=None):
    """The samples of WebDataset tar shards (module docstring). ``text``: None or a str (the
    .json key, "text" by default), or False (no transcripts). ``missing``: "error" (a key without
    an audio member is a ValueError naming ``shard.tar:key``) or "skip" (left out, listed in
    ``skipped``)."""
    module = audio_module()
    remote = None
    if _remote_shards.is_remote(source):
        names = _remote_shards.expand_shards(source, storage_options)
        remote = _remote_shards.RemoteShards(names, storage_options=storage_options,
                                             cache_dir=cache_dir, cache_budget=cache_budget)
        shard_keys, facts = [], []
        for s, doc in enumerate(_tar_index.remote_tar_documents(remote)):
            shard_keys.append(_tar_index.document_keys(doc))
            known = doc.get("facts", {}).get("audio")
            # A sidecar written without the audio facts (before them, or without the audio
            # module): the shard is fetched and described here.
            facts.append(known if known is not None or not any(
                _audio_member(m) for _, m in shard_keys[-1]) else
                describe_shard(remote.fetch(s), shard_keys[-1]))
    else:
        names = _paths.expand(source, "tar shard", (".tar",))
        shard_keys = [_native.remote.index_tar_keys(p) for p in names]
        facts = [describe_shard(p, k) for p, k in zip(names, shard_keys)]
    key = text if isinstance(text, str) else "text"
    refs, clips, unreadable, skipped, channels = [], [], [], [], None
    for s, keys in enumerate(shard_keys):
        for k, members in keys:
            name = f"{names[s]}:{k}"
            audio = _audio_member(members)
            if audio is None:
                if missing == "error":
                    raise ValueError(
                        f"{name}: no audio member ({', '.join('.' + e for e in AUDIO_MEMBERS)}"
                        f"); missing=\"skip\" leaves such keys out")
                skipped.append(f"{name}: no audio member")
                continue
            duration, ch, txt, js = facts[s][k]
            if not duration > 0:
                unreadable.append(name)
            elif channels is None:
                channels = ch
            clips.append(Clip(name, 0.0, duration,
                              None if text is False else _transcript(txt, js, key, name),
                              len(refs)))
            refs.append((s, audio[2], audio[3]))
    longest = max((c.duration for c in clips), default=0.0) or 1.0 / sample_rate
    clips = [c if c.duration > 0 else dataclasses.replace(c, duration=longest) for c in clips]
    native = module.tar_members(list(names), refs) if remote is None else \
        module.remote_tar_members(remote.native, refs)
    block_shards = None if remote is None else [[s] for s in range(len(names))]
    return Members(clips, unreadable, native, skipped, channels or 1, remote, block_shards)


def _read_tables(source, storage_options=None):
    """(pyarrow Table, name of each row's file) of a Table or of Parquet/Arrow files, local or at
    URLs (each read whole into memory: the audio's bytes are gathered into one buffer anyway)."""
    import pyarrow as pa
    if isinstance(source, pa.Table):
        return source, ["table"] * source.num_rows
    if _remote_shards.is_remote(source):
        from .. import remote
        paths = _remote_shards.expand_shards(source, storage_options)

        def opened(url):
            store = remote.Store.for_url(url, storage_options)
            return pa.BufferReader(pa.py_buffer(bytes(store.read(url, 0, None))))
    else:
        paths = _paths.expand(source, "table file", _TABLE_SUFFIXES)

        def opened(path):
            return pa.memory_map(path)
    tables, files = [], []
    for path in paths:
        with opened(path) as f:
            if path.lower().endswith(".parquet"):
                import pyarrow.parquet as pq
                t = pq.read_table(f)
            else:  # datasets writes the streaming format; `save_to_disk` and others the file one
                try:
                    t = pa.ipc.open_file(f).read_all()
                except pa.ArrowInvalid:
                    f.seek(0)
                    t = pa.ipc.open_stream(f).read_all()
        tables.append(t)
        files.append((path, t.num_rows))
    table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
    return table, [p for p, n in files for _ in range(n)]


def table_members(source, audio, text, missing, sample_rate, storage_options=None):
    """The samples of a Hugging Face audio table (module docstring): the audio in column
    ``audio``, the transcripts in column ``text`` (None: "text" where the table has it; False:
    none). A cell without bytes whose ``path`` is set is that file, opened as ``datasets``'
    ``Audio()`` opens it (the path as written: a relative one from the current directory), read
    from disk like the files of a folder; the cells with bytes are gathered into one buffer.
    ``missing``: "error" (a row with no audio, neither bytes nor an existing file, is a ValueError
    naming it) or "skip" (left out, listed in ``skipped``)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    table, row_files = _read_tables(source, storage_options)
    if audio not in table.column_names:
        raise ValueError(f"no column {audio!r} in the table (columns: {table.column_names}); "
                         f"pass audio= the Audio() column's name")
    col = table.column(audio)
    paths = None
    if pa.types.is_struct(col.type):
        field = col.type.get_field_index("bytes")
        if field < 0:
            raise ValueError(f"column {audio!r} is a struct without a 'bytes' field: not an "
                             f"Audio() column of encoded audio")
        data = pc.struct_field(col, [field])
        if col.type.get_field_index("path") >= 0:
            paths = pc.struct_field(col, [col.type.get_field_index("path")]).to_pylist()
    elif pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        data = col
    else:
        raise ValueError(f"column {audio!r} is {col.type}: an Audio() column is a struct of "
                         f"{{bytes, path}} (or binary)")
    data = data.cast(pa.large_binary())
    data = data.combine_chunks() if isinstance(data, pa.ChunkedArray) else data
    names = [f"{f}:{r}" for f, r in zip(row_files, _row_numbers(row_files))]
    has_bytes = data.is_valid().to_numpy(zero_copy_only=False)
    # Each row: its member in the buffer (bytes), its file (a path alone), or neither.
    files, skipped = {}, []
    for r in np.flatnonzero(~has_bytes).tolist():
        path = None if paths is None or paths[r] is None else os.path.expanduser(paths[r])
        if path is not None and os.path.isfile(path):
            files[r] = path
            continue
        why = "no audio bytes" + ("" if path is None else f", and no file at {paths[r]!r}")
        if missing == "error":
            raise ValueError(f"{names[r]}: {why} in column {audio!r}; missing=\"skip\" leaves "
                             f"such rows out")
        skipped.append(f"{names[r]}: {why}")
    rows = [r for r in range(len(data)) if has_bytes[r] or r in files]
    texts = [None] * len(rows)
    column = text if isinstance(text, str) else "text" if text is None else None
    if column is not None:
        if column in table.column_names:
            values = table.column(column).to_pylist()
            texts = [None if values[i] is None else as_text(values[i]) for i in rows]
        elif text is not None:
            raise ValueError(f"no column {column!r} in the table (columns: "
                             f"{table.column_names})")
    in_buffer = np.flatnonzero(has_bytes)
    data = data.take(pa.array(in_buffer))
    bufs = data.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64)[data.offset:data.offset + len(data) + 1]
    payload = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else \
        np.zeros(0, np.uint8)
    payload = np.ascontiguousarray(payload[offsets[0]:offsets[-1]])
    offsets = np.ascontiguousarray(offsets - offsets[0])
    native = audio_module().buffer_members(payload, offsets)
    member_names = [names[i] for i in in_buffer.tolist()]
    durations, unreadable, channels = _probe(native, member_names, sample_rate)
    member_of = {r: m for m, r in enumerate(in_buffer.tolist())}
    by_row = {r: (names[r], durations[m], m) for r, m in member_of.items()}
    if files:
        file_clips, bad_files = manifests.file_clips(list(files.values()), sample_rate)
        unreadable += bad_files
        for r, c in zip(files, file_clips):
            by_row[r] = (c.path, c.duration, -1)
        if not member_of:
            channels = manifests.first_channels(file_clips, bad_files)
    clips = [Clip(by_row[r][0], 0.0, by_row[r][1], t, by_row[r][2])
             for r, t in zip(rows, texts)]
    return Members(clips, unreadable, native, skipped, channels)


def _row_numbers(row_files):
    """Each row's number within its file."""
    out, last, n = [], None, 0
    for f in row_files:
        n = n + 1 if f == last else 0
        last = f
        out.append(n)
    return out
