"""The learner's side of all three algorithms, independent of processes and sockets.

A learner is C chips training data-parallel on one shard. `LearnerCore` holds
one chip's replica, its AdamW inner optimizer and Decoupled DiLoCo's
per-fragment bookkeeping (counters c_steps / c_tokens since the fragment was
last received, versions, outstanding pushes, merged fragments waiting for
their apply step). The three loops (`run_decoupled`, `run_diloco`, `run_ddp`)
drive it; the harness injects the two things that are not pure logic:

* a `Collective` for the chips of this learner (a Gloo group in a real run),
* on the learner's host (rank 0) only, a link to the syncer.

Every chip makes the same decisions because rank 0 decides and broadcasts
them inside the learner (which fragments to apply at this step, and their
values), so the replicas of one learner never diverge.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from trainers import mutations
from trainers.config import DilocoConfig, TrainConfig
from trainers.fragments import FragmentSchedule, partition_tensors
from trainers.model import ModelConfig, TinyGPT, build_model


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


@dataclass
class FragmentPush:
    """One learner's copy of one fragment, offered to the syncer (never waited on)."""

    learner: int
    fragment: int
    base_version: int
    c_steps: int
    c_tokens: int
    first_step: int
    last_step: int
    step_time_s: float
    tensors: dict[str, Tensor]
    final: bool = False


@dataclass
class MergedFragment:
    """A global fragment from the syncer: the answer to our pulled copy, or the current value on (re)join."""

    fragment: int
    version: int
    tensors: dict[str, Tensor]
    pulled_step: int | None = None
    """The step at which our copy was pulled for this merge (None: not a merge we took part in)."""


@dataclass
class Snapshot:
    """The host-RAM copy of the learner after a step, from which the link answers pulls at once."""

    learner: int
    step: int
    step_time_s: float
    tensors: dict[str, Tensor]
    counters: list[tuple[int, int, int, int]]
    """Per fragment: (version, c_steps, c_tokens, first_step)."""

    def copy(self) -> Snapshot:
        """The same snapshot with tensors of its own (one flat copy; the entries are views of it)."""
        flat = flatten([t.detach() for t in self.tensors.values()])
        parts = flat.split([t.numel() for t in self.tensors.values()])
        tensors = {n: v.view_as(t) for (n, t), v in zip(self.tensors.items(), parts, strict=True)}
        return Snapshot(self.learner, self.step, self.step_time_s, tensors, list(self.counters))

    def push_for(self, p: int, names: list[str], final: bool = False) -> FragmentPush:
        version, c_steps, c_tokens, first = self.counters[p]
        tensors = {n: self.tensors[n] for n in names} if c_steps > 0 else {}
        return FragmentPush(learner=self.learner, fragment=p, base_version=version, c_steps=c_steps,
                            c_tokens=c_tokens, first_step=first, last_step=self.step, step_time_s=self.step_time_s,
                            tensors=tensors, final=final)


class DecoupledLink(Protocol):
    """The host's non-blocking link to the syncer (Decoupled DiLoCo)."""

    stop_requested: bool
    """The syncer said the run's total budget is reached (train.budget = total)."""

    def publish(self, snapshot: Snapshot, partition: list[list[str]]) -> None:
        """Offer the state after a step for pulls. The snapshot's tensors may be the live parameters: a link
        copies what it keeps before it returns."""

    def push(self, push: FragmentPush) -> None: ...
    def poll(self) -> list[MergedFragment]: ...


class SyncLink(Protocol):
    """The host's blocking link to the syncer (the synchronous baselines). Raises TimeoutError."""

    def exchange_grads(self, step: int, tokens: int, grads: dict[str, Tensor]) -> dict[str, Tensor]: ...
    def exchange_params(self, round_: int, step: int, tokens: int, params: dict[str, Tensor]) -> dict[str, Tensor]: ...


def flatten(tensors: list[Tensor]) -> Tensor:
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)


