"""The errors of stoker.remote. Every message names the URL; ``url`` holds it; ``__cause__`` is
the object-store client's own exception, when there is one."""

from __future__ import annotations


class RemoteError(OSError):
    """Reading a remote object failed (after the retries the store's options allow)."""

    def __init__(self, message: str, url: str):
        super().__init__(message)
        self.url = url

    def __str__(self) -> str:
        return self.args[0]

    def __reduce__(self):
        return (type(self), (self.args[0], self.url))


class RemoteAuthError(RemoteError):
    """A credentials problem: the store answered 401 or 403, or no credentials could be found.
    The message says which environment variables and options supplied them (never their values)."""


class RemoteNotFound(RemoteError, FileNotFoundError):
    """The object (or the prefix, or the bucket) does not exist."""
