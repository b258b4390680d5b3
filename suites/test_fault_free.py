"""Fault-free reference runs of the built-in default scenario (M=4 learners x C=2 chips).

These are the baselines the chaos suites compare against: each algorithm must
converge from chance (ln 256 = 5.55 nats/byte) to well under 3.0 with every
chip a real process in its own learner's Gloo group. Only the public API is
used: `harness.scenario.builtin` and `harness.supervisor.run_scenario`.
"""

from __future__ import annotations

import pytest

from harness.hygiene import leftovers
from harness.scenario import builtin
from harness.supervisor import run_scenario

CONVERGED_BELOW = 3.0  # nats per byte; chance is 5.55, a unigram model ~3.1


@pytest.mark.parametrize("algorithm", ["decoupled", "diloco", "ddp"])
def test_default_scenario_converges(tmp_path, algorithm):
    sc = builtin("default").replace(algorithm=algorithm)
    res = run_scenario(sc, tmp_path)
    rep = res.report
    print(f"{algorithm}: eval {rep['initial_eval_loss']} -> {rep['final_eval_loss']}, "
          f"tokens merged {rep['tokens_merged']}, wall {rep['wall_s']} s, longest gap {rep['longest_gap_s']} s")
    assert len(rep["chip_pids"]) == 8, rep["chip_pids"]
    assert len(rep["gloo_groups"]) == 4, rep["gloo_groups"]
    assert all(d["steps"] == sc.train.steps for d in rep["per_learner"].values())
    assert rep["initial_eval_loss"] > 5.4
    assert rep["final_eval_loss"] < CONVERGED_BELOW, f"final eval loss {rep['final_eval_loss']} >= {CONVERGED_BELOW}"
    assert rep["global_model_finite"] is True
    assert rep["errors"] == []
    assert leftovers(res) == {"processes": [], "ports": []}
