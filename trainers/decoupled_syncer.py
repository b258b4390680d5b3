"""The synchronizer's logic for Decoupled DiLoCo, without sockets or threads.

It owns the global fragments Theta_p, their versions and the outer Nesterov
optimizer (one momentum state per fragment), and it drives the fragment
schedule, as in the paper: learners report metadata (their step) every step;
the syncer's clock is the step of the K-th most advanced alive learner (it
moves back when the learners ahead leave, so those still here are pulled); when
that clock reaches a step at which fragment p is due (fragments staggered
over H steps), the syncer opens a *round* for p and pulls p from every alive
learner. Each learner answers at once from its host-RAM snapshot, whatever
step it is at, so a slower learner contributes fewer steps and the token
weights c_tokens**2 / c_steps account for it; a learner that has nothing new
(c_steps = 0) declines. `poll(now, alive)` asks the pure quorum / grace
policy about every open round and merges those it allows: outer gradient
Delta_m = Theta_p - theta_{m,p}, RDA on non-embedding tensors, weighted mean
on embeddings, then the outer step.

Every push ends in exactly one of: merged, rejected (with a reason), or
superseded (a newer push of the same learner in the same round, a late
answer to a round that already merged, or a stale copy whose work an earlier
merge already holds: a learner merged into version v of a fragment offers
nothing new until it has applied v, so its pushes based on an older version
are declined, never merged twice). A learner that (re)joins is sent every
current fragment; until it has applied them, its pushes based on older
versions are declined too (`on_join`, BEFORE_REJOIN).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch
from torch import Tensor

from trainers.config import DilocoConfig
from trainers.fragments import FragmentSchedule, partition_tensors
from trainers.learner import FragmentPush
from trainers.merge import all_finite, outer_gradient, token_weights
from trainers.model import ModelConfig, build_model
from trainers.outer_optimizer import NesterovOuterOptimizer, OuterOptConfig
from trainers.syncer_policy import Action, EwmaEstimator, QuorumConfig, RoundState, StepTimeTracker, decide


class PushOutcome(enum.Enum):
    ACCEPTED = "accepted"
    DECLINED = "declined"
    LATE = "late"
    REJECTED_NONFINITE = "rejected_nonfinite"
    REJECTED_SHAPE = "rejected_shape"
    REJECTED_FRAGMENT = "rejected_fragment"
    STALE = "stale"
    """The learner's copy still carries work already merged: it has not applied the version that merge made
    (its host is stalled, or the broadcast was lost). Merging it again would count that work twice."""
    UNANCHORED = "unanchored"
    """outer_anchor = base, and the push's base version is older than the versions the syncer still holds."""
    BEFORE_REJOIN = "before_rejoin"
    """Based on a version older than the one the learner was sent when it (re)joined: it trained on a copy the
    global model moved past while it was away (a freeze, a partition), and has not applied the current value
    yet. Measured against the current value, its outer gradient would undo that progress."""


@dataclass
class OpenRound:
    """One pull of one fragment: who was asked, who answered."""

    round_id: int
    started_at: float
    pulled: frozenset[int]
    quorum_at: float | None = None
    pushes: dict[int, FragmentPush] = field(default_factory=dict)
    declined: set[int] = field(default_factory=set)


@dataclass
class MergeRecord:
    """What one merge did; the service logs it and sends `tensors` to the participants."""

    fragment: int
    version: int
    round_id: int
    participants: list[int]
    pulled_steps: list[int]
    weights: list[float]
    c_steps: list[int]
    c_tokens: list[int]
    step_ranges: list[tuple[int, int]]
    base_versions: list[int]
    reason: str
    grace_s: float
    started_at: float
    quorum_at: float | None
    merged_at: float
    tensors: dict[str, Tensor]
    outer_grad_norm: float


@dataclass
class Pull:
    """A request the service sends to every learner in `learners`."""

    fragment: int
    round_id: int
    learners: frozenset[int]


