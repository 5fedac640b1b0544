"""Hugging Face image processors, natively: ``ImageProcessor.from_pretrained(x)``.

``x`` is a directory holding ``preprocessor_config.json`` (or that file), the config as a dict, or
a transformers image processor object. Supported (the config's ``image_processor_type``, with or
without transformers' ``Fast``/``Pil`` suffix):

- ``CLIPImageProcessor`` (LLaVA-1.5's: shortest edge 336, center crop 336) and
  ``SiglipImageProcessor`` (an exact size) become a :class:`FixedImageProcessor`: a
  :mod:`stoker.transforms` pipeline (Resize with PIL's bicubic, CenterCrop with Hugging Face's
  offset, ToTensor, Normalize with the rescale factor folded in) that
  ``stoker.image_text.Image(transform=processor)`` runs natively;
- ``Qwen2VLImageProcessor`` (Qwen2-VL's, Qwen2.5-VL's, Qwen3-VL's) becomes a
  :class:`PatchImageProcessor` (the native patch processor,
  include/stoker/image_text/patch_processor.h): an image's (patches, image_grid_thw), its number
  of image tokens from its size alone;
- ``LlavaNextImageProcessor`` becomes a :class:`TileImageProcessor` (the native any-resolution
  processor, include/stoker/image_text/tile_processor.h): an image's tiles (the base tile and a
  grid chosen by its size) and image_sizes, its number of image tokens from its size alone.

Images are read as transformers' ``convert_to_rgb`` reads them: a PNG's transparency (an alpha
channel, palette alphas, a transparent colour) composited on white, bit for bit as PIL's
``alpha_composite`` (``decode_alpha = "white"``; torchvision's loader drops the alpha instead).

A config option the native form does not reproduce is a ValueError naming it.
"""

from __future__ import annotations

import json
import math
import numbers
import os

import numpy as np

from .. import transforms as T

# Options every processor may carry that change nothing here.
_IGNORED = {"image_processor_type", "processor_class", "feature_extractor_type", "_processor_class",
            "model_input_names", "input_data_format", "data_format", "return_tensors", "device",
            "disable_grouping", "default_to_square", "image_seq_length", "num_image_tokens",
            "return_dict"}
_BICUBIC, _BILINEAR = 3, 2


def _config_of(source):
    """The config dict of a path, a dict or a transformers image processor."""
    if isinstance(source, dict):
        return dict(source)
    if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
        path = os.fsdecode(source)
        if os.path.isdir(path):
            # transformers 5 saves a processor's image processor in processor_config.json
            nested = os.path.join(path, "processor_config.json")
            path = os.path.join(path, "preprocessor_config.json")
            if not os.path.exists(path) and os.path.exists(nested):
                with open(nested, encoding="utf-8") as f:
                    cfg = json.load(f).get("image_processor")
                if isinstance(cfg, dict):
                    return cfg
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    to_dict = getattr(source, "to_dict", None)
    if callable(to_dict):
        cfg = dict(to_dict())
        cfg.setdefault("image_processor_type", type(source).__name__)
        return cfg
    raise TypeError(f"ImageProcessor.from_pretrained takes a directory, a "
                    f"preprocessor_config.json, a config dict or a transformers image "
                    f"processor, got {type(source).__name__}")


