"""What the torchft suites (suites/test_torchft.py, test_torchft_netns.py, test_torchft_rollback.py) read from a
run's events: a replica group's committed syncs and the survivors' longest stall. Plain functions of the event
list (`ChaosRun.events`, also of a failed run)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def committed(events: Sequence[dict[str, Any]], learner: int) -> list[dict[str, Any]]:
    """Group `learner`'s committed torchft syncs, in time order."""
    return [e for e in events if e["ev"] == "torchft_sync" and e["learner"] == learner and e["committed"]]


def longest_stall(events: Sequence[dict[str, Any]], learners: Sequence[int], t0: float, t1: float) -> float:
    """The longest time between two consecutive committed steps of any of `learners` that overlaps [t0, t1]."""
    worst = 0.0
    for m in learners:
        ts = [e["t"] for e in events if e["ev"] == "step" and e["learner"] == m]
        worst = max([worst, *[b - a for a, b in zip(ts, ts[1:], strict=False) if b >= t0 and a <= t1]])
    return worst
