"""Repeated augmentation, DataLoader(repeats=k): every sample k times an epoch at k adjacent
positions of the global order, copy r of epoch e keyed as cycle e * k + r; exact accounting
across ranks, padding and drop_last, resume (also elastic), and what it refuses."""

import collections
import hashlib
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import stoker  # noqa: E402
from stoker import _native  # noqa: E402
from stoker import transforms as T  # noqa: E402
from stoker.sample_data import make_sample  # noqa: E402


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    root = tmp_path_factory.mktemp("images") / "sample"
    make_sample(root, num_classes=3, images_per_class=8, shards=2)
    return root


def augmented(sample):
    t = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToTensor()])
    return stoker.ImageFolder(str(sample / "train"), transform=t)


class Keys:
    """A map-style Python dataset whose sample i reports (i, its randomness's key)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.array([i, torch.initial_seed()], dtype=np.int64)


def key(seed, cycle, i):
    return _native.pydata.sample_key(seed, cycle, i)


def epoch_positions(n, k, shuffle, seed, epoch):
    """(sample, cycle) at each of the epoch's n * k global positions, from the engine's order."""
    order = _native.engine.BatchPlan(n, n, False, 0, 1).indices(shuffle, seed, epoch, 0)
    return [(int(order[q // k]), epoch * k + q % k) for q in range(n * k)]


def draws(loader, seed):
    """(sample, cycle) of every row of a Keys loader's epoch, by matching the keys."""
    out = []
    for batch in loader:
        for i, k in np.asarray(batch).tolist():
            cycles = [c for c in range(64) if key(seed, c, i) == k]
            assert len(cycles) == 1
            out.append((i, cycles[0]))
    return out


# ---- accounting ----------------------------------------------------------------------------------

