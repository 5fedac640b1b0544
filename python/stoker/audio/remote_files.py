"""AudioDataset's audio files on object storage (docs/audio.md, "Remote files"): URLs, a pattern
of them, or a NeMo or Lhotse manifest (local, or itself at a URL) whose audio paths are URLs.

Each file is one object of the remote layer's shard cache (sources/remote.py), fetched whole into
the node's cache when the loader first reads it, and decoded from memory as a tar shard's member
is (shards.py's AudioMembers: a member that is the whole object). Durations come from the
manifest, so that a dataset is made without fetching a file; files given without one (URLs, a
NeMo row without ``duration``) are fetched once when the dataset is made and their headers read
there, with a RemoteIndexWarning that names how many.
"""

from __future__ import annotations

import dataclasses
import warnings

from ..sources import remote as _remote_shards
from . import manifests
from .files import audio_module
from .shards import Members


def read_manifest(url, text, storage_options=None):
    """The clips of the NeMo or Lhotse manifest at ``url`` (its audio paths resolved from it)."""
    from .. import remote
    store = remote.Store.for_url(url, storage_options)
    data = bytes(store.read(url, 0, None))
    if manifests.is_cutset(url, data):
        return manifests.lhotse_clips(url, data)
    return manifests.nemo_clips(url, text if isinstance(text, str) else "text", data)


def url_clips(source, storage_options=None):
    """A clip per file of ``source`` (URLs or patterns of them), its duration to be read."""
    return [manifests.Clip(u, 0.0, 0.0) for u in
            _remote_shards.expand_shards(source, storage_options)]


def remote_members(clips, sample_rate, storage_options=None, cache_dir=None, cache_budget=None):
    """Members for the clips whose path is a URL (the others stay files): one member per distinct
    URL, the clips of a file pointing at it. A clip without a duration (0) gets its file's,
    fetched and probed here."""
    module = audio_module()
    urls = list(dict.fromkeys(c.path for c in clips if manifests.is_url(c.path)))
    remote = _remote_shards.RemoteShards(urls, storage_options=storage_options,
                                         cache_dir=cache_dir, cache_budget=cache_budget)
    member = {u: i for i, u in enumerate(urls)}
    native = module.remote_tar_members(remote.native,
                                       [(i, 0, size) for i, size in enumerate(remote.sizes)])
    unknown = sorted({member[c.path] for c in clips if c.path in member and not c.duration > 0})
    infos = {}
    if unknown:
        warnings.warn(f"{len(unknown)} of {len(urls)} remote audio files have no duration in a "
                      f"manifest: downloading them once to read their headers (kept in the "
                      f"cache). A NeMo manifest with durations, or a Lhotse CutSet, spares it",
                      _remote_shards.RemoteIndexWarning, stacklevel=4)
        paths = remote._map(remote.fetch, unknown)
        for i, path in zip(unknown, paths):
            try:
                infos[i] = module.probe(path)
            except Exception:  # noqa: BLE001 - the read names the error, or on_error skips it
                infos[i] = None
    unreadable = [urls[i] for i, info in infos.items() if not info or not info["duration"] > 0]
    known = [c.duration for c in clips if c.duration > 0] + [
        info["duration"] for info in infos.values() if info and info["duration"] > 0]
    longest = max(known, default=0.0) or 1.0 / sample_rate
    out = []
    for c in clips:
        if c.path not in member:
            out.append(c)
            continue
        i = member[c.path]
        duration = c.duration
        if not duration > 0:
            info = infos.get(i)
            duration = info["duration"] - c.offset if info and info["duration"] > 0 else longest
        out.append(dataclasses.replace(c, duration=duration, member=i))
    first = next((info for info in infos.values() if info), None)
    channels = first["channels"] if first else None
    return Members(out, unreadable, native, [], channels, remote, [[i] for i in range(len(urls))])
