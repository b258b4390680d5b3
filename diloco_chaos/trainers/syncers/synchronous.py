"""The synchronizer's logic for the two synchronous baselines, without sockets.

* `DdpSyncer` (data parallel): every inner step it waits for the gradients of
  all M learners, averages them (weighted by tokens) and hands the average
  back; it also applies the same AdamW step to its own replica, so the syncer
  holds the global model for eval and checkpoints exactly as in the other
  algorithms. One missing learner stalls everyone: that is the baseline.
* `DilocoSyncer` (synchronous DiLoCo): every H steps it waits for all M
  learners' full parameters, takes the plain mean of the outer gradients
  Theta - theta_m, applies outer Nesterov SGD and hands the model back.

Both reject non-finite inputs (the round then never completes, which is how a
synchronous system fails). Elastic data parallel (diloco_chaos/trainers/syncers/elastic_ddp.py)
takes `DdpSyncer.merge` behind a barrier whose membership follows the learners
present.
"""

from __future__ import annotations

import dataclasses

from torch import Tensor

from diloco_chaos.trainers.config import DilocoConfig, TrainConfig
from diloco_chaos.trainers.learner.core import InnerOptimizer
from diloco_chaos.trainers.merge.outer_gradient import all_finite, weighted_mean
from diloco_chaos.trainers.merge.outer_optimizer import NesterovOuterOptimizer, OuterOptConfig
from diloco_chaos.trainers.model import ModelConfig
from diloco_chaos.trainers.syncers.core import Contribution, Reconfiguration, SyncResult, SyncRound
from diloco_chaos.trainers.task import Task, parameters
from diloco_chaos.trainers.tasks import as_task


class _Barrier:
    """Collects one contribution per learner for each round key until all M are in.

    Keys only move forward: a contribution to a round that already completed is not a new round (it is a
    learner whose reply was lost, e.g. across a link outage); the caller answers it from `last`.
    """

    def __init__(self, num_learners: int) -> None:
        self.num_learners = num_learners
        self.pending: dict[int, dict[int, tuple[int, dict[str, Tensor]]]] = {}
        self.completed = -1
        self.last: SyncRound | None = None

    def replay(self, key: int, learner: int) -> SyncRound | None | bool:
        """For a key at or below the last completed one: the stored result again (last key), else None."""
        if self.last is not None and key == self.last.key:
            return dataclasses.replace(self.last, replay_to=learner)
        return None

    def add(
        self, key: int, learner: int, tokens: int, tensors: dict[str, Tensor]
    ) -> dict[int, tuple[int, dict[str, Tensor]]] | None:
        got = self.pending.setdefault(key, {})
        got[learner] = (tokens, tensors)
        if len(got) < self.num_learners:
            return None
        self.completed = key
        return self.pending.pop(key)


class _FixedGroup:
    """What the two non-elastic baselines share as `BarrierCore`s: the group never changes, a learner that
    leaves is waited for (that is the baseline), one that joins resumes from the current state, and nothing
    is checkpointed."""

    def resume_state(self) -> tuple[int, dict[str, Tensor]]:
        raise NotImplementedError

    def checkpoint_state(self) -> dict[str, object]:
        return {}

    def on_join(self, learner: int, now: float, why: str) -> tuple[int, dict[str, Tensor]]:
        return self.resume_state()

    def on_leave(self, learner: int, now: float, why: str) -> SyncResult:
        return None  # the barrier keeps waiting for it: that is the baseline

    def on_finished(self, learner: int) -> None:
        return None

    def take_reconfigurations(self) -> list[Reconfiguration]:
        return []

    def take_rollbacks(self) -> list[tuple[int, int, int]]:
        return []


