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
from stoker import _native

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
    from stoker import _native
    from stoker.pydata import rng_fields
    from stoker.pydata import seeding
    seeder = seeding.global_seeder()
    assert seeder is not None  # the generators' fields were located (and verified) here
    key = _native.pydata.sample_key(5, 2, 11)
    assert key < 2**63
    draws = []
    for leftover in (False, True):
        if leftover:  # a previous sample left a cached normal in each generator
            random.gauss(0, 1)
            np.random.standard_normal()
            while torch.default_generator.get_state()[5040] != 1:  # normal_is_valid
                torch.randn(1)
        seeder.seed(key, list(seeding.GENERATORS))
        draws.append((random.random(), random.gauss(0, 1), np.random.rand(),
                      np.random.standard_normal(), torch.rand(1).item(), torch.randn(1).item()))
    assert torch.initial_seed() == key
    random.setstate((3, tuple(_native.pydata.mt19937_state(key, "random")) + (624,), None))
    np.random.set_state(("MT19937", np.array(_native.pydata.mt19937_state(key, "numpy"), np.uint32),
                         624, 0, 0.0))
    torch.set_rng_state(rng_fields.torch_state(key, _native.pydata.mt19937_state(key, "torch")))
    expected = (random.random(), random.gauss(0, 1), np.random.rand(),
                np.random.standard_normal(), torch.rand(1).item(), torch.randn(1).item())
    assert draws == [expected, expected]
    other = _native.pydata.sample_key(5, 2, 12)
    seeding._slow_seed((False, False, False))(other)  # the public calls give the same states
    slow = (random.random(), np.random.rand(), torch.rand(1).item())
    seeder.seed(other, list(seeding.GENERATORS))
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
    from stoker import _native
    from stoker.pydata import seeding

    def expected(i):
        seeding._slow_seed((False, False, False))(_native.pydata.sample_key(5, 1, i))
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
    fetcher = seeding.fetcher(5, True)
    got = fetcher.fetch(Counting(), 1, list(range(150)))
    assert fetcher.modes == ["lazy", "lazy", "lazy"] and set(calls.values()) == {1}
    key = _native.pydata.sample_key(5, 1, 149)
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
    from stoker import _native
    from stoker.pydata import seeding

    class DrawsThenFails(Dataset):
        def __getitem__(self, i):
            if i == 100:
                if np.random.rand() < 2:
                    raise ValueError("bad sample")
            return i
    fetcher = seeding.fetcher(0, True)
    fetcher.fetch(DrawsThenFails(), 0, range(100))
    with pytest.raises(ValueError, match="bad sample") as info:
        fetcher.fetch(DrawsThenFails(), 0, [99, 100, 101])
    assert info.value._stoker_index == 100 and fetcher.modes == ["lazy", "seeded", "lazy"]
    # A key that is not an integer (a bulk sampler's list) is seeded from its place in the epoch.
    got = seeding.fetcher(0, "always").fetch({"a": 1, "b": 2}, 3, ["a", "b"], 7)
    assert got == [1, 2] and torch.initial_seed() == _native.testing.position_key(0, 3, 7, 1)
    with pytest.raises(ValueError, match="seed_samples"):
        stoker.DataLoader(Random(), seed_samples="sometimes")


class ByName(Dataset):
    """Samples fetched by a key that is not an integer: seeded from their place in the epoch."""

    def __len__(self):
        return 64

    def __getitem__(self, name):
        return torch.tensor([torch.initial_seed(), int(random.random() * 2**40)])


def test_samples_by_name_are_seeded_by_their_row_whichever_way_the_batch_is_fetched():
    # num_workers="auto" fetches an epoch's first batch in timed parts; each sample keeps the key
    # of its row in the batch, so the batches equal those fetched whole (and no two rows of a
    # batch share a key).
    names = [f"s{i}" for i in range(64)]
    kw = dict(sampler=names, batch_size=32, seed=4)
    whole = [b.tolist() for b in stoker.DataLoader(ByName(), num_workers=0, **kw)]
    assert [b.tolist() for b in stoker.DataLoader(ByName(), num_workers="auto", **kw)] == whole
    assert [b.tolist() for b in stoker.DataLoader(ByName(), num_workers=2, **kw)] == whole
    for b, batch in enumerate(whole):
        assert [k for k, _ in batch] == [_native.testing.position_key(4, 0, b, r) for r in range(32)]


