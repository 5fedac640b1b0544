"""stoker.Mixture: batches mixing sources by weight, each source walked exactly once per its own
epoch, weight schedules, and resume on another world size with other weights."""

import collections
import json
import math
import pickle

import numpy as np
import pytest

import stoker

SIZES = {"web": 120, "code": 45, "math": 17}


def ids(name, n):
    """A source whose sample j is the unique id (source number * 1000 + j)."""
    return stoker.ArrayDataset(np.arange(n, dtype=np.int64) + 1000 * list(SIZES).index(name))


def mixture(weights=None, sizes=SIZES):
    return stoker.Mixture({name: ids(name, n) for name, n in sizes.items()}, weights=weights)


def loader(m, rank=0, world=1, batch_size=10, workers=0, shuffle=True, **kw):
    return stoker.DataLoader(m, batch_size=batch_size, shuffle=shuffle, seed=7, rank=rank,
                             world_size=world, num_workers=workers, output="numpy", **kw)


def source_counts(batch):
    return collections.Counter(np.asarray(batch) // 1000)


def within_one(count, length, share):
    return math.floor(length * share - 1e-9) <= count <= math.ceil(length * share + 1e-9)


def check_streams(seen, sizes=SIZES):
    """Every source's draws are a prefix of its stream: each sample drawn q or q + 1 times,
    q = draws // n, and exactly draws % n of them q + 1 times. Returns the draws per source."""
    draws = {}
    for c, (name, n) in enumerate(sizes.items()):
        counts = collections.Counter(x - 1000 * c for x in seen if x // 1000 == c)
        total = sum(counts.values())
        q, r = divmod(total, n)
        per_sample = collections.Counter(counts.get(j, 0) for j in range(n))
        expected = {q: n - r, q + 1: r} if r else {q: n}
        assert dict(per_sample) == expected, f"{name}: {total} draws, samples drawn {per_sample}"
        assert set(counts) <= set(range(n))
        draws[name] = total
    return draws


def test_every_batch_holds_each_source_within_one_sample_of_its_weight():
    weights = {"web": 5, "code": 3, "math": 2}
    for world in (1, 3):
        for rank in range(world):
            for batch in loader(mixture(weights), rank, world, batch_size=13):
                got = source_counts(batch)
                for c, name in enumerate(SIZES):
                    assert within_one(got[c], len(batch), weights[name] / 10), (got, len(batch))


def test_an_epoch_has_the_batches_of_the_sources_concatenated():
    m = mixture({"web": 1, "code": 1, "math": 1})
    assert len(m) == sum(SIZES.values())
    for world, drop_last in ((1, False), (2, True), (4, False)):
        plain = stoker.DataLoader(stoker.ArrayDataset(np.arange(len(m))), batch_size=8,
                                  rank=0, world_size=world, drop_last=drop_last)
        mixed = loader(m, 0, world, batch_size=8, drop_last=drop_last)
        assert len(mixed) == len(plain)
        assert [len(b) for b in mixed] == [len(b) for b in plain]


def test_each_source_is_drawn_exactly_once_per_its_own_epoch():
    m = mixture({"web": 1, "code": 1, "math": 1})  # math (17 samples) runs through many epochs
    dl = loader(m, batch_size=9)
    seen = []
    for epoch in range(3):
        for batch in dl:
            seen += np.asarray(batch).tolist()
    draws = check_streams(seen)
    stats = dl.stats()["mixture"]
    for name, n in SIZES.items():
        assert stats[name]["samples"] == draws[name]
        assert stats[name]["epochs"] == draws[name] // n
        assert stats[name]["weight"] == 1
    assert stats["math"]["epochs"] >= 5
    assert sum(draws.values()) == 3 * len(m)


def test_proportional_weights_by_default():
    dl = loader(mixture(), batch_size=len(mixture()))
    (batch,) = list(dl)
    got = source_counts(batch)
    assert [got[c] for c in range(3)] == list(SIZES.values())


def test_a_schedule_changes_the_weights_at_its_step():
    phases = [(0, {"web": 1, "code": 0, "math": 0}), (5, {"web": 0, "code": 1, "math": 1})]
    every_step = lambda step: phases[0][1] if step < 5 else phases[1][1]  # noqa: E731
    for weights in (phases, every_step):
        dl = loader(mixture(weights), batch_size=8)
        batches = []
        for epoch in range(2):
            batches += list(dl)
        assert len(batches) > 5
        for step, batch in enumerate(batches):
            got = source_counts(batch)
            if step < 5:
                assert set(got) == {0}, (step, got)
            else:
                assert 0 not in got and abs(got[1] - got[2]) <= 1, (step, got)
        assert dl.stats()["mixture"]["web"]["weight"] == 0


def test_same_batches_whatever_the_workers():
    m = mixture([(0, {"web": 3, "code": 1, "math": 1}), (4, {"web": 1, "code": 1, "math": 3})])
    runs = []
    for workers in (0, 1, 3):
        dl = loader(m, workers=workers, batch_size=7)
        runs.append([np.asarray(b).tolist() for epoch in range(2) for b in dl])
    assert runs[0] == runs[1] == runs[2]


def test_resume_with_the_same_world_size_gives_the_same_batches():
    m = mixture({"web": 2, "code": 1, "math": 1})
    dl = loader(m, batch_size=6)
    whole = [np.asarray(b).tolist() for epoch in range(2) for b in dl]
    dl = loader(m, batch_size=6)
    it = iter(dl)
    first = [np.asarray(next(it)).tolist() for _ in range(5)]
    state = json.loads(json.dumps(dl.state_dict()))
    assert state["mixture"]["step"] == 5
    again = loader(mixture({"web": 2, "code": 1, "math": 1}), batch_size=6)
    again.load_state_dict(state)
    rest = [np.asarray(b).tolist() for b in again] + [np.asarray(b).tolist() for b in again]
    assert first + rest == whole


def run_job(make, world, state, steps, weights=None):
    """Each of `world` ranks loads `state` (None: a fresh start), takes `steps` batches (None:
    to the end of the epoch) and saves. Returns (samples of all ranks, the state, batches)."""
    seen, states, counts = [], [], set()
    for rank in range(world):
        dl = make(rank, world)
        if state is not None:
            dl.load_state_dict(json.loads(json.dumps(state)), weights=weights)
        it = iter(dl)
        counts.add(len(it))
        for _ in range(len(it) if steps is None else steps):
            seen.append(np.asarray(next(it)).tolist())
        states.append(dl.state_dict())
        del it
    assert len(counts) == 1
    for s in states:
        assert {**s, "rank": 0} == {**states[0], "rank": 0}
    return seen, states[0], counts.pop()


def test_resume_on_another_world_size_with_another_schedule():
    before = {"web": 4, "code": 2, "math": 1}
    after = [(0, {"web": 1, "code": 1, "math": 1}), (9, {"web": 0, "code": 1, "math": 3})]

    def make(rank, world):
        return loader(mixture(before), rank, world, batch_size=5)

    # Two ranks take 4 steps of epoch 0; three ranks finish it and run epoch 1 under new weights.
    seen, state, _ = run_job(make, 2, None, 4)
    assert state["mixture"]["step"] == 4 and state["world_size"] == 2
    for batch in seen:
        got = source_counts(batch)
        assert all(within_one(got[c], 5, w / 7) for c, w in enumerate(before.values()))
    more, state, batches = run_job(make, 3, state, None, weights=after)
    seen += more
    assert state["epoch"] == 1 and state["mixture"]["step"] == 4 + batches
    # Every batch after the resume follows the new schedule at its step (step 9 on: no web).
    for i, batch in enumerate(more):
        step = 4 + i % batches
        if step >= 9:
            assert 0 not in source_counts(batch), (step, batch)
    last, state, _ = run_job(make, 3, state, None, weights=after)
    seen += last
    flat = [x for b in seen for x in b]
    draws = check_streams(flat)
    assert draws == state["mixture"]["draws"]


def test_state_is_small_and_names_the_sources():
    dl = loader(mixture({"web": 1, "code": 1, "math": 1}))
    state = dl.state_dict()
    json.dumps(state)
    assert state["order"] == "mixture"
    assert state["mixture"]["sources"] == SIZES
    assert state["mixture"]["draws"] == {"web": 0, "code": 0, "math": 0}
    other = loader(mixture({"web": 1, "code": 1}, sizes={"web": 120, "code": 45}))
    with pytest.raises(ValueError, match="Mixture of"):
        other.load_state_dict(state)
    plain = stoker.DataLoader(stoker.ArrayDataset(np.arange(182)), batch_size=10)
    with pytest.raises(ValueError, match="ordered by a Mixture's weights"):
        plain.load_state_dict(state)
    with pytest.raises(ValueError, match="is for a loader of a stoker.Mixture"):
        plain.load_state_dict(plain.state_dict(), weights={"a": 1})


def test_bad_weights_are_named():
    with pytest.raises(ValueError, match="unknown source 'wiki'"):
        mixture({"web": 1, "code": 1, "math": 1, "wiki": 1})
    with pytest.raises(ValueError, match="no weight for source 'math'"):
        mixture({"web": 1, "code": 1})
    with pytest.raises(ValueError, match="source 'code' has weight -1"):
        mixture({"web": 1, "code": -1, "math": 1})
    with pytest.raises(ValueError, match="source 'web' has weight nan"):
        mixture({"web": float("nan"), "code": 1, "math": 1})
    with pytest.raises(ValueError, match="sum to 0"):
        mixture({"web": 0, "code": 0, "math": 0})
    with pytest.raises(ValueError, match="at step 3 sum to 0"):
        mixture([(0, {"web": 1, "code": 1, "math": 1}), (3, {"web": 0, "code": 0, "math": 0})])
    with pytest.raises(ValueError, match="first phase must start at step 0"):
        mixture([(2, {"web": 1, "code": 1, "math": 1})])
    with pytest.raises(ValueError, match="increasing steps"):
        mixture([(0, {"web": 1, "code": 1, "math": 1}), (0, {"web": 1, "code": 1, "math": 2})])
    with pytest.raises(ValueError, match="at step 0 have no weight for source 'web'"):
        mixture(lambda step: {"code": 1, "math": 1})
    m = mixture()
    with pytest.raises(ValueError, match="sum to 0"):
        m.weights = {"web": 0, "code": 0, "math": 0}
    late = mixture(lambda step: {"web": 1, "code": 1, "math": 1 if step < 3 else -1})
    with pytest.raises(ValueError, match="at step 3: source 'math' has weight -1"):
        list(loader(late))


def test_bad_datasets_and_options_are_named():
    with pytest.raises(ValueError, match="non-empty dict"):
        stoker.Mixture({})
    with pytest.raises(TypeError, match="source 'py' must be a Stoker dataset"):
        stoker.Mixture({"a": ids("web", 3), "py": [1, 2, 3]})
    pairs = stoker.ArrayDataset(np.zeros((4, 2), np.int64))
    with pytest.raises(ValueError, match='mixture source "b" field 0'):
        stoker.Mixture({"a": ids("web", 3), "b": pairs})
    with pytest.raises(ValueError, match='shuffle="stratified" and class_weights'):
        loader(mixture(), shuffle="stratified")


def test_inspection_and_pickling():
    m = mixture({"web": 1, "code": 2, "math": 3})
    assert m[0] == 0 and m[120] == 1000 and m[-1] == 2016
    assert m.locate(130) == ("code", 10)
    with pytest.raises(IndexError):
        m[len(m)]
    again = pickle.loads(pickle.dumps(m))
    assert again.names == m.names and again.weights == m.weights and len(again) == len(m)
    assert "Mixture({web: ArrayDataset(120)" in repr(m)


def test_token_sources_mix(tmp_path):
    datasets = {}
    for c, name in enumerate(("a", "b", "c")):
        path = tmp_path / f"{name}.bin"
        (np.arange(1 + 8 * 20, dtype=np.uint16) + 10000 * c).tofile(path)
        datasets[name] = stoker.TokenDataset(path, seq_len=8)
    m = stoker.Mixture(datasets, weights={"a": 2, "b": 1, "c": 1})
    dl = stoker.DataLoader(m, batch_size=8, shuffle=True, output="numpy", num_workers=2)
    for x, y in dl:
        assert x.shape[1:] == (8,) and (y[:, :-1] == x[:, 1:]).all()
        got = collections.Counter(x[:, 0] // 10000)  # 60 windows: 7 batches of 8, one of 4
        assert [got[0], got[1], got[2]] == [len(x) // 2, len(x) // 4, len(x) // 4]


def test_tables_mix_into_dict_batches():
    pa = pytest.importorskip("pyarrow")
    tables = {name: pa.table({"id": pa.array(np.arange(n, dtype=np.int64) + 1000 * c),
                              "x": pa.array(np.full(n, float(c)))})
              for c, (name, n) in enumerate(SIZES.items())}
    datasets = {name: stoker.TableDataset(t) for name, t in tables.items()}
    m = stoker.Mixture(datasets, weights={"web": 1, "code": 1, "math": 2})
    seen = []
    for batch in loader(m, batch_size=8):
        assert set(batch) == {"id", "x"}
        assert (np.asarray(batch["id"]) // 1000 == np.asarray(batch["x"])).all()
        seen += np.asarray(batch["id"]).tolist()
    check_streams(seen)
    with pytest.raises(ValueError, match="field"):
        stoker.Mixture({"a": datasets["web"],
                        "b": stoker.TableDataset(pa.table({"id": pa.array([1.5])}))})
