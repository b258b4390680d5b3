"""The scenario check's part for `[explore]` (diloco_chaos/harness/explore/; docs/explore.md).

What: `explore_rules` reports, each naming its key, the `[explore]` values that are in range on their own but
do not fit together or with the rest of the scenario: a kind that is no registered fault kind, min above max
(faults, durations), must_fail above tries (and confirm_must_fail above confirm_runs, unless that is 0), a target
that is neither "syncer" nor one of the run's learners, and a trigger window (first_step, last_step) outside the
explored run's steps.

Why here: like the target's and the task's rules (target_check.py, task_check.py), the table is validated with
the rest of the scenario before any process starts, so `diloco-chaos validate` and `explore` refuse a bad table
the same way; which kinds this scenario can actually carry, and which invariants exist, are decided by explore
itself (diloco_chaos/harness/explore/generate.py), which reads the fault and invariant registries.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from diloco_chaos.chaos import faults
from diloco_chaos.trainers.config import did_you_mean

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario
    from diloco_chaos.harness.config.sections import Found

TARGET = re.compile(r"learner(\d+)|syncer")
"""An `[explore] targets` entry: "learner<M>" or "syncer"."""


def explored_steps(sc: Scenario) -> int:
    """Inner steps of every explored run: explore.steps, or train.steps where that is smaller."""
    return min(sc.explore.steps, sc.train.steps)


def trigger_window(sc: Scenario) -> tuple[int, int]:
    """(first, last) step a drawn fault may trigger at: last_step, or the explored steps less a tenth."""
    steps = explored_steps(sc)
    last = sc.explore.last_step or steps - max(1, steps // 10)
    return sc.explore.first_step, last


def explore_rules(sc: Scenario, found: Found) -> None:
    """Every error of the `[explore]` table's values taken together (see the module doc)."""
    ex = sc.explore
    names = faults.names()
    for kind in ex.kinds:
        if faults.find(kind) is None and found.ok("explore.kinds"):
            found.add("explore.kinds", f"explore.kinds: {kind!r} is not a fault kind{did_you_mean(kind, names)}; "
                                       f"one of {', '.join(names)}")
    for lo, hi in (("min_faults", "max_faults"), ("min_duration_s", "max_duration_s"), ("must_fail", "tries"),
                   ("confirm_must_fail", "confirm_runs")):
        a, b = getattr(ex, lo), getattr(ex, hi)
        if a > b and (lo != "confirm_must_fail" or b > 0) and found.ok(f"explore.{lo}", f"explore.{hi}"):
            found.add(f"explore.{lo}", f"explore.{lo} = {a:g}: must be at most explore.{hi} = {b:g}")
    for t in ex.targets:
        m = TARGET.fullmatch(t)
        if m is None or (m.group(1) is not None and int(m.group(1)) >= sc.topology.learners):
            if found.ok("explore.targets", "topology.learners"):
                found.add("explore.targets", f"explore.targets: {t!r} must be \"syncer\" or \"learner<M>\" with M "
                                             f"in [0, {sc.topology.learners - 1}] (topology.learners)")
    if not found.ok("explore.first_step", "explore.last_step", "explore.steps", "train.steps"):
        return
    steps = explored_steps(sc)
    first, last = trigger_window(sc)
    if ex.last_step > steps:
        found.add("explore.last_step", f"explore.last_step = {ex.last_step}: must be at most the explored steps "
                                       f"{steps} (explore.steps, train.steps)")
    elif first >= last:
        found.add("explore.first_step", f"explore.first_step = {first}: must be below the last trigger step {last}"
                                        + ("" if ex.last_step else f" (the explored steps {steps} less a tenth)"))
