"""The one front: every dataset and every option gives a stoker.DataLoader (no subclass), its
options are checked once, and the package has no import circle and keeps the CLI out of
``import stoker``."""

import ast
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import stoker

PACKAGE = os.path.dirname(stoker.__file__)


class MapStyle:
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return i


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(5))


def loaders():
    arrays = stoker.ArrayDataset(np.arange(12).reshape(6, 2))
    yield stoker.DataLoader(arrays, batch_size=2)
    yield stoker.DataLoader(arrays, batch_size=2, shuffle="stratified",
                            labels=[0, 1, 0, 1, 0, 1])
    yield stoker.DataLoader(MapStyle(), batch_size=2, num_workers=0)
    yield stoker.DataLoader(MapStyle(), batch_size=None, num_workers=0)
    yield stoker.DataLoader(MapStyle(), batch_size=2, shuffle=True, class_weights="balanced",
                            labels=[0, 1, 0, 1, 0, 1], num_workers=0)
    yield stoker.DataLoader(Stream(), batch_size=2)
    if importlib.util.find_spec("ray") is not None:  # made, not started: no Ray instance
        yield stoker.DataLoader(arrays, batch_size=2, offload=stoker.RayOffload())
        yield stoker.DataLoader(MapStyle(), batch_size=2, offload=stoker.RayOffload())


def test_every_dataset_and_option_gives_the_one_dataloader_class():
    made = list(loaders())
    assert len(made) >= 6
    for loader in made:
        assert type(loader) is stoker.DataLoader
        s = loader.stats()  # built in one place: the same keys whoever produces
        for key in ("batches", "samples", "skipped", "skipped_samples", "num_workers",
                    "prefetch_factor", "pin_memory", "memory_budget", "device"):
            assert key in s, (key, loader._producer)
        state = loader.state_dict()
        assert state["version"] == 3 and state["epoch"] == 0


def test_options_checked_once_with_one_message_for_every_producer():
    arrays = stoker.ArrayDataset(np.arange(4))
    for dataset in (arrays, MapStyle()):
        with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*64\)"):
            stoker.DataLoader(dataset, seed=-1)
        with pytest.raises(ValueError, match='output must be "torch" or "numpy"'):
            stoker.DataLoader(dataset, output="jax")
        with pytest.raises(ValueError, match="memory_budget must be None"):
            stoker.DataLoader(dataset, memory_budget="lots")
        with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
            stoker.DataLoader(dataset, bogus=1)
    with pytest.raises(ValueError, match="collate_fn is for Python datasets"):
        stoker.DataLoader(arrays, collate_fn=list)


def test_torchs_frozen_attributes_are_frozen_for_every_dataset():
    for dataset in (stoker.ArrayDataset(np.arange(4)), MapStyle()):
        loader = stoker.DataLoader(dataset, batch_size=2, num_workers=0)
        with pytest.raises(ValueError, match="batch_size attribute should not be set"):
            loader.batch_size = 3
        loader.output = "numpy"  # not frozen


def _imports(path, module, modules):
    """The modules of ``modules`` that ``module`` (at ``path``) imports, anywhere in its body:
    ``from P import x`` imports module P.x where there is one, else P itself."""
    is_package = path.endswith("__init__.py")
    base = module.split(".") if is_package else module.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parent = ".".join(base[:len(base) - node.level + 1] +
                                  ([node.module] if node.module else []))
            elif (node.module or "").startswith("stoker"):
                parent = node.module
            else:
                continue
            for a in node.names:
                out.add(f"{parent}.{a.name}" if f"{parent}.{a.name}" in modules else parent)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("stoker"))
    return {m for m in out if m in modules and m != module}


def test_no_import_circle_in_the_package():
    # The extensions: they import nothing of the package (_arrow imports _native only).
    modules = {"stoker._native": None, "stoker._arrow": None}
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
                modules[rel.removesuffix(".__init__")] = path
    graph = {m: _imports(p, m, modules) if p else set() for m, p in modules.items()}
    state = {}

    def visit(m, stack):
        state[m] = "open"
        for t in graph[m]:
            if state.get(t) == "open":
                raise AssertionError("import circle: " + " -> ".join(stack + [m, t]))
            if t not in state:
                visit(t, stack + [m])
        state[m] = "done"

    for m in modules:
        if m not in state:
            visit(m, [])


def test_import_stoker_leaves_the_cli_and_python_dataset_machinery_out():
    # Without torch loaded, the Python-dataset producer (which imports torch) waits for a
    # Python dataset; with torch loaded it comes with stoker, so the first batch does not pay.
    code = ("import sys, stoker; assert 'torch' not in sys.modules; print(sorted(m for m in "
            "sys.modules if m.startswith(('stoker.cli', 'stoker.pydata'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_python_datasets_get_torchs_messages_first_and_its_truthy_drop_last():
    sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(6)), 3,
                                            False)
    with pytest.raises(ValueError, match="batch_sampler option is mutually exclusive with"):
        stoker.DataLoader(MapStyle(), drop_last=3, batch_sampler=sampler)
    with pytest.raises(ValueError, match="expected unspecified shuffle option"):
        stoker.DataLoader(Stream(), shuffle=3)
    loader = stoker.DataLoader(MapStyle(), batch_size=4, drop_last=1, num_workers=0)
    assert loader.drop_last is True and len(list(loader)) == 1
    with pytest.raises(ValueError, match="drop_last must be True or False"):
        stoker.DataLoader(stoker.ArrayDataset(np.arange(4)), drop_last=1)
    assert stoker.DataLoader(MapStyle(), batch_size=None, num_workers=0)._auto_collation is False
