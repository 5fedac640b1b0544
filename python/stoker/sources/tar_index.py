"""A tar shard's sidecar index (``<shard>.idx.json``, written by ``stoker index``): its document,
and the per-shard samples of remote shards, read from it or made by indexing the shard. Image
(TarShards) and video (VideoDataset over tar shards) datasets share it."""

from __future__ import annotations

import json

from .. import _native
from . import remote as _remote_shards


def tar_index_document(size, members, media="images"):
    """A tar shard's sidecar index: its size and samples (image or video member, data offset,
    size, label); ``media`` says which (absent: images)."""
    doc = {"format": "stoker-tar-index", "version": 1, "size": size,
           "samples": [list(m) for m in members]}
    if media != "images":
        doc["media"] = media
    return doc


def is_tar_index(doc, media):
    """Whether ``doc`` is a tar index (tar_index_document) of ``media`` samples."""
    return doc is not None and doc.get("format") == "stoker-tar-index" and \
        doc.get("media", "images") == media


def remote_tar_index(remote, media="images"):
    """Per remote shard, its samples (``media``: images or videos): from its sidecar index, else
    from the cache's, else by downloading and indexing it (RemoteIndexWarning)."""
    from .. import remote as _store
    unindexed = []
    derived = "tar-index" if media == "images" else f"tar-{media}-index"

    def one(shard):
        url = remote.urls[shard]
        doc = remote.index_entry(shard)  # the directory's manifest (`stoker index`)
        if not is_tar_index(doc, media):
            try:
                doc = json.loads(remote.read(url + _remote_shards.INDEX_SUFFIX))
            except _store.RemoteNotFound:
                doc = remote.load_derived(shard, derived)
        if is_tar_index(doc, media) and doc.get("size") == remote.sizes[shard]:
            return [tuple(m) for m in doc["samples"]]
        unindexed.append(shard)
        members = _native.remote.index_tar(remote.fetch(shard), media)
        remote.save_derived(shard, derived,
                            tar_index_document(remote.sizes[shard], members, media))
        return members

    index = remote._map(one, range(len(remote.urls)))
    if unindexed:
        _remote_shards.warn_indexing("tar shards", len(unindexed), len(remote.urls),
                                     "stoker index " + remote.urls[0].rsplit("/", 1)[0] + "/*.tar")
    return index
