"""Runs the test lanes and prints one closing line: ``N passed, N failed, N skipped``. Exits
non-zero when anything failed.

Two doors:
- ``make test`` (no option): every lane below, slow tests included. CI runs this.
- ``make check`` (``--quick``): lanes 1 (release build only) and 2 without the tests marked
  ``slow`` (tests/python/conftest.py says which and why): the edit-test loop, a few minutes.

Lanes, in order (``make test`` builds what they need first):
1. C++ tests (ctest) of the release, ASan/UBSan and TSan builds (TSan: the wings that run threads
   of their own, the Makefile's TSAN_WINGS); the fuzz regression inputs and seeds replay in the
   first two (fuzz/CMakeLists.txt). The libFuzzer search itself is `make fuzz` (CI runs it for
   10 s a target before `make test`: .ci/run).
2. Python tests against the .venv build.
3. Python tests against the ASan/UBSan build of the extension (build/pyasan/site, `make
   ext-asan`): the suite without the tests marked slow (those start Ray clusters, torchrun jobs,
   fresh virtual environments and interpreters: process orchestration that calls the same native
   paths as the rest, and at ASan's pace they would take the lane over the 30 minutes `make test`
   may take), libasan (and libstdc++, which ASan's exception interceptor needs at start-up)
   preloaded into the interpreter, Python's own allocator off so that ASan sees every object's
   memory. Tests whose assertion is a decision taken from wall-clock pace are skipped there
   (tests/python/conftest.py says which and why): ASan's slowdown changes the pace.

Every lane runs with TMPDIR set to a fresh directory of its own, which must be empty afterwards:
a test that leaves a file outside its own temporary directory fails the run (listed by name).
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CTEST = os.path.join(os.path.dirname(sys.executable), "ctest")
# allocator_may_return_null: a failed allocation returns null as glibc's does, so that the tests
# of what the engine does then (a batch buffer that cannot be allocated) run under the sanitizers.
CPP_BUILDS = [
    ("cpp", {}),
    ("asan", {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:allocator_may_return_null=1",
              "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}),
    # Suppressed: races inside pyarrow's uninstrumented libarrow/libparquet (the file says why).
    ("tsan", {"TSAN_OPTIONS": "halt_on_error=1 second_deadlock_stack=1 "
                              "allocator_may_return_null=1 suppressions="
                              + os.path.join(ROOT, "tools", "tsan-suppressions.txt")}),
]
PYASAN_SITE = os.path.join(ROOT, "build", "pyasan", "site")
PYTEST_TIMEOUT = 900  # seconds a Python test may take (the longest take about 2 minutes)


def count_junit(path):
    """(passed, failed, skipped) from a JUnit XML report."""
    passed = failed = skipped = 0
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.find("skipped") is not None or case.get("status") in ("notrun", "disabled"):
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


# Every failure of the run, "lane: test: first line of its message", listed again just above the
# closing line: a CI log's tail then names what failed, whichever lane it was in.
FAILURES = []


def failed_cases(path):
    """'test: first line of the message' of each failed case of a JUnit XML report."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is None:
            continue
        name = "::".join(p for p in (case.get("classname"), case.get("name")) if p)
        message = (bad.get("message") or bad.text or "").strip().splitlines()
        out.append(f"{name}: {message[0][:500] if message else ''}")
    return out


def leftovers(tmpdir):
    """Paths a lane left in its TMPDIR (pytest's own base directory excepted)."""
    found = []
    for entry in sorted(os.listdir(tmpdir)):
        if entry.startswith("pytest-of-"):
            continue  # tmp_path's base: pytest keeps the last three runs by design
        found.append(entry)
    return found


