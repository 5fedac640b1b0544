"""Stoker: a data-loading engine that keeps accelerators fed.

C++ threads read, decode and collate samples straight into pooled batch buffers, handed to PyTorch
or NumPy without a copy; every sample exactly once per epoch, bit-identical batches whatever the
worker count, resumable mid-epoch, bounded memory.

One front, ``DataLoader`` (loader.py), hands its options to a producer: native.py (the C++
engine), pydata/ (Python datasets in worker processes) or offload/ (Ray actors). The other
subpackages: sources/ (Stoker's datasets), gpu/ (the GPU feed and GPU decode), tuning/ (tune,
diagnose, stats), text/ (the tokenizer, its extension loaded on first use), audio/ (AudioDataset and its features,
its extension loaded on first use); cli/ (the ``stoker``
command and its sample data) is never imported from here.
"""

from ._version import __version__
from ._native.gpu import cuda_available
from ._native.engine import usable_cores
from . import image_text, transforms
from .audio import AudioDataset
from .budget import Budget
from .errors import DecodeError, MemoryBudgetError, SampleError, WorkerError
from .loader import DataLoader
from .offload.producer import RayOffload
from .sources.arrays import ArrayDataset
from .sources.images import ImageFolder, TarShards
from .sources.lerobot import LeRobotDataset
from .sources.mixture import Mixture
from .sources.tables import TableDataset
from .sources.tokens import TokenDataset
from .sources.video import VideoDataset
from .text import TextDataset, Tokenizer
from .image_text import VLMDataset
from .tuning.diagnose import diagnose

import sys as _sys

if "torch" in _sys.modules:  # the Python-dataset producer imports torch: load it now when cheap,
    from .pydata import producer as _pydata_producer  # noqa: F401  (not at the first batch)

__all__ = [
    "ArrayDataset",
    "AudioDataset",
    "Budget",
    "DataLoader",
    "DecodeError",
    "ImageFolder",
    "LeRobotDataset",
    "MemoryBudgetError",
    "Mixture",
    "RayOffload",
    "SampleError",
    "TableDataset",
    "TarShards",
    "TextDataset",
    "TokenDataset",
    "Tokenizer",
    "VLMDataset",
    "VideoDataset",
    "cuda_available",
    "diagnose",
    "image_text",
    "transforms",
    "usable_cores",
    "WorkerError",
]
