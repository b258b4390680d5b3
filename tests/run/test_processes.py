"""diloco_chaos/chaos/processes.py against real processes: the right pid gets the right signal, freezes are undone."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from diloco_chaos.chaos import faults
from diloco_chaos.chaos.processes import STALLED_OTHERS_S, ProcessChaos
from diloco_chaos.chaos.schedule import parse_fault


def wait_status(pid: int, want: set[str], timeout: float = 5.0) -> str:
    tick = threading.Event()
    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        try:
            status = psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            status = "gone"
        if status in want:
            return status
        tick.wait(0.02)
    raise AssertionError(f"pid {pid} status {status!r}, wanted {want}")


@pytest.fixture
def chips() -> Iterator[dict[int, list[subprocess.Popen]]]:
    """Two 'learners' of two sleeping processes each, standing in for chip processes."""
    procs = {m: [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
             for m in range(2)}
    yield procs
    for ps in procs.values():
        for p in ps:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)


def make(chips: dict[int, list[subprocess.Popen]]) -> tuple[ProcessChaos, list[tuple[str, dict]]]:
    seen: list[tuple[str, dict]] = []

    def rec(ev: str, /, **fields: object) -> None:
        seen.append((ev, fields))

    def pids_of(m: int) -> list[int]:
        return [p.pid for p in chips[m] if p.poll() is None]

    return ProcessChaos(pids_of, learners=2, on_event=rec), seen


def test_kill_chip_hits_only_that_chip(chips) -> None:
    pc, seen = make(chips)
    pc.kill_chip(1, 1)
    assert chips[1][1].wait(timeout=10) == -9
    assert all(p.poll() is None for p in (chips[0][0], chips[0][1], chips[1][0]))
    assert seen == [("process_fault", {"kind": "kill_chip", "learner": 1, "pids": [chips[1][1].pid],
                                       "signal": "SIGKILL", "chip": 1})]
    assert pc.sent == {"kill_chip": 1}


def test_kill_learner_and_crash_host(chips) -> None:
    pc, _ = make(chips)
    pc.crash_host(0)
    assert chips[0][0].wait(timeout=10) == -9 and chips[0][1].poll() is None
    pc.kill_learner(1)
    assert [p.wait(timeout=10) for p in chips[1]] == [-9, -9]
    with pytest.raises(ProcessLookupError, match="learner 1 has no live chip"):
        pc.kill_learner(1)


def test_freeze_stops_until_cleared(chips) -> None:
    pc, seen = make(chips)
    with pc.freeze(0) as fault:
        for p in chips[0]:
            wait_status(p.pid, {psutil.STATUS_STOPPED})
        assert psutil.Process(chips[1][0].pid).status() != psutil.STATUS_STOPPED
    for p in chips[0]:
        wait_status(p.pid, {psutil.STATUS_SLEEPING, psutil.STATUS_RUNNING})
    fault.clear()  # idempotent: no second SIGCONT event
    assert [e for e, _ in seen] == ["process_fault", "process_fault_off"]


def test_apply_and_range_errors(chips) -> None:
    pc, _ = make(chips)
    spec = parse_fault({"action": "freeze", "learner": 1, "chip": 0, "until": {"after_s": 1}}, "faults[0]", 2)
    fault = faults.get(spec.action).apply(faults.FaultContext(processes=pc), spec)  # as the FaultRunner does
    wait_status(chips[1][0].pid, {psutil.STATUS_STOPPED})
    assert psutil.Process(chips[1][1].pid).status() != psutil.STATUS_STOPPED
    fault.clear()
    wait_status(chips[1][0].pid, {psutil.STATUS_SLEEPING, psutil.STATUS_RUNNING})
    with pytest.raises(ValueError, match=r"learner = 2: must be in \[0, 1\]"):
        pc.kill_learner(2)
    with pytest.raises(ValueError, match="chip = 2: learner 0 has 2 live chips"):
        pc.kill_chip(0, 2)
    link = parse_fault({"action": "partition", "learner": 0}, "faults[0]", 2)
    with pytest.raises(RuntimeError, match="link faults need proxies"):
        faults.get(link.action).apply(faults.FaultContext(processes=pc), link)


def test_slow_duty_cycles_a_busy_process_to_its_speed() -> None:
    """Time is the point here: a busy process slowed to speed 0.5 is stopped about half the time, and gets at
    most about half a core. The stopped fraction is sampled from /proc (what the signals did); the CPU share is
    checked only from above, since a loaded machine can only lower it (CI once gave 0.24 under load)."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        pc = ProcessChaos(lambda m: [busy.pid] if busy.poll() is None else [], learners=1)
        proc = psutil.Process(busy.pid)
        tick = threading.Event()
        fault = pc.slow(0, speed=0.5, period_s=0.1)
        c0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        samples = []
        while time.monotonic() - t0 < 1.5:
            samples.append(proc.status() == psutil.STATUS_STOPPED)
            tick.wait(0.003)
        share = (sum(proc.cpu_times()[:2]) - c0) / (time.monotonic() - t0)
        fault.clear()
        stopped = sum(samples) / len(samples)
        assert 0.3 <= stopped <= 0.7, f"stopped {stopped:.2f} of {len(samples)} samples under speed 0.5"
        assert share <= 0.75, f"CPU share {share:.2f} under speed 0.5"
        assert fault.cycles >= 10
        wait_status(busy.pid, {psutil.STATUS_RUNNING, psutil.STATUS_SLEEPING})
    finally:
        busy.kill()
        busy.wait(timeout=10)


