"""Machine-readable results: one typed record per finished run, written as JSON for CI (`--json PATH`).

`diloco-chaos run --json PATH` writes one row and `diloco-chaos compare --json PATH` one row per run plus
compare's verdict. The file is `{"schema_version": N, "command": ..., "runs": [...], "claims": [...]}`; every
field is documented in docs/metrics.md ("Results JSON"). The schema is stable: a field is only ever added
(with a default, so older readers keep working); renaming or removing one, or changing its meaning, bumps
SCHEMA_VERSION. A row's invariants are those of diloco_chaos/harness/invariants/ that apply to it without a bound
chosen by the user: the bound-free ones, and `converged` against fault-free ddp for compare's runs with faults.

The bound-free verdicts are checked once per run, as it ends, and written to its run directory as
invariants.json (`record_invariants`, the same InvariantFigure records, same schema version); every reader
(the CLI's summary, report.html, replay, a row here) reads them back (`invariant_figures`) instead of checking
again.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from diloco_chaos.harness.invariants import InvariantResult, check_all, load_run
from diloco_chaos.harness.run.rundir import CONFIG_FILE, INVARIANTS_FILE, FinishedRun, read_json, write_json

SCHEMA_VERSION = 1
"""Bumped when a field is renamed or removed or its meaning changes; adding a field does not bump it."""

Number = bool | int | float | None


def _number(x: Any) -> Any:
    """A JSON-safe figure: numbers as they are, a non-finite float (inf: never happened, nan) or a non-number as
    None."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x if isinstance(x, (bool, int, float)) else None


@dataclass(frozen=True)
class InvariantFigure:
    """One invariant's verdict on one run (diloco_chaos.harness.invariants.InvariantResult, JSON-safe)."""

    name: str
    """The invariant: converged, faults_fired, updates_accounted, token_accounting, model_finite, ..."""
    ok: bool
    """Whether `figure relation bound` held."""
    figure: Number
    """The measured value (null: nothing to measure, or not finite; `detail` says which)."""
    bound: Number
    relation: Literal["<=", ">=", "=="]
    unit: str
    measure: str
    """What the figure is, in words."""
    detail: str

    @classmethod
    def of(cls, r: InvariantResult) -> InvariantFigure:
        rel = r.relation if r.relation in ("<=", ">=", "==") else "<="
        return cls(r.name, bool(r.ok), _number(r.figure), _number(r.bound), rel,  # type: ignore[arg-type]
                   r.unit, r.measure, r.detail)


@dataclass(frozen=True)
class RestartPhases:
    """A torchrun job's restarts in a run (RunRow.restart_phases; report.json elastic_restarts)."""

    restarts: int
    steps_redone: int
    """Steps trained again after rolling back to the checkpoint."""
    phases_s: dict[str, float | None]
    """Each restart phase (detect, stop, rendezvous, spawn, worker_init, pg_init, checkpoint_load; in that order)
    -> its seconds summed over the restarts; None where no restart measured it."""


@dataclass(frozen=True)
class Explained:
    """compare: one failed invariant of a row and the classified finding about its system that explains it
    (diloco_chaos/harness/targets/base.py `Target.explain`)."""

    invariant: str
    finding: str
    """The finding's key, as the target's doc names it."""
    verdict: str
    """"defect" or "permitted by configuration"."""


