"""``VLMDataset``: conversations with images for vision-language model SFT (LLaVA's JSON, the
same rows in JSONL or Parquet, a ``datasets.Dataset``), made as the model's Hugging Face
processor makes them, natively (include/stoker/image_text/vlm_source.h).

The rows are read once when the dataset is made: each conversation is rendered by the chat
template and tokenized on every core into a token store (the text wing's TextCorpus), and its
images are located (a folder, tar shards, or bytes in the rows). Every sample is then a pure
function of ``(seed, epoch, index)``: the tokens expanded, the labels masked, the images decoded
and processed by the engine's threads into the batch."""

from __future__ import annotations

import json
import os
import hashlib
import tarfile
import tempfile
import warnings

import numpy as np

from .. import _native
from ..errors import SampleError
from ..text.dataset import build_once
from ..sources import remote as _remote_files
from ..sources.base import StokerDataset
from ..sources._checks import check_index
from ..sources.samples import read_sample
from .._checks import check_positive_int
from .processors import ImageProcessor, PatchImageProcessor, TileImageProcessor

PACKS = (None, "best_fit")
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
          "system": "system", "bot": "assistant", "model": "assistant"}
_WHOLE = np.iinfo(np.uint64).max
_BATCH_ROWS = 4096


class VLMDataset(StokerDataset):
    """Conversations with images, as ``processor.apply_chat_template`` and the processor's call
    make them: ``input_ids``, ``labels`` (-100 outside the assistant's turns and on image
    tokens; not shifted, as transformers' models take them), ``attention_mask``,
    ``pixel_values`` (and for Qwen2-VL ``image_grid_thw`` and ``mm_token_type_ids``, 1 on image
    tokens, which its processor returns and its model's M-RoPE needs).

    ``source``: a LLaVA JSON file (a list of rows), JSONL, Parquet, a ``datasets.Dataset`` or a
    list of row dicts (or a list of such files). A row holds a conversation under ``messages``
    (default: ``"conversations"`` or ``"messages"``, whichever the rows have): LLaVA's
    ``{"from": "human"|"gpt", "value": "<image>\\n..."}`` turns (each ``<image>`` becomes an
    image item of the content, the text around it stripped) or transformers'
    ``{"role": ..., "content": [{"type": "image"}, {"type": "text", "text": ...}]}``; and its
    images under ``image_field`` (default ``"image"`` or ``"images"``): a name, or a list of names,
    bytes, or ``{"bytes": ..., "path": ...}`` dicts (datasets' Image feature), in the order of
    the placeholders. A ``datasets.Dataset``'s Image columns are read as their bytes (not
    decoded to PIL images in Python).

    ``images``: where names are: a folder, or tar shards (a ``.tar`` path or a list of them,
    names being member paths); None: paths relative to the source file's folder (or absolute).

    ``processor``: a model directory (tokenizer.json, tokenizer_config.json or
    chat_template.jinja, preprocessor_config.json, processor_config.json) or a transformers
    processor (LlavaProcessor, Qwen2VLProcessor, Qwen2_5_VLProcessor, Qwen3VLProcessor, ...).
    Fixed-resolution processors (CLIP, SigLIP: LLaVA-1.5) give every image the same count of
    image tokens (``image_tokens``, default from the processor: LLaVA-1.5's 576) and
    ``pixel_values`` [images, 3, H, W]; Qwen2-VL's (Qwen2.5-VL's, Qwen3-VL's) gives each image
    tokens and patches by its size, read from its header, and so does LLaVA-NeXT's
    any-resolution processor with tiles.
    ``image_token``: the placeholder the template writes (default the processor's).

    ``pack``: None (a sample is a conversation; batches pad to their longest, or
    ``stoker.Budget(tokens=N)`` counts image tokens), or ``"best_fit"`` (conversations packed
    whole into samples of at most ``seq_len`` tokens, image tokens counted, with
    ``position_ids``, ``cu_seqlens`` and ``max_seqlen``; use batch_size=1). For Qwen2-VL,
    a pack's ``position_ids`` are [4, B, L], as its transformers model takes packed sequences:
    each conversation's text positions, then its M-RoPE (t, h, w) positions, those the model
    would compute for the conversation alone. The packs are chosen
    from the lengths once; with ``shuffle_conversations`` each epoch swaps conversations of the
    same length (and images) between packs, so which share a pack changes while the padding
    does not.

    A batch is a dict; ``pixel_values`` holds the batch's images one after the other (the
    model's layout: [images, 3, H, W], Qwen2-VL's [patches, dim] and ``image_grid_thw``
    [images, 3], or LLaVA-NeXT's [tiles, 3, H, W] and ``image_sizes`` [images, 2]), and
    ``image_counts`` [B] how many are each sample's.

    ``cache_dir``: where the rendered and tokenized rows and their images' places are kept (a
    folder named by a digest of the files, the tokenizer, the template and the options): a later
    VLMDataset of the same opens it at once. Without it, each VLMDataset indexes the rows again,
    into temporary files that vanish with it.

    Remote rows (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``hf://``; ``storage_options``
    as for every remote dataset) are fetched into the cache (``cache_budget``) when the dataset is
    made. So are remote images: ``images=`` a folder URL (the images the rows name, one request
    each) or ``.tar`` shard URLs (whole); they must fit the cache budget together.

    ``on_error``: "raise" (a bad row raises ``stoker.SampleError`` naming the file and row: a
    line that is not JSON, a conversation the template rejects, more or fewer placeholders
    than images, a missing image, a conversation longer than ``max_length`` or ``seq_len``) or
    "skip" (left out and counted: ``stats()["skipped"]``, with a warning naming the first). An
    image that fails to decode when read is the loader's ``on_error``.
    """

    def __init__(self, source, processor, images=None, *, messages=None, image_field=None,
                 pack=None, seq_len=None, max_length=None, chat_template=None,
                 template_kwargs=None, image_token=None, image_tokens=None, label_ignore=-100,
                 pad_id=None, shuffle_conversations=True, cache_dir=None, on_error="raise",
                 num_threads=None, storage_options=None, cache_budget=None):
        if pack not in PACKS:
            raise ValueError(f"pack is None or \"best_fit\", got {pack!r}")
        if pack is not None:
            check_positive_int("seq_len", seq_len)
        elif seq_len is not None:
            raise ValueError('seq_len is the length of packed samples: give pack="best_fit", or '
                             'max_length to refuse longer conversations')
        if max_length is not None:
            check_positive_int("max_length", max_length)
        if on_error not in ("raise", "skip"):
            raise ValueError(f'on_error must be "raise" or "skip", got {on_error!r}')
        self.pack, self.seq_len, self.max_length = pack, seq_len, max_length
        self.on_error = on_error
        self.label_ignore = int(label_ignore)
        model = _Model(processor, chat_template, image_token, image_tokens)
        self.tokenizer = model.tokenizer
        self.image_processor = model.image_processor
        self.image_token = model.image_token
        self.chat_template = model.chat_template
        token_id = self.tokenizer.token_to_id(self.image_token)
        if token_id is None:
            raise ValueError(f"the image token {self.image_token!r} is not in the tokenizer's "
                             f"vocabulary")
        self.image_token_id = int(token_id)
        variables = dict(model.variables)
        variables.update(template_kwargs or {})
        for key in ("messages", "tools", "documents", "add_generation_prompt"):
            if key in (template_kwargs or {}):
                raise ValueError(f"template_kwargs may not set {key!r}: each row sets it")

        self.cache_dir = cache_dir
        self._blob = None  # without cache_dir: image bytes from the rows, in an unnamed file
        fetch = {"storage_options": storage_options, "cache_budget": cache_budget,
                 "cache_dir": cache_dir and os.path.join(os.fspath(cache_dir), "remote")}
        rows = _Rows(_inputs(source, storage_options, cache_dir, cache_budget), messages,
                     image_field, images, fetch)
        index = _Index(self.tokenizer, self.chat_template, variables, model.bos_text, on_error,
                       num_threads or 0)
        key = index.key(rows) if cache_dir is not None else None
        if cache_dir is not None and key is None:
            warnings.warn("VLMDataset: rows without a stable identity (a list of dicts) are "
                          "indexed again each time; cache_dir is not used", stacklevel=2)
        if key is None:
            self._blob = tempfile.NamedTemporaryFile(prefix="stoker-vlm-images-")
            corpus, table = index.build(rows, "", self._blob)
            self._blob.flush()
        else:
            store = build_once(cache_dir, f"vlm-{key}", "vlm.json",
                               lambda folder: index.save(rows, folder))
            corpus, table = _Index.open(store)
        self._corpus = corpus
        image_starts, image_ids = _document_images(corpus, table)
        ranges = _native.sources.FileRanges(
            _local_files(table["files"], fetch), table["range_file"], table["range_offset"],
            table["range_size"], table["names"])
        fixed = model.pipeline is not None
        qwen = isinstance(self.image_processor, PatchImageProcessor)
        pipeline = model.pipeline
        if pad_id is None:
            pad_id = model.pad_id if model.pad_id is not None else 0
        module = _text().image_text
        self._source = module.VLMSource(
            corpus, image_starts, image_ids, ranges, self.image_token_id, pipeline,
            int(model.tokens_per_image or 0) if fixed else 0,
            None if fixed else self.image_processor._native, 0, int(pad_id), self.label_ignore,
            int(seq_len or 0), int(max_length or 0), on_error == "skip", int(num_threads or 0),
            bool(shuffle_conversations), qwen, mrope=bool(pack) and qwen)
        self._names = tuple(self._source.field_names) + tuple(self._source.lengths_names)
        self._summary = {"rows": table["count"], "text": dict(corpus.stats),
                         **dict(self._source.stats)}
        skipped = table["bad"] + corpus.stats["skipped"] + self._source.stats["skipped"]
        self._summary["skipped"] = skipped
        self._summary["skipped_reasons"] = (table["reasons"] +
                                            list(corpus.stats["skipped_reasons"]) +
                                            list(self._source.stats["skipped_reasons"]))[:8]
        if skipped:
            warnings.warn(f"VLMDataset skipped {skipped} bad rows of {table['count']}; the "
                          f"first: {self._summary['skipped_reasons'][0]}", stacklevel=2)

    # -- samples --

    def __len__(self):
        return len(self._source)

    def __getitem__(self, index):
        """Sample ``index`` as a dict of NumPy arrays (seed 0, epoch 0), its ragged fields at
        their own lengths."""
        i = check_index(index, len(self))
        return dict(zip(self._names, read_sample(self._source, i)))

    def documents_of(self, index, seed=0, epoch=0):
        """The conversations (their numbers among those indexed) of sample ``index`` in that
        epoch."""
        return list(self._source.documents_of(check_index(index, len(self)), int(seed),
                                              int(epoch)))

    def stats(self):
        """Rows read, conversations kept and skipped (with the first reasons), tokens, image
        tokens, images, and packed padding."""
        return dict(self._summary)

    def trained(self, d):
        """Conversation ``d``'s flags of the tokens trained on, before the image tokens are
        expanded."""
        return self._corpus.trained(d)

    # -- the dataset protocol (sources/base.py) --

    def _lengths(self, unit):
        if unit != "tokens":
            return super()._lengths(unit)
        return np.asarray(self._source.lengths(), dtype=np.int64)

    def _batch_names(self):
        return self._names

    def _assemble_batch(self, fields):
        """The engine's batch as the model takes it: the images of every sample one after the
        other (the engine pads each sample's to the batch's most)."""
        out = dict(zip(self._names, fields))
        positions = out.get("position_ids")
        if positions is not None and positions.ndim == 3:  # M-RoPE's [B, L, 4] as [4, B, L]
            out["position_ids"] = positions.transpose(2, 0, 1) if isinstance(
                positions, np.ndarray) else positions.permute(2, 0, 1)
        info = next((k for k in ("image_grid_thw", "image_sizes") if k in out), None)
        counts = out[f"{info}_lengths" if info else "pixel_values_lengths"]
        out["image_counts"] = counts
        out["pixel_values"] = _flatten(out["pixel_values"], out["pixel_values_lengths"])
        if info:
            out[info] = _flatten(out[info], counts)
        return out

    def _stats(self):
        return {**super()._stats(), "vlm": self.stats()}

    def _where(self):
        return f"{len(self)} samples"

    def __reduce__(self):
        raise TypeError("a VLMDataset is not pickled: make it where it is used")

    def __repr__(self):
        return (f"VLMDataset({len(self)} samples, {self._summary['kept']} conversations, "
                f"{self._summary['images']} images, image token {self.image_token!r}"
                f"{', packed to ' + str(self.seq_len) if self.pack else ''})")


