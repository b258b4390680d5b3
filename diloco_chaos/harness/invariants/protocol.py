"""Decoupled DiLoCo's protocol invariants, kept importable here: they live in
diloco_chaos/harness/invariants/checks/, one module each (rda_norms, outer_lr, token_weights, pushes_received,
apply_schedule, initial_pull), registered with requires="fragmented" (the per-fragment protocol: decoupled's).
docs/sensitivity.md and README point here; this module re-exports them.
"""

from __future__ import annotations

from collections.abc import Callable

from diloco_chaos.harness.invariants import (
    InvariantResult,
    Run,
    _run,
    apply_schedule,
    expected_weights,
    initial_pull,
    outer_lr,
    pushes_received,
    rda_norms,
    specs,
    token_weights,
)

__all__ = ["PROTOCOL_INVARIANTS", "apply_schedule", "check_protocol", "expected_weights", "initial_pull",
           "outer_lr", "pushes_received", "rda_norms", "token_weights"]

PROTOCOL_INVARIANTS: dict[str, Callable[..., InvariantResult]] = {
    s.name: s.fn for s in specs().values() if s.requires == "fragmented"}
"""Name -> invariant, every one bound-free (defaults only): the registry's invariants of the per-fragment
protocol (decoupled's)."""


def check_protocol(run: Run) -> list[InvariantResult]:
    """Every protocol invariant with its default bounds, for a run of a fragmented algorithm (decoupled); [] for
    the others (the baselines)."""
    r = _run(run)
    if not r.descriptor.fragmented:
        return []
    return [f(r) for f in PROTOCOL_INVARIANTS.values()]
