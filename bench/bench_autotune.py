"""Online autotune against the best static configuration, on the sample data.

Static configurations (num_workers x prefetch_factor) are measured first, then the autotuned
loader (num_workers and prefetch_factor "auto": it starts at the usable cores within the CPU
budget, src/engine/autotune.h, and the controller moves from there) runs for
`--seconds`; its throughput is tracked over a sliding 1 s window. Reported: the time at which the
window first reaches >= 90% of the best static throughput (target <= 10 s), and the controller's
decisions. The best static configuration is measured again after the autotuned run and the mean
of both measurements is the reference (drift on a shared machine).
"""

from __future__ import annotations

import argparse
import collections
import json
import time

import stoker
from stoker import _native
from stoker.tuning.tune import sample_dataset


def static(ds, workers, prefetch, seconds):
    knobs = [{"name": "num_workers", "values": [workers], "start": workers},
             {"name": "prefetch_factor", "values": [prefetch], "start": prefetch}]
    r = _native.tuning.tune_loader(ds._source, knobs, {"batch_size": 64, "shuffle": True, "seed": 0},
                            {"repeats": 1}, seconds)
    return r["points"][0]["samples_per_s"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--static-seconds", type=float, default=1.5)
    args = p.parse_args()
    ds = sample_dataset()
    cores = _native.engine.usable_cores()
    configs = [(w, pf) for w in sorted({1, 2, cores, cores + 1, 2 * cores}) for pf in (2, 4)]
    results = {f"{w}x{pf}": static(ds, w, pf, args.static_seconds) for w, pf in configs}
    best_key = max(results, key=results.get)
    bw, bp = (int(x) for x in best_key.split("x"))

    loader = stoker.DataLoader(ds, batch_size=64, shuffle=True, output="numpy")
    window = collections.deque()
    start = time.perf_counter()
    trace = []
    epoch = 0
    reached_at = None
    reference = results[best_key]
    while time.perf_counter() - start < args.seconds:
        loader.set_epoch(epoch)
        epoch += 1
        for x, _ in loader:
            now = time.perf_counter() - start
            window.append((now, len(x)))
            while window and window[0][0] < now - 1.0:
                window.popleft()
            if now >= 1.0:
                rate = sum(n for _, n in window) / 1.0
                trace.append((round(now, 2), round(rate)))
                if reached_at is None and rate >= 0.9 * reference:
                    reached_at = now
            if now > args.seconds:
                break
    after = static(ds, bw, bp, args.static_seconds)
    reference2 = (results[best_key] + after) / 2
    # Re-evaluate against the drift-corrected reference.
    reached2 = next((t for t, r in trace if r >= 0.9 * reference2), None)
    s = loader.stats()
    tail = [r for t, r in trace if t >= args.seconds - 3]
    out = {
        "static": results, "best_static": best_key, "best_static_after": after,
        "reference_samples_per_s": reference2,
        "time_to_90pct_s": reached2,
        "autotune_final": {"active_workers": s["active_workers"],
                           "prefetch_factor": s["prefetch_factor_now"]},
        "autotune_last_3s_samples_per_s": sum(tail) / len(tail) if tail else None,
        "decisions": [(round(d["time_s"], 2), d["num_workers"], d["prefetch_factor"], d["reason"])
                      for d in s["autotune"]],
    }
    print(json.dumps(out, indent=2))
    print(f"autotune reached 90% of the best static ({best_key}, "
          f"{reference2:.0f} samples/s) at t = "
          f"{'never' if reached2 is None else f'{reached2:.1f} s'} (target <= 10 s); "
          f"final {s['active_workers']} workers x prefetch {s['prefetch_factor_now']}")


if __name__ == "__main__":
    import sys

    import record  # bench/record.py: this output also goes to bench/results/
    sys.exit(record.run(main))