def _document_images(corpus, table):
    """(image_starts, image_ids): each document's images (the rows skipped leave no document),
    as VLMSource takes them."""
    origins, local_rows = corpus.document_rows()
    doc_rows = table["row_base"][origins.astype(np.int64)] + local_rows.astype(np.int64)
    starts, ids = table["row_images"], table["row_image_ids"]
    counts = (starts[1:] - starts[:-1])[doc_rows]
    image_starts = np.zeros(len(doc_rows) + 1, dtype=np.uint64)
    np.cumsum(counts, out=image_starts[1:])
    # document d's images: ids[starts[its row] ...], counts[d] of them, one after the other
    pick = np.repeat(starts[doc_rows] - image_starts[:-1].astype(np.int64), counts) + \
        np.arange(int(image_starts[-1]), dtype=np.int64)
    return image_starts, ids[pick].astype(np.uint64)


def _flatten(values, counts):
    """values [B, M, ...] with counts [B] real rows each: their real rows, [sum, ...]; a view
    where every sample has M."""
    b, m = values.shape[0], values.shape[1]
    if b == 1 or bool((counts == m).all()):
        return values.reshape((b * m,) + tuple(values.shape[2:]))
    if isinstance(values, np.ndarray):
        keep = np.arange(m)[None, :] < np.asarray(counts)[:, None]
    else:
        import torch
        keep = torch.arange(m, device=values.device)[None, :] < counts.to(values.device)[:, None]
    return values[keep]


