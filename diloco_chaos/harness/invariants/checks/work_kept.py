"""Invariant `work_kept`: Every step of training work that never reached the global model was discarded by an
injected fault or an algorithm rule, never silently.

One module per invariant (a run invariant of Decoupled DiLoCo): it registers itself with
`diloco_chaos.harness.invariants.registry.register`, so check_all, the pytest plugin and `diloco-chaos invariants` list
it. The discarded steps are goodput's (`diloco_chaos.harness.report.metrics.goodput_and_discards`: a step no merge
covers and whose work no overlap overwrite explains), never recounted here; this module only says why each was discarded
(docs/metrics.md, "Which work can be discarded, and why").
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from diloco_chaos.harness.invariants.base import InvariantResult, Run, RunRecord, _run
from diloco_chaos.harness.invariants.checks._common import _listing
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.learner import Apply, FinalPushesGivenUp, FragmentOverwritten, Step
from diloco_chaos.harness.record.run import FaultEnd, FaultStart, LearnerDown, LearnerRestart, SyncerDown
from diloco_chaos.harness.record.syncer import LearnerJoin, Merge, Push, PushRejected, PushSuperseded, shard_of
from diloco_chaos.harness.report.metrics import DiscardedStep, goodput_and_discards
from diloco_chaos.trainers.syncers.decoupled_records import PushOutcome, SupersededCause


class Cause(enum.Enum):
    """Why a discarded step's work never reached the global model. Every member but UNEXPLAINED_* is explained
    by an injected fault or an algorithm rule."""

    OWN_FAULT = "own_fault"
    """A fault on the step's own learner (its process killed or crashed and restarted from an older step, its
    host frozen, its link cut or partitioned) started or was active after the step, before any later work of
    that learner was merged: the work since its last merge was lost with it, or overwritten by the current
    value it took on rejoining."""
    REJOIN = "rejoin"
    """Its push was declined (before_rejoin) or dropped (rejoin_drop) because its learner reconnected and was
    sent the current values, which overwrite its copy (a running learner: it applies them); or, in no push, its
    work was overwritten by the values its learner applied on (re)joining (a learner that joins after the first
    merges applies them a step or two into its training)."""
    LAGGING = "lagging"
    """Its push was based on a version more than max_staleness behind: its learner was away long enough to lag."""
    SUPERSEDED = "superseded"
    """Its push was a stale copy (its learner had not applied the merge holding its earlier steps) or had lost
    its anchor: the algorithm's rule against merging work twice."""
    SYNCER_OUTAGE = "syncer_outage"
    """Its push reached a syncer (or its shard) that went down before merging it, or was lost with the
    connection to it."""
    BROADCAST = "broadcast"
    """diloco.broadcast = all: its learner was sent a merge of the fragment it was not in, which overwrote that
    work (`fragment_overwritten`), or its push was declined or dropped for it (overwritten, broadcast_drop)."""
    GIVEN_UP = "final_given_up"
    """A finished learner gave up its push after timeouts.final_flush_s with the syncer unreachable during a
    fault (`final_pushes_given_up`)."""
    UNEXPLAINED_FINAL = "unexplained_final_dropped"
    """A finished learner's final push declined or dropped on rejoining: it applies nothing, so nothing else
    holds that work (the bug of issue 26)."""
    UNEXPLAINED = "unexplained"
    """No push holding the step was merged, and no fault or rule explains why."""

    @property
    def explained(self) -> bool:
        return self not in (Cause.UNEXPLAINED, Cause.UNEXPLAINED_FINAL)


@dataclass(frozen=True)
class Attributed:
    """One discarded step and its cause."""

    step: DiscardedStep
    cause: Cause


LOSING_ACTIONS = frozenset({"kill_chip", "kill_learner", "crash_host", "freeze", "partition", "flap", "reset_peer",
                            "limit_data"})
"""Faults on a learner that may cost it the work since its last merge: its process killed (restarted from an
older step), frozen past the liveness timeout, or its connection cut (it rejoins and takes the current value).
A `slow`, `degrade` or `slice` fault only delays its work and explains no discard."""

