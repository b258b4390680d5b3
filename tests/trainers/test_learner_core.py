"""Tests for the learner side (diloco_chaos/trainers/learner/core.py, learner_loops.py): LearnerCore's fragment
bookkeeping and the three learner loops with fake links."""

from __future__ import annotations

import pytest
import torch

from diloco_chaos.trainers.config import DilocoConfig, TrainConfig
from diloco_chaos.trainers.learner.core import LearnerCore
from diloco_chaos.trainers.learner.lockstep import await_round, due_here
from diloco_chaos.trainers.learner.loops import run_ddp, run_decoupled, run_diloco
from diloco_chaos.trainers.messages import FragmentPush, MergedFragment, Snapshot, flatten
from diloco_chaos.trainers.model import ModelConfig

MODEL = ModelConfig(seq_len=8, d_model=16, n_layers=1, n_heads=2, d_ff=32)
BATCH = 2
TOKENS = BATCH * MODEL.seq_len  # learner tokens per step (one chip)


def make(steps: int = 6, overlap: int = 2, sync_every: int = 4, fragments: int = 4) -> LearnerCore:
    return LearnerCore(
        learner=1, model_cfg=MODEL, train_cfg=TrainConfig(steps=steps, lr=1e-2, warmup_steps=0),
        diloco_cfg=DilocoConfig(fragments=fragments, sync_every=sync_every, overlap=overlap), seed=5,
    )


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    chunk = torch.randint(0, 256, (BATCH, MODEL.seq_len + 1), generator=g)
    return chunk[:, :-1], chunk[:, 1:]


def train(core: LearnerCore, n: int) -> None:
    for _ in range(n):
        core.inner_step(*batch(core.step + 1))


def params(core: LearnerCore) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in core.named.items()}


def merged(core: LearnerCore, p: int, version: int, value: float = 0.25, pulled_step: int | None = None
           ) -> MergedFragment:
    return MergedFragment(fragment=p, version=version, pulled_step=pulled_step,
                          tensors={n: torch.full_like(core.named[n], value) for n in core.partition[p]})


def no_step(step: int, loss: float, tokens: int) -> None:
    return None


# -- LearnerCore --------------------------------------------------------------------------------


def test_inner_step_counts_tokens_and_steps_for_every_fragment() -> None:
    core = make()
    loss, tokens = core.inner_step(*batch(1))
    assert tokens == TOKENS and core.step == 1
    assert loss > 0 and torch.isfinite(torch.tensor(loss))
    train(core, 2)
    assert [(st.c_steps, st.c_tokens, st.first_step) for st in core.frags] == [(3, 3 * TOKENS, 1)] * 4
    assert core.step_time_s > 0


def test_inner_step_changes_the_model() -> None:
    core = make()
    before = params(core)
    train(core, 1)
    assert any(not torch.equal(before[n], p) for n, p in core.named.items())
    assert core.finite()


def test_receive_ignores_versions_not_newer() -> None:
    core = make()
    train(core, 1)
    assert core.receive(merged(core, 0, 0)) is False  # same as the current version 0
    assert core.frags[0].pending is None
    assert core.receive(merged(core, 0, 2)) is True
    assert core.receive(merged(core, 0, 2)) is False  # same as the pending version
    assert core.receive(merged(core, 0, 1)) is False  # older than the pending version
    assert core.frags[0].pending is not None and core.frags[0].pending.version == 2
    assert core.receive(merged(core, 0, 3)) is True
    assert core.frags[0].pending.version == 3
    core.apply_fragment(0, 3, flatten([core.frags[0].pending.tensors[n] for n in core.partition[0]]))
    assert core.receive(merged(core, 0, 3)) is False  # not newer than the applied version
    assert core.receive(merged(core, 0, 1)) is False


