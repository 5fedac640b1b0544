"""stoker.RayOffload: batches produced by Ray actors on a local Ray instance are the local
loader's batches bit for bit; state_dict, rank sharding, elastic resume and on_error as local; an
actor killed mid-epoch loses nothing; memory in flight is bounded; without Ray, an error that
says how to install it."""

import os
import pickle
import random
import shutil
import signal
import sys
import tempfile

import numpy as np
import pytest
import torch

import stoker
from stoker import transforms as T
from stoker.sample_data import make_sample
from faulty import FaultyDataset

from conftest import ASAN_LANE

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    # Ray's memory monitor kills workers when the machine (shared with other jobs) runs low:
    # not this test's concern.
    saved = os.environ.get("RAY_memory_monitor_refresh_ms")
    os.environ["RAY_memory_monitor_refresh_ms"] = "0"  # read by the processes ray.init starts
    # Ray's session files (logs, sockets) in a directory of the test's own, removed afterwards
    # (short: the sockets' paths must fit in 107 bytes).
    session_dir = tempfile.mkdtemp(prefix="ray-")
    # In the ASan lane libasan goes to the processes that load the extension (this one, and Ray's
    # workers through the job's runtime_env), not to Ray's own uninstrumented daemons: a raylet
    # under libasan once missed Ray's fixed 30 s start limit on a loaded CI machine.
    preload = os.environ.pop("LD_PRELOAD", None) if ASAN_LANE else None
    runtime_env = {"env_vars": {"LD_PRELOAD": preload}} if preload else None
    try:
        # 4 logical CPUs on this 2-core machine: room for the actors of two loaders at once.
        ray.init(num_cpus=4, include_dashboard=False, object_store_memory=256 << 20,
                 log_to_driver=False, configure_logging=False, _temp_dir=session_dir,
                 runtime_env=runtime_env)
    finally:
        if preload:
            os.environ["LD_PRELOAD"] = preload
    # The Python datasets below travel by value: a Ray worker cannot import this test module.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    if ASAN_LANE:  # the workers run the ASan build of the extension, as this process does
        assert ray.get(asan_runtime.remote()) == asan_runtime._function()
    yield
    ray.shutdown()
    shutil.rmtree(session_dir, ignore_errors=True)
    if saved is None:
        del os.environ["RAY_memory_monitor_refresh_ms"]
    else:
        os.environ["RAY_memory_monitor_refresh_ms"] = saved


@ray.remote
def asan_runtime():
    """Where this process's extension comes from, and whether libasan is loaded."""
    with open("/proc/self/maps") as maps:
        return stoker._native.__file__, "libasan" in maps.read()


@pytest.fixture
def loaders(local_ray):
    """Makes offload loaders, and stops their actors after the test (the actors of one test must
    not hold the CPUs the next test's actors need)."""
    made = []

    def make(dataset, actors=2, cpus_per_actor=1, max_retries=3, **kw):
        loader = stoker.DataLoader(dataset, offload=stoker.RayOffload(
            actors=actors, cpus_per_actor=cpus_per_actor, max_retries=max_retries), **kw)
        made.append(loader)
        return loader

    yield make
    for loader in made:
        loader.shutdown()