def _kind(cfg):
    name = str(cfg.get("image_processor_type") or cfg.get("feature_extractor_type") or "")
    for suffix in ("Fast", "Pil"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    name = name.replace("FeatureExtractor", "ImageProcessor")
    return name


def _resample(cfg, name):
    r = cfg.get("resample", _BICUBIC)
    r = getattr(r, "value", r)
    if r == _BICUBIC:
        return "bicubic"
    if r == _BILINEAR:
        return "bilinear"
    raise ValueError(f"{name}: resample={r!r} is not reproduced natively (bicubic, 3, or "
                     f"bilinear, 2)")


def _triple(cfg, key, name, default):
    v = cfg.get(key, default)
    if v is None:
        v = default
    if isinstance(v, numbers.Number):
        v = [v] * 3
    v = [float(x) for x in v]
    if len(v) != 3:
        raise ValueError(f"{name}: {key} must have 3 values (RGB), got {v!r}")
    return v


def _check_flags(cfg, name, known):
    for key, value in cfg.items():
        if key in _IGNORED or key in known:
            continue
        if key in ("do_pad", "do_reduce_labels") and not value:
            continue
        if value is None:
            continue
        raise ValueError(f"{name}: option {key}={value!r} is not reproduced natively")
    for key in ("do_resize", "do_rescale", "do_normalize"):
        if cfg.get(key, True) is False:
            raise ValueError(f"{name}: option {key}=False is not reproduced natively")
    if cfg.get("do_convert_rgb", True) is False:
        raise ValueError(f"{name}: option do_convert_rgb=False is not reproduced natively "
                         f"(images are always decoded to RGB)")


def _size(value, name, key):
    if isinstance(value, numbers.Integral):
        return {"shortest_edge": int(value)} if key == "size" else {"height": int(value),
                                                                     "width": int(value)}
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if v is not None}
    raise ValueError(f"{name}: {key}={value!r} is not a size")


class FixedImageProcessor(T.Compose):
    """A fixed-resolution Hugging Face processor as a native transform pipeline: pass it as
    ``stoker.image_text.Image(transform=processor)`` (or any dataset's ``transform``). Its
    pixel_values are float32 CHW ``[3, height, width]``. ``config`` is the config it came from,
    ``kind`` its processor type. Its images are decoded with transparency composited on white,
    as the Hugging Face processor sees them (``decode_alpha``)."""

    decode_alpha = "white"

    def __init__(self, transforms, kind, config):
        super().__init__(transforms)
        self.kind = kind
        self.config = config

    def __repr__(self):  # Compose's, with the processor type first
        return super().__repr__().replace("(", f"({self.kind}:", 1)


def _fixed(cfg, kind):
    name = kind
    known = {"do_convert_rgb", "do_resize", "size", "resample", "do_rescale", "rescale_factor",
             "do_normalize", "image_mean", "image_std"}
    if kind == "CLIPImageProcessor":
        known |= {"do_center_crop", "crop_size"}
    _check_flags(cfg, name, known)
    interp = _resample(cfg, name)
    size = _size(cfg.get("size", {"shortest_edge": 224} if kind == "CLIPImageProcessor"
                         else {"height": 224, "width": 224}), name, "size")
    out = []
    if set(size) == {"shortest_edge"}:
        out.append(T.Resize(int(size["shortest_edge"]), interpolation=interp))
        short = int(size["shortest_edge"])
    elif set(size) == {"height", "width"}:
        out.append(T.Resize((int(size["height"]), int(size["width"])), interpolation=interp))
        short = min(int(size["height"]), int(size["width"]))
    else:
        raise ValueError(f"{name}: size={size!r} is not reproduced natively ({{'shortest_edge': "
                         f"n}} or {{'height': h, 'width': w}})")
    if kind == "CLIPImageProcessor" and cfg.get("do_center_crop", True):
        crop = _size(cfg.get("crop_size", {"height": 224, "width": 224}), name, "crop_size")
        if set(crop) != {"height", "width"}:
            raise ValueError(f"{name}: crop_size={crop!r} is not reproduced natively")
        if max(crop["height"], crop["width"]) > short:
            # HF pads a crop larger than the image with its own offsets; not reproduced.
            raise ValueError(f"{name}: crop_size {crop!r} larger than the resized image's "
                             f"shorter side ({short}) is not reproduced natively")
        out.append(T.CenterCrop((int(crop["height"]), int(crop["width"])), rounding="floor"))
    mean = _triple(cfg, "image_mean", name, [0.48145466, 0.4578275, 0.40821073])
    std = _triple(cfg, "image_std", name, [0.26862954, 0.26130258, 0.27577711])
    if kind == "SiglipImageProcessor":
        mean = _triple(cfg, "image_mean", name, [0.5, 0.5, 0.5])
        std = _triple(cfg, "image_std", name, [0.5, 0.5, 0.5])
    rescale = float(cfg.get("rescale_factor", 1 / 255))
    if not rescale > 0:
        raise ValueError(f"{name}: rescale_factor must be positive, got {rescale!r}")
    if math.isclose(rescale, 1 / 255, rel_tol=1e-12):
        out += [T.ToTensor("float32"), T.Normalize(mean, std)]
    else:  # (v * r - mean) / std == (v - mean / r) / (std / r)
        out += [T.ToDtype("float32", scale=False),
                T.Normalize([m / rescale for m in mean], [s / rescale for s in std])]
    return FixedImageProcessor(out, kind, cfg)