def test_apply_fragment_from_tensors_equals_from_flat() -> None:
    """A lone chip applies a merged fragment's tensors directly; a group broadcasts them flat: same result."""
    a, b = make(), make()
    values = [torch.randn_like(a.named[n]) for n in a.partition[1]]
    a.apply_fragment(1, 4, values)
    b.apply_fragment(1, 4, flatten(values))
    for n in a.partition[1]:
        assert torch.equal(a.named[n], b.named[n])
    assert torch.equal(a.named[a.partition[1][0]], values[0])
    assert (a.frags[1].version, a.frags[1].c_steps) == (4, 0)
    untouched = a.partition[0][0]
    assert torch.equal(a.named[untouched], make().named[untouched])


def test_apply_waits_for_pulled_step_plus_overlap() -> None:
    core = make(overlap=2)
    train(core, 3)
    assert core.receive(merged(core, 1, 1, pulled_step=3))
    assert core.frags[1].pending_apply_at == 5
    assert core.due_applies() == []
    train(core, 1)  # step 4
    assert core.due_applies() == []
    train(core, 1)  # step 5 = pulled 3 + overlap 2
    assert core.due_applies() == [1]
    train(core, 1)
    assert core.due_applies() == [1]  # stays due until applied


def test_apply_late_arrival_is_applied_at_the_next_step() -> None:
    core = make(overlap=2)
    train(core, 4)
    assert core.receive(merged(core, 2, 1, pulled_step=1))  # 1 + 2 = 3 is already past
    assert core.frags[2].pending_apply_at == 5
    assert core.due_applies() == []
    train(core, 1)
    assert core.due_applies() == [2]


def test_apply_of_current_value_on_join_uses_next_step() -> None:
    core = make(overlap=2)
    train(core, 2)
    assert core.receive(merged(core, 3, 4, pulled_step=None))
    assert core.frags[3].pending_apply_at == 3
    assert core.due_applies() == []
    train(core, 1)
    assert core.due_applies() == [3]


def test_apply_fragment_overwrites_only_that_fragment() -> None:
    core = make()
    train(core, 3)
    before = params(core)
    names = core.partition[2]
    flat = flatten([torch.full_like(core.named[n], 0.5) for n in names])
    assert core.receive(merged(core, 2, 7, value=0.5))
    core.apply_fragment(2, 7, flat)
    for n, p in core.named.items():
        if n in names:
            assert torch.equal(p.detach(), torch.full_like(p, 0.5)), n
        else:
            assert torch.equal(p.detach(), before[n]), n
    st = core.frags[2]
    assert (st.version, st.c_steps, st.c_tokens, st.first_step, st.pending) == (7, 0, 0, 4, None)
    for q in (0, 1, 3):
        assert (core.frags[q].version, core.frags[q].c_steps, core.frags[q].c_tokens) == (0, 3, 3 * TOKENS)
    assert core.due_applies() == []
    train(core, 1)
    assert (core.frags[2].c_steps, core.frags[2].c_tokens) == (1, TOKENS)
    assert core.frags[0].c_steps == 4


def test_snapshot_is_a_copy() -> None:
    core = make()
    train(core, 2)
    snap = core.snapshot()
    frozen = {n: t.clone() for n, t in snap.tensors.items()}
    assert snap.step == 2 and snap.learner == 1
    assert snap.counters == [(0, 2, 2 * TOKENS, 1)] * 4
    train(core, 2)
    for n, t in snap.tensors.items():
        assert torch.equal(t, frozen[n]), n
    assert any(not torch.equal(snap.tensors[n], p.detach()) for n, p in core.named.items())
    assert snap.counters == [(0, 2, 2 * TOKENS, 1)] * 4 and snap.step == 2


def test_push_for_carries_counters_and_is_empty_without_progress() -> None:
    core = make()
    train(core, 3)
    core.apply_fragment(0, 2, flatten([core.named[n].detach() for n in core.partition[0]]))
    train(core, 1)
    core.apply_fragment(1, 1, flatten([core.named[n].detach() for n in core.partition[1]]))
    snap = core.snapshot()
    empty = snap.push_for(1, core.partition[1])
    assert empty.c_steps == 0 and empty.tensors == {}
    q = snap.push_for(0, core.partition[0], final=True)
    assert isinstance(q, FragmentPush)
    assert (q.learner, q.fragment, q.base_version, q.c_steps, q.c_tokens, q.first_step, q.last_step, q.final) == \
        (1, 0, 2, 1, TOKENS, 4, 4, True)
    assert set(q.tensors) == set(core.partition[0])
    for n in core.partition[0]:
        assert torch.equal(q.tensors[n], core.named[n].detach())