def unflatten_into(flat: Tensor, tensors: list[Tensor]) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


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

    def __init__(self, model: TinyGPT, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.params = [p for p in model.parameters()]
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)

    def step(self, step: int) -> None:
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        for g in self.opt.param_groups:
            g["lr"] = inner_lr(step, self.cfg)
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
    applied_from: tuple[int | None, int] | None = None
    """Host: (pulled step, arrival step) of the merged value last applied, for the apply event (the `apply_schedule`
    invariant checks the apply step against them)."""


@dataclass
class LearnerCore:
    """One chip's replica of a learner, with its inner optimizer and fragment bookkeeping."""

    learner: int
    model_cfg: ModelConfig
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

    def __post_init__(self) -> None:
        self.model = build_model(self.model_cfg, self.seed)
        self.named = dict(self.model.named_parameters())
        self.optimizer = InnerOptimizer(self.model, self.train_cfg)
        sizes = {n: p.numel() for n, p in self.named.items()}
        self.partition = partition_tensors(sizes, self.diloco_cfg.fragments)
        self.schedule = FragmentSchedule(self.diloco_cfg.fragments, self.diloco_cfg.sync_every, self.diloco_cfg.overlap)
        self.frags = [FragmentState() for _ in self.partition]

    # -- the inner step -------------------------------------------------------------------------
    def forward_backward(self, x: Tensor, y: Tensor) -> float:
        loss = self.model.loss(x, y)
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
        tokens = x.numel() * self.collective.size
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
        if st.pending is not None:  # the host: what it applied, as the facts the apply event logs
            st.applied_from = (st.pending.pulled_step, st.pending_arrived)
        st.version = version
        st.c_steps = 0
        st.c_tokens = 0
        st.first_step = self.step + 1
        st.pending = None

    def finite(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.named.values())


BatchFn = Callable[[int], tuple[Tensor, Tensor]]
StepHook = Callable[[int, float, int], None]
"""Called on the host after every inner step with (step, loss, learner tokens)."""


def _sync_applies(core: LearnerCore, link: DecoupledLink | None) -> tuple[list[tuple[int, int]], bool, bool]:
    """Decide on rank 0 which merged fragments to apply now, and share values with every chip.

    Returns (applied (fragment, version) pairs, whether the group re-forms after this step, whether the
    syncer said to stop): rank 0 decides, and the answers travel in the same control broadcast so every chip
    agrees and all of them stop after the same step."""
    coll = core.collective
    values: list[int] = []
    if coll.rank == 0:
        assert link is not None
        t0 = time.perf_counter()
        for merged in link.poll():
            core.receive(merged)
        core.last_sync_s = time.perf_counter() - t0 + core.publish_s
        core.publish_s = 0.0
        due = core.due_applies()
        values = [len(due), int(core.shrinkable and coll.pending_reform()),  # memberships change only under shrink
                  int(link.stop_requested)]
        for p in due:
            values += [p, core.frags[p].pending.version]  # type: ignore[union-attr]
    if coll.size > 1:  # one control broadcast; a lone chip keeps its decisions in Python (the hot path)
        control = torch.zeros(3 + 2 * len(core.partition), dtype=torch.int64)
        if coll.rank == 0:
            control[: len(values)] = torch.tensor(values, dtype=torch.int64)
        coll.broadcast_(control)
        values = control.tolist()
    applied = []
    for i in range(values[0]):
        p, version = values[3 + 2 * i], values[4 + 2 * i]
        pending = core.frags[p].pending if coll.rank == 0 else None
        if coll.size == 1:
            assert pending is not None
            core.apply_fragment(p, version, [pending.tensors[n] for n in core.partition[p]])
        else:
            if pending is not None:
                flat = flatten([pending.tensors[n] for n in core.partition[p]])
            else:
                flat = torch.empty(sum(core.named[n].numel() for n in core.partition[p]))
            coll.broadcast_(flat)
            core.apply_fragment(p, version, flat)
        applied.append((p, version))
    return applied, bool(values[1]), bool(values[2])


def host_state(core: LearnerCore) -> tuple[int, dict[str, Tensor]]:
    """Rank 0's step, parameters and AdamW moments, in the form `resume_sync` takes."""
    tensors = {n: p.detach() for n, p in core.named.items()}
    for n, p in core.named.items():
        st = core.optimizer.opt.state.get(p)
        if not st or "exp_avg" not in st:
            return core.step, {n: p.detach() for n, p in core.named.items()}
        tensors[f"opt.exp_avg.{n}"] = st["exp_avg"]
        tensors[f"opt.exp_avg_sq.{n}"] = st["exp_avg_sq"]
    return core.step, tensors


