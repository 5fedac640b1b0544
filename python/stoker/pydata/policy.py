"""num_workers="auto" for a Python dataset: whether workers pay, decided from measured timings.

The training process produces an epoch's first batches itself (torch's num_workers=0 semantics)
and feeds the policy what it measured: the seconds a sample took (the faster of two timed chunks
of the first batch: the first chunk pays one-time costs; then the fastest batch so far), and, for
a dataset that allows it, how fast two threads went side by side. The policy answers with a
Decision: stay in this process, start worker processes, or start worker threads. It decides from
those numbers alone (no clock of its own), so its tests feed it synthetic timings.

Why these thresholds (measured on the light and heavy benches, bench/bench_python_datasets.py):
a fork costs the parent its page tables' copy (~7 ms for 300 MB) and the child its first
copy-on-write faults, and a second process's RSS, which a short epoch does not win back (forked
after the second batch of the light bench's 0.25 s epoch: 564k against 565k samples/s, 164 MiB more
RSS). So processes start at once when the rest of the first batch alone would take over
FORK_NOW_S, or later when the rest of the epoch would take over FORK_EPOCH_S (FORK_PERSISTENT_S with
persistent workers, whose start is paid once for every later epoch). A worker that is spawned (or
forked by a forkserver) imports torch first: its start costs SPAWN_START_S more. Threads win when
two threads together take under THREAD_GAIN of one thread's time a sample (the work releases the
GIL).
"""

from __future__ import annotations

import dataclasses

FORK_NOW_S = 0.02
FORK_EPOCH_S = 0.5
FORK_PERSISTENT_S = 0.1
SPAWN_START_S = 2.0
THREAD_GAIN = 0.75


@dataclasses.dataclass(frozen=True)
class Decision:
    kind: str  # "stay" | "processes" | "threads"
    workers: int
    reason: str


STAY = Decision("stay", 0, "the measured work does not pay for workers")


class ExecutorPolicy:
    """Decides, for one loader, between producing in the training process and worker pools.

    ``cores``: usable cores. Processes: ``cores - 1`` workers (the training process keeps
    producing while it waits), at least 1; threads: ``cores``. ``forked``: workers start by fork
    (else spawn or forkserver). ``persistent``: workers are kept for later epochs.
    ``threads_allowed``: the dataset may run on threads (it declares ``thread_safe = True``; no
    per-sample seeding).
    """

    def __init__(self, cores, forked=True, persistent=False, threads_allowed=False):
        self.cores = max(1, cores)
        self.start_s = 0.0 if forked else SPAWN_START_S
        self.persistent = persistent
        self.threads_allowed = threads_allowed
        self.pace = float("inf")  # the fastest seconds a sample measured so far

    @property
    def processes(self):
        return Decision("processes", max(1, self.cores - 1), "")

    def wants_thread_trial(self):
        return self.threads_allowed and self.cores > 1

    def first_chunks(self, seconds_per_sample, rest_of_batch):
        """After two timed chunks of the first batch: start processes now when the batch's rest
        alone pays for them."""
        self.pace = min(self.pace, seconds_per_sample)
        work = self.pace * rest_of_batch
        if work > FORK_NOW_S + self.start_s:
            return dataclasses.replace(
                self.processes, reason=f"the first batch's rest takes {work * 1e3:.0f} ms here")
        return STAY

    def thread_trial(self, one_thread_s, two_threads_s):
        """After two threads produced chunks side by side: seconds a sample on one thread (the
        pace so far) and on two at once (wall time over the samples both produced)."""
        if two_threads_s < THREAD_GAIN * one_thread_s:
            return Decision("threads", self.cores,
                            f"two threads took {two_threads_s / one_thread_s:.2f}x one "
                            f"thread's time a sample: the work releases the GIL")
        return STAY

    def after_batch(self, seconds_per_sample, samples_left):
        """After a batch produced here: start processes (for the batches after it) when the rest
        of the epoch at the fastest pace so far pays for them."""
        self.pace = min(self.pace, seconds_per_sample)
        work = self.pace * samples_left
        pays = (FORK_PERSISTENT_S if self.persistent else FORK_EPOCH_S) + self.start_s
        if work > pays:
            return dataclasses.replace(
                self.processes, reason=f"the rest of the epoch takes {work:.2f} s here")
        return STAY
