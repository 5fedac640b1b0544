"""stoker.DataLoader in torch.distributed.checkpoint (DCP), as torchtitan checkpoints its
dataloader: the loader is a DCP ``Stateful`` (``state_dict`` / ``load_state_dict``) put in the
state dict given to ``dcp.save`` and ``dcp.load``.

1. One process: every kind of leaf a Stoker state holds (ints, str, bool, None, a list of pairs
   for class weights, nested dicts for a Mixture) goes through DCP (each leaf is stored as a
   pickled "bytes" item) and comes back equal; the loaded loader continues with the same
   batches.
2. 2 ranks (torchrun, gloo) train 3 steps of a shuffled epoch and ``dcp.save`` the loader under
   one key (``{"dataloader": loader}``): DCP writes one copy of each leaf (the state is the job's
   position, the same on every rank; its "rank" leaf is kept from whichever rank DCP picks, and
   ``load_state_dict`` does not read it). 3 ranks
   ``dcp.load`` it and finish the epoch: with what the 2 ranks had delivered, every sample is
   seen, and only the padding of the 3-rank split (the first samples of the epoch's order,
   fewer than 3) twice (stoker/_state.py: elastic resume).
3. torchtitan's pattern (``ParallelAwareDataloader``: the state under ``f"dp_rank_{r}"`` and
   "world_size") saved by the same 2 ranks cannot be loaded by 3: DCP's default load planner
   raises on every rank for the key "dp_rank_2" the checkpoint lacks (and torchtitan's own
   ``load_state_dict`` asserts the same data-parallel degree after it).

Bounded: every run has a deadline and is killed with what it started at the end.
"""

import collections
import json
import pickle
import textwrap
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import stoker  # noqa: E402
from stoker import _native  # noqa: E402
from trainer_launch import DIE_WITH_PARENT, Launches, torchrun  # noqa: E402

N, BATCH, SEED, STEPS = 50, 4, 11, 3
DEADLINE_S = 120  # a torchrun phase: its workers importing torch on 2 cores, the epoch


def make_loader():
    return stoker.DataLoader(stoker.ArrayDataset(np.arange(N)), batch_size=BATCH, shuffle=True,
                             seed=SEED, num_workers=1, output="numpy")


class TitanStyle:
    """torchtitan's ParallelAwareDataloader state around a loader
    (torchtitan/components/dataloader.py): the state pickled under this rank's key, and the
    data-parallel degree."""

    def __init__(self, loader, dp_rank, dp_world_size):
        self.loader, self.dp_world_size = loader, dp_world_size
        self.rank_id = f"dp_rank_{dp_rank}"

    def state_dict(self):
        return {self.rank_id: pickle.dumps(self.loader.state_dict()),
                "world_size": self.dp_world_size}

    def load_state_dict(self, state):
        if not state or self.rank_id not in state:
            return
        assert self.dp_world_size == state["world_size"], (
            "dp_degree is inconsistent before and after checkpoint, dataloader resharding is "
            "not supported yet.")
        self.loader.load_state_dict(pickle.loads(state[self.rank_id]))


# ---- one process: the leaves ------------------------------------------------------------------

class _Ids(torch.utils.data.Dataset):
    """A Python dataset with a state of its own (torchdata's contract)."""

    def __init__(self):
        self.level = 0

    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.tensor(i)

    def state_dict(self):
        return {"level": self.level}

    def load_state_dict(self, state):
        self.level = state["level"]


def _python_loader(workers):
    """A Python dataset with its own state and torchdata's stateful RandomSampler, whose state
    holds its generator's (a tensor: DCP stores it as bytes too)."""
    from torchdata.stateful_dataloader.sampler import RandomSampler
    data = _Ids()
    data.level = 7
    sampler = RandomSampler(data, generator=torch.Generator().manual_seed(SEED))
    return lambda: stoker.DataLoader(data, batch_size=BATCH, sampler=sampler,
                                     num_workers=workers)

def _weighted_loader():
    labels = np.arange(N) % 3
    return stoker.DataLoader(stoker.ArrayDataset(np.arange(N), labels), batch_size=BATCH,
                             shuffle=True, seed=SEED, class_weights={0: 1.0, 1: 2.0, 2: 0.5},
                             num_workers=1, output="numpy")


def _mixture_loader():
    mixture = stoker.Mixture({"a": stoker.ArrayDataset(np.arange(30)),
                              "b": stoker.ArrayDataset(np.arange(30, N))},
                             weights={"a": 0.7, "b": 0.3})
    return stoker.DataLoader(mixture, batch_size=BATCH, shuffle=True, seed=SEED, num_workers=1,
                             output="numpy")


def _ids(batch):
    return (batch[0] if isinstance(batch, tuple) else batch).tolist()


@pytest.mark.parametrize("make", [make_loader, _weighted_loader, _mixture_loader, "python0",
                                  "python2"],
                         ids=["plain", "class-weights", "mixture", "python0", "python2"])
