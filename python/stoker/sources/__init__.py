"""Stoker's own datasets, read by the C++ engine: arrays and token files (arrays.py), image folders
and tar shards (images.py)."""
