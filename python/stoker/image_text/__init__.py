"""Image-text samples: WebDataset shards whose samples hold any fields (img2dataset's
``<key>.jpg`` + ``<key>.txt`` + ``<key>.json``, a ``.cls``, a ``.npy``), read by
``stoker.TarShards(paths, fields={...})``.

``fields`` maps each batch key (the name the model takes: ``pixel_values``, ``input_ids``, ...) to
one of the specs below; a sample is then a dict and so is a batch. Every member is decoded in C++
worker threads (include/stoker/image_text/image_text_source.h): images by the image pipeline,
captions by the native ``stoker.Tokenizer``, JSON values by simdjson. docs/image-text.md has an
example over img2dataset's shards. ``ImageProcessor.from_pretrained`` makes Hugging Face image
processors (CLIP, SigLIP, Qwen2-VL, LLaVA-NeXT) native (processors.py). ``VLMDataset`` (vlm.py, also
``stoker.VLMDataset``): conversations with images, as a vision-language model's processor makes
them.
"""

from __future__ import annotations

from . import dataset as _dataset  # noqa: F401  (what TarShards(fields=...) makes)
from .fields import AspectBuckets, Image, Json, Label, Npy, Text
from .processors import (FixedImageProcessor, ImageProcessor, PatchImageProcessor,
                         TileImageProcessor)
from .vlm import VLMDataset

__all__ = ["AspectBuckets", "FixedImageProcessor", "Image", "ImageProcessor", "Json", "Label",
           "Npy", "PatchImageProcessor", "Text", "TileImageProcessor", "VLMDataset"]
