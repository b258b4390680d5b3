"""diloco_chaos.harness.report.progress on hand-built torchft histories: a committed manager step is one advance
(grouped over the groups that committed it, a step re-committed in another quorum is another advance), an
uncommitted sync covers nothing, torchft_diloco's fragment syncs cover the last sync_every steps for a share of
1 / fragments each; and goodput, uptime and the longest gap follow from it."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import as_records

from diloco_chaos.harness.report.metrics import downtime, goodput
from diloco_chaos.harness.report.progress import progress


def step(t: float, m: int, s: int, tokens: int = 100) -> dict[str, Any]:
    return {"ev": "step", "t": t, "proc": f"learner{m}.chip0", "learner": m, "step": s, "loss": 1.0,
            "tokens": tokens, "chips": 1, "compute_s": 0.05, "sync_s": 0.01}


def sync(t: float, m: int, s: int, inner: int, committed: bool = True, quorum: int = 1) -> dict[str, Any]:
    return {"ev": "torchft_sync", "t": t, "proc": f"learner{m}.chip0", "learner": m, "rank": 0, "step": s,
            "inner_step": inner, "quorum_id": quorum, "participants": 2, "committed": committed, "healed": False,
            "digest": f"d{s}"}


def ddp_history(steps: int = 6, fail_at: int | None = None) -> list[dict[str, Any]]:
    evs: list[dict[str, Any]] = [{"ev": "chip_start", "t": 0.0, "proc": f"learner{m}.chip0", "learner": m,
                                  "rank": 0, "size": 1, "generation": 0} for m in (0, 1)]
    for s in range(1, steps + 1):
        for m in (0, 1):
            t = s * 0.1 + 0.01 * m
            evs.append(step(t, m, s))
            evs.append(sync(t + 0.001, m, s, s, committed=s != fail_at))
    return evs


def test_each_committed_step_is_one_advance_of_both_groups() -> None:
    p = progress(as_records(ddp_history()), "torchft_ddp", fragments=1, sync_every=1)
    assert len(p.advances) == 6
    assert [a.participants for a in p.advances] == [(0, 1)] * 6
    assert p.advances[0].t == pytest.approx(0.101) and p.advances[-1].tokens_merged == 1200.0
    assert p.covered[0] == {s: 1.0 for s in range(1, 7)}


def test_an_uncommitted_sync_is_no_advance_and_its_step_is_discarded() -> None:
    recs = as_records(ddp_history(fail_at=3))
    p = progress(recs, "torchft_ddp", fragments=1, sync_every=1)
    assert len(p.advances) == 5 and 3 not in p.covered[0] and 3 not in p.covered[1]
    gp = goodput(recs, "torchft_ddp", 2, 1, 1, 1)
    assert gp.discarded_chip_s > 0 and gp.goodput is not None and gp.goodput < 1.0


def test_the_same_step_in_another_quorum_is_another_advance() -> None:
    evs = ddp_history(steps=2) + [sync(5.0, 1, 2, 2, quorum=2)]
    p = progress(as_records(evs), "torchft_ddp", fragments=1, sync_every=1)
    assert [a.participants for a in p.advances] == [(0, 1), (0, 1), (1,)]


def test_fragment_syncs_cover_the_last_sync_every_steps_by_share() -> None:
    evs = [step(0.1 * s, 0, s) for s in range(1, 9)]
    evs += [sync(0.1 * i + 0.01, 0, i // 2, i) for i in (2, 4, 6, 8)]  # sync_every 4, 2 fragments: one per 2 steps
    p = progress(as_records(evs), "torchft_diloco", fragments=2, sync_every=4)
    assert p.covered[0][1] == 1.0 and p.covered[0][5] == 1.0, "steps 1-6 are in both fragments' windows"
    assert p.covered[0][8] == 0.5, "step 8 reached one fragment: the other's next sync never came"
    assert [a.tokens for a in p.advances] == [(100.0,), (200.0,), (200.0,), (200.0,)]
    assert p.round_end(0, 4) and p.round_end(0, 2) and not p.round_end(0, 3)


def test_a_gap_between_commits_is_downtime() -> None:
    evs = ddp_history(steps=3) + [step(5.0, 0, 4), sync(5.0, 0, 4, 4), step(5.0, 1, 4), sync(5.0, 1, 4, 4)]
    p = progress(as_records(evs), "torchft_ddp", fragments=1, sync_every=1)
    d = downtime(p.times, 0.101, 5.0, window_s=1.0)
    assert d["downtime_s"] == pytest.approx(5.0 - 0.301 - 1.0, abs=1e-3)
