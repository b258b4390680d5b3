"""The `diloco-chaos` command line.

    diloco-chaos run [SCENARIO.toml] [--algorithm ddp|elastic_ddp|diloco|decoupled] [--runs-dir DIR] [--json PATH]
                                  no file: the built-in default scenario, with a chip loss, a degraded link and a
                                  straggler; --builtin fault-free for the same run without faults (benchmarks)
    diloco-chaos run ... --incident INCIDENT.toml   the same, with an incident's [[faults]] on top
    diloco-chaos run ... --set train.steps=500 --set diloco.wire_dtype=fp32
                                  change a scenario key (a dotted path; the value read as TOML) before validation;
                                  repeatable; recorded in the run directory's config.json as `overrides`
    diloco-chaos replay RUN_DIR [--against RUN_DIR2]   run a recorded run again (config, seed, fault schedule),
                                  or take RUN_DIR2 as its replay, and compare: fault timeline, key figures and
                                  invariant verdicts side by side; exit 1 when the timeline or a verdict differs
    diloco-chaos scenarios        list the built-in scenarios: name, algorithm, topology, steps, faults
    diloco-chaos tasks            list the built-in tasks (a scenario's [task] factory; docs/api.md)
    diloco-chaos report RUN_DIR [--open]   write RUN_DIR/report.html (plots, timeline, metrics); print its path
    diloco-chaos compare [SCENARIO.toml] [--builtin chip-loss] [--runs-dir DIR] [--json PATH]
                                  the same scenario and faults under ddp, elastic_ddp, diloco and decoupled (and
                                  fault-free ddp): goodput, uptime, tokens/s, final eval side by side
    --json PATH                   also write the results as JSON for CI (schema: docs/metrics.md)
    diloco-chaos simulate --table1 | --calibrate RUN_DIR... | --scenario FILE ...
                                  goodput at scale by simulation (docs/simulator.md)
    diloco-chaos toxiproxy-server [--host H] [--port P] [--seed N] [--log-level L]
                                  run the embedded Toxiproxy-compatible server until SIGINT/SIGTERM

    diloco-chaos keys [SECTION]   every scenario key of a section (or all): type, default, range, meaning
                                  (the same as docs/scenario.md)
    diloco-chaos validate FILE... [--incident FILE] [--set KEY=VALUE ...]
                                  check files, run nothing: every error of every file, one per line (exit 0 or 2)

Bad scenario values are reported (every one, each with its key and allowed range) and exit with code 2
before any process starts.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.config import doc as scenario_doc
from diloco_chaos.harness.config import scenario as scenario_mod
from diloco_chaos.harness.config.sections import ScenarioError, read_toml
from diloco_chaos.harness.explore import cli as explore_cli
from diloco_chaos.harness.run.progress import Progress, error_lines, faults_table, summary_table, verdict_lines
from diloco_chaos.harness.run.rundir import FinishedRun
from diloco_chaos.harness.run.supervisor import RunFailed, RunResult, run_scenario
from diloco_chaos.harness.simulator import cli as simulate_cli
from diloco_chaos.trainers import mutations

EXIT_BAD_CONFIG = 2
_SET_HELP = ("set a scenario key before validation, e.g. train.steps=500, diloco.wire_dtype=fp32, seed=3 "
             "(VALUE read as TOML, else as a string); repeatable; checked like the file")
EXIT_RUN_FAILED = 1


def _runs_dir(value: str) -> str:
    """--runs-dir: a folder, or a path where one can be made."""
    if os.path.exists(value) and not os.path.isdir(value):
        raise argparse.ArgumentTypeError(f"{value!r} exists and is not a folder")
    return value


def _port(value: str) -> int:
    """A TCP port to listen on: 1-65535."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port: must be in [1, 65535]")
    return port


