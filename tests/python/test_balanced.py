"""Class-balanced epochs: shuffle="stratified", class_weights, labels (stoker.balance)."""

import io
import json
import random
import tarfile

import numpy as np
import pytest
import torch

import stoker
from stoker import _native, balance
from stoker import transforms as T


def labelled(labels):
    """An ArrayDataset whose first array is the sample index and second the label."""
    labels = np.asarray(labels, dtype=np.int64)
    return stoker.ArrayDataset(np.arange(len(labels), dtype=np.int64), labels)


def epoch(loader):
    return [np.asarray(x).tolist() for x, _ in loader]


def random_labels(rng, n_classes_max=6):
    """Skewed class sizes, often a class smaller than the number of batches, arbitrary values."""
    labels = []
    for _ in range(rng.randint(1, n_classes_max)):
        size = rng.randint(1, 3) if rng.random() < 0.3 else rng.randint(1, 120)
        labels += [rng.randrange(-50, 1000)] * size
    rng.shuffle(labels)
    return np.array(labels, dtype=np.int64)


def within_one(batches, labels, shares):
    """Every batch holds every class within one sample of len(batch) * share."""
    for k, batch in enumerate(batches):
        counts = {c: 0 for c in shares}
        for i in batch:
            counts[int(labels[i])] += 1
        for c, share in shares.items():
            expected = len(batch) * share
            assert abs(counts[c] - expected) < 1 + 1e-9, (
                f"batch {k} holds {counts[c]} of class {c}, expected {expected:.3f}")


