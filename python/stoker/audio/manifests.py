"""What an ``AudioDataset`` is made of: clips (a file, an offset and a duration in seconds) and
their transcripts, read from a folder or a list of files, a NeMo manifest or a Lhotse CutSet.

- Files: each a recording, its duration from its header (``probe``). A file whose header cannot
  be read is kept, with the longest readable file's duration (so that with ``on_error="skip"``
  any sample can stand in for it in its padded batch): reading it raises the decoder's error,
  which the loader names (or skips, with ``on_error="skip"``).
- NeMo JSON-lines manifests, as NeMo's ``AudioToCharDataset`` reads them: ``audio_filepath``
  (relative paths from the manifest's folder), ``duration``, ``offset`` (0 when absent), and the
  transcript under ``text`` (or the key given).
- Lhotse CutSets (``cuts.jsonl`` or ``.jsonl.gz``, each line a ``MonoCut`` with its recording and
  supervisions inline, as ``CutSet.to_file`` writes it): the cut's ``start`` and ``duration`` in
  its recording's one file (paths as Lhotse opens them: relative to the working directory); the
  transcript is its supervisions' texts, joined by spaces.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os

from .files import audio_module

AUDIO_EXTENSIONS = (".wav", ".flac", ".mp3", ".opus", ".ogg", ".oga", ".m4a", ".aac", ".webm")


@dataclasses.dataclass(frozen=True)
class Clip:
    """A sample: ``offset`` and ``duration`` seconds of the audio file ``path``, or (``member``
    >= 0) of that member of the source's AudioMembers (shards.py), which ``path`` then names."""
    path: str
    offset: float
    duration: float
    text: str | None = None
    member: int = -1


def _open_text(path):
    # Bytes that are not UTF-8 are kept as surrogate escapes (as os.fsdecode keeps them), so that
    # a path still opens, and a transcript that holds them is named by the sample when it is
    # tokenized (dataset.py) instead of failing the whole manifest without saying where.
    return gzip.open(path, "rt", encoding="utf-8", errors="surrogateescape") \
        if path.endswith(".gz") else open(path, encoding="utf-8", errors="surrogateescape")


def as_text(t):
    """A transcript as a str: bytes decoded as UTF-8, with invalid bytes kept as surrogate
    escapes (tokenizing them is an error naming the sample)."""
    return t.decode("utf-8", "surrogateescape") if isinstance(t, (bytes, bytearray)) else str(t)


def _json_lines(path, data=None):
    """(line number, object) of a JSON-lines file, or of its ``data`` (bytes read from a URL)."""
    if data is not None:
        raw = gzip.decompress(data) if path.endswith(".gz") else data
        f = io.StringIO(raw.decode("utf-8", errors="surrogateescape"))
    else:
        f = _open_text(path)
    with f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield n, json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not JSON ({e})") from None


def is_manifest(path):
    p = path.lower()
    return p.endswith((".jsonl", ".jsonl.gz", ".json", ".json.gz"))


def is_cutset(path, data=None):
    """A Lhotse CutSet rather than a NeMo manifest: its first line is a cut."""
    for _, row in _json_lines(path, data):
        return isinstance(row, dict) and "recording" in row and "start" in row
    return False


def file_clips(paths, sample_rate):
    """Each file a clip of its header's duration; (clips, paths whose header could not be
    read)."""
    module = audio_module()
    clips, unreadable = [], []
    for p in paths:
        try:
            duration = module.probe(p)["duration"]
        except Exception:  # noqa: BLE001 - the read names the error, or on_error skips it
            duration = 0.0
        if not duration > 0:
            unreadable.append(p)
        clips.append(Clip(p, 0.0, duration))
    longest = max((c.duration for c in clips), default=0.0) or 1.0 / sample_rate
    return [c if c.duration > 0 else Clip(c.path, 0.0, longest) for c in clips], unreadable


def first_channels(clips, unreadable):
    """The channels of the first clip whose file's header can be read (1 without one)."""
    bad = set(unreadable)
    for c in clips:
        if c.path not in bad:
            return audio_module().probe(c.path)["channels"]
    return 1


