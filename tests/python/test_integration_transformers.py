"""stoker.integrations.transformers: the real ``transformers.Trainer`` on the CPU, reading through
``stoker.DataLoader``.

The model records the sample ids of every batch it is called with (training and evaluation
apart), so each test checks exactly which samples came at each step: every sample once an epoch,
and a run resumed from a checkpoint by a new Trainer sees the same batches after it as the
uninterrupted run, ends with the same weights and logs the same steps, epochs and losses. Trainer's
own data skipping (accelerate's skip_first_batches) is made to fail: it must never be reached.
"""

import json
import os

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import stoker  # noqa: E402
from stoker.integrations.transformers import (  # noqa: E402
    STATE_FILE, StokerTrainer, StokerTrainerMixin)

BATCH = 4


class IdModel(torch.nn.Module):
    """A linear regression that records the ``idx`` of every batch it sees."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.seen, self.seen_eval = [], []

    def forward(self, idx, x, labels=None):
        (self.seen if self.training else self.seen_eval).append(idx.tolist())
        pred = self.lin(x.float()).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(pred, labels.float()), "pred": pred}


def arrays(n):
    rng = np.random.default_rng(n)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32) + 0.1).astype(np.float32)
    return np.arange(n), x, y


class PyDataset(torch.utils.data.Dataset):
    """A Python map-style dataset of dict samples (read in worker processes)."""

    def __init__(self, n):
        self.idx, self.x, self.y = arrays(n)

    def __len__(self):
        return len(self.idx)

    def __getitem__(self, i):
        return {"idx": int(self.idx[i]), "x": torch.from_numpy(self.x[i]),
                "labels": float(self.y[i])}


def make_dataset(kind, n):
    if kind == "native":
        return stoker.ArrayDataset(*arrays(n), names=["idx", "x", "labels"])
    if kind == "python":
        return PyDataset(n)
    datasets = pytest.importorskip("datasets")
    idx, x, y = arrays(n)
    # "extra" is no argument of the model: Trainer's column removal must drop it
    return datasets.Dataset.from_dict({"idx": idx, "x": x.tolist(), "labels": y,
                                       "extra": np.zeros(n, np.int64)})


class _SeenAtSave(transformers.TrainerCallback):
    """Records, at each checkpoint, how many training batches the model had seen."""

    def __init__(self, model, record):
        self.model, self.record = model, record

    def on_save(self, args, state, control, **kwargs):
        self.record[state.global_step] = len(self.model.seen)


class Run:
    def __init__(self, trainer, model, seen_at_save):
        self.trainer, self.model, self.seen_at_save = trainer, model, seen_at_save
        self.seen = model.seen

    def logged(self, after=0):
        """(step, epoch, loss) of every logged training step after ``after``."""
        return [(e["step"], e["epoch"], e["loss"]) for e in self.trainer.state.log_history
                if "loss" in e and e["step"] > after]

    def weights(self):
        return [p.detach().clone() for p in self.model.parameters()]


def train(out, dataset, resume=None, trainer_class=StokerTrainer, eval_dataset=None, **args):
    torch.manual_seed(0)
    model = IdModel()
    options = dict(output_dir=str(out), report_to="none", use_cpu=True, save_strategy="steps",
                   save_steps=4, per_device_train_batch_size=BATCH, per_device_eval_batch_size=8,
                   num_train_epochs=2, learning_rate=0.02, logging_steps=1, disable_tqdm=True,
                   seed=7)
    options.update(args)
    trainer = trainer_class(model=model, args=transformers.TrainingArguments(**options),
                            train_dataset=dataset, eval_dataset=eval_dataset)
    seen_at_save = {}
    trainer.add_callback(_SeenAtSave(model, seen_at_save))
    trainer.train(resume_from_checkpoint=resume)
    return Run(trainer, model, seen_at_save)


@pytest.fixture(autouse=True)
def no_trainer_skipping(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("Trainer skipped batches with accelerate's skip_first_batches")
    monkeypatch.setattr(transformers.trainer, "skip_first_batches", refuse)


def epochs_of(seen, batches_per_epoch):
    return [seen[i:i + batches_per_epoch] for i in range(0, len(seen), batches_per_epoch)]


def assert_every_sample_once_an_epoch(seen, n, epochs):
    per_epoch = epochs_of(seen, -(-n // BATCH))
    assert len(per_epoch) == epochs
    orders = [[i for b in epoch for i in b] for epoch in per_epoch]
    for order in orders:
        assert sorted(order) == list(range(n))
    assert orders[0] != orders[1]  # shuffled anew every epoch
    assert all(len(b) == BATCH for epoch in per_epoch for b in epoch[:-1])


def assert_resumes_exactly(tmp_path, full, dataset, checkpoints, **args):
    for step in checkpoints:
        resumed = train(tmp_path / f"resumed-{step}", dataset,
                        resume=str(tmp_path / "full" / f"checkpoint-{step}"), **args)
        assert resumed.seen == full.seen[full.seen_at_save[step]:], step
        assert resumed.logged(after=step) == full.logged(after=step)
        for a, b in zip(resumed.weights(), full.weights()):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


# (dataset kind, samples, gradient accumulation, dataloader_num_workers, checkpoints resumed):
# 48 samples are 12 batches an epoch; 44 are 11, which with accumulation 2 leaves an optimizer
# step of one batch at each epoch's end. Checkpoints every 4 (2 with accumulation) steps: in
# the middle of epoch 0, at its end (12; 6 with accumulation) and in epoch 1.
CASES = {
    "native": ("native", 48, 1, 0, (8, 12, 20)),
    "native-accumulate": ("native", 44, 2, 0, (4, 6, 8)),
    "python-auto-workers": ("python", 48, 1, 0, (8, 20)),
    "python-2-workers": ("python", 48, 1, 2, (8,)),
    "hf-datasets-accumulate": ("hf", 44, 2, 0, (4,)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_sample_once_an_epoch_and_resume_is_exact(tmp_path, case):
    kind, n, accumulate, workers, checkpoints = CASES[case]
    dataset = make_dataset(kind, n)
    args = dict(gradient_accumulation_steps=accumulate, dataloader_num_workers=workers,
                save_steps=4 // accumulate)
    full = train(tmp_path / "full", dataset, **args)
    assert_every_sample_once_an_epoch(full.seen, n, epochs=2)
    steps_per_epoch = -(-(-(-n // BATCH)) // accumulate)
    assert full.trainer.state.global_step == 2 * steps_per_epoch
    with open(tmp_path / "full" / f"checkpoint-{checkpoints[0]}" / STATE_FILE) as f:
        state = json.load(f)
    assert (state["epoch"], state["batch"]) == (0, checkpoints[0] * accumulate)
    assert_resumes_exactly(tmp_path, full, dataset, checkpoints, **args)


def test_evaluation_during_training_does_not_move_the_training_data(tmp_path):
    dataset, evaluation = make_dataset("native", 48), make_dataset("native", 20)
    args = dict(eval_strategy="steps", eval_steps=5)
    full = train(tmp_path / "full", dataset, eval_dataset=evaluation, **args)
    assert_every_sample_once_an_epoch(full.seen, 48, epochs=2)
    # 24 steps: evaluated at steps 5, 10, 15, 20 and the last, each time the 20 samples in
    # order, in batches of 8
    one_pass = [list(range(0, 8)), list(range(8, 16)), list(range(16, 20))]
    assert full.model.seen_eval == one_pass * 5
    assert_resumes_exactly(tmp_path, full, dataset, (8,), eval_dataset=evaluation, **args)


@pytest.mark.parametrize("kind", ["native", "python"])
def test_evaluate_and_predict(tmp_path, kind):
    torch.manual_seed(0)
    model = IdModel()
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none",
                                          use_cpu=True, per_device_eval_batch_size=8)
    trainer = StokerTrainer(model=model, args=args, eval_dataset=make_dataset(kind, 20))
    metrics = trainer.evaluate()
    assert model.seen_eval == [list(range(0, 8)), list(range(8, 16)), list(range(16, 20))]
    _, x, y = arrays(20)
    with torch.no_grad():
        pred = model.lin(torch.from_numpy(x)).squeeze(-1)
    target = torch.from_numpy(y)
    # Trainer weighs every batch as a full one (the loss repeated eval_batch_size times)
    expected = np.mean([torch.nn.functional.mse_loss(pred[i:i + 8], target[i:i + 8]).item()
                        for i in range(0, 20, 8)])
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-5)
    out = trainer.predict(make_dataset(kind, 12))
    with torch.no_grad():
        pred = model.lin(torch.from_numpy(arrays(12)[1])).squeeze(-1)
    np.testing.assert_allclose(out.predictions, pred.numpy(), rtol=1e-6)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_max_steps_ending_mid_epoch(tmp_path, accumulate):
    dataset = make_dataset("native", 48)
    args = dict(gradient_accumulation_steps=accumulate, save_steps=3)
    short = train(tmp_path / "full", dataset, max_steps=9, **args)
    assert len(short.seen) == 9 * accumulate  # stopped inside an epoch (of 12 batches)
    with open(tmp_path / "full" / "checkpoint-9" / STATE_FILE) as f:
        state = json.load(f)
    assert (state["epoch"], state["batch"]) == divmod(9 * accumulate, 12)
    assert_resumes_exactly(tmp_path, short, dataset, (6,), max_steps=9, **args)
    # The run goes on with a longer budget from where max_steps stopped it: the batches of an
    # uninterrupted run with that budget (not the weights: the learning-rate schedule differs).
    longer = train(tmp_path / "longer", dataset, max_steps=20, **args)
    more = train(tmp_path / "more", dataset, max_steps=20,
                 resume=str(tmp_path / "full" / "checkpoint-9"), **args)
    assert more.seen == longer.seen[9 * accumulate:]
    assert more.trainer.state.global_step == 20


def test_the_loaders_state_is_authoritative(tmp_path):
    """A state saved by 2 ranks, resumed by 1 (elastic): the checkpoint's global step says
    batch 3 of epoch 0, but the two ranks had delivered 3 batches each, 24 samples together.
    The resumed run sees exactly the rest of the epoch's order from sample 24, then the next
    epochs whole, and Trainer's loop follows: 6 + 12 + 12 more steps."""
    dataset = make_dataset("native", 48)
    full = train(tmp_path / "full", dataset, num_train_epochs=3, save_steps=3)
    path = tmp_path / "full" / "checkpoint-3" / STATE_FILE
    state = json.loads(path.read_text())
    assert (state["epoch"], state["batch"], state["world_size"]) == (0, 3, 1)
    state["world_size"] = 2
    path.write_text(json.dumps(state))
    resumed = train(tmp_path / "resumed", dataset, num_train_epochs=3, save_steps=3,
                    resume=str(tmp_path / "full" / "checkpoint-3"))
    assert resumed.seen == full.seen[6:]
    assert resumed.trainer.state.global_step == 3 + 6 + 12 + 12
    # state.epoch counts the batches before the resume: half of epoch 0 had been read
    assert resumed.logged(after=3)[0][:2] == (4, 7 / 12)