def test_stratified_every_sample_once_and_every_batch_of_every_rank_in_proportion():
    rng = random.Random(0)
    for _ in range(150):
        labels = random_labels(rng)
        n = len(labels)
        world = rng.randint(1, 4)
        kw = dict(batch_size=rng.randint(1, 24), shuffle="stratified", seed=rng.randrange(2**32),
                  drop_last=rng.random() < 0.5, num_workers=rng.choice([0, 2]),
                  world_size=world, output="numpy")
        per_rank = [epoch(stoker.DataLoader(labelled(labels), rank=r, **kw)) for r in range(world)]
        assert len({len(b) for b in per_rank}) == 1, "ranks got different batch counts"
        plain = stoker.DataLoader(labelled(labels), **dict(kw, shuffle=True))
        assert len(plain) == len(per_rank[0])  # the same batches as the plain shuffle
        values, counts = np.unique(labels, return_counts=True)
        shares = {int(v): c / n for v, c in zip(values, counts)}
        for rank in per_rank:
            within_one(rank, labels, shares)
        seen = [i for rank in per_rank for b in rank for i in b]
        if kw["drop_last"]:
            assert len(seen) == len(set(seen)), "a sample was repeated"
        else:
            assert set(seen) == set(range(n)), "a sample is missing"
            assert len(seen) == world * -(-n // world)  # padding: < world_size repeats


def test_the_scenario_of_the_issue_rare_class_in_every_batch():
    # 95% / 5%, batch 32, drop_last: 1.6 rare samples a batch on average. Stratified: 1 or 2 in
    # every batch. The plain shuffle: anything from 0 to 6 or more.
    labels = np.zeros(10_000, dtype=np.int64)
    labels[::20] = 1
    ds = labelled(labels)
    strat = stoker.DataLoader(ds, batch_size=32, shuffle="stratified", drop_last=True,
                              output="numpy")
    plain = stoker.DataLoader(ds, batch_size=32, shuffle=True, drop_last=True, output="numpy")
    for _ in range(3):
        rare = [int(y.sum()) for _, y in strat]
        assert set(rare) == {1, 2}
        assert 0.5 < np.mean(np.array(rare) == 2) < 0.7
        assert min(int(y.sum()) for _, y in plain) == 0


def test_dropped_tail_keeps_the_shares_and_changes_every_epoch():
    labels = np.array([0] * 700 + [1] * 250 + [2] * 53, dtype=np.int64)  # 1003 samples
    loader = stoker.DataLoader(labelled(labels), batch_size=64, shuffle="stratified",
                               drop_last=True, output="numpy")
    dropped_sets = []
    for _ in range(4):
        seen = {i for b in epoch(loader) for i in b}
        dropped = sorted(set(range(len(labels))) - seen)
        assert len(dropped) == len(labels) - 15 * 64
        for c, n_c in ((0, 700), (1, 250), (2, 53)):
            expected = len(dropped) * n_c / len(labels)
            assert abs(sum(labels[dropped] == c) - expected) < 1
        dropped_sets.append(dropped)
    assert len({tuple(d) for d in dropped_sets}) == 4


@pytest.mark.parametrize("class_weights", ["balanced", {0: 1, 1: 1, 2: 2}, [3.0, 1.0, 0.5]])
def test_weighted_epochs_hit_the_target_in_every_batch_and_starve_no_sample(class_weights):
    labels = np.array([0] * 900 + [1] * 37 + [2] * 140, dtype=np.int64)
    rng = np.random.default_rng(1)
    rng.shuffle(labels)
    n = len(labels)
    kw = dict(batch_size=40, shuffle=True, class_weights=class_weights, drop_last=False, seed=3,
              output="numpy")
    loader = stoker.DataLoader(labelled(labels), **kw)
    assert len(loader) == len(stoker.DataLoader(labelled(labels), batch_size=40, shuffle=True))
    w = [1, 1, 1] if class_weights == "balanced" else [class_weights[c] for c in range(3)]
    shares = {c: w[c] / sum(w) for c in range(3)}
    plan = loader.class_plan()
    assert [p["label"] for p in plan] == [0, 1, 2]
    assert [p["samples"] for p in plan] == [900, 37, 140]
    assert sum(p["draws_per_epoch"] for p in plan) == n
    drawn = np.zeros(n, dtype=np.int64)
    for e in range(6):
        batches = epoch(loader)
        within_one(batches, labels, shares)
        per_class = np.bincount(labels[[i for b in batches for i in b]], minlength=3)
        assert per_class.tolist() == [p["draws_per_epoch"] for p in plan]  # fixed, stated
        for b in batches:
            np.add.at(drawn, b, 1)  # a batch may hold a sample twice (at a cycle's end)
            for c in range(3):  # no sample drawn twice before every one of its class once
                mine = drawn[labels == c]
                assert mine.max() - mine.min() <= 1, (e, c)
    # Every sample of the subsampled class was reached over these epochs.
    assert (drawn[labels == 0] > 0).all()


def test_batches_are_bit_identical_whatever_num_workers_and_prefetch():
    rng = np.random.default_rng(2)
    labels = rng.choice(5, size=2000, p=[0.6, 0.2, 0.1, 0.07, 0.03]).astype(np.int64)
    data = rng.standard_normal((2000, 3)).astype(np.float32)
    for extra in (dict(shuffle="stratified"), dict(shuffle=True, class_weights="balanced")):
        def run(workers, prefetch):
            loader = stoker.DataLoader(stoker.ArrayDataset(data, labels), batch_size=48, seed=7,
                                       num_workers=workers, prefetch_factor=prefetch,
                                       output="numpy", **extra)
            loader.set_epoch(3)
            return [(x.tobytes(), y.tobytes()) for x, y in loader]

        reference = run(0, "auto")
        for workers in (1, 2, 4, "auto"):
            for prefetch in (1, 3, "auto"):
                assert run(workers, prefetch) == reference, (extra, workers, prefetch)


@pytest.mark.parametrize("extra", [dict(shuffle="stratified"),
                                   dict(shuffle="stratified", class_weights={0: 2, 1: 1, 7: 1})])
def test_resume_mid_epoch_from_state_dict_with_other_workers(extra):
    labels = np.array(([0] * 5 + [1] * 2 + [7]) * 60, dtype=np.int64)
    kw = dict(batch_size=16, seed=11, output="numpy", world_size=2, rank=1, **extra)
    full = stoker.DataLoader(labelled(labels), num_workers=0, **kw)
    full.set_epoch(2)
    reference = epoch(full)
    for stop in (0, 1, len(reference) // 2, len(reference) - 1):
        loader = stoker.DataLoader(labelled(labels), num_workers=2, **kw)
        loader.set_epoch(2)
        it = iter(loader)
        head = [np.asarray(next(it)[0]).tolist() for _ in range(stop)]
        state = json.loads(json.dumps(loader.state_dict()))
        del it
        resumed = stoker.DataLoader(labelled(labels), num_workers=1, **kw)
        resumed.load_state_dict(state)
        assert head + epoch(resumed) == reference
    weighted = "class_weights" in extra
    assert (state["class_weights"] is not None) == weighted
    other = stoker.DataLoader(labelled(labels), num_workers=0,
                              **dict(kw, class_weights=None if weighted else "balanced"))
    with pytest.raises(ValueError, match="class_weights"):
        other.load_state_dict(state)


def test_epoch_indices_are_what_the_loader_reads():
    labels = np.array([0] * 90 + [1] * 10, dtype=np.int64)
    loader = stoker.DataLoader(labelled(labels), batch_size=8, shuffle="stratified", seed=4,
                               output="numpy")
    loader.set_epoch(5)
    read = [i for b in epoch(loader) for i in b]
    assert loader._producer.engine.epoch_indices(5).tolist() == read


def test_labels_come_from_the_dataset_or_the_loader():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 4, 300)
    x = np.arange(300)
    # ArrayDataset: the last 1-D integer array, or the array named "label"/"y"/...
    assert np.array_equal(stoker.ArrayDataset(x, y).targets, y)
    named = stoker.ArrayDataset(y, x.astype(np.float32), names=["label", "feature"])
    assert np.array_equal(named.targets, y)
    assert named.names == ("label", "feature")  # as given; None when unnamed
    assert stoker.ArrayDataset(x, y).names is None
    assert stoker.ArrayDataset(x.astype(np.float32)).targets is None
    a = stoker.DataLoader(stoker.ArrayDataset(x, y), batch_size=10, shuffle="stratified",
                          output="numpy")
    b = stoker.DataLoader(stoker.ArrayDataset(x), batch_size=10, shuffle="stratified",
                          labels=y, output="numpy")
    first = [xb.tolist() for xb, _ in a]
    assert first == [xb.tolist() for xb in b]
    # A torch tensor of labels works too.
    torch = pytest.importorskip("torch")
    c = stoker.DataLoader(stoker.ArrayDataset(x), batch_size=10, shuffle="stratified",
                          labels=torch.from_numpy(y), output="numpy")
    assert [xb.tolist() for xb in c] == first


def _garbage_images(tmp_path, labels):
    """An ImageFolder tree and tar shards whose "images" are not images: reading labels must
    not decode, so a stratified loader over them is made and planned without an error."""
    root = tmp_path / "folder"
    for i, c in enumerate(labels):
        d = root / f"class{c}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:04d}.jpg").write_bytes(b"not an image")
    shard = tmp_path / "train-0000.tar"
    with tarfile.open(shard, "w") as tar:
        for i, c in enumerate(labels):
            for name, data in ((f"{i:04d}.jpg", b"not an image"), (f"{i:04d}.cls", b"%d" % c)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return root, shard


def test_image_datasets_give_their_labels_without_decoding(tmp_path):
    labels = [0] * 30 + [1] * 6 + [2] * 12
    root, shard = _garbage_images(tmp_path, labels)
    transform = T.Compose([T.Resize(8), T.CenterCrop(8), T.ToTensor()])
    for ds in (stoker.ImageFolder(root, transform=transform),
               stoker.TarShards(str(shard), transform=transform)):
        targets = np.asarray(ds.targets)
        assert np.array_equal(ds._source.labels(), targets)
        loader = stoker.DataLoader(ds, batch_size=8, shuffle="stratified", output="numpy")
        order = loader._producer.engine.epoch_indices(0)
        assert sorted(order.tolist()) == list(range(len(labels)))
        shares = {c: labels.count(c) / len(labels) for c in set(labels)}
        within_one(order.reshape(-1, 8).tolist(), targets, shares)
        with pytest.raises(stoker.SampleError):  # reading them does decode, and fails
            next(iter(loader))


def test_repeats_of_an_oversampled_image_are_augmented_anew(tmp_path):
    # Each draw's randomness is keyed by its cycle through its class, so the ~9 draws of each
    # image of an oversampled class in an epoch are ~9 different crops, not one crop 9 times.
    from stoker.sample_data import make_sample
    make_sample(tmp_path / "s", num_classes=3, images_per_class=8, shards=1)
    transform = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToTensor()])
    ds = stoker.ImageFolder(tmp_path / "s" / "train", transform=transform)
    labels = np.ones(len(ds), dtype=np.int64)
    labels[[3, 17]] = 0  # two rare images, 3/4 of the draws: about 9 each an epoch
    loader = stoker.DataLoader(ds, batch_size=6, shuffle=True, class_weights={0: 3, 1: 1},
                               labels=labels, output="numpy", num_workers=2)
    order = loader._producer.engine.epoch_indices(0).tolist()
    images = np.concatenate([x for x, _ in loader])
    for rare in (3, 17):
        crops = {images[k].tobytes() for k, i in enumerate(order) if i == rare}
        draws = order.count(rare)
        assert 8 <= draws <= 10
        assert len(crops) == draws, f"image {rare}: {draws} draws, {len(crops)} different crops"


