"""The post-run phase: what the supervisor does after every process of a run stopped, in one place and one order.

Order, and why: (1) the sharded syncer's final checkpoints are assembled into global.pt; (2) the event log is
read once (`RunLog.load`); (3) the errors are labelled (`errors_labelled`) and (4) the final global model is
evaluated (`eval`, kind final), both written to the log; (5) `run_end` is written, the log's last line: after
it nothing appends to events.jsonl; (6) report.json is built and (7) the bound-free invariants are checked and
written to invariants.json, both from the log read in (2) plus the lines (3)-(5) wrote (`RunLog.extended`), so
the file is read once and every reader sees what a reader of the finished directory sees.

A run that raised never reaches this phase; the supervisor writes its `run_end` itself, so every run's log ends
with one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.config.task_check import scenario_task
from diloco_chaos.harness.record.events import EventLog
from diloco_chaos.harness.record.run import RunEnd
from diloco_chaos.harness.record.run_record import RunLog
from diloco_chaos.harness.record.syncer import Eval
from diloco_chaos.harness.run.rundir import CHECKPOINT_FILE, REPORT_FILE, FinishedRun, write_json
from diloco_chaos.trainers.task import (
    evaluate,
    has_running_stats,
    load_params,
    recalibrate_buffers,
    recalibration_batches,
)


def final_model(run_dir: str | os.PathLike[str], sc: Scenario) -> tuple[torch.nn.Module, dict[str, Any]] | None:
    """The run's model (its task's) with the final global checkpoint's parameters loaded and its running
    statistics (batch norm) re-estimated on training batches, and the checkpoint; None without a checkpoint."""
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.exists():
        return None
    state = torch.load(path, weights_only=True)
    task = scenario_task(sc)
    model = task.build_model(sc.seed)
    load_params(model, state["params"])
    if has_running_stats(model):
        recalibrate_buffers(task, model, recalibration_batches(task, sc.topology.learners))
    return model, state


def final_eval(run_dir: str | os.PathLike[str], sc: Scenario, events: EventLog) -> str | None:
    """Evaluate the final global checkpoint on the whole held-out split and write it as an `eval` event (kind
    final); returns the line written, None without a checkpoint."""
    loaded = final_model(run_dir, sc)
    if loaded is None:
        return None
    model, state = loaded
    task = scenario_task(sc)
    loss, metrics = evaluate(task, model, task.eval_batches(10**9))
    finite = all(bool(torch.isfinite(t).all()) for t in state["params"].values())
    return events.write_line(Eval(kind="final", loss=loss, version=state["merges"],
                                  tokens_merged=state["tokens_merged"], finite=finite,
                                  metrics={k: round(v, 5) for k, v in metrics.items()} if metrics else None))


def finish_run(run_dir: Path, sc: Scenario, events: EventLog, t0: float) -> FinishedRun:
    """The post-run phase (see the module docstring) of a run started at monotonic `t0` whose processes all stopped
    just now; returns the run as its readers see it, report included. `run_end` is written however this ends."""
    from diloco_chaos.harness.report.errors import label_errors
    from diloco_chaos.harness.report.results import record_invariants
    from diloco_chaos.harness.report.run_report import build_report
    from diloco_chaos.harness.syncer.shards import assemble_final

    stopped_t = time.monotonic()  # the run's own end: the post-run phase below is not part of it
    wall_s = stopped_t - t0
    written: list[str] = []
    try:
        assemble_final(str(run_dir), sc)  # sharded: global.pt from the shards' final checkpoints
        log = RunLog.load(run_dir)  # the one read of events.jsonl
        written.append(label_errors(log, sc, events))
        line = final_eval(run_dir, sc, events)
        if line is not None:
            written.append(line)
    finally:
        written.append(events.write_line(RunEnd(wall_s=wall_s, stopped_t=stopped_t)))
    run = FinishedRun.load(run_dir, log.extended(written))
    run = run.with_report(build_report(run))
    write_json(run_dir / REPORT_FILE, run.report)
    record_invariants(run)  # once, after report.json (some invariants read it)
    return run
