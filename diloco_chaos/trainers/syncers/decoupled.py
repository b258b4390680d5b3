"""The synchronizer's logic for Decoupled DiLoCo, without sockets or threads.

It owns the global fragments Theta_p, their versions and the outer Nesterov
optimizer (one momentum state per fragment), and it runs the fragment rounds
as in the paper: learners report metadata (their step) every step, and a
learner *reports* for fragment p when its own step count reaches one of p's
sync points (every H of its steps, staggered by fragment; `FragmentSchedule`).
The syncer then pulls p from that learner's host-RAM snapshot at once.

Rounds. Each fragment has at most one open round. A report opens one only if
its sync index is beyond every round of p opened so far (`lead`); a report
while a round is open joins it (pulled again if it was already in: the newer
copy supersedes its older one); any other report is *late* (its round already
merged) and the learner is pulled when p's next round opens. So rounds follow
the most advanced learners: about one merge per fragment per H of their steps,
never one per learner. When those leave, or stop stepping for H step times
(a stalled leader is a straggler too), `lead` falls back to the most advanced
learner still driving, so the others open rounds. `poll(now, alive)`
asks the pure quorum / grace policy (`syncer_policy.decide`) about every open
round: K fresh pushes (answers of learners at the sync point), then the grace
window; learners not at the point are not in the merge.

Late answers. An answer that arrives after its round merged is *carried*: it
joins p's open round, or the next one when it opens, and is merged there (not
counted toward K); its learner's counters were not reset, so its work is not
lost and its token weight covers all of it. At the end of the run `drain`
merges what is still open or carried. Merge: outer gradient
Delta_m = Theta_p - theta_{m,p}, RDA on non-embedding tensors, weighted mean on
embeddings, then the outer step.

Every push ends in exactly one of: merged, rejected (with a reason), or
superseded (a newer push of the same learner in the same round, or a stale
copy whose work an earlier merge already holds: a learner merged into version
v of a fragment offers nothing new until it has applied v, so its pushes based
on an older version are declined, never merged twice). A learner that
(re)joins is sent every current fragment; until it has applied them, its
pushes based on older versions are declined too (`on_join`, BEFORE_REJOIN),
except its final pushes: a learner that finished while the syncer was down
reconnects only to deliver them and never applies what it is sent, so they
are judged by the other rules and merged when they hold steps not merged.
A push based on a version more than `max_staleness` behind the fragment's
current one is declined as LAGGING and its learner sent the current value: its
learner missed that many merges (a freeze or stall shorter than the liveness
timeout), and measured against the current value its outer gradient would undo
the others' progress since. A learner at the sync point whose answer was declined is pulled again at its
next step while the round is open.
"""

from __future__ import annotations

import torch
from torch import Tensor

from diloco_chaos.trainers import mutations
from diloco_chaos.trainers.config import DilocoConfig
from diloco_chaos.trainers.fragments import FragmentSchedule, partition_tensors
from diloco_chaos.trainers.merge.outer_gradient import MergeNorms, all_finite, outer_gradient, token_weights
from diloco_chaos.trainers.merge.outer_optimizer import NesterovOuterOptimizer, OuterOptConfig
from diloco_chaos.trainers.merge.quorum import Action, EwmaEstimator, QuorumConfig, RoundState, StepTimeTracker, decide
from diloco_chaos.trainers.messages import FragmentPush
from diloco_chaos.trainers.model import ModelConfig
from diloco_chaos.trainers.syncers.decoupled_records import MergeRecord, OpenRound, Pull, PushOutcome
from diloco_chaos.trainers.task import Task, embedding_names, parameters
from diloco_chaos.trainers.tasks import as_task


