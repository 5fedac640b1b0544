"""``StokerDataset``: what a Stoker dataset is to the ``stoker.DataLoader`` front, and the
questions the generic layers ask every dataset.

Every Stoker dataset (``ArrayDataset``, ``TokenDataset``, ``ImageFolder``, ``TarShards``,
``TableDataset``, ``VideoDataset``, ``LeRobotDataset``, ``Mixture``) derives from it. The generic
layers (loader.py, native.py, _state.py, tuning/, integrations/, offload/) read a dataset through
these members only: never by its type, never by probing for attributes. Each member has its
default here; a dataset overrides what it has. The underscored members are the package's own
protocol, not user API. docs/architecture.md, "Adding a modality", says which a new one declares.

What the engine reads:
- ``_source``: the engine's ``_native.sources.Source`` that reads the samples on C++ threads;
  None when the dataset cannot be read natively as made (see ``_unbatchable``) or its samples
  are made in Python (an image transform with no native form: the loader then reads it as a
  Python dataset, through ``__getitem__``, in worker processes).
- ``_unbatchable``: why the dataset cannot be batched as made (an ImageFolder without a
  transform), or None. The native producer raises it as a ValueError.
- ``_source_for(shuffle)``: the source for a loader that shuffles or not (``_source`` unless
  what a sample is depends on it, as a video's random or evenly spaced clips do).
- ``default_shuffle``: what ``shuffle=True`` means for it: True, or "shards" (remote shards).
- ``_remote``: the ``RemoteShards`` of a dataset streamed from object storage, else None; with
  ``_block_shards``, the shards each block of the engine's block order reads.

What a batch is:
- ``_assemble_batch(fields)``: a batch as the loader yields it, from the engine's fields (a tuple
  of arrays or tensors): the one field alone, else the tuple; a dict where the dataset says so.
- ``_batch_names()``: the names of the batch's fields as a model takes them (``model(**batch)``):
  a tuple, one name per field of a tuple batch; () where batches are dicts already. ValueError
  where the dataset cannot name them (an ArrayDataset without ``names``).
- ``_labels_are_next_tokens``: the batch's labels are already the next tokens (a language
  model's), so a trainer must not shift them again.
- ``_text``: names of columns a batch looks up in Python (a table's text), else empty.
- ``_lengths(unit)``: every sample's length in ``unit`` ("tokens", "seconds", "pixels"), known
  without reading a sample (a float or int array), for batches by a ``stoker.Budget``;
  ValueError where the dataset does not know them in that unit.
- ``_buckets()``: each sample's bucket where batches must not mix them (images in aspect-ratio
  buckets, whose batches have their bucket's shape): an int array, known without reading a
  sample; None (the default) where any samples may share a batch. A dataset in buckets is
  batched by a ``stoker.Budget`` (``batch_size=N`` is ``Budget(samples=N)``), each batch from one
  bucket.

What the tools report:
- ``_stats()``: its sections of ``loader.stats()`` (a dict: "remote", "transforms", "packing",
  ...); {} when it has none.
- ``_counters()`` and ``_figures(before, after)``: a reading of its own counters (any value, or
  None), and its figures for ``diagnose`` over a run between two readings: a list of
  ``figure(...)`` dicts (name, value, unit; worker seconds in a stage of its own with the advice
  when that stage limits: include/stoker/tuning/diagnosis.h, SourceFigure).
- ``_where()``: where its samples are, in a few words, for a command's report.
- ``_extra``: the extra of ``pip install 'stoker[...]'`` it needs installed (pyproject.toml's
  [project.optional-dependencies]: "tables", "video", ...), or None.
- ``_identity()``: what must be equal where the dataset is rebuilt in another process or node
  (the offload layer compares it): its files, say. Compared by ``repr``.

Images on the GPU and per-batch transforms (a dataset of images declares them; the defaults say
"none"):
- ``_decodes_on_gpu`` and ``_copy_stage(device, on_error)``: batches decoded on the GPU, and the
  stage that makes them from what the engine's workers staged.
- ``_device_output()``: for ``device="cuda"``, ``(uint8 source, gpu.output.DeviceOutput)`` when
  the dataset's float conversion can run on the GPU after the copy, else None.
- ``_mixing_source(spec)``: the ImageSource a batch transform (MixUp, CutMix: a
  ``batch_transforms.Spec``) mixes over, on the CPU; ValueError where the dataset's batches are
  not (images, labels) or cannot be mixed so.
"""

from __future__ import annotations

from .. import _native


def figure(name, value, unit, stage="", advice=""):
    """One of a dataset's figures for ``diagnose``: ``name`` in words, ``value`` in ``unit``
    ("s", "frames", "" for a ratio). ``stage``: the value is worker seconds spent in that stage
    of the dataset's own work, and ``advice`` what to do when it is the bottleneck."""
    return {"name": name, "value": float(value), "unit": unit, "stage": stage, "advice": advice}


class StokerDataset:
    """The base of every Stoker dataset: the members the generic layers read (module
    docstring), with their defaults."""

    _source = None
    _unbatchable = None
    _remote = None
    _block_shards = None
    _text = ()
    _labels_are_next_tokens = False
    _extra = None
    default_shuffle = True

    def _source_for(self, shuffle):
        return self._source

    def _assemble_batch(self, fields):
        return fields[0] if len(fields) == 1 else fields

    def _lengths(self, unit):
        raise ValueError(f"Budget({unit}=...) needs the samples' lengths: {type(self).__name__} "
                         f"does not know them in {unit}; pass Budget(..., lengths=...) (an array, "
                         f"or a callable index -> length)")

    def _buckets(self):
        return None

    def _batch_names(self):
        """By default the engine source's field names."""
        return tuple(self._source.field_names) if self._source is not None else ()

    def _stats(self):
        """The sections every dataset may have: "remote" for shards from object storage."""
        return {} if self._remote is None else {"remote": self._remote.stats()}

    def _counters(self):
        return None

    def _figures(self, before, after):
        return []

    def _identity(self):
        return None

    def _where(self):
        return f"{len(self)} samples"

    _decodes_on_gpu = False

    def _copy_stage(self, device, on_error):
        return None

    def _device_output(self):
        return None

    def _mixing_source(self, spec):
        raise ValueError(f"batch_transform={spec.name} mixes batches of (images, labels): it is for "
                         f"ImageFolder, TarShards and TableDataset(image=..., label=...), got "
                         f"{type(self).__name__}")

    @property
    def _native(self):
        """Whether the engine reads this dataset (or explains why it cannot): the loader's choice
        between the native producer and the Python one."""
        return isinstance(self._source, _native.sources.Source) or self._unbatchable is not None


def is_native(dataset):
    """A Stoker dataset read by the engine, including one that cannot be batched as made (the
    native producer explains why)."""
    return isinstance(dataset, StokerDataset) and dataset._native
