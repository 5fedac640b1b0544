"""Multi-process runs for the trainer integration tests (test_integration_*.py): a command started
in a process group of its own, in an environment without the distributed variables of whatever
runs the tests, waited on with a deadline and killed with what it started at the end.

torchrun's agent starts its workers in sessions of their own, so killing the agent's process group
leaves them running: a worker script begins with ``DIE_WITH_PARENT``, after which it dies with
the process that started it.
"""

import os
import signal
import socket
import subprocess
import sys

import pytest

DIE_WITH_PARENT = """\
import ctypes, os, signal
ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() == 1:
    os._exit(1)  # the parent died before the line above
"""

# What a launcher, torchrun or a cluster sets: none may reach a run from the test's environment.
_DISTRIBUTED_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
                     "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT",
                     "TORCHELASTIC_RUN_ID")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc):
    """The torchrun command line of ``nproc`` workers on this host (a rendezvous of its own)."""
    return [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone",
            f"--nproc-per-node={nproc}", "--max-restarts=0", "--monitor-interval=0.5"]


class Launches:
    """Runs commands under ``tmp`` (one at a time); ``kill_all`` ends every one of them."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []

    def env(self, **extra):
        """The environment of a run: the test's (PYTHONPATH included: it reaches stoker and
        tests/python), without distributed variables, gloo on the loopback interface, one
        thread for torch's CPU ops, temporary files in the test's directory."""
        env = {k: v for k, v in os.environ.items() if k not in _DISTRIBUTED_VARS}
        (self.tmp / "tmp").mkdir(exist_ok=True)
        env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1",
                   TMPDIR=str(self.tmp / "tmp"), **extra)
        return env

    def run(self, name, cmd, deadline_s, **extra_env):
        """Runs ``cmd`` to its end (within ``deadline_s``, else the test fails) and returns its
        output; the test fails on a non-zero exit, showing the output's end."""
        out = self.tmp / f"{name}.out"
        with open(out, "w") as log:
            proc = subprocess.Popen(cmd, cwd=self.tmp, env=self.env(**extra_env), stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.procs.append(proc)
        try:
            code = proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            self.kill_all()
            pytest.fail(f"{name!r} did not end in {deadline_s} s:\n{out.read_text()[-4000:]}")
        self.kill(proc)  # whatever it started and left behind
        text = out.read_text()
        assert code == 0, f"{name!r} exited with {code}:\n{text[-4000:]}"
        return text

    @staticmethod
    def kill(proc):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def kill_all(self):
        for p in self.procs:
            self.kill(p)
