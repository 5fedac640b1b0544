"""``StokerDataset``: what a Stoker dataset is to the ``stoker.DataLoader`` front.

Every Stoker dataset (``ArrayDataset``, ``TokenDataset``, ``ImageFolder``, ``TarShards``,
``TableDataset``, ``Mixture``) derives from it. The front (loader.py, native.py, balance.py,
offload/, tuning/) reads a dataset through these members only, never by probing for attributes;
each has its default here, and a dataset overrides what it has. The underscored members are the
package's own protocol, not user API.

- ``_source``: the engine's ``_native.sources.Source`` that reads the samples on C++ threads;
  None when the dataset cannot be read natively as made (see ``_unbatchable``) or its samples
  are made in Python (an image transform with no native form: the loader then reads it as a
  Python dataset, through ``__getitem__``, in worker processes).
- ``_unbatchable``: why the dataset cannot be batched as made (an ImageFolder without a
  transform), or None. The native producer raises it as a ValueError.
- ``_cpu_source``: an image dataset's ImageSource on the CPU (also with ``decode="cuda"``, whose
  ``_source`` stages files for the GPU), for batch transforms; None otherwise.
- ``_copy_stage(device, on_error)``: for a dataset that decodes on the GPU, the stage that turns
  its staged batches into GPU batches; None otherwise (``_decodes_on_gpu`` says which).
- ``_device_output()``: for ``device="cuda"``, ``(uint8 source, gpu.output.DeviceOutput)`` when
  the dataset's float conversion can run on the GPU after the copy, else None.
- ``_assemble_batch(fields)``: a batch as the loader yields it, from the engine's fields (a tuple
  of arrays or tensors): the one field alone, else the tuple; a table makes a dict.
- ``_remote``: the ``RemoteShards`` of a dataset streamed from object storage, else None; with
  ``_block_shards``, the shards each block of the engine's block order reads.
- ``default_shuffle``: what ``shuffle=True`` means for it: True, or "shards" (remote shards).
- ``_text``: names of columns a batch looks up in Python (a table's text), else empty.
- ``_source_for(shuffle)``: the source for a loader that shuffles or not (``_source`` but for
  a VideoDataset, whose clip starts follow it).
- ``_packing_stats()``, ``_transform_report()``: figures for ``loader.stats()``, or None.
- ``_video_stats()``: a video dataset's decoding counts, for ``diagnose``; None otherwise.

A dataset of encoded images (ImageFolder, TarShards, TableDataset(image=...)) holds an
``ImageSamples`` (``_images``, set by ``_set_images``), which gives the image members above.
"""

from __future__ import annotations

from .. import _native


class StokerDataset:
    """The base of every Stoker dataset: the members the DataLoader front reads (module
    docstring), with their defaults."""

    _source = None
    _unbatchable = None
    _cpu_source = None
    _remote = None
    _block_shards = None
    _text = ()
    _images = None  # an ImageSamples (sources/images.py) for a dataset of encoded images
    default_shuffle = True

    def _set_images(self, images):
        """Makes this a dataset of encoded images, ``images`` (an ImageSamples): its
        ``transform``, ``max_pixels`` and ``decode`` become attributes."""
        self.transform = images.transform
        self._files = images.files
        self.max_pixels, self.decode = images.max_pixels, images.decode
        self._images = images
        self._source, self._cpu_source = images.source, images.cpu_source
        self._unbatchable = images.unbatchable

    @property
    def _decodes_on_gpu(self):
        """Whether batches are decoded on the GPU (``decode="cuda"``): ``_copy_stage`` makes
        them from what the engine's workers staged."""
        return self._images is not None and self._images.decodes_on_gpu

    def _copy_stage(self, device, on_error):
        return self._images.copy_stage(device, on_error) if self._decodes_on_gpu else None

    def _device_output(self):
        return None if self._images is None else self._images.device_output()

    def _assemble_batch(self, fields):
        return fields[0] if len(fields) == 1 else fields

    def _source_for(self, shuffle):
        """The engine's source for a loader that shuffles (``shuffle``) or not: ``_source``,
        unless what a sample is depends on it (a VideoDataset's random or evenly spaced
        clips)."""
        return self._source

    def _packing_stats(self):
        return None

    def _video_stats(self):
        """A video dataset's decoding counts (VideoDataset.stats()), for diagnose; None
        otherwise."""
        return None

    def _transform_report(self):
        return None if self._images is None else self._images.transform_report()

    @property
    def _native(self):
        """Whether the engine reads this dataset (or explains why it cannot): the loader's choice
        between the native producer and the Python one."""
        return isinstance(self._source, _native.sources.Source) or self._unbatchable is not None


def is_native(dataset):
    """A Stoker dataset read by the engine, including one that cannot be batched as made (the
    native producer explains why)."""
    return isinstance(dataset, StokerDataset) and dataset._native