_FATE_OF_CAUSE = {SupersededCause.BEFORE_REJOIN: Cause.REJOIN, SupersededCause.REJOIN_DROP: Cause.REJOIN,
                  SupersededCause.LAGGING: Cause.LAGGING, SupersededCause.STALE: Cause.SUPERSEDED,
                  SupersededCause.OVERWRITTEN: Cause.BROADCAST, SupersededCause.BROADCAST_DROP: Cause.BROADCAST}


def attribute(r: RunRecord, discarded: Sequence[DiscardedStep]) -> list[Attributed]:
    """The cause of each discarded step (pure: reads only the run's records)."""
    end = r.all_records[-1].t if r.all_records else 0.0
    windows: dict[int, list[tuple[float, float]]] = defaultdict(list)  # learner -> its own faults' spans
    ends = {e.index: e.t for e in r.records(FaultEnd)}
    for f in r.records(FaultStart):
        if f.learner is not None and f.action in LOSING_ACTIONS:
            windows[f.learner].append((f.t, ends.get(f.index, end)))
    restarts = r.records(LearnerRestart)
    for down in r.records(LearnerDown):
        back = next((x.t for x in restarts if x.learner == down.learner and x.t >= down.t), end)
        windows[down.learner].append((down.t, back))
    outages = [x.t for x in r.records(SyncerDown)]
    merged_at: dict[int, list[tuple[float, int]]] = defaultdict(list)  # learner -> (when, last step) merged
    for e in r.records(Merge):
        for m, (_, b) in zip(e.participants, e.step_ranges or [], strict=False):
            merged_at[int(m)].append((e.t, int(b)))
    sup: dict[tuple[int, int, int, int], list[PushSuperseded]] = defaultdict(list)
    for s in r.records(PushSuperseded):
        sup[(s.learner, s.fragment, s.first_step, s.last_step)].append(s)
    rejected = {(x.learner, x.fragment, x.first_step, x.last_step) for x in r.records(PushRejected)}
    pushes: dict[int, list[Push]] = defaultdict(list)
    for p in r.records(Push):
        pushes[p.learner].append(p)
    given_up: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for g in r.records(FinalPushesGivenUp):
        given_up[g.learner] += [(int(a), int(b)) for a, b in g.step_ranges]

    def next_merge(m: int, t: float, k: int) -> float:
        """When a merge next took in work of learner m from step k on, after t (the run's end if none did)."""
        return min((x for x, b in merged_at[m] if x > t and b >= k), default=end)

    def own_fault(m: int, t: float, k: int) -> bool:
        """A fault of learner m's own active at or after t (the end of its step k), before any merge of its
        later work."""
        return any(b >= t and a <= next_merge(m, t, k) for a, b in windows[m])

    joins: dict[int, list[LearnerJoin]] = defaultdict(list)
    for j in r.records(LearnerJoin):
        if j.versions is not None:
            joins[j.learner].append(j)
    applies: dict[int, list[Apply]] = defaultdict(list)
    for ap in r.records(Apply):
        if ap.fragments:
            applies[ap.learner].append(ap)

    def overwritten_on_join(m: int, t: float, k: int) -> bool:
        """Learner m applied, at step k or later and before any merge of its later work, fragment values it was
        sent on (re)joining, which overwrote the work of step k."""
        until = next_merge(m, t, k)
        for ap in applies[m]:
            if ap.step < k or ap.t < t or ap.t > until:
                continue
            sent = [(p, v) for p, v in zip(ap.fragments or [], ap.versions or [], strict=False)]
            if sent and all(any(j.t <= ap.t and p < len(j.versions or []) and (j.versions or [])[p] == v
                                for j in joins[m]) for p, v in sent):
                return True
        return False

    overwrites = r.records(FragmentOverwritten)

    def fate(p: Push) -> Cause:
        """Why push p (not merged) came to nothing."""
        outcome = p.outcome if isinstance(p.outcome, PushOutcome) else None
        for s in sup.get((p.learner, p.fragment, p.first_step, p.last_step), []):
            if s.t < p.t or s.cause is None or s.cause is SupersededCause.NEWER:
                continue
            cause = _FATE_OF_CAUSE.get(s.cause, Cause.SUPERSEDED)
            if cause is Cause.REJOIN and p.final:
                return Cause.UNEXPLAINED_FINAL
            return cause
        if outcome in (PushOutcome.ACCEPTED, PushOutcome.CARRIED):
            shard = shard_of(p.proc)
            if any(x.t > p.t and x.shard == shard for x in r.records(SyncerDown)):
                return Cause.SYNCER_OUTAGE
        if outcome is PushOutcome.UNANCHORED:
            return Cause.SUPERSEDED
        if (p.learner, p.fragment, p.first_step, p.last_step) in rejected and own_fault(p.learner, p.t, p.last_step):
            return Cause.OWN_FAULT
        return Cause.UNEXPLAINED

    out = []
    for d in discarded:
        m, k = d.learner, d.step
        latest: dict[int, Push] = {}  # fragment -> the last push of m holding step k
        for p in pushes[m]:
            if p.first_step <= k <= p.last_step and p.t >= d.end:
                latest[p.fragment] = p
        fates = [fate(p) for p in latest.values()]
        if Cause.UNEXPLAINED_FINAL in fates:
            cause = Cause.UNEXPLAINED_FINAL
        elif own_fault(m, d.end, k):
            cause = Cause.OWN_FAULT
        elif any(a <= k <= b for a, b in given_up[m]) and (outages or windows[m]):
            cause = Cause.GIVEN_UP
        elif any(c.explained for c in fates):
            cause = next(c for c in fates if c.explained)
        elif any(o.learner == m and o.step >= k and d.end <= o.t <= next_merge(m, d.end, k)
                 for o in overwrites):
            cause = Cause.BROADCAST
        elif overwritten_on_join(m, d.end, k):
            cause = Cause.REJOIN
        elif not fates and any(d.end < t <= next_merge(m, d.end, k) for t in outages):
            cause = Cause.SYNCER_OUTAGE  # sent, lost with the connection to a syncer that went down
        else:
            cause = Cause.UNEXPLAINED
        out.append(Attributed(d, cause))
    return out


