"""The syncer's evaluator thread: held-out loss of snapshots of the global model, off the merge path.

The main loop hands it a snapshot (version, tokens merged, a copy of the parameters) when harness/eval_schedule.py
says one is due;
a one-slot queue keeps only one waiting, so a slow eval never queues work behind it nor blocks the loop.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Mapping

import torch

from harness.events import EventLog
from harness.scenario import Scenario
from trainers.data import eval_batches, make_splits
from trainers.model import build_model

EVAL_SEQS = 16


def evaluate(model: torch.nn.Module, params: Mapping[str, torch.Tensor], batches: list) -> float:
    """Mean held-out loss of `params` loaded into `model` (a scratch copy)."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(params[n])
        losses = [float(model.loss(x, y)) for x, y in batches]  # type: ignore[operator]
    return sum(losses) / len(losses)


class Evaluator:
    """A thread logging a periodic `eval` event for each snapshot it is given."""

    def __init__(self, sc: Scenario, events: EventLog) -> None:
        self.events = events
        self._q: queue.Queue = queue.Queue(maxsize=1)
        splits = make_splits(sc.data, sc.topology.learners)
        self._batches = eval_batches(splits.holdout, sc.model.seq_len, EVAL_SEQS, sc.eval.batches)
        self._model = build_model(sc.model, sc.seed)
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
            loss = evaluate(self._model, params, self._batches)
            self.last_cpu_s = time.thread_time() - cpu0
            self.events.log("eval", version=version, tokens_merged=tokens, loss=loss, kind="periodic",
                            trigger=trigger, cpu_s=round(self.last_cpu_s, 4))

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
