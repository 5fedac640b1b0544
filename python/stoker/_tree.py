"""The one walker over batch trees outside collation: a batch is a leaf, or a tuple, list, dict
or namedtuple of batches (as torch's pin_memory and default_collate see it)."""

from __future__ import annotations

import collections.abc


def tree_map(fn, obj, leaf_type):
    """``obj`` with every leaf of ``leaf_type`` replaced by fn(leaf): tuples, lists, mappings and
    namedtuples keep their type (a mapping type that cannot be built from a dict becomes a
    dict); str, bytes and other leaves pass through."""
    if isinstance(obj, leaf_type):
        return fn(obj)
    if isinstance(obj, (str, bytes)):
        return obj
    if isinstance(obj, collections.abc.Mapping):
        mapped = {k: tree_map(fn, v, leaf_type) for k, v in obj.items()}
        try:
            return type(obj)(mapped)
        except TypeError:
            return mapped
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(tree_map(fn, v, leaf_type) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(tree_map(fn, v, leaf_type) for v in obj)
    return obj


def tree_leaves(obj, leaf_type):
    """The leaves of ``leaf_type`` in ``obj``, in tree_map's order."""
    out = []
    tree_map(out.append, obj, leaf_type)
    return out
