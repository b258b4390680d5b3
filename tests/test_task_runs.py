"""Each built-in task runs the default scenario's shape (4 learners x 2 chips) under ddp, diloco and decoupled,
on real processes, with every invariant that applies checked.

Few steps each (the runs are about process start-up and the task plumbing, not convergence), so the nine runs
stay within the suite's budget; the example project (examples/own-model) checks convergence under faults.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

SHAPE: dict[str, Any] = {
    "topology": {"learners": 4, "chips_per_learner": 2},
    "train": {"steps": 16, "warmup_steps": 2, "lr": 1e-2},
    "diloco": {"fragments": 4, "sync_every": 4, "overlap": 1},
    "eval": {"points": 4},
}
TASKS: dict[str, dict[str, Any]] = {
    "byte_lm": {"model": {"seq_len": 16, "d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32},
                "data": {"holdout_fraction": 0.02}},
    "image_cnn": {"task": {"factory": "image_cnn", "args": {"size": 10, "width": 4}}},
    "regression_mlp": {"task": {"factory": "regression_mlp", "args": {"hidden": 16}}},
}


@pytest.mark.parametrize("algorithm", ["ddp", "diloco", "decoupled"])
@pytest.mark.parametrize("task", sorted(TASKS))
def test_each_builtin_task_runs_under_each_algorithm(run_scenario: Any, task: str, algorithm: str) -> None:
    run = run_scenario({**SHAPE, **TASKS[task], "algorithm": algorithm, "name": f"{task}-{algorithm}"})
    rep = run.report
    run.figures(initial=rep["initial_eval_loss"], final=rep["final_eval_loss"], merges=rep["merge_count"],
                metrics=rep["final_eval_metrics"], wall_s=rep["wall_s"])
    assert math.isfinite(rep["final_eval_loss"]) and rep["final_eval_loss"] < rep["initial_eval_loss"]
    assert rep["global_model_finite"] and rep["unexpected_errors"] == 0
    run.check_all()
