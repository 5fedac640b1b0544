"""``TextDataset``: raw text and conversations (JSONL, Parquet, Arrow, a ``datasets.Dataset``,
remote files) tokenized natively into a token store, then packed, or batched by a budget, as
``TokenDataset`` packs token corpora (include/stoker/text/text_corpus.h)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings

from ..sources import paths as _paths
from ..sources import remote as _remote_files
from ..sources.tokens import PackedDocuments
from .._checks import check_positive_int

PACKS = {None: None, "concat": "document", "best_fit": "best_fit"}
LOSSES = ("assistant", "all")
_JSONL = (".jsonl", ".json", ".ndjson", ".jsonl.gz", ".json.gz", ".ndjson.gz", ".jsonl.zst",
          ".json.zst", ".ndjson.zst", ".jsonl.zstd")
_ARROW = (".parquet", ".arrow")
_STORE_VERSION = 1
_BATCH_ROWS = 4096  # rows of a Parquet/Arrow batch handed to the encoders at once
# Variables the conversation of each row sets; template_kwargs may not name them.
_ROW_VARIABLES = ("messages", "tools", "documents", "add_generation_prompt")


from .tokenizer import Tokenizer, _text_module


class TextDataset(PackedDocuments):
    """Rows of raw text, or conversations, as token sequences for LLM training.

    ``source``: JSONL files (plain, ``.gz``, ``.zst``), Parquet or Arrow files (a directory,
    a pattern, a list), a ``datasets.Dataset`` (its shuffle/select kept), a ``pyarrow.Table``,
    or remote URLs (``s3://``, ``gs://``, ``hf://``, ``https://``), copied to the cache first.

    ``tokenizer``: a ``stoker.Tokenizer``, a path ``Tokenizer.from_file`` reads, or a Hugging
    Face tokenizer (``from_hf``).

    A row is a document of token ids:

    - ``field`` (default ``"text"``): the row's text, encoded with the tokenizer's own special
      tokens (``add_bos=None``: its post-processor, as ``tokenizer(text)``; True: its bos token
      instead; False: neither), then its eos token (``add_eos``, default True where the
      tokenizer has one).
    - ``messages="messages"``: the row's conversation rendered by ``chat_template`` (default:
      the tokenizer's) with ``tools`` from the row's own ``"tools"``, the tokenizer's bos/eos
      tokens and ``template_kwargs``; encoded without special tokens, as transformers'
      ``apply_chat_template`` does. ``loss="assistant"`` (the default for conversations)
      trains on the assistant's tokens only: ``labels`` are -100 elsewhere; the tokens are those
      ``apply_chat_template(..., return_assistant_tokens_mask=True)`` marks where the template
      has ``{% generation %}`` blocks, else each assistant message's span (docs/text.md states
      the rule). ``loss="all"`` trains on every token.

    Then its first ``max_length`` tokens are kept.

    ``pack``: ``None`` (each row a sample of its own length, padded by the batch, or batched by
    ``stoker.Budget(tokens=N)``), ``"concat"`` (rows concatenated in a new order each epoch
    with ``shuffle_documents``, cut into ``seq_len`` sequences) or ``"best_fit"`` (rows packed
    whole into ``seq_len`` sequences, best-fit decreasing). Packed samples are TokenDataset's
    dicts: ``input_ids``, ``labels``, ``position_ids``, ``cu_seqlens``, ``max_seqlen`` (and
    ``loss_mask`` with ``loss_mask=True``). Every sample is a pure function of ``(seed, epoch,
    index)``: each row exactly once an epoch, the same batches whatever the workers, O(1)
    resume state, a ``Mixture`` with ``TokenDataset`` s of the same fields.

    The rows are tokenized when the dataset is made, on every core, into a token store: in
    ``cache_dir`` when given (a later TextDataset of the same files, tokenizer and options
    opens it at once), else in temporary files that vanish with the dataset. Packing, shuffling
    and every epoch's batches then read the store.

    ``on_error``: ``"raise"`` (a bad row, e.g. a line that is not JSON, a missing field, text
    that is not UTF-8, a conversation the template rejects, raises ``stoker.SampleError``
    naming the file and line) or ``"skip"`` (such rows are left out, counted in
    ``stats["skipped"]``, with a warning naming the first).
    """

    def __init__(self, source, tokenizer, field=None, messages=None, seq_len=None, pack=None,
                 chat_template=None, loss=None, add_bos=None, add_eos=None, max_length=None, *,
                 template_kwargs=None, shuffle_documents=True, label_ignore=-100,
                 loss_mask=False, max_segments=None, cache_dir=None, on_error="raise",
                 storage_options=None, cache_budget=None, num_threads=None):
        if pack not in PACKS:
            raise ValueError(f"pack must be one of {', '.join(map(repr, PACKS))}, got {pack!r}")
        if pack is not None:
            check_positive_int("seq_len", seq_len)
        elif seq_len is not None:
            raise ValueError("seq_len is the length of packed sequences: give pack=\"concat\" or "
                             "\"best_fit\", or max_length to cut unpacked rows")
        if max_length is not None:
            check_positive_int("max_length", max_length)
        if on_error not in ("raise", "skip"):
            raise ValueError(f'on_error must be "raise" or "skip", got {on_error!r}')
        if max_segments is not None:
            check_positive_int("max_segments", max_segments)
        if pack is None and (loss_mask or max_segments is not None):
            raise ValueError("loss_mask and max_segments are for packed sequences; unpacked "
                             "rows mark padding with labels and attention_mask")
        if messages is not None and field is not None:
            raise ValueError("give field (a text column) or messages (a conversation column), "
                             "not both")
        self.messages = messages
        self.field = messages if messages is not None else (field or "text")
        is_chat = messages is not None
        if loss is None:
            loss = "assistant" if is_chat else "all"
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
        if loss == "assistant" and not is_chat:
            raise ValueError('loss="assistant" is for conversations (messages=...); text rows '
                             'train on every token (loss="all")')
        if not isinstance(tokenizer, Tokenizer):
            tokenizer = Tokenizer.from_file(tokenizer) if isinstance(
                tokenizer, (str, os.PathLike)) else Tokenizer.from_hf(tokenizer)
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.pack = pack
        self.loss = loss
        self.max_length = max_length
        self.shuffle_documents = bool(shuffle_documents)
        self.label_ignore = int(label_ignore)
        self.loss_mask = bool(loss_mask)
        self.max_segments = max_segments
        self.on_error = on_error
        self.template_kwargs = dict(template_kwargs or {})
        clash = sorted(set(self.template_kwargs) & set(_ROW_VARIABLES))
        if clash:
            raise ValueError(f"template_kwargs may not set {clash}: each row sets them")

        self.chat_template = None
        if is_chat:
            self.chat_template = chat_template if chat_template is not None else \
                tokenizer.chat_template
            if not self.chat_template:
                raise ValueError("conversations need a chat template: this tokenizer has none "
                                 "(give chat_template=, or a tokenizer directory with a "
                                 "tokenizer_config.json that has one)")
        elif chat_template is not None:
            raise ValueError("chat_template renders conversations: give messages=...")
        bos, eos, special = self._special_ids(tokenizer, is_chat, add_bos, add_eos)
        self.add_bos, self.add_eos = bos is not None or special, eos is not None
        self.eos = eos if eos is not None else _token_id(tokenizer, tokenizer.eos_token)
        variables = {k: v for k, v in tokenizer.template_tokens().items() if v is not None}
        variables.update(self.template_kwargs)
        self._format = dict(field=self.field, messages=is_chat, chat_template=self.chat_template,
                            template_variables=json.dumps(variables, ensure_ascii=False),
                            assistant_only=loss == "assistant", add_special_tokens=special,
                            bos=bos, eos=eos, max_length=max_length or 0)

        self._inputs = _inputs(source, storage_options, cache_dir, cache_budget)
        self.paths = [_origin(kind, name) for kind, name, _ in self._inputs]
        self.cache_dir = cache_dir
        corpus = self._open_or_build(cache_dir, num_threads or 0)
        self.stats = dict(corpus.stats)
        if self.stats["skipped"]:
            warnings.warn(f"TextDataset skipped {self.stats['skipped']} bad rows of "
                          f"{self.stats['rows']}; the first: {self.stats['skipped_reasons'][0]}",
                          stacklevel=2)
        if corpus.num_documents == 0:
            raise ValueError(f"no rows in {self.paths}")
        self._pack_documents(corpus, pack, seq_len, self.eos, max_length=max_length,
                             native_pack=PACKS[pack])

    @staticmethod
    def _special_ids(tokenizer, is_chat, add_bos, add_eos):
        """(bos id or None, eos id or None, whether the post-processor adds its tokens)."""
        if is_chat:  # the template writes them
            if add_bos or add_eos:
                raise ValueError("a chat template writes its own bos/eos tokens: add_bos and "
                                 "add_eos are for text rows")
            return None, None, False
        bos = eos = None
        if add_bos:
            bos = _token_id(tokenizer, tokenizer.bos_token)
            if bos is None:
                raise ValueError("add_bos=True, but the tokenizer has no bos token")
        if add_eos or add_eos is None:
            eos = _token_id(tokenizer, tokenizer.eos_token)
            if eos is None and add_eos:
                raise ValueError("add_eos=True, but the tokenizer has no eos token")
        return bos, eos, add_bos is None

    def _key(self):
        """The store's name: a digest of what its tokens depend on (None: not cacheable)."""
        identities = [identity for _, _, identity in self._inputs]
        if any(i is None for i in identities):
            return None
        what = {"version": _STORE_VERSION, "tokenizer": self.tokenizer._digest,
                "format": self._format, "inputs": identities, "on_error": self.on_error}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]

    def _open_or_build(self, cache_dir, threads):
        text = _text_module()
        key = self._key() if cache_dir is not None else None
        if cache_dir is not None and key is None:
            warnings.warn("TextDataset: a source without a stable identity (an in-memory "
                          "table) is tokenized again each time; cache_dir is not used",
                          stacklevel=3)
        if key is None:
            return self._build(text, "", threads)
        store = build_once(cache_dir, f"text-{key}", "index.json",
                           lambda folder: self._build(text, folder, threads))
        return text.TextCorpus.open(store)

    def _build(self, text, store_dir, threads):
        builder = text.TextCorpusBuilder(self.tokenizer._native, **self._format,
                                         store_dir=store_dir,
                                         skip_bad_rows=self.on_error == "skip", threads=threads)
        for kind, name, _ in self._inputs:
            if kind == "jsonl":
                builder.add_jsonl(name[1] if isinstance(name, tuple) else name,
                                  _origin(kind, name))
            else:
                first = 0
                local = name[1] if isinstance(name, tuple) else name
                for batch in _record_batches(kind, local, self._columns()):
                    builder.add_arrow(batch, _origin(kind, name), first)
                    first += batch.num_rows
        return builder.finish()

    def _columns(self):
        """The columns a row needs: its field, and its tools for a conversation."""
        return [self.field, "tools"] if self.messages is not None else [self.field]

    # -- the dataset protocol (sources/base.py) --

    def _identity(self):
        return (self.paths, self._key())

    def _where(self):
        return self.paths[0] if len(self.paths) == 1 else f"{len(self.paths)} sources"

    def _stats(self):
        return {**super()._stats(), "text": dict(self.stats)}

    def __reduce__(self):
        raise TypeError("a TextDataset is not pickled: make it where it is used (a Ray actor "
                        "makes its own from the same files and tokenizer)")

    def trained(self, d):
        """Row ``d``'s flags of the tokens trained on (uint8; all 1 with ``loss="all"``)."""
        return self._corpus.trained(d)


