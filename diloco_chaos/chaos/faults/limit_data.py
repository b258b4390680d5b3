"""`limit_data`: each of one learner's connections is closed after some bytes (a frame cut short)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from diloco_chaos.chaos.faults.base import LINK_BACKENDS, FaultContext, FaultHandle, FaultKind, register
from diloco_chaos.trainers.config import bounded

if TYPE_CHECKING:
    from diloco_chaos.chaos.schedule import FaultSpec


@dataclass(frozen=True)
class LimitDataParams:
    """Where connections are cut (required)."""

    bytes: int | None = bounded(None, 0, 1 << 40)
    """Connections are closed after this many bytes from the learner."""


@register
class LimitData(FaultKind):
    name = "limit_data"
    target = "link"
    params = LimitDataParams
    backends = LINK_BACKENDS
    colour = "#9467bd"
    summary = "each of one learner's connections closed after `bytes` from it"
    required = ("bytes",)

    def apply(self, ctx: FaultContext, spec: FaultSpec) -> FaultHandle:
        return ctx.link().limit_data(spec.target_learner, spec.options.bytes)
