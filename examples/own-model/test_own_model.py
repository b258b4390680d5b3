"""The user project's chaos test: its own task converges under a chip loss and a degraded link.

`run_scenario` is a fixture of the diloco-chaos pytest plugin (active wherever diloco-chaos is installed): it
runs the scenario on real processes in a directory under the test's tmp_path, and fails the test if any
process or port of the run outlives it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import diloco_chaos as dc

HERE = Path(__file__).parent
MIN_ACCURACY = 0.85
"""Held-out accuracy the merged model must reach (chance: 1/3; 0.941-0.973 measured in six runs of the scenario)."""
MAX_LOSS = 0.45
"""Held-out cross-entropy bound, nats (chance: ln 3 = 1.10; 0.087-0.206 measured in the same runs)."""


def test_task_contract() -> None:
    """The task builds the same model from the same seed and the same batch for the same (learner, chip, step)."""
    sc = dc.load(HERE / "scenario.toml")
    task = dc.scenario_task(sc)
    a, b = task.build_model(3), task.build_model(3)
    assert all((p == q).all() for p, q in zip(a.parameters(), b.parameters(), strict=True))
    x1, y1 = task.train_batch(1, 0, 7)
    x2, y2 = task.train_batch(1, 0, 7)
    assert (x1 == x2).all() and (y1 == y2).all()
    assert not (task.train_batch(0, 0, 7)[0] == x1).all()  # learners' shards differ


@pytest.mark.failure
@pytest.mark.link
def test_converges_under_chip_loss_and_degraded_link(run_scenario) -> None:
    run = run_scenario(HERE / "scenario.toml")
    rep = run.report
    accuracy = rep["final_eval_metrics"]["accuracy"]
    run.figures(final_eval_loss=rep["final_eval_loss"], accuracy=accuracy, merges=rep["merge_count"])
    run.check_all(max_loss=MAX_LOSS)  # every invariant that applies, plus the loss bound
    run.check("faults_fired")
    assert accuracy >= MIN_ACCURACY, f"held-out accuracy {accuracy:.3f} < {MIN_ACCURACY}"
