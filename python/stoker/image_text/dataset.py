"""``TarShards(paths, fields={...})``: what it makes, a TarShards whose samples and batches are
dicts of the fields (stoker/image_text/fields.py), read by the C++ ImageTextSource over the same
tar index as the image+label TarShards (include/stoker/image_text/image_text_source.h).

It is a TarShards (``isinstance`` holds; ranks, shuffling, resume and ``on_error`` are the
loader's, as for every native source): the one class for WebDataset shards, this subclass holding
what differs when a sample is a dict."""

from __future__ import annotations

import functools

import numpy as np

from ..sources import paths as _paths
from ..sources import remote as _remote_shards
from ..sources._checks import DEFAULT_MAX_PIXELS, check_index, check_max_pixels
from ..sources.images import TarShards
from ..sources.samples import read_sample
from ..sources import tar_index as _tar_index
from ..sources.tar_index import document_keys, remote_tar_documents
from .fields import SPECS, Image, Text


def _image_text_module():
    from ..text.tokenizer import _text_module
    return _text_module().image_text


_IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")


def describe_images(path, keys):
    """The image facts of the local tar shard at ``path`` with ``keys`` (its sidecar's
    ``facts.image``, sources/tar_index.py): ``[[data offset, height, width], ...]`` of its image
    members, read from their headers ((0, 0) where a header cannot be read), what a remote
    dataset in aspect-ratio buckets plans by. None where it has no image member or this build
    has no text wing."""
    members = [(m[2], m[3]) for _, ms in keys for m in ms if m[0] in _IMAGE_EXTS]
    if not members:
        return None
    try:
        module = _image_text_module()
    except ImportError:
        return None
    sizes = module.member_image_sizes(path, members)
    return sorted([offset, h, w] for (offset, _), (h, w) in zip(members, sizes))


_tar_index.register_facts("image", describe_images)


def _image_sizes(doc, url):
    """A remote shard's image members as (data offset, height, width), from its sidecar."""
    facts = (doc.get("facts") or {}).get("image")
    if facts is None:
        raise ValueError(f"{url}: its index has no image sizes, which aspect-ratio buckets are "
                         f"planned by; index the shards again (stoker index)")
    return [tuple(int(v) for v in f) for f in facts]