def _text():
    from ..text.tokenizer import _text_module
    return _text_module()


class _Model:
    """What a processor (a directory, or a transformers processor) says: the tokenizer, the
    image processor, the chat template and its variables, the image token and its count."""

    def __init__(self, processor, chat_template, image_token, image_tokens):
        from ..text.tokenizer import Tokenizer
        config = {}
        if isinstance(processor, (str, os.PathLike)):
            path = os.fspath(processor)
            if not os.path.isdir(path):
                raise ValueError(f"processor={path!r}: a model directory, or a transformers "
                                 f"processor")
            self.tokenizer = Tokenizer.from_file(path)
            self.image_processor = ImageProcessor.from_pretrained(path)
            for name in ("processor_config.json", "preprocessor_config.json"):
                p = os.path.join(path, name)
                if os.path.exists(p):
                    with open(p, encoding="utf-8") as f:
                        config = {**json.load(f), **config}
            template = self.tokenizer.chat_template
            jinja = os.path.join(path, "chat_template.jinja")
            chat_json = os.path.join(path, "chat_template.json")
            if os.path.exists(jinja):
                with open(jinja, encoding="utf-8") as f:
                    template = f.read()
            elif os.path.exists(chat_json):
                with open(chat_json, encoding="utf-8") as f:
                    template = json.load(f).get("chat_template", template)
            self.variables = {k: v for k, v in self.tokenizer.template_tokens().items()
                              if v is not None}
            self.bos_text = self.tokenizer.bos_token
            self.pad_id = None
        else:
            hf_tokenizer = getattr(processor, "tokenizer", None)
            hf_images = getattr(processor, "image_processor", None)
            if hf_tokenizer is None or hf_images is None:
                raise ValueError(f"processor={type(processor).__name__}: a transformers "
                                 f"processor with a tokenizer and an image processor, or a model "
                                 f"directory")
            self.tokenizer = Tokenizer.from_hf(hf_tokenizer)
            self.image_processor = ImageProcessor.from_pretrained(hf_images)
            template = getattr(processor, "chat_template", None) or \
                getattr(hf_tokenizer, "chat_template", None)
            self.variables = {k: v for k, v in hf_tokenizer.special_tokens_map.items()
                              if isinstance(v, str)}
            self.bos_text = hf_tokenizer.bos_token
            self.pad_id = hf_tokenizer.pad_token_id
            config = {k: getattr(processor, k) for k in (
                "patch_size", "vision_feature_select_strategy", "num_additional_image_tokens",
                "image_token", "image_seq_length") if getattr(processor, k, None) is not None}
        self.chat_template = chat_template or template
        if not self.chat_template:
            raise ValueError("the processor has no chat template: give chat_template=")
        qwen = isinstance(self.image_processor, PatchImageProcessor)
        dynamic = qwen or isinstance(self.image_processor, TileImageProcessor)
        if isinstance(self.image_processor, TileImageProcessor):  # the model sets its tokens
            self.image_processor = self.image_processor.with_model(**{
                k: config[k] for k in ("patch_size", "num_additional_image_tokens",
                                       "vision_feature_select_strategy") if k in config})
        self.image_token = image_token or config.get("image_token") or \
            ("<|image_pad|>" if qwen else "<image>")
        self.tokens_per_image = self.pipeline = None
        if not dynamic:
            from ..transforms import _compile
            compiled = _compile.compile_transform(self.image_processor)
            self.pipeline = _native.image.ImagePipeline(list(compiled.specs),
                                                        alpha=compiled.alpha)
            shape = self.pipeline.output_shape
            size = (shape[1], shape[2]) if shape[0] == 3 else (shape[0], shape[1])
            self.tokens_per_image = image_tokens or _fixed_tokens(size, config)
        elif image_tokens is not None:
            raise ValueError("image_tokens is for fixed-resolution processors: Qwen2-VL's and "
                             "LLaVA-NeXT's count each image's tokens from its size")


