"""stoker.DataLoader inside Lightning 2.6, with no Stoker-specific code in the training program:
a LightningDataModule whose ``train_dataloader()`` returns a ``stoker.DataLoader``, a
LightningModule that records the sample ids of every batch (one JSON line a batch, a file per
rank), and Lightning's own Trainer, checkpoints and launcher.

1. One process, 3 epochs: every sample once an epoch, and Lightning's epoch k is Stoker's epoch k
   (the batches of a plain loop after ``set_epoch(k)``): Lightning's ``iter()`` before the epoch
   and its ``sampler.set_epoch`` are no extra epoch; with ``reload_dataloaders_every_n_epochs=1``
   (a new loader every epoch) too.
2. Checkpoints (``ModelCheckpoint(every_n_train_steps=5)``, 10 batches an epoch) mid-epoch and at
   an epoch's end: a new Trainer's ``fit(ckpt_path=...)`` gives the uninterrupted run's batches
   from that checkpoint on (Lightning saves ``loader.state_dict()`` in the checkpoint and loads
   it before the first batch).
3. A validation loader beside it, run twice an epoch: every validation pass reads the whole set
   in order, and the training batches stay those of the plain loop.
4. DDP, 2 processes on CPU/gloo, started by Lightning's own launcher (the script re-run; no RANK
   in the environment, the ranks come from the process group): the two ranks' batches partition
   every epoch, each rank's are those of a plain loop with ``rank=r, world_size=2``, the
   validation set is split too; then 2 processes resume from a mid-epoch checkpoint, which
   holds rank 0's loader state only (the job's position, the same on every rank): each rank
   continues exactly.

Datasets: a native ``stoker.ArrayDataset`` and a Python map-style dataset read with num_workers 0
and 2. Every multi-process run has a deadline and is killed with its process group at the end.
"""

import json
import os
import sys
import textwrap
import warnings

import numpy as np
import pytest

pl = pytest.importorskip("lightning.pytorch")
torch = pytest.importorskip("torch")

import stoker  # noqa: E402
from trainer_launch import DIE_WITH_PARENT, Launches, free_port  # noqa: E402

N, VAL_N, BATCH, SEED = 40, 16, 4, 3  # 10 training batches an epoch in one process
EPOCHS = 3
EVERY = 5  # ModelCheckpoint(every_n_train_steps=EVERY): mid-epoch, then an epoch's end
DDP_EVERY = 3  # with 2 ranks an epoch has 5 steps
KINDS = ("native", "python0", "python2")
DEADLINE_S = 180  # a DDP run: 2 interpreters importing torch and Lightning on 2 cores, the fit


# ---- the training program (imported by the DDP script too) ------------------------------------

