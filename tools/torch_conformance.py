"""Runs PyTorch's own DataLoader test suite (``test/test_dataloader.py`` from PyTorch's source,
which is not part of this repository: pass its path) with ``stoker.DataLoader`` in place of
``torch.utils.data.DataLoader``, and prints the pass/fail/skip counts and the failing tests.

    .venv/bin/python tools/torch_conformance.py /path/to/test_dataloader.py [--loader torch]

How the swap is made: a ``sitecustomize`` module, put first on PYTHONPATH, sets
``torch.utils.data.DataLoader = stoker.DataLoader`` at interpreter start-up, before the test module
runs ``from torch.utils.data import DataLoader``. It does so in every Python process the run
starts (pytest itself, the test's own ``spawn`` processes that build loaders, its ``python -c``
subprocesses); ``--main-only`` limits it to the pytest process. ``--loader torch`` runs the same
suite with torch's own DataLoader, the reference for which tests can pass with this torch build.
The file is run from a temporary directory (it imports itself by its file name), with a
per-test timeout so that a hang counts as a failure instead of stopping the run.

Needs ``expecttest`` (torch.testing's import) and ``pytest-timeout`` (requirements.txt).
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

# The swap, as a sitecustomize module (every process) or a conftest.py (pytest's only).
PATCH = """\
import os
if os.environ.get("STOKER_CONFORMANCE_LOADER") == "stoker":
    import torch.utils.data
    import stoker
    torch.utils.data.DataLoader = stoker.DataLoader
"""



def results(junit):
    """[(test id, outcome)] from a JUnit XML report: outcome is passed, failed or skipped."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            out.append((name, "failed"))
        elif case.find("skipped") is not None:
            out.append((name, "skipped"))
        else:
            out.append((name, "passed"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("test_file", help="PyTorch's test/test_dataloader.py")
    ap.add_argument("--loader", choices=("stoker", "torch"), default="stoker")
    ap.add_argument("--main-only", action="store_true",
                    help="swap the DataLoader in the pytest process only")
    ap.add_argument("-k", default=None, help="pytest -k expression")
    ap.add_argument("--timeout", type=int, default=180, help="seconds a test may take")
    ap.add_argument("--junit", default=None, help="also keep the JUnit XML report here")
    ap.add_argument("--suite-timeout", type=int, default=5400,
                    help="seconds for the whole run; then pytest and its children are killed "
                         "(a loader whose workers keep the interpreter from exiting after the "
                         "last test), and the report it wrote, if any, is read")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="stoker-conformance-") as tmp:
        shutil.copy(args.test_file, os.path.join(tmp, "test_dataloader.py"))
        env = dict(os.environ, STOKER_CONFORMANCE_LOADER=args.loader,
                   PYTHONDONTWRITEBYTECODE="1")
        if args.main_only:
            with open(os.path.join(tmp, "conftest.py"), "w") as f:
                f.write(PATCH)
        else:
            site = os.path.join(tmp, "site")
            os.mkdir(site)
            with open(os.path.join(site, "sitecustomize.py"), "w") as f:
                f.write(PATCH)
            env["PYTHONPATH"] = os.pathsep.join(
                [site] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        junit = os.path.join(tmp, "report.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore",
               f"--timeout={args.timeout}", f"--junitxml={junit}", "--rootdir", tmp,
               "test_dataloader.py"]
        if args.k:
            cmd += ["-k", args.k]
        print(f"== {args.loader} DataLoader: {' '.join(cmd)}", flush=True)
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            rc = proc.wait(args.suite_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
            print(f"pytest did not end within {args.suite_timeout} s: killed", flush=True)
        if not os.path.exists(junit):
            print(f"no report (pytest exit code {rc})")
            return 2
        if args.junit:
            shutil.copy(junit, args.junit)
        got = results(junit)
    counts = {k: sum(1 for _, o in got if o == k) for k in ("passed", "failed", "skipped")}
    for name, outcome in got:
        if outcome == "failed":
            print(f"FAILED {name}")
    ran = counts["passed"] + counts["failed"]
    rate = counts["passed"] / ran if ran else 0.0
    print(f"{args.loader}: {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped; {rate:.1%} of the tests that ran (not skipped) passed")
    return 0 if counts["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
