"""torchft's Streaming DiLoCo (`algorithm = "torchft_diloco"`, target.system torchft): `torchft.local_sgd.DiLoCo`
with the model split into diloco.fragments fragments, one fragment synced (outer Nesterov SGD with
diloco.outer_lr and diloco.outer_momentum on the averaged pseudo-gradient) every sync_every / fragments inner
steps, its allreduce overlapped with diloco.overlap inner steps (torchft's fragment_sync_delay), one rank per
replica group (the layout torchft's DiLoCo supports with a full model copy per rank). Runs in the torchft
trainer (diloco_chaos/harness/targets/torchft/trainer.py); its built-in hooks refuse to run."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from diloco_chaos.harness.algorithms.base import Algorithm, register
from diloco_chaos.harness.algorithms.torchft_ddp import not_builtin_learner, not_builtin_syncer, torchft_gloo_timeout_s

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario


def supported(sc: Scenario) -> tuple[dict[str, object], str | None]:
    """The smallest change to `sc` that puts it in a layout torchft's DiLoCo supports, and what was changed (None:
    nothing): one rank per replica group (topology.chips_per_learner 1; a fault aimed at a chip other than 0 is
    aimed at the group's only rank), then Streaming DiLoCo's constraints (sync_every % fragments == 0 and overlap
    < sync_every / fragments): fragments becomes the largest divisor of sync_every not above it, then overlap at
    most sync_every / fragments - 1."""
    d = sc.diloco
    changes: dict[str, object] = {}
    notes: list[str] = []
    if sc.topology.chips_per_learner > 1:
        changes["topology"] = dataclasses.replace(sc.topology, chips_per_learner=1)
        notes.append(f"topology.chips_per_learner {sc.topology.chips_per_learner} -> 1 (torchft's DiLoCo runs one "
                     "rank per replica group)")
        tables = [f.to_table() for f in sc.faults]
        for i, t in enumerate(tables):
            if t.get("chip", 0):
                notes.append(f"faults[{i}].chip {t['chip']} -> 0")
                del t["chip"]
        changes["faults"] = tables
    frags = max(f for f in range(1, d.fragments + 1) if d.sync_every % f == 0)
    overlap = min(d.overlap, d.sync_every // frags - 1)
    streaming = [f"diloco.{key} {old} -> {new}" for key, old, new in (("fragments", d.fragments, frags),
                                                                       ("overlap", d.overlap, overlap)) if old != new]
    if streaming:
        changes["diloco"] = dataclasses.replace(d, fragments=frags, overlap=overlap)
        notes.append("; ".join(streaming) + " (Streaming DiLoCo needs sync_every % fragments == 0 and overlap < "
                                            "sync_every / fragments)")
    return changes, "; ".join(notes) or None


ALGORITHM = register(Algorithm(
    name="torchft_diloco", summary="torchft's Streaming DiLoCo: one fragment synced every sync_every / fragments "
                                   "steps through a quorum",
    order=11, merge_unit="round", elastic=False, outer_step=False, shardable_syncer=False, restorable_syncer=False,
    gloo_timeout_s=torchft_gloo_timeout_s, run_learner=not_builtin_learner, resume_learner=not_builtin_learner,
    syncer_handler=not_builtin_syncer, compare_order=11, system="torchft", adapt=supported))
