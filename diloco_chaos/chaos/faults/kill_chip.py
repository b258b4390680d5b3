"""`kill_chip`: SIGKILL one chip of a learner; its Gloo group breaks and the learner fails as a whole."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from diloco_chaos.chaos.faults.base import FaultContext, FaultHandle, FaultKind, RepairParams, register, remember_repair
from diloco_chaos.trainers.config import bounded

if TYPE_CHECKING:
    from diloco_chaos.chaos.schedule import FaultSpec


@dataclass(frozen=True)
class KillChipParams(RepairParams):
    """Which chip, and the repair delay."""

    chip: int | None = bounded(None, 0, 1023)
    """Which chip (rank) of the learner (default 0, its host); at most topology.chips_per_learner - 1."""


@register
class KillChip(FaultKind):
    name = "kill_chip"
    target = "process"
    params = KillChipParams
    colour = "#1f77b4"
    summary = "SIGKILL one chip of a learner (one shot; restarted after repair_s)"

    def apply(self, ctx: FaultContext, spec: FaultSpec) -> FaultHandle:
        remember_repair(ctx, spec)
        return ctx.process().kill_chip(spec.target_learner, spec.options.chip or 0)
