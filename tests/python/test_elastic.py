"""Elastic resume: a state saved by a job of one world size, loaded by a job of another, continues
the epoch. Every sample is accounted for exactly: the samples the old ranks delivered together
are not repeated, the rest of the epoch is split among the new ranks with equal batch counts,
padding repeats fewer samples than there are ranks (drop_last=False), drop_last=True repeats
none."""

import collections
import json
import random

import numpy as np
import pytest

import stoker
from stoker import _native


class IndexDataset:
    """A map-style Python dataset whose sample i is i."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def native_dataset(n):
    return stoker.ArrayDataset(np.arange(n, dtype=np.int64))


def epoch_order(n, shuffle, seed, epoch):
    """The epoch's global order: sample at each position."""
    return _native.engine.BatchPlan(n, n, False, 0, 1).indices(shuffle, seed, epoch, 0) if n else []


def run_job(make, world, state, steps, rng):
    """Each of `world` ranks loads `state` (None: a fresh start at epoch 2), takes `steps` batches
    (None: to the end of the epoch) and saves its state. Returns (samples, states, batches per
    rank)."""
    seen, states, counts = [], [], set()
    for rank in range(world):
        loader = make(rank, world)
        if state is None:
            loader.set_epoch(2)
        else:
            loader.load_state_dict(json.loads(json.dumps(state)))
        it = iter(loader)
        n = len(it)
        counts.add(n)
        for _ in range(n if steps is None else steps):
            seen += np.asarray(next(it)).tolist()
        if steps is None or steps == n:  # a loop's last next(): the epoch ends (an empty one
            assert next(it, None) is None  # starts there: an iteration starts at its next())
        states.append(loader.state_dict())
        del it
    assert len(counts) == 1, f"ranks got different batch counts: {counts}"
    for s in states:  # the ranks of a job agree on where the epoch is
        assert {**s, "rank": 0} == {**states[0], "rank": 0}
    return seen, states[0], counts.pop()


def check_epoch(make, n, bs, shuffle, seed, drop_last, worlds, rng):
    """Jobs of the given world sizes take turns at one epoch, each stopping after a random number
    of steps, the last one finishing it. Checks the exact multiset of samples delivered."""
    order = epoch_order(n, shuffle, seed, 2)
    seen, state, reached = [], None, 0  # reached: the prefix of the order consumed so far
    for j, world in enumerate(worlds):
        # The rest of the epoch, split among this job's ranks (the same batches as the saved
        # plan's when the world size did not change).
        plan = _native.engine.BatchPlan(n, bs, drop_last, 0, world, reached)
        steps = None if j == len(worlds) - 1 else rng.randint(0, plan.num_batches)
        got, state, batches = run_job(make, world, state, steps, rng)
        assert batches == plan.num_batches
        seen += got
        if steps is None or steps == batches:  # this job finished the epoch
            assert state["epoch"] == 3 and state["batch"] == 0 and state["start"] == 0
            if drop_last:
                end = reached + plan.num_batches * bs * world
                expected = collections.Counter(order[:end])
            else:
                pad = plan.samples_per_rank * world - (n - reached)
                # Padding wraps to the start of the order, cyclically (more ranks than samples).
                expected = collections.Counter(order) + collections.Counter(
                    order[i % n] for i in range(pad))
                assert pad < world
            assert collections.Counter(seen) == expected, (n, worlds, j)
            return
        # Not finished: what the jobs so far delivered is exactly a prefix of the order.
        reached = plan.position_after(steps)
        assert collections.Counter(seen) == collections.Counter(order[:reached]), (n, worlds, j)
    raise AssertionError("unreachable: the last job finishes the epoch")


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_native_elastic_resume_over_random_world_size_changes(shuffle, drop_last):
    rng = random.Random(2 * shuffle + drop_last)
    for _ in range(30):
        n, bs, seed = rng.randint(1, 160), rng.randint(1, 7), rng.randrange(2**32)
        worlds = [rng.randint(1, 6) for _ in range(rng.randint(2, 5))]
        data = native_dataset(n)

        def make(rank, world):
            return stoker.DataLoader(data, batch_size=bs, shuffle=shuffle, seed=seed,
                                     drop_last=drop_last, rank=rank, world_size=world,
                                     num_workers=rng.choice([0, 1, 2]), output="numpy")

        check_epoch(make, n, bs, shuffle, seed, drop_last, worlds, rng)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_python_dataset_elastic_resume_over_random_world_size_changes(shuffle, drop_last):
    rng = random.Random(10 + 2 * shuffle + drop_last)
    for trial in range(12):
        n, bs, seed = rng.randint(1, 120), rng.randint(1, 7), rng.randrange(2**32)
        worlds = [rng.randint(1, 5) for _ in range(rng.randint(2, 4))]
        data = IndexDataset(n)
        workers = 2 if trial == 0 else 0  # forked workers once: the order is the engine's anyway

        def make(rank, world):
            return stoker.DataLoader(data, batch_size=bs, shuffle=shuffle, seed=seed,
                                     drop_last=drop_last, rank=rank, world_size=world,
                                     num_workers=workers, output="numpy")

        check_epoch(make, n, bs, shuffle, seed, drop_last, worlds, rng)


