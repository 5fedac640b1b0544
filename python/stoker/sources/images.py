"""Image classification datasets: torchvision's ImageFolder layout and WebDataset tar shards.

Both decode and augment in C++ worker threads (see :mod:`stoker.transforms`); a
``stoker.DataLoader`` over them yields ``(images, labels)`` batches. Augmentation randomness
depends only on (seed, epoch, sample index), so batches are bit-identical whatever the worker
count.
"""

from __future__ import annotations

import functools
import os
import time
import warnings

import numpy as np

from .. import _native
from ..gpu import decode as gpu_decode
from ..transforms import _compile
from . import paths as _paths
from .base import StokerDataset
from . import remote as _remote_shards
from ._checks import DEFAULT_MAX_PIXELS, check_index, check_max_pixels
from .tar_index import remote_tar_index

__all__ = ["IMG_EXTENSIONS", "ImageFolder", "TarShards"]

# torchvision.datasets.folder.IMG_EXTENSIONS: the files ImageFolder lists. Stoker decodes JPEG and
# PNG; the other formats are listed (as torchvision does) and fail to decode as unsupported.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

_NO_TRANSFORM = (
    "{name} was made without a transform, so its images have different sizes and cannot be "
    "batched; pass a transform that ends in a fixed size, e.g. "
    "transform=stoker.transforms.Compose([Resize(256), CenterCrop(224), ToTensor()])")


class PythonTransformWarning(UserWarning):
    """A transform with no native form: it and the transforms after it run in Python."""


# Datasets rebuilt in worker processes (unpickled) do not repeat the notice.
_quiet = False


def rebuild_quietly(make, *args, **kwargs):
    """``make(*args, **kwargs)`` without the Python-transform notice: a dataset unpickled in a
    worker process already gave it where it was made."""
    global _quiet
    was, _quiet = _quiet, True
    try:
        return make(*args, **kwargs)
    finally:
        _quiet = was


