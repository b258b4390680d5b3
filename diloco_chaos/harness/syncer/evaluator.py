"""The syncer's evaluator thread: held-out loss of snapshots of the global model, off the merge path.

The main loop hands it a snapshot (version, tokens merged, a copy of the parameters) when
diloco_chaos/harness/syncer/eval_schedule.py
says one is due;
a one-slot queue keeps only one waiting, so a slow eval never queues work behind it nor blocks the loop.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Mapping

import torch

from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.config.task_check import scenario_task
from diloco_chaos.harness.record.events import EventLog
from diloco_chaos.harness.record.syncer import Eval
from diloco_chaos.trainers.task import (
    Batch,
    Task,
    has_running_stats,
    load_params,
    recalibrate_buffers,
    recalibration_batches,
)
from diloco_chaos.trainers.task import evaluate as task_evaluate


def evaluate(task: Task, model: torch.nn.Module, params: Mapping[str, torch.Tensor], batches: list[Batch],
             calibration: list[Batch]) -> tuple[float, dict[str, float]]:
    """Mean held-out loss (and the task's metrics) of `params` loaded into `model` (a scratch copy), its
    running statistics re-estimated on `calibration` first."""
    load_params(model, params)
    recalibrate_buffers(task, model, calibration)
    return task_evaluate(task, model, batches)


class Evaluator:
    """A thread logging a periodic `eval` event for each snapshot it is given."""

    def __init__(self, sc: Scenario, events: EventLog) -> None:
        self.events = events
        self._q: queue.Queue = queue.Queue(maxsize=1)
        self._task = scenario_task(sc)
        self._batches = self._task.eval_batches(sc.eval.batches)
        self._model = self._task.build_model(sc.seed)
        self._calibration = (recalibration_batches(self._task, sc.topology.learners)
                             if has_running_stats(self._model) else [])
        self._thread = threading.Thread(target=self._run, name="eval", daemon=True)
        self.last_cpu_s = 0.0
        """CPU seconds of the last evaluation (read by the main loop; a float store is atomic)."""

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            version, tokens, params, trigger = item
            cpu0 = time.thread_time()
            loss, _ = evaluate(self._task, self._model, params, self._batches, self._calibration)
            self.last_cpu_s = time.thread_time() - cpu0
            self.events.write(Eval(version=version, tokens_merged=tokens, loss=loss, kind="periodic",
                                   trigger=trigger, cpu_s=round(self.last_cpu_s, 4)))

    def request(self, version: int, tokens_merged: float, params: Mapping[str, torch.Tensor],
                trigger: str = "time") -> None:
        """Evaluate a copy of `params` unless a snapshot is already waiting; `trigger` says why it was due."""
        snap = {n: t.detach().clone() for n, t in params.items()}
        try:
            self._q.put_nowait((version, tokens_merged, snap, trigger))
        except queue.Full:
            pass

    def stop(self, timeout: float) -> None:
        """Replace a pending snapshot by the stop marker (never block on a busy evaluator) and join it."""
        while True:
            try:
                self._q.put_nowait(None)
                break
            except queue.Full:
                try:
                    self._q.get_nowait()
                except queue.Empty:
                    pass
        self._thread.join(timeout=timeout)