class DdpSyncer(_FixedGroup):
    """Gradient averaging barrier + a replica updated with the averaged gradient (a `BarrierCore`)."""

    contribution: Contribution = "grads"

    def on_contribution(self, learner: int, key: int, step: int, tokens: int, tensors: dict[str, Tensor],
                        now: float) -> SyncResult:
        return self.on_grads(learner, step, tokens, tensors)

    def __init__(self, model_cfg: Task | ModelConfig, train_cfg: TrainConfig, seed: int, num_learners: int) -> None:
        self.model = as_task(model_cfg, seed).build_model(seed)
        self.params = parameters(self.model)
        self.optimizer = InnerOptimizer(self.model, train_cfg)
        self.barrier = _Barrier(num_learners)
        self.merges = 0

    def on_grads(self, learner: int, step: int, tokens: int, grads: dict[str, Tensor]) -> SyncResult:
        """False if rejected (non-finite / wrong names), None while waiting, the round when complete."""
        if set(grads) != set(self.params) or not all_finite(grads.values()):
            return False
        if step <= self.barrier.completed:
            return self.barrier.replay(step, learner)
        done = self.barrier.add(step, learner, tokens, grads)
        if done is None:
            return None
        self.barrier.last = self.merge(step, done)
        return self.barrier.last

    def merge(self, step: int, done: dict[int, tuple[int, dict[str, Tensor]]]) -> SyncRound:
        """Average the contributions (learner -> (tokens, gradient)) weighted by tokens and take the AdamW step
        on the replica; the round to send back."""
        learners = sorted(done)
        toks = [done[m][0] for m in learners]
        w = [t / sum(toks) for t in toks]
        avg = {n: weighted_mean([done[m][1][n] for m in learners], w) for n in self.params}
        for n, p in self.params.items():
            p.grad = avg[n].clone()
        self.optimizer.step(step)
        self.merges += 1
        return SyncRound(key=step, participants=learners, tokens=toks, step=step, tensors=avg)

    def resume_state(self) -> tuple[int, dict[str, Tensor]]:
        """For a restarted learner: the last completed step, the replica and its AdamW moments (the replica
        every learner holds in ddp, since all apply the same averaged gradients with the same optimizer)."""
        out = {n: p.detach().clone() for n, p in self.params.items()}
        for n, p in self.params.items():
            st = self.optimizer.opt.state.get(p, {})
            if "exp_avg" in st:
                out[f"opt.exp_avg.{n}"] = st["exp_avg"].clone()
                out[f"opt.exp_avg_sq.{n}"] = st["exp_avg_sq"].clone()
        return self.merges, out


class DilocoSyncer(_FixedGroup):
    """Full-model barrier every H steps + outer Nesterov on the mean outer gradient (a `BarrierCore`)."""

    contribution: Contribution = "params"

    def on_contribution(self, learner: int, key: int, step: int, tokens: int, tensors: dict[str, Tensor],
                        now: float) -> SyncResult:
        return self.on_params(learner, key, step, tokens, tensors)

    def __init__(self, model_cfg: Task | ModelConfig, cfg: DilocoConfig, seed: int, num_learners: int) -> None:
        model = as_task(model_cfg, seed).build_model(seed)
        self.params: dict[str, Tensor] = {n: p.detach().clone() for n, p in parameters(model).items()}
        self.outer = NesterovOuterOptimizer(OuterOptConfig(lr=cfg.outer_lr, momentum=cfg.outer_momentum))
        self.barrier = _Barrier(num_learners)
        self.merges = 0
        self.sync_every = cfg.sync_every

    def resume_state(self) -> tuple[int, dict[str, Tensor]]:
        """For a restarted learner: the step of the last completed round and the global model after it."""
        return self.merges * self.sync_every, {n: t.clone() for n, t in self.params.items()}

    def on_params(self, learner: int, round_: int, step: int, tokens: int,
                  params: dict[str, Tensor]) -> SyncResult:
        if set(params) != set(self.params) or not all_finite(params.values()):
            return False
        if round_ <= self.barrier.completed:
            return self.barrier.replay(round_, learner)
        done = self.barrier.add(round_, learner, tokens, params)
        if done is None:
            return None
        learners = sorted(done)
        w = [1.0 / len(learners)] * len(learners)
        delta = {n: weighted_mean([self.params[n] - done[m][1][n] for m in learners], w) for n in self.params}
        self.outer.step("model", self.params, delta)
        self.merges += 1
        self.barrier.last = SyncRound(key=round_, participants=learners, tokens=[done[m][0] for m in learners],
                                      step=step, tensors={n: t.clone() for n, t in self.params.items()})
        return self.barrier.last


