"""`freeze`: SIGSTOP a learner's chips (or one chip) until `until`, then SIGCONT: a hung host that comes back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from diloco_chaos.chaos.faults.base import FaultContext, FaultHandle, FaultKind, ScheduleError, register
from diloco_chaos.trainers.config import bounded

if TYPE_CHECKING:
    from diloco_chaos.chaos.schedule import FaultSpec


@dataclass(frozen=True)
class FreezeParams:
    """What is stopped."""

    chip: int | None = bounded(None, 0, 1023)
    """Which chip (rank) of the learner; unset stops all the learner's chips."""


@register
class Freeze(FaultKind):
    name = "freeze"
    target = "process"
    params = FreezeParams
    colour = "#aec7e8"
    summary = "SIGSTOP a learner's chips until `until`, then SIGCONT"

    def validate(self, spec: FaultSpec, key: str) -> None:
        if spec.until is None:
            raise ScheduleError(f"{key}: freeze needs until (a process frozen to the end of the run never finishes)")

    def apply(self, ctx: FaultContext, spec: FaultSpec) -> FaultHandle:
        return ctx.process().freeze(spec.target_learner, spec.options.chip)
