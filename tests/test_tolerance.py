"""Tests for harness.tolerance: the one rule every suite's convergence bound is derived with."""

from __future__ import annotations

import math

import pytest

from harness.tolerance import K_SIGMA, loss_tolerance


def test_tolerance_is_the_allowed_cost_plus_k_sigma_of_a_two_run_difference() -> None:
    assert loss_tolerance(0.0) == 0.0
    assert loss_tolerance(0.05) == pytest.approx(K_SIGMA * math.sqrt(2) * 0.05)
    assert loss_tolerance(0.05, cost=0.1) == pytest.approx(0.1 + 3 * math.sqrt(2) * 0.05)
    assert loss_tolerance(0.05, k=2.0) < loss_tolerance(0.05)


@pytest.mark.parametrize("kw", [{"sd": -0.1}, {"sd": 0.1, "cost": -0.01}, {"sd": 0.1, "k": -1.0}])
def test_negative_inputs_are_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="loss_tolerance"):
        loss_tolerance(**kw)
