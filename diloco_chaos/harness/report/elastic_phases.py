"""elastic_ddp's torchrun engine, read back: each restart of the job with its measured phases, and the steps a
restart did twice (docs/metrics.md, "Restart phases").

What: `restart_phases(evs)` joins the records of diloco_chaos/harness/record/elastic.py per restart: detect (the
process fault that killed a worker to torchrun's agent seeing its group failed), stop, rendezvous and spawn (the
agent's), worker_init, pg_init and checkpoint_load (the slowest learner's: the job goes on when the last one is
back), and the steps redone (from the syncer's rollback). `rollbacks(evs)` is what goodput and updates_accounted
read: a step a learner did, or the syncer merged, after the checkpoint and before the rollback was lost, and is
done again.

Why here: the phases are logged by three kinds of process (the agent, the workers, the syncer); the report is
the one place that reads them all.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from diloco_chaos.harness.record import Event
from diloco_chaos.harness.record.elastic import ElasticFailureSeen, ElasticPhase, ElasticRollback
from diloco_chaos.harness.record.run import ProcessFault

PHASES = ("detect", "stop", "rendezvous", "spawn", "worker_init", "pg_init", "checkpoint_load")
"""In the order a restart goes through them."""
WORKER_PHASES = ("worker_init", "pg_init", "checkpoint_load")
"""Measured on each learner: a restart's figure is the slowest learner's."""


@dataclass(frozen=True)
class Rollback:
    """The syncer went back to the checkpoint at time t: steps to_step + 1 .. from_step were lost, and redone."""

    t: float
    to_step: int
    from_step: int

    def lost(self, step: int, end: float) -> bool:
        """A step that ended (or was merged) at `end` was lost to this rollback."""
        return end < self.t and self.to_step < step <= self.from_step


@dataclass(frozen=True)
class RestartPhases:
    """One restart of the torchrun job, its phases in seconds (None: not logged)."""

    restart: int
    phases: dict[str, float | None]
    steps_redone: int
    """Steps the group had completed after the checkpoint (done again after the restart)."""

    @property
    def total_s(self) -> float:
        return round(sum(v for v in self.phases.values() if v is not None), 4)

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "total_s": self.total_s}


def rollbacks(evs: Sequence[Event]) -> list[Rollback]:
    return [Rollback(e.t, e.to_step, e.from_step) for e in evs if isinstance(e, ElasticRollback)]


def lost_to_rollback(rbs: Sequence[Rollback], step: int, end: float) -> bool:
    return any(rb.lost(step, end) for rb in rbs)


def restart_phases(evs: Sequence[Event]) -> list[RestartPhases]:
    """Every restart (1, 2, ...) of the job, in order; [] for a run without the torchrun engine's records."""
    seen = {e.restart: e for e in evs if isinstance(e, ElasticFailureSeen)}
    faults = sorted(e.t for e in evs if isinstance(e, ProcessFault))
    agent: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    worker: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e in evs:
        if isinstance(e, ElasticPhase) and e.restart > 0:
            if e.phase in WORKER_PHASES:
                worker[e.restart][e.phase] = max(worker[e.restart][e.phase], e.seconds)
            else:
                agent[e.restart][e.phase] += e.seconds
    rbs = sorted(rollbacks(evs), key=lambda r: r.t)
    out = []
    for k in sorted(set(seen) | set(agent) | set(worker)):
        phases: dict[str, float | None] = dict.fromkeys(PHASES)
        f = seen.get(k)
        if f is not None:
            before = [t for t in faults if t <= f.t]
            phases["detect"] = round(f.t - before[-1], 4) if before else None
        for name, v in (*agent[k].items(), *worker[k].items()):
            phases[name] = round(v, 4)
        rb = rbs[k - 1] if len(rbs) >= k else None
        out.append(RestartPhases(k, phases, rb.from_step - rb.to_step if rb is not None else 0))
    return out


def summary(evs: Sequence[Event]) -> dict[str, object] | None:
    """report.json's `elastic_restarts`: per restart its phases; None without the torchrun engine's records."""
    rs = restart_phases(evs)
    if not rs:
        return None
    return {"restarts": len(rs), "per_restart": [r.to_dict() for r in rs],
            "phases_s": {p: round(sum(r.phases[p] or 0.0 for r in rs), 4) for p in PHASES},
            "steps_redone": sum(r.steps_redone for r in rs)}
