"""The run's errors, each labelled expected (caused by an injected fault, which one) or unexpected.

A scenario that kills a chip makes the chip's peers fail their collective ("Connection reset by peer"); a
partition makes a link give up. Those errors are the fault's intended effect, and a report that lists them
beside a real defect hides the defect. An error is expected when a fault that targets its learner (or every
learner: a syncer crash, a host crash) was in effect when it was logged, or had started no longer than the
settle window before: the failure detection bounds of the timeout hierarchy (Gloo timeout + liveness), the
longest a consequence of a fault may take to surface. Everything else is unexpected and fails loudly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

ERROR_EVENTS = ("chip_error", "syncer_error", "link_fatal")
"""Event kinds that report an error of a run process."""


@dataclass(frozen=True)
class RunError:
    """One error event of the run, as report.json lists it."""

    proc: str
    """The process that logged it (learner0.chip1, syncer, link1, ...)."""
    ev: str
    """One of ERROR_EVENTS."""
    error: str | None
    """The error's type and message."""
    t_s: float
    """Seconds since the run started."""
    expected: bool
    """True when an injected fault explains it (see `cause`)."""
    cause: str | None
    """The fault that explains it, "fault 2: kill_chip learner 1 chip 0 at step 20"; None when unexpected."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _window(start: dict[str, Any], end: dict[str, Any] | None, settle_s: float) -> tuple[float, float]:
    last = end["t"] if end is not None else float("inf")
    return start["t"], max(last, start["t"]) + settle_s


def _explains(fault: dict[str, Any], e: dict[str, Any]) -> bool:
    if e["ev"] == "syncer_error":
        return bool(fault["action"] == "kill_syncer")
    target = fault.get("learner")
    return target is None or target == e.get("learner")


def classify_errors(evs: list[dict[str, Any]], start: float, settle_s: float) -> list[RunError]:
    """Every error event of `evs` in time order, labelled with the fault that explains it, if any."""
    starts = [e for e in evs if e["ev"] == "fault_start" and not e.get("missed")]
    ends = {e["index"]: e for e in evs if e["ev"] == "fault_end"}
    out = []
    for e in sorted((e for e in evs if e["ev"] in ERROR_EVENTS), key=lambda e: e["t"]):
        cause = None
        for f in starts:
            lo, hi = _window(f, ends.get(f["index"]), settle_s)
            if lo <= e["t"] <= hi and _explains(f, e):
                cause = f"fault {f['index']}: {f['describe']}"
                break
        out.append(RunError(proc=e["proc"], ev=e["ev"], error=e.get("error"), t_s=round(e["t"] - start, 3),
                            expected=cause is not None, cause=cause))
    return out
