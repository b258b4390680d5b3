"""Protocol invariants of Decoupled DiLoCo: the syncer's and the learners' logs checked for self-consistency.

What: six invariants over a finished run, in the style of harness/invariants.py (same `InvariantResult`, same
run argument, same rule that nothing to measure is a failure). Each compares facts logged where the work really
happened (the tensors a merge used, the step a fragment arrived at, the pushes a learner's link sent) against
what the algorithm promises:

* `rda_norms`: merge_rule rda keeps each non-embedding tensor's merged outer-gradient norm equal to the weighted
  mean of the participants' norms (a plain mean shrinks it); any rule keeps merged <= that mean.
* `outer_lr`: the outer step's effective learning rate (applied change / Nesterov direction, measured on the
  tensors) is diloco.outer_lr.
* `token_weights`: each merge's weights are c_tokens^2 / c_steps of its participants, normalised (uniform with
  token_weighting off).
* `pushes_received`: every push a learner's link sent on a connection that ended in BYE reached the syncer's
  log (merged, carried, superseded or rejected, but logged).
* `apply_schedule`: a merged fragment is applied after step max(pulled + tau, arrived + 1), never earlier or
  later (a regroup of the learner's chips may delay it).
* `initial_pull`: a restarted learner applied every fragment, at least at the version the syncer sent when it
  rejoined, before its first step.

Why a module of their own: a mutation of the syncer's internals (bench/sensitivity.py) changes the final loss by
less than the run-to-run spread, so the loss bound cannot see it; these can, because they check the protocol
itself. They apply to decoupled runs only (the baselines log no pushes, merges by fragment or applies), and
`check_protocol` gives all of them; `harness.invariants.check_all` and the pytest plugin's `ChaosRun.check`
reach them by name through `PROTOCOL_INVARIANTS`.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from harness.invariants import InvariantResult, Run, RunRecord, _run
from trainers.config import DilocoConfig

PushKey = tuple[int, int, int, int]
"""(learner, fragment, first_step, last_step): a push's identity in both the learner's and the syncer's log."""


def _diloco(r: RunRecord, key: str, default: Any) -> Any:
    return r.config.get("diloco", {}).get(key, default)


def _listing(problems: list[str], show: int) -> str:
    return "; ".join(problems[:show]) + (f"; and {len(problems) - show} more" if len(problems) > show else "")


def _no_merges(name: str, bound: float, measure: str, unit: str = "") -> InvariantResult:
    return InvariantResult(name, False, None, bound, "no merge was logged: nothing to check", measure, unit)


# -- rda_norms ---------------------------------------------------------------------------------------------

def rda_norms(run: Run, *, rel_tol: float = 1e-3, show: int = 3) -> InvariantResult:
    """Per merge, from the `norms` it logged (measured in trainers.merge.outer_gradient on the outer gradients it
    used): with diloco.merge_rule rda, the non-embedding tensors' merged norm equals the weighted mean of the
    participants' norms within `rel_tol`; with any rule, no merged norm (embeddings included) exceeds it.
    Figure: the largest relative deviation. A merge of one participant satisfies both trivially; merges of two or
    more are the ones that can tell RDA from a mean (counted in the detail)."""
    r = _run(run)
    measure = "largest relative deviation of merged norm from radial norm"
    merges = r.of("merge")
    if not merges:
        return _no_merges("rda_norms", rel_tol, measure)
    rule = str(_diloco(r, "merge_rule", DilocoConfig().merge_rule))
    worst, bad, unlogged, multi = 0.0, [], 0, 0
    for e in merges:
        n = e.get("norms")
        if not isinstance(n, dict):
            unlogged += 1
            continue
        multi += len(e.get("participants", [])) > 1
        devs = []
        for radial, merged, exact in ((n["radial"], n["merged"], rule == "rda"),
                                      (n["embedding_radial"], n["embedding_merged"], False)):
            if radial <= 0:
                continue
            rel = float(merged) / float(radial) - 1.0
            devs.append(abs(rel) if exact else max(rel, 0.0))
        dev = max(devs, default=0.0)
        if dev > rel_tol:
            bad.append(f"fragment {e.get('fragment')} v{e.get('version')} ({len(e.get('participants', []))} "
                       f"participants): merged {n['merged']:.6g} vs radial {n['radial']:.6g}")
        worst = max(worst, dev)
    if unlogged:
        return InvariantResult("rda_norms", False, None, rel_tol, f"{unlogged} of {len(merges)} merges logged no "
                               "norms (a syncer older than the norms field): unverifiable", measure)
    detail = (_listing(bad, show) if bad else
              f"rule {rule}: {len(merges)} merges, {multi} with two or more participants")
    return InvariantResult("rda_norms", not bad, round(worst, 6), rel_tol, detail, measure)