def test_python_dataset_targets_give_the_native_order():
    # A Python dataset (torchvision's convention: a `targets` attribute) gets the native
    # loader's order through _native.engine.StratifiedPlan, batch by batch.
    class Python:
        def __init__(self, targets):
            self.targets = list(targets)

        def __len__(self):
            return len(self.targets)

        def __getitem__(self, i):
            return i

    labels = np.array([3] * 40 + [5] * 9 + [8] * 3, dtype=np.int64)
    for weights in (None, "balanced"):
        for rank in range(2):
            plan = balance.stratified_plan(Python(labels), "stratified", weights, None, 9, 5,
                                           False, rank, 2).plan
            native = stoker.DataLoader(labelled(labels), batch_size=5, shuffle="stratified",
                                       class_weights=weights, seed=9, rank=rank, world_size=2)
            assert len(plan) == len(native)
            flat = [i for b in range(len(plan)) for i in plan.batch_indices(2, b)]
            assert flat == native._producer.engine.epoch_indices(2).tolist()
            indices, cycles = plan.batch_draws(2, 1)
            assert indices == plan.batch_indices(2, 1) and len(cycles) == len(indices)
            if weights is None:
                assert set(cycles) <= {2, 3}  # the epoch, or a later one for padding
    assert balance.stratified_plan(Python(labels), True, None, None, 0, 5, False, 0, 1) is None
    assert balance.stratified_plan(Python(labels), None, None, None, 0, 5, False, 0, 1) is None


