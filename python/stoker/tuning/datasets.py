"""What the dataset argument of ``stoker stats``, ``stoker tune`` and ``stoker diagnose`` names:
an ImageFolder root, WebDataset tar shards (a path or glob), or a table (a ``.parquet`` /
``.arrow`` file, glob or directory of them; ``--image COLUMN`` for an image table, ``--label
COLUMN`` for its labels). Nothing given: the built-in sample data."""

from __future__ import annotations

import glob
import os

from ..sources.tables import _TABLE_SUFFIXES

__all__ = ["add_dataset_arguments", "open_dataset"]

DATASET_HELP = ("an ImageFolder root, tar shards (a path or glob such as 'shards/train-*.tar'), "
                "or a table: a .parquet/.arrow file, glob or directory of them (default: the "
                "built-in sample data)")


def add_dataset_arguments(parser, help=DATASET_HELP):
    parser.add_argument("dataset", nargs="?", default=None, help=help)
    parser.add_argument("--image", metavar="COLUMN",
                        help="a table's column of encoded images (binary, or HF's Image)")
    parser.add_argument("--label", metavar="COLUMN", help="a table's integer label column")


def is_table(spec, image=None):
    """Whether ``spec`` names table files (or ``--image`` says it does)."""
    if image is not None:
        return True
    path = os.path.expanduser(os.fspath(spec))
    if os.path.isdir(path):
        return any(f.lower().endswith(_TABLE_SUFFIXES) for f in os.listdir(path)) and not any(
            e.is_dir() for e in os.scandir(path))
    matches = sorted(glob.glob(path)) if glob.has_magic(path) else [path]
    return bool(matches) and matches[0].lower().endswith(_TABLE_SUFFIXES)


def open_dataset(spec, transform=None, image=None, label=None):
    """The dataset ``spec`` names (see the module docstring); ``transform`` for image datasets.
    A table without ``image`` is read as columns (``transform`` unused)."""
    from ..sources.images import ImageFolder, TarShards
    from ..sources.tables import TableDataset
    if spec is None:
        from ..sample_data import default_sample_root, make_sample
        make_sample()
        return ImageFolder(os.path.join(default_sample_root(), "train"), transform=transform)
    if is_table(spec, image):
        if image is None:
            if label is not None:
                raise ValueError("--label names an image table's labels: give --image too")
            return TableDataset(spec)
        return TableDataset(spec, image=image, label=label, transform=transform)
    if image is not None or label is not None:
        raise ValueError("--image and --label are for tables (.parquet, .arrow)")
    if os.path.isdir(spec):
        return ImageFolder(spec, transform=transform)
    return TarShards(spec, transform=transform)


def where(dataset):
    """Where a dataset's samples are, for a command's report."""
    return dataset._where()
