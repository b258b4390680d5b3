"""One scenario and fault schedule under every algorithm, side by side (`diloco-chaos compare`).

Each algorithm runs the same scenario (same seed, data, topology and `[[faults]]`) on real processes; a
fault-free ddp run of the same seed is the quality reference. The table holds what the paper compares:
goodput and uptime (diloco_chaos/harness/report/metrics.py), tokens merged per second of training, the longest time the
global model stood still, and final eval loss, with its distance to fault-free ddp. Rows are
diloco_chaos.harness.report.results.RunRow records, which `--json` writes as they are. When torchft is installed,
torchft_ddp and torchft_diloco follow the built-in algorithms on the same scenario (`beside`;
`diloco_chaos.harness.algorithms.base.switch` makes the smallest change each needs):
their figures come from the same report.json (a committed torchft step is a merge, docs/metrics.md "Progress of
the global model"); the verdict stays about decoupled against the built-in baselines.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diloco_chaos.harness.algorithms import base as registry
from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.config.sections import ScenarioError
from diloco_chaos.harness.report.results import Claim, Explained, RestartPhases, RunRow, run_row, same_mutation
from diloco_chaos.harness.report.tolerance import K_SIGMA
from diloco_chaos.harness.run.supervisor import run_scenario
from diloco_chaos.harness.targets import base as targets

log = logging.getLogger(__name__)



def compared() -> tuple[str, ...]:
    """Every algorithm of the builtin system compare runs, in its descriptor's `compare_order` (ddp, elastic_ddp,
    diloco, decoupled for the built-in ones): the verdict judges whichever of them have rows."""
    return tuple(a.name for a in sorted(registry.every(), key=lambda a: (a.compare_order, a.order))
                 if a.system == "builtin")


def beside() -> tuple[str, ...]:
    """The algorithms of other systems under test compare runs after `compared()`, reported beside them and never
    judged by the verdict: those of every other target whose module is installed (`Target.installed`), in their
    `compare_order` (torchft_ddp and torchft_diloco when torchft is importable)."""
    return tuple(a.name for a in sorted(registry.every(), key=lambda a: (a.compare_order, a.order))
                 if a.system != "builtin" and targets.get(a.system).installed())


def not_run(label: str, sc: Scenario, algorithm: str, why: str) -> RunRow:
    """The row of a run compare could not make: no figures, `note` says why."""
    return RunRow(label=label, algorithm=algorithm, scenario=sc.name, seed=sc.seed, faults=len(sc.faults),
                  goodput=None, merged_fraction=None, uptime=None, final_eval_loss=None, tokens_trained=0,
                  tokens_merged=0.0, tokens_merged_per_s=None, merges=0, longest_gap_s=0.0, wall_s=0.0, run_dir="",
                  train_steps=sc.train.steps, note=f"not run: {why}", ran=False)


def goodput_order() -> tuple[str, ...]:
    """The paper's ranking of goodput under failures (its Table 1; the descriptors' `goodput_rank`, highest
    first: decoupled, elastic_ddp, ddp): each is above the next one that has a row."""
    ranked = [a for a in registry.every() if a.goodput_rank is not None]
    return tuple(a.name for a in sorted(ranked, key=lambda a: -(a.goodput_rank or 0)))


def _one(what: str, found: list[registry.Algorithm]) -> str:
    if len(found) != 1:
        raise ValueError(f"compare needs exactly one algorithm that is its {what}, registered: "
                         f"{[a.name for a in found]}")
    return found[0].name


def claim_subject() -> str:
    """The algorithm compare's verdict is about (decoupled): the one descriptor with `claim_subject`."""
    return _one("claim subject", [a for a in registry.every() if a.claim_subject])


def quality_reference() -> str:
    """The algorithm of compare's fault-free reference run (ddp): the one descriptor with `quality_reference`."""
    return _one("quality reference", [a for a in registry.every() if a.quality_reference])

