"""Invariants of a finished run: plain functions over its run directory, each with a measured figure and a bound.

A chaos run passes when the system kept its promises, not merely when it did not crash. Each function here
takes a run (a run directory, or a `RunRecord` loaded once with `load_run`) and the bounds it needs, and
returns an `InvariantResult` holding the measured figure, the bound and a human-readable detail;
`result.check()` raises `InvariantViolation` (an AssertionError) whose message names the invariant and prints
both, e.g. ``invariant no_global_downtime violated: longest gap with >= 1 learners alive 4.19 s > bound 1 s
(interval 12.3-16.5 s since run start)``. Everything is computed from the run directory alone
(events.jsonl, config.json, report.json, global.pt), so any recorded run can be checked again.

The invariants:
* `converged`: the final eval loss is within a tolerance of a baseline run's, and/or below an absolute bound.
* `no_global_downtime`: while at least K learners were alive, the global model never stood still longer than
  a bound.
* `availability`: uptime (harness/metrics.py's definition, as in report.json) is at least a bound.
* `faults_fired`: every scheduled fault started, and hit something.
* `rejoined`: every failed learner was back (connected to the syncer and stepping) within a bound after its
  repair delay.
* `updates_accounted`: no update was merged twice and none was lost: every push the syncer logged was merged,
  rejected with a logged reason, or superseded.
* `token_accounting`: the tokens the syncer says it merged equal the tokens of the steps its merges took in.
* `model_finite`: the global model (checkpoint and every evaluation of it) is finite.

Decoupled DiLoCo's protocol invariants (rda_norms, outer_lr, token_weights, pushes_received, apply_schedule,
initial_pull) are in harness/protocol_invariants.py; `check_all` runs them too.

A result with nothing to measure where there should be something (no training span, no final eval, no
checkpoint) is a failure, never a pass: an invariant must not hold vacuously.
"""

from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from harness.events import EVENTS_FILE, read_events
from harness.metrics import DATA_PARALLEL, DOWNTIME_WINDOW_S, downtime
from harness.rundir import CHECKPOINT_FILE, CONFIG_FILE, REPORT_FILE, read_json

_NEGATE = {"<=": ">", ">=": "<", "==": "!="}


class InvariantViolation(AssertionError):
    """An invariant did not hold; `.result` is the `InvariantResult` with the figure and the bound."""

    def __init__(self, result: InvariantResult) -> None:
        super().__init__(result.message())
        self.result = result

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across processes (its args hold only the message)
        return (type(self), (self.result,))


def _fmt(x: Any) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, float):
        return f"{x:.6g}"
    return str(x)


