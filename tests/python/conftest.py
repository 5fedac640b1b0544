import gc
import os

import pytest


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