def test_push_for_on_handmade_snapshot() -> None:
    snap = Snapshot(learner=0, step=9, step_time_s=0.1, tensors={"a": torch.ones(2), "b": torch.zeros(3)},
                    counters=[(1, 0, 0, 10), (2, 4, 40, 6)])
    assert snap.push_for(0, ["a"]).tensors == {}
    q = snap.push_for(1, ["b"])
    assert list(q.tensors) == ["b"] and (q.c_steps, q.c_tokens, q.first_step, q.last_step) == (4, 40, 6, 9)
    assert q.final is False and q.step_time_s == 0.1


# -- the loops with fake links --------------------------------------------------------------------


class FakeDecoupledLink:
    """Records publishes and pushes; poll() after step s returns the fragments scheduled for s."""

    def __init__(self, core: LearnerCore, deliveries: dict[int, list[MergedFragment]]) -> None:
        self.core = core
        self.deliveries = deliveries
        self.published: list[tuple[int, list[tuple[int, int, int, int]]]] = []
        self.pushes: list[FragmentPush] = []
        self.polls: list[int] = []
        self.stop_requested = False
        self.stop_after: int | None = None
        """The step after which the fake syncer says the run's total budget is reached."""

    def publish(self, snapshot: Snapshot, partition: list[list[str]]) -> None:
        assert partition == self.core.partition
        self.published.append((snapshot.step, snapshot.counters))

    def push(self, push: FragmentPush) -> None:
        self.pushes.append(push)

    def poll(self) -> list[MergedFragment]:
        self.polls.append(self.core.step)
        self.stop_requested = self.stop_after is not None and self.core.step >= self.stop_after
        return self.deliveries.get(self.core.step, [])


def test_run_decoupled_trains_past_its_steps_under_a_total_budget_until_told_to_stop() -> None:
    core = make(steps=4)
    link = FakeDecoupledLink(core, {})
    link.stop_after = 7
    run_decoupled(core, batch, link, no_step, max_steps=16)
    assert core.step == 7, "it trained on past train.steps (4) and stopped after the step the syncer named"
    assert [q.fragment for q in link.pushes] == [0, 1, 2, 3] and all(q.last_step == 7 for q in link.pushes)
    core2 = make(steps=4)
    run_decoupled(core2, batch, FakeDecoupledLink(core2, {}), no_step, max_steps=6)
    assert core2.step == 6, "never told to stop: bounded by max_steps"


def test_run_decoupled_applies_publishes_and_pushes_final() -> None:
    core = make(steps=6, overlap=2)
    m1 = merged(core, 1, 1, value=0.125, pulled_step=1)  # arrives after step 2 -> applied after step 3
    m2 = merged(core, 2, 1, value=-0.25, pulled_step=None)  # arrives after step 5 -> applied after step 6
    link = FakeDecoupledLink(core, {2: [m1], 5: [m2]})
    steps: list[tuple[int, int]] = []
    applies: list[tuple[int, list[tuple[int, int]]]] = []
    run_decoupled(core, batch, link, lambda s, loss, tok: steps.append((s, tok)),
                  on_apply=lambda s, a: applies.append((s, a)))
    assert core.step == 6
    assert steps == [(s, TOKENS) for s in range(1, 7)]
    assert link.polls == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in link.published] == [1, 2, 3, 4, 5, 6]
    assert applies == [(3, [(1, 1)]), (6, [(2, 1)])]
    # the publish after step 3 already shows fragment 1 applied (version 1, counters reset)
    assert link.published[2][1][1] == (1, 0, 0, 4)
    assert link.published[3][1][1] == (1, 1, TOKENS, 4)
    # fragment 2 was applied after the last step: nothing trained on top of it
    for n in core.partition[2]:
        assert torch.equal(core.named[n].detach(), torch.full_like(core.named[n], -0.25))
    assert [f.version for f in core.frags] == [0, 1, 1, 0]
    # final unsolicited pushes only for fragments with progress (fragment 2 has c_steps 0)
    assert [q.fragment for q in link.pushes] == [0, 1, 3]
    assert all(q.final and q.last_step == 6 and q.tensors for q in link.pushes)
    assert [(q.c_steps, q.c_tokens, q.base_version, q.first_step) for q in link.pushes] == \
        [(6, 6 * TOKENS, 0, 1), (3, 3 * TOKENS, 1, 4), (6, 6 * TOKENS, 0, 1)]


