"""Tests for diloco_chaos.trainers.syncers.synchronous and diloco_chaos.trainers.syncers.elastic_ddp: the ddp,
elastic_ddp and synchronous
DiLoCo syncers."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from diloco_chaos.trainers.config import DilocoConfig, TrainConfig
from diloco_chaos.trainers.learner.core import InnerOptimizer, LearnerCore
from diloco_chaos.trainers.learner.loops import run_ddp
from diloco_chaos.trainers.messages import STATE_STEP_KEY
from diloco_chaos.trainers.model import ModelConfig, build_model
from diloco_chaos.trainers.syncers.core import SyncRejected, SyncRound
from diloco_chaos.trainers.syncers.elastic_ddp import Action, Change, ElasticDdpSyncer, OpenStep, decide
from diloco_chaos.trainers.syncers.synchronous import DdpSyncer, DilocoSyncer

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
        expected = theta[n] - DilocoConfig().outer_lr * (1 + 0.9) * mean_delta
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
        assert_close(s.params[n], theta1[n] - DilocoConfig().outer_lr * 2.71 * d[n], rtol=1e-5, atol=1e-6)


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
    from diloco_chaos.trainers.config import DilocoConfig, TrainConfig
    from diloco_chaos.trainers.model import ModelConfig
    from diloco_chaos.trainers.syncers.synchronous import DdpSyncer, DilocoSyncer

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


# -- elastic_ddp: membership decisions (pure, injected clock) ------------------------------------

def test_decide_lost_with_every_survivor_in_completes_the_step_and_measures_the_wait() -> None:
    view = OpenStep(step=5, members=frozenset({0, 1, 2}), arrived={0: 10.0, 2: 10.4})
    d = decide(11.0, view, Change("lost", 1, "link closed"))
    assert d.action is Action.SHRINK and d.members == {0, 2} and d.complete
    assert d.stall_started_at == 10.4, "the survivors waited on the lost learner alone from the last arrival"
    assert "learner 1 lost (link closed)" in d.reason and "step 5" in d.reason


def test_decide_lost_before_the_survivors_are_in_costs_no_stall() -> None:
    view = OpenStep(step=5, members=frozenset({0, 1, 2}), arrived={0: 10.0})
    d = decide(11.0, view, Change("lost", 1, "link closed"))
    assert d.action is Action.SHRINK and d.members == {0, 2} and not d.complete
    assert d.stall_started_at == 11.0 and "waits for the survivors" in d.reason


def test_decide_join_grow_and_the_no_change_branches() -> None:
    view = OpenStep(step=9, members=frozenset({0, 2}), arrived={0: 1.0}, finished=frozenset({2}))
    grow = decide(2.0, view, Change("joined", 1, "connected"))
    assert grow.action is Action.GROW and grow.members == {0, 1, 2} and not grow.complete
    assert "admitted from step 9" in grow.reason
    again = decide(2.0, view, Change("joined", 0, "connected"))
    assert again.action is Action.KEEP and again.members == view.members
    stranger = decide(2.0, view, Change("lost", 1, "link closed"))
    assert stranger.action is Action.KEEP and stranger.members == view.members
    done = decide(2.0, view, Change("lost", 2, "link closed"))
    assert done.action is Action.KEEP and done.members == {0} and done.complete, "a finished learner is no loss"
    last = decide(2.0, OpenStep(3, frozenset({1}), {}), Change("lost", 1, "link closed"))
    assert last.action is Action.SHRINK and last.members == frozenset() and not last.complete


# -- elastic_ddp: the syncer ----------------------------------------------------------------------


def test_elastic_ddp_matches_ddp_while_nobody_is_lost() -> None:
    ddp, el = DdpSyncer(MODEL, TRAIN, SEED, 2), ElasticDdpSyncer(MODEL, TRAIN, SEED, 2)
    for step in (1, 2, 3):
        g0, g1 = grads(1e-2, 10 * step), grads(1e-2, 10 * step + 1)
        ddp.on_grads(0, step, 16, g0)
        el.on_grads(0, step, 16, g0, now=float(step))
        a, b = ddp.on_grads(1, step, 48, g1), el.on_grads(1, step, 48, g1, now=float(step))
        assert isinstance(a, SyncRound) and isinstance(b, SyncRound)
        assert a.participants == b.participants == [0, 1] and a.tokens == b.tokens == [16, 48]
    for n, p in ddp.params.items():
        assert torch.equal(p.detach(), el.params[n].detach())
    assert el.take_reconfigurations() == []


def test_elastic_ddp_shrinks_on_a_loss_and_averages_the_survivors_only() -> None:
    g = [grads(1.0, i) for i in range(3)]
    s2 = ElasticDdpSyncer(MODEL, TRAIN, SEED, 3)
    for m in range(3):
        s2.on_grads(m, 1, 10, g[m], now=1.0)
    assert s2.completed == 1
    assert s2.on_grads(0, 2, 10, g[0], now=2.0) is None
    assert s2.on_grads(2, 2, 30, g[2], now=2.25) is None, "the barrier still expects learner 1"
    res = s2.on_leave(1, now=3.0, why="link closed")
    assert isinstance(res, SyncRound) and res.participants == [0, 2] and res.tokens == [10, 30] and res.key == 2
    for n in g[0]:
        assert_close(res.tensors[n], 0.25 * g[0][n] + 0.75 * g[2][n])
    (rec,) = s2.take_reconfigurations()
    assert (rec.kind, rec.learner, rec.members_before, rec.members_after, rec.step) == \
        ("shrink", 1, [0, 1, 2], [0, 2], 2)
    assert rec.stall_s == pytest.approx(0.75) and rec.started_at == 2.25 and rec.ended_at == 3.0
    assert s2.on_grads(0, 3, 10, g[0], now=3.1) is None
    assert isinstance(s2.on_grads(2, 3, 10, g[2], now=3.2), SyncRound), "step 3 needs only the survivors"
    assert s2.on_grads(1, 4, 10, g[1], now=3.3) == SyncRejected("not a member of the global group"), \
        "a learner not admitted is never averaged"


def test_elastic_ddp_admits_a_rejoining_learner_at_the_next_step_with_the_full_state() -> None:
    s = ElasticDdpSyncer(MODEL, TRAIN, SEED, 2)
    g = [grads(1e-2, i) for i in range(2)]
    s.on_grads(0, 1, 10, g[0], now=0.0)
    s.on_leave(1, now=0.5, why="link closed")
    s.on_grads(0, 2, 10, g[0], now=1.0)
    assert s.completed == 2 and [r.kind for r in s.take_reconfigurations()] == ["shrink"]
    step, state = s.on_join(1, now=2.0, why="connected")
    assert step == 2 and all(f"opt.exp_avg.{n}" in state for n in s.params), "replica and AdamW moments"
    for n, p in s.params.items():
        assert torch.equal(state[n], p.detach())
    assert s.on_grads(0, 3, 10, g[0], now=2.1) is None, "from step 3 the barrier expects it again"
    res = s.on_grads(1, 3, 10, g[1], now=2.4)
    assert isinstance(res, SyncRound) and res.participants == [0, 1]
    (rec,) = s.take_reconfigurations()
    assert (rec.kind, rec.members_before, rec.members_after, rec.step) == ("grow", [0], [0, 1], 3)
    assert rec.stall_s == pytest.approx(0.3) and rec.started_at == 2.0 and rec.ended_at == 2.4


def test_elastic_ddp_a_bye_before_the_last_step_is_still_a_loss() -> None:
    """A host whose chip died can close its link politely (BYE) before it exits: that learner is lost."""
    s = ElasticDdpSyncer(MODEL, TrainConfig(steps=2, warmup_steps=0), SEED, 2)
    g = grads(1e-2, 0)
    s.on_grads(0, 1, 10, g, now=1.0)
    s.on_grads(1, 1, 10, g, now=1.0)
    s.on_grads(0, 2, 10, g, now=2.0)
    s.on_finished(1)
    assert isinstance(s.on_leave(1, now=2.5, why="link closed"), SyncRound)
    assert [(r.kind, r.members_after) for r in s.take_reconfigurations()] == [("shrink", [0])]
    s.on_finished(0)  # after the last step (2): the end of the run, not a reconfiguration
    assert s.on_leave(0, now=3.0, why="link closed") is None and s.take_reconfigurations() == []
    assert s.members == set()


def test_elastic_ddp_catches_up_a_member_that_missed_steps() -> None:
    s = ElasticDdpSyncer(MODEL, TRAIN, SEED, 2)
    g = [grads(1e-2, i) for i in range(2)]
    for step in (1, 2, 3):
        s.on_grads(0, step, 10, g[0], now=float(step))
        last = s.on_grads(1, step, 10, g[1], now=float(step))
    assert isinstance(last, SyncRound)
    replay = s.on_grads(1, 3, 10, g[1], now=4.0)
    assert isinstance(replay, SyncRound) and replay.replay_to == 1 and replay.step == replay.key == 3
    assert STATE_STEP_KEY not in replay.tensors and s.merges == 3, "the last step's result again, no new merge"
    old = s.on_grads(1, 1, 10, g[1], now=4.0)
    assert isinstance(old, SyncRound) and old.replay_to == 1 and old.key == 1 and old.step == 3
    assert int(old.tensors[STATE_STEP_KEY]) == 3 and all(f"opt.exp_avg_sq.{n}" in old.tensors for n in s.params)
    assert s.merges == 3


class _CatchUpLink:
    """The syncer's side for run_ddp: answers step 1 with the group's state after step 5, then averages."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state
        self.asked: list[int] = []

    def exchange_grads(self, step: int, tokens: int, g: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.asked.append(step)
        if step == 1:
            return {**self.state, STATE_STEP_KEY: torch.tensor([5.0])}
        return {n: torch.zeros_like(t) for n, t in g.items()}

    def exchange_params(self, round_: int, step: int, tokens: int,
                        params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        raise AssertionError("not a diloco run")


def test_run_ddp_elastic_loads_the_groups_state_and_goes_on_from_its_step() -> None:
    train = TrainConfig(steps=7, lr=1e-2, warmup_steps=0)
    core = LearnerCore(0, MODEL, train, DilocoConfig(fragments=1, sync_every=1), SEED)
    group = {n: torch.full_like(p, 0.5) for n, p in core.named.items()}
    group |= {f"opt.exp_avg.{n}": torch.zeros_like(p) for n, p in core.named.items()}
    group |= {f"opt.exp_avg_sq.{n}": torch.ones_like(p) for n, p in core.named.items()}
    link = _CatchUpLink(group)
    x = torch.zeros(2, MODEL.seq_len, dtype=torch.long)
    caught: list[tuple[int, int]] = []
    run_ddp(core, lambda s: (x, x), link, lambda *a: None, elastic=True,
            on_catch_up=lambda ours, theirs: caught.append((ours, theirs)))
    assert link.asked == [1, 6, 7] and caught == [(1, 5)] and core.step == 7
    assert all(float(core.optimizer.opt.state[p]["step"]) == 7 for p in core.named.values()), "AdamW resumed at 5"
    ref = torch.full((1,), 0.5)
    for p in core.named.values():  # two AdamW steps on zero gradients from the group's state: decay only
        assert torch.allclose(p.detach(), ref * (1 - train.lr * train.weight_decay) ** 2)


class _ScriptedGroup:
    """A learner's group for the host's side of run_ddp: its broadcast fails once at `fail_at` (a chip died),
    it re-forms with one chip fewer, and a repaired chip is waiting from `grow_at` on (the chip processes and
    Gloo group themselves are exercised in suites/test_elastic.py)."""

    def __init__(self, fail_at: int, grow_at: int) -> None:
        self.rank, self.size = 0, 2
        self.fail_at, self.grow_at = fail_at, grow_at
        self.broadcasts = 0
        self.reforms: list[int] = []
        self.step = 0

    def allreduce_mean_(self, flat: torch.Tensor) -> None:
        return None

    def broadcast_(self, flat: torch.Tensor, src: int = 0) -> None:
        self.broadcasts += 1
        if self.broadcasts == self.fail_at:
            from diloco_chaos.trainers.learner.core import CollectiveFailed

            raise CollectiveFailed("connection closed by peer")

    def pending_reform(self) -> bool:
        return self.step >= self.grow_at and self.size == 1

    def reform(self) -> None:
        self.size = 2 if self.size == 1 and self.step >= self.grow_at else 1
        self.reforms.append(self.size)


class _AveragingLink:
    """The syncer's side: averages (returns our gradient), recording (step, tokens) asked; a step asked again
    after a regroup is answered again (the syncer's stored result)."""

    def __init__(self, group: _ScriptedGroup) -> None:
        self.group = group
        self.asked: list[tuple[int, int]] = []

    def exchange_grads(self, step: int, tokens: int, g: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.asked.append((step, tokens))
        self.group.step = step
        return {n: t.clone() for n, t in g.items()}

    def exchange_params(self, round_: int, step: int, tokens: int,
                        params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        raise AssertionError("not a diloco run")


def test_run_ddp_shrinkable_regroups_after_a_failed_collective_and_grows_at_a_step_boundary() -> None:
    train = TrainConfig(steps=8, lr=1e-2, warmup_steps=0)
    core = LearnerCore(0, MODEL, train, DilocoConfig(fragments=1, sync_every=1), SEED, shrinkable=True)
    group = _ScriptedGroup(fail_at=2 * 3, grow_at=5)  # two broadcasts a step: the 6th is step 3's gradient
    core.collective = group
    link = _AveragingLink(group)
    x = torch.zeros(2, MODEL.seq_len, dtype=torch.long)
    regroups: list[tuple[int, str]] = []
    steps: list[tuple[int, int]] = []
    run_ddp(core, lambda s: (x, x), link, lambda s, loss, tokens: steps.append((s, tokens)), elastic=True,
            on_regroup=lambda s, why: regroups.append((s, why.split(":")[0])))
    full, half = 2 * x.numel(), x.numel()
    assert regroups == [(2, "collective failed"), (5, "membership changed")] and group.reforms == [1, 2]
    assert link.asked[:4] == [(1, full), (2, full), (3, full), (3, half)], "step 3 done again with one chip"
    # step 3 logs the tokens of its first exchange: the syncer answers the redo with that exchange's stored result
    assert steps == [(1, full), (2, full), (3, full), (4, half), (5, half), (6, full), (7, full), (8, full)]
    assert core.step == 8 and core.finite()


def test_run_ddp_not_shrinkable_fails_the_learner_on_a_failed_collective() -> None:
    from diloco_chaos.trainers.learner.core import CollectiveFailed

    core = LearnerCore(0, MODEL, TrainConfig(steps=4, lr=1e-2, warmup_steps=0),
                       DilocoConfig(fragments=1, sync_every=1), SEED)
    core.collective = _ScriptedGroup(fail_at=3, grow_at=99)
    x = torch.zeros(2, MODEL.seq_len, dtype=torch.long)
    with pytest.raises(CollectiveFailed):
        run_ddp(core, lambda s: (x, x), _AveragingLink(core.collective), lambda *a: None, elastic=True)
    assert core.step == 1


def _fault(action: str) -> dict[str, object]:
    extra: dict[str, object] = {"until": {"after_s": 1.0}} if action in ("freeze", "slow", "partition", "degrade",
                                                                          "flap", "slice", "limit_data") else {}
    if action == "slow":
        extra["speed"] = 0.5
    extra |= {"degrade": {"latency_ms": 10}, "flap": {"period_s": 1.0, "duty": 0.5},
              "limit_data": {"bytes": 100_000}}.get(action, {})
    return {"action": action, "learner": 1, "at": {"step": 5}, **extra}


@pytest.mark.parametrize("action", ["kill_chip", "kill_learner", "crash_host", "freeze", "slow", "partition",
                                    "degrade", "flap", "reset_peer", "slice", "limit_data", "kill_syncer"])
def test_elastic_ddp_accepts_exactly_the_faults_ddp_accepts(action: str) -> None:
    from diloco_chaos.harness.config.scenario import from_dict
    from diloco_chaos.harness.config.sections import ScenarioError

    def verdict(algorithm: str) -> str:
        try:
            from_dict({"algorithm": algorithm, "topology": {"learners": 2, "chips_per_learner": 2},
                       "recovery": {"policy": "restart"}, "faults": [_fault(action)]})
        except ScenarioError as e:
            return str(e).replace(repr(algorithm), "ALG")
        return "accepted"

    assert verdict("elastic_ddp") == verdict("ddp")
    assert (verdict("ddp") == "accepted") == (action != "kill_syncer"), verdict("ddp")
