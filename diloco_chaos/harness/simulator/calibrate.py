"""Calibration of the simulator's time parameters on the harness's own runs, and held-out predictions.

A run directory holds `config.json` (the resolved scenario: topology, step
budget, `[recovery]`, the explicit `[[faults]]`), `events.jsonl` and
`report.json`. From each run this module reads the facts the simulator's
parameters stand for, at miniature:

* step_s: the median interval between a learner's consecutive steps;
* start_skew_s: the sum over learners of how long after the first learner's
  first step each took its own (process start-up staggered by the machine's
  load: allocated, not training, in the report's goodput);
* per fault: its outage, from `fault_start` to the failed learner's first step
  after it (detection, repair, restart and rejoin together), and the repair
  time the scenario configured;
* the measured goodput, whatever definition the run's report.json used.

Fitted per algorithm: ``restart_s`` = mean(outage - repair), ``step_s`` and
``start_skew_s`` = means of the runs', and ``efficiency`` = the goodput report.json gives a
fault-free step (1.0 under the paper's definition; below 1 where the report
counts a step's synchronisation as lost). The prediction is the simulator's
mechanism applied to the held-out run's own fault schedule: a fault stalls
every learner (ddp, diloco, or decoupled under a per-learner step budget: the
others wait for the failed one) or only the failed learner (elastic_ddp, whose
group goes on without it; decoupled with a total budget: the others take over
its share of the steps), for restart_s + its repair time:

    goodput = efficiency * W * step_s / (W * step_s + k * sum(outages) + start_skew_s),

W the learner-steps of the run, k = M when a fault stalls all M learners, 1
otherwise (the same 1 / (1 + lost / useful) as a lane of model.py). A second
prediction takes step_s and start_skew_s from the held-out run itself (its
machine's speed and start-up, not its faults), to separate the fault model's
error from the machine's run-to-run spread.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.record.events import EVENTS_FILE, read_events
from diloco_chaos.harness.run.rundir import read_json


class CalibrationError(ValueError):
    """A run directory lacks what calibration needs; the message names the run and the missing part."""


@dataclass(frozen=True)
class FaultFacts:
    """One scheduled fault of a run as calibration sees it."""

    learner: int
    repair_s: float
    """The repair time the scenario configured for it (the fault's own, else `[recovery].repair_s`)."""
    outage_s: float | None
    """fault_start -> the learner's first step after it; None when it never stepped again."""


@dataclass(frozen=True)
class RunFacts:
    """What calibration reads from one run directory."""

    run_dir: str
    algorithm: str
    learners: int
    chips_per_learner: int
    learner_steps: int
    """W: learner-steps of the run in all (M x steps)."""
    stalls_all: bool
    """A fault stalls every learner (ddp, diloco, or a per-learner budget), not only its own."""
    step_s: float
    start_skew_s: float
    """Sum over learners of (own first step - the first learner's first step), seconds."""
    faults: tuple[FaultFacts, ...]
    measured_goodput: float
    """report.json goodput.goodput (under the definition the run's harness used)."""


@dataclass(frozen=True)
class Calibration:
    """Time parameters fitted for one algorithm."""

    algorithm: str
    step_s: float
    start_skew_s: float
    restart_s: float
    """Outage beyond the configured repair time: detection, restart, rejoin."""
    efficiency: float
    """Goodput of a fault-free step as report.json counts it."""
    runs: tuple[str, ...]


@dataclass(frozen=True)
class Prediction:
    """A held-out run's predicted against measured goodput."""

    run_dir: str
    algorithm: str
    predicted: float
    """From the calibrated parameters and the run's fault schedule."""
    predicted_given_speed: float
    """The same with the run's own step_s and start_skew_s (its machine's speed, not its faults)."""
    measured: float
    calibrated_on: tuple[str, ...]

    @property
    def error(self) -> float:
        return self.predicted - self.measured


def read_run(run_dir: str | Path, recompute: bool = False) -> RunFacts:
    """The calibration facts of one run directory; with `recompute`, the measured goodput is computed again from
    its event log by the harness's current report code (diloco_chaos/harness/report/run_report.py `build_report`)
    instead of read from the report.json written when the run finished, so a changed goodput definition applies to old
    runs."""
    d = Path(run_dir)
    for name in ("config.json", EVENTS_FILE, "report.json"):
        if not (d / name).is_file():
            raise CalibrationError(f"{d}: no {name} (not a finished run directory)")
    cfg: dict[str, Any] = read_json(d / "config.json")
    report: dict[str, Any] = read_json(d / "report.json")
    evs = sorted(read_events(d / EVENTS_FILE), key=lambda e: e["t"])
    algorithm = str(cfg["algorithm"])
    m = int(cfg["topology"]["learners"])
    steps = int(cfg["train"]["steps"])
    budget = str(cfg["train"].get("budget", "per_learner"))
    by_learner: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for e in evs:
        if e["ev"] == "step":
            by_learner[int(e["learner"])].append((int(e["step"]), float(e["t"])))
    gaps = []
    firsts = [min(t for _, t in rows) for rows in by_learner.values()]
    for rows in by_learner.values():
        rows.sort()
        gaps += [b[1] - a[1] for a, b in zip(rows, rows[1:], strict=False) if b[0] == a[0] + 1]
    if not gaps:
        raise CalibrationError(f"{d}: no consecutive step events")
    repair_default = float(cfg.get("recovery", {}).get("repair_s", 0.0))
    faults = []
    for f in (e for e in evs if e["ev"] == "fault_start" and e.get("learner") is not None):
        who = int(f["learner"])
        spec = cfg["faults"][int(f["index"])] if int(f["index"]) < len(cfg["faults"]) else {}
        repair = spec.get("repair_s")
        back = next((e for e in evs if e["ev"] == "step" and e["t"] > f["t"] and int(e["learner"]) == who
                     and _after_restart(evs, f["t"], e["t"], who)), None)
        faults.append(FaultFacts(who, float(repair) if repair is not None else repair_default,
                                 float(back["t"] - f["t"]) if back is not None else None))
    return RunFacts(str(d), algorithm, m, int(cfg["topology"]["chips_per_learner"]), m * steps,
                    _stalls_all(algorithm, budget), statistics.median(gaps),
                    sum(f - min(firsts) for f in firsts), tuple(faults),
                    float(_measured(d, recompute, report)))


def _stalls_all(algorithm: str, budget: str) -> bool:
    """Whether a learner's outage stalls every learner, by the algorithm's simulator method: dp (ddp, diloco)
    waits for it at the barrier, and so do decoupled's others under a per-learner budget (their steps end before
    its do); elastic_dp's (elastic_ddp's) group goes on without it, and decoupled's others take over its share
    under a total budget."""
    method = algorithms.get(algorithm).sim_method
    if method == "elastic_dp":
        return False
    return method != "decoupled" or budget != "total"


def _measured(d: Path, recompute: bool, report: dict[str, Any]) -> float:
    if recompute:
        from diloco_chaos.harness.report.run_report import build_report

        report = build_report(d)
    g = report.get("goodput", {}).get("goodput")
    if g is None:
        raise CalibrationError(f"{d}: report has no goodput.goodput")
    return float(g)


def _after_restart(evs: list[dict[str, Any]], t0: float, t1: float, who: int) -> bool:
    """A step at t1 is the learner's first real step after a fault at t0 once it has (re)joined in between."""
    return any(t0 < e["t"] <= t1 and e["ev"] in ("resume", "learner_restart", "chip_joined", "learner_join")
               and e.get("learner") == who for e in evs)


def _loss_factor(run: RunFacts, outages: list[float]) -> float:
    """W * step / (W * step + k * sum(outages)): the share of allocated time the faults leave to training."""
    work = run.learner_steps * run.step_s
    k = run.learners if run.stalls_all else 1
    return work / (work + k * sum(outages) + run.start_skew_s)


def fit(runs: list[RunFacts]) -> Calibration:
    """Time parameters of one algorithm from its calibration runs."""
    if not runs:
        raise CalibrationError("no calibration runs")
    algs = {r.algorithm for r in runs}
    if len(algs) != 1:
        raise CalibrationError(f"calibration runs mix algorithms: {sorted(algs)}")
    extra = [f.outage_s - f.repair_s for r in runs for f in r.faults if f.outage_s is not None]
    restart = statistics.fmean(extra) if extra else 0.0
    eff = statistics.fmean(
        r.measured_goodput / _loss_factor(r, [f.outage_s for f in r.faults if f.outage_s is not None])
        for r in runs)
    return Calibration(runs[0].algorithm, statistics.fmean(r.step_s for r in runs),
                       statistics.fmean(r.start_skew_s for r in runs), restart, eff, tuple(r.run_dir for r in runs))


def predict(run: RunFacts, cal: Calibration) -> Prediction:
    """The held-out run's goodput from its fault schedule and the calibrated time parameters."""
    scaled = dataclasses.replace(run, step_s=cal.step_s, start_skew_s=cal.start_skew_s)
    outages = [cal.restart_s + f.repair_s for f in run.faults]
    return Prediction(run.run_dir, run.algorithm, cal.efficiency * _loss_factor(scaled, outages),
                      cal.efficiency * _loss_factor(run, outages), run.measured_goodput, cal.runs)


def calibrate_and_predict(calibrate: list[str], holdout: list[str],
                          recompute: bool = False) -> tuple[list[Calibration], list[Prediction]]:
    """Fit per algorithm on `calibrate` and predict `holdout`; with no holdout, leave one run out at a time."""
    cal_runs = [read_run(d, recompute) for d in calibrate]
    by_alg: dict[str, list[RunFacts]] = defaultdict(list)
    for r in cal_runs:
        by_alg[r.algorithm].append(r)
    cals = [fit(rs) for rs in by_alg.values()]
    preds: list[Prediction] = []
    if holdout:
        for r in (read_run(d, recompute) for d in holdout):
            if r.algorithm not in by_alg:
                raise CalibrationError(f"{r.run_dir}: no calibration run of algorithm {r.algorithm}")
            preds.append(predict(r, fit(by_alg[r.algorithm])))
    else:
        for alg, rs in by_alg.items():
            if len(rs) < 2:
                raise CalibrationError(f"leave-one-out needs two runs of {alg}; give --holdout instead")
            for i, r in enumerate(rs):
                preds.append(predict(r, fit(rs[:i] + rs[i + 1:])))
    return cals, preds