# -- outer_lr ----------------------------------------------------------------------------------------------

def outer_lr(run: Run, *, rel_tol: float = 1e-2, show: int = 3) -> InvariantResult:
    """Per merge, the outer step's effective learning rate it logged (`outer_lr`: the applied change's norm over
    the Nesterov direction's, trainers.outer_optimizer) equals diloco.outer_lr within `rel_tol` (relative).
    Figure: the largest relative deviation. A step whose direction was 0 logs nan and is skipped (counted)."""
    r = _run(run)
    measure = "largest relative deviation of the effective outer lr"
    merges = r.of("merge")
    if not merges:
        return _no_merges("outer_lr", rel_tol, measure)
    lr = float(_diloco(r, "outer_lr", DilocoConfig().outer_lr))
    worst, bad, unlogged, zero = 0.0, [], 0, 0
    for e in merges:
        if "outer_lr" not in e:
            unlogged += 1
            continue
        eff = float(e["outer_lr"])
        if math.isnan(eff):
            zero += 1
            continue
        dev = abs(eff - lr) / max(lr, 1e-12)
        if dev > rel_tol:
            bad.append(f"fragment {e.get('fragment')} v{e.get('version')}: effective lr {eff:.6g}")
        worst = max(worst, dev)
    if unlogged:
        return InvariantResult("outer_lr", False, None, rel_tol, f"{unlogged} of {len(merges)} merges logged no "
                               "outer_lr: unverifiable", measure)
    detail = _listing(bad, show) if bad else f"diloco.outer_lr {lr}: {len(merges) - zero} outer steps checked"
    detail += f"; {zero} with a zero direction skipped" if zero else ""
    return InvariantResult("outer_lr", not bad, round(worst, 6), rel_tol, detail, measure)


# -- token_weights -----------------------------------------------------------------------------------------

def expected_weights(c_steps: list[int], c_tokens: list[int], token_weighting: bool = True) -> list[float]:
    """The merge weights the algorithm promises: c_tokens^2 / c_steps normalised, or uniform."""
    if not token_weighting:
        return [1.0 / len(c_steps)] * len(c_steps)
    raw = [t * t / s if s > 0 else 0.0 for s, t in zip(c_steps, c_tokens, strict=True)]
    total = sum(raw)
    return [x / total for x in raw] if total > 0 else [math.nan] * len(raw)


def token_weights(run: Run, *, tolerance: float = 1e-5, show: int = 3) -> InvariantResult:
    """Per merge, the weights it used (logged, rounded to 6 decimals) equal c_tokens^2 / c_steps of its
    participants normalised (diloco.token_weighting off: uniform), recomputed from the merge's counters, which
    are the pushes'. Figure: the largest absolute difference. Merges whose participants all had the same
    counters cannot tell the two apart (the detail counts those that can)."""
    r = _run(run)
    measure = "largest merge-weight difference"
    merges = r.of("merge")
    if not merges:
        return _no_merges("token_weights", tolerance, measure)
    on = bool(_diloco(r, "token_weighting", DilocoConfig().token_weighting))
    worst, bad, unlogged, telling = 0.0, [], 0, 0
    for e in merges:
        if "weights" not in e or "c_steps" not in e or "c_tokens" not in e:
            unlogged += 1
            continue
        cs, ct = [int(x) for x in e["c_steps"]], [int(x) for x in e["c_tokens"]]
        want = expected_weights(cs, ct, on)
        telling += max(want) - min(want) > tolerance
        got = [float(w) for w in e["weights"]]
        diff = max((abs(a - b) for a, b in zip(got, want, strict=False)), default=math.inf)
        if len(got) != len(want) or not diff <= tolerance:
            bad.append(f"fragment {e.get('fragment')} v{e.get('version')}: weights {got}, c_steps {cs}, "
                       f"c_tokens {ct} give {[round(w, 6) for w in want]}")
        worst = max(worst, diff if math.isfinite(diff) else 1.0)
    if unlogged:
        return InvariantResult("token_weights", False, None, tolerance, f"{unlogged} of {len(merges)} merges "
                               "logged no weights or counters: unverifiable", measure)
    detail = _listing(bad, show) if bad else (f"token_weighting {on}: {len(merges)} merges, {telling} whose "
                                              "counters give unequal weights")
    return InvariantResult("token_weights", not bad, round(worst, 7), tolerance, detail, measure)


# -- pushes_received ---------------------------------------------------------------------------------------

_CONNECTION_LOST = ("learner_leave", "link_down", "learner_down")
"""Per learner: events after which a push sent earlier may have been lost with its connection (a link_down of
reason "closed" is the learner's own close after its BYE, logged before the syncer reads that BYE)."""


