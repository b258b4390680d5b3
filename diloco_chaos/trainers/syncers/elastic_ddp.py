"""Elastic data parallel (`algorithm = "elastic_ddp"`): ddp whose global group follows the learners present.

The paper's main comparator: slice-granularity elasticity. The elastic unit is a learner (one slice). Every
inner step the syncer averages the gradients of the learners that are *members* of the global group and
applies AdamW to its replica, exactly like `ddp`; but when a member is lost (its link closes: a chip death
under the restart policy, a learner kill, a crashed host, or a link silent for `timeouts.liveness_s`) the
group shrinks to the learners still present and the step's barrier stops waiting for it. The pause that cost
the survivors is the reconfiguration stall. A learner that connects again (restarted after its repair, or a
partitioned one whose link is back) is admitted at the next step boundary: it is sent the replica, the AdamW
moments and the step, and from that step on the barrier expects it again.

Under the shrink policy (`recovery.policy = "shrink"` or `"elastic"`) a lost non-host chip does not reach
this module: its learner re-forms a smaller group inside itself (`diloco_chaos.trainers.learner.loops.run_ddp`, the same
regroup as Decoupled DiLoCo's) and stays a member, with fewer tokens per gradient; the barrier simply waits for its
gradient while it re-forms. Only a learner-level loss (a lost host, a learner kill, a crashed host, a silent
link) changes the membership here.

The global batch shrinks with the membership. The learning rate is kept: the syncer takes the token-weighted
mean gradient of the members present, an unbiased estimate of the same gradient from a smaller batch, and
AdamW's update size does not follow the gradient's scale, so the schedule stays the fault-free one (a batch-
size rule would tie the schedule to the fault timeline). docs/algorithm.md says more.

`decide` is the membership decision: a pure function of (clock value, the open step's view, the change) that
returns its reason, like `diloco_chaos.trainers.merge.quorum.decide`. `ElasticDdpSyncer` applies its decisions and
keeps the records of every reconfiguration for the harness to log.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from diloco_chaos.trainers.config import TrainConfig
from diloco_chaos.trainers.merge.outer_gradient import all_finite
from diloco_chaos.trainers.messages import STATE_STEP_KEY
from diloco_chaos.trainers.model import ModelConfig
from diloco_chaos.trainers.syncers.core import Reconfiguration, SyncRejected, SyncResult, SyncRound
from diloco_chaos.trainers.syncers.synchronous import DdpSyncer
from diloco_chaos.trainers.task import Task


class Action(enum.Enum):
    """What a membership change does to the global group."""

    SHRINK = "shrink"
    GROW = "grow"
    KEEP = "keep"


@dataclass(frozen=True)
class OpenStep:
    """What the syncer knows about the step its barrier is waiting on, at decision time."""

    step: int
    """The open step: the last completed step + 1."""
    members: frozenset[int]
    """Learners the barrier expects for this step."""
    arrived: Mapping[int, float]
    """Learner -> clock time its gradient for this step arrived."""
    finished: frozenset[int] = frozenset()
    """Learners that said BYE after the group's last step: their leaving is the end, not a loss."""


@dataclass(frozen=True)
class Change:
    """A learner's link closed (`lost`) or it connected (`joined`)."""

    kind: Literal["lost", "joined"]
    learner: int
    why: str
    """What signalled it (the link's close reason), for the event."""


@dataclass(frozen=True)
class Decision:
    """The outcome of `decide`."""

    action: Action
    members: frozenset[int]
    """The group after the change."""
    complete: bool
    """The open step's round completes now: every remaining member's gradient is in."""
    stall_started_at: float
    """When the members present began waiting on the lost learner alone (their last gradient's arrival), or
    now when they were not all in yet: the reconfiguration stall is now minus this."""
    reason: str


def round_complete(view: OpenStep, members: frozenset[int] | None = None) -> bool:
    """Every member's gradient for the open step is in (and there is at least one member)."""
    group = view.members if members is None else members
    return bool(group) and group <= set(view.arrived)