class _DynamicProcessor:
    """What the native processors whose images' tokens depend on their size share
    (include/stoker/image_text/dynamic_images.h): ``processor(image)`` and
    ``num_image_tokens(height, width)``; subclasses make ``self._native`` with
    :meth:`_make`."""

    decode_alpha = "white"

    def _make(self, native_class, *args, **kwargs):
        try:
            self._native = native_class(*args, **kwargs)
        except Exception as e:  # InvalidArgument: a bad option, named
            raise ValueError(str(e)) from None

    def num_image_tokens(self, height, width):
        """The model's image tokens for an image of that size, without decoding it."""
        return self._native.image_tokens(int(height), int(width))

    def __call__(self, image):
        """(pixel rows, the image's info) of encoded bytes, a path, an HWC uint8 RGB array or a
        PIL image (transparency composited on white)."""
        if isinstance(image, np.ndarray):
            return self._native.process_rgb(np.ascontiguousarray(image, dtype=np.uint8))
        if isinstance(image, (str, os.PathLike)):
            with open(image, "rb") as f:
                image = f.read()
        if isinstance(image, (bytes, bytearray, memoryview)):
            return self._native.process_bytes(bytes(image))
        if hasattr(image, "convert"):  # a PIL image
            return self._native.process_rgb(np.asarray(_rgb_on_white(image)))
        raise TypeError(f"{type(self).__name__} takes encoded bytes, a path, an HWC uint8 array "
                        f"or a PIL image, got {type(image).__name__}")


class PatchImageProcessor(_DynamicProcessor):
    """Qwen2-VL's dynamic-resolution processor (include/stoker/image_text/patch_processor.h):
    ``processor(image)`` takes encoded bytes (JPEG, PNG, ...), a path, or an HWC uint8 RGB array
    and returns ``(pixel_values, image_grid_thw)``: float32 ``[t*h*w, 3 * temporal_patch_size *
    patch_size**2]`` and int64 ``[3]``, as Hugging Face's processor gives for one image.
    ``grid(height, width)`` and ``num_image_tokens(height, width)`` need only the size. Encoded
    images and PIL images with transparency are composited on white first, as transformers'
    ``convert_to_rgb`` does."""

    def __init__(self, patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=56 * 56,
                 max_pixels=28 * 28 * 1280, rescale_factor=1 / 255,
                 image_mean=(0.48145466, 0.4578275, 0.40821073),
                 image_std=(0.26862954, 0.26130258, 0.27577711), config=None):
        from .._text import image_text as native
        self.config = config
        self.options = dict(patch_size=int(patch_size), merge_size=int(merge_size),
                            temporal_patch_size=int(temporal_patch_size),
                            min_pixels=int(min_pixels), max_pixels=int(max_pixels),
                            rescale_factor=float(rescale_factor), mean=[float(v) for v in image_mean],
                            std=[float(v) for v in image_std])
        self._make(native.PatchProcessor, **self.options)

    def __reduce__(self):
        o = self.options
        return (_patch_processor, (o, self.config))

    def grid(self, height, width):
        """image_grid_thw (t, h, w) of an image of that size, without decoding it."""
        return self._native.grid(int(height), int(width))

    @property
    def patch_dim(self):
        return self._native.patch_dim

    @property
    def max_patches(self):
        """The most patches an image makes (max_pixels / patch_size**2)."""
        return self._native.max_patches

    def __repr__(self):
        o = self.options
        return (f"PatchImageProcessor(patch_size={o['patch_size']}, merge_size="
                f"{o['merge_size']}, temporal_patch_size={o['temporal_patch_size']}, min_pixels="
                f"{o['min_pixels']}, max_pixels={o['max_pixels']})")


