"""``TokenDataset``: LLM training sequences from token corpora of any number of shards, read and
packed by C++ threads (include/stoker/sources/token_corpus.h, packing.h)."""

from __future__ import annotations

import json
import os

import numpy as np

from .. import _native
from .._checks import check_positive_int, is_integral
from .._extras import require
from . import paths as _paths
from . import remote as _remote_shards
from .samples import read_sample
from .base import StokerDataset

PACK_MODES = ("concat", "document", "best_fit", None)
_TOKEN_SUFFIXES = (".bin", ".npy", ".idx")


def _is_megatron_prefix(path):
    return os.path.exists(path + ".bin") and os.path.exists(path + ".idx")


def _shards(paths):
    """The shards ``paths`` names, in order: each a flat token file or a Megatron dataset (by the
    prefix of its ``.bin``/``.idx`` pair: a pattern that lists both files counts it once)."""
    found = _paths.expand(paths, "token shard", _TOKEN_SUFFIXES,
                          exists=lambda p: os.path.exists(p) or _is_megatron_prefix(p))
    shards, seen = [], set()
    for path in found:
        stem, suffix = os.path.splitext(path)
        if suffix in (".bin", ".idx") and _is_megatron_prefix(stem):
            path = stem
        elif suffix == ".idx":
            raise FileNotFoundError(f"Megatron index {path} has no {stem}.bin beside it")
        if path not in seen:
            seen.add(path)
            shards.append(path)
    return shards


_HEAD_BYTES = 4096  # enough for an llm.c header (1024) or a .npy header


def _remote_shard_urls(urls, storage_options):
    """The data URLs of remote token shards (a Megatron pair, named by its .idx or its .bin, by
    its .bin, each once; flat files as they are), and the URLs known to exist from a listing of
    their directories where the store has one (None: unknown, probe each .idx)."""
    from .. import remote
    by_dir = {}
    for u in urls:
        by_dir.setdefault(u.rpartition("/")[0] + "/", []).append(u)
    listed = {}
    try:
        for directory, inside in by_dir.items():
            if len(inside) < _remote_shards.LIST_AT:
                raise ValueError("few shards: a listing could cost more than it saves")
            listed.update(remote.Store.for_url(directory, storage_options).list_info(directory))
    except ValueError:  # no listing (http, the Hub), or not worth one
        listed = None
    out, seen = [], set()
    for url in urls:
        stem, suffix = os.path.splitext(url)
        if suffix == ".idx":
            url = stem + ".bin"
        if url not in seen:
            seen.add(url)
            out.append(url)
    return out, listed


def _remote_token_shards(shards, dtype, eos, need_documents, listed=None):
    """Per remote shard, (format, dtype, data offset, tokens, document ends, last tokens) for
    ``_native.remote.token_corpus``, from ranged reads (a flat file's header and last token; a
    Megatron .idx whole). Flat shards are one document each unless ``need_documents`` (document
    packing with eos): then their documents come from a sidecar ``<url>.idx.json``, or the cache's,
    or by downloading the shard once (RemoteIndexWarning)."""
    from .. import remote
    unindexed = []

    def one(i):
        url, size = shards.urls[i], shards.sizes[i]
        doc = shards.index_entry(i)
        if doc and doc.get("format") == "stoker-token-index" and doc.get("size") == size and \
                doc["layout"]["dtype"] == dtype and (not need_documents or doc["eos"] == eos):
            # `stoker index` wrote it: layout and documents without a request of their own
            layout = doc["layout"]
            if need_documents or eos is not None:
                ends, last = doc["ends"], doc["last_tokens"]
                if not need_documents:
                    ends, last = [], last[-1:]
            else:
                ends, last = [], []
            return (layout["format"], dtype, layout["offset"], layout["tokens"], ends, last)
        stem = url[:-4] if url.endswith(".bin") else None
        if stem is not None and (listed is None or stem + ".idx" in listed):
            try:
                idx = shards.read(stem + ".idx")
            except remote.RemoteNotFound:
                idx = None
            if idx is not None:
                path = shards.derived_path(i, "megatron.idx")
                with open(path + f".{os.getpid()}", "wb") as f:
                    f.write(idx)
                os.replace(path + f".{os.getpid()}", path)
                tdtype, offset, tokens, ends = _native.remote.megatron_index(path, size, url)
                return ("megatron", tdtype, offset, tokens, ends, [])
        head = shards.read(url, 0, min(size, _HEAD_BYTES))
        fmt, offset, tokens = _native.remote.token_file_layout(head, size, dtype, url)
        if not need_documents:
            if eos is None:  # the last token places separators only with eos
                return (fmt, dtype, offset, tokens, [], [])
            width = 2 if dtype == "uint16" else 4
            last = shards.read(url, offset + (tokens - 1) * width, offset + tokens * width) \
                if tokens else b"\0" * width
            return (fmt, dtype, offset, tokens, [], [int.from_bytes(last, "little")])
        doc = None
        try:
            doc = json.loads(shards.read(url + _remote_shards.INDEX_SUFFIX))
        except remote.RemoteNotFound:
            doc = shards.load_derived(i, f"token-index-{eos}")
        if not (doc and doc.get("size") == size and doc.get("eos") == eos):
            unindexed.append(i)
            doc = token_index_document(shards.fetch(i), size, dtype, eos)
            shards.save_derived(i, f"token-index-{eos}", doc)
        return (fmt, dtype, offset, tokens, doc["ends"], doc["last_tokens"])

    out = shards._map(one, range(len(shards.urls)))
    if unindexed:
        _remote_shards.warn_indexing("token shards", len(unindexed), len(shards.urls),
                                     f"stoker index --eos {eos} " + shards.urls[0])
    return out


