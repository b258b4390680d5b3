"""Helpers shared by the torchft invariants (not an invariant: modules starting with _ are skipped)."""

from __future__ import annotations

from diloco_chaos.harness.record.torchft import TorchftCommit, TorchftQuorum, TorchftSync

Process = tuple[int, int, int]
"""(learner, rank, pid): one trainer process, i.e. one generation of a replica group's rank (a restart is a new
pid, whose manager starts afresh and heals)."""


def process_of(e: TorchftSync | TorchftQuorum | TorchftCommit) -> Process:
    return e.learner, e.rank, e.pid


def name(p: Process) -> str:
    return f"learner {p[0]} rank {p[1]} (pid {p[2]})"
