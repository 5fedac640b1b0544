"""Errors that cross from a worker to the training process (Python datasets).

A worker catches the exception of a sample (or of its worker_init_fn, or of sending a batch) and
packs it as a RemoteError: the exception itself, pickled when it can be, and always its type,
message and formatted traceback. The training process raises it as a ``stoker.SampleError`` that
is also an instance of the original type when the two can mix (so ``except ValueError`` works as
with torch), with the sample's index, the worker's traceback in the message and the original
exception as ``__cause__``. A worker that dies raises ``stoker.WorkerError`` with torch's wording.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import traceback

from ..errors import SampleError, WorkerError


@dataclasses.dataclass(frozen=True)
class RemoteError:
    """An exception raised in a worker, as it travels to the training process."""
    index: object  # the sample's index (None: not a sample's: worker_init_fn, a whole batch)
    type_name: str  # module-qualified name of the exception's type
    message: str
    traceback: str  # formatted, as the worker saw it
    pickled: bytes | None  # the exception itself, when it pickles and unpickles
    worker_id: int | None  # None: raised in the training process
    pid: int


def pack(exc: BaseException, worker_id: int | None, index=None) -> RemoteError:
    """The RemoteError of ``exc`` (its ``_stoker_index`` names the sample, else ``index``)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)
    except Exception:
        blob = None
    kind = type(exc)
    return RemoteError(getattr(exc, "_stoker_index", index),
                       f"{kind.__module__}.{kind.__qualname__}", str(exc), text, blob, worker_id,
                       os.getpid())


_ERROR_CLASSES: dict[type, type] = {}


def error_class(exc_type):
    """A SampleError that is also an instance of ``exc_type`` (so ``except ValueError`` catches
    it, as with torch), or plain SampleError when the two cannot mix."""
    if exc_type is None or not issubclass(exc_type, Exception) or issubclass(exc_type,
                                                                              SampleError):
        return SampleError
    cls = _ERROR_CLASSES.get(exc_type)
    if cls is None:
        try:
            cls = type("SampleError", (SampleError, exc_type),
                       {"__module__": "stoker.errors", "__str__": SampleError.__str__,
                        "__reduce__": lambda self: (SampleError, (str(self), self.index))})
            cls("probe", 0)
        except Exception:
            cls = SampleError
        _ERROR_CLASSES[exc_type] = cls
    return cls


def to_exception(err: RemoteError) -> SampleError:
    """The exception the training process raises for ``err``."""
    cause = None
    if err.pickled is not None:
        try:
            cause = pickle.loads(err.pickled)
        except Exception:
            cause = None
    if not isinstance(cause, BaseException):
        cause = RuntimeError(f"{err.type_name}: {err.message}")
    where = (f"DataLoader worker process {err.worker_id} (pid {err.pid})"
             if err.worker_id is not None else "the training process")
    what = f"sample {err.index}" if err.index is not None else "a batch"
    short = err.type_name.rsplit(".", 1)[-1]
    text = (f"{what}: {short}: {err.message}\n\nCaught {short} in {where}.\n"
            f"Original {err.traceback}")
    exc = error_class(type(cause))(text, err.index)
    exc.__cause__ = cause
    return exc


def local_exception(exc: BaseException) -> BaseException:
    """The exception to raise for ``exc``, raised by a sample in this process: the same
    SampleError as a worker's (``_stoker_index`` names the sample), chained to it."""
    if not isinstance(exc, Exception):
        return exc
    index = getattr(exc, "_stoker_index", None)
    what = f"sample {index}" if index is not None else "a batch"
    err = error_class(type(exc))(f"{what}: {type(exc).__qualname__}: {exc}", index)
    err.__cause__ = exc
    return err


def worker_died(worker_id: int, pid: int, exitcode: int | None) -> WorkerError:
    """The error for a worker that ended without being asked to, worded as torch words it."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.strsignal(-exitcode) or signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        text = f"DataLoader worker (pid {pid}) is killed by signal: {name}. "
    else:
        text = f"DataLoader worker (pid(s) {pid}) exited unexpectedly (exit code {exitcode})"
    return WorkerError(text, worker=worker_id, pid=pid)
