"""`replicas_agree` and `ranks_agree` on hand-built torchft histories. replicas_agree checks torchft's guarantee as
torchft states it, per group rank: it holds when every committing group reports the same digest per step at each
rank (even where rank 0 and rank 1 differ), fails naming the step, the rank and the groups when two groups
disagree at one rank (a forked history), ignores uncommitted syncs and is violated when no step was committed by
two groups (nothing compared). ranks_agree checks the harness trainer's own promise for replicated ranks: the
ranks of one group agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diloco_chaos.harness.invariants import check_all
from diloco_chaos.harness.invariants.checks.torchft.ranks_agree import ranks_agree
from diloco_chaos.harness.invariants.checks.torchft.replicas_agree import replicas_agree
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


def two_ranks(differ_from: int | None = None, fork: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """Two groups of two ranks, steps 1-4. `differ_from`: from that step rank 1 holds other weights than rank 0, in
    every group alike (torchft's per-rank view: each rank agrees across groups). `fork` (step, rank): from that
    step group 1 disagrees with group 0 at that rank."""
    def d(s: int, m: int, k: int) -> str:
        out = f"d{s}" + ("r" if differ_from is not None and k and s >= differ_from else "")
        return out + ("x" if fork is not None and m == 1 and k == fork[1] and s >= fork[0] else "")
    return [sync(s + 0.1 * m + 0.01 * k, m, s, d(s, m, k), rank=k) for s in range(1, 5) for m in (0, 1) for k in (0, 1)]


def test_ranks_that_differ_but_agree_across_groups_hold(tmp_path: Path) -> None:
    """Rank 0 and rank 1 of each group hold different weights from step 3, but each rank agrees across the groups:
    torchft's guarantee holds (it promises nothing between the ranks of one group)."""
    res = replicas_agree(write_run(tmp_path, two_ranks(differ_from=3), config("torchft_diloco")))
    assert res.ok and res.figure == 0, res
    assert res.detail == "4 steps compared across groups at every group rank, all equal", res.detail


def test_two_groups_that_disagree_at_one_rank_fail(tmp_path: Path) -> None:
    res = replicas_agree(write_run(tmp_path, two_ranks(fork=(3, 1)), config("torchft_diloco")))
    assert not res.ok and res.figure == 2, res
    assert "step 3: r1: d3 by groups [0], d3x by groups [1]" in res.detail, res.detail
    assert "r0:" not in res.detail, "rank 0 agreed across the groups"


def test_ranks_agree_fails_naming_the_harness_trainer_where_ranks_of_a_group_differ(tmp_path: Path) -> None:
    """The same history that replicas_agree accepts breaks the harness trainer's own promise for replicated ranks
    (torchft_ddp keeps a full copy at every rank): ranks_agree fails, naming the trainer, not torchft."""
    res = ranks_agree(write_run(tmp_path, two_ranks(differ_from=3), config("torchft_ddp")))
    assert not res.ok and res.figure == 4, res
    assert res.detail.startswith("the harness's torchft trainer keeps a full copy at every rank"), res.detail
    assert "group 0 step 3: d3 by ranks [0], d3r by ranks [1]" in res.detail, res.detail


def test_ranks_agree_holds_where_the_ranks_of_each_group_agree(tmp_path: Path) -> None:
    res = ranks_agree(write_run(tmp_path, two_ranks(), config("torchft_ddp")))
    assert res.ok and res.detail == "8 group steps compared across their ranks, all equal", res


def test_ranks_agree_applies_to_replicated_ranks_only(tmp_path: Path) -> None:
    """check_all runs ranks_agree for torchft_ddp (trait replicated_ranks) and not for torchft_diloco (one rank per
    group): the per-rank difference that torchft permits fails nothing under torchft_diloco."""
    names = {r.name: r.ok for r in check_all(write_run(tmp_path, two_ranks(differ_from=3), config("torchft_diloco"),
                                                                 name="ft"))}
    assert "ranks_agree" not in names and names["replicas_agree"], names
    names = {r.name: r.ok for r in check_all(write_run(tmp_path, two_ranks(differ_from=3), config("torchft_ddp"),
                                                                 name="ddp"))}
    assert names["ranks_agree"] is False and names["replicas_agree"], names
