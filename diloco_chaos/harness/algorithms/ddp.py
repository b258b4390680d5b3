"""Synchronous data parallel (`algorithm = "ddp"`): every step's gradient is averaged over all learners at the
syncer's barrier; one missing learner stalls everyone. Also the shared pieces of the synchronous baselines
(their gloo-timeout rule and resume), which diloco.py and elastic_ddp.py reuse."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diloco_chaos.harness.algorithms.base import Algorithm, register

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario
    from diloco_chaos.harness.learner.chip import LearnerContext
    from diloco_chaos.harness.record.events import EventLog
    from diloco_chaos.harness.syncer.dispatch import AlgorithmHandler
    from diloco_chaos.harness.syncer.transport import Transport


def barrier_gloo_timeout_s(sc: Scenario) -> float:
    """barrier_s + gloo_s: the other chips wait in a broadcast while the host waits for the syncer's barrier."""
    return sc.timeouts.barrier_s + sc.timeouts.gloo_s


def resume_from_syncer(ctx: LearnerContext) -> None:
    """The host waits (2 x connect_s at most) for the syncer's RESUME state, every chip loads it; `resume`."""
    from diloco_chaos.harness.record.learner import Resume
    from diloco_chaos.trainers.learner.loops import resume_sync

    spec = ctx.spec
    wait_s = 2 * spec.scenario.timeouts.connect_s
    state = None
    if spec.rank == 0:
        assert ctx.link is not None
        state = ctx.link.wait_resume(wait_s)
        if state is None:
            raise TimeoutError(f"learner {spec.learner}: no resume state from the syncer within {wait_s}s")
    step = resume_sync(ctx.core, state)
    if spec.rank == 0:
        ctx.events.write(Resume(learner=spec.learner, step=step))


def run_learner(ctx: LearnerContext) -> None:
    from diloco_chaos.trainers.learner.loops import run_ddp

    run_ddp(ctx.core, ctx.batch, ctx.link, ctx.on_step)


def syncer_handler(sc: Scenario, run_dir: str, events: EventLog, transport: Transport,
                   shard: int) -> AlgorithmHandler:
    from diloco_chaos.harness.config.task_check import scenario_task
    from diloco_chaos.harness.syncer.barrier import BarrierHandler
    from diloco_chaos.trainers.syncers.synchronous import DdpSyncer

    return BarrierHandler(sc, run_dir, events, transport,
                          DdpSyncer(scenario_task(sc), sc.train, sc.seed, sc.topology.learners))


ALGORITHM = register(Algorithm(
    name="ddp", summary="synchronous data parallel: every step's gradient averaged over all learners",
    order=2, merge_unit="step", elastic=False, outer_step=False, shardable_syncer=False, restorable_syncer=False,
    gloo_timeout_s=barrier_gloo_timeout_s, run_learner=run_learner, resume_learner=resume_from_syncer,
    syncer_handler=syncer_handler, compare_order=0, goodput_rank=1, quality_reference=True, sim_method="dp"))
