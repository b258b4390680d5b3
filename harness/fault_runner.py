"""Carrying out a run's fault schedule: the schedule decides (chaos/schedule.py), this acts and logs.

The supervisor calls `tick` with the events it has just read; the schedule
updates its view of training progress and says which faults start or end,
and the runner applies them through the link chaos API, logging
`fault_start` / `fault_end` with the fault's index, description, the reason
(the trigger reached) and the progress at that moment. `stop_all` ends every
active fault; the supervisor calls it on every way out of a run.
"""

from __future__ import annotations

import logging
from typing import Any

from chaos.links import LinkChaos, LinkFault
from chaos.schedule import FaultSchedule, FaultSpec, Transition
from harness.events import EventLog

log = logging.getLogger(__name__)


class FaultRunner:
    """Applies a FaultSchedule's decisions; `fired` / `cleared` count them per fault."""

    def __init__(self, faults: tuple[FaultSpec, ...], chaos: LinkChaos | None, events: EventLog) -> None:
        self.schedule = FaultSchedule(faults)
        self.chaos = chaos
        self.events = events
        self.handles: dict[int, LinkFault] = {}

    @property
    def fired(self) -> list[int]:
        return self.schedule.fired

    def pending(self) -> bool:
        return self.schedule.pending()

    def tick(self, events: list[dict[str, Any]], elapsed_s: float) -> None:
        self.schedule.progress.observe(events)
        for tr in self.schedule.decide(elapsed_s):
            self._act(tr, elapsed_s)

    def stop_all(self, elapsed_s: float) -> None:
        for tr in self.schedule.end_all():
            try:
                self._act(tr, elapsed_s)
            except Exception as e:  # noqa: BLE001 - teardown goes on; the error is logged
                log.warning("could not end fault %d: %s", tr.index, e)

    def _act(self, tr: Transition, elapsed_s: float) -> None:
        spec = self.schedule.faults[tr.index]
        fields = {"index": tr.index, "action": spec.action, "learner": spec.learner, "describe": spec.describe(),
                  "reason": tr.reason, "elapsed_s": round(elapsed_s, 3), "progress": self.schedule.progress.as_dict()}
        if tr.start:
            assert self.chaos is not None, "link faults need proxies (validated before the run)"
            self.handles[tr.index] = self.chaos.apply(spec)
            self.events.log("fault_start", **fields)
        else:
            handle = self.handles.pop(tr.index, None)
            if handle is not None:
                handle.clear()
            self.events.log("fault_end", **fields)
