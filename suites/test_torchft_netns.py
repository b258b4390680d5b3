"""torchft on netns hosts: a replica group cut off from the others by a kernel partition (docs/targets/torchft.md
"Partitions on netns hosts").

torchft's claim: a replica group that cannot be reached is dropped from the quorum within its Lighthouse's
timeouts, the others keep committing steps, and once it can be reached again it heals from a live peer and
commits with them again, with the same weights. Here each replica group lives in its own network namespace
(`[launch] hosts = "netns"`), the Lighthouse on the bridge in the root namespace, and the partition is an
nftables rule on the group's veth matching every TCP port (`links.backend = "kernel"`): its Lighthouse link,
its Gloo pairs to the other groups and its checkpoint server all go dark at once, as on a real network.

The test runs torchft 0.2.0 (3 groups of 1 rank, torchft_ddp on the scenario's task, the short explicit
timeouts of suites/test_torchft.py) with one `partition` (blackhole) of group 2 triggered by learner 0's progress
and lifted after PARTITION_S. It asserts: the survivors commit with 2 participants during the partition (the victim is
excluded); the victim heals from a peer and commits with 3 participants after it (it rejoins); `replicas_agree`
holds; every group reaches the last step; and nothing is left behind (hosts_removed lists nothing, nothing of
the run's prefix remains, and the pytest plugin's hygiene check finds no process or port). Skipped, with the
reason, where namespaces cannot be made (not root, no `ip`, `tc` or `nft`).
"""

from __future__ import annotations

from typing import Any

import pytest
from torchft_history import committed, longest_stall

from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.hosts.netns import availability
from diloco_chaos.harness.hosts.netns import remaining as residue

pytest.importorskip("torchft", reason="the torchft target needs torchft (the `torchft` extra, in `dev`)")
WHY = availability()
pytestmark = [pytest.mark.torchft, pytest.mark.failure, pytest.mark.link,
              pytest.mark.skipif(WHY is not None, reason=f"{WHY}"), pytest.mark.timeout(180)]

STEPS = 400
"""Manager steps of each group (20-40 a second here): enough that the survivors are still training when the
victim's links recover (TCP's retransmission backoff delays that: docs/targets/torchft.md)."""
VICTIM = 2
AT = {"step": 10, "learner": 0}
"""Learner 0's progress triggers the partition, so the trigger survives it."""
JOIN_S = 1.0
HEARTBEAT_S = 1.0
GLOO_S = 3.0
SLACK_S = 2.0
"""Added to the governing timeout in the stall bound (suites/test_torchft.py)."""
PARTITION_S = 6.0
"""Longer than the Gloo timeout plus the Lighthouse's: a partition that lands inside an allreduce holds the
survivors for GLOO_S (measured: a 2 s partition there was over before anyone was excluded)."""
EXCLUDED_BY_S = GLOO_S + JOIN_S + SLACK_S
"""The survivors' longest stall bound: they exclude the victim within this of the partition's start."""
IN_FLIGHT_S = 1.0
"""A survivor commit this long after the cut is not the step in flight at the cut: it cannot include the victim."""
TORCHFT = {"min_replicas": 2, "join_timeout_s": JOIN_S, "heartbeat_timeout_s": HEARTBEAT_S, "timeout_s": GLOO_S,
           "connect_timeout_s": GLOO_S, "quorum_timeout_s": 15.0, "quorum_tick_ms": 100}
"""quorum_timeout_s: the victim's quorum request waits through the partition and the TCP backoff after it; with
no quorum retry, its expiry would end the victim's process."""


def scenario(fault: dict[str, Any], steps: int = STEPS, **torchft: Any) -> Any:
    return from_dict({
        "name": "torchft-netns",
        "seed": 3,
        "algorithm": "torchft_ddp",
        "topology": {"learners": 3, "chips_per_learner": 1},
        "train": {"steps": steps, "warmup_steps": 10, "lr": 3e-3},
        "eval": {"batches": 2},
        "timeouts": {"run_s": 120.0},
        "torchft": {**TORCHFT, **torchft},
        "launch": {"hosts": "netns"},
        "links": {"backend": "kernel", "proxy": "off"},
        "faults": [fault],
    })


def test_a_partitioned_group_is_excluded_heals_and_rejoins(run_scenario):
    res = run_scenario(scenario({"action": "partition", "learner": VICTIM, "at": AT,
                                 "until": {"after_s": PARTITION_S}}))
    evs = res.events
    (start,) = res.of("fault_start")
    (end,) = res.of("fault_end")
    assert res.report["links"]["backend"] == "kernel"
    during = [e for m in (0, 1) for e in committed(res.events, m) if start["t"] + IN_FLIGHT_S < e["t"] < end["t"]]
    assert during and {e["participants"] for e in during} == {2}, "the survivors went on without the victim"
    assert not [e for e in committed(res.events, VICTIM) if start["t"] + GLOO_S < e["t"] < end["t"]], \
        "the partitioned group committed nothing while cut off"
    back = [e for e in committed(res.events, VICTIM) if e["t"] > end["t"]]
    assert back, "the victim committed again after the partition"
    assert back[0]["healed"], "its first commit after the partition follows a heal from a live peer"
    assert back[0]["step"] > AT["step"] + 1, "it resumed from the others' step"
    assert back[-1]["participants"] == 3, "and rejoined the quorum"
    res.check("faults_fired")
    agree = res.check("replicas_agree")
    for m in range(3):
        assert committed(res.events, m)[-1]["step"] == STEPS, f"group {m} did not reach step {STEPS}"
    unexpected = [e for e in res.report["errors"] if not e["expected"]]
    assert not unexpected, f"errors no injected fault explains: {unexpected}"
    stall = longest_stall(res.events, [0, 1], start["t"], end["t"])
    figures = {"partition_s": round(end["t"] - start["t"], 3), "survivor_stall_s": round(stall, 3),
               "end_to_victim_commit_s": round(back[0]["t"] - end["t"], 3), "healed_to_step": back[0]["step"],
               "survivor_commits_during": len(during), "replicas_agree": agree.detail}
    res.figures(figures)
    # excluded within the Lighthouse's timeouts, or the Gloo timeout when cut inside an allreduce
    assert stall < EXCLUDED_BY_S, figures
    (removed,) = [e for e in evs if e["ev"] == "hosts_removed"]
    assert removed["left"] == [], removed
    prefix = next(e["prefix"] for e in evs if e["ev"] == "hosts_ready")
    assert residue(prefix) == [], "the run's namespaces, veths, qdiscs and nft tables are gone"
