"""Video clips: ``VideoDataset``, decoded with FFmpeg in C++ worker threads.

A sample is a clip of ``frames`` frames of one video, ``stride`` source frames apart or, with
``fps``, the frames shown at that rate by timestamp. ``clips_per_video=k`` makes k samples per
video. With random clips (``shuffle=True`` by default) a clip's start is drawn from (seed, epoch,
index); otherwise the k clips are evenly spaced. A video shorter than a clip repeats its last
frame. The transform (``stoker.transforms`` or torchvision v2, as for ``ImageFolder``) draws its
random parameters once per clip: every frame gets the same crop, flip and jitter.

Decoding (``src/ffmpeg/``): each video's packets are indexed once (timestamps and keyframes,
without decoding) and kept in a bounded cache; a clip seeks to the keyframe before its first
frame, decodes only to its last, skips the non-reference frames no kept frame needs, and converts
to RGB only the region the transform reads. The C++ module is ``stoker._video`` (FFmpeg's
libraries; docs/install.md).
"""

from __future__ import annotations

import csv
import os

import numpy as np

from .. import _native
from .._checks import is_integral
from ..transforms import CenterCrop, Compose, _compile
from . import paths as _paths
from . import remote as _remote_shards
from .base import StokerDataset, figure
from ._checks import DEFAULT_MAX_PIXELS, check_index, check_max_pixels
from .tar_index import remote_tar_index

__all__ = ["VIDEO_EXTENSIONS", "VideoDataset", "ffmpeg_versions", "probe"]

VIDEO_EXTENSIONS = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi")

_TABLE_SUFFIXES = (".csv", ".parquet", ".pq")
_LAYOUTS = ("TCHW", "CTHW")


def _video_module():
    try:
        from .. import _video
    except ImportError as e:
        raise ImportError(
            f"this stoker was built without its video module ({e}): build it where FFmpeg's "
            f"development libraries are found by pkg-config (libavformat, libavcodec, "
            f"libswscale, libavutil; docs/install.md)") from None
    return _video


def ffmpeg_versions():
    """FFmpeg's libraries as the video module links them."""
    return _video_module().ffmpeg_versions()


def probe(path):
    """A video's stream by its packet index: a dict of width, height, codec, frames, keyframes
    and seconds (every frame's presentation time, ascending)."""
    return _video_module().probe(os.fspath(path))


def frame_pipeline(what, transform, size, tail, max_pixels):
    """The native pipeline a video dataset runs on every frame, and whether frames must be
    ``size`` (h, w) already: the transform's, or without one, a crop to ``size`` then ``tail``
    (transforms of the output, e.g. ToDtype)."""
    if transform is None:
        compiled = _compile.compile_transform(Compose([CenterCrop(size)] + list(tail)))
        return _native.image.ImagePipeline(compiled.specs, max_pixels), True
    compiled = _compile.compile_transform(transform)
    if compiled.python:
        raise ValueError(
            f"{what} runs its transform natively on every frame; {compiled.python_names[0]} has "
            f"no native form (use stoker.transforms or the torchvision v2 transforms ImageFolder "
            f"runs natively)")
    return _native.image.ImagePipeline(compiled.specs, max_pixels), False


