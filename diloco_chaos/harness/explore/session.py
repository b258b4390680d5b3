"""The explore loop: draw schedules, run them J at a time until the budget is spent, then shrink each failure.

What: `Explorer.explore` submits schedule 0, 1, 2, ... of the seed (diloco_chaos/harness/explore/generate.py) to
a pool of `jobs` threads, each waiting on one run's child process (diloco_chaos/harness/explore/runner.py); it
starts no schedule once the budget is spent or `runs` were started, and lets the runs in flight finish. Every
run is one line of explore.jsonl as it ends, and one progress line on stderr (runs done, failures found, time
left). `Explorer.shrink_all` then takes, for each invariant some run violated, its first failing schedule (the
lowest index) and shrinks it (diloco_chaos/harness/explore/shrink.py) with r-of-n runs, confirms the schedule
it ends at with confirm_runs fresh runs (backing out of one that does not repeat), writing
minimal-<invariant>.toml, the minimal run's report.html, and the command that reproduces it.

Why this order: the schedules of a seed are fixed, so with `--runs N` the set of runs and the failing schedule
each shrink starts from are the same whatever `--jobs` is; shrinking after exploring keeps the budget for
searching and lets the shrink's tries of one candidate use every job at once.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path

from diloco_chaos.chaos.schedule import parse_fault
from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.explore.generate import Vocabulary, draw
from diloco_chaos.harness.explore.incident import run_command, write_incident
from diloco_chaos.harness.explore.records import Base, Minimal, RunLine, Summary, Trial
from diloco_chaos.harness.explore.runner import run_trial
from diloco_chaos.harness.explore.shrink import Judgement, RofN, Shrunk, Try, shrink

Runner = Callable[..., RunLine]
"""How one trial is run and judged: run_trial (real processes); tests of the pool and the order inject their own."""
JSONL = "explore.jsonl"
SUMMARY = "explore-summary.json"


@dataclass(frozen=True)
class Options:
    """The command line's choices."""

    budget_s: float
    runs: int | None
    """Most schedules to run; None: as many as the budget allows."""
    seed: int
    jobs: int
    out: Path
    shrink: bool = True
    until_found: bool = False
    """Start no schedule once an explored run has failed (the time to a first finding; bench/explore_power.py)."""


