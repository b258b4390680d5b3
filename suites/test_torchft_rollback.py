"""torchft suite: the history fork a stale replica group makes when it comes back after every other group finished
(issue 28 item 8; docs/targets/torchft.md "Findings"), reproduced from an incident file.

The incident (examples/incidents/torchft-rollback.toml on examples/incidents/torchft-rollback-scenario.toml):
torchft_ddp, replica group 1 frozen (SIGSTOP) at group 0's step 10 and let go (SIGCONT) when group 0 has
committed its last step. Group 0 no longer asks for a quorum, so group 1 is alone with the Lighthouse:
- min_replicas = 1: it forms a quorum of one at its old step, nobody is ahead of it to heal from, and it trains
  the steps group 0 already committed again, from other weights: `replicas_agree` reports each of those steps with
  two digests (the invariant that catches a rollback of committed steps);
- min_replicas = 2 (a third group, so the others can go on without it): it gets no quorum, and after
  torchft.quorum_timeout_s torchft raises out of `start_quorum`; the group exits 1 and the run fails. No step is
  committed twice: the setting prevents the fork and turns it into a failed group.
Triggers are training progress (group 0's steps), never a sleep. Public API only: the pytest plugin's
`run_scenario`, diloco_chaos.harness.config.scenario.load and diloco_chaos.harness.run.replay.load_incident.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from torchft_history import committed

from diloco_chaos.harness.chaos_run import ChaosRunFailed
from diloco_chaos.harness.config.scenario import load
from diloco_chaos.harness.run.replay import load_incident

pytest.importorskip("torchft", reason="the torchft target needs torchft (the `torchft` extra, in `dev`)")
pytestmark = [pytest.mark.torchft, pytest.mark.failure, pytest.mark.timeout(120)]

INCIDENTS = Path(__file__).resolve().parent.parent / "examples" / "incidents"
SCENARIO = INCIDENTS / "torchft-rollback-scenario.toml"
INCIDENT = INCIDENTS / "torchft-rollback.toml"
VICTIM = 1


def incident(*overrides: str) -> Any:
    return load_incident(INCIDENT, load(SCENARIO, list(overrides)))


def test_a_stale_group_alone_retrains_committed_steps_under_min_replicas_1(run_scenario):
    sc = incident()
    assert sc.torchft.min_replicas == 1 and sc.topology.learners == 2
    res = run_scenario(sc)
    (start,) = res.of("fault_start")
    (end,) = res.of("fault_end")
    steps = sc.train.steps
    assert committed(res.events, 0)[-1]["step"] == steps and committed(res.events, 0)[-1]["t"] <= end["t"]
    back = [e for e in committed(res.events, VICTIM) if e["t"] > end["t"]]
    alone = [e for e in back if e["participants"] == 1]
    assert alone, f"the stale group committed steps alone after SIGCONT: {back[:3]}"
    first = alone[0]
    # a step it had in flight when frozen may complete in its old quorum first (1 run in 6), then it is alone
    held = [e for e in back if e["t"] < first["t"]]
    assert len(held) <= 1 and all(e["participants"] == 2 for e in held), held
    stale = max(e["step"] for e in committed(res.events, VICTIM) if e["t"] < first["t"])
    assert not first["healed"] and first["step"] == stale + 1, f"it went on from its own step {stale}: {first}"
    assert first["step"] < steps - 10, f"far behind group 0's {steps}: {first}"
    assert back[-1]["step"] == steps, "and trained on to the last step"
    agree = res.measure("replicas_agree")
    retrained = sorted({e["step"] for e in alone} & {e["step"] for e in committed(res.events, 0)})
    res.figures({"forked_steps": agree.figure, "retrained_steps": len(retrained), "resumed_at": first["step"],
                 "frozen_s": round(end["t"] - start["t"], 3), "detail": agree.detail[:200]})
    assert not agree.ok, "replicas_agree catches the fork"
    # the step it had in flight (held), when it completes after SIGCONT, forks too if group 0 had given up on
    # that allreduce (Gloo timeout, not committed) and committed the step alone from other weights (1 CI run)
    ours = {e["step"]: e["digest"] for e in committed(res.events, 0)}
    held_forked = [e for e in held if ours.get(e["step"]) not in (None, e["digest"])]
    # every step from where it resumed to the last was retrained alone (how far the victim got before SIGSTOP
    # landed depends on the load: it resumed at step 11-14 in the runs measured)
    assert len(retrained) == steps - first["step"] + 1, (first["step"], retrained)
    assert agree.figure == len(retrained) + len(held_forked), (agree.figure, len(retrained), held)
    assert f"step {first['step']}:" in agree.detail, agree.detail
    res.check("quorum_floor")  # torchft kept its own rule: every quorum had min_replicas = 1 member


def test_min_replicas_2_prevents_the_fork_and_the_stale_group_fails(run_scenario):
    sc = incident("topology.learners=3", "torchft.min_replicas=2")
    with pytest.raises(ChaosRunFailed) as failed:
        run_scenario(sc)
    run = failed.value.run
    assert run is not None and f"replica group {VICTIM}" in str(failed.value), failed.value
    assert "after a freeze of the schedule" in str(failed.value), failed.value
    events = run.events
    (end,) = [e for e in events if e["ev"] == "fault_end"]
    errors = [e for e in events if e["ev"] == "chip_error" and e["learner"] == VICTIM]
    assert errors and "Timeout expired" in errors[0]["error"], errors
    # the step it had in flight at the freeze may complete after SIGCONT in the quorum it was frozen in (its peers
    # had finished that allreduce before the freeze: 1 run in a full-suite run); no new quorum takes it back
    before = [e for e in committed(events, VICTIM) if e["t"] <= end["t"]]
    late = [e for e in committed(events, VICTIM) if e["t"] > end["t"]]
    held = [e for e in late if before and e["quorum_id"] == before[-1]["quorum_id"]
            and e["step"] == before[-1]["step"] + 1]
    assert len(held) <= 1 and late == held, f"the stale group committed nothing new after SIGCONT: {late[:2]}"
    fail_s = errors[0]["t"] - end["t"]
    # its quorum request may have started before the freeze (its timeout runs on while it is stopped: 6.0 s after
    # SIGCONT in 1 run of 9), so the timeout is counted from its last commit, the earliest the request can start
    last = max(e["t"] for e in committed(events, VICTIM))
    since_commit_s = errors[0]["t"] - last
    run.figures({"sigcont_to_failure_s": round(fail_s, 3), "last_commit_to_failure_s": round(since_commit_s, 3),
                 "quorum_timeout_s": sc.torchft.quorum_timeout_s})
    assert since_commit_s >= sc.torchft.quorum_timeout_s, since_commit_s
    assert fail_s < sc.torchft.quorum_timeout_s + 3.0, fail_s
    assert run.measure("replicas_agree").ok, "no step was committed with two results"
    assert run.measure("quorum_floor").ok
