"""procutil.running against a real forkserver child: it tells a thread whether the child has ended without
reading the exit code, so the watching thread's `exitcode` stays the child's own. The hazard it avoids is shown
on the same child: a second reader of the sentinel (what a second thread's Popen.poll does when both find it
readable) takes the exit code, and multiprocessing then records 255 for a child that exited 0."""

from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing.connection import wait

from diloco_chaos.harness.run.procutil import running


def _exit_zero() -> None:
    return None


def _ended_child() -> mp.process.BaseProcess:
    p = mp.get_context("forkserver").Process(target=_exit_zero)
    p.start()
    assert wait([p.sentinel], timeout=30.0), "the child ended"
    return p


def test_running_reads_nothing_so_the_watcher_gets_the_real_exit_code() -> None:
    p = _ended_child()
    assert not running(p) and not running(p)
    assert p.exitcode == 0


def test_a_second_reader_of_the_sentinel_makes_multiprocessing_report_255() -> None:
    p = _ended_child()
    os.read(p.sentinel, 8)  # the racing thread's read_signed: it consumed the exit code
    assert p.exitcode == 255