class Explorer:
    """One explore session over one scenario (see the module doc)."""

    def __init__(self, base: Base, sc: Scenario, vocab: Vocabulary, opts: Options,
                 say: Callable[[str], None], runner: Runner = run_trial) -> None:
        self.base, self.sc, self.vocab, self.opts, self.say = base, sc, vocab, opts, say
        self.runner = runner
        self.lines: list[RunLine] = []
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.shrink_runs = itertools.count()
        opts.out.mkdir(parents=True, exist_ok=True)
        self.jsonl = opts.out / JSONL

    def _record(self, line: RunLine) -> None:
        with self.lock:
            self.lines.append(line)
            with open(self.jsonl, "a", encoding="utf-8") as f:
                f.write(line.json_line() + "\n")

    def _left(self) -> float:
        return self.opts.budget_s - (time.monotonic() - self.t0)

    def _progress(self, line: RunLine) -> None:
        explored = [x for x in self.lines if x.phase == "explore"]
        failing = Counter(n for x in explored for n in x.failed)
        errors = sum(x.outcome in ("run_failed", "crashed") for x in explored)
        what = {"passed": "passed", "failed": f"FAILED {', '.join(line.failed)}",
                "run_failed": f"harness error: {line.error}", "crashed": f"harness error: {line.error}"}[line.outcome]
        where = f"schedule {line.index}" if line.phase == "explore" else f"shrink run {line.index} ({line.shrinking})"
        found = f" ({', '.join(f'{k} {v}' for k, v in sorted(failing.items()))})" if failing else ""
        self.say(f"explore: {where}: {what} in {line.wall_s:.0f} s | {len(explored)} runs done, "
                 f"{sum(1 for x in explored if x.failed)} failures found{found}, {errors} harness errors, "
                 f"{max(0.0, self._left()):.0f} s left")

    def _run(self, trial: Trial, index: int, phase: str = "explore", shrinking: str = "") -> RunLine:
        folder = self.opts.out / "runs" / f"{phase}-{index:04d}"
        line = self.runner(self.base, trial, self.sc.topology.learners, folder, self.sc.explore,
                         self.sc.timeouts.run_s, index=index, seed=self.opts.seed, phase=phase,  # type: ignore[arg-type]
                         shrinking=shrinking)
        self._record(line)
        self._progress(line)
        return line

    def explore(self, pool: ThreadPoolExecutor) -> list[RunLine]:
        """Run schedules until the budget or `runs` is spent; every finished run's line, by index."""
        pending: set[Future[RunLine]] = set()
        out: list[RunLine] = []
        i = 0
        while True:
            while (len(pending) < self.opts.jobs and self._left() > 0
                   and (self.opts.runs is None or i < self.opts.runs)
                   and not (self.opts.until_found and any(x.failed for x in out))):
                trial = draw(self.vocab, self.opts.seed, i)
                if trial is None:
                    self.say(f"explore: schedule {i}: no valid schedule in the vocabulary; skipped")
                else:
                    pending.add(pool.submit(self._run, trial, i))
                i += 1
            if not pending:
                return sorted(out, key=lambda x: x.index)
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            out += [f.result() for f in done]

    def shrink_all(self, lines: list[RunLine], pool: ThreadPoolExecutor) -> list[Minimal]:
        """Shrink the first failing schedule of each invariant violated (see the module doc)."""
        ex = self.sc.explore
        firsts: dict[str, RunLine] = {}
        for line in lines:
            for name in line.failed:
                firsts.setdefault(name, line)
        out = []
        for name, line in sorted(firsts.items()):
            start = Trial(tuple(parse_fault(t, f"faults[{j}]", line.learners) for j, t in enumerate(line.faults)),
                          line.steps, line.learners)
            self.say(f"explore: shrinking the failure of {name} (schedule {line.index}: {start.describe()})")

            def attempt(trial: Trial, k: int, name: str = name) -> list[Try]:
                idx = [next(self.shrink_runs) for _ in range(k)]
                runs = pool.map(lambda n: self._run(trial, n, "shrink", f"{name}: {trial.describe()}"), idx)
                return [Try(name in r.failed, r.run_dir) for r in runs]

            fails = RofN(attempt, ex.must_fail, ex.tries, width=self.opts.jobs)
            confirm = (RofN(attempt, ex.confirm_must_fail, ex.confirm_runs, width=self.opts.jobs)
                       if ex.confirm_runs else None)

            def step(what: str, trial: Trial, name: str = name) -> None:
                self.say(f"explore: {name} still fails after: {what}")

            def confirmed(trial: Trial, j: Judgement, name: str = name) -> None:
                verdict = "kept" if j.failed else "does not repeat: backing out of it"
                self.say(f"explore: {name} failed {j.fails} of {j.runs} confirmation runs of "
                         f"{trial.describe()}: {verdict}")

            res = shrink(start, fails, lambda t: self.base.valid(t, self.sc.topology.learners),
                         first=self.vocab.first, max_runs=ex.shrink_runs if self.opts.shrink else 0,
                         run_dir=line.run_dir, learners_too=ex.shrink_learners, on_step=step, confirm=confirm,
                         on_confirm=confirmed, last=self.vocab.last)
            out.append(self._minimal(name, res, line))
        return out

    def _minimal(self, name: str, res: Shrunk, found: RunLine) -> Minimal:
        trial, steps, rep = res.trial, res.steps, res.repeat
        path = self.opts.out / f"minimal-{name}.toml"
        args = self.base.run_args(trial, self.sc.topology.learners)
        command = run_command(args, path)
        repeats = ("not confirmed (explore.confirm_runs = 0)" if rep is None else
                   f"it failed {rep.fails} of {rep.runs} fresh runs"
                   + ("" if rep.confirmed else f", below the {self.sc.explore.confirm_must_fail} of "
                      f"{self.sc.explore.confirm_runs} asked for: expect it to pass some runs"))
        write_incident(path, trial.tables(), f"explore: the smallest schedule found that fails {name}", [
            f"Found by diloco-chaos explore (seed {self.opts.seed}, schedule {found.index}), shrunk in {res.runs} "
            f"runs by {len(steps)} steps: {'; '.join(steps) or 'none'}.",
            f"Repeats: {repeats}."
            + (f" Smaller schedules that did not repeat: {' | '.join(res.rejected)}." if res.rejected else ""),
            f"Reproduce: {command}"])
        run_dir = res.run_dir
        report = None
        if run_dir is not None:
            try:
                from diloco_chaos.harness.report.html import write_report

                report = str(write_report(run_dir))
            except Exception as e:  # noqa: BLE001  (a report that cannot be drawn is said, the incident stands)
                self.say(f"explore: no report.html for {run_dir}: {e}")
        return Minimal(name, trial, str(path), run_dir, report, command, res.runs,
                       rep.fails if rep else 0, rep.runs if rep else 0, rep.confirmed if rep else False,
                       res.rejected)

    def run(self) -> Summary:
        with ThreadPoolExecutor(max_workers=self.opts.jobs) as pool:
            lines = self.explore(pool)
            minimal = self.shrink_all(lines, pool) if self.opts.shrink else []
        summary = Summary(len(lines), sum(1 for x in lines if x.failed),
                          sum(x.outcome in ("run_failed", "crashed") for x in lines),
                          dict(Counter(n for x in lines for n in x.failed)), tuple(minimal),
                          round(time.monotonic() - self.t0, 1))
        (self.opts.out / SUMMARY).write_text(json.dumps(asdict(summary), indent=2, sort_keys=True, default=str)
                                             + "\n", encoding="utf-8")
        return summary