def _stopped_share(own: bool, others_per_s: float, window_s: float = 1.5) -> tuple[float, list[tuple[str, dict]]]:
    """A busy process slowed to 0.5 (period 0.1 s) whose own progress is its CPU time x 100 steps a second,
    beside one other learner making `others_per_s` steps a second: the share of `window_s` it spent stopped."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    t0 = time.monotonic()
    try:
        proc = psutil.Process(busy.pid)
        pc = ProcessChaos(lambda m: [busy.pid] if m == 0 else [idle.pid], learners=2,
                          progress=lambda: {0: int(sum(proc.cpu_times()[:2]) * 100),
                                            1: int((time.monotonic() - t0) * others_per_s)})
        events: list[tuple[str, dict]] = []
        pc.on_event = lambda name, **f: events.append((name, f))
        tick = threading.Event()
        fault = pc.slow(0, speed=0.5, period_s=0.1, own=own)
        samples, start = [], time.monotonic()
        while time.monotonic() - start < window_s:
            samples.append(proc.status() == psutil.STATUS_STOPPED)
            tick.wait(0.003)
        fault.clear()
        wait_status(busy.pid, {psutil.STATUS_RUNNING, psutil.STATUS_SLEEPING})
        return sum(samples) / len(samples), events
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait(timeout=10)


@pytest.mark.parametrize(("own", "stopped_range"), [(False, (0.0, 0.15)), (True, (0.3, 0.7))])
def test_a_slow_learner_follows_the_others_pace_or_keeps_its_own(own: bool,
                                                                 stopped_range: tuple[float, float]) -> None:
    """The other learner races ahead (1000 steps a second). Held to 0.5 of the others' progress
    (`relative_to = "others"`), the slowed learner is never ahead of its budget and is hardly stopped; held to
    0.5 of its own pace (`"own"`) it is stopped about half of each period whatever the others do."""
    stopped, events = _stopped_share(own, others_per_s=1000.0)
    assert stopped_range[0] <= stopped <= stopped_range[1], f"own={own}: stopped {stopped:.2f}"
    assert events[0][1]["mode"] == ("duty" if own else "progress")


def test_a_slow_learner_whose_others_wait_for_it_runs_a_duty_cycle_and_is_not_held_for_ever() -> None:
    """The other learner makes no progress: under ddp or diloco it waits for the slowed one. Held to the others'
    progress the slowed learner is ahead of 0.5 x 0 and was stopped for ever (a deadlock: a ddp run stood at its
    step 153 until stopped); once the others have not moved for STALLED_OTHERS_S it runs a duty cycle instead."""
    stopped, _ = _stopped_share(False, others_per_s=0.0, window_s=3.0)
    assert 0.4 <= stopped <= 0.8, f"stopped {stopped:.2f}: the first {STALLED_OTHERS_S} s stopped, then half"


def test_freeze_stops_a_hosts_child_with_it() -> None:
    """A host chip's link process is its child: a frozen host is silent on its link too, and comes back."""
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
           "time.sleep(60)"
    host = subprocess.Popen([sys.executable, "-c", code])
    try:
        child = _wait_child(host.pid)
        pc = ProcessChaos(lambda m: [host.pid], learners=1)
        with pc.freeze(0) as fault:
            assert fault.pids == [host.pid, child]
            assert wait_status(host.pid, {psutil.STATUS_STOPPED}) == psutil.STATUS_STOPPED
            assert wait_status(child, {psutil.STATUS_STOPPED}) == psutil.STATUS_STOPPED
        assert wait_status(child, {psutil.STATUS_SLEEPING, psutil.STATUS_RUNNING}) != psutil.STATUS_STOPPED
    finally:
        for p in psutil.Process(host.pid).children():
            p.kill()
        host.kill()
        host.wait(timeout=10)


def _wait_child(pid: int, timeout: float = 10.0) -> int:
    tick = threading.Event()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = psutil.Process(pid).children()
        if kids:
            return kids[0].pid
        tick.wait(0.02)
    raise AssertionError(f"pid {pid} started no child within {timeout}s")
