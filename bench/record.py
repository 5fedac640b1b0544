"""Each benchmark's latest figures, kept in bench/results/<benchmark>.md and rewritten by the
benchmark itself: ``sys.exit(record.run(main))`` in place of ``sys.exit(main())``.

What a run prints on standard output is shown as usual and also kept; when ``main`` returns (a
target missed included: the figures are still the latest), bench/results/<script name>.md is
replaced by a header (when, on what machine, with which versions, the exact command) and that
output. A run that raises or is interrupted writes nothing: the file keeps the last whole output.

Not recorded: smoke and short runs (``--quick``, ``--cpu-smoke``: their figures are not the
benchmark's), the measurement children a benchmark starts (``--child``, ``--run-scenario``: their
output is the parent's input) and ``--help``. Standard error (warnings, a library's notices) is
not kept.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import inspect
import io
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from harness import cores, stoker_build  # noqa: E402  (beside this file)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
NOT_RECORDED = ("--quick", "--cpu-smoke", "--child", "--run-scenario", "--help", "-h")


class _Tee(io.TextIOBase):
    """Standard output that also keeps what passes through it."""

    def __init__(self, out):
        self.out = out
        self.kept = io.StringIO()

    def write(self, text):
        self.kept.write(text)
        return self.out.write(text)

    def flush(self):
        self.out.flush()

    def __getattr__(self, name):  # encoding, isatty, fileno, ...
        return getattr(self.out, name)


def _field(path, key, sep):
    """The value of the first ``key<sep>value`` line of a file, or None."""
    try:
        with open(path) as f:
            for line in f:
                name, found, value = line.partition(sep)
                if found and name.strip() == key:
                    return value.strip().strip('"')
    except OSError:
        pass
    return None


def _os_name():
    pretty = _field("/etc/os-release", "PRETTY_NAME", "=") or platform.system()
    return f"{pretty}, kernel {platform.release()}"


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _gpus():
    if shutil.which("nvidia-smi") is None:
        return "none"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "none (nvidia-smi did not answer)"
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return "; ".join(lines) if out.returncode == 0 and lines else "none"


def machine():
    """One line per fact about this machine, for the header."""
    cpu = _field("/proc/cpuinfo", "model name", ":") or platform.processor() or "unknown"
    mem = _field("/proc/meminfo", "MemTotal", ":")
    mem = f"{int(mem.split()[0]) / 2**20:.1f} GiB" if mem else "unknown"
    return [
        f"CPU: {cpu}; {cores()} usable cores (of {os.cpu_count()})",
        f"memory: {mem}",
        f"OS: {_os_name()}",
        f"GPU: {_gpus()}",
        f"python {platform.python_version()}, torch {_version('torch')}, "
        f"stoker {_version('stoker')}",
        f"stoker build: {stoker_build()}",
    ]


def command():
    """The command as typed from the repository root."""
    def shown(path):
        p = Path(path).absolute()
        return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(path)
    return shlex.join([shown(sys.executable), shown(sys.argv[0]), *sys.argv[1:]])


def header(name, started, seconds, load):
    when = started.strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# {name}: the latest whole output", "",
             "Written by the benchmark itself (bench/record.py); rerun the command to replace it.",
             "", f"- date: {when} (the run took {seconds:.0f} s)"]
    lines += [f"- {fact}" for fact in machine()]
    lines += [f"- load average at the start: {', '.join(f'{x:.2f}' for x in load)}",
              f"- command: `{command()}`"]
    return "\n".join(lines) + "\n"


def write(name, head, output):
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.md"
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(f"{head}\n```\n{output.rstrip()}\n```\n")
    tmp.replace(path)
    return path


def run(main):
    """Runs a benchmark's ``main()`` and records its output (see the module's docstring);
    returns what ``main`` returned."""
    if any(arg.split("=")[0] in NOT_RECORDED for arg in sys.argv[1:]):
        return main()
    name = Path(inspect.getfile(main)).stem
    started = datetime.datetime.now(datetime.timezone.utc)
    load = os.getloadavg()
    t0 = time.monotonic()
    tee = _Tee(sys.stdout)
    sys.stdout = tee
    try:
        result = main()
    finally:
        sys.stdout = tee.out
    path = write(name, header(name, started, time.monotonic() - t0, load), tee.kept.getvalue())
    print(f"(output recorded in {path.relative_to(ROOT)})", file=sys.stderr)
    return result