@dataclass(frozen=True)
class RunRow:
    """The figures of one finished run: what `run --json` writes and `compare` tabulates and judges."""

    label: str
    """compare: "ddp, fault-free" or "<algorithm>, with faults"; run: the algorithm."""
    algorithm: str
    scenario: str
    """The scenario's name."""
    seed: int
    faults: int
    """Faults the scenario scheduled (0: a fault-free run)."""
    goodput: float | None
    """report.json goodput.goodput: the share of allocated chip-time spent on useful training."""
    merged_fraction: float | None
    uptime: float | None
    """report.json availability.uptime."""
    final_eval_loss: float | None
    tokens_trained: int
    tokens_merged: float
    tokens_merged_per_s: float | None
    """tokens_merged / train_s."""
    merges: int
    longest_gap_s: float
    wall_s: float
    run_dir: str
    invariants: tuple[InvariantFigure, ...] = ()
    vs_fault_free_ddp: float | None = None
    """compare: final_eval_loss minus fault-free ddp's; null in `run` or without a reference."""
    train_steps: int | None = None
    """The scenario's train.steps (where compare's verdict reads the parity curve); null if its config is gone."""
    note: str | None = None
    """compare: what the run changed from the compared scenario (torchft_diloco's fragments / overlap), or why it
    was not run; null otherwise."""
    back_s: float | None = None
    """The longest time from a fault to what it hit training again (report.json fault_response: detect_s +
    rejoin_s; for a kill, kill to rejoin); null when no fault hit anything that came back."""
    restart_phases: RestartPhases | None = None
    """elastic.engine = "torchrun": the job's restarts, the steps they redid and each phase's measured seconds
    summed over them (report.json elastic_restarts); null for every other run."""
    ran: bool = True
    """False for a compare row whose run was not made (its target refused the scenario: `note` says why); its
    figures are then empty and the verdict ignores it."""
    mutation: str | None = None
    """report.json `mutation`: the DILOCO_CHAOS_MUTATION the run was made under; null when none."""
    explained: tuple[Explained, ...] = ()
    """compare: the row's failed invariants that a classified finding about its system explains (the table names
    the finding); empty in `run` and where nothing failed or no finding applies."""


@dataclass(frozen=True)
class Claim:
    """One line of compare's verdict on the paper's claim."""

    claim: str
    """e.g. "decoupled goodput above ddp"."""
    holds: bool
    figures: str
    """The two figures compared, e.g. "0.952 vs 0.934"."""


@dataclass(frozen=True)
class ResultsFile:
    """The JSON file `--json PATH` writes."""

    command: Literal["run", "compare"]
    runs: tuple[RunRow, ...]
    claims: tuple[Claim, ...] = ()
    schema_version: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)
    """Fields a newer writer added that this reader does not know (kept, not interpreted)."""


def computed_invariants(run: FinishedRun | str | os.PathLike[str], baseline_loss: float | None = None,
                        tolerance: float | None = None) -> tuple[InvariantFigure, ...]:
    """diloco_chaos.harness.invariants.check_all on the run now: the bound-free invariants, plus `converged` when a
    baseline loss and tolerance are given."""
    results = check_all(load_run(run), baseline_loss=baseline_loss,
                        tolerance=tolerance if baseline_loss is not None else None)
    return tuple(InvariantFigure.of(r) for r in results)


def record_invariants(run: FinishedRun | str | os.PathLike[str]) -> tuple[InvariantFigure, ...]:
    """Check the bound-free invariants once, as the run ends (after report.json, which some of them read), and
    write them to run_dir/invariants.json (`{"schema_version": N, "invariants": [InvariantFigure...]}`), so every
    reader (the CLI's summary, report.html, replay, `--json`) shows the same verdicts without recomputing."""
    run = FinishedRun.of(run)
    figures = computed_invariants(run)
    obj = {"schema_version": SCHEMA_VERSION, "invariants": [dataclasses.asdict(f) for f in figures]}
    json.dumps(obj, allow_nan=False)
    write_json(run.run_dir / INVARIANTS_FILE, obj)
    return figures


def recorded_invariants(run_dir: str | os.PathLike[str]) -> tuple[InvariantFigure, ...] | None:
    """The verdicts run_dir/invariants.json holds; None when the run directory has none (a run that did not
    finish, or one made before the file existed). A file of another schema version raises ValueError."""
    path = Path(run_dir) / INVARIANTS_FILE
    if not path.is_file():
        return None
    d = read_json(path)
    if d.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {d.get('schema_version')!r}, this reader knows {SCHEMA_VERSION}")
    return tuple(_build(InvariantFigure, i) for i in d["invariants"])


def invariant_figures(run: FinishedRun | str | os.PathLike[str], baseline_loss: float | None = None,
                      tolerance: float | None = None) -> tuple[InvariantFigure, ...]:
    """The run's invariant verdicts: those recorded in invariants.json when no baseline is given (else, for a
    run directory without the file, computed now on the run: a path is read then), plus `converged` against
    `baseline_loss` when one is."""
    if baseline_loss is None:
        recorded = recorded_invariants(run.run_dir if isinstance(run, FinishedRun) else run)
        if recorded is not None:
            return recorded
    return computed_invariants(run, baseline_loss, tolerance)


