"""Tests for diloco_chaos.harness.report.tolerance: the one rule every suite's convergence bound is derived with."""

from __future__ import annotations

import math

import pytest

from diloco_chaos.harness.report.tolerance import K_SIGMA, SEED_SD, Reference, loss_tolerance


def test_tolerance_is_the_allowed_cost_plus_k_sigma_of_a_two_run_difference() -> None:
    assert loss_tolerance(0.0) == 0.0
    assert loss_tolerance(0.05) == pytest.approx(K_SIGMA * math.sqrt(2) * 0.05)
    assert loss_tolerance(0.05, cost=0.1) == pytest.approx(0.1 + 3 * math.sqrt(2) * 0.05)
    assert loss_tolerance(0.05, k=2.0) < loss_tolerance(0.05)


@pytest.mark.parametrize("kw", [{"sd": -0.1}, {"sd": 0.1, "cost": -0.01}, {"sd": 0.1, "k": -1.0}])
def test_negative_inputs_are_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="loss_tolerance"):
        loss_tolerance(**kw)


def test_a_reference_gives_the_twin_tolerance_and_the_absolute_bound() -> None:
    ref = Reference("r", mean=2.3, sd=0.02, cost=0.1)
    assert ref.tolerance() == pytest.approx(0.1 + 3 * math.sqrt(2) * 0.02)
    assert ref.bound() == pytest.approx(2.3 + ref.tolerance())
    assert Reference("r", mean=2.0, sd=SEED_SD).bound() == pytest.approx(2.0 + 3 * math.sqrt(2) * SEED_SD)
    with pytest.raises(ValueError, match="loss_tolerance"):
        Reference("r", mean=2.0, sd=-0.01).bound()