class IdDataset(torch.utils.data.Dataset):
    """A Python map-style dataset: sample i is (i, float(i))."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i, np.float32(i)


def make_loader(kind, n=N, shuffle=True, **kw):
    """The loader of ``kind``: "native" (ArrayDataset), "python0"/"python2" (IdDataset read
    with 0 or 2 worker processes). Batches are (ids, x)."""
    if kind == "native":
        dataset = stoker.ArrayDataset(np.arange(n), np.arange(n, dtype=np.float32),
                                      names=("id", "x"))
        workers = 2
    else:
        dataset, workers = IdDataset(n), int(kind[len("python"):])
    return stoker.DataLoader(dataset, batch_size=BATCH, shuffle=shuffle, seed=SEED,
                             num_workers=workers, **kw)


class IdModule(pl.LightningModule):
    """Records the ids of every batch it is given: {"stage", "epoch", "step", "ids"} a line,
    in ``{log}-rank{r}.jsonl``."""

    def __init__(self, log):
        super().__init__()
        self.log_path = log
        self.layer = torch.nn.Linear(1, 1)

    def _write(self, **record):
        with open(f"{self.log_path}-rank{self.global_rank}.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def _record(self, stage, ids):
        self._write(stage=stage, epoch=self.current_epoch, step=self.global_step,
                    ids=ids.tolist())

    def on_fit_start(self):  # where this process's rank could come from
        self._write(stage="env", RANK=os.environ.get("RANK"),
                    WORLD_SIZE=os.environ.get("WORLD_SIZE"))

    def training_step(self, batch, batch_idx):
        ids, x = batch
        self._record("train", ids)
        return self.layer(x[:, None]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        ids, x = batch
        self._record("sanity" if self.trainer.sanity_checking else "val", ids)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-6)


class IdData(pl.LightningDataModule):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def train_dataloader(self):
        return make_loader(self.kind)


class IdDataWithVal(IdData):
    def __init__(self, kind, val_kind):
        super().__init__(kind)
        self.val_kind = val_kind

    def val_dataloader(self):
        return make_loader(self.val_kind, VAL_N, shuffle=False)


def fit(log, kind, val_kind=None, epochs=EPOCHS, ckpt_dir=None, every=EVERY, ckpt_path=None,
        devices=1, val_check_interval=1.0, reload_every=0):
    """One ``Trainer.fit``: with ``ckpt_dir``, a checkpoint every ``every`` steps (named by
    step); with ``ckpt_path``, resumed from it."""
    callbacks = []
    if ckpt_dir:
        callbacks.append(pl.callbacks.ModelCheckpoint(
            dirpath=ckpt_dir, filename="{step}", every_n_train_steps=every, save_top_k=-1))
    trainer = pl.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
        max_epochs=epochs, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=bool(ckpt_dir), callbacks=callbacks,
        default_root_dir=os.path.dirname(log), val_check_interval=val_check_interval,
        reload_dataloaders_every_n_epochs=reload_every, log_every_n_steps=1)
    data = IdData(kind) if val_kind is None else IdDataWithVal(kind, val_kind)
    trainer.fit(IdModule(log), datamodule=data, ckpt_path=ckpt_path)


# ---- reading what ran -------------------------------------------------------------------------

def records(log, rank=0, stage="train"):
    """[(epoch, step, ids), ...] of one rank and stage, in the order they ran."""
    path = f"{log}-rank{rank}.jsonl"
    out = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r["stage"] == stage:
                out.append((r["epoch"], r["step"], r["ids"]))
    return out


def plain_epochs(kind, epochs=EPOCHS, **kw):
    """The batches' ids of each epoch of a plain loop: ``set_epoch(e)``, then iterate."""
    loader = make_loader(kind, **kw)
    out = []
    for e in range(epochs):
        loader.set_epoch(e)
        out.append([b[0].tolist() for b in loader])
    return out


def by_epoch(recs, epochs=EPOCHS):
    return [[ids for e, _, ids in recs if e == k] for k in range(epochs)]


def flat(batches):
    return [i for b in batches for i in b]


# ---- one process -------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=KINDS)
def full_run(request, tmp_path_factory):
    """An uninterrupted 3-epoch fit with a checkpoint every EVERY steps: (kind, log, ckpt_dir)."""
    tmp = tmp_path_factory.mktemp(f"lightning-{request.param}")
    log, ckpt = str(tmp / "full"), str(tmp / "ckpt")
    fit(log, request.param, ckpt_dir=ckpt)
    return request.param, log, ckpt