def _positive_int(name, value):
    if not is_integral(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _is_table(source):
    return hasattr(source, "__arrow_c_stream__") or hasattr(source, "to_pandas") or \
        (isinstance(source, (str, os.PathLike)) and
         os.fspath(source).lower().endswith(_TABLE_SUFFIXES))


def _class_folder(root):
    """``root/<class>/**/<video>``: (path, class index) per video, class names."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    videos, empty = [], []
    for label, name in enumerate(classes):
        found = []
        for dirpath, _, fnames in sorted(os.walk(os.path.join(root, name), followlinks=True)):
            found += [(os.path.join(dirpath, f), label) for f in sorted(fnames)
                      if f.lower().endswith(VIDEO_EXTENSIONS)]
        if not found:
            empty.append(name)
        videos += found
    if empty:
        raise FileNotFoundError(f"no video ({', '.join(VIDEO_EXTENSIONS)}) for the classes "
                                f"{', '.join(empty)} in {root}")
    return videos, classes


def _table_rows(source, path_column, label_column, start_column, end_column):
    """The columns of a table source (CSV, Parquet, a pyarrow Table or a pandas DataFrame) as
    lists, and the folder relative paths are resolved from (a file's own)."""
    base = None
    if isinstance(source, (str, os.PathLike)):
        path = os.path.expanduser(os.fspath(source))
        base = os.path.dirname(os.path.abspath(path))
        if path.lower().endswith(".csv"):
            with open(path, newline="") as f:
                rows = list(csv.DictReader(f))
            columns = {k: [r[k] for r in rows] for k in (rows[0].keys() if rows else ())}
        else:
            import pyarrow.parquet as pq
            columns = pq.read_table(path).to_pydict()
    elif hasattr(source, "to_pydict"):
        columns = source.to_pydict()
    else:
        columns = {k: list(v) for k, v in source.to_dict("list").items()}
    if path_column not in columns:
        raise ValueError(f"the table has no column {path_column!r} (its columns: "
                         f"{', '.join(columns)}); name the videos' column with path_column=")

    def optional(name):
        return columns.get(name) if name is not None else None

    return (columns[path_column], optional(label_column), optional(start_column),
            optional(end_column), base)


def _labels_of(values):
    """Integer labels as they are; other labels (class names) numbered in sorted order."""
    try:
        return [int(v) for v in values], None
    except (TypeError, ValueError):
        classes = sorted({str(v) for v in values})
        index = {c: i for i, c in enumerate(classes)}
        return [index[str(v)] for v in values], classes


def _seconds(values, name):
    out = []
    for v in values:
        if v is None or v == "" or (isinstance(v, float) and np.isnan(v)):
            out.append(0.0)
            continue
        try:
            out.append(float(v))
        except ValueError:
            raise ValueError(f"the {name} column holds {v!r}, not seconds") from None
    return out


class VideoDataset(StokerDataset):
    """Clips of videos, decoded natively (FFmpeg, C++ threads).

    ``source``: a folder in the class-per-subfolder layout (UCF-101, Kinetics as extracted:
    labels are the sorted class folders), a folder of videos, a glob, a list of paths (or of
    ``(path, label)`` pairs), or a table: a CSV or Parquet file, a ``pyarrow.Table`` or a pandas
    DataFrame with a ``path`` column and, optionally, ``label`` (integers, or class names
    numbered in sorted order) and ``start``/``end`` times in seconds (Kinetics' annotations);
    relative paths in a table file are relative to its folder; or WebDataset tar shards (a path,
    glob or list of ``.tar`` files) of ``<key>.mp4`` (or another video suffix) and ``<key>.cls``
    members, read into memory a video at a time, also from object storage (``s3://``, ``gs://``,
    ``az://``, ``http(s)://``, ``hf://datasets/...`` URLs through a disk cache, as ``TarShards``
    reads them: ``storage_options``, ``cache_dir``, ``cache_budget``; ``stoker index`` writes
    their sidecar indexes). Videos without a label get -1.

    A batch is ``(clips, labels)``: uint8 ``[B, T, C, H, W]`` (or the transform's dtype),
    ``[B, C, T, H, W]`` with ``layout="CTHW"``; ``timestamps=True`` adds each frame's
    presentation time in seconds, ``[B, T]`` float64. Without a transform every video must have
    the first one's size. ``random_clips``: random starts (True), evenly spaced (False), or,
    by default, random when the loader shuffles. ``decoder_threads``: FFmpeg's own threads per
    decoder (1: none; the loader's workers decode clips in parallel). ``index_cache_bytes``
    bounds the packet indexes kept in memory.
    """

    _extra = "video"  # stoker[video]: the FFmpeg module

    def __init__(self, source, frames=16, stride=1, fps=None, clips_per_video=1, transform=None,
                 timestamps=False, layout="TCHW", *, random_clips=None, path_column="path",
                 label_column="label", start_column="start", end_column="end",
                 decoder_threads=1, index_cache_bytes=64 << 20,
                 max_pixels=DEFAULT_MAX_PIXELS, storage_options=None, cache_dir=None,
                 cache_budget=None):
        self._module = _video_module()
        self.frames = _positive_int("frames", frames)
        self.stride = _positive_int("stride", stride)
        self.clips_per_video = _positive_int("clips_per_video", clips_per_video)
        if fps is not None and (isinstance(fps, bool) or not float(fps) > 0 or
                                not np.isfinite(float(fps))):
            raise ValueError(f"fps must be a positive number of frames a second, got {fps!r}")
        self.fps = None if fps is None else float(fps)
        if layout not in _LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(_LAYOUTS)}, got {layout!r}")
        if random_clips not in (None, True, False):
            raise ValueError(f"random_clips must be True, False or None, got {random_clips!r}")
        self.layout, self.timestamps, self.random_clips = layout, bool(timestamps), random_clips
        self.transform = transform
        self.max_pixels = check_max_pixels(max_pixels)
        self.decoder_threads = int(decoder_threads)
        self.index_cache_bytes = int(index_cache_bytes)
        self._spec = (source, path_column, label_column, start_column, end_column)
        self._remote_options = (storage_options, cache_dir, cache_budget)
        self.classes = None
        self._files = None  # the tar shards' members (TarShardFiles), for WebDataset videos
        self.videos = self._resolve(source, path_column, label_column, start_column, end_column)
        self._pipeline, self._exact_size = self._make_pipeline(transform)
        self._sources = {}
        self._source = self._source_for(True)

    # -- the videos --------------------------------------------------------------------------

    def _resolve(self, source, path_column, label_column, start_column, end_column):
        """(path, label, start, end) per video."""
        if _remote_shards.is_remote(source):  # WebDataset tar shards in object storage
            storage_options, cache_dir, cache_budget = self._remote_options
            urls = _remote_shards.expand_shards(source, storage_options)
            self._remote = _remote_shards.RemoteShards(
                urls, storage_options=storage_options, cache_dir=cache_dir,
                cache_budget=cache_budget)
            index = remote_tar_index(self._remote, "videos")
            self._files = _native.remote.tar_shard_files(self._remote.native, index)
            counts = [len(members) for members in index]
            self._block_shards = _remote_shards.block_shards_of([n for n in counts if n], counts)
            return [(self._files.path(i), self._files.label(i), 0.0, 0.0)
                    for i in range(len(self._files))]
        if _is_table(source):
            paths, labels, starts, ends, base = _table_rows(
                source, path_column, label_column, start_column, end_column)
            if base is not None:
                paths = [p if os.path.isabs(p) else os.path.join(base, p) for p in paths]
            if labels is None:
                labels = [-1] * len(paths)
            else:
                labels, self.classes = _labels_of(labels)
            starts = _seconds(starts, start_column) if starts is not None else [0.0] * len(paths)
            ends = _seconds(ends, end_column) if ends is not None else [0.0] * len(paths)
            videos = [(os.fspath(p), int(l), s, e)
                      for p, l, s, e in zip(paths, labels, starts, ends)]
        elif isinstance(source, (str, os.PathLike)) and os.path.isdir(source) and any(
                e.is_dir() for e in os.scandir(source)):
            found, self.classes = _class_folder(os.path.expanduser(os.fspath(source)))
            videos = [(p, label, 0.0, 0.0) for p, label in found]
        elif isinstance(source, (list, tuple)) and source and all(
                isinstance(s, tuple) and len(s) == 2 for s in source):
            videos = [(os.fspath(p), int(label), 0.0, 0.0) for p, label in source]
        else:
            files = _paths.expand(source, "video", VIDEO_EXTENSIONS + (".tar",))
            tars = [f for f in files if f.lower().endswith(".tar")]
            if tars and len(tars) != len(files):
                raise ValueError("VideoDataset: give tar shards or video files, not both")
            if tars:  # WebDataset: <key>.mp4 (or another video suffix) + <key>.cls
                self._files = _native.sources.TarShardFiles(tars, media="videos")
                videos = [(self._files.path(i), self._files.label(i), 0.0, 0.0)
                          for i in range(len(self._files))]
            else:
                videos = [(f, -1, 0.0, 0.0) for f in files]
        if not videos:
            raise ValueError("VideoDataset: no videos given")
        return videos

    def _make_pipeline(self, transform):
        """The frames' native pipeline, and whether every frame must be the first video's size
        (no transform)."""
        size = None
        if transform is None:
            first = probe(self.videos[0][0]) if self._files is None else \
                self._module.probe(self._files.read(0), self._files.path(0))
            size = (first["height"], first["width"])
        return frame_pipeline("VideoDataset", transform, size, [], self.max_pixels)

    def _source_for(self, shuffle):
        """The engine's source for a loader that shuffles or not: random clip starts follow
        ``shuffle`` unless ``random_clips`` says otherwise."""
        random = bool(shuffle) if self.random_clips is None else self.random_clips
        if random not in self._sources:
            videos = self.videos if self._files is None else self._files
            self._sources[random] = self._module.VideoSource(
                videos, self._pipeline, self.frames, self.stride, self.fps or 0.0,
                self.clips_per_video, random, self.timestamps, self.layout == "CTHW",
                self._exact_size, self.decoder_threads, self.index_cache_bytes)
        return self._sources[random]

    @property
    def default_shuffle(self):
        """What ``shuffle=True`` means for this dataset: the shard order for remote shards."""
        return "shards" if self._remote is not None else True

    # -- the dataset -------------------------------------------------------------------------

    def __len__(self):
        return len(self.videos) * self.clips_per_video

    @property
    def targets(self):
        """Every sample's label (each video's, ``clips_per_video`` times)."""
        return [v[1] for v in self.videos for _ in range(self.clips_per_video)]

    def path(self, index):
        """The video of sample ``index``."""
        return self.videos[check_index(index, len(self)) // self.clips_per_video][0]

    def __getitem__(self, index):
        """``(clip, label)`` (and the frames' timestamps with ``timestamps=True``) as NumPy
        arrays, with the randomness of seed 0, epoch 0, this index, and the clip starts of a
        loader without shuffle (unless ``random_clips`` is True)."""
        i = check_index(index, len(self))
        source = self._source_for(False)
        fields = source.sample(i, 0, 0)
        out = []
        for data, dtype, shape in zip(fields, source.field_dtypes, source.field_shapes):
            array = np.frombuffer(data, dtype=dtype).reshape(shape).copy()
            out.append(array if shape else array.item())
        return tuple(out)

    def stats(self):
        """Decoding counts since the dataset was made, over every loader that read it: clips,
        frames_delivered, frames_decoded (the decoder's output; skipped non-reference frames
        not counted), seeks, opens, decoder_reuses (opens that kept the decoder of a video
        encoded alike), index_builds, index_cache_bytes, decode_seconds and
        transform_seconds (worker time demuxing and decoding; converting and transforming the
        kept frames)."""
        total = {}
        for s in self._sources.values():
            for k, v in s.stats().items():
                total[k] = total.get(k, 0) + v
        return total

    def _batch_names(self):
        return ("pixel_values", "labels", "timestamps") if self.timestamps else \
            ("pixel_values", "labels")

    def _lengths(self, unit):
        """Pixels: each clip's frame width x height, from its video's header (its packet
        index)."""
        if unit != "pixels":
            return super()._lengths(unit)
        sizes = {}
        for i, (path, *_rest) in enumerate(self.videos):
            if path not in sizes:
                info = probe(path) if self._files is None else \
                    self._module.probe(self._files.read(i), self._files.path(i))
                sizes[path] = info["width"] * info["height"]
        return np.repeat([sizes[v[0]] for v in self.videos], self.clips_per_video)

    def _counters(self):
        return self.stats()

    def _figures(self, before, after):
        return decoding_figures(before, after)

    def _identity(self):
        return self.videos

    def __reduce__(self):  # pickled as its spec: the videos are resolved again where unpickled
        source, path_column, label_column, start_column, end_column = self._spec
        storage_options, cache_dir, cache_budget = self._remote_options
        kwargs = dict(random_clips=self.random_clips, path_column=path_column,
                      label_column=label_column, start_column=start_column,
                      end_column=end_column, decoder_threads=self.decoder_threads,
                      index_cache_bytes=self.index_cache_bytes, max_pixels=self.max_pixels,
                      storage_options=storage_options, cache_dir=cache_dir,
                      cache_budget=cache_budget)
        return _rebuild, (source, self.frames, self.stride, self.fps, self.clips_per_video,
                          self.transform, self.timestamps, self.layout, kwargs)

    def __repr__(self):
        lines = [f"Dataset {type(self).__name__}", f"    Number of datapoints: {len(self)}",
                 f"    Videos: {len(self.videos)}, clips of {self.frames} frames " +
                 (f"at {self.fps:g} fps" if self.fps else f"with stride {self.stride}")]
        if self.transform is not None:
            lines += ["    Transform: " + repr(self.transform).replace("\n", "\n    ")]
        return "\n".join(lines)


def decoding_figures(before, after):
    """Decoding over a run (two readings of a video source's stats), as ``diagnose`` takes a
    dataset's figures (sources/base.py ``figure``): the decoder's and the transform's worker
    seconds, each a stage with its advice, and frames decoded per frame delivered."""
    d = {k: after[k] - before[k] for k in ("decode_seconds", "transform_seconds",
                                           "frames_decoded", "frames_delivered")}
    return [
        figure("decode seconds", d["decode_seconds"], "s", stage="decode", advice=_DECODE_ADVICE),
        figure("transform seconds", d["transform_seconds"], "s", stage="frame transform",
               advice="convert and transform fewer pixels: videos stored at the resolution "
                      "the model takes, or a lighter transform"),
        figure("frames decoded per frame delivered",
               d["frames_decoded"] / d["frames_delivered"] if d["frames_delivered"] else 0.0,
               ""),
        figure("frames decoded", d["frames_decoded"], "frames"),
        figure("frames delivered", d["frames_delivered"], "frames"),
    ]


_DECODE_ADVICE = ("decode fewer frames per clip: keyframes closer together (re-encode with a "
                  "shorter GOP), clips that span fewer frames (a smaller stride or fps), several "
                  "clips of a video in one pass (clips_per_video with evenly spaced clips), or "
                  "videos stored at the resolution the model takes")


def _rebuild(source, frames, stride, fps, clips_per_video, transform, timestamps, layout, kwargs):
    return VideoDataset(source, frames, stride, fps, clips_per_video, transform, timestamps,
                        layout, **kwargs)
