"""The table of every invariant, rendered from the registry: `diloco-chaos invariants` prints it.

Why: the list of invariants, their bounds and the algorithms they apply to is read from the registry when it is
asked for, so it cannot drift from the code, and adding an invariant is adding one module of
diloco_chaos/harness/invariants/checks/: no table to regenerate or commit beside it (docs/invariants.md says how to read
the output and how to add an invariant).
"""

from __future__ import annotations

import logging
import sys

from diloco_chaos.harness.invariants.registry import REQUIRED, Bound, discover

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
    """A markdown table: each registered invariant, what it checks, its bounds, algorithms and check_all mode."""
    lines = [
        "| invariant | checks | bounds | algorithms | check_all |",
        "|---|---|---|---|---|",
    ]
    for s in discover().values():
        bounds = "<br>".join(_bound(b) + (" *triggers*" if b.triggers else "") for b in s.bounds) or "none"
        lines.append(f"| `{s.name}` | {s.summary} | {bounds} | {', '.join(s.algorithms)} | {s.mode} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the table (`diloco-chaos invariants`, or `python -m diloco_chaos.harness.invariants.doc`)."""
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main())
