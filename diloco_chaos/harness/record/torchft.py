"""Records of the torchft target's events (docs/targets/torchft.md): its run's supervisor starting the Lighthouse
(diloco_chaos/harness/targets/torchft/run.py), each trainer rank's syncs (diloco_chaos/harness/targets/torchft/
trainer.py) and torchft's own structured loggers `torchft_quorums` and `torchft_commits`, copied by a logging
handler in the trainer (diloco_chaos/harness/targets/torchft/observe.py). The trainer also writes the built-in
records whose meaning matches (chip_start, step, learner_done, chip_error, eval)."""

from __future__ import annotations

from dataclasses import dataclass

from diloco_chaos.harness.record.base import Event, event

TRAINER = "`learner<m>.chip<r>` (diloco_chaos/harness/targets/torchft/trainer.py)"
OBSERVE = "`learner<m>.chip<r>` (diloco_chaos/harness/targets/torchft/observe.py)"
RUN = "supervisor (diloco_chaos/harness/targets/torchft/run.py)"


@event("lighthouse_ready", RUN)
@dataclass(frozen=True, kw_only=True)
class LighthouseReady(Event):
    """torchft's Lighthouse accepts connections on its port (the replica groups are started after this)."""

    port: int
    """Its port on 127.0.0.1 (gRPC, and HTTP: `GET /status`)."""
    child_pid: int
    """Its process id."""
    ready_s: float
    """Seconds from its start to its port accepting."""


@event("torchft_sync", TRAINER)
@dataclass(frozen=True, kw_only=True)
class TorchftSync(Event):
    """One manager step of a replica group ended (torchft_ddp: every step; torchft_diloco: each fragment sync),
    written by every rank after `should_commit`."""

    learner: int
    """The replica group (learner m is replica group m)."""
    rank: int
    """The rank inside the group."""
    step: int
    """The manager's step after this sync (`Manager.current_step()`): the global step every participant that
    committed it agrees on."""
    inner_step: int
    """The learner's own inner steps so far (torchft_ddp: equal to step unless it healed)."""
    quorum_id: int
    """The quorum the sync ran in (`Manager._quorum_id`, private in torchft 0.2.0)."""
    participants: int
    """Replica groups in that quorum (`Manager.num_participants()`)."""
    committed: bool
    """Whether this sync was committed (`should_commit` returned true: every participant's collectives succeeded)."""
    healed: bool
    """Whether the group healed (loaded a live peer's state) in this step's quorum."""
    digest: str
    """sha1 (12 hex digits) of the global weights after the sync: torchft_ddp the model's parameters,
    torchft_diloco every fragment's last synced (`original_parameters`); replicas_agree compares them per step."""
    error: str | None = None
    """`Manager.errored()` when the step failed, else None."""


@event("torchft_quorum", OBSERVE)
@dataclass(frozen=True, kw_only=True)
class TorchftQuorum(Event):
    """torchft's `torchft_quorums` logger: this rank's manager received a new quorum."""

    learner: int
    """The replica group."""
    rank: int
    """The rank inside the group."""
    replica_id: str
    """The manager's replica id (the group's name, ':' and a uuid per process start)."""
    quorum_id: int
    """The new quorum's id."""
    step: int
    """The quorum's max step (the step the group continues from, after a heal if it was behind)."""


@event("torchft_commit", OBSERVE)
@dataclass(frozen=True, kw_only=True)
class TorchftCommit(Event):
    """torchft's `torchft_commits` logger: this rank's manager decided a step's commit (`should_commit`)."""

    learner: int
    """The replica group."""
    rank: int
    """The rank inside the group."""
    replica_id: str
    """The manager's replica id."""
    quorum_id: int
    """The quorum the step ran in."""
    step: int
    """The manager step decided."""
    commit_result: bool
    """Whether every participant's work succeeded, so the step was committed."""
