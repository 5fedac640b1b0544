"""Seeding for Python datasets: worker seeds as torch gives them, and per-sample seeds.

Worker seeds: each iterator (epoch) draws a 63-bit base seed: from ``generator`` when the loader
has one, else from the loader's ``seed`` and the epoch. Worker ``w`` seeds ``random``, torch and
``numpy.random`` from ``base + w`` before ``worker_init_fn`` runs, as torch does
(``get_worker_info().seed == torch.initial_seed()`` there).

Per-sample seeds (``seed_samples``, default True): before ``dataset[i]`` runs, the three global
generators get states derived from the sample's key, ``_native.pydata.sample_key(seed, epoch, i)`` (63
bits; ``torch.initial_seed()`` reports it), so a sample's randomness does not depend on which
worker ran it (stoker/pydata/sample_fetcher.h has the adaptive rule). A generator that
``worker_init_fn`` seeded (or drew from) is left to it in that worker: the user's seeding wins.
"""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch

from .. import _native
from . import rng_fields

GENERATORS = ("random", "numpy", "torch")
_located = None  # a _native.pydata.GlobalSeeder; False where the fields could not be located


def global_seeder():
    """The native writer of the generators' fields (rng_fields.py), or None."""
    global _located
    if _located is None:
        _located = rng_fields.locate() or False
    return _located or None


def base_seed(seed, epoch, generator=None):
    """The 63-bit base of an epoch's worker seeds: drawn from ``generator`` when given (as torch
    draws it), else derived from (seed, epoch)."""
    if generator is not None:
        return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item()) \
            & _native.pydata.SEED_MASK
    return _native.engine.hash_key(seed, epoch, 0x5EED_0F_3A7E) >> 1


def seed_worker(base, worker_id):
    """Seeds this worker's generators as torch seeds its workers; returns the worker's seed."""
    seed = (base + worker_id) & _native.pydata.SEED_MASK
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed([seed & 0xFFFFFFFF, seed >> 32, worker_id])
    return seed


def snapshot():
    """The three generators' states through their public calls (to compare, not to restore)."""
    return (random.getstate(), np.random.get_state(legacy=True)[1:],
            torch.default_generator.get_state())


def changed(before):
    """Which generators (random, numpy, torch) differ from ``before`` (a snapshot())."""
    now = snapshot()
    return (now[0] != before[0],
            not (np.array_equal(now[1][0], before[1][0]) and now[1][1:] == before[1][1:]),
            not torch.equal(now[2], before[2]))


def _slow_seed(leave_alone):
    """Seeding through the public calls, with the states the native writer gives."""
    def seed(key):
        if not leave_alone[0]:
            random.setstate((3, tuple(_native.pydata.mt19937_state(key, "random")) + (624,), None))
        if not leave_alone[1]:
            np.random.set_state(("MT19937", np.array(_native.pydata.mt19937_state(key, "numpy"),
                                                     np.uint32), 624, 0, 0.0))
        if not leave_alone[2]:
            torch.default_generator.set_state(
                rng_fields.torch_state(key, _native.pydata.mt19937_state(key, "torch")))
    return seed


def fetcher(seed, seed_samples, leave_alone=(False, False, False), skip=False, size=0):
    """A ``_native.pydata.SampleFetcher`` for this process: ``seed_samples`` True (adaptive), "always"
    or False; ``leave_alone``: per generator, whether a worker_init_fn owns it here."""
    mode = {True: "adaptive", "always": "always", False: "off"}[seed_samples]
    native = global_seeder() if mode != "off" else None
    slow = _slow_seed(leave_alone) if mode != "off" and native is None else None
    return _native.pydata.SampleFetcher(seed, mode, native, slow, list(leave_alone), skip, size)


@contextlib.contextmanager
def caller_states_kept(active=True):
    """Runs samples in the training process (seeding the global generators per sample) and gives
    the caller its generator states back afterwards (~1 us natively, ~70 us otherwise)."""
    if not active:
        yield
        return
    native = global_seeder()
    if native is not None:
        saved = native.save()
        try:
            yield
        finally:
            native.restore(saved)
        return
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
