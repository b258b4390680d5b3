"""What every process of a run does first: die with its parent, one thread, a name.

PR_SET_PDEATHSIG makes the kernel SIGKILL a run's process when its parent
(the forkserver, which itself exits when the supervisor dies) goes away, so a
killed supervisor cannot leave learners or a syncer behind.
"""

from __future__ import annotations

import ctypes
import os
import signal

import torch

PR_SET_PDEATHSIG = 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def become_run_process(parent_pid: int | None = None) -> None:
    """Tie this process's life to its parent (the forkserver) and use one compute thread."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the supervisor's own cleanup still applies
        pass
    if parent_pid is not None and not _alive(parent_pid):
        os._exit(1)  # the supervisor died before prctl took effect
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to handle
    torch.set_num_threads(1)