class ImageTextShards(TarShards):
    """WebDataset shards read as dicts of ``fields`` (``TarShards(paths, fields=...)`` makes
    one; its docstring and docs/image-text.md say what each field is).

    ``missing``: "error" (a key that lacks a field's member fails at construction, naming the
    shard, the key and the extension) or "skip" (such a key is not a sample: ``len()`` leaves it
    out, ``stats()["skipped_keys"]`` counts it). Decided when the shards are indexed."""

    def __init__(self, paths, transform=None, max_pixels=DEFAULT_MAX_PIXELS, decode="cpu", *,
                 storage_options=None, cache_dir=None, cache_budget=None, fields=None,
                 missing="error"):
        if transform is not None:
            raise ValueError("TarShards(fields=...): each Image field takes its own transform "
                             "(stoker.image_text.Image(transform)); pass no transform=")
        if decode != "cpu":
            raise ValueError('TarShards(fields=...) decodes on the CPU (decode="cpu")')
        if missing not in ("error", "skip"):
            raise ValueError(f'missing is "error" or "skip", got {missing!r}')
        if not isinstance(fields, dict) or not fields:
            raise ValueError("fields is a dict of batch key -> field spec "
                             "(stoker.image_text.Image, Text, Json, Label, Npy)")
        for name, spec in fields.items():
            if not isinstance(name, str) or not isinstance(spec, SPECS):
                raise ValueError(f"fields[{name!r}] is {spec!r}: a field is one of "
                                 f"stoker.image_text.Image, Text, Json, Label, Npy")
        self.fields = dict(fields)
        self.missing = missing
        self.max_pixels = check_max_pixels(max_pixels)
        self.transform = None
        self.decode = decode
        self._remote_options = (storage_options, cache_dir, cache_budget)
        native = [spec._native(name, self.max_pixels) for name, spec in self.fields.items()]
        module = _image_text_module()
        if _remote_shards.is_remote(paths):
            self.paths = _remote_shards.expand_shards(paths, storage_options)
            self._remote = _remote_shards.RemoteShards(
                self.paths, storage_options=storage_options, cache_dir=cache_dir,
                cache_budget=cache_budget)
            docs = remote_tar_documents(self._remote)
            sizes = [] if not self._bucketed() else [_image_sizes(doc, url) for doc, url in
                                                     zip(docs, self.paths)]
            self._source = module.ImageTextSource.remote(
                self._remote.native, [document_keys(doc) for doc in docs], native,
                missing == "skip", sizes)
            counts = list(self._source.shard_samples)
            self._block_shards = _remote_shards.block_shards_of([n for n in counts if n], counts)
        else:
            self.paths = _paths.expand(paths, "tar shard", (".tar",))
            self._source = module.ImageTextSource(self.paths, native, missing == "skip")
        self._unbatchable = None
        self._raw = {name: i for i, (name, spec) in enumerate(self.fields.items())
                     if isinstance(spec, Text) and spec.raw}
        self._names = tuple(self._source.field_names)
        # The engine adds each sample's lengths: "lengths" (captions of variable length, or
        # Qwen2-VL patches alone), "<key>_lengths" for patches beside such captions.
        self._names += tuple(self._source.lengths_names)
        self.labels = self.targets = None

    def __len__(self):
        return len(self._source)

    def _bucketed(self):
        return any(isinstance(s, Image) and s.buckets is not None for s in self.fields.values())

    def _buckets(self):
        """Each sample's aspect-ratio bucket (an int array) with a bucketed Image field."""
        return np.asarray(self._source.buckets(), dtype=np.int64) if self._bucketed() else None

    def _lengths(self, unit):
        """Pixels: each image's area in its aspect-ratio bucket (what its batch holds). Tokens:
        each caption's ids with a variable-length Text field (padding="longest")."""
        if unit == "pixels" and self._bucketed():
            areas = np.asarray([h * w for h, w in self._source.bucket_sizes], dtype=np.float64)
            return areas[self._buckets()]
        if unit == "tokens" and any(isinstance(s, Text) and s.padding == "longest"
                                    for s in self.fields.values()):
            return np.asarray(self._source.lengths(), dtype=np.float64)
        return super()._lengths(unit)

    def bucket_sizes(self):
        """The aspect-ratio buckets' (height, width), and each sample's image (height, width)
        read from its header ((0, 0) where it cannot be read): ``(buckets, sizes)``; None without
        a bucketed Image field."""
        if not self._bucketed():
            return None
        return list(self._source.bucket_sizes), np.asarray(self._source.image_sizes)

    def path(self, index):
        """``shard.tar:key`` of sample ``index``."""
        return self._source.path(check_index(index, len(self)))

    def _caption(self, index, name):
        return self._source.member(int(index), self._raw[name]).decode("utf-8")

    def __getitem__(self, index):
        """Sample ``index`` as a dict of NumPy arrays (a raw caption as a str), drawn with seed
        0, epoch 0."""
        i = check_index(index, len(self))
        out = dict(zip(self._names, read_sample(self._source, i)))
        for name in self._raw:
            out[name] = self._caption(i, name)
        for name, value in out.items():
            if isinstance(value, np.ndarray) and value.ndim == 0:
                out[name] = value[()]
        return out

    def _batch_names(self):
        return self._names

    def _assemble_batch(self, fields):
        out = dict(zip(self._names, fields))
        for name in self._raw:  # the sample indices, NumPy or torch, on any device
            out[name] = [self._caption(i, name) for i in out[name].tolist()]
        return out

    def stats(self):
        """The shards' index: keys met, ``skipped_keys`` (missing a member, missing="skip") and
        the first few of them, ``shard.tar:key: what is missing``."""
        return dict(self._source.stats())

    def _stats(self):
        s = super()._stats()
        s["tar"] = self.stats()
        return s

    def _identity(self):
        return (self.paths, {k: repr(v) for k, v in self.fields.items()}, self.missing)

    def __reduce__(self):  # pickled as its spec: the shards are indexed again where unpickled
        storage_options, cache_dir, cache_budget = self._remote_options
        make = functools.partial(ImageTextShards, storage_options=storage_options,
                                 cache_dir=cache_dir, cache_budget=cache_budget,
                                 fields=self.fields, missing=self.missing)
        return make, (self.paths, None, self.max_pixels)

    def _extra_repr(self):
        return [f"Shards: {len(self.paths)}", f"Fields: {', '.join(self.fields)}"]


TarShards._with_fields = ImageTextShards
