"""`partition`: cut one learner's link (blackhole: nothing passes; refuse: the proxy is disabled)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from diloco_chaos.chaos.faults.base import KERNEL, LINK_BACKENDS, FaultContext, FaultHandle, FaultKind, register
from diloco_chaos.trainers.config import choice

if TYPE_CHECKING:
    from diloco_chaos.chaos.schedule import FaultSpec


@dataclass(frozen=True)
class PartitionParams:
    """How the link is cut."""

    mode: str | None = choice(None, ("blackhole", "refuse"))
    """'blackhole' (connections open, nothing passes; default) or 'refuse' (proxy disabled)."""


@register
class Partition(FaultKind):
    name = "partition"
    target = "link"
    params = PartitionParams
    backends = LINK_BACKENDS | KERNEL
    colour = "#d62728"
    summary = "one learner's link cut (blackhole or refuse) until healed"

    def apply(self, ctx: FaultContext, spec: FaultSpec) -> FaultHandle:
        return ctx.link().partition(spec.target_learner, spec.options.mode or "blackhole")