def run_row(label: str, res: Any, baseline_loss: float | None = None, tolerance: float | None = None) -> RunRow:
    """The row of one finished run: a diloco_chaos.harness.run.supervisor.RunResult, or anything with `report` and
    `run_dir` (the pytest plugin's ChaosRun); its `finished` run, when it has one, is not read again."""
    r = res.report
    train_s = r.get("train_s") or 0.0
    gp = r.get("goodput") or {}
    config = Path(res.run_dir) / CONFIG_FILE
    cfg = read_json(config) if config.exists() else {}
    faults = len(cfg.get("faults", []))
    steps = (cfg.get("train") or {}).get("steps")
    return RunRow(
        label=label, algorithm=r["algorithm"], scenario=r["name"], seed=int(r["seed"]), faults=faults,
        goodput=gp.get("goodput"), merged_fraction=gp.get("merged_fraction"),
        uptime=(r.get("availability") or {}).get("uptime"), final_eval_loss=_number(r["final_eval_loss"]),
        tokens_trained=int(r["tokens_trained"]), tokens_merged=float(r["tokens_merged"]),
        tokens_merged_per_s=round(r["tokens_merged"] / train_s, 1) if train_s else None,
        merges=int(r["merge_count"]), longest_gap_s=float(r["longest_gap_s"]), wall_s=float(r["wall_s"]),
        run_dir=str(res.run_dir),
        invariants=invariant_figures(getattr(res, "finished", None) or res.run_dir, baseline_loss, tolerance),
        train_steps=None if steps is None else int(steps), back_s=_back_s(r), restart_phases=_restart_phases(r),
        mutation=r.get("mutation"))


def _restart_phases(report: dict[str, Any]) -> RestartPhases | None:
    """RunRow.restart_phases of a report."""
    el = report.get("elastic_restarts")
    if not el:
        return None
    return RestartPhases(int(el["restarts"]), int(el["steps_redone"]), dict(el["phases_s"]))


def _back_s(report: dict[str, Any]) -> float | None:
    """RunRow.back_s of a report."""
    backs = [f["detect_s"] + f["rejoin_s"] for f in report.get("fault_response") or []
             if f.get("detect_s") is not None and f.get("rejoin_s") is not None]
    return round(max(backs), 3) if backs else None


class MutationMismatch(ValueError):
    """Runs made under different mutations (DILOCO_CHAOS_MUTATION) were to be compared or judged together."""


def same_mutation(runs: list[tuple[str, str | None]]) -> None:
    """Refuse (MutationMismatch) to compare runs, given as (label, report.json `mutation`), unless every one was
    made under the same mutation or none: a mutated run's figures are a known regression's, not the algorithm's."""
    if len({m for _, m in runs}) > 1:
        listed = "; ".join(f"{label}: {m or 'none'}" for label, m in runs)
        raise MutationMismatch(f"refusing to compare runs made under different mutations (DILOCO_CHAOS_MUTATION, "
                               f"diloco_chaos/trainers/mutations.py): {listed}")


def to_json(results: ResultsFile) -> dict[str, Any]:
    out = dataclasses.asdict(results)
    out.update(out.pop("extra"))
    return out


def write_results(path: str | os.PathLike[str], results: ResultsFile) -> Path:
    """Write the results atomically (a reader never sees half a file); strict JSON: a non-finite figure is
    written as null (`_number`), and anything else non-finite raises before the file is touched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    obj = to_json(results)
    json.dumps(obj, allow_nan=False)
    write_json(path, obj)
    return path


def _build(cls: type, d: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


def read_results(path: str | os.PathLike[str]) -> ResultsFile:
    """Parse a results file written by this or a newer writer of the same schema version."""
    with open(path) as f:
        d = json.load(f)
    version = d.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {version!r}, this reader knows {SCHEMA_VERSION}")
    runs = tuple(dataclasses.replace(_build(RunRow, r), invariants=tuple(
        _build(InvariantFigure, i) for i in r.get("invariants", [])), explained=tuple(
        _build(Explained, x) for x in r.get("explained", []))) for r in d["runs"])
    known = {f.name for f in dataclasses.fields(ResultsFile)}
    return ResultsFile(command=d["command"], runs=runs, claims=tuple(_build(Claim, c) for c in d.get("claims", [])),
                       schema_version=version, extra={k: v for k, v in d.items() if k not in known})
