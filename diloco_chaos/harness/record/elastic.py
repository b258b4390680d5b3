"""Records of elastic_ddp's torchrun engine (`[elastic] engine = "torchrun"`): what the instrumented torchrun
agent (diloco_chaos/harness/hosts/elastic_agent.py), its workers (diloco_chaos/harness/algorithms/elastic_ddp.py)
and the syncer (diloco_chaos/harness/syncer/barrier.py) log about each restart of the job.

Why a module of its own: one restart is told by three kinds of process, and the report joins them into the
restart's phases (diloco_chaos/harness/report/elastic_phases.py): detect (the fault to the agent seeing its
workers failed), stop, rendezvous, spawn (the agent), worker init, process-group init and checkpoint load (the
workers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from diloco_chaos.harness.record.base import Event, event

AGENT = "`torchrun.agent` (diloco_chaos/harness/hosts/elastic_agent.py)"
WORKER = "`learner<m>.chip<r>` (diloco_chaos/harness/algorithms/elastic_ddp.py)"
SYNCER = "syncer (diloco_chaos/harness/syncer/barrier.py)"

Phase = Literal["stop", "rendezvous", "spawn", "worker_init", "pg_init", "checkpoint_load"]
"""A measured phase of a restart: stop (torchrun stops every worker), rendezvous (c10d, on the run's store),
spawn (torchrun starts the workers), worker_init (a learner host's process from its creation to forming its
group: the interpreter, torch's import, the model and the data), pg_init (a learner's Gloo group formed and its
host rejoined the global group at the syncer), checkpoint_load
(a learner read the last checkpoint and every chip took it)."""


@event("elastic_failure_seen", AGENT)
@dataclass(frozen=True, kw_only=True)
class ElasticFailureSeen(Event):
    """torchrun's agent saw its worker group failed (its monitor found a worker exited non-zero)."""

    restart: int
    """The restart this failure starts (1 for the first)."""
    failed_ranks: list[int]
    """Global ranks of the workers that failed (rank = learner x chips_per_learner + chip)."""
    exitcodes: list[int]
    """Their exit codes (same order; negative: killed by that signal)."""
    restarts_left: int
    """Restarts torchrun has left after this one (--max-restarts); -1: none left, the job fails."""


@event("elastic_phase", f"{AGENT}; {WORKER}")
@dataclass(frozen=True, kw_only=True)
class ElasticPhase(Event):
    """One measured phase of a restart of the torchrun job."""

    restart: int
    """Which restart (TORCHELASTIC_RESTART_COUNT of the workers it started; 0: the job's first start)."""
    phase: Phase
    """The phase."""
    seconds: float
    """Its measured duration (a monotonic clock of the process that logs it)."""
    learner: int | None = None
    """The learner it was measured on (worker phases); None for the agent's."""


@event("elastic_checkpoint", WORKER)
@dataclass(frozen=True, kw_only=True)
class ElasticCheckpoint(Event):
    """Global rank 0 wrote the replica's checkpoint (temp file, fsync, rename) after a step."""

    step: int
    """The step it holds the state after."""
    seconds: float
    """Time the write took (inside the step's time: production pays it too)."""
    path: str
    """The checkpoint file."""


@event("elastic_rollback", SYNCER)
@dataclass(frozen=True, kw_only=True)
class ElasticRollback(Event):
    """The syncer's replica went back to the last checkpoint when the restarted job rejoined: the steps after it
    are redone, and their first doing counts as lost."""

    from_step: int
    """The last step the group had completed before the restart."""
    to_step: int
    """The checkpoint's step: the group goes on from the step after it."""
    learner: int
    """The learner whose rejoining triggered it (the first back)."""
