"""The explore loop's pool with an injected runner (no processes): whatever `--jobs` is, and in whatever order the
runs finish, `--runs N` runs the same schedules with the same outcomes, shrinking starts from the same failing
schedule (the lowest index failing each invariant) and ends at the same minimal schedule. The runner stands in for
`diloco-chaos run`, which the explore suite runs for real (suites/test_explore.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from diloco_chaos.harness.config import scenario as scenario_mod
from diloco_chaos.harness.explore.generate import vocabulary
from diloco_chaos.harness.explore.records import Base, RunLine, Trial
from diloco_chaos.harness.explore.session import Explorer, Options

RUNS = 8
LINK = {"degrade", "partition", "flap", "reset_peer", "slice", "limit_data", "corrupt"}
SETS = ("faults=[]", "explore.shrink_runs=6", "explore.confirm_runs=2", "explore.confirm_must_fail=2")


class OutOfOrder:
    """A runner whose explored schedule i (even) finishes only after schedule i + 1 has started, when more than
    one run may be in flight: with jobs >= 2 the runs finish out of order. A run fails `work_kept` when its
    schedule holds a link fault, a property of the schedule alone, so every session judges schedule i alike."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.started = {i: threading.Event() for i in range(RUNS + 1)}
        self.finished: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, base: Base, trial: Trial, default_learners: int, folder: Path, *a: Any, index: int,
                 seed: int, phase: str = "explore", shrinking: str = "") -> RunLine:
        if phase == "explore":
            self.started[index].set()
            if self.jobs > 1 and index % 2 == 0 and index + 1 < RUNS:
                assert self.started[index + 1].wait(10), f"schedule {index + 1} never started beside {index}"
            with self.lock:
                self.finished.append(index)
        failed = ("work_kept",) if any(f.action in LINK for f in trial.faults) else ()
        return RunLine(index, phase, seed, "failed" if failed else "passed", failed,  # type: ignore[arg-type]
                       tuple(trial.tables()), trial.steps, trial.learners)


def session(jobs: int, out: Path) -> tuple[Explorer, OutOfOrder, list[str]]:
    sc = scenario_mod.builtin("default", list(SETS))
    said: list[str] = []
    runner = OutOfOrder(jobs)
    ex = Explorer(Base(None, "default", SETS), sc, vocabulary(sc), Options(1e9, RUNS, 0, jobs, out), said.append,
                  runner=runner)
    return ex, runner, said


def outcome(jobs: int, out: Path) -> tuple[list[tuple[int, str, tuple[dict[str, Any], ...]]], list[str], list[str],
                                           OutOfOrder]:
    ex, runner, said = session(jobs, out)
    summary = ex.run()
    explored = sorted((x for x in ex.lines if x.phase == "explore"), key=lambda x: x.index)
    starts = [s for s in said if s.startswith("explore: shrinking the failure of")]
    return ([(x.index, x.outcome, x.faults) for x in explored], starts,
            [m.trial.key() for m in summary.minimal], runner)


@pytest.mark.parametrize("jobs", [2, 3])
def test_the_runs_the_shrink_start_and_the_minimal_schedule_do_not_depend_on_jobs(jobs: int, tmp_path: Path) -> None:
    one, one_starts, one_minimal, _ = outcome(1, tmp_path / "one")
    assert [i for i, _, _ in one] == list(range(RUNS))
    assert any(o == "failed" for _, o, _ in one) and any(o == "passed" for _, o, _ in one), one  # both kinds
    assert len(one_starts) == 1 and one_minimal

    many, starts, minimal, runner = outcome(jobs, tmp_path / "many")
    assert runner.finished != sorted(runner.finished), runner.finished  # they did finish out of order
    assert many == one and starts == one_starts and minimal == one_minimal
