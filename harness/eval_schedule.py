"""When the syncer evaluates the global model: a pure decision over the run's progress and an injected clock.

A wall-clock period alone gives a short run a handful of curve points and a long run hundreds. The schedule
spreads `eval.points` evaluations over the run's planned training (each algorithm's handler says what share is
done: tokens merged for the synchronous ones, learner-steps reported for Decoupled DiLoCo), so every run's curve
has about that many points whatever its length, at points of training that do not depend on the machine's
speed; `eval.every_s` bounds the wall gap between two evaluations while training stalls (a syncer outage).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EvalTrigger = Literal["progress", "time"]


def planned_tokens(learners: int, chips_per_learner: int, steps: int, batch_size: int, seq_len: int) -> int:
    """Tokens the run trains if no chip is lost: every chip's every step, batch_size windows of seq_len."""
    return learners * chips_per_learner * steps * batch_size * seq_len


@dataclass
class EvalSchedule:
    """Next token milestone and next wall deadline; `due` says whether and why an eval is due now."""

    stride: float
    """Progress between two progress-triggered evals (planned / points); 0: progress triggers none."""
    every_s: float
    """Longest wall gap between two evals."""
    next_progress: float = 0.0
    next_time: float = 0.0

    @classmethod
    def start(cls, planned: float, points: int, every_s: float, now: float) -> EvalSchedule:
        """The schedule after the initial eval, taken at `now` with nothing merged."""
        stride = planned / points if points > 0 and planned > 0 else 0.0
        return cls(stride=stride, every_s=every_s, next_progress=stride, next_time=now + every_s)

    def due(self, now: float, progress: float) -> EvalTrigger | None:
        """'progress' once the progress (a share of the planned run, or any measure of it) passes the next
        milestone; 'time' once the wall gap is used up."""
        if self.stride > 0 and progress >= self.next_progress:
            return "progress"
        if now >= self.next_time:
            return "time"
        return None

    def taken(self, now: float, progress: float) -> None:
        """Record an eval at (now, progress): the next milestone is the first one above it."""
        if self.stride > 0:
            while self.next_progress <= progress:
                self.next_progress += self.stride
        self.next_time = now + self.every_s
