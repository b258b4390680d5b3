"""Built-in regression task: an MLP fits a fixed random teacher function of `inputs` variables (no download).

The teacher, y = sum_j a_j sin(w_j . x) + noise, is drawn from the seed; inputs are standard normal, drawn as a
pure function of (seed, split, learner, chip, step). The loss is the mean squared error; the metric `r2` is one
minus it over the targets' variance. A plain MLP: no embeddings, no buffers. Its output layer has no bias (the
targets have mean zero): RDA merges a one-element tensor as the participants' mean magnitude with the sign of
their weighted mean direction, so a scalar bias would be pushed a full step whichever way the learners lean.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diloco_chaos.trainers.task import Batch, Task, TaskContext


class RegressionMLP(Task):
    """Fit the teacher function; loss: MSE; metric: r2."""

    name = "regression_mlp"

    def __init__(self, ctx: TaskContext, inputs: int = 8, hidden: int = 32, noise: float = 0.05,
                 eval_samples: int = 512) -> None:
        if inputs < 1 or hidden < 1 or noise < 0 or eval_samples < 1:
            raise ValueError(f"need inputs >= 1, hidden >= 1, noise >= 0, eval_samples >= 1; got inputs={inputs}, "
                             f"hidden={hidden}, noise={noise}, eval_samples={eval_samples}")
        self.ctx, self.inputs, self.hidden, self.noise, self.eval_samples = ctx, inputs, hidden, noise, eval_samples
        gen = torch.Generator().manual_seed(hash((3, ctx.seed)) & 0x7FFF_FFFF_FFFF)
        self.w = torch.randn(inputs, 4, generator=gen) / inputs ** 0.5
        self.a = torch.randn(4, generator=gen)

    def _draw(self, key: tuple, n: int) -> Batch:
        gen = torch.Generator().manual_seed(hash(key) & 0x7FFF_FFFF_FFFF)
        x = torch.randn(n, self.inputs, generator=gen)
        y = torch.sin(x @ self.w) @ self.a + self.noise * torch.randn(n, generator=gen)
        return x, y.unsqueeze(1)

    def build_model(self, seed: int) -> nn.Module:
        state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            return nn.Sequential(nn.Linear(self.inputs, self.hidden), nn.GELU(),
                                 nn.Linear(self.hidden, self.hidden), nn.GELU(), nn.Linear(self.hidden, 1, bias=False))
        finally:
            torch.random.set_rng_state(state)

    def train_batch(self, learner: int, chip: int, step: int) -> Batch:
        return self._draw((1, self.ctx.seed, learner, chip, step), self.ctx.batch_size)

    def eval_batches(self, max_batches: int) -> list[Batch]:
        x, y = self._draw((2, self.ctx.seed), self.eval_samples)
        return [(x[i:i + 128], y[i:i + 128]) for i in range(0, len(x), 128)][:max_batches]

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        return F.mse_loss(model(batch[0]), batch[1])

    def metrics(self, model: nn.Module, batch: Batch) -> dict[str, float]:
        y = batch[1]
        var = float(y.var()) or 1.0
        return {"r2": 1.0 - float(F.mse_loss(model(batch[0]), y)) / var}


def regression_mlp(ctx: TaskContext, inputs: int = 8, hidden: int = 32, noise: float = 0.05,
                   eval_samples: int = 512) -> RegressionMLP:
    """Factory: `inputs` variables, `hidden` units per layer, target `noise` sd, `eval_samples` held out."""
    return RegressionMLP(ctx, inputs, hidden, noise, eval_samples)
