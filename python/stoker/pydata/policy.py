"""num_workers="auto" for a Python dataset: whether workers pay, decided from measured timings.

The decision is the engine's (``_native.tuning.ExecutorPolicy``; the rule, its thresholds and why they
are what they are: stoker/tuning/executor_policy.h). This module gives its answers the shape the
Python front uses: a ``Decision`` to stay in this process, start worker processes, or start worker
threads.
"""

from __future__ import annotations

import dataclasses

from .. import _native

_Native = _native.tuning.ExecutorPolicy
FORK_NOW_S = _Native.FORK_NOW_S
FORK_EPOCH_S = _Native.FORK_EPOCH_S
FORK_PERSISTENT_S = _Native.FORK_PERSISTENT_S
SPAWN_START_S = _Native.SPAWN_START_S
THREAD_GAIN = _Native.THREAD_GAIN
HELP_BATCH_S = _Native.HELP_BATCH_S


@dataclasses.dataclass(frozen=True)
class Decision:
    kind: str  # "stay" | "processes" | "threads"
    workers: int
    reason: str


STAY = Decision(*_Native.stay())


def _decision(answer):
    return STAY if answer[0] == "stay" else Decision(*answer)


class ExecutorPolicy:
    """Decides, for one loader, between producing in the training process and worker pools.

    ``cores``: usable cores. Processes: ``cores - 1`` workers (the training process keeps
    producing while it waits), at least 1, or ``cores`` when a batch of ``batch_size`` samples
    takes this process over HELP_BATCH_S to make; threads: ``cores``. ``forked``: workers start by fork
    (else spawn or forkserver). ``persistent``: workers are kept for later epochs.
    ``threads_allowed``: the dataset may run on threads (it declares ``thread_safe = True``; no
    per-sample seeding).
    """

    def __init__(self, cores, forked=True, persistent=False, threads_allowed=False, batch_size=1):
        self._native = _Native(cores, forked, persistent, threads_allowed, batch_size)

    @property
    def cores(self):
        return self._native.cores

    @property
    def pace(self):
        """The fastest seconds a sample measured so far."""
        return self._native.pace

    @property
    def start_s(self):
        """What a worker's start costs beyond a fork (SPAWN_START_S when not forked)."""
        return self._native.start_s

    @property
    def persistent(self):
        return self._native.persistent

    @property
    def threads_allowed(self):
        return self._native.threads_allowed

    def wants_thread_trial(self):
        return self._native.wants_thread_trial()

    def first_chunks(self, seconds_per_sample, rest_of_batch):
        """After two timed chunks of the first batch: start processes now when the batch's rest
        alone pays for them."""
        return _decision(self._native.first_chunks(seconds_per_sample, rest_of_batch))

    def thread_trial(self, one_thread_s, two_threads_s):
        """After two threads produced chunks side by side: seconds a sample on one thread (the
        pace so far) and on two at once (wall time over the samples both produced)."""
        return _decision(self._native.thread_trial(one_thread_s, two_threads_s))

    def after_batch(self, seconds_per_sample, samples_left):
        """After a batch produced here: start processes (for the batches after it) when the rest
        of the epoch at the fastest pace so far pays for them."""
        return _decision(self._native.after_batch(seconds_per_sample, samples_left))