def _fixed_tokens(size, config):
    """The image tokens of a fixed-resolution processor's image of `size` (height, width), as
    transformers' processors count them (LlavaProcessor: the patches, plus
    num_additional_image_tokens, less the CLS token with the "default" feature strategy; or the
    processor's image_seq_length)."""
    height, width = size
    if config.get("image_seq_length"):
        return int(config["image_seq_length"])
    patch = config.get("patch_size")
    if not patch:
        raise ValueError("cannot tell how many tokens an image is: the processor config has no "
                         "patch_size (or image_seq_length); give image_tokens=")
    n = (height // patch) * (width // patch) + int(config.get("num_additional_image_tokens") or 0)
    if config.get("vision_feature_select_strategy") == "default":
        n -= 1
    return n


class _Index:
    """The rows rendered and tokenized into a TextCorpus, and their images located: built in
    memory (temporary files), or saved in a folder of cache_dir and opened again."""

    VERSION = 1

    def __init__(self, tokenizer, chat_template, variables, bos_text, on_error, threads):
        self.tokenizer, self.chat_template = tokenizer, chat_template
        self.variables = json.dumps(variables, ensure_ascii=False, sort_keys=True)
        self.bos_text, self.on_error, self.threads = bos_text or "", on_error, threads

    def key(self, rows):
        """A digest of what the index depends on; None where the rows have no identity."""
        inputs = rows.identity()
        if inputs is None:
            return None
        what = {"version": self.VERSION, "tokenizer": self.tokenizer._digest,
                "template": self.chat_template, "variables": self.variables,
                "bos": self.bos_text, "on_error": self.on_error, "rows": inputs}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]

    def build(self, rows, store_dir, blob):
        """(corpus, table): the rows fed to a TextCorpusBuilder (its store in store_dir, or
        temporary files), image bytes written to ``blob`` (an open binary file)."""
        builder = _text().TextCorpusBuilder(
            self.tokenizer._native, field="messages", messages=True,
            chat_template=self.chat_template, template_variables=self.variables,
            assistant_only=True, add_special_tokens=True, bos=None, eos=None, max_length=0,
            store_dir=store_dir, skip_bad_rows=self.on_error == "skip", threads=self.threads,
            bos_text=self.bos_text)
        bad = rows.feed(builder, self.on_error, blob)
        return builder.finish(), rows.table(bad)

    def save(self, rows, folder):
        os.makedirs(folder)
        with open(os.path.join(folder, "images.bin"), "wb") as blob:
            corpus, table = self.build(rows, os.path.join(folder, "corpus"), blob)
        del corpus
        files = ["<store>/images.bin" if f == blob.name else f for f in table["files"]]
        np.savez(os.path.join(folder, "rows.npz"),
                 **{k: table[k] for k in _Index.ARRAYS})
        with open(os.path.join(folder, "vlm.json"), "w", encoding="utf-8") as f:
            json.dump({"files": files, "names": table["names"], "count": table["count"],
                       "bad": table["bad"], "reasons": table["reasons"]}, f)

    ARRAYS = ("row_base", "row_images", "row_image_ids", "range_file", "range_offset",
              "range_size")

    @staticmethod
    def open(store):
        with open(os.path.join(store, "vlm.json"), encoding="utf-8") as f:
            table = json.load(f)
        table["files"] = [os.path.join(store, f[len("<store>/"):]) if f.startswith("<store>/")
                          else f for f in table["files"]]
        with np.load(os.path.join(store, "rows.npz")) as arrays:
            table.update({k: arrays[k] for k in _Index.ARRAYS})
        return _text().TextCorpus.open(os.path.join(store, "corpus")), table


