"""`replicas_agree` on hand-built torchft histories: it holds when every committing group reports the same digest
per step, fails naming the step and the groups when two disagree (a forked history), ignores uncommitted syncs
and is violated when no step was committed by two groups (nothing compared)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diloco_chaos.harness.invariants.checks.replicas_agree import replicas_agree
from tests.invariants.test_invariants import config, ev, write_run


def sync(t: float, learner: int, step: int, digest: str, committed: bool = True, rank: int = 0) -> dict[str, Any]:
    return ev("torchft_sync", t, f"learner{learner}.chip{rank}", learner=learner, rank=rank, step=step, inner_step=step,
              quorum_id=1, participants=2, committed=committed, healed=False, digest=digest, error=None)


def history(fork_at: int | None = None, steps: int = 6) -> list[dict[str, Any]]:
    out = []
    for s in range(1, steps + 1):
        for m in (0, 1):
            d = f"d{s:02d}" + ("x" if fork_at is not None and s >= fork_at and m == 1 else "")
            out.append(sync(s + 0.1 * m, m, s, d))
    return out


def test_holds_when_the_groups_agree(tmp_path: Path) -> None:
    res = replicas_agree(write_run(tmp_path, history(), config("torchft_ddp")))
    assert res.ok and res.figure == 0 and res.detail.startswith("6 steps compared"), res


def test_fails_naming_the_steps_where_two_groups_disagree(tmp_path: Path) -> None:
    res = replicas_agree(write_run(tmp_path, history(fork_at=5), config("torchft_ddp")))
    assert not res.ok and res.figure == 2, res
    assert "step 5: d05 by groups [0], d05x by groups [1]" in res.detail, res.detail


def test_an_uncommitted_sync_is_not_compared(tmp_path: Path) -> None:
    evs = [*history(), sync(9.0, 1, 3, "other", committed=False)]
    assert replicas_agree(write_run(tmp_path, evs, config("torchft_ddp"))).ok


def test_no_step_committed_by_two_groups_is_no_evidence(tmp_path: Path) -> None:
    solo = [e for e in history() if e["learner"] == 0]
    res = replicas_agree(write_run(tmp_path, solo, config("torchft_ddp")))
    assert not res.ok and res.figure is None and "nothing to compare" in res.detail


def test_ranks_of_one_group_that_disagree_are_named_by_rank(tmp_path: Path) -> None:
    """Two groups of two ranks: rank 1's quorum computed something else than rank 0's (each rank of a healed group
    healed from a different peer), so every group's ranks disagree with each other, not one group with another."""
    evs = [sync(s + 0.1 * m + 0.01 * k, m, s, f"d{s}" + ("r" if k and s >= 3 else ""), rank=k)
           for s in range(1, 5) for m in (0, 1) for k in (0, 1)]
    res = replicas_agree(write_run(tmp_path, evs, config("torchft_diloco")))
    assert not res.ok and res.figure == 2, res
    assert "step 3: d3 by groups [0/0 1/0], d3r by groups [0/1 1/1]" in res.detail, res.detail
