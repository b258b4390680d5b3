"""Invariant `updates_accounted`: No update was merged twice and none was lost.

One module per invariant (a run invariant): it registers itself with
`diloco_chaos.harness.invariants.registry.register`, so check_all, the pytest plugin and `diloco-chaos invariants` list
it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, NamedTuple

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.checks._common import overwrites, unlogged_merges
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.elastic import ElasticRollback
from diloco_chaos.harness.record.learner import Apply
from diloco_chaos.harness.record.run import SyncerDown
from diloco_chaos.harness.record.syncer import (
    LearnerJoin,
    Merge,
    Push,
    PushRejected,
    PushSuperseded,
    shard_of,
)
from diloco_chaos.harness.report.elastic_phases import lost_to_rollback, rollbacks
from diloco_chaos.trainers.syncers.decoupled_records import PushOutcome, SupersededCause


class Contribution(NamedTuple):
    """One participant of one decoupled merge."""

    merge: Merge
    learner: int
    fragment: int
    round: Any
    first_step: int
    last_step: int
    c_steps: int
    c_tokens: int

    @property
    def trained(self) -> tuple[int, int]:
        """The steps its counters hold: the c_steps steps ending at last_step. It differs from
        (first_step, last_step) only when a learner misreports first_step (a restarted learner keeps
        first_step = 1 for a fragment its initial pull did not reset)."""
        return max(self.first_step, self.last_step - self.c_steps + 1), self.last_step


def merged_contributions(run: Run) -> list[Contribution]:
    """Decoupled: every participant of every merge, from the merge events' parallel lists."""
    out = []
    for e in _run(run).records(Merge):
        n = len(e.participants)
        ranges = e.step_ranges or []
        c_steps: list[int | None] = list(e.c_steps) if e.c_steps is not None else [None] * n
        for m, (a, b), cs, ct in zip(e.participants, ranges, c_steps, e.c_tokens, strict=False):
            steps = int(cs) if cs is not None else int(b) - int(a) + 1
            out.append(Contribution(e, int(m), _fragment(e), e.round, int(a), int(b), steps,
                                    int(ct) if ct is not None else 0))
    return out


