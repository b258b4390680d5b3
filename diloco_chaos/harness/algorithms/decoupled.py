"""Decoupled DiLoCo (`algorithm = "decoupled"`): the learners never wait for each other; the syncer merges
each of P fragments of the model as soon as a quorum of learners pushed it, and a learner applies a merged
fragment tau steps after it sent it (docs/algorithm.md)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from diloco_chaos.harness.algorithms.base import Algorithm, register

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario
    from diloco_chaos.harness.learner.chip import LearnerContext
    from diloco_chaos.harness.record.events import EventLog
    from diloco_chaos.harness.syncer.dispatch import AlgorithmHandler
    from diloco_chaos.harness.syncer.transport import Transport


def gloo_timeout_s(sc: Scenario) -> float:
    """gloo_s; in the deterministic mode (at a sync point) and with diloco.apply_wait = block (at step pulled +
    tau) the host waits up to liveness_s while its chips wait in the group, so liveness_s + gloo_s."""
    t = sc.timeouts
    return t.gloo_s + (t.liveness_s if sc.diloco.deterministic or sc.diloco.apply_wait == "block" else 0.0)


def run_learner(ctx: LearnerContext) -> None:
    """`run_decoupled` for the scenario's budget (total: M x steps learner-steps in all, each learner at most
    that), with the deterministic mode's lockstep wait after each publish."""
    from diloco_chaos.harness.learner.chip import lockstep_hook
    from diloco_chaos.trainers.learner.loops import run_decoupled

    sc = ctx.spec.scenario
    budget = sc.train.steps * (sc.topology.learners if sc.train.budget == "total" else 1)
    lockstep = (lockstep_hook(ctx.core, ctx.link, ctx.events, sc.timeouts.liveness_s)
                if sc.diloco.deterministic else None)
    run_decoupled(ctx.core, ctx.batch, ctx.link, ctx.on_step, ctx.on_apply, on_regroup=ctx.on_regroup,
                  max_steps=budget, after_publish=lockstep)


def resume_learner(ctx: LearnerContext) -> None:
    """Pull every fragment's merged value (bounded by 2 x connect_s), logged as `initial_pull` by the host."""
    from diloco_chaos.harness.record.learner import InitialPull
    from diloco_chaos.trainers.learner.loops import initial_pull

    spec, core, link = ctx.spec, ctx.core, ctx.link
    deadline = time.monotonic() + 2 * spec.scenario.timeouts.connect_s

    def wait() -> bool:
        left = deadline - time.monotonic()
        return left > 0 and link is not None and link.wait_inbox(left)

    got = initial_pull(core, link, wait)
    if spec.rank == 0:
        ctx.events.write(InitialPull(learner=spec.learner, step=core.step, fragments=len(got),
                                     of=len(core.partition), applied=[list(x) for x in got]))


def syncer_handler(sc: Scenario, run_dir: str, events: EventLog, transport: Transport,
                   shard: int) -> AlgorithmHandler:
    from diloco_chaos.harness.syncer.decoupled import DecoupledHandler

    return DecoupledHandler(sc, run_dir, events, transport, shard)


ALGORITHM = register(Algorithm(
    name="decoupled", summary="Decoupled DiLoCo: per-fragment merges by quorum, no learner waits for another",
    order=0, merge_unit="fragment", elastic=True, outer_step=True, shardable_syncer=True, restorable_syncer=True,
    gloo_timeout_s=gloo_timeout_s, run_learner=run_learner, resume_learner=resume_learner,
    syncer_handler=syncer_handler, compare_order=3, goodput_rank=3, claim_subject=True, sim_method="decoupled"))