PARITY_CURVE: tuple[tuple[int, float], ...] = ((120, 0.106), (240, 0.223), (480, 0.189))
"""(train.steps, fault-free decoupled's final eval minus fault-free ddp's, mean over seeds 0-2) at equal tokens,
measured by `bench/parity.py --suite test_compare:compare_scenario` (docs/metrics.md, "Loss tolerances"): the
distance this miniature leaves between the two. It is the gap the verdict expects; GAP_SD is what it allows
on top."""

GAP_SD = 0.036
"""Standard deviation of one run's gap about PARITY_CURVE: the paired per-seed gaps of the same bench (seeds 0-2
at each step count, pooled over the three step counts). It holds both the seed's effect and the run-to-run
spread of an asynchronous run, so the bound holds for any seed, not only the one measured."""


def parity_gap(steps: int | None) -> float:
    """The gap to fault-free ddp expected at `steps` from PARITY_CURVE: interpolated linearly in log-log
    between measured points, extrapolated with the nearest segment's power law outside them (the gap shrinks
    as a power of the steps: measured exponents in docs/metrics.md). None (steps unknown): the first point's."""
    if steps is None:
        return PARITY_CURVE[0][1]
    if steps <= 0:
        raise ValueError(f"parity_gap needs steps > 0, got {steps}")
    pts = PARITY_CURVE
    i = next((k for k in range(1, len(pts) - 1) if steps < pts[k][0]), len(pts) - 1)
    (s0, g0), (s1, g1) = pts[i - 1], pts[i]
    slope = math.log(g1 / g0) / math.log(s1 / s0)
    return g0 * (steps / s0) ** slope


def loss_allowance(steps: int | None) -> float:
    """How far (nats per byte) decoupled's final eval with the faults may be above fault-free ddp's for the
    verdict's quality claim to hold: the parity gap at `steps` plus K_SIGMA x GAP_SD (the gap is already a
    two-run difference, so no further sqrt(2))."""
    return parity_gap(steps) + K_SIGMA * GAP_SD


def row(label: str, res: Any, baseline_loss: float | None = None, steps: int | None = None) -> RunRow:
    """The comparison figures of one finished run (a RunResult, or anything with `report` and `run_dir`, such
    as the pytest plugin's ChaosRun), with its invariants; `converged` against `baseline_loss` when given,
    within loss_allowance(steps)."""
    return run_row(label, res, baseline_loss, loss_allowance(steps) if baseline_loss is not None else None)