def test_torch_subset_labels_are_the_inner_datasets():
    torch = pytest.importorskip("torch")

    class Inner(torch.utils.data.Dataset):
        targets = [0, 1, 1, 2, 0, 2, 2]

        def __len__(self):
            return 7

        def __getitem__(self, i):
            return i

    subset = torch.utils.data.Subset(Inner(), [6, 0, 2])
    assert balance.labels_of(subset).tolist() == [2, 0, 1]


def test_invalid_arguments_say_what_is_wrong():
    labels = np.array([0, 0, 1, 1, 2], dtype=np.int64)
    ds = labelled(labels)
    with pytest.raises(ValueError, match='shuffle must be True, False, "stratified" or "shards"'):
        stoker.DataLoader(ds, shuffle="random")
    with pytest.raises(ValueError, match="shuffle=True or"):
        stoker.DataLoader(ds, class_weights="balanced")
    with pytest.raises(ValueError, match="need the class of every sample"):
        stoker.DataLoader(stoker.ArrayDataset(np.zeros((5, 2))), shuffle="stratified")
    with pytest.raises(ValueError, match="labels give 4 classes for a dataset of 5"):
        stoker.DataLoader(ds, shuffle="stratified", labels=[0, 1, 0, 1])
    with pytest.raises(ValueError, match="must be integers"):
        stoker.DataLoader(ds, shuffle="stratified", labels=[0.5, 1, 0, 1, 0])
    with pytest.raises(ValueError, match="no weight for the classes 2"):
        stoker.DataLoader(ds, shuffle=True, class_weights={0: 1, 1: 1})
    with pytest.raises(ValueError, match="no sample has: 9"):
        stoker.DataLoader(ds, shuffle=True, class_weights={0: 1, 1: 1, 2: 1, 9: 1})
    with pytest.raises(ValueError, match="outside"):
        stoker.DataLoader(ds, shuffle=True, class_weights=[1, 1])
    with pytest.raises(ValueError, match="finite number >= 0"):
        stoker.DataLoader(ds, shuffle=True, class_weights=[1, -1, 1])
    with pytest.raises(ValueError, match="all 0"):
        stoker.DataLoader(ds, shuffle=True, class_weights=[0, 0, 0])
    with pytest.raises(ValueError, match="balanced"):
        stoker.DataLoader(ds, shuffle=True, class_weights="inverse")
    with pytest.raises(ValueError, match="class_plan"):
        stoker.DataLoader(ds, shuffle=True).class_plan()
    # A weight of 0 leaves a class out.
    loader = stoker.DataLoader(ds, batch_size=2, shuffle=True, class_weights={0: 1, 1: 0, 2: 1},
                               output="numpy")
    assert 1 not in {int(v) for _, y in loader for v in y}