def _token_block_shards(source, corpus, seq_len):
    """For each block of the shard order (a shard with samples), the shards its samples read:
    its own and, where its last window runs past its end, the next ones."""
    counts = list(source.samples_per_shard)
    if not counts:
        return [list(range(corpus.num_shards))]
    blocks = _remote_shards.block_shards_of([n for n in counts if n], counts)
    last = len(counts) - 1
    return [b + [b[-1] + 1] if b[-1] < last else b for b in blocks]


def token_index_document(path, size, dtype, eos):
    """The flat token file at ``path``: its layout, and its documents split after each ``eos``
    (one document without eos): a sidecar index ``{"format", "size", "layout", "eos", "ends",
    "last_tokens"}``."""
    with open(path, "rb") as f:
        head = f.read(_HEAD_BYTES)
    fmt, offset, tokens = _native.remote.token_file_layout(head, size, dtype, path)
    corpus = _native.sources.TokenCorpus([path], dtype, split_at=eos)
    ends = [corpus.document_start(d + 1) for d in range(corpus.num_documents)]
    flat = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(tokens,))
    last = [int(t) for t in flat[np.asarray(ends, dtype=np.int64) - 1]]
    return {"format": "stoker-token-index", "version": 1, "size": size,
            "layout": {"format": fmt, "dtype": dtype, "offset": offset, "tokens": tokens},
            "eos": eos, "ends": ends, "last_tokens": last}


def _column_documents(source, column, vocab_size):
    """The rows of list column ``column`` of a table (``.parquet``/``.arrow`` paths, a
    pyarrow.Table, a ``datasets.Dataset``) as ``_native.sources.ArrayDocuments``, and what the
    source is called. The column's buffers are read in place: a memory-mapped Arrow file (a
    Hugging Face dataset's cache) is not loaded; a Parquet file's column is read into memory."""
    from .tables import _TABLE_SUFFIXES, is_hf_dataset, read_columns
    pa = require("pyarrow", "tables", "TokenDataset(column=...)")
    rows = None
    if is_hf_dataset(source):
        if source._indices is not None:  # shuffle/select/split: the rows it names, in order
            rows = source._indices.column(0)
        source = source.data.table
    if isinstance(source, (str, os.PathLike, list, tuple)):
        files = _paths.expand(source, "table file", _TABLE_SUFFIXES)
        table, name = read_columns(pa, files, [column]), files[0]
    elif isinstance(source, pa.Table):
        table, name = source, "table"
    else:
        raise TypeError(f"TokenDataset(column=...) reads .parquet/.arrow paths, pyarrow.Table "
                        f"and datasets.Dataset, got {type(source).__name__}")
    if column not in table.column_names:
        raise ValueError(f"{name} has no column {column!r} (columns: "
                         f"{', '.join(table.column_names)})")
    col = table.column(column)
    if rows is not None:
        col = col.take(rows)
    col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    kind = col.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or \
            not pa.types.is_integer(kind.value_type):
        raise ValueError(f"{name}: column {column!r} is {kind}, not a list of integer token "
                         f"ids")
    offsets = col.offsets.to_numpy(zero_copy_only=False)
    values = col.values.to_numpy(zero_copy_only=False)
    label = f"{name}:{column}"
    return _native.sources.ArrayDocuments(values, offsets, label, vocab_size or 0), label


