"""Batches by a budget (stoker.Budget, include/stoker/budget.h): every batch within its budget,
every sample exactly once, the same number of batches on every rank, resume mid-epoch and across
world sizes, batches that do not depend on the workers, Python datasets with ``lengths=``, and two
gloo ranks over a skewed corpus that finish together."""

import collections
import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import stoker

BUDGET = 2048


def write_corpus(path, n=1500, seed=0, eos=0):
    """A uint16 token file of ``n`` documents of long-tailed lengths (log-normal, 2-600 tokens),
    each ending with ``eos``; token t of document d is 1 + (d * 7 + t) % 60000 (never eos)."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(3.5, 1.0, n), 2, 600).astype(int)
    docs = [np.append(1 + (d * 7 + np.arange(k - 1)) % 60000, eos) for d, k in enumerate(lengths)]
    np.concatenate(docs).astype(np.uint16).tofile(path)
    return docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("budget") / "corpus.bin"
    docs = write_corpus(path)
    return str(path), docs


def documents(path, **kw):
    return stoker.TokenDataset(path, dtype="uint16", pack=None, eos=0, **kw)


def rows(batch):
    """The documents of a batch, each its unpadded tokens, as tuples."""
    ids, lengths = np.asarray(batch["input_ids"]), np.asarray(batch["lengths"])
    return [tuple(int(t) for t in ids[r, :lengths[r]]) for r in range(len(lengths))]


def epoch_rows(loader):
    return [rows(b) for b in loader]


def test_every_batch_within_its_budget_and_every_document_once(corpus):
    path, docs = corpus
    ds = documents(path)
    assert len(ds) == len(docs)
    loader = stoker.DataLoader(ds, batch_size=stoker.Budget(tokens=BUDGET, pad_to_multiple_of=8),
                               shuffle=True, seed=3, num_workers=2)
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        n = len(loader)
        seen = collections.Counter()
        batches = 0
        for b in loader:
            ids = b["input_ids"]
            assert ids.shape[0] * ids.shape[1] <= BUDGET + 8 * ids.shape[0]
            assert ids.shape[1] % 8 == 0
            lengths = b["lengths"]
            longest = int(lengths.max())
            assert ids.shape[0] * longest <= BUDGET, "the cost: B x the longest"
            assert torch.equal(b["attention_mask"].sum(1), lengths)
            pad = ~b["attention_mask"].bool()
            assert (ids[pad] == 0).all() and (b["labels"][pad] == -100).all()
            # labels: the next token of the same document, -100 after its last
            for r in range(len(lengths)):
                k = int(lengths[r])
                assert torch.equal(b["labels"][r, :k - 1], ids[r, 1:k])
                assert int(b["labels"][r, k - 1]) == -100
            seen.update(rows(b))
            batches += 1
        assert batches == n, "len(loader) is exact"
        assert sorted(seen) == sorted(tuple(int(t) for t in d) for d in docs)
        assert set(seen.values()) == {1}
    s = loader.stats()["budget"]
    assert s["budget"] == BUDGET and s["unit"] == "tokens" and s["oversized"] == 0
    assert 0 <= s["padding_fraction"] < 0.05
    assert s["delivered_padding_fraction"] >= s["padding_fraction"]  # + pad_to_multiple_of


def test_batches_do_not_depend_on_the_workers(corpus):
    path, _ = corpus
    runs = [epoch_rows(stoker.DataLoader(documents(path), batch_size=stoker.Budget(tokens=BUDGET),
                                         shuffle=True, seed=5, num_workers=w)) for w in (0, 1, 3)]
    assert runs[0] == runs[1] == runs[2]


@pytest.mark.parametrize("remainder", ["drop", "repeat"])
def test_every_rank_gets_the_same_number_of_batches(corpus, remainder):
    path, docs = corpus
    budget = stoker.Budget(tokens=BUDGET, remainder=remainder, buckets=[16, 64, 200])
    everything = sorted(tuple(int(t) for t in d) for d in docs)
    for world in range(1, 9):
        per_rank, repeated = [], 0
        for rank in range(world):
            loader = stoker.DataLoader(documents(path), batch_size=budget, shuffle=True, seed=1,
                                       rank=rank, world_size=world, num_workers=0)
            got = epoch_rows(loader)
            assert len(got) == len(loader)
            per_rank.append(got)
            s = loader.stats()["budget"]
            repeated += s["repeated_batches"]
        assert len({len(r) for r in per_rank}) == 1, f"world {world}: unequal batch counts"
        seen = collections.Counter(d for r in per_rank for b in r for d in b)
        if remainder == "drop":
            assert set(seen.values()) <= {1}
            assert len(seen) + s["dropped_samples"] == len(docs)
        else:
            # Every document, and again only in the batches counted as repeats.
            assert sorted(seen) == everything and s["dropped_batches"] == 0
            assert (max(seen.values()) > 1) == (repeated > 0)
        # The ranks' costs of a step, (most - least) / most: small but for a bucket's last
        # (partial) batch; bench/bench_budget.py measures it on a corpus of realistic size.
        assert 0 <= s["mean_cost_spread"] <= s["max_cost_spread"] <= 1


def take(loader, k):
    it = iter(loader)
    out = [rows(next(it)) for _ in range(k)]
    return out, loader.state_dict()


def test_resume_mid_epoch_gives_the_same_batches(corpus):
    path, _ = corpus
    budget = stoker.Budget(tokens=BUDGET)
    make = lambda **kw: stoker.DataLoader(documents(path), batch_size=budget, shuffle=True,  # noqa
                                          seed=2, rank=1, world_size=2, **kw)
    full = make(num_workers=0)
    full.set_epoch(3)
    whole = epoch_rows(full)
    a = make(num_workers=2)
    a.set_epoch(3)
    first, state = take(a, 5)
    assert state["order"] == "budget" and state["batch"] == 5
    assert json.loads(json.dumps(state)) == state and len(json.dumps(state)) < 2000, "O(buckets)"
    b = make(num_workers=1)
    b.load_state_dict(state)
    assert first + epoch_rows(b) == whole


def test_elastic_resume_across_world_sizes_delivers_every_document_once(corpus):
    path, docs = corpus
    budget = stoker.Budget(tokens=BUDGET, remainder="repeat")
    seen = collections.Counter()

    def job(world, steps, state=None):
        states = []
        for rank in range(world):
            loader = stoker.DataLoader(documents(path), batch_size=budget, shuffle=True, seed=4,
                                       rank=rank, world_size=world, num_workers=0)
            if state is not None:
                loader.load_state_dict(state)
            it = iter(loader)
            for _ in range(steps if steps is not None else len(loader)):
                seen.update(rows(next(it)))
            states.append(loader.state_dict())
        return states[0]

    state = job(4, 3)
    state = job(3, 2, state)
    job(2, None, state)
    assert sorted(seen) == sorted(tuple(int(t) for t in d) for d in docs)


def test_a_document_over_the_budget_raises_naming_it_or_is_skipped(tmp_path):
    docs = write_corpus(tmp_path / "c.bin", n=200)
    longest = int(np.argmax([len(d) for d in docs]))
    tight = len(docs[longest]) - 1
    with pytest.raises(stoker.SampleError, match=rf"sample {longest} \(.*c\.bin.*\) is "
                                                 rf"{len(docs[longest])} tokens long"):
        stoker.DataLoader(documents(str(tmp_path / "c.bin")), batch_size=stoker.Budget(tokens=tight))
    loader = stoker.DataLoader(documents(str(tmp_path / "c.bin")),
                               batch_size=stoker.Budget(tokens=tight), on_error="skip")
    got = [d for b in loader for d in rows(b)]
    assert len(got) == len(docs) - sum(len(d) > tight for d in docs)
    assert loader.stats()["budget"]["oversized"] == sum(len(d) > tight for d in docs)
    assert loader.stats()["skipped"] >= 1


class Sentences(torch.utils.data.Dataset):
    """A Python dataset of variable-length dict samples."""

    def __init__(self, n=300):
        rng = np.random.default_rng(7)
        self.lengths = np.clip(rng.lognormal(3, 0.8, n), 1, 300).astype(int)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return {"input_ids": torch.full((int(self.lengths[i]),), i + 1), "labels": i}


@pytest.mark.parametrize("given", ["array", "callable"])
def test_a_python_dataset_with_lengths(given):
    ds = Sentences()
    lengths = ds.lengths if given == "array" else (lambda i: int(ds.lengths[i]))
    loader = stoker.DataLoader(ds, batch_size=stoker.Budget(tokens=512, lengths=lengths),
                               shuffle=True, seed=1, num_workers=2)
    seen = []
    for b in loader:
        ids, mask = b["input_ids"], b["attention_mask"]
        assert ids.shape[0] * int(mask.sum(1).max()) <= 512
        for r in range(ids.shape[0]):
            k = int(mask[r].sum())
            assert k == ds.lengths[int(b["labels"][r])]
            assert (ids[r, :k] == int(b["labels"][r]) + 1).all() and (ids[r, k:] == 0).all()
        seen += b["labels"].tolist()
    assert sorted(seen) == list(range(len(ds)))
    again = stoker.DataLoader(ds, batch_size=stoker.Budget(tokens=512, lengths=lengths),
                              shuffle=True, seed=1, num_workers=0)
    loader.set_epoch(0)
    assert [b["labels"].tolist() for b in again] == \
        [b["labels"].tolist() for b in loader], "the same batches whatever the workers"


def test_a_users_collate_fn_gets_the_budgets_batches():
    ds = Sentences(100)
    loader = stoker.DataLoader(ds, batch_size=stoker.Budget(tokens=256, lengths=ds.lengths),
                               collate_fn=lambda samples: [s["labels"] for s in samples],
                               num_workers=0)
    batches = list(loader)
    assert sorted(i for b in batches for i in b) == list(range(100))
    assert all(len(b) * max(ds.lengths[i] for i in b) <= 256 for b in batches)


def test_a_dataset_without_lengths_says_how_to_give_them():
    ds = stoker.ArrayDataset(np.arange(10))
    with pytest.raises(ValueError, match=r"lengths=\.\.\."):
        stoker.DataLoader(ds, batch_size=stoker.Budget(tokens=10))
    loader = stoker.DataLoader(ds, batch_size=stoker.Budget(tokens=4, lengths=np.ones(10)),
                               output="numpy")
    assert sorted(int(i) for b in loader for i in b) == list(range(10))


@pytest.mark.parametrize("bad, message", [
    (dict(), "one of tokens=, seconds=, pixels= or samples="),
    (dict(tokens=1, seconds=2), "one of tokens="),
    (dict(tokens=-1), "positive number"),
    (dict(tokens=8, cost="max"), "cost must be one of"),
    (dict(tokens=8, buckets=[5, 3]), "increasing"),
    (dict(tokens=8, remainder="pad"), "remainder must be"),
    (dict(tokens=8, max_batch_size=0), "max_batch_size"),
])
def test_budget_arguments_are_checked(bad, message):
    with pytest.raises(ValueError, match=message):
        stoker.Budget(**bad)


def test_a_budget_with_an_order_of_its_own_is_refused(corpus):
    path, _ = corpus
    with pytest.raises(ValueError, match="not both"):
        stoker.DataLoader(stoker.Mixture({"a": documents(path), "b": documents(path)}),
                          batch_size=stoker.Budget(tokens=BUDGET))
    with pytest.raises(ValueError, match="repeats"):
        stoker.DataLoader(documents(path), batch_size=stoker.Budget(tokens=BUDGET), repeats=2)


# Two gloo ranks over a skewed corpus, batches by a budget: both finish the epoch with the same
# number of batches (an uneven count would hang the last all_reduce).
WORKER = textwrap.dedent("""
    import datetime, json, os, sys
    import torch
    import torch.distributed as dist
    import stoker

    rank, port, out, path = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=60))
    ds = stoker.TokenDataset(path, dtype="uint16", pack=None, eos=0)
    loader = stoker.DataLoader(ds, batch_size=stoker.Budget(tokens=1024), shuffle=True)
    steps = tokens = 0
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            t = torch.tensor([int(batch["lengths"].sum())])
            dist.all_reduce(t)  # a step: every rank must take part
            tokens += int(t)
            steps += 1
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"steps": steps, "tokens": tokens, "len": len(loader)}, f)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)
""")


@pytest.mark.slow
def test_two_gloo_ranks_over_a_skewed_corpus_finish_together(tmp_path):
    docs = write_corpus(tmp_path / "skewed.bin", n=800, seed=9)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(port), str(tmp_path),
                               str(tmp_path / "skewed.bin")], env=env) for r in range(2)]
    try:
        for p in procs:
            assert p.wait(timeout=240) == 0, "a rank hung or failed"
    finally:
        for p in procs:
            p.kill()
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert reports[0]["steps"] == reports[1]["steps"] > 0
    total = sum(len(d) for d in docs)
    # Two epochs; with the default remainder ("drop") a few batches wait for the next epoch.
    assert 0.9 * 2 * total <= reports[0]["tokens"] <= 2 * total


def test_image_sizes_come_from_the_headers(tmp_path):
    from PIL import Image
    rng = np.random.default_rng(0)
    sizes = {}
    for k in range(12):
        w, h = int(rng.integers(8, 64)), int(rng.integers(8, 64))
        (tmp_path / str(k % 2)).mkdir(exist_ok=True)
        path = tmp_path / str(k % 2) / f"{k}.{'png' if k % 3 else 'jpg'}"
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(path)
        sizes[str(path)] = w * h
    from stoker import transforms as T
    ds = stoker.ImageFolder(tmp_path, transform=T.Compose([T.Resize((8, 8)), T.ToTensor()]))
    assert list(ds._lengths("pixels")) == [sizes[p] for p, _ in ds.samples]
    budget = 6000
    loader = stoker.DataLoader(ds, batch_size=stoker.Budget(pixels=budget), shuffle=True)
    seen = []
    for images, labels in loader:
        assert images.shape[1:] == (3, 8, 8)
        seen.append(len(labels))
    assert sum(seen) == len(ds) - sum(s > budget for s in sizes.values())  # oversized: raise?
    with pytest.raises(ValueError, match="does not know them in seconds"):
        stoker.DataLoader(ds, batch_size=stoker.Budget(seconds=5))


def test_a_tables_list_column_gives_its_lengths(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    rows = [list(range(1, k + 1)) for k in (3, 9, 1, 14, 6, 2, 11, 5)]
    pq.write_table(pa.table({"input_ids": rows, "y": list(range(8))}), tmp_path / "t.parquet")
    ds = stoker.TableDataset(tmp_path / "t.parquet", max_length=12)
    assert list(ds._lengths("tokens")) == [min(len(r), 12) for r in rows]
    loader = stoker.DataLoader(ds, batch_size=stoker.Budget(tokens=24), output="numpy")
    assert sorted(int(y) for b in loader for y in b["y"]) == list(range(8))


def test_diagnose_reports_the_padding_and_the_cost_spread(corpus):
    path, _ = corpus
    loader = stoker.DataLoader(documents(path), batch_size=stoker.Budget(tokens=BUDGET),
                               shuffle=True, rank=0, world_size=2)
    report = stoker.diagnose(loader, max_batches=5, seconds=10)
    assert report["budget"]["padding_fraction"] < 0.1
    assert any("padding" in r and "cost of a step" in r for r in report.reasons)
