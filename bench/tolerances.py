"""The measurements behind the suites' loss tolerances: each suite's reference run, repeated.

Not a test: it prints a table. Every convergence bound in suites/ and diloco_chaos/harness/report/compare.py is
`reference + diloco_chaos.harness.report.tolerance.loss_tolerance(sd, cost)`: the reference run's final eval loss (a
fault-free twin the test runs itself, or a mean measured here), plus K standard deviations of the difference of two runs
(sqrt(2) x the run-to-run sd measured here), plus the cost the test's fault is allowed. This bench runs each
suite's reference scenario (built by the suite's own scenario function, with its own seed) --repeats times
and prints per reference: mean, sd, range, and the tolerance the suite derives from them; docs/metrics.md
("Loss tolerances") records the table and each suite cites its row.

    python bench/tolerances.py [--repeats 6] [--only NAME,...] [--json OUT]
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from spread import stats  # bench/ is the script's directory: on sys.path when run
from table import Column, emit, parser

from diloco_chaos.harness.config.scenario import Scenario, builtin
from diloco_chaos.harness.report.tolerance import loss_tolerance
from diloco_chaos.harness.run.supervisor import run_scenario

SUITES = Path(__file__).resolve().parent.parent / "suites"


def suite(name: str) -> ModuleType:
    """A suite module, imported from its file (suites/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, SUITES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def references() -> dict[str, Callable[[], Scenario]]:
    """Each suite's reference scenario by name (the runs its convergence bounds are measured against)."""
    pf, st, lc, el = (suite(n) for n in ("test_process_failure", "test_stragglers", "test_link_chaos",
                                         "test_elastic"))
    cmp = suite("test_compare")
    return {
        "process-failure fault-free": lambda: pf.scenario([]),
        "process-failure ddp 120 steps": lambda: pf.scenario([], algorithm="ddp", steps=120),
        "process-failure diloco 120 steps": lambda: pf.scenario([], algorithm="diloco", steps=120),
        "stragglers full-speed": lambda: st.scenario([]),
        "stragglers 2x1 240 steps": lambda: st.scenario([], learners=2, steps=240),
        "link 3x1 160 steps": lambda: lc.scenario("decoupled", learners=3, steps=160, faults=[]),
        "link 2x1 240 steps": lambda: lc.scenario("decoupled", learners=2, steps=240, faults=[]),
        "link 2x1 100 steps": lambda: lc.scenario("decoupled", learners=2, steps=100, faults=[]),
        "link ddp 2x1 80 steps": lambda: lc.scenario("ddp", learners=2, steps=80, faults=[]),
        "elastic ddp fault-free": lambda: el.scenario("ddp").replace(faults=[]),
        "compare ddp fault-free": lambda: cmp.compare_scenario().replace(algorithm="ddp", faults=[]),
        "compare decoupled with faults": lambda: cmp.compare_scenario().replace(algorithm="decoupled"),
        "fault-free decoupled": lambda: builtin("fault-free"),
        "fault-free diloco": lambda: builtin("fault-free").replace(algorithm="diloco"),
        "fault-free ddp": lambda: builtin("fault-free").replace(algorithm="ddp"),
    }


def measure(build: Callable[[], Scenario], repeats: int) -> dict[str, Any]:
    finals: list[float] = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            finals.append(float(run_scenario(build(), d).report["final_eval_loss"]))
    row = stats(finals)
    row["sd"] = row.pop("std")
    return {**row, "tolerance_k3": loss_tolerance(row["sd"])}


COLUMNS = (Column("reference", "reference", 32, left=True), Column("runs", "runs", 5),
           Column("mean", "mean", 9, ".4f"), Column("sd", "sd", 9, ".4f"), Column("min", "min", 9, ".4f"),
           Column("max", "max", 9, ".4f"), Column("tolerance_k3", "3*sqrt2*sd", 12, ".4f"))


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--repeats", type=int, default=6, help="runs of each reference (its suite's own seed)")
    ap.add_argument("--only", help="comma-separated reference names (default: all)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    refs = references()
    names = args.only.split(",") if args.only else list(refs)
    rows = {n: measure(refs[n], args.repeats) for n in names}
    emit(COLUMNS, [{"reference": n, **r} for n, r in rows.items()], args.json, detail="finals")

if __name__ == "__main__":
    main()