class DecoupledSyncer:
    """Global fragments, outer optimizer, the fragment clock and open rounds. Clock injected."""

    def __init__(self, model_cfg: ModelConfig, cfg: DilocoConfig, seed: int, num_learners: int) -> None:
        self.cfg = cfg
        self.num_learners = num_learners
        model = build_model(model_cfg, seed)
        self.params: dict[str, Tensor] = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.partition = partition_tensors({n: t.numel() for n, t in self.params.items()}, cfg.fragments)
        self.schedule = FragmentSchedule(cfg.fragments, cfg.sync_every, cfg.overlap)
        self.versions = [0] * len(self.partition)
        self.round_ids = [0] * len(self.partition)
        self.rounds: list[OpenRound | None] = [None] * len(self.partition)
        self.outer = NesterovOuterOptimizer(OuterOptConfig(lr=cfg.outer_lr, momentum=cfg.outer_momentum))
        self.quorum = QuorumConfig(min_quorum=cfg.min_quorum, overlap=cfg.overlap, grace_gamma=cfg.grace_gamma,
                                   grace_cap_s=cfg.grace_cap_s, grace_enabled=cfg.grace_enabled)
        self.step_times = StepTimeTracker()
        self.sync_time = EwmaEstimator(alpha=0.2)
        self.reported_step: dict[int, int] = {}
        self.merged_into: dict[tuple[int, int], tuple[int, int]] = {}
        """(learner, fragment) -> (version its last merged push went into, last step that push covered)."""
        self.joined_at: dict[tuple[int, int], int] = {}
        """(learner, fragment) -> the version it was sent when it last (re)joined (`on_join`)."""
        self.history: list[dict[int, dict[str, Tensor]]] = []
        """Per fragment: version -> its global value, the last `cfg.anchor_history` versions (outer_anchor base;
        empty lists otherwise)."""
        self._reset_history()
        self.clock = 0
        self.merges = 0
        self.skipped_due = 0

    def fragment(self, p: int) -> dict[str, Tensor]:
        return {n: self.params[n] for n in self.partition[p]}

    # -- persistence ----------------------------------------------------------------------------
    def fragment_state(self, p: int) -> dict:
        """Everything a restarted syncer needs about fragment p: its global value, version, outer momentum,
        last round id, and the clock and reported steps at that moment. One fragment per file, so a merge
        writes only what it changed, and each file is consistent on its own."""
        key = f"frag{p}"
        bufs = self.outer.buffers(key)
        return {"fragment": p, "version": self.versions[p], "round_id": self.round_ids[p],
                "params": {n: t.detach().clone() for n, t in self.fragment(p).items()}, "momentum": bufs,
                "clock": self.clock, "reported_step": dict(self.reported_step),
                "merged_into": {m: list(v) for (m, q), v in self.merged_into.items() if q == p}}

    def restore(self, states: list[dict]) -> None:
        """Load fragment states written by `fragment_state` (any subset; the others keep their initial value).

        The merge count is the sum of versions (every merge bumps exactly one version); the clock and
        reported steps are the newest saved. Open rounds are not restored: the learners' counters were not
        reset for them, so that progress is pulled again in a later round."""
        buffers = self.outer.state_dict()["buffers"]
        for st in states:
            p = int(st["fragment"])
            if set(st["params"]) != set(self.partition[p]):
                raise ValueError(f"saved fragment {p} holds {sorted(st['params'])}, expected {self.partition[p]}")
            for n, t in st["params"].items():
                self.params[n].copy_(t)
            self.versions[p] = int(st["version"])
            self.round_ids[p] = int(st["round_id"])
            buffers[f"frag{p}"] = st["momentum"]
            self.clock = max(self.clock, int(st["clock"]))
            for m, step in st["reported_step"].items():
                self.reported_step[int(m)] = max(int(step), self.reported_step.get(int(m), 0))
            for m, (version, last) in st.get("merged_into", {}).items():
                self.merged_into[(int(m), p)] = (int(version), int(last))
        self.outer.load_state_dict({"buffers": buffers})
        self.merges = sum(self.versions)
        self._reset_history()  # older versions died with the old syncer

    def _reset_history(self) -> None:
        """Hold only each fragment's current version (outer_anchor = base; nothing is kept otherwise)."""
        base = self.cfg.outer_anchor == "base"
        self.history = [{self.versions[p]: {n: self.params[n].clone() for n in names}} if base else {}
                        for p, names in enumerate(self.partition)]

    # -- the clock ------------------------------------------------------------------------------
    def on_meta(self, learner: int, step: int, step_time_s: float, now: float, alive: frozenset[int]) -> list[Pull]:
        """A learner's per-step metadata. Returns the pulls to send (rounds opened by the clock)."""
        self.reported_step[learner] = max(step, self.reported_step.get(learner, 0))
        if step_time_s > 0:
            self.step_times.update(learner, step_time_s)
        steps = sorted((self.reported_step[m] for m in alive if m in self.reported_step), reverse=True)
        if len(steps) < self.cfg.min_quorum:
            return []
        target = steps[self.cfg.min_quorum - 1]
        if target < self.clock:
            # The learners that set the clock have left (finished, failed or cut off): follow the ones still
            # here, so their steps keep being pulled and merged instead of waiting until they pass the old
            # clock (a run's tail, or a fast learner's outage, would otherwise be global downtime).
            self.clock = target
            return []
        pulls: list[Pull] = []
        handled: set[int] = set()  # a clock that jumps (a learner back from an outage) asks once per fragment
        for s in range(self.clock + 1, target + 1):
            for p in self.schedule.fragments_due(s):
                rnd = self.rounds[p]
                if p in handled:
                    self.skipped_due += 1
                    continue
                handled.add(p)
                if rnd is not None:
                    # The previous round of p is still open (below quorum): it serves for this due step
                    # too, and every alive learner that has not pushed to it is asked (again): a learner
                    # that left and came back lost its pull, and one that declined (nothing trained yet)
                    # may have trained since; without asking again the round could never close.
                    self.skipped_due += 1
                    ask = alive - set(rnd.pushes)
                    if ask:
                        rnd.declined -= ask
                        rnd.pulled = rnd.pulled | ask
                        pulls.append(Pull(p, rnd.round_id, frozenset(ask)))
                    continue
                self.round_ids[p] += 1
                self.rounds[p] = OpenRound(self.round_ids[p], now, alive)
                pulls.append(Pull(p, self.round_ids[p], alive))
        self.clock = target
        return pulls

    def on_join(self, learner: int) -> list[int]:
        """A learner (re)joined and is sent every fragment's current value: returns those versions. Its pushes
        based on older versions are declined (BEFORE_REJOIN) until it has applied them."""
        for p, version in enumerate(self.versions):
            self.joined_at[(learner, p)] = version
        return list(self.versions)

    def forget(self, learner: int) -> None:
        """A learner left: keep its last step (it may come back) but stop waiting on it."""
        self.step_times.forget(learner)

    # -- answers --------------------------------------------------------------------------------
    def on_push(self, push: FragmentPush, round_id: int | None, now: float) -> tuple[PushOutcome, FragmentPush | None]:
        """Validate an answer to a pull (or a final unsolicited push, round_id None).

        Returns (outcome, the push it superseded if any)."""
        p = push.fragment
        if not 0 <= p < len(self.partition):
            return PushOutcome.REJECTED_FRAGMENT, None
        rnd = self.rounds[p]
        if round_id is None and push.final:  # end of a learner's run: join the open round or open one
            if rnd is None:
                self.round_ids[p] += 1
                rnd = self.rounds[p] = OpenRound(self.round_ids[p], now, frozenset({push.learner}))
            round_id = rnd.round_id
        if rnd is None or rnd.round_id != round_id:
            return PushOutcome.LATE, None
        if push.c_steps <= 0 or push.c_tokens <= 0:
            self._decline(rnd, push.learner, now)
            return PushOutcome.DECLINED, None
        if self.is_stale(push):
            self._decline(rnd, push.learner, now)
            return PushOutcome.STALE, None
        if push.base_version < self.joined_at.get((push.learner, p), 0):
            self._decline(rnd, push.learner, now)
            return PushOutcome.BEFORE_REJOIN, None
        if self.cfg.outer_anchor == "base" and push.base_version not in self.history[p]:
            self._decline(rnd, push.learner, now)
            return PushOutcome.UNANCHORED, None
        expected = self.fragment(p)
        if set(push.tensors) != set(expected) or any(push.tensors[n].shape != t.shape for n, t in expected.items()):
            return PushOutcome.REJECTED_SHAPE, None
        if not all_finite(push.tensors.values()):
            return PushOutcome.REJECTED_NONFINITE, None
        if push.step_time_s > 0:
            self.step_times.update(push.learner, push.step_time_s)
        superseded = rnd.pushes.get(push.learner)
        rnd.pushes[push.learner] = push
        self._note_quorum(rnd, now)
        return PushOutcome.ACCEPTED, superseded

    def _decline(self, rnd: OpenRound, learner: int, now: float) -> None:
        """An answer with nothing to merge: it counts toward the quorum, not toward the merge."""
        rnd.declined.add(learner)
        self._note_quorum(rnd, now)

    def _note_quorum(self, rnd: OpenRound, now: float) -> None:
        """Stamp when the round first had K answers (pushes plus declines): the grace window starts there."""
        if rnd.quorum_at is None and len(rnd.pushes) + len(rnd.declined - set(rnd.pushes)) >= self.cfg.min_quorum:
            rnd.quorum_at = now

    def is_stale(self, push: FragmentPush) -> bool:
        """Whether the push is based on a version older than one its learner's work was already merged into."""
        into = self.merged_into.get((push.learner, push.fragment))
        return into is not None and push.base_version < into[0]

    def missed_broadcast(self, push: FragmentPush) -> bool:
        """A stale push from a learner that has stepped past the point where it should have applied the merge
        (last merged step + overlap): it never got that broadcast, so it should be sent the fragment again."""
        into = self.merged_into.get((push.learner, push.fragment))
        return into is not None and push.last_step > into[1] + self.cfg.overlap

    def note_sync_time(self, seconds: float) -> None:
        """Feed xi_sync: the measured time of one merge plus its broadcast."""
        self.sync_time.update(seconds)

    # -- decisions ------------------------------------------------------------------------------
    def round_state(self, p: int, alive: frozenset[int]) -> RoundState | None:
        rnd = self.rounds[p]
        if rnd is None:
            return None
        reported = frozenset(rnd.pushes)
        awaited = (alive & rnd.pulled) - rnd.declined
        return RoundState(started_at=rnd.started_at, quorum_at=rnd.quorum_at, reported=reported, alive=awaited,
                          declined=frozenset(rnd.declined),
                          step_time_s=self.step_times.estimate(reported), sync_time_s=self.sync_time.value or 0.0)

    def poll(self, now: float, alive: frozenset[int]) -> tuple[list[MergeRecord], float | None, list[int]]:
        """Merge every round the policy allows.

        Returns (merges, earliest time to poll again, fragments whose round closed empty)."""
        merges: list[MergeRecord] = []
        empty: list[int] = []
        wake: float | None = None
        for p, rnd in enumerate(self.rounds):
            if rnd is None:
                continue
            if not rnd.pushes and not ((alive & rnd.pulled) - rnd.declined):
                self.rounds[p] = None  # everyone asked declined or left: nothing to merge
                empty.append(p)
                continue
            state = self.round_state(p, alive)
            assert state is not None
            d = decide(now, state, self.quorum)
            if d.action is Action.MERGE:
                merges.append(self.merge(p, now, d.reason, d.grace_s))
            elif d.wake_at is not None:
                wake = d.wake_at if wake is None else min(wake, d.wake_at)
        return merges, wake, empty

    def drain(self, now: float) -> list[MergeRecord]:
        """Merge every open round that has data, regardless of quorum (the run is ending)."""
        out = []
        for p, rnd in enumerate(self.rounds):
            if rnd is not None and rnd.pushes:
                out.append(self.merge(p, now, "drain at end of run", 0.0))
            self.rounds[p] = None
        return out

    # -- the merge ------------------------------------------------------------------------------
    def merge(self, p: int, now: float, reason: str, grace_s: float) -> MergeRecord:
        rnd = self.rounds[p]
        assert rnd is not None and rnd.pushes
        learners = sorted(rnd.pushes)
        pushes = [rnd.pushes[m] for m in learners]
        if self.cfg.token_weighting:
            weights = token_weights([(q.c_steps, q.c_tokens) for q in pushes])
        else:
            weights = [1.0 / len(pushes)] * len(pushes)
        frag = self.fragment(p)
        anchors = ([self.history[p][q.base_version] for q in pushes] if self.cfg.outer_anchor == "base" else None)
        delta = outer_gradient(frag, [q.tensors for q in pushes], weights, self.cfg.embedding_tensors,
                               self.cfg.merge_rule, anchors)
        if not all_finite(delta.values()):  # unreachable while pushes are checked; kept as a last guard
            raise FloatingPointError(f"non-finite outer gradient for fragment {p}")
        self.outer.step(f"frag{p}", frag, delta)
        self.versions[p] += 1
        if self.cfg.outer_anchor == "base":
            held = self.history[p]
            held[self.versions[p]] = {n: t.clone() for n, t in frag.items()}
            for v in sorted(held)[:-self.cfg.anchor_history]:
                del held[v]
        self.rounds[p] = None
        self.merges += 1
        for m, q in zip(learners, pushes, strict=True):
            self.merged_into[(m, p)] = (self.versions[p], q.last_step)
        norm = float(torch.sqrt(torch.stack([(d.double() ** 2).sum() for d in delta.values()]).sum()))
        return MergeRecord(
            fragment=p, version=self.versions[p], round_id=rnd.round_id, participants=learners,
            pulled_steps=[q.last_step for q in pushes], weights=weights,
            c_steps=[q.c_steps for q in pushes], c_tokens=[q.c_tokens for q in pushes],
            step_ranges=[(q.first_step, q.last_step) for q in pushes],
            base_versions=[q.base_version for q in pushes], reason=reason, grace_s=grace_s,
            started_at=rnd.started_at, quorum_at=rnd.quorum_at, merged_at=now,
            tensors={n: t.clone() for n, t in frag.items()}, outer_grad_norm=norm,
        )