def same(a, b):
    """Bit-identical batches: same structure, dtypes, shapes and bytes."""
    if isinstance(a, torch.Tensor):
        raw = lambda t: t.contiguous().view(torch.uint8).numpy().tobytes()  # bfloat16 too
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and \
            raw(a) == raw(b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and \
            a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b


def assert_same_batches(got, expected):
    assert len(got) == len(expected)
    for k, (a, b) in enumerate(zip(got, expected)):
        assert same(a, b), f"batch {k} differs"


def rows(n=300):
    data = np.random.default_rng(0).standard_normal((n, 5)).astype(np.float32)
    return stoker.ArrayDataset(data, np.arange(n, dtype=np.int64))


@pytest.mark.parametrize("actors,output,drop_last,rank", [(1, "torch", False, 1),
                                                          (2, "numpy", True, 0)])
def test_native_batches_equal_local_for_a_rank(loaders, actors, output, drop_last, rank):
    ds = rows()
    kw = dict(batch_size=16, shuffle=True, seed=11, drop_last=drop_last, output=output,
              world_size=2)
    off = loaders(ds, actors=actors, rank=rank, **kw)
    local = stoker.DataLoader(ds, rank=rank, **kw)
    it = iter(off)
    next(it), next(it)
    del it  # a `break`: the actors close its streams
    off.set_epoch(0)
    for epoch in (0, 1):  # the actors serve every epoch
        got, expected = list(off), list(local)
        assert_same_batches(got, expected)
        assert isinstance(got[0][0], torch.Tensor if output == "torch" else np.ndarray)
    assert off.stats()["batches"] == 2 * len(local) + 2 and off.stats()["retries"] == 0



@pytest.mark.parametrize("extra", [{"shuffle": "stratified"},
                                   {"shuffle": True, "class_weights": "balanced"}])
def test_stratified_and_weighted_orders_equal_local(loaders, extra):
    """The actors build the same class-balanced order from the same labels: the strided streams
    of a stratified epoch are the local loader's batches, bit for bit."""
    labels = np.array(([0] * 9 + [1] * 2 + [2]) * 25, dtype=np.int64)
    ds = stoker.ArrayDataset(np.arange(len(labels), dtype=np.int64), labels)
    kw = dict(batch_size=12, seed=4, world_size=2, rank=1, **extra)
    off = loaders(ds, actors=2, **kw)
    local = stoker.DataLoader(ds, **kw)
    for epoch in (0, 1):
        assert_same_batches(list(off), list(local))
    assert off.state_dict() == local.state_dict()

class WeightedKeys(torch.utils.data.Dataset):
    """A Python dataset with torchvision's `targets`, whose samples report their key and a
    draw."""
    targets = [0] * 4 + [1] * 36

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return torch.tensor([i, torch.initial_seed(), int(random.random() * 2**40)])


def test_python_dataset_with_class_weights_equals_local(loaders):
    """The actors key each draw of a Python dataset by its cycle, as the local loader does: the
    ~5 repeats of each rare sample in an epoch draw anew, and equal the local batches."""
    kw = dict(batch_size=8, shuffle=True, class_weights="balanced", seed=6)
    off = loaders(WeightedKeys(), **kw)
    got = list(off)
    assert_same_batches(got, list(stoker.DataLoader(WeightedKeys(), num_workers=0, **kw)))
    rows = torch.cat(got)
    rare = rows[rows[:, 0] < 4]
    assert len(rare) == 20 and len(set(rare[:, 2].tolist())) == 20


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray-images") / "sample"
    make_sample(root, num_classes=3, images_per_class=8, shards=2)
    return root


def test_augmented_images_equal_local_bit_for_bit(loaders, images):
    """The spec travels (root, transform) and the actor rebuilds the dataset; random crops and
    flips are drawn from (seed, epoch, index), so the batches are the local loader's."""
    aug = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(),
                     T.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25])])
    bf16 = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(),
                      T.ToTensor(dtype="bfloat16")])  # no NumPy dtype: travels as int16
    for ds, actors, cpus in ((stoker.ImageFolder(images / "train", transform=aug), 1, 2),
                             (stoker.TarShards(str(images / "shards" / "train-*.tar"),
                                               transform=bf16), 2, 1)):
        kw = dict(batch_size=5, shuffle=True, seed=3)
        off = loaders(ds, actors=actors, cpus_per_actor=cpus, **kw)
        off.set_epoch(4)
        local = stoker.DataLoader(ds, **kw)
        local.set_epoch(4)
        assert_same_batches(list(off), list(local))
        off.shutdown()


def test_native_datasets_travel_as_their_spec(tmp_path, images):
    """What an actor receives: paths, transform and mappings, not the data (files are read where
    the dataset is rebuilt)."""
    big = np.arange(200_000, dtype=np.int64).reshape(100_000, 2)
    np.save(tmp_path / "big.npy", big)
    mapped = stoker.ArrayDataset(str(tmp_path / "big.npy"), np.arange(100_000), names=["x", "i"])
    blob = pickle.dumps(mapped)
    assert len(blob) < 900_000 < big.nbytes  # the mapped array travels as its path
    back = pickle.loads(blob)
    assert back._files[0].path == str(tmp_path / "big.npy")  # mapped again, guarded again
    assert np.array_equal(back.arrays[0], big)
    # An array NumPy mapped (here a view of one) travels as its place in the file, and is mapped
    # again, guarded again, where it is unpickled.
    view = stoker.ArrayDataset(np.load(tmp_path / "big.npy", mmap_mode="r")[::-2, 1:])
    blob = pickle.dumps(view)
    assert len(blob) < 1000
    back = pickle.loads(blob)
    assert isinstance(back._files[0], stoker._native.sources.FileMapping)
    assert back._files[0].path == str(tmp_path / "big.npy")
    assert np.array_equal(back.arrays[0], big[::-2, 1:])
    (tmp_path / "tokens.bin").write_bytes(np.arange(1000, dtype=np.uint16).tobytes())
    aug = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor()])
    for ds in (mapped, stoker.TokenDataset(tmp_path / "tokens.bin", seq_len=7),
               stoker.ImageFolder(images / "train", transform=aug),
               stoker.TarShards(str(images / "shards" / "train-*.tar"), transform=aug),
               FaultyDataset(30, width=2, fail={3}, delay_us=1)):
        back = pickle.loads(pickle.dumps(ds))
        assert type(back) is type(ds) and len(back) == len(ds)
        kw = dict(batch_size=4, shuffle=True, seed=1, on_error="skip", output="numpy")
        assert_same_batches(list(stoker.DataLoader(back, **kw)), list(stoker.DataLoader(ds, **kw)))