def build_once(cache_dir, name, marker, build):
    """The folder ``cache_dir/name``, made by ``build(folder)`` when it is not there yet (no
    ``marker`` file in it): built in a folder of this process's own, renamed when complete, so
    that a folder with its marker is whole; where another process renamed its own first, that
    one is used. Returns its path."""
    store = os.path.join(os.fspath(cache_dir), name)
    if os.path.exists(os.path.join(store, marker)):
        return store
    os.makedirs(cache_dir, exist_ok=True)
    building = f"{store}.building-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    try:
        build(building)  # what it returns (a corpus mapping the files) is dropped before the rename
        try:
            os.rename(building, store)
        except OSError:  # another process finished it first: use theirs
            shutil.rmtree(building, ignore_errors=True)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return store


def _token_id(tokenizer, token):
    return None if token is None else tokenizer.token_to_id(token)


def _origin(kind, name):
    """How errors name an input: its path or URL, or its kind."""
    if isinstance(name, tuple):  # a fetched remote file: (url, local path)
        return name[0]
    return name if isinstance(name, str) else f"<{kind}>"


def _inputs(source, storage_options, cache_dir, cache_budget):
    """What the rows come from, in order: (kind, name, identity) per input. ``kind``: "jsonl",
    "parquet", "arrow", "table" (a pyarrow Table) or "dataset"; ``name`` a path (or, for a
    fetched remote file, (url, local path)), or the object; ``identity`` what the store's key
    records of it (None: nothing stable)."""
    if _is_hf_dataset(source):
        return [("dataset", source, ["dataset", source._fingerprint])]
    if type(source).__module__.startswith("pyarrow") and hasattr(source, "to_batches"):
        return [("table", source, None)]
    names = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not names:
        raise ValueError("TextDataset needs at least one source")
    if _remote_files.is_remote(names):
        urls, local = _remote_files.stage(names, "TextDataset", storage_options=storage_options,
                                          cache_dir=cache_dir and os.path.join(
                                              os.fspath(cache_dir), "remote"),
                                          cache_budget=cache_budget)
        out = []
        for url, path in zip(urls, local):
            st = os.stat(path)
            kind = _kind_of(url)
            out.append((kind, (url, path), [url, st.st_size, st.st_mtime_ns]))
        return out
    files = _paths.expand(names, "text file", _JSONL + _ARROW)
    out = []
    for path in files:
        st = os.stat(path)
        out.append((_kind_of(path), os.fspath(path), [os.path.abspath(path), st.st_size,
                                                     st.st_mtime_ns]))
    return out


