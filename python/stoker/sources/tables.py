"""Tables: Parquet files, Arrow IPC files (Hugging Face datasets' cache files) and in-memory Arrow
tables (pyarrow, polars, DuckDB, Hugging Face ``datasets.Dataset``) as a Stoker dataset.

The C++ engine's worker threads read them with the Arrow C++ libraries that pyarrow ships (the
module ``stoker._arrow``): a Parquet row group is decoded by one worker, GIL released, into a
bounded cache of decoded row groups; Arrow IPC files are memory-mapped and read in place; an
in-memory table is read where it is (zero-copy, through Arrow's C stream interface). Images in a
column go through the same fused decode + transform as ``ImageFolder``. Rows are never read
through Python.

Shuffling a Parquet table: a full permutation would decode a row group for nearly every sample.
A shuffled epoch instead permutes the row groups, takes them ``shuffle_window`` rows at a time,
and permutes the rows within each window (``stoker/block_order.h``): every row exactly once,
each row group decoded once per epoch, O(1) resume state. ``shuffle_window`` >= the table's
rows gives a full permutation (docs/tables.md measures both).
"""

from __future__ import annotations

import os

import numpy as np

from .. import _native
from .._checks import check_positive_int
from .._extras import require
from . import paths as _paths
from . import remote as _remote_shards
from .samples import read_sample
from ._checks import DEFAULT_MAX_PIXELS, check_index
from .images import HoldsImages, ImageSamples, rebuild_quietly

__all__ = ["TableDataset"]

_TABLE_SUFFIXES = (".parquet", ".pq", ".arrow", ".feather", ".ipc")


def _pyarrow():
    return require("pyarrow", TableDataset._extra, "stoker.TableDataset")


def _arrow_module():
    _pyarrow()  # loads libarrow/libparquet, which stoker._arrow links
    try:
        from .. import _arrow
    except ImportError as e:
        raise ImportError(f"this stoker was built without its tables module ({e}); rebuild it "
                          f"with pyarrow installed") from None
    return _arrow


def _file_schema(pa, path):
    """The first file's schema (the engine then checks every file's against it)."""
    with open(path, "rb") as f:
        head = f.read(8)
    try:
        if head[:4] == b"PAR1":
            import pyarrow.parquet as pq
            return pq.read_schema(path)
        if head[:6] == b"ARROW1":
            return pa.ipc.open_file(pa.memory_map(path)).schema
        if head[:4] == b"\xff\xff\xff\xff":
            return pa.ipc.open_stream(pa.memory_map(path)).schema
    except pa.ArrowException as e:
        kind = "Parquet" if head[:4] == b"PAR1" else "Arrow IPC"
        raise ValueError(f"{path} is not a readable {kind} file (truncated or corrupt?): "
                         f"{e}") from None
    raise ValueError(f"{path} is neither a Parquet file nor an Arrow IPC file (its first bytes "
                     f"are neither PAR1, ARROW1 nor an IPC stream's)"
                     + (": it is empty" if not head else ""))


def read_columns(pa, paths, columns):
    """``columns`` of the table files ``paths`` as one pyarrow.Table: Parquet read into memory,
    Arrow IPC files and streams memory-mapped (their buffers stay views of the files)."""
    tables = []
    for path in paths:
        with open(path, "rb") as f:
            head = f.read(6)
        if head[:4] == b"PAR1":
            import pyarrow.parquet as pq
            tables.append(pq.read_table(path, columns=list(columns)))
        elif head == b"ARROW1":
            tables.append(pa.ipc.open_file(pa.memory_map(path)).read_all().select(columns))
        else:
            tables.append(pa.ipc.open_stream(pa.memory_map(path)).read_all().select(columns))
    return pa.concat_tables(tables)


def is_hf_dataset(obj):
    return type(obj).__module__.startswith("datasets.") and hasattr(obj, "data") and \
        hasattr(obj, "_indices")


def _numeric(pa, t):
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _is_text(pa, t):
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


_INDEX_FIELD = "__stoker_sample__"  # the engine's per-sample index, for text lookups


