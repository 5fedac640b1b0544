import gc
import os
import time

import pytest

# The references the image tests hold Stoker to (torchvision's affine and rotate) build their
# sampling grid with a batched matmul, which MKL runs with AVX-512 kernels where the processor has
# them: their sums round differently in the last bit, and about one pixel in a thousand then
# rounds to a neighbouring value (max difference 1). MKL's conditional numerical reproducibility
# pins the AVX2 code path, so the reference is the same on every machine; it is read when MKL
# starts, before any test imports torch.
os.environ.setdefault("MKL_CBWR", "AVX2")

# The test doubles beside this file (faulty.py, gpu_emulation.py) are importable in every process
# the tests start: worker processes and Ray's workers unpickle FaultyDataset by module name.
_HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + [_HERE])

# The ASan/UBSan lane of tools/run_tests.py runs this suite against build/pyasan/site.
ASAN_LANE = os.environ.get("STOKER_EXPECT_ASAN") == "1"


def _fork_only_after_exited_threads():
    """ASan lane: every fork waits until the Python threads that have finished are gone from the
    kernel too.

    GCC's ASan allocator has no fork handler: a child forked while another thread holds one of its
    locks waits on that lock forever. On Python 3.11, ``Thread.join()`` returns before the thread's
    native exit (which frees its thread state and ASan's per-thread caches through that
    allocator), so a fork right after a join could hang the child: 7 forks in 2,000 did after a
    ``threading.Timer`` was cancelled and joined, as pytest-timeout does after each test; one such
    hang failed a CI run. glibc's malloc, in the other lanes and for users, locks itself around
    fork. The wait is on an observed condition (the thread's /proc entry), not on a guess of time.
    """
    import threading

    started = set()  # native ids of the Python threads started since
    bootstrap = threading.Thread._bootstrap_inner

    def recording_bootstrap(self):
        started.add(threading.get_native_id())
        bootstrap(self)

    def before_fork():
        running = {t.native_id for t in threading.enumerate()}
        end = time.monotonic() + 10
        while True:
            started.intersection_update(int(tid) for tid in os.listdir("/proc/self/task"))
            if not started - running or time.monotonic() > end:
                return
            time.sleep(0.0002)

    threading.Thread._bootstrap_inner = recording_bootstrap
    os.register_at_fork(before=before_fork)


if ASAN_LANE:
    _fork_only_after_exited_threads()


def pytest_sessionstart(session):
    if not ASAN_LANE:
        return
    import stoker._native as native

    with open("/proc/self/maps") as f:
        maps = f.read()
    site = os.path.join("build", "pyasan", "site")
    if site not in native.__file__ or "libasan" not in maps:
        pytest.exit(f"ASan lane: the extension {native.__file__} is not the ASan build in {site} "
                    "or libasan is not loaded (make ext-asan; see tools/run_tests.py)", 2)