def test_run_decoupled_stops_early_and_ignores_stale_versions() -> None:
    core = make(steps=10)
    stale = merged(core, 0, 0, pulled_step=1)
    link = FakeDecoupledLink(core, {1: [stale]})
    run_decoupled(core, batch, link, no_step, should_stop=lambda: core.step >= 3)
    assert core.step == 3 and len(link.published) == 3
    assert [f.version for f in core.frags] == [0, 0, 0, 0]
    assert [q.fragment for q in link.pushes] == [0, 1, 2, 3]


class EchoSyncLink:
    """Synchronous link that hands back exactly what it was given (a one-learner syncer that averages)."""

    def __init__(self) -> None:
        self.params_calls: list[tuple[int, int, int]] = []
        self.grads_calls: list[tuple[int, int]] = []

    def exchange_grads(self, step: int, tokens: int, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.grads_calls.append((step, tokens))
        return {n: g.clone() for n, g in grads.items()}

    def exchange_params(self, round_: int, step: int, tokens: int,
                        params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.params_calls.append((round_, step, tokens))
        return {n: p.clone() for n, p in params.items()}


def test_run_diloco_exchanges_every_h_steps_and_a_final_partial_round() -> None:
    core = make(steps=10, sync_every=4)
    link = EchoSyncLink()
    rounds: list[tuple[int, int]] = []
    run_diloco(core, batch, link, no_step, on_round=lambda r, s: rounds.append((r, s)))
    assert core.step == 10
    assert link.params_calls == [(1, 4, 4 * TOKENS), (2, 8, 4 * TOKENS), (3, 10, 2 * TOKENS)]
    assert rounds == [(1, 4), (2, 8), (3, 10)]
    # an echoing syncer changes nothing: same weights as plain local training
    ref = make(steps=10, sync_every=4)
    train(ref, 10)
    for n, p in core.named.items():
        assert torch.equal(p.detach(), ref.named[n].detach()), n


def test_run_diloco_no_extra_round_when_steps_is_a_multiple_of_h() -> None:
    core = make(steps=8, sync_every=4)
    link = EchoSyncLink()
    run_diloco(core, batch, link, no_step)
    assert [c[:2] for c in link.params_calls] == [(1, 4), (2, 8)]


def test_run_diloco_installs_the_merged_model() -> None:
    core = make(steps=4, sync_every=4)

    class ZeroLink(EchoSyncLink):
        def exchange_params(self, round_, step, tokens, params):
            super().exchange_params(round_, step, tokens, params)
            return {n: torch.zeros_like(p) for n, p in params.items()}

    run_diloco(core, batch, ZeroLink(), no_step)
    assert all(bool((p == 0).all()) for p in core.named.values())


def test_run_ddp_exchanges_every_step() -> None:
    core = make(steps=5)
    link = EchoSyncLink()
    seen: list[tuple[int, int]] = []
    run_ddp(core, batch, link, lambda s, loss, tok: seen.append((s, tok)))
    assert core.step == 5
    assert link.grads_calls == [(s, TOKENS) for s in range(1, 6)]
    assert seen == [(s, TOKENS) for s in range(1, 6)]
    ref = make(steps=5)
    train(ref, 5)
    for n, p in core.named.items():
        assert torch.equal(p.detach(), ref.named[n].detach()), n


def test_run_ddp_uses_the_returned_gradient() -> None:
    scaled, ref = make(steps=3), make(steps=3)

    class ScaleLink(EchoSyncLink):
        def exchange_grads(self, step, tokens, grads):
            super().exchange_grads(step, tokens, grads)
            return {n: g * 1000.0 for n, g in grads.items()}

    run_ddp(scaled, batch, ScaleLink(), no_step)
    run_ddp(ref, batch, EchoSyncLink(), no_step)
    # gradient clipping at 1.0 makes the two differ: the learner did apply what came back
    assert any(not torch.equal(p.detach(), ref.named[n].detach()) for n, p in scaled.named.items())


def test_cosine_schedule_warms_up_then_anneals_to_the_floor() -> None:
    from diloco_chaos.harness.config.scenario import from_dict
    from diloco_chaos.trainers.learner.core import inner_lr

    cfg = from_dict({"train": {"lr_schedule": "cosine", "steps": 300, "warmup_steps": 20, "lr": 3e-3,
                               "min_lr_ratio": 0.1}}).train
    assert inner_lr(10, cfg) == pytest.approx(1.5e-3)
    assert inner_lr(20, cfg) == pytest.approx(3e-3)
    assert inner_lr(160, cfg) == pytest.approx(3e-3 * (0.1 + 0.9 * 0.5))
    assert inner_lr(300, cfg) == pytest.approx(3e-4) and inner_lr(600, cfg) == pytest.approx(3e-4)
    assert inner_lr(300, from_dict({"train": {"steps": 300}}).train) == pytest.approx(3e-3)  # constant default


def test_run_decoupled_reports_each_step_before_publishing_its_snapshot() -> None:
    """A restarted learner resumes after the last step it reported; the link answers pulls from the published
    snapshot. Reported first, a step its pushes may hold is never trained (and merged) a second time by a
    learner killed between the two."""
    core = make(steps=4)
    order: list[tuple[str, int]] = []
    link = FakeDecoupledLink(core, {})
    publish = link.publish

    def recording_publish(snapshot: Snapshot, partition: list[list[str]]) -> None:
        order.append(("publish", snapshot.step))
        publish(snapshot, partition)

    link.publish = recording_publish  # type: ignore[method-assign]
    run_decoupled(core, batch, link, lambda s, loss, tok: order.append(("step", s)))
    assert order == [(kind, s) for s in range(1, 5) for kind in ("step", "publish")]


def test_lockstep_await_round_holds_the_step_until_the_due_fragments_merge_arrives() -> None:
    """Deterministic mode: after step s, the host takes merged values off the link until every fragment due
    at s holds one pulled at s; they are applied at their usual step (s + tau), not at once. A wait that gives
    up returns False."""
    core = make(steps=8, overlap=2)
    for _ in range(3):
        core.inner_step(*batch(core.step + 1))
    due = due_here(core)
    assert due, "step 3 is a sync point of some fragment here"
    late = [merged(core, p, 1, value=0.5, pulled_step=3) for p in due]
    link = FakeDecoupledLink(core, {})
    waits: list[int] = []

    def wait() -> bool:  # the merge arrives on the second wait
        waits.append(1)
        if len(waits) == 2:
            link.deliveries[core.step] = late
        return len(waits) < 5

    assert await_round(core, link, wait) is True and len(waits) == 2
    assert all(core.frags[p].pending is not None and core.frags[p].pending_apply_at == 5 for p in due)
    assert core.due_applies() == []
    fresh = make(steps=8)
    assert await_round(fresh, FakeDecoupledLink(fresh, {}), lambda: False) is True, "no sync point before step 1"
    never = make(steps=8)
    for _ in range(3):
        never.inner_step(*batch(never.step + 1))
    assert await_round(never, FakeDecoupledLink(never, {}), lambda: False) is False