@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_copy_exactly_once_across_ranks_with_the_stated_padding(shuffle, drop_last):
    # Padding rule (DistributedSampler's, over the n * k positions): without drop_last every
    # rank gets ceil(n * k / world) positions and the last ones wrap to the epoch's first
    # positions (fewer than world draws repeat); with drop_last the ranks take the first
    # floor(n * k / world) // batch_size * batch_size * world positions, each once.
    for n, k, world, bs in ((23, 3, 2, 4), (10, 2, 3, 3), (7, 4, 4, 2), (30, 1, 3, 5)):
        seed = 5 + n
        per_rank = n * k // world if drop_last else -(-n * k // world)
        taken = per_rank // bs * bs * world if drop_last else per_rank * world
        want = epoch_positions(n, k, shuffle, seed, 1)
        want = collections.Counter(want[q % (n * k)] for q in range(taken))
        got = collections.Counter()
        native = collections.Counter()
        for rank in range(world):
            kw = dict(batch_size=bs, shuffle=shuffle, seed=seed, drop_last=drop_last, rank=rank,
                      world_size=world, repeats=k, output="numpy")
            loader = stoker.DataLoader(Keys(n), num_workers=0, **kw)
            assert len(loader) == -(-per_rank // bs) if not drop_last else per_rank // bs
            loader.set_epoch(1)
            got.update(draws(loader, seed))
            arrays = stoker.DataLoader(stoker.ArrayDataset(np.arange(n)), num_workers=2, **kw)
            arrays.set_epoch(1)
            native.update(int(i) for b in arrays for i in b)
        assert got == want, (n, k, world, bs)
        assert native == collections.Counter(i for i, _ in want.elements())
        if not drop_last and n * k % world == 0:
            assert all(c == 1 for c in got.values())
            assert all(native[i] == k for i in range(n))


def test_copies_are_adjacent_and_go_to_different_ranks():
    n, k, seed = 20, 3, 9
    whole = stoker.DataLoader(Keys(n), batch_size=4, shuffle=True, seed=seed, repeats=k,
                              num_workers=0, output="numpy")
    flat = draws(whole, seed)
    assert flat == epoch_positions(n, k, True, seed, 0)
    for j in range(n):  # positions jk .. jk + k - 1: copies 0 .. k - 1 of one sample
        assert [c for _, c in flat[j * k:(j + 1) * k]] == list(range(k))
        assert len({i for i, _ in flat[j * k:(j + 1) * k]}) == 1
    # With as many ranks as copies, each rank holds one copy of every sample, in step.
    ranks = [draws(stoker.DataLoader(Keys(n), batch_size=4, shuffle=True, seed=seed,
                                     repeats=k, rank=r, world_size=k, num_workers=0,
                                     output="numpy"), seed) for r in range(k)]
    for r in range(k):
        assert [i for i, _ in ranks[r]] == [i for i, _ in ranks[0]]
        assert all(c == r for _, c in ranks[r])


def test_each_copy_draws_the_augmentation_of_its_cycle(sample):
    ds = augmented(sample)
    k = 3
    loader = stoker.DataLoader(ds, batch_size=6, shuffle=True, seed=4, repeats=k, num_workers=2)
    loader.set_epoch(1)
    images = torch.cat([x for x, _ in loader])
    labels = torch.cat([y for _, y in iter_epoch(loader, 1)])
    again = torch.cat([x for x, _ in iter_epoch(loader, 1)])
    assert torch.equal(images, again)  # a second iteration reproduces the copies
    order = _native.engine.BatchPlan(len(ds), len(ds), False, 0, 1).indices(True, 4, 1, 0)
    # Copy r of sample i is the plain loader's sample i in epoch 1 * k + r.
    plain = stoker.DataLoader(ds, batch_size=len(ds), shuffle=False, seed=4, num_workers=2)
    by_cycle = {c: next(iter_epoch(plain, c))[0] for c in range(k, 2 * k)}
    for j, i in enumerate(order):
        copies = images[j * k:(j + 1) * k]
        assert len(set(labels[j * k:(j + 1) * k].tolist())) == 1
        for r in range(k):
            assert torch.equal(copies[r], by_cycle[k + r][i])
        assert not torch.equal(copies[0], copies[1]) and not torch.equal(copies[1], copies[2])


def iter_epoch(loader, epoch):
    loader.set_epoch(epoch)
    return iter(loader)


def test_one_repeat_is_todays_loader(sample):
    ds = augmented(sample)
    a = stoker.DataLoader(ds, batch_size=5, shuffle=True, seed=2, num_workers=2)
    b = stoker.DataLoader(ds, batch_size=5, shuffle=True, seed=2, num_workers=2, repeats=1)
    for epoch in (0, 3):
        for (x, y), (u, v) in zip(list(iter_epoch(a, epoch)), list(iter_epoch(b, epoch))):
            assert torch.equal(x, u) and torch.equal(y, v)
    assert len(a) == len(b) == 5
    assert b.state_dict()["repeats"] == 1
    # A state saved before repeats existed (no key) loads as repeats=1.
    old = {k: v for k, v in a.state_dict().items() if k != "repeats"}
    b.load_state_dict(old)


# ---- resume --------------------------------------------------------------------------------------

def test_resume_mid_epoch_is_bit_identical_and_repeats_must_match(sample):
    ds = augmented(sample)
    kw = dict(batch_size=5, shuffle=True, seed=6, repeats=2)
    full = [(x.clone(), y.clone()) for x, y in
            iter_epoch(stoker.DataLoader(ds, num_workers=2, **kw), 1)]
    assert len(full) == 10  # 48 copies in batches of 5
    first = stoker.DataLoader(ds, num_workers=1, **kw)
    it = iter_epoch(first, 1)
    for _ in range(4):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["repeats"] == 2 and state["batch"] == 4
    resumed = stoker.DataLoader(ds, num_workers=0, **kw)
    resumed.load_state_dict(state)
    rest = [(x.clone(), y.clone()) for x, y in resumed]
    assert len(rest) == 6
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(rest, full[4:]))
    for other in (1, 3):
        with pytest.raises(ValueError, match=rf"the state was saved with repeats=2 but this "
                                             rf"loader has repeats={other}"):
            stoker.DataLoader(ds, **{**kw, "repeats": other}).load_state_dict(state)


def image_ids(batches):
    return [hashlib.sha1(x.numpy().tobytes()).hexdigest() for b, _ in batches for x in b]


