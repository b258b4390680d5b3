"""Tests for diloco_chaos.trainers.syncers.decoupled: the fragment clock, push validation, quorum/grace polling and
merges.

Everything runs on plain float clocks; no sockets, threads or sleeps.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch.testing import assert_close

from diloco_chaos.trainers.config import DilocoConfig
from diloco_chaos.trainers.messages import FragmentPush
from diloco_chaos.trainers.model import ModelConfig
from diloco_chaos.trainers.syncers.decoupled import DecoupledSyncer
from diloco_chaos.trainers.syncers.decoupled_records import PushOutcome

MODEL = ModelConfig(seq_len=8, d_model=16, n_layers=1, n_heads=2, d_ff=32)
P = 4  # fragments; with H = 4, fragment s % 4 is due after step s


def make(min_quorum: int = 1, learners: int = 2, **kw) -> DecoupledSyncer:
    cfg = DilocoConfig(fragments=P, sync_every=4, overlap=2, min_quorum=min_quorum, grace_gamma=0.5,
                       grace_cap_s=0.5, **kw)
    return DecoupledSyncer(MODEL, cfg, seed=3, num_learners=learners)


def alive(*ids: int) -> frozenset[int]:
    return frozenset(ids)


def snapshot_params(s: DecoupledSyncer) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in s.params.items()}


def push(s: DecoupledSyncer, learner: int, p: int, c_steps: int = 4, c_tokens: int = 64, shift: float = 0.01,
         final: bool = False, step_time_s: float = 0.0) -> FragmentPush:
    """A push whose tensors are the global fragment shifted by `shift` (a nonzero outer gradient)."""
    tensors = {n: t.clone() + shift for n, t in s.fragment(p).items()} if c_steps > 0 else {}
    return FragmentPush(learner=learner, fragment=p, base_version=s.versions[p], c_steps=c_steps, c_tokens=c_tokens,
                        first_step=1, last_step=c_steps, step_time_s=step_time_s, tensors=tensors, final=final)


def open_round(s: DecoupledSyncer, p: int, now: float = 10.0, who: frozenset[int] = alive(0, 1)) -> int:
    """Learner 0 reaches step p, fragment p's first sync point (it opens p's round); returns the round id."""
    assert 1 <= p <= 3
    pulls = s.on_meta(0, p, 0.0, now, who)
    mine = [q for q in pulls if q.fragment == p]
    assert len(mine) == 1 and mine[0].learners == alive(0)
    return mine[0].round_id


def answer_all(s: DecoupledSyncer, pulls: list, now: float, steps: dict[int, int]) -> None:
    """Every pulled learner answers at once with a copy whose steps end at its current step."""
    for q in pulls:
        for m in q.learners:
            a = push(s, m, q.fragment)
            a.last_step = steps[m]
            assert s.on_push(a, q.round_id, now)[0] is PushOutcome.ACCEPTED


# -- reports and rounds -------------------------------------------------------------------------


def test_a_learner_reaching_a_sync_point_opens_that_fragments_round_and_others_join_it() -> None:
    s = make(min_quorum=1)
    pulls = s.on_meta(0, 1, 0.0, 1.0, alive(0, 1))
    assert [(q.fragment, q.round_id, q.learners) for q in pulls] == [(1, 1, alive(0))]
    assert [(q.fragment, q.round_id, q.learners) for q in s.on_meta(0, 2, 0.0, 1.1, alive(0, 1))] == [
        (2, 1, alive(0))]
    assert s.on_meta(0, 2, 0.0, 1.2, alive(0, 1)) == [], "the same step again reaches nothing new"
    # learner 1 reaches fragment 1's sync point while its round is open: it joins (pulled into round 1)
    assert [(q.fragment, q.round_id, q.learners) for q in s.on_meta(1, 1, 0.0, 1.3, alive(0, 1))] == [
        (1, 1, alive(1))]
    assert s.rounds[1] is not None and s.rounds[1].reporters == {0, 1}
    assert s.rounds[0] is None and s.rounds[3] is None and s.clock == 2


def test_a_report_after_its_round_merged_is_late_and_the_learner_joins_the_next_round() -> None:
    s = make(min_quorum=1, grace_enabled=False)
    rid = open_round(s, 1)
    assert s.on_push(push(s, 0, 1), rid, 10.1)[0] is PushOutcome.ACCEPTED
    (rec,) = s.poll(10.1, alive(0, 1))[0]
    assert rec.participants == [0]
    assert s.on_meta(1, 1, 0.0, 10.2, alive(0, 1)) == [], "late: it opens no round (no merge per learner)"
    assert s.pending[1] == {1} and s.rounds[1] is None
    nxt = [q for step in range(2, 6) for q in s.on_meta(0, step, 0.0, 11.0 + step, alive(0, 1)) if q.fragment == 1]
    assert [(q.round_id, q.learners) for q in nxt] == [(rid + 1, alive(0, 1))], "pulled when round 2 opens"
    assert s.pending[1] == set()


def test_rounds_follow_the_leader_one_merge_per_fragment_per_h_of_its_steps() -> None:
    """Two learners, one at half the other's speed, K = 1 without grace, every answer at once. The fast learner
    reaches fragment 1's sync point 10 times in 40 steps, the slow one 5 times in 20: rounds must number 10 (one
    per H of the leader's steps), not 15 (a round per learner per sync point: the divergence of learner-timed
    pushes, docs/algorithm.md)."""
    s = make(min_quorum=1, grace_enabled=False)
    steps = {0: 0, 1: 0}
    merges = []
    for t in range(40):
        for m in (0, 1) if t % 2 == 0 else (0,):
            steps[m] += 1
            pulls = s.on_meta(m, steps[m], 0.01, float(t), alive(0, 1))
            answer_all(s, pulls, float(t), steps)
            merges += [r for r in s.poll(float(t), alive(0, 1))[0] if r.fragment == 1]
    assert len(merges) == 10
    slow_in = [r for r in merges if 1 in r.participants]
    assert len(slow_in) == 5, "the slow learner is in a merge once per sync point of its own"
    assert sum(len(r.participants) for r in merges) == 15


def test_rounds_follow_the_learners_still_here_when_the_leaders_leave() -> None:
    """K = 1: learner 0 reached step 12 and left; learner 1 at step 4 must open fragment 1's round at step 5
    instead of being late until it passes step 12 (a run's tail would otherwise be global downtime)."""
    s = make(min_quorum=1, grace_enabled=False)
    steps = {0: 0, 1: 0}
    for step in range(1, 13):
        for m in (0, 1) if step <= 4 else (0,):
            steps[m] = step
            answer_all(s, s.on_meta(m, step, 0.01, float(step), alive(0, 1)), float(step), steps)
            s.poll(float(step), alive(0, 1))
    assert s.lead[1] == 3  # learner 0 opened fragment 1's rounds at steps 1, 5 and 9
    assert copy.deepcopy(s).on_meta(1, 5, 0.01, 9.0, alive(0, 1)) == [], "with learner 0 here, 1 is late"
    pulls = s.on_meta(1, 5, 0.01, 9.0, alive(1))
    assert [(q.fragment, q.learners) for q in pulls] == [(1, alive(1))]


def test_rounds_follow_the_others_when_the_leader_stalls_for_h_step_times() -> None:
    """Learner 0 (the leader, step 12) stops stepping but stays connected; learner 1 (0.1 s a step) reaches
    fragment 1's sync point at step 5. Within H = 4 step times of the leader's last report it is late; after
    that the leader no longer drives the rounds and learner 1's report opens one."""
    def run_to_12() -> DecoupledSyncer:
        s = make(min_quorum=1, grace_enabled=False)
        steps = {0: 0, 1: 0}
        for step in range(1, 13):
            for m in (0, 1) if step <= 4 else (0,):
                steps[m] = step
                answer_all(s, s.on_meta(m, step, 0.1, 0.1 * step, alive(0, 1)), 0.1 * step, steps)
                s.poll(0.1 * step, alive(0, 1))
        return s

    assert run_to_12().on_meta(1, 5, 0.1, 1.2 + 0.3, alive(0, 1)) == [], "0.3 s < 4 x 0.1 s: the leader drives"
    pulls = run_to_12().on_meta(1, 5, 0.1, 1.2 + 0.5, alive(0, 1))
    assert [(q.fragment, q.learners) for q in pulls] == [(1, alive(1))]


def test_a_jumping_step_reports_each_fragment_once() -> None:
    """A learner back from an outage reports a step far ahead: one pull per fragment, not one per sync point."""
    s = make(min_quorum=1)
    s.on_meta(0, 1, 0.0, 0.5, alive(0, 1))
    pulls = s.on_meta(0, 40, 0.0, 1.0, alive(0, 1))
    assert sorted(q.fragment for q in pulls) == [0, 1, 2, 3]
    assert [q.learners for q in pulls if q.fragment == 1] == [alive(0)], "fragment 1: pulled again, same round"
    assert s.clock == 40
    fresh = make(min_quorum=1)  # first seen at step 40 (a syncer that restarted): only step 40's sync point
    assert [q.fragment for q in fresh.on_meta(0, 40, 0.0, 1.0, alive(0, 1))] == [0]


def test_k2_round_waits_for_a_second_learner_at_the_sync_point_and_a_gone_one_does_not_lower_k() -> None:
    """K = 2 is a floor on fresh updates: learner 1 leaves, the round waits (no deadline); when it is back and
    reaches fragment 1's next sync point it joins the open round and the round merges both."""
    s = make(min_quorum=2)
    rid = open_round(s, 1)
    assert s.on_push(push(s, 0, 1), rid, 10.1)[0] is PushOutcome.ACCEPTED
    assert s.poll(50.0, alive(0)) == ([], None)
    pulls = [q for step in range(1, 6) for q in s.on_meta(1, step, 0.0, 51.0, alive(0, 1)) if q.fragment == 1]
    assert [(q.round_id, q.learners) for q in pulls] == [(rid, alive(1)), (rid, alive(1))]
    assert s.on_push(push(s, 1, 1), rid, 51.0)[0] is PushOutcome.ACCEPTED
    assert s.rounds[1] is not None and s.rounds[1].quorum_at == 51.0
    (rec,) = s.poll(51.0, alive(0, 1))[0]
    assert rec.participants == [0, 1] and rec.carried == []


def test_a_declined_answer_does_not_count_toward_k_and_is_pulled_again_at_the_next_step() -> None:
    s = make(min_quorum=2)
    rid = open_round(s, 1)
    s.on_meta(1, 1, 0.0, 10.0, alive(0, 1))
    assert s.on_push(push(s, 1, 1, c_steps=0, c_tokens=0), rid, 10.0)[0] is PushOutcome.DECLINED
    assert s.on_push(push(s, 0, 1), rid, 10.1)[0] is PushOutcome.ACCEPTED
    assert s.poll(10.2, alive(0, 1)) == ([], None), "a decline is no update: K = 2 is not reached"
    again = [q for q in s.on_meta(1, 2, 0.0, 10.3, alive(0, 1)) if q.fragment == 1]
    assert [(q.round_id, q.learners) for q in again] == [(rid, alive(1))]
    assert s.on_push(push(s, 1, 1), rid, 10.4)[0] is PushOutcome.ACCEPTED
    (rec,) = s.poll(10.4, alive(0, 1))[0]
    assert rec.participants == [0, 1]


def test_an_answer_after_its_round_merged_is_carried_into_the_next_round() -> None:
    """Learner 1 reached the sync point but its answer came after the round merged: it is held, merged with
    fragment 1's next round (not counted toward K there), and learner 1 is pulled again when that round opens."""
    s = make(min_quorum=1, grace_enabled=False)
    rid = open_round(s, 1)
    s.on_meta(1, 1, 0.0, 10.0, alive(0, 1))
    s.on_push(push(s, 0, 1), rid, 10.1)
    (first,) = s.poll(10.1, alive(0, 1))[0]
    assert first.participants == [0] and s.pending[1] == {1}
    late = push(s, 1, 1, c_steps=2, c_tokens=32)
    assert s.on_push(late, rid, 10.2) == (PushOutcome.CARRIED, None)
    assert s.held[1] == {1: late}
    nxt = [q for step in range(2, 6) for q in s.on_meta(0, step, 0.0, 11.0, alive(0, 1)) if q.fragment == 1]
    assert [q.learners for q in nxt] == [alive(0, 1)]
    st = s.round_state(1, alive(0, 1))
    assert st is not None and st.reported == frozenset() and st.carried == alive(1)
    assert s.poll(11.0, alive(0, 1)) == ([], None), "a carried push does not make the quorum"
    s.on_push(push(s, 0, 1), rid + 1, 11.1)
    (rec,) = s.poll(11.1, alive(0, 1))[0]
    assert rec.participants == [0, 1] and rec.carried == [1] and rec.c_tokens == [64, 32]


# -- pushes -------------------------------------------------------------------------------------


def test_a_carried_push_from_before_a_rejoin_is_dropped_on_rejoin() -> None:
    """Learner 1's late answer for fragment 1 (based on version 0) is held while learner 0's merge makes version 1;
    learner 1 then rejoins, where it is sent version 1 and its counters reset: the held copy is dropped, never
    merged. Its held copy of fragment 2, based on the current version 0, stays."""
    s = make(min_quorum=1, grace_enabled=False)
    rid = open_round(s, 1, who=alive(0))
    late = push(s, 1, 1)
    s.on_push(push(s, 0, 1), rid, 10.1)
    s.poll(10.1, alive(0))
    assert s.versions[1] == 1
    assert s.on_push(late, rid, 10.2)[0] is PushOutcome.CARRIED and s.held[1] == {1: late}
    keep = push(s, 1, 2)
    assert s.on_push(keep, 7, 10.2)[0] is PushOutcome.CARRIED
    s.on_join(1)
    assert s.drop_carried(1) == [late] and s.held[1] == {}
    assert s.held[2] == {1: keep}


def test_push_to_a_round_that_is_not_open_is_carried() -> None:
    s = make()
    rid = open_round(s, 1)
    assert s.on_push(push(s, 0, 1), rid + 7, 10.1) == (PushOutcome.CARRIED, None)
    assert s.on_push(push(s, 1, 2), 1, 10.1) == (PushOutcome.CARRIED, None)  # fragment 2 has no open round
    assert s.held[2] and s.rounds[1] is not None and s.rounds[1].fresh == set()


def test_unknown_fragment_is_rejected() -> None:
    s = make()
    bad = push(s, 0, 1)
    bad.fragment = P
    assert s.on_push(bad, 1, 1.0) == (PushOutcome.REJECTED_FRAGMENT, None)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_push_is_rejected_and_never_merged(bad: float) -> None:
    s = make()
    before = snapshot_params(s)
    rid = open_round(s, 1, who=alive(0))
    q = push(s, 0, 1)
    name = next(iter(q.tensors))
    q.tensors[name].view(-1)[0] = bad
    assert s.on_push(q, rid, 10.1) == (PushOutcome.REJECTED_NONFINITE, None)
    assert s.rounds[1] is not None and s.rounds[1].pushes == {}
    merges, _ = s.poll(100.0, alive(0))
    assert merges == []
    assert s.drain(200.0) == []
    assert s.versions[1] == 0 and s.merges == 0
    for n, t in s.params.items():
        assert torch.isfinite(t).all(), n
        assert torch.equal(t, before[n]), n


def test_wrong_shape_names_or_dtype_are_rejected() -> None:
    s = make()
    rid = open_round(s, 1)
    q = push(s, 0, 1)
    name = next(iter(q.tensors))
    q.tensors[name] = torch.zeros(q.tensors[name].numel() + 1)
    assert s.on_push(q, rid, 10.1) == (PushOutcome.REJECTED_SHAPE, None)
    q = push(s, 0, 1)
    q.tensors.pop(name)
    assert s.on_push(q, rid, 10.1) == (PushOutcome.REJECTED_SHAPE, None)
    q = push(s, 0, 1)
    q.tensors["not.a.tensor"] = torch.zeros(1)
    assert s.on_push(q, rid, 10.1) == (PushOutcome.REJECTED_SHAPE, None)
    q = push(s, 0, 1)
    q.tensors = {n: t.clone() for n, t in s.fragment(2).items()}  # another fragment's tensors
    assert s.on_push(q, rid, 10.1) == (PushOutcome.REJECTED_SHAPE, None)
    for dtype in (torch.float16, torch.int32, torch.uint8):  # right names and shapes, another dtype: once merged
        q = push(s, 0, 1)                                       # cast to float32 (a hostile peer's PUSH)
        q.tensors = {n: t.to(dtype) for n, t in q.tensors.items()}
        assert s.on_push(q, rid, 10.1) == (PushOutcome.REJECTED_SHAPE, None), dtype
    assert s.rounds[1] is not None and s.rounds[1].pushes == {}


def test_second_push_from_same_learner_supersedes_first() -> None:
    s = make()
    rid = open_round(s, 1, who=alive(0))
    a = push(s, 0, 1, c_steps=2, c_tokens=32, shift=0.5)
    b = push(s, 0, 1, c_steps=3, c_tokens=48, shift=0.01)
    assert s.on_push(a, rid, 10.1) == (PushOutcome.ACCEPTED, None)
    outcome, superseded = s.on_push(b, rid, 10.2)
    assert outcome is PushOutcome.ACCEPTED and superseded is a
    assert s.rounds[1] is not None and s.rounds[1].pushes == {0: b}
    assert s.rounds[1].quorum_at == 10.1  # the quorum time is the first time K pushes were in
    merges, _ = s.poll(10.2, alive(0))
    assert len(merges) == 1 and merges[0].c_steps == [3] and merges[0].c_tokens == [48]


# -- poll, quorum and grace ---------------------------------------------------------------------


def test_poll_merges_once_all_awaited_learners_reported() -> None:
    s = make()
    rid = open_round(s, 2)
    s.on_push(push(s, 0, 2), rid, 10.1)
    s.on_push(push(s, 1, 2), rid, 10.2)
    merges, wake = s.poll(10.2, alive(0, 1))
    assert wake is None
    assert len(merges) == 1
    rec = merges[0]
    assert (rec.fragment, rec.version, rec.round_id, rec.participants) == (2, 1, rid, [0, 1])
    assert "all 2 alive learners in" in rec.reason
    assert rec.started_at == 10.0 and rec.quorum_at == 10.1 and rec.merged_at == 10.2
    assert s.rounds[2] is None and s.versions[2] == 1 and s.merges == 1
    for n, t in rec.tensors.items():
        assert torch.equal(t, s.params[n])
    assert s.poll(10.3, alive(0, 1)) == ([], None)  # merged exactly once


def test_poll_waits_in_grace_window_then_merges_at_wake() -> None:
    s = make()
    rid = open_round(s, 1)
    s.on_push(push(s, 0, 1), rid, 10.1)
    before = snapshot_params(s)
    merges, wake = s.poll(10.2, alive(0, 1))
    assert merges == []
    assert wake == pytest.approx(10.1 + 0.5)  # no step-time estimate yet: the grace window is the cap
    assert s.versions[1] == 0
    for n, t in s.params.items():
        assert torch.equal(t, before[n])
    merges, wake2 = s.poll(wake - 1e-6, alive(0, 1))
    assert merges == [] and wake2 == pytest.approx(wake)
    merges, wake3 = s.poll(wake, alive(0, 1))
    assert wake3 is None
    assert len(merges) == 1 and merges[0].participants == [0]
    assert "grace expired" in merges[0].reason
    assert merges[0].grace_s == pytest.approx(0.5)


def test_grace_window_adapts_to_measured_step_time() -> None:
    s = make()
    s.on_meta(0, 1, 0.2, 10.0, alive(0, 1))  # opens fragment 1; learner 0 steps in 0.2 s
    s.on_push(push(s, 0, 1), 1, 10.1)
    _, wake = s.poll(10.1, alive(0, 1))
    # grace = gamma * (tau * xi_step - xi_quorum - xi_sync) = 0.5 * (2 * 0.2 - 0.1 - 0) = 0.15
    assert wake == pytest.approx(10.1 + 0.15)


def test_k2_waits_without_deadline_below_quorum() -> None:
    s = make(min_quorum=2)
    s.on_meta(1, 1, 0.0, 9.0, alive(0, 1))
    rid = open_round(s, 1)
    s.on_push(push(s, 0, 1), rid, 10.1)
    assert s.poll(50.0, alive(0, 1)) == ([], None)
    s.on_push(push(s, 1, 1), rid, 10.2)
    assert s.rounds[1] is not None and s.rounds[1].quorum_at == 10.2
    merges, _ = s.poll(10.2, alive(0, 1))
    assert len(merges) == 1 and merges[0].participants == [0, 1]


def test_merge_of_unchanged_copy_keeps_fragment_and_bumps_version() -> None:
    s = make()
    before = snapshot_params(s)
    rid = open_round(s, 3, who=alive(0))
    s.on_push(push(s, 0, 3, shift=0.0), rid, 10.1)
    merges, _ = s.poll(10.1, alive(0))
    assert len(merges) == 1
    rec = merges[0]
    assert rec.version == 1 and s.versions[3] == 1 and s.merges == 1
    assert rec.outer_grad_norm == 0.0
    for n, t in s.params.items():
        assert torch.equal(t, before[n]), n


def test_merge_moves_fragment_and_only_that_fragment() -> None:
    s = make()
    before = snapshot_params(s)
    rid = open_round(s, 3, who=alive(0))
    s.on_push(push(s, 0, 3, shift=0.01), rid, 10.1)
    (rec,) = s.poll(10.1, alive(0))[0]
    assert rec.outer_grad_norm > 0
    inside = set(s.partition[3])
    for n, t in s.params.items():
        if n in inside:
            assert not torch.equal(t, before[n]), n
            # single learner, first outer step: Theta - lr*(1+mu)*Delta, Delta = Theta - theta = -0.01
            # (RDA of one vector is the vector itself)
            assert_close(t, before[n] + DilocoConfig().outer_lr * 1.9 * 0.01, rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(t, before[n]), n


def test_merge_record_token_weights() -> None:
    s = make()
    rid = open_round(s, 1)
    s.on_push(push(s, 0, 1, c_steps=2, c_tokens=64), rid, 10.1)
    s.on_push(push(s, 1, 1, c_steps=4, c_tokens=96), rid, 10.1)
    (rec,) = s.poll(10.1, alive(0, 1))[0]
    raw = [64**2 / 2, 96**2 / 4]
    assert rec.weights == pytest.approx([r / sum(raw) for r in raw])
    assert rec.c_steps == [2, 4] and rec.c_tokens == [64, 96]
    assert sum(rec.weights) == pytest.approx(1.0)


def test_merge_record_equal_weights_without_token_weighting() -> None:
    s = make(token_weighting=False)
    rid = open_round(s, 1)
    s.on_push(push(s, 0, 1, c_steps=2, c_tokens=64), rid, 10.1)
    s.on_push(push(s, 1, 1, c_steps=4, c_tokens=96), rid, 10.1)
    (rec,) = s.poll(10.1, alive(0, 1))[0]
    assert rec.weights == pytest.approx([0.5, 0.5])


def test_drain_merges_rounds_with_data_and_closes_all() -> None:
    s = make()
    s.on_meta(0, 2, 0.0, 10.0, alive(0, 1))  # opens fragments 1 and 2
    s.on_push(push(s, 0, 1), 1, 10.1)  # fragment 1 waits for learner 1 in the grace window
    assert s.poll(10.1, alive(0, 1))[0] == []
    recs = s.drain(10.2)
    assert [(r.fragment, r.participants, r.reason) for r in recs] == [(1, [0], "drain at end of run")]
    assert all(r is None for r in s.rounds)
    assert s.versions == [0, 1, 0, 0] and s.merges == 1


def test_final_push_without_round_is_carried_and_drained() -> None:
    s = make()
    q = push(s, 1, 3, final=True)
    assert s.on_push(q, None, 20.0) == (PushOutcome.CARRIED, None)
    assert s.rounds[3] is None and s.held[3] == {1: q}
    assert s.poll(20.0, alive(0, 1)) == ([], None)
    (rec,) = s.drain(21.0)
    assert rec.participants == [1] and rec.carried == [1] and s.versions[3] == 1 and s.held[3] == {}


def test_final_push_joins_the_open_round() -> None:
    s = make()
    rid = open_round(s, 1)
    assert s.on_push(push(s, 0, 1), rid, 10.1)[0] is PushOutcome.ACCEPTED
    assert s.on_push(push(s, 1, 1, final=True), None, 10.2) == (PushOutcome.ACCEPTED, None)
    assert s.round_ids[1] == rid  # no new round
    merges, _ = s.poll(10.2, alive(0, 1))
    assert len(merges) == 1 and merges[0].participants == [0, 1] and merges[0].round_id == rid


def test_final_push_with_no_progress_declines() -> None:
    s = make()
    assert s.on_push(push(s, 0, 2, c_steps=0, c_tokens=0, final=True), None, 5.0) == (PushOutcome.DECLINED, None)
    assert s.poll(5.0, alive(0, 1)) == ([], None) and s.drain(6.0) == []
    assert s.versions[2] == 0


# -- crash safety -------------------------------------------------------------------------------


def test_fragment_state_restores_values_versions_momentum_and_clock() -> None:
    s = make(min_quorum=1)
    for p in (1, 2):
        rid = open_round(s, p)
        s.on_push(push(s, 0, p, shift=0.05 * p), rid, 10.0)
    merged = s.poll(11.0, alive(0))[0]
    assert {r.fragment for r in merged} == {1, 2}
    states = [s.fragment_state(p) for p in range(P)]
    fresh = make(min_quorum=1)
    fresh.restore(states)
    assert fresh.versions == s.versions and fresh.merges == s.merges == 2
    assert fresh.clock == s.clock and fresh.round_ids == s.round_ids
    for n, t in s.params.items():
        assert_close(fresh.params[n], t)
    # the momentum came back too: the same next outer step gives the same result
    for syncer in (s, fresh):
        rid = syncer.on_meta(0, 6, 0.0, 20.0, alive(0))
        rid = next(q.round_id for q in rid if q.fragment == 2)
        syncer.on_push(push(syncer, 0, 2, shift=0.02), rid, 20.0)
        syncer.poll(21.0, alive(0))
    for n in s.partition[2]:
        assert_close(fresh.params[n], s.params[n])


def test_restore_rejects_a_checkpoint_of_another_model() -> None:
    s = make()
    st = s.fragment_state(0)
    st["params"] = {"not.a.tensor": torch.zeros(1)}
    with pytest.raises(ValueError, match="saved fragment 0 holds"):
        make().restore([st])


def test_a_stale_copy_is_never_merged_twice() -> None:
    """A learner whose work went into version v offers nothing new until it applied v: its older-based pushes
    are declined as stale; a push that steps past the apply point means the broadcast was lost (resend)."""
    s = make(min_quorum=1, learners=1)
    rid = open_round(s, 1, who=alive(0))
    first = push(s, 0, 1, c_steps=2, shift=0.05)
    first.last_step = 3
    assert s.on_push(first, rid, 10.0)[0] is PushOutcome.ACCEPTED
    (rec,) = s.poll(11.0, alive(0))[0]
    assert rec.version == 1 and s.merged_into[(0, 1)] == (1, 3)
    rid2 = next(q.round_id for q in s.on_meta(0, 5, 0.0, 12.0, alive(0)) if q.fragment == 1)
    again = push(s, 0, 1, c_steps=2, shift=0.05)
    again.base_version, again.last_step = 0, 3  # the same snapshot again: its host is stalled
    assert s.on_push(again, rid2, 12.0)[0] is PushOutcome.STALE
    assert not s.missed_broadcast(again)
    again.last_step = 3 + s.cfg.overlap + 1  # it stepped on without applying v1: it never got it
    assert s.missed_broadcast(again)
    assert s.poll(13.0, alive(0))[0] == [], "a round whose only answer was stale closes empty, merging nothing"
    fresh = push(s, 0, 1, c_steps=2, shift=0.02)  # based on v1: new work
    rid3 = next(q.round_id for q in s.on_meta(0, 9, 0.0, 14.0, alive(0)) if q.fragment == 1)
    assert s.on_push(fresh, rid3, 14.0)[0] is PushOutcome.ACCEPTED


def _stale_merge(anchor: str) -> tuple[DecoupledSyncer, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Learner 0's push makes version 1; then learner 1's push, based on version 0 and holding version 0's value
    plus 0.01 of its own progress, is merged alone. Returns (syncer, version-1 values, final values)."""
    s = make(min_quorum=1, outer_anchor=anchor, outer_momentum=0.0)
    v0 = {n: t.clone() for n, t in s.fragment(3).items()}
    rid = open_round(s, 3, who=alive(0))
    s.on_push(push(s, 0, 3, shift=0.05), rid, 10.1)
    s.poll(10.1, alive(0))
    v1 = {n: t.clone() for n, t in s.fragment(3).items()}
    rid = next(q.round_id for q in s.on_meta(1, 7, 0.0, 11.0, alive(0, 1)) if q.fragment == 3)
    late = FragmentPush(learner=1, fragment=3, base_version=0, c_steps=4, c_tokens=64, first_step=1, last_step=7,
                        step_time_s=0.0, tensors={n: t + 0.01 for n, t in v0.items()})
    assert s.on_push(late, rid, 11.1)[0] is PushOutcome.ACCEPTED
    (rec,) = s.poll(11.1, alive(1))[0]
    assert rec.base_versions == [0] and rec.version == 2
    return s, v1, {n: t.clone() for n, t in s.fragment(3).items()}


def test_base_anchor_merges_only_the_stale_learners_own_progress() -> None:
    _, v1, after = _stale_merge("base")
    for n in v1:  # Δ = Θ(v0) - θ = -0.01: the global moves by lr * 0.01 from version 1, never back
        assert_close(after[n], v1[n] + DilocoConfig().outer_lr * 0.01, rtol=1e-5, atol=1e-6)


def test_current_anchor_pulls_the_global_model_back_towards_a_stale_base() -> None:
    """The failure mode `outer_anchor = base` exists for: Δ = Θ(v1) - θ also undoes version 1's progress."""
    _, v1, after = _stale_merge("current")
    moved_back = [float((after[n] - v1[n]).mean()) for n in v1]
    assert all(x < 0 for x in moved_back), "version 1 moved up by ~0.07; the stale merge must pull it down"


def test_a_push_based_on_a_version_no_longer_held_is_declined_as_unanchored() -> None:
    s = make(min_quorum=1, outer_anchor="base", anchor_history=1)
    rid = open_round(s, 3, who=alive(0))
    s.on_push(push(s, 0, 3), rid, 10.1)
    s.poll(10.1, alive(0))
    assert sorted(s.history[3]) == [1], "only the newest version is held"
    rid = next(q.round_id for q in s.on_meta(1, 7, 0.0, 11.0, alive(0, 1)) if q.fragment == 3)
    old = push(s, 1, 3)
    old.base_version = 0
    assert s.on_push(old, rid, 11.1)[0] is PushOutcome.UNANCHORED
    assert s.poll(11.2, alive(1))[0] == [], "declined: nothing to merge"


def test_a_copy_from_before_a_rejoin_is_declined_until_the_current_value_is_applied() -> None:
    """A learner that was away (frozen, partitioned) comes back with a copy based on version 0 while the global
    fragment is at version 1. It is sent version 1 on rejoin; until it has applied it, its older-based pushes
    are declined, never merged (measured against version 1 they would pull the model back towards version 0)."""
    s = make(min_quorum=1)
    rid = open_round(s, 3, who=alive(0))
    s.on_push(push(s, 0, 3, shift=0.05), rid, 10.1)
    s.poll(10.1, alive(0))
    assert s.versions[3] == 1
    assert s.on_join(1) == s.versions and s.joined_at[(1, 3)] == 1
    rid = next(q.round_id for q in s.on_meta(1, 7, 0.0, 11.0, alive(0, 1)) if q.fragment == 3)
    before = FragmentPush(learner=1, fragment=3, base_version=0, c_steps=4, c_tokens=64, first_step=1, last_step=7,
                          step_time_s=0.0, tensors={n: t + 0.01 for n, t in s.fragment(3).items()})
    assert s.on_push(before, rid, 11.1)[0] is PushOutcome.BEFORE_REJOIN
    assert s.poll(11.2, alive(0, 1))[0] == [], "declined: the round closes without merging it"
    applied = push(s, 1, 3, c_steps=2)
    applied.base_version = 1  # it applied what it was sent on rejoin: new work again
    rid = next(q.round_id for q in s.on_meta(1, 11, 0.0, 12.0, alive(0, 1)) if q.fragment == 3)
    assert s.on_push(applied, rid, 12.1)[0] is PushOutcome.ACCEPTED
    other = make(min_quorum=1)  # the same push from a learner that never left is merged as usual
    rid = open_round(other, 3, who=alive(0))
    other.on_push(push(other, 0, 3, shift=0.05), rid, 10.1)
    other.poll(10.1, alive(0))
    rid = next(q.round_id for q in other.on_meta(1, 7, 0.0, 11.0, alive(0, 1)) if q.fragment == 3)
    before.learner = 1
    assert other.on_push(before, rid, 11.1)[0] is PushOutcome.ACCEPTED


def test_a_push_more_than_max_staleness_versions_behind_is_declined_as_lagging() -> None:
    """A learner that sat out merges without being declared dead (a freeze shorter than the liveness timeout)
    pushes a copy based on a version far behind the fragment's current one. Measured against the current value
    its outer gradient would undo the others' progress since: beyond `max_staleness` versions it is declined;
    within the bound it is merged as usual."""
    for bound, expected in ((1, PushOutcome.LAGGING), (2, PushOutcome.ACCEPTED)):
        s = make(min_quorum=1, max_staleness=bound)
        for step in (3, 7):  # learner 0 alone moves fragment 3 to version 2 at its sync points
            rid = next(q.round_id for q in s.on_meta(0, step, 0.0, 10.0, alive(0)) if q.fragment == 3)
            s.on_push(push(s, 0, 3), rid, 10.1)
            s.poll(10.1, alive(0))
        assert s.versions[3] == 2
        rid = next(q.round_id for q in s.on_meta(1, 11, 0.0, 11.0, alive(0, 1)) if q.fragment == 3)
        behind = push(s, 1, 3)
        behind.base_version = 0
        assert s.on_push(behind, rid, 11.1)[0] is expected, bound
        merged, _ = s.poll(11.2, alive(1))
        assert len(merged) == (0 if expected is PushOutcome.LAGGING else 1)


def test_deterministic_mode_waits_for_learners_not_started_yet_and_merges_once_all_are_in() -> None:
    """In lockstep, a round opened by the first learner to start waits for the others, even before they have
    connected (they are expected: their first sync point is ahead of them), and merges once all are in."""
    s = make(min_quorum=1, deterministic=True)
    rid = open_round(s, 3, who=alive(0))
    s.on_push(push(s, 0, 3), rid, 10.1)
    assert s.poll(11.0, alive(0))[0] == [], "learner 1 has not started: it is waited for"
    normal = make(min_quorum=1)
    rid_n = open_round(normal, 3, who=alive(0))
    normal.on_push(push(normal, 0, 3), rid_n, 10.1)
    assert len(normal.poll(11.0, alive(0))[0]) == 1, "without the mode the lone learner's round merges"
    pulls = s.on_meta(1, 3, 0.0, 11.1, alive(0, 1))
    assert [q.round_id for q in pulls if q.fragment == 3] == [rid], "learner 1 joins the open round"
    s.on_push(push(s, 1, 3), rid, 11.2)
    (rec,), _ = s.poll(11.2, alive(0, 1))
    assert rec.participants == [0, 1]


def _finished_push_after_rejoin(s: DecoupledSyncer) -> tuple[FragmentPush, FragmentPush]:
    """Learner 1's final push of fragment 1 based on version 0, and a running copy of it, after a merge made
    version 1 and learner 1 rejoined (a restored syncer sends it version 1)."""
    rid = open_round(s, 1, who=alive(0))
    final = push(s, 1, 1, final=True)
    running = push(s, 1, 1)
    s.on_push(push(s, 0, 1), rid, 10.1)
    s.poll(10.1, alive(0))
    assert s.versions[1] == 1
    s.on_join(1)
    return final, running


def test_a_final_push_after_rejoin_is_merged_by_the_ordinary_rules() -> None:
    """Issue 26: a learner that finished while the syncer was down rejoins only to deliver its final pushes and
    never applies the values it is sent; a final push based on an older version is carried and merged (it holds
    steps not merged), while a running learner's push from before its rejoin is still declined."""
    s = make(min_quorum=1, grace_enabled=False)
    final, running = _finished_push_after_rejoin(s)
    assert s.on_push(running, None, 10.2)[0] is PushOutcome.BEFORE_REJOIN
    assert s.on_push(final, None, 10.2)[0] is PushOutcome.CARRIED and s.held[1] == {1: final}
    assert s.drop_carried(1) == [] and s.held[1] == {1: final}
    (rec,) = s.drain(10.3)
    assert rec.participants == [1] and s.versions[1] == 2


def test_a_final_push_after_rejoin_is_still_declined_when_stale_or_lagging() -> None:
    """The ordinary rules still apply to a final push: lagging beyond max_staleness."""
    s = make(min_quorum=1, grace_enabled=False, max_staleness=0)
    final, _ = _finished_push_after_rejoin(s)
    assert s.on_push(final, None, 10.2)[0] is PushOutcome.LAGGING


def test_mutation_final_before_rejoin_restores_the_old_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    from diloco_chaos.trainers import mutations

    monkeypatch.setattr(mutations, "current", lambda: "final_before_rejoin")
    s = make(min_quorum=1, grace_enabled=False)
    final, _ = _finished_push_after_rejoin(s)
    assert s.on_push(final, None, 10.2)[0] is PushOutcome.BEFORE_REJOIN