def test_caller_states_kept_puts_back_every_generator_with_its_cached_normals():
    from stoker import _native
    from stoker.pydata import seeding
    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    random.gauss(0, 1)  # each generator now holds a cached normal
    np.random.standard_normal()
    while torch.default_generator.get_state()[5040] != 1:
        torch.randn(1)
    state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    before = (random.gauss(0, 1), random.random(), np.random.standard_normal(),
              np.random.rand(), torch.randn(3), torch.rand(2))
    random.setstate(state[0])
    np.random.set_state(state[1])
    torch.set_rng_state(state[2])
    with seeding.caller_states_kept():
        seeding.global_seeder().seed(_native.pydata.sample_key(1, 2, 3), list(seeding.GENERATORS))
        random.random(), np.random.rand(), torch.rand(5)
    after = (random.gauss(0, 1), random.random(), np.random.standard_normal(),
             np.random.rand(), torch.randn(3), torch.rand(2))
    assert before[:4] == after[:4]
    assert torch.equal(before[4], after[4]) and torch.equal(before[5], after[5])


@pytest.mark.parametrize("column", [[1, -2, 3], [0.5, 2.0, -1.25], [True, False], [2**70, 1],
                                    [2**63 - 1, -2**63]])
def test_number_columns_collate_exactly_as_default_collate(column):
    from stoker.pydata import batch_structure
    try:
        expected = default_collate(column)
    except Exception as e:
        with pytest.raises(type(e)):
            batch_structure._collate_column(column)
        return
    got = batch_structure._collate_column(column)
    assert got.dtype == expected.dtype and torch.equal(got, expected)


def test_the_front_reads_the_constants_the_engine_exports():
    # The engine defines each; the front reads it (no second copy to drift).
    from stoker.gpu import decode as gpu_decode
    assert _native.engine.SKIPPED_LISTED == 1000
    loader = stoker.DataLoader(list(range(4)), batch_size=2, num_workers=0)
    assert loader._producer._skipped_samples.maxlen == _native.engine.SKIPPED_LISTED
    assert loader._producer.prefetch_factor == _native.pydata.DEFAULT_PREFETCH_FACTOR
    assert loader.prefetch_factor is None  # no workers: None, as torch has it
    assert all(_native.pydata.sample_key(1, 2, i) <= _native.pydata.SEED_MASK for i in range(100))
    assert gpu_decode.DEFAULT_DECODE_BUFFER_BYTES == _native.gpu.DEFAULT_DECODE_BUFFER_BYTES
    seeded = stoker.DataLoader(list(range(4)), generator=torch.Generator().manual_seed(7))
    assert 0 <= seeded.seed <= _native.pydata.SEED_MASK


def test_batch_tree_uses_the_engines_tags_and_round_trips():
    from stoker.pydata import batch_structure
    Pair = collections.namedtuple("Pair", "a b")
    batch = {"t": torch.arange(3), "n": np.zeros(2, np.float32), "o": "x",
             "nt": Pair(1, 2.0), "tup": (torch.ones(1),), "seq": [3]}
    arrays, objects = [], []
    tree = batch_structure.flatten(batch, arrays, objects)
    tags = set()

    def walk(node):
        tags.add(node[0])
        if node[0] in (_native.pydata.TREE_TAGS["mapping"], _native.pydata.TREE_TAGS["namedtuple"],
                       _native.pydata.TREE_TAGS["sequence"]):
            for child in node[-1]:
                walk(child)
        elif node[0] == _native.pydata.TREE_TAGS["tuple"]:
            for child in node[1]:
                walk(child)

    walk(tree)
    assert tags == set(_native.pydata.TREE_TAGS.values())
    assert len(_native.pydata.TREE_TAGS) == 7
    back = batch_structure.rebuild(tree, arrays, objects, collated=False)
    assert back.keys() == batch.keys() and back["nt"] == Pair(1, 2.0) and back["seq"] == [3]
    assert back["tup"][0] is arrays[2] and back["o"] == "x"
    # gather_columns (C++) reads the tree flatten built from the same tags
    assert batch_structure._columns([batch, batch]) is not None


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


@pytest.mark.parametrize("workers", [0, 1, 3, "auto"])
def test_samples_that_differ_collate_like_default_collate(workers):
    # Samples that differ in structure or shape give what torch gives, value or error.
    both(Uneven(), workers=workers, batch_size=4)
    for bad in (1, 6):  # in the first batch, in a later one
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


def test_with_explicit_workers_every_sample_runs_in_a_worker():
    ref = list(stoker.DataLoader(WhoRan(), batch_size=8, shuffle=True, num_workers=0))
    for n in (1, 2):
        loader = stoker.DataLoader(WhoRan(), batch_size=8, shuffle=True, num_workers=n)
        got = list(loader)
        pids = {p for _, ps in got for p in ps.tolist()}
        assert os.getpid() not in pids and len(pids) == n
        assert [b[0].tolist() for b in got] == [b[0].tolist() for b in ref]  # same samples
        assert loader.stats()["pickled_batches"] == 0
    # consumer_helps=True asks this process to produce too (for a dataset that allows it).
    got = list(stoker.DataLoader(WhoRan(), batch_size=8, shuffle=True, num_workers=1,
                                 consumer_helps=True, prefetch_factor=1))
    assert [b[0].tolist() for b in got] == [b[0].tolist() for b in ref]
    assert os.getpid() in {p for _, ps in got for p in ps.tolist()}
    with pytest.raises(TypeError, match="consumer_helps must be None, True or False"):
        stoker.DataLoader(WhoRan(), consumer_helps="no")


