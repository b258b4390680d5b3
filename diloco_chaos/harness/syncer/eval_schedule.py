"""When the syncer evaluates the global model: a pure decision over the run's progress and an injected clock.

A wall-clock period alone gives a short run a handful of curve points and a long run hundreds. The schedule
spreads `eval.points` evaluations over the run's planned training (each algorithm's handler says what share is
done: tokens merged for the synchronous ones, learner-steps reported for Decoupled DiLoCo), so every run's curve
has about that many points whatever its length, at points of training that do not depend on the machine's
speed; `eval.every_s` bounds the wall gap between two evaluations while training stalls (a syncer outage).
On a machine with few cores the evaluations compete with the chips for CPU, so a progress milestone is held
back while the evaluations would take more than `eval.max_share` of a core (the last one's CPU time over the
gap since it started): a very short run gets fewer points rather than a slower run.
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
    max_share: float = 1.0
    """Largest share of a core the progress-triggered evals may take."""
    next_progress: float = 0.0
    next_time: float = 0.0
    last_at: float = 0.0
    """When the last eval was taken."""
    cost_s: float = 0.0
    """CPU seconds of the last eval (`cost`)."""

    @classmethod
    def start(cls, planned: float, points: int, every_s: float, now: float, max_share: float = 1.0) -> EvalSchedule:
        """The schedule after the initial eval, taken at `now` with nothing merged."""
        stride = planned / points if points > 0 and planned > 0 else 0.0
        return cls(stride=stride, every_s=every_s, max_share=max_share, next_progress=stride,
                   next_time=now + every_s, last_at=now)

    def due(self, now: float, progress: float) -> EvalTrigger | None:
        """'progress' once the progress (a share of the planned run, or any measure of it) passes the next
        milestone and the evals stay within `max_share` of a core; 'time' once the wall gap is used up."""
        if self.stride > 0 and progress >= self.next_progress and now - self.last_at >= self.cost_s / self.max_share:
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
        self.last_at = now

    def cost(self, cpu_s: float) -> None:
        """The last eval took `cpu_s` of CPU: the next milestone waits until that is `max_share` of the gap."""
        self.cost_s = cpu_s
