"""Process chaos: kill a chip, a learner or its host, or freeze a learner, by pid from the run's registry.

Signals go to pids the supervisor hands over (never to process names), each
checked alive first, so a fault can only ever hit a process of this run.
`kill_chip` / `kill_learner` / `crash_host` are one shot (SIGKILL: no cleanup
runs, like a chip or host that dies); the learner's recovery policy decides
what happens next. `freeze` sends SIGSTOP to the learner's chips and returns
a scope whose `clear()` sends SIGCONT: a hung host that comes back. `slow`
duty-cycles SIGSTOP/SIGCONT from outside the training loop so the learner
runs `speed` of the time (an older hardware generation, or, scoped, a
transient straggler); it follows the learner across restarts, since it asks
the registry for the current pids every cycle.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from chaos.schedule import PROCESS_ACTIONS, FaultSpec

log = logging.getLogger(__name__)

PidsOf = Callable[[int], list[int]]
"""learner -> pids of its live chip processes, ordered by rank (rank 0 is the learner's host)."""


def _no_event(ev: str, /, **fields: Any) -> None:
    pass


@dataclass
class ProcessFault:
    """One process fault; `clear()` (idempotent) undoes what can be undone (a freeze)."""

    kind: str
    learner: int
    pids: list[int] = field(default_factory=list)
    owner: ProcessChaos | None = None
    cleared: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    cycles: int = 0

    def clear(self) -> None:
        if self.owner is not None:
            self.owner._clear(self)

    def __enter__(self) -> ProcessFault:
        return self

    def __exit__(self, *exc: object) -> None:
        self.clear()


class ProcessChaos:
    """Signals to a run's chip processes; counts what it sent."""

    def __init__(self, pids_of: PidsOf, learners: int, on_event: Callable[..., None] | None = None) -> None:
        self.pids_of = pids_of
        self.learners = learners
        self.on_event = on_event or _no_event
        self.sent: dict[str, int] = {}
        self._lock = threading.Lock()

    def kill_chip(self, learner: int, chip: int) -> ProcessFault:
        """SIGKILL one chip of a learner: its Gloo group breaks and the learner fails as a whole."""
        pids = self._pids(learner)
        if not 0 <= chip < len(pids):
            raise ValueError(f"chip = {chip}: learner {learner} has {len(pids)} live chips")
        return self._signal("kill_chip", learner, [pids[chip]], signal.SIGKILL, chip=chip)

    def crash_host(self, learner: int) -> ProcessFault:
        """SIGKILL the learner's host (chip 0, the only process that talks to the syncer)."""
        return self.kill_chip(learner, 0)

    def kill_learner(self, learner: int) -> ProcessFault:
        """SIGKILL every chip of a learner at once."""
        return self._signal("kill_learner", learner, self._pids(learner), signal.SIGKILL)

    def freeze(self, learner: int, chip: int | None = None) -> ProcessFault:
        """SIGSTOP the learner's chips (or one chip); clear() sends SIGCONT."""
        pids = self._pids(learner)
        if chip is not None:
            if not 0 <= chip < len(pids):
                raise ValueError(f"chip = {chip}: learner {learner} has {len(pids)} live chips")
            pids = [pids[chip]]
        return self._signal("freeze", learner, pids, signal.SIGSTOP, chip=chip)

    def slow(self, learner: int, speed: float, period_s: float = 0.2) -> ProcessFault:
        """Let the learner run only `speed` of every `period_s` (SIGCONT ... SIGSTOP), until cleared."""
        if not 0.0 < speed < 1.0:
            raise ValueError(f"speed = {speed}: must be in (0, 1)")
        self._pids(learner)
        fault = ProcessFault("slow", learner, owner=self)
        fault.thread = threading.Thread(target=self._duty_cycle, args=(fault, speed, period_s),
                                        name=f"slow-{learner}", daemon=True)
        fault.thread.start()
        with self._lock:
            self.sent["slow"] = self.sent.get("slow", 0) + 1
        self.on_event("process_fault", kind="slow", learner=learner, speed=speed, period_s=period_s)
        return fault

    def _duty_cycle(self, fault: ProcessFault, speed: float, period_s: float) -> None:
        run_s, stop_s = period_s * speed, period_s * (1.0 - speed)
        while not fault.stop.wait(run_s):
            pids = self.pids_of(fault.learner)
            self._send_all(pids, signal.SIGSTOP)
            stopped = fault.stop.wait(stop_s)
            self._send_all(pids, signal.SIGCONT)  # always: never leave a learner stopped
            fault.cycles += 1
            if stopped:
                break

    @staticmethod
    def _send_all(pids: list[int], sig: signal.Signals) -> None:
        for pid in pids:
            try:
                psutil.Process(pid).send_signal(sig)
            except psutil.NoSuchProcess:
                pass

    def apply(self, spec: FaultSpec) -> ProcessFault:
        if spec.action not in PROCESS_ACTIONS:
            raise ValueError(f"not a process action: {spec.action}")
        if spec.action == "kill_chip":
            return self.kill_chip(spec.learner, spec.chip or 0)
        if spec.action == "crash_host":
            return self.crash_host(spec.learner)
        if spec.action == "kill_learner":
            return self.kill_learner(spec.learner)
        if spec.action == "slow":
            return self.slow(spec.learner, spec.speed or 0.5, spec.period_s or 0.2)
        return self.freeze(spec.learner, spec.chip)

    # -- internals -------------------------------------------------------------------------------
    def _pids(self, learner: int) -> list[int]:
        if not 0 <= learner < self.learners:
            raise ValueError(f"learner = {learner}: must be in [0, {self.learners - 1}]")
        pids = self.pids_of(learner)
        if not pids:
            raise ProcessLookupError(f"learner {learner} has no live chip process to hit")
        return pids

    def _signal(self, kind: str, learner: int, pids: list[int], sig: signal.Signals, **fields: Any) -> ProcessFault:
        hit = []
        for pid in pids:
            try:
                psutil.Process(pid).send_signal(sig)
                hit.append(pid)
            except psutil.NoSuchProcess:
                log.warning("%s: pid %d of learner %d is already gone", kind, pid, learner)
        with self._lock:
            self.sent[kind] = self.sent.get(kind, 0) + 1
        self.on_event("process_fault", kind=kind, learner=learner, pids=hit, signal=sig.name,
                      **{k: v for k, v in fields.items() if v is not None})
        return ProcessFault(kind, learner, hit, owner=self)

    def _clear(self, fault: ProcessFault) -> None:
        with self._lock:
            if fault.cleared:
                return
            fault.cleared = True
        if fault.kind == "slow":
            fault.stop.set()
            if fault.thread is not None:
                fault.thread.join(timeout=5.0)
            self.on_event("process_fault_off", kind="slow", learner=fault.learner, cycles=fault.cycles)
            return
        if fault.kind != "freeze":
            return
        for pid in fault.pids:
            try:
                psutil.Process(pid).send_signal(signal.SIGCONT)
            except psutil.NoSuchProcess:
                pass
        self.on_event("process_fault_off", kind=fault.kind, learner=fault.learner, pids=fault.pids)