class Paced(Dataset):
    def __init__(self, n, seconds):
        self.n, self.seconds = n, seconds

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return torch.tensor([i, random.randrange(1000)]), os.getpid()


def test_the_policy_decides_from_timings_alone():
    from stoker.pydata import policy
    p = policy.ExecutorPolicy(cores=4)
    assert p.first_chunks(0.001, 10).kind == "stay"  # 10 ms left in the batch
    d = p.first_chunks(0.001, 30)  # 30 ms: workers now, one a core but this process's
    assert (d.kind, d.workers) == ("processes", 3)
    p = policy.ExecutorPolicy(cores=4)
    assert p.after_batch(0.0001, 4000).kind == "stay"  # 0.4 s of epoch left
    assert p.after_batch(0.0002, 3000).kind == "stay"  # the fastest pace so far counts
    assert p.after_batch(0.0002, 6000).kind == "processes"  # 0.6 s
    persistent = policy.ExecutorPolicy(cores=2, persistent=True)
    assert persistent.after_batch(0.0001, 2000).kind == "processes"  # 0.2 s, paid once
    spawned = policy.ExecutorPolicy(cores=2, forked=False)  # each worker imports torch first
    assert spawned.after_batch(0.001, 2000).kind == "stay"
    assert spawned.first_chunks(0.001, 30).kind == "stay"
    assert spawned.after_batch(0.001, 3000).workers == 1
    threads = policy.ExecutorPolicy(cores=2, threads_allowed=True)
    assert threads.wants_thread_trial()
    assert threads.thread_trial(0.003, 0.0016).kind == "threads"  # 0.53x: releases the GIL
    assert threads.thread_trial(0.003, 0.003).kind == "stay"
    assert threads.thread_trial(0.003, 0.003).workers == 0
    assert not policy.ExecutorPolicy(cores=1, threads_allowed=True).wants_thread_trial()
    heavy = policy.ExecutorPolicy(cores=2, batch_size=64)  # 64 x 4 ms: one worker a core
    assert heavy.first_chunks(0.004, 60).workers == 2
    assert policy.ExecutorPolicy(cores=2, batch_size=64).after_batch(0.0005, 2000).workers == 1


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


class ScriptedPolicy:
    """An ExecutorPolicy whose answers are scripted, not timed: the loader's plumbing under each
    decision is tested here; the decisions from timings in test_the_policy_decides_...()."""

    def __init__(self, first=None, after=(), trial=None):
        from stoker.pydata import policy
        self.stay = policy.STAY
        self.first, self.after, self.trial = first, list(after), trial
        self.calls = []

    def wants_thread_trial(self):
        return self.trial is not None

    def first_chunks(self, pace, rest):
        self.calls.append("first_chunks")
        return self.first or self.stay

    def thread_trial(self, one, two):
        self.calls.append("thread_trial")
        return self.trial

    def after_batch(self, pace, left):
        self.calls.append("after_batch")
        return self.after.pop(0) if self.after else self.stay


def test_auto_starts_workers_when_its_policy_says_so(children):
    from stoker.pydata.policy import Decision
    ref = [b[0].tolist() for b in stoker.DataLoader(Paced(96, 0), batch_size=16, shuffle=True,
                                                     num_workers=0)]

    def run(policy, **kw):
        loader = stoker.DataLoader(Paced(96, 0.001), batch_size=16, shuffle=True, **kw)
        loader._producer._policy = policy
        forked, got = [], []
        for batch in loader:
            forked.append((loader.stats()["worker_processes"], len(children())))
            got.append(batch)
        if kw.get("seed_samples") is False:  # the same samples (their draws: whoever drew first)
            assert [b[0][:, 0].tolist() for b in got] == [[x[0] for x in b] for b in ref]
        else:  # the same samples, bit for bit, whoever produced them
            assert [b[0].tolist() for b in got] == ref
        return forked, {p for _, ps in got for p in ps.tolist()}
    # Staying: this process produces the epoch alone; nothing is forked.
    policy = ScriptedPolicy()
    forked, pids = run(policy)
    assert set(forked) == {(0, 0)} and pids == {os.getpid()}
    assert policy.calls == ["first_chunks"] + ["after_batch"] * 6
    # Workers during the first batch (from its first chunks): this process keeps producing.
    forked, pids = run(ScriptedPolicy(first=Decision("processes", 2, "")))
    assert set(forked) == {(2, 2)} and os.getpid() in pids and len(pids) == 3
    # Workers after the second batch, for the batches after it.
    policy = ScriptedPolicy(after=[policy_stay(), Decision("processes", 1, "")])
    forked, pids = run(policy)
    assert forked[0] == (0, 0) and set(forked[1:]) == {(1, 1)}
    assert policy.calls == ["first_chunks", "after_batch", "after_batch"]
    # Threads after a trial: no process.
    loader_policy = ScriptedPolicy(trial=Decision("threads", 2, ""))
    forked, pids = run(loader_policy, seed_samples=False)
    assert set(forked) == {(0, 0)} and pids == {os.getpid()}
    assert loader_policy.calls == ["thread_trial"]
    assert children() == []


