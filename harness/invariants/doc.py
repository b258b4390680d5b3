"""Generate docs/invariants.md from the invariant registry: ``python -m harness.invariants.doc [--check]``.

Why: the list of invariants, their bounds and the algorithms they apply to is read from the registry, so the
doc cannot drift from the code; tests/test_invariant_registry.py asserts the committed file equals the output.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from harness import generated_doc
from harness.invariants.registry import REQUIRED, Bound, discover

DOC = Path(__file__).resolve().parents[2] / "docs" / "invariants.md"
log = logging.getLogger(__name__)


def _default(b: Bound) -> str:
    return "required" if b.default is REQUIRED else f"`{b.default!r}`"


def _bound(b: Bound) -> str:
    alias = f" (formerly `{b.renamed_from}` in check_all: refused)" if b.renamed_from else ""
    lo = "" if b.low is None else f"{b.low:g}"
    hi = "" if b.high is None else f"{b.high:g}"
    rng = f"; in [{lo or '-inf'}, {hi or 'inf'}]" if (lo or hi) else ""
    return f"`{b.name}` = {_default(b)}{alias}: {b.meaning}{rng}"


def render() -> str:
    """The whole of docs/invariants.md."""
    lines = [
        "# Invariants",
        "",
        "Generated from the registry (`harness/invariants/registry.py`) by `python -m harness.invariants.doc`;",
        "do not edit by hand. Each invariant is one module of `harness/invariants/checks/`. `check_all` runs the",
        "\"always\" ones on their defaults and each \"when_bound\" one when a bound marked *triggers* is given;",
        "`ChaosRun.check(name, **bounds)` runs any of them by name. A misspelled bound raises `UnknownBound`",
        "(naming the allowed ones), an impossible value `ValueError`.",
        "",
        "| invariant | checks | bounds | algorithms | check_all |",
        "|---|---|---|---|---|",
    ]
    for s in discover().values():
        bounds = "<br>".join(_bound(b) + (" *triggers*" if b.triggers else "") for b in s.bounds) or "none"
        lines.append(f"| `{s.name}` | {s.summary} | {bounds} | {', '.join(s.algorithms)} | {s.mode} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return generated_doc.main(DOC, render, "python -m harness.invariants.doc", __doc__, argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main())
