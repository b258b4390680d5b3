"""WAN profiles: real inter-datacenter links, scaled down to this harness's miniature.

A profile is named after its real reference (e.g. `wan-2gbps-40ms`) and
resolved into toxics (`latency_ms`, `jitter_ms`, `bandwidth_kbps`) for a run's
fragment size and inner-step time, keeping the two ratios that matter to
Decoupled DiLoCo: how many inner steps a fragment needs to cross the link
(against the overlap tau) and how large the round trip is against a step.
On a real cluster, use the real figures directly with `degrade`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WanProfile:
    """A real WAN link, scaled down to this harness's miniature by keeping its ratios to the step time.

    What matters to the algorithm is not bytes per second but how many inner
    steps a fragment needs to cross the link (against the overlap tau) and how
    large the round trip is against a step. A profile keeps those two ratios
    from its real reference and turns them into toxics for the run's fragment
    size and step time: rate = fragment_bytes / (transfer_steps * step_s),
    latency = rtt_steps * step_s.
    """

    name: str
    reference: str
    """The real link and workload the ratios come from."""
    transfer_steps: float
    """Inner-step times one fragment takes to cross the link at the reference."""
    rtt_steps: float
    """Round-trip time in inner-step times at the reference."""
    jitter_fraction: float = 0.0
    """Jitter as a fraction of the round-trip time."""

    def resolve(self, fragment_bytes: int, step_s: float) -> dict[str, float]:
        rate_bytes_s = fragment_bytes / (self.transfer_steps * step_s)
        rtt_ms = self.rtt_steps * step_s * 1e3
        return {"bandwidth_kbps": rate_bytes_s * 8 / 1000, "latency_ms": rtt_ms,
                "jitter_ms": rtt_ms * self.jitter_fraction}


# Reference workload for the ratios: 12B parameters in bf16 (24 GB), P = 24 fragments (1 GB each), 1 s inner
# steps (the paper's geo-distributed run used 2-5 Gbps between four US regions; S-nvf quotes 1 s steps).
WAN_PROFILES: dict[str, WanProfile] = {
    p.name: p
    for p in (
        WanProfile("wan-5gbps-20ms", "5 Gbit/s, 20 ms RTT: 1 GB fragment in 1.6 s; RTT 0.02 steps", 1.6, 0.02),
        WanProfile("wan-2gbps-40ms", "2 Gbit/s, 40 ms RTT: 1 GB fragment in 4 s; RTT 0.04 steps", 4.0, 0.04),
        WanProfile("transatlantic", "1 Gbit/s, 80 ms RTT +-10%: 1 GB fragment in 8 s; RTT 0.08 steps",
                   8.0, 0.08, 0.1),
        WanProfile("lossy-edge", "400 Mbit/s, 150 ms RTT +-30% (retransmits as jitter): 20 s per fragment",
                   20.0, 0.15, 0.3),
    )
}
