"""Shared helpers for the harness's own tests."""

from __future__ import annotations

from typing import Any

import pytest

from harness.scenario import Scenario, from_dict


def tiny_table(algorithm: str = "decoupled", learners: int = 2, chips: int = 2, steps: int = 60,
               **extra: Any) -> dict[str, Any]:
    """A scenario table small enough for a 2-core machine: a few seconds of training."""
    table: dict[str, Any] = {
        "name": f"tiny-{algorithm}",
        "seed": 1,
        "algorithm": algorithm,
        "topology": {"learners": learners, "chips_per_learner": chips},
        "train": {"steps": steps, "warmup_steps": 10, "lr": 3e-3},
        "diloco": {"fragments": 4, "sync_every": 4, "overlap": 1},
        "eval": {"every_s": 1.0, "batches": 2},
        "timeouts": {"run_s": 240.0},
    }
    for key, value in extra.items():
        table.setdefault(key, {}).update(value) if isinstance(value, dict) else table.__setitem__(key, value)
    return table


def tiny(algorithm: str = "decoupled", **kw: Any) -> Scenario:
    return from_dict(tiny_table(algorithm, **kw))


@pytest.fixture
def runs_dir(tmp_path):
    return tmp_path / "runs"
