"""report.json `tokens` (diloco_chaos/harness/report/tokens.py): every trained token accounted, its parts summing to
the tokens trained, on hand-built histories and on one small real run of each algorithm; and the mutation a run was
made under recorded (run_start, config.json, report.json), warned about by the CLI and refused by compare."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import as_records, complete, tiny

from diloco_chaos.harness.config.scenario import ScenarioError, from_dict
from diloco_chaos.harness.report.compare import verdict
from diloco_chaos.harness.report.results import MutationMismatch, RunRow
from diloco_chaos.harness.report.tokens import PARTS, token_parts
from diloco_chaos.harness.run.replay import recorded_scenario
from diloco_chaos.harness.run.supervisor import run_scenario
from diloco_chaos.trainers import mutations

ROOT = Path(__file__).resolve().parents[2]


def ev(t: float, name: str, proc: str = "syncer", **fields: Any) -> dict[str, Any]:
    return complete([{"t": t, "wall": 1_700_000_000.0 + t, "pid": 1, "proc": proc, "ev": name, **fields}])[0]


def step(t: float, m: int, s: int, tokens: int = 400) -> dict[str, Any]:
    return ev(t, "step", f"learner{m}.chip0", learner=m, step=s, tokens=tokens, loss=1.0, chips=1, compute_s=0.01,
              sync_s=0.0)


def merge(t: float, p: int, version: int, parts: list[tuple[int, int, int]], tokens: int = 400) -> dict[str, Any]:
    """A decoupled merge of fragment p taking in each (learner, first step, last step)."""
    c = [tokens * (b - a + 1) for _, a, b in parts]
    return ev(t, "merge", fragment=p, version=version, participants=[m for m, _, _ in parts], c_tokens=c,
              step_ranges=[[a, b] for _, a, b in parts], base_versions=[version - 1] * len(parts), round=version)


def apply(t: float, m: int, s: int, p: int, version: int, pulled: int | None,
          broadcast: bool = False) -> dict[str, Any]:
    return ev(t, "apply", f"learner{m}.chip0", learner=m, step=s, fragments=[p], versions=[version], pulled=[pulled],
              arrived=[s], broadcast=[broadcast])


def parts_of(evs: list[dict[str, Any]], algorithm: str = "decoupled", fragments: int = 2) -> dict[str, float]:
    recs = as_records(evs)
    div = fragments if algorithm == "decoupled" else 1
    merged = sum(sum(e.c_tokens) / div for e in recs if type(e).__name__ == "Merge")  # the syncer's count
    out = token_parts(recs, algorithm, fragments, 4, merged)
    assert sum(out.parts().values()) == pytest.approx(out.trained)
    assert all(v >= -1e-9 for v in out.parts().values()), out
    return out.to_dict()


def test_the_overlap_window_is_discarded_per_fragment_and_the_rest_in_flight() -> None:
    """Learner 0, P = 2, 400 tokens a step: fragment 0 pulled at step 2 and merged with steps 1-2, applied at
    step 4 (steps 3-4 of fragment 0 overwritten: 2 x 200); fragment 1 never merged (steps 1-5 in flight: 5 x 200);
    step 5 of fragment 0 in flight too."""
    evs = [step(1.0 + s, 0, s) for s in range(1, 6)]
    evs += [merge(3.5, 0, 1, [(0, 1, 2)]), apply(5.01, 0, 4, 0, 1, pulled=2)]
    got = parts_of(evs)
    assert got["trained"] == 2000 and got["merged"] == 400 and got["discarded_overlap"] == 400
    assert got["in_flight_at_end"] == 1200 and got["unattributed"] == 0 and got["merged_unlogged"] == 0


def test_a_broadcast_overwrite_a_restart_and_a_redone_step_are_each_counted() -> None:
    """Learner 1 is overwritten on fragment 1 at step 2 by a merge it was not in (fragment_overwritten); it is killed
    after step 3 and redoes step 3 after its restart."""
    evs = [step(1.0, 1, 1), step(2.0, 1, 2),
           ev(2.1, "fragment_overwritten", "learner1.chip0", learner=1, fragment=1, step=2, tokens=400.0,
              reason="merge of a round it was not in"),
           step(3.0, 1, 3),
           ev(3.5, "learner_down", "supervisor", learner=1, exitcodes={}, step=3, repair_s=0.1),
           ev(4.0, "learner_restart", "supervisor", learner=1, generation=1, start_step=2, restarts=1),
           step(5.0, 1, 3), merge(6.0, 0, 1, [(1, 1, 3)]), merge(6.1, 1, 1, [(1, 3, 3)])]
    got = parts_of(evs)
    # fragment 0: steps 1-3 merged (the redone 3's); fragment 1: steps 1-2 overwritten, the redone step 3 merged
    assert got["merged"] == 800 and got["discarded_broadcast"] == 400
    assert got["discarded_restart"] == 400, "the first step 3 (both fragments) was lost with the learner"
    assert got["trained"] == 1600 and got["in_flight_at_end"] == 0


@pytest.mark.parametrize(("broadcast", "part"), [(True, "discarded_broadcast"), (False, "discarded_restart")])
def test_a_value_it_did_not_pull_discards_as_a_broadcast_or_as_a_rejoin(broadcast: bool, part: str) -> None:
    """Learner 1 pushed fragment 0's steps 1-2 and was left out of the merge (K = 1), which it then applied at
    step 2: with nothing unpushed to lose it writes no fragment_overwritten, and its pushed steps no merge took are
    lost to that broadcast (diloco.broadcast = all). The same apply of a value it did not pull without the
    broadcast flag is the current value taken on (re)joining: a restart's loss. (A fault-free default run counted
    2560 tokens as discarded_restart before the apply record said which.)"""
    evs = [step(1.0, 1, 1), step(2.0, 1, 2), merge(2.5, 1, 1, [(1, 1, 2)]),
           apply(2.6, 1, 2, 0, 1, pulled=None, broadcast=broadcast)]
    got = parts_of(evs)
    assert got[part] == 400 and got["merged"] == 400 and got["unattributed"] == 0, got
    assert got["discarded_restart" if broadcast else "discarded_broadcast"] == 0, got


def test_a_declined_push_is_rejected_and_a_step_merged_but_never_logged_is_told_apart() -> None:
    evs = [step(1.0, 0, 1), step(2.0, 0, 2),
           ev(2.5, "push_superseded", learner=0, fragment=1, first_step=1, last_step=2, reason="stale",
              cause="stale"),
           merge(3.0, 0, 1, [(0, 1, 3)])]  # step 3's record was never written (killed right after sending)
    got = parts_of(evs)
    assert got["discarded_rejected"] == 400 and got["merged"] == 400 and got["merged_unlogged"] == 200


def test_ddp_and_diloco_parts_come_from_their_rounds_and_steps() -> None:
    ddp = [step(1.0, 0, 1), step(2.0, 0, 2),
           ev(1.5, "merge", fragment=None, version=1, participants=[0], c_tokens=[400], step=1, round=None),
           ev(2.5, "sync_rejected", learner=0, step=2, reason="rejected_nonfinite")]
    got = parts_of(ddp, "ddp", 1)
    assert got["merged"] == 400 and got["discarded_rejected"] == 400
    diloco = [step(float(s), 0, s) for s in range(1, 7)]
    diloco += [ev(4.5, "merge", fragment=None, version=1, participants=[0], c_tokens=[1600], step=4, round=1)]
    got = parts_of(diloco, "diloco", 1)
    assert got["merged"] == 1600 and got["in_flight_at_end"] == 800, "steps 5-6 of round 2 never closed"


BUILTIN = ("decoupled", "diloco", "ddp", "elastic_ddp")
TORCHFT = ("torchft_ddp", "torchft_diloco")


def check_tokens(report: dict[str, Any]) -> dict[str, float]:
    t = report["tokens"]
    assert t["trained"] == report["tokens_trained"] > 0
    assert sum(t[p] for p in PARTS) == pytest.approx(t["trained"], abs=1.0), t
    assert all(t[p] >= 0 for p in PARTS), t
    assert t["merged"] + t["merged_unlogged"] == pytest.approx(report["tokens_merged"], abs=1.0), t
    assert t["unattributed"] <= 0.01 * t["trained"], t
    return t


@pytest.mark.parametrize("algorithm", BUILTIN)
def test_every_trained_token_is_accounted_on_a_real_run(algorithm: str, runs_dir: Path) -> None:
    res = run_scenario(tiny(algorithm, learners=2, chips=1, steps=20), runs_dir)
    t = check_tokens(res.report)
    if algorithm == "decoupled":
        assert t["discarded_overlap"] > 0, "the overlap window overwrites part of every fragment's work"
    else:
        assert t["discarded_overlap"] == 0


@pytest.mark.torchft
@pytest.mark.skipif(importlib.util.find_spec("torchft") is None, reason="torchft is not installed")
@pytest.mark.parametrize("algorithm", TORCHFT)
def test_every_trained_token_is_accounted_on_a_torchft_run(algorithm: str, runs_dir: Path) -> None:
    sc = tiny(algorithm, learners=2, chips=1, steps=20, diloco={"fragments": 2, "sync_every": 4, "overlap": 0})
    t = check_tokens(run_scenario(sc, runs_dir).report)
    assert t["merged"] > 0 and t["discarded_overlap"] == 0


# -- the mutation a run was made under ---------------------------------------------------------------------------


def test_a_mutated_run_is_warned_about_and_recorded(tmp_path: Path) -> None:
    """`DILOCO_CHAOS_MUTATION=rda_as_mean diloco-chaos run`: the warning on stderr at the start and the end, and
    the run directory says so in run_start, config.json and report.json; its config.json loads again."""
    name = "rda_as_mean"
    assert name in mutations.MUTATIONS
    scenario = tmp_path / "s.toml"
    scenario.write_text('name = "mutated"\nalgorithm = "decoupled"\n[topology]\nlearners = 2\nchips_per_learner = 1\n'
                        '[train]\nsteps = 20\nwarmup_steps = 10\n[diloco]\nfragments = 4\nsync_every = 4\n'
                        'overlap = 1\n[eval]\nbatches = 2\n')
    env = {**os.environ, mutations.ENV_VAR: name, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "diloco_chaos.harness.entry", "run", str(scenario), "--quiet",
                          "--runs-dir", str(tmp_path / "runs")], env=env, capture_output=True, text=True,
                         timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    warnings = [line for line in out.stderr.splitlines() if "WARNING" in line and name in line]
    assert len(warnings) == 2 and "starts" in warnings[0] and "ended" in warnings[1], out.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    config = json.loads((run_dir / "config.json").read_text())
    assert config["mutation"] == name
    assert recorded_scenario(run_dir).name == "mutated", "a mutated run's config.json loads again (replay)"
    with pytest.raises(ScenarioError, match="unknown key mutation"):  # a scenario file cannot switch one on
        from_dict(config)
    first = json.loads((run_dir / "events.jsonl").read_text().splitlines()[0])
    assert first["ev"] == "run_start" and first["mutation"] == name
    assert json.loads((run_dir / "report.json").read_text())["mutation"] == name


def row(label: str, algorithm: str, mutation: str | None) -> RunRow:
    return RunRow(label=label, algorithm=algorithm, scenario="s", seed=1, faults=1, goodput=0.9,
                  merged_fraction=0.9, uptime=1.0, final_eval_loss=3.0, tokens_trained=10, tokens_merged=5.0,
                  tokens_merged_per_s=1.0, merges=1, longest_gap_s=0.1, wall_s=1.0, run_dir="d", mutation=mutation)


def test_compare_refuses_to_judge_runs_made_under_different_mutations() -> None:
    rows = [row("decoupled with faults", "decoupled", "rda_as_mean"), row("ddp with faults", "ddp", None)]
    with pytest.raises(MutationMismatch, match="rda_as_mean.*none|none.*rda_as_mean"):
        verdict(rows)
    same = [row("decoupled with faults", "decoupled", "rda_as_mean"), row("ddp with faults", "ddp", "rda_as_mean")]
    assert verdict(same), "runs made under the same mutation are judged"