def test_same_batches_as_the_engine_plan_and_state_is_small():
    data = native_dataset(103)
    old = [stoker.DataLoader(data, batch_size=4, shuffle=True, seed=9, rank=r, world_size=4,
                             output="numpy") for r in range(4)]
    for loader in old:
        it = iter(loader)
        for _ in range(3):
            next(it)
    state = old[0].state_dict()
    assert len(json.dumps(state)) < 400 and state["start"] == 0 and state["batch"] == 3
    new = stoker.DataLoader(data, batch_size=4, shuffle=True, seed=9, rank=1, world_size=3,
                            output="numpy")
    new.load_state_dict(state)
    got = [b.tolist() for b in new]
    plan = _native.engine.BatchPlan(103, 4, False, 1, 3, 48)  # 3 batches x 4 samples x 4 ranks
    assert got == [plan.indices(True, 9, 0, b) for b in range(plan.num_batches)]
    # Mid-way through the resumed epoch, the state names the new plan's start.
    new.load_state_dict(state)
    it = iter(new)
    next(it)
    again = new.state_dict()
    assert (again["epoch"], again["batch"], again["start"], again["world_size"]) == (0, 1, 48, 3)
    assert len(it) == plan.num_batches - 1


def test_nested_resume_with_the_same_world_size_keeps_the_batches():
    """A state saved in an elastically resumed epoch, loaded with that job's world size, gives the
    batches that job would have delivered."""
    data = native_dataset(77)

    def make(rank, world, **kw):
        return stoker.DataLoader(data, batch_size=3, shuffle=True, seed=4, rank=rank,
                                 world_size=world, output="numpy", **kw)

    first = make(0, 2)
    it = iter(first)
    next(it), next(it)
    state = first.state_dict()
    full = make(1, 3)
    full.load_state_dict(state)
    uninterrupted = [b.tolist() for b in full]
    part = make(1, 3, num_workers=2)
    part.load_state_dict(state)
    it = iter(part)
    head = [next(it).tolist() for _ in range(4)]
    mid = part.state_dict()
    del it
    resumed = make(1, 3, num_workers=0)
    resumed.load_state_dict(mid)
    assert head + [b.tolist() for b in resumed] == uninterrupted


def test_finished_epoch_resumes_at_the_next():
    data = native_dataset(40)
    loaders = [stoker.DataLoader(data, batch_size=3, drop_last=True, rank=r, world_size=3,
                                 output="numpy") for r in range(3)]
    it = iter(loaders[0])
    for _ in range(len(loaders[0])):
        next(it)
    state = loaders[0].state_dict()
    new = stoker.DataLoader(data, batch_size=3, drop_last=True, rank=0, world_size=2)
    new.load_state_dict(state)
    assert new.state_dict()["epoch"] == 1 and new.state_dict()["batch"] == 0
    # A state saved at the last batch of an epoch (batch == its batch count) ends it too.
    state = dict(state, epoch=0, batch=len(loaders[0]))
    new.load_state_dict(state)
    assert (new.state_dict()["epoch"], new.state_dict()["start"]) == (1, 0)


