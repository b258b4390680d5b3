"""The fragment-to-shard assignment (diloco_chaos/trainers/syncers/shards.py), its validation (syncer.shards) and the
per-shard
link chaos arithmetic; pure functions, no processes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diloco_chaos.chaos.links import proxy_name, shard_rate
from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.config.sections import ScenarioError
from diloco_chaos.harness.record.syncer import shard_of
from diloco_chaos.harness.syncer.shards import (
    assemble_final,
    checkpoint_name,
    fragment_owners,
    proc_name,
    state_dir,
)
from diloco_chaos.trainers.syncers.shards import assign_shards, owned

sizes_and_shards = st.lists(st.integers(0, 10_000), min_size=1, max_size=40).flatmap(
    lambda sizes: st.tuples(st.just(sizes), st.integers(1, len(sizes))))


@given(sizes_and_shards)
def test_every_fragment_has_exactly_one_owner_in_range(case):
    sizes, s = case
    owner = assign_shards(sizes, s)
    assert len(owner) == len(sizes) and all(0 <= k < s for k in owner)
    assert sorted(p for k in range(s) for p in owned(owner, k)) == list(range(len(sizes)))


@given(sizes_and_shards)
def test_balance_bound_and_determinism(case):
    """LPT: the heaviest shard holds at most the mean load plus the largest fragment; the same input gives the
    same assignment (every process computes it on its own)."""
    sizes, s = case
    owner = assign_shards(sizes, s)
    load = [sum(sizes[p] for p in owned(owner, k)) for k in range(s)]
    assert max(load) <= sum(sizes) / s + max(sizes)
    assert assign_shards(list(sizes), s) == owner


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=40))
def test_one_shard_is_the_identity(sizes):
    assert assign_shards(sizes, 1) == [0] * len(sizes)


def test_known_assignment_and_ties():
    assert assign_shards([5, 5, 5, 5], 2) == [0, 1, 0, 1]  # equal sizes: lower index first, lighter shard first
    assert assign_shards([10, 1, 1, 8], 2) == [0, 1, 1, 1]  # 10 | 8 + 1 + 1
    with pytest.raises(ValueError, match="shards = 3"):
        assign_shards([1, 2], 3)
    with pytest.raises(ValueError, match="shards = 0"):
        assign_shards([1, 2], 0)


def base(**syncer):
    return {"topology": {"learners": 2}, "diloco": {"fragments": 4}, "syncer": syncer}


def test_validation_of_shards():
    assert from_dict(base()).syncer.shards == 1
    sc = from_dict(base(shards=2))
    owners = fragment_owners(sc)
    assert sorted(set(owners)) == [0, 1] and len(owners) == 4
    with pytest.raises(ScenarioError, match=r"syncer\.shards = 5: must be in \[1, diloco\.fragments = 4\]"):
        from_dict(base(shards=5))
    with pytest.raises(ScenarioError, match="supported for algorithm = 'decoupled' only"):
        from_dict({**base(shards=2), "algorithm": "ddp"})
    with pytest.raises(ScenarioError, match="needs recovery.syncer_checkpoint = 'every_merge'"):
        from_dict({**base(shards=2), "recovery": {"syncer_checkpoint": "off"}})
    kill = {"recovery": {"syncer_policy": "restart"}, "faults": [{"action": "kill_syncer", "shard": 2,
                                                                  "at": {"merges": 5}}]}
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.shard = 2: must be in \[0, 1\]"):
        from_dict({**base(shards=2), **kill})
    ok = from_dict({**base(shards=2), **kill, "faults": [{"action": "kill_syncer", "shard": 1, "at": {"merges": 5}}]})
    assert ok.faults[0].describe() == "kill_syncer(syncer shard 1)"


def test_names_keep_the_unsharded_layout():
    assert (proc_name(0, 1), state_dir(0, 1), checkpoint_name(0, 1)) == ("syncer", "syncer_state", "global.pt")
    assert (proc_name(1, 2), state_dir(1, 2), checkpoint_name(1, 2)) == ("syncer.s1", "syncer_state.s1",
                                                                         "global.s1.pt")
    assert [shard_of(p) for p in ("syncer", "syncer.s0", "syncer.s3", "learner0.link")] == [0, 0, 3, 0]
    assert proxy_name(2) == proxy_name(2, 0) == "learner-2" and proxy_name(2, 1) == "learner-2-shard1"


def test_bandwidth_is_split_across_a_learners_shard_connections():
    assert shard_rate(800, 1) == 100 and shard_rate(800, 2) == 50 and shard_rate(8, 4) == 1


def test_assemble_final_is_a_no_op_without_sharding(tmp_path):
    assert assemble_final(str(tmp_path), from_dict(base())) is None


def test_a_shard_core_runs_only_its_own_fragments():
    """DecoupledSyncer(owned=...): rounds, pulls and pushes of the fragments it owns; others' pushes rejected."""
    from diloco_chaos.trainers.config import DilocoConfig
    from diloco_chaos.trainers.messages import FragmentPush
    from diloco_chaos.trainers.model import ModelConfig
    from diloco_chaos.trainers.syncers.decoupled import DecoupledSyncer
    from diloco_chaos.trainers.syncers.decoupled_records import PushOutcome

    cfg = DilocoConfig(fragments=4, sync_every=4, overlap=2, min_quorum=1)
    s = DecoupledSyncer(ModelConfig(seq_len=8, d_model=16, n_layers=1, n_heads=2, d_ff=32), cfg, seed=3,
                        num_learners=1, owned=frozenset({1, 3}))
    pulled = {q.fragment for step in range(1, 9) for q in s.on_meta(0, step, 0.0, float(step), frozenset({0}))}
    assert pulled == {1, 3}
    for p, want in ((0, PushOutcome.REJECTED_FRAGMENT), (1, PushOutcome.ACCEPTED)):
        tensors = {n: t.clone() + 0.01 for n, t in s.fragment(p).items()}
        push = FragmentPush(learner=0, fragment=p, base_version=0, c_steps=4, c_tokens=64, first_step=1,
                            last_step=4, step_time_s=0.0, tensors=tensors, final=True)
        assert s.on_push(push, None, 9.0)[0] is want
