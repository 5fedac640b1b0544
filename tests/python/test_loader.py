"""stoker.DataLoader: exact epochs, worker-count independence, resume, errors, shutdown, memory."""

import gc
import json
import random
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import stoker
from faulty import FaultyDataset

from conftest import blocked_in_futex, native_threads, wait_until


def index_dataset(n):
    return stoker.ArrayDataset(np.arange(n, dtype=np.int64))


def batches(loader):
    return [np.asarray(b).tolist() for b in loader]


def test_every_sample_exactly_once_over_random_configurations():
    rng = random.Random(0)
    for _ in range(120):
        n = rng.randint(1, 150)
        world = rng.randint(1, 4)
        kw = dict(batch_size=rng.randint(1, 12), shuffle=rng.random() < 0.5,
                  seed=rng.randrange(2**32), drop_last=rng.random() < 0.5,
                  num_workers=rng.choice([0, 1, 2, 4]), world_size=world, output="numpy")
        per_rank = [batches(stoker.DataLoader(index_dataset(n), rank=r, **kw))
                    for r in range(world)]
        assert len({len(b) for b in per_rank}) == 1, "ranks got different batch counts"
        seen = [v for rank in per_rank for b in rank for v in b]
        if kw["drop_last"]:
            assert len(seen) == len(set(seen)), "a sample was repeated"
            per = n // world
            assert len(seen) == world * (per // kw["batch_size"] * kw["batch_size"])
        else:
            assert set(seen) == set(range(n)), "a sample is missing"
            assert len(seen) == world * -(-n // world)  # padding by wrap-around only


@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_batches_identical_for_any_worker_count_and_prefetch(output):
    data = np.random.default_rng(1).standard_normal((1000, 7)).astype(np.float32)
    labels = np.arange(1000)

    def run(workers, prefetch):
        loader = stoker.DataLoader(stoker.ArrayDataset(data, labels), batch_size=33, shuffle=True,
                                   seed=5, num_workers=workers, prefetch_factor=prefetch,
                                   output=output)
        loader.set_epoch(2)
        return [(np.asarray(x).tobytes(), np.asarray(y).tobytes()) for x, y in loader]

    reference = run(0, "auto")
    for workers in (1, 2, 4):
        for prefetch in (1, 2, 6):
            assert run(workers, prefetch) == reference, (workers, prefetch)
    x, y = stoker.DataLoader(stoker.ArrayDataset(data, labels), batch_size=33, shuffle=True,
                             seed=5, output="numpy").__iter__().__next__()
    np.testing.assert_array_equal(x, data[y])  # rows travel with their labels


def test_epochs_reshuffle_and_same_epoch_repeats():
    loader = stoker.DataLoader(index_dataset(200), batch_size=10, shuffle=True, output="numpy")
    e0, e1 = batches(loader), batches(loader)  # each iteration is a new epoch
    assert e0 != e1
    loader.set_epoch(0)
    assert batches(loader) == e0
    assert sorted(sum(e0, [])) == list(range(200))


def test_resume_at_random_points_matches_uninterrupted_run():
    rng = random.Random(3)
    for _ in range(25):
        n, bs = rng.randint(30, 300), rng.randint(1, 9)
        kw = dict(batch_size=bs, shuffle=True, seed=rng.randrange(1000), output="numpy")
        full_loader = stoker.DataLoader(index_dataset(n), num_workers=2, **kw)
        full_loader.set_epoch(4)
        full = batches(full_loader)
        k = rng.randint(0, len(full))
        loader = stoker.DataLoader(index_dataset(n), num_workers=rng.choice([0, 1, 3]), **kw)
        loader.set_epoch(4)
        it = iter(loader)
        head = [np.asarray(next(it)).tolist() for _ in range(k)]
        state = json.loads(json.dumps(loader.state_dict()))
        del it
        if k == len(full):  # every batch consumed: the next batch is the next epoch's first
            assert (state["epoch"], state["batch"]) == (5, 0)
            continue
        resumed = stoker.DataLoader(index_dataset(n), num_workers=rng.choice([0, 2, 4]),
                                    prefetch_factor=rng.choice([1, 3]), **kw)
        resumed.load_state_dict(state)
        assert head + batches(resumed) == full
        assert resumed.state_dict()["epoch"] == 5 and resumed.state_dict()["batch"] == 0


def test_state_dict_rejects_a_different_configuration():
    state = stoker.DataLoader(index_dataset(50), batch_size=5, seed=1).state_dict()
    with pytest.raises(ValueError, match="batch_size=5 but this loader has batch_size=6"):
        stoker.DataLoader(index_dataset(50), batch_size=6, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        stoker.DataLoader(index_dataset(50), batch_size=5, seed=2).load_state_dict(state)


@pytest.mark.parametrize("workers", [0, 2])
def test_error_names_the_sample_and_the_loader_goes_on(workers, no_leaked_threads):
    loader = stoker.DataLoader(FaultyDataset(40, fail={13}), batch_size=4, num_workers=workers,
                               output="numpy")
    it = iter(loader)
    got = [next(it)[:, 0].tolist() for _ in range(3)]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    with pytest.raises(stoker.SampleError) as info:
        next(it)
    assert info.value.index == 13
    assert info.value.path == "sample-13.bin"
    assert "sample 13 (sample-13.bin): corrupt data" in str(info.value)
    assert isinstance(info.value.__cause__, stoker.DecodeError)
    assert next(it)[:, 0].tolist() == [16, 17, 18, 19]
    del it


def test_skip_replaces_deterministically_and_counts():
    def run(workers):
        loader = stoker.DataLoader(FaultyDataset(60, fail={5, 6, 41}), batch_size=8, shuffle=True,
                                   num_workers=workers, on_error="skip", output="numpy")
        return batches(loader), loader.stats()

    reference, stats = run(0)
    assert stats["skipped"] == 3
    assert any("sample-41.bin" in s for s in stats["skipped_samples"])
    flat = [row[0] for b in reference for row in b]
    assert len(flat) == 60 and not {5, 6, 41} & set(flat)
    assert run(4)[0] == reference


def test_break_and_garbage_collection_join_threads(no_leaked_threads):
    loader = stoker.DataLoader(FaultyDataset(10_000, delay_us=500), batch_size=4, num_workers=4)
    for i, _ in enumerate(loader):
        if i == 3:
            break
    it = iter(loader)
    next(it)
    assert native_threads() >= 4
    del it, loader


def test_exhausted_iterator_releases_threads_at_once():
    before = native_threads()
    loader = stoker.DataLoader(index_dataset(100), batch_size=10, num_workers=3)
    it = iter(loader)
    list(it)
    assert native_threads() == before  # no garbage collection needed


def test_ctrl_c_interrupts_a_waiting_consumer_and_shuts_down():
    script = textwrap.dedent("""
        import gc, os, signal, sys, time
        import stoker
        from faulty import FaultyDataset
        signal.signal(signal.SIGINT, signal.default_int_handler)  # even if SIGINT was ignored
        before = len(os.listdir("/proc/self/task"))
        loader = stoker.DataLoader(FaultyDataset(100, delay_us=2_000_000), batch_size=4,
                                   num_workers=2)
        try:
            print("iterating", flush=True)
            for batch in loader:
                pass
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        # The traceback held the iterator until the handler ended; now its threads are gone.
        print("threads left:", len(os.listdir("/proc/self/task")) - before, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "iterating"
    # Interrupt once the consumer is blocked waiting for its first batch (each sample takes 2 s).
    assert wait_until(lambda: blocked_in_futex(proc.pid, proc.pid))
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)  # a consumer that stays blocked fails here
    assert "interrupted\nthreads left: 0" in out, out
    assert proc.returncode == 0


def test_buffer_memory_stays_under_budget_for_a_larger_dataset():
    data = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (200_000, 256), (0, 0))
    ds = stoker.ArrayDataset(np.ascontiguousarray(data[:60_000]))  # 61 MB of rows
    budget = 4 * 2**20
    loader = stoker.DataLoader(ds, batch_size=256, num_workers=2, prefetch_factor=8,
                               memory_budget=budget, output="numpy")
    total = sum(len(b) for b in loader)
    assert total == 60_000
    stats = loader.stats()
    assert 0 < stats["buffer_bytes_peak"] <= budget
    assert stats["memory_budget"] == budget


@pytest.mark.parametrize("workers", [0, 2])
def test_keeping_every_batch_past_the_budget_raises_instead_of_hanging(workers):
    loader = stoker.DataLoader(index_dataset(1000), batch_size=10, num_workers=workers,
                               memory_budget=3 * 80, output="numpy")
    with pytest.raises(stoker.MemoryBudgetError, match="consumer holds all of them"):
        list(loader)


def test_memory_budget_accepts_sizes_and_rejects_nonsense():
    assert stoker.DataLoader(index_dataset(10), memory_budget="2MiB").memory_budget == 2**20 * 2
    with pytest.raises(ValueError, match="memory_budget"):
        stoker.DataLoader(index_dataset(10), memory_budget="lots")
    with pytest.raises(ValueError, match="more than memory_budget"):
        stoker.DataLoader(index_dataset(10), batch_size=10, memory_budget=79)


def test_rank_and_world_size_default_to_torchrun_environment(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = stoker.DataLoader(index_dataset(9), batch_size=1, output="numpy")
    assert (loader.rank, loader.world_size) == (2, 3)
    assert batches(loader) == [[2], [5], [8]]


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_size=0), "batch_size must be a positive integer"),
    (dict(batch_size=2.5), "batch_size must be a positive integer"),
    (dict(num_workers=-1), r'num_workers must be "auto" or an integer in \[0, 256\]'),
    (dict(num_workers="many"), "num_workers"),
    (dict(prefetch_factor=0), r'prefetch_factor must be "auto" or an integer in \[1, 64\]'),
    (dict(pin_memory="yes"), "pin_memory must be"),
    (dict(shuffle=1), "shuffle must be True, False, \"stratified\" or \"shards\""),
    (dict(seed=-1), "seed must be an integer"),
    (dict(rank=3, world_size=2), r"rank must be an integer in \[0, 2\)"),
    (dict(world_size=0), "world_size must be a positive integer"),
    (dict(output="jax"), 'output must be "torch" or "numpy"'),
    (dict(on_error="ignore"), 'on_error must be "raise" or "skip"'),
])
def test_invalid_arguments_say_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        stoker.DataLoader(index_dataset(10), **kwargs)


def test_rejects_what_is_not_a_dataset():
    with pytest.raises(TypeError, match="needs a dataset"):
        stoker.DataLoader(42)
    with pytest.raises(ValueError, match="for Python datasets"):
        stoker.DataLoader(index_dataset(4), collate_fn=list)


def test_auto_knobs_resolve_and_stats_report():
    loader = stoker.DataLoader(index_dataset(100), batch_size=10)
    assert loader.num_workers == stoker.usable_cores()
    assert loader.prefetch_factor == 2  # autotuned, small batches: starts at two per worker
    assert len(loader) == 10
    for _ in loader:
        pass
    s = loader.stats()
    assert s["batches"] == 10 and s["samples"] == 100 and s["skipped"] == 0
    assert s["read_s"] >= 0 and s["consumer_wait_s"] >= 0 and s["buffer_bytes_peak"] > 0


def test_pin_memory_without_cuda_warns_and_uses_pageable_memory():
    if stoker.cuda_available():
        pytest.skip("a CUDA device is present")
    with pytest.warns(UserWarning, match="no CUDA device"):
        loader = stoker.DataLoader(index_dataset(10), pin_memory=True)
    assert loader.pin_memory is False


def test_pinned_batches_on_a_gpu_machine():
    torch = pytest.importorskip("torch")
    if not (stoker.cuda_available() and torch.cuda.is_available()):
        pytest.skip("needs a CUDA device and a CUDA build of torch")
    loader = stoker.DataLoader(index_dataset(64), batch_size=8, pin_memory=True)
    batch = next(iter(loader))
    assert batch.is_pinned()
    assert batch.cuda(non_blocking=True).cpu().tolist() == list(range(8))


def test_batches_are_zero_copy_views_of_the_pool():
    loader = stoker.DataLoader(index_dataset(64), batch_size=8, num_workers=0, output="numpy")
    it = iter(loader)
    a = next(it)
    address = a.__array_interface__["data"][0]
    del a
    gc.collect()
    b = next(it)  # the freed buffer is recycled, not reallocated
    assert b.__array_interface__["data"][0] == address