def sync_replicas(core: LearnerCore) -> int:
    """After the group re-formed: every chip takes rank 0's step, parameters and AdamW state (so a survivor
    that was one collective behind, or a repaired chip that just joined, continues from the host's replica)."""
    return resume_sync(core, host_state(core) if core.collective.rank == 0 else None)


RegroupHook = Callable[[int, str], None]
"""Called on every chip after its group re-formed, with (step, why)."""


def regroup(core: LearnerCore, why: str, on_regroup: RegroupHook | None = None) -> None:
    """Re-form the learner's group and make the replicas identical again."""
    core.optimizer.opt.zero_grad(set_to_none=False)  # a failed step's local gradients must not leak into the next
    core.collective.reform()
    sync_replicas(core)
    if on_regroup is not None:
        on_regroup(core.step, why)


def regroup_after(core: LearnerCore, failure: CollectiveFailed, on_regroup: RegroupHook | None = None) -> None:
    """A collective failed: under the shrink policy (`core.shrinkable`) re-form the group with the chips left and
    go on from rank 0's replica; otherwise the failure propagates and the learner fails as a whole. Shared by
    the loops that survive a chip loss (Decoupled DiLoCo's and elastic_ddp's)."""
    if not core.shrinkable:
        raise failure
    regroup(core, f"collective failed: {failure}", on_regroup)


ApplyHook = Callable[[int, list[tuple[int, int]]], None]


def resume_sync(core: LearnerCore, state: tuple[int, dict[str, Tensor]] | None) -> int:
    """A restarted learner of a synchronous baseline takes the syncer's state before its first step.

    Host: `state` is (step, tensors) from the syncer: the parameters and, for ddp, the AdamW moments under
    `opt.exp_avg.<name>` / `opt.exp_avg_sq.<name>`. Every chip receives them by broadcast, loads them and
    continues from that step. Returns the step.
    """
    coll = core.collective
    names = list(core.named)
    head = torch.zeros(2, dtype=torch.int64)
    if coll.rank == 0:
        assert state is not None
        step, tensors = state
        has_opt = all(f"opt.exp_avg.{n}" in tensors for n in names)
        head[0], head[1] = step, int(has_opt)
    if coll.size > 1:
        coll.broadcast_(head)
    step, has_opt = int(head[0]), bool(head[1])
    groups = [names] + ([[f"opt.exp_avg.{n}" for n in names], [f"opt.exp_avg_sq.{n}" for n in names]]
                        if has_opt else [])
    total = sum(p.numel() for p in core.named.values())
    loaded: list[Tensor] = []
    for keys in groups:
        flat = flatten([state[1][k] for k in keys]) if coll.rank == 0 else torch.empty(total)  # type: ignore[index]
        if coll.size > 1:
            coll.broadcast_(flat)
        loaded.append(flat)
    with torch.no_grad():
        unflatten_into(loaded[0], [core.named[n] for n in names])
    if has_opt:
        for i, n in enumerate(names):
            p = core.named[n]
            off = sum(core.named[m].numel() for m in names[:i])
            core.optimizer.opt.state[p] = {
                "step": torch.tensor(float(step)),
                "exp_avg": loaded[1][off:off + p.numel()].view_as(p).clone(),
                "exp_avg_sq": loaded[2][off:off + p.numel()].view_as(p).clone(),
            }
    core.step = step
    return step


