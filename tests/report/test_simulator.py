"""The goodput simulator against closed forms, its seeds, its JSON and its command line."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest

from diloco_chaos.harness.simulator import cli as simulate_cli
from diloco_chaos.harness.simulator.calibrate import FaultFacts, RunFacts, fit, predict
from diloco_chaos.harness.simulator.model import (
    YEAR_S,
    FaultProcess,
    Job,
    SimConfigError,
    TimeParams,
    draw_repairs,
    exp_weibull_mean,
    simulate,
    stall_chain,
)
from diloco_chaos.harness.simulator.table1 import CHIPS, PAPER, ROWS, run_grid

DAY = 86400.0


def _renewal(mtbf: float, down: float) -> float:
    """Alternating renewal: exponential up times of mean mtbf, each followed by `down` seconds lost."""
    return mtbf / (mtbf + down)


def test_single_chip_goodput_is_mtbi_over_mtbi_plus_restart() -> None:
    fp = FaultProcess(mtbi_chip_s=3600.0)
    r = simulate(Job("dp", 1), fp, TimeParams(restart_s=600.0), horizon_s=2000 * 3600.0, seeds=(0, 1, 2))
    assert r.goodput_mean == pytest.approx(_renewal(3600.0, 600.0), abs=0.01)
    assert r.uptime == r.goodput  # dp: the job advances exactly when it trains


def test_dp_exponential_failures_fixed_restart() -> None:
    # N chips fail at N / MTBI; every failure costs the whole job restart_s: G = 1 / (1 + N * R / MTBI).
    n, mtbi, restart = 10_000, 30 * DAY, 120.0
    r = simulate(Job("dp", n), FaultProcess(mtbi_chip_s=mtbi), TimeParams(restart_s=restart), horizon_s=20 * DAY)
    assert r.goodput_mean == pytest.approx(_renewal(mtbi / n, restart), abs=0.01)
    assert r.goodput_std < 0.01


def test_dp_checkpoint_rollback_discards_the_work_since_the_last_checkpoint() -> None:
    # Up time U ~ Exp(m); the restart resumes from a checkpoint taken every c of training, so U mod c is lost:
    # G = (m - E[U mod c]) / (m + R), E[U mod c] = m - c e^(-c/m) / (1 - e^(-c/m)).
    n, mtbi, restart, c = 1000, 10 * DAY, 60.0, 600.0
    m = mtbi / n
    lost = m - c * math.exp(-c / m) / (1 - math.exp(-c / m))
    r = simulate(Job("dp", n), FaultProcess(mtbi_chip_s=mtbi), TimeParams(restart_s=restart, checkpoint_every_s=c),
                 horizon_s=30 * DAY)
    assert r.goodput_mean == pytest.approx((m - lost) / (m + restart), abs=0.01)
    no_ckpt = simulate(Job("dp", n), FaultProcess(mtbi_chip_s=mtbi), TimeParams(restart_s=restart), horizon_s=30 * DAY)
    assert r.goodput_mean < no_ckpt.goodput_mean - 0.05


def test_elastic_with_instant_repair_loses_only_the_downscale() -> None:
    n, mtbi, down = 5000, 30 * DAY, 30.0
    fp = FaultProcess(mtbi_chip_s=mtbi, repair="fixed", repair_mean_s=0.0, chips_per_domain=1)
    r = simulate(Job("elastic_dp", n), fp, TimeParams(downscale_s=down, upscale_s=0.0), horizon_s=20 * DAY)
    assert r.goodput_mean == pytest.approx(_renewal(mtbi / n, down), abs=0.01)


def test_elastic_domain_in_repair_costs_its_chips_only() -> None:
    # No reconfiguration cost: the only loss is each failed domain's S chips for its repair: lambda * S * E[R].
    n, mtbi, s, rep = 100_000, YEAR_S, 64, 6 * 3600.0
    fp = FaultProcess(mtbi_chip_s=mtbi, chips_per_domain=s, repair="exponential", repair_mean_s=rep)
    r = simulate(Job("elastic_dp", n), fp, TimeParams(downscale_s=0.0, upscale_s=0.0), horizon_s=20 * DAY)
    assert 1 - r.goodput_mean == pytest.approx(s * rep / mtbi, rel=0.1)
    assert r.uptime_mean == 1.0


def test_decoupled_one_learner_is_elastic_dp() -> None:
    a = simulate(Job("decoupled", 200_000, 1), horizon_s=DAY)
    b = simulate(Job("elastic_dp", 200_000), horizon_s=DAY)
    assert a.goodput == b.goodput  # the same draws: one learner is one elastic job (syncer outages cost uptime)


def test_m_learners_behave_like_elastic_dp_on_n_over_m_chips() -> None:
    """The paper's modelling rule: an M-learner system's goodput is elastic DP's on N/M chips."""
    dec = simulate(Job("decoupled", 1_200_000, 8), horizon_s=2 * DAY)
    el = simulate(Job("elastic_dp", 150_000), horizon_s=2 * DAY)
    assert dec.goodput_mean == pytest.approx(el.goodput_mean, abs=0.01)
    assert dec.uptime_mean > el.uptime_mean + 0.05  # the global model keeps advancing while one learner stalls