def pushes_received(run: Run, *, show: int = 5) -> InvariantResult:
    """Every push a learner's link sent (`push_sent`, with c_steps > 0: a push with nothing in it is declined
    without a log line) is in the syncer's log (`push`, or `push_rejected` naming it), counted per identity
    (learner, fragment, first_step, last_step). A push may be lost only with its connection: the first event
    about that learner's link after it was sent is then a loss (the syncer's learner_leave, the link's
    link_down, the supervisor's learner_down, the syncer going down) rather than the syncer's learner_bye
    (TCP delivers in order: a push sent before a BYE the syncer read was read too). A push logged as sent after
    the syncer logged that learner's BYE (and before it joined again) went out after the BYE (the link answers a
    pull that came in while it was closing) and is not counted either: the learner's final push holds its
    steps. Figure: pushes lost."""
    r = _run(run)
    measure = "pushes sent but never logged by the syncer"
    sent = [e for e in r.of("push_sent") if int(e.get("c_steps", 1)) > 0
            and int(e.get("first_step", 0)) <= int(e.get("last_step", 0))]
    if not sent:
        got_any = bool(r.of("push"))
        return InvariantResult("pushes_received", False, None, 0, "the syncer logged pushes but no link logged "
                               "push_sent (an older link)" if got_any else "no push was sent: nothing to check",
                               measure)

    def key(e: dict[str, Any]) -> PushKey:
        return int(e["learner"]), int(e["fragment"]), int(e["first_step"]), int(e["last_step"])

    received: Counter[PushKey] = Counter(key(e) for e in r.of("push"))
    received.update(key(e) for e in r.of("push_rejected") if "fragment" in e and "first_step" in e)
    ends: dict[int, list[tuple[float, bool]]] = defaultdict(list)  # learner -> (t, lost?) of its link's ends
    byes: dict[int, list[tuple[float, bool]]] = defaultdict(list)  # learner -> (t, said BYE?) of byes and joins
    for e in r.events:
        if e.get("ev") in ("learner_bye", "learner_join") and e.get("learner") is not None:
            byes[int(e["learner"])].append((float(e["t"]), e["ev"] == "learner_bye"))
        kind, m = e.get("ev"), e.get("learner")
        if kind == "learner_bye" and m is not None:
            ends[int(m)].append((float(e["t"]), False))
        elif kind in _CONNECTION_LOST and m is not None and not (kind == "link_down" and e.get("reason") == "closed"):
            ends[int(m)].append((float(e["t"]), True))
        elif kind == "syncer_down" or (kind == "process_fault" and e.get("kind") == "kill_syncer"):
            for who in {int(x["learner"]) for x in sent}:
                ends[who].append((float(e["t"]), True))
    by_key: dict[PushKey, list[dict[str, Any]]] = defaultdict(list)
    for e in sent:
        by_key[key(e)].append(e)
    lost, excused, after_bye = [], 0, 0
    for k, sends in by_key.items():
        missing = len(sends) - received[k]
        for e in sorted(sends, key=lambda x: float(x["t"]))[len(sends) - missing:] if missing > 0 else []:
            before = [x for x in byes[k[0]] if x[0] < float(e["t"])]
            after = sorted(x for x in ends[k[0]] if x[0] > float(e["t"]))
            if before and before[-1][1]:
                after_bye += 1
            elif after and after[0][1]:
                excused += 1
            else:
                lost.append(f"learner {k[0]} fragment {k[1]} steps {k[2]}-{k[3]} (round {e.get('round')}) sent at "
                            f"{float(e['t']) - r.start:.3f} s, connection then "
                            f"{'ended in BYE' if after else 'never ended'}, never logged by the syncer")
    detail = _listing(lost, show) if lost else f"{len(sent)} pushes sent, all logged by the syncer"
    detail += f"; {excused} lost with their connection" if excused else ""
    detail += f"; {after_bye} sent after the learner's BYE" if after_bye else ""
    return InvariantResult("pushes_received", not lost, len(lost), 0, detail, measure)


# -- apply_schedule ----------------------------------------------------------------------------------------

