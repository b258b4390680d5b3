"""What every process of a run does first: die with the supervisor, one thread, ignore Ctrl-C, and the
numeric and memory settings every chip trains with (subnormals flushed to zero, no heap trimming per step).

Two independent guarantees that a killed supervisor leaves nothing behind:

* PR_SET_PDEATHSIG: the kernel SIGKILLs this process when its parent, the
  forkserver, exits. The forkserver exits when the supervisor's "alive" pipe
  closes, but every forkserver child inherits that pipe's write end (so that
  it could start processes of its own); a run process closes it at once, or
  the forkserver would wait for its own children forever.
* A watchdog thread that exits the process within `WATCHDOG_S` of the
  supervisor's pid disappearing.

And the supervisor's side of the same job: signalling a run process with its descendants (a local one by pid, a
remote learner through its host's agent) and waiting for the first of them to end.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from typing import Any

import torch

PR_SET_PDEATHSIG = 1
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
FLUSH_DENORMAL = True
"""Every run process computes with subnormal floats flushed to zero (FTZ/DAZ), as CPU training usually does.
Once merged fragments arrive, intermediate tensors of a chip's step (not its parameters, gradients or AdamW
state: checked at the end of a run) hold subnormals, and arithmetic on them is many times slower: the
step's compute went from 20 to 25-29 ms, back to 21 ms with them flushed (bench/harness_overhead.py)."""
HEAP_KEEP_BYTES = 64 << 20
"""glibc keeps this much free memory at the top of the heap instead of returning it to the kernel. With its
default (128 KiB, adjusted on the fly) a chip gave back and re-faulted its activations' pages every step:
13,000 page faults per second and ~2 ms of a 20 ms step (perf stat, bench/harness_overhead.py)."""
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


def _libc() -> Any:
    """glibc through ctypes (OSError where there is none: not Linux, or musl)."""
    return ctypes.CDLL("libc.so.6", use_errno=True)


def _kill_me_with_parent() -> None:
    try:
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the watchdog (run processes) or the closed socket (link processes) still applies
        pass


def keep_heap() -> None:
    """Stop glibc from trimming the heap after every step (HEAP_KEEP_BYTES); no-op without glibc."""
    try:
        libc = _libc()
        libc.mallopt(M_TRIM_THRESHOLD, HEAP_KEEP_BYTES)
        libc.mallopt(M_TOP_PAD, HEAP_KEEP_BYTES // 4)
    except (OSError, AttributeError):
        pass


def die_with_parent(parent_pid: int) -> None:
    """For a process forked by a run process (a host's link process): the kernel SIGKILLs it when that
    parent dies; if the parent is already gone, exit now."""
    _kill_me_with_parent()
    if os.getppid() != parent_pid:
        os._exit(70)


def reset_compute_pool() -> None:
    """For a process forked by a run process, before it starts a thread: rebuild torch's intra-op pool here,
    on one thread. After a fork torch marks the inherited pool corrupt and the first thread to run a parallel
    op (a large copy) replaces it; two threads doing that at once can read the pool while it is replaced and
    fail an internal assert ("Invalid thread pool!"), which killed a link process's writer thread."""
    torch.set_num_threads(1)


def become_run_process(supervisor_pid: int | None = None) -> None:
    """Tie this process's life to the supervisor's and use one compute thread."""
    _close_inherited_forkserver_fd()
    _kill_me_with_parent()
    if supervisor_pid is not None:
        if not pid_alive(supervisor_pid):
            os._exit(70)  # the supervisor died before we got here
        threading.Thread(target=_watchdog, args=(supervisor_pid,), name="watchdog", daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to handle
    keep_heap()
    torch.set_flush_denormal(FLUSH_DENORMAL)
    torch.set_num_threads(1)
    # Processes with I/O threads next to a computing one (the syncer; a host's link process inherits this)
    # hand the GIL over every 0.2 ms instead of 5 ms, so a thread with a frame to read is not held up behind it.
    sys.setswitchinterval(GIL_SWITCH_S)


def stderr_to_file(run_dir: str | os.PathLike[str], proc: str) -> None:
    """Send this process's stderr (fd 2: Python's tracebacks and warnings and what Gloo and torch's C++ code
    print) to the run directory's logs/<proc>.stderr, appended (a restarted process's generations follow each
    other, each under a line naming its pid). The terminal is the harness's: an error a child hits, expected
    or not, is reported there by the run's error list, which gives this file's path for an unexpected one."""
    from diloco_chaos.harness.run.rundir import stderr_file

    path = stderr_file(run_dir, proc)
    path.parent.mkdir(exist_ok=True)
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    sys.stderr.write(f"--- {proc} pid {os.getpid()} started\n")
    sys.stderr.flush()


def print_error(e: BaseException) -> None:
    """Write `e`'s traceback to stderr (the process's log file) at once, in one write: the supervisor may stop
    a failing process, its learner down, before the interpreter would print it on the way out, or between the
    lines traceback.print_exception writes one at a time. Call it before logging the error's event, which is
    what the supervisor reacts to."""
    import traceback

    sys.stderr.flush()
    os.write(2, "".join(traceback.format_exception(e)).encode(errors="replace"))


def signal_tree(pid: int, sig: int) -> None:
    """Signal a local process and every descendant (gone ones skipped)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        for q in [*proc.children(recursive=True), proc]:
            try:
                q.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
    except psutil.NoSuchProcess:
        pass


def signal_proc(p: Any, sig: int) -> None:
    """A run process and its descendants: a local one by its pid, a remote learner
    (diloco_chaos/harness/hosts/remote.py,
    whose pid is another host's) through its own `signal_tree`."""
    remote = getattr(p, "signal_tree", None)
    if remote is not None:
        remote(sig)
    else:
        signal_tree(p.pid, sig)


def wait_any(procs: list[Any], timeout: float) -> None:
    """Until one of these processes ends (its `sentinel` is readable) or `timeout` passes."""
    from multiprocessing.connection import wait

    wait(list({p.sentinel for p in procs}), timeout=timeout)  # a torchrun stands for each of its chips


def running(p: Any) -> bool:
    """Whether `p` has not ended, for a thread other than the one that watches it (a fault's thread looking up
    the pids to signal). It reads nothing: it only asks whether `p.sentinel` is readable. `exitcode` and
    `is_alive` would call multiprocessing's Popen.poll, which is not thread-safe: when two threads both find an
    ended forkserver child's sentinel readable, one reads its exit code and the other reads EOF, which
    multiprocessing records as exit code 255 (popen_forkserver.py), so a learner that finished cleanly was
    reported failed with 255 (seen once, under a slow fault whose thread looked up the learner's pids as it
    ended)."""
    from multiprocessing.connection import wait

    sentinel = getattr(p, "sentinel", None)
    if sentinel is None:
        return bool(p.exitcode is None)
    return not wait([sentinel], timeout=0)


def main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
