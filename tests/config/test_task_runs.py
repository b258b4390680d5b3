"""Each built-in task runs the default scenario's shape (4 learners x 2 chips) under ddp, diloco and decoupled,
on real processes, with every invariant that applies checked.

Few steps each (the runs are about process start-up and the task plumbing, not convergence), so the nine runs
stay within the suite's budget; the example project (examples/own-model) checks convergence under faults. A
decoupled run's merges depend on its learners' timing, so only the synchronous runs, which repeat exactly, must
end below their initial loss (regression_mlp under decoupled has ended above it: docs/api.md).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

SHAPE: dict[str, Any] = {
    "topology": {"learners": 4, "chips_per_learner": 2},
    "train": {"steps": 16, "warmup_steps": 2, "lr": 5e-3},
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
    assert math.isfinite(rep["final_eval_loss"])
    if algorithm != "decoupled":  # the synchronous runs repeat exactly: they must have learned something
        assert rep["final_eval_loss"] < rep["initial_eval_loss"]
    assert rep["global_model_finite"] and rep["unexpected_errors"] == 0
    run.check_all()


def test_children_import_a_task_module_the_forkserver_never_saw(run_scenario: Any, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The forkserver is already running (its sys.path fixed) when the task's module first appears, in a
    directory that is only the working directory: the run's processes import it from the recorded task.path."""
    from diloco_chaos.harness.run.forkserver import context

    p = context().Process(target=time.sleep, args=(0,))  # starts the forkserver now, if it was not yet
    p.start()
    p.join(timeout=60)
    project = tmp_path / "project"
    project.mkdir()
    (project / "late_task_mod.py").write_text(
        "from diloco_chaos.trainers.tasks.regression_mlp import regression_mlp as make\n",
                                              encoding="utf-8")
    monkeypatch.chdir(project)
    run = run_scenario({"name": "late-module", "task": {"factory": "late_task_mod:make", "args": {"hidden": 8}},
                        "topology": {"learners": 2, "chips_per_learner": 1}, "train": {"steps": 20},
                        "diloco": {"fragments": 2, "sync_every": 2, "overlap": 1}, "eval": {"points": 2}})
    assert json.loads((run.run_dir / "config.json").read_text())["task"]["path"] == str(project)
    assert math.isfinite(run.report["final_eval_loss"]) and not run.report["unexpected_errors"]
    run.check_all()