def _kind_of(name):
    lower = name.lower()
    if lower.endswith(".parquet"):
        return "parquet"
    if lower.endswith(".arrow"):
        return "arrow"
    if lower.endswith(_JSONL):
        return "jsonl"
    raise ValueError(f"{name}: not a text file TextDataset reads (JSONL: "
                     f"{', '.join(_JSONL)}; Parquet; Arrow)")


def _is_hf_dataset(obj):
    return type(obj).__name__ == "Dataset" and type(obj).__module__.startswith("datasets")


def _record_batches(kind, source, columns):
    """The record batches of a Parquet/Arrow file, a pyarrow Table or a datasets.Dataset, with
    the columns among ``columns`` that it has (the encoders name a missing field)."""
    import pyarrow as pa

    if kind == "parquet":
        import pyarrow.parquet as pq
        f = pq.ParquetFile(source)
        have = set(f.schema_arrow.names)
        yield from f.iter_batches(batch_size=_BATCH_ROWS,
                                  columns=[c for c in columns if c in have] or None)
        return
    if kind == "arrow":
        with pa.memory_map(source) as m:
            try:
                reader = pa.ipc.open_file(m)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            except pa.ArrowInvalid:  # the stream format (datasets' cache files)
                m.seek(0)
                batches = pa.ipc.open_stream(m)
            for b in batches:
                yield _select(b, columns)
        return
    if kind == "dataset":
        for table in source.with_format("arrow").iter(batch_size=_BATCH_ROWS):
            for b in table.to_batches():
                yield _select(b, columns)
        return
    for b in source.to_batches(max_chunksize=_BATCH_ROWS):
        yield _select(b, columns)


def _select(batch, columns):
    have = [c for c in columns if c in batch.schema.names]
    return batch.select(have) if have else batch
