"""Elastic data parallel (`algorithm = "elastic_ddp"`): ddp whose global group drops a lost learner and admits
it again after its repair; a rejoining learner catches up to the group's state."""

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
    """`run_ddp(elastic=True)`; a catch-up to the group's state is an `elastic_catch_up` event."""
    from diloco_chaos.harness.record.learner import ElasticCatchUp
    from diloco_chaos.trainers.learner.loops import run_ddp

    learner = ctx.spec.learner
    run_ddp(ctx.core, ctx.batch, ctx.link, ctx.on_step, elastic=True,
            on_catch_up=lambda ours, group: ctx.events.write(
                ElasticCatchUp(learner=learner, from_step=ours, to_step=group)),
            on_regroup=ctx.on_regroup)


def syncer_handler(sc: Scenario, run_dir: str, events: EventLog, transport: Transport,
                   shard: int) -> AlgorithmHandler:
    from diloco_chaos.harness.config.task_check import scenario_task
    from diloco_chaos.harness.syncer.barrier import BarrierHandler
    from diloco_chaos.trainers.syncers.elastic_ddp import ElasticDdpSyncer

    return BarrierHandler(sc, run_dir, events, transport,
                          ElasticDdpSyncer(scenario_task(sc), sc.train, sc.seed, sc.topology.learners))


ALGORITHM = register(Algorithm(
    name="elastic_ddp", summary="data parallel whose global group drops a lost learner and admits it again",
    order=3, merge_unit="step", elastic=True, outer_step=False, shardable_syncer=False, restorable_syncer=False,
    gloo_timeout_s=barrier_gloo_timeout_s, run_learner=run_learner, resume_learner=resume_from_syncer,
    syncer_handler=syncer_handler, compare_order=1, goodput_rank=2, sim_method="elastic_dp"))