class ImageSamples:
    """Encoded images decoded and transformed: natively where the transform has a native form, the
    rest in Python. What ImageFolder, TarShards and TableDataset(image=...) hold (as the
    dataset's ``_images``; sources/base.py says what the loader reads of it).

    ``files``: the engine's files (ImageFolderFiles, TarShardFiles, a table's image column);
    ``name``: the dataset's class name, for messages."""

    def __init__(self, name, files, transform, max_pixels, decode="cpu", paths=None):
        self.files = files
        self.transform = transform
        self.max_pixels = check_max_pixels(max_pixels)
        self.decode = gpu_decode.check_decode(decode)
        if decode == "cuda":
            gpu_decode.require_gpu_decode()
        self.compiled = None  # the compiled transform (transforms/_compile.py)
        self.source = self.cpu_source = self.unbatchable = None
        if transform is None:
            self.unbatchable = _NO_TRANSFORM.format(name=name)
            return
        compiled = self.compiled = _compile.compile_transform(transform)
        if compiled.python:
            # Some of it runs in Python: the dataset is then a Python one to the loader (worker
            # processes; per-sample seeding keeps batches identical whatever the workers).
            if decode == "cuda":
                raise ValueError(f"decode=\"cuda\" needs a transform that runs natively; "
                                 f"{compiled.python_names[0]} runs in Python")
            self.prefix = _native.image.ImagePipeline(compiled.specs, self.max_pixels,
                                                      any_size=True, alpha=compiled.alpha)
            self.python_input = _compile.python_input_kind(compiled.python)
            self._notice(compiled)
            return
        specs = compiled.specs
        self.source = self.cpu_source = _native.sources.ImageSource(files, specs, max_pixels,
                                                                    alpha=compiled.alpha)
        if decode == "cuda":  # the loader's workers stage batches for the GPU stage
            self.source = gpu_decode.staging_source(files, specs, max_pixels, paths)

    @property
    def decodes_on_gpu(self):
        return self.decode == "cuda" and self.source is not None

    def _notice(self, compiled):
        """The one-line notice of a transform that runs in Python, with its cost on the first
        image when it can be measured."""
        if _quiet:
            return
        cost = ""
        if len(self.files) > 0:
            try:
                data = self.files.read(0)
                t0 = time.perf_counter()
                image = self.prefix.run(data, 0)
                t1 = time.perf_counter()
                self.run_python(image)
                t2 = time.perf_counter()
                cost = _compile.describe_cost((t1 - t0) * 1e3, (t2 - t1) * 1e3)
            except Exception:  # a bad first sample: the notice goes without figures
                cost = ""
        native = ", ".join(compiled.native_names) or "decoding only"
        warnings.warn(
            f"stoker: {compiled.python_names[0]} has no native form, so it and the "
            f"{len(compiled.python) - 1} transform(s) after it run in Python on each image, in "
            f"worker processes{cost}; natively: {native}. stats()['transforms'] says what ran "
            f"where.", PythonTransformWarning, stacklevel=4)

    def run_python(self, image):
        """The Python part of the transform on the native part's HWC uint8 image."""
        if self.python_input == "tensor":
            import torch
            from torchvision import tv_tensors
            x = tv_tensors.Image(torch.from_numpy(image).permute(2, 0, 1))
        else:
            from PIL import Image
            x = Image.fromarray(image)
        for t in self.compiled.python:
            x = t(x)
        return x

    def item(self, i):
        """Sample ``i``'s transformed image (drawn with seed 0, epoch 0, this index)."""
        if self.compiled.python:
            return self.run_python(self.prefix.run(self.files.read(i), _sample_key()))
        image_bytes, _ = self.cpu_source.sample(i, 0, 0)
        return _as_array(image_bytes, self.cpu_source.image_dtype,
                         tuple(self.cpu_source.image_shape))

    def device_output(self):
        """For ``device="cuda"``: ``(uint8 source, gpu.output.DeviceOutput)`` when the transform
        ends in a float ToTensor (and Normalize) that can run on the GPU after the copy (see
        stoker/gpu/output.py), else None."""
        from ..gpu.output import DeviceOutput
        from ..transforms import Normalize, ToTensor
        c = self.compiled
        if c is None or c.python or self.decode == "cuda":
            return None
        k = len(c.native)
        while k > 0 and isinstance(c.native[k - 1], (ToTensor, Normalize)):
            k -= 1
        tail = c.native[k:]
        if not tail or not isinstance(tail[0], ToTensor) or tail[0].dtype == "uint8" or any(
                isinstance(t, ToTensor) for t in tail[1:]):
            return None
        to_tensor = tail[0]
        norm = tail[1] if len(tail) > 1 else None
        specs = [s for t in c.native[:k] for s in t._specs()]
        specs.append(("ToTensor", {"dtype": "uint8", "layout": to_tensor.layout, "scale": True}))
        source = _native.sources.ImageSource(self.files, specs, self.max_pixels)
        return source, DeviceOutput(to_tensor.dtype, to_tensor.scale,
                                    None if norm is None else norm.mean,
                                    None if norm is None else norm.std, to_tensor.layout)

    def transform_report(self):
        """What ran natively and what in Python, for ``stats()["transforms"]``."""
        return None if self.compiled is None else self.compiled.report()

    def copy_stage(self, device, on_error):
        """The GPU decode stage of a ``decode="cuda"`` dataset (the DataLoader's copy stage)."""
        return gpu_decode.GpuDecodeStage(device, self.source, on_error)


class HoldsImages(StokerDataset):
    """A dataset of encoded images (ImageFolder, TarShards, TableDataset(image=...)): it holds an
    ``ImageSamples`` (``_images``, set by ``_set_images``) and answers the protocol's image
    members (sources/base.py) from it. A dataset that has no images (a table of columns) keeps
    ``_images`` None and the protocol's defaults."""

    _images = None

    def _set_images(self, images):
        """Makes this a dataset of encoded images, ``images`` (an ImageSamples): its
        ``transform``, ``max_pixels`` and ``decode`` become attributes."""
        self.transform = images.transform
        self._files = images.files
        self.max_pixels, self.decode = images.max_pixels, images.decode
        self._images = images
        self._source = images.source
        self._unbatchable = images.unbatchable

    def _batch_names(self):
        return ("pixel_values", "labels") if self._images is not None else super()._batch_names()

    def _lengths(self, unit):
        """Pixels: each image's width x height from its header, read natively (no decode)."""
        if unit != "pixels" or self._images is None:
            return super()._lengths(unit)
        threads = max(1, min(8, _native.engine.usable_cores()))
        return _native.sources.image_pixels(self._files, threads, self.max_pixels)

    @property
    def _decodes_on_gpu(self):
        return self._images is not None and self._images.decodes_on_gpu

    def _copy_stage(self, device, on_error):
        return self._images.copy_stage(device, on_error) if self._decodes_on_gpu else None

    def _device_output(self):
        return None if self._images is None else self._images.device_output()

    def _stats(self):
        s = super()._stats()
        report = None if self._images is None else self._images.transform_report()
        if report is not None:
            s["transforms"] = report  # which transforms ran natively, which in Python
        return s

    def _mixing_source(self, spec):
        source = None if self._images is None else self._images.cpu_source
        if source is None:
            return super()._mixing_source(spec)
        if spec.mixes_images and source.image_dtype == "uint8":
            raise ValueError(f"batch_transform={spec.name}: MixUp blends images, which uint8 "
                             f"cannot hold (torchvision's MixUp fails on uint8 too): make float "
                             f'images, e.g. ToTensor(dtype="float32"), or use CutMix alone')
        return source