def test_quorum_and_syncer_outages_lower_uptime_not_goodput() -> None:
    job = Job("decoupled", 600_000, 4, 1)
    strict = Job("decoupled", 600_000, 4, 4)
    a, b = simulate(job, horizon_s=DAY), simulate(strict, horizon_s=DAY)
    assert a.goodput == b.goodput
    assert b.uptime_mean < a.uptime_mean - 0.1
    # Learners that never fail, a syncer failing every hour for 10 minutes: uptime = 60 / (60 + 10).
    tp = TimeParams(syncer_mtbi_s=3600.0, syncer_repair_s=600.0)
    c = simulate(job, FaultProcess(mtbi_chip_s=1e12), tp, horizon_s=200 * DAY)
    assert c.goodput_mean == pytest.approx(1.0, abs=1e-4)  # a chip fails once in 30,000 years here
    assert c.uptime_mean == pytest.approx(_renewal(3600.0, 600.0), abs=0.01)


def test_stall_chain_absorbs_events_inside_a_stall() -> None:
    t = np.array([0.0, 1.0, 2.5, 3.0, 0.5, 9.0])
    lane = np.array([0, 0, 0, 0, 1, 1])
    dur = np.array([2.0, 2.0, 0.4, 1.0, 10.0, 1.0])
    # lane 0: stall [0, 2] absorbs 1.0; 2.5 starts [2.5, 2.9]; 3.0 starts. lane 1: [0.5, 10.5] absorbs 9.0.
    assert stall_chain(t, dur, lane).tolist() == [0, 2, 3, 4]
    assert stall_chain(np.array([1.0, 1.0]), np.zeros(2), np.zeros(2, dtype=np.int64)).tolist() == [0, 1]


def test_repair_distributions_have_their_mean() -> None:
    rng = np.random.default_rng(0)
    for kind in ("fixed", "exponential", "lognormal", "exp_weibull"):
        fp = FaultProcess(repair=kind, repair_mean_s=100.0, repair_sd_s=50.0)  # type: ignore[arg-type]
        assert float(np.mean(draw_repairs(rng, 200_000, fp))) == pytest.approx(100.0, rel=0.02), kind
    assert exp_weibull_mean(1.0, 1.0) == pytest.approx(1.0, rel=1e-3)  # a=1, k=1: the unit exponential


def test_seeds_are_deterministic_and_distinct() -> None:
    job = Job("elastic_dp", 300_000)
    a = simulate(job, horizon_s=DAY, seeds=(0, 1, 2))
    b = simulate(job, horizon_s=DAY, seeds=(0, 1, 2))
    assert a.goodput == b.goodput and a.uptime == b.uptime
    assert len(set(a.goodput)) == 3
    assert simulate(job, horizon_s=DAY, seeds=(1,)).goodput[0] == a.goodput[1]  # a seed's draw is its own


def test_bad_parameters_name_the_key() -> None:
    with pytest.raises(SimConfigError, match=r"job.min_quorum = 9: must be in \[1, 8\]"):
        simulate(Job("decoupled", 1000, 8, 9))
    with pytest.raises(SimConfigError, match="faults.repair = 'weibull'"):
        simulate(Job("dp", 10), FaultProcess(repair="weibull"))  # type: ignore[arg-type]
    with pytest.raises(SimConfigError, match=r"times.restart_s = -1"):
        simulate(Job("dp", 10), tp=TimeParams(restart_s=-1.0))


def test_table1_grid_and_json(tmp_path: Path) -> None:
    grid = run_grid(seeds=(0,), horizon_s=DAY / 4)
    doc = grid.to_json()
    assert doc["schema"] == "diloco-chaos.simulate.table1/1"
    cells = doc["cells"]
    assert isinstance(cells, list) and len(cells) == len(ROWS) * len(CHIPS) == 30
    first = cells[0]
    assert set(first) == {"method", "chips", "learners", "paper", "goodput", "goodput_std", "uptime", "diff",
                          "miss", "events"}
    assert first["paper"] == PAPER[ROWS[0][0]][0]
    assert first["diff"] == pytest.approx(first["goodput"] - first["paper"], abs=0.02)
    json.dumps(doc)  # serialisable as is


