"""`degrade`: added round-trip latency (+- seeded jitter) and/or a bandwidth cap on one learner's link."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from diloco_chaos.chaos.faults.base import (
    KERNEL,
    LINK_BACKENDS,
    FaultContext,
    FaultHandle,
    FaultKind,
    ScheduleError,
    register,
)
from diloco_chaos.chaos.wan_profiles import WAN_PROFILES
from diloco_chaos.trainers.config import bounded, choice

if TYPE_CHECKING:
    from diloco_chaos.chaos.schedule import FaultSpec


@dataclass(frozen=True)
class DegradeParams:
    """A slower link: a named WAN profile and/or explicit figures (which override the profile's)."""

    profile: str | None = choice(None, tuple(WAN_PROFILES))
    """A named WAN profile (diloco_chaos/chaos/wan_profiles.py), resolved for the run's fragment size and step time."""
    latency_ms: float | None = bounded(None, 0.0, 60_000.0)
    """Added round-trip time in ms (half on each direction)."""
    jitter_ms: float | None = bounded(None, 0.0, 60_000.0)
    """+- this much (round trip), drawn by the harness from the run's seed."""
    bandwidth_kbps: float | None = bounded(None, 8.0, 100_000_000.0)
    """Link rate in kilobits/s, each direction (Toxiproxy's `rate` is KB/s: kbps / 8)."""


@register
class Degrade(FaultKind):
    name = "degrade"
    target = "link"
    params = DegradeParams
    backends = LINK_BACKENDS | KERNEL
    backend_params = {"kernel": frozenset({"bandwidth_kbps"})}
    """The kernel backend has tbf but no netem: a rate, no added latency or jitter (so no WAN profile)."""
    colour = "#ff7f0e"
    summary = "added latency (+- jitter) and/or a bandwidth cap on one learner's link"

    def validate(self, spec: FaultSpec, key: str) -> None:
        if not spec.params():
            raise ScheduleError(f"{key}: degrade needs profile, latency_ms, jitter_ms or bandwidth_kbps")

    def apply(self, ctx: FaultContext, spec: FaultSpec) -> FaultHandle:
        p = spec.options
        return ctx.link().degrade(spec.target_learner, latency_ms=p.latency_ms or 0.0, jitter_ms=p.jitter_ms or 0.0,
                                  bandwidth_kbps=p.bandwidth_kbps, profile=p.profile)