def initial_pull(core: LearnerCore, link: DecoupledLink | None, wait: Callable[[], bool]) -> list[tuple[int, int]]:
    """A (re)joining learner takes the current global value of every fragment before its first step.

    Host: collects the fragments the syncer sends on join until it has all of them or `wait()` says to stop
    (it waits on the link and returns False past its deadline); then every chip applies them at once, which
    resets each fragment's counters, so the learner's first push covers only its own new steps.
    """
    if mutations.active("skip_initial_pull"):  # mutation: no initial pull; fragments arriving are applied later
        return _sync_applies(core, link)[0]
    if core.collective.rank == 0:
        assert link is not None
        n = len(core.partition)
        while True:
            for merged in link.poll():
                core.receive(merged)
            if all(st.pending is not None for st in core.frags[:n]) or not wait():
                break
        for st in core.frags:
            if st.pending is not None:
                st.pending_apply_at = core.step
    return _sync_applies(core, link)[0]


def run_decoupled(
    core: LearnerCore, batch: BatchFn, link: DecoupledLink | None, on_step: StepHook,
    on_apply: ApplyHook | None = None, should_stop: Callable[[], bool] = lambda: False,
    on_regroup: RegroupHook | None = None, max_steps: int | None = None,
    after_publish: Callable[[], None] | None = None,
) -> None:
    """Decoupled DiLoCo: train, apply merged fragments when due, publish a snapshot for the syncer's pulls.

    Never waits for the syncer: the link answers pulls from the latest snapshot in its own thread. At the
    end, every fragment with progress not yet merged is pushed unsolicited (final) so the syncer can drain it.
    With `core.shrinkable` (the shrink policy), a broken group is re-formed with the chips that are left and
    training goes on with fewer tokens per step; a repaired chip joins the same way at a step boundary.
    Training ends after `max_steps` (default train.steps) or, earlier, after the step at which the syncer said
    the run's total budget is reached (train.budget = total). `after_publish` runs on the host after each
    publish, inside the step's time in the link (the deterministic mode's wait: trainers/lockstep.py).
    """
    limit = core.train_cfg.steps if max_steps is None else max_steps
    stop = False
    while core.step < limit and not stop and not should_stop():
        is_host = core.collective.rank == 0
        before = core.step
        try:
            x, y = batch(core.step + 1)
            loss, tokens = core.inner_step(x, y)
            t0 = time.perf_counter()
            applied, reform, stop = _sync_applies(core, link)
        except CollectiveFailed as e:
            if core.shrinkable and is_host and core.step > before:  # the step was done before the group broke
                on_step(core.step, loss, tokens)
            regroup_after(core, e, on_regroup)
            continue
        t1 = time.perf_counter()
        if is_host:
            assert link is not None
            on_step(core.step, loss, tokens)  # before the publish: the step a restart resumes after (publish_s)
            if applied and on_apply is not None:
                on_apply(core.step, applied)
            t2 = time.perf_counter()
            link.publish(core.snapshot(copy=False), core.partition)
            if after_publish is not None:
                after_publish()
            core.publish_s = time.perf_counter() - t2
        core._add("apply", t1 - t0)
        core._add("publish", time.perf_counter() - t1)
        if reform:
            regroup(core, "membership changed", on_regroup)
    if core.collective.rank == 0:
        assert link is not None
        snap = core.snapshot()
        for p, names in enumerate(core.partition):
            if core.frags[p].c_steps > 0:
                link.push(snap.push_for(p, names, final=True))


def run_diloco(core: LearnerCore, batch: BatchFn, link: SyncLink | None, on_step: StepHook,
               on_round: Callable[[int, int], None] | None = None) -> None:
    """Synchronous DiLoCo: every H steps send all parameters, block until the merged model returns."""
    is_host = core.collective.rank == 0
    names = list(core.named)
    round_ = core.step // core.diloco_cfg.sync_every  # a restarted learner resumes after its last round
    tokens_since = 0
    while core.step < core.train_cfg.steps:
        x, y = batch(core.step + 1)
        loss, tokens = core.inner_step(x, y)
        tokens_since += tokens
        core.last_sync_s = 0.0
        if core.step % core.diloco_cfg.sync_every == 0 or core.step >= core.train_cfg.steps:
            round_ += 1
            if is_host:
                assert link is not None
                params = {n: p.detach().clone() for n, p in core.named.items()}
                t0 = time.perf_counter()
                merged = link.exchange_params(round_, core.step, tokens_since, params)
                core.last_sync_s = time.perf_counter() - t0
                flat = flatten([merged[n] for n in names])
            else:
                flat = torch.empty(sum(p.numel() for p in core.named.values()))
            core.collective.broadcast_(flat)
            with torch.no_grad():
                unflatten_into(flat, list(core.named.values()))
            tokens_since = 0
            if is_host and on_round is not None:
                on_round(round_, core.step)
        if is_host:  # after the round, so the step's event carries its barrier wait
            on_step(core.step, loss, tokens)


