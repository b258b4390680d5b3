"""Explore's schedule draws: a pure function of (table, scenario, seed, index), inside the bounds, accepted by the
scenario's validation, and the kinds the scenario can carry; the `[explore]` table's own checks."""

from __future__ import annotations

import dataclasses

import pytest

from diloco_chaos.chaos import faults
from diloco_chaos.chaos.faults.base import RepairParams
from diloco_chaos.harness.config import scenario as scenario_mod
from diloco_chaos.harness.config.sections import ScenarioError
from diloco_chaos.harness.explore.generate import PARAM_RANGES, draw, vocabulary

RESTART = ["recovery.policy=restart", "recovery.syncer_policy=restart", "recovery.max_restarts=3"]


def sc_of(*sets: str) -> scenario_mod.Scenario:
    return scenario_mod.builtin("fault-free", [*RESTART, *sets])


def test_the_same_seed_and_index_give_the_same_schedule_and_others_differ() -> None:
    v = vocabulary(sc_of())
    a = [draw(v, 7, i) for i in range(20)]
    assert a == [draw(vocabulary(sc_of()), 7, i) for i in range(20)]  # a fresh vocabulary, the same draws
    assert [draw(v, 7, i) for i in reversed(range(20))] == a[::-1]  # order of drawing does not matter
    assert a != [draw(v, 8, i) for i in range(20)]
    assert len({t.describe() for t in a if t is not None}) > 15


def test_every_draw_is_accepted_by_validation_and_inside_the_table() -> None:
    sc = sc_of("explore.max_faults=4", "explore.min_duration_s=0.5", "explore.max_duration_s=2.0",
               "explore.first_step=10", "explore.last_step=70", "explore.reaction_share=0.5")
    v = vocabulary(sc)
    seen_kinds, reactions = set(), 0
    for i in range(60):
        t = draw(v, 0, i)
        assert t is not None
        assert 1 <= len(t.faults) <= 4 and t.steps == 80 and t.learners == 4
        sc.replace(train=dataclasses.replace(sc.train, steps=t.steps), faults=list(t.tables()))  # raises if not
        kills: dict[int | None, int] = {}
        for f in t.faults:
            seen_kinds.add(f.action)
            if f.at.step is not None:
                assert 10 <= f.at.step <= 70
                assert f.at.learner == f.learner
            else:
                reactions += 1
                assert f.at.after in ("rejoin", "syncer_restored") and 0 <= (f.at.after_s or 0) <= 1.0
            if isinstance(f.options, RepairParams):
                assert 0.5 <= f.options.repair_s <= 2.0
                kills[f.learner] = kills.get(f.learner, 0) + 1
            else:
                assert f.until is not None and 0.5 <= (f.until.after_s or 0) <= 2.0
            for k, value in f.params().items():
                if k in PARAM_RANGES:
                    field = next(x for x in dataclasses.fields(faults.get(f.action).params) if x.name == k)
                    lo, hi = field.metadata["range"]
                    assert max(lo, PARAM_RANGES[k][0]) <= value <= min(hi, PARAM_RANGES[k][1])
        assert all(n <= 3 for n in kills.values())  # recovery.max_restarts
    assert reactions > 0
    assert {"kill_learner", "kill_syncer", "partition", "degrade", "freeze"} <= seen_kinds


def test_default_kinds_are_those_the_scenario_can_carry() -> None:
    failing = vocabulary(scenario_mod.builtin("fault-free", ["recovery.policy=fail"])).kinds
    assert "partition" in failing and "freeze" in failing
    assert not {"kill_chip", "kill_learner", "crash_host", "kill_syncer"} & set(failing)  # policy fail refuses them
    assert "loss" not in failing  # kernel backend only
    assert {"kill_learner", "kill_syncer"} <= set(vocabulary(sc_of()).kinds)
    no_proxy = vocabulary(sc_of("links.proxy=off")).kinds
    assert not {k for k in no_proxy if faults.get(k).target == "link"}


def test_targets_restrict_whom_faults_hit() -> None:
    v = vocabulary(sc_of('explore.targets=["learner2"]'))
    assert v.learners == (2,) and not v.syncer and "kill_syncer" not in v.kinds
    for i in range(20):
        t = draw(v, 0, i)
        assert t is not None and {f.learner for f in t.faults} == {2}


def test_a_listed_kind_the_scenario_cannot_carry_is_refused_before_any_run() -> None:
    with pytest.raises(ScenarioError, match="explore.kinds: 'kill_learner' cannot be drawn"):
        vocabulary(scenario_mod.builtin("fault-free", ['explore.kinds=["kill_learner"]']))


@pytest.mark.parametrize("sets, message", [
    (["explore.min_faults=5"], "explore.min_faults = 5: must be at most explore.max_faults = 3"),
    (["explore.kinds=[\"degrad\"]"], "'degrad' is not a fault kind \\(did you mean degrade\\?\\)"),
    (["explore.targets=[\"learner4\"]"], "'learner4' must be \"syncer\" or \"learner<M>\" with M in \\[0, 3\\]"),
    (["explore.must_fail=3"], "explore.must_fail = 3: must be at most explore.tries = 2"),
    (["explore.confirm_runs=4"], "explore.confirm_must_fail = 5: must be at most explore.confirm_runs = 4"),
    (["explore.last_step=400"], "explore.last_step = 400: must be at most the explored steps 80"),
    (["explore.first_step=75"], "explore.first_step = 75: must be below the last trigger step 72"),
    (["explore.tries=0"], "explore.tries = 0: must be in \\[1, 20\\]"),
])
def test_the_table_is_validated_naming_the_key(sets: list[str], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        scenario_mod.builtin("fault-free", sets)
