"""Explore's draws on the torchft target (docs/targets/torchft.md "Explore against torchft"): the kinds are the
target descriptor's `fault_kinds` that the scenario's validation takes (its rules: kill_syncer only with quorum
retries and a restarted Lighthouse, link kinds only on netns hosts with the kernel backend), the reactions are
the target's (`Target.reactions`: no "syncer_restored", a restarted Lighthouse restores nothing), and every
draw of the built-in torchft explore scenarios is a schedule validation accepts. Pure: no process starts."""

from __future__ import annotations

import dataclasses

import pytest

from diloco_chaos.chaos import faults
from diloco_chaos.harness.config import scenario as scenario_mod
from diloco_chaos.harness.config.sections import ScenarioError
from diloco_chaos.harness.explore.generate import draw, vocabulary
from diloco_chaos.harness.targets import base as targets

pytest.importorskip("torchft", reason="validation of a torchft scenario needs torchft installed (needs_module)")

BUILTINS = ("torchft-ddp-explore", "torchft-diloco-explore")


def carried() -> frozenset[str]:
    kinds = targets.get("torchft").fault_kinds
    assert kinds is not None
    return kinds


def links() -> set[str]:
    return {k for k in carried() if faults.get(k).target == "link"}


@pytest.mark.parametrize("name", BUILTINS)
def test_the_builtins_draw_every_process_kind_the_target_carries_and_no_link_kind(name: str) -> None:
    v = vocabulary(scenario_mod.builtin(name))
    assert set(v.kinds) == carried() - links()  # local hosts: the target's rules refuse its link kinds
    assert links() and "kill_syncer" in v.kinds  # quorum_retries >= 1, syncer_policy restart
    assert v.reactions == ("rejoin",)
    assert v.learners == (0, 1, 2) and v.syncer


@pytest.mark.parametrize("name", BUILTINS)
def test_every_draw_of_a_builtin_is_valid_and_triggers_on_what_a_torchft_run_writes(name: str) -> None:
    sc = scenario_mod.builtin(name, ["explore.reaction_share=0.6"])
    v = vocabulary(sc)
    kinds, reactions = set(), 0
    for i in range(60):
        t = draw(v, 0, i)
        assert t is not None and t.learners == 3 and t.steps == sc.explore.steps
        sc.replace(train=dataclasses.replace(sc.train, steps=t.steps), faults=list(t.tables()))  # raises if not
        for f in t.faults:
            kinds.add(f.action)
            assert f.at.after in (None, "rejoin")  # never syncer_restored: no torchft record marks it
            if f.at.after is None:
                assert f.at.step is not None and sc.explore.first_step <= f.at.step <= sc.explore.last_step
            else:
                reactions += 1
            if f.action == "kill_chip":
                assert f.chip == 0  # one rank per replica group: its only rank
    assert kinds == set(v.kinds) and reactions > 0


def test_kill_syncer_is_drawn_only_where_the_target_rules_take_it() -> None:
    for sets in (["torchft.quorum_retries=0"], ["recovery.syncer_policy=fail"]):
        v = vocabulary(scenario_mod.builtin("torchft-ddp-explore", sets))
        assert "kill_syncer" not in v.kinds and "kill_learner" in v.kinds, sets
    with pytest.raises(ScenarioError, match="explore.kinds: 'kill_syncer' cannot be drawn.*quorum_retries"):
        vocabulary(scenario_mod.builtin("torchft-ddp-explore",
                                        ["torchft.quorum_retries=0", 'explore.kinds=["kill_syncer"]']))


def test_netns_hosts_with_the_kernel_backend_add_the_target_s_link_kinds_with_the_parameters_it_takes() -> None:
    v = vocabulary(scenario_mod.builtin("torchft-diloco-explore", ["launch.hosts=netns", "links.backend=kernel"]))
    assert set(v.kinds) == carried()
    assert {k for k in v.kinds if faults.get(k).target == "link"} == {"partition", "degrade", "flap", "loss"}
    degrades = [f for i in range(80) if (t := draw(v, 0, i)) is not None for f in t.faults if f.action == "degrade"]
    assert degrades, "degrade is drawn"
    for f in degrades:  # the kernel backend carries bandwidth, not latency (no netem): only what it takes is set
        assert f.params().get("bandwidth_kbps") and not f.params().get("latency_ms"), f.params()


def test_a_kind_the_target_does_not_carry_is_refused_with_its_reason() -> None:
    with pytest.raises(ScenarioError, match="'slow' cannot be drawn.*target 'torchft' cannot carry"):
        vocabulary(scenario_mod.builtin("torchft-ddp-explore", ['explore.kinds=["slow"]']))


def test_validation_refuses_a_trigger_on_a_reaction_torchft_never_shows() -> None:
    sc = scenario_mod.builtin("torchft-ddp-explore")
    kill = {"action": "kill_syncer", "at": {"step": 20}, "repair_s": 1.0}
    after = {"action": "kill_learner", "learner": 1, "repair_s": 1.0, "at": {"after": "syncer_restored"}}
    with pytest.raises(ScenarioError, match=r"faults\[1\].at.after = 'syncer_restored': target 'torchft' never "
                                            "shows this reaction: a restarted Lighthouse has no checkpoint"):
        sc.replace(faults=[kill, after])
    sc.replace(faults=[{**kill, "action": "kill_learner", "learner": 0},
                       {**after, "at": {"after": "rejoin", "learner": 0}}])  # rejoin is shown: accepted
