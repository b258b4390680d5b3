"""`slice`: one learner's bytes delivered in small delayed slices (frames arrive in many pieces)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from diloco_chaos.chaos.faults.base import LINK_BACKENDS, FaultContext, FaultHandle, FaultKind, register
from diloco_chaos.trainers.config import bounded

if TYPE_CHECKING:
    from diloco_chaos.chaos.schedule import FaultSpec


@dataclass(frozen=True)
class SliceParams:
    """Toxiproxy's slicer (defaults: 64 +- 32 bytes, 200 us apart)."""

    average_size: int | None = bounded(None, 1, 1 << 24)
    """Average bytes per slice."""
    size_variation: int | None = bounded(None, 0, 1 << 24)
    """+- bytes of slice size variation."""
    delay_us: int | None = bounded(None, 0, 10_000_000)
    """Microseconds between slices."""


@register
class Slice(FaultKind):
    name = "slice"
    target = "link"
    params = SliceParams
    backends = LINK_BACKENDS
    colour = "#bcbd22"
    summary = "one learner's bytes delivered in small delayed slices, both directions"

    def apply(self, ctx: FaultContext, spec: FaultSpec) -> FaultHandle:
        return ctx.link().corrupt_by_slicing(spec.target_learner, **spec.params())