def _rgb_on_white(image):
    """A PIL image as RGB, its transparency composited on white (transformers' convert_to_rgb)."""
    if "A" not in image.getbands() and image.info.get("transparency") is None:
        return image.convert("RGB")
    from PIL import Image
    rgba = image.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")


def _patch_processor(options, config):
    o = dict(options)
    return PatchImageProcessor(image_mean=o.pop("mean"), image_std=o.pop("std"), config=config,
                               **o)


class TileImageProcessor(_DynamicProcessor):
    """LLaVA-NeXT's any-resolution processor (include/stoker/image_text/tile_processor.h):
    ``processor(image)`` takes encoded bytes, a path, an HWC uint8 RGB array or a PIL image and
    returns ``(pixel_values, image_size)``: float32 ``[tiles, 3, crop, crop]`` (the base tile,
    then the grid's tiles row by row) and int64 ``[2]`` (height, width), as Hugging Face's
    processor gives for one image (without its batch padding of tiles). ``tiles(height,
    width)`` and ``num_image_tokens(height, width)`` need only the size; the tokens follow
    ``LlavaNextProcessor`` (its ``patch_size``, ``num_additional_image_tokens`` and
    ``vision_feature_select_strategy``: :meth:`with_model`)."""

    _LLAVA_1_6 = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))

    def __init__(self, image_grid_pinpoints=_LLAVA_1_6, crop_size=336, patch_size=14,
                 num_additional_image_tokens=1, vision_feature_select_strategy="default",
                 rescale_factor=1 / 255, image_mean=(0.48145466, 0.4578275, 0.40821073),
                 image_std=(0.26862954, 0.26130258, 0.27577711), config=None):
        from .._text import image_text as native
        if vision_feature_select_strategy not in ("default", "full"):
            raise ValueError(f"vision_feature_select_strategy is \"default\" or \"full\", got "
                             f"{vision_feature_select_strategy!r}")
        self.config = config
        self.options = dict(
            image_grid_pinpoints=[[int(h), int(w)] for h, w in image_grid_pinpoints],
            crop_size=int(crop_size), patch_size=int(patch_size),
            num_additional_image_tokens=int(num_additional_image_tokens),
            vision_feature_select_strategy=vision_feature_select_strategy,
            rescale_factor=float(rescale_factor), image_mean=[float(v) for v in image_mean],
            image_std=[float(v) for v in image_std])
        o = self.options
        self._make(native.TileProcessor, [tuple(p) for p in o["image_grid_pinpoints"]],
                   o["crop_size"], o["patch_size"], o["num_additional_image_tokens"],
                   vision_feature_select_strategy == "default", o["rescale_factor"],
                   o["image_mean"], o["image_std"])

    def with_model(self, **model):
        """The same processor with the model's ``patch_size``, ``num_additional_image_tokens``
        or ``vision_feature_select_strategy`` (a LlavaNextProcessor's), which set the tokens."""
        return TileImageProcessor(**{**self.options, **model}, config=self.config)

    def __reduce__(self):
        return (_tile_processor, (self.options, self.config))

    def best_resolution(self, height, width):
        """The (height, width) among image_grid_pinpoints an image of that size is fitted to."""
        return tuple(self._native.best_resolution(int(height), int(width)))

    def tiles(self, height, width):
        """Its tiles, the base one included."""
        return self._native.tiles(int(height), int(width))

    @property
    def max_tiles(self):
        return self._native.max_tiles

    def __repr__(self):
        o = self.options
        return (f"TileImageProcessor(image_grid_pinpoints={o['image_grid_pinpoints']}, "
                f"crop_size={o['crop_size']}, patch_size={o['patch_size']})")


def _tile_processor(options, config):
    return TileImageProcessor(**options, config=config)


