"""A task whose training turns NaN on one learner after a given step: the regression MLP
(diloco_chaos/trainers/tasks/regression_mlp.py) whose training inputs are NaN for `learner` from step `after` + 1 on, so
that learner's loss, gradients and parameters go non-finite while the others (and every eval batch) stay clean.

The tests name it as `[task] factory = "nan_task:nan_after"` (tests/invariants/test_learners_finite.py).
"""

from __future__ import annotations

import torch

from diloco_chaos.trainers.task import Batch, TaskContext
from diloco_chaos.trainers.tasks.regression_mlp import RegressionMLP


class NanAfter(RegressionMLP):
    """RegressionMLP, with learner `bad`'s training batches NaN after step `after`."""

    name = "nan_after"

    def __init__(self, ctx: TaskContext, bad: int, after: int, hidden: int) -> None:
        super().__init__(ctx, 8, hidden, 0.05, 512)
        self.bad, self.after = bad, after

    def train_batch(self, learner: int, chip: int, step: int) -> Batch:
        x, y = super().train_batch(learner, chip, step)
        if learner == self.bad and step > self.after:
            x = torch.full_like(x, float("nan"))
        return x, y


def nan_after(ctx: TaskContext, learner: int = 1, after: int = 100, hidden: int = 16) -> NanAfter:
    """Factory: learner `learner` trains on NaN inputs from step `after` + 1."""
    return NanAfter(ctx, learner, after, hidden)