class DecoupledSyncer:
    """Global fragments, outer optimizer, the fragment clock and open rounds. Clock injected."""

    def __init__(self, model_cfg: Task | ModelConfig, cfg: DilocoConfig, seed: int, num_learners: int,
                 owned: frozenset[int] | None = None) -> None:
        self.cfg = cfg
        self.owned = owned
        """A shard of a sharded synchronizer (diloco_chaos/trainers/syncers/shards.py): the fragments it owns, the
        only ones it
        opens rounds for, merges and accepts pushes of; the others keep their initial value here. None: all."""
        self.num_learners = num_learners
        self.seed = seed
        task = as_task(model_cfg, seed)
        model = task.build_model(seed)
        self.params: dict[str, Tensor] = {n: p.detach().clone() for n, p in parameters(model).items()}
        self.embeddings = embedding_names(model, cfg.embedding_tensors or task.embedding_tensors)
        """Parameter names merged by the weighted mean (diloco.embedding_tensors, else the task's)."""
        self.partition = partition_tensors({n: t.numel() for n, t in self.params.items()}, cfg.fragments)
        self.schedule = FragmentSchedule(cfg.fragments, cfg.sync_every, cfg.overlap)
        n = len(self.partition)
        self.versions = [0] * n
        self.round_ids = [0] * n
        self.rounds: list[OpenRound | None] = [None] * n
        self.lead = [0] * n
        """Per fragment: the highest sync index that opened or joined one of its rounds (r_p)."""
        self.pending: list[set[int]] = [set() for _ in range(n)]
        """Per fragment: learners that reached a sync point after its round merged; pulled when the next opens."""
        self.held: list[dict[int, FragmentPush]] = [{} for _ in range(n)]
        """Per fragment: carried pushes waiting for its next round (no round open when they arrived)."""
        self.outer = NesterovOuterOptimizer(OuterOptConfig(lr=cfg.outer_lr, momentum=cfg.outer_momentum))
        self.quorum = QuorumConfig.from_diloco(cfg)
        self.step_times = StepTimeTracker()
        self.sync_time = EwmaEstimator(alpha=0.2)
        self.reported_step: dict[int, int] = {}
        self.last_report_at: dict[int, float] = {}
        """Learner -> clock time it last reported a new step (a leader that stopped stepping stops driving)."""
        self.step_gaps: dict[int, EwmaEstimator] = {}
        """Learner -> EWMA of the clock time between its reported steps, per step."""
        self.merged_into: dict[tuple[int, int], tuple[int, int]] = {}
        """(learner, fragment) -> (version its last merged push went into, last step that push covered)."""
        self.overwritten_at: dict[tuple[int, int], int] = {}
        """(learner, fragment) -> the version it was last sent as a merge it was not in (`on_overwrite`)."""
        self.joined_at: dict[tuple[int, int], int] = {}
        """(learner, fragment) -> the version it was sent when it last (re)joined (`on_join`)."""
        self.history: list[dict[int, dict[str, Tensor]]] = []
        """Per fragment: version -> its global value, the last `cfg.anchor_history` versions (outer_anchor base;
        empty lists otherwise)."""
        self._reset_history()
        self.clock = 0
        """The highest step any learner reported (informational; rounds follow each learner's own steps)."""
        self.merges = 0
        """Reports of a sync point whose round had already merged (the learner joins the next round)."""

    def owns(self, p: int) -> bool:
        """Whether this synchronizer (shard) merges fragment p."""
        return self.owned is None or p in self.owned

    def fragment(self, p: int) -> dict[str, Tensor]:
        return {n: self.params[n] for n in self.partition[p]}

    # -- persistence ----------------------------------------------------------------------------
    def checkpoint_state(self) -> dict[str, object]:
        """The final checkpoint's extra fields (`SyncerCore`): fragment versions and the outer optimizer."""
        return {"versions": list(self.versions), "outer": self.outer.state_dict()}

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
            if mutations.active("restore_drops_momentum"):  # mutation: the outer momentum restarts from zero
                del buffers[f"frag{p}"]
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

    # -- reports ------------------------------------------------------------------------------
    def on_meta(self, learner: int, step: int, step_time_s: float, now: float, alive: frozenset[int]) -> list[Pull]:
        """A learner's per-step metadata. Returns the pulls to send: this learner's, for every fragment whose
        sync point it reached at this step (or whose declined answer is due again), plus the late learners of
        a round this report opens."""
        prev = self.reported_step.get(learner, step - 1)
        if step_time_s > 0:
            self.step_times.update(learner, step_time_s)
        # Where the learners still driving progress were before this report: alive, and reported a step within
        # H of their own recent step intervals (a leader that stalls that long is a straggler; the others must
        # not wait for it).
        driving = [m for m in alive if m != learner and m in self.reported_step and not self._stalled(m, now)]
        here = [prev] + [self.reported_step[m] for m in driving]
        if learner in self.last_report_at and step > prev:
            gap = self.step_gaps.setdefault(learner, EwmaEstimator(alpha=0.2))
            gap.update(max(0.0, now - self.last_report_at[learner]) / (step - prev))
        self.reported_step[learner] = max(step, prev)
        if step > prev or learner not in self.last_report_at:
            self.last_report_at[learner] = now
        self.clock = max(self.clock, step)
        pulls: list[Pull] = []
        ahead = max(max(here), 0)  # sync_index never decreases with the step: the most advanced sets every top
        for p, rnd in enumerate(self.rounds):
            if not self.owns(p):
                continue
            # The learners that drove p's rounds may have left (finished, failed, cut off) or stalled: follow the
            # most advanced one still driving, or the others' reports would all be late and nothing would merge.
            top = self.schedule.sync_index(p, ahead)
            self.lead[p] = min(self.lead[p], top)
            i_new, i_old = self.schedule.sync_index(p, step), self.schedule.sync_index(p, max(prev, 0))
            if i_new <= i_old:
                if rnd is not None and learner in rnd.repull and step > rnd.repull[learner]:
                    del rnd.repull[learner]  # declined last time (nothing new, stale copy): ask again
                    pulls.append(Pull(p, rnd.round_id, frozenset({learner})))
                continue
            if rnd is not None:  # joins the open round (again: its newer copy supersedes the older one)
                rnd.reporters.add(learner)
                rnd.repull.pop(learner, None)
                self.lead[p] = max(self.lead[p], i_new)
                pulls.append(Pull(p, rnd.round_id, frozenset({learner})))
            elif i_new > self.lead[p]:
                pulls.append(self._open(p, i_new, learner, now, alive))
            else:  # its round already merged: it is pulled when p's next round opens
                self.pending[p].add(learner)
        return pulls

    def _stalled(self, m: int, now: float) -> bool:
        """Learner m has not reported a new step for H of its own recent step intervals."""
        gap = self.step_gaps.get(m)
        if gap is None or gap.value is None:
            return False
        return now - self.last_report_at[m] > self.cfg.sync_every * gap.value

    def _open(self, p: int, index: int, learner: int, now: float, alive: frozenset[int]) -> Pull:
        """Open round `index` of fragment p for `learner`, with p's late learners still here and its carried
        pushes."""
        late = self.pending[p] & alive
        self.pending[p] -= late
        self.round_ids[p] += 1
        rnd = OpenRound(self.round_ids[p], now, reporters={learner} | late)
        rnd.pushes.update(self.held[p])
        self.held[p].clear()
        self.rounds[p] = rnd
        self.lead[p] = index
        return Pull(p, rnd.round_id, frozenset(rnd.reporters))

    def on_join(self, learner: int) -> list[int]:
        """A learner (re)joined and is sent every fragment's current value: returns those versions. Its pushes
        based on older versions are declined (BEFORE_REJOIN) until it has applied them."""
        for p, version in enumerate(self.versions):
            self.joined_at[(learner, p)] = version
        return list(self.versions)

    def drop_carried(self, learner: int) -> list[FragmentPush]:
        """A learner (re)joined: drop its carried pushes based on versions older than the current ones. It is
        sent the current values, which overwrite that work and reset its counters; merged afterwards, measured
        against the current value, such a push would pull the model back (the BEFORE_REJOIN case). A final push
        is kept: a finished learner applies nothing, so its work would be lost (`_keeps_final`)."""
        dropped = []
        for p in range(len(self.partition)):
            rnd = self.rounds[p]
            for held, fresh in ((self.held[p], set()), (rnd.pushes, rnd.fresh) if rnd is not None else ({}, set())):
                q = held.get(learner)
                if (q is not None and learner not in fresh and q.base_version < self.versions[p]
                        and not self._keeps_final(q)):
                    dropped.append(held.pop(learner))
        return dropped

    def on_overwrite(self, learner: int, p: int, version: int) -> list[FragmentPush]:
        """diloco.broadcast = all: `learner` was not in the merge that made fragment p's current version and is
        sent it; it overwrites its copy and resets p's counters on arrival. From now on its pushes of p based on
        an older version are declined (OVERWRITTEN): the work they hold is what the overwrite discards (the
        learner's `fragment_overwritten` record). Returns its carried pushes of p dropped for the same reason
        (a final push is kept, `_keeps_final`)."""
        self.overwritten_at[(learner, p)] = max(version, self.overwritten_at.get((learner, p), 0))
        q = self.held[p].get(learner)
        if q is not None and q.base_version < version and not self._keeps_final(q):
            return [self.held[p].pop(learner)]
        return []

    def forget(self, learner: int) -> None:
        """A learner left: keep its last step (it may come back) but stop waiting on it."""
        self.step_times.forget(learner)

    # -- answers --------------------------------------------------------------------------------
    def on_push(self, push: FragmentPush, round_id: int | None, now: float) -> tuple[PushOutcome, FragmentPush | None]:
        """Validate an answer to a pull (or a final unsolicited push, round_id None) and file it.

        An answer to the open round is fresh (ACCEPTED); a final push joins the open round as fresh (the
        learner's last step is its last sync point); any other answer, or a final push with no round open, is
        CARRIED. Returns (outcome, the push it superseded if any: the same learner's older push for p)."""
        p = push.fragment
        if mutations.active("drop_pushes") and mutations.dropped(self.seed, push.learner, p, push.first_step,
                                                                 push.last_step):  # mutation: silently dropped
            return PushOutcome.DECLINED, None
        if not 0 <= p < len(self.partition) or not self.owns(p):
            return PushOutcome.REJECTED_FRAGMENT, None
        rnd = self.rounds[p]
        fresh = rnd is not None and (round_id == rnd.round_id or (round_id is None and push.final))
        declined = self._check(push)
        if declined is not None:
            if fresh and rnd is not None and push.learner in rnd.reporters and declined is not PushOutcome.UNANCHORED:
                rnd.repull[push.learner] = self.reported_step.get(push.learner, push.last_step)
            return declined, None
        expected = self.fragment(p)
        if set(push.tensors) != set(expected) or any(
                push.tensors[n].shape != t.shape or push.tensors[n].dtype != t.dtype for n, t in expected.items()):
            return PushOutcome.REJECTED_SHAPE, None
        if not all_finite(push.tensors.values()):
            return PushOutcome.REJECTED_NONFINITE, None
        if push.step_time_s > 0:
            self.step_times.update(push.learner, push.step_time_s)
        held = rnd.pushes if rnd is not None else self.held[p]
        older = held.get(push.learner)
        if older is not None and older.last_step > push.last_step:
            return (PushOutcome.ACCEPTED if fresh else PushOutcome.CARRIED), push  # an older copy: kept out
        held[push.learner] = push
        if rnd is not None:
            if fresh:
                rnd.reporters.add(push.learner)
                rnd.fresh.add(push.learner)
            else:
                rnd.fresh.discard(push.learner)
            if rnd.quorum_at is None and len(rnd.fresh) >= self.cfg.min_quorum:
                rnd.quorum_at = now  # the grace window starts here
        return (PushOutcome.ACCEPTED if fresh else PushOutcome.CARRIED), older

    def _check(self, push: FragmentPush) -> PushOutcome | None:
        """Why a push has nothing to merge (DECLINED, STALE, BEFORE_REJOIN, OVERWRITTEN, LAGGING, UNANCHORED), or
        None."""
        p = push.fragment
        if push.c_steps <= 0 or push.c_tokens <= 0:
            return PushOutcome.DECLINED
        if self.is_stale(push):
            return PushOutcome.STALE
        if push.base_version < self.joined_at.get((push.learner, p), 0) and not self._keeps_final(push):
            return PushOutcome.BEFORE_REJOIN
        if push.base_version < self.overwritten_at.get((push.learner, p), 0) and not self._keeps_final(push):
            return PushOutcome.OVERWRITTEN
        if self.versions[p] - push.base_version > self.cfg.max_staleness:
            return PushOutcome.LAGGING
        if self.cfg.outer_anchor == "base" and push.base_version not in self.history[p]:
            return PushOutcome.UNANCHORED
        return None

    @staticmethod
    def _keeps_final(push: FragmentPush) -> bool:
        """A final push is exempt from BEFORE_REJOIN (and from `drop_carried`): its learner has finished and
        will never apply the values it was sent on rejoining (a finished learner's link reconnects to a restored
        syncer only to deliver these), so nothing overwrites its work; judged by the ordinary rules (STALE,
        LAGGING, UNANCHORED), it is merged when it covers steps not merged yet."""
        return push.final and not mutations.active("final_before_rejoin")

    def is_stale(self, push: FragmentPush) -> bool:
        """Whether the push is based on a version older than one its learner's work was already merged into."""
        if mutations.active("stale_as_fresh"):  # mutation: the staleness check skipped
            return False
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
        reported = frozenset(rnd.fresh)
        if self.cfg.deterministic:  # a learner not started yet is expected too: its first sync point is ahead
            alive = alive | (frozenset(range(self.num_learners)) - frozenset(self.reported_step))
        return RoundState(started_at=rnd.started_at, quorum_at=rnd.quorum_at, reported=reported, alive=alive,
                          carried=frozenset(rnd.pushes) - reported,
                          step_time_s=self.step_times.estimate(reported), sync_time_s=self.sync_time.value or 0.0)

    def poll(self, now: float, alive: frozenset[int]) -> tuple[list[MergeRecord], float | None]:
        """Merge every round the policy allows. Returns (merges, earliest time to poll again)."""
        merges: list[MergeRecord] = []
        wake: float | None = None
        for p, rnd in enumerate(self.rounds):
            if rnd is None:
                continue
            state = self.round_state(p, alive)
            assert state is not None
            d = decide(now, state, self.quorum)
            if d.action is Action.MERGE:
                merges.append(self.merge(p, now, d.reason, d.grace_s))
            elif d.wake_at is not None:
                wake = d.wake_at if wake is None else min(wake, d.wake_at)
        return merges, wake

    def drain(self, now: float) -> list[MergeRecord]:
        """Merge every open round and every carried push, regardless of quorum (the run is ending)."""
        out = []
        for p in range(len(self.partition)):
            rnd = self.rounds[p]
            if rnd is None and self.held[p]:
                self.round_ids[p] += 1
                rnd = self.rounds[p] = OpenRound(self.round_ids[p], now)
                rnd.pushes.update(self.held[p])
                self.held[p].clear()
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
        norms = MergeNorms()
        delta = outer_gradient(frag, [q.tensors for q in pushes], weights, self.embeddings,
                               self.cfg.merge_rule, anchors, norms)
        if not all_finite(delta.values()):  # unreachable while pushes are checked; kept as a last guard
            raise FloatingPointError(f"non-finite outer gradient for fragment {p}")
        momentum_in = self.outer.momentum_norm(f"frag{p}")
        outer_lr = self.outer.step(f"frag{p}", frag, delta)
        self.versions[p] += 1
        if self.cfg.outer_anchor == "base":
            held = self.history[p]
            held[self.versions[p]] = {n: t.clone() for n, t in frag.items()}
            for v in sorted(held)[:-self.cfg.anchor_history]:
                del held[v]
        self.rounds[p] = None
        # reached the sync point but not in (answer in flight, or declined): they are in the next round
        self.pending[p] |= rnd.reporters - set(rnd.pushes)
        self.merges += 1
        for m, q in zip(learners, pushes, strict=True):
            self.merged_into[(m, p)] = (self.versions[p], q.last_step)
        norm = float(torch.sqrt(torch.stack([(d.double() ** 2).sum() for d in delta.values()]).sum()))
        return MergeRecord(
            fragment=p, version=self.versions[p], round_id=rnd.round_id, participants=learners,
            pulled_steps=[q.last_step for q in pushes], weights=weights,
            c_steps=[q.c_steps for q in pushes], c_tokens=[q.c_tokens for q in pushes],
            step_ranges=[(q.first_step, q.last_step) for q in pushes],
            base_versions=[q.base_version for q in pushes], carried=[m for m in learners if m not in rnd.fresh],
            reason=reason, grace_s=grace_s,
            started_at=rnd.started_at, quorum_at=rnd.quorum_at, merged_at=now,
            tensors={n: t.clone() for n, t in frag.items()}, outer_grad_norm=norm, norms=norms, outer_lr=outer_lr,
            momentum_in=momentum_in, momentum_out=self.outer.momentum_norm(f"frag{p}"),
        )