def run(label, cmd, report, env=None):
    """Runs one lane; returns (passed, failed, skipped)."""
    print(f"== {label}: {' '.join(cmd)}", flush=True)
    lane_tmp = tempfile.mkdtemp(prefix="stoker-lane-")
    start = time.monotonic()
    # SIGINT at its default disposition in the lane: started in the background (nohup, `&`, some
    # CI runners) a process inherits SIGINT ignored, and Python then installs no KeyboardInterrupt
    # handler, which the Ctrl-C tests need.
    # torch (2.14) makes its compiler's cache directory, TMPDIR/torchinductor_<user>, when
    # torchvision imports torch._dynamo: kept under build/ so that only the tests' own files are
    # judged in TMPDIR.
    inductor = os.path.join(ROOT, "build", "torchinductor")
    rc = subprocess.call(cmd, cwd=ROOT, env={**os.environ, **(env or {}), "TMPDIR": lane_tmp,
                                             "TORCHINDUCTOR_CACHE_DIR": inductor},
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seconds = time.monotonic() - start
    left = leftovers(lane_tmp)
    shutil.rmtree(lane_tmp, ignore_errors=True)
    if not os.path.exists(report):
        print(f"== {label}: no report (exit code {rc}), {seconds:.0f} s", flush=True)
        FAILURES.append(f"{label}: no report (exit code {rc})")
        return 0, 1, 0
    counts = count_junit(report)
    FAILURES.extend(f"{label}: {case}" for case in failed_cases(report))
    if rc != 0 and counts[1] == 0:
        counts = (counts[0], 1, counts[2])  # crashed outside any test case
        FAILURES.append(f"{label}: exit code {rc} outside any test case")
    if left:
        print(f"== {label}: FAILED: tests left files in the temp dir: {', '.join(left)}",
              flush=True)
        FAILURES.append(f"{label}: tests left files in the temp dir: {', '.join(left)}")
        counts = (counts[0], counts[1] + 1, counts[2])
    print(f"== {label}: {counts[0]} passed, {counts[1]} failed, {counts[2]} skipped "
          f"({seconds:.0f} s)", flush=True)
    return counts


def gcc_library(name):
    """The path of a runtime library of the GCC that built the extension."""
    out = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True)
    return os.path.realpath(out.stdout.strip())


def main(argv=None):
    p = argparse.ArgumentParser(description="Run Stoker's test lanes (make test / make check).")
    p.add_argument("--quick", action="store_true",
                   help="release C++ tests and the Python tests not marked slow only "
                        "(make check)")
    args = p.parse_args(argv)
    totals = [0, 0, 0]

    def add(counts):
        for i in range(3):
            totals[i] += counts[i]

    # A test that hangs fails its lane (every stack dumped, the run ends) instead of holding CI
    # until its own limit.
    hang = [f"--timeout={PYTEST_TIMEOUT}", "--timeout-method=thread"]
    # The slowest tests of each full lane, in the log: where `make test`'s 30 minutes go.
    slowest = ["--durations=12", "--durations-min=3"]
    with tempfile.TemporaryDirectory() as tmp:
        for build, env in CPP_BUILDS[:1] if args.quick else CPP_BUILDS:
            report = os.path.join(tmp, f"ctest-{build}.xml")
            add(run(f"C++ ({build})", [CTEST, "--test-dir", f"build/{build}",
                                       "--output-on-failure", "-j", "2",
                                       "--output-junit", report], report, env))

        if args.quick:
            report = os.path.join(tmp, "pytest.xml")
            add(run("Python (not slow)",
                    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m",
                     "not slow", *hang, f"--junitxml={report}"], report))
            return finish(totals)

        report = os.path.join(tmp, "pytest.xml")
        add(run("Python", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *hang, *slowest, f"--junitxml={report}"], report))

        report = os.path.join(tmp, "pytest-asan.xml")
        env = {
            "PYTHONPATH": PYASAN_SITE,
            "LD_PRELOAD": f"{gcc_library('libasan.so')} {gcc_library('libstdc++.so')}",
            "PYTHONMALLOC": "malloc",
            # Leaks off: the interpreter and torch keep what they allocate until exit by design.
            # Everything else ASan and UBSan find is fatal.
            "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:abort_on_error=1:"
                            "allocator_may_return_null=1:handle_segv=1",
            "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
            "STOKER_EXPECT_ASAN": "1",
            # One OpenMP thread: GCC's ASan allocator is not fork-safe, and a child forked while
            # torch's OpenMP pool allocated waited forever on the allocator's lock (seen in a
            # fresh-clone run). glibc's malloc, in the other lanes, locks itself around fork.
            # For the same reason tests/python/conftest.py makes every fork in this lane wait
            # until the Python threads that finished have left the kernel.
            "OMP_NUM_THREADS": "1",
        }
        # --capture=sys: a sanitizer report is written to fd 2 by native code, which pytest's
        # default fd capture would swallow when the process aborts.
        add(run("Python (ASan/UBSan extension, not slow)",
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m",
                 "not slow", "--capture=sys", *hang, *slowest, f"--junitxml={report}"],
                report, env))
    return finish(totals)


def finish(totals):
    """The failures again, then the closing line; the exit status."""
    for failure in FAILURES:
        print(f"FAILED {failure}")
    print(f"{totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    return 1 if totals[1] else 0


if __name__ == "__main__":
    sys.exit(main())