class _Rows:
    """The rows of every source, converted to conversations (messages as transformers takes
    them) and their images located; fed to a TextCorpusBuilder one source (origin) at a
    time."""

    def __init__(self, inputs, messages, image_field, images, fetch):
        self.inputs = inputs
        self.messages, self.image_field = messages, image_field
        self.blob = None
        self.files, self.file_index = [], {}
        self.range_file, self.range_offset, self.range_size, self.names = [], [], [], []
        self.name_index = {}
        self.row_images = [0]  # per row: the end of its images in self.row_image_ids
        self.row_image_ids = []
        self.reasons = []
        self.count = 0
        self.row_base = []
        self.folder, self.members = None, None
        self.remote_folder = False
        self.shard_urls = {}  # remote shards: local copy -> URL
        if images is not None:
            names = [images] if isinstance(images, (str, os.PathLike)) else list(images)
            names = [os.fspath(n) for n in names]
            if _remote_files.is_remote(names):
                if names and all(n.endswith(".tar") for n in names):
                    urls, local = _remote_files.stage(names, "VLMDataset's image shards",
                                                      **fetch)
                    self.shards = local
                    self.shard_urls = dict(zip(local, urls))
                elif len(names) == 1:  # a folder: the images the rows name, fetched later
                    self.folder, self.remote_folder = names[0].rstrip("/"), True
                else:
                    raise ValueError(f"images={images!r}: a folder, or .tar shards")
            elif len(names) == 1 and os.path.isdir(names[0]):
                self.folder = names[0]
            elif names and all(n.endswith(".tar") for n in names):
                self.shards = names
            else:
                raise ValueError(f"images={images!r}: a folder, or .tar shards")

    shards = ()

    def identity(self):
        """What the rows and the images' places are, for a cache key (None: no stable one)."""
        inputs = [identity for _, _, _, identity in self.inputs]
        if any(i is None for i in inputs):
            return None
        folder = self.folder if self.remote_folder else self.folder and os.path.abspath(
            self.folder)
        return {"inputs": inputs, "messages": self.messages, "image_field": self.image_field,
                "folder": folder, "shards": [[self.shard_urls.get(p, p)] + _file_identity(p)[1:]
                                             for p in self.shards]}

    def feed(self, builder, on_error, blob):
        """Adds every row to the builder (a bad one, with on_error="skip", is left out here and
        counted), image bytes written to ``blob``; returns the rows skipped so."""
        import pyarrow as pa
        self.blob = blob
        if self.shards:
            self.members = _tar_members(self.shards)
        bad = 0
        for name, rows, base_dir, _ in self.inputs:
            self.row_base.append(self.count)
            batch, first = [], 0
            for r, row in enumerate(rows):
                self.count += 1
                try:
                    conversation, refs = self._convert(row, name, r, base_dir)
                except _BadRow as e:
                    if on_error == "raise":
                        raise SampleError(f"{e.where}: {e}", self.count - 1, e.where) from None
                    bad += 1
                    if len(self.reasons) < 8:
                        self.reasons.append(f"{e.where}: {e}")
                    self.row_images.append(self.row_images[-1])
                    self._add(builder, pa, batch, name, first)  # the rows before it
                    batch, first = [], r + 1
                    continue
                self.row_images.append(self.row_images[-1] + len(refs))
                self.row_image_ids.extend(refs)
                batch.append(conversation)
                if len(batch) == _BATCH_ROWS:
                    self._add(builder, pa, batch, name, first)
                    batch, first = [], r + 1
            self._add(builder, pa, batch, name, first)
        return bad

    @staticmethod
    def _add(builder, pa, batch, name, first):
        if not batch:
            return
        column = pa.array([json.dumps(c, ensure_ascii=False) for c in batch], type=pa.json_())
        builder.add_arrow(pa.RecordBatch.from_arrays([column], names=["messages"]), name, first)

    def _convert(self, row, name, r, base_dir):
        line = None
        if isinstance(row, _Line):
            line, row = row.number, row.row
        where = f"{name}:{line}" if line is not None else f"{name}: row {r}"
        if isinstance(row, _BadRow):
            row.where = where
            raise row
        if not isinstance(row, dict):
            raise _BadRow(f"a row is a JSON object, got {type(row).__name__}", where)
        key = self.messages or ("conversations" if "conversations" in row else "messages")
        turns = row.get(key)
        if not isinstance(turns, list):
            raise _BadRow(f"no list of messages under {key!r}", where)
        conversation = [_message(t, where) for t in turns]
        field = self.image_field or ("image" if "image" in row else "images")
        value = row.get(field)
        if value is None:
            value = []
        elif not isinstance(value, list):
            value = [value]
        refs = [self._image(v, base_dir, where) for v in value]
        return conversation, refs

    def _image(self, value, base_dir, where):
        data = None
        if isinstance(value, dict):
            data, value = value.get("bytes"), value.get("path")
        if isinstance(value, (bytes, bytearray, memoryview)):
            data, value = bytes(value), None
        if data is not None:
            f = self.blob
            offset = f.tell()
            f.write(data)
            return self._range(f.name, offset, len(data), f"{where}: image bytes")
        if not isinstance(value, str) or not value:
            raise _BadRow(f"an image is a path, bytes or {{'bytes', 'path'}}, got {value!r}",
                          where)
        if self.members is not None:
            hit = self.members.get(value)
            if hit is None:
                raise _BadRow(f"image {value!r} is in none of the tar shards", where)
            shard, offset, size = hit
            shard = self.shard_urls.get(shard, shard)  # a remote shard by its URL
            return self._range(shard, offset, size, f"{shard}:{value}")
        if self.remote_folder:
            path = f"{self.folder}/{value.lstrip('/')}"
        else:
            path = os.path.join(self.folder or base_dir or "", value)
        return self._range(path, 0, _WHOLE, path)

    def _range(self, file, offset, size, name):
        key = (file, offset)
        hit = self.name_index.get(key)
        if hit is not None and offset == 0 and size == _WHOLE:
            return hit
        index = self.file_index.setdefault(file, len(self.files))
        if index == len(self.files):
            self.files.append(file)
        self.range_file.append(index)
        self.range_offset.append(offset)
        self.range_size.append(size)
        self.names.append(name)
        self.name_index[key] = len(self.names) - 1
        return len(self.names) - 1

    def table(self, bad):
        """The rows' images: per row its range of row_image_ids (row_images, from 0), and the
        images as FileRanges' arguments; rows met, skipped here and why."""
        return {"row_base": np.asarray(self.row_base, dtype=np.int64),
                "row_images": np.asarray(self.row_images, dtype=np.int64),
                "row_image_ids": np.asarray(self.row_image_ids, dtype=np.int64),
                "files": list(self.files), "range_file": np.asarray(self.range_file, np.uint32),
                "range_offset": np.asarray(self.range_offset, np.uint64),
                "range_size": np.asarray(self.range_size, np.uint64), "names": list(self.names),
                "count": self.count, "bad": bad, "reasons": list(self.reasons)}


