"""torchft suite: the standalone reproductions of docs/targets/torchft.md "Findings" (examples/torchft-findings/),
each run as its own interpreter with nothing of diloco-chaos imported, so each fact is about torchft itself.

Each script prints one JSON line of what it observed; a test asserts every fact the finding's entry states, one
assertion per fact with the fact's name, so a torchft that behaves differently fails naming what changed; and
that every process the script started (Lighthouses, trainer ranks: its `pids`) is gone. The scripts trigger their
faults by training progress (records and log lines), never by wall time, and set every torchft timeout.
ddp_comm_hook_assert.py in that folder is run by another suite. The min_replicas 2 control of the fork script
(`--min-replicas 2`) is not run here: suites/test_torchft_rollback.py covers that setting through the harness.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchft", reason="the findings reproduce torchft behaviour (the `torchft` extra, in `dev`)")
pytestmark = [pytest.mark.torchft, pytest.mark.timeout(180)]

FOLDER = Path(__file__).resolve().parent.parent / "examples" / "torchft-findings"
SCRIPT_TIMEOUT_S = 150


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def run(script: str, *args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFT_") and k != "REPRO_KEEP"}
    proc = subprocess.run([sys.executable, str(FOLDER / script), *args], capture_output=True, text=True,
                          timeout=SCRIPT_TIMEOUT_S, env=env, cwd=FOLDER)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and len(lines) == 1, f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    out: dict[str, Any] = json.loads(lines[0])
    assert out["pids"], out
    left = [p for p in out["pids"] if alive(p)]
    assert not left and not out["left_alive"], f"processes left: {left} {out['left_alive']}"
    assert "stopped" not in out, f"an awaited record never came: {out['stopped']}"
    return out


def test_a_restarted_lighthouse_reissues_quorum_id_1_and_one_commit_fails():
    out = run("lighthouse_quorum_id_reuse.py")
    assert out["quorum_before"] == {"step": 4, "quorum_id": 1, "participants": 2, "committed": True}, out
    assert out["same_quorum_id_other_membership"], f"new Lighthouse's first quorum: {out['after_restart'][:1]}"
    assert out["skipped_reconfigure"], f"reconfigured after the restart for {out['reconfigured_after_restart']}"
    assert out["failed_commit"], f"the step on the stale process group committed: {out['after_restart'][:1]}"
    assert out["lighthouse2_commit_failure_bumps"] == [2], out["lighthouse2_commit_failure_bumps"]
    assert out["recovered"] is not None and out["recovered"]["quorum_id"] == 2, out["recovered"]
    assert out["failed_commits_after_restart"] == 1, out["after_restart"]
    assert out["group0_exit"] == 0 and out["reproduced"], out


def test_min_replicas_1_lets_a_stale_group_recommit_steps_from_other_weights():
    out = run("min_replicas_one_fork.py")
    assert out["agreed_before_freeze"], "the groups held one history while in one quorum"
    assert out["stale_after_thaw"] is not None and out["stale_after_thaw"]["participants"] == 1, \
        f"the returning group got a quorum of one: {out['stale_after_thaw']}"
    assert not out["stale_healed"], "nobody was ahead of it to heal from"
    assert out["recommitted_steps"] == list(range(5, 17)), out["recommitted_steps"]
    assert out["forked_steps"] == 12, f"every recommitted step has other weights: {out['forked_steps']}"
    assert out["stale_exit"] == 0 and out["reproduced"], out


def test_a_healing_group_heals_each_rank_from_its_own_source_and_ranks_agree_across_groups():
    out = run("heal_round_robin.py")
    src = out["heal_sources"]
    assert src["rank0"]["source_group"] == 0 and src["rank1"]["source_group"] == 1, \
        f"round robin by group rank ((i + group_rank) % up_to_date): {src}"
    assert out["manager_server_log"] == [0, 1], "the ManagerServer's 'healing is required' lines"
    assert out["healed_loaded"] == ["g2r0new", "g2r1new"], out["healed_loaded"]
    assert out["steps_compared"] == [3, 4, 5], out["steps_compared"]
    assert out["per_rank_agree"], "torchft's promise: at each group rank, every group holds the same weights"
    assert out["ranks_of_a_group_agree_before_heal"], "replicated ranks agreed until the heal"
    assert out["ranks_of_a_group_differ_after_heal"] == [3, 4, 5], \
        f"replicated ranks split by the heal (no torchft promise): {out['ranks_of_a_group_differ_after_heal']}"
    assert out["reproduced"], out


def test_under_a_restarted_lighthouse_two_of_three_commit_and_the_late_group_heals_back():
    out = run("restart_two_of_three.py")
    assert out["committed_without_g0"] == [5, 6, 7], out["committed_without_g0"]
    pair = out["pair_after_restart"]
    assert pair[-1] == {"step": 5, "quorum_id": 2, "participants": 2, "committed": True}, pair
    assert out["g0_healed"], "the late group healed from the two"
    assert out["g0_first_after"] == {"step": 8, "quorum_id": 3, "participants": 3, "committed": True}, out
    assert out["last_steps"] == {"g0": 12, "g1": 12, "g2": 12}, out["last_steps"]
    assert out["steps_all_three_agree"] == [1, 2, 3, 4, 8, 9, 10, 11, 12], out["steps_all_three_agree"]
    assert out["exits"] == {"g0": 0, "g1": 0, "g2": 0} and out["reproduced"], out
