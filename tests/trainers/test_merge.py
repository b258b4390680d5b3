"""Tests for diloco_chaos.trainers.merge.outer_gradient: token weights, weighted mean, RDA and the per-tensor outer
gradient."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from diloco_chaos.trainers.merge.outer_gradient import all_finite, outer_gradient, rda, token_weights, weighted_mean


def test_token_weights_normalise_and_follow_quality_factor() -> None:
    w = token_weights([(10, 1000), (10, 2000)])
    assert math.isclose(sum(w), 1.0)
    # same steps, twice the tokens -> 4x the weight (tokens * tokens-per-step)
    assert math.isclose(w[1] / w[0], 4.0)
    assert w == pytest.approx([0.2, 0.8])


def test_token_weights_fixed_batch_is_proportional_to_steps() -> None:
    # with a constant 64 tokens per step, c_tokens**2 / c_steps = 64**2 * c_steps
    w = token_weights([(1, 64), (3, 192), (4, 256)])
    assert w == pytest.approx([1 / 8, 3 / 8, 4 / 8])


def test_token_weights_quantity_vs_quality() -> None:
    # learner 0: 100 tokens in 1 step; learner 1: 100 tokens in 4 steps -> raw 10000 vs 2500
    assert token_weights([(1, 100), (4, 100)]) == pytest.approx([0.8, 0.2])


def test_token_weights_zero_steps_gets_zero() -> None:
    assert token_weights([(0, 500), (5, 50)]) == [0.0, 1.0]
    assert token_weights([(0, 0), (2, 8), (2, 8)]) == pytest.approx([0.0, 0.5, 0.5])


def test_token_weights_errors() -> None:
    with pytest.raises(ValueError, match="zero"):
        token_weights([(0, 10), (3, 0)])
    with pytest.raises(ValueError, match="zero"):
        token_weights([])
    with pytest.raises(ValueError, match="negative"):
        token_weights([(1, 10), (-1, 10)])
    with pytest.raises(ValueError, match="negative"):
        token_weights([(1, -10), (1, 10)])


def test_weighted_mean_values_and_dtype() -> None:
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = torch.tensor([[5.0, 6.0], [7.0, 8.0]])
    assert_close(weighted_mean([a, b], [1.0, 3.0]), torch.tensor([[4.0, 5.0], [6.0, 7.0]]))
    assert_close(weighted_mean([a, b], [0.0, 2.0]), b)
    h = weighted_mean([a.half(), b.half()], [0.5, 0.5])
    assert h.dtype == torch.float16
    with pytest.raises(ValueError):
        weighted_mean([a, b], [1.0])
    with pytest.raises(ValueError):
        weighted_mean([a, b[:1]], [1.0, 1.0])
    with pytest.raises(ValueError):
        weighted_mean([a, b], [0.0, 0.0])
    with pytest.raises(ValueError):
        weighted_mean([], [])


def _equal_norm_random(m: int, shape: tuple[int, ...], radius: float, gen: torch.Generator) -> list:
    vs = [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(m)]
    return [v * (radius / torch.linalg.vector_norm(v)) for v in vs]


@pytest.mark.parametrize("m", range(2, 9))
def test_rda_preserves_norm_where_mean_shrinks(m: int) -> None:
    gen = torch.Generator().manual_seed(100 + m)
    radius = 3.5
    vs = _equal_norm_random(m, (64, 128), radius, gen)  # 8192-dim: near-orthogonal
    for weights in ([1.0] * m, torch.rand(m, generator=gen, dtype=torch.float64).add(0.1).tolist()):
        r = rda(vs, weights)
        mean = weighted_mean(vs, weights)
        assert r.shape == (64, 128)
        assert_close(torch.linalg.vector_norm(r), torch.tensor(radius, dtype=torch.float64))
        # plain averaging shrinks: ~R/sqrt(M) for equal weights, always well below R
        assert float(torch.linalg.vector_norm(mean)) < 0.8 * radius
        # RDA only rescales the weighted mean (same direction)
        cos = torch.dot(r.flatten(), mean.flatten()) / (
            torch.linalg.vector_norm(r) * torch.linalg.vector_norm(mean)
        )
        assert_close(cos, torch.tensor(1.0, dtype=torch.float64))
    equal_mean_norm = float(torch.linalg.vector_norm(weighted_mean(vs, [1.0] * m)))
    assert equal_mean_norm == pytest.approx(radius / math.sqrt(m), rel=0.1)


def test_rda_equals_weighted_mean_when_directions_agree() -> None:
    u = torch.tensor([0.6, -0.8, 0.0, 2.0])
    vs = [2.0 * u, 0.5 * u, 7.0 * u]
    w = [0.2, 0.3, 0.5]
    assert_close(rda(vs, w), weighted_mean(vs, w))
    assert_close(rda(vs, w), (0.4 + 0.15 + 3.5) * u)


def test_rda_radial_is_weighted_mean_of_norms() -> None:
    a = torch.tensor([3.0, 0.0])  # norm 3
    b = torch.tensor([0.0, 1.0])  # norm 1
    r = rda([a, b], [1.0, 1.0])
    # radial 2, direction phi((e1 + e2) / 2) = (1, 1) / sqrt(2)
    assert_close(r, torch.tensor([math.sqrt(2.0), math.sqrt(2.0)]))
    r = rda([a, b], [3.0, 1.0])
    # radial (9 + 1) / 4 = 2.5, direction phi(3 e1 + e2)
    assert_close(r, 2.5 * torch.tensor([3.0, 1.0]) / math.sqrt(10.0))


def test_rda_phi_zero_handling() -> None:
    u = torch.tensor([0.0, 2.0, 0.0])
    z = torch.zeros(3)
    # the zero vector adds 0 to the radial mean and nothing to the direction
    assert_close(rda([u, z], [1.0, 1.0]), torch.tensor([0.0, 1.0, 0.0]))
    # a norm below eps counts as zero
    tiny = torch.tensor([1e-14, 0.0, 0.0])
    assert_close(rda([u, tiny], [1.0, 1.0]), torch.tensor([0.0, 1.0, 0.0]))
    # all-zero and exactly cancelling inputs give zeros, never NaN
    out = rda([z, z], [0.5, 0.5])
    assert_close(out, z)
    out = rda([u, -u], [1.0, 1.0])
    assert all_finite([out])
    assert_close(out, z)


def test_rda_zero_weight_learner_is_ignored() -> None:
    a = torch.tensor([1.0, 0.0])
    b = torch.tensor([0.0, 100.0])
    assert_close(rda([a, b], [1.0, 0.0]), a)


def _frags() -> tuple[dict, list[dict]]:
    global_frag = {
        "tok_emb": torch.tensor([[1.0, 0.0], [0.0, 1.0]]),
        "blk.w": torch.tensor([1.0, 1.0, 1.0]),
    }
    learners = [
        {"tok_emb": torch.tensor([[0.0, 0.0], [0.0, 1.0]]), "blk.w": torch.tensor([0.0, 1.0, 1.0])},
        {"tok_emb": torch.tensor([[1.0, 0.0], [0.0, 0.0]]), "blk.w": torch.tensor([1.0, 0.0, 1.0])},
    ]
    return global_frag, learners


def test_outer_gradient_routes_embeddings_to_mean_and_rest_to_rda() -> None:
    g, ls = _frags()
    w = [0.5, 0.5]
    out = outer_gradient(g, ls, w, embedding_names={"tok_emb"})
    assert list(out) == ["tok_emb", "blk.w"]
    # deltas: tok_emb -> e00, e11 (orthogonal, norm 1); blk.w -> e0, e1 (orthogonal, norm 1)
    assert_close(out["tok_emb"], torch.tensor([[0.5, 0.0], [0.0, 0.5]]))  # plain mean: shrinks
    s = 1 / math.sqrt(2.0)
    assert_close(out["blk.w"], torch.tensor([s, s, 0.0]))  # RDA: keeps norm 1
    assert_close(torch.linalg.vector_norm(out["blk.w"]), torch.tensor(1.0))


def test_outer_gradient_mean_rule_and_no_embeddings() -> None:
    g, ls = _frags()
    out = outer_gradient(g, ls, [0.25, 0.75], embedding_names=(), rule="mean")
    assert_close(out["blk.w"], torch.tensor([0.25, 0.75, 0.0]))
    assert_close(out["tok_emb"], torch.tensor([[0.25, 0.0], [0.0, 0.75]]))
    out = outer_gradient(g, ls, [0.5, 0.5], embedding_names=())
    s = 1 / math.sqrt(2.0)
    assert_close(out["tok_emb"], torch.tensor([[s, 0.0], [0.0, s]]))


def test_outer_gradient_single_learner_is_its_delta() -> None:
    g, ls = _frags()
    out = outer_gradient(g, ls[:1], [1.0], embedding_names={"tok_emb"})
    for name in g:
        assert_close(out[name], g[name] - ls[0][name])


def test_outer_gradient_errors() -> None:
    g, ls = _frags()
    with pytest.raises(ValueError, match="unknown merge rule"):
        outer_gradient(g, ls, [0.5, 0.5], (), rule="median")
    missing = [ls[0], {"tok_emb": ls[1]["tok_emb"]}]
    with pytest.raises(ValueError, match="missing tensor 'blk.w'"):
        outer_gradient(g, missing, [0.5, 0.5], ())
    bad = [ls[0], {"tok_emb": ls[1]["tok_emb"], "blk.w": torch.zeros(4)}]
    with pytest.raises(ValueError, match="shape"):
        outer_gradient(g, bad, [0.5, 0.5], ())
    with pytest.raises(ValueError):
        outer_gradient(g, ls, [1.0], ())


def test_all_finite() -> None:
    assert all_finite([torch.ones(3), torch.zeros(2, 2), torch.arange(4)])
    assert all_finite([])
    assert not all_finite([torch.ones(3), torch.tensor([1.0, float("nan")])])
    assert not all_finite([torch.tensor([float("-inf")])])


def test_outer_gradient_measures_each_learner_from_its_own_anchor() -> None:
    g = {"w": torch.full((3,), 2.0)}
    learners = [{"w": torch.full((3,), 0.5)}, {"w": torch.full((3,), 1.5)}]
    anchors = [{"w": torch.full((3,), 1.0)}, {"w": torch.full((3,), 2.0)}]
    out = outer_gradient(g, learners, [0.5, 0.5], embedding_names=(), rule="mean", anchors=anchors)
    assert torch.allclose(out["w"], torch.full((3,), 0.5)), "(1 - 0.5 + 2 - 1.5) / 2"
    with pytest.raises(ValueError, match="anchors"):
        outer_gradient(g, learners, [0.5, 0.5], embedding_names=(), anchors=anchors[:1])