def compare(sc: Scenario, runs_dir: str | os.PathLike[str] | None = None,
            algorithms: tuple[str, ...] | None = None, baseline: bool = True,
            on_run: Callable[[RunRow], None] | None = None,
            runner: Callable[[Scenario], Any] | None = None) -> list[RunRow]:
    """Run `sc` under each algorithm (default: `compared()` then `beside()`, torchft's when installed; with
    `baseline`, fault-free ddp first); returns one row per run, each with `vs_fault_free_ddp` (its final eval loss
    minus the reference's) when there is a reference. An algorithm of another system runs `registry.switch(sc,
    alg)` (its row's `note` says what changed); one whose target refuses the scenario gets a row that was not
    run (`ran` false, `note` the refusal) instead of stopping the comparison. A row whose scenario got another
    topology (torchft_diloco: one rank per replica group) is judged `converged` against a fault-free reference
    run on that topology, a row of its own before it: half the chips train on half the tokens, so the compared
    topology's reference would charge the topology to the fault. `vs_fault_free_ddp` stays against the compared
    scenario's reference, for every row.

    `runner(scenario)` makes each run and returns something with `report` and `run_dir` (default:
    diloco_chaos.harness.run.supervisor.run_scenario into `runs_dir`; a suite passes the pytest plugin's `run_scenario`
    fixture, so its runs get the plugin's deadlines and hygiene checks)."""
    if runner is None:
        if runs_dir is None:
            raise ValueError("compare needs runs_dir or a runner")
        runner = lambda s: run_scenario(s, runs_dir)  # noqa: E731
    rows: list[RunRow] = []
    ref: float | None = None
    ref_alg = quality_reference()
    refs: dict[Any, float | None] = {}  # topology -> the fault-free reference's final eval on it

    def ref_label(topology: Any) -> str:
        """The reference row's label: the compared topology's plain, another's with its shape."""
        return f"{ref_alg}, fault-free" + ("" if topology == sc.topology else
                                           f" ({topology.learners} x {topology.chips_per_learner})")

    def reference(topology: Any) -> float | None:
        """The fault-free reference's final eval on `topology`: its row is run once, the first time it is needed
        (the compared scenario's own topology first; another for a row whose scenario compare adapted)."""
        if topology not in refs:
            label = ref_label(topology)
            ref_sc = registry.switch(sc.replace(faults=(), topology=topology), ref_alg)[0]
            rows.append(row(label, runner(ref_sc)))
            refs[topology] = rows[-1].final_eval_loss
            if on_run is not None:
                on_run(rows[-1])
        return refs[topology]

    if baseline:
        ref = reference(sc.topology)
    for alg in (*compared(), *beside()) if algorithms is None else algorithms:
        label = f"{alg}, with faults"
        try:
            alg_sc, note = registry.switch(sc, alg)
        except ScenarioError as e:
            rows.append(not_run(label, sc, alg, f"the {registry.get(alg).system} target refuses the scenario: "
                                                f"{' '.join(str(e).split())}"))
        else:
            own_ref = ref
            if baseline and alg_sc.topology != sc.topology:  # judged against the reference on its own topology
                own_ref = reference(alg_sc.topology)
                note = (f"{note}; " if note else "") + f"converged judged against {ref_label(alg_sc.topology)}"
            rows.append(explain(row(label, runner(alg_sc), own_ref, sc.train.steps), alg_sc))
            if note is not None:
                rows[-1] = dataclasses.replace(rows[-1], note=note)
        if on_run is not None:
            on_run(rows[-1])
    return [dataclasses.replace(r, vs_fault_free_ddp=round(r.final_eval_loss - ref, 4)
                                if ref is not None and r.final_eval_loss is not None else None) for r in rows]


def explain(r: RunRow, sc: Scenario) -> RunRow:
    """`r` with each failed invariant that a classified finding about its system explains (`Target.explain` on the
    scenario it ran): the table names the finding beside the failure."""
    target = targets.get(targets.system_of(sc))
    found = [(f.name, target.explain(sc, f.name)) for f in r.invariants if not f.ok]
    return dataclasses.replace(r, explained=tuple(Explained(name, x.key, x.verdict) for name, x in found
                                                  if x is not None))


def verdict(rows: list[RunRow], tolerance: float | None = None) -> list[Claim]:
    """The paper's claim, checked on compare's rows (runs with faults, and the fault-free reference):
    decoupled's goodput above every other algorithm's and its uptime at least theirs; goodput in the paper's
    order (`goodput_order()`: decoupled > elastic_ddp > ddp, a missing row skipped); decoupled's final eval loss
    within `tolerance` of fault-free ddp (default: loss_allowance at the decoupled run's train.steps, the
    parity curve plus the measured spread). Nothing to judge without a decoupled row."""
    same_mutation([(r.label, r.mutation) for r in rows if r.ran])
    by = {r.algorithm: r for r in rows if r.label.endswith("with faults") and r.ran}
    subject = claim_subject()
    dec = by.get(subject)
    if dec is None:
        return []
    out: list[Claim] = []

    def above(key: str, a: RunRow, b: RunRow, strict: bool = True) -> None:
        x, y = getattr(a, key), getattr(b, key)
        if x is not None and y is not None:
            out.append(Claim(f"{a.algorithm} {key} {'above' if strict else 'at least'} {b.algorithm}",
                             x > y if strict else x >= y, f"{x:.3f} vs {y:.3f}"))

    others = [by[a] for a in compared() if a in by and a != subject]
    for r in others:
        above("goodput", dec, r)
    ranked = [by[a] for a in goodput_order() if a in by]
    for a, b in zip(ranked, ranked[1:], strict=False):
        if a is not dec:  # decoupled's own comparisons are above
            above("goodput", a, b)
    for r in others:
        above("uptime", dec, r, strict=False)
    gap = dec.vs_fault_free_ddp
    if gap is not None:
        bound = loss_allowance(dec.train_steps) if tolerance is None else tolerance
        out.append(Claim(f"{subject} final eval within {bound:.3f} of fault-free {quality_reference()}", gap <= bound,
                         f"{gap:+.3f}" + (f" (parity gap at {dec.train_steps} steps {parity_gap(dec.train_steps):.3f})"
                                          if tolerance is None else "")))
    return out


