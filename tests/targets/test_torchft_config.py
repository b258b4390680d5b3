"""Validation of the system under test (`[target]`, `[torchft]`; diloco_chaos/harness/config/target_check.py): each
refusal names its key, whether or not torchft is installed (no run here)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import tiny_table

from diloco_chaos.harness.config.scenario import ScenarioError, from_dict
from diloco_chaos.harness.targets.base import get, names, system_of

TFT_DILOCO = {"diloco": {"fragments": 2, "sync_every": 4, "overlap": 1}, "chips": 1}


def refused(table: dict[str, Any], *parts: str) -> str:
    with pytest.raises(ScenarioError) as e:
        from_dict(table)
    text = str(e.value)
    for p in parts:
        assert p in text, text
    return text


def test_auto_resolves_the_system_from_the_algorithm() -> None:
    assert names() == ("builtin", "torchft")
    assert system_of(from_dict(tiny_table("ddp"))) == "builtin"
    table = tiny_table("torchft_diloco", **TFT_DILOCO)
    table["target"] = {"system": "torchft"}
    if get("torchft").needs_module:
        pytest.importorskip("torchft", reason="the torchft system is refused without torchft installed")
    assert system_of(from_dict(table)) == "torchft"


def test_a_builtin_algorithm_on_torchft_and_the_reverse_are_refused() -> None:
    refused({**tiny_table("ddp"), "target": {"system": "torchft"}}, "target.system = 'torchft'",
            "algorithm = 'ddp' runs on the 'builtin' system")
    refused({**tiny_table("torchft_ddp"), "target": {"system": "builtin"}}, "target.system = 'builtin'",
            "algorithm = 'torchft_ddp' runs on the 'torchft' system")


@pytest.mark.parametrize(("key", "value", "message"), [
    ("min_replicas", 0, "torchft.min_replicas = 0: must be in [1, 64]"),
    ("min_replicas", 3, "torchft.min_replicas = 3: must be in [1, topology.learners = 2]"),
    ("join_timeout_s", 0.0, "torchft.join_timeout_s = 0.0: must be in"),
    ("heartbeat_timeout_s", 1e6, "torchft.heartbeat_timeout_s = 1000000.0: must be in"),
    ("quorum_tick_ms", 0, "torchft.quorum_tick_ms = 0: must be in"),
    ("quorum_tick_ms", 5000, "torchft.quorum_tick_ms = 5000: must be below torchft.join_timeout_s"),
    ("quorum_retries", -1, "torchft.quorum_retries = -1: must be in [0, 100]"),
    ("timeout_s", 40.0, "torchft.timeout_s = 40.0: must be below torchft.quorum_timeout_s = 30.0"),
    ("connect_timeout_s", 20.0, "torchft.connect_timeout_s = 20.0: must be at most torchft.timeout_s = 10.0"),
    ("quorum_timeout_s", 3.5, "torchft.quorum_timeout_s = 3.5: must be above heartbeat_timeout_s + "
                              "join_timeout_s = 4"),
    ("quorum_timeout_s", 300.0, "torchft.quorum_timeout_s = 300.0: must be below timeouts.run_s = 240.0"),
])
def test_each_torchft_key_out_of_range_is_refused_naming_it(key: str, value: Any, message: str) -> None:
    refused(tiny_table("torchft_ddp", torchft={key: value}), message)


def test_streaming_diloco_constraints_name_their_key() -> None:
    refused(tiny_table("torchft_diloco", chips=1, diloco={"fragments": 3, "sync_every": 4, "overlap": 0}),
            "diloco.sync_every = 4: must be a multiple of diloco.fragments = 3")
    refused(tiny_table("torchft_diloco", chips=1, diloco={"fragments": 2, "sync_every": 4, "overlap": 2}),
            "diloco.overlap = 2: must be below diloco.sync_every / diloco.fragments = 2")


def test_torchft_diloco_is_refused_with_several_ranks_per_group_naming_the_key_and_the_reason() -> None:
    """torchft's DiLoCo averages per group rank and heals each rank from its own source: full copies at two ranks
    of one group would drift apart (docs/targets/torchft.md "Findings"), so the layout is refused before any
    process starts; torchft_ddp keeps replicated ranks (its ranks agree, checked by ranks_agree)."""
    refused(tiny_table("torchft_diloco", chips=2, **{k: v for k, v in TFT_DILOCO.items() if k != "chips"}),
            "topology.chips_per_learner = 2: torchft_diloco runs one rank per replica group",
            "heals each rank of a group from its own source group", "set topology.chips_per_learner = 1")
    from_dict(tiny_table("torchft_ddp", chips=2))


def test_ddp_api_ddp_module_is_accepted_for_torchft_ddp_only_naming_the_key() -> None:
    assert from_dict(tiny_table("torchft_ddp")).torchft.ddp_api == "manager", "the default: today's path"
    refused(tiny_table("torchft_ddp", torchft={"ddp_api": "hooks"}),
            "torchft.ddp_api = 'hooks': must be one of manager, ddp_module")
    for alg, extra in (("torchft_diloco", TFT_DILOCO), ("ddp", {})):
        refused(tiny_table(alg, torchft={"ddp_api": "ddp_module"}, **extra),
                f"torchft.ddp_api = 'ddp_module': only with algorithm = 'torchft_ddp', not {alg!r}",
                "replaces its per-step Manager.allreduce of the gradients")
    pytest.importorskip("torchft", reason="the torchft system is refused without torchft installed")
    for chips in (1, 2):  # several ranks per group: the hook averages across groups, LearnerCore inside the group
        sc = from_dict(tiny_table("torchft_ddp", torchft={"ddp_api": "ddp_module"},
                                  topology={"learners": 2, "chips_per_learner": chips}))
        assert (sc.torchft.ddp_api, sc.topology.chips_per_learner) == ("ddp_module", chips)


def test_a_fault_kind_the_target_cannot_carry_is_refused_naming_target_kind_and_reason() -> None:
    table = tiny_table("torchft_ddp")
    table["faults"] = [{"action": "limit_data", "learner": 0, "bytes": 1000, "at": {"step": 5}}]
    refused(table, "faults[0].action = 'limit_data': target 'torchft' cannot carry this fault kind",
            "link faults need one network namespace per replica group",
            "the kernel link backend cannot carry limit_data (it carries degrade, flap, loss, partition)",
            "it carries: crash_host, degrade, flap, freeze, kill_chip, kill_learner, kill_syncer, loss, partition")
    table["faults"] = [{"action": "slow", "learner": 0, "speed": 0.5, "at": {"step": 5}, "until": {"after_s": 1.0}}]
    refused(table, "faults[0].action = 'slow': target 'torchft' cannot carry this fault kind: not carried yet")


def test_its_link_kinds_are_those_the_kernel_link_backend_carries() -> None:
    from diloco_chaos.chaos import faults
    from diloco_chaos.harness.targets.torchft import LINK_KINDS

    assert set(faults.names(lambda k: k.target == "link" and "kernel" in k.backends)) == set(LINK_KINDS)


NETNS = {"launch": {"hosts": "netns"}, "links": {"proxy": "off", "backend": "kernel"}}
LINK_FAULTS = [
    {"action": "partition", "learner": 1, "at": {"step": 5, "learner": 0}, "until": {"after_s": 2.0}},
    {"action": "partition", "learner": 1, "mode": "refuse", "at": {"step": 5}, "until": {"step": 9, "learner": 0}},
    {"action": "degrade", "learner": 1, "bandwidth_kbps": 64, "at": {"step": 5}, "until": {"after_s": 2.0}},
    {"action": "flap", "learner": 1, "period_s": 1.0, "duty": 0.5, "at": {"step": 5}, "until": {"after_s": 2.0}},
    {"action": "loss", "learner": 1, "percent": 5, "at": {"step": 5}, "until": {"after_s": 2.0}},
]


@pytest.mark.parametrize("fault", LINK_FAULTS)
def test_link_faults_are_accepted_on_netns_hosts_with_the_kernel_backend(fault: dict[str, Any]) -> None:
    pytest.importorskip("torchft", reason="the torchft system is refused without torchft installed")
    table = tiny_table("torchft_ddp", **NETNS)
    table["faults"] = [fault]
    sc = from_dict(table)
    assert (sc.faults[0].action, sc.launch.hosts, sc.links.backend) == (fault["action"], "netns", "kernel")


def test_link_faults_on_netns_hosts_take_the_kernel_backend_with_the_default_link_settings() -> None:
    pytest.importorskip("torchft", reason="the torchft system is refused without torchft installed")
    table = tiny_table("torchft_ddp", launch={"hosts": "netns"})
    table["faults"] = [LINK_FAULTS[0]]
    sc = from_dict(table)
    assert (sc.links.proxy, sc.links.backend) == ("auto", "auto"), "the scenario keeps what was written"
    assert (sc.links_in_effect.proxy, sc.links_in_effect.backend) == ("off", "kernel")


@pytest.mark.parametrize("fault", LINK_FAULTS)
@pytest.mark.parametrize("launch", [
    {},  # local hosts: proxies cannot carry Gloo or the checkpoint server
    {"launch": {"hosts": "netns"}, "links": {"backend": "toxiproxy"}},  # netns hosts without the kernel backend
])
def test_link_faults_elsewhere_are_refused_naming_target_kind_and_why(fault: dict[str, Any],
                                                                     launch: dict[str, Any]) -> None:
    table = tiny_table("torchft_ddp", **launch)
    table["faults"] = [fault]
    hosts = launch.get("launch", {}).get("hosts", "local")
    refused(table, f"faults[0].action = {fault['action']!r}: target 'torchft' carries link faults only on netns "
                   f"hosts with the kernel link backend (launch.hosts = {hosts!r}, links.backend = 'toxiproxy')",
            "Gloo pairs and checkpoint server use ephemeral ports")


def test_the_kernel_backend_refuses_what_it_cannot_carry_on_torchft_too() -> None:
    table = tiny_table("torchft_ddp", **NETNS)
    table["faults"] = [{"action": "degrade", "learner": 1, "latency_ms": 50, "at": {"step": 5},
                        "until": {"after_s": 2.0}}]
    refused(table, "faults[0].action = 'degrade': not supported by the kernel backend", "latency_ms")


@pytest.mark.parametrize("fault", [
    {"action": "kill_learner", "learner": 1, "at": {"step": 5, "learner": 0}},
    {"action": "kill_chip", "learner": 1, "chip": 1, "at": {"step": 5}},
    {"action": "crash_host", "learner": 1, "at": {"step": 5}},
    {"action": "freeze", "learner": 1, "at": {"step": 5}, "until": {"after_s": 2.0}},
])
def test_the_process_faults_it_carries_are_accepted(fault: dict[str, Any]) -> None:
    pytest.importorskip("torchft", reason="the torchft system is refused without torchft installed")
    table = tiny_table("torchft_ddp", recovery={"policy": "restart"})
    table["faults"] = [fault]
    assert from_dict(table).faults[0].action == fault["action"]


def test_kill_syncer_needs_quorum_retries_and_the_restart_policy() -> None:
    table = tiny_table("torchft_ddp")
    table["faults"] = [{"action": "kill_syncer", "at": {"step": 5}}]
    refused(table, "torchft.quorum_retries = 0: faults[0] kills the Lighthouse", "set it to at least 1",
            "faults[0].action = 'kill_syncer': needs recovery.syncer_policy = 'restart'")
    pytest.importorskip("torchft", reason="the torchft system is refused without torchft installed")
    ok = tiny_table("torchft_ddp", torchft={"quorum_retries": 1}, recovery={"syncer_policy": "restart"})
    ok["faults"] = table["faults"]
    assert from_dict(ok).faults[0].action == "kill_syncer"  # the builtin syncer's checkpoint rules do not apply


@pytest.mark.parametrize(("launch", "message"), [
    ({"hosts": "remote", "backend": "torchrun", "agents": ["a:1", "b:2"]},
     "launch.hosts = 'remote', launch.backend = 'torchrun': target 'torchft' runs on this machine only"),
    ({"hosts": "netns", "backend": "torchrun"},
     "launch.hosts = 'netns', launch.backend = 'torchrun': target 'torchft' runs on this machine only"),
])
def test_torchft_runs_on_local_or_netns_hosts_with_the_local_backend_only(launch: dict[str, Any],
                                                                          message: str) -> None:
    refused(tiny_table("torchft_ddp", launch=launch, links={"proxy": "off"}), message)


def test_torchft_on_netns_hosts_is_accepted() -> None:
    pytest.importorskip("torchft", reason="the torchft system is refused without torchft installed")
    sc = from_dict(tiny_table("torchft_ddp", launch={"hosts": "netns"}, links={"proxy": "off"}))
    assert (sc.launch.hosts, sc.launch.backend) == ("netns", "local")


def test_algorithm_flag_makes_the_smallest_change_and_says_it(capsys: pytest.CaptureFixture[str]) -> None:
    """`diloco-chaos run --builtin chip-loss --algorithm torchft_diloco`: chip-loss's 2 chips per learner become
    one rank per replica group (its kill aimed at the group's only rank) and its overlap 2, not below
    sync_every / fragments = 1, becomes 0 (what compare's row does); the flag says so on stderr instead of
    refusing the scenario."""
    import argparse

    from diloco_chaos.harness.cli import _load

    args = argparse.Namespace(scenario=None, builtin="chip-loss", set=[], algorithm="torchft_diloco", seed=None,
                              incident=None)
    sc = _load(args)
    assert sc.algorithm == "torchft_diloco" and (sc.diloco.fragments, sc.diloco.overlap) == (8, 0)
    assert sc.topology.chips_per_learner == 1
    err = capsys.readouterr().err
    assert "--algorithm torchft_diloco: topology.chips_per_learner 2 -> 1" in err and "faults[0].chip 1 -> 0" in err
    assert "diloco.overlap 2 -> 0" in err, err
    same = _load(argparse.Namespace(**{**vars(args), "algorithm": "torchft_ddp"}))
    assert same.diloco.overlap == 2 and capsys.readouterr().err == ""
