"""The torchft history invariants (diloco_chaos/harness/invariants/checks/torchft/) on hand-built histories: each
holds on a good one and fails, naming the process and step, on one that breaks it; and the general ones
(availability, no_global_downtime) read a torchft run's committed steps as the global model's advances."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diloco_chaos.harness.invariants import availability, check_all, load_run, no_global_downtime
from diloco_chaos.harness.invariants.checks.torchft.commits_monotonic import commits_monotonic
from diloco_chaos.harness.invariants.checks.torchft.quorum_floor import quorum_floor
from diloco_chaos.harness.invariants.checks.torchft.quorum_ids_monotonic import quorum_ids_monotonic
from tests.invariants.test_invariants import config, ev, write_run


def sync(t: float, m: int, step: int, *, quorum: int = 1, participants: int = 2, committed: bool = True,
         healed: bool = False, pid: int = 0) -> dict[str, Any]:
    return {**ev("torchft_sync", t, f"learner{m}.chip0", learner=m, rank=0, step=step, inner_step=step,
                 quorum_id=quorum, participants=participants, committed=committed, healed=healed,
                 digest=f"d{step}"), "pid": 100 + m + pid}


def quorum(t: float, m: int, qid: int, step: int, pid: int = 0) -> dict[str, Any]:
    return {**ev("torchft_quorum", t, f"learner{m}.chip0", learner=m, rank=0, replica_id=f"learner{m}",
                 quorum_id=qid, step=step), "pid": 100 + m + pid}


def good(steps: int = 6) -> list[dict[str, Any]]:
    out = [quorum(0.05, m, 1, 0) for m in (0, 1)]
    for s in range(1, steps + 1):
        for m in (0, 1):
            out.append(ev("step", s * 0.1 + 0.01 * m, f"learner{m}.chip0", learner=m, step=s, loss=1.0, tokens=10,
                          chips=1, compute_s=0.05, sync_s=0.01))
            out.append(sync(s * 0.1 + 0.01 * m + 0.001, m, s))
    return out


def cfg(min_replicas: int = 2) -> dict[str, Any]:
    return {**config("torchft_ddp"), "torchft": {"min_replicas": min_replicas}}


def run(tmp_path: Path, evs: list[dict[str, Any]], min_replicas: int = 2) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return write_run(tmp_path, evs, cfg(min_replicas))


def test_a_good_history_holds_every_torchft_invariant(tmp_path: Path) -> None:
    d = run(tmp_path, good())
    for inv in (commits_monotonic, quorum_ids_monotonic, quorum_floor):
        res = inv(d)
        assert res.ok, res
    assert quorum_floor(d).figure == 2 and commits_monotonic(d).figure == 0
    names = {r.name for r in check_all(load_run(d))}
    assert {"commits_monotonic", "quorum_ids_monotonic", "quorum_floor", "replicas_agree"} <= names


def test_commits_monotonic_fails_on_a_repeat_and_a_jump_without_heal(tmp_path: Path) -> None:
    evs = good(3) + [sync(0.5, 0, 3), sync(0.6, 1, 6)]
    res = commits_monotonic(run(tmp_path, evs))
    assert not res.ok and res.figure == 2, res
    assert "learner 0 rank 0 (pid 100)" in res.detail and "step 3 -> 3 (repeated)" in res.detail
    assert "step 3 -> 6 (jumped without a heal)" in res.detail


def test_commits_monotonic_allows_a_jump_by_a_heal_and_a_restart(tmp_path: Path) -> None:
    healed = good(3) + [sync(0.6, 1, 6, healed=True)]
    assert commits_monotonic(run(tmp_path / "a", healed)).ok
    via_quorum = good(3) + [quorum(0.55, 1, 2, 5), sync(0.6, 1, 6)]
    assert commits_monotonic(run(tmp_path / "b", via_quorum)).ok
    restarted = good(3) + [sync(0.6, 1, 1, pid=50)]  # a new process starts its own sequence
    assert commits_monotonic(run(tmp_path / "c", restarted)).ok


def test_commits_monotonic_without_commits_is_no_evidence(tmp_path: Path) -> None:
    res = commits_monotonic(run(tmp_path, [quorum(0.1, 0, 1, 0)]))
    assert not res.ok and res.figure is None and "nothing to check" in res.detail


def test_quorum_ids_monotonic_fails_when_an_id_goes_down_in_one_process(tmp_path: Path) -> None:
    evs = good(3) + [quorum(0.5, 0, 3, 3), sync(0.6, 0, 4, quorum=3), quorum(0.7, 0, 1, 4)]
    res = quorum_ids_monotonic(run(tmp_path, evs))
    assert not res.ok and res.figure == 1 and "learner 0 rank 0 (pid 100)" in res.detail, res
    assert "quorum 3 -> 1 (torchft_quorum)" in res.detail
    restarted = good(3) + [quorum(0.5, 0, 3, 3), quorum(0.7, 0, 1, 0, pid=50)]
    assert quorum_ids_monotonic(run(tmp_path / "b", restarted)).ok, "a new process may see a lower id"


def test_quorum_floor_fails_on_a_commit_below_min_replicas(tmp_path: Path) -> None:
    evs = good(3) + [sync(0.5, 0, 4, participants=1, quorum=2)]
    res = quorum_floor(run(tmp_path, evs))
    assert not res.ok and res.figure == 1 and res.bound == 2, res
    assert "learner 0 rank 0 step 4 (quorum 2)" in res.detail
    assert quorum_floor(run(tmp_path / "b", evs, min_replicas=1)).ok
    uncommitted = good(3) + [sync(0.5, 0, 4, participants=1, committed=False)]
    assert quorum_floor(run(tmp_path / "c", uncommitted)).ok, "a step that was not committed advanced nothing"


def test_uptime_and_global_downtime_read_the_committed_steps(tmp_path: Path) -> None:
    starts = [ev("chip_start", 0.0, f"learner{m}.chip0", learner=m, rank=0, size=1, generation=0) for m in (0, 1)]
    evs = starts + good(3)
    late = [ev("step", 5.0, f"learner{m}.chip0", learner=m, step=4, loss=1.0, tokens=10, chips=1, compute_s=0.05,
               sync_s=0.01) for m in (0, 1)]
    gap = evs + late + [sync(5.0, 0, 4), sync(5.0, 1, 4)]
    assert availability(run(tmp_path / "a", evs), min_uptime=0.99).ok
    res = availability(run(tmp_path / "b", gap), min_uptime=0.9)
    assert not res.ok and res.figure < 0.5, res
    assert no_global_downtime(run(tmp_path / "c", evs), bound_s=0.5).ok
    res = no_global_downtime(run(tmp_path / "d", gap), bound_s=1.0)
    assert not res.ok and res.figure > 4.0, res