# Tests marked `slow`: `make check` (tools/run_tests.py --quick) leaves them out with
# `-m "not slow"`; `make test` runs them in every Python lane. A module is slow as a whole when
# each of its tests pays the same start-up; otherwise single tests are listed: each took over
# about 5 s in `pytest --durations` on the 2-core development machine (measured while two C++
# builds ran beside it, so the times are pessimistic; the figures below are from that run).
SLOW_MODULES = {
    # Each test starts or joins a local Ray instance (GCS, raylet, worker processes) and actors:
    # 4-12 s a test, ~100 s for the module.
    "test_ray.py",
    # Two torchrun "nodes" of 2 ranks, one killed, then a 3-rank resume: a dozen interpreters
    # importing torch, rendezvous and barrier timeouts (37 s).
    "test_torchrun.py",
    # 8 epochs of two scenarios, each in a fresh process that imports torch
    # (bench/soak.py --quick; 39 s).
    "test_soak.py",
    # A fresh virtual environment with the wheel and numpy installed, auditwheel runs (15 s); and
    # it needs `make wheel`, which make test runs and make check does not (a stale dist/ wheel).
    "test_wheel.py",
    # The trainers people use, run for real (Lightning, transformers' Trainer, Accelerate, DCP):
    # each imports its framework (2-6 s), the multi-process ones start 2-3 interpreters that
    # import torch and the framework. They test the front's integration, not memory safety:
    # the release lane runs them, the ASan lane need not.
    "test_integration_lightning.py",
    "test_integration_transformers.py",
    "test_integration_accelerate.py",
    "test_integration_dcp.py",
}
SLOW_TESTS = {  # "module::function" (every parametrization) or "module::function[id]"
    # Builds a 600-image sample data set from the photographs (64 s).
    "test_sample_data.py::test_statistics_default_build",
    # Builds the small sample data set three times to compare the bytes (6.5 s).
    "test_sample_data.py::test_deterministic",
    # A child interpreter importing torch, a dataset that sleeps 2 s a sample, then SIGINT (16 s).
    "test_loader.py::test_ctrl_c_interrupts_a_waiting_consumer_and_shuts_down",
    # A child interpreter importing torch with 2 worker processes, then SIGINT (15 s).
    "test_python_datasets.py::test_ctrl_c_stops_workers",
    # Workers started by spawn and forkserver: each imports torch afresh (15 s and 11 s).
    "test_torch_semantics.py::"
    "test_every_multiprocessing_context_gives_the_same_batches_in_shared_memory[spawn]",
    "test_torch_semantics.py::"
    "test_every_multiprocessing_context_gives_the_same_batches_in_shared_memory[forkserver]",
    # Signal tests: a child interpreter (and its workers) per case, each importing torch, waited
    # on until the state the signal must hit is observed (4-14 s a case).
    "test_faults.py::test_signal_while_the_native_consumer_waits_for_its_first_batch",
    "test_faults.py::test_signal_to_a_python_dataset_consumer_leaves_no_worker",
    "test_faults.py::test_parent_killed_leaves_no_worker_and_nothing_in_dev_shm",
    # Two gloo processes, each importing torch, make loaders before their process group (6 s).
    "test_ranks.py::test_a_process_group_made_after_the_loader_splits_the_epoch",
    "test_ranks.py::test_ranks_that_disagree_raise_on_every_rank_naming_the_one_that_differs",
    # Worker processes by forkserver, each importing torch (~8 s).
    "test_remote_datasets.py::test_a_python_transform_runs_in_clean_worker_processes",
    # Over 5 s in a fresh-clone `make test` (2026-11-29, the release lane; 11-17 s in the ASan
    # lane): a worker process importing torch rebuilds a remote dataset (13 s); a throttled S3
    # proxy for diagnose's network figure (8 s); `stoker index` over local and remote shards (5 s);
    # stats, tune and diagnose over two tables (5.6 s); torchvision's side of pad, rotate and
    # gaussian blur on the full-size photographs (5.6-7.4 s a case: the small and odd-sized
    # images of the same tests stay in every lane); RandAugment's draws over 200 images (6.4 s).
    "test_remote_datasets.py::test_a_worker_process_rebuilds_a_remote_dataset_from_the_cache",
    "test_remote_datasets.py::test_diagnose_names_the_network_when_shards_arrive_slowly",
    "test_remote_datasets.py::test_stoker_index_writes_sidecars_local_and_remote",
    "test_tables.py::test_stats_tune_and_diagnose_accept_a_table",
    "test_vision_warp_ops.py::test_pad[coffee-constant]",
    "test_vision_warp_ops.py::test_pad[astronaut-constant]",
    "test_vision_warp_ops.py::test_rotate[astronaut]",
    "test_vision_color_ops.py::test_gaussian_blur_agrees_within_one_step[astronaut]",
    "test_vision_color_ops.py::test_gaussian_blur_agrees_within_one_step[coffee]",
    "test_vision_recipes.py::test_rand_augment_draws_an_operation_of_torchvisions_space",
}


def _is_slow(item):
    name = item.path.name
    return (name in SLOW_MODULES or f"{name}::{item.name}" in SLOW_TESTS
            or f"{name}::{getattr(item, 'originalname', item.name)}" in SLOW_TESTS)


def pytest_collection_modifyitems(session, config, items):
    """Marks the slow tests (above). The Ray tests run last: Ray leaves threads in this process
    after ray.shutdown() (gRPC's timers among them) that wake and allocate; a later fork copies
    whatever lock one of them holds at that instant, and in the ASan lane the allocator's is one
    a child then waits on forever."""
    for item in items:
        if _is_slow(item):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.path.name == "test_ray.py")  # stable: the rest keep order


def wait_until(condition, timeout=30.0):
    """Polls ``condition()`` until it is true (returns True) or ``timeout`` seconds pass (False):
    a test acts on a state it observes, not on a sleep that makes the state likely."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True


def blocked_in_futex(pid, tid):
    """True when thread ``tid`` of process ``pid`` sleeps in a futex wait (a lock or a condition
    variable): /proc/<pid>/task/<tid>/wchan."""
    try:
        with open(f"/proc/{pid}/task/{tid}/wchan") as f:
            return f.read().startswith("futex")
    except OSError:
        return False


def native_threads():
    """Threads of this process, native ones included."""
    return len(os.listdir("/proc/self/task"))


@pytest.fixture
def no_leaked_threads():
    """Fails the test if it leaves threads behind."""
    gc.collect()
    before = native_threads()
    yield
    gc.collect()
    assert native_threads() == before, "the test left threads running"


# stoker.remote's tests run against servers on 127.0.0.1 (remote_servers.py): moto's S3 (a child
# process, one for the session: it takes ~1 s to start), a directory over HTTP that also plays the
# Hugging Face Hub, and fault-injecting proxies in front of either.
@pytest.fixture(scope="session")
def s3_server():
    """An S3Server: ``url`` (the endpoint), ``put(bucket, {key: bytes})``, ``env()`` (the
    AWS_* variables that reach it, with its one valid key)."""
    pytest.importorskip("moto")
    from remote_servers import S3Server

    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture
def http_server(tmp_path_factory):
    """A FileServer on an empty directory (``root``), the Hub's URL shapes included."""
    from remote_servers import FileServer

    server = FileServer(tmp_path_factory.mktemp("http")).start()
    yield server
    server.stop()


@pytest.fixture
def fault_proxy():
    """``fault_proxy(upstream_url)`` starts a FaultProxy in front of it (stopped after the test)."""
    from remote_servers import FaultProxy

    proxies = []

    def start(upstream):
        proxies.append(FaultProxy(upstream).start())
        return proxies[-1]

    yield start
    for proxy in proxies:
        proxy.stop()
