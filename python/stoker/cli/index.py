"""``stoker index SHARD...``: the sidecar index of each shard, written beside it.

A remote dataset reads every shard's metadata at construction. Tar shards need the offsets of
their members, which only a pass over the whole shard finds (the index holds every key's members
by extension, for ``TarShards(fields=...)``, and the image or video + label samples where the
shard has them); token files split into documents at
``--eos`` need their document ends, likewise. ``stoker index`` makes that pass once and writes
``<shard>.idx.json`` beside the shard (a local file, or an object put next to a remote one), so
that a dataset over the shards downloads nothing at construction. Without an index a dataset
downloads and indexes the shard itself (RemoteIndexWarning) and keeps the index in its cache.

  stoker index shards/train-*.tar                   local shards (e.g. before uploading them)
  stoker index 's3://bucket/train-{0000..0127}.tar' remote ones: each is fetched, then indexed
  stoker index --eos 50256 's3://bucket/tok-*.bin'  token files: their documents at token 50256
  stoker index 'kinetics/train/*/*.mp4'             local videos: <video>.stoker-index, their
                                                    packet index, read by VideoDataset
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile


def index_video(path):
    """Writes ``<path>.stoker-index`` beside a local video (its packet index, src/ffmpeg); returns
    a line saying what it holds."""
    from ..sources.video import _video_module
    info = _video_module().write_index(path)
    return (f"{path}: {info['frames']} frames, {info['keyframes']} keyframes, "
            f"{info['codec']} {info['width']}x{info['height']} -> {path}.stoker-index")


def index_document(path, size, eos, dtype):
    """The sidecar of the local shard at ``path`` (``size`` bytes)."""
    from ..sources.tar_index import local_tar_index_document
    from ..sources.tokens import token_index_document
    if path.endswith(".tar"):
        return local_tar_index_document(path, size)
    return token_index_document(path, size, dtype, eos)


def main(argv=None):
    p = argparse.ArgumentParser(prog="stoker index", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shards", nargs="+", help="shard paths, URLs or patterns")
    p.add_argument("--eos", type=int, help="token files: the id that ends a document")
    p.add_argument("--dtype", default="uint16", choices=("uint16", "uint32"),
                   help="token files: their token type (default uint16)")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a storage option of the remote store (repeatable)")
    args = p.parse_args(argv)
    from .. import remote
    from ..sources.remote import INDEX_SUFFIX, MANIFEST_NAME
    from ..sources.video import VIDEO_EXTENSIONS
    options = dict(o.split("=", 1) for o in args.storage_option)
    manifests = {}  # directory -> {name: {"size", "etag", "index"}}
    try:
        shards = remote.expand(args.shards, options)
        for shard in shards:
            if not remote.is_url(shard) and shard.lower().endswith(VIDEO_EXTENSIONS):
                print(index_video(remote.local_path(shard)))  # a video: its own sidecar
                continue
            directory, _, name = shard.rpartition("/")
            if remote.is_url(shard):
                store = remote.Store.for_url(shard, options)
                info = store.head(shard)
                with tempfile.TemporaryDirectory(prefix="stoker-index-") as tmp:
                    local = remote.fetch_to_cache(shard, info, tmp, store=store).path
                    doc = index_document(local, info.size, args.eos, args.dtype)
                store.write(shard + INDEX_SUFFIX, json.dumps(doc).encode())
                etag = info.etag
            else:
                path = remote.local_path(shard)
                doc = index_document(path, os.path.getsize(path), args.eos, args.dtype)
                with open(path + INDEX_SUFFIX, "w", encoding="utf-8") as f:
                    json.dump(doc, f)
                etag = None  # a local file's ETag is the store's, once uploaded: sizes only
            manifests.setdefault(directory, {})[name] = {"size": doc["size"], "etag": etag,
                                                         "index": doc}
            if doc.get("media") == "keys":  # samples of other fields: TarShards(fields=...)
                print(f"{shard}{INDEX_SUFFIX}: {len(doc['keys'])} keys")
            else:
                print(f"{shard}{INDEX_SUFFIX}: {len(doc.get('samples', doc.get('ends', [])))} "
                      f"{'samples' if 'samples' in doc else 'documents'}")
        for directory, entries in manifests.items():
            _write_manifest(remote, directory + "/" + MANIFEST_NAME, entries, options)
            print(f"{directory}/{MANIFEST_NAME}: {len(entries)} shards")
    except (OSError, ValueError) as e:
        print(f"stoker index: error: {e}", file=sys.stderr)
        return 2
    return 0


def _write_manifest(remote, where, entries, options):
    """Merges ``entries`` into the manifest at ``where`` (a path or URL), creating it."""
    if remote.is_url(where):
        store = remote.Store.for_url(where, options)
        try:
            doc = json.loads(bytes(store.read(where)))
        except remote.RemoteNotFound:
            doc = {}
    else:
        where = remote.local_path(where)
        try:
            with open(where, encoding="utf-8") as f:
                doc = json.load(f)
        except FileNotFoundError:
            doc = {}
    shards = doc.get("shards", {}) if doc.get("format") == "stoker-index" else {}
    shards.update(entries)
    data = json.dumps({"format": "stoker-index", "version": 1, "shards": shards}).encode()
    if remote.is_url(where):
        store.write(where, data)
    else:
        with open(where, "wb") as f:
            f.write(data)