def test_ignore_data_skip_starts_the_epoch_over(tmp_path):
    dataset = make_dataset("native", 48)
    full = train(tmp_path / "full", dataset)
    resumed = train(tmp_path / "resumed", dataset, ignore_data_skip=True,
                    resume=str(tmp_path / "full" / "checkpoint-16"))
    assert resumed.seen == full.seen[12:20]  # epoch 1 from its start, up to the 24 steps


def test_a_checkpoint_without_the_loaders_state_raises(tmp_path):
    dataset = make_dataset("native", 48)
    train(tmp_path / "full", dataset, max_steps=4)
    os.remove(tmp_path / "full" / "checkpoint-4" / STATE_FILE)
    with pytest.raises(FileNotFoundError, match="ignore_data_skip=True"):
        train(tmp_path / "resumed", dataset, resume=str(tmp_path / "full" / "checkpoint-4"))


def test_arrays_without_names_raise(tmp_path):
    _, x, y = arrays(16)
    with pytest.raises(ValueError, match="names="):
        train(tmp_path, stoker.ArrayDataset(x, y))


class _CountingTrainer(transformers.Trainer):
    """A Trainer subclass of the user's (as TRL's SFTTrainer is one)."""

    steps = 0

    def training_step(self, *args, **kwargs):
        type(self).steps += 1
        return super().training_step(*args, **kwargs)


