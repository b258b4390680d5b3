"""Netns hosts suite: learners in their own network namespaces, link faults made by the kernel (tc, nftables).

Each test runs the real system with `[launch] hosts = "netns"` and the kernel link backend (set, or `[links]` left
at its default "auto", which picks it there): every learner host's chips live in its namespace and reach the
syncer across a veth and a bridge, and a partition is an nftables rule on that veth. The claims: a kernel
partition of one learner stalls ddp (which needs every learner every step) but not Decoupled DiLoCo, as a proxy's
partition does (suites/test_link_chaos.py); the default link settings carry it on netns hosts; and no namespace,
veth, qdisc or nft table is left after a run, after a failed run, or after a SIGKILLed supervisor once the next
run starts. Skipped, with the reason, where namespaces cannot be made (not root, no `ip`, `tc` or `nft`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.hosts.netns import availability
from diloco_chaos.harness.hosts.netns import remaining as residue
from diloco_chaos.harness.testing.pytest_plugin import ChaosRunFailed, wait_for

WHY = availability()



pytestmark = [pytest.mark.link, pytest.mark.skipif(WHY is not None, reason=f"{WHY}"), pytest.mark.timeout(300)]
PARTITION_S = 3.0
REPO = Path(__file__).resolve().parent.parent


def table(algorithm: str, steps: int, faults: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": f"netns-{algorithm}",
        "seed": 3,
        "algorithm": algorithm,
        "topology": {"learners": 2, "chips_per_learner": 1},
        "train": {"steps": steps, "warmup_steps": 10},
        "diloco": {"fragments": 4, "sync_every": 4, "overlap": 1},
        "eval": {"every_s": 2.0, "batches": 2},
        "timeouts": {"run_s": 120.0},
        "launch": {"hosts": "netns"},
        "links": {"backend": "kernel", "proxy": "off"},
        "faults": faults,
    }
    out.update(extra)
    return out


def window(evs: list[dict[str, Any]]) -> tuple[float, float]:
    start = next(e["t"] for e in evs if e["ev"] == "fault_start" and e["index"] == 0)
    end = next(e["t"] for e in evs if e["ev"] == "fault_end" and e["index"] == 0)
    return start, end


def prefix_of(evs: list[dict[str, Any]]) -> str:
    return next(e["prefix"] for e in evs if e["ev"] == "hosts_ready")


PARTITION = [{"action": "partition", "learner": 1, "at": {"step": 20, "learner": 0}, "until": {"after_s": PARTITION_S}}]


def test_a_kernel_partition_of_one_learner_stalls_ddp_but_not_decoupled(run_scenario):
    figures: dict[str, Any] = {}
    for algorithm, steps in (("ddp", 50), ("decoupled", 120)):
        res = run_scenario(from_dict(table(algorithm, steps, PARTITION)))
        rep, evs = res.report, res.events
        assert rep["links"]["backend"] == "kernel"
        assert residue(prefix_of(evs)) == [], "the run's namespaces, veths, qdiscs and nft tables are gone"
        assert next(e for e in evs if e["ev"] == "hosts_removed")["left"] == []
        t0, t1 = window(evs)
        merges = [e for e in evs if e["ev"] == "merge" and t0 + 0.5 <= e["t"] <= t1]
        steps0 = [e for e in evs if e["ev"] == "step" and e["learner"] == 0 and t0 + 0.5 <= e["t"] <= t1]
        figures[algorithm] = {"partition_s": round(t1 - t0, 2), "merges": len(merges), "learner0_steps": len(steps0)}
        assert all(d["steps"] == steps for d in rep["per_learner"].values()), f"{algorithm} resumes after the heal"
        if algorithm == "ddp":
            assert merges == [], f"ddp merged {len(merges)} times while a learner was partitioned"
            assert len(steps0) <= 1, f"learner 0 kept stepping in ddp during the partition: {len(steps0)}"
        else:
            assert len(merges) >= 5, f"decoupled merged only {len(merges)} times during the partition"
            assert all(e["participants"] == [0] for e in merges[len(merges) // 2:]), "learner 1 is cut off"
            assert len(steps0) >= 20, f"learner 0 made only {len(steps0)} steps during the partition"
        res.check("model_finite")
    res.figures(**figures)


def test_default_link_settings_on_netns_hosts_run_a_link_fault_through_the_kernel(run_scenario):
    """`[launch] hosts = "netns"` and nothing in `[links]`: links.proxy and links.backend stay "auto", which on
    netns hosts is no proxy and the kernel backend (diloco_chaos/harness/config/sections.py
    `LinksConfig.in_effect`); the partition is an nft rule on learner 1's veth, and nothing is left after."""
    doc = {**table("decoupled", 120, PARTITION), "name": "netns-default-links"}
    del doc["links"]
    sc = from_dict(doc)
    assert (sc.links.proxy, sc.links.backend) == ("auto", "auto")
    res = run_scenario(sc)
    rep, evs = res.report, res.events
    assert rep["links"]["backend"] == "kernel", rep["links"]
    assert json.loads((res.run_dir / "config.json").read_text())["links"]["backend"] == "auto"
    t0, t1 = window(evs)
    assert t1 - t0 >= PARTITION_S - 0.5, (t0, t1)
    merges = [e for e in evs if e["ev"] == "merge" and t0 + 0.5 <= e["t"] <= t1]
    assert len(merges) >= 4, f"decoupled merged only {len(merges)} times during the partition"
    assert all(e["participants"] == [0] for e in merges[len(merges) // 2:]), "the kernel cut learner 1 off"
    assert all(d["steps"] == 120 for d in rep["per_learner"].values()), "both learners finished after the heal"
    assert residue(prefix_of(evs)) == [], "the run's namespaces, veths, qdiscs and nft tables are gone"
    assert next(e for e in evs if e["ev"] == "hosts_removed")["left"] == []
    res.check("model_finite")
    res.figures(partition_s=round(t1 - t0, 2), merges_during=len(merges))


KILLED = {**table("decoupled", 100_000, []), "name": "netns-killed"}


def test_nothing_is_left_after_a_sigkilled_supervisor_and_the_next_failed_run(run_scenario, tmp_path):
    runs = tmp_path / "killed"
    code = ("import json, sys\nfrom diloco_chaos.harness.config.scenario import from_dict\n"
            "from diloco_chaos.harness.run.supervisor import run_scenario\n"
            f"run_scenario(from_dict(json.loads(sys.argv[1])), {str(runs)!r})\n")
    sup = subprocess.Popen([sys.executable, "-c", code, json.dumps(KILLED)], cwd=REPO,
                           env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)

    def stepping() -> str | None:
        for path in runs.glob("*/events.jsonl"):
            evs = [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]
            if {e["learner"] for e in evs if e["ev"] == "step"} == {0, 1}:
                return prefix_of(evs)
        return None

    try:
        killed = wait_for(stepping, 90, "the run on netns hosts to train")
    finally:
        sup.send_signal(signal.SIGKILL)
        sup.wait(timeout=30)
    assert residue(killed), "a SIGKILLed supervisor cannot clean up: its hosts are still there"
    # the next run fails on purpose: it cannot finish its steps within its deadline
    failing = table("decoupled", 100_000, [], timeouts={"socket_op_s": 1.0, "liveness_s": 1.5, "gloo_s": 2.0,
                                                        "barrier_s": 3.0, "run_s": 8.0})
    with pytest.raises(ChaosRunFailed, match="exceeded timeouts.run_s") as e:
        run_scenario(from_dict(failing))
    evs = e.value.run.events
    swept = next(x for x in evs if x["ev"] == "hosts_swept")["removed"]
    assert {f"{killed}n00", f"{killed}n01", f"{killed}b"} <= set(swept), swept
    assert residue(killed) == [], "the next run removed the killed supervisor's hosts"
    assert residue(prefix_of(evs)) == [], "the failed run removed its own hosts"
