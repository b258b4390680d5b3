"""Invariant `pushes_received`: Every push a learner's link sent on a connection that ended in BYE reached the
syncer's log.

One module per invariant (a protocol invariant of Decoupled DiLoCo, for decoupled runs only): it registers itself with
`diloco_chaos.harness.invariants.registry.register`, so check_all, the pytest plugin and `diloco-chaos invariants` list
it.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.checks._common import PushKey, _listing
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.learner import LinkDown, PushSent
from diloco_chaos.harness.record.run import ProcessFault, SyncerDown
from diloco_chaos.harness.record.syncer import LearnerBye, LearnerJoin, Push, PushRejected

_CONNECTION_LOST = ("learner_leave", "link_down", "learner_down")
"""Per learner: events after which a push sent earlier may have been lost with its connection (a link_down of
reason "closed" is the learner's own close after its BYE, logged before the syncer reads that BYE)."""


@register(order=140, requires="fragmented", bounds=(Bound("show", "problems listed in the detail", 5, low=0),))
def pushes_received(run: Run, *, show: int = 5) -> InvariantResult:
    """Every push a learner's link sent (`push_sent`, with c_steps > 0: a push with nothing in it is declined
    without a log line) is in the syncer's log (`push`, or `push_rejected` naming it), counted per identity
    (learner, fragment, first_step, last_step). A push may be lost only with its connection: the first event
    about that learner's link after it was sent is then a loss (the syncer's learner_leave, the link's
    link_down, the supervisor's learner_down, the syncer going down) rather than the syncer's learner_bye
    (TCP delivers in order: a push sent before a BYE the syncer read was read too). A push logged as sent after
    the syncer logged that learner's BYE (and before it joined again) went out after the BYE (the link answers a
    pull that came in while it was closing) and is not counted either: the learner's final push holds its
    steps. A push sent more than once (a finished learner sends its final pushes again when its connection
    ended before the syncer answered its BYE) is counted per copy; the copies missing are first those whose
    connection was lost. Figure: pushes lost."""
    r = _run(run)
    measure = "pushes sent but never logged by the syncer"
    sent = [e for e in r.records(PushSent) if e.c_steps > 0 and e.first_step <= e.last_step]
    if not sent:
        got_any = bool(r.records(Push))
        return InvariantResult("pushes_received", False, None, 0, "the syncer logged pushes but no link logged "
                               "push_sent (an older link)" if got_any else "no push was sent: nothing to check",
                               measure)

    def key(e: PushSent | Push) -> PushKey:
        return e.learner, e.fragment, e.first_step, e.last_step

    received: Counter[PushKey] = Counter(key(e) for e in r.records(Push))
    received.update((e.learner, e.fragment, e.first_step, e.last_step) for e in r.records(PushRejected)
                    if e.fragment is not None and e.first_step is not None and e.last_step is not None)
    ends: dict[int, list[tuple[float, bool]]] = defaultdict(list)  # learner -> (t, lost?) of its link's ends
    byes: dict[int, list[tuple[float, bool]]] = defaultdict(list)  # learner -> (t, said BYE?) of byes and joins
    for e in r.all_records:
        kind, m = e.ev, getattr(e, "learner", None)
        if isinstance(e, LearnerBye | LearnerJoin):
            byes[e.learner].append((e.t, isinstance(e, LearnerBye)))
        if isinstance(e, LearnerBye):
            ends[e.learner].append((e.t, False))
        elif kind in _CONNECTION_LOST and m is not None and not (isinstance(e, LinkDown) and e.reason == "closed"):
            ends[int(m)].append((e.t, True))
        elif isinstance(e, SyncerDown) or (isinstance(e, ProcessFault) and e.kind == "kill_syncer"):
            for who in {x.learner for x in sent}:
                ends[who].append((e.t, True))
    by_key: dict[PushKey, list[PushSent]] = defaultdict(list)
    for e in sent:
        by_key[key(e)].append(e)
    def started(e: PushSent) -> float:
        """When the push's write began: `push_sent` is logged when the write returned, and a connection that ended
        meanwhile (its link_down logged first) may have taken the push with it (the kernel took the bytes of a
        connection the peer had closed; found by explore under limit_data)."""
        return e.t - max(0.0, e.seconds)

    def lost_with_connection(e: PushSent) -> bool:
        after = sorted(x for x in ends[e.learner] if x[0] > started(e))
        return bool(after) and after[0][1]

    lost, excused, after_bye = [], 0, 0
    for k, sends in by_key.items():
        missing = len(sends) - received[k]
        # a push sent more than once (a finished learner re-sends its final pushes when its connection ended
        # before the syncer answered its BYE): the copies missing are first those whose connection was lost
        order = sorted(sends, key=lambda x: (not lost_with_connection(x), x.t))
        for e in order[:missing] if missing > 0 else []:
            before = [x for x in byes[k[0]] if x[0] < e.t]
            after = sorted(x for x in ends[k[0]] if x[0] > started(e))
            if before and before[-1][1]:
                after_bye += 1
            elif after and after[0][1]:
                excused += 1
            else:
                lost.append(f"learner {k[0]} fragment {k[1]} steps {k[2]}-{k[3]} (round {e.round}) sent at "
                            f"{e.t - r.start:.3f} s, connection then "
                            f"{'ended in BYE' if after else 'never ended'}, never logged by the syncer")
    detail = _listing(lost, show) if lost else f"{len(sent)} pushes sent, all logged by the syncer"
    detail += f"; {excused} lost with their connection" if excused else ""
    detail += f"; {after_bye} sent after the learner's BYE" if after_bye else ""
    return InvariantResult("pushes_received", not lost, len(lost), 0, detail, measure)
