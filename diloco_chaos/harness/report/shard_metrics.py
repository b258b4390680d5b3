"""Per-shard figures of a run's synchronizer (syncer.shards; docs/sharded-syncer.md): merges, outages, and
what went on merging while a shard was down.

A shard's *outage* runs from the moment it was lost (the `kill_syncer` process fault that hit it, or, without
one, its `syncer_down`) to its first merge after it restored (`syncer_restore`): the time its fragments could not
advance. Unsharded runs have one shard, 0, named `syncer`; the figures then describe the whole synchronizer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from diloco_chaos.harness.record import Event
from diloco_chaos.harness.record.run import ProcessFault, SyncerDown, SyncerRestart
from diloco_chaos.harness.record.syncer import Merge, SyncerRestore, SyncerStart, shard_of
from diloco_chaos.harness.report.metrics import downtime


@dataclass
class ShardFigures:
    """One shard's figures (times relative to the run's start)."""

    merges: int = 0
    """Merges it logged."""
    owned: list[int] | None = None
    """The fragments it owns (None: unsharded, every fragment)."""
    restarts: int = 0
    """Times the supervisor restarted it."""
    outages: list[list[float | None]] = field(default_factory=list)
    """[lost, first merge after its restore] per outage, seconds from the run's start (end None: never merged
    again)."""
    outage_s: float = 0.0
    """Seconds its fragments could not advance, summed over its outages (to the training end if open)."""
    merges_in_outage: int = 0
    """Merges logged (by any shard) while it was out: the other shards' merges, since it merges nothing then."""
    uptime: float | None = None
    """diloco_chaos/harness/report/metrics.py `downtime` over its own merges: the share of the training span in which
    its fragments advanced within the downtime window."""


def shard_figures(recs: Sequence[Event], start: float, train_start: float, train_end: float) -> dict[str, Any]:
    """Shard -> its `ShardFigures` as a dict, for report.json's `shards`."""
    merges: dict[int, list[float]] = defaultdict(list)
    all_merges: list[float] = []
    figs: dict[int, ShardFigures] = defaultdict(ShardFigures)
    lost_at: dict[int, float] = {}
    spans: dict[int, list[tuple[float, float, bool]]] = defaultdict(list)  # (lost, back, closed) per shard
    restored: dict[int, bool] = {}
    shards: set[int] = {0}
    for e in recs:
        if isinstance(e, SyncerStart) and e.shard is not None:
            shards.add(e.shard)
            figs[e.shard].owned = e.owned
    for e in sorted(recs, key=lambda e: e.t):
        if isinstance(e, ProcessFault) and e.kind == "kill_syncer":
            for k in (sorted(shards) if e.shard is None else [e.shard]):
                lost_at.setdefault(k, e.t)
                restored[k] = False
        elif isinstance(e, SyncerDown):
            lost_at.setdefault(e.shard, e.t)
            restored.setdefault(e.shard, False)
        elif isinstance(e, SyncerRestart):
            figs[e.shard].restarts += 1
        elif isinstance(e, SyncerRestore):
            restored[shard_of(e.proc)] = True
        elif isinstance(e, Merge):
            k = shard_of(e.proc)
            merges[k].append(e.t)
            all_merges.append(e.t)
            figs[k].merges += 1
            if k in lost_at and restored.get(k):
                spans[k].append((lost_at.pop(k), e.t, True))
    for k, t0 in lost_at.items():  # never merged again after it was lost
        spans[k].append((t0, train_end, False))
    out: dict[str, Any] = {}
    for k in sorted(shards | set(figs) | set(spans)):
        f = figs[k]
        f.outage_s = round(sum(b - a for a, b, _ in spans[k]), 3)
        f.merges_in_outage = sum(1 for t in all_merges if any(a < t < b for a, b, _ in spans[k]))
        f.outages = [[round(a - start, 3), round(b - start, 3) if closed else None] for a, b, closed in spans[k]]
        f.uptime = downtime(merges[k], train_start, train_end)["uptime"]
        out[str(k)] = asdict(f)
    return out
