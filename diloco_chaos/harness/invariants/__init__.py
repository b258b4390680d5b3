"""Invariants of a finished run: plain functions over its run directory, each with a measured figure and a bound.

What: the package re-exports the public API (`InvariantResult`, `InvariantViolation`, `RunRecord`, `load_run`,
`final_loss`, every invariant function and `check_all`); diloco_chaos/harness/invariants/base.py has the result and run
records, diloco_chaos/harness/invariants/registry.py the typed `InvariantSpec` registry, and
diloco_chaos/harness/invariants/checks/ one
module per invariant, each registering itself. `diloco-chaos invariants` lists them, rendered from the registry by
``diloco_chaos.harness.invariants.doc``.

Why a registry: check_all, the pytest plugin's `ChaosRun.check` and the docs list the invariants from one
place, and a bound has one name, validated in one place.
"""

from __future__ import annotations

from typing import Any

from diloco_chaos.harness.invariants.base import InvariantResult, InvariantViolation, Run, RunRecord, _run, load_run
from diloco_chaos.harness.invariants.checks.apply_schedule import apply_schedule
from diloco_chaos.harness.invariants.checks.availability import availability
from diloco_chaos.harness.invariants.checks.converged import converged, final_loss
from diloco_chaos.harness.invariants.checks.faults_fired import faults_fired
from diloco_chaos.harness.invariants.checks.initial_pull import initial_pull
from diloco_chaos.harness.invariants.checks.learners_finite import learners_finite
from diloco_chaos.harness.invariants.checks.model_finite import model_finite
from diloco_chaos.harness.invariants.checks.no_global_downtime import alive_intervals, no_global_downtime
from diloco_chaos.harness.invariants.checks.outer_lr import outer_lr
from diloco_chaos.harness.invariants.checks.pushes_received import pushes_received
from diloco_chaos.harness.invariants.checks.rda_norms import rda_norms
from diloco_chaos.harness.invariants.checks.rejoined import rejoined
from diloco_chaos.harness.invariants.checks.token_accounting import token_accounting
from diloco_chaos.harness.invariants.checks.token_weights import expected_weights, token_weights
from diloco_chaos.harness.invariants.checks.updates_accounted import (
    Contribution,
    merged_contributions,
    updates_accounted,
)
from diloco_chaos.harness.invariants.registry import InvariantSpec, UnknownBound, discover, spec, specs, unknown_bound

__all__ = [
    "Contribution", "InvariantResult", "InvariantSpec", "InvariantViolation", "Run", "RunRecord", "UnknownBound",
    "alive_intervals", "apply_schedule", "availability", "check_all", "check_all_keywords", "converged",
    "discover", "expected_weights", "faults_fired", "final_loss", "initial_pull", "learners_finite", "load_run",
    "merged_contributions", "model_finite", "no_global_downtime", "outer_lr", "pushes_received", "rda_norms",
    "rejoined", "spec", "specs", "token_accounting", "token_weights", "updates_accounted",
]


def check_all_keywords() -> dict[str, tuple[str, str]]:
    """check_all's keywords -> (invariant, bound name): every bound of a "when_bound" invariant, by its name."""
    return {b.name: (s.name, b.name) for s in discover().values() if s.mode == "when_bound" for b in s.bounds}


def check_all(run: Run, **bounds: Any) -> list[InvariantResult]:
    """Every registered invariant that applies to the run's algorithm, in registry order: the "always" ones on
    their defaults (faults_fired, updates_accounted, token_accounting, model_finite, learners_finite and, for a
    decoupled run, the protocol invariants), and each "when_bound" one whose triggering bound is given (converged:
    baseline_loss or max_loss; no_global_downtime: bound_s; availability: min_uptime; rejoined: within_s).
    Nothing raises on a violation; `[r.check() for r in results]` or filter on `ok`. A keyword that is no
    bound raises UnknownBound, an impossible value ValueError."""
    keys = check_all_keywords()
    given: dict[str, dict[str, Any]] = {}
    for key, value in bounds.items():
        if key not in keys:
            raise unknown_bound("check_all", key, keys, {b.renamed_from: b.name for s in discover().values()
                                                         for b in s.bounds if b.renamed_from})
        inv, name = keys[key]
        given.setdefault(inv, {})[name] = value
    registry = specs()
    for inv, args in given.items():
        registry[inv].resolve(args)  # validate every value before measuring anything
    r = _run(run)
    out = []
    for s in registry.values():
        if r.algorithm not in s.algorithms:
            continue
        args = {k: v for k, v in given.get(s.name, {}).items() if v is not None}
        if s.mode == "when_bound" and not any((b := s.bound(k)) is not None and b.triggers for k in args):
            continue
        out.append(s(r, **args))
    return out
