"""stoker.DataLoader keeps torch.utils.data.DataLoader's semantics where a Python dataset can
observe them: which process runs a sample, worker start-up and seeds, persistent copies, the
multiprocessing start methods, the keywords torch has and the checks, warnings and errors it gives.
Stoker's own tests in the shape of PyTorch's test/test_dataloader.py (tools/torch_conformance.py
runs that suite itself)."""

import gc
import multiprocessing
import os
import pickle
import random
import threading
import warnings

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

import stoker

TIMEOUT = 60  # seconds a loader may wait for a batch here: a hang fails instead of blocking


@pytest.fixture
def children():
    gc.collect()
    before = {p.pid for p in psutil.Process().children()}
    return lambda: [p for p in psutil.Process().children() if p.pid not in before]


class WhoAmI(Dataset):
    """Each sample says which process ran it and what that process's worker info and seeds
    were."""

    def __init__(self, n=12):
        self.n = n
        self.tag = "main"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = get_worker_info()
        return {"i": i, "pid": os.getpid(), "worker": -1 if info is None else info.id,
                "workers": -1 if info is None else info.num_workers,
                "tag": self.tag, "seed": torch.initial_seed()}


def tag_worker(worker_id):
    info = get_worker_info()
    assert info.id == worker_id and info.seed == torch.initial_seed()
    info.dataset.tag = f"init{worker_id}"


def test_explicit_workers_run_every_sample_after_worker_init_fn_with_worker_info():
    loader = stoker.DataLoader(WhoAmI(), batch_size=2, num_workers=2, worker_init_fn=tag_worker,
                               timeout=TIMEOUT)
    it = iter(loader)
    pids = {p.pid for p in it._workers}
    batches = list(it)
    assert len(pids) == 2 and os.getpid() not in pids
    for k, b in enumerate(batches):
        w = k % 2  # batch k goes to worker k mod 2, as torch dispatches
        assert b["worker"].tolist() == [w, w] and b["workers"].tolist() == [2, 2]
        assert b["tag"] == [f"init{w}"] * 2 and set(b["pid"].tolist()) <= pids
    assert WhoAmI().tag == "main" and get_worker_info() is None


class Barrier(Dataset):
    """Every sample waits until all ``n`` workers hold one: it finishes only when the workers
    all run at once (a dataset that synchronises its workers)."""

    def __init__(self, n):
        self.n = n
        self.barrier = multiprocessing.get_context("fork").Barrier(n)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.barrier.wait(timeout=TIMEOUT)
        return get_worker_info().id


def test_workers_start_up_front_so_a_barrier_across_them_does_not_hang():
    got = list(stoker.DataLoader(Barrier(3), batch_size=1, num_workers=3, timeout=TIMEOUT))
    assert sorted(int(b) for b in got) == [0, 1, 2]


class Mutable(Dataset):
    def __init__(self):
        self.value = 0

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return self.value


def test_persistent_workers_keep_their_dataset_copies():
    ds = Mutable()
    loader = stoker.DataLoader(ds, batch_size=2, num_workers=2, persistent_workers=True)
    for epoch in range(3):
        assert [b.tolist() for b in loader] == [[0, 0], [0, 0]]
        ds.value = epoch + 1  # the workers copied the dataset when they started
    fresh = stoker.DataLoader(ds, batch_size=2, num_workers=2)  # new workers copy it anew
    assert [b.tolist() for b in fresh] == [[3, 3], [3, 3]]


def test_sample_seeds_fit_in_63_bits_and_collate():
    # torch.initial_seed() of each sample is its 63-bit key: a batch of them is an int64 tensor.
    for workers in (0, 2):
        seeds = torch.cat([b["seed"] for b in stoker.DataLoader(WhoAmI(64), batch_size=8,
                                                                  num_workers=workers)])
        assert seeds.dtype == torch.int64 and (seeds >= 0).all()
        assert len(set(seeds.tolist())) == 64  # one key a sample, whichever worker ran it
        ref = [stoker._native.pydata.sample_key(0, 0, i) for i in range(64)]
        assert seeds.tolist() == ref


