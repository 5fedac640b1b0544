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
        # Stoker's own options are fixed too: one home, the loader's frozen options.
        with pytest.raises(ValueError, match="output attribute should not be set"):
            loader.output = "numpy"
        assert loader.output == "torch" and loader.repeats == 1 and loader.on_error == "raise"


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
    # The extensions: they import nothing of the package (_arrow, _video, _text and _audio import
    # _native only).
    modules = {"stoker._native": None, "stoker._arrow": None, "stoker._video": None,
               "stoker._text": None, "stoker._audio": None}
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


# ---- one rule, one place --------------------------------------------------------------------------

def test_options_are_one_immutable_value():
    loader = stoker.DataLoader(stoker.ArrayDataset(np.arange(4)), batch_size=2)
    import dataclasses
    with pytest.raises(dataclasses.FrozenInstanceError):
        loader._options.batch_size = 3
    assert loader._options.order == "engine" and loader._options.stratified is False


def test_each_shared_rule_has_one_message_for_every_producer():
    # repeats: the plain order only, whoever produces (the engine refuses it too, for C++ users)
    arrays = stoker.ArrayDataset(np.arange(6), np.arange(6) % 2)
    mixture = stoker.Mixture({"a": stoker.ArrayDataset(np.arange(6)),
                              "b": stoker.ArrayDataset(np.arange(6))})
    for dataset, kw in ((arrays, dict(shuffle="stratified")), (mixture, {}),
                        (MapStyle(), dict(sampler=list(range(6)))),
                        (MapStyle(), dict(shuffle=True, class_weights="balanced",
                                          labels=[0, 1] * 3)),
                        (Stream(), {})):
        with pytest.raises(ValueError, match=r"^repeats is for the plain order \(shuffle=True or "
                                             r"False\): not with shuffle=\"stratified\""):
            stoker.DataLoader(dataset, batch_size=2, repeats=2, **kw)
    # batch_size: one message for every producer the engine orders (a Python dataset: torch's)
    for kw in ({}, dict(offload=stoker.RayOffload()) if importlib.util.find_spec("ray") else {}):
        with pytest.raises(ValueError,
                           match=r"^batch_size must be a positive integer or a stoker.Budget, got 0$"):
            stoker.DataLoader(arrays, batch_size=0, **kw)
    with pytest.raises(ValueError, match=r"^batch_size should be a positive integer value"):
        stoker.DataLoader(MapStyle(), batch_size=0)


def _attributes_read(path, owner):
    """Names ``X`` read as ``<owner>.X`` in the module at ``path`` (``owner``: a dotted name such
    as ``self._producer``)."""
    names = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) == owner:
            names.add(node.attr)
    return names


def test_the_front_reads_only_what_the_protocols_declare():
    from stoker._producer import Producer
    from stoker.sources.base import StokerDataset
    front = {"loader.py": ["self._producer", "loader._producer"],
             "_state.py": ["loader._producer", "p"],
             "tuning/diagnose.py": ["producer"]}
    for module, owners in front.items():
        for owner in owners:
            for name in _attributes_read(os.path.join(PACKAGE, module), owner):
                # diagnose reads a NativeProducer's C++ engine once it has checked the type
                assert hasattr(Producer, name) or name == "engine", (module, owner, name)
    datasets = {"loader.py": ["ds"], "native.py": ["dataset", "self.dataset"],
                "sources/mixture.py": ["ds"], "balance.py": ["dataset"],
                "offload/producer.py": ["dataset"], "pydata/producer.py": ["dataset"]}
    for module, owners in datasets.items():
        for owner in owners:
            for name in _attributes_read(os.path.join(PACKAGE, module), owner):
                if name.startswith("_") and not name.startswith("__"):
                    assert hasattr(StokerDataset, name), (module, owner, name)


def test_no_probing_for_private_names():
    # getattr/hasattr on a private name is a member nobody declared; the exceptions read other
    # libraries' objects (torchvision's transforms, NumPy's memmap, torch's C module, a
    # namedtuple's fields, a Hugging Face dataset's indices, sys on free-threaded builds,
    # transformers' Trainer's cache of eval loaders, which Trainer creates the same way) or an
    # attribute Stoker sets on exceptions it raises. Dunders are Python's own protocols.
    allowed = {"_fill", "_labels_getter", "_mmap", "_cuda_getCurrentRawStream", "_stoker_index",
               "_initialized", "_fields", "_indices", "_is_gil_enabled", "_eval_dataloaders"}
    found = []
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                        node.func.id in ("getattr", "hasattr") and len(node.args) >= 2 and \
                        isinstance(node.args[1], ast.Constant) and \
                        str(node.args[1].value).startswith("_") and \
                        not str(node.args[1].value).startswith("__") and \
                        node.args[1].value not in allowed:
                    found.append(f"{os.path.relpath(path, PACKAGE)}:{node.lineno} "
                                 f"{node.args[1].value}")
    assert not found, found


def test_every_stoker_dataset_is_a_stoker_dataset_and_a_table_is_not_an_image_dataset():
    from stoker.sources.base import StokerDataset
    from stoker.sources.images import _ImageDataset
    for cls in (stoker.ArrayDataset, stoker.TokenDataset, stoker.ImageFolder, stoker.TarShards,
                stoker.Mixture):
        assert issubclass(cls, StokerDataset), cls
    tables = pytest.importorskip("stoker.sources.tables")
    assert issubclass(tables.TableDataset, StokerDataset)
    assert not issubclass(tables.TableDataset, _ImageDataset)
