"""The run's forkserver: every process of a run (syncer, chips, links, torchft ranks) is forked from it.

What: `context()` is the forkserver context with the heavy imports preloaded once per supervisor process;
`warm()` starts that forkserver now, without waiting for it, and `stop()` (at exit) ends it. Why `warm`: the
forkserver imports torch, torch._dynamo and the harness's process entry points (seconds on 2 cores), and the first
process start waits for that. The executable (diloco_chaos/harness/entry.py), about to run something
(`diloco-chaos run`, `compare`, `replay`, explore's child per run), calls `warm()` before it imports and
validates, so the forkserver's imports overlap the command's own instead of following them. Its sys.path and
environment are the command's at that moment: children find a task module that appears later through the
scenario's task.path, and nothing of the command sets the environment a run depends on (DILOCO_CHAOS_MUTATION is
read from the environment the command started with). Imports nothing heavy.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import signal
from typing import Any

PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "diloco_chaos.harness.learner.chip",
           "diloco_chaos.harness.syncer.service"]
"""Imported once in the forkserver. torch._dynamo is what the first AdamW construction imports (1.6 s of CPU
per chip process on this machine, measured with -X importtime); preloaded, a chip is ready in ~0.1 s."""
_ctx: Any = None


def context() -> Any:
    """The forkserver context, with the heavy imports preloaded once per supervisor process."""
    global _ctx
    if _ctx is None:
        _ctx = mp.get_context("forkserver")
        _ctx.set_forkserver_preload(PRELOAD)
    return _ctx


def warm() -> None:
    """Start the forkserver now (it imports PRELOAD in the background); the first process start still waits for
    it to be ready, but no longer for all of its imports after the caller's own."""
    from multiprocessing import forkserver

    context()
    forkserver.ensure_running()
    atexit.register(stop)


def stop() -> None:
    """End this process's forkserver, if one runs: at the exit of a command that warmed it, so a forkserver still
    importing when the command ends early (a refused scenario) does not outlive it by seconds."""
    from multiprocessing import forkserver

    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)  # CPython's forkserver
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
