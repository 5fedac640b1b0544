"""Multi-node torchrun on one machine: two torchrun "nodes" (c10d rendezvous on 127.0.0.1, gloo
over the loopback interface), each with its own process group, as two hosts would run them.

1. 2 nodes x 2 ranks run a whole epoch: every sample is seen exactly once across the 4 ranks.
2. The same job again, checkpointing the loader's state at a step; after one more step, one
   node's whole job is killed (SIGKILL to its process group), and the other node's ranks fail
   in their next collective (a barrier with a 5 s timeout).
3. A job of 3 ranks (a node of 2 and a node of 1) resumes the epoch from the checkpoint: with
   what the 4 ranks had delivered up to the checkpoint, every sample is seen, and only the
   padding of the 3-rank split (the first samples of the epoch's order, fewer than 3) twice.

Bounded: every wait has a deadline, and every process group started is killed at the end.
"""

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from stoker import _native

N, BATCH, SEED, CHECKPOINT_STEP = 96, 4, 7, 2
DEADLINE_S = 120  # a phase (start, rendezvous, import torch on 2 cores, the epoch)

WORKER = textwrap.dedent("""
    import ctypes, datetime, json, os, signal, sys, time
    # A node dies whole: torchelastic starts its workers in sessions of their own, so killing the
    # agent's process group would leave them running. They die with their agent instead.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        os._exit(1)  # the agent died before the line above
    import numpy as np
    import torch
    import torch.distributed as dist
    import stoker

    out, phase, n, batch, seed, checkpoint_step = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    assert (rank, world) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    # rank and world_size come from torchrun's RANK and WORLD_SIZE
    loader = stoker.DataLoader(stoker.ArrayDataset(np.arange(n)), batch_size=batch,
                               shuffle=True, seed=seed, num_workers=1, output="numpy")
    if phase == "resume":
        with open(os.path.join(out, "checkpoint.json")) as f:
            loader.load_state_dict(json.load(f)["loader"])
    log = open(os.path.join(out, f"{phase}-rank{rank}.jsonl"), "w")
    for step, samples in enumerate(loader, 1):
        total = torch.tensor([len(samples)])
        dist.all_reduce(total)  # the training step: every rank takes part in it
        log.write(json.dumps({"step": step, "node": os.environ["GROUP_RANK"],
                              "samples": samples.tolist()}) + "\\n")
        log.flush()
        if phase == "crash" and step == checkpoint_step:
            states = [None] * world
            dist.all_gather_object(states, loader.state_dict())
            assert all({**s, "rank": 0} == {**states[0], "rank": 0} for s in states)
            if rank == 0:
                with open(os.path.join(out, "checkpoint.tmp"), "w") as f:
                    json.dump({"step": step, "loader": states[0]}, f)
                os.replace(os.path.join(out, "checkpoint.tmp"),
                           os.path.join(out, "checkpoint.json"))
        if phase == "crash" and step == checkpoint_step + 1:  # work after the checkpoint: lost
            open(os.path.join(out, f"ready-rank{rank}"), "w").close()
            if os.environ["GROUP_RANK"] == "1":
                time.sleep(300)  # this node is killed here
            # Never completes: the other node is dead. The wait times out and the rank fails, as
            # a training step's collective with a timeout does.
            try:
                dist.barrier(async_op=True).wait(timeout=datetime.timedelta(seconds=5))
            except RuntimeError as e:
                print(f"rank {rank}: the other node is gone: {e}", flush=True)
                os._exit(1)  # not sys.exit: the pending gloo operation would hold the exit
            sys.exit("the barrier completed without the killed node")
    dist.destroy_process_group()
""")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """torchrun "nodes" on localhost, each in its own process group (so killing a node kills its
    agent and its workers), all killed on exit."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.nodes = []

    def start(self, phase, nprocs, rdzv_port):
        script = self.tmp / "worker.py"
        script.write_text(WORKER)
        # TMPDIR: torchelastic's per-run directories land in the test's own (a SIGKILLed node
        # cannot remove its own).
        (self.tmp / "tmp").mkdir(exist_ok=True)
        env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
                   MASTER_ADDR="127.0.0.1", PYTHONUNBUFFERED="1", TMPDIR=str(self.tmp / "tmp"))
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        started = []
        for node, nproc in enumerate(nprocs):
            cmd = [torchrun, f"--nnodes={len(nprocs)}", f"--nproc-per-node={nproc}",
                   "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{rdzv_port}",
                   f"--rdzv-id={phase}-{rdzv_port}", f"--rdzv-conf=is_host={int(node == 0)}",
                   "--local-addr=127.0.0.1", "--max-restarts=0", "--monitor-interval=0.5",
                   str(script), str(self.tmp), phase, str(N), str(BATCH), str(SEED),
                   str(CHECKPOINT_STEP)]
            log = open(self.tmp / f"{phase}-node{node}.log", "w")
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            self.nodes.append(proc)
            started.append(proc)
        return started

    def logs(self, phase):
        return "\n".join(p.read_text()[-3000:] for p in sorted(self.tmp.glob(f"{phase}-node*.log")))

    def wait(self, procs, phase, deadline_s=DEADLINE_S):
        end = time.monotonic() + deadline_s
        for p in procs:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill_all()
                pytest.fail(f"torchrun phase {phase!r} did not end in {deadline_s} s:\n"
                            f"{self.logs(phase)}")
        return [p.returncode for p in procs]

    @staticmethod
    def kill(proc):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def kill_all(self):
        for p in self.nodes:
            self.kill(p)


def read_log(tmp, phase):
    """{rank: [(step, samples), ...]} of a phase."""
    out = {}
    for path in tmp.glob(f"{phase}-rank*.jsonl"):
        rank = int(path.stem.split("rank")[1])
        records = map(json.loads, path.read_text().splitlines())
        out[rank] = [(r["step"], r["samples"]) for r in records]
    return out


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.kill_all()


def test_two_nodes_then_a_killed_node_and_a_three_rank_resume(cluster, tmp_path):
    order = _native.engine.BatchPlan(N, N, False, 0, 1).indices(True, SEED, 0, 0)

    # 1. Two nodes, two ranks each: the epoch, every sample once.
    procs = cluster.start("full", [2, 2], free_port())
    assert cluster.wait(procs, "full") == [0, 0], cluster.logs("full")
    full = read_log(tmp_path, "full")
    assert sorted(full) == [0, 1, 2, 3]
    assert len({len(steps) for steps in full.values()}) == 1  # equal batch counts
    seen = [s for steps in full.values() for _, batch in steps for s in batch]
    assert sorted(seen) == list(range(N))

    # 2. Again, with a checkpoint at CHECKPOINT_STEP; kill node 1 one step later.
    procs = cluster.start("crash", [2, 2], free_port())
    end = time.monotonic() + DEADLINE_S
    while len(list(tmp_path.glob("ready-rank*"))) < 4:
        if time.monotonic() > end or any(p.poll() is not None for p in procs):
            cluster.kill_all()
            pytest.fail(f"the job did not reach the crash point:\n{cluster.logs('crash')}")
        time.sleep(0.1)
    Cluster.kill(procs[1])
    codes = cluster.wait(procs[:1], "crash", deadline_s=60)
    assert codes[0] != 0, "node 0 finished although node 1 was killed"
    checkpoint = json.loads((tmp_path / "checkpoint.json").read_text())
    assert checkpoint["step"] == CHECKPOINT_STEP and checkpoint["loader"]["world_size"] == 4
    crashed = read_log(tmp_path, "crash")
    assert sorted(crashed) == [0, 1, 2, 3]
    kept = [s for steps in crashed.values() for step, batch in steps
            if step <= CHECKPOINT_STEP for s in batch]
    lost = [s for steps in crashed.values() for step, batch in steps
            if step > CHECKPOINT_STEP for s in batch]
    assert len(kept) == 4 * CHECKPOINT_STEP * BATCH and lost  # work after the checkpoint

    # 3. Three ranks (a node of 2, a node of 1) resume from the checkpoint.
    procs = cluster.start("resume", [2, 1], free_port())
    assert cluster.wait(procs, "resume") == [0, 0], cluster.logs("resume")
    resumed = read_log(tmp_path, "resume")
    assert sorted(resumed) == [0, 1, 2]
    assert len({len(steps) for steps in resumed.values()}) == 1  # equal batch counts
    seen = kept + [s for steps in resumed.values() for _, batch in steps for s in batch]
    counts = collections.Counter(seen)
    assert set(counts) == set(range(N)), "a sample was lost"
    left = N - len(kept)
    pad = -(-left // 3) * 3 - left
    assert pad < 3
    assert counts == collections.Counter(order) + collections.Counter(order[:pad])