def cmd_validate(args: argparse.Namespace) -> int:
    """Check scenario files (and an incident file on top of each) without running anything: every error of
    every file, one line each, prefixed with the file; 0 if all are valid, else 2."""
    from diloco_chaos.harness.config.check import incident_problems
    from diloco_chaos.harness.config.scenario import build

    bad = 0
    for path in args.files:
        try:
            sc, errors = build(scenario_mod.apply_overrides(read_toml(path, "scenario file"), args.set))
        except ScenarioError as unreadable:
            sc, errors = None, [unreadable]
        if args.incident:
            errors += incident_problems(args.incident, sc)
        if errors or sc is None:
            bad += 1
            for err in errors:
                print(f"{path}: invalid: {err}", file=sys.stderr)
            continue
        print(f"{path}: OK ({sc.name}, {sc.algorithm}, {sc.topology.learners}x{sc.topology.chips_per_learner}, "
              f"{len(sc.faults)} faults{' + incident ' + args.incident if args.incident else ''})")
    return EXIT_BAD_CONFIG if bad else 0


def _invalid(e: ScenarioError) -> int:
    """Print each error of a refused scenario on its own line; the exit code for a bad config."""
    for p in e.problems:
        print(f"diloco-chaos: invalid scenario: {p}", file=sys.stderr)
    return EXIT_BAD_CONFIG


def _load(args: argparse.Namespace) -> scenario_mod.Scenario:
    sc = (scenario_mod.load(args.scenario, args.set) if args.scenario
          else scenario_mod.builtin(args.builtin, args.set))
    if args.algorithm:
        sc, changed = algorithms.switch(sc, args.algorithm)
        if changed is not None:
            print(f"diloco-chaos: --algorithm {args.algorithm}: {changed}", file=sys.stderr)
    if args.seed is not None:
        sc = sc.replace(seed=args.seed)
    if getattr(args, "incident", None):
        from diloco_chaos.harness.run.replay import load_incident

        sc = load_incident(args.incident, sc)
    return sc


