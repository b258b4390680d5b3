"""The learner's three training loops: `run_decoupled`, `run_diloco`, `run_ddp` (and elastic_ddp's variant).

Each drives a `LearnerCore` (diloco_chaos/trainers/learner/core.py) with a `Collective` for the learner's chips and, on
the host only, a link to the syncer. Every chip makes the same decisions because rank 0 decides and
broadcasts them inside the learner. Split from the core so each module stays small.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor

from diloco_chaos.trainers import mutations
from diloco_chaos.trainers.learner.core import (
    CollectiveFailed,
    DecoupledLink,
    LearnerCore,
    SyncLink,
    WaitOutcome,
)
from diloco_chaos.trainers.messages import STATE_STEP_KEY, flatten, unflatten_into

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
        if core.apply_wait_s > 0:
            block_for_merges(core, link)
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


def block_for_merges(core: LearnerCore, link: DecoupledLink) -> None:
    """diloco.apply_wait = block, host, after step t: for each fragment p last pulled at step s with s + tau <= t
    and not waited for yet, if no merged value answering that pull has arrived (`FragmentState.answered`), wait
    for one, at most `core.apply_wait_s` (the link's liveness bound) for all of them together, then go on. A
    value that arrives is applied after this step. Each wait is logged in `core.waits` (fragment, pulled step,
    seconds, outcome: applied, overwritten by a merge it was not in, or timed_out)."""
    tau = core.schedule.overlap
    deadline = time.monotonic() + core.apply_wait_s
    for p, st in enumerate(core.frags):
        s = link.pulled_step(p)
        if s is None or s <= st.waited or s + tau > core.step:
            continue
        st.waited = s
        if st.answered >= s:
            continue
        t0 = time.monotonic()
        while st.answered < s:
            left = deadline - time.monotonic()
            if left <= 0 or not link.wait_inbox(left):
                break
            for merged in link.poll():
                core.receive(merged)
        outcome: WaitOutcome = "timed_out"
        if st.answered >= s and st.pending is not None:
            st.pending_apply_at = core.step  # what it waited for is applied after this step
            outcome = "overwritten" if st.pending.broadcast else "applied"
        core.waits.append((p, s, time.monotonic() - t0, outcome))


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
    publish, inside the step's time in the link (the deterministic mode's wait:
    diloco_chaos/trainers/learner/lockstep.py).
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