def _llava_next(cfg, kind):
    name = kind
    known = {"do_convert_rgb", "do_resize", "size", "resample", "do_center_crop", "crop_size",
             "do_rescale", "rescale_factor", "do_normalize", "image_mean", "image_std",
             "image_grid_pinpoints", "do_pad"}
    _check_flags(cfg, name, known)
    if _resample(cfg, name) != "bicubic":
        raise ValueError(f"{name}: resample={cfg.get('resample')!r} is not reproduced natively "
                         f"(bicubic only)")
    size = _size(cfg.get("size", {"shortest_edge": 224}), name, "size")
    crop = _size(cfg.get("crop_size", {"height": 224, "width": 224}), name, "crop_size")
    side = size.get("shortest_edge", size.get("height"))
    if set(crop) != {"height", "width"} or crop["height"] != crop["width"] or \
            side != crop["height"] or size.get("width", side) != side:
        raise ValueError(f"{name}: size={size!r} with crop_size={crop!r} is not reproduced "
                         f"natively (a square crop of the size's side)")
    return TileImageProcessor(
        image_grid_pinpoints=cfg.get("image_grid_pinpoints") or TileImageProcessor._LLAVA_1_6,
        crop_size=int(crop["height"]), rescale_factor=cfg.get("rescale_factor", 1 / 255),
        image_mean=_triple(cfg, "image_mean", name, [0.48145466, 0.4578275, 0.40821073]),
        image_std=_triple(cfg, "image_std", name, [0.26862954, 0.26130258, 0.27577711]),
        config=cfg)


def _qwen2_vl(cfg, kind):
    name = kind
    known = {"do_convert_rgb", "do_resize", "size", "resample", "do_rescale", "rescale_factor",
             "do_normalize", "image_mean", "image_std", "patch_size", "merge_size",
             "temporal_patch_size", "min_pixels", "max_pixels"}
    _check_flags(cfg, name, known)
    if _resample(cfg, name) != "bicubic":
        raise ValueError(f"{name}: resample={cfg.get('resample')!r} is not reproduced natively "
                         f"(bicubic only)")
    size = cfg.get("size") or {}
    if not isinstance(size, dict):
        raise ValueError(f"{name}: size={size!r} is not reproduced natively")
    min_pixels = cfg.get("min_pixels") or size.get("shortest_edge") or size.get("min_pixels")
    max_pixels = cfg.get("max_pixels") or size.get("longest_edge") or size.get("max_pixels")
    return PatchImageProcessor(
        patch_size=cfg.get("patch_size", 14), merge_size=cfg.get("merge_size", 2),
        temporal_patch_size=cfg.get("temporal_patch_size", 2),
        min_pixels=min_pixels or 56 * 56, max_pixels=max_pixels or 28 * 28 * 1280,
        rescale_factor=cfg.get("rescale_factor", 1 / 255),
        image_mean=_triple(cfg, "image_mean", name, [0.48145466, 0.4578275, 0.40821073]),
        image_std=_triple(cfg, "image_std", name, [0.26862954, 0.26130258, 0.27577711]),
        config=cfg)


_KINDS = {"CLIPImageProcessor": _fixed, "SiglipImageProcessor": _fixed,
          "Qwen2VLImageProcessor": _qwen2_vl, "LlavaNextImageProcessor": _llava_next}


class ImageProcessor:
    """The native form of a Hugging Face image processor (module docstring)."""

    @staticmethod
    def from_pretrained(source):
        """A :class:`FixedImageProcessor` (CLIP, SigLIP), :class:`PatchImageProcessor`
        (Qwen2-VL) or :class:`TileImageProcessor` (LLaVA-NeXT) from a directory, a
        preprocessor_config.json, a config dict or a
        transformers image processor. ValueError for another processor type or an option the
        native form does not reproduce, naming it."""
        cfg = _config_of(source)
        kind = _kind(cfg)
        make = _KINDS.get(kind)
        if make is None:
            raise ValueError(f"image processor {kind or '(no image_processor_type)'!r} has no "
                             f"native form (supported: {', '.join(sorted(_KINDS))})")
        return make(cfg, kind)
