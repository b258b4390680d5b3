"""A tiny byte-level decoder-only transformer language model.

Why this size: the harness runs 8+ real processes on a 2-core machine, so one
inner step must cost milliseconds, yet the model must be a real transformer so
that the merge rules (RDA on non-embedding tensors, plain averaging on
embeddings) act on the same kinds of tensors as in the paper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

VOCAB_SIZE = 256  # byte-level: one token per byte


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the transformer. Every learner and the syncer build the same one."""

    seq_len: int = 64
    """Context length in bytes (tokens)."""
    d_model: int = 64
    """Width of the residual stream."""
    n_layers: int = 2
    """Number of transformer blocks."""
    n_heads: int = 4
    """Attention heads per block; must divide d_model."""
    d_ff: int = 256
    """Hidden width of each block's MLP."""


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then a GELU MLP."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        shape = (b, t, self.n_heads, d // self.n_heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    """Byte-level GPT. `tok_emb` and `pos_emb` are the embedding tensors."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(VOCAB_SIZE, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, VOCAB_SIZE, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean next-byte cross-entropy in nats (ln 256 ≈ 5.55 at chance)."""
        logits = self(x)
        return F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), y.reshape(-1))


def build_model(cfg: ModelConfig, seed: int) -> TinyGPT:
    """Build the model with weights drawn from `seed` (same seed, same weights)."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return TinyGPT(cfg)
    finally:
        torch.random.set_rng_state(gen_state)


CHANCE_LOSS = math.log(VOCAB_SIZE)