def test_an_actor_refuses_a_dataset_that_differs_where_it_is_rebuilt(images, tmp_path):
    from stoker.offload.actor import BatchActor, fingerprint

    aug = T.Compose([T.CenterCrop(16), T.ToTensor()])
    ds = stoker.ImageFolder(images / "train", transform=aug)
    config = {"fingerprint": fingerprint(ds), "threads": 1, "python": {},
              "loader": dict(batch_size=2, shuffle=False, seed=0, drop_last=False, rank=0,
                             world_size=1, on_error="raise", memory_budget=None)}
    BatchActor(ds, config)  # the same files: fine
    other = tmp_path / "train"
    os.makedirs(other / "a")
    os.symlink(ds.samples[0][0], other / "a" / "x.jpg")
    with pytest.raises(RuntimeError, match="readable at the same paths"):
        BatchActor(stoker.ImageFolder(other, transform=aug), config)


class Augmenting:
    """A Python dataset that draws from random, numpy.random and torch in __getitem__."""

    def __len__(self):
        return 57

    def __getitem__(self, i):
        return {"index": i, "noise": torch.rand(3), "np": np.random.rand(2),
                "coin": random.random()}


def test_python_dataset_equals_local_with_per_sample_seeding(loaders):
    kw = dict(batch_size=6, shuffle=True, seed=5)
    off = loaders(Augmenting(), **kw)
    local = stoker.DataLoader(Augmenting(), num_workers=0, **kw)
    got, expected = list(off), list(local)
    assert_same_batches(got, expected)
    assert sorted(torch.cat([b["index"] for b in got]).tolist()) == list(range(57))
    # Process workers, the same seeds. Started by a forkserver: this process runs Ray's threads,
    # and a fork from it could copy a lock that one of them holds (in the ASan lane, the
    # allocator's: it has no fork handler).
    again = stoker.DataLoader(Augmenting(), num_workers=2, multiprocessing_context="forkserver",
                              **kw)
    assert_same_batches(got, list(again))


def test_state_dict_moves_between_offload_and_local_loaders(loaders):
    ds = rows(200)
    kw = dict(batch_size=8, shuffle=True, seed=2, output="numpy")
    full = list(stoker.DataLoader(ds, **kw))
    off = loaders(ds, **kw)
    it = iter(off)
    head = [next(it) for _ in range(7)]
    state = off.state_dict()
    del it
    local = stoker.DataLoader(ds, num_workers=1, **kw)
    local.load_state_dict(state)
    assert_same_batches(head + list(local), full)
    off.shutdown()
    # And back: a local state resumed by actors, with another world size (elastic).
    local = stoker.DataLoader(ds, **kw, rank=1, world_size=4)
    it = iter(local)
    for _ in range(2):
        next(it)
    state = local.state_dict()
    elastic = stoker.DataLoader(ds, **kw, rank=2, world_size=3)
    elastic.load_state_dict(state)
    off = loaders(ds, actors=1, **kw, rank=2, world_size=3)
    off.load_state_dict(state)
    assert_same_batches(list(off), list(elastic))


def test_a_row_group_order_resumes_elastically_on_actors(loaders, tmp_path):
    # A table's row groups are ordered for the world size (stripes): actors that resume a state
    # of another world size keep the epoch's arrangement, as a local loader does.
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"id": np.arange(300, dtype=np.int64)}), path, row_group_size=20)
    ds = stoker.TableDataset(str(path))
    kw = dict(batch_size=8, shuffle=True, seed=2, output="numpy")
    local = stoker.DataLoader(ds, **kw, rank=1, world_size=4)
    it = iter(local)
    for _ in range(2):
        next(it)
    state = local.state_dict()
    assert state["stripes"] == 4
    elastic = stoker.DataLoader(ds, **kw, rank=2, world_size=3)
    elastic.load_state_dict(state)
    off = loaders(ds, actors=1, **kw, rank=2, world_size=3)
    off.load_state_dict(state)
    assert off.state_dict()["stripes"] == 4
    assert_same_batches(list(off), list(elastic))


