"""Combine learners' fragment updates into one outer gradient (syncer side).

Why: the syncer merges whatever subset of learners made the quorum, so each
learner's update is weighted by how much work it represents (token weighting,
w = c_tokens**2 / c_steps: tokens processed times tokens per step), and the
per-learner outer gradients, which are nearly orthogonal, are combined with
Radial-Directional Averaging (RDA) so the merged update keeps the typical
learner's norm instead of shrinking like 1/sqrt(M) as plain averaging does.
Following the paper's main runs, embedding tensors are plainly averaged and
all other tensors use RDA. RDA is applied per tensor (the paper does not say
at which granularity; per tensor is what the reference implementation does).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from diloco_chaos.trainers import mutations

MERGE_RULES = ("rda", "mean")


@dataclass
class MergeNorms:
    """What one merge did to the norms, measured on the tensors it used (logged with the merge, checked by the
    `rda_norms` invariant). Per tensor, `radial` is the weighted mean of the participants' outer-gradient norms
    and `merged` the norm of the merged outer gradient; summed over the fragment's non-embedding tensors and,
    apart, its embedding tensors. RDA keeps merged == radial per tensor; a weighted mean gives merged <= radial
    (triangle inequality), strictly less unless every participant points the same way."""

    radial: float = 0.0
    merged: float = 0.0
    embedding_radial: float = 0.0
    embedding_merged: float = 0.0


def token_weights(counters: Sequence[tuple[int, int]]) -> list[float]:
    """Normalised token weights of the learners taking part in a merge.

    Args:
        counters: (c_steps, c_tokens) per participating learner: inner steps and
            tokens processed since that learner last received this fragment.

    Returns:
        Weights in the order of `counters`, summing to 1. A learner's raw weight
        is c_tokens**2 / c_steps (quantity c_tokens times quality
        c_tokens / c_steps), and 0 when c_steps == 0.

    Raises:
        ValueError: if a counter is negative or every raw weight is 0
            (including an empty `counters`).
    """
    if mutations.active("ignore_token_weights") and counters:  # mutation: uniform weights, counters ignored
        return [1.0 / len(counters)] * len(counters)
    raw: list[float] = []
    for i, (steps, tokens) in enumerate(counters):
        if steps < 0 or tokens < 0:
            raise ValueError(f"learner #{i}: negative counter (c_steps={steps}, c_tokens={tokens})")
        raw.append(0.0 if steps == 0 else tokens * tokens / steps)
    total = sum(raw)
    if total <= 0.0:
        raise ValueError(f"all token weights are zero (counters={list(counters)})")
    return [r / total for r in raw]


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: at least float32, so half-precision inputs do not lose sums."""
    return torch.promote_types(dtype, torch.float32)


def _check_inputs(vectors: Sequence[Tensor], weights: Sequence[float]) -> float:
    """Validate a (vectors, weights) pair and return the weight sum."""
    if len(vectors) == 0:
        raise ValueError("no vectors to combine")
    if len(vectors) != len(weights):
        raise ValueError(f"{len(vectors)} vectors but {len(weights)} weights")
    shape = vectors[0].shape
    for i, v in enumerate(vectors):
        if v.shape != shape:
            raise ValueError(f"vector #{i} has shape {tuple(v.shape)}, expected {tuple(shape)}")
    if any(w < 0 for w in weights):
        raise ValueError(f"negative weight in {list(weights)}")
    total = float(sum(weights))
    if total <= 0.0:
        raise ValueError("weights sum to zero")
    return total


