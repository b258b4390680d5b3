"""Deterministic (lockstep) mode of Decoupled DiLoCo: the learner's wait at a sync point.

What: with `diloco.deterministic`, a learner's host, after publishing the snapshot of a step that is a sync
point of some fragment, waits until that round's merged value has arrived; the syncer merges a round only
once every alive learner is in (`syncer_policy.decide`). Every push then holds exactly the steps up to its
sync point, every merge has the same participants in the same order, and every merged value is applied
at the same step, so a fault-free run repeats exactly.

Why: the normal mode's merges depend on which learner reaches a sync point first, when pulls are answered
and when merged values arrive, so a run's final loss varies from one run to the next with the same seed.
A regression smaller than that variation can be bisected only when runs repeat: this mode is for that. Its
learners wait for each other at every sync point like synchronous streaming DiLoCo, so it says nothing about
availability; under faults it degrades to the normal mode (a wait gives up after its bound).
"""

from __future__ import annotations

from collections.abc import Callable

from diloco_chaos.trainers.learner.core import DecoupledLink, LearnerCore


def due_here(core: LearnerCore) -> list[int]:
    """Fragments whose sync point is the step the learner just finished (none before step 1)."""
    return core.schedule.fragments_due(core.step) if core.step >= 1 else []


def await_round(core: LearnerCore, link: DecoupledLink, wait: Callable[[], bool]) -> bool:
    """Host, after publishing step s: take merged fragments off the link until every fragment due at s holds
    a merged value pulled at s or later, or `wait()` (a bounded wait on the link, False past its deadline)
    gives up. Returns whether every one arrived. Nothing is applied here: the values are applied at their
    usual step (pulled step + tau)."""
    due = due_here(core)

    def arrived(p: int) -> bool:
        pending = core.frags[p].pending
        return pending is not None and pending.pulled_step is not None and pending.pulled_step >= core.step

    while True:
        for merged in link.poll():
            core.receive(merged)
        if all(arrived(p) for p in due):
            return True
        if not wait():
            return False