def folder_files(root):
    """The audio files under ``root``, sorted by path."""
    out = []
    for dirpath, dirs, names in os.walk(root, followlinks=True):
        dirs.sort()
        out += [os.path.join(dirpath, n) for n in sorted(names)
                if n.lower().endswith(AUDIO_EXTENSIONS)]
    if not out:
        raise FileNotFoundError(f"no audio file ({', '.join(AUDIO_EXTENSIONS)}) under {root}")
    return out


def is_url(path):
    """Whether ``path`` is a URL of the remote layer (s3://, gs://, az://, http(s)://, hf://)."""
    from .. import remote
    return isinstance(path, str) and remote.is_url(path)


def resolve(audio, manifest):
    """An audio path of a NeMo manifest at ``manifest`` (a path or URL): a URL or an absolute
    path as it is, a relative one from the manifest's directory."""
    if is_url(audio) or audio.startswith("/"):
        return audio
    if is_url(manifest):
        return manifest.rsplit("/", 1)[0] + "/" + audio
    audio = os.path.expanduser(audio)
    return audio if os.path.isabs(audio) else \
        os.path.join(os.path.dirname(os.path.abspath(manifest)), audio)


def nemo_clips(path, text_key, data=None):
    """The clips of a NeMo manifest (or of its ``data``, read from a URL); its durations are
    trusted (a clip that decodes shorter fails when read, by AudioDataset's duration_tolerance).
    A row without one: its file's header, where the file is local (a remote file's is read when
    the dataset fetches it: its duration is 0 here)."""
    module = None
    clips = []
    for n, row in _json_lines(path, data):
        if "audio_filepath" not in row:
            raise ValueError(f"{path}:{n}: a NeMo manifest line needs audio_filepath")
        audio = resolve(row["audio_filepath"], path)
        duration = row.get("duration")
        if duration is None and is_url(audio):
            clips.append(Clip(audio, float(row.get("offset") or 0.0), 0.0,
                              None if row.get(text_key) is None else as_text(row[text_key])))
            continue
        if duration is None:  # not in the manifest: the header's
            module = module or audio_module()
            duration = module.probe(audio)["duration"]
        offset = float(row.get("offset") or 0.0)
        if not float(duration) > 0 or offset < 0:
            raise ValueError(f"{path}:{n}: {audio}: duration {duration!r} and offset {offset!r} "
                             f"must be positive seconds")
        text = row.get(text_key)
        clips.append(Clip(audio, offset, float(duration), None if text is None else as_text(text)))
    return clips


def lhotse_clips(path, data=None):
    """The cuts of a Lhotse CutSet manifest (or of its ``data``, read from a URL)."""
    clips = []
    for n, cut in _json_lines(path, data):
        where = f"{path}:{n} (cut {cut.get('id')!r})"
        check_cut_type(cut, where)
        rec = cut.get("recording")
        if not rec:
            raise ValueError(f"{where}: no recording inline (a CutSet of cuts with their "
                             f"recordings, as CutSet.to_file writes it)")
        sources = rec.get("sources") or []
        if len(sources) != 1 or sources[0].get("type") != "file":
            raise ValueError(f"{where}: its recording's audio is not one file (sources of type "
                             f"{[s.get('type') for s in sources]}); only type 'file' is read "
                             f"for now")
        channels = rec.get("channel_ids") or sources[0].get("channels") or [0]
        if cut.get("type", "MonoCut") == "MonoCut" and len(channels) > 1:
            raise ValueError(f"{where}: a MonoCut of channel {cut.get('channel')} of a "
                             f"{len(channels)}-channel recording; one channel of several is not "
                             f"read yet")
        source = sources[0]["source"]  # as Lhotse opens it: a URL, else from the current dir
        clips.append(Clip(source if is_url(source) else os.path.expanduser(source),
                          float(cut["start"]), float(cut["duration"]), cut_text(cut)))
    return clips


def check_cut_type(cut, where):
    """A ValueError naming ``where`` unless ``cut`` is a MonoCut or a MultiCut."""
    kind = cut.get("type", "MonoCut") if isinstance(cut, dict) else type(cut).__name__
    if kind not in ("MonoCut", "MultiCut"):
        raise ValueError(f"{where}: a {kind}: only MonoCut and MultiCut are read for now")


def cut_text(cut):
    """A cut's transcript: its supervisions' texts joined by spaces (None without any)."""
    texts = [s["text"] for s in cut.get("supervisions") or () if s.get("text")]
    return " ".join(texts) if texts else None