def decide(now: float, view: OpenStep, change: Change) -> Decision:
    """The global group after `change`, and whether the open step completes because of it.

    Branches, first match wins:
      1. joined, already a member -> KEEP (its link came back before its loss was noticed; it is caught up);
      2. joined -> GROW from the open step: it is sent the state after the last completed step;
      3. lost, not a member -> KEEP (an old connection, or one already dropped);
      4. lost after its BYE -> KEEP membership minus it, no reconfiguration (the run is ending);
      5. lost -> SHRINK; the open step completes now if every survivor's gradient is in, and the stall is
         the time since the last of them arrived (the survivors waited on the lost learner alone);
         otherwise the step goes on waiting for the survivors, with no stall.
    """
    m = change.learner
    if change.kind == "joined":
        if m in view.members:
            return Decision(Action.KEEP, view.members, False, now,
                            f"learner {m} reconnected while still a member; it is caught up at step {view.step}")
        after = view.members | {m}
        return Decision(Action.GROW, after, False, now,
                        f"learner {m} joined ({change.why}); admitted from step {view.step} with the state after "
                        f"step {view.step - 1}")
    if m not in view.members:
        return Decision(Action.KEEP, view.members, False, now, f"learner {m} left but is not a member")
    after = view.members - {m}
    if m in view.finished:
        return Decision(Action.KEEP, after, round_complete(view, after), now, f"learner {m} finished")
    if round_complete(view, after):
        waited_from = max(t for k, t in view.arrived.items() if k in after)
        return Decision(Action.SHRINK, after, True, min(waited_from, now),
                        f"learner {m} lost ({change.why}); the {len(after)} survivors' step {view.step} gradients "
                        "were in, the step completes without it")
    return Decision(Action.SHRINK, after, False, now,
                    f"learner {m} lost ({change.why}) before every survivor's step {view.step} gradient was in; "
                    "the barrier waits for the survivors only")


@dataclass
class _Grow:
    """A learner admitted, waiting for its first step to complete."""

    before: list[int]
    after: list[int]
    step: int
    admitted_at: float
    reason: str