@register(order=60, systems=("builtin",), bounds=(Bound("show", "problems listed in the detail", 5, low=0),))
def updates_accounted(run: Run, *, show: int = 5) -> InvariantResult:
    """No update merged twice and none lost. Figure: the problems found; bound 0.

    Decoupled DiLoCo. A push is what the syncer logged as a `push` event; its identity is
    (learner, fragment, round, first_step, last_step): a learner answers a round at most once per step
    range, and a merge's contribution carries the same fields (participants, fragment, round, step_ranges).
    A final unsolicited push is logged with round None, and a carried push (outcome carried: an answer that
    arrived after its round merged, merged into the fragment's next round) with the round it answered; both
    match a merge of any round. A merge matches only pushes logged before it by the same syncer process
    (no `syncer_down` of its shard in between: open rounds die with the syncer and a restored one may reuse
    their ids). With a sharded synchronizer (syncer.shards > 1) every crash below is the push's own shard's
    (the shard is the `proc` that logged the push; `syncer_down.shard`): another shard going down changes
    nothing for it. Each push must end in exactly one of:
    * outcome accepted or carried: taken in by a merge with the same identity; or superseded by a newer push of the
      same learner in the same round (`push_superseded` without a reason, same learner, fragment and step
      range); or, if the syncer went down (`syncer_down`) while the push's round was open, re-pushed: a later
      merge takes in a push of that learner and fragment whose step range covers it (the learner's counters
      were not reset, so its next answer holds the same steps); or, if the restored syncer came back at a
      version no merge event shows (`syncer_restore.versions` beyond the fragment's last logged merge: merged
      and checkpointed, then killed before the merge was logged), counted as merged there; or, if the syncer
      went down while its round was open, given up on rejoin: the learner then (re)joined the restored syncer
      (`learner_join`, whose `versions` are the fragments it was sent) and applied fragment p at the version it
      was sent there, which overwrites its copy and resets its counters (the algorithm's rule for a (re)joining
      learner), before any push of those steps was merged, or it finished first and the restored syncer
      dropped its push of those steps as before_rejoin (`push_superseded` cause before_rejoin covering them);
      or lost with the syncer's open round: no merge of
      the fragment came between the push and the crash, and the learner applied the fragment after a later
      step (a carried push's learner applies the round it missed, so the dead syncer held the only copy);
    * outcome late / stale / overwritten: a `push_superseded` with that cause and the same step range
      (overwritten, and a carried push superseded with cause broadcast_drop: diloco.broadcast = all sent its
      learner a merge it was not in, whose overwrite discards that work);
    * outcome rejected_*: a `push_rejected` with a non-empty reason and the same step range.
    Problems: a push none of these accounts for (lost); a merged contribution that no push accounts for; two
    merged contributions of one learner and fragment whose trained steps overlap (the same steps merged twice,
    whether the same push twice or a stale copy; trained steps: the c_steps steps ending at last_step, see
    `Contribution.trained`); two merges giving one fragment the same version (a merge
    the restored syncer forgot, so one broadcast version was lost). diloco.broadcast = all: every apply of a
    merge the learner was not in (`merge.overwrites`) that discards steps (after its previous apply of the
    fragment) has a `fragment_overwritten` record, every such record an apply, and no discarded step is merged.

    ddp, elastic_ddp and diloco log no push events: only the last check applies there, as one merge per step
    (ddp, elastic_ddp) or round (diloco); a step's merge that a restart from the checkpoint undid
    (`elastic_rollback`, elastic.engine = "torchrun") is not counted: the step is merged again."""
    r = _run(run)
    problems: list[str] = []
    measure = "pushes lost or merged twice"
    unit = r.descriptor.merge_unit
    if unit != "fragment":
        key = unit
        rbs = rollbacks(r.records(ElasticRollback))  # merges a restart from the checkpoint undid are done again
        seen = Counter(e.step if key == "step" else e.round for e in r.records(Merge)
                       if not (key == "step" and e.step is not None and lost_to_rollback(rbs, e.step, e.t)))
        for k, n in sorted(seen.items(), key=lambda kv: str(kv[0])):
            if n > 1:
                problems.append(f"{key} {k} merged {n} times")
        detail = "; ".join(problems[:show]) or f"{len(r.records(Merge))} merges, each {key} once"
        return InvariantResult("updates_accounted", not problems, len(problems), 0, detail, measure)

    contribs = merged_contributions(r)
    merged_pool: dict[tuple[int, int, int, int], list[Merge]] = defaultdict(list)
    for c in contribs:
        merged_pool[(c.learner, c.fragment, c.first_step, c.last_step)].append(c.merge)
    sup_pool: Counter[tuple[str, int, int, int, int]] = Counter()
    for s in r.records(PushSuperseded):
        sup_pool[(_pool_of(s), s.learner, s.fragment, s.first_step, s.last_step)] += 1
    rej_pool: Counter[tuple[int, int, int, int]] = Counter()
    for rj in r.records(PushRejected):
        if rj.reason and rj.fragment is not None and rj.first_step is not None and rj.last_step is not None:
            rej_pool[(rj.learner, rj.fragment, rj.first_step, rj.last_step)] += 1
    downs_of: dict[int, list[float]] = defaultdict(list)  # per synchronizer shard (0 alone without sharding)
    for d in r.records(SyncerDown):
        downs_of[d.shard].append(d.t)

    def same_syncer(t_push: float, t_merge: float, shard: int) -> bool:
        """A merge takes in only pushes its own syncer process (its shard's) received, before it merged (a
        restored syncer does not restore open rounds, and may reuse their round ids)."""
        return t_push <= t_merge and not any(t_push < d < t_merge for d in downs_of[shard])

    # versions restored beyond the last logged merge: merges the old syncer made but never logged
    unlogged: dict[tuple[int, int], int] = defaultdict(int)  # (learner, fragment) -> pushes it may account for
    unlogged_frag = Counter(p for p, _ in unlogged_merges(r))

    joins = [j for j in r.records(LearnerJoin) if j.versions is not None]
    applies = r.records(Apply)

    before_rejoin = r.records(PushSuperseded)

    def given_up_on_rejoin(m: int, p: int, crash: float, shard: int, a0: int, b0: int) -> bool:
        """Learner m joined a syncer (of the push's shard) after `crash` and then applied fragment p at the
        version it was sent; or, finishing before it could apply it, had its last push of steps a0..b0 (and
        more) superseded as before_rejoin there."""
        for j in joins:
            versions = j.versions or []
            if j.learner != m or j.t <= crash or p >= len(versions) or shard_of(j.proc) != shard:
                continue
            sent = (p, int(versions[p]))
            if any(a.learner == m and a.t > j.t
                   and sent in zip(a.fragments or [], a.versions or [], strict=False) for a in applies):
                return True
            if any(s.learner == m and s.fragment == p and s.t > j.t and shard_of(s.proc) == shard
                   and s.cause is SupersededCause.BEFORE_REJOIN and s.first_step <= a0 and s.last_step >= b0
                   for s in before_rejoin):
                return True  # a learner that finished before applying it: its last push of those steps dropped
        return False

    frag_merges = [(_fragment(e), e.t) for e in r.records(Merge)]

    def died_with_the_syncer(m: int, p: int, t_push: float, last: int, crash: float) -> bool:
        """The push's round was still open when the syncer died (no merge of fragment p between the push and
        the crash), and learner m had applied fragment p after a step past the push's (which overwrote those
        steps and reset its counters), so the dead syncer's round held their only copy."""
        if any(q == p and t_push < tm < crash for q, tm in frag_merges):
            return False
        return any(a.learner == m and a.t > t_push and a.step > last and p in (a.fragments or []) for a in applies)

    pushes = r.records(Push)
    lost: list[str] = []
    n_given_up = n_died = 0
    pending: list[Push] = []
    for e in pushes:  # late / stale / rejected first: their own follow-up event accounts for them
        m, p, a, b = e.learner, e.fragment, e.first_step, e.last_step
        outcome = _outcome(e)
        if outcome in ("accepted", "carried"):
            pending.append(e)
        elif outcome in _SUPERSEDED_TAG:
            tag = _SUPERSEDED_TAG[outcome]
            if sup_pool[(tag, m, p, a, b)] > 0:
                sup_pool[(tag, m, p, a, b)] -= 1
            else:
                lost.append(f"{_push_id(e)} outcome {outcome} but no push_superseded with reason {tag}")
        elif outcome.startswith("rejected"):
            if rej_pool[(m, p, a, b)] > 0:
                rej_pool[(m, p, a, b)] -= 1
            else:
                lost.append(f"{_push_id(e)} outcome {outcome} but no push_rejected with a reason")
        else:
            lost.append(f"{_push_id(e)} has unknown outcome {outcome!r}")
    for e in pending:
        m, p, a, b = e.learner, e.fragment, e.first_step, e.last_step
        t = e.t
        shard = shard_of(e.proc)
        cands = merged_pool.get((m, p, a, b), [])
        any_round = e.round is None or e.outcome is PushOutcome.CARRIED
        hit = next((i for i, x in enumerate(cands)
                    if (any_round or x.round == e.round) and same_syncer(t, x.t, shard)), None)
        if hit is not None:
            cands.pop(hit)
            continue
        if sup_pool[("newer", m, p, a, b)] > 0:
            sup_pool[("newer", m, p, a, b)] -= 1
            continue
        crash = next((d for d in downs_of[shard] if d > t), None)
        if crash is not None and any(c.learner == m and c.fragment == p and c.first_step <= a and c.last_step >= b
                                     and c.merge.t > crash for c in contribs):
            continue  # its round was lost with the syncer; a later push of the same steps was merged
        if crash is not None and unlogged_frag[p] > unlogged[(m, p)]:
            unlogged[(m, p)] += 1  # merged and checkpointed by the syncer that died before logging the merge
            continue
        if crash is not None and given_up_on_rejoin(m, p, crash, shard, a, b):
            n_given_up += 1  # its round died with the syncer; the rejoin's fragment then reset its counters
            continue
        if crash is not None and died_with_the_syncer(m, p, t, b, crash):
            n_died += 1  # the dead syncer's open round held its only copy: the learner had moved past it
            continue
        lost.append(f"{_push_id(e)} {_outcome(e)} but never merged nor superseded")
    phantom = [f"merge of fragment {p} v{x.version} round {x.round} took learner {m} steps {a}-{b}, "
               "which no logged push accounts for"
               for (m, p, a, b), left in merged_pool.items() for x in left]
    twice: list[str] = []
    ranges: dict[tuple[int, int], list[tuple[int, int, Any]]] = defaultdict(list)
    for c in contribs:
        ranges[(c.learner, c.fragment)].append((*c.trained, c.merge.version))
    for (m, p), xs in sorted(ranges.items()):
        xs.sort(key=lambda x: (x[0], x[1]))
        for (a1, b1, v1), (a2, b2, v2) in zip(xs, xs[1:], strict=False):
            if a2 <= b1:
                twice.append(f"learner {m} fragment {p}: steps {a1}-{b1} (v{v1}) and {a2}-{b2} (v{v2}) both merged")
    versions = Counter((e.fragment, e.version) for e in r.records(Merge))
    twice += [f"fragment {p} version {v} made by {n} merges" for (p, v), n in sorted(versions.items()) if n > 1]
    found, orphans = overwrites(r)
    unaccounted = [f"learner {o.learner} applied fragment {o.fragment} v{o.version}, a merge it was not in, at step "
                   f"{o.step}: its steps {o.first}-{o.step} overwritten but no fragment_overwritten accounts for them"
                   for o in found if o.record is None]
    unaccounted += [f"fragment_overwritten of learner {o.learner} fragment {o.fragment} at step {o.step} matches no "
                    "apply of a merge it was not in" for o in orphans]
    for o in found:  # work discarded by the overwrite must not be merged too
        twice += [f"learner {o.learner} fragment {o.fragment}: steps {o.first}-{o.step} overwritten (v{o.version}) "
                  f"and steps {a}-{b} (v{v}) merged" for a, b, v in ranges.get((o.learner, o.fragment), [])
                  if a <= o.step and b >= o.first]
    problems = lost + phantom + twice + unaccounted
    if problems:
        detail = "; ".join(problems[:show]) + (f"; and {len(problems) - show} more" if len(problems) > show else "")
    else:
        n_unlogged = sum(unlogged.values())
        detail = (f"{len(pushes)} pushes, {len(contribs)} merged contributions"
                  + (f", {n_unlogged} counted as merged in merges the killed syncer did not log" if n_unlogged else "")
                  + (f", {n_given_up} given up on rejoining the restored syncer" if n_given_up else "")
                  + (f", {n_died} lost with the syncer's open round" if n_died else "")
                  + (f", {len(found)} overwrites by merges the learner was not in (broadcast = all), their work "
                     "discarded" if found else ""))
    return InvariantResult("updates_accounted", not problems, len(problems), 0, detail, measure)