def _torch():
    import torch
    return torch


def _check_int(name, value, low, none_ok=False):
    if value is None and none_ok:
        return
    if not is_integral(value) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


class PackedDocuments(StokerDataset):
    """Samples made of a corpus of token documents (a native DocumentSet): sequences packed
    from them, or the documents themselves. What ``TokenDataset`` and ``stoker.TextDataset``
    share; a subclass makes the corpus and calls ``_pack_documents``."""

    def _pack_documents(self, corpus, pack, seq_len, eos, max_length=None, native_pack=None):
        """Samples of ``corpus``: ``native_pack`` (the engine's mode: "concat", "document",
        "best_fit"; default ``pack``), or its documents (first ``max_length`` tokens) when
        ``pack`` is None. Padding is ``eos`` (else 0)."""
        self._corpus = corpus
        self._native_pack = pack if native_pack is None else native_pack
        if pack is None:
            self._source = _native.sources.DocumentSource(
                corpus, pad_id=eos or 0, label_ignore=self.label_ignore,
                max_length=max_length or 0)
        else:
            self._source = _native.sources.PackedTokenSource(
                corpus, self._native_pack, seq_len, eos,
                shuffle_documents=self.shuffle_documents and self._native_pack != "concat",
                label_ignore=self.label_ignore, loss_mask=self.loss_mask,
                max_segments=self.max_segments or 0)
        self.num_tokens = corpus.num_tokens
        self.num_documents = corpus.num_documents
        if pack is None:  # the native producer's hook: a batch of documents is a dict
            self._assemble_batch = self._documents_batch
        elif self._native_pack != "concat":  # a packed batch is a dict
            self._fields = tuple(self._source.field_names)
            self._assemble_batch = self._as_dict

    @property
    def padding_fraction(self):
        """Padding tokens over all tokens of an epoch's sequences (0 for ``"concat"``; for
        ``None``, the batches' padding: ``loader.stats()["budget"]``)."""
        return 0.0 if self.pack is None else self._source.padding_fraction

    _labels_are_next_tokens = True  # y is x shifted by one token (or labels of a pack)

    def _batch_names(self):
        return ("input_ids", "labels") if self._native_pack == "concat" else ()  # packs: dicts

    def _identity(self):
        return self.paths

    def _lengths(self, unit):
        if unit != "tokens" or self.pack is not None:
            return super()._lengths(unit) if unit != "tokens" else np.full(
                len(self), self.seq_len, dtype=np.float64)  # windows: seq_len tokens each
        return self._source.lengths()  # documents: from the index

    def _stats(self):
        """Adds ``loader.stats()["packing"]``: how the corpus is packed (the same every
        epoch)."""
        if self.pack is None:
            return super()._stats()
        return {**super()._stats(), "packing": self._packing()}

    def _packing(self):
        return {"mode": self.pack, "seq_len": self.seq_len, "documents": self.num_documents,
                "tokens": self.num_tokens, "sequences": len(self),
                "padded_tokens": self._source.padded_tokens,
                "padding_fraction": self.padding_fraction}

    def _as_dict(self, fields):
        return dict(zip(self._fields, fields))

    def _documents_batch(self, fields):
        """An unpacked batch: input_ids, labels, attention_mask (from the lengths), lengths."""
        ids, labels, lengths = fields
        positions = (np if isinstance(ids, np.ndarray) else _torch()).arange(ids.shape[1])
        mask = positions[None, :] < lengths[:, None]
        return {"input_ids": ids, "labels": labels,
                "attention_mask": mask.astype(np.int64) if isinstance(mask, np.ndarray)
                else mask.long(), "lengths": lengths}

    def __len__(self):
        return len(self._source)

    def __getitem__(self, index):
        """Sample ``index`` of epoch 0 with seed 0, for inspection: ``(input, target)``, or a dict
        of the packed fields."""
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        fields = read_sample(self._source, index)
        if self._native_pack == "concat":
            return tuple(fields)
        if self.pack is None:
            return {"input_ids": fields[0], "labels": fields[1]}
        return self._as_dict(fields)

    def document(self, d):
        """Document ``d``'s tokens (int64), as the corpus holds them."""
        return self._corpus.document(d)