def _batchable(pa, t):
    """Columns a batch holds as tensors: numbers, bools, fixed-size lists of them (any depth),
    and lists of numbers (padded)."""
    while pa.types.is_fixed_size_list(t):
        t = t.value_type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _numeric(pa, t.value_type) and not pa.types.is_boolean(t.value_type)
    return _numeric(pa, t)


class TableDataset(HoldsImages):
    """Rows of a table as samples.

    ``source``: a ``.parquet`` / Arrow IPC (``.arrow``) file, a directory of them, a glob, or a
    list of these (one table, in order); a ``pyarrow.Table`` or any object with
    ``__arrow_c_stream__`` (polars, DuckDB results); or a Hugging Face ``datasets.Dataset``
    (read from its Arrow table, its indices mapping (``select``, ``shuffle``, splits) applied).

    Without ``image``, a batch is a dict of tensors, one per column: numbers and bools are
    scalars, fixed-size lists keep their shape, and a variable-length list of numbers (token
    ids) is padded to ``max_length`` with ``pad_value`` (default: the longest list, found by
    reading the column once) with its lengths in ``"<name>_length"``. ``columns=None`` takes
    every such column; text columns come only when named, as Python lists of str (looked up per
    batch; a Parquet file's text columns are read into memory whole).

    With ``image="col"`` the column holds encoded images (binary, or Hugging Face's
    ``{"bytes", "path"}`` Image struct), decoded and transformed natively as by
    ``ImageFolder`` (``transform``: a :mod:`stoker.transforms` pipeline); a batch is
    ``(images, labels)`` with ``label="col"`` (an integer column, read once without decoding any
    image; ``shuffle="stratified"`` and ``class_weights`` use it), else the images alone.

    ``shuffle_window`` (rows, default: about 256 MiB of the table's decoded data) and
    ``cache_bytes`` (decoded row groups kept, default two windows) tune shuffled Parquet reads:
    see the module's docstring. Errors name the file, row group and row (and the column).

    Remote files (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``hf://datasets/...`` URLs
    and patterns; docs/remote.md) are copied into the local cache at construction
    (``cache_dir``, ``cache_budget``, ``storage_options``), concurrently and once per node, then
    read as local files: a shuffled table reads row groups from all its files, so they must fit
    the cache budget together (ValueError naming the sizes otherwise).
    """

    _extra = "tables"

    def __init__(self, source, columns=None, image=None, transform=None, label=None, *,
                 max_length=None, pad_value=0, shuffle_window=None, cache_bytes=None,
                 max_pixels=DEFAULT_MAX_PIXELS, decode="cpu", storage_options=None,
                 cache_dir=None, cache_budget=None):
        self._remote_options = {"storage_options": storage_options, "cache_dir": cache_dir,
                                "cache_budget": cache_budget}
        self.urls = None  # remote files: their URLs (self.paths: the cached copies)
        pa = _pyarrow()
        arrow = _arrow_module()
        for name, value in (("shuffle_window", shuffle_window), ("cache_bytes", cache_bytes),
                            ("max_length", max_length)):
            if value is not None:
                check_positive_int(name, value)
        if image is None and (transform is not None or label is not None):
            raise ValueError("transform and label are for image tables: name the image column "
                             "with image=")
        if image is not None and columns is not None:
            raise ValueError("an image table's batch is (images, labels): give image= and "
                             "label=, not columns=")
        self.source = source
        self.image = image
        self.label = label
        self.max_length = max_length
        self.pad_value = pad_value
        self.shuffle_window = shuffle_window
        self.cache_bytes = cache_bytes
        schema, open_data = self._opener(pa, arrow, source)
        self._schema = schema
        names = list(schema.names)
        wanted = [image] + ([label] if label else []) if image is not None else columns
        if wanted is not None:
            for name in wanted:
                if name not in names:
                    raise ValueError(f"{self._name} has no column {name!r} (its columns: "
                                     f"{', '.join(names)})")
        if image is None:
            if columns is None:
                wanted = [n for n in names if _batchable(pa, schema.field(n).type)]
                if not wanted:
                    raise ValueError(f"{self._name} has no column that batches as a tensor "
                                     f"(numbers, bools, lists of numbers): its columns are "
                                     + ", ".join(f"{n}: {schema.field(n).type}" for n in names))
            elif isinstance(columns, str) or not columns:
                raise ValueError(f"columns must be a non-empty list of names, got {columns!r}")
        self.columns = list(wanted)
        # Text columns (asked for by name) are Python lists, looked up per batch from the
        # batch's sample indices; the engine reads the others.
        self._text = [c for c in self.columns if image is None and
                      _is_text(pa, schema.field(c).type)]
        native = [c for c in self.columns if c not in self._text]
        # (text alone: the engine reads the first text column's blocks, for their order)
        self._data = open_data(native or self._text[:1], cache_bytes or 0, shuffle_window or 0)
        if image is None:
            spec = [(c, max_length or 0, float(pad_value), False) for c in native]
            if self._text:
                spec.append((_INDEX_FIELD, 0, 0.0, True))
                self._text_columns = self._read_text(pa, source)
            self._source = arrow.TableSource(self._data, spec)
            self._field_names = list(self._source.field_names)
        else:
            files = arrow.TableImageFiles(self._data, image, label or "")
            self._set_images(ImageSamples(type(self).__name__, files, transform, max_pixels, decode))

    def _read_text(self, pa, source):
        """The text columns, whole, as Arrow arrays (the table's own memory for an in-memory or
        memory-mapped table; a Parquet file's are read here, into memory)."""
        if not self.paths:
            return {c: self._table.column(c) for c in self._text}
        table = read_columns(pa, self.paths, self._text)
        return {c: table.column(c) for c in self._text}

    def _texts(self, indices):
        """{column: list of str} for samples ``indices`` (an int64 array)."""
        pa = _pyarrow()
        rows = indices if self._rows is None else self._rows[indices]
        take = pa.array(rows, pa.int64())
        return {c: col.take(take).to_pylist() for c, col in self._text_columns.items()}

    def _opener(self, pa, arrow, source):
        """The table's schema, and a function (columns, cache_bytes, window_rows) -> TableData."""
        rows = []
        self._rows = None
        if is_hf_dataset(source):
            if source._indices is not None:
                self._rows = source._indices.column(0).to_numpy().astype(np.int64)
                rows = self._rows.tolist()
            source = source.data.table  # memory-mapped from its cache files, or in memory
        if isinstance(source, (str, os.PathLike, list, tuple)) and \
                _remote_shards.is_remote(source):
            self.urls, self.paths = _remote_shards.stage(source, "TableDataset",
                                                         **self._remote_options)
            source = self.paths
        if isinstance(source, (str, os.PathLike, list, tuple)):
            if self.urls is None:
                self.paths = _paths.expand(source, "table file", _TABLE_SUFFIXES)
            self._name = self.paths[0] if len(self.paths) == 1 else \
                f"{self.paths[0]} and {len(self.paths) - 1} more"
            return _file_schema(pa, self.paths[0]), \
                lambda cols, cache, window: arrow.TableData.open(self.paths, cols, cache, window,
                                                                 rows)
        if not hasattr(source, "__arrow_c_stream__"):
            raise TypeError(
                f"TableDataset reads .parquet/.arrow paths, Arrow tables (anything with "
                f"__arrow_c_stream__) and datasets.Dataset, got {type(source).__name__}")
        self.paths = []
        table = source if isinstance(source, pa.Table) else pa.table(source)
        self._table = table
        self._name = type(source).__name__
        self._table = table  # keeps what the engine reads alive with the dataset

        def open_stream(cols, cache, window):
            capsule = table.select(cols).__arrow_c_stream__()
            return arrow.TableData.from_stream(capsule, self._name, cols, cache, window, rows)
        return table.schema, open_stream

    def __len__(self):
        return len(self._data)

    @property
    def targets(self):
        """The label column (an int64 array), or None without ``label``."""
        if self.label is None:
            return None
        return self._data.integer_column(self.label)

    def cache_stats(self):
        """The row-group cache: block_reads (row groups decoded), cache_hits, cached_bytes (now
        and peak) and cache_bytes (its limit)."""
        return self._data.stats()

    def _batch_names(self):
        if self.image is None:
            return ()  # batches are dicts of the columns
        return ("pixel_values", "labels") if self.label else ("pixel_values",)

    def _mixing_source(self, spec):
        if self.image is not None and self.label is None:
            raise ValueError(f"batch_transform={spec.name} needs labels: this TableDataset has "
                             f"images but no label column (TableDataset(..., label=...))")
        return super()._mixing_source(spec)

    def _identity(self):
        return self.paths

    def _lengths(self, unit):
        """Tokens: each row's longest list (of its list columns: token ids), up to max_length,
        read from the column without the engine; pixels of an image table: from the headers."""
        if unit != "tokens" or self.image is not None:
            return super()._lengths(unit)
        pa = _pyarrow()
        import pyarrow.compute as pc
        table = self._table if not self.paths else None
        types = {c: self._schema.field(c).type for c in self.columns}
        lists = [c for c, t in types.items() if pa.types.is_list(t) or pa.types.is_large_list(t)]
        if not lists:
            raise ValueError(f"Budget(tokens=...) needs the rows' lengths: this TableDataset has "
                             f"no list column (token ids); pass Budget(..., lengths=...)")
        table = table if table is not None else read_columns(pa, self.paths, lists)
        lengths = np.zeros(len(self), dtype=np.int64)
        for c in lists:
            counts = pc.list_value_length(table.column(c)).fill_null(0)
            lengths = np.maximum(lengths, counts.to_numpy(zero_copy_only=False))
        return np.minimum(lengths, self.max_length) if self.max_length else lengths

    def _where(self):
        return self._name

    def _assemble_batch(self, fields):
        """A loader's batch: a dict of the columns' tensors (image tables: as ImageFolder)."""
        if self.image is not None:  # the engine's image files have a label field regardless
            return fields if self.label else fields[0]
        out = dict(zip(self._field_names, fields))
        if self._text:
            out.update(self._texts(np.asarray(out.pop(_INDEX_FIELD))))
        return out

    def __getitem__(self, index):
        i = check_index(index, len(self))
        if self.image is not None:
            image = self._decode(i) if self.transform is None else self._images.item(i)
            return (image, self._files.label(i)) if self.label else image
        out = dict(zip(self._field_names, read_sample(self._source, i)))
        if self._text:
            texts = self._texts(np.array([out.pop(_INDEX_FIELD)], np.int64))
            out.update({c: v[0] for c, v in texts.items()})
        return out

    def _decode(self, i):
        return _native.image.decode_file(self._files.read(i), self.max_pixels)

    def __reduce__(self):
        if not self.paths:
            raise TypeError("a TableDataset over an in-memory table cannot be pickled; write it "
                            "to Parquet and read the file")
        kwargs = dict(columns=None if self.image is not None else self.columns, image=self.image,
                      transform=self.transform if self.image is not None else None,
                      label=self.label, max_length=self.max_length, pad_value=self.pad_value,
                      shuffle_window=self.shuffle_window, cache_bytes=self.cache_bytes,
                      **self._remote_options)
        return _rebuild, (self.urls or self.paths, kwargs)

    def _extra_repr(self):
        return [f"Table: {self._name}", f"Columns: {', '.join(self.columns)}"]

    def __repr__(self):
        lines = [f"Dataset {type(self).__name__}", f"    Number of datapoints: {len(self)}"]
        lines += [f"    {line}" for line in self._extra_repr()]
        if self.image is not None and self.transform is not None:
            lines += ["    Transform: " + repr(self.transform).replace("\n", "\n    ")]
        return "\n".join(lines)


def _rebuild(paths, kwargs):
    return rebuild_quietly(TableDataset, paths, **kwargs)
