"""The field specs of ``TarShards(fields=...)``: what one member of a sample becomes in a batch.

Each spec is a plain value (picklable: a dataset rebuilt in a worker process or on another node
makes the same fields); ``_native(name, max_pixels)`` makes the dict the C++ source takes
(bindings/image_text.cc)."""

from __future__ import annotations

import numbers

from .. import _native


def _exts(ext, what):
    exts = (ext,) if isinstance(ext, str) else tuple(ext)
    if not exts or not all(isinstance(e, str) and e for e in exts):
        raise ValueError(f"{what}: ext is an extension or a tuple of them, got {ext!r}")
    return tuple(e.lower().lstrip(".") for e in exts)


class AspectBuckets:
    """Aspect-ratio buckets for ``Image(buckets=...)``, the SDXL way: a list of sizes (height,
    width), each image going to the one nearest its aspect ratio.

    ``AspectBuckets(pixels=1024 * 1024, step=64)`` makes them for a pixel budget: for every
    width from ``min_size`` to ``max_size`` in ``step``\ s, the largest height (a multiple of
    ``step``, at most ``max_size``) whose area stays within ``pixels``, and the same sizes turned
    (portrait and landscape); kohya's ``make_bucket_resolutions``. ``min_size`` and ``max_size``
    default to half and twice the square side, rounded to ``step`` (1024²: 512 to 2048, 1:4 to
    4:1). ``AspectBuckets(sizes=[(h, w), ...])`` takes the sizes as given (SDXL's published
    list, say)."""

    def __init__(self, pixels=None, step=64, min_size=None, max_size=None, *, sizes=None):
        if (pixels is None) == (sizes is None):
            raise ValueError("AspectBuckets takes pixels= (a budget that makes the sizes) or "
                             "sizes= (a list of (height, width)), one of them")
        if sizes is not None:
            try:
                got = [(int(h), int(w)) for h, w in sizes]
            except (TypeError, ValueError):
                raise ValueError(f"AspectBuckets sizes are (height, width) pairs, got "
                                 f"{sizes!r}") from None
            if not got or any(h <= 0 or w <= 0 or (h, w) != tuple(x) for (h, w), x in
                              zip(got, sizes)):
                raise ValueError(f"AspectBuckets sizes are positive integer (height, width) "
                                 f"pairs, got {sizes!r}")
            if len(set(got)) != len(got):
                raise ValueError(f"AspectBuckets sizes hold a size twice: {sizes!r}")
            self.sizes = got
            self.pixels = self.step = self.min_size = self.max_size = None
            return
        for what, v in (("pixels", pixels), ("step", step)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
                raise ValueError(f"AspectBuckets {what} must be a positive integer, got {v!r}")
        side = int(round(pixels ** 0.5))
        min_size = max(step, round(side / 2 / step) * step) if min_size is None else min_size
        max_size = max(step, round(side * 2 / step) * step) if max_size is None else max_size
        for what, v in (("min_size", min_size), ("max_size", max_size)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
                raise ValueError(f"AspectBuckets {what} must be a positive integer, got {v!r}")
        if min_size > max_size:
            raise ValueError(f"AspectBuckets min_size {min_size} exceeds max_size {max_size}")
        found = set()
        for w in range(-(-min_size // step) * step, max_size + 1, step):  # multiples of step
            h = min(max_size, pixels // w // step * step)
            if h >= min_size:
                found.update({(h, w), (w, h)})
        if not found:
            raise ValueError(f"AspectBuckets(pixels={pixels}, step={step}, min_size={min_size}, "
                             f"max_size={max_size}) makes no size")
        self.sizes = sorted(found, key=lambda s: (s[1] / s[0], s))
        self.pixels, self.step, self.min_size, self.max_size = pixels, step, min_size, max_size

    def __len__(self):
        return len(self.sizes)

    def __eq__(self, other):
        return isinstance(other, AspectBuckets) and self.sizes == other.sizes

    def __hash__(self):
        return hash(tuple(self.sizes))

    def __repr__(self):
        if self.pixels is None:
            return f"AspectBuckets(sizes={self.sizes!r})"
        return (f"AspectBuckets(pixels={self.pixels}, step={self.step}, "
                f"min_size={self.min_size}, max_size={self.max_size})")


_CROPS = ("random", "center")


class Image:
    """The sample's image member (the first of ``ext`` the key has), decoded and transformed by
    the native image pipeline: ``transform`` is a :mod:`stoker.transforms` pipeline (or a
    torchvision v2 recipe it compiles) that ends in a fixed size and runs natively (a transform
    with a Python part is a ValueError naming it). Randomness is keyed by (seed, epoch, sample
    index), as TarShards' images are.

    ``transform`` may be a Hugging Face processor made native by
    ``ImageProcessor.from_pretrained``: a fixed-resolution one (CLIP, SigLIP) is such a
    pipeline; Qwen2-VL's (a PatchImageProcessor) makes the field ragged: float32 patches
    ``[patches, 3 * temporal_patch_size * patch_size**2]`` (a batch pads them to its longest
    sample and adds ``lengths``, each sample's patch count) and ``grid_name`` (default
    ``"image_grid_thw"``), int64 ``[3]``. A dataset takes one such field; each image's header is
    read when the dataset is made, for its patch count.

    ``buckets``: an :class:`AspectBuckets` (or a list of (height, width)): each image goes to the
    bucket nearest its aspect ratio, read from its header when the shards are indexed (no
    decode), is resized to cover the bucket and cropped to it (``crop``: "random" or "center"),
    and then runs ``transform`` (None: uint8 CHW; else flips, colour, ``ToTensor``,
    ``Normalize``, ..., nothing that changes the size). Every batch is then from one bucket: a
    loader plans the epoch by bucket (``batch_size=N``: N images a batch;
    ``stoker.Budget(pixels=P)``: as many as fit in P pixels). The batch also holds each image's
    ``original_sizes`` (height, width) and ``crop_top_lefts`` (top, left in the resized image),
    what SDXL conditions on (``<key>_original_sizes`` and ``<key>_crop_top_lefts`` for a key
    other than ``pixel_values``). One Image field at most has buckets."""

    def __init__(self, transform=None, ext=("jpg", "jpeg", "png", "webp"),
                 grid_name="image_grid_thw", *, buckets=None, crop="random"):
        self.transform = transform
        self.ext = _exts(ext, "Image")
        self.grid_name = grid_name
        if buckets is not None and not isinstance(buckets, AspectBuckets):
            buckets = AspectBuckets(sizes=buckets)
        self.buckets = buckets
        if crop not in _CROPS:
            raise ValueError(f'Image crop is "random" or "center", got {crop!r}')
        self.crop = crop

    @staticmethod
    def extra_names(name):
        """The names of a bucketed field's original sizes and crops in the batch."""
        if name == "pixel_values":
            return "original_sizes", "crop_top_lefts"
        return f"{name}_original_sizes", f"{name}_crop_top_lefts"

    def _native(self, name, max_pixels):
        from ..transforms import _compile
        from .processors import PatchImageProcessor, TileImageProcessor
        if isinstance(self.transform, TileImageProcessor):
            raise ValueError(f"fields[{name!r}]: LLaVA-NeXT's processor is VLMDataset's (its "
                             f"tokens come with the conversation); not a TarShards field")
        if isinstance(self.transform, PatchImageProcessor):
            if self.buckets is not None:
                raise ValueError(f"fields[{name!r}]: a Qwen2-VL processor sizes each image "
                                 f"itself: no aspect-ratio buckets with it")
            return {"kind": "patches", "name": name, "exts": list(self.ext),
                    "processor": self.transform._native, "grid_name": self.grid_name,
                    "max_pixels": int(max_pixels or 0)}
        if self.transform is None and self.buckets is None:
            raise ValueError(f"fields[{name!r}]: Image needs a transform that ends in a fixed "
                             f"size, e.g. Compose([Resize(256), CenterCrop(224), ToTensor()])")
        specs, alpha = [], "drop"
        if self.transform is not None:
            compiled = _compile.compile_transform(self.transform)
            if compiled.python:
                raise ValueError(f"fields[{name!r}]: {compiled.python_names[0]} has no native "
                                 f"form; an Image field runs its transform natively only")
            specs, alpha = list(compiled.specs), compiled.alpha
        out = {"kind": "image", "name": name, "exts": list(self.ext)}
        if self.buckets is None:
            out["pipeline"] = _native.image.ImagePipeline(specs, max_pixels, alpha=alpha)
            return out
        out["sizes_name"], out["crops_name"] = self.extra_names(name)
        out["bucket_pipelines"] = [
            _native.image.ImagePipeline(
                [("CoverCrop", {"height": h, "width": w, "random": self.crop == "random",
                                "antialias": True})] + specs, max_pixels, alpha=alpha)
            for h, w in self.buckets.sizes]
        return out

    def __repr__(self):
        extra = "" if self.buckets is None else f", buckets={self.buckets!r}, crop={self.crop!r}"
        return f"Image({self.transform!r}, ext={self.ext!r}{extra})"


class Text:
    """The sample's caption (UTF-8 text), tokenized natively: int64 ids ``[max_length]``, and an
    attention mask (int64, 1 for real tokens) in the batch under ``<key>_attention_mask``, or
    ``attention_mask`` for the key ``input_ids`` (as Hugging Face processors name them).

    ``tokenizer``: a ``stoker.Tokenizer``, a ``tokenizers.Tokenizer`` or a transformers fast
    tokenizer (converted by ``Tokenizer.from_hf``), or a path (``Tokenizer.from_file``). The ids
    are those of ``tokenizer(text, padding="max_length", max_length=max_length,
    truncation=True)``: the caption's tokens cut to leave room for the post-processor's special
    tokens (``add_special_tokens``), which are then put around them (CLIP keeps its final
    ``<|endoftext|>``), and ``pad_id`` after them: by default the id of the tokenizer's
    ``pad_token`` (CLIP pads with ``<|endoftext|>``); ValueError where it has none and no
    ``pad_id`` is given. ``truncation=False``: a longer caption is an error of its sample.

    ``padding="longest"``: variable-length captions, ``tokenizer(texts, padding="longest",
    truncation=True, max_length=max_length)``: each batch padded to its longest caption (ids with
    ``pad_id``, mask 0), and a ``lengths`` field (int64 [B]); ``max_length`` is then the cap (None:
    none). Every caption is tokenized when the shards are indexed (local shards), so its length is
    known before the epoch: ``stoker.Budget(tokens=N)`` batches captions by their padded size.

    ``raw=True``: the caption itself, a Python str per sample (a list in the batch), read and
    checked to be UTF-8 natively, decoded to str when the batch is assembled; no tokenizer."""

    def __init__(self, tokenizer=None, max_length=77, padding="max_length", truncation=True,
                 ext="txt", add_special_tokens=True, pad_id=None, raw=False):
        if padding not in ("max_length", "longest"):
            raise ValueError(f'Text: padding is "max_length" or "longest", got {padding!r}')
        if raw and tokenizer is not None:
            raise ValueError("Text(raw=True) keeps the caption as text: it takes no tokenizer")
        if not raw and tokenizer is None:
            raise ValueError("Text needs a tokenizer (or raw=True for the caption as a str)")
        if not (max_length is None and padding == "longest") and (
                isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral)
                or max_length < 1):
            raise ValueError(f"Text: max_length is a positive integer (None with "
                             f'padding="longest"), got {max_length!r}')
        self.tokenizer = tokenizer
        self.max_length = None if max_length is None else int(max_length)
        self.padding = padding
        self.truncation = bool(truncation)
        self.ext = _exts(ext, "Text")
        self.add_special_tokens = bool(add_special_tokens)
        self.pad_id = pad_id
        self.raw = bool(raw)

    @staticmethod
    def mask_name(name):
        """The attention mask's key for a Text field of key ``name``."""
        return "attention_mask" if name == "input_ids" else f"{name}_attention_mask"

    def _stoker_tokenizer(self):
        from ..text import Tokenizer
        t = self.tokenizer
        if isinstance(t, Tokenizer):
            return t
        if isinstance(t, (str, bytes)) or hasattr(t, "__fspath__"):
            return Tokenizer.from_file(t)
        return Tokenizer.from_hf(t)

    def _pad_id(self, tokenizer):
        if self.pad_id is not None:
            return int(self.pad_id)
        pad = tokenizer.template_tokens().get("pad_token")
        hf = getattr(self.tokenizer, "pad_token_id", None)  # a transformers tokenizer's own
        if hf is not None:
            return int(hf)
        if pad is not None and tokenizer.token_to_id(pad) is not None:
            return tokenizer.token_to_id(pad)
        raise ValueError("Text: the tokenizer names no pad token; pass pad_id= (CLIP pads with "
                         "its <|endoftext|> id)")

    def _native(self, name, max_pixels):
        if self.raw:
            return {"kind": "raw", "name": name, "exts": list(self.ext)}
        tokenizer = self._stoker_tokenizer()
        return {"kind": "text", "name": name, "exts": list(self.ext),
                "tokenizer": tokenizer._native, "max_length": self.max_length or 0,
                "ragged": self.padding == "longest",
                "truncation": self.truncation, "add_special_tokens": self.add_special_tokens,
                "pad_id": self._pad_id(tokenizer), "mask_name": self.mask_name(name)}

    def __repr__(self):
        return (f"Text(max_length={self.max_length}, padding={self.padding!r}, "
                f"truncation={self.truncation}, "
                f"ext={self.ext!r}, add_special_tokens={self.add_special_tokens}, "
                f"pad_id={self.pad_id!r}, raw={self.raw})")


class Json:
    """A number, or a fixed-length list of numbers, picked by name from the sample's JSON object
    member: ``key`` is a name or a dotted path (``"a.b"``). ``dtype`` "float32" or "int64" (the
    latter takes integers only). The shape is the first sample's; an absent or null value takes
    ``default`` (a number, or a list of that length), and without one is an error of its
    sample."""

    def __init__(self, key, dtype="float32", default=None, ext="json"):
        if not isinstance(key, str) or not key:
            raise ValueError(f"Json: key is a name or a dotted path, got {key!r}")
        if dtype not in ("float32", "int64"):
            raise ValueError(f'Json: dtype is "float32" or "int64", got {dtype!r}')
        self.key = key
        self.dtype = dtype
        self.default = default
        self.ext = _exts(ext, "Json")

    def _native(self, name, max_pixels):
        d = {"kind": "json", "name": name, "exts": list(self.ext), "key": self.key,
             "dtype": self.dtype}
        if self.default is not None:
            is_list = not isinstance(self.default, numbers.Number)
            d["default"] = [float(v) for v in self.default] if is_list else [float(self.default)]
            d["default_is_list"] = is_list
        return d

    def __repr__(self):
        return (f"Json({self.key!r}, dtype={self.dtype!r}, default={self.default!r}, "
                f"ext={self.ext!r})")


class Label:
    """The sample's decimal integer label (int64), from its ``.cls`` member."""

    def __init__(self, ext="cls"):
        self.ext = _exts(ext, "Label")

    def _native(self, name, max_pixels):
        return {"kind": "label", "name": name, "exts": list(self.ext)}

    def __repr__(self):
        return f"Label(ext={self.ext!r})"


class Npy:
    """The sample's ``.npy`` array member: its dtype and shape are the first sample's, and every
    other sample must have the same (an error naming the sample otherwise)."""

    def __init__(self, ext="npy"):
        self.ext = _exts(ext, "Npy")

    def _native(self, name, max_pixels):
        return {"kind": "npy", "name": name, "exts": list(self.ext)}

    def __repr__(self):
        return f"Npy(ext={self.ext!r})"


SPECS = (Image, Text, Json, Label, Npy)