class TokenDataset(PackedDocuments):
    """Token ids for LLM training: windows or packed sequences over one or many shards.

    ``path``: a token file, a Megatron dataset (the prefix of its ``.bin``/``.idx`` pair, or
    either file), a directory, a pattern (``train-{000..127}.bin``, globs), or a list of these
    (stoker/sources/paths.py). Shards may mix layouts: raw token files (nanoGPT's
    ``train.bin``), llm.c's headered shards, 1-d ``.npy`` arrays (told by their first bytes) and
    Megatron-LM indexed datasets (their ``.idx`` gives the token type and document boundaries).
    Every shard is memory-mapped once and shared by every thread: one global index over all
    of them, O(1) per lookup, no per-worker copy.

    Documents: a Megatron dataset's own; a flat file is one document, or, with ``eos`` (the
    end-of-document id), is split after each ``eos`` token (which stays its document's last).

    ``pack``:

    - ``"concat"`` (default): sample ``i`` is ``(input, target) = (stream[i*L : i*L+L],
      stream[i*L+1 : i*L+L+1])``, ``L = seq_len``, over the documents one after the other (the
      loader shuffles windows); a window crosses document boundaries without marking them. With
      ``eos``, every document of the stream ends with it: one is put after a document that does
      not end with it (in the stream, not the file).
    - ``"document"``: the documents (in a new order each epoch with ``shuffle_documents``) cut
      into sequences of ``L`` tokens that say where each document starts. A sample is a dict:
      ``input_ids``, ``labels`` (the next token of the same document, ``label_ignore`` where
      there is none), ``position_ids`` (restarting at each document), ``cu_seqlens`` (int32,
      ``max_segments + 1`` entries, padded with ``L``) and ``max_seqlen`` for variable-length
      attention, and ``loss_mask`` (uint8) with ``loss_mask=True``. Padding is ``eos`` (else 0).
    - ``"best_fit"``: whole documents bin-packed into sequences of ``L`` (best-fit decreasing;
      a document longer than ``L`` is split into ``L``-token pieces), padded at the end; same
      fields as ``"document"``. ``padding_fraction`` is the share of padding tokens.
    - ``None``: no packing: sample ``d`` is document ``d`` whole (its first ``seq_len`` tokens
      when ``seq_len`` is given), of its own length. A batch pads its documents to its longest
      (``eos``, else 0; labels ``label_ignore``): a dict of ``input_ids`` and ``labels`` (the
      next token of the same document) ``[B, L]``, ``attention_mask`` (1 on tokens, 0 on
      padding) and ``lengths`` ``[B]``. With ``batch_size=stoker.Budget(tokens=N)`` batches hold
      about N padded tokens each (docs/budget.md); the lengths come from the index.

    Each is a pure function of ``(seed, epoch, index)``: every token of every document once per
    epoch, bit-identical batches whatever the workers, resumable with the loader's O(1) state.

    ``column``: the documents are the rows of this list-of-integers column of a table instead:
    ``path`` is then ``.parquet``/``.arrow`` files (as TableDataset takes them), a
    ``pyarrow.Table`` or a Hugging Face ``datasets.Dataset`` (its shuffle/select kept), read in
    place (a memory-mapped Arrow file is not loaded; a Parquet column is read into memory).
    ``eos`` then only marks document ends in the concat stream and pads.

    ``vocab_size``: a token id at or above it fails its sample with an error naming the file
    and the token's position (checked as tokens are read, never by a scan of the corpus).
    """

    def __init__(self, path, dtype="uint16", seq_len=None, *, pack="concat", eos=None,
                 vocab_size=None, shuffle_documents=True, loss_mask=False, label_ignore=-100,
                 max_segments=None, column=None, storage_options=None, cache_dir=None,
                 cache_budget=None):
        if dtype not in ("uint16", "uint32"):
            raise ValueError(f'dtype must be "uint16" or "uint32", got {dtype!r}')
        if pack is not None or seq_len is not None:
            check_positive_int("seq_len", seq_len)
        if pack not in PACK_MODES:
            raise ValueError(f"pack must be one of {', '.join(map(repr, PACK_MODES))}, "
                             f"got {pack!r}")
        _check_int("eos", eos, 0, none_ok=True)
        _check_int("vocab_size", vocab_size, 1, none_ok=True)
        _check_int("max_segments", max_segments, 1, none_ok=True)
        if eos is not None and vocab_size is not None and eos >= vocab_size:
            raise ValueError(f"eos {eos} is not below vocab_size {vocab_size}")
        self.column = column
        if column is not None:
            self._table_source = path
            self.paths = list(_paths.expand(path, "table file")) if isinstance(
                path, (str, os.PathLike, list, tuple)) else []
        self._remote = None
        self._remote_options = (storage_options, cache_dir, cache_budget)
        if column is None and _remote_shards.is_remote(path):
            self.paths, listed = _remote_shard_urls(
                _remote_shards.expand_shards(path, storage_options), storage_options)
            self._remote = _remote_shards.RemoteShards(
                self.paths, storage_options=storage_options, cache_dir=cache_dir,
                cache_budget=cache_budget, known=listed)
        elif column is None:
            self.paths = _shards(path)
        self.path = self.paths[0] if len(self.paths) == 1 else self.paths
        self.dtype = dtype
        self.seq_len = seq_len
        self.pack = pack
        self.eos = eos
        self.vocab_size = vocab_size
        self.shuffle_documents = bool(shuffle_documents)
        self.loss_mask = bool(loss_mask)
        self.label_ignore = int(label_ignore)
        self.max_segments = max_segments
        if pack in ("concat", None) and (loss_mask or max_segments is not None):
            raise ValueError('loss_mask and max_segments are for pack="document" and '
                             '"best_fit"; concat windows are (input, target), unpacked '
                             'documents mark padding with labels and attention_mask')
        if column is not None:
            self._corpus, name = _column_documents(path, column, vocab_size)
            self.formats = ["table"]
        elif self._remote is not None:
            shards = _remote_token_shards(self._remote, dtype, eos,
                                          need_documents=eos is not None and pack != "concat",
                                          listed=listed)
            self._corpus = _native.remote.token_corpus(self._remote.native, shards,
                                                       vocab_size or 0)
            self.formats = list(self._corpus.formats)
        else:
            self._corpus = _native.sources.TokenCorpus(self.paths, dtype, split_at=eos,
                                                       vocab_size=vocab_size or 0)
            self.formats = list(self._corpus.formats)
        if pack is None and self._remote is not None:
            raise ValueError("pack=None (whole documents) reads local token files; stream "
                             "remote shards with a packing")
        self._pack_documents(self._corpus, pack, seq_len, eos, max_length=seq_len)
        if self._remote is not None:
            self._block_shards = _token_block_shards(self._source, self._corpus, seq_len)
        self.format = self.formats[0] if len(set(self.formats)) == 1 else "mixed"

    @property
    def default_shuffle(self):
        """What ``shuffle=True`` means here: the shard order for remote shards packed by concat
        (document packings already order documents themselves)."""
        return "shards" if self._remote is not None and self.pack == "concat" else True

    def __reduce__(self):  # pickled as its spec: the shards must be readable at the same paths
        source = self.paths if self.column is None else self._table_source
        storage_options, cache_dir, cache_budget = self._remote_options
        return _rebuild, (source, self.dtype, self.seq_len, dict(column=self.column,
            storage_options=storage_options, cache_dir=cache_dir, cache_budget=cache_budget,
            pack=self.pack, eos=self.eos, vocab_size=self.vocab_size,
            shuffle_documents=self.shuffle_documents, loss_mask=self.loss_mask,
            label_ignore=self.label_ignore, max_segments=self.max_segments))

def _rebuild(paths, dtype, seq_len, options):
    return TokenDataset(paths, dtype, seq_len, **options)