class _MyTrainer(StokerTrainerMixin, _CountingTrainer):
    pass


def test_the_mixin_on_a_trainer_subclass(tmp_path):
    dataset = make_dataset("native", 48)
    run = train(tmp_path, dataset, trainer_class=_MyTrainer, max_steps=5)
    assert _MyTrainer.steps == 5
    assert isinstance(run.trainer.get_train_dataloader(), stoker.DataLoader)

    with pytest.raises(TypeError, match="goes before"):
        class Backwards(_CountingTrainer, StokerTrainerMixin):  # would change nothing
            pass


def tiny_llama():
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


@pytest.mark.parametrize("pack", ["concat", "document"])
def test_token_dataset_labels_are_not_shifted_twice(tmp_path, pack):
    """A TokenDataset's labels are the next tokens; a causal LM's loss must use them as they
    are (shift_labels), not shift them once more."""
    tokens = np.random.default_rng(0).integers(1, 64, 600).astype(np.uint16)
    tokens[::37] = 0  # documents end with eos 0
    tokens.tofile(tmp_path / "tokens.bin")
    dataset = stoker.TokenDataset(str(tmp_path / "tokens.bin"), seq_len=16, pack=pack,
                                  eos=None if pack == "concat" else 0)
    model = tiny_llama()
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none",
                                          use_cpu=True, per_device_train_batch_size=4,
                                          max_steps=2, save_strategy="no", disable_tqdm=True)
    trainer = StokerTrainer(model=model, args=args, train_dataset=dataset)
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["shift_labels"] is batch["labels"]
    expected_keys = {"input_ids", "labels", "shift_labels"}
    if pack == "document":  # cu_seqlens and max_seqlen are not arguments of the model
        expected_keys |= {"position_ids", "use_cache"}
        assert batch["use_cache"] is False  # transformers masks packs apart without a cache
    assert set(batch) == expected_keys
    with torch.no_grad():
        out = model(**batch)
    targets = batch["labels"]
    expected = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 64).float(),
                                                 targets.reshape(-1).long(), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)
    trainer.train()
    assert trainer.state.global_step == 2


