"""``AudioDataset``: recordings and cuts decoded, resampled and featurized on C++ worker threads.

The engine's source is ``stoker._audio.AudioSource`` (include/stoker/audio/audio_source.h): its
fields are the audio (or the features), ragged, and each clip's index, by which a batch looks its
transcript up here (strings stay in Python in this phase, as TableDataset's text columns do).
"""

from __future__ import annotations

import glob
import itertools
import math
import os

import numpy as np

from ..errors import DecodeError
from ..sources.base import StokerDataset, figure
from ..sources.samples import read_sample
from ..sources import remote as _remote_shards
from ..sources._checks import check_index
from . import manifests, remote_files, shar, shards
from .features import Fbank, LogMel, SpecAugment
from .files import audio_module

_ADVICE = {
    "decode": "store the audio in a cheaper codec (FLAC or WAV decode several times faster than "
              "MP3 or Opus), or give the loader more cores",
    "resample": "store the audio at the model's rate (sample_rate=) so that no resampling is "
                "needed, or give the loader more cores",
    "features": "compute fewer features (fewer mel bins, a longer frame shift), or give the "
                "loader more cores",
}


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return value


class AudioDataset(StokerDataset):
    """Speech and sound decoded, resampled and featurized natively (FFmpeg, C++ threads).

    ``source``: a folder of audio files (``.wav``, ``.flac``, ``.mp3``, ``.opus``, ``.ogg``, ...,
    found recursively and sorted), a glob, a list of files, a NeMo JSON-lines manifest
    (``audio_filepath``, ``duration``, ``offset``, ``text``), a Lhotse CutSet manifest
    (``cuts.jsonl.gz``, recordings and supervisions inline) or a Lhotse Shar (a directory of
    ``cuts.NNNNNN.jsonl.gz`` and ``recording.NNNNNN.tar``, or ``{"cuts": [...], "recording":
    [...]}`` as ``CutSet.from_shar(fields=...)`` takes it; shar.py). A sample is a recording (a
    file) or a cut (an offset and a duration in one): a cut seeks and decodes only its slice.

    A batch is a dict: ``audio`` float32 ``[B, T]`` (``[B, T, channels]`` with ``mono=False``)
    padded with zeros, and ``audio_lens`` (int64 samples at ``sample_rate``); or, with
    ``features=stoker.audio.Fbank(...)`` or ``LogMel(...)``, ``features`` ``[B, frames, bins]``
    and ``features_lens``; and ``text``, a list of the transcripts (raw strings; None where a
    sample has none), where there are transcripts.

    ``text``: None: the manifest's transcripts, if it has any (a NeMo line's ``text``, a cut's
    supervisions' texts); a string: the NeMo key that holds them; a list: one transcript per
    file (files only); False: none. ``max_duration``: the longest sample in seconds (longer ones
    are cut to their first ``max_duration`` seconds; None: the longest there is).
    ``duration_tolerance``: how many seconds short of its stated duration (a manifest's or a
    header's) a sample may decode before it is a ``DecodeError`` (within it, it is padded with
    zeros). Durations come from the manifest or the files' headers, never from decoding, so that
    ``Budget(seconds=...)`` plans an epoch without reading one.

    ``augment``: ``stoker.audio.SpecAugment(...)``, masks on the features (needs ``features``),
    drawn per sample from the loader's seed, the epoch and the sample's index. ``speed``:
    factors (``(0.9, 1.0, 1.1)``), one drawn per sample and epoch the same way; the audio is
    resampled as sox's ``speed`` and Lhotse's ``PerturbSpeed`` do (a factor of 1.1 is 1/1.1 as
    long, its pitch 1.1 times higher), before the features and their masks.

    Audio inside other files, decoded from memory (shards.py): WebDataset tar shards
    (``"shards/{000..009}.tar"``, a list of ``.tar`` paths, or URLs of object storage with
    ``storage_options``, ``cache_dir``, ``cache_budget`` as TarShards takes them): a sample is a
    key with an audio member (``.flac``, ``.wav``, ``.mp3``, ``.opus``, ``.ogg``, ``.m4a``; the
    first found), its transcript the key's ``.txt``, else ``text`` (default "text") of its
    ``.json``; and Hugging Face audio tables (Parquet or Arrow files, or a ``pyarrow.Table``)
    with an ``Audio()`` column named ``audio`` (``{"bytes", "path"}`` structs) and transcripts
    in the column ``text`` (default "text" where there is one). ``missing``: "error" (a key
    without audio, a row without bytes, is a ValueError naming it) or "skip" (left out, counted
    in ``stats()["skipped_keys"]``). Durations come from each member's header, probed once when
    the dataset is made. ``path(i)`` is ``shard.tar:key`` or ``file.parquet:row``.

    ``tokenizer``: a ``stoker.Tokenizer``; every transcript is encoded once, when the dataset is
    made (``add_special_tokens`` as ``Tokenizer.encode``'s), and a batch gets ``labels`` (int64
    ``[B, L]``, each sample's ids then -100 to the batch's longest) and ``labels_lens`` (int64
    ``[B]``), besides ``text``.
    """

    _extra = "audio"

    def __init__(self, source, sample_rate=16000, mono=True, features=None, text=None,
                 max_duration=None, *, duration_tolerance=0.1, augment=None, speed=None,
                 tokenizer=None, add_special_tokens=False, audio="audio", missing="error",
                 storage_options=None, cache_dir=None, cache_budget=None):
        module = audio_module()
        if missing not in ("error", "skip"):
            raise ValueError(f'missing is "error" or "skip", got {missing!r}')
        if not isinstance(audio, str):
            raise ValueError(f"audio names the table's Audio() column, got {audio!r}")
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, int) or sample_rate <= 0:
            raise ValueError(f"sample_rate must be a positive integer, got {sample_rate!r}")
        if features is not None and not isinstance(features, (Fbank, LogMel)):
            raise ValueError(f"features must be stoker.audio.Fbank(...) or LogMel(...), got "
                             f"{features!r}")
        if features is not None and not mono:
            raise ValueError("features are computed from mono audio: pass mono=True")
        if augment is not None and not isinstance(augment, SpecAugment):
            raise ValueError(f"augment must be stoker.audio.SpecAugment(...), got {augment!r}")
        if augment is not None and features is None:
            raise ValueError("augment=SpecAugment(...) masks features: pass features=Fbank() or "
                             "LogMel() too")
        if max_duration is not None:
            _positive("max_duration", max_duration)
        speeds = _speeds(speed)
        tolerance = duration_tolerance
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or \
                not tolerance >= 0:
            raise ValueError(f"duration_tolerance must be seconds >= 0, got {tolerance!r}")
        self.sample_rate, self.mono, self.features = sample_rate, bool(mono), features
        self.duration_tolerance = float(duration_tolerance)
        self.augment, self.speed = augment, speeds
        self._spec = (source, text, max_duration)
        self._inside = dict(audio=audio, missing=missing, storage_options=storage_options,
                            cache_dir=cache_dir, cache_budget=cache_budget)
        self._members, self.skipped, self._member_channels = None, None, 1
        inside = self._inside_clips(source, text, audio, missing, storage_options, cache_dir,
                                    cache_budget)
        if inside is None:
            clips, unreadable = self._clips(source, text, storage_options)
            if any(manifests.is_url(c.path) for c in clips):  # files on object storage
                inside = remote_files.remote_members(clips, sample_rate, storage_options,
                                                     cache_dir, cache_budget)
                inside.unreadable += unreadable
            else:
                self.clips, self.unreadable = clips, unreadable
        if inside is not None:
            self.clips, self.unreadable = inside.clips, inside.unreadable
            self._members, self.skipped = inside.native, inside.skipped
            self._member_channels = inside.channels
            self._remote, self._block_shards = inside.remote, inside.block_shards
        if not self.clips:
            raise ValueError(f"no audio in {source!r}")
        self.texts = [c.text for c in self.clips] if any(
            c.text is not None for c in self.clips) and text is not False else None
        durations = np.array([c.duration for c in self.clips], dtype=np.float64)
        self.max_duration = float(max_duration) if max_duration is not None else \
            float(durations.max())
        self.durations = np.minimum(durations, self.max_duration)
        self.channels = 1 if self.mono else self._channels()
        self.tokenizer, self.add_special_tokens = tokenizer, bool(add_special_tokens)
        self._labels = None if tokenizer is None else tokenizer if isinstance(
            tokenizer, _TokenIds) else _token_ids(tokenizer, self.clips, self.texts,
                                                  self.add_special_tokens)
        ids, offsets = (None, None) if self._labels is None else \
            (self._labels.ids, self._labels.offsets)
        options = None if features is None else features._options(sample_rate)
        self._source = module.AudioSource(
            [(c.path, c.offset, c.duration, c.member) for c in self.clips], sample_rate, self.mono,
            self.channels, self.max_duration, self.duration_tolerance, options,
            None if augment is None else augment._options(), list(speeds or ()), ids, offsets,
            self._members)
        self._key = "audio" if features is None else "features"

    def _clips(self, source, text, storage_options):
        if isinstance(source, str) and manifests.is_url(source) and manifests.is_manifest(source):
            if isinstance(text, (list, tuple)):
                raise ValueError("text= as a list is for files; a manifest has its own")
            return remote_files.read_manifest(source, text, storage_options), []
        if _remote_shards.is_remote(source):  # URLs of files, or patterns of them
            clips, unreadable = remote_files.url_clips(source, storage_options), []
        else:
            if isinstance(source, (str, os.PathLike)):
                path = os.path.expanduser(os.fspath(source))
                if os.path.isfile(path) and manifests.is_manifest(path):
                    if isinstance(text, (list, tuple)):
                        raise ValueError("text= as a list is for files; a manifest has its own")
                    if manifests.is_cutset(path):
                        return manifests.lhotse_clips(path), []
                    key = text if isinstance(text, str) else "text"
                    return manifests.nemo_clips(path, key), []
                if os.path.isdir(path):
                    paths = manifests.folder_files(path)
                elif os.path.isfile(path):
                    paths = [path]
                else:
                    paths = sorted(glob.glob(path, recursive=True))
                    if not paths:
                        raise FileNotFoundError(f"no audio file at {path}")
            else:
                paths = [os.path.expanduser(os.fspath(p)) for p in source]
            clips, unreadable = manifests.file_clips(paths, self.sample_rate)
        if isinstance(text, (list, tuple)):
            if len(text) != len(clips):
                raise ValueError(f"text= has {len(text)} transcripts for {len(clips)} files")
            clips = [manifests.Clip(c.path, c.offset, c.duration,
                                    None if t is None else manifests.as_text(t))
                     for c, t in zip(clips, text)]  # None: a file without a transcript
        elif isinstance(text, str):
            raise ValueError("text= as a key names a NeMo manifest's field; for files pass a "
                             "list of transcripts")
        return clips, unreadable

    def _inside_clips(self, source, text, audio, missing, storage_options, cache_dir,
                      cache_budget):
        """The samples of a Lhotse Shar (shar.py), of tar shards or of a table (shards.py), else
        None."""
        if shar.is_shar(source, storage_options):
            if isinstance(text, (list, tuple)):
                raise ValueError("text= as a list is for files; a Lhotse Shar has its own "
                                 "transcripts (its supervisions')")
            return shar.shar_members(source, text, missing, storage_options, cache_dir,
                                     cache_budget)
        if shards.is_table(source) or shards.is_tar(source):
            if isinstance(text, (list, tuple)):
                raise ValueError("text= as a list is for files; tar shards and tables have their "
                                 "own transcripts (text= names the .json key or the column)")
        if shards.is_table(source):
            return shards.table_members(source, audio, text, missing, self.sample_rate,
                                        storage_options)
        if shards.is_tar(source):
            return shards.tar_members(source, text, missing, self.sample_rate, storage_options,
                                      cache_dir, cache_budget)
        return None

    def _channels(self):
        if self._members is not None:
            if self._member_channels is None:  # remote files, none fetched: the first one's
                first = next(c.path for c in self.clips if c.member == 0)
                info = self._members.probe([first], 1)[0]
                return info["channels"] if isinstance(info, dict) else 1
            return self._member_channels
        return manifests.first_channels(self.clips, self.unreadable)

    def __len__(self):
        return len(self.clips)

    def path(self, index):
        """The file of sample ``index`` (``shard.tar:key``, ``file.parquet:row`` for a member)."""
        return self.clips[check_index(index, len(self))].path

    def __getitem__(self, index):
        """Sample ``index`` as a dict of NumPy arrays (``audio`` or ``features``, its
        ``..._lens``) and its ``text`` where there are transcripts."""
        i = check_index(index, len(self))
        fields = read_sample(self._source, i)
        data = fields[0]
        named = dict(zip(self._source.field_names, fields))
        if self.speed is not None:  # the speed drawn with seed 0, epoch 0; rows past it are 0
            data = data[:int(named["perturbed_length"])]
        out = {self._key: data, f"{self._key}_lens": len(data)}
        if self.texts is not None:
            out["text"] = self.texts[i]
        if self._labels is not None:
            out["labels"] = named["labels"][:int(named["labels_lens"])]
            out["labels_lens"] = len(out["labels"])
        return out

    def _assemble_batch(self, fields):
        f = dict(zip((*self._source.field_names, "lengths"), fields))
        data, index = f[self._key], f["index"]
        # With speeds, the engine's lengths are the bound (the slowest speed's): the source
        # writes each sample's own.
        lengths = f.get("perturbed_length", f["lengths"])
        out = {self._key: data, f"{self._key}_lens": lengths}
        if self.texts is not None:
            out["text"] = [self.texts[i] for i in index.tolist()]  # NumPy or torch, any device
        if self._labels is not None:
            # The source pads every row to the longest transcript's ids; the batch keeps its own
            # longest (a view).
            out["labels"] = f["labels"][:, :max(int(f["labels_lens"].max()), 1)]
            out["labels_lens"] = f["labels_lens"]
        return out

    def _batch_names(self):
        return ()  # batches are dicts already

    def _lengths(self, unit):
        """Seconds: each sample's duration from its manifest or header (cut to
        max_duration); with ``speed``, divided by the slowest factor: the longest the sample
        can come out, so that a batch planned by them never exceeds its budget."""
        if unit != "seconds":
            return super()._lengths(unit)
        return self.durations / min(self.speed) if self.speed else self.durations.copy()

    def stats(self):
        """Counts since the dataset was made, over every loader that read it: clips, seconds
        (of audio delivered), decoded_seconds (of audio decoded: a cut decodes its slice and a
        short pre-roll, not its whole file), decode_seconds, resample_seconds and
        features_seconds (worker time in each stage); for tar shards and tables, skipped_keys
        (keys or rows left out by missing="skip")."""
        s = self._source.stats()
        if self.skipped is not None:
            s["skipped_keys"] = len(self.skipped)
        return s

    def _stats(self):
        return {**super()._stats(), "audio": {**self.stats(), "resampler": module_resampler()}}

    def _counters(self):
        return self.stats()

    def _figures(self, before, after):
        d = {k: after[k] - before[k] for k in after}
        out = [figure(f"{stage} seconds", d[f"{stage}_seconds"], "s", stage=stage,
                      advice=_ADVICE[stage]) for stage in ("decode", "resample", "features")
               if stage != "features" or self.features is not None]
        out.append(figure("audio delivered", d["seconds"], "s"))
        out.append(figure("audio decoded per second delivered",
                          d["decoded_seconds"] / d["seconds"] if d["seconds"] else 0.0, ""))
        return out

    def _identity(self):
        return [(c.path, c.offset, c.duration) for c in self.clips]

    def _where(self):
        return f"{len(self)} clips, {float(self.durations.sum()):.1f} s of audio"

    def __reduce__(self):
        source, text, max_duration = self._spec
        return _rebuild, (source, self.sample_rate, self.mono, self.features, text, max_duration,
                          self.duration_tolerance, self.augment, self.speed, self._labels,
                          self.add_special_tokens, self._inside)

    def __repr__(self):
        lines = [f"Dataset {type(self).__name__}", f"    Number of datapoints: {len(self)}",
                 f"    Audio: {float(self.durations.sum()):.1f} s at {self.sample_rate} Hz, " +
                 ("mono" if self.mono else f"{self.channels} channels")]
        if self.features is not None:
            lines.append(f"    Features: {self.features!r}")
        if self.augment is not None:
            lines.append(f"    Augment: {self.augment!r}")
        if self.speed is not None:
            lines.append(f"    Speed: {self.speed}")
        return "\n".join(lines)