def lost_finals(r: RunRecord, counted: set[tuple[int, int]]) -> list[Attributed]:
    """The fragment work of every final push of a finished learner declined or dropped on rejoining (before_rejoin,
    rejoin_drop), per step and fragment, for the steps `counted` leaves out (goodput counts a step discarded only
    when no fragment of it reached the model, so a final push declined for fragment p of a step whose fragment q
    was merged, or was overwritten by a broadcast, is no discarded step): each is 1/P of the step's work (its
    chips x compute_s + sync_s) and tokens, unexplained_final_dropped (issue 26's bug on any fragment)."""
    steps = {(e.learner, e.step): e for e in r.records(Step)}  # the last record of each (a redone step's)
    declined = {(s.learner, s.fragment, s.first_step, s.last_step) for s in r.records(PushSuperseded)
                if s.cause in (SupersededCause.BEFORE_REJOIN, SupersededCause.REJOIN_DROP)}
    share = 1.0 / max(1, r.fragments)
    out = []
    for p in r.records(Push):
        if not p.final or (p.learner, p.fragment, p.first_step, p.last_step) not in declined:
            continue
        for k in range(p.first_step, p.last_step + 1):
            st = steps.get((p.learner, k))
            if st is None or (p.learner, k) in counted:
                continue
            out.append(Attributed(DiscardedStep(p.learner, k, st.t, st.chips * (st.compute_s + st.sync_s) * share,
                                                int(st.tokens * share)), Cause.UNEXPLAINED_FINAL))
    return out


def _ranges(steps: list[int]) -> str:
    """1,2,3,7 -> "1-3, 7"."""
    out: list[str] = []
    for s in sorted(steps):
        if out and s == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{s}"
        else:
            out.append(str(s))
    return ", ".join(out)


