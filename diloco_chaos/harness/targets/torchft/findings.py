"""The classified findings about torchft (docs/targets/torchft.md "Findings") that explain an invariant failing on
a torchft run, as `Finding` records of the target's descriptor (`Target.findings`): compare names the finding
beside a torchft row whose invariant it explains, instead of reporting the failure as torchft's without a
verdict or as ours without a cause. Each entry's evidence (versions, reproduction, the promise checked
against) is in the doc; this module holds only what a run's
scenario must have for the finding to apply. Imports nothing heavy (validation imports the descriptor)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diloco_chaos.harness.targets.base import Finding

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario


def _kills_lighthouse(sc: Scenario) -> bool:
    return any(f.action == "kill_syncer" for f in sc.faults)


def _quorum_of_one(sc: Scenario) -> bool:
    return sc.torchft.min_replicas == 1 and bool(sc.faults)


FINDINGS = (
    Finding(key="lighthouse-quorum-id-reuse", title="a restarted Lighthouse numbers quorums from 1 again, so one id "
            "can name two memberships", verdict="defect", invariants=("quorum_ids_monotonic",),
            applies=_kills_lighthouse),
    Finding(key="min-replicas-1-fork", title="with min_replicas = 1 a group that returns after every up-to-date "
            "group is gone forms a quorum alone and retrains committed steps", verdict="permitted by configuration",
            invariants=("replicas_agree",), applies=_quorum_of_one),
)
"""Every torchft finding that can explain a failed invariant."""
