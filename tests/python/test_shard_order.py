"""shuffle="shards": a dataset in shards is read ~shard_window shards at a time per rank, every
sample still exactly once an epoch, the same batches whatever num_workers, and a resume state
that continues the epoch exactly, with the same world size or another (include/stoker/
block_order.h)."""

import collections
import json

import numpy as np
import pytest

import stoker
from stoker import _native

from faulty import FaultyDataset

# Unequal shards: the overflow between a window's groups is exercised too.
SHARDS = [60, 40, 50, 50, 55, 45, 50, 50, 50, 50, 50, 50]
N = sum(SHARDS)  # 600: 3 and 4 ranks with batches of 8 split it evenly (no padding)


class RemoteLike(FaultyDataset):
    """A dataset whose shards are its natural order (remote datasets declare it)."""

    default_shuffle = "shards"


def dataset(cls=FaultyDataset):
    return cls(N, shards=SHARDS)


def loader(rank=0, world=1, workers=0, **kw):
    kw = {"batch_size": 8, "shuffle": "shards", "seed": 5, "shard_window": 2, **kw}
    return stoker.DataLoader(kw.pop("ds", None) or dataset(), rank=rank, world_size=world,
                             num_workers=workers, output="numpy", **kw)


def samples(batches):
    return [int(v) for b in batches for v in np.asarray(b).reshape(-1)]


def shard_of(sample):
    return int(np.searchsorted(np.cumsum(SHARDS), sample, side="right"))


def test_batches_do_not_depend_on_the_workers():
    runs = [[np.asarray(b).copy() for b in loader(1, 2, workers)] for workers in (0, 1, 3)]
    for run in runs[1:]:
        assert len(run) == len(runs[0])
        for a, b in zip(run, runs[0]):
            np.testing.assert_array_equal(a, b)


def test_follows_the_engines_block_order():
    lo = loader(2, 3)
    lo.set_epoch(4)
    got = samples(lo)
    order = _native.engine.BlockOrder(SHARDS, 2, 3, 5, 4)
    expected = order.map(np.arange(2, N, 3, dtype=np.uint64))
    assert got == expected.tolist()
    assert lo.shuffle == "shards"


def test_every_sample_once_an_epoch_across_ranks():
    for epoch in (0, 1):
        seen = collections.Counter()
        lengths = set()
        for rank in range(3):
            lo = loader(rank, 3)
            lo.set_epoch(epoch)
            batches = list(lo)
            lengths.add(len(batches))
            seen.update(samples(batches))
        assert len(lengths) == 1, "ranks got different batch counts"
        assert sorted(seen) == list(range(N)) and set(seen.values()) == {1}


def test_a_rank_reads_few_shards_at_a_time():
    # 12 shards, window 2, 3 ranks: windows of 6 shards; a rank's first 16 samples stay in about
    # two shards (its group's), where a full shuffle would touch nearly all 12.
    got = samples(loader(0, 3))
    assert len({shard_of(s) for s in got[:16]}) <= 3
    lo = loader(0, 3)
    schedule = lo._producer.engine.block_schedule(0)
    first_use = list(dict.fromkeys(shard_of(s) for s in got))
    assert schedule.tolist() == first_use


def test_default_shuffle_shards_makes_shuffle_true_the_shard_order():
    a = samples(loader(shuffle=True, ds=dataset(RemoteLike)))
    b = samples(loader(shuffle="shards"))
    assert a == b
    assert loader(shuffle=True, ds=dataset(RemoteLike)).shuffle == "shards"
    plain = samples(stoker.DataLoader(dataset(RemoteLike), batch_size=8, shuffle=False,
                                      num_workers=0, output="numpy"))
    assert plain == list(range(N))


def test_state_dict_round_trip_mid_epoch():
    lo = loader(1, 2, 2)
    lo.set_epoch(3)
    it = iter(lo)
    head = [np.asarray(next(it)).copy() for _ in range(7)]
    state = json.loads(json.dumps(lo.state_dict()))
    rest = [np.asarray(b).copy() for b in it]
    assert state["version"] == 3
    assert state["shard_window"] == 2 and state["stripes"] == 2
    assert state["epoch"] == 3 and state["batch"] == 7
    resumed = loader(1, 2, 1)
    resumed.load_state_dict(state)
    again = [np.asarray(b).copy() for b in resumed]
    assert len(again) == len(rest) and len(head) + len(rest) == len(lo)
    for a, b in zip(again, rest):
        np.testing.assert_array_equal(a, b)


def test_elastic_resume_from_four_ranks_to_three_reads_the_rest_exactly():
    seen = collections.Counter()
    states = []
    for rank in range(4):  # a 4-rank job stops after 3 batches of epoch 1
        lo = loader(rank, 4, 1)
        lo.set_epoch(1)
        it = iter(lo)
        seen.update(samples(next(it) for _ in range(3)))
        states.append(lo.state_dict())
        del it
    assert {s["stripes"] for s in states} == {4}
    state = json.loads(json.dumps(states[0]))
    next_states = []
    for rank in range(3):  # a 3-rank job goes on: the epoch's order is still arranged for 4
        lo = loader(rank, 3, 2)
        lo.load_state_dict(state)
        mid = iter(lo)
        first = next(mid)
        assert lo.state_dict()["stripes"] == 4  # the running epoch keeps its arrangement
        seen.update(samples([first]))
        seen.update(samples(mid))
        next_states.append(lo.state_dict())
        # The epoch after it is arranged for the new world size: as a fresh 3-rank job's.
        nxt = samples(lo)
        fresh = loader(rank, 3)
        fresh.set_epoch(2)
        assert nxt == samples(fresh)
    assert sorted(seen) == list(range(N)) and set(seen.values()) == {1}
    assert {s["epoch"] for s in next_states} == {2}
    assert {s["stripes"] for s in next_states} == {3}


def test_another_shard_window_is_refused():
    state = loader(0, 2).state_dict()
    with pytest.raises(ValueError, match="shard_window=2 but this loader has shard_window=4"):
        loader(0, 2, shard_window=4).load_state_dict(state)


def test_states_without_stripes_or_another_order_are_handled():
    plain = stoker.DataLoader(dataset(), batch_size=8, shuffle=True, seed=5, num_workers=0,
                              output="numpy")
    state = plain.state_dict()
    assert "stripes" not in state and "shard_window" not in state
    old = {**state, "version": 2}
    plain.load_state_dict(old)  # version 2 states stay readable
    with pytest.raises(ValueError, match="shuffle"):
        loader().load_state_dict(state)


def test_invalid_uses_say_what_is_wrong():
    flat = FaultyDataset(100)
    with pytest.raises(ValueError, match="needs a source with shards"):
        stoker.DataLoader(flat, shuffle="shards", num_workers=0)
    with pytest.raises(ValueError, match="shard_window is for shuffle=\"shards\""):
        stoker.DataLoader(flat, shuffle=True, shard_window=4, num_workers=0)
    with pytest.raises(ValueError, match="shard_window must be"):
        stoker.DataLoader(dataset(), shuffle="shards", shard_window=0, num_workers=0)
    with pytest.raises(ValueError, match="shuffle must be"):
        stoker.DataLoader(dataset(), shuffle="shard", num_workers=0)
    with pytest.raises(ValueError, match="Python dataset"):
        stoker.DataLoader(list(range(10)), shuffle="shards", num_workers=0)


def test_auto_window_is_eight():
    lo = stoker.DataLoader(dataset(), batch_size=8, shuffle="shards", num_workers=0)
    assert lo.state_dict()["shard_window"] == 8
