"""A user's own task for diloco-chaos: a tiny CNN that tells stripe patterns apart.

This module stands for your training setup. It knows nothing of processes, links or faults: it builds the
model from a seed, draws each batch as a pure function of (learner, chip, step), and computes the loss. The
scenario names it (`[task] factory = "shapes_task:stripes_cnn"`) and every learner, chip and the syncer import
it by that path.

The data: 10 x 10 one-channel images of horizontal stripes, vertical stripes or a checkerboard, at a random
phase and contrast under Gaussian noise; label = the pattern. The model has batch norm, so it also shows that
the harness re-estimates the running statistics of the merged model before it evaluates it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diloco_chaos import Batch, Task, TaskContext

SIZE = 10
CLASSES = 3


def draw(gen: torch.Generator, n: int, noise: float) -> Batch:
    """`n` images (n, 1, SIZE, SIZE) and their labels."""
    labels = torch.randint(0, CLASSES, (n,), generator=gen)
    phase = torch.randint(0, 2, (n, 1, 1), generator=gen)
    contrast = 0.5 + torch.rand(n, 1, 1, generator=gen)
    r = torch.arange(SIZE).view(1, SIZE, 1)
    c = torch.arange(SIZE).view(1, 1, SIZE)
    rows, cols = (r + phase) % 2, (c + phase) % 2
    pattern = torch.where(labels.view(n, 1, 1) == 0, rows.expand(n, SIZE, SIZE),
                          torch.where(labels.view(n, 1, 1) == 1, cols.expand(n, SIZE, SIZE), (rows + cols) % 2))
    img = contrast * (pattern.float() - 0.5) + noise * torch.randn(n, SIZE, SIZE, generator=gen)
    return img.unsqueeze(1), labels


class StripesCNN(Task):
    """Three-way stripe classification; loss: cross-entropy (ln 3 = 1.10 at chance); metric: accuracy."""

    name = "stripes_cnn"

    def __init__(self, ctx: TaskContext, width: int, noise: float) -> None:
        self.ctx, self.width, self.noise = ctx, width, noise

    def build_model(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(
            nn.Conv2d(1, self.width, 3, padding=1), nn.BatchNorm2d(self.width), nn.ReLU(),
            nn.Conv2d(self.width, self.width, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(self.width, CLASSES))

    def train_batch(self, learner: int, chip: int, step: int) -> Batch:
        # integers only: Python's hash of a str differs from process to process
        gen = torch.Generator().manual_seed(hash((1, self.ctx.seed, learner, chip, step)) & 0x7FFF_FFFF)
        return draw(gen, self.ctx.batch_size, self.noise)

    def eval_batches(self, max_batches: int) -> list[Batch]:
        gen = torch.Generator().manual_seed(hash((2, self.ctx.seed)) & 0x7FFF_FFFF)
        return [draw(gen, 64, self.noise) for _ in range(min(max_batches, 4))]

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        return F.cross_entropy(model(batch[0]), batch[1])

    def metrics(self, model: nn.Module, batch: Batch) -> dict[str, float]:
        return {"accuracy": float((model(batch[0]).argmax(dim=1) == batch[1]).float().mean())}


def stripes_cnn(ctx: TaskContext, width: int = 8, noise: float = 0.8) -> StripesCNN:
    """The factory the scenario names: called with the run's context and the scenario's [task.args]."""
    return StripesCNN(ctx, width, noise)
