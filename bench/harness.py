"""What the benchmarks share, held once: the cores they may use and the machine line they print,
CPU time, the size of a batch, ImageNet's normalization, measurement children in fresh processes
with their peak RSS, the median over repeats, the peers' interpreters, folders of links to a
subset of the sample files, the page-cache warm-up and the ``--json`` file.

Peak RSS is summed over a process tree (a measurement child and its workers) and polled from the
parent: a sampler thread inside the measured process would take its GIL and slow what it
measures (by a fifth for a single-process loader on the light Python dataset).

A measurement child prints its figures as one JSON object, its last line of standard output
(``emit``); the parent runs it with ``run_measured``, which adds the child's peak RSS.
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PEERS = REPO / ".venv-peers"  # the peers' environments (bench/setup_peers.sh)

# ImageNet's per-channel mean and standard deviation: every image benchmark normalizes with them.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

_PAGE = os.sysconf("SC_PAGE_SIZE")


def cores():
    """The cores this process may run on (its affinity), not all the machine has."""
    return len(os.sched_getaffinity(0))


def machine_line(build=True):
    """The start of a benchmark's first line: the interpreter, the cores, the load, and (with
    `build`) the Stoker build measured (wheel tag, compiler, C++ library, glibc headers,
    libjpeg-turbo)."""
    line = (f"python {sys.version.split()[0]}; {cores()} usable cores; load average "
            f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return f"{line}; {stoker_build()}" if build else line


def stoker_build():
    """stoker.info.summary() of the Stoker this interpreter imports, or why there is none."""
    try:
        import stoker.info
    except ImportError as e:
        return f"stoker not importable ({e})"
    return stoker.info.summary()


def cpu_seconds(children=True):
    """CPU time (user + system) of this process; with ``children``, also of its children, reaped
    and living (psutil), as a loader with worker processes spends it."""
    if not children:
        import resource
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    import psutil
    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    return total


def samples_in(batch):
    """Samples in a batch (its first element's length: the last batch of an epoch may be short)."""
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    return len(first)


def median_of(runs, keep=("error",)):
    """The median of each number over the runs that worked (those without "error"), the other
    values from the first of them, and with "images_per_s" its min and max. When none worked:
    the first run's ``keep`` entries (the error, and what the child reported beside it)."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {k: v for k, v in runs[0].items() if k in keep}
    out = dict(ok[0])
    for k, v in ok[0].items():
        if isinstance(v, (int, float)):
            out[k] = statistics.median(r[k] for r in ok)
    if "images_per_s" in out:
        out["images_per_s_min"] = min(r["images_per_s"] for r in ok)
        out["images_per_s_max"] = max(r["images_per_s"] for r in ok)
    return out


def peer_python(env):
    """The interpreter of the peer environment ``env`` (.venv-peers/<env>), or None when it is
    missing or its setup did not finish."""
    return str(PEERS / env / "bin" / "python") if (PEERS / env / ".ok").exists() else None


def link_files(paths, root, dst):
    """A folder ``dst`` of symbolic links to ``paths`` (files under ``root``, kept at the same
    place relative to it): a subset of a dataset at no copy."""
    dst = Path(dst)
    for path in paths:
        rel = Path(path).relative_to(root)
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(path, dst / rel)
    return dst


def read_files(paths):
    """Reads each file once, so that every loader then reads it from the page cache (RAM)."""
    for path in paths:
        with open(path, "rb") as f:
            f.read()


def write_json(path, figures, **dump_options):
    """``--json PATH``: every figure of the run, indented, the file ending with a newline."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(figures, f, indent=2, **dump_options)
        f.write("\n")


def emit(figures):
    """Ends a measurement child: prints its figures as JSON (the last line) and exits at once.
    Interpreter teardown is skipped: some peers' worker pools and threads (torchdata's process
    mapper, DALI, FFCV) have been seen to abort or hang in it."""
    print(json.dumps(figures), flush=True)
    os._exit(0)


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


def median_epochs(cmd, repeat, samples, env=None, timeout=None):
    """The median (``median_of``) of ``repeat`` runs of the measurement child ``cmd``, each of
    which reports the ``samples`` it delivered and its ``wall_s`` for one epoch: a run that
    delivered another count than ``samples`` (an epoch must deliver every sample once) counts as
    an error, as does one that failed."""
    runs = []
    for _ in range(repeat):
        try:
            runs.append(run_measured(cmd, env=env, timeout=timeout))
        except RuntimeError as e:
            runs.append({"error": str(e)})
    for r in runs:
        if "error" not in r and r.get("samples") != samples:
            r["error"] = f"delivered {r.get('samples')} samples of {samples}"
    return median_of(runs)
