"""Peak RSS summed over a process tree (a measurement child and its workers), polled from the
parent: a sampler thread inside the measured process would take its GIL and slow what it
measures (by a fifth for a single-process loader on the light Python dataset)."""

import json
import os
import signal
import subprocess
import threading

_PAGE = os.sysconf("SC_PAGE_SIZE")


def tree_rss(pid):
    """RSS of ``pid`` and its descendants, read from /proc (statm, task/*/children)."""
    total, pending = 0, [pid]
    while pending:
        p = pending.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * _PAGE
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    pending += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass  # the process ended meanwhile
    return total


class PeakPoll:
    """``with PeakPoll(measure) as p: ...``; then ``p.peak``: the largest ``measure()`` seen,
    polled every ``interval`` seconds by a thread of this process and once more at the end."""

    def __init__(self, measure, interval=0.01):
        self.measure = measure
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.measure())
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.measure())


def run_measured(cmd, env=None, timeout=None):
    """Runs ``cmd`` (a measurement child printing one JSON object as its last line) and returns
    that object with the peak RSS of the child's process tree added as "peak_rss". With a
    timeout (seconds), a child still running then is killed with its process group and
    RuntimeError is raised."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env,
                            start_new_session=timeout is not None)
    with PeakPoll(lambda: tree_rss(proc.pid)) as rss:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise RuntimeError(f"measurement {cmd[2:]} timed out after {timeout} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"measurement {cmd[2:]} failed (exit {proc.returncode})")
    return json.loads(out.strip().splitlines()[-1]) | {"peak_rss": rss.peak}
