"""stoker.DataLoader in a plain Accelerate 1.x training loop (``Accelerator(cpu=True)``).

1. ``accelerator.prepare(model, optimizer, loader)`` hands the loader back unchanged (it is not a
   torch DataLoader, so Accelerate neither shards nor wraps it: Stoker resolves the ranks
   itself), and the loop's epochs are the plain loop's.
2. ``accelerator.register_for_checkpointing(loader)`` with ``save_state`` mid-epoch and
   ``load_state`` in a new Accelerator with a new loader: the same batches follow (every sample
   once an epoch, the same sequence), native and Python datasets.
3. ``accelerate.skip_first_batches(loader, n)`` and ``accelerator.prepare_data_loader(loader)``
   build a torch DataLoader from ``loader.batch_sampler``, which would give other batches: they
   raise TypeError naming ``load_state_dict`` at their first batch, and the loader is untouched.
4. torchrun, 2 ranks on CPU/gloo: the ranks' batches partition every epoch; a mid-epoch
   ``save_state`` (rank 0 writes the loader's state: the job's position) loaded by both ranks
   into new loaders gives each rank the batches it had after that step.
"""

import json
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
accelerate = pytest.importorskip("accelerate")

import stoker  # noqa: E402
from trainer_launch import DIE_WITH_PARENT, Launches, torchrun  # noqa: E402

N, BATCH, SEED, EPOCHS = 40, 4, 5, 2  # 10 batches an epoch
DEADLINE_S = 120  # torchrun: 2 workers importing torch and Accelerate on 2 cores, 2 epochs


class IdDataset(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return i, np.float32(i)


def make_loader(kind="native", num_workers=None, **kw):
    if num_workers is None:  # "python0", "python2": a Python dataset and its workers
        num_workers = int(kind[-1]) if kind.startswith("python") else 2
    if kind == "native":
        dataset = stoker.ArrayDataset(np.arange(N), np.arange(N, dtype=np.float32))
    else:
        dataset = IdDataset()
    return stoker.DataLoader(dataset, batch_size=BATCH, shuffle=True, seed=SEED,
                             num_workers=num_workers, **kw)


def plain_epochs(kind="native", **kw):
    loader = make_loader(kind, **kw)
    out = []
    for e in range(EPOCHS):
        loader.set_epoch(e)
        out.append([b[0].tolist() for b in loader])
    return out


def train(accelerator, loader, epochs, stop=None, save=None):
    """A plain Accelerate loop: ``set_epoch`` each epoch, a step a batch. Returns the ids of the
    batches of each epoch; calls ``save()`` after batch ``stop`` of epoch ``stop[0]``."""
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    assert prepared is loader
    out = []
    for epoch in epochs:
        prepared.set_epoch(epoch)
        seen = []
        for step, (ids, x) in enumerate(prepared, 1):
            loss = model(x[:, None]).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            seen.append(ids.tolist())
            if (epoch, step) == stop:
                save()
        out.append(seen)
    return out


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Accelerate keeps its state in process-wide singletons (as its own tests do, each test
    here starts and ends without them: another test's Accelerator may be configured otherwise)."""
    from accelerate.state import AcceleratorState, GradientState
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def test_prepare_passes_the_loader_through():
    accelerator = accelerate.Accelerator(cpu=True)
    got = train(accelerator, make_loader(), range(EPOCHS))
    assert got == plain_epochs()
    for epoch in got:
        assert sorted(i for b in epoch for i in b) == list(range(N))
    assert got[0] != got[1]


@pytest.mark.parametrize("kind", ["native", "python0", "python2"])
def test_save_state_and_load_state_resume_mid_epoch(kind, tmp_path):
    accelerator = accelerate.Accelerator(cpu=True)
    loader = make_loader(kind)
    accelerator.register_for_checkpointing(loader)
    stop = (1, 3)  # after batch 3 of epoch 1
    full = train(accelerator, loader, range(EPOCHS), stop=stop,
                 save=lambda: accelerator.save_state(str(tmp_path / "state")))
    assert full == plain_epochs(kind)

    accelerator = accelerate.Accelerator(cpu=True)  # a new run: new objects, the saved state
    loader = make_loader(kind)
    accelerator.register_for_checkpointing(loader)
    accelerator.load_state(str(tmp_path / "state"))
    resumed = train(accelerator, loader, range(stop[0], EPOCHS))
    assert resumed == [full[1][stop[1]:]]
    assert sorted(i for b in full[1][:stop[1]] + resumed[0] for i in b) == list(range(N))


def test_skip_first_batches_and_prepare_data_loader_raise(tmp_path):
    accelerator = accelerate.Accelerator(cpu=True)
    # num_workers=0: the torch DataLoader these build has the loader's num_workers, and torch's
    # worker iterator, failing in its constructor, then complains again when collected.
    loader = make_loader(num_workers=0)
    for rebuild in (lambda: accelerate.skip_first_batches(loader, 2),
                    lambda: accelerator.skip_first_batches(loader, 2),
                    lambda: accelerator.prepare_data_loader(loader)):
        with pytest.raises(TypeError, match=r"load_state_dict"):
            next(iter(rebuild()))
    assert [b[0].tolist() for b in loader] == plain_epochs(num_workers=0)[0]


# ---- torchrun, 2 ranks ------------------------------------------------------------------------

WORKER = DIE_WITH_PARENT + textwrap.dedent("""
    import json, sys
    import accelerate
    import test_integration_accelerate as t  # tests/python is on PYTHONPATH

    out = sys.argv[1]
    loader = t.make_loader()  # before the process group: its ranks resolve at iteration
    accelerator = accelerate.Accelerator(cpu=True)
    accelerator.register_for_checkpointing(loader)
    stop = (1, 2)  # 5 batches a rank an epoch
    full = t.train(accelerator, loader, range(t.EPOCHS), stop=stop,
                   save=lambda: accelerator.save_state(out + "/state"))
    accelerator.wait_for_everyone()
    again = accelerate.Accelerator(cpu=True)
    loader = t.make_loader()
    again.register_for_checkpointing(loader)
    again.load_state(out + "/state")
    resumed = t.train(again, loader, range(stop[0], t.EPOCHS))
    with open(f"{out}/rank{accelerator.process_index}.json", "w") as f:
        json.dump({"world": accelerator.num_processes, "full": full, "resumed": resumed,
                   "stop": stop}, f)
    # The process group must be gone before the interpreter exits: a gloo group that a DDP model
    # still holds runs its threads into interpreter finalization, where one can abort the
    # process ("terminate called without an active exception": a gloo work item releasing a
    # Python object, pytorch/pytorch#190489). The accelerators drop their DDP models first.
    accelerator.free_memory()
    again.free_memory()
    again.end_training()
""")


@pytest.fixture
def launches(tmp_path):
    runs = Launches(tmp_path)
    yield runs
    runs.kill_all()


def test_torchrun_two_ranks_partition_and_resume(launches, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    launches.run("torchrun", torchrun(2) + [str(script), str(tmp_path)], DEADLINE_S)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    for e in range(EPOCHS):
        seen = [[i for b in r["full"][e] for i in b] for r in ranks]
        assert not set(seen[0]) & set(seen[1]), f"epoch {e}: the ranks overlap"
        assert sorted(seen[0] + seen[1]) == list(range(N)), f"epoch {e}: not every sample once"
    for rank, r in enumerate(ranks):
        assert r["full"] == plain_epochs(rank=rank, world_size=2)
        epoch, step = r["stop"]
        assert r["resumed"] == [r["full"][epoch][step:]]
