"""A chaos suite of your own: docs/api.md, "Writing a suite", shows this file whole (tests/package/test_api_doc.py keeps
the two equal) and `python -m pytest` runs it with the harness's tests (pyproject testpaths)."""

from __future__ import annotations

import pytest

import diloco_chaos as dc

PARTITION = {"action": "partition", "learner": 1, "at": {"step": 15, "learner": 0},
             "until": {"step": 35, "learner": 0}}
"""Learner 1's link cut from learner 0's step 15 to its step 35 (progress triggers: the same on any machine)."""
TOLERANCE = 0.5
"""Nats the partitioned run's final eval loss may exceed the fault-free one's: loose, for an example; derive
your own from the run-to-run spread you measure (docs/metrics.md)."""


def scenario(**tables: object) -> dc.Scenario:
    """2 learners x 1 chip, 60 steps of the default byte LM: a few seconds on two cores."""
    return dc.scenario({"name": "suite-example", "seed": 1, "algorithm": "decoupled",
                        "topology": {"learners": 2, "chips_per_learner": 1},
                        "train": {"steps": 60, "warmup_steps": 10},
                        "diloco": {"fragments": 4, "sync_every": 4, "overlap": 1},
                        "eval": {"every_s": 1.0, "batches": 2}}, **tables)


def test_the_task_gives_each_chip_the_same_batch_every_time() -> None:
    task = dc.scenario_task(scenario())  # the scenario's [task], built as every process builds it
    (x1, _), (x2, _) = task.train_batch(1, 0, 7), task.train_batch(1, 0, 7)
    assert (x1 == x2).all()


@pytest.mark.link
def test_training_goes_on_through_a_partition(cluster, run_scenario) -> None:
    baseline = cluster(scenario(), name="fault-free")  # runs once per module; other tests get the same run
    run = run_scenario(scenario(faults=[PARTITION]), name="partition")
    (start,) = run.of("fault_start")  # events as dicts, in time order (docs/events.md)
    (end,) = run.of("fault_end")
    merged = [e for e in run.of("merge") if start["t"] <= e["t"] <= end["t"]]
    run.figures(final_eval_loss=run.report["final_eval_loss"], merges_while_cut=len(merged))
    assert merged, "learner 0 alone kept the global model moving while learner 1 was cut off"
    run.check("faults_fired")  # one invariant by name: raises naming its figure and bound
    run.check_all(baseline_loss=baseline, tolerance=TOLERANCE)  # every invariant that applies, plus converged
    uptime = run.measure("availability", min_uptime=0.9)  # the result, without raising
    assert uptime.figure >= 0.9, uptime
