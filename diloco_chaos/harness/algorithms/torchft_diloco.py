"""torchft's Streaming DiLoCo (`algorithm = "torchft_diloco"`, target.system torchft): `torchft.local_sgd.DiLoCo`
with the model split into diloco.fragments fragments, one fragment synced (outer Nesterov SGD with
diloco.outer_lr and diloco.outer_momentum on the averaged pseudo-gradient) every sync_every / fragments inner
steps, its allreduce overlapped with diloco.overlap inner steps (torchft's fragment_sync_delay). Runs in the
torchft trainer (diloco_chaos/harness/targets/torchft/trainer.py); its built-in hooks refuse to run."""

from __future__ import annotations

from diloco_chaos.harness.algorithms.base import Algorithm, register
from diloco_chaos.harness.algorithms.torchft_ddp import not_builtin_learner, not_builtin_syncer, torchft_gloo_timeout_s

ALGORITHM = register(Algorithm(
    name="torchft_diloco", summary="torchft's Streaming DiLoCo: one fragment synced every sync_every / fragments "
                                   "steps through a quorum",
    order=11, merge_unit="round", elastic=False, outer_step=False, shardable_syncer=False, restorable_syncer=False,
    gloo_timeout_s=torchft_gloo_timeout_s, run_learner=not_builtin_learner, resume_learner=not_builtin_learner,
    syncer_handler=not_builtin_syncer, compare_order=11, system="torchft"))
