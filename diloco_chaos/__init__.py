"""diloco-chaos's public Python API: one import to build a scenario, run it, read its results and check its
invariants, and to bring your own model, data and loss (a `Task`). docs/api.md documents every name.

    import diloco_chaos as dc

    sc = dc.scenario(task={"factory": "my_task:build", "args": {"width": 8}}, topology={"learners": 2})
    run = dc.run(sc, runs_dir="runs")          # real processes; returns when every one has exited
    print(run.report["final_eval_loss"], run.report["final_eval_metrics"])
    run.check_all(max_loss=0.5)                 # every invariant that applies; AssertionError naming figures

Why a package of its own: diloco_chaos/harness/, diloco_chaos/trainers/ and diloco_chaos/chaos/ are the implementation,
laid out by job; a user's code should not have to know which of their modules holds what it needs, nor break when they
move. Everything here is re-exported, so `from diloco_chaos import X` stays the stable path.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diloco_chaos.harness.chaos_run import INVARIANTS, ChaosRun
    from diloco_chaos.harness.config.scenario import Scenario, builtin, builtin_names, from_dict, load
    from diloco_chaos.harness.config.sections import ScenarioError
    from diloco_chaos.harness.config.task_check import MemoryEstimate, check_memory, memory_estimate, scenario_task
    from diloco_chaos.harness.invariants import (
        InvariantResult,
        InvariantViolation,
        RunRecord,
        check_all,
        final_loss,
        load_run,
    )
    from diloco_chaos.harness.invariants import spec as invariant
    from diloco_chaos.harness.record import read_records
    from diloco_chaos.harness.report.results import ResultsFile, RunRow, read_results, run_row, write_results
    from diloco_chaos.harness.run.supervisor import RunFailed, RunResult
    from diloco_chaos.trainers.task import BUILTIN_TASKS, Batch, Task, TaskConfig, TaskContext, TaskError, load_task

_LAZY: dict[str, tuple[str, str]] = {
    **{n: ("diloco_chaos.harness.chaos_run", n) for n in ("INVARIANTS", "ChaosRun")},
    **{n: ("diloco_chaos.harness.invariants", n) for n in ("InvariantResult", "InvariantViolation", "RunRecord",
                                                           "check_all", "final_loss", "load_run")},
    "invariant": ("diloco_chaos.harness.invariants", "spec"),
    "read_records": ("diloco_chaos.harness.record", "read_records"),
    **{n: ("diloco_chaos.harness.report.results", n) for n in ("ResultsFile", "RunRow", "read_results", "run_row",
                                                        "write_results")},
    "ScenarioError": ("diloco_chaos.harness.config.sections", "ScenarioError"),
    **{n: ("diloco_chaos.harness.config.scenario", n) for n in ("Scenario", "builtin", "builtin_names",
                                                         "from_dict", "load")},
    **{n: ("diloco_chaos.harness.run.supervisor", n) for n in ("RunFailed", "RunResult", "Supervisor")},
    **{n: ("diloco_chaos.harness.config.task_check", n) for n in ("MemoryEstimate", "check_memory", "memory_estimate",
                                                           "scenario_task")},
    **{n: ("diloco_chaos.trainers.task", n) for n in ("BUILTIN_TASKS", "Batch", "Task", "TaskConfig", "TaskContext",
                                                      "TaskError", "load_task")},
}
"""Public name -> (module, attribute), imported on first access."""

__all__ = [
    "BUILTIN_TASKS", "INVARIANTS", "Batch", "ChaosRun", "InvariantResult", "InvariantViolation", "MemoryEstimate",
    "ResultsFile", "RunFailed", "RunRecord", "RunResult", "RunRow", "Scenario", "ScenarioError", "Task",
    "TaskConfig", "TaskContext", "TaskError", "builtin", "builtin_names", "check_all", "check_memory",
    "final_loss", "from_dict", "invariant", "load", "load_run", "load_task", "memory_estimate", "read_records",
    "read_results", "run", "run_row", "scenario", "scenario_task", "write_results",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'diloco_chaos' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


def scenario(table: Mapping[str, Any] | None = None, /, **tables: Any) -> Scenario:
    """A validated Scenario from TOML-shaped tables (`table` and/or keyword tables, the keywords winning):
    `scenario(algorithm="ddp", topology={"learners": 2})`. ScenarioError lists every bad key."""
    from diloco_chaos.harness.config.scenario import from_dict

    return from_dict({**(table or {}), **tables})


def run(sc: Scenario | Mapping[str, Any] | str | os.PathLike[str], runs_dir: str | os.PathLike[str] = "runs",
        ) -> ChaosRun:
    """Run a scenario (a Scenario, tables, a .toml path or a built-in name) on real processes, in a new directory
    under `runs_dir`; returns its `ChaosRun` (report, events, invariants). Raises ScenarioError before anything
    starts when the scenario is invalid or cannot fit in memory, RunFailed when the run does not complete. Call
    it under `if __name__ == "__main__":` in a script (multiprocessing)."""
    from diloco_chaos.harness.chaos_run import ChaosRun
    from diloco_chaos.harness.config.scenario import Scenario, builtin, from_dict, load
    from diloco_chaos.harness.targets.base import supervisor_for

    if isinstance(sc, Mapping):
        sc = from_dict(dict(sc))
    elif not isinstance(sc, Scenario):
        sc = load(sc) if str(sc).endswith(".toml") or Path(sc).is_file() else builtin(str(sc))
    sup = supervisor_for(sc, runs_dir)
    out = ChaosRun(sup.sc, sup.run_dir)
    try:
        result = sup.run()
    finally:
        out.pids = [p.pid for p in [*sup.procs.values(), *sup.retired]]
    out.__dict__["report"] = result.report
    return out
