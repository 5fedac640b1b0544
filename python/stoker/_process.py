"""Facts about other processes, from this one."""

import os


def pid_alive(pid: int) -> bool:
    """True while a process with this pid exists, whether or not it is ours to signal.
    (A recycled pid reads as alive: callers use it where a false "alive" only delays cleanup.)"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