class ElasticDdpSyncer(DdpSyncer):
    """ddp's averaging and AdamW replica behind a barrier whose membership follows `decide`."""

    def __init__(self, model_cfg: Task | ModelConfig, train_cfg: TrainConfig, seed: int, num_learners: int,
                 restart_from: Callable[[], tuple[int, dict[str, Tensor]] | None] | None = None) -> None:
        super().__init__(model_cfg, train_cfg, seed, num_learners)
        self.restart_from = restart_from
        self.num_learners = num_learners
        """A job restarted whole (elastic.engine = "torchrun"): the checkpoint its learners resume from (None: none
        written yet, the initial state). The first learner to join an empty group after steps were completed
        rolls the replica back to it (`rollbacks`)."""
        self.initial = self.resume_state() if restart_from is not None else None
        self.rollbacks: list[tuple[int, int, int]] = []
        """(from step, to step, learner) of each rollback since the last `take_rollbacks`."""
        self.members: set[int] = set(range(num_learners))  # every learner is expected from step 1, as in ddp
        self.finished: set[int] = set()
        self.arrived: dict[int, float] = {}
        """Learner -> when its gradient for the open step arrived."""
        self.pending: dict[int, tuple[int, dict[str, Tensor]]] = {}
        """Learner -> (tokens, gradient) for the open step."""
        self.records: list[Reconfiguration] = []
        self.grows: dict[int, _Grow] = {}
        self.completed = 0
        self.steps = train_cfg.steps

    def view(self) -> OpenStep:
        return OpenStep(self.completed + 1, frozenset(self.members), dict(self.arrived), frozenset(self.finished))

    def take_reconfigurations(self) -> list[Reconfiguration]:
        """The reconfigurations since the last call, oldest first."""
        out, self.records = self.records, []
        return out

    def on_join(self, learner: int, now: float, why: str) -> tuple[int, dict[str, Tensor]]:
        """A learner connected: admit it from the open step. Returns the state it resumes from."""
        if self.restart_from is not None and not self.members and self.completed > 0:
            self._roll_back(learner)
        before = sorted(self.members)
        d = decide(now, self.view(), Change("joined", learner, why))
        self.members = set(d.members)
        self.finished.discard(learner)
        if d.action is Action.GROW:
            self.grows[learner] = _Grow(before, sorted(d.members), self.completed + 1, now, d.reason)
        return self.resume_state()  # one merge per completed step: its step is `completed`

    def on_contribution(self, learner: int, key: int, step: int, tokens: int, tensors: dict[str, Tensor],
                        now: float) -> SyncResult:
        return self.on_grads(learner, step, tokens, tensors, now)

    def _roll_back(self, learner: int) -> None:
        """The whole job was stopped and restarts from its checkpoint: the replica, its AdamW moments and the
        completed step go back to it (the steps after it are done again)."""
        import torch

        assert self.restart_from is not None and self.initial is not None
        step, tensors = self.restart_from() or self.initial
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(tensors[n])
        for n, p in self.params.items():
            if f"opt.exp_avg.{n}" in tensors:
                self.optimizer.opt.state[p] = {"step": torch.tensor(float(step)),
                                               "exp_avg": tensors[f"opt.exp_avg.{n}"].clone(),
                                               "exp_avg_sq": tensors[f"opt.exp_avg_sq.{n}"].clone()}
            else:
                self.optimizer.opt.state.pop(p, None)
        self.rollbacks.append((self.completed, step, learner))
        self.barrier.completed = self.completed = self.merges = step
        self.barrier.last = None
        self.pending, self.arrived, self.grows = {}, {}, {}
        self.members = set(range(self.num_learners))  # the restarted job: every learner, as at the start

    def take_rollbacks(self) -> list[tuple[int, int, int]]:
        """The rollbacks since the last call, oldest first."""
        out, self.rollbacks = self.rollbacks, []
        return out

    def on_finished(self, learner: int) -> None:
        """It said BYE. That is the end only once the group has completed its last step: a host whose chip died
        may close its link politely (BYE) before it exits, and that is still a loss."""
        if self.completed >= self.steps:
            self.finished.add(learner)

    def on_leave(self, learner: int, now: float, why: str) -> SyncRound | None:
        """A learner's link closed: shrink the group. Returns the open step's round if that completes it."""
        before = sorted(self.members)
        d = decide(now, self.view(), Change("lost", learner, why))
        self.members = set(d.members)
        self.grows.pop(learner, None)
        self.pending.pop(learner, None)  # a gradient of a learner no longer present is not averaged
        self.arrived.pop(learner, None)
        if d.action is Action.SHRINK:
            self.records.append(Reconfiguration("shrink", learner, before, sorted(d.members), self.completed + 1,
                                                d.stall_started_at, now, now - d.stall_started_at, d.reason))
        return self._complete(now) if d.complete else None

    def on_grads(self, learner: int, step: int, tokens: int, grads: dict[str, Tensor],
                 now: float = 0.0) -> SyncResult:
        """False if non-finite or malformed, `SyncRejected` if ahead of the group or from a non-member, None
        while waiting, the round when complete; for a request older than the open step, a reply to that learner
        alone: the stored result (the last step, kept by the barrier as in ddp) or the full state (older)."""
        if set(grads) != set(self.params) or not all_finite(grads.values()):
            return False
        if step <= self.completed:
            again = self.barrier.replay(step, learner)
            if again is not None:
                return again
            at, tensors = self.resume_state()
            return SyncRound(key=step, participants=[learner], tokens=[0], step=at,
                             tensors={**tensors, STATE_STEP_KEY: _scalar(at)}, replay_to=learner)
        if step > self.completed + 1:  # never averaged
            return SyncRejected(f"ahead of the group: step {step}, the open step is {self.completed + 1}")
        if learner not in self.members:
            return SyncRejected("not a member of the global group")
        self.pending[learner] = (tokens, grads)
        self.arrived[learner] = now
        return self._complete(now) if round_complete(self.view()) else None

    def _complete(self, now: float) -> SyncRound:
        step = self.completed + 1
        done = {m: self.pending[m] for m in sorted(self.members)}
        for m in sorted(self.grows):
            g = self.grows.pop(m)
            others = [t for k, t in self.arrived.items() if k != m]
            waited_from = max(others, default=self.arrived.get(m, now))
            self.records.append(Reconfiguration("grow", m, g.before, g.after, g.step, g.admitted_at, now,
                                                max(0.0, self.arrived.get(m, now) - waited_from), g.reason))
        self.pending, self.arrived = {}, {}
        self.barrier.completed = self.completed = step
        self.barrier.last = self.merge(step, done)
        return self.barrier.last


def _scalar(x: int) -> Tensor:
    import torch

    return torch.tensor([float(x)])
