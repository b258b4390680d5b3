"""torchft's fault-tolerant data parallel (`algorithm = "torchft_ddp"`, target.system torchft): every step a
quorum of the live replica groups (learners) is formed by torchft's Lighthouse, their gradients are averaged
with `Manager.allreduce` and the step is committed only if every participant's allreduce succeeded
(`should_commit`); a restarted group heals from a live peer. It runs in the torchft trainer
(diloco_chaos/harness/targets/torchft/trainer.py), never in the built-in chips and syncer, so the built-in hooks
of its descriptor refuse to run. Also the shared pieces of the torchft descriptors, which torchft_diloco.py
reuses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diloco_chaos.harness.algorithms.base import Algorithm, register

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario
    from diloco_chaos.harness.learner.chip import LearnerContext
    from diloco_chaos.harness.record.events import EventLog
    from diloco_chaos.harness.syncer.dispatch import AlgorithmHandler
    from diloco_chaos.harness.syncer.transport import Transport


class NotBuiltin(RuntimeError):
    """A torchft algorithm was handed to the built-in learners or syncer (target.system resolves it to torchft)."""


def torchft_gloo_timeout_s(sc: Scenario) -> float:
    """torchft.timeout_s: torchft's ProcessGroupGloo and the trainer's intra-group Gloo group use it."""
    return sc.torchft.timeout_s


def not_builtin_learner(ctx: LearnerContext) -> None:
    raise NotBuiltin(f"{ctx.spec.scenario.algorithm} runs on the torchft target, not in the built-in chips")


def not_builtin_syncer(sc: Scenario, run_dir: str, events: EventLog, transport: Transport,
                       shard: int) -> AlgorithmHandler:
    raise NotBuiltin(f"{sc.algorithm} runs on the torchft target: it has no built-in syncer")


ALGORITHM = register(Algorithm(
    name="torchft_ddp", summary="torchft's fault-tolerant data parallel: a quorum and an allreduce every step",
    order=10, merge_unit="step", elastic=False, outer_step=False, shardable_syncer=False, restorable_syncer=False,
    gloo_timeout_s=torchft_gloo_timeout_s, run_learner=not_builtin_learner, resume_learner=not_builtin_learner,
    syncer_handler=not_builtin_syncer, compare_order=10, system="torchft", replicated_ranks=True))