class _BadRow(ValueError):
    def __init__(self, message, where=""):
        super().__init__(message)
        self.where = where


def _message(turn, where):
    """A turn as transformers takes it: {"role", "content"}, the content a list of items with
    each placeholder an image item."""
    if not isinstance(turn, dict):
        raise _BadRow(f"a message is an object, got {type(turn).__name__}", where)
    if "from" in turn and "value" in turn:
        role = _ROLES.get(turn["from"])
        if role is None:
            raise _BadRow(f"unknown speaker {turn['from']!r} (LLaVA's: human, gpt, system)", where)
        content = turn["value"]
    else:
        role, content = turn.get("role"), turn.get("content")
        if not isinstance(role, str):
            raise _BadRow("a message has no role", where)
    if isinstance(content, list):
        return {**turn, "role": role, "content": content} if "from" not in turn else \
            {"role": role, "content": content}
    if not isinstance(content, str):
        raise _BadRow(f"a message's content is text or a list, got {type(content).__name__}",
                      where)
    items = []
    for k, piece in enumerate(content.split("<image>")):
        if k:
            items.append({"type": "image"})
        piece = piece.strip()
        if piece:
            items.append({"type": "text", "text": piece})
    return {"role": role, "content": items}


def _inputs(source, storage_options=None, cache_dir=None, cache_budget=None):
    """(name, rows, base folder, identity) per input: rows an iterable of dicts (or _Line, or
    _BadRow for a line that is not one), read when iterated; identity what a cache key records
    of it (None: nothing stable). Remote files (s3://, gs://, hf://, ...) are fetched into the
    cache first; errors name their URLs, and their image paths are relative to images=."""
    if type(source).__name__ == "Dataset" and type(source).__module__.startswith("datasets"):
        source = _undecoded(source)
        return [("<datasets.Dataset>", iter(source), None, ["dataset", source._fingerprint])]
    if isinstance(source, list) and (not source or isinstance(source[0], dict)):
        return [("<rows>", source, None, None)]
    names = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not names:
        raise ValueError("VLMDataset needs at least one source")
    if _remote_files.is_remote(names):
        urls, local = _remote_files.stage(
            names, "VLMDataset", storage_options=storage_options,
            cache_dir=cache_dir and os.path.join(os.fspath(cache_dir), "remote"),
            cache_budget=cache_budget)
        return [(url, _rows_of(path, url), None, [url] + _file_identity(path)[1:])
                for url, path in zip(urls, local)]
    return [(os.fspath(n), _rows_of(os.fspath(n)), os.path.dirname(os.path.abspath(n)),
             _file_identity(n)) for n in names]


