"""What every process of a run does first: die with the supervisor, one thread, ignore Ctrl-C.

Two independent guarantees that a killed supervisor leaves nothing behind:

* PR_SET_PDEATHSIG: the kernel SIGKILLs this process when its parent, the
  forkserver, exits. The forkserver exits when the supervisor's "alive" pipe
  closes, but every forkserver child inherits that pipe's write end (so that
  it could start processes of its own); a run process closes it at once, or
  the forkserver would wait for its own children forever.
* A watchdog thread that exits the process within `WATCHDOG_S` of the
  supervisor's pid disappearing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

import torch

PR_SET_PDEATHSIG = 1
WATCHDOG_S = 1.0
GIL_SWITCH_S = 0.0002


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cpu_seconds() -> float:
    """User + system CPU time this process has used so far."""
    t = os.times()
    return round(t.user + t.system, 3)


def _close_inherited_forkserver_fd() -> None:
    from multiprocessing import forkserver

    fs = forkserver._forkserver  # the stdlib keeps the inherited fd here; it has no public accessor
    fd = getattr(fs, "_forkserver_alive_fd", None)  # private, absent from the stubs
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
        fs._forkserver_alive_fd = None  # type: ignore[attr-defined]


def _watchdog(supervisor_pid: int) -> None:
    stop = threading.Event()
    while not stop.wait(WATCHDOG_S):
        if not pid_alive(supervisor_pid):
            os._exit(70)


def become_run_process(supervisor_pid: int | None = None) -> None:
    """Tie this process's life to the supervisor's and use one compute thread."""
    _close_inherited_forkserver_fd()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the watchdog still applies
        pass
    if supervisor_pid is not None:
        if not pid_alive(supervisor_pid):
            os._exit(70)  # the supervisor died before we got here
        threading.Thread(target=_watchdog, args=(supervisor_pid,), name="watchdog", daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to handle
    torch.set_num_threads(1)
    # The link's I/O threads hold the GIL only briefly; a short switch interval stops the training
    # thread from waiting the default 5 ms for it after each torch op (measured: bench/harness_overhead.py).
    sys.setswitchinterval(GIL_SWITCH_S)
