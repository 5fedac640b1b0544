"""Robot episodes: ``LeRobotDataset``, a LeRobot dataset (format v3.0) read natively.

A sample is a time step of an episode, as lerobot's own ``LeRobotDataset[i]`` gives it: the
step's values (``observation.state``, ``action``, ``timestamp``, ``frame_index``,
``episode_index``, ``index``, ``task_index``, ...), for every camera the frame its video shows at
the step, and the task's text. With ``delta_timestamps`` a key holds its values (or frames) at
those offsets, clamped to the episode, with a ``<key>_is_pad`` mask: lerobot's rules.

The values (numbers only) are read once, at construction, from the data's Parquet files into
memory (``sources/tables.read_columns``, the tables' reader); every step is then gathered by the
engine's threads, which also decode each camera's frames from its video (FFmpeg, ``stoker._video``:
one pass over a GOP for all of a sample's frames of one camera) and run the transform, so nothing
of a sample passes through Python but its task's text.
"""

from __future__ import annotations

import glob
import json
import math
import os

import numpy as np

from ..transforms import ToDtype
from . import remote as _remote_shards
from .base import StokerDataset
from ._checks import DEFAULT_MAX_PIXELS, check_index, check_max_pixels
from .samples import read_sample
from .tables import _pyarrow, read_columns
from .video import _video_module, decoding_figures, frame_pipeline

__all__ = ["LeRobotDataset"]

_FRAME_DTYPES = ("float32", "uint8")
_STRATIFY = ("task", "episode")


