"""A tar shard's sidecar index (``<shard>.idx.json``, written by ``stoker index``): its document,
and the per-shard samples of remote shards, read from it or made by indexing the shard. Image
(TarShards) and video (VideoDataset over tar shards) datasets share it.

A modality whose samples need more than the members' places (a duration from a header, a
transcript) registers a describer (``register_facts``): ``stoker index`` and the indexing of a
remote shard without a sidecar then store what it returns under ``facts.<name>``, so that a
dataset over remote shards is made from their sidecars without fetching them."""

from __future__ import annotations

import json

from .. import _native
from . import remote as _remote_shards


# name -> describe(path, keys): what a modality stores of a local shard (JSON), or None where the
# shard holds none of its samples.
_FACTS = {}


def register_facts(name, describe):
    """Adds ``describe(path, keys)`` to every tar shard's sidecar: its value is
    ``doc["facts"][name]`` (omitted where it returns None)."""
    _FACTS[name] = describe


def tar_index_document(size, members, media="images", keys=None):
    """A tar shard's sidecar index: its size and samples (image or video member, data offset,
    size, label); ``media`` says which (absent: images; "keys": a shard of other samples, whose
    ``samples`` is empty). ``keys``: every key with its members, ``[key, [[ext, member, data
    offset, size], ...]]`` (what ``TarShards(fields=...)`` reads; an index written before it has
    none and is rebuilt for it)."""
    doc = {"format": "stoker-tar-index", "version": 1, "size": size,
           "samples": [list(m) for m in members]}
    if media != "images":
        doc["media"] = media
    if keys is not None:
        doc["keys"] = [[k, [list(m) for m in ms]] for k, ms in keys]
    return doc


def local_tar_index_document(path, size):
    """The sidecar of the local tar shard at ``path`` (``size`` bytes): its keys, its samples as
    an image (else video) + label shard where it is one, and the registered facts."""
    keys = _native.remote.index_tar_keys(path)
    doc = None
    for media in ("images", "videos"):
        try:
            doc = tar_index_document(size, _native.remote.index_tar(path, media), media, keys)
            break
        except ValueError as e:  # not a shard of (image or video, label) samples
            if "has no label" in str(e) or "invalid label" in str(e) or "has two" in str(e):
                break
    doc = doc or tar_index_document(size, [], "keys", keys)
    facts = {name: describe(path, keys) for name, describe in _FACTS.items()}
    if any(v is not None for v in facts.values()):
        doc["facts"] = {name: v for name, v in facts.items() if v is not None}
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


def _has_keys(doc, size):
    return doc is not None and doc.get("format") == "stoker-tar-index" and \
        doc.get("keys") is not None and doc.get("size") == size


def remote_tar_documents(remote):
    """Per remote shard, its sidecar document (tar_index_document, with ``keys``): from its
    sidecar index, else from the cache's, else by downloading and indexing it (with the
    registered facts; RemoteIndexWarning)."""
    from .. import remote as _store
    unindexed = []

    def one(shard):
        url, size = remote.urls[shard], remote.sizes[shard]
        doc = remote.index_entry(shard)  # the directory's manifest (`stoker index`)
        if not _has_keys(doc, size):
            try:
                doc = json.loads(remote.read(url + _remote_shards.INDEX_SUFFIX))
            except _store.RemoteNotFound:
                doc = None
        if not _has_keys(doc, size):
            doc = remote.load_derived(shard, "tar-keys-index")
        if _has_keys(doc, size):
            return doc
        unindexed.append(shard)
        doc = local_tar_index_document(remote.fetch(shard), size)
        remote.save_derived(shard, "tar-keys-index", doc)
        return doc

    docs = remote._map(one, range(len(remote.urls)))
    if unindexed:
        _remote_shards.warn_indexing("tar shards", len(unindexed), len(remote.urls),
                                     "stoker index " + remote.urls[0].rsplit("/", 1)[0] + "/*.tar")
    return docs


def document_keys(doc):
    """A sidecar document's keys with their members: ``[(key, [(ext, member, offset, size)])]``."""
    return [(k, [tuple(m) for m in ms]) for k, ms in doc["keys"]]


def remote_tar_keys(remote):
    """Per remote shard, its keys with their members (``[(key, [(ext, member, offset, size)])]``),
    from remote_tar_documents."""
    return [document_keys(doc) for doc in remote_tar_documents(remote)]
