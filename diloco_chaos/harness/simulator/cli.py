"""`diloco-chaos simulate`: argparse setup and handler.

Three modes: one job (`--method`, `--chips`, `--learners`, ... or a scenario's
`[random_faults]` / `[recovery]` tables via `--scenario`), the paper's Table 1
grid beside the simulated one (`--table1`), and calibration on run directories
with held-out predictions (`--calibrate`). Every parameter is validated before
anything is simulated; a bad one exits 2 naming the key and its range.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.config.sections import learner_policy
from diloco_chaos.harness.simulator.model import (
    METHODS,
    REPAIRS,
    FaultProcess,
    Job,
    SimConfigError,
    TimeParams,
    simulate,
)

_FAULT_ARGS = ("mtbi_chip_s", "chips_per_domain", "repair", "repair_mean_s", "repair_sd_s", "repair_weibull_k",
               "repair_weibull_a", "repair_min_s", "repair_max_s")
_TIME_ARGS = ("restart_s", "downscale_s", "upscale_s", "checkpoint_every_s", "step_s", "syncer_mtbi_s",
              "syncer_repair_s")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register `simulate` on the CLI's subparsers."""
    p: argparse.ArgumentParser = sub.add_parser(
        "simulate", help="goodput at scale: simulated chips under a per-chip failure process (docs/simulator.md)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--table1", action="store_true", help="the paper's Table 1 grid beside the simulated one")
    mode.add_argument("--calibrate", nargs="+", metavar="RUN_DIR",
                      help="fit time parameters on these run directories and predict held-out runs' goodput")
    p.add_argument("--holdout", nargs="+", metavar="RUN_DIR", default=[],
                   help="with --calibrate: runs to predict (default: leave one calibration run out at a time)")
    p.add_argument("--recompute", action="store_true",
                   help="with --calibrate: measured goodput recomputed from events.jsonl by the current report code")
    p.add_argument("--scenario", help="TOML whose [random_faults], [recovery], [topology] and algorithm set the job")
    p.add_argument("--method", choices=METHODS, help="dp, elastic_dp or decoupled (default decoupled)")
    p.add_argument("--chips", type=int, help="N, chips in all (default 1,200,000)")
    p.add_argument("--learners", type=int, help="M (decoupled; default 8)")
    p.add_argument("--min-quorum", type=int, help="K (decoupled; default 1)")
    p.add_argument("--policy", choices=("shrink", "restart"), help="decoupled learners' [recovery].policy")
    defaults_f, defaults_t = FaultProcess(), TimeParams()
    for name in _FAULT_ARGS:
        kind: Any = str if name == "repair" else (int if name == "chips_per_domain" else float)
        p.add_argument("--" + name.replace("_", "-"), type=kind, choices=REPAIRS if name == "repair" else None,
                       help=f"default {getattr(defaults_f, name)} (docs/simulator.md)")
    for name in _TIME_ARGS:
        p.add_argument("--" + name.replace("_", "-"), type=float, help=f"default {getattr(defaults_t, name)}")
    p.add_argument("--seeds", type=int, default=5, help="seeds per cell, 0..N-1 (default 5)")
    p.add_argument("--horizon-s", type=float, default=3 * 86400.0, help="simulated seconds (default 3 days)")
    p.add_argument("--json", metavar="PATH", help="write the result as JSON")
    p.add_argument("--plot", metavar="DIR", help="write the goodput figures (PNG) into DIR (--table1)")
    p.set_defaults(func=cmd_simulate, _parser=p)
    return p


def _params(args: argparse.Namespace, scenario: dict[str, Any]) -> tuple[FaultProcess, TimeParams]:
    f: dict[str, Any] = {k: v for k, v in scenario.items() if k in _FAULT_ARGS}
    t: dict[str, Any] = {k: v for k, v in scenario.items() if k in _TIME_ARGS}
    f.update({k: getattr(args, k) for k in _FAULT_ARGS if getattr(args, k) is not None})
    t.update({k: getattr(args, k) for k in _TIME_ARGS if getattr(args, k) is not None})
    return FaultProcess(**f), TimeParams(**t)


def scenario_params(path: str, step_s: float | None) -> dict[str, Any]:
    """Simulator keys from a scenario TOML: [random_faults] (mtbf_steps x step_s is the per-chip MTBI; its repair
    distribution), [recovery] (policy; repair_s when there is no [random_faults]; syncer_repair_s), [topology]
    (M and N = M x C) and the algorithm (its descriptor's `sim_method`: ddp and diloco are dp, elastic_ddp is
    elastic_dp; policy shrink, or elastic for decoupled, makes elastic learners)."""
    with open(path, "rb") as fh:
        t = tomllib.load(fh)
    out: dict[str, Any] = {}
    topo = t.get("topology", {})
    m, c = int(topo.get("learners", 4)), int(topo.get("chips_per_learner", 2))
    rec = t.get("recovery", {})
    algorithm = t.get("algorithm", "decoupled")
    method = algorithms.get(algorithm).sim_method
    if method is None:
        raise SimConfigError(f"{path}: algorithm {algorithm!r} has no simulator method")
    out["method"] = method
    out["learners"], out["chips"] = (m, m * c) if out["method"] == "decoupled" else (1, m * c)
    out["chips_per_domain"] = 1
    if rec.get("policy") in ("shrink", "restart", "elastic"):
        policy, _ = learner_policy(rec["policy"], algorithm)  # 'elastic' resolves per algorithm, as in a run
        out["policy"] = policy
    if "syncer_repair_s" in rec:
        out["syncer_repair_s"] = float(rec["syncer_repair_s"])
    rf = t.get("random_faults")
    if rf is not None:
        if step_s is None:
            raise SimConfigError("--step-s: required with a scenario's [random_faults] (its mtbf is in steps)")
        out["mtbi_chip_s"] = float(rf["mtbf_steps"]) * step_s
        for k in ("repair", "repair_mean_s", "repair_sd_s", "repair_min_s", "repair_max_s"):
            if k in rf:
                out[k] = rf[k]
    elif "repair_s" in rec:
        out["repair"], out["repair_mean_s"] = "fixed", float(rec["repair_s"])
    return out


