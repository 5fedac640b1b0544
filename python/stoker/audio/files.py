"""One audio file at a time, through the audio wing's extension ``stoker._audio`` (imported here,
on first use): ``probe`` (its header), ``load`` (a slice of it decoded and resampled)."""

from __future__ import annotations

import os


def audio_module():
    """``stoker._audio``, or an ImportError that says how to build it."""
    try:
        from .. import _audio
    except ImportError as e:
        raise ImportError(
            f"this stoker was built without its audio module ({e}): build it where FFmpeg's "
            f"development libraries are found by pkg-config (libavformat, libavcodec, "
            f"libswresample, libavutil; docs/audio.md)") from None
    return _audio


def ffmpeg_versions():
    """FFmpeg's libraries as the audio module links them."""
    return audio_module().ffmpeg_versions()


def resampler():
    """The resampler: ``"soxr"`` (libswresample's soxr engine) or ``"swr"`` (its own filter)."""
    return audio_module().resampler()


def _source(path):
    """A path, or encoded audio in memory (bytes-like: decoded from memory, probed by content)."""
    if isinstance(path, (bytes, bytearray, memoryview)):
        return bytes(path)
    return os.fspath(path)


def probe(path):
    """A file's ``duration`` (seconds), ``sample_rate``, ``channels`` and ``codec``, from its
    header and container, without decoding. ``path`` may be encoded audio's bytes."""
    return audio_module().probe(_source(path))


def load(path, offset=0.0, duration=None, sample_rate=16000, mono=True):
    """``duration`` seconds of ``path`` from ``offset`` (None: to the end) as float32 NumPy at
    ``sample_rate``: ``[T]`` mono (the channels averaged), else ``[T, channels]``. Seeks to the
    offset: a slice never decodes the whole file. ``path`` may be encoded audio's bytes (a tar
    member, a Parquet cell), decoded from memory to the same samples as the file."""
    return audio_module().decode(_source(path), float(offset), float(duration or 0.0),
                                 int(sample_rate), bool(mono))