class LeRobotDataset(StokerDataset):
    """The time steps of a LeRobot dataset on disk (format v3.0: ``meta/info.json``,
    ``meta/episodes/``, ``meta/tasks.parquet``, ``data/chunk-*/file-*.parquet``,
    ``videos/<camera>/chunk-*/file-*.mp4``), item for item as lerobot's ``LeRobotDataset(repo_id,
    root=root, delta_timestamps=..., episodes=...)``. ``root`` may be a URL of object storage or
    the Hub (``hf://datasets/<org>/<name>``, ``s3://...``): its metadata, data files and the
    selected episodes' videos are then copied to the local cache first (``cache_dir``,
    ``cache_budget``, ``storage_options`` as for ``TarShards``; files already there are reused).

    ``delta_timestamps``: {key: [seconds, ...]}, each a multiple of 1/fps (within
    ``tolerance_s``); a key's values become ``[D, ...]`` (a camera's frames ``[D, C, H, W]``, one
    delta ``[C, H, W]`` as lerobot gives it) with ``<key>_is_pad``. ``episodes``: the
    ``episode_index`` values to read (all by default). ``transform``: a ``stoker.transforms`` or
    torchvision v2 pipeline run natively on every camera's frames, one draw per camera and sample
    (its frames at the deltas share it); it replaces the conversion to float. Without it frames
    are float32 ``[C, H, W]`` in [0, 1], or uint8 with ``frame_dtype="uint8"`` (convert on the
    GPU). ``tolerance_s``: how far a frame may be from a step's time. ``stratify``: what
    ``shuffle="stratified"`` groups steps by, "task" or "episode". Batches are dicts of tensors,
    with ``task`` a list of strings.
    """

    _extra = "video"  # stoker[video]: the FFmpeg module

    def __init__(self, root, delta_timestamps=None, episodes=None, transform=None,
                 tolerance_s=1e-4, *, frame_dtype="float32", stratify="task",
                 decoder_threads=1, index_cache_bytes=64 << 20, max_pixels=DEFAULT_MAX_PIXELS,
                 storage_options=None, cache_dir=None, cache_budget=None):
        self._module = _video_module()
        self._remote_options = (storage_options, cache_dir, cache_budget)
        self._url = isinstance(root, str) and _remote_shards.is_remote(root)
        self.root = root.rstrip("/") if self._url else os.path.expanduser(os.fspath(root))
        if frame_dtype not in _FRAME_DTYPES:
            raise ValueError(f"frame_dtype must be 'float32' or 'uint8', got {frame_dtype!r}")
        if stratify not in _STRATIFY:
            raise ValueError(f"stratify must be 'task' or 'episode', got {stratify!r}")
        if not (isinstance(tolerance_s, (int, float)) and tolerance_s > 0):
            raise ValueError(f"tolerance_s must be a positive number of seconds, got "
                             f"{tolerance_s!r}")
        self.delta_timestamps = None if delta_timestamps is None else \
            {k: list(v) for k, v in delta_timestamps.items()}
        self.transform, self.tolerance_s = transform, float(tolerance_s)
        self.frame_dtype, self.stratify = frame_dtype, stratify
        self.decoder_threads, self.index_cache_bytes = int(decoder_threads), int(index_cache_bytes)
        self.max_pixels = check_max_pixels(max_pixels)
        self._requested_episodes = None if episodes is None else [int(e) for e in episodes]

        self.info = self._read_info()
        self.fps = self.info["fps"]
        features = self.info["features"]
        self.camera_keys = [k for k, f in features.items() if f.get("dtype") == "video"]
        unsupported = [k for k, f in features.items() if f.get("dtype") in ("image", "string")]
        if unsupported:
            raise ValueError(f"{self.root}: the features {', '.join(unsupported)} are images or "
                             f"text in the data files; LeRobotDataset reads video cameras and "
                             f"numbers")
        self.delta_indices = self._delta_indices()
        self._episode_meta = self._read_episodes()
        self.tasks = self._read_tasks()
        self.episodes = self._requested_episodes if self._requested_episodes is not None else \
            sorted(self._episode_meta)
        missing = [e for e in self.episodes if e not in self._episode_meta]
        if missing:
            raise ValueError(f"{self.root}: no episodes {missing[:10]} in meta/episodes (it has "
                             f"{len(self._episode_meta)})")
        self._columns, self._names, starts, ids = self._read_data()
        self.episodes = ids
        self._source = self._make_source(starts, ids)
        self._field_names = list(self._source.field_names)

    # -- the files ---------------------------------------------------------------------------

    def _files(self, names):
        """Local paths of the dataset's files ``names`` (relative to root): in root, or copied
        from its URL to the cache."""
        if not self._url:
            return [os.path.join(self.root, n) for n in names]
        storage_options, cache_dir, cache_budget = self._remote_options
        return _remote_shards.stage([f"{self.root}/{n}" for n in names], "LeRobotDataset",
                                    storage_options=storage_options, cache_dir=cache_dir,
                                    cache_budget=cache_budget)[1]

    def _file(self, name):
        if not self._url:
            return os.path.join(self.root, name)
        try:
            return self._files([name])[0]
        except FileNotFoundError:
            return os.path.join(self.root, name)  # absent: named as such by the caller

    def _parquet_files(self, folder):
        if self._url:
            storage_options = self._remote_options[0]
            try:
                urls = _remote_shards.expand_shards(f"{self.root}/{folder}/*/*.parquet",
                                                    storage_options)
            except FileNotFoundError:
                urls = []
            names = [u[len(self.root) + 1:] for u in urls]
            paths = self._files(names) if names else []
        else:
            paths = sorted(glob.glob(os.path.join(self.root, folder, "*", "*.parquet")))
        if not paths:
            raise FileNotFoundError(f"{self.root}: no Parquet files in {folder}/chunk-*/")
        return paths

    # -- the metadata ------------------------------------------------------------------------

    def _read_info(self):
        path = self._file("meta/info.json")
        try:
            with open(path) as f:
                info = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.root} is not a LeRobot dataset: no meta/info.json")
        except ValueError as e:
            raise ValueError(f"{path} is not JSON: {e}") from None
        version = str(info.get("codebase_version", "?"))
        if not version.startswith("v3."):
            raise ValueError(f"{self.root} is a LeRobot dataset of format {version}; "
                             f"LeRobotDataset reads v3.0 (lerobot's converter "
                             f"lerobot.datasets.v30.convert_dataset_v21_to_v30 turns v2.1 into "
                             f"it)")
        for key in ("fps", "features", "data_path"):
            if key not in info:
                raise ValueError(f"{path} has no {key!r}")
        return info

    def _delta_indices(self):
        """{key: [steps]} of delta_timestamps, checked as lerobot checks them."""
        if self.delta_timestamps is None:
            return {}
        out = {}
        for key, deltas in self.delta_timestamps.items():
            if key not in self.info["features"]:
                raise ValueError(f"delta_timestamps names {key!r}, which is not a feature "
                                 f"(features: {', '.join(self.info['features'])})")
            if not deltas:
                raise ValueError(f"delta_timestamps[{key!r}] is empty")
            steps = []
            for d in deltas:
                s = float(d) * self.fps
                if abs(s - round(s)) / self.fps > self.tolerance_s:
                    raise ValueError(f"delta_timestamps[{key!r}] holds {d}, not a multiple of "
                                     f"1/fps = 1/{self.fps} s within tolerance_s="
                                     f"{self.tolerance_s}")
                steps.append(int(round(s)))
            out[key] = steps
        return out

    def _read_episodes(self):
        """{episode_index: its row of meta/episodes (stats left out)}."""
        _pyarrow()
        import pyarrow.parquet as pq
        out = {}
        for path in self._parquet_files("meta/episodes"):
            schema = pq.read_schema(path)
            columns = [c for c in schema.names if not c.startswith("stats/")]
            for row in pq.read_table(path, columns=columns).to_pylist():
                out[int(row["episode_index"])] = row
        return out

    def _read_tasks(self):
        """The tasks' texts by position (lerobot's ``meta.tasks.iloc[task_index].name``)."""
        _pyarrow()
        import pyarrow.parquet as pq
        path = self._file("meta/tasks.parquet")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{self.root}: no meta/tasks.parquet")
        table = pq.read_table(path)
        pandas = (table.schema.pandas_metadata or {}).get("index_columns", [])
        name = next((c for c in pandas if isinstance(c, str)), None) or \
            ("task" if "task" in table.column_names else None)
        if name is None:
            raise ValueError(f"{path} names no task texts (no pandas index and no 'task' column)")
        return [str(t) for t in table.column(name).to_pylist()]

    # -- the steps ---------------------------------------------------------------------------

    def _read_data(self):
        """The values of the selected episodes' steps, as NumPy arrays by column (in the data's
        order), their names, and the episodes' first rows and ids (in the data's order:
        lerobot's hf_dataset order)."""
        pa = _pyarrow()
        import pyarrow.compute as pc
        features = self.info["features"]
        names = [k for k, f in features.items() if f.get("dtype") != "video"]
        for need in ("timestamp", "episode_index", "index", "task_index"):
            if need not in names:
                raise ValueError(f"{self.root}: meta/info.json has no {need!r} feature")
        wanted = set(self.episodes)
        columns = {n: [] for n in names}
        for path in self._parquet_files("data"):
            table = read_columns(pa, [path], names)
            mask = pc.is_in(table.column("episode_index"),
                            value_set=pa.array(sorted(wanted), pa.int64()))
            table = table.filter(mask)
            for n in names:
                columns[n].append(self._column_array(pa, table.column(n), n, path))
        columns = {n: (np.concatenate(parts) if parts else np.zeros(0))
                   for n, parts in columns.items()}
        episode = columns["episode_index"]
        index = columns["index"]
        # Each episode's steps in one run, as meta/episodes says: dataset_from_index ..
        # dataset_to_index - 1, in order.
        starts = np.concatenate([[0], np.flatnonzero(np.diff(episode)) + 1, [len(episode)]])
        starts = starts.astype(np.int64).tolist() if len(episode) else [0]
        ids = [int(episode[i]) for i in starts[:-1]]
        if len(set(ids)) != len(ids):
            again = next(e for e in ids if ids.count(e) > 1)
            raise ValueError(f"{self.root}: episode {again}'s steps are not in one run in the "
                             f"data files")
        for e, i, j in zip(ids, starts, starts[1:]):
            meta = self._episode_meta[e]
            lo, hi = int(meta["dataset_from_index"]), int(meta["dataset_to_index"])
            if j - i != hi - lo or not np.array_equal(index[i:j], np.arange(lo, hi)):
                raise ValueError(
                    f"{self.root}: episode {e} has {j - i} steps in the data files (index "
                    f"{int(index[i])}..{int(index[j - 1])}), but meta/episodes says {hi - lo} "
                    f"(index {lo}..{hi - 1})")
        absent = sorted(wanted - set(ids))
        if absent:
            raise ValueError(f"{self.root}: the data files hold no steps of episodes "
                             f"{absent[:10]}, which meta/episodes lists")
        return columns, names, starts, ids

    def _column_array(self, pa, column, name, path):
        """A data column as a NumPy array of lerobot's item dtype (floats float32, integers
        int64), checked against meta/info.json's shape."""
        import pyarrow.compute as pc
        t = column.type
        shape = []
        while pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
            column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
            lengths = np.asarray(pc.list_value_length(column).to_numpy(zero_copy_only=False))
            if len(lengths) and not (lengths == lengths[0]).all():
                raise ValueError(f"{path}: column {name!r} holds lists of different lengths")
            shape.append(int(lengths[0]) if len(lengths) else 0)
            column = column.flatten()
            t = column.type
        if pa.types.is_floating(t):
            dtype = np.float32
        elif pa.types.is_integer(t):
            dtype = np.int64
        elif pa.types.is_boolean(t):
            dtype = np.bool_
        else:
            raise ValueError(f"{path}: column {name!r} is {column.type}, not numbers")
        if column.null_count:
            raise ValueError(f"{path}: column {name!r} holds nulls")
        expected = [int(s) for s in self.info["features"][name].get("shape", [1])]
        if shape and expected != shape and not (expected == [1] and shape == [1]):
            raise ValueError(f"{path}: column {name!r} holds values of shape {shape}, but "
                             f"meta/info.json says {expected}")
        if not shape and expected not in ([1], []):
            raise ValueError(f"{path}: column {name!r} holds scalars, but meta/info.json says "
                             f"shape {expected}")
        values = np.asarray(column.to_numpy(zero_copy_only=False)).astype(dtype, copy=False)
        rows = len(values) // max(1, math.prod(shape)) if shape else len(values)
        return values.reshape([rows] + shape)

    def _make_source(self, starts, ids):
        values = []
        for n in self._names:
            array = np.ascontiguousarray(self._columns[n])
            dtype = {"f": "float32", "i": "int64", "b": "bool"}[array.dtype.kind]
            values.append((n, dtype, list(array.shape[1:]), array.tobytes(),
                           self.delta_indices.get(n, [])))
        cameras = []
        names = {key: [self._video_name(key, self._episode_meta[e]) for e in ids]
                 for key in self.camera_keys}
        distinct = sorted({n for per_camera in names.values() for n in per_camera})
        local = dict(zip(distinct, self._files(distinct))) if distinct else {}
        for key in self.camera_keys:
            pipeline, exact = self._pipeline(key)
            videos = [local[n] for n in names[key]]
            starts_s = [float(self._episode_meta[e].get(f"videos/{key}/from_timestamp", 0.0)
                              or 0.0) for e in ids]
            cameras.append((key, pipeline, exact, self.delta_indices.get(key, []), videos,
                            starts_s))
        labels = self._columns["task_index"] if self.stratify == "task" else \
            np.repeat(np.asarray(ids, np.int64), np.diff(starts))
        return self._module.LeRobotSource(
            values, self._columns["timestamp"].astype(np.float32).tolist(), cameras, starts,
            ids, np.asarray(labels, np.int64).tolist(), self.tolerance_s, self.decoder_threads,
            self.index_cache_bytes)

    def _video_name(self, key, meta):
        template = self.info.get("video_path")
        if template is None:
            raise ValueError(f"{self.root}: meta/info.json has video features but no video_path")
        chunk, file = meta.get(f"videos/{key}/chunk_index"), meta.get(f"videos/{key}/file_index")
        if chunk is None or file is None:
            raise ValueError(f"{self.root}: meta/episodes gives episode "
                             f"{meta['episode_index']} no video file for camera {key}")
        return template.format(video_key=key, chunk_index=int(chunk), file_index=int(file))

    def _pipeline(self, key):
        """A camera's native pipeline, and whether its frames must be info.json's size."""
        shape = self.info["features"][key].get("shape", [])
        names = self.info["features"][key].get("names") or ["height", "width", "channels"]
        dims = dict(zip(names, shape))
        height, width = int(dims.get("height", shape[0])), int(dims.get("width", shape[1]))
        tail = [ToDtype(self.frame_dtype, scale=True)]
        return frame_pipeline("LeRobotDataset", self.transform, (height, width), tail,
                              self.max_pixels)

    # -- the dataset -------------------------------------------------------------------------

    def __len__(self):
        return len(self._columns["index"])

    @property
    def num_episodes(self):
        return len(self.episodes)

    @property
    def targets(self):
        """Every step's stratum: its task_index (or episode_index, ``stratify="episode"``)."""
        return np.asarray(self._source.labels())

    def path(self, index):
        """The step behind sample ``index``: its episode and step."""
        return self._source.path(check_index(index, len(self)))

    def _assemble_batch(self, fields):
        """A loader's batch: {key: tensor}, and ``task``: the tasks' texts."""
        out = dict(zip(self._field_names, fields))
        tasks = np.asarray(out["task_index"]).reshape(-1)
        out["task"] = [self.tasks[int(t)] for t in tasks]
        return out

    def __getitem__(self, index):
        """Step ``index`` as lerobot's item: {key: torch tensor}, ``task`` a string (NumPy
        arrays when torch is absent)."""
        i = check_index(index, len(self))
        arrays = read_sample(self._source, i)
        try:
            import torch
            convert = torch.from_numpy
        except ImportError:
            def convert(a):
                return a
        out = {n: convert(a) for n, a in zip(self._field_names, arrays)}
        out["task"] = self.tasks[int(arrays[self._field_names.index("task_index")])]
        return out

    def stats(self):
        """Decoding counts since the dataset was made (VideoDataset.stats()'s; a clip is one
        camera's frames of a step)."""
        return self._source.stats()

    def _batch_names(self):
        return ()  # batches are dicts, keyed as lerobot's items

    def _counters(self):
        return self.stats()

    def _figures(self, before, after):
        return decoding_figures(before, after)

    def _identity(self):
        return self.root, self.episodes

    def __reduce__(self):  # pickled as its arguments: read again where unpickled
        storage_options, cache_dir, cache_budget = self._remote_options
        kwargs = dict(frame_dtype=self.frame_dtype, stratify=self.stratify,
                      decoder_threads=self.decoder_threads,
                      index_cache_bytes=self.index_cache_bytes, max_pixels=self.max_pixels,
                      storage_options=storage_options, cache_dir=cache_dir,
                      cache_budget=cache_budget)
        return _rebuild, (self.root, self.delta_timestamps, self._requested_episodes,
                          self.transform, self.tolerance_s, kwargs)

    def __repr__(self):
        return (f"LeRobotDataset({self.root!r}: {self.num_episodes} episodes, {len(self)} steps "
                f"at {self.fps} fps, cameras {self.camera_keys})")


def _rebuild(root, delta_timestamps, episodes, transform, tolerance_s, kwargs):
    return LeRobotDataset(root, delta_timestamps, episodes, transform, tolerance_s, **kwargs)
