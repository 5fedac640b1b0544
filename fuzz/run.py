"""Runs the libFuzzer targets built in build/fuzz (``make fuzz``; CI's fuzz smoke is ``make fuzz
FUZZ_SECONDS=10 FUZZ_JOBS=2``, .ci/run), each for a given time, and reports what each did.

Corpus directories given to each target, in this order: ``build/fuzz/corpus/<target>`` (where
libFuzzer adds the inputs that found new coverage; kept between runs), ``fuzz/corpus/<target>``
(committed small seeds), ``build/fuzz/seeds/<target>`` (seeds generated from the sample data by
fuzz/make_seeds.py, made once) and ``fuzz/regressions/<target>`` (every crash found, replayed
first of all). A finding (libFuzzer's ``crash-*``, ``leak-*``, ``timeout-*``, ``oom-*`` files)
is written to ``build/fuzz/findings/<target>/`` (``-artifact_prefix``; each target also runs in
build/fuzz, so nothing a target writes lands in the repository) and fails the run: add the input
to fuzz/regressions/<target>/ with the fix.

Per target the report gives the inputs executed, the coverage (edges, libFuzzer's ``cov``, and
features, ``ft``), the corpus size and the exit status; ``--json`` writes it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("jpeg", "png", "tar", "tokens", "npy", "table", "megatron", "video", "jsonl",
           "tokenizer", "chat_template", "audio")
SEEDS_VERSION = "5"  # bump when make_seeds.py changes what it writes

_STATUS = re.compile(r"#(\d+)\s+(?:DONE|INITED|NEW|REDUCE|pulse|RELOAD)\s+cov: (\d+) ft: (\d+)"
                     r"(?: corp: (\d+)/\S+)?")
_STAT = re.compile(r"stat::(\w+):\s+(\d+)")


def ensure_seeds(build):
    """build/seeds/<target>, generated from the sample data once per SEEDS_VERSION."""
    seeds = build / "seeds"
    stamp = seeds / ".version"
    if stamp.exists() and stamp.read_text() == SEEDS_VERSION:
        return seeds
    subprocess.run([sys.executable, str(ROOT / "fuzz" / "make_seeds.py"), str(seeds)], check=True)
    stamp.write_text(SEEDS_VERSION)
    return seeds


def parse(output):
    """The last status line's figures and the final stat:: lines."""
    result = {}
    for m in _STATUS.finditer(output):
        result.update(inputs=int(m.group(1)), edges=int(m.group(2)), features=int(m.group(3)))
        if m.group(4):
            result["corpus"] = int(m.group(4))
    for m in _STAT.finditer(output):
        result[m.group(1)] = int(m.group(2))
    if "number_of_executed_units" in result:
        result["inputs"] = result["number_of_executed_units"]
    crash = re.search(r"Test unit written to (\S+)", output)
    if crash:
        result["artifact"] = crash.group(1)
    summary = re.search(r"SUMMARY: (.*)", output)
    if summary:
        result["summary"] = summary.group(1)
    return result


def run_target(target, seconds, build, seeds, niceness, log_dir):
    binary = build / "fuzz" / f"fuzz_{target}"
    corpus = build / "corpus" / target
    findings = build / "findings" / target
    for d in (corpus, findings):
        d.mkdir(parents=True, exist_ok=True)
    dirs = [corpus, ROOT / "fuzz" / "corpus" / target, seeds / target,
            ROOT / "fuzz" / "regressions" / target]
    cmd = [str(binary), f"-max_total_time={seconds}", "-print_final_stats=1",
           "-rss_limit_mb=2560", "-timeout=30",
           f"-artifact_prefix={findings}/"] + [str(d) for d in dirs if d.is_dir()]
    if niceness:
        cmd = ["nice", "-n", str(niceness)] + cmd
    env = {**os.environ,
           "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:symbolize=1",
           "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=build, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace", timeout=seconds * 3 + 300)
    result = {"target": target, "seconds": round(time.monotonic() - start, 1),
              "returncode": proc.returncode, **parse(proc.stdout)}
    log = log_dir / f"fuzz_{target}.log"
    log.write_text(proc.stdout)
    result["log"] = str(log)
    return result


def describe(r):
    status = "ok" if r["returncode"] == 0 else f"FAILED (exit {r['returncode']})"
    line = (f"fuzz_{r['target']:<7} {r.get('inputs', 0):>11,} inputs  "
            f"{r.get('average_exec_per_sec', 0):>7,}/s  cov {r.get('edges', 0):>5} edges  "
            f"ft {r.get('features', 0):>6}  corpus {r.get('corpus', 0):>5}  "
            f"{r['seconds']:>6.0f} s  {status}")
    if r["returncode"] != 0:  # one line a target: a failure names its input and log
        line += f": {r.get('summary', 'no sanitizer summary')}; input: " \
                f"{r.get('artifact', '?')}; log: {r['log']}"
    return line


def main(argv=None):
    p = argparse.ArgumentParser(description="Run Stoker's fuzz targets (build them first: "
                                            "make fuzz-build).")
    p.add_argument("--seconds", type=int, default=600, help="per target (default 600)")
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--jobs", type=int, default=1, help="targets run side by side")
    p.add_argument("--nice", type=int, default=0, help="run the targets under nice -n N")
    p.add_argument("--build", default=str(ROOT / "build" / "fuzz"))
    p.add_argument("--json", help="write the results as JSON")
    args = p.parse_args(argv)
    build = Path(args.build).resolve()  # absolute: the targets run in it
    targets = [t for t in args.targets.split(",") if t]
    unknown = set(targets) - set(TARGETS)
    if unknown:
        p.error(f"unknown targets {sorted(unknown)}; known: {', '.join(TARGETS)}")
    for t in targets:
        if not (build / "fuzz" / f"fuzz_{t}").exists():
            p.error(f"{build}/fuzz/fuzz_{t} is not built: run make fuzz-build")
    seeds = ensure_seeds(build)
    log_dir = build / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"fuzzing {', '.join(targets)} for {args.seconds} s each, {args.jobs} at a time",
          flush=True)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_target, t, args.seconds, build, seeds, args.nice, log_dir)
                   for t in targets]
        results = []
        for f in futures:
            results.append(f.result())
            print(describe(results[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 1 if any(r["returncode"] != 0 for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