STATE_STEP_KEY = "elastic.state_step"
"""elastic_ddp: in the syncer's answer to a gradient, marks it as the group's state after that step (replica and
AdamW moments, as `resume_sync` takes) instead of an averaged gradient: the answer to a learner that missed
steps while its link was down."""


def run_ddp(core: LearnerCore, batch: BatchFn, link: SyncLink | None, on_step: StepHook, elastic: bool = False,
            on_catch_up: Callable[[int, int], None] | None = None, on_regroup: RegroupHook | None = None) -> None:
    """Synchronous data parallel: every step's gradient is averaged over all learners via the syncer.

    `elastic` (elastic_ddp): the syncer may answer with the group's state instead (`STATE_STEP_KEY`); the host
    then tells its chips in the step's control broadcast, every chip loads that state and the loop goes on from
    its step (`on_catch_up(our step, the group's step)` on the host).
    With `core.shrinkable` (the shrink policy, elastic_ddp only) a failed collective re-forms the learner's group
    with the chips left (`regroup_after`) and the step is done again with fewer chips: the learner stays in the
    global group, whose barrier waits for its gradient meanwhile (a step the syncer already completed is
    answered with its stored result). A repaired chip joins at a step boundary, announced in the same control
    broadcast as in Decoupled DiLoCo's loop."""
    names = list(core.named)
    control = elastic or core.shrinkable
    # (step, tokens) of the host's last exchange the syncer answered: a step redone after a failed broadcast is
    # answered with that exchange's stored result, so its tokens are what was merged (and what the step logs).
    answered: tuple[int, int] | None = None
    while core.step < core.train_cfg.steps:
        is_host = core.collective.rank == 0  # the host (chip 0) never leaves a group it is in
        step = core.step + 1
        x, y = batch(step)
        t0 = time.perf_counter()
        loss = core.forward_backward(x, y)
        try:
            core.allreduce_grads()
            compute = time.perf_counter() - t0
            tokens = x.numel() * core.collective.size
            avg: dict[str, Tensor] = {}
            reform = False
            if is_host:
                assert link is not None
                t_sync = time.perf_counter()
                avg = link.exchange_grads(step, tokens, dict(zip(names, core.grads(), strict=True)))
                core.last_sync_s = time.perf_counter() - t_sync
                if answered is not None and answered[0] == step:
                    tokens = answered[1]
                answered = (step, tokens)
            if control:  # [group's state step or -1, re-form after this step]
                head = torch.tensor([int(avg[STATE_STEP_KEY]) if STATE_STEP_KEY in avg else -1,
                                     int(is_host and core.shrinkable and core.collective.pending_reform())],
                                    dtype=torch.int64)
                if core.collective.size > 1:
                    core.collective.broadcast_(head)
                reform = bool(head[1])
                if int(head[0]) >= 0:  # caught up: load the group's state, redo from its next step
                    core.optimizer.opt.zero_grad(set_to_none=False)
                    resume_sync(core, (int(head[0]), avg) if is_host else None)
                    if is_host and on_catch_up is not None:
                        on_catch_up(step, core.step)
                    continue
            if is_host:
                flat = flatten([avg[n] for n in names])
            else:
                flat = torch.empty(sum(p.numel() for p in core.named.values()))
            core.collective.broadcast_(flat)
        except CollectiveFailed as e:
            regroup_after(core, e, on_regroup)
            continue
        unflatten_into(flat, core.grads())
        core.step = step
        t1 = time.perf_counter()
        core.optimizer.step(step)
        core.last_compute_s = compute + time.perf_counter() - t1
        if is_host:
            on_step(step, loss, tokens)
        if reform:
            regroup(core, "membership changed", on_regroup)


def params_finite(tensors: Mapping[str, Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors.values())