def _undecoded(ds):
    """A datasets.Dataset whose Image columns (or lists of images) give their encoded bytes,
    {"bytes", "path"}, instead of PIL images: the engine decodes them (a cast of the features,
    no data rewritten)."""
    import datasets

    def plain(feature):
        if isinstance(feature, datasets.Image) and feature.decode:
            return datasets.Image(decode=False)
        inner = getattr(feature, "feature", None)  # List / Sequence / LargeList of images
        if isinstance(inner, datasets.Image) and inner.decode:
            return type(feature)(datasets.Image(decode=False))
        if isinstance(feature, list) and len(feature) == 1 and \
                isinstance(feature[0], datasets.Image) and feature[0].decode:
            return [datasets.Image(decode=False)]
        return feature

    features = datasets.Features({k: plain(f) for k, f in ds.features.items()})
    return ds if features == ds.features else ds.cast(features)


def _rows_of(path, name=None):
    """The rows of a local file, by the name's suffix (a fetched remote file's: its URL's)."""
    lower = (name or path).lower()
    if lower.endswith(".json"):
        return _json_rows(path, name or path)
    if lower.endswith((".jsonl", ".ndjson")):
        return _jsonl_rows(path)
    if lower.endswith(".parquet"):
        return _parquet_rows(path)
    raise ValueError(f"{name or path}: VLMDataset reads .json (LLaVA's list of rows), .jsonl and "
                     f".parquet")


