"""Carrying out a run's fault schedule: the schedule decides (chaos/schedule.py), this acts and logs.

The supervisor calls `tick` with the events it has just read; the schedule
updates its view of training progress and says which faults start or end,
and the runner applies them through each kind's module (chaos/faults/), logging
`fault_start` / `fault_end` with the fault's index, description, the reason
(the trigger reached) and the progress at that moment. `stop_all` ends every
active fault; the supervisor calls it on every way out of a run. Process faults go to
chaos/processes.py by pid from the supervisor's registry.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from chaos import faults
from chaos.faults.base import FaultHandle
from chaos.links import LinkChaos
from chaos.processes import ProcessChaos
from chaos.schedule import FaultSchedule, FaultSpec, Transition
from harness.events import EventLog

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
            kind = faults.get(spec.action)
            fields["applied_from_t"] = time.monotonic()  # its effect may show before it is logged (an agent's reply)
            try:
                self.handles[tr.index] = kind.apply(faults.FaultContext(self.chaos, self.processes), spec)
            except ProcessLookupError as e:  # the learner (or syncer) is down already: the fault hit nothing
                fields["missed"] = str(e)
            self.events.log("fault_start", **fields)
        else:
            handle = self.handles.pop(tr.index, None)
            if handle is not None:
                handle.clear()
            self.events.log("fault_end", **fields)