def test_class_groups_memory_is_four_bytes_a_sample():
    labels = np.random.default_rng(0).integers(0, 1000, 200_000)
    groups = _native.engine.ClassGroups(labels)
    assert groups.num_classes == 1000
    assert sum(groups.counts) == 200_000
    assert groups.memory_bytes < 4 * 200_000 + 16 * 1000 + 1024


def test_class_mix_shows_how_each_shuffle_mode_mixes_the_classes():
    from stoker.tuning.stats import class_mix
    labels = np.array([0] * 950 + [1] * 50, dtype=np.int64)  # sorted, as an ImageFolder is
    mix = class_mix(labels, batch_size=32, drop_last=True, world_size=2, epochs=2,
                    class_weights="balanced")
    assert [c["samples"] for c in mix["classes"]] == [950, 50]
    modes = mix["modes"]
    assert list(modes) == ["shuffle=False", "shuffle=True", 'shuffle="stratified"',
                           "class_weights='balanced'"]
    sequential, random_, strat, balanced = modes.values()
    assert all(m["batches"] == 2 * 2 * (500 // 32) for m in modes.values())
    assert sequential["per_class"][1]["batches_without"] >= sequential["batches"] - 4
    assert strat["all_within_one"] == strat["batches"] and strat["worst_deviation"] < 1
    assert (strat["per_class"][1]["min"], strat["per_class"][1]["max"]) == (1, 2)
    assert random_["all_within_one"] < random_["batches"]
    assert balanced["per_class"][1]["min"] == balanced["per_class"][1]["max"] == 16


def test_stoker_stats_classes_cli(tmp_path, capsys):
    from stoker.tuning.stats import main
    labels = np.zeros(2000, dtype=np.int64)
    labels[1900:] = 1
    path = tmp_path / "labels.npy"
    np.save(path, labels)
    assert main(["--classes", str(path), "--batch-size", "32", "--class-weights", "balanced",
                 "--json", str(tmp_path / "mix.json")]) == 0
    out = capsys.readouterr().out
    assert "2 classes, 2,000 samples" in out
    line = next(line for line in out.splitlines() if line.strip().startswith('shuffle="strat'))
    assert line.split()[1:3] == ["1", "2"]  # min and max of the rare class per batch
    saved = json.loads((tmp_path / "mix.json").read_text())
    assert saved["modes"]['shuffle="stratified"']["all_within_one"] == 62
    with pytest.raises(SystemExit):
        main(["--classes", str(path), "--batch-size", "0"])
    assert main(["--classes", str(tmp_path / "missing.npy")]) == 2


def test_python_dataset_through_the_dataloader_follows_the_native_order():
    class Python:
        def __init__(self, targets):
            self.targets = list(targets)

        def __len__(self):
            return len(self.targets)

        def __getitem__(self, i):
            return np.int64(i)

    labels = np.array([0] * 60 + [1] * 11 + [2] * 4, dtype=np.int64)
    for extra in (dict(shuffle="stratified"), dict(shuffle=True, class_weights="balanced")):
        kw = dict(batch_size=8, seed=5, drop_last=False, world_size=2, rank=1, **extra)
        python = stoker.DataLoader(Python(labels), num_workers=0, output="numpy", **kw)
        native = stoker.DataLoader(labelled(labels), output="numpy", **kw)
        assert len(python) == len(native)
        python.set_epoch(3)
        native.set_epoch(3)
        assert [np.asarray(b).tolist() for b in python] == [x.tolist() for x, _ in native]
        assert python.state_dict()["shuffle"] == extra["shuffle"]
    with pytest.raises(ValueError, match="mutually exclusive"):
        stoker.DataLoader(Python(labels), shuffle="stratified",
                          sampler=list(range(len(labels))))


class Keys:
    """A Python dataset (torchvision's `targets`) whose samples report their key and a draw."""
    targets = [0 if i in (3, 17) else 1 for i in range(40)]

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return np.array([i, torch.initial_seed(), int(random.random() * 2**40)], dtype=np.int64)


def test_repeats_of_an_oversampled_python_sample_draw_their_own_randomness():
    # As the native loader does: a draw's randomness is keyed by (seed, cycle, index), so the ~9
    # draws of a rare sample in an epoch are ~9 different augmentations, whichever process or
    # part of a batch fetched them.
    kw = dict(batch_size=6, shuffle=True, class_weights={0: 3, 1: 1}, seed=3, output="numpy")
    runs = []
    for workers in (0, 2, "auto"):
        loader = stoker.DataLoader(Keys(), num_workers=workers, **kw)
        loader.set_epoch(1)
        runs.append(np.concatenate(list(loader)))
    assert all(np.array_equal(r, runs[0]) for r in runs[1:])
    rows = runs[0]
    plan = loader._producer._order.stratified
    cycles = np.concatenate([plan.batch_draws(1, b)[1] for b in range(len(plan))])
    assert rows[:, 1].tolist() == [_native.pydata.sample_key(3, int(c), int(i))
                                   for c, i in zip(cycles, rows[:, 0])]
    for rare in (3, 17):
        draws = rows[rows[:, 0] == rare]
        assert 14 <= len(draws) <= 16  # 3/4 of 40 draws, for two samples
        assert len(set(draws[:, 2].tolist())) == len(draws), f"sample {rare} repeats a draw"
    # Without weights every draw is keyed by the epoch, as in a plain shuffle.
    loader = stoker.DataLoader(Keys(), num_workers=0, batch_size=6, shuffle="stratified", seed=3,
                               output="numpy")
    rows = np.concatenate(list(loader))
    assert rows[:, 1].tolist() == [_native.pydata.sample_key(3, 0, int(i)) for i in rows[:, 0]]


@pytest.mark.parametrize("extra", [{"shuffle": "stratified"},
                                   {"shuffle": True, "class_weights": "balanced"}])
def test_a_stratified_state_resumes_only_with_the_world_size_that_saved_it(extra):
    """A stratified order lays its rows out for the saving job's ranks: an elastic resume (another
    world size) is refused with the reason; the same world size resumes exactly."""
    labels = np.array(([0] * 7 + [1]) * 40, dtype=np.int64)
    kw = dict(batch_size=8, seed=3, output="numpy", num_workers=0, **extra)
    loader = stoker.DataLoader(labelled(labels), world_size=2, rank=0, **kw)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["order"] == "stratified"
    with pytest.raises(ValueError, match="stratified or class-weighted order"):
        stoker.DataLoader(labelled(labels), world_size=3, rank=0, **kw).load_state_dict(state)
    same = stoker.DataLoader(labelled(labels), world_size=2, rank=0, **kw)
    same.load_state_dict(state)
    assert epoch(same) == [np.asarray(x).tolist() for x, _ in it]