def policy_stay():
    from stoker.pydata.policy import STAY
    return STAY


def test_auto_tries_threads_only_for_thread_safe_datasets_without_seeding():
    def allowed(**kw):
        loader = stoker.DataLoader(Waiting(True), batch_size=16, **kw)
        it = iter(loader)
        it._workers  # starts the iteration (at its first next(), or its first attribute)
        return loader._producer._policy.threads_allowed
    assert allowed(seed_samples=False)
    # Per-sample seeding of the process-global generators needs processes: threads would race.
    assert not allowed()
    assert not allowed(seed_samples="always")
    # A dataset that does not say it is thread-safe never runs on two threads at once.
    Waiting.thread_safe = False
    try:
        assert not allowed(seed_samples=False)
    finally:
        Waiting.thread_safe = True


def test_threads_run_a_gil_releasing_dataset_with_the_same_batches(children):
    ref = [b[0].tolist() for b in stoker.DataLoader(Waiting(True), batch_size=16, shuffle=True,
                                                     num_workers=0, seed_samples=False)]
    loader = stoker.DataLoader(Waiting(True), batch_size=16, shuffle=True, num_workers=2,
                               worker_type="thread")
    assert [b[0].tolist() for b in loader] == ref
    assert loader.stats()["worker_threads"] == 2 and children() == []


def test_error_names_the_sample_and_the_epoch_goes_on():
    for bad in range(4):
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


def test_an_error_comes_in_order_whoever_produced_its_batch():
    # With consumer_helps, this process produces later batches while the worker finishes the one
    # due; a failure there must surface when its batch is due, after every batch before it.
    for bad, helps in ((13, None), (22, True), (30, True)):
        loader = stoker.DataLoader(SlowFailing(bad=bad, n=40), batch_size=4, num_workers=1,
                                   consumer_helps=helps)
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

    def replacement(i, epoch=0, seed=0):  # the native loader's rule (src/engine/engine.cc)
        return next(o for o in (_native.engine.hash_key(seed, epoch, i * 16 + a) % 30
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
    with pytest.raises(stoker.WorkerError, match=r"DataLoader worker \(pid \d+\) is killed by "
                                                 r"signal: Killed") as info:
        list(stoker.DataLoader(Killing(), batch_size=2, num_workers=2))
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
        assert len(children()) == 3  # all started before the first batch
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


Pair = collections.namedtuple("Pair", "x y")


class Pairs(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return collections.OrderedDict(p=Pair(torch.full((2,), i), i), n=[torch.tensor(i)])


def test_numpy_output_converts_tensors_inside_namedtuples_and_keeps_container_types():
    for workers in (0, 1):
        batch = next(iter(stoker.DataLoader(Pairs(), batch_size=3, num_workers=workers,
                                            output="numpy")))
        assert type(batch) is collections.OrderedDict and type(batch["p"]) is Pair
        assert isinstance(batch["p"].x, np.ndarray) and isinstance(batch["p"].y, np.ndarray)
        assert batch["p"].x.tolist() == [[0, 0], [1, 1], [2, 2]]
        assert isinstance(batch["n"][0], np.ndarray) and batch["n"][0].tolist() == [0, 1, 2]


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


class Rows(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((1000,), float(i)), i


def test_an_epoch_left_early_does_not_reuse_buffers_its_workers_still_write():
    # Persistent workers still producing the batches of a `break`: the next epoch waits for them
    # before it hands their buffers out again (a 1 MiB budget makes it reuse every buffer).
    loader = stoker.DataLoader(Rows(), batch_size=4, num_workers=2, persistent_workers=True,
                               memory_budget="1MiB")
    ref = [b[1].tolist() for b in stoker.DataLoader(Rows(), batch_size=4, num_workers=0)]
    for epoch in range(4):
        got = []
        for k, (x, y) in enumerate(loader):
            assert torch.equal(x, y[:, None].float().expand(-1, 1000)), (epoch, k)
            got.append(y.tolist())
            if epoch % 2 == 0 and k == 1:
                break
        if epoch % 2:
            assert got == ref
    assert loader.stats()["pickled_batches"] == 0