@pytest.mark.parametrize("python", [False, True])
def test_set_epoch_after_load_state_dict_keeps_the_resume_point(python):
    """A torch-style loop calls set_epoch at the top of every epoch, the resumed one too."""
    data = IndexDataset(60) if python else native_dataset(60)
    old = stoker.DataLoader(data, batch_size=5, shuffle=True, rank=0, world_size=2, num_workers=0,
                            output="numpy")
    old.set_epoch(3)
    it = iter(old)
    head = [next(it).tolist() for _ in range(2)]
    state = old.state_dict()
    new = stoker.DataLoader(data, batch_size=5, shuffle=True, rank=0, world_size=3, num_workers=0,
                            output="numpy")
    new.load_state_dict(state)
    new.set_epoch(3)  # the epoch the state is in: the position stays
    rest = [b.tolist() for b in new]
    assert len(rest) == 3  # 40 samples left, 14 a rank: 3 batches
    assert not set(sum(rest, [])) & set(sum(head, []))
    new.set_epoch(3)  # later: epoch 3 from its start
    assert len([b for b in new]) == len(new)
    new.load_state_dict(state)
    with pytest.warns(UserWarning, match=r"set_epoch\(4\) discards the position "
                                         r"load_state_dict gave the loader, inside epoch 3"):
        new.set_epoch(4)  # another epoch: from its start
    assert new.state_dict()["epoch"] == 4 and new.state_dict()["batch"] == 0


def test_version_1_state_still_loads():
    data = native_dataset(50)
    loader = stoker.DataLoader(data, batch_size=5, world_size=2, rank=0, output="numpy")
    v1 = {"version": 1, "epoch": 0, "batch": 2, "seed": 0, "shuffle": False, "batch_size": 5,
          "drop_last": False, "num_samples": 50, "rank": 0, "world_size": 2}
    loader.load_state_dict(v1)
    assert [b.tolist() for b in loader][0] == [20, 22, 24, 26, 28]
    one = stoker.DataLoader(data, batch_size=5, output="numpy")
    one.load_state_dict(v1)  # 2 ranks x 2 batches x 5 samples consumed
    assert sum(len(b) for b in one) == 30


@pytest.mark.parametrize("key,value", [("seed", 1), ("batch_size", 4), ("shuffle", True),
                                       ("drop_last", True), ("num_samples", 51)])
def test_refuses_a_state_of_another_configuration(key, value):
    data = native_dataset(50)
    state = stoker.DataLoader(data, batch_size=5, world_size=2, rank=1).state_dict()
    kw = dict(batch_size=5, world_size=3, rank=0)
    kw.update({key: value} if key != "num_samples" else {})
    other = native_dataset(51) if key == "num_samples" else data
    with pytest.raises(ValueError, match=f"{key}="):
        stoker.DataLoader(other, **kw).load_state_dict(state)


def test_refuses_world_size_changes_where_no_position_names_the_consumed_samples():
    import torch
    from torch.utils.data import IterableDataset

    state = stoker.DataLoader(IndexDataset(40), batch_size=4, rank=0, world_size=2,
                              num_workers=0).state_dict()
    sampled = stoker.DataLoader(IndexDataset(40), batch_size=4, num_workers=0,
                                sampler=list(range(39, -1, -1)))
    with pytest.raises(ValueError, match="custom sampler"):
        sampled.load_state_dict(state)
    sampled_state = sampled.state_dict()
    plain = stoker.DataLoader(IndexDataset(40), batch_size=4, num_workers=0, world_size=2,
                              rank=0)
    with pytest.raises(ValueError, match="custom sampler"):
        plain.load_state_dict(sampled_state)

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(10))

    stream = stoker.DataLoader(Stream(), batch_size=4, num_workers=0)
    with pytest.raises(ValueError, match="IterableDataset"):
        stream.load_state_dict(state)
    assert torch.equal(next(iter(stream)), torch.tensor([0, 1, 2, 3]))


def test_refuses_malformed_states():
    loader = stoker.DataLoader(native_dataset(20), batch_size=2, world_size=2)
    good = loader.state_dict()
    for bad in (None, {"version": 9}, dict(good, batch=-1), dict(good, start=21),
                dict(good, world_size=0), dict(good, batch=99), dict(good, epoch="1")):
        with pytest.raises(ValueError):
            loader.load_state_dict(bad)