class _ImageDataset(HoldsImages):
    """What ImageFolder and TarShards share: ``(image, label)`` samples of their files."""

    def __len__(self):
        return len(self._files)

    def _index(self, index):
        return check_index(index, len(self))

    def __getitem__(self, index):
        """``(image, label)``: the transformed image (drawn with seed 0, epoch 0, this index) as
        an array, or without a transform the decoded HWC uint8 RGB array."""
        i = self._index(index)
        label = self._files.label(i)
        if self.transform is None:
            return self._decode(i), label
        return self._images.item(i), label

    def _decode(self, i):
        return _native.image.decode_file(self._files.read(i), self.max_pixels)

    def __repr__(self):
        lines = [f"Dataset {type(self).__name__}", f"    Number of datapoints: {len(self)}"]
        lines += [f"    {line}" for line in self._extra_repr()]
        if self.transform is not None:
            lines += ["    Transform: " + repr(self.transform).replace("\n", "\n    ")]
        return "\n".join(lines)


def _sample_key():
    """The native part's randomness for one sample of a transform that goes on in Python: drawn
    from torch's generator, which the loader seeds from (seed, epoch, index) before each sample,
    so it is the same whatever the worker that reads it."""
    try:
        import torch
    except ImportError:  # pragma: no cover - the Python path needs torch
        return int(np.random.randint(0, 2**62))
    return int(torch.randint(0, 2**62, ()).item())


def _as_array(data, dtype, shape):
    if dtype == "bfloat16":  # NumPy has no bfloat16: a torch tensor
        import torch
        return torch.frombuffer(bytearray(data), dtype=torch.bfloat16).reshape(shape)
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _has_image_extension(filename):
    return filename.lower().endswith(IMG_EXTENSIONS)


class ImageFolder(_ImageDataset):
    """torchvision's ImageFolder: ``root/<class>/**/<file>``, classes in sorted order.

    Attributes as torchvision's: ``root``, ``classes``, ``class_to_idx``, ``samples`` (list of
    ``(path, class_index)``), ``targets``, ``imgs``. ``transform`` is a :mod:`stoker.transforms`
    pipeline; a DataLoader needs one that ends in a fixed size. Images over ``max_pixels`` pixels
    fail to decode (PIL's default limit). ``decode="cuda"`` decodes JPEGs on the GPU (nvJPEG),
    with a ``DataLoader(device="cuda")``: see :mod:`stoker.gpu.decode`.
    """

    def __init__(self, root, transform=None, max_pixels=DEFAULT_MAX_PIXELS, decode="cpu"):
        self.root = os.path.expanduser(os.fspath(root))
        self.classes, self.class_to_idx = self.find_classes(self.root)
        self.samples = self.make_dataset(self.root, self.class_to_idx)
        self.targets = [s[1] for s in self.samples]
        self.imgs = self.samples
        files = _native.sources.ImageFolderFiles(self.samples)
        self._set_images(ImageSamples(type(self).__name__, files, transform, max_pixels, decode,
                                      [p for p, _ in self.samples]))

    @staticmethod
    def find_classes(directory):
        """Sorted names of the subdirectories of ``directory`` and their indices."""
        try:
            classes = sorted(e.name for e in os.scandir(directory) if e.is_dir())
        except FileNotFoundError:
            raise FileNotFoundError(f"Couldn't find any class folder in {directory}.") from None
        if not classes:
            raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
        return classes, {name: i for i, name in enumerate(classes)}

    @staticmethod
    def make_dataset(directory, class_to_idx):
        """torchvision's make_dataset: files with an image extension (any case), walked
        recursively (following links) in sorted order, class by class."""
        samples = []
        empty = set(class_to_idx)
        for target_class in sorted(class_to_idx):
            class_index = class_to_idx[target_class]
            target_dir = os.path.join(directory, target_class)
            if not os.path.isdir(target_dir):
                continue
            for root, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
                for fname in sorted(fnames):
                    path = os.path.join(root, fname)
                    if _has_image_extension(path) and os.path.isfile(path):
                        samples.append((path, class_index))
                        empty.discard(target_class)
        if empty:
            raise FileNotFoundError(
                f"Found no valid file for the classes {', '.join(sorted(empty))}. "
                f"Supported extensions are: {', '.join(IMG_EXTENSIONS)}")
        return samples

    def _decode(self, i):
        return _native.image.decode_file(self.samples[i][0], self.max_pixels)

    def _identity(self):
        return self.samples

    def _where(self):
        return self.root

    def __reduce__(self):  # pickled as its spec: the tree is scanned again where it is unpickled
        return rebuild_quietly, (ImageFolder, self.root, self.transform, self.max_pixels)

    def _extra_repr(self):
        return [f"Root location: {self.root}"]