def test_on_error_raise_and_skip_as_local(loaders):
    ds = FaultyDataset(60, width=2, fail={5, 33})
    off = loaders(ds, batch_size=4, on_error="raise", output="numpy")
    it = iter(off)
    assert next(it)[:, 0].tolist() == [0, 1, 2, 3]
    with pytest.raises(stoker.SampleError) as info:
        next(it)
    assert info.value.index == 5 and "sample-5.bin" in str(info.value)
    assert isinstance(info.value.__cause__, stoker.DecodeError)
    assert next(it)[:, 0].tolist() == [8, 9, 10, 11]  # the loader goes on
    off.shutdown()
    kw = dict(batch_size=4, shuffle=True, seed=8, on_error="skip", output="numpy")
    off = loaders(ds, **kw)
    local = stoker.DataLoader(ds, **kw)
    assert_same_batches(list(off), list(local))
    s = off.stats()
    assert s["skipped"] == 2 and sorted(t.split(":")[0] for t in s["skipped_samples"]) == \
        sorted(t.split(":")[0] for t in local.stats()["skipped_samples"])


def test_an_actor_killed_mid_epoch_loses_nothing(loaders):
    ds = FaultyDataset(240, width=3, delay_us=2000)  # 2 ms a sample: the epoch takes a while
    kw = dict(batch_size=6, shuffle=True, seed=1, output="numpy")
    expected = list(stoker.DataLoader(ds, **kw))
    off = loaders(ds, actors=2, **kw)
    it = iter(off)
    got = [next(it) for _ in range(3)]
    victim = it.streams[(3 - it.first) % len(it.streams)].actor  # the next batch's actor
    os.kill(off._producer._actors.pids[victim], signal.SIGKILL)
    got += list(it)
    assert_same_batches(got, expected)
    s = off.stats()
    assert s["actor_failures"] == 1 and s["retries"] >= 1
    assert s["batches"] == len(expected)


class Crashing:
    """Sample 7 kills the process that produces it."""

    def __len__(self):
        return 20

    def __getitem__(self, i):
        if i == 7:
            os._exit(3)
        return i


def test_a_batch_that_kills_every_actor_raises_after_max_retries(loaders):
    off = loaders(Crashing(), actors=1, max_retries=2, batch_size=4)
    it = iter(off)
    assert next(it).tolist() == [0, 1, 2, 3]
    with pytest.raises(stoker.WorkerError, match="batch 1 of epoch 0: the Ray actors"):
        next(it)
    assert off.stats()["actor_failures"] == 3  # the first death, then two retries


def test_memory_in_flight_is_bounded(loaders):
    ds = rows(400)
    off = loaders(ds, batch_size=10, prefetch_factor=3)
    list(off)
    assert 2 <= off.stats()["in_flight_peak"] <= 2 * 3
    off.shutdown()
    batch_bytes = 10 * (5 * 4 + 8)
    tight = loaders(ds, batch_size=10, prefetch_factor=3, memory_budget=2 * batch_bytes + 1)
    list(tight)
    assert tight.stats()["in_flight_peak"] <= 2  # one batch a stream: what the budget holds
    assert tight.stats()["batch_bytes"] == batch_bytes


def test_offload_refuses_what_it_cannot_reproduce(local_ray):
    from torch.utils.data import IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(4))

    off = stoker.RayOffload(actors=1)
    with pytest.raises(ValueError, match='num_workers must be "auto"'):
        stoker.DataLoader(rows(), num_workers=2, offload=off)
    with pytest.raises(ValueError, match="sampler"):
        stoker.DataLoader(Augmenting(), sampler=list(range(57)), offload=off)
    with pytest.raises(ValueError, match="map-style"):
        stoker.DataLoader(Stream(), offload=off)
    with pytest.raises(ValueError, match="actors must be a positive integer"):
        stoker.RayOffload(actors=0)
    with pytest.raises(TypeError, match="RayOffload"):
        stoker.DataLoader(rows(), offload="ray")


def test_without_ray_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'stoker\[ray\]'"):
        stoker.RayOffload(actors=2)


def test_address_none_joins_a_running_cluster_or_starts_a_local_one(monkeypatch):
    class FakeRay:
        def __init__(self, running):
            self.running, self.calls, self.initialized = running, [], False

        def is_initialized(self):
            return self.initialized

        def init(self, address=None):
            self.calls.append(address)
            if address == "auto" and not self.running:
                raise ConnectionError("Could not find any running Ray instance")
            self.initialized = True

    for running, calls in ((True, ["auto"]), (False, ["auto", None])):
        fake = FakeRay(running)
        monkeypatch.setitem(sys.modules, "ray", fake)
        assert stoker.RayOffload(actors=1)._connect() is fake and fake.calls == calls
        assert stoker.RayOffload(actors=1)._connect() is fake and fake.calls == calls  # joined
    fake = FakeRay(False)
    monkeypatch.setitem(sys.modules, "ray", fake)
    stoker.RayOffload(address="ray://head:10001")._connect()
    assert fake.calls == ["ray://head:10001"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available")
def test_device_cuda_without_cuda_is_refused_with_offload_too(local_ray):
    with pytest.raises(RuntimeError, match="CUDA"):
        stoker.DataLoader(rows(), batch_size=4, device="cuda",
                          offload=stoker.RayOffload(actors=1))
