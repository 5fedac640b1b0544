"""`stoker tune` against an exhaustive grid over the same knobs, on the built-in sample data.

Both use the same native measurement (bare loader, no model; RandomResizedCrop(224) + flip +
ToTensor + Normalize) with the same repeats and seconds per measurement. The grid's best and the
tuner's recommendation are then re-measured side by side, interleaved (A B A B ...), so machine
drift hits both. Targets: recommendation >= 95% of the grid's best throughput, tuner measuring
time <= 30% of the grid's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

from stoker import _native
from stoker.tuning.tune import default_knobs, sample_dataset, tune_loader


def measure(ds, config, batch_size, seconds):
    base = {"batch_size": batch_size, "shuffle": True, "seed": 0}
    knobs = [{"name": k, "values": [v], "start": v} for k, v in config.items()]
    r = _native.tuning.tune_loader(ds._source, knobs, {**base, "min_batches": 2}, {"repeats": 1}, seconds)
    return r["points"][0]["samples_per_s"], r["measuring_seconds"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seconds", type=float, default=0.3)
    p.add_argument("--batch-sizes", default="32,64,128")
    p.add_argument("--confirm-rounds", type=int, default=4)
    args = p.parse_args()
    ds = sample_dataset()
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    knobs = default_knobs(batch_sizes=batch_sizes, batch_size=64)
    print(f"cores: {_native.engine.usable_cores()}; knobs: "
          + ", ".join(f"{k['name']}={k['values']}" for k in knobs))

    t0 = time.perf_counter()
    tuned = tune_loader(ds, knobs=knobs, batch_size=64, repeats=args.repeats,
                        seconds=args.seconds)
    tuner_wall = time.perf_counter() - t0
    tuner_configs = len({tuple(sorted((k, v) for k, v in pt.items() if k in
                                      {kn["name"] for kn in knobs})) for pt in tuned["points"]})

    grid = {}
    grid_measuring = 0.0
    t0 = time.perf_counter()
    names = [k["name"] for k in knobs]
    for values in itertools.product(*[k["values"] for k in knobs]):
        config = dict(zip(names, values))
        runs = []
        for _ in range(args.repeats):
            v, s = measure(ds, config, 64, args.seconds)
            runs.append(v)
            grid_measuring += s
        grid[values] = statistics.mean(runs)
    grid_wall = time.perf_counter() - t0
    best_values = max(grid, key=grid.get)
    grid_best = dict(zip(names, best_values))
    rec = {k: int(v) for k, v in tuned["recommended"].items()}

    # Side by side, interleaved: the grid's best and the tuner's recommendation.
    a, b = [], []
    for _ in range(args.confirm_rounds):
        a.append(measure(ds, grid_best, 64, 2 * args.seconds)[0])
        b.append(measure(ds, rec, 64, 2 * args.seconds)[0])
    grid_tp, tuner_tp = statistics.median(a), statistics.median(b)
    out = {
        "grid_configs": len(grid), "tuner_configs": tuner_configs,
        "grid_best": grid_best, "grid_best_samples_per_s_in_grid": grid[best_values],
        "tuner_recommended": rec,
        "grid_best_remeasured": grid_tp, "tuner_recommended_remeasured": tuner_tp,
        "throughput_ratio": tuner_tp / grid_tp,
        "grid_measuring_s": grid_measuring, "tuner_measuring_s": tuned["measuring_seconds"],
        "measuring_time_ratio": tuned["measuring_seconds"] / grid_measuring,
        "grid_wall_s": grid_wall, "tuner_wall_s": tuner_wall,
    }
    print(json.dumps(out, indent=2))
    print(f"tuner/grid throughput {out['throughput_ratio']:.3f} (target >= 0.95), measuring time "
          f"{out['measuring_time_ratio']:.3f} (target <= 0.30): "
          f"{tuner_configs} of {len(grid)} configurations")


if __name__ == "__main__":
    import sys

    import record  # bench/record.py: this output also goes to bench/results/
    sys.exit(record.run(main))
