"""A learner's per-chip state and its collective, independent of processes and sockets.

`LearnerCore` holds one chip's replica, its AdamW inner optimizer (`InnerOptimizer`) and Decoupled DiLoCo's
per-fragment bookkeeping; `Collective` is the group of this learner's chips; `DecoupledLink` / `SyncLink`
are the host's links to the syncer as the loops (diloco_chaos/trainers/learner/loops.py) see them. Split from the loops
so each module stays small.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
from torch import Tensor

from diloco_chaos.trainers import mutations
from diloco_chaos.trainers.config import DilocoConfig, TrainConfig
from diloco_chaos.trainers.fragments import FragmentSchedule, partition_tensors
from diloco_chaos.trainers.messages import FragmentPush, MergedFragment, Snapshot, flatten, unflatten_into
from diloco_chaos.trainers.model import ModelConfig
from diloco_chaos.trainers.task import Task, model_finite, parameters
from diloco_chaos.trainers.tasks import as_task

WaitOutcome = Literal["applied", "overwritten", "timed_out"]
"""How a diloco.apply_wait = block wait ended (the `apply_wait` record's outcome)."""


class CollectiveFailed(RuntimeError):
    """A collective among the learner's chips failed (a chip died, or hung past the group's timeout).

    With the `shrink` policy the loop re-forms the group (`Collective.reform`) and carries on; otherwise it
    propagates and the learner fails as a whole."""


class Collective(Protocol):
    """Collectives among the chips of one learner. Every call is bounded by the group's timeout and raises
    CollectiveFailed when the group is broken."""

    rank: int
    size: int

    def allreduce_mean_(self, flat: Tensor) -> None: ...
    def broadcast_(self, flat: Tensor, src: int = 0) -> None: ...
    def pending_reform(self) -> bool:
        """Host only: whether a new membership (a repaired chip joining) is waiting to be formed."""
        ...

    def reform(self) -> None:
        """Every member: form the group's next membership (raises CollectiveFailed if it cannot)."""
        ...


class SoloCollective:
    """The collective of a one-chip learner: nothing to exchange."""

    rank = 0
    size = 1

    def allreduce_mean_(self, flat: Tensor) -> None:
        return None

    def broadcast_(self, flat: Tensor, src: int = 0) -> None:
        return None

    def pending_reform(self) -> bool:
        return False

    def reform(self) -> None:
        raise CollectiveFailed("a one-chip learner has no group to re-form")



class DecoupledLink(Protocol):
    """The host's non-blocking link to the syncer (Decoupled DiLoCo)."""

    stop_requested: bool
    """The syncer said the run's total budget is reached (train.budget = total)."""

    def publish(self, snapshot: Snapshot, partition: list[list[str]]) -> None:
        """Offer the state after a step for pulls. The snapshot's tensors may be the live parameters: a link
        copies what it keeps before it returns."""

    def push(self, push: FragmentPush) -> None: ...
    def poll(self) -> list[MergedFragment]: ...
    def pulled_step(self, p: int) -> int | None:
        """The step of the snapshot fragment p was last pulled from with work (None: never)."""
        ...

    def wait_inbox(self, timeout_s: float) -> bool:
        """Wait (bounded) until a merged fragment is waiting to be polled; False on timeout."""
        ...


class SyncLink(Protocol):
    """The host's blocking link to the syncer (the synchronous baselines). Raises TimeoutError."""

    def exchange_grads(self, step: int, tokens: int, grads: dict[str, Tensor]) -> dict[str, Tensor]: ...
    def exchange_params(self, round_: int, step: int, tokens: int, params: dict[str, Tensor]) -> dict[str, Tensor]: ...



def inner_lr(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to cfg.lr over cfg.warmup_steps, then constant or a cosine down to cfg.min_lr_ratio * lr at
    step cfg.steps (held there after it)."""
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    if cfg.lr_schedule == "constant" or cfg.steps <= cfg.warmup_steps:
        return cfg.lr
    progress = min(1.0, (step - cfg.warmup_steps) / (cfg.steps - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


class InnerOptimizer:
    """AdamW with the warm-up schedule and gradient clipping; shared by learners and the ddp syncer."""

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.params = [p for p in model.parameters()]
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)

    def prepare(self, step: int) -> None:
        """What precedes AdamW's step at `step`: the gradients clipped, the scheduled lr set. Separate so that a
        wrapper that decides whether to step (torchft's OptimizerWrapper) steps `opt` itself after it."""
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        for g in self.opt.param_groups:
            g["lr"] = inner_lr(step, self.cfg)

    def step(self, step: int) -> None:
        self.prepare(step)
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)


@dataclass
class FragmentState:
    """Decoupled DiLoCo's per-fragment bookkeeping on one learner."""

    version: int = 0
    c_steps: int = 0
    c_tokens: int = 0
    first_step: int = 1
    pending: MergedFragment | None = None
    pending_apply_at: int = 0
    pending_arrived: int = 0
    """The learner's step when `pending` arrived (taken off the link)."""
    merged_upto: int = 0
    """Host: the last step of this counter period merged in a merge whose value was replaced before it was
    applied (a newer one arrived); those steps are not discarded by the overwrite."""
    answered: int = -1
    """Host: the latest pull step a merged value that arrived answers (its pulled step, or its arrival step for
    one it was not in): diloco.apply_wait = block waits until it reaches the pull's step."""
    waited: int = -1
    """Host: the latest pull step already waited for (one wait per pull)."""
    overwrote: tuple[int, float] | None = None
    """Host: (first step discarded, its tokens / P) of the last apply of a merge it was not in (broadcast = all),
    None when that apply discarded nothing; for the `fragment_overwritten` record."""
    applied_from: tuple[int | None, int, bool] | None = None
    """Host: (pulled step, arrival step, broadcast) of the merged value last applied, for the apply event (the
    `apply_schedule` invariant checks the apply step against them; broadcast: a merge it was not in)."""


@dataclass
class LearnerCore:
    """One chip's replica of a learner, with its inner optimizer and fragment bookkeeping."""

    learner: int
    model_cfg: Task | ModelConfig
    """The task this learner trains (diloco_chaos/trainers/task.py), or a ModelConfig: the byte LM of that shape."""
    train_cfg: TrainConfig
    diloco_cfg: DilocoConfig
    seed: int
    collective: Collective = field(default_factory=SoloCollective)
    step: int = 0
    step_time_s: float = 0.0
    timing: dict[str, float] = field(default_factory=dict)
    """Seconds spent per phase of the loop (compute, allreduce, apply, publish): where a step's time goes."""
    last_compute_s: float = 0.0
    """Seconds the last inner step computed (forward, backward, the learner's all-reduce, optimizer)."""
    last_sync_s: float = 0.0
    """Host: seconds of the last step spent in the learner's link to the syncer: waiting at a synchronous
    baseline's barrier (ddp, diloco exchanges), or, for Decoupled DiLoCo, taking the merged fragments off the
    link and publishing the snapshot. Goodput counts a step's interval minus this (docs/metrics.md)."""
    publish_s: float = 0.0
    """Host, Decoupled DiLoCo: seconds spent publishing the previous step's snapshot, counted in the next step's
    `last_sync_s`. A step is reported before its snapshot is published, so that a learner killed in between is
    restarted after that step, never before a step its pushes may already hold."""
    shrinkable: bool = False
    """Re-form the group when a collective fails (the shrink policy) instead of failing the learner."""
    apply_wait_s: float = 0.0
    """diloco.apply_wait = block: how long the host waits at step s + tau for the merge of a fragment pulled at s
    (timeouts.liveness_s); 0: on_arrival, never waits."""
    waits: list[tuple[int, int, float, WaitOutcome]] = field(default_factory=list)
    """Host: (fragment, pulled step, seconds, outcome) of the waits of the last step, for `apply_wait` records."""

    def __post_init__(self) -> None:
        self.task = as_task(self.model_cfg, self.seed)
        self.model = self.task.build_model(self.seed)
        self.named = parameters(self.model)
        self.optimizer = InnerOptimizer(self.model, self.train_cfg)
        sizes = {n: p.numel() for n, p in self.named.items()}
        self.partition = partition_tensors(sizes, self.diloco_cfg.fragments)
        self.schedule = FragmentSchedule(self.diloco_cfg.fragments, self.diloco_cfg.sync_every, self.diloco_cfg.overlap)
        self.frags = [FragmentState() for _ in self.partition]
        self.step_tokens: dict[int, int] = {}
        """Tokens of each step not yet behind every fragment's counter period (what an overwrite discards)."""

    # -- the inner step -------------------------------------------------------------------------
    def forward_backward(self, x: Tensor, y: Tensor) -> float:
        loss = self.task.loss(self.model, (x, y))
        loss.backward()
        return float(loss.detach())

    def grads(self) -> list[Tensor]:
        return [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.named.values()]

    def allreduce_grads(self) -> None:
        if self.collective.size == 1:
            return
        grads = self.grads()
        flat = flatten(grads)
        self.collective.allreduce_mean_(flat)
        unflatten_into(flat, grads)

    def inner_step(self, x: Tensor, y: Tensor) -> tuple[float, int]:
        """One AdamW step on this learner's batch (all chips). Returns (loss, learner tokens)."""
        t0 = time.perf_counter()
        loss = self.forward_backward(x, y)
        t1 = time.perf_counter()
        self.allreduce_grads()
        t2 = time.perf_counter()
        self.step += 1
        self.optimizer.step(self.step)
        self._add("allreduce", t2 - t1)
        self._add("compute", time.perf_counter() - t2 + t1 - t0)
        tokens = self.task.batch_tokens((x, y)) * self.collective.size
        self.step_tokens[self.step] = tokens
        for st in self.frags:
            st.c_steps += 1
            st.c_tokens += tokens
        dt = time.perf_counter() - t0
        self.last_compute_s = dt
        self.step_time_s = dt if self.step_time_s == 0 else 0.8 * self.step_time_s + 0.2 * dt
        return loss, tokens

    def _add(self, phase: str, seconds: float) -> None:
        self.timing[phase] = self.timing.get(phase, 0.0) + seconds

    # -- fragments ------------------------------------------------------------------------------
    def fragment_tensors(self, p: int) -> dict[str, Tensor]:
        return {n: self.named[n].detach().clone() for n in self.partition[p]}

    def snapshot(self, copy: bool = True) -> Snapshot:
        """The replica and the counters after the current step: copied to host RAM (the syncer pulls from
        this copy), or with `copy=False` the live parameters themselves, for a link that copies them at once
        (one copy per step instead of two: the training loop's hot path)."""
        snap = Snapshot(
            learner=self.learner, step=self.step, step_time_s=self.step_time_s,
            tensors={n: p.detach() for n, p in self.named.items()},
            counters=[(st.version, st.c_steps, st.c_tokens, st.first_step) for st in self.frags],
        )
        return snap.copy() if copy else snap

    def receive(self, merged: MergedFragment) -> bool:
        """Host: stash a merged fragment until its apply step. False if it is not newer than ours."""
        st = self.frags[merged.fragment]
        newest = st.pending.version if st.pending is not None else st.version
        if merged.version <= newest:
            return False
        if st.pending is not None and st.pending.pulled_step is not None:  # its merge replaced before applied
            st.merged_upto = max(st.merged_upto, st.pending.pulled_step)
        if merged.broadcast:
            st.merged_upto = max(st.merged_upto, merged.merged_step)
        st.answered = max(st.answered, merged.pulled_step if merged.pulled_step is not None else self.step)
        st.pending = merged
        st.pending_arrived = self.step
        pulled = merged.pulled_step
        st.pending_apply_at = max(self.step + 1, pulled + self.schedule.overlap if pulled is not None else 0)
        if mutations.active("overlap_off_by_one") and pulled is not None:  # mutation: tau + 1 instead of tau
            st.pending_apply_at = max(self.step + 1, pulled + self.schedule.overlap + 1)
        return True

    def due_applies(self) -> list[int]:
        """Host: fragments whose merged value must be applied after the current step."""
        return [p for p, st in enumerate(self.frags) if st.pending is not None and st.pending_apply_at <= self.step]

    def apply_fragment(self, p: int, version: int, flat: Tensor | list[Tensor]) -> None:
        """Overwrite fragment p with the global value (flat, or its tensors in partition order) and reset its
        counters (all chips)."""
        params: list[Tensor] = [self.named[n] for n in self.partition[p]]
        with torch.no_grad():
            if isinstance(flat, Tensor):
                unflatten_into(flat, params)
            else:
                torch._foreach_copy_(params, [t.view_as(q) for t, q in zip(flat, params, strict=True)])
        st = self.frags[p]
        st.overwrote = None
        if st.pending is not None:  # the host: what it applied, as the facts the apply event logs
            st.applied_from = (st.pending.pulled_step, st.pending_arrived, st.pending.broadcast)
            first = max(st.first_step, st.merged_upto + 1)
            if st.pending.broadcast and first <= self.step:  # a merge it was not in: its unmerged work is discarded
                tokens = sum(self.step_tokens.get(s, 0) for s in range(first, self.step + 1))
                st.overwrote = (first, tokens / len(self.partition))
        st.merged_upto = 0
        st.version = version
        st.c_steps = 0
        st.c_tokens = 0
        st.first_step = self.step + 1
        st.pending = None
        oldest = min(f.first_step for f in self.frags)
        for s in [s for s in self.step_tokens if s < oldest]:
            del self.step_tokens[s]

    def finite(self) -> bool:
        """Every parameter and floating-point buffer finite."""
        return model_finite(self.model)


BatchFn = Callable[[int], tuple[Tensor, Tensor]]
StepHook = Callable[[int, float, int], None]
"""Called on the host after every inner step with (step, loss, learner tokens)."""


def params_finite(tensors: Mapping[str, Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors.values())

