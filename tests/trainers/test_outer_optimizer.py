"""Tests for diloco_chaos.trainers.merge.outer_optimizer: Nesterov outer SGD against hand-computed numbers."""

from __future__ import annotations

import io

import pytest
import torch
from torch.testing import assert_close

from diloco_chaos.trainers.merge.outer_optimizer import NesterovOuterOptimizer, OuterOptConfig

F64 = torch.float64


def test_defaults_follow_diloco() -> None:
    cfg = OuterOptConfig()
    assert (cfg.lr, cfg.momentum, cfg.nesterov) == (0.7, 0.9, True)


def test_nesterov_two_steps_by_hand() -> None:
    # lr = 0.5, mu = 0.9, p0 = [1, -2]
    # step 1: g1 = [0.2, 0.4]; buf1 = [0.2, 0.4]
    #         g1 + mu*buf1 = [0.38, 0.76]; p1 = p0 - 0.5*[0.38, 0.76] = [0.81, -2.38]
    # step 2: g2 = [-0.1, 0.0]; buf2 = 0.9*[0.2, 0.4] + g2 = [0.08, 0.36]
    #         g2 + mu*buf2 = [-0.028, 0.324]; p2 = p1 - 0.5*[-0.028, 0.324] = [0.824, -2.542]
    opt = NesterovOuterOptimizer(OuterOptConfig(lr=0.5, momentum=0.9, nesterov=True))
    params = {"w": torch.tensor([1.0, -2.0], dtype=F64)}
    w_obj = params["w"]
    opt.step("frag0", params, {"w": torch.tensor([0.2, 0.4], dtype=F64)})
    assert_close(params["w"], torch.tensor([0.81, -2.38], dtype=F64))
    opt.step("frag0", params, {"w": torch.tensor([-0.1, 0.0], dtype=F64)})
    assert_close(params["w"], torch.tensor([0.824, -2.542], dtype=F64))
    assert params["w"] is w_obj  # updated in place
    assert_close(opt.state_dict()["buffers"]["frag0"]["w"], torch.tensor([0.08, 0.36], dtype=F64))


def test_plain_momentum_two_steps_by_hand() -> None:
    # step 1: buf1 = [0.2, 0.4]; p1 = [1, -2] - 0.5*[0.2, 0.4] = [0.9, -2.2]
    # step 2: buf2 = [0.08, 0.36]; p2 = [0.9, -2.2] - 0.5*[0.08, 0.36] = [0.86, -2.38]
    opt = NesterovOuterOptimizer(OuterOptConfig(lr=0.5, momentum=0.9, nesterov=False))
    params = {"w": torch.tensor([1.0, -2.0], dtype=F64)}
    opt.step("frag0", params, {"w": torch.tensor([0.2, 0.4], dtype=F64)})
    assert_close(params["w"], torch.tensor([0.9, -2.2], dtype=F64))
    opt.step("frag0", params, {"w": torch.tensor([-0.1, 0.0], dtype=F64)})
    assert_close(params["w"], torch.tensor([0.86, -2.38], dtype=F64))


def test_lr_one_no_momentum_sets_params_to_learner_average() -> None:
    # with lr=1, mu=0 the outer step is Θ - (Θ - θ_avg) = θ_avg: plain parameter averaging
    opt = NesterovOuterOptimizer(OuterOptConfig(lr=1.0, momentum=0.0))
    params = {"w": torch.tensor([4.0, 4.0])}
    opt.step("frag0", params, {"w": torch.tensor([4.0, 4.0]) - torch.tensor([1.0, 3.0])})
    assert_close(params["w"], torch.tensor([1.0, 3.0]))


def test_buffers_are_per_fragment_key() -> None:
    opt = NesterovOuterOptimizer(OuterOptConfig(lr=1.0, momentum=0.5, nesterov=False))
    a = {"w": torch.zeros(1)}
    b = {"w": torch.zeros(1)}
    opt.step("frag0", a, {"w": torch.ones(1)})
    opt.step("frag0", a, {"w": torch.ones(1)})  # buf 1.5 -> a = -1 - 1.5 = -2.5
    opt.step("frag1", b, {"w": torch.ones(1)})  # fresh buf 1 -> b = -1
    assert_close(a["w"], torch.tensor([-2.5]))
    assert_close(b["w"], torch.tensor([-1.0]))
    assert set(opt.state_dict()["buffers"]) == {"frag0", "frag1"}


def test_state_dict_round_trip_through_torch_save(tmp_path) -> None:
    cfg = OuterOptConfig(lr=0.7, momentum=0.9)
    gen = torch.Generator().manual_seed(0)
    grads = [{"w": torch.randn(3, 2, generator=gen), "b": torch.randn(2, generator=gen)} for _ in range(4)]
    params_a = {"w": torch.ones(3, 2), "b": torch.zeros(2)}
    opt_a = NesterovOuterOptimizer(cfg)
    for g in grads[:2]:
        opt_a.step("frag3", params_a, g)
    path = tmp_path / "outer.pt"
    torch.save(opt_a.state_dict(), path)
    opt_b = NesterovOuterOptimizer(cfg)
    opt_b.load_state_dict(torch.load(path, weights_only=True))
    params_b = {k: v.clone() for k, v in params_a.items()}
    for g in grads[2:]:
        opt_a.step("frag3", params_a, g)
        opt_b.step("frag3", params_b, g)
    for k, value in params_a.items():
        assert_close(value, params_b[k], rtol=0, atol=0)
    # a fresh optimizer (zero momentum) would have diverged: the state matters
    opt_c = NesterovOuterOptimizer(cfg)
    params_c = {k: v.clone() for k, v in params_b.items()}
    opt_c.step("frag3", params_c, grads[0])
    opt_b.step("frag3", params_b, grads[0])
    assert not torch.equal(params_b["w"], params_c["w"])


def test_state_dict_is_a_copy() -> None:
    opt = NesterovOuterOptimizer(OuterOptConfig())
    params = {"w": torch.zeros(2)}
    opt.step("frag0", params, {"w": torch.ones(2)})
    sd = opt.state_dict()
    sd["buffers"]["frag0"]["w"].fill_(99.0)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    assert_close(torch.load(buf, weights_only=True)["buffers"]["frag0"]["w"], torch.ones(2))


def test_errors() -> None:
    opt = NesterovOuterOptimizer(OuterOptConfig())
    with pytest.raises(ValueError, match="unknown tensor"):
        opt.step("frag0", {"w": torch.zeros(2)}, {"v": torch.zeros(2)})
    with pytest.raises(ValueError, match="shape"):
        opt.step("frag0", {"w": torch.zeros(2)}, {"w": torch.zeros(3)})
    with pytest.raises(ValueError):
        OuterOptConfig(momentum=1.0)
    with pytest.raises(ValueError):
        OuterOptConfig(lr=-0.1)
    with pytest.raises(ValueError):
        opt.load_state_dict({})
