"""Built-in image classification task: a small CNN with batch norm on procedurally drawn images (no download).

Each image is `size` x `size`, one channel, showing one of four shapes at a random place under Gaussian noise:
a horizontal bar, a vertical bar, a filled square or a diagonal. The classes are told apart by shape alone, so
a convolutional model learns them in a few hundred examples. Every image is a pure function of (seed, split,
learner, chip, step, index): learner m's shard is the images drawn under its own index, disjoint from the others'
and from the held-out ones. The model has batch-norm buffers (diloco_chaos/trainers/task.py re-estimates the global
model's) and no embeddings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diloco_chaos.trainers.task import Batch, Task, TaskContext

CLASSES = 4
CHANCE_ACCURACY = 1 / CLASSES


def draw_images(gen: torch.Generator, n: int, size: int, noise: float) -> Batch:
    """`n` images (n, 1, size, size) and their labels, from `gen`."""
    labels = torch.randint(0, CLASSES, (n,), generator=gen)
    pos = torch.randint(1, size - 5, (n, 2), generator=gen)
    img = noise * torch.randn(n, 1, size, size, generator=gen)
    for i in range(n):
        r, c = int(pos[i, 0]), int(pos[i, 1])
        k = int(labels[i])
        if k == 0:
            img[i, 0, r, 1:-1] += 1.0
        elif k == 1:
            img[i, 0, 1:-1, c] += 1.0
        elif k == 2:
            img[i, 0, r:r + 4, c:c + 4] += 1.0
        else:
            idx = torch.arange(size - abs(r - c))
            img[i, 0, idx + max(0, r - c), idx + max(0, c - r)] += 1.0
    return img, labels


class SmallCNN(nn.Module):
    """conv-BN-ReLU x 2, global average pooling, a linear head."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(2 * width)
        self.head = nn.Linear(2 * width, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean(dim=(2, 3)))


class ImageCNN(Task):
    """Four-way shape classification; loss: cross-entropy in nats (ln 4 = 1.39 at chance); metric: accuracy."""

    name = "image_cnn"

    def __init__(self, ctx: TaskContext, size: int = 12, width: int = 8, noise: float = 0.3,
                 eval_images: int = 256) -> None:
        if size < 8 or width < 1 or noise < 0 or eval_images < 1:
            raise ValueError(f"need size >= 8, width >= 1, noise >= 0, eval_images >= 1; got size={size}, "
                             f"width={width}, noise={noise}, eval_images={eval_images}")
        self.ctx, self.size, self.width, self.noise, self.eval_images = ctx, size, width, noise, eval_images

    def build_model(self, seed: int) -> nn.Module:
        state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            return SmallCNN(self.width)
        finally:
            torch.random.set_rng_state(state)

    def train_batch(self, learner: int, chip: int, step: int) -> Batch:
        gen = torch.Generator().manual_seed(hash((1, self.ctx.seed, learner, chip, step)) & 0x7FFF_FFFF_FFFF)
        return draw_images(gen, self.ctx.batch_size, self.size, self.noise)

    def eval_batches(self, max_batches: int) -> list[Batch]:
        gen = torch.Generator().manual_seed(hash((2, self.ctx.seed)) & 0x7FFF_FFFF_FFFF)
        x, y = draw_images(gen, self.eval_images, self.size, self.noise)
        out = [(x[i:i + 64], y[i:i + 64]) for i in range(0, len(x), 64)]
        return out[:max_batches]

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        return F.cross_entropy(model(batch[0]), batch[1])

    def metrics(self, model: nn.Module, batch: Batch) -> dict[str, float]:
        return {"accuracy": float((model(batch[0]).argmax(dim=1) == batch[1]).float().mean())}


def image_cnn(ctx: TaskContext, size: int = 12, width: int = 8, noise: float = 0.3,
              eval_images: int = 256) -> ImageCNN:
    """Factory: images `size` pixels square, `width` channels in the first conv, `noise` sd, `eval_images`
    held out."""
    return ImageCNN(ctx, size, width, noise, eval_images)
