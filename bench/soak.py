"""Soak: many epochs of the image pipeline and of a Python dataset with persistent process
workers, and what the process holds after each.

    .venv/bin/python bench/soak.py                  # 100 epochs of each (a few minutes)
    .venv/bin/python bench/soak.py --quick          # 8 epochs on small data (the test's version)

Each scenario runs in a fresh process of its own. After every epoch it records the RSS of the
process and of its children, the open file descriptors (memfds among them), the threads and the
child processes; after the loader is dropped, the same again, and the /dev/shm entries. The
checks (exit status 1 if one fails):

- RSS flat after the third epoch: the RSS (process + children) of the last epochs is at most 2%
  above that of epochs 3 to 7 (medians of five epochs, three for short runs: the allocator moves
  it by a few MiB from epoch to epoch), batch buffers the pool allocated since epoch 3 aside (it
  allocates one only when all it has are in flight, up to depth + workers + 1 and the memory
  budget); the raw growth from epoch 3 to the last is reported too;
- descriptors, memfds, threads, child processes and the /dev/shm files mapped the same after
  every epoch as after the first;
- after the loader is gone: no child process, no memfd, none of the /dev/shm files the process or
  its workers mapped left, and descriptors and threads back to what they were before the loader
  was made.

Writes ``OUT/soak.json`` (every epoch's figures and the verdicts) and ``OUT/rss.png`` (RSS per
epoch). The Python-dataset scenario uses only Stoker's public API.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RSS_GROWTH_LIMIT = 0.02
SCENARIOS = ("images", "python")


# --------------------------------------------------------------------------- what a process holds

def process_state():
    import psutil

    me = psutil.Process()
    children = me.children(recursive=True)
    fds = os.listdir("/proc/self/fd")
    memfds = 0
    for fd in fds:
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:"):
                memfds += 1
        except OSError:
            pass  # the descriptor listdir itself used
    shm = shm_mapped([me.pid] + [c.pid for c in children])
    child_rss = 0
    for c in children:
        try:
            child_rss += c.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    rss = me.memory_info().rss
    return {"rss": rss, "children_rss": child_rss, "total_rss": rss + child_rss,
            "fds": len(fds), "memfds": memfds, "threads": len(os.listdir("/proc/self/task")),
            "children": len(children), "shm": sorted(shm)}


def shm_mapped(pids):
    """The /dev/shm files the processes map (shared memory, POSIX semaphores): what they would
    leave behind there. (Other processes on the machine create and remove entries of their own,
    so the directory's contents alone say nothing about ours.)"""
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    parts = line.split(maxsplit=5)
                    if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                        found.add(parts[5].strip().removesuffix(" (deleted)"))
        except OSError:
            pass
    return found


# --------------------------------------------------------------------------- the two scenarios

def image_data(quick, scratch):
    from stoker.sample_data import default_sample_root, make_sample

    if quick:
        root = Path(scratch) / "sample"
        make_sample(root, num_classes=2, images_per_class=48, shards=1)
    else:
        root = Path(default_sample_root())
        make_sample(root)  # cached
    return root / "train"


def image_loader(quick, data):
    import stoker
    from stoker import transforms as T

    ds = stoker.ImageFolder(data, transform=T.Compose([
        T.RandomResizedCrop(224 if not quick else 96), T.RandomHorizontalFlip(), T.ToTensor(),
        T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]))
    # Fixed knobs, not "auto": the soak measures what epochs leave behind. The autotune deepening
    # the prefetch (two more 19 MB batch buffers, within the memory budget) or adding a worker
    # when the machine is busy would look like growth (seen: +39 MiB at epoch 16 of a soak run
    # beside a build).
    return stoker.DataLoader(ds, batch_size=32, shuffle=True, num_workers=2, prefetch_factor=2,
                             on_error="skip")


class Augmenting:
    """A map-style Python dataset with a little NumPy work per sample, as user datasets do: a
    random crop and flip of a synthetic 3 x 80 x 80 image, normalized."""

    def __init__(self, n):
        import numpy as np

        self.n = n
        self.base = np.random.default_rng(0).integers(0, 256, (3, 80, 80), dtype=np.uint8)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import numpy as np

        rng = np.random.default_rng(i)
        top, left = rng.integers(0, 17, 2)
        crop = self.base[:, top:top + 64, left:left + 64].astype(np.float32) / 255
        if rng.random() < 0.5:
            crop = crop[:, :, ::-1]
        return np.ascontiguousarray((crop - 0.5) / 0.25), i % 10


def python_loader(quick, data):
    import stoker

    return stoker.DataLoader(Augmenting(512 if quick else 4096), batch_size=32, shuffle=True,
                             num_workers=2, worker_type="process", persistent_workers=True)


def run_scenario(name, epochs, quick):
    """Runs in its own process; prints one JSON line per measurement."""
    # Imports, data and torch's first op first: the baseline is what the loader adds.
    import numpy  # noqa: F401
    import stoker  # noqa: F401
    import torch

    torch.stack([torch.zeros(4), torch.ones(4)])

    with tempfile.TemporaryDirectory(prefix="stoker-soak-") as scratch:
        data = image_data(quick, scratch) if name == "images" else None
        make = image_loader if name == "images" else python_loader
        gc.collect()
        before = process_state()
        loader = make(quick, data)
        batches = 0
        shm = set(before["shm"])
        for epoch in range(1, epochs + 1):
            start = time.perf_counter()
            for batch in loader:
                batches += 1
                del batch
            seconds = time.perf_counter() - start
            state = process_state()
            shm |= set(state["shm"])
            pool = loader.stats().get("buffer_bytes", 0)
            print(json.dumps({"epoch": epoch, "seconds": seconds, "pool_bytes": pool, **state}),
                  flush=True)
        stats = loader.stats()
        del loader
        gc.collect()
        after = process_state()
        print(json.dumps({"before": before, "after": after, "batches": batches,
                          "skipped": stats.get("skipped", 0),
                          "shm_used": sorted(shm),
                          "shm_left": sorted(p for p in shm if os.path.exists(p))}), flush=True)


# --------------------------------------------------------------------------- checks and report

def verdicts(epochs_rows, end):
    """(name, ok, detail) for each check."""
    rows = epochs_rows
    out = []
    third = rows[min(2, len(rows) - 1)]
    last = rows[-1]
    growth = last["total_rss"] / third["total_rss"] - 1
    peak = max(r["total_rss"] for r in rows[2:]) / third["total_rss"] - 1
    # The batch pool allocates a buffer only when every one it has is in flight, so a new
    # high-water mark of batches in flight (a scheduling hiccup at epoch 40) adds a whole buffer,
    # within depth + workers + 1 buffers and the memory budget. That growth is the pool's, by
    # design and reported by it; the check is on everything else. From epoch to epoch the
    # allocator moves the RSS up and down by a few MiB (freed decoder buffers kept or returned),
    # so the check compares medians: of epochs 3 to 7 and of the last five (three for short runs).
    def rest(r):
        return r["total_rss"] - max(0, r["pool_bytes"] - third["pool_bytes"])

    width = 5 if len(rows) >= 15 else 3
    first_epochs = statistics.median(rest(r) for r in rows[2:2 + width])
    last_epochs = statistics.median(rest(r) for r in rows[-width:])
    other = last_epochs / first_epochs - 1
    pool_growth = max(0, last["pool_bytes"] - third["pool_bytes"])
    out.append(("rss flat after epoch 3 (buffers the pool added aside)", other <= RSS_GROWTH_LIMIT,
                f"epoch 3 {third['total_rss'] / 2**20:.1f} MiB, epoch {last['epoch']} "
                f"{last['total_rss'] / 2**20:.1f} MiB: {growth:+.2%} (peak {peak:+.2%}); batch "
                f"buffers the pool added {pool_growth / 2**20:.1f} MiB; the rest, median of the "
                f"last {width} epochs against epochs 3-{2 + width}: {other:+.2%} "
                f"(limit {RSS_GROWTH_LIMIT:.0%})"))
    for key in ("fds", "threads", "children", "memfds", "shm"):
        values = sorted({str(r[key]) if key == "shm" else r[key] for r in rows})
        out.append((f"{key} constant across epochs", len(values) == 1, f"values {values}"))
    before, after = end["before"], end["after"]
    for key in ("fds", "threads", "children", "memfds"):
        out.append((f"{key} back after the loader is gone", after[key] == before[key],
                    f"before {before[key]}, after {after[key]}"))
    out.append(("no /dev/shm entry left", not end["shm_left"],
                f"used {end['shm_used']}, left {end['shm_left']}"))
    return out


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items()):
        epochs = [row["epoch"] for row in r["epochs"]]
        ax.plot(epochs, [row["total_rss"] / 2**20 for row in r["epochs"]], label="process + children")
        ax.plot(epochs, [row["rss"] / 2**20 for row in r["epochs"]], label="process")
        base = r["epochs"][min(2, len(epochs) - 1)]["pool_bytes"]
        ax.plot(epochs, [(row["total_rss"] - max(0, row["pool_bytes"] - base)) / 2**20
                         for row in r["epochs"]], linestyle=":",
                label="process + children - buffers the pool added after epoch 3")
        third = r["epochs"][min(2, len(epochs) - 1)]["total_rss"] / 2**20
        ax.axhline(third * (1 + RSS_GROWTH_LIMIT), color="grey", linestyle="--", linewidth=0.8,
                   label=f"epoch 3 + {RSS_GROWTH_LIMIT:.0%}")
        ax.set_title(f"{name}: RSS per epoch")
        ax.set_xlabel("epoch")
        ax.set_ylabel("MiB")
        ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=None, help="default 100 (8 with --quick)")
    p.add_argument("--quick", action="store_true", help="small data, 8 epochs")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--out", default="build/soak", help="directory for soak.json and rss.png")
    p.add_argument("--no-rss-check", action="store_true",
                   help="record RSS but do not check it (under AddressSanitizer RSS is mostly its "
                        "quarantine of freed memory, which fills up epoch after epoch)")
    p.add_argument("--run-scenario", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    epochs = args.epochs or (8 if args.quick else 100)
    if epochs < 3:
        p.error("--epochs must be at least 3 (the RSS baseline is epoch 3)")
    if args.run_scenario:
        run_scenario(args.run_scenario, epochs, args.quick)
        return 0

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results, failed = {}, False
    for name in args.scenarios.split(","):
        if name not in SCENARIOS:
            p.error(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
        print(f"== {name}: {epochs} epochs", flush=True)
        cmd = [sys.executable, os.path.abspath(__file__), "--run-scenario", name,
               "--epochs", str(epochs)] + (["--quick"] if args.quick else [])
        # One OpenBLAS thread: OpenBLAS stops its pool before every fork and starts it again on
        # its next call, which would change the thread count under the Python dataset's workers.
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
        lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        rows = [r for r in lines if "epoch" in r]
        if proc.returncode != 0 or len(rows) != epochs or "after" not in lines[-1]:
            print(f"   the scenario failed (exit {proc.returncode})")
            failed = True
            continue
        end = lines[-1]
        checks = verdicts(rows, end)
        if args.no_rss_check:
            checks = [c for c in checks if not c[0].startswith("rss")]
        results[name] = {"epochs": rows, "end": end,
                         "checks": [{"check": c, "ok": ok, "detail": d} for c, ok, d in checks]}
        print(f"   {end['batches']} batches, {sum(r['seconds'] for r in rows):.1f} s; "
              f"RSS at epoch 3: {rows[2]['total_rss'] / 2**20:.1f} MiB, at epoch {epochs}: "
              f"{rows[-1]['total_rss'] / 2**20:.1f} MiB", flush=True)
        for check, ok, detail in checks:
            print(f"   {'ok  ' if ok else 'FAIL'} {check}: {detail}", flush=True)
            failed |= not ok
    (out / "soak.json").write_text(json.dumps(results, indent=1) + "\n")
    if results:
        plot(results, out / "rss.png")
    print(f"wrote {out / 'soak.json'} and {out / 'rss.png'}")
    return 1 if failed else 0


if __name__ == "__main__":
    import record  # bench/record.py: this output also goes to bench/results/
    sys.exit(record.run(main))
