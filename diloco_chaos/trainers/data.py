"""Byte-level text corpus, disjoint per-learner shards and a held-out split.

Corpus: the Python documentation topics that ship inside every CPython
(`pydoc_data.topics`, the text `help('assert')` prints), about 466 KB of
English technical prose. It needs no download and no extra package, so the
same bytes exist on every machine that can run the harness. License: the
Python Software Foundation License (it is part of CPython's documentation).

Batches are a pure function of (seed, learner, chip, step), so a replayed run
sees the same data at the same step, and a restarted learner does not need
any iterator state.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

CORPUS_NAMES = ("pydoc-topics",)


@dataclass(frozen=True)
class DataConfig:
    """Where the training bytes come from and how they are split."""

    corpus: str = "pydoc-topics"
    """Name of the corpus; one of CORPUS_NAMES, or a path to a UTF-8 text file."""
    holdout_fraction: float = 0.1
    """Fraction of the corpus (its tail) kept out of training for eval, in (0, 0.5]."""
    batch_size: int = 8
    """Sequences per chip per inner step."""


@lru_cache(maxsize=4)
def load_corpus(name: str) -> bytes:
    """Return the corpus bytes. Raises FileNotFoundError for a missing file."""
    if name == "pydoc-topics":
        from pydoc_data.topics import topics

        return "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
    with open(name, "rb") as f:
        return f.read()


@dataclass(frozen=True)
class Splits:
    """The corpus cut into per-learner training shards and a held-out tail."""

    shards: tuple[torch.Tensor, ...]
    holdout: torch.Tensor


def make_splits(cfg: DataConfig, num_learners: int) -> Splits:
    """Cut the corpus: tail for eval, the rest into `num_learners` disjoint shards."""
    data = torch.frombuffer(bytearray(load_corpus(cfg.corpus)), dtype=torch.uint8)
    n_hold = int(len(data) * cfg.holdout_fraction)
    train, holdout = data[: len(data) - n_hold], data[len(data) - n_hold :]
    per = len(train) // num_learners
    shards = tuple(train[i * per : (i + 1) * per].clone() for i in range(num_learners))
    return Splits(shards=shards, holdout=holdout.clone())


def train_batch(
    shard: torch.Tensor, seq_len: int, batch_size: int, seed: int, learner: int, chip: int, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic random windows of `shard` for one chip at one inner step."""
    gen = torch.Generator().manual_seed(hash((seed, learner, chip, step)) & 0x7FFF_FFFF_FFFF)
    starts = torch.randint(0, len(shard) - seq_len - 1, (batch_size,), generator=gen)
    return _windows(shard, starts, seq_len)


def eval_batches(
    holdout: torch.Tensor, seq_len: int, batch_size: int, max_batches: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed, non-overlapping windows of the held-out split, in order."""
    n_windows = min((len(holdout) - 1) // seq_len, batch_size * max_batches)
    starts = torch.arange(n_windows) * seq_len
    return [
        _windows(holdout, starts[i : i + batch_size], seq_len)
        for i in range(0, n_windows, batch_size)
    ]


def _windows(src: torch.Tensor, starts: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts.unsqueeze(1) + torch.arange(seq_len + 1)
    chunk = src[idx].long()
    return chunk[:, :-1], chunk[:, 1:]