def weighted_mean(vectors: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    """Σ w_m v_m / Σ w_m, with the shape and dtype of the inputs."""
    total = _check_inputs(vectors, weights)
    dtype = vectors[0].dtype
    acc = torch.zeros(vectors[0].shape, dtype=_acc_dtype(dtype), device=vectors[0].device)
    with torch.no_grad():
        for v, w in zip(vectors, weights, strict=False):
            if w:
                acc.add_(v.to(acc.dtype), alpha=float(w) / total)
    return acc.to(dtype)


def rda(vectors: Sequence[Tensor], weights: Sequence[float], eps: float = 1e-12) -> Tensor:
    """Radial-Directional Averaging.

    RDA = (Σ w‖v‖ / Σ w) · φ(Σ w φ(v) / Σ w), with φ(x) = x / ‖x‖ and φ(x) = 0
    when ‖x‖ < eps. Norms are taken over the whole (flattened) tensor. If every
    ‖v_m‖ equals R the result has norm R (unless the directions cancel
    exactly, which gives 0); if all directions agree it equals the weighted mean.
    """
    total = _check_inputs(vectors, weights)
    dtype = vectors[0].dtype
    acc_dtype = _acc_dtype(dtype)
    direction = torch.zeros(vectors[0].shape, dtype=acc_dtype, device=vectors[0].device)
    radial = 0.0
    with torch.no_grad():
        for v, w in zip(vectors, weights, strict=False):
            if not w:
                continue
            vv = v.to(acc_dtype)
            norm = float(torch.linalg.vector_norm(vv))
            if norm < eps:
                continue  # φ(0) = 0 and ‖v‖ contributes 0 to the radial mean
            radial += float(w) * norm / total
            direction.add_(vv, alpha=float(w) / (total * norm))
        dnorm = float(torch.linalg.vector_norm(direction))
        if dnorm < eps:
            return torch.zeros_like(vectors[0])
        return direction.mul_(radial / dnorm).to(dtype)


def outer_gradient(
    global_frag: Mapping[str, Tensor],
    learner_frags: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    embedding_names: Collection[str],
    rule: str = "rda",
    anchors: Sequence[Mapping[str, Tensor]] | None = None,
    norms: MergeNorms | None = None,
) -> dict[str, Tensor]:
    """Merged outer gradient of one fragment.

    For each tensor name in `global_frag`, Δ_m = anchor_m - learner_m (anchor_m: `anchors[m]`, the global
    value learner m started from, or `global_frag` itself when `anchors` is None), combined
    over learners with `weights`: rule "rda" uses RDA for non-embedding tensors
    and the weighted mean for names in `embedding_names`; rule "mean" uses the
    weighted mean everywhere. Keys follow `global_frag`'s order; each result has
    the shape and dtype of the global tensor. With `norms`, adds each tensor's
    radial and merged norms to it (`MergeNorms`).

    Raises:
        ValueError: on an unknown rule, a learner missing a tensor or holding one
            of a different shape, or a weights / learners length mismatch.
    """
    if rule not in MERGE_RULES:
        raise ValueError(f"unknown merge rule {rule!r}; expected one of {MERGE_RULES}")
    if len(learner_frags) != len(weights):
        raise ValueError(f"{len(learner_frags)} learner fragments but {len(weights)} weights")
    if not learner_frags:
        raise ValueError("no learner fragments to merge")
    if anchors is not None and len(anchors) != len(learner_frags):
        raise ValueError(f"{len(learner_frags)} learner fragments but {len(anchors)} anchors")
    out: dict[str, Tensor] = {}
    with torch.no_grad():
        for name, g in global_frag.items():
            deltas: list[Tensor] = []
            for m, frag in enumerate(learner_frags):
                if name not in frag:
                    raise ValueError(f"learner #{m} fragment is missing tensor {name!r}")
                t = frag[name]
                if t.shape != g.shape:
                    raise ValueError(
                        f"learner #{m} tensor {name!r} has shape {tuple(t.shape)}, expected {tuple(g.shape)}"
                    )
                a = g if anchors is None else anchors[m][name]
                deltas.append(a - t.to(device=g.device, dtype=g.dtype))
            if rule == "rda" and name not in embedding_names:
                out[name] = rda(deltas, weights)
                if mutations.active("rda_as_mean"):  # mutation: RDA replaced by the plain weighted mean
                    out[name] = weighted_mean(deltas, weights)
            else:
                out[name] = weighted_mean(deltas, weights)
            if norms is not None:
                _add_norms(norms, name in embedding_names, deltas, weights, out[name])
    return out


def _add_norms(norms: MergeNorms, embedding: bool, deltas: Sequence[Tensor], weights: Sequence[float],
               merged: Tensor) -> None:
    """Add one tensor's weighted mean of the participants' norms and its merged norm (float64)."""
    total = float(sum(weights))
    radial = sum(float(w) / total * float(torch.linalg.vector_norm(d.double())) for d, w in zip(deltas, weights,
                                                                                              strict=True))
    got = float(torch.linalg.vector_norm(merged.double()))
    if embedding:
        norms.embedding_radial += radial
        norms.embedding_merged += got
    else:
        norms.radial += radial
        norms.merged += got


def all_finite(tensors: Iterable[Tensor]) -> bool:
    """True when no tensor holds a NaN or an infinity (True for an empty iterable)."""
    return all(bool(torch.isfinite(t).all()) for t in tensors)