@dataclass(frozen=True)
class InvariantResult:
    """One invariant's verdict on one run: `figure` (the measured value) `relation` `bound` must hold."""

    name: str
    ok: bool
    figure: Any
    bound: Any
    detail: str = ""
    measure: str = ""
    """What the figure is, in words (e.g. "longest gap with >= 1 learners alive")."""
    unit: str = ""
    relation: str = "<="
    """How the figure must compare to the bound: <=, >= or ==."""

    def message(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        verdict = "holds" if self.ok else "violated"
        rel = self.relation if self.ok else _NEGATE.get(self.relation, f"not {self.relation}")
        what = f"{self.measure} " if self.measure else ""
        text = f"invariant {self.name} {verdict}: {what}{_fmt(self.figure)}{unit} {rel} bound {_fmt(self.bound)}{unit}"
        return f"{text} ({self.detail})" if self.detail else text

    def check(self) -> InvariantResult:
        """Raise `InvariantViolation` unless the invariant holds; returns self so calls can be chained."""
        if not self.ok:
            raise InvariantViolation(self)
        return self

    def __str__(self) -> str:
        return (f"{self.name}: {'ok' if self.ok else 'VIOLATED'} ({self.measure or 'figure'} {_fmt(self.figure)}"
                f"{' ' + self.unit if self.unit else ''}, bound {self.relation} {_fmt(self.bound)})")


@dataclass(frozen=True)
class RunRecord:
    """A run directory read once: the event log sorted by `t` (several processes append to one file, so file
    order is not time order; the sort is stable), report.json and config.json ({} when absent)."""

    events: list[dict[str, Any]]
    report: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    run_dir: Path | None = None

    def of(self, *kinds: str) -> list[dict[str, Any]]:
        """Events of the given kinds, in time order."""
        return [e for e in self.events if e.get("ev") in kinds]

    @property
    def algorithm(self) -> str:
        if "algorithm" in self.config:
            return str(self.config["algorithm"])
        start = next(iter(self.of("run_start")), {})
        return str(start.get("algorithm", "decoupled"))

    @property
    def min_quorum(self) -> int:
        return int(self.config.get("diloco", {}).get("min_quorum", 1))

    @property
    def fragments(self) -> int:
        """P, the fragments a decoupled merge spreads a push's tokens over; 1 for the synchronous baselines."""
        if self.algorithm != "decoupled":
            return 1
        p = self.config.get("diloco", {}).get("fragments")
        if p is None:
            p = next((e.get("fragments") for e in self.of("syncer_start") if e.get("fragments")), 1)
        return int(p)

    @property
    def start(self) -> float:
        """run_start (the supervisor's clock), else the first event."""
        s = self.of("run_start")
        return float(s[0]["t"]) if s else (float(self.events[0]["t"]) if self.events else 0.0)

    def train_span(self) -> tuple[float, float] | None:
        """(first inner step, last inner step) of any learner; None if no step was logged."""
        ts = [float(e["t"]) for e in self.of("step")]
        return (min(ts), max(ts)) if ts else None


Run = RunRecord | str | os.PathLike[str]


def load_run(run_dir: str | os.PathLike[str]) -> RunRecord:
    """Read a run directory's events.jsonl (required), report.json and config.json (optional)."""
    d = Path(run_dir)
    evs = sorted(read_events(d / EVENTS_FILE), key=lambda e: float(e.get("t", 0.0)))
    report = read_json(d / REPORT_FILE) if (d / REPORT_FILE).exists() else {}
    config = read_json(d / CONFIG_FILE) if (d / CONFIG_FILE).exists() else {}
    return RunRecord(evs, report, config, d)


def _run(run: Run) -> RunRecord:
    return run if isinstance(run, RunRecord) else load_run(run)


# -- converged ---------------------------------------------------------------------------------------------

def final_loss(run: Run) -> float | None:
    """Eval loss of the final global checkpoint: the `eval` event of kind final, else report.json's."""
    r = _run(run)
    final = [e for e in r.of("eval") if e.get("kind") == "final"]
    if final:
        return float(final[-1]["loss"])
    v = r.report.get("final_eval_loss")
    return None if v is None else float(v)


def converged(run: Run, *, baseline_loss: float | Run | None = None, tolerance: float | None = None,
              max_loss: float | None = None) -> InvariantResult:
    """The final eval loss is at most `baseline_loss + tolerance` (baseline_loss: a number, or a baseline run
    whose final eval loss is taken, e.g. the fault-free run of the same seed) and/or at most `max_loss`.
    With both, both must hold (the bound shown is the tighter). Doing better than the baseline is fine."""
    if baseline_loss is None and max_loss is None:
        raise ValueError("converged needs baseline_loss (with tolerance) or max_loss")
    if baseline_loss is not None and tolerance is None:
        raise ValueError("converged: baseline_loss needs a tolerance")
    loss = final_loss(run)
    bounds: list[tuple[float, str]] = []
    if baseline_loss is not None:
        assert tolerance is not None
        base = baseline_loss if isinstance(baseline_loss, (int, float)) else final_loss(baseline_loss)
        if base is None:
            raise ValueError("converged: the baseline run has no final eval loss")
        bounds.append((float(base) + tolerance, f"baseline {_fmt(float(base))} + tolerance {_fmt(tolerance)}"))
    if max_loss is not None:
        bounds.append((float(max_loss), f"absolute bound {_fmt(float(max_loss))}"))
    bound, why = min(bounds)
    ok = loss is not None and math.isfinite(loss) and all(loss <= b for b, _ in bounds)
    detail = why if loss is not None else "no final eval loss in the run (no eval event of kind final, no report)"
    return InvariantResult("converged", ok, loss, bound, detail, "final eval loss", "nats", "<=")


# -- no_global_downtime ------------------------------------------------------------------------------------

def alive_intervals(run: Run, min_alive: int) -> list[tuple[float, float]]:
    """Intervals in which at least `min_alive` learners were alive in the syncer's view.

    Alive is the syncer's definition: an authenticated connection that has not said BYE. It is read from
    the `alive` set on `learner_join` / `learner_leave`, a `learner_bye` removes its learner, and a syncer
    that starts (`syncer_start`), is killed (`process_fault` kill_syncer) or is seen dead (`syncer_down`)
    has no learners: while the syncer is down nobody can advance the model, which is the syncer-restart
    bound's business, not this one's."""
    r = _run(run)
    alive: set[int] = set()
    since: float | None = None
    out: list[tuple[float, float]] = []
    for e in r.events:
        kind = e.get("ev")
        if kind in ("learner_join", "learner_leave"):
            if "alive" in e:
                alive = set(e["alive"])
            elif kind == "learner_join":
                alive.add(e["learner"])
            else:
                alive.discard(e["learner"])
        elif kind == "learner_bye":
            alive.discard(e["learner"])
        elif kind in ("syncer_start", "syncer_down") or (kind == "process_fault" and e.get("kind") == "kill_syncer"):
            alive = set()
        else:
            continue
        t = float(e["t"])
        if len(alive) >= min_alive and since is None:
            since = t
        elif len(alive) < min_alive and since is not None:
            out.append((since, t))
            since = None
    if since is not None:
        out.append((since, float(r.events[-1]["t"])))
    return out


def no_global_downtime(run: Run, *, bound_s: float, min_alive: int | None = None) -> InvariantResult:
    """While at least K learners were alive (syncer's view, see `alive_intervals`; K = `min_alive`, default
    the scenario's diloco.min_quorum) and inside the training span (first to last inner step of any learner,
    as report.json's longest_gap_s), the longest interval without a merge is at most `bound_s`. The ends of
    each such interval count as gap ends, so a model that stands still from the moment the K-th learner
    joins until the next merge counts in full."""
    r = _run(run)
    k = r.min_quorum if min_alive is None else min_alive
    measure = f"longest gap with >= {k} learners alive"
    span = r.train_span()
    if span is None:
        return InvariantResult("no_global_downtime", False, None, bound_s, "no inner step was logged: no training "
                               "span to measure", measure, "s")
    merges = [float(e["t"]) for e in r.of("merge")]
    worst, where, covered = 0.0, (0.0, 0.0), 0.0
    for a, b in alive_intervals(r, k):
        a, b = max(a, span[0]), min(b, span[1])
        if b <= a:
            continue
        covered += b - a
        # downtime() with a zero allowance lists every gap between merges (and the interval's ends)
        for x, y in downtime(merges, a, b, window_s=0.0)["intervals"]:
            if y - x > worst:
                worst, where = y - x, (a + x - r.start, a + y - r.start)
    if covered == 0.0:
        return InvariantResult("no_global_downtime", False, None, bound_s,
                               f"never >= {k} learners alive during training: nothing to measure", measure, "s")
    detail = f"interval {where[0]:.3f}-{where[1]:.3f} s since run start; {covered:.3f} s with >= {k} alive checked"
    return InvariantResult("no_global_downtime", worst <= bound_s, round(worst, 3), bound_s, detail, measure, "s")


# -- availability ------------------------------------------------------------------------------------------

def availability(run: Run, *, min_uptime: float, window_s: float = DOWNTIME_WINDOW_S) -> InvariantResult:
    """Uptime, harness/metrics.py's `downtime` over the training span (report.json's availability.uptime):
    1 - (time in merge gaps longer than window_s, beyond their first window_s) / span, is >= `min_uptime`."""
    r = _run(run)
    span = r.train_span()
    d = downtime([float(e["t"]) for e in r.of("merge")], *span, window_s=window_s) if span else None
    up = d["uptime"] if d else None
    if up is None or d is None or span is None:
        return InvariantResult("availability", False, None, min_uptime, "no training span (fewer than two "
                               "step times) to measure uptime over", "uptime", "", ">=")
    worst = sorted(d["intervals"], key=lambda iv: iv[0] - iv[1])[:3]
    detail = (f"downtime {d['downtime_s']} s of a {span[1] - span[0]:.3f} s training span, window {window_s} s"
              + (f"; longest downtime intervals (s since first step): {worst}" if worst else ""))
    return InvariantResult("availability", up >= min_uptime, up, min_uptime, detail, "uptime", "", ">=")


# -- faults_fired ------------------------------------------------------------------------------------------

def _describe_fault(f: dict[str, Any]) -> str:
    who = "syncer" if f.get("learner") is None else f"learner {f['learner']}"
    return f"{f.get('action', '?')}({who})"


def faults_fired(run: Run, *, allow_missed: bool = False) -> InvariantResult:
    """Every fault in config.json's `faults` has a `fault_start` with its index; one whose start logged
    `missed` (its target was already down, it hit nothing) does not count unless `allow_missed`.
    Figure: faults that fired; bound: faults scheduled."""
    r = _run(run)
    scheduled = list(r.config.get("faults", []))
    starts = {e["index"]: e for e in r.of("fault_start")}
    never, missed = [], []
    for i, f in enumerate(scheduled):
        e = starts.get(i)
        if e is None:
            never.append(f"faults[{i}] {_describe_fault(f)}")
        elif "missed" in e and not allow_missed:
            missed.append(f"faults[{i}] {e.get('describe', _describe_fault(f))}: {e['missed']}")
    fired = len(scheduled) - len(never) - len(missed)
    parts = ([f"never fired: {'; '.join(never)}"] if never else []) + (
        [f"fired but hit nothing: {'; '.join(missed)}"] if missed else [])
    detail = "; ".join(parts) if parts else f"{len(scheduled)} scheduled"
    return InvariantResult("faults_fired", fired == len(scheduled), fired, len(scheduled), detail,
                           "faults fired", "", ">=")


# -- rejoined ----------------------------------------------------------------------------------------------

def rejoined(run: Run, *, within_s: float) -> InvariantResult:
    """Every failed learner (a `learner_down`: the supervisor saw one of its chips die and will restart it)
    was back within `within_s` after its repair delay ended: back = both the syncer logged its `learner_join`
    and it logged an inner `step`, after its `learner_restart`. Figure: the longest delay from
    learner_down.t + repair_s to being back (inf if it never came back, or failed again first)."""
    r = _run(run)
    downs = r.of("learner_down")
    if not downs:
        return InvariantResult("rejoined", True, 0.0, within_s, "no learner failed", "longest rejoin delay", "s")
    default_repair = float(r.config.get("recovery", {}).get("repair_s", 0.0))
    worst, worst_detail = -math.inf, ""
    for d in downs:
        m, t_down = d["learner"], float(d["t"])
        ready = t_down + float(d.get("repair_s", default_repair))
        again = next((float(e["t"]) for e in downs if e["learner"] == m and float(e["t"]) > t_down), math.inf)
        restart = next((e for e in r.of("learner_restart") if e["learner"] == m and t_down < float(e["t"]) < again),
                       None)
        back = math.inf
        if restart is not None:
            t0 = float(restart["t"])
            join = next((float(e["t"]) for e in r.of("learner_join") if e["learner"] == m and t0 < float(e["t"])),
                        math.inf)
            step = next((float(e["t"]) for e in r.of("step") if e["learner"] == m and t0 < float(e["t"])), math.inf)
            back = max(join, step)
        if back >= again:
            back = math.inf
        delay = back - ready
        if delay > worst:
            how = ("never back" if back == math.inf else
                   f"back {back - r.start:.3f} s since run start")
            worst, worst_detail = delay, (f"learner {m} down at {t_down - r.start:.3f} s, repair done at "
                                          f"{ready - r.start:.3f} s, {how}")
    figure = round(worst, 3) if math.isfinite(worst) else math.inf
    detail = f"{len(downs)} failure(s); worst: {worst_detail}"
    return InvariantResult("rejoined", figure <= within_s, figure, within_s, detail, "longest rejoin delay", "s")


# -- updates_accounted -------------------------------------------------------------------------------------

class Contribution(NamedTuple):
    """One participant of one decoupled merge."""

    merge: dict[str, Any]
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
    for e in _run(run).of("merge"):
        n = len(e.get("participants", []))
        ranges = e.get("step_ranges", [])
        c_steps = e.get("c_steps", [None] * n)
        c_tokens = e.get("c_tokens", [None] * n)
        for m, (a, b), cs, ct in zip(e.get("participants", []), ranges, c_steps, c_tokens, strict=False):
            cs = int(cs) if cs is not None else int(b) - int(a) + 1
            out.append(Contribution(e, int(m), int(e["fragment"]), e.get("round"), int(a), int(b), cs,
                                    int(ct) if ct is not None else 0))
    return out


def updates_accounted(run: Run, *, show: int = 5) -> InvariantResult:
    """No update merged twice and none lost. Figure: the problems found; bound 0.

    Decoupled DiLoCo. A push is what the syncer logged as a `push` event; its identity is
    (learner, fragment, round, first_step, last_step): a learner answers a round at most once per step
    range, and a merge's contribution carries the same fields (participants, fragment, round, step_ranges).
    A final unsolicited push is logged with round None, and a carried push (outcome carried: an answer that
    arrived after its round merged, merged into the fragment's next round) with the round it answered; both
    match a merge of any round. A merge matches only pushes logged before it by the same syncer process
    (no `syncer_down` in between: open rounds die with the syncer and a restored one may reuse their ids).
    Each push must end in exactly one of:
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
      learner), before any push of those steps was merged; or lost with the syncer's open round: no merge of
      the fragment came between the push and the crash, and the learner applied the fragment after a later
      step (a carried push's learner applies the round it missed, so the dead syncer held the only copy);
    * outcome late / stale: a `push_superseded` with reason late / stale and the same step range;
    * outcome rejected_*: a `push_rejected` with a non-empty reason and the same step range.
    Problems: a push none of these accounts for (lost); a merged contribution that no push accounts for; two
    merged contributions of one learner and fragment whose trained steps overlap (the same steps merged twice,
    whether the same push twice or a stale copy; trained steps: the c_steps steps ending at last_step, see
    `Contribution.trained`); two merges giving one fragment the same version (a merge
    the restored syncer forgot, so one broadcast version was lost).

    ddp, elastic_ddp and diloco log no push events: only the last check applies there, as one merge per step
    (ddp, elastic_ddp) or round (diloco)."""
    r = _run(run)
    problems: list[str] = []
    measure = "pushes lost or merged twice"
    if r.algorithm != "decoupled":
        key = "step" if r.algorithm in DATA_PARALLEL else "round"
        seen = Counter(e.get(key) for e in r.of("merge"))
        for k, n in sorted(seen.items(), key=lambda kv: str(kv[0])):
            if n > 1:
                problems.append(f"{key} {k} merged {n} times")
        detail = "; ".join(problems[:show]) or f"{len(r.of('merge'))} merges, each {key} once"
        return InvariantResult("updates_accounted", not problems, len(problems), 0, detail, measure)

    contribs = merged_contributions(r)
    merged_pool: dict[tuple[int, int, int, int], list[dict[str, Any]]] = defaultdict(list)
    for c in contribs:
        merged_pool[(c.learner, c.fragment, c.first_step, c.last_step)].append(c.merge)
    sup_pool: Counter[tuple[str, int, int, int, int]] = Counter()
    for e in r.of("push_superseded"):
        reason = str(e.get("reason") or "")
        tag = "late" if reason.startswith("late") else "stale" if reason.startswith("stale") else \
            "before_rejoin" if reason.startswith("before rejoin") else "lagging" if reason.startswith("lagging") \
            else "newer"
        sup_pool[(tag, int(e["learner"]), int(e["fragment"]), int(e["first_step"]), int(e["last_step"]))] += 1
    rej_pool: Counter[tuple[int, int, int, int]] = Counter()
    for e in r.of("push_rejected"):
        if e.get("reason") and "fragment" in e and "first_step" in e:
            rej_pool[(int(e["learner"]), int(e["fragment"]), int(e["first_step"]), int(e["last_step"]))] += 1
    downs = [float(e["t"]) for e in r.of("syncer_down")]

    def same_syncer(t_push: float, t_merge: float) -> bool:
        """A merge takes in only pushes its own syncer process received, before it merged (a restored
        syncer does not restore open rounds, and may reuse their round ids)."""
        return t_push <= t_merge and not any(t_push < d < t_merge for d in downs)

    # versions restored beyond the last logged merge: merges the old syncer made but never logged
    unlogged: dict[tuple[int, int], int] = defaultdict(int)  # (learner, fragment) -> pushes it may account for
    unlogged_frag: dict[int, int] = defaultdict(int)
    for rest in r.of("syncer_restore"):
        for p, v in enumerate(rest.get("versions", [])):
            logged = max((int(e["version"]) for e in r.of("merge")
                          if e.get("fragment") == p and float(e["t"]) < float(rest["t"])), default=0)
            unlogged_frag[p] += max(0, int(v) - logged)

    joins = [e for e in r.of("learner_join") if "versions" in e]
    applies = r.of("apply")

    def given_up_on_rejoin(m: int, p: int, crash: float) -> bool:
        """Learner m joined a syncer after `crash` and then applied fragment p at the version it was sent."""
        for j in joins:
            if int(j["learner"]) != m or float(j["t"]) <= crash or p >= len(j["versions"]):
                continue
            sent = (p, int(j["versions"][p]))
            if any(int(a["learner"]) == m and float(a["t"]) > float(j["t"])
                   and sent in zip(a.get("fragments", []), a.get("versions", []), strict=False) for a in applies):
                return True
        return False

    frag_merges = [(int(e["fragment"]), float(e["t"])) for e in r.of("merge")]

    def died_with_the_syncer(m: int, p: int, t_push: float, last: int, crash: float) -> bool:
        """The push's round was still open when the syncer died (no merge of fragment p between the push and
        the crash), and learner m had applied fragment p after a step past the push's (which overwrote those
        steps and reset its counters), so the dead syncer's round held their only copy."""
        if any(q == p and t_push < tm < crash for q, tm in frag_merges):
            return False
        return any(int(a["learner"]) == m and float(a["t"]) > t_push and int(a.get("step", -1)) > last
                   and p in a.get("fragments", []) for a in applies)

    pushes = r.of("push")
    lost: list[str] = []
    n_given_up = n_died = 0
    pending: list[dict[str, Any]] = []
    for e in pushes:  # late / stale / rejected first: their own follow-up event accounts for them
        m, p, a, b = int(e["learner"]), int(e["fragment"]), int(e["first_step"]), int(e["last_step"])
        outcome = str(e.get("outcome", ""))
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
        m, p, a, b = int(e["learner"]), int(e["fragment"]), int(e["first_step"]), int(e["last_step"])
        t = float(e["t"])
        cands = merged_pool.get((m, p, a, b), [])
        any_round = e.get("round") is None or e.get("outcome") == "carried"
        hit = next((i for i, x in enumerate(cands)
                    if (any_round or x.get("round") == e.get("round")) and same_syncer(t, x["t"])), None)
        if hit is not None:
            cands.pop(hit)
            continue
        if sup_pool[("newer", m, p, a, b)] > 0:
            sup_pool[("newer", m, p, a, b)] -= 1
            continue
        crash = next((d for d in downs if d > t), None)
        if crash is not None and any(c.learner == m and c.fragment == p and c.first_step <= a and c.last_step >= b
                                     and float(c.merge["t"]) > crash for c in contribs):
            continue  # its round was lost with the syncer; a later push of the same steps was merged
        if crash is not None and unlogged_frag[p] > unlogged[(m, p)]:
            unlogged[(m, p)] += 1  # merged and checkpointed by the syncer that died before logging the merge
            continue
        if crash is not None and given_up_on_rejoin(m, p, crash):
            n_given_up += 1  # its round died with the syncer; the rejoin's fragment then reset its counters
            continue
        if crash is not None and died_with_the_syncer(m, p, t, b, crash):
            n_died += 1  # the dead syncer's open round held its only copy: the learner had moved past it
            continue
        lost.append(f"{_push_id(e)} {e.get('outcome')} but never merged nor superseded")
    phantom = [f"merge of fragment {p} v{x.get('version')} round {x.get('round')} took learner {m} steps {a}-{b}, "
               "which no logged push accounts for"
               for (m, p, a, b), left in merged_pool.items() for x in left]
    twice: list[str] = []
    ranges: dict[tuple[int, int], list[tuple[int, int, Any]]] = defaultdict(list)
    for c in contribs:
        ranges[(c.learner, c.fragment)].append((*c.trained, c.merge.get("version")))
    for (m, p), xs in sorted(ranges.items()):
        xs.sort(key=lambda x: (x[0], x[1]))
        for (a1, b1, v1), (a2, b2, v2) in zip(xs, xs[1:], strict=False):
            if a2 <= b1:
                twice.append(f"learner {m} fragment {p}: steps {a1}-{b1} (v{v1}) and {a2}-{b2} (v{v2}) both merged")
    versions = Counter((e.get("fragment"), e.get("version")) for e in r.of("merge"))
    twice += [f"fragment {p} version {v} made by {n} merges" for (p, v), n in sorted(versions.items()) if n > 1]
    problems = lost + phantom + twice
    if problems:
        detail = "; ".join(problems[:show]) + (f"; and {len(problems) - show} more" if len(problems) > show else "")
    else:
        n_unlogged = sum(unlogged.values())
        detail = (f"{len(pushes)} pushes, {len(contribs)} merged contributions"
                  + (f", {n_unlogged} counted as merged in merges the killed syncer did not log" if n_unlogged else "")
                  + (f", {n_given_up} given up on rejoining the restored syncer" if n_given_up else "")
                  + (f", {n_died} lost with the syncer's open round" if n_died else ""))
    return InvariantResult("updates_accounted", not problems, len(problems), 0, detail, measure)


_SUPERSEDED_TAG = {"late": "late", "stale": "stale", "unanchored": "stale", "before_rejoin": "before_rejoin",
                   "lagging": "lagging"}
"""Push outcomes the syncer follows with a push_superseded event, and the start of that event's reason."""


def _push_id(e: dict[str, Any]) -> str:
    return (f"push of learner {e['learner']} fragment {e['fragment']} round {e.get('round')} "
            f"steps {e['first_step']}-{e['last_step']}")


# -- token_accounting --------------------------------------------------------------------------------------

def token_accounting(run: Run, *, tolerance: float = 1e-3, show: int = 5) -> InvariantResult:
    """Tokens merged = tokens in merged pushes. Figure: the discrepancy in tokens; bound `tolerance`.

    Two sums of absolute differences, so errors cannot cancel:
    * the syncer's own count (the last `syncer_done.tokens_merged`, else the final eval's, else the last
      merge's cumulative `tokens_merged`) against the sum over merge events of their contributions'
      c_tokens / P (P fragments for decoupled, 1 for the others: the report's definition). A restored
      syncer's `tokens_merged` counts in where its versions show merges that were checkpointed but never
      logged; otherwise a restored count that differs from the log is a discrepancy;
    * decoupled: each merged contribution's c_tokens against the tokens the learner's `step` events logged for
      the steps it trained (the c_steps steps ending at its last_step; the latest logged value of each step),
      divided by P; ddp and elastic_ddp: each participant's tokens against its step's (logged after the merge,
      so every step is read first). A contribution whose
      steps were not all logged is counted in the detail as unverifiable, not as a discrepancy."""
    r = _run(run)
    merges = r.of("merge")
    p_div = r.fragments
    measure = "tokens-merged discrepancy"
    done = r.of("syncer_done")
    finals = [e for e in r.of("eval") if e.get("kind") == "final" and "tokens_merged" in e]
    if done:
        reported, src = float(done[-1]["tokens_merged"]), "syncer_done"
    elif finals:
        reported, src = float(finals[-1]["tokens_merged"]), "final eval"
    elif merges:
        reported, src = float(merges[-1].get("tokens_merged", 0.0)), "last merge"
    else:
        return InvariantResult("token_accounting", False, None, tolerance, "no merge and no syncer count: "
                               "nothing merged to account for", measure, "tokens")
    step_tokens: dict[int, dict[int, int]] = defaultdict(dict)
    logged, per_contrib, unverifiable, misreported, restored_extra = 0.0, 0.0, 0, 0, 0.0
    issues: list[str] = []
    data_parallel = r.algorithm in DATA_PARALLEL
    if data_parallel:  # a data-parallel step is logged after its merge: the learner steps on the averaged gradient
        for e in r.of("step"):
            step_tokens[int(e["learner"])][int(e["step"])] = int(e.get("tokens", 0))
    for e in r.events:
        kind = e.get("ev")
        if kind == "step" and not data_parallel:
            step_tokens[int(e["learner"])][int(e["step"])] = int(e.get("tokens", 0))
        elif kind == "syncer_restore":
            versions = e.get("versions", [])
            before = [x for x in merges if float(x["t"]) < float(e["t"])]
            gap = float(e.get("tokens_merged", 0.0)) - logged - restored_extra
            lost_merges = sum(max(0, int(v) - max((int(x["version"]) for x in before if x.get("fragment") == q),
                                                  default=0)) for q, v in enumerate(versions))
            if lost_merges > 0 and gap >= 0:
                restored_extra += gap
            elif abs(gap) > tolerance:
                per_contrib += abs(gap)
                issues.append(f"restored syncer counts {e.get('tokens_merged')} tokens merged, the log "
                              f"{logged + restored_extra:.6g}")
        elif kind == "merge":
            c = [int(x) for x in e.get("c_tokens", [])]
            logged += sum(c) / p_div
            if r.algorithm == "decoupled":
                ranges = [(int(a), int(b)) for a, b in e.get("step_ranges", [])]
                c_steps = [int(x) for x in e.get("c_steps", [b - a + 1 for a, b in ranges])]
                misreported += sum(1 for (a, b), cs in zip(ranges, c_steps, strict=False) if cs != b - a + 1)
                spans = [(max(a, b - cs + 1), b) for (a, b), cs in zip(ranges, c_steps, strict=False)]
            elif r.algorithm in DATA_PARALLEL and e.get("step") is not None:
                spans = [(int(e["step"]), int(e["step"]))] * len(c)
            else:
                continue
            for m, ct, (a, b) in zip(e.get("participants", []), c, spans, strict=False):
                have = step_tokens.get(int(m), {})
                if any(s not in have for s in range(a, b + 1)):
                    unverifiable += 1
                    continue
                steps_sum = sum(have[s] for s in range(a, b + 1))
                if steps_sum != ct:
                    per_contrib += abs(ct - steps_sum) / p_div
                    issues.append(f"merge of fragment {e.get('fragment')} v{e.get('version')}: learner {m} "
                                  f"c_tokens {ct} but its steps {a}-{b} logged {steps_sum} tokens")
    total_gap = abs(reported - (logged + restored_extra))
    if total_gap > tolerance:
        issues.insert(0, f"{src} says {reported:.6g} tokens merged, merges logged {logged + restored_extra:.6g}")
    figure = round(total_gap + per_contrib, 6)
    detail = "; ".join(issues[:show]) + (f"; and {len(issues) - show} more" if len(issues) > show else "")
    if not issues:
        detail = f"{reported:.6g} tokens merged ({src}) over {len(merges)} merges, P = {p_div}"
    if unverifiable:
        detail += f"; {unverifiable} contribution(s) with steps not all logged, not checked against steps"
    if misreported:
        detail += (f"; {misreported} contribution(s) whose step range is not c_steps long (first_step misreported),"
                   " checked over the last c_steps steps")
    return InvariantResult("token_accounting", figure <= tolerance, figure, tolerance, detail, measure, "tokens")


# -- model_finite ------------------------------------------------------------------------------------------

def model_finite(run: Run) -> InvariantResult:
    """The global model is finite. Figure: non-finite observations; bound 0. Observations: each tensor of
    global.pt's params (loaded when the run directory has it), the final eval's `finite` flag (or
    report.json's global_model_finite), and the loss of every eval of the global model (periodic and final).
    With none of these there is no evidence, which is a violation."""
    r = _run(run)
    bad: list[str] = []
    evidence = 0
    ckpt = r.run_dir / CHECKPOINT_FILE if r.run_dir is not None else None
    if ckpt is not None and ckpt.exists():
        import torch

        state = torch.load(ckpt, weights_only=True)
        for n, t in state.get("params", {}).items():
            evidence += 1
            if not bool(torch.isfinite(t).all()):
                bad.append(f"global.pt tensor {n} has {int((~torch.isfinite(t)).sum())} non-finite values")
    finals = [e for e in r.of("eval") if e.get("kind") == "final" and "finite" in e]
    flag = finals[-1]["finite"] if finals else r.report.get("global_model_finite")
    if flag is not None:
        evidence += 1
        if flag is not True:
            bad.append("final eval says the checkpoint is not finite")
    for e in r.of("eval"):
        evidence += 1
        if not math.isfinite(float(e.get("loss", math.nan))):
            bad.append(f"{e.get('kind', 'periodic')} eval of version {e.get('version')} at "
                       f"{float(e['t']) - r.start:.3f} s: loss {e.get('loss')}")
    if evidence == 0:
        return InvariantResult("model_finite", False, None, 0, "no global.pt, no final eval and no eval event: "
                               "no evidence the global model is finite", "non-finite observations")
    detail = "; ".join(bad[:5]) if bad else f"{evidence} observations, all finite"
    return InvariantResult("model_finite", not bad, len(bad), 0, detail, "non-finite observations")


# -- all at once -------------------------------------------------------------------------------------------

def check_all(run: Run, *, baseline_loss: float | Run | None = None, tolerance: float | None = None,
              max_loss: float | None = None, downtime_bound_s: float | None = None, min_alive: int | None = None,
              min_uptime: float | None = None, rejoin_within_s: float | None = None) -> list[InvariantResult]:
    """Every invariant whose bounds are given, plus the bound-free ones (faults_fired, updates_accounted,
    token_accounting, model_finite) and, for a decoupled run, the protocol invariants of
    harness/protocol_invariants.py. Nothing raises; `[r.check() for r in results]` or filter on `ok`."""
    r = _run(run)
    out = []
    if baseline_loss is not None or max_loss is not None:
        out.append(converged(r, baseline_loss=baseline_loss, tolerance=tolerance, max_loss=max_loss))
    if downtime_bound_s is not None:
        out.append(no_global_downtime(r, bound_s=downtime_bound_s, min_alive=min_alive))
    if min_uptime is not None:
        out.append(availability(r, min_uptime=min_uptime))
    out.append(faults_fired(r))
    if rejoin_within_s is not None:
        out.append(rejoined(r, within_s=rejoin_within_s))
    out += [updates_accounted(r), token_accounting(r), model_finite(r)]
    from harness.protocol_invariants import check_protocol  # it builds on this module

    return out + check_protocol(r)