def module_resampler():
    return audio_module().resampler()


def _rebuild(source, sample_rate, mono, features, text, max_duration, duration_tolerance,
             augment, speed, tokenizer, add_special_tokens, inside=None):
    return AudioDataset(source, sample_rate, mono, features, text, max_duration,
                        duration_tolerance=duration_tolerance, augment=augment, speed=speed,
                        tokenizer=tokenizer, add_special_tokens=add_special_tokens,
                        **(inside or {}))


def _token_ids(tokenizer, clips, texts, add_special_tokens):
    """Every transcript's ids, encoded once by the tokenizer's native batch encoder (on every
    core): int64 ids and offsets, sample i's ids at ids[offsets[i]:offsets[i + 1]]."""
    from ..text.tokenizer import Tokenizer
    if not isinstance(tokenizer, Tokenizer):
        raise ValueError(f"tokenizer must be a stoker.Tokenizer, got {type(tokenizer).__name__}")
    if texts is None:
        raise ValueError("tokenizer= tokenizes the transcripts, and this dataset has none (text= "
                         "gives them for files)")
    if None in texts:
        i = texts.index(None)
        raise ValueError(f"sample {i} ({clips[i].path}) has no transcript to tokenize")
    try:  # one check for all; the loop below only finds which one fails
        "\n".join(texts).encode("utf-8")
    except UnicodeEncodeError:
        for i, t in enumerate(texts):
            try:
                t.encode("utf-8")
            except UnicodeEncodeError as e:
                raise DecodeError(f"sample {i} ({clips[i].path}): its transcript is not valid "
                                  f"UTF-8 (at character {e.start}: {t!r})") from None
    encoded = tokenizer.encode_batch(texts, add_special_tokens)
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), np.int64, count=len(encoded)), out=offsets[1:])
    ids = np.fromiter(itertools.chain.from_iterable(encoded), np.int64, count=int(offsets[-1]))
    return _TokenIds(ids, offsets)


class _TokenIds:
    """Transcripts tokenized already: what a pickled AudioDataset carries in place of its
    tokenizer (a stoker.Tokenizer does not pickle), and passes back as ``tokenizer``."""

    def __init__(self, ids, offsets):
        self.ids, self.offsets = ids, offsets


def _speeds(speed):
    """``speed=`` as a tuple of positive factors, or None."""
    if speed is None:
        return None
    factors = (speed,) if isinstance(speed, (int, float)) else tuple(speed)
    if not factors or not all(isinstance(f, (int, float)) and not isinstance(f, bool) and
                              math.isfinite(f) and 0.1 <= f <= 10 for f in factors):
        raise ValueError(f"speed must be factors in [0.1, 10] (as (0.9, 1.0, 1.1)), got {speed!r}")
    return tuple(float(f) for f in factors)