def test_every_leaf_of_a_state_goes_through_dcp(make, tmp_path):
    if isinstance(make, str):
        make = _python_loader(int(make[-1]))
    loader = make()
    it = iter(loader)
    for _ in range(STEPS):
        next(it)
    state = loader.state_dict()
    with warnings.catch_warnings():  # no process group: DCP says it saves in one process
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"dataloader": loader}, checkpoint_id=str(tmp_path))
        rest = [_ids(b) for b in it]
        del it
        again = make()
        dcp.load({"dataloader": again}, checkpoint_id=str(tmp_path))
    assert str(again.state_dict()) == str(state)  # a sampler's state holds a tensor
    assert [_ids(b) for b in again] == rest
    stored = dcp.FileSystemReader(str(tmp_path)).read_metadata().state_dict_metadata
    kinds = {"BytesStorageMetadata"}  # a torch sampler's generator state: a tensor item
    if isinstance(again.dataset, _Ids):
        kinds.add("TensorStorageMetadata")
    assert {type(m).__name__ for m in stored.values()} == kinds
    assert "dataloader.epoch" in stored and "dataloader.class_weights" in stored
    if isinstance(again.dataset, _Ids):  # torchdata's contract: the dataset's state too
        assert "dataloader.dataset_state.level" in stored


# ---- 2 ranks save, 3 ranks load ----------------------------------------------------------------

WORKER = DIE_WITH_PARENT + textwrap.dedent("""
    import datetime, json, os, sys
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import test_integration_dcp as t  # tests/python is on PYTHONPATH

    out, phase = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    model = torch.nn.Linear(4, 1)
    loader = t.make_loader()  # its ranks: the process group's

    def step(samples):  # a training step: every rank takes part
        total = torch.tensor([len(samples)])
        dist.all_reduce(total)
        return samples.tolist()

    record = {}
    if phase == "save":
        it = iter(loader)
        record["batches"] = [step(next(it)) for _ in range(t.STEPS)]
        record["state"] = loader.state_dict()
        dcp.save({"model": model.state_dict(), "dataloader": loader,
                  "titan": t.TitanStyle(loader, rank, world)}, checkpoint_id=out + "/ckpt")
        del it
    else:
        dcp.load({"model": model.state_dict(), "dataloader": loader},
                 checkpoint_id=out + "/ckpt")
        record["pending"] = loader.state_dict()
        record["batches"] = [step(b) for b in loader]
        titan = t.TitanStyle(t.make_loader(), rank, world)
        try:
            dcp.load({"titan": titan}, checkpoint_id=out + "/ckpt")
            record["titan"] = "loaded"
        except dcp.api.CheckpointException as e:  # a BaseException, not an Exception
            record["titan"] = f"{type(e).__name__}: {e}"
    with open(f"{out}/{phase}-rank{rank}.json", "w") as f:
        json.dump(record, f)
    dist.destroy_process_group()
    # Leave without finalizing: a gloo thread freeing the last collective's tensors during
    # finalization aborts the process (see test_ranks' worker).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
""")


@pytest.fixture
def launches(tmp_path):
    runs = Launches(tmp_path)
    yield runs
    runs.kill_all()


def test_two_ranks_save_three_ranks_load_and_finish_the_epoch(launches, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    launches.run("save", torchrun(2) + [str(script), str(tmp_path), "save"], DEADLINE_S)
    saved = [json.loads((tmp_path / f"save-rank{r}.json").read_text()) for r in range(2)]
    kept = [i for r in saved for b in r["batches"] for i in b]
    assert len(kept) == len(set(kept)) == 2 * STEPS * BATCH
    assert {**saved[0]["state"], "rank": 1} == saved[1]["state"]  # the job's position

    launches.run("load", torchrun(3) + [str(script), str(tmp_path), "load"], DEADLINE_S)
    loaded = [json.loads((tmp_path / f"load-rank{r}.json").read_text()) for r in range(3)]
    for rank, r in enumerate(loaded):  # the 3 ranks go on from where the 2 stopped together
        assert (r["pending"]["world_size"], r["pending"]["rank"]) == (3, rank)
        assert (r["pending"]["epoch"], r["pending"]["batch"], r["pending"]["start"]) == \
            (0, 0, len(kept))
    assert len({len(r["batches"]) for r in loaded}) == 1  # equal batch counts
    counts = collections.Counter(kept + [i for r in loaded for b in r["batches"] for i in b])
    assert set(counts) == set(range(N)), "a sample was lost"
    order = _native.engine.BatchPlan(N, N, False, 0, 1).indices(True, SEED, 0, 0)
    left = N - len(kept)
    pad = -(-left // 3) * 3 - left
    assert 0 < pad < 3
    assert counts == collections.Counter(order) + collections.Counter(order[:pad])

    # torchtitan's per-rank keys: rank 2's key is not in a checkpoint of 2 ranks.
    for r in loaded:
        assert r["titan"].startswith("CheckpointException"), r["titan"]
        assert "Missing key in checkpoint state_dict: titan.dp_rank_2" in r["titan"]