def cmd_run(args: argparse.Namespace) -> int:
    try:
        sc = _load(args)
    except ScenarioError as e:
        return _invalid(e)
    res = _execute(sc, args, "run")
    if isinstance(res, int):
        return res
    print(summary_table([res.report]))
    metrics = res.report.get("final_eval_metrics") or {}
    if metrics:  # the task's own held-out figures (diloco_chaos/trainers/task.py), e.g. accuracy
        print("final eval metrics: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items())))
    print(_faults_and_verdicts(_finished(res)))
    print(f"run directory: {res.run_dir}")
    if args.json:
        from diloco_chaos.harness.report.results import ResultsFile, run_row, write_results

        path = write_results(args.json, ResultsFile("run", (run_row(sc.algorithm, res),)))
        print(f"results: {path}")
    return 0


def cmd_invariants(args: argparse.Namespace) -> int:
    from diloco_chaos.harness.invariants.doc import main as print_table

    return print_table([])


def _finished(res: RunResult) -> FinishedRun:
    """The run as the supervisor read it when it ended (else its directory, read now)."""
    return res.finished if res.finished is not None else FinishedRun.load(res.run_dir)


def _faults_and_verdicts(run: FinishedRun) -> str:
    """What a person wants after a run besides the figures: the faults that fired, and the invariants'
    verdicts (the bound-free ones, diloco_chaos.harness.report.results.invariant_figures), and the errors, expected or
    not."""
    from diloco_chaos.harness.report.results import invariant_figures
    from diloco_chaos.harness.report.timeline import fault_bands

    bands = fault_bands(run.log.records)
    errors = run.report.get("errors", [])
    return "\n".join([faults_table(bands), verdict_lines(list(invariant_figures(run))),
                      *(error_lines(errors, run_dir=run.run_dir) or ["errors: none"])])


def _execute(sc: scenario_mod.Scenario, args: argparse.Namespace, verb: str) -> RunResult | int:
    """Run with live progress unless --quiet; an exit code if the run failed or was interrupted."""
    progress = None if args.quiet else Progress(sc.topology.learners)
    try:
        mutations.from_env(os.environ)
    except ValueError as e:  # an unknown DILOCO_CHAOS_MUTATION, refused before any process starts
        print(f"diloco-chaos: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    try:
        warn_mutation("starts")
        return run_scenario(sc, args.runs_dir, progress)
    except ScenarioError as e:  # refused before it started (the memory check)
        return _invalid(e)
    except RunFailed as e:
        print(f"diloco-chaos: {verb} failed: {e}", file=sys.stderr)
        return EXIT_RUN_FAILED
    except KeyboardInterrupt:
        print("diloco-chaos: interrupted; every process of the run was stopped", file=sys.stderr)
        return 130
    finally:
        warn_mutation("ended")


def warn_mutation(when: str) -> None:
    """On stderr: the run was made with a mutation switched on (DILOCO_CHAOS_MUTATION, perhaps still exported
    in the shell), so its figures are a known regression's, not the algorithm's; nothing when none is."""
    name = os.environ.get(mutations.ENV_VAR, "").strip()
    if name:
        what = mutations.MUTATIONS.get(name, "not a known mutation")
        print(f"diloco-chaos: WARNING: this run {when} with {mutations.ENV_VAR}={name} ({what}); its run directory "
              f"records it and compare refuses to set it beside runs without it", file=sys.stderr)


def cmd_replay(args: argparse.Namespace) -> int:
    """Run a recorded run again (or, with --against, take a finished run as its replay), then print both runs'
    figures and verdicts side by side; exit 1 when the fault timeline or a verdict differs."""
    from diloco_chaos.harness.run.replay import (
        RunVerdicts,
        compare_timelines,
        finished_run,
        fired_faults,
        recorded_scenario,
        side_by_side,
    )

    try:  # each run directory read once
        sc = recorded_scenario(args.run_dir)
        first = finished_run(args.run_dir)
        against = finished_run(args.against) if args.against else None
    except ScenarioError as e:
        print(f"diloco-chaos: cannot replay: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    if against is None:
        res = _execute(sc, args, "replay")
        if isinstance(res, int):
            return res
        print(summary_table([res.report]))
        again = _finished(res)
    else:
        again = against
    replay_dir = str(again.run_dir)
    mutated = [first.report.get("mutation"), again.report.get("mutation")]
    if mutated[0] != mutated[1]:  # a replay under a mutation measures what the invariants catch: said, and a difference
        print(f"diloco-chaos: replay differs: mutation ({mutations.ENV_VAR}) {mutated[0] or 'none'} in the original, "
              f"{mutated[1] or 'none'} in the replay: the runs are not the same algorithm", file=sys.stderr)
    original = RunVerdicts.read(first)
    before, after = fired_faults(first), fired_faults(again)
    seen = {x["index"]: x for x in after}
    for x in before:
        y = seen.get(x["index"], {})
        print(f"F{x['index']} {x['describe']}\n    trigger: {x['trigger']}\n    progress then: recorded "
              f"{x['steps']}, replay {y.get('steps', 'did not fire')}")
    diffs = compare_timelines(before, after)
    for d in diffs:
        print(f"diloco-chaos: replay differs: {d}", file=sys.stderr)
    print(f"replay: {len(before)} faults recorded, {len(after)} fired again; "
          + ("the same fault timeline" if not diffs else f"{len(diffs)} differences (above)"))
    lines, verdicts = side_by_side(original, RunVerdicts.read(again))
    print("\n".join(lines))
    for d in verdicts:
        print(f"diloco-chaos: replay's verdict differs: {d}", file=sys.stderr)
    print("verdicts: " + ("the same in both runs" if not verdicts else f"{len(verdicts)} differ (above)"))
    print(f"run directory: {replay_dir}")
    return EXIT_RUN_FAILED if diffs or verdicts or mutated[0] != mutated[1] else 0


def cmd_report(args: argparse.Namespace) -> int:
    from diloco_chaos.harness.record.events import EVENTS_FILE
    from diloco_chaos.harness.report.html import write_report
    from diloco_chaos.harness.run.rundir import REPORT_FILE, RunDirError, check_events, check_run_dir

    try:
        check_run_dir(args.run_dir, (REPORT_FILE,), EVENTS_FILE)
        run = FinishedRun.load(args.run_dir)  # the one read of its events.jsonl
        check_events(run.log, args.run_dir)
    except RunDirError as e:
        print(f"diloco-chaos: cannot report: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    path = write_report(run)
    print(path)
    if args.open:
        import webbrowser

        webbrowser.open(path.resolve().as_uri())
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    import os

    from diloco_chaos.harness.report.compare import compare, plot, table, verdict

    try:
        sc = scenario_mod.load(args.scenario) if args.scenario else scenario_mod.builtin(args.builtin)
        if args.seed is not None:
            sc = sc.replace(seed=args.seed)
    except ScenarioError as e:
        return _invalid(e)
    from diloco_chaos.harness.report.results import MutationMismatch

    try:
        warn_mutation("starts")
        rows = compare(sc, args.runs_dir, baseline=not args.no_baseline,
                       on_run=lambda r: print(f"{r.label}: final eval {r.final_eval_loss}, goodput {r.goodput}, "
                                              f"uptime {r.uptime} ({r.run_dir})", flush=True))
    except RunFailed as e:
        print(f"diloco-chaos: compare failed: {e}", file=sys.stderr)
        return EXIT_RUN_FAILED
    finally:
        warn_mutation("ended")
    print(table(rows))
    try:
        claims = verdict(rows)
    except MutationMismatch as e:
        print(f"diloco-chaos: cannot judge: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    for c in claims:
        print(f"{'holds ' if c.holds else 'FAILS '} {c.claim}: {c.figures}")
    if args.json:
        from diloco_chaos.harness.report.results import ResultsFile, write_results

        print(f"results: {write_results(args.json, ResultsFile('compare', tuple(rows), tuple(claims)))}")
    os.makedirs(args.runs_dir, exist_ok=True)
    png = plot(rows, os.path.join(args.runs_dir, f"compare-{sc.name}.png"))
    if png is not None:
        print(f"plot: {png}")
    return 0


def cmd_scenarios(args: argparse.Namespace) -> int:
    """One line per built-in scenario (`run --builtin NAME`): its name, algorithm, topology, steps and faults."""
    names = scenario_mod.builtin_names()
    width = max(12, *(len(n) for n in names))
    for name in names:
        try:
            sc = scenario_mod.builtin(name)
        except ScenarioError as e:  # a torchft built-in where torchft is not installed
            print(f"{name:<{width}} not runnable here: {e.problems[0]}")
            continue
        faults = ", ".join(f.action for f in sc.faults) or "none"
        print(f"{name:<{width}} {sc.algorithm:<14} {sc.topology.learners}x{sc.topology.chips_per_learner}  "
              f"{sc.train.steps} steps  faults: {faults}")
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    """One line per built-in task: its name, factory and what it trains."""
    import importlib

    from diloco_chaos.trainers.task import BUILTIN_TASKS

    for name, factory in BUILTIN_TASKS.items():
        module = factory.split(":")[0]
        doc = (importlib.import_module(module).__doc__ or "").strip().split("\n")[0]
        print(f"{name:<16} {factory:<46} {doc}")
    return 0


def cmd_toxiproxy_server(args: argparse.Namespace) -> int:
    from diloco_chaos.chaos import toxiproxy_server

    # main() below calls logging.basicConfig, a no-op once ours above has run: set the level here.
    logging.getLogger().setLevel(args.log_level)
    return toxiproxy_server.main(["--host", args.host, "--port", str(args.port), "--seed", str(args.seed),
                                  "--log-level", args.log_level])


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(prog="diloco-chaos", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run a scenario with real processes (default: the built-in one)")
    run.add_argument("scenario", nargs="?", help="scenario TOML file (default: the built-in 'default', which has "
                                                 "a few faults; --builtin fault-free has none)")
    run.add_argument("--builtin", default="default", help="name of a built-in scenario")
    run.add_argument("--algorithm", choices=algorithms.names(), help="override the algorithm")
    run.add_argument("--seed", type=int, help="override the seed")
    run.add_argument("--runs-dir", default="runs", type=_runs_dir,
                     help="where run directories are created (default: runs)")
    run.add_argument("--quiet", action="store_true", help="no live progress")
    run.add_argument("--incident", help="TOML file of [[faults]] tables to inject on top of the scenario")
    run.add_argument("--json", metavar="PATH", help="also write the run's results as JSON (docs/metrics.md, "
                                                    "'Results JSON')")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=_SET_HELP)
    run.set_defaults(func=cmd_run)
    rp = sub.add_parser("replay", help="run a recorded run again; compare its fault timeline, figures and verdicts")
    rp.add_argument("run_dir", help="a run directory (holds config.json and events.jsonl)")
    rp.add_argument("--runs-dir", default="runs", type=_runs_dir, help="where the replay's run directory is created")
    rp.add_argument("--quiet", action="store_true", help="no live progress")
    rp.add_argument("--against", metavar="RUN_DIR", help="run nothing: compare with this finished run (e.g. an "
                                                         "earlier replay) as the replay")
    rp.set_defaults(func=cmd_replay)
    val = sub.add_parser("validate", help="check scenario files without running them (exit 0: all valid, 2: not)")
    val.add_argument("files", nargs="+", metavar="FILE", help="scenario TOML files")
    val.add_argument("--incident", help="also check this incident file on top of each scenario")
    val.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=_SET_HELP)
    val.set_defaults(func=cmd_validate)
    inv = sub.add_parser("invariants", help="list every invariant with its bounds (a markdown table, from the "
                         "registry)")
    inv.set_defaults(func=cmd_invariants)
    tk = sub.add_parser("tasks", help="list the built-in tasks ([task] factory = NAME or module:function)")
    tk.set_defaults(func=cmd_tasks)
    sc = sub.add_parser("scenarios", help="list the built-in scenarios")
    sc.set_defaults(func=cmd_scenarios)
    rep = sub.add_parser("report", help="write a run's self-contained HTML report (eval loss, faults, timeline)")
    rep.add_argument("run_dir", help="a run directory (holds events.jsonl and report.json)")
    rep.add_argument("--open", action="store_true", help="open the report in a web browser")
    rep.set_defaults(func=cmd_report)
    cmp = sub.add_parser("compare", help="one scenario under ddp, elastic_ddp, diloco and decoupled, side by side")
    cmp.add_argument("scenario", nargs="?", help="scenario TOML file (default: built-in 'chip-loss')")
    cmp.add_argument("--builtin", default="chip-loss", help="name of a built-in scenario")
    cmp.add_argument("--seed", type=int, help="override the seed")
    cmp.add_argument("--runs-dir", default="runs", type=_runs_dir,
                     help="where run directories are created (default: runs)")
    cmp.add_argument("--no-baseline", action="store_true", help="skip the fault-free ddp reference run")
    cmp.add_argument("--json", metavar="PATH", help="also write every run's results and the verdict as JSON "
                                                    "(docs/metrics.md, 'Results JSON')")
    cmp.set_defaults(func=cmd_compare)
    tps = sub.add_parser("toxiproxy-server", help="run the embedded Toxiproxy-compatible server (foreground)")
    tps.add_argument("--host", default="127.0.0.1", help="API listen host (default 127.0.0.1)")
    tps.add_argument("--port", type=_port, default=8474, help="API listen port (default 8474)")
    tps.add_argument("--seed", type=int, default=0, help="seed for jitter/toxicity/slicer randomness (default 0)")
    tps.add_argument("--log-level", default="INFO", type=str.upper,
                     choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], help="logging level (default INFO)")
    tps.set_defaults(func=cmd_toxiproxy_server)
    simulate_cli.add_parser(sub)
    explore_cli.add_parser(sub)
    scenario_doc.add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
