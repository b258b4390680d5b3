"""The built-in byte-level language model task: TinyGPT on the Python documentation (diloco_chaos/trainers/model.py,
data.py).

Its shape is the scenario's [model] table and its corpus the [data] table, as before tasks existed; the token
weights count bytes (batch x seq_len), and `tok_emb.weight` and `pos_emb.weight` are its embeddings.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from diloco_chaos.trainers.data import Splits, eval_batches, make_splits, train_batch
from diloco_chaos.trainers.model import VOCAB_SIZE, build_model
from diloco_chaos.trainers.task import Batch, Task, TaskContext

EVAL_SEQS = 16
"""Sequences per eval batch."""


class ByteLM(Task):
    """Next-byte prediction; loss in nats per byte (ln 256 = 5.55 at chance)."""

    name = "byte_lm"
    embedding_tensors = ("tok_emb.weight", "pos_emb.weight")

    def __init__(self, ctx: TaskContext) -> None:
        self.ctx = ctx
        self._splits: Splits | None = None

    @property
    def splits(self) -> Splits:
        if self._splits is None:
            self._splits = make_splits(self.ctx.data, self.ctx.learners)
        return self._splits

    def build_model(self, seed: int) -> nn.Module:
        return build_model(self.ctx.model, seed)

    def train_batch(self, learner: int, chip: int, step: int) -> Batch:
        shard, seq = self.splits.shards[learner], self.ctx.model.seq_len
        if len(shard) < seq + 2:
            raise ValueError(f"data.corpus {self.ctx.data.corpus!r}: learner {learner}'s shard holds {len(shard)} "
                             f"bytes, fewer than model.seq_len + 2 = {seq + 2}")
        return train_batch(self.splits.shards[learner], self.ctx.model.seq_len, self.ctx.batch_size,
                           self.ctx.seed, learner, chip, step)

    def eval_batches(self, max_batches: int) -> list[Batch]:
        return eval_batches(self.splits.holdout, self.ctx.model.seq_len, EVAL_SEQS, max_batches)

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        x, y = batch
        return F.cross_entropy(model(x).reshape(-1, VOCAB_SIZE), y.reshape(-1))

    def batch_tokens(self, batch: Batch) -> int:
        return int(batch[0].numel())


def byte_lm(ctx: TaskContext) -> ByteLM:
    """Factory: the byte LM of the scenario's [model] and [data] tables."""
    return ByteLM(ctx)