def cmd_simulate(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args._parser
    if args.seeds < 1 or args.seeds > 1000:
        parser.error(f"--seeds = {args.seeds}: must be in [1, 1000]")
    seeds = tuple(range(args.seeds))
    if args.holdout and not args.calibrate:
        parser.error("--holdout: only with --calibrate")
    if args.plot and not args.table1:
        parser.error("--plot: only with --table1")
    try:
        if args.calibrate:
            return _calibrate(args)
        scen = scenario_params(args.scenario, args.step_s) if args.scenario else {}
        faults, times = _params(args, scen)
        faults.validate()
        times.validate()
        if args.table1:
            return _table1(args, seeds, faults, times)
        pick = {"method": (args.method, "decoupled"), "chips": (args.chips, 1_200_000),
                "learners": (args.learners, 8), "min_quorum": (args.min_quorum, 1),
                "learner_policy": (args.policy, "shrink")}
        src = dict(scen, learner_policy=scen.get("policy", "shrink"))
        fields = {k: (v if v is not None else src.get(k, d)) for k, (v, d) in pick.items()}
        if fields["method"] != "decoupled" and args.learners is None:
            fields["learners"] = 1
        job = Job(**fields)
        job.validate()
        t0 = time.perf_counter()
        r = simulate(job, faults, times, args.horizon_s, seeds)
        wall = time.perf_counter() - t0
    except (SimConfigError, OSError, tomllib.TOMLDecodeError, KeyError, ValueError) as e:
        parser.error(str(e))
    print(f"{job.method} N={job.chips:,} M={job.learners} K={job.min_quorum}: goodput {100 * r.goodput_mean:.2f} "
          f"± {100 * r.goodput_std:.2f} %, uptime {100 * r.uptime_mean:.2f} % over {len(seeds)} seeds "
          f"({r.events:,} events, {wall:.2f} s)")
    if args.json:
        _write(args.json, {"schema": "diloco-chaos.simulate.job/1", "job": dataclasses.asdict(job),
                           "faults": dataclasses.asdict(faults), "times": dataclasses.asdict(times),
                           "seeds": list(seeds), "horizon_s": args.horizon_s, "goodput": list(r.goodput),
                           "uptime": list(r.uptime), "goodput_mean": r.goodput_mean, "goodput_std": r.goodput_std,
                           "uptime_mean": r.uptime_mean, "events": r.events})
    return 0


def _table1(args: argparse.Namespace, seeds: tuple[int, ...], faults: FaultProcess, times: TimeParams) -> int:
    from diloco_chaos.harness.simulator.table1 import format_table, run_grid

    grid = run_grid(seeds, args.horizon_s, faults, times)
    print(format_table(grid))
    if args.json:
        _write(args.json, grid.to_json())
    if args.plot:
        from diloco_chaos.harness.simulator.plots import goodput_vs_chips, goodput_vs_m

        d = Path(args.plot)
        d.mkdir(parents=True, exist_ok=True)
        a, b = goodput_vs_chips(grid, d / "goodput_vs_chips.png"), goodput_vs_m(grid, d / "goodput_vs_m.png")
        print(f"plots: {a}, {b}")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from diloco_chaos.harness.simulator.calibrate import calibrate_and_predict

    cals, preds = calibrate_and_predict(args.calibrate, args.holdout, args.recompute)
    print("calibrated (per algorithm): step_s, start_skew_s (learners' staggered first steps, summed), restart_s "
          "(outage beyond the configured repair), efficiency (report.json goodput of a fault-free step)")
    for c in cals:
        print(f"  {c.algorithm}: step_s {c.step_s:.4f}, start_skew_s {c.start_skew_s:.2f}, "
              f"restart_s {c.restart_s:.3f}, efficiency {c.efficiency:.3f} ({len(c.runs)} runs)")
    source = ("recomputed from events.jsonl by diloco_chaos/harness/report/run_report.py" if args.recompute
              else "the run's report.json")
    print(f"held-out: predicted / measured goodput.goodput ({source}) / error; and predicted given the run's own "
          "step time and start skew / error")
    for p in preds:
        print(f"  {p.algorithm:9s} {p.predicted:.3f} / {p.measured:.3f} / {p.error:+.3f};  "
              f"{p.predicted_given_speed:.3f} / {p.predicted_given_speed - p.measured:+.3f}  {p.run_dir}")
    worst = max((abs(p.error) for p in preds), default=0.0)
    print(f"largest |error| {worst:.3f}")
    if args.json:
        _write(args.json, {"schema": "diloco-chaos.simulate.calibration/1",
                           "calibrations": [dataclasses.asdict(c) for c in cals],
                           "predictions": [dict(dataclasses.asdict(p), error=p.error) for p in preds]})
    return 0


def _write(path: str, obj: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")
    print(f"json: {path}", file=sys.stderr)