def test_elastic_resume_from_two_ranks_to_three_delivers_each_remaining_copy_once(sample):
    ds = augmented(sample)
    kw = dict(batch_size=3, shuffle=True, seed=8, repeats=2)
    # Every (sample, copy) of the epoch is a distinct augmented image.
    everything = image_ids(iter_epoch(stoker.DataLoader(ds, num_workers=2, **kw), 2))
    assert len(everything) == 48 and len(set(everything)) == 48
    before, states = [], []
    for rank in range(2):
        loader = stoker.DataLoader(ds, rank=rank, world_size=2, num_workers=2, **kw)
        it = iter_epoch(loader, 2)
        before += image_ids(next(it) for _ in range(3))
        states.append(loader.state_dict())
    assert states[0]["batch"] == 3
    after = []
    for rank in range(3):
        loader = stoker.DataLoader(ds, rank=rank, world_size=3, num_workers=1, **kw)
        loader.load_state_dict(states[0])
        after += image_ids(loader)
    # 48 - 18 = 30 copies left: 10 a rank, no padding.
    assert len(before) == 18 and len(after) == 30
    assert collections.Counter(before + after) == collections.Counter(everything)
    # The same with Python datasets, by keys: 2 ranks of 37 * 2 copies, then 3 ranks.
    n, seed = 37, 8
    pkw = dict(batch_size=4, shuffle=True, seed=seed, repeats=2, num_workers=0, output="numpy")
    done = []
    for rank in range(2):
        loader = stoker.DataLoader(Keys(n), rank=rank, world_size=2, **pkw)
        it = iter_epoch(loader, 0)
        for _ in range(5):
            done += [tuple(r) for r in np.asarray(next(it)).tolist()]
        state = loader.state_dict()
    rest = []
    for rank in range(3):
        loader = stoker.DataLoader(Keys(n), rank=rank, world_size=3, **pkw)
        loader.load_state_dict(state)
        rest += [tuple(r) for b in loader for r in np.asarray(b).tolist()]
    want = collections.Counter((i, key(seed, c, i)) for i, c in epoch_positions(n, 2, True,
                                                                                 seed, 0))
    left = want - collections.Counter(done)
    assert sum(left.values()) == 74 - 40
    got = collections.Counter(rest)
    assert all(got[d] == 1 for d in left)
    # 34 positions for 3 ranks: 12 each, the 2 extra wrap to the epoch's first positions.
    extra = got - left
    assert sum(extra.values()) == 2
    first = [(i, key(seed, c, i)) for i, c in epoch_positions(n, 2, True, seed, 0)[:2]]
    assert sorted(extra) == sorted(first)


# ---- orders with blocks --------------------------------------------------------------------------

def test_tables_with_row_groups_repeat_each_row_in_their_block_order(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"x": np.arange(60, dtype=np.int64)}), path, row_group_size=7)
    ds = stoker.TableDataset(str(path), shuffle_window=20)
    once = [int(i) for b in stoker.DataLoader(ds, batch_size=8, shuffle=True, seed=1,
                                              num_workers=2) for i in b["x"]]
    twice = [int(i) for b in stoker.DataLoader(ds, batch_size=8, shuffle=True, seed=1,
                                               num_workers=2, repeats=2) for i in b["x"]]
    assert sorted(once) == list(range(60))
    assert twice == [i for i in once for _ in range(2)]


# ---- what it refuses -----------------------------------------------------------------------------

def test_repeats_is_refused_where_it_cannot_hold(sample):
    arrays = stoker.ArrayDataset(np.arange(12), np.arange(12) % 2)
    for bad in (0, -1, 1.5, True, "2", None):
        with pytest.raises(ValueError, match=r"repeats must be a positive integer"):
            stoker.DataLoader(arrays, batch_size=2, repeats=bad)
    for kw in (dict(shuffle="stratified"), dict(shuffle=True, class_weights="balanced")):
        with pytest.raises(ValueError, match=r"repeats is for the plain order"):
            stoker.DataLoader(arrays, batch_size=2, repeats=2, **kw)
    mixture = stoker.Mixture({"a": stoker.ArrayDataset(np.arange(6)),
                              "b": stoker.ArrayDataset(np.arange(6))})
    with pytest.raises(ValueError, match=r"repeats is for the plain order"):
        stoker.DataLoader(mixture, batch_size=2, repeats=2)
    with pytest.raises(ValueError, match=r"repeats is for the plain order"):
        stoker.DataLoader(Keys(8), batch_size=2, repeats=2, sampler=list(range(8)))
    with pytest.raises(ValueError, match=r"repeats is for the plain order"):
        stoker.DataLoader(Keys(8), batch_size=2, repeats=2, shuffle="stratified",
                          labels=[0, 1] * 4)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(4))

    with pytest.raises(ValueError, match=r"repeats is for the plain order"):
        stoker.DataLoader(Stream(), batch_size=2, repeats=2)
