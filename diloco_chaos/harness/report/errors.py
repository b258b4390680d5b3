"""The run's errors, each labelled expected (caused by an injected fault, which one) or unexpected.

A scenario that kills a chip makes the chip's peers fail their collective ("Connection reset by peer"); a
partition makes a link give up. Those errors are the fault's intended effect, and a report that lists them
beside a real defect hides the defect. An error is expected when a fault that targets its learner (or every
learner: a syncer crash, a host crash) was in effect when it was logged, or had started no longer than the
settle window before: the failure detection bounds of the timeout hierarchy (Gloo timeout + liveness), the
longest a consequence of a fault may take to surface. Everything else is unexpected and fails loudly.

A learner whose training went non-finite (`learner_nonfinite`: NaN loss) is an error too, and never expected: no
injected fault makes a learner compute NaN (a corrupted frame fails the wire's CRC), so it is a defect of the
task, the model or the optimizer, even though the syncer protected the global model by rejecting its pushes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from diloco_chaos.harness.record import Event
from diloco_chaos.harness.record.learner import ChipError, LearnerNonfinite, LinkFatal
from diloco_chaos.harness.record.run import ErrorsLabelled, FaultEnd, FaultStart
from diloco_chaos.harness.record.run_record import RunLog
from diloco_chaos.harness.record.syncer import SyncerError

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario
    from diloco_chaos.harness.record.events import EventLog

ERROR_EVENTS = ("chip_error", "syncer_error", "link_fatal", "learner_nonfinite")
"""Event kinds that report an error of a run process."""

ErrorEvent = ChipError | SyncerError | LinkFatal | LearnerNonfinite


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


def settle_window_s(gloo_s: float, liveness_s: float) -> float:
    """The settle window: how long after a fault starts (or while it lasts) its consequences may surface, the
    failure detection bounds of the timeout hierarchy (a Gloo collective's timeout, then the syncer's liveness)."""
    return gloo_s + liveness_s


def _window(start: FaultStart, end: FaultEnd | None, settle_s: float) -> tuple[float, float]:
    last = end.t if end is not None else float("inf")
    began = start.applied_from_t if start.applied_from_t is not None else start.t
    return began, max(last, start.t) + settle_s


def _explains(fault: FaultStart, e: ErrorEvent) -> bool:
    if isinstance(e, LearnerNonfinite):  # no fault makes a learner compute NaN
        return False
    if isinstance(e, SyncerError):
        return fault.action == "kill_syncer"
    return fault.learner is None or fault.learner == e.learner


def classify_errors(evs: Iterable[Event], start: float, settle_s: float) -> list[RunError]:
    """Every error record of `evs` in time order, labelled with the fault that explains it, if any."""
    evs = list(evs)
    starts = [e for e in evs if isinstance(e, FaultStart) and not e.missed]
    ends = {e.index: e for e in evs if isinstance(e, FaultEnd)}
    errors: list[ErrorEvent] = [e for e in evs if isinstance(e, ChipError | SyncerError | LinkFatal | LearnerNonfinite)]
    out = []
    for e in sorted(errors, key=lambda e: e.t):
        cause = None
        for f in starts:
            lo, hi = _window(f, ends.get(f.index), settle_s)
            if lo <= e.t <= hi and _explains(f, e):
                cause = f"fault {f.index}: {f.describe}"
                break
        out.append(RunError(proc=e.proc, ev=e.ev, error=e.error, t_s=round(e.t - start, 3),
                            expected=cause is not None, cause=cause))
    return out


def label_errors(log: RunLog, sc: Scenario, events: EventLog) -> str:
    """Write one `errors_labelled` event: each error the run's processes logged (in `log`, the run's events read
    once after every process stopped), expected (with the injected fault that explains it) or not, so the event log
    itself says which errors were the scenario's doing. Returns the line written."""
    t = sc.timeouts
    errors = classify_errors(log.records, log.start, settle_window_s(t.gloo_s, t.liveness_s))
    return events.write_line(ErrorsLabelled(expected=sum(e.expected for e in errors),
                                       unexpected=sum(not e.expected for e in errors),
                                       errors=[e.as_dict() for e in errors]))
