"""Process chaos: kill a chip, a learner or its host, or freeze a learner, by pid from the run's registry.

Signals go to pids the supervisor hands over (never to process names), each
checked alive first, so a fault can only ever hit a process of this run.
`kill_chip` / `kill_learner` / `crash_host` are one shot (SIGKILL: no cleanup
runs, like a chip or host that dies); the learner's recovery policy decides
what happens next. `freeze` sends SIGSTOP to the learner's chips (and the
host's link process) and returns a scope whose `clear()` sends SIGCONT: a hung
host that comes back.
`kill_syncer` SIGKILLs the synchronizer (one shard, or every shard); the
supervisor restores each from its checkpoint after the repair delay.

`slow` holds a learner to `speed` of the others (an older hardware
generation, or, scoped, a transient straggler) from outside its training
loop, with SIGSTOP/SIGCONT. Where the run's progress is known (the
supervisor passes each learner's step), it is a feedback controller: every
CONTROL_TICK_S the learner is stopped while it is ahead of `speed` x the
mean progress of the learners that are not slowed, and runs otherwise, so
its achieved speed relative to them is the profile, whatever the machine's
load. Its error is a few steps whatever the window's length (the learner
runs on until the controller sees its step: the supervisor's progress poll
plus a tick), so the profile is precise over windows of many steps.
Without progress (or with no unslowed learner left) it falls back to a
fixed duty cycle (`speed` of every `period_s`). `jitter` varies the target
per period, uniformly in speed x (1 +- jitter), from the run's seed. It
follows the learner across restarts: it asks the registry for the current
pids every tick.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

CONTROL_TICK_S = 0.02
"""How often the `slow` controller compares progress (at most `period_s / 4`): a learner at full speed does
about one step in this on this machine, so it overshoots its budget by about one step before it is stopped."""
STALLED_OTHERS_S = 1.0
"""`slow` held to the others' progress: when their progress has not moved for this long, the learner runs a duty
cycle of its own pace until it moves again. Synchronous learners (ddp, diloco, a `block` wait) stop while they wait
for the straggler, and holding it to their progress then held it stopped for ever."""

log = logging.getLogger(__name__)

PidsOf = Callable[[int], list[int]]
"""learner -> pids of its live chip processes, ordered by rank (rank 0 is the learner's host)."""
ProgressOf = Callable[[], dict[int, int]]
"""-> the highest inner step seen so far per learner (the supervisor's view of the event log)."""
SyncerPids = Callable[[], dict[int, int]]
"""-> shard -> pid of each synchronizer shard that is running now (shard 0 alone without sharding)."""


def syncer_repair_key(shard: int) -> str:
    """The `ProcessChaos.repair_s` key of a killed synchronizer shard's repair delay."""
    return f"syncer.s{shard}"


Signaller = Callable[[int, list[int], signal.Signals, bool], list[int]]
"""(learner, pids, signal, with their child processes) -> the pids signalled. Where the learner's processes
live: this machine (`local_signaller`) or another host, through its agent (diloco_chaos/harness/hosts/agent.py), which
alone can read that host's process tree."""


def _no_event(ev: str, /, **fields: Any) -> None:
    pass


def _with_children(pids: list[int]) -> list[int]:
    """The pids and their child processes: a host chip's link process (diloco_chaos/harness/learner/link_process.py)
    stops and continues with it, so a frozen or slowed host is silent on its link, as a stopped machine is."""
    out = []
    for pid in pids:
        out.append(pid)
        try:
            out.extend(c.pid for c in psutil.Process(pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    return out


def local_signaller(learner: int, pids: list[int], sig: signal.Signals, children: bool) -> list[int]:
    """Signal processes of this machine (and, with `children`, their child processes); the pids hit."""
    hit = []
    for pid in _with_children(pids) if children else pids:
        try:
            psutil.Process(pid).send_signal(sig)
            hit.append(pid)
        except psutil.NoSuchProcess:
            log.warning("pid %d of learner %d is already gone", pid, learner)
    return hit


@dataclass
class ProcessFault:
    """One process fault; `clear()` (idempotent) undoes what can be undone (a freeze)."""

    kind: str
    learner: int
    """The learner hit; -1 for the syncer."""
    pids: list[int] = field(default_factory=list)
    owner: ProcessChaos | None = None
    cleared: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    cycles: int = 0
    stopped_s: float = 0.0
    """slow: seconds the learner was held stopped."""

    def clear(self) -> None:
        if self.owner is not None:
            self.owner._clear(self)

    def __enter__(self) -> ProcessFault:
        return self

    def __exit__(self, *exc: object) -> None:
        self.clear()


class ProcessChaos:
    """Signals to a run's chip processes; counts what it sent."""

    def __init__(self, pids_of: PidsOf, learners: int, on_event: Callable[..., None] | None = None,
                 syncer_pids: SyncerPids | None = None, progress: ProgressOf | None = None,
                 seed: int = 0, send: Signaller = local_signaller) -> None:
        self.pids_of = pids_of
        self.send = send
        self.learners = learners
        self.on_event = on_event or _no_event
        self.syncer_pids = syncer_pids
        self.progress = progress
        self.seed = seed
        self.sent: dict[str, int] = {}
        self.repair_s: dict[int | str, float] = {}
        """Repair delays asked for by kills that fired (learner, or `syncer_repair_key(shard)`); the supervisor
        pops them."""
        self._slowed: dict[int, ProcessFault] = {}
        self._lock = threading.Lock()

    def slowed(self) -> bool:
        """Whether a `slow` fault is active (the supervisor then reads progress at its fault poll rate)."""
        with self._lock:
            return bool(self._slowed)

    def kill_syncer(self, repair_s: float | None = None, shard: int | None = None) -> ProcessFault:
        """SIGKILL the synchronizer's shard `shard` (None: every shard); each is restored from its last
        checkpoint after the repair delay."""
        live = self.syncer_pids() if self.syncer_pids is not None else {}
        hit = {k: pid for k, pid in live.items() if shard is None or k == shard}
        if not hit:
            raise ProcessLookupError("the syncer is not running" if shard is None
                                     else f"syncer shard {shard} is not running")
        if repair_s is not None:
            for k in hit:
                self.repair_s[syncer_repair_key(k)] = repair_s
        return self._signal("kill_syncer", -1, list(hit.values()), signal.SIGKILL, shard=shard)

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
        return self._signal("freeze", learner, pids, signal.SIGSTOP, children=True, chip=chip)

    def slow(self, learner: int, speed: float, period_s: float = 0.2, jitter: float = 0.0,
             own: bool = False) -> ProcessFault:
        """Hold the learner to `speed` of the unslowed learners' progress (SIGSTOP/SIGCONT), until cleared; with
        `own`, or when no progress is read, to `speed` of its own pace (a duty cycle)."""
        if not 0.0 < speed < 1.0:
            raise ValueError(f"speed = {speed}: must be in (0, 1)")
        if not 0.0 <= jitter < 1.0:
            raise ValueError(f"jitter = {jitter}: must be in [0, 1)")
        self._pids(learner)
        fault = ProcessFault("slow", learner, owner=self)
        with self._lock:
            if learner in self._slowed:
                raise ValueError(f"learner {learner} is already slowed")
            self._slowed[learner] = fault
            self.sent["slow"] = self.sent.get("slow", 0) + 1
        fault.thread = threading.Thread(target=self._hold_to_speed, args=(fault, speed, period_s, jitter, own),
                                        name=f"slow-{learner}", daemon=True)
        fault.thread.start()
        self.on_event("process_fault", kind="slow", learner=learner, speed=speed, period_s=period_s,
                      jitter=jitter, mode="progress" if self.progress is not None and not own else "duty")
        return fault

    def _reference(self, learner: int, start: dict[int, int]) -> float | None:
        """Mean steps since the fault started over the learners that are not slowed and have a process."""
        assert self.progress is not None
        now = self.progress()
        with self._lock:
            slowed = set(self._slowed)
        refs = [now.get(m, 0) - start.get(m, 0) for m in range(self.learners)
                if m not in slowed and m != learner and self.pids_of(m)]
        return sum(refs) / len(refs) if refs else None

    def _hold_to_speed(self, fault: ProcessFault, speed: float, period_s: float, jitter: float,
                       own: bool = False) -> None:
        rng = random.Random(f"{self.seed}/slow/{fault.learner}")
        progress = None if own else self.progress
        start = dict(progress()) if progress is not None else {}
        tick = min(period_s / 4, CONTROL_TICK_S) if progress is not None else period_s / 4
        target, next_draw, t = speed, 0.0, 0.0
        stopped = False
        last_ref, ref_moved = None, 0.0
        try:
            while not fault.stop.is_set():
                if t >= next_draw:  # a new target speed each period (jitter 0: always `speed`)
                    target = speed * (1.0 + jitter * rng.uniform(-1.0, 1.0))
                    next_draw = t + period_s
                ref = self._reference(fault.learner, start) if progress is not None else None
                if ref != last_ref:
                    last_ref, ref_moved = ref, t
                elif ref is not None and t - ref_moved > STALLED_OTHERS_S:
                    ref = None  # the others stand still, perhaps waiting for this learner: a duty cycle
                if ref is not None:
                    done = progress().get(fault.learner, 0) - start.get(fault.learner, 0)  # type: ignore[misc]
                    want_stop = done > target * ref
                else:  # duty cycle: run the first `target` of each period
                    want_stop = (t % period_s) >= target * period_s
                if want_stop != stopped:
                    self.send(fault.learner, self.pids_of(fault.learner),
                              signal.SIGSTOP if want_stop else signal.SIGCONT, True)
                    stopped = want_stop
                    fault.cycles += int(want_stop)
                if fault.stop.wait(tick):
                    break
                t += tick
                fault.stopped_s += tick if stopped else 0.0
        finally:
            self.send(fault.learner, self.pids_of(fault.learner), signal.SIGCONT, True)  # never leave one stopped
            with self._lock:
                self._slowed.pop(fault.learner, None)

    # -- internals -------------------------------------------------------------------------------
    def _pids(self, learner: int) -> list[int]:
        if not 0 <= learner < self.learners:
            raise ValueError(f"learner = {learner}: must be in [0, {self.learners - 1}]")
        pids = self.pids_of(learner)
        if not pids:
            raise ProcessLookupError(f"learner {learner} has no live chip process to hit")
        return pids

    def _signal(self, kind: str, learner: int, pids: list[int], sig: signal.Signals, children: bool = False,
                **fields: Any) -> ProcessFault:
        hit = self.send(learner, pids, sig, children) if learner >= 0 else local_signaller(learner, pids, sig, False)
        with self._lock:
            self.sent[kind] = self.sent.get(kind, 0) + 1
        self.on_event("process_fault", kind=kind, learner=learner if learner >= 0 else None, pids=hit,
                      signal=sig.name,
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
            self.on_event("process_fault_off", kind="slow", learner=fault.learner, cycles=fault.cycles,
                          stopped_s=round(fault.stopped_s, 3))
            return
        if fault.kind != "freeze":
            return
        self.send(fault.learner, fault.pids, signal.SIGCONT, False)
        self.on_event("process_fault_off", kind=fault.kind, learner=fault.learner, pids=fault.pids)
