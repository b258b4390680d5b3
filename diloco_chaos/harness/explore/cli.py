"""`diloco-chaos explore SCENARIO [--budget-s S] [--runs N] [--seed N] [--jobs J] [--out DIR]`.

Draws fault schedules from the scenario's `[explore]` table, runs each with real processes, judges every
invariant that applies, records each run as a line of DIR/explore.jsonl, then shrinks each failure to
DIR/minimal-<invariant>.toml and prints the `diloco-chaos run ... --incident` command that reproduces it
(docs/explore.md). Everything is checked before the first run: a bad scenario or `[explore]` table exits 2.
Exit 0: nothing failed; 1: an invariant failed in some run (a finding); 2: refused.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from diloco_chaos.harness.config.sections import ScenarioError
from diloco_chaos.harness.explore.generate import vocabulary
from diloco_chaos.harness.explore.records import Base, Minimal, Summary
from diloco_chaos.harness.explore.session import JSONL, Explorer, Options
from diloco_chaos.trainers import mutations


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"{text}: must be > 0")
        return v
    return parse


def add_parser(sub: Any) -> None:
    """Register `diloco-chaos explore` on the CLI's subparsers."""
    p = sub.add_parser("explore", help="search fault schedules drawn from the scenario's [explore] table; shrink "
                                       "each failure to a minimal incident file (docs/explore.md)")
    p.add_argument("scenario", nargs="?", help="scenario TOML file (default: the built-in one, --builtin)")
    p.add_argument("--builtin", default="default", help="name of a built-in scenario (default: default)")
    p.add_argument("--budget-s", type=_positive(float), default=600.0,
                   help="start no schedule after this many seconds (runs in flight finish; default 600)")
    p.add_argument("--runs", type=_positive(int), help="run at most this many schedules (default: as many as the "
                                                       "budget allows)")
    p.add_argument("--seed", type=int, help="seed of the schedules (default: the scenario's seed)")
    p.add_argument("--jobs", type=_positive(int), default=1, help="runs at once (each run is several processes; "
                                                                  "docs/explore.md; default 1)")
    p.add_argument("--out", help="folder for explore.jsonl, the runs and the minimal incidents "
                                 "(default: runs/explore-<time>)")
    p.add_argument("--no-shrink", action="store_true", help="record failures, do not shrink them")
    p.add_argument("--until-found", action="store_true",
                   help="start no schedule once one has failed an invariant (then shrink it); the time to a finding")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="set a scenario key before validation (as `run --set`); repeatable")
    p.set_defaults(func=cmd_explore)


DROP_OWN_FAULTS = "faults=[]"
"""The override that takes a scenario's own [[faults]] out of every explored run: a drawn schedule is the whole
fault load of its run (the built-in default's three faults would otherwise be in every run, and its triggers past
the explored runs' shorter train.steps are refused)."""


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cmd_explore(args: argparse.Namespace) -> int:
    from diloco_chaos.harness.invariants import spec

    base = Base(args.scenario, args.builtin, tuple(args.set))
    try:
        mutations.from_env(os.environ)
        if base.load().faults:  # each drawn schedule replaces the scenario's own [[faults]] (the command says so)
            base = Base(args.scenario, args.builtin, (DROP_OWN_FAULTS, *args.set))
        sc = base.load()
        for name in sc.explore.invariants:
            spec(name)
        vocab = vocabulary(sc)
    except ScenarioError as e:
        for p in e.problems:
            print(f"diloco-chaos: invalid scenario: {p}", file=sys.stderr)
        return 2
    except ValueError as e:  # an unknown invariant in [explore] invariants, or an unknown mutation
        print(f"diloco-chaos: invalid: {e}", file=sys.stderr)
        return 2
    out = Path(args.out or os.path.join("runs", f"explore-{time.strftime('%Y%m%d-%H%M%S')}"))
    seed = sc.seed if args.seed is None else args.seed
    _say(f"explore: {sc.name} ({sc.algorithm}, {sc.topology.learners}x{sc.topology.chips_per_learner}, "
         f"{vocab.steps} steps per run), kinds {', '.join(vocab.kinds)}; {vocab.min_faults}-{vocab.max_faults} faults "
         f"per schedule, triggers in steps [{vocab.first}, {vocab.last}]; seed {seed}, {args.jobs} jobs, "
         f"budget {args.budget_s:g} s; writing {out / JSONL}")
    name = os.environ.get(mutations.ENV_VAR, "").strip()
    if name:
        _say(f"explore: WARNING: every run is made with {mutations.ENV_VAR}={name} ({mutations.MUTATIONS[name]})")
    explorer = Explorer(base, sc, vocab, Options(args.budget_s, args.runs, seed, args.jobs, out, not args.no_shrink,
                                                 args.until_found), _say)
    try:
        summary = explorer.run()
    except KeyboardInterrupt:
        _say("explore: interrupted; the runs so far are in " + str(out / JSONL))
        return 130
    print(summary_text(summary, out))
    return 1 if summary.failures else 0


def summary_text(s: Summary, out: Path) -> str:
    """What explore prints at the end."""
    lines = [f"explore: {s.runs} schedules run in {s.elapsed_s:.0f} s: "
             + (f"{s.failures} failed ({', '.join(f'{k} in {v}' for k, v in sorted(s.failed_invariants.items()))})"
                if s.failures else "no invariant failed (none found)")
             + f"; {s.harness_errors} harness errors (runs that did not complete, not shrunk)"]
    for m in s.minimal:
        lines += [f"minimal schedule failing {m.invariant} ({len(m.trial.faults)} faults, {m.trial.steps} steps, "
                  f"{m.trial.learners} learners; {m.runs} shrink runs): {m.incident}",
                  f"  repeats: {_repeats(m)}",
                  f"  run directory: {m.run_dir}", f"  report: {m.report}", f"  reproduce: {m.command}"]
    lines.append(f"runs: {out / JSONL}")
    return "\n".join(lines)


def _repeats(m: Minimal) -> str:
    if not m.repeat_runs:
        return "not confirmed (explore.confirm_runs = 0 or --no-shrink)"
    said = f"failed {m.repeat_fails} of {m.repeat_runs} fresh runs"
    backed = f"; {len(m.rejected)} smaller schedules did not repeat and were backed out of" if m.rejected else ""
    return said + backed if m.confirmed else f"only {said}, below the rate asked for (explore.confirm_must_fail)"
