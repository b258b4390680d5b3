"""Tests for diloco_chaos.harness.config.scenario: TOML validation with errors that name the key and what is allowed."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from diloco_chaos.harness.config.scenario import Scenario, builtin, builtin_names, from_dict, load
from diloco_chaos.harness.config.sections import ScenarioError

BASE: dict[str, Any] = {
    "name": "t",
    "seed": 1,
    "algorithm": "decoupled",
    "topology": {"learners": 3, "chips_per_learner": 1},
    "model": {"seq_len": 8, "d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32},
    "train": {"steps": 10},
    "diloco": {"fragments": 4, "sync_every": 4, "overlap": 1, "min_quorum": 2},
}


def table(**changes: dict[str, Any] | Any) -> dict[str, Any]:
    out = copy.deepcopy(BASE)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return out


def rejected(t: dict[str, Any], *fragments: str) -> str:
    with pytest.raises(ScenarioError) as info:
        from_dict(t)
    msg = str(info.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    return msg


def test_builtin_default_validates() -> None:
    sc = builtin("default")
    assert isinstance(sc, Scenario)
    assert sc.name == "default" and sc.algorithm == "decoupled"
    assert sc.topology.learners == 4 and sc.diloco.fragments == 8 and sc.diloco.min_quorum == 1
    assert {"default", "fault-free", "chip-loss"} <= set(builtin_names())


def test_the_default_scenario_shows_chaos_and_fault_free_is_the_same_run_without_it() -> None:
    """A first `diloco-chaos run` fires a chip loss (with a repair), a degraded link and a straggler, each
    triggered by progress so it fires however slow the machine; `--builtin fault-free` is the quiet twin for
    benchmarks: the same tables but its name, the faults and the recovery that only the faults need."""
    sc, quiet = builtin("default"), builtin("fault-free")
    assert [f.action for f in sc.faults] == ["kill_chip", "degrade", "slow"]
    assert all(f.at.step is not None for f in sc.faults), "progress-triggered"
    assert sc.recovery.policy == "elastic" and sc.recovery.repair_s > 0, "the lost chip is repaired"
    assert all(f.until is not None for f in sc.faults if f.action != "kill_chip"), "link and straggler end"
    assert quiet.faults == () and quiet.name == "fault-free"
    assert quiet == sc.replace(name="fault-free", faults=(), recovery=type(sc.recovery)())


def test_the_scenarios_command_lists_each_builtin_with_its_faults(capsys: pytest.CaptureFixture[str]) -> None:
    from diloco_chaos.harness import cli

    assert cli.main(["scenarios"]) == 0
    lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()}
    assert sorted(lines) == builtin_names()
    assert lines["default"].endswith("faults: kill_chip, degrade, slow"), lines["default"]
    assert lines["fault-free"].endswith("faults: none") and "4x2" in lines["fault-free"], lines["fault-free"]


def test_valid_table_round_trips_through_to_dict() -> None:
    sc = from_dict(table())
    assert sc.diloco.min_quorum == 2 and sc.model.d_model == 16
    assert from_dict(sc.to_dict()) == sc
    assert Scenario() == from_dict(Scenario().to_dict())


def test_int_accepted_for_float_field() -> None:
    sc = from_dict(table(train={"lr": 1}))
    assert sc.train.lr == 1.0 and isinstance(sc.train.lr, float)


def test_min_quorum_above_learners() -> None:
    rejected(table(diloco={"min_quorum": 4}), "diloco.min_quorum", "topology.learners = 3", "[1,")
    assert from_dict(table(diloco={"min_quorum": 3})).diloco.min_quorum == 3


def test_unknown_key_at_top_level() -> None:
    rejected(table(bogus=1), "bogus", "top level", "allowed:", "algorithm")


def test_unknown_key_inside_a_table() -> None:
    rejected(table(train={"stepz": 3}), "train.stepz", "[train]", "allowed:", "steps")
    rejected(table(timeouts={"gloo": 3.0}), "timeouts.gloo", "gloo_s")


def test_negative_rate() -> None:
    rejected(table(train={"lr": -1}), "train.lr", "[0.0, 1.0]")
    rejected(table(diloco={"grace_gamma": 1.5}), "diloco.grace_gamma", "[0.0, 1.0]")
    rejected(table(train={"steps": 0}), "train.steps", "[1, 10000000]")
    rejected(table(topology={"learners": 65}), "topology.learners", "[1, 64]")
    rejected(table(model={"seq_len": 4}), "model.seq_len", "[8, 4096]")
    rejected(table(data={"holdout_fraction": 0.9}), "data.holdout_fraction", "[0.01, 0.5]")


def test_nan_is_out_of_range() -> None:
    rejected(table(train={"lr": float("nan")}), "train.lr", "[0.0, 1.0]")


@pytest.mark.parametrize(
    ("changes", "key", "what"),
    [
        ({"train": {"steps": "ten"}}, "train.steps", "integer"),
        ({"train": {"steps": 10.0}}, "train.steps", "integer"),
        ({"train": {"steps": True}}, "train.steps", "integer"),
        ({"train": {"lr": "fast"}}, "train.lr", "number"),
        ({"diloco": {"grace_enabled": 1}}, "diloco.grace_enabled", "true or false"),
        ({"name": 5}, "name", "string"),
        ({"diloco": {"embedding_tensors": [1, 2]}}, "diloco.embedding_tensors", "list of strings"),
        ({"topology": 3}, "topology", "table"),
    ],
)
def test_wrong_type(changes: dict[str, Any], key: str, what: str) -> None:
    msg = rejected(table(**changes), key, what)
    assert msg.startswith(key)


def test_unknown_algorithm() -> None:
    rejected(table(algorithm="sgd"), "algorithm", "'sgd'", "decoupled", "diloco", "ddp")
    rejected(table(diloco={"merge_rule": "median"}), "diloco.merge_rule", "rda", "mean")


def test_missing_corpus_file(tmp_path) -> None:
    missing = tmp_path / "no-such-corpus.txt"
    rejected(table(data={"corpus": str(missing)}), "data.corpus", "no such file", "pydoc-topics")
    missing.write_text("some text " * 100)  # long enough for every learner's shard to hold a window
    assert from_dict(table(data={"corpus": str(missing)})).data.corpus == str(missing)


def test_broken_timeout_hierarchy() -> None:
    msg = rejected(table(timeouts={"gloo_s": 2.0}), "timeouts.liveness_s", "timeouts.gloo_s", "hierarchy")
    assert re.search(r"timeouts\.liveness_s = 3(\.0)?: must be below timeouts\.gloo_s = 2(\.0)?", msg)
    rejected(table(timeouts={"barrier_s": 5.0}), "timeouts.gloo_s", "timeouts.barrier_s")
    rejected(table(timeouts={"run_s": 30.0}), "timeouts.barrier_s", "timeouts.run_s")
    rejected(table(timeouts={"socket_op_s": 3.0}), "timeouts.socket_op_s", "timeouts.liveness_s")
    rejected(table(timeouts={"final_flush_s": 1.5}), "timeouts.final_flush_s", "timeouts.socket_op_s")


def test_heartbeat_too_large_for_liveness() -> None:
    rejected(table(timeouts={"heartbeat_s": 1.5, "liveness_s": 4.0}), "timeouts.heartbeat_s",
             "timeouts.liveness_s / 3")
    assert from_dict(table(timeouts={"heartbeat_s": 1.0, "liveness_s": 3.0})).timeouts.heartbeat_s == 1.0


def test_n_heads_must_divide_d_model() -> None:
    rejected(table(model={"n_heads": 3}), "model.n_heads", "model.d_model = 16", "divide")


def test_too_many_fragments_for_the_model() -> None:
    rejected(table(diloco={"fragments": 18}), "diloco.fragments", "[1, 17]")


def test_replace_validates_again() -> None:
    sc = from_dict(table())
    with pytest.raises(ScenarioError, match="algorithm"):
        sc.replace(algorithm="nope")
    assert sc.replace(seed=9).seed == 9


def test_load_valid_file(tmp_path) -> None:
    path = tmp_path / "ok.toml"
    path.write_text('name = "ok"\nseed = 4\n[topology]\nlearners = 2\n[diloco]\nmin_quorum = 2\n')
    sc = load(path)
    assert (sc.name, sc.seed, sc.topology.learners, sc.diloco.min_quorum) == ("ok", 4, 2, 2)


def test_load_invalid_toml(tmp_path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("name = \n[topology\n")
    with pytest.raises(ScenarioError, match="not valid TOML") as info:
        load(path)
    assert "bad.toml" in str(info.value)


def test_load_bad_value_names_the_key(tmp_path) -> None:
    path = tmp_path / "bad_value.toml"
    path.write_text("[train]\nlr = -1\n")
    with pytest.raises(ScenarioError, match=re.escape("train.lr = -1.0: must be in [0.0, 1.0]")):
        load(path)


def test_load_missing_file(tmp_path) -> None:
    with pytest.raises(ScenarioError, match="does not exist") as info:
        load(tmp_path / "absent.toml")
    assert "absent.toml" in str(info.value)


RANDOM = {"topology": {"learners": 2, "chips_per_learner": 2}, "train": {"steps": 300}, "seed": 4,
          "recovery": {"policy": "restart", "max_restarts": 10},
          "random_faults": {"mtbf_steps": 300, "actions": {"kill_chip": 2, "freeze": 1}, "min_gap_steps": 30}}


def test_random_faults_are_drawn_into_explicit_entries_once():
    sc = from_dict(RANDOM)
    assert sc.faults and {f.action for f in sc.faults} <= {"kill_chip", "freeze"}
    assert all(f.at.step is not None and f.at.learner == f.learner for f in sc.faults)
    assert from_dict(RANDOM).faults == sc.faults, "same seed, same draw"
    assert from_dict({**RANDOM, "seed": 5}).faults != sc.faults
    again = from_dict(sc.to_dict())  # the resolved config.json: the draw is not repeated on replay
    assert again.faults == sc.faults and again.random_faults_source == sc.random_faults_source
    assert '"mtbf_steps": 300' in sc.random_faults_source


def test_random_faults_bad_values_and_too_few_restarts_are_rejected():
    with pytest.raises(ScenarioError, match=r"random_faults\.mtbf_steps = 0"):
        from_dict({**RANDOM, "random_faults": {"mtbf_steps": 0}})
    with pytest.raises(ScenarioError, match=r"unknown key random_faults\.mtbf\b"):
        from_dict({**RANDOM, "random_faults": {"mtbf": 10}})
    with pytest.raises(ScenarioError, match=r"recovery\.max_restarts = 0"):
        from_dict({**RANDOM, "random_faults": {"mtbf_steps": 100},
                   "recovery": {"policy": "restart", "max_restarts": 0}})


def test_kill_syncer_needs_decoupled_and_a_restart_policy():
    base = {"recovery": {"syncer_policy": "restart"}, "faults": [{"action": "kill_syncer", "at": {"merges": 5}}]}
    sc = from_dict(base)
    assert sc.faults[0].learner is None and sc.faults[0].describe() == "kill_syncer(syncer)"
    with pytest.raises(ScenarioError, match="kill_syncer': supported for algorithm = 'decoupled' only"):
        from_dict({**base, "algorithm": "ddp"})
    with pytest.raises(ScenarioError, match="needs recovery.syncer_policy = 'restart'"):
        from_dict({"faults": base["faults"]})
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.learner: kill_syncer hits the syncer"):
        from_dict({**base, "faults": [{"action": "kill_syncer", "learner": 0}]})
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.repair_s = -1"):
        from_dict({**base, "faults": [{"action": "kill_syncer", "repair_s": -1}]})


@pytest.mark.parametrize(("policy", "algorithm", "resolved"), [
    ("elastic", "decoupled", "shrink"), ("elastic", "elastic_ddp", "shrink"), ("elastic", "ddp", "restart"),
    ("elastic", "diloco", "restart"), ("shrink", "elastic_ddp", "shrink"), ("restart", "decoupled", "restart"),
    ("fail", "ddp", "fail"),
])
def test_learner_policy_resolves_elastic_per_algorithm(policy: str, algorithm: str, resolved: str) -> None:
    from diloco_chaos.harness.config.sections import learner_policy

    got, why = learner_policy(policy, algorithm)
    assert got == resolved and algorithm in why if policy == "elastic" else got == resolved


def test_recovery_policy_shrink_is_kept_to_the_elastic_algorithms_and_elastic_fits_every_algorithm() -> None:
    for algorithm in ("decoupled", "elastic_ddp", "ddp", "diloco"):
        assert from_dict(table(algorithm=algorithm, recovery={"policy": "elastic"})).recovery.policy == "elastic"
    assert from_dict(table(algorithm="elastic_ddp", recovery={"policy": "shrink"})).recovery.policy == "shrink"
    for algorithm in ("ddp", "diloco"):
        with pytest.raises(ScenarioError, match=r"recovery.policy = 'shrink': supported for algorithm in"):
            from_dict(table(algorithm=algorithm, recovery={"policy": "shrink"}))
    with pytest.raises(ScenarioError, match=r"recovery\.policy = 'elastik'"):
        from_dict(table(recovery={"policy": "elastik"}))