def apply_schedule(run: Run, *, show: int = 5) -> InvariantResult:
    """Every merged fragment a learner applied (`apply` events, with the step the value was pulled at, None
    for a value it did not take part in, and the step it arrived at) was applied after step
    max(pulled + tau, arrived + 1) with tau = diloco.overlap (arrived + 1 when pulled is None): no earlier, and
    no later unless a `regroup` of that learner's chips at a step in between held it back. Figure: applies off
    schedule. An apply bound by the schedule (pulled + tau > arrived + 1) is the kind that shows a shifted tau."""
    r = _run(run)
    measure = "applies off the tau schedule"
    tau = int(_diloco(r, "overlap", DilocoConfig().overlap))
    applies = r.of("apply")
    if not applies:
        ok = not any(e.get("participants") for e in r.of("merge"))
        return InvariantResult("apply_schedule", False, None, 0, "no apply was logged" +
                               ("" if ok else " although merges had participants") + ": nothing to check", measure)
    regroups: dict[int, list[int]] = defaultdict(list)
    for e in r.of("regroup"):
        regroups[int(e["learner"])].append(int(e["step"]))
    bad, unlogged, checked, by_schedule = [], 0, 0, 0
    for e in applies:
        if "pulled" not in e or "arrived" not in e:
            unlogged += 1
            continue
        m, step = int(e["learner"]), int(e["step"])
        for p, v, pulled, arrived in zip(e["fragments"], e["versions"], e["pulled"], e["arrived"], strict=True):
            if arrived is None:
                unlogged += 1
                continue
            checked += 1
            due = int(arrived) + 1 if pulled is None else max(int(pulled) + tau, int(arrived) + 1)
            by_schedule += pulled is not None and int(pulled) + tau > int(arrived) + 1
            held = any(int(arrived) <= g <= step for g in regroups[m])
            if step < due or (step > due and not held):
                bad.append(f"learner {m} applied fragment {p} v{v} after step {step}, due after {due} "
                           f"(pulled at {pulled}, arrived at {arrived}, tau {tau})")
    if unlogged:
        return InvariantResult("apply_schedule", False, None, 0, f"{unlogged} applied fragments without pulled / "
                               "arrived steps (an older learner): unverifiable", measure)
    detail = _listing(bad, show) if bad else (f"{checked} applied fragments on schedule, {by_schedule} of them "
                                              "due by pulled + tau rather than on arrival")
    return InvariantResult("apply_schedule", not bad, len(bad), 0, detail, measure)


# -- initial_pull ------------------------------------------------------------------------------------------

def initial_pull(run: Run, *, show: int = 5) -> InvariantResult:
    """Every learner restarted to resume at a step > 0 (`learner_restart.start_step`) logged an `initial_pull`
    before its first step that applied all of the fragments, each at least at the version the syncer sent it
    when it rejoined (`learner_join.versions`); a learner that failed again before its pull is not counted.
    Figure: restarts whose initial pull was missing or incomplete. No restart: holds, nothing to check."""
    r = _run(run)
    measure = "restarts without a complete initial pull"
    restarts = [e for e in r.of("learner_restart") if int(e.get("start_step", 0)) > 0]
    if not restarts:
        return InvariantResult("initial_pull", True, 0, 0, "no learner was restarted past step 0", measure)
    bad, checked = [], 0
    for rs in restarts:
        m, t0 = int(rs["learner"]), float(rs["t"])
        again = min((float(e["t"]) for e in r.of("learner_down") if int(e["learner"]) == m and float(e["t"]) > t0),
                    default=math.inf)
        pull = next((e for e in r.of("initial_pull") if int(e["learner"]) == m and t0 < float(e["t"]) < again), None)
        first = next((float(e["t"]) for e in r.of("step") if int(e["learner"]) == m and t0 < float(e["t"]) < again),
                     None)
        if pull is None:
            if first is not None:
                bad.append(f"learner {m} restarted at {t0 - r.start:.3f} s stepped without an initial pull")
            continue  # failed again before its pull: nothing promised
        checked += 1
        join = next((e for e in r.of("learner_join") if int(e["learner"]) == m and float(e["t"]) > t0
                     and "versions" in e), None)
        applied = {int(p): int(v) for p, v in pull.get("applied", [])}
        short = [p for p, v in enumerate(join["versions"]) if applied.get(p, -1) < int(v)] if join else []
        if int(pull["fragments"]) < int(pull["of"]) or short:
            bad.append(f"learner {m} restarted at step {rs['start_step']}: initial pull applied {pull['fragments']} "
                       f"of {pull['of']} fragments" + (f", fragments {short} below the version sent on rejoin"
                                                       if short else ""))
    detail = _listing(bad, show) if bad else f"{checked} restart(s), each pulled every fragment first"
    return InvariantResult("initial_pull", not bad, len(bad), 0, detail, measure)


# -- registry ----------------------------------------------------------------------------------------------

PROTOCOL_INVARIANTS: dict[str, Callable[..., InvariantResult]] = {
    "rda_norms": rda_norms, "outer_lr": outer_lr, "token_weights": token_weights,
    "pushes_received": pushes_received, "apply_schedule": apply_schedule, "initial_pull": initial_pull,
}
"""Name -> invariant, every one bound-free (defaults only)."""


def check_protocol(run: Run) -> list[InvariantResult]:
    """Every protocol invariant with its default bounds, for a decoupled run; [] for the baselines."""
    r = _run(run)
    if r.algorithm != "decoupled":
        return []
    return [f(r) for f in PROTOCOL_INVARIANTS.values()]
