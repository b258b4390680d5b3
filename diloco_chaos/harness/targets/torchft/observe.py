"""What a torchft trainer rank observes, as typed records: torchft's structured loggers `torchft_quorums` and
`torchft_commits` (their `extra=` fields: replica_id, quorum_id, step, commit_result) copied by `TorchftLogs`, a
logging.Handler, into events.jsonl as `torchft_quorum` / `torchft_commit` (diloco_chaos/harness/record/torchft.py);
and `digest`, the short sha1 of a set of tensors that replicas_agree compares across replica groups.

Why a handler: torchft 0.2.0 exposes quorum changes and commit decisions only through these loggers (and its
Rust stderr); reading them needs no change to torchft. `torchft_errors` never fires with Gloo, so it is not
read; a failed step is seen in `torchft_commit.commit_result` and `Manager.errored()`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable

import torch

from diloco_chaos.harness.record.events import EventLog
from diloco_chaos.harness.record.torchft import TorchftCommit, TorchftQuorum

LOGGERS = ("torchft_quorums", "torchft_commits")
"""The structured loggers copied."""


def digest(tensors: Iterable[torch.Tensor]) -> str:
    """sha1 (12 hex digits) of the tensors' bytes, in the order given (callers sort by name)."""
    h = hashlib.sha1()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:12]


class TorchftLogs(logging.Handler):
    """Copies the structured loggers' records into the run's events; remembers the last commit decision, so the
    trainer's loop can tell that a sync happened inside `optimizer.step()` (torchft_diloco's hooks)."""

    def __init__(self, events: EventLog, learner: int, rank: int) -> None:
        super().__init__(logging.INFO)
        self.events, self.learner, self.rank = events, learner, rank
        self.last_commit: bool | None = None
        """The latest commit decision (commit_result), until the loop takes it (`take_commit`)."""

    def emit(self, record: logging.LogRecord) -> None:
        f = record.__dict__
        try:
            if record.name == "torchft_quorums":
                self.events.write(TorchftQuorum(learner=self.learner, rank=self.rank, replica_id=str(f["replica_id"]),
                                                quorum_id=int(f["quorum_id"]), step=int(f["step"])))
            elif record.name == "torchft_commits":
                result = bool(f["commit_result"])
                self.events.write(TorchftCommit(learner=self.learner, rank=self.rank, replica_id=str(f["replica_id"]),
                                                quorum_id=int(f["quorum_id"]), step=int(f["step"]),
                                                commit_result=result))
                self.last_commit = result
        except (KeyError, TypeError, ValueError):
            self.handleError(record)  # a torchft release that changed its fields: printed to stderr, not fatal

    def take_commit(self) -> bool | None:
        """The commit decided since the last call (whether it committed), None if none."""
        rec, self.last_commit = self.last_commit, None
        return rec

    def install(self) -> None:
        """Attach to the structured loggers (INFO, not propagated to the root logger)."""
        for name in LOGGERS:
            lg = logging.getLogger(name)
            lg.setLevel(logging.INFO)
            lg.addHandler(self)
            lg.propagate = False
