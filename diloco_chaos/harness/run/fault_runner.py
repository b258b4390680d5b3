"""Carrying out a run's fault schedule: the schedule decides (diloco_chaos/chaos/schedule.py), this acts and logs.

The supervisor calls `tick` with the events it has just read; the schedule
updates its view of training progress and says which faults start or end,
and the runner applies them through each kind's module (diloco_chaos/chaos/faults/), logging
`fault_start` / `fault_end` with the fault's index, description, the reason
(the trigger reached) and the progress at that moment. `stop_all` ends every
active fault; the supervisor calls it on every way out of a run. Process faults go to
diloco_chaos/chaos/processes.py by pid from the supervisor's registry.

A kill (kill_chip, kill_learner, crash_host, kill_syncer) is one signal, but its effect lasts until what it
killed is back; the runner follows the records it is given with diloco_chaos.harness.report.timeline.FaultReactions, the
same definition report.json's fault_response uses, and logs the kill's `fault_end` when it recovers (with the time
of the record that showed it, `ended_t`), or "not recovered by run end" at the end. So a fault's end has one
source, its `fault_end`, for the live output, the final table, report.json and the HTML report.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from diloco_chaos.chaos import faults
from diloco_chaos.chaos.faults.base import FaultHandle
from diloco_chaos.chaos.links import LinkChaos
from diloco_chaos.chaos.processes import ProcessChaos
from diloco_chaos.chaos.schedule import KILL_ACTIONS, FaultSchedule, FaultSpec, Transition
from diloco_chaos.harness.record import parse_lenient
from diloco_chaos.harness.record.events import EventLog
from diloco_chaos.harness.record.run import FaultEnd, FaultStart
from diloco_chaos.harness.report.timeline import RECOVERED, FaultReactions

log = logging.getLogger(__name__)


class FaultRunner:
    """Applies a FaultSchedule's decisions; `fired` / `cleared` count them per fault."""

    def __init__(self, faults: tuple[FaultSpec, ...], chaos: LinkChaos | None, events: EventLog,
                 processes: ProcessChaos | None = None) -> None:
        self.schedule = FaultSchedule(faults)
        self.chaos = chaos
        self.processes = processes
        self.events = events
        self.handles: dict[int, FaultHandle] = {}
        self.reactions = FaultReactions()

    def never_fired(self) -> list[str]:
        """Faults whose trigger was never reached: a schedule that did not happen is a failed run."""
        return [f"faults[{i}] {f.describe()} at {f.at.describe()}" for i, f in enumerate(self.schedule.faults)
                if self.schedule.fired[i] == 0]

    @property
    def fired(self) -> list[int]:
        return self.schedule.fired

    def pending(self) -> bool:
        return self.schedule.pending()

    def tick(self, events: list[dict[str, Any]], elapsed_s: float) -> None:
        self.schedule.progress.observe(events, elapsed_s)
        self._follow_kills(events, elapsed_s)
        for tr in self.schedule.decide(elapsed_s):
            self._act(tr, elapsed_s)

    def _follow_kills(self, events: list[dict[str, Any]], elapsed_s: float) -> None:
        """Feed the records to the reactions tracker; end each kill they show recovered."""
        recs = [rec for rec in (parse_lenient(raw)[0] for raw in events) if rec is not None]
        for rec in sorted(recs, key=lambda e: e.t):  # several processes append: file order is not time order
            for i in self.reactions.feed(rec):
                if self.schedule.started_at[i] is None:  # already ended (run teardown)
                    continue
                self.schedule.started_at[i] = None
                self.schedule.cleared[i] += 1
                k = self.reactions.tracked[i]
                assert k.reaction is not None and k.back is not None
                self._act(Transition(i, False, RECOVERED.get(k.reaction.ev, "recovered")), elapsed_s,
                          ended_t=k.back.t, reaction=k.reaction.ev)

    def stop_all(self, elapsed_s: float) -> None:
        for tr in self.schedule.end_all():
            try:
                self._act(tr, elapsed_s)
            except Exception as e:  # noqa: BLE001 - teardown goes on; the error is logged
                log.warning("could not end fault %d: %s", tr.index, e)

    def _act(self, tr: Transition, elapsed_s: float, ended_t: float | None = None, reaction: str | None = None) -> None:
        spec = self.schedule.faults[tr.index]
        reason = tr.reason
        if not tr.start and ended_t is None and spec.action in KILL_ACTIONS and reason == "end of run":
            reason = "not recovered by run end"  # a kill still not back when the run ended
        elapsed, progress = round(elapsed_s, 3), self.schedule.progress.as_dict()
        if tr.start:
            kind = faults.get(spec.action)
            applied_from_t = time.monotonic()  # its effect may show before it is logged (an agent's reply)
            missed = None
            try:
                self.handles[tr.index] = kind.apply(faults.FaultContext(self.chaos, self.processes), spec)
            except ProcessLookupError as e:  # the learner (or syncer) is down already: the fault hit nothing
                missed = str(e)
            self.events.write(FaultStart(index=tr.index, action=spec.action, learner=spec.learner,
                                         describe=spec.describe(), reason=reason, elapsed_s=elapsed, progress=progress,
                                         missed=missed, applied_from_t=applied_from_t))
            if missed is not None and spec.action in KILL_ACTIONS:  # nothing to recover from: over at once
                self.schedule.started_at[tr.index] = None
                self.schedule.cleared[tr.index] += 1
                self._act(Transition(tr.index, False, "it hit nothing"), elapsed_s)
        else:
            handle = self.handles.pop(tr.index, None)
            if handle is not None:
                handle.clear()
            self.events.write(FaultEnd(index=tr.index, action=spec.action, learner=spec.learner,
                                       describe=spec.describe(), reason=reason, elapsed_s=elapsed, progress=progress,
                                       ended_t=ended_t, reaction=reaction))
