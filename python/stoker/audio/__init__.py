"""The audio modality: ``AudioDataset`` (dataset.py: files, NeMo and Lhotse manifests, and
WebDataset tar shards and Hugging Face audio tables (shards.py), decoded, resampled and
featurized natively), the features ``Fbank`` and ``LogMel`` and their
``SpecAugment`` masks (features.py), and ``load``/``probe`` for one file.

Decoding, resampling and features are the C++ audio wing (include/stoker/audio/); its extension,
``stoker._audio``, links FFmpeg's libraries (libavformat, libavcodec, libswresample, libavutil)
and is imported on first use, so that ``import stoker`` never needs it. docs/audio.md says what is
supported and the tolerances against the reference libraries.
"""

from .features import Fbank, LogMel, SpecAugment
from .files import ffmpeg_versions, load, probe, resampler

__all__ = ["AudioDataset", "Fbank", "LogMel", "SpecAugment", "ffmpeg_versions", "load", "probe",
           "resampler"]


def __getattr__(name):
    if name == "AudioDataset":  # its module imports the sources; loaded on first use
        from .dataset import AudioDataset
        return AudioDataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
