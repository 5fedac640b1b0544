"""The rank that cannot be wrong (stoker/_ranks.py): resolved when an iteration starts, from a
process group made after the loader, a DeviceMesh, or RANK/WORLD_SIZE; never a silent rank 0; and
the first iteration under a process group checks that every rank agrees on the data."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import stoker

N, BATCH = 40, 4


def ids(loader):
    return [int(i) for b in loader for i in np.asarray(b)]


def test_world_size_without_a_rank_raises_at_the_first_batch_naming_the_fix(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")  # Lightning's launcher sets it, not RANK
    loader = stoker.DataLoader(stoker.ArrayDataset(np.arange(N)), batch_size=BATCH,
                               output="numpy")
    assert len(loader) == N // BATCH // 2  # len() before the group exists: rank 0's share
    it = iter(loader)  # starts nothing
    with pytest.raises(ValueError, match=r"WORLD_SIZE=2 but this process's rank is unknown.*"
                                         r"init_process_group.*rank="):
        next(it)
    monkeypatch.setenv("RANK", "1")  # resolved again at the next iteration
    assert ids(loader) == list(range(1, N, 2))


def test_explicit_world_size_without_rank_raises_too():
    loader = stoker.DataLoader(list(range(N)), batch_size=BATCH, world_size=2, num_workers=0)
    with pytest.raises(ValueError, match=r"world_size=2 but this process's rank is unknown"):
        next(iter(loader))
    assert ids(stoker.DataLoader(list(range(N)), batch_size=BATCH, rank=1, world_size=2,
                                 num_workers=0)) == list(range(1, N, 2))


@pytest.mark.parametrize("bad, message", [
    (dict(rank=2, world_size=2), r"rank must be an integer in \[0, 2\)"),
    (dict(rank=0, world_size=0), "world_size must be a positive integer"),
    (dict(rank="0"), "rank must be an integer, a torch.distributed process group"),
])
def test_bad_ranks_are_named_when_the_loader_is_made(bad, message):
    with pytest.raises(ValueError, match=message):
        stoker.DataLoader(stoker.ArrayDataset(np.arange(N)), batch_size=BATCH, **bad)


def test_rank_from_the_environment_is_read_when_an_iteration_starts(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    loader = stoker.DataLoader(stoker.ArrayDataset(np.arange(N)), batch_size=BATCH,
                               output="numpy")
    assert (loader.rank, loader.world_size) == (0, 1)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert ids(loader) == list(range(2, N, 4))
    assert (loader.rank, loader.world_size) == (2, 4)


# Two processes, gloo over loopback. Each makes its loaders before the process group exists,
# with WORLD_SIZE set and no RANK (as under Lightning's launcher), then joins the group.
WORKER = textwrap.dedent("""
    import datetime, json, os, sys
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    import stoker

    rank, port, out, n, batch = int(sys.argv[1]), sys.argv[2], sys.argv[3], *map(int, sys.argv[4:])
    os.environ.pop("RANK", None)
    os.environ["WORLD_SIZE"] = "2"
    report = {}

    class Items(torch.utils.data.Dataset):  # a Python dataset
        def __len__(self):
            return n
        def __getitem__(self, i):
            return i

    native = stoker.DataLoader(stoker.ArrayDataset(np.arange(n)), batch_size=batch,
                               shuffle=True, seed=3, output="numpy")
    python = stoker.DataLoader(Items(), batch_size=batch, shuffle=True, seed=3, num_workers=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=60))
    report["native"] = [int(i) for b in native for i in np.asarray(b)]
    report["python"] = [int(i) for b in python for i in b.tolist()]
    # A DeviceMesh: 1-D, and (mesh, "dp") of a 2 x 1 mesh (dp x tp).
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    report["mesh"] = [int(i) for b in stoker.DataLoader(
        stoker.ArrayDataset(np.arange(n)), batch_size=batch, rank=mesh, output="numpy")
        for i in np.asarray(b)]
    mesh2 = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))
    report["mesh_dp"] = [int(i) for b in stoker.DataLoader(
        stoker.ArrayDataset(np.arange(n)), batch_size=batch, rank=(mesh2, "dp"),
        output="numpy") for i in np.asarray(b)]
    report["group"] = [int(i) for b in stoker.DataLoader(
        stoker.ArrayDataset(np.arange(n)), batch_size=batch, rank=dist.group.WORLD,
        output="numpy") for i in np.asarray(b)]
    # The ranks disagree: rank 1 has another seed. Both raise, naming rank 1.
    try:
        next(iter(stoker.DataLoader(stoker.ArrayDataset(np.arange(n)), batch_size=batch,
                                    shuffle=True, seed=rank, output="numpy")))
        report["disagree"] = None
    except ValueError as e:
        report["disagree"] = str(e)
    # And on the epoch: rank 0 starts epoch 1, rank 1 epoch 0.
    loader = stoker.DataLoader(stoker.ArrayDataset(np.arange(n)), batch_size=batch,
                               output="numpy")
    loader.set_epoch(1 - rank)
    try:
        next(iter(loader))
        report["epoch"] = None
    except ValueError as e:
        report["epoch"] = str(e)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()
    # A gloo thread frees the last all_gather's tensors after the collective returns, and takes
    # the GIL to do it: when that falls in the interpreter's finalization, the process aborts
    # (std::terminate in ProcessGroupGloo::runLoop; pytorch/pytorch#179291; a third of the runs
    # here). Leave without finalizing, as test_integration_transformers' workers do.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
""")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    script = out / "worker.py"
    script.write_text(WORKER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # gloo on the loopback interface, as the other launchers of the tests (trainer_launch.py,
    # test_torchrun.py): by default it takes the interface of the machine's hostname, which need
    # not connect to itself (a CI machine's).
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(port), str(out),
                               str(N), str(BATCH)], env=env) for r in range(2)]
    try:
        for p in procs:
            assert p.wait(timeout=180) == 0
    finally:
        for p in procs:
            p.kill()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("name", ["native", "python", "mesh", "mesh_dp", "group"])
def test_a_process_group_made_after_the_loader_splits_the_epoch(two_ranks, name):
    a, b = two_ranks[0][name], two_ranks[1][name]
    assert len(a) == len(b) == N // 2
    assert sorted(a + b) == list(range(N))


def test_ranks_that_disagree_raise_on_every_rank_naming_the_one_that_differs(two_ranks):
    for report in two_ranks:
        assert "rank 1 has seed (low 32 bits) 1, rank 0 has 0" in report["disagree"]
        assert "do not agree on the data" in report["disagree"]
        assert "rank 1 has epoch 0, rank 0 has 1" in report["epoch"]
