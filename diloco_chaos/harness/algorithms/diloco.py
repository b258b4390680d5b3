"""Synchronous DiLoCo (`algorithm = "diloco"`): every H inner steps all learners send their parameters and
wait at the syncer's barrier for the outer step's merged model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diloco_chaos.harness.algorithms.base import Algorithm, register
from diloco_chaos.harness.algorithms.ddp import barrier_gloo_timeout_s, resume_from_syncer

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario
    from diloco_chaos.harness.learner.chip import LearnerContext
    from diloco_chaos.harness.record.events import EventLog
    from diloco_chaos.harness.syncer.dispatch import AlgorithmHandler
    from diloco_chaos.harness.syncer.transport import Transport


def run_learner(ctx: LearnerContext) -> None:
    """`run_diloco`; each merged round applied is an `apply` event with its round."""
    from diloco_chaos.harness.record.learner import Apply
    from diloco_chaos.trainers.learner.loops import run_diloco

    learner = ctx.spec.learner
    run_diloco(ctx.core, ctx.batch, ctx.link, ctx.on_step,
               lambda r, s: ctx.events.write(Apply(learner=learner, step=s, round=r)))


def syncer_handler(sc: Scenario, run_dir: str, events: EventLog, transport: Transport,
                   shard: int) -> AlgorithmHandler:
    from diloco_chaos.harness.config.task_check import scenario_task
    from diloco_chaos.harness.syncer.barrier import BarrierHandler
    from diloco_chaos.trainers.syncers.synchronous import DilocoSyncer

    return BarrierHandler(sc, run_dir, events, transport,
                          DilocoSyncer(scenario_task(sc), sc.diloco, sc.seed, sc.topology.learners))


ALGORITHM = register(Algorithm(
    name="diloco", summary="synchronous DiLoCo: an outer step on all parameters every H steps, at a barrier",
    order=1, merge_unit="round", elastic=False, outer_step=True, shardable_syncer=False, restorable_syncer=False,
    gloo_timeout_s=barrier_gloo_timeout_s, run_learner=run_learner, resume_learner=resume_from_syncer,
    syncer_handler=syncer_handler, compare_order=2, sim_method="dp"))