COLUMNS = [("label", "run", "{}"), ("final_eval_loss", "final eval", "{:.3f}"),
           ("vs_fault_free_ddp", "vs ddp ff", "{:+.3f}"), ("goodput", "goodput", "{:.3f}"),
           ("uptime", "uptime", "{:.3f}"), ("tokens_merged_per_s", "tok/s merged", "{:.0f}"),
           ("longest_gap_s", "longest gap s", "{:.2f}"), ("back_s", "fault->back s", "{:.2f}"),
           ("wall_s", "wall s", "{:.1f}")]


def table(rows: list[RunRow]) -> str:
    """A plain-text table of the rows (what `compare` prints), the last column each run's invariant verdicts."""
    head = [label for _, label, _ in COLUMNS] + ["invariants"]
    cells = [head]
    for r in rows:
        cells.append([r.label, *("-" for _ in head[1:])] if not r.ran else
                     ["-" if getattr(r, k) is None else fmt.format(getattr(r, k)) for k, _, fmt in COLUMNS]
                     + [verdicts(r)])
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = ["  ".join(c[i].ljust(widths[i]) if i in (0, len(head) - 1) else c[i].rjust(widths[i])
                       for i in range(len(head))).rstrip() for c in cells]
    notes = [f"{r.label}: {r.note}" for r in rows if r.note]
    restarts = [f"{r.label}: {restart_line(r.restart_phases)}" for r in rows if r.restart_phases]
    return "\n".join(lines + (["", "notes:", *(f"  {n}" for n in notes)] if notes else [])
                     + (["", "restarts (elastic.engine = torchrun; seconds, summed over restarts):",
                         *(f"  {x}" for x in restarts)] if restarts else []))


def restart_line(phases: RestartPhases) -> str:
    """RunRow.restart_phases in one line: how many restarts, steps redone, then each measured phase."""
    counts = f"{phases.restarts} restart(s), {phases.steps_redone} steps redone"
    return ", ".join([counts, *(f"{k} {v:.2f}" for k, v in phases.phases_s.items() if v is not None)])


def verdicts(r: RunRow) -> str:
    """A row's invariants in a few words: "all N held", or the violated ones by name, each followed by the
    finding that explains it where one does ("FAIL replicas_agree (finding min-replicas-1-fork: permitted by
    configuration)")."""
    why = {x.invariant: f" (finding {x.finding}: {x.verdict})" for x in r.explained}
    bad = [f.name + why.get(f.name, "") for f in r.invariants if not f.ok]
    return f"FAIL {', '.join(bad)}" if bad else f"all {len(r.invariants)} held"


def plot(rows: list[RunRow], path: str | os.PathLike[str]) -> Path | None:
    """Bar charts of goodput, uptime, tokens/s and final eval per run, as a PNG (None without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no comparison plot")
        return None
    keys = [("goodput", "goodput"), ("uptime", "uptime"), ("tokens_merged_per_s", "tokens merged / s"),
            ("final_eval_loss", "final eval loss")]
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2))
    labels = [r.label.replace(", ", "\n") for r in rows]
    colours = ["#888", "#c44", "#a6c", "#c84", "#48c"]
    for ax, (k, title) in zip(axes, keys, strict=True):
        ax.bar(labels, [getattr(r, k) or 0.0 for r in rows], color=colours[: len(rows)])
        ax.set_title(title)
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