_SUPERSEDED_TAG = {"late": "late", "stale": "stale", "unanchored": "stale", "before_rejoin": "before_rejoin",
                   "lagging": "lagging", "overwritten": "overwritten"}
"""Push outcomes the syncer follows with a push_superseded event, and the start of that event's reason."""


_POOL_OF_CAUSE = {"newer": "newer", "rejoin_drop": "newer", "broadcast_drop": "newer", "stale": "stale",
                  "before_rejoin": "before_rejoin", "lagging": "lagging", "late": "late", "overwritten": "overwritten"}
"""A push_superseded event's cause (diloco_chaos.trainers.syncers.decoupled.SupersededCause) -> the pool it accounts in:
pushes superseded by a newer one or dropped on rejoin account for accepted or carried pushes; the others for
pushes whose own outcome named them."""


def _pool_of(e: PushSuperseded) -> str:
    """The pool of a push_superseded event: its typed cause; for run directories recorded before events
    carried one (cause None), the start of its reason."""
    if e.cause is not None and e.cause.value in _POOL_OF_CAUSE:
        return _POOL_OF_CAUSE[e.cause.value]
    reason = str(e.reason or "")
    for prefix, pool in (("late", "late"), ("stale", "stale"), ("before rejoin", "before_rejoin"),
                         ("lagging", "lagging")):
        if reason.startswith(prefix):
            return pool
    return "newer"


def _push_id(e: Push) -> str:
    return f"push of learner {e.learner} fragment {e.fragment} round {e.round} steps {e.first_step}-{e.last_step}"


def _outcome(e: Push) -> str:
    """A push's outcome as written: a PushOutcome value, or "late" in a run directory written before late answers
    were carried."""
    return e.outcome.value if isinstance(e.outcome, PushOutcome) else e.outcome


def _fragment(e: Merge) -> int:
    """A decoupled merge's fragment (every decoupled merge names one; None is a barrier algorithm's merge)."""
    if e.fragment is None:
        raise ValueError(f"decoupled merge at t={e.t} names no fragment")
    return e.fragment