def _parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="diloco-chaos")
    simulate_cli.add_parser(root.add_subparsers(dest="cmd"))
    return root


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "0"], "--seeds = 0"),
    (["--chips", "0"], "job.chips = 0"),
    (["--method", "dp", "--learners", "4"], "job.learners = 4: must be 1 for dp"),
    (["--learners", "4", "--min-quorum", "5"], "job.min_quorum = 5"),
    (["--restart-s", "-3"], "times.restart_s = -3.0"),
    (["--plot", "x"], "--plot: only with --table1"),
    (["--calibrate", "/nonexistent-run"], "no config.json"),
])
def test_cli_bad_arguments_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["simulate", *argv])
    with pytest.raises(SystemExit) as exc:
        args.func(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_registered_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from diloco_chaos.harness.cli import main

    out = tmp_path / "job.json"
    assert main(["simulate", "--method", "dp", "--chips", "1000", "--mtbi-chip-s", "864000", "--restart-s", "60",
                 "--horizon-s", "864000", "--seeds", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "diloco-chaos.simulate.job/1" and len(doc["goodput"]) == 2
    assert doc["goodput_mean"] == pytest.approx(_renewal(864.0, 60.0), abs=0.02)
    assert "goodput" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--repair", "weibull"])
    assert exc.value.code == 2


def _facts(alg: str, stalls_all: bool, outage: float, repair: float, goodput: float, skew: float = 0.0) -> RunFacts:
    return RunFacts(f"/runs/{alg}-{outage}", alg, 4, 2, 1200, stalls_all, 0.1, skew, (FaultFacts(1, repair, outage),),
                    goodput)


def test_calibration_fits_restart_and_predicts_longer_repairs() -> None:
    # A ddp run: 120 s of training, one 5 s outage (2 s repair) stalls all 4 learners: loss factor 120 / 140.
    run = _facts("ddp", True, 5.0, 2.0, 0.6 * 120 / 140)
    cal = fit([run])
    assert (cal.algorithm, cal.step_s, cal.runs) == ("ddp", 0.1, (run.run_dir,))
    assert cal.restart_s == pytest.approx(3.0) and cal.efficiency == pytest.approx(0.6)
    longer = _facts("ddp", True, 8.0, 5.0, 0.0)
    assert predict(longer, cal).predicted == pytest.approx(0.6 * 120 / (120 + 4 * 8))
    alone = _facts("decoupled", False, 5.0, 2.0, 0.0)  # only the failed learner stalls: 120 / (120 + 5)
    assert predict(alone, fit([_facts("decoupled", False, 5.0, 2.0, 0.9 * 120 / 125)])).predicted == \
        pytest.approx(0.9 * 120 / 125)
    # Learners that started late are allocated and idle: their summed skew is lost like an outage of one learner.
    skewed = fit([_facts("decoupled", False, 5.0, 2.0, 0.9 * 120 / 135, skew=10.0)])
    assert (skewed.start_skew_s, skewed.efficiency) == (10.0, pytest.approx(0.9))
    late = predict(_facts("decoupled", False, 5.0, 2.0, 0.0, skew=20.0), skewed)
    assert late.predicted == pytest.approx(0.9 * 120 / 135)  # the calibrated skew
    assert late.predicted_given_speed == pytest.approx(0.9 * 120 / 145)  # the run's own


def test_scenario_tables_map_to_simulator_keys(tmp_path: Path) -> None:
    toml = tmp_path / "s.toml"
    toml.write_text('algorithm = "decoupled"\n[topology]\nlearners = 4\nchips_per_learner = 2\n'
                    '[recovery]\npolicy = "shrink"\nsyncer_repair_s = 3.0\n'
                    '[random_faults]\nmtbf_steps = 500\nrepair = "lognormal"\nrepair_mean_s = 2.0\nrepair_sd_s = 1.0\n')
    got = simulate_cli.scenario_params(str(toml), step_s=0.2)
    assert got == {"method": "decoupled", "learners": 4, "chips": 8, "chips_per_domain": 1, "policy": "shrink",
                   "syncer_repair_s": 3.0, "mtbi_chip_s": 100.0, "repair": "lognormal", "repair_mean_s": 2.0,
                   "repair_sd_s": 1.0}
    with pytest.raises(SimConfigError, match="--step-s"):
        simulate_cli.scenario_params(str(toml), step_s=None)
    ddp = tmp_path / "d.toml"
    ddp.write_text('algorithm = "ddp"\n[topology]\nlearners = 4\n[recovery]\npolicy = "restart"\nrepair_s = 2.0\n')
    got = simulate_cli.scenario_params(str(ddp), step_s=None)
    assert (got["method"], got["learners"], got["chips"], got["repair"], got["repair_mean_s"]) == \
        ("dp", 1, 8, "fixed", 2.0)
    for algorithm, method, learners, policy in (("elastic_ddp", "elastic_dp", 1, "shrink"),
                                                ("decoupled", "decoupled", 4, "shrink"),
                                                ("diloco", "dp", 1, "restart")):
        el = tmp_path / f"{algorithm}.toml"
        el.write_text(f'algorithm = "{algorithm}"\n[topology]\nlearners = 4\n[recovery]\npolicy = "elastic"\n')
        got = simulate_cli.scenario_params(str(el), step_s=None)
        assert (got["method"], got["learners"], got["policy"]) == (method, learners, policy), algorithm


def test_plots_are_written(tmp_path: Path) -> None:
    from diloco_chaos.harness.simulator.plots import goodput_vs_chips, goodput_vs_m

    grid = run_grid(seeds=(0,), horizon_s=DAY / 8)
    for path in (goodput_vs_chips(grid, tmp_path / "a.png"), goodput_vs_m(grid, tmp_path / "b.png")):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