@register(order=65, requires="fragmented",
          bounds=(Bound("max_unexplained_chip_s", "chip-seconds of discarded work no fault or rule explains", 0.0,
                        low=0),
                  Bound("show", "learners listed in the detail", 5, low=0)))
def work_kept(run: Run, *, max_unexplained_chip_s: float = 0.0, show: int = 5) -> InvariantResult:
    """Every discarded step has a cause. Figure: chip-seconds of discarded work that no injected fault or
    algorithm rule explains; bound max_unexplained_chip_s (0).

    Decoupled DiLoCo. The discarded steps are those `goodput` counts in `discarded_chip_s` (no merge covers
    them; work overwritten in the overlap window by design is not discarded), plus, per fragment, the steps of a
    finished learner's final push declined or dropped on rejoining that goodput does not count (another
    fragment of the step reached the model; `lost_finals`). Each is attributed
    (`attribute`, `Cause`) from the fate of the last push of its learner holding it, per fragment, and from the
    faults: a final push of a finished learner declined or dropped on rejoining is unexplained (a finished
    learner applies nothing, so its work would be lost for no reason: the syncer must merge it, issue 26);
    a fault of the learner's own (killed, crashed, frozen, partitioned) active after the step and before its
    next merged work explains it; then a push superseded as a stale copy, lagging, before_rejoin or dropped on
    rejoin (a running learner), one that died with a syncer going down or was lost with its connection, and
    a final push given up after timeouts.final_flush_s during a fault. Anything else is unexplained. The
    detail gives chip-seconds and tokens by cause, and the unexplained steps by learner.

    ddp, elastic_ddp and diloco are not checked: a step or round there is merged by every participant or by
    none (a fault stopping the group), with no push that a rule could drop."""
    r = _run(run)
    measure = "discarded chip-seconds no fault or rule explains"
    cfg = r.config
    topo, dl = cfg.get("topology", {}), cfg.get("diloco", {})
    learners = int(topo.get("learners", 0)) or 1 + max((e.learner for e in r.records(Push)), default=0)
    _, discarded = goodput_and_discards(r.all_records, r.algorithm, learners, int(topo.get("chips_per_learner", 1)),
                                        r.fragments, int(dl.get("sync_every", 1)))
    if not r.train_span():
        return InvariantResult("work_kept", False, None, max_unexplained_chip_s, "no step was logged: nothing to "
                               "check", measure, "chip-s")
    causes = attribute(r, discarded)
    partial = lost_finals(r, {(d.learner, d.step) for d in discarded})
    causes += partial
    chip_s: dict[Cause, float] = defaultdict(float)
    tokens: dict[Cause, int] = defaultdict(int)
    bad: dict[int, set[int]] = defaultdict(set)
    for a in causes:
        chip_s[a.cause] += a.step.chip_s
        tokens[a.cause] += a.step.tokens
        if not a.cause.explained:
            bad[a.step.learner].add(a.step.step)
    unexplained = round(sum(v for c, v in chip_s.items() if not c.explained), 3)
    by_cause = ", ".join(f"{c.value} {v:.3f} chip-s / {tokens[c]} tokens" for c, v in
                         sorted(chip_s.items(), key=lambda kv: -kv[1]))
    total = sum(chip_s.values())
    detail = (f"discarded {total:.3f} chip-s in {len(discarded)} steps"
              + (f" and {len(partial)} fragments of other steps" if partial else "")
              + (f": {by_cause}" if by_cause else ""))
    if bad:
        why: dict[int, set[str]] = defaultdict(set)
        for a in causes:
            if not a.cause.explained:
                why[a.step.learner].add(a.cause.value)
        lines = [f"learner {m} steps {_ranges(list(ss))} ({', '.join(sorted(why[m]))})"
                 for m, ss in sorted(bad.items())]
        detail += "; unexplained: " + _listing(lines, show)
    return InvariantResult("work_kept", unexplained <= max_unexplained_chip_s, unexplained, max_unexplained_chip_s,
                           detail, measure, "chip-s")
