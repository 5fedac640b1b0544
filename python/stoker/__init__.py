"""Stoker: a data-loading engine that keeps accelerators fed.

C++ threads read, decode and collate samples straight into pooled batch buffers, handed to PyTorch
or NumPy without a copy; every sample exactly once per epoch, bit-identical batches whatever the
worker count, resumable mid-epoch, bounded memory.
"""

from ._native.gpu import cuda_available
from ._native.engine import usable_cores
from . import transforms
from .datasets import ArrayDataset, TokenDataset
from .diagnose import diagnose
from .errors import DecodeError, MemoryBudgetError, SampleError, WorkerError
from .images import ImageFolder, TarShards
from .loader import DataLoader
from .offload import RayOffload

import sys as _sys

if "torch" in _sys.modules:  # the front for Python datasets imports torch; load it now if cheap
    from . import python_datasets as _python_datasets  # noqa: F401

__version__ = "0.1.0"

__all__ = [
    "ArrayDataset",
    "DataLoader",
    "DecodeError",
    "ImageFolder",
    "MemoryBudgetError",
    "RayOffload",
    "SampleError",
    "TarShards",
    "TokenDataset",
    "cuda_available",
    "diagnose",
    "transforms",
    "usable_cores",
    "WorkerError",
]
