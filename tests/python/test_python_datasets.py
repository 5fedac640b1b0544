"""stoker.DataLoader over Python datasets: behaves like torch.utils.data.DataLoader (batching,
collate, samplers, errors, timeout, worker_init_fn, IterableDataset sharding), with the engine's
guarantees (exactly once, worker-count independence, resume) and clean shutdown."""

import collections
import gc
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import (BatchSampler, Dataset, IterableDataset, RandomSampler,
                              SequentialSampler, default_collate, get_worker_info)

import stoker

Point = collections.namedtuple("Point", "x y")


class Nested(Dataset):
    def __init__(self, n=23):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"t": torch.arange(4, dtype=torch.float32) * i,
                "pair": (np.full((2, 3), i, dtype=np.int16), float(i) / 2),
                "pt": Point(torch.tensor([i, -i]), i % 3 == 0),
                "name": f"s{i}", "n": i, "np": np.float32(i)}


class Random(Dataset):
    """Augmentation with every global RNG: must not depend on which worker ran the sample."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.tensor([i, random.random(), np.random.rand(), torch.rand(1).item()],
                            dtype=torch.float64)


class Failing(Dataset):
    def __init__(self, bad=7, n=20):
        self.bad, self.n = bad, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError(f"bad sample {i}")
        return torch.tensor([i])


class Killing(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor([i])


class Slow(Dataset):
    def __init__(self, delay, at=None):
        self.delay, self.at = delay, at

    def __len__(self):
        return 16

    def __getitem__(self, i):
        if self.at is None or i == self.at:
            time.sleep(self.delay)
        return torch.tensor([i])


class Stream(IterableDataset):
    def __init__(self, n=21):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(wid, self.n, nw):
            yield {"i": torch.tensor(i), "w": wid}


@pytest.fixture
def children():
    """Child processes this test started (earlier tests' exceptions may keep theirs alive)."""
    gc.collect()
    before = {p.pid for p in psutil.Process().children()}
    return lambda: [p for p in psutil.Process().children() if p.pid not in before]


def same(a, b):
    """Deep equality of collated batches, types included."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), (a, b)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    else:
        assert a == b


def both(ds, workers=2, **kw):
    ours = list(stoker.DataLoader(ds, num_workers=workers, **kw))
    theirs = list(torch.utils.data.DataLoader(ds, num_workers=0, **kw))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        same(a, b)
    return ours


@pytest.mark.parametrize("workers", [0, 2])
def test_default_collate_of_nested_samples_matches_torch(workers):
    both(Nested(), workers, batch_size=5)
    both(Nested(), workers, batch_size=5, drop_last=True)
    both(Nested(7), workers, batch_size=None)


def test_samplers_batch_sampler_and_collate_fn_match_torch():
    def sampler():
        return RandomSampler(range(23), generator=torch.Generator().manual_seed(3))
    ours = list(stoker.DataLoader(Nested(), sampler=sampler(), batch_size=4, num_workers=2))
    theirs = list(torch.utils.data.DataLoader(Nested(), sampler=sampler(), batch_size=4))
    for a, b in zip(ours, theirs):
        same(a, b)
    both(Nested(), batch_sampler=BatchSampler(SequentialSampler(range(23)), 6, True))
    both(Nested(), batch_size=4, collate_fn=lambda b: [s["n"] for s in b])
    both(Nested(), batch_size=4, collate_fn=lambda b: {"t": torch.stack([s["t"] for s in b])})


def test_argument_validation_matches_torch():
    cases = [dict(batch_sampler=BatchSampler(range(4), 2, False), batch_size=3),
             dict(batch_sampler=BatchSampler(range(4), 2, False), drop_last=True),
             dict(sampler=range(4), shuffle=True), dict(batch_size=None, drop_last=True),
             dict(num_workers=-1), dict(timeout=-1), dict(persistent_workers=True, num_workers=0)]
    for kw in cases:
        with pytest.raises(ValueError) as theirs:
            torch.utils.data.DataLoader(Nested(), **kw)
        with pytest.raises(ValueError, match=None) as ours:
            stoker.DataLoader(Nested(), **kw)
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError, match="expected unspecified shuffle option"):
        stoker.DataLoader(Stream(), shuffle=True)


def test_iterable_dataset_sharding_matches_torch():
    for workers in (0, 2, 3):
        ours = list(stoker.DataLoader(Stream(), batch_size=4, num_workers=workers))
        theirs = list(torch.utils.data.DataLoader(Stream(), batch_size=4, num_workers=workers))
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            same(a, b)


def test_worker_init_fn_runs_once_per_worker(tmp_path):
    def init(worker_id):
        with open(tmp_path / f"{worker_id}-{os.getpid()}", "w"):
            pass
    assert len(list(stoker.DataLoader(Nested(), batch_size=2, num_workers=3,
                                      worker_init_fn=init))) == 12
    assert sorted(p.split("-")[0] for p in os.listdir(tmp_path)) == ["0", "1", "2"]


def test_order_is_the_native_loaders_and_exactly_once():
    kw = dict(batch_size=7, shuffle=True, seed=9, drop_last=False)
    native = [b.tolist() for b in stoker.DataLoader(
        stoker.ArrayDataset(np.arange(50)), output="numpy", num_workers=1, **kw)]

    class Index(Dataset):
        def __len__(self):
            return 50

        def __getitem__(self, i):
            return i
    ours = [b.tolist() for b in stoker.DataLoader(Index(), num_workers=2, **kw)]
    assert ours == native
    assert sorted(sum(ours, [])) == list(range(50))


def test_batches_identical_for_any_worker_count_with_random_augmentation():
    def run(workers):
        loader = stoker.DataLoader(Random(), batch_size=6, shuffle=True, num_workers=workers)
        loader.set_epoch(3)
        return [b for b in loader]
    ref = run(0)
    assert len({round(float(x), 6) for b in ref for x in b[:, 1]}) == 40  # really random
    for workers in (1, 2, 4):
        got = run(workers)
        assert all(torch.equal(a, b) for a, b in zip(ref, got)) and len(got) == len(ref)
    state = (random.getstate(), torch.get_rng_state())
    run(0)  # in-process: the caller's RNG states are restored after each batch
    assert state[0] == random.getstate() and torch.equal(state[1], torch.get_rng_state())


def test_per_sample_seeding_gives_the_documented_states_and_clears_cached_normals():
    from stoker import _native, workers
    seeder = workers.sample_seeder()
    assert seeder is not workers._seed_slow  # the generators' fields were located here
    draws = []
    for leftover in (False, True):
        if leftover:  # a previous sample left a cached normal in each generator
            random.gauss(0, 1)
            np.random.standard_normal()
            while workers._torch_cpu_generator.get_state()[5040] != 1:  # normal_is_valid
                torch.randn(1)
        seeder(5, 2, 11)
        draws.append((random.random(), random.gauss(0, 1), np.random.rand(),
                      np.random.standard_normal(), torch.rand(1).item(), torch.randn(1).item()))
    key = _native.sample_seed(5, 2, 11)
    assert torch.initial_seed() == key
    random.setstate((3, tuple(_native.mt19937_state(key, "random")) + (624,), None))
    np.random.set_state(("MT19937", np.array(_native.mt19937_state(key, "numpy"), np.uint32),
                         624, 0, 0.0))
    torch.set_rng_state(workers._torch_state(key, _native.mt19937_state(key, "torch")))
    expected = (random.random(), random.gauss(0, 1), np.random.rand(),
                np.random.standard_normal(), torch.rand(1).item(), torch.randn(1).item())
    assert draws == [expected, expected]
    workers._seed_slow(5, 2, 12)  # the fallback path gives the same states as the native one
    slow = (random.random(), np.random.rand(), torch.rand(1).item())
    seeder(5, 2, 12)
    assert slow == (random.random(), np.random.rand(), torch.rand(1).item())
    # The three generators get different states.
    assert len({random.random(), np.random.rand(), torch.rand(1, dtype=torch.float64).item()}) == 3


class SometimesRandom(Dataset):
    """Draws from one global generator only for some samples, after many that draw from none:
    the adaptive seeding must still give those the seeded states."""

    def __len__(self):
        return 240

    def __getitem__(self, i):
        if i < 150 or i % 7:
            return torch.tensor([i, 0.0], dtype=torch.float64)
        draw = (random.random, np.random.rand, lambda: torch.rand(1).item(),
                lambda: random.gauss(0, 1))[i % 4]()
        return torch.tensor([i, draw], dtype=torch.float64)


def test_adaptive_seeding_gives_every_drawing_sample_its_seeded_state():
    from stoker import _native, workers

    def expected(i):
        workers._seed_slow(5, 1, i)
        return SometimesRandom()[i]

    def run(workers_n, mode):
        loader = stoker.DataLoader(SometimesRandom(), batch_size=16, shuffle=True, seed=5,
                                   num_workers=workers_n, seed_samples=mode)
        loader.set_epoch(1)
        return torch.cat(list(loader))
    ref = run(0, "always")
    assert torch.equal(ref[ref[:, 0].argsort()],
                       torch.stack([expected(i) for i in range(240)]))
    assert (ref[:, 1] != 0).sum() == sum(1 for i in range(150, 240) if i % 7 == 0)
    for workers_n in (0, 1, 2):
        assert torch.equal(run(workers_n, True), ref)
    # The fetcher itself: generators no sample drew from are checked, not written; a chunk in
    # which a sample drew from one runs again with it seeded, which is seeded from then on.
    calls = collections.Counter()

    class Counting(SometimesRandom):
        def __getitem__(self, i):
            calls[i] += 1
            return super().__getitem__(i)
    fetcher = workers.sample_fetcher(5, True)
    got = fetcher.fetch(Counting(), 1, list(range(150)))
    assert fetcher.modes == ["lazy", "lazy", "lazy"] and set(calls.values()) == {1}
    key = _native.sample_seed(5, 1, 149)
    assert torch.initial_seed() == key  # torch's initial_seed() is always the sample's key
    for start in range(150, 240, 10):  # chunks; any sequence of indices
        got += fetcher.fetch(Counting(), 1, np.arange(start, start + 10))
    assert torch.equal(torch.stack(got), torch.stack([expected(i) for i in range(240)]))
    assert fetcher.modes == ["seeded", "seeded", "seeded"]
    # Sample 154 drew from torch's generator, 161 from NumPy's, 168 from random's: their chunks
    # ran twice (both generators of the second one at once), and no other sample.
    assert {int(i) for i, c in calls.items() if c == 2} == set(range(150, 170))
    assert all(calls[i] == 1 for i in [*range(150), *range(170, 240)])


def test_adaptive_seeding_reruns_a_failed_sample_that_drew_and_keeps_its_index():
    from stoker import workers

    class DrawsThenFails(Dataset):
        def __getitem__(self, i):
            if i == 100:
                if np.random.rand() < 2:
                    raise ValueError("bad sample")
            return i
    fetcher = workers.sample_fetcher(0, True)
    fetcher.fetch(DrawsThenFails(), 0, range(100))
    with pytest.raises(ValueError, match="bad sample") as info:
        fetcher.fetch(DrawsThenFails(), 0, [99, 100, 101])
    assert info.value._stoker_index == 100 and fetcher.modes == ["lazy", "seeded", "lazy"]
    with pytest.raises(TypeError, match="integer sample indices.*'a'") as info:
        fetcher.fetch({"a": 1}, 0, ["a"])
    assert info.value._stoker_index == "a"
    assert workers.sample_fetcher(0, False).fetch({"a": 1}, 0, ["a"]) == [1]
    with pytest.raises(ValueError, match="seed_samples"):
        stoker.DataLoader(Random(), seed_samples="sometimes")


def test_global_rng_states_puts_back_every_generator_with_its_cached_normals():
    from stoker import workers
    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    random.gauss(0, 1)  # each generator now holds a cached normal
    np.random.standard_normal()
    while workers._torch_cpu_generator.get_state()[5040] != 1:
        torch.randn(1)
    restore = workers.global_rng_states()
    before = (random.gauss(0, 1), random.random(), np.random.standard_normal(),
              np.random.rand(), torch.randn(3), torch.rand(2))
    workers.sample_seeder()(1, 2, 3)
    random.random(), np.random.rand(), torch.rand(5)
    restore()
    after = (random.gauss(0, 1), random.random(), np.random.standard_normal(),
             np.random.rand(), torch.randn(3), torch.rand(2))
    assert before[:4] == after[:4]
    assert torch.equal(before[4], after[4]) and torch.equal(before[5], after[5])


@pytest.mark.parametrize("column", [[1, -2, 3], [0.5, 2.0, -1.25], [True, False], [2**70, 1],
                                    [2**63 - 1, -2**63]])
def test_number_columns_collate_exactly_as_default_collate(column):
    from stoker import workers
    try:
        expected = default_collate(column)
    except Exception as e:
        with pytest.raises(type(e)):
            workers._collate_column(column)
        return
    got = workers._collate_column(column)
    assert got.dtype == expected.dtype and torch.equal(got, expected)


def test_resume_from_state_dict():
    loader = stoker.DataLoader(Random(), batch_size=4, shuffle=True, num_workers=2)
    full = list(loader)
    loader.set_epoch(0)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    del it
    resumed = stoker.DataLoader(Random(), batch_size=4, shuffle=True, num_workers=1)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(full) - 3
    assert all(torch.equal(a, b) for a, b in zip(rest, full[3:]))


@pytest.mark.parametrize("workers", [0, 2])
def test_exception_keeps_type_message_traceback_and_index(workers):
    loader = stoker.DataLoader(Failing(), batch_size=4, num_workers=workers)
    got = []
    with pytest.raises(ValueError) as info:  # catchable as the original type, as with torch
        for b in loader:
            got.append(b)
    err = info.value
    assert isinstance(err, stoker.SampleError) and err.index == 7
    assert "bad sample 7" in str(err)
    assert isinstance(err.__cause__, ValueError) and "bad sample 7" in str(err.__cause__)
    if workers:
        assert "Traceback" in str(err) and "__getitem__" in str(err)
    assert len(got) == 1
    del info, err
    with pytest.raises(ValueError, match="bad sample 7"):
        list(torch.utils.data.DataLoader(Failing(), batch_size=4))
    gc.collect()


class Uneven(Dataset):
    """Numbers of mixed types, and (with ``bad_shape``) one tensor of another shape."""

    def __init__(self, bad_shape=None):
        self.bad_shape = bad_shape

    def __len__(self):
        return 12

    def __getitem__(self, i):
        t = torch.zeros(3 if i == self.bad_shape else 2) + i
        return t, (i if i % 3 else i / 2)


@pytest.mark.parametrize("workers", [1, 3])
def test_first_batch_shared_with_the_workers_falls_back_like_default_collate(workers):
    # Batch 0 is produced by this process and the workers together: samples that differ in
    # structure or shape must give what torch gives, value or error.
    both(Uneven(), workers=workers, batch_size=4)
    for bad in (1, 6):  # in the shared first batch, in a later one
        with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
            list(torch.utils.data.DataLoader(Uneven(bad), batch_size=4))
        with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
            list(stoker.DataLoader(Uneven(bad), batch_size=4, num_workers=workers))


class WhoRan(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.tensor([i, random.randrange(1000)]), os.getpid()


def test_the_consumer_produces_samples_of_the_batch_it_waits_for():
    ref = list(stoker.DataLoader(WhoRan(), batch_size=8, shuffle=True, num_workers=0))
    loader = stoker.DataLoader(WhoRan(), batch_size=8, shuffle=True, num_workers=1)
    got = list(loader)
    pids = {p for _, ps in got for p in ps.tolist()}
    assert os.getpid() in pids and len(pids) == 2  # this process and the worker both produced
    assert [b[0].tolist() for b in got] == [b[0].tolist() for b in ref]  # the same samples
    assert loader.stats()["pickled_batches"] == 0


class Paced(Dataset):
    def __init__(self, n, seconds):
        self.n, self.seconds = n, seconds

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return torch.tensor([i, random.randrange(1000)]), os.getpid()


def test_auto_workers_are_forked_only_when_the_measured_work_pays_for_it(children):
    expected_workers = stoker.DataLoader(Paced(1, 0), num_workers="auto").num_workers

    def run(n, seconds, persistent=False):
        loader = stoker.DataLoader(Paced(n, seconds), batch_size=16, shuffle=True,
                                   persistent_workers=persistent)
        forked = []
        got = []
        for batch in loader:
            forked.append((loader.stats()["worker_processes"], len(children())))
            got.append(batch)
        ref = list(stoker.DataLoader(Paced(n, 0), batch_size=16, shuffle=True, num_workers=0))
        assert [b[0].tolist() for b in got] == [b[0].tolist() for b in ref]  # same samples
        return forked, {p for _, ps in got for p in ps.tolist()} - {os.getpid()}
    # Fast samples, a short epoch: this process produces it alone; nothing is forked.
    forked, pids = run(2000, 0)
    assert set(forked) == {(0, 0)} and not pids
    # 5 ms a sample: the first chunk shows that the batch is slow; a worker is forked to help.
    forked, pids = run(48, 0.005)
    assert forked[0] == (1, 1) and forked[-1] == (expected_workers, expected_workers) and pids
    # 0.3 ms a sample: the first batch is fast, but the epoch's rest (0.7 s) pays for the forks,
    # which come once a second batch confirms the pace.
    forked, pids = run(2400, 0.0003)
    assert forked[:2] == [(0, 0), (0, 0)] and forked[2] == (expected_workers,) * 2 and pids
    # 0.2 ms a sample, a 0.3 s epoch: not worth a fork for one epoch, but with persistent workers
    # (kept for the epochs to come) it is.
    forked, pids = run(1200, 0.0002)
    assert set(forked) == {(0, 0)} and not pids
    forked, pids = run(1200, 0.0002, persistent=True)
    assert forked[:2] == [(0, 0), (0, 0)] and forked[2] == (expected_workers,) * 2 and pids
    assert children() == []


class Waiting(Dataset):
    """3 ms a sample, with the GIL released (as file reads and most decoders release it) or
    held (pure Python)."""

    thread_safe = True  # __getitem__ may run on several threads at once

    def __init__(self, releases):
        self.releases = releases

    def __len__(self):
        return 96

    def __getitem__(self, i):
        if self.releases:
            time.sleep(0.003)
        else:
            end = time.perf_counter() + 0.003
            while time.perf_counter() < end:
                pass
        return torch.tensor([i, i * i]), i % 5


def test_auto_runs_on_threads_when_the_work_releases_the_gil(children):
    ref = [b[0].tolist() for b in stoker.DataLoader(Waiting(True), batch_size=16, shuffle=True,
                                                     num_workers=0)]

    def run(releases, **kw):
        loader = stoker.DataLoader(Waiting(releases), batch_size=16, shuffle=True, **kw)
        got = []
        for b in loader:
            got.append(b[0].tolist())
            if releases and kw.get("seed_samples") is False and Waiting.thread_safe:
                assert children() == []  # no process is forked
        assert got == ref
        stats = loader.stats()
        return stats["worker_threads"], stats["worker_processes"]
    threads, processes = run(True, seed_samples=False)
    assert threads == min(stoker.usable_cores(), 16) and processes == 0
    # Per-sample seeding of the process-global generators needs processes.
    threads, processes = run(True)
    assert threads == 0 and processes >= 1
    # Work that holds the GIL does not go faster on a second thread: processes.
    threads, processes = run(False, seed_samples=False)
    assert threads == 0 and processes >= 1
    # A dataset that does not say it is thread-safe never runs on two threads at once.
    Waiting.thread_safe = False
    try:
        threads, processes = run(True, seed_samples=False)
    finally:
        Waiting.thread_safe = True
    assert threads == 0 and processes >= 1
    assert children() == []


def test_without_consumer_help_every_sample_runs_in_a_worker():
    ref = list(stoker.DataLoader(WhoRan(), batch_size=8, shuffle=True, num_workers=0))
    loader = stoker.DataLoader(WhoRan(), batch_size=8, shuffle=True, num_workers=2,
                               consumer_helps=False)
    got = list(loader)
    pids = {p for _, ps in got for p in ps.tolist()}
    assert os.getpid() not in pids and len(pids) == 2
    assert [b[0].tolist() for b in got] == [b[0].tolist() for b in ref]
    with pytest.raises(TypeError, match="consumer_helps must be True or False"):
        stoker.DataLoader(WhoRan(), consumer_helps="no")


def test_error_in_the_shared_first_batch_names_the_sample():
    for bad in range(4):  # whichever process claims it
        loader = stoker.DataLoader(Failing(bad=bad), batch_size=4, num_workers=2)
        it = iter(loader)
        with pytest.raises(ValueError, match=f"bad sample {bad}") as info:
            next(it)
        assert info.value.index == bad
        assert [b.tolist() for b in it] == [[[i] for i in range(k, k + 4)]
                                            for k in range(4, 20, 4)]


class SlowFailing(Failing):
    def __getitem__(self, i):
        time.sleep(0.001 * (i % 3))  # uneven: producers finish their chunks at different times
        return super().__getitem__(i)


def test_error_in_a_batch_the_consumer_helped_ahead_with_comes_in_order():
    # The consumer produces chunks of later batches while the worker finishes the one due; a
    # failure there must surface when its batch is due, after every batch before it.
    for bad in (13, 22, 30):
        loader = stoker.DataLoader(SlowFailing(bad=bad, n=40), batch_size=4, num_workers=1)
        got = []
        with pytest.raises(ValueError, match=f"bad sample {bad}") as info:
            for b in loader:
                got.append(b.flatten().tolist())
        assert info.value.index == bad
        assert got == [list(range(k, k + 4)) for k in range(0, bad // 4 * 4, 4)]


def test_the_consumer_drops_its_pages_of_recycled_buffers():
    def shmem_kib():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("RssShmem"))

    class Big(Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            return torch.full((256, 1024), float(i))  # 1 MiB

    before = shmem_kib()
    for b in stoker.DataLoader(Big(), batch_size=4, num_workers=1):
        assert b.sum().item() > -1  # touches every page of the 4 MiB batch
    del b
    assert shmem_kib() - before < 1024  # not the 8+ MiB of the buffers it touched


class Corrupt(Dataset):
    """Samples in ``bad`` fail as a corrupt file does."""

    def __init__(self, bad=(3, 11), n=30):
        self.bad, self.n = set(bad), n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise OSError(f"cannot identify image file 'img{i}.jpg'")
        return torch.tensor([i, random.randrange(1000)]), i


def test_on_error_skip_replaces_failed_samples_deterministically():
    from stoker import _native

    def replacement(i, epoch=0, seed=0):  # the native loader's rule (src/loader.cc)
        return next(o for o in (_native.sample_seed(seed, epoch, i * 16 + a) % 30
                                for a in range(1, 17)) if o != i and o not in (3, 11))

    def run(workers_n):
        loader = stoker.DataLoader(Corrupt(), batch_size=4, shuffle=True, on_error="skip",
                                   num_workers=workers_n)
        batches = list(loader)
        return batches, loader.stats()
    ref, stats = run(0)
    order = [i for b in stoker.DataLoader(Corrupt(bad=()), batch_size=4, shuffle=True,
                                          num_workers=0) for i in b[1].tolist()]
    assert [i for b in ref for i in b[1].tolist()] == [
        replacement(i) if i in (3, 11) else i for i in order]
    assert stats["skipped"] == 2 and sorted(stats["skipped_samples"]) == [
        "sample 11: OSError: cannot identify image file 'img11.jpg'",
        "sample 3: OSError: cannot identify image file 'img3.jpg'"]
    for workers_n in (1, 2, "auto"):  # bit-identical whoever produced what, counted once
        got, stats = run(workers_n)
        assert len(got) == len(ref) and all(
            torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, ref))
        assert stats["skipped"] == 2
    # Nothing readable: the error names the sample and says why.
    with pytest.raises(RuntimeError, match="no readable replacement found after 16 attempts") \
            as info:
        list(stoker.DataLoader(Corrupt(bad=range(30)), batch_size=4, on_error="skip",
                               num_workers=0))
    assert info.value.index == 0
    with pytest.raises(ValueError, match="on_error"):
        stoker.DataLoader(Stream(), on_error="skip")


def test_killed_worker_raises_naming_pid_and_signal_without_hanging(children):
    start = time.monotonic()
    with pytest.raises(stoker.WorkerError, match=r"worker \d \(pid \d+\) was killed by signal "
                                                 r"SIGKILL") as info:
        # consumer_helps=False: every sample runs in a worker, none in this process
        list(stoker.DataLoader(Killing(), batch_size=2, num_workers=2, consumer_helps=False))
    assert time.monotonic() - start < 10
    assert not psutil.pid_exists(info.value.pid) or \
        psutil.Process(info.value.pid).status() == psutil.STATUS_ZOMBIE
    assert children() == []


def test_timeout_raises_like_torch(children):
    with pytest.raises(RuntimeError, match="DataLoader timed out after 0.3 seconds"):
        list(stoker.DataLoader(Slow(3, at=2), batch_size=2, num_workers=1, timeout=0.3))
    assert children() == []


def shm_entries():
    return set(os.listdir("/dev/shm"))


def test_break_and_gc_leave_no_process_and_no_shared_memory_file(children):
    before = shm_entries()
    loader = stoker.DataLoader(Slow(0.01), batch_size=2, num_workers=3)
    for b, _ in enumerate(loader):
        # The first batch comes from this process and one worker, the others start after it.
        assert len(children()) == (1 if b == 0 else 3)
        if b == 1:
            break
    assert children() == []
    it = iter(loader)
    next(it)
    del it
    assert children() == []
    assert shm_entries() <= before


def test_persistent_workers_are_reused_and_stopped(children):
    loader = stoker.DataLoader(Nested(), batch_size=4, num_workers=2, persistent_workers=True)
    list(loader)
    pids = {p.pid for p in children()}
    assert len(pids) == 2
    second = list(loader)
    assert {p.pid for p in children()} == pids
    same(second[0], list(torch.utils.data.DataLoader(Nested(), batch_size=4))[0])
    del loader
    assert children() == []


def test_ctrl_c_stops_workers(tmp_path):
    script = textwrap.dedent("""
        import sys, time, torch, psutil
        sys.path.insert(0, %r)
        import stoker
        from test_python_datasets import Slow
        loader = stoker.DataLoader(Slow(0.05), batch_size=1, num_workers=2)
        for i, b in enumerate(loader):
            if i == 1:
                print(" ".join(str(p.pid) for p in psutil.Process().children()), flush=True)
    """ % os.path.dirname(__file__))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    time.sleep(0.2)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in pids)


def test_threads_and_numpy_output():
    loader = stoker.DataLoader(Nested(), batch_size=5, num_workers=2, worker_type="thread")
    for a, b in zip(loader, torch.utils.data.DataLoader(Nested(), batch_size=5)):
        same(a, b)
    batch = next(iter(stoker.DataLoader(Nested(), batch_size=5, num_workers=1, output="numpy")))
    assert isinstance(batch["t"], np.ndarray) and batch["name"][0] == "s0"


def test_batches_live_in_recycled_shared_buffers():
    loader = stoker.DataLoader(Nested(), batch_size=4, num_workers=2, memory_budget="64MiB")
    kept = list(loader)  # more batches than buffers: the rest travel pickled, still correct
    for a, b in zip(kept, torch.utils.data.DataLoader(Nested(), batch_size=4)):
        same(a, b)
    del kept
    for _ in range(3):
        for _ in loader:
            pass
    s = loader.stats()
    assert s["buffer_bytes"] <= s["memory_budget"]
    assert s["batches"] == 4 * 6 and s["pickled_batches"] == 0
