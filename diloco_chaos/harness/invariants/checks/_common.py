"""Helpers shared by the protocol invariants' modules (not an invariant: modules starting with _ are skipped)."""

from __future__ import annotations

from typing import Any

from diloco_chaos.harness.invariants.base import InvariantResult, RunRecord

PushKey = tuple[int, int, int, int]
"""(learner, fragment, first_step, last_step): a push's identity in both the learner's and the syncer's log."""


def _diloco(r: RunRecord, key: str, default: Any) -> Any:
    return r.config.get("diloco", {}).get(key, default)


def _listing(problems: list[str], show: int) -> str:
    return "; ".join(problems[:show]) + (f"; and {len(problems) - show} more" if len(problems) > show else "")


def _no_merges(name: str, bound: float, measure: str, unit: str = "") -> InvariantResult:
    return InvariantResult(name, False, None, bound, "no merge was logged: nothing to check", measure, unit)

