"""Stoker's Python exception types (the native engine raises these)."""


class SampleError(RuntimeError):
    """A sample failed while being produced. ``index`` and ``path`` name it; ``__cause__`` is the
    original error (a :class:`DecodeError`, an ``OSError``, ...)."""

    def __init__(self, message, index, path=""):
        super().__init__(message)
        self.index = index
        self.path = path or None

    def __reduce__(self):
        return (type(self), (str(self), self.index, self.path or ""))


class DecodeError(ValueError):
    """Input data that cannot be decoded: corrupt, truncated, empty, unsupported or too large."""


class TemplateError(ValueError):
    """A chat template called raise_exception(message): the message is the template's."""


class MemoryBudgetError(MemoryError):
    """The memory budget cannot hold what was asked for (for example, every batch is kept)."""


class WorkerError(RuntimeError):
    """A worker process of a Python dataset died (killed by a signal, or exited): ``worker`` and
    ``pid`` name it, and the message names the signal."""

    def __init__(self, message, worker=None, pid=None):
        super().__init__(message)
        self.worker = worker
        self.pid = pid

    def __reduce__(self):
        return (type(self), (str(self), self.worker, self.pid))


_REMOTE = ("RemoteAuthError", "RemoteError", "RemoteNotFound")


def __getattr__(name):
    """stoker.remote's errors (RemoteError and its kinds), defined there and loaded on first use:
    importing stoker.remote here would add its imports to every ``import stoker``."""
    if name in _REMOTE:
        from .remote import _errors

        return getattr(_errors, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
