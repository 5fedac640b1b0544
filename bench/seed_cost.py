"""What per-sample seeding costs, written in place (rng_fields.py, stoker/pydata/global_seeder.h)
against the generators' public calls, and the fetch loop's cost a sample in each seeding mode.
One process, timeit; on a shared machine compare the ratios, not the absolute figures.

    .venv/bin/python bench/seed_cost.py
"""

import timeit

import torch

from stoker import _native
from stoker.pydata import seeding


class Identity:
    def __getitem__(self, i):
        return i


def per_sample(mode, indices):
    f = seeding.fetcher(0, mode)
    f.fetch(Identity(), 0, list(range(64)))  # past the probing samples
    return min(timeit.repeat(lambda: f.fetch(Identity(), 0, indices), number=200,
                             repeat=5)) / (200 * len(indices))


def main():
    key = _native.pydata.sample_key(1, 2, 3)
    native = seeding.global_seeder()
    public = seeding._slow_seed((False, False, False))
    gens = list(seeding.GENERATORS)
    t_public = min(timeit.repeat(lambda: public(key), number=500, repeat=5)) / 500
    t_manual = min(timeit.repeat(lambda: torch.manual_seed(key), number=5000, repeat=5)) / 5000
    print(f"public calls for the three generators: {t_public * 1e6:.2f} us a sample")
    print(f"torch.manual_seed alone: {t_manual * 1e6:.2f} us")
    if native is None:
        print("the generators' fields could not be located here: the public calls are used")
        return
    t_native = min(timeit.repeat(lambda: native.seed(key, gens), number=20000, repeat=5)) / 20000
    print(f"written in place, three generators: {t_native * 1e6:.2f} us a sample "
          f"({t_public / t_native:.0f}x less)")
    idx = list(range(256))
    off, always, adaptive = (per_sample(m, idx) for m in (False, "always", True))
    print(f"fetch loop a sample, a dataset that draws from none: off {off * 1e6:.3f} us, "
          f"always {always * 1e6:.3f} us, adaptive {adaptive * 1e6:.3f} us")


if __name__ == "__main__":
    import sys

    import record  # bench/record.py: this output also goes to bench/results/
    sys.exit(record.run(main))
