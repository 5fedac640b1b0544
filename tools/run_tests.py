"""Runs every test suite (C++ under three builds, then Python) and prints one closing line:
``N passed, N failed, N skipped``. Exits non-zero when anything failed."""

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CTEST = os.path.join(os.path.dirname(sys.executable), "ctest")
CPP_BUILDS = [
    ("cpp", {}),
    ("asan", {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
              "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}),
    ("tsan", {"TSAN_OPTIONS": "halt_on_error=1 second_deadlock_stack=1"}),
]


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


def run(label, cmd, report, env=None):
    print(f"== {label}: {' '.join(cmd)}", flush=True)
    rc = subprocess.call(cmd, cwd=ROOT, env={**os.environ, **(env or {})})
    if not os.path.exists(report):
        print(f"== {label}: no report (exit code {rc})", flush=True)
        return 0, 1, 0
    counts = count_junit(report)
    if rc != 0 and counts[1] == 0:
        counts = (counts[0], 1, counts[2])  # crashed outside any test case
    print(f"== {label}: {counts[0]} passed, {counts[1]} failed, {counts[2]} skipped", flush=True)
    return counts


def main():
    totals = [0, 0, 0]
    with tempfile.TemporaryDirectory() as tmp:
        for build, env in CPP_BUILDS:
            report = os.path.join(tmp, f"ctest-{build}.xml")
            counts = run(f"C++ ({build})", [CTEST, "--test-dir", f"build/{build}",
                                            "--output-on-failure", "-j", "2",
                                            "--output-junit", report], report, env)
            totals = [a + b for a, b in zip(totals, counts)]
        report = os.path.join(tmp, "pytest.xml")
        counts = run("Python", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                f"--junitxml={report}"], report)
        totals = [a + b for a, b in zip(totals, counts)]
    print(f"{totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    return 1 if totals[1] else 0


if __name__ == "__main__":
    sys.exit(main())
