"""Tests for trainers.baselines: the synchronous DDP and DiLoCo syncers."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from trainers.baselines import DdpSyncer, DilocoSyncer, SyncRound
from trainers.config import DilocoConfig, TrainConfig
from trainers.learner import InnerOptimizer
from trainers.model import ModelConfig, build_model

MODEL = ModelConfig(seq_len=8, d_model=16, n_layers=1, n_heads=2, d_ff=32)
TRAIN = TrainConfig(steps=10, lr=1e-2, warmup_steps=0)
SEED = 7


def initial() -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in build_model(MODEL, SEED).named_parameters()}


def grads(scale: float, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: scale * torch.randn(t.shape, generator=g) for n, t in initial().items()}


# -- DdpSyncer ----------------------------------------------------------------------------------


def test_ddp_waits_for_all_learners_then_returns_token_weighted_average() -> None:
    s = DdpSyncer(MODEL, TRAIN, SEED, num_learners=3)
    before = {n: p.detach().clone() for n, p in s.params.items()}
    g0, g1, g2 = grads(1.0, 0), grads(1.0, 1), grads(1.0, 2)
    assert s.on_grads(2, 1, 10, g2) is None
    assert s.on_grads(0, 1, 30, g0) is None
    assert s.merges == 0
    for n, p in s.params.items():
        assert torch.equal(p.detach(), before[n])
    res = s.on_grads(1, 1, 60, g1)
    assert isinstance(res, SyncRound)
    assert res.participants == [0, 1, 2] and res.tokens == [30, 60, 10] and res.key == 1 and res.step == 1
    for n in before:
        assert_close(res.tensors[n], 0.3 * g0[n] + 0.6 * g1[n] + 0.1 * g2[n])
    assert s.merges == 1


def test_ddp_advances_its_replica_like_an_adamw_step() -> None:
    s = DdpSyncer(MODEL, TRAIN, SEED, num_learners=2)
    g0, g1 = grads(1e-3, 3), grads(1e-3, 4)
    s.on_grads(0, 1, 16, g0)
    res = s.on_grads(1, 1, 16, g1)
    assert isinstance(res, SyncRound)
    ref = build_model(MODEL, SEED)
    opt = InnerOptimizer(ref, TRAIN)
    for n, p in ref.named_parameters():
        p.grad = (0.5 * g0[n] + 0.5 * g1[n]).clone()
    opt.step(1)
    start = initial()
    for n, p in ref.named_parameters():
        assert_close(s.params[n].detach(), p.detach())
        assert not torch.equal(s.params[n].detach(), start[n]), n


def test_ddp_rounds_are_keyed_by_step() -> None:
    s = DdpSyncer(MODEL, TRAIN, SEED, num_learners=2)
    assert s.on_grads(0, 1, 16, grads(1.0, 0)) is None
    assert s.on_grads(0, 2, 16, grads(1.0, 1)) is None  # a different step does not complete step 1
    r1 = s.on_grads(1, 1, 16, grads(1.0, 2))
    assert isinstance(r1, SyncRound) and r1.key == 1
    r2 = s.on_grads(1, 2, 16, grads(1.0, 3))
    assert isinstance(r2, SyncRound) and r2.key == 2
    assert s.merges == 2


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_ddp_rejects_nonfinite_and_never_completes_that_step(bad: float) -> None:
    s = DdpSyncer(MODEL, TRAIN, SEED, num_learners=2)
    before = {n: p.detach().clone() for n, p in s.params.items()}
    poisoned = grads(1.0, 0)
    next(iter(poisoned.values())).view(-1)[3] = bad
    assert s.on_grads(0, 1, 16, poisoned) is False
    assert s.on_grads(1, 1, 16, grads(1.0, 1)) is None
    assert s.on_grads(1, 1, 16, grads(1.0, 2)) is None  # the same learner again does not make M
    assert s.merges == 0
    for n, p in s.params.items():
        assert torch.equal(p.detach(), before[n])
        assert torch.isfinite(p).all()


def test_ddp_rejects_wrong_tensor_names() -> None:
    s = DdpSyncer(MODEL, TRAIN, SEED, num_learners=1)
    g = grads(1.0, 0)
    g.pop(next(iter(g)))
    assert s.on_grads(0, 1, 16, g) is False
    assert s.merges == 0


# -- DilocoSyncer -------------------------------------------------------------------------------


def test_diloco_first_outer_step_is_nesterov_on_mean_delta() -> None:
    s = DilocoSyncer(MODEL, DilocoConfig(), SEED, num_learners=2)
    theta = initial()
    d0, d1 = grads(0.01, 5), grads(0.01, 6)
    p0 = {n: theta[n] - d0[n] for n in theta}  # learner copies, so Delta_m = Theta - theta_m = d_m
    p1 = {n: theta[n] - d1[n] for n in theta}
    assert s.on_params(0, 1, 8, 100, p0) is None
    assert s.merges == 0
    for n, t in s.params.items():
        assert torch.equal(t, theta[n])
    res = s.on_params(1, 1, 8, 300, p1)
    assert isinstance(res, SyncRound)
    assert res.participants == [0, 1] and res.tokens == [100, 300] and res.key == 1 and res.step == 8
    for n in theta:
        mean_delta = 0.5 * (d0[n] + d1[n])  # plain mean: tokens do not weigh in
        expected = theta[n] - 0.7 * (1 + 0.9) * mean_delta
        assert_close(s.params[n], expected, rtol=1e-5, atol=1e-6)
        assert torch.equal(res.tensors[n], s.params[n])
    assert s.merges == 1


def test_diloco_second_step_uses_momentum() -> None:
    s = DilocoSyncer(MODEL, DilocoConfig(), SEED, num_learners=1)
    theta0 = initial()
    d = grads(0.01, 8)
    s.on_params(0, 1, 4, 10, {n: theta0[n] - d[n] for n in theta0})
    theta1 = {n: t.clone() for n, t in s.params.items()}
    s.on_params(0, 2, 8, 10, {n: theta1[n] - d[n] for n in theta1})
    for n in theta0:
        # buf1 = g, buf2 = 0.9 g + g = 1.9 g; step 2 moves by lr (g + 0.9 buf2) = 0.7 * 2.71 g
        assert_close(s.params[n], theta1[n] - 0.7 * 2.71 * d[n], rtol=1e-5, atol=1e-6)


def test_diloco_result_is_a_copy() -> None:
    s = DilocoSyncer(MODEL, DilocoConfig(), SEED, num_learners=1)
    res = s.on_params(0, 1, 4, 10, initial())
    assert isinstance(res, SyncRound)
    name = next(iter(res.tensors))
    res.tensors[name].add_(1.0)
    assert not torch.equal(res.tensors[name], s.params[name])


def test_diloco_rejects_nonfinite_and_never_completes_that_round() -> None:
    s = DilocoSyncer(MODEL, DilocoConfig(), SEED, num_learners=2)
    theta = initial()
    bad = {n: t.clone() for n, t in theta.items()}
    next(iter(bad.values())).view(-1)[0] = math.nan
    assert s.on_params(0, 1, 4, 10, bad) is False
    assert s.on_params(1, 1, 4, 10, initial()) is None
    assert s.merges == 0
    for n, t in s.params.items():
        assert torch.equal(t, theta[n])


def test_a_contribution_to_a_completed_round_gets_the_stored_result_not_a_new_round() -> None:
    """A learner whose reply was lost (link outage) sends its request again after reconnecting."""
    from trainers.baselines import DdpSyncer, DilocoSyncer
    from trainers.config import DilocoConfig, TrainConfig
    from trainers.model import ModelConfig

    cfg = ModelConfig()
    ddp = DdpSyncer(cfg, TrainConfig(), 0, 2)
    g = {n: torch.ones_like(p) for n, p in ddp.params.items()}
    assert ddp.on_grads(0, 1, 10, g) is None
    done = ddp.on_grads(1, 1, 10, g)
    assert done.replay_to is None and ddp.merges == 1
    again = ddp.on_grads(1, 1, 10, g)
    assert again.replay_to == 1 and again.key == 1 and ddp.merges == 1, "no second merge of the same step"
    assert ddp.barrier.pending == {}, "no half-open round for a step that is done"
    assert ddp.on_grads(0, 2, 10, g) is None and ddp.merges == 1

    dl = DilocoSyncer(cfg, DilocoConfig(), 0, 2)
    p = {n: t.clone() for n, t in dl.params.items()}
    dl.on_params(0, 1, 8, 10, p)
    assert dl.on_params(1, 1, 8, 10, p).replay_to is None
    assert dl.on_params(0, 1, 8, 10, p).replay_to == 0 and dl.merges == 1
    assert dl.on_params(0, 0, 0, 10, p) is None, "older rounds than the last are not answered"