class Draws(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([torch.initial_seed(), random.randrange(2**30),
                             int(np.random.randint(2**30))])


def seed_torch_in_init(worker_id):
    torch.manual_seed(12345)


def test_worker_init_fn_seeding_wins_over_per_sample_seeding():
    got = torch.cat(list(stoker.DataLoader(Draws(), batch_size=2, num_workers=2,
                                           worker_init_fn=seed_torch_in_init)))
    assert (got[:, 0] == 12345).all()  # torch's generator is worker_init_fn's
    # random and numpy, untouched by it, are still seeded per sample: the same as in-process
    ref = torch.cat(list(stoker.DataLoader(Draws(), batch_size=2, num_workers=0)))
    assert torch.equal(got[:, 1:], ref[:, 1:])
    assert len(set(got[:, 1].tolist())) == 8


class Augment(Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        return torch.tensor([float(i), torch.rand(()).item()])


def test_generator_seeds_the_order_and_the_sample_seeds():
    def run(seed, workers=0):
        g = torch.Generator().manual_seed(seed)
        return torch.cat(list(stoker.DataLoader(Augment(), batch_size=4, shuffle=True,
                                                generator=g, num_workers=workers)))
    a, b, c = run(1), run(1, workers=2), run(2)
    assert torch.equal(a, b)  # reproducible, whatever the worker count
    assert a[:, 0].tolist() != c[:, 0].tolist() and sorted(a[:, 0].tolist()) == list(range(20))
    assert not torch.equal(a[:, 1].sort().values, c[:, 1].sort().values)  # other draws
    g = torch.Generator().manual_seed(1)
    before = g.get_state()
    loader = stoker.DataLoader(Augment(), generator=g)
    next(iter(loader))
    assert not torch.equal(g.get_state(), before)  # it was used, not ignored
    with pytest.raises(ValueError, match="seed or generator"):
        stoker.DataLoader(Augment(), seed=3, generator=torch.Generator())


class Counting(Dataset):
    def __init__(self, n=11):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


@pytest.mark.parametrize("method", [m for m in ("spawn", "forkserver")
                                    if m in multiprocessing.get_all_start_methods()])
def test_every_multiprocessing_context_gives_the_same_batches_in_shared_memory(method):
    ref = [b.tolist() for b in stoker.DataLoader(Counting(), batch_size=3, num_workers=0)]
    for context in (method, multiprocessing.get_context(method)):
        loader = stoker.DataLoader(Counting(), batch_size=3, num_workers=1,
                                   multiprocessing_context=context, timeout=TIMEOUT)
        assert [b.tolist() for b in loader] == ref
        assert loader.stats()["pickled_batches"] == 0  # the memfd reached the workers
    assert loader.multiprocessing_context.get_start_method() == method


def test_multiprocessing_context_is_checked_as_torch_checks_it():
    with pytest.raises(ValueError, match=r"multi-process loading \(num_workers > 0\)"):
        stoker.DataLoader(Counting(), num_workers=0, multiprocessing_context="fork")
    with pytest.raises(ValueError, match="should specify a valid start method in"):
        stoker.DataLoader(Counting(), num_workers=1, multiprocessing_context="bad")
    with pytest.raises(TypeError, match="multiprocessing_context option should be a valid "):
        stoker.DataLoader(Counting(), num_workers=1, multiprocessing_context=object())


class FirstWaits(Dataset):
    """Sample 0 waits until the training process says so (``go``)."""

    def __init__(self):
        self.go = multiprocessing.get_context("fork").Event()

    def __len__(self):
        return 4

    def __getitem__(self, i):
        if i == 0:
            assert self.go.wait(TIMEOUT)
        return i


def test_in_order_false_hands_out_batches_as_they_are_ready():
    ds = FirstWaits()
    it = iter(stoker.DataLoader(ds, num_workers=2, in_order=False, timeout=TIMEOUT))
    first = next(it).item()  # batch 0 cannot be ready before `go`: another batch comes first
    ds.go.set()
    assert first != 0 and sorted([first] + [b.item() for b in it]) == [0, 1, 2, 3]
    ds = FirstWaits()
    ds.go.set()
    assert [b.item() for b in stoker.DataLoader(ds, num_workers=2)] == [0, 1, 2, 3]


def test_pin_memory_device_is_accepted():
    loader = stoker.DataLoader(Counting(), batch_size=2, pin_memory_device="cuda")
    batch = next(iter(loader))
    assert not batch.is_pinned() if not torch.cuda.is_available() else True
    assert loader.pin_memory_device == "cuda"


class Stream(IterableDataset):
    def __init__(self, n, length):
        self.n, self.length = n, length

    def __len__(self):
        return self.length

    def __iter__(self):
        return iter(range(self.n))


@pytest.mark.parametrize("workers", [0, 1])
def test_iterable_dataset_longer_than_its_len_warns_once_len_was_asked(workers):
    loader = stoker.DataLoader(Stream(8, 5), num_workers=workers)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(loader)) == 8  # len() not asked: no warning
    assert len(loader) == 5
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(5):
            next(it)
    for _ in range(3):
        with pytest.warns(UserWarning, match=r"reported to be 5 .* but \d samples have been "
                                             r"fetched"):
            next(it)


def test_more_workers_than_cores_warns():
    with pytest.warns(UserWarning, match="excessive worker creation might get DataLoader "
                                         "running slow or even freeze"):
        stoker.DataLoader(Counting(), num_workers=os.cpu_count() + 50)


def test_reassigning_what_defines_the_batches_raises():
    loader = stoker.DataLoader(Counting(), batch_size=2)
    for attr in ("batch_size", "sampler", "batch_sampler", "drop_last", "dataset",
                 "persistent_workers"):
        with pytest.raises(ValueError, match=f"{attr} attribute should not be set after"):
            setattr(loader, attr, 3)
    loader.timeout = 5  # the others may change, as with torch


class Unpicklable:
    def __reduce__(self):
        raise TypeError("cannot pickle an Unpicklable")


class HoldsUnpicklable(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return Unpicklable()


def test_an_unpicklable_sample_raises_a_pickling_error_naming_its_type(children):
    with pytest.raises(pickle.PicklingError, match="an object of type Unpicklable that cannot "
                                                    "be sent") as info:
        list(stoker.DataLoader(HoldsUnpicklable(), batch_size=None, num_workers=1,
                               timeout=TIMEOUT))
    assert "exited unexpectedly" not in str(info.value)
    del info  # its traceback holds the iterator, which holds the workers
    gc.collect()
    assert children() == []
    # In this process nothing is sent: the sample is the batch.
    assert isinstance(next(iter(stoker.DataLoader(HoldsUnpicklable(), batch_size=None))),
                      Unpicklable)


class Bulk(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, keys):
        assert isinstance(keys, list)
        return torch.tensor([[k, random.randrange(1000)] for k in keys])


class ListSampler(Sampler):
    def __iter__(self):
        return iter([[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]])

    def __len__(self):
        return 4


def test_a_sampler_of_lists_with_batch_size_none_is_seeded_by_place():
    runs = [list(stoker.DataLoader(Bulk(), batch_size=None, sampler=ListSampler(),
                                   num_workers=w)) for w in (0, 2)]
    assert [b[:, 0].tolist() for b in runs[0]] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert all(torch.equal(a, b) for a, b in zip(*runs))  # seeded the same in any worker


def test_a_tiny_dataset_forks_no_worker_by_default(children):
    loader = stoker.DataLoader(list(range(4)), batch_size=None)  # num_workers omitted
    for _ in loader:
        assert children() == []
    assert loader.stats()["worker_processes"] == 0


class Failing(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 3:
            raise KeyError(f"no sample {i}")
        return i


def test_an_error_carries_the_workers_exception_and_the_epoch_goes_on():
    it = iter(stoker.DataLoader(Failing(), batch_size=2, num_workers=2))
    assert next(it).tolist() == [0, 1]
    with pytest.raises(KeyError) as info:
        next(it)
    err = info.value
    assert isinstance(err, stoker.SampleError) and err.index == 3
    assert isinstance(err.__cause__, KeyError) and err.__cause__.args == ("no sample 3",)
    assert "Caught KeyError in DataLoader worker process 1" in str(err)
    assert "Traceback" in str(err) and "__getitem__" in str(err)
    assert next(it).tolist() == [4, 5]


def raise_in_init(worker_id):
    raise RuntimeError(f"worker {worker_id} cannot start")


def test_an_error_in_worker_init_fn_is_raised(children, monkeypatch):
    with pytest.raises(RuntimeError, match=r"worker \d cannot start"):
        list(stoker.DataLoader(Counting(), num_workers=2, worker_init_fn=raise_in_init))
    assert children() == []
    # Also when the worker has exited before its first task is sent (its pipe is broken then:
    # the error is still the worker_init_fn's). Seen in torch's suite under load.
    from stoker.pydata import workers
    submit = workers.ProcessPool.submit

    def after_exit(self, worker, task):
        self.processes[worker].join(30)
        submit(self, worker, task)
    monkeypatch.setattr(workers.ProcessPool, "submit", after_exit)
    with pytest.raises(RuntimeError, match=r"worker 0 cannot start"):
        list(stoker.DataLoader(Counting(), num_workers=2, worker_init_fn=raise_in_init))
    assert children() == []


def test_auto_decides_before_the_first_sample_when_a_dataset_could_tell(children):
    # An IterableDataset runs in this process: more workers would each replay its stream.
    loader = stoker.DataLoader(Stream(5, 5))
    assert [b.item() for b in loader] == [0, 1, 2, 3, 4] and children() == []
    # A worker_init_fn (or persistent_workers, or a timeout): workers from the first sample on.
    got = list(stoker.DataLoader(WhoAmI(), batch_size=2, worker_init_fn=tag_worker))
    assert all(w >= 0 for b in got for w in b["worker"].tolist())
    assert os.getpid() not in {p for b in got for p in b["pid"].tolist()}


def test_a_killed_worker_is_reported_with_torchs_wording(children):
    class Kills(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            os.kill(os.getpid(), 9)

    with pytest.raises(stoker.WorkerError, match=r"DataLoader worker \(pid \d+\) is killed by "
                                                 r"signal: "):
        list(stoker.DataLoader(Kills(), num_workers=1))
    assert children() == []


def test_workers_exit_cleanly_when_the_iterator_is_dropped():
    it = iter(stoker.DataLoader(Counting(40), batch_size=2, num_workers=2))
    workers = it._workers
    for _ in range(3):
        next(it)
    del it
    for w in workers:
        w.join(TIMEOUT)
        assert not w.is_alive() and w.exitcode == 0


def test_threads_also_run_worker_init_fn():
    seen = []
    lock = threading.Lock()

    def init(worker_id):
        with lock:
            seen.append(worker_id)
    got = list(stoker.DataLoader(Counting(6), batch_size=2, num_workers=2, worker_type="thread",
                                 worker_init_fn=init))
    assert [b.tolist() for b in got] == [[0, 1], [2, 3], [4, 5]] and sorted(seen) == [0, 1]