def _file_identity(path):
    st = os.stat(path)
    return [os.path.abspath(path), st.st_size, st.st_mtime_ns]


def _json_rows(path, name):
    with open(path, "rb") as f:
        try:
            rows = json.loads(f.read())
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"{name}: not JSON ({e}); LLaVA's format is a JSON list of rows") \
                from None
    if not isinstance(rows, list):
        raise ValueError(f"{name}: a JSON list of rows, got {type(rows).__name__}")
    yield from rows


class _Line:
    """A JSONL row and its line (from 1), which errors name."""
    __slots__ = ("number", "row")

    def __init__(self, number, row):
        self.number, self.row = number, row


def _jsonl_rows(path):
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, UnicodeDecodeError) as e:
                row = _BadRow(f"not JSON ({e})")
            yield _Line(number, row)


def _parquet_rows(path):
    import pyarrow.parquet as pq
    for batch in pq.ParquetFile(path).iter_batches(batch_size=_BATCH_ROWS):
        yield from batch.to_pylist()


def _local_files(files, fetch):
    """The images' files, remote ones (URLs: an image of a remote folder, a remote shard) fetched
    into the cache, now and whenever the dataset is made (an index kept in cache_dir names
    them by URL). A URL with no object stays as it is: the engine reports its conversations'
    image as missing, by its URL."""
    urls = [f for f in files if _remote_files.is_remote(f)]
    if not urls:
        return list(files)
    _, local = _remote_files.stage(urls, "VLMDataset's images", missing_ok=True, expand=False,
                                   **fetch)
    where = dict(zip(urls, local))
    return [where.get(f) or f for f in files]


def _tar_members(shards):
    """member path -> (shard, data offset, size), the first shard's where two hold one."""
    out = {}
    for shard in shards:
        with tarfile.open(shard, "r:") as tar:
            for m in tar:
                if m.isfile():
                    out.setdefault(m.name, (shard, m.offset_data, m.size))
    return out