class TarShards(_ImageDataset):
    """WebDataset shards: ``<key>.jpg`` / ``.jpeg`` / ``.png`` with a ``<key>.cls`` label.

    ``paths``: shard paths, a directory of ``.tar`` files, or patterns
    (``train-{000000..000127}.tar``, globs), or a list of these (stoker/sources/paths.py). The
    shards are indexed once, in C++; samples are in shard order, then
    member order. ``labels`` (also ``targets``) holds each sample's label.

    Remote shards: URLs (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``hf://datasets/...``,
    with the same patterns) stream through a disk cache (docs/remote.md): ``storage_options``
    configure the client, ``cache_dir`` and ``cache_budget`` (bytes; default half the free disk
    there) the cache. Each shard's index is read from ``<shard>.idx.json`` beside it (``stoker
    index`` writes them); a shard without one is downloaded once at construction to index it
    (the index is kept in the cache). A DataLoader with ``shuffle=True`` visits remote shards in
    the shard order (``shuffle="shards"``).

    ``fields``: samples of any members instead of an image and a label: a dict of batch key ->
    field spec of :mod:`stoker.image_text` (``Image``, ``Text``, ``Json``, ``Label``, ``Npy``);
    a sample and a batch are then dicts of them, and ``missing`` ("error" or "skip") says what a
    key lacking a field's member is. docs/image-text.md.
    """

    # What TarShards(fields=...) makes: the TarShards whose samples are dicts of fields,
    # stoker/image_text/dataset.py's (set there when `import stoker` imports it).
    _with_fields = None

    def __new__(cls, *args, fields=None, **kwargs):
        if fields is not None and cls is TarShards:
            return object.__new__(TarShards._with_fields)
        return object.__new__(cls)

    def __init__(self, paths, transform=None, max_pixels=DEFAULT_MAX_PIXELS, decode="cpu", *,
                 storage_options=None, cache_dir=None, cache_budget=None, fields=None,
                 missing="error"):
        if missing != "error":
            raise ValueError("missing= is for TarShards(fields=...): a key without its image or "
                             "label is an error of the image + label TarShards")
        if _remote_shards.is_remote(paths):
            self.paths = _remote_shards.expand_shards(paths, storage_options)
            self._remote = _remote_shards.RemoteShards(
                self.paths, storage_options=storage_options, cache_dir=cache_dir,
                cache_budget=cache_budget)
            index = remote_tar_index(self._remote)
            files = _native.remote.tar_shard_files(self._remote.native, index)
            counts = [len(members) for members in index]
            self._block_shards = _remote_shards.block_shards_of([n for n in counts if n], counts)
        else:
            self.paths = _paths.expand(paths, "tar shard", (".tar",))
            files = _native.sources.TarShardFiles(self.paths)
        self._remote_options = (storage_options, cache_dir, cache_budget)
        self.labels = list(files.labels)
        self.targets = self.labels
        self._set_images(ImageSamples(type(self).__name__, files, transform, max_pixels, decode))

    @property
    def default_shuffle(self):
        """What ``shuffle=True`` means for this dataset: the shard order for remote shards."""
        return "shards" if self._remote is not None else True

    def _identity(self):
        return self.paths

    def _where(self):
        return f"{len(self.paths)} tar shards"

    def path(self, index):
        """``shard.tar:member`` of sample ``index``."""
        return self._files.path(self._index(index))

    def __reduce__(self):  # pickled as its spec: the shards are indexed again where unpickled
        storage_options, cache_dir, cache_budget = self._remote_options
        make = functools.partial(TarShards, storage_options=storage_options, cache_dir=cache_dir,
                                 cache_budget=cache_budget)
        return rebuild_quietly, (make, self.paths, self.transform, self.max_pixels)

    def _extra_repr(self):
        return [f"Shards: {len(self.paths)}"]
