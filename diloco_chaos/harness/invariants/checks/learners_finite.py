"""Invariant `learners_finite`: No learner produced non-finite work (loss, push, contribution or parameters).

One module per invariant (a run invariant): it registers itself with
`diloco_chaos.harness.invariants.registry.register`, so check_all, the pytest plugin and `diloco-chaos invariants` list
it.

Why: the syncer rejects a non-finite push (`push_rejected` rejected_nonfinite; the barrier algorithms'
`sync_rejected` rejected_nonfinite), which protects the global model, so `model_finite` holds; but a learner
that trains on NaN for the rest of the run wastes its chips and its tokens, and without this invariant the run
would pass. The evidence, per learner: the steps whose training loss is not finite (`step`, and the host chip's
`learner_nonfinite`), the pushes the syncer rejected as non-finite (fragment and steps) and the contributions
the barrier rejected as non-finite (step or round), and parameters non-finite when it finished (`learner_done`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from diloco_chaos.harness.invariants.base import InvariantResult, Run, RunRecord, _run
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.learner import LearnerDone, LearnerNonfinite, Step
from diloco_chaos.harness.record.syncer import PushRejected, SyncRejected

NONFINITE = "rejected_nonfinite"
"""The reason the syncer gives a push or contribution it refused for a NaN or infinite value."""


def ranges(values: Iterable[int]) -> str:
    """Sorted integers as ranges: [1, 2, 3, 7, 9, 10] -> "1-3, 7, 9-10"."""
    out: list[str] = []
    xs = sorted(set(values))
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ", ".join(out)


@dataclass
class NonfiniteWork:
    """What one learner did that was not finite."""

    learner: int
    loss_steps: set[int] = field(default_factory=set)
    """Steps whose training loss was NaN or infinite."""
    pushes: dict[int | None, set[int]] = field(default_factory=lambda: defaultdict(set))
    """Fragment (None: the whole model, a barrier algorithm's contribution) -> the steps of its rejected work."""
    rounds: set[int] = field(default_factory=set)
    """diloco: rounds whose outer delta was rejected as non-finite."""
    rejected: int = 0
    """Pushes and contributions the syncer rejected as non-finite."""
    final_params_step: int | None = None
    """Set when its parameters were non-finite when it finished: its last step."""

    def describe(self) -> str:
        parts = []
        if self.loss_steps:
            parts.append(f"loss non-finite at steps {ranges(self.loss_steps)}")
        for frag in sorted(self.pushes, key=lambda p: -1 if p is None else p):
            where = "whole model" if frag is None else f"fragment {frag}"
            parts.append(f"{where}: non-finite work rejected, steps {ranges(self.pushes[frag])}")
        if self.rounds:
            parts.append(f"whole model: non-finite outer delta rejected, rounds {ranges(self.rounds)}")
        if self.rejected:
            parts.append(f"{self.rejected} pushes rejected_nonfinite")
        if self.final_params_step is not None:
            parts.append(f"parameters non-finite when it finished (step {self.final_params_step})")
        return f"learner {self.learner}: " + "; ".join(parts)


def nonfinite_work(r: RunRecord) -> dict[int, NonfiniteWork]:
    """Per learner with any non-finite work, what it was (empty: every learner stayed finite)."""
    out: dict[int, NonfiniteWork] = {}

    def of(m: int) -> NonfiniteWork:
        return out.setdefault(m, NonfiniteWork(m))

    for s in r.records(Step):
        if not math.isfinite(float(s.loss)):
            of(s.learner).loss_steps.add(s.step)
    for n in r.records(LearnerNonfinite):
        of(n.learner).loss_steps.add(n.step)
    for p in r.records(PushRejected):
        if p.reason == NONFINITE:
            w = of(p.learner)
            w.rejected += 1
            first = p.first_step if p.first_step is not None else p.last_step
            last = p.last_step if p.last_step is not None else first
            w.pushes[p.fragment] |= set(range(first, last + 1)) if first is not None and last is not None else set()
    for c in r.records(SyncRejected):
        if c.reason == NONFINITE:
            w = of(c.learner)
            w.rejected += 1
            if c.step is not None:
                w.pushes[None].add(c.step)
            if c.round is not None:
                w.rounds.add(c.round)
    for d in r.records(LearnerDone):
        if d.finite is False:
            of(d.learner).final_params_step = d.steps
    return out


@register(order=85, bounds=(Bound("show", "learners listed in the detail", 5, low=0),))
def learners_finite(run: Run, show: int = 5) -> InvariantResult:
    """Every learner's work stayed finite. Figure: learners with non-finite work (a NaN or infinite training
    loss, a push or contribution the syncer rejected as non-finite, or parameters non-finite when it finished);
    bound 0. The detail names each such learner with its fragments and steps (as ranges). A run in which no
    learner logged a step or finished has no evidence, which is a violation."""
    r = _run(run)
    measure = "learners with non-finite work"
    if not r.records(Step) and not r.records(LearnerDone):
        return InvariantResult("learners_finite", False, None, 0, "no learner logged a step: no evidence that "
                               "any learner's work was finite", measure)
    bad = nonfinite_work(r)
    if not bad:
        steps = len(r.records(Step))
        return InvariantResult("learners_finite", True, 0, 0, f"{steps} steps, every loss and push finite", measure)
    listed = [bad[m].describe() for m in sorted(bad)]
    more = f"; and {len(listed) - show} more" if len(listed) > show else ""
    return InvariantResult("learners_finite", False, len(bad), 0, "; ".join(listed[:show]) + more, measure)