def test_lightning_epoch_k_is_stoker_epoch_k(full_run):
    kind, log, _ = full_run
    got = by_epoch(records(log))
    expected = plain_epochs(kind)
    for e in range(EPOCHS):
        assert sorted(flat(got[e])) == list(range(N)), f"epoch {e}: not every sample once"
    assert got == expected
    assert len({tuple(flat(b)) for b in got}) == EPOCHS  # a new order every epoch
    steps = [s for _, s, _ in records(log)]
    assert steps == list(range(EPOCHS * N // BATCH))


def test_a_new_loader_every_epoch_reads_that_epoch(tmp_path):
    # reload_dataloaders_every_n_epochs=1: train_dataloader() makes a new loader each epoch,
    # whose first iteration Lightning's sampler.set_epoch(k) makes epoch k.
    log = str(tmp_path / "reload")
    fit(log, "native", reload_every=1)
    assert by_epoch(records(log)) == plain_epochs("native")


@pytest.mark.parametrize("step", [EVERY, 2 * EVERY, 5 * EVERY], ids=["mid-epoch", "epoch-end",
                                                                      "mid-last-epoch"])
def test_fit_from_a_checkpoint_continues_the_same_batches(full_run, step, tmp_path):
    kind, log, ckpt = full_run
    path = os.path.join(ckpt, f"step={step}.ckpt")
    assert os.path.exists(path), sorted(os.listdir(ckpt))
    saved = torch.load(path, weights_only=False)["loops"]["fit_loop"]["state_dict"]
    per_epoch = N // BATCH
    assert saved["combined_loader"][0]["epoch"] * per_epoch + \
        saved["combined_loader"][0]["batch"] == step  # the loader's state at that step
    resumed = str(tmp_path / "resumed")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(resumed, kind, ckpt_path=path)
    assert records(resumed) == records(log)[step:]
    assert not [w for w in caught if "not resumable" in str(w.message)]  # Lightning saw a state


def test_validation_loader_beside_training(tmp_path):
    log = str(tmp_path / "val")
    # Python training batches from 2 worker processes; native validation batches, twice an
    # epoch (after batch 5 and 10), and Lightning's sanity check (2 batches) before training.
    fit(log, "python2", val_kind="native", epochs=2, val_check_interval=0.5)
    assert by_epoch(records(log), 2) == plain_epochs("python2", 2)
    val_order = list(range(VAL_N))  # shuffle=False
    sanity = records(log, stage="sanity")
    assert [ids for _, _, ids in sanity] == [val_order[:BATCH], val_order[BATCH:2 * BATCH]]
    val = records(log, stage="val")
    runs = {}
    for epoch, step, ids in val:
        runs.setdefault((epoch, step), []).extend(ids)
    assert sorted(runs) == [(0, 5), (0, 10), (1, 15), (1, 20)]
    assert all(ids == val_order for ids in runs.values())


# ---- DDP: two processes started by Lightning ---------------------------------------------------

SCRIPT = DIE_WITH_PARENT + textwrap.dedent("""
    import json, sys
    import torch.distributed as dist
    from test_integration_lightning import fit  # tests/python is on PYTHONPATH
    fit(**json.loads(sys.argv[1]))
    # Lightning leaves a gloo group to the interpreter's exit, where its threads can abort the
    # process (pytorch/pytorch#190489); a script that ends cleanly destroys it.
    if dist.is_initialized():
        dist.destroy_process_group()
""")


@pytest.fixture
def launches(tmp_path):
    runs = Launches(tmp_path)
    yield runs
    runs.kill_all()


def lightning_ddp(launches, name, **fit_args):
    """``fit(**fit_args)`` in a script that Lightning's DDP launcher re-runs for rank 1."""
    script = launches.tmp / "train.py"
    script.write_text(SCRIPT)
    launches.run(name, [sys.executable, str(script), json.dumps(fit_args)], DEADLINE_S,
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), PL_DISABLE_FORK="1")


def test_ddp_two_processes_partition_every_epoch_and_resume(launches, tmp_path):
    epochs = 2  # 5 batches a rank an epoch: checkpoints at steps 3 (mid-epoch 0), 6 and 9
    full, ckpt = str(tmp_path / "full"), str(tmp_path / "ckpt")
    lightning_ddp(launches, "full", log=full, kind="native", val_kind="python2",
                  epochs=epochs, ckpt_dir=ckpt, every=DDP_EVERY, devices=2)
    for r in (0, 1):  # Lightning's launcher sets WORLD_SIZE, no RANK: the process group has it
        with open(f"{full}-rank{r}.jsonl") as f:
            env = json.loads(f.readline())
        assert (env["stage"], env["RANK"], env["WORLD_SIZE"]) == ("env", None, "2")
    ranks = [records(full, r) for r in (0, 1)]
    for e in range(epochs):
        seen = [flat(ids for ep, _, ids in ranks[r] if ep == e) for r in (0, 1)]
        assert not set(seen[0]) & set(seen[1]), f"epoch {e}: the ranks overlap"
        assert sorted(seen[0] + seen[1]) == list(range(N)), f"epoch {e}: not every sample once"
    for r in (0, 1):  # each rank's share is a plain loop's with rank=r, world_size=2
        assert by_epoch(ranks[r], epochs) == plain_epochs("native", epochs, rank=r, world_size=2)
    for e in range(epochs):  # the validation set is split between the ranks, whole
        val = [flat(ids for ep, _, ids in records(full, r, "val") if ep == e) for r in (0, 1)]
        assert sorted(val[0] + val[1]) == list(range(VAL_N))

    # Two new processes resume from the checkpoint at step 3 (mid-epoch 0): each rank goes on
    # with exactly the batches it would have had.
    step = DDP_EVERY
    resumed = str(tmp_path / "resumed")
    lightning_ddp(launches, "resumed", log=resumed, kind="native", val_kind="python2",
                  epochs=epochs, devices=2, ckpt_path=os.path.join(ckpt, f"step={step}.ckpt"))
    for r in (0, 1):
        assert records(resumed, r) == ranks[r][step:]
