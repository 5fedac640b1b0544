"""The messages between the training process and its workers (Python datasets), documented once.

Training process -> worker, on the worker's task pipe (pickled):

- ``Task``: produce one batch. Map-style: ``draws`` are its samples (batch_order.Draws).
  IterableDataset: ``draws`` is None and the worker takes the next batch of its own copy of the stream (a new stream when
  ``epoch`` changes). ``slot``: where in the shared arena the batch's arrays go (None: no buffer
  was free; the arrays travel pickled).
- ``STOP`` (an empty message): exit (exit code 0).

Worker -> training process, on the worker's result pipe (pickled):

- ``BatchDone``: the batch, encoded (batch_structure.EncodedBatch: its arrays in the slot, the
  rest pickled), and the samples on_error="skip" replaced on the way.
- ``TaskFailed``: a sample (or the collate function, or sending the batch) raised.
- ``StreamEnd``: an IterableDataset worker's stream is exhausted; it gets no more tasks this epoch.
- ``InitFailed``: the worker's start-up (worker_init_fn) raised; the worker exits.

Every message that answers a task names it by ``task_id``.
"""

from __future__ import annotations

import dataclasses

from .batch_order import Draws
from .batch_structure import EncodedBatch
from .remote_errors import RemoteError

STOP = b""


@dataclasses.dataclass(frozen=True)
class Slot:
    """A batch buffer of the shared arena: ``capacity`` bytes at byte ``offset``."""
    offset: int
    capacity: int


@dataclasses.dataclass(frozen=True)
class Task:
    task_id: int
    epoch: int
    batch_no: int  # the batch's number in the epoch (seeds samples fetched by non-integer keys)
    draws: Draws | None  # None: the next batch of an IterableDataset stream
    slot: Slot | None
    stream_seed: int | None = None  # IterDataPipe: the epoch's shared seed (torch's)


@dataclasses.dataclass(frozen=True)
class BatchDone:
    task_id: int
    batch: EncodedBatch
    samples: int  # samples in the batch
    skipped: list  # [(index, "Type: message")] replaced by on_error="skip"


@dataclasses.dataclass(frozen=True)
class TaskFailed:
    task_id: int
    error: RemoteError
    skipped: list


@dataclasses.dataclass(frozen=True)
class StreamEnd:
    task_id: int


@dataclasses.dataclass(frozen=True)
class InitFailed:
    error: RemoteError
    task_id = None  # it answers no task: a worker that could not start


Result = BatchDone | TaskFailed | StreamEnd