DISTRIBUTED = """
import json, os, sys
from test_integration_transformers import make_dataset, train
out, resume = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None
run = train(out, make_dataset("native", 48), resume=resume)
with open(os.path.join(out, f"seen-{os.environ.get('RANK', 0)}.json"), "w") as f:
    json.dump({"seen": run.seen, "at_save": run.seen_at_save}, f)
# A gloo thread of torch can free a finished all_gather (Trainer's loss logging) while Python
# finalizes, which aborts the process (std::terminate in ProcessGroupGloo::runLoop, about one
# run in eight here): leave without finalizing.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""


@pytest.mark.slow
def test_two_processes_then_one(tmp_path):
    """torchrun, 2 processes on gloo: each epoch's samples are split between the ranks, every
    one once; resumed by 2 processes, each rank sees what it saw after the checkpoint; resumed by
    1 process (elastic), it reads exactly the samples the 2 ranks had not read of that epoch."""
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text(DISTRIBUTED)

    def job(out, processes, resume=None):
        command = [sys.executable, str(script), str(out)] + ([resume] if resume else [])
        if processes > 1:
            command[1:1] = ["-m", "torch.distributed.run", "--standalone",
                            f"--nproc_per_node={processes}"]
        # TMPDIR: torchelastic's per-run directories land in the test's own folder (the agent
        # leaves them behind when its workers end with os._exit).
        (tmp_path / "tmp").mkdir(exist_ok=True)
        subprocess.run(command, check=True, timeout=240, cwd=tmp_path,
                       env={**os.environ, "OMP_NUM_THREADS": "1",
                            "TMPDIR": str(tmp_path / "tmp")})
        runs = []
        for rank in range(processes):
            with open(out / f"seen-{rank}.json") as f:
                runs.append(json.load(f))
        return runs

    full = job(tmp_path / "full", 2)  # 24 samples a rank an epoch: 6 batches, 12 steps
    for epoch in range(2):
        read = [i for run in full for b in run["seen"][6 * epoch:6 * epoch + 6] for i in b]
        assert sorted(read) == list(range(48))
    checkpoint = str(tmp_path / "full" / "checkpoint-4")  # epoch 0, 4 batches a rank
    again = job(tmp_path / "again", 2, resume=checkpoint)
    assert [run["seen"] for run in again] == [run["seen"][4:] for run in full]
    alone = job(tmp_path / "alone", 1, resume=checkpoint)[0]["seen"]
    before = [i for run in full for b in run["seen"][:4] for i in b]
    after = [i for b in alone[:4] for i in b]  # 16 samples left: 4 batches
    assert sorted(before + after) == list(range(48))
    assert len(alone) == 4 + 12  # then epoch 1 whole, alone
    assert sorted(i for b in alone[4:] for i in b) == list(range(48))
