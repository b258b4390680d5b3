"""Elastic data parallel (`algorithm = "elastic_ddp"`): ddp whose global group drops a lost learner and admits
it again after its repair; a rejoining learner catches up to the group's state.

Two engines (`[elastic] engine`): "regroup" (the default) drops the lost learner in place; "torchrun" runs every
chip as a worker of one torchrun elastic job (diloco_chaos/harness/hosts/elastic_torchrun.py), which stops and
restarts them all on any loss: global rank 0 writes a checkpoint every `elastic.checkpoint_every` steps and a
restarted job resumes after it (`run_learner` below), logging its process-group init and checkpoint load."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from diloco_chaos.harness.algorithms.base import Algorithm, register
from diloco_chaos.harness.algorithms.ddp import barrier_gloo_timeout_s, resume_from_syncer

if TYPE_CHECKING:
    from torch import Tensor

    from diloco_chaos.harness.config.scenario import Scenario
    from diloco_chaos.harness.learner.chip import LearnerContext
    from diloco_chaos.harness.record.events import EventLog
    from diloco_chaos.harness.syncer.dispatch import AlgorithmHandler
    from diloco_chaos.harness.syncer.transport import Transport

RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"
"""torchrun's count of the job's restarts, in each worker's environment."""


def save_checkpoint(path: str, step: int, tensors: dict[str, Tensor]) -> None:
    """Write (step, tensors) atomically: a temp file in the same directory, fsync, rename over `path`."""
    import torch

    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save({"step": step, "tensors": tensors}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: str) -> tuple[int, dict[str, Tensor]] | None:
    """The checkpoint's (step, tensors), or None if none was written yet."""
    import torch

    try:
        with open(path, "rb") as f:
            data = torch.load(f, weights_only=True)
    except FileNotFoundError:
        return None
    return int(data["step"]), dict(data["tensors"])


def _torchrun_resume(ctx: LearnerContext, restart: int, path: str) -> None:
    """A restarted job's learner: its host reads the last checkpoint (none yet: the initial model), every chip
    takes it; the group init and the load are logged as phases, the resume as `resume`."""
    import psutil

    from diloco_chaos.harness.record.elastic import ElasticPhase
    from diloco_chaos.harness.record.learner import Resume
    from diloco_chaos.trainers.learner.loops import host_state, resume_sync

    m, is_host = ctx.spec.learner, ctx.spec.rank == 0
    t0 = time.monotonic()
    # from the process's creation (torchrun's spawn) to forming its group: interpreter, imports, model, data
    init_s = time.time() - ctx.joined_s - psutil.Process().create_time()
    state = None
    if is_host:
        state = load_checkpoint(path) or host_state(ctx.core)  # before the first checkpoint: the initial model
    step = resume_sync(ctx.core, state)
    if is_host:
        ctx.events.write(ElasticPhase(restart=restart, phase="worker_init", seconds=round(max(0.0, init_s), 5),
                                      learner=m))
        ctx.events.write(ElasticPhase(restart=restart, phase="pg_init", seconds=round(ctx.joined_s, 5), learner=m))
        ctx.events.write(ElasticPhase(restart=restart, phase="checkpoint_load",
                                      seconds=round(time.monotonic() - t0, 5), learner=m))
        ctx.events.write(Resume(learner=m, step=step))


def run_learner(ctx: LearnerContext) -> None:
    """`run_ddp(elastic=True)`; a catch-up to the group's state is an `elastic_catch_up` event. Engine torchrun:
    a restarted job resumes from the checkpoint first, and global rank 0 writes one every checkpoint_every
    steps."""
    from diloco_chaos.harness.record.learner import ElasticCatchUp
    from diloco_chaos.trainers.learner.loops import run_ddp

    learner = ctx.spec.learner
    on_step = ctx.on_step
    sc = ctx.spec.scenario
    if sc.elastic.engine == "torchrun":
        from diloco_chaos.harness.hosts.elastic_torchrun import checkpoint_path
        from diloco_chaos.harness.record.elastic import ElasticCheckpoint
        from diloco_chaos.trainers.learner.loops import host_state

        path = checkpoint_path(ctx.spec.run_dir)
        restart = int(os.environ.get(RESTART_ENV, "0"))
        if restart > 0:
            _torchrun_resume(ctx, restart, path)
        if learner == 0 and ctx.spec.rank == 0:
            every = sc.elastic.checkpoint_every

            def on_step(step: int, loss: float, tokens: int) -> None:
                ctx.on_step(step, loss, tokens)
                if step % every == 0:
                    t0 = time.monotonic()
                    save_checkpoint(path, *host_state(ctx.core))
                    ctx.events.write(ElasticCheckpoint(step=step, seconds=round(time.monotonic() - t0, 5),
                                                       path=path))

    run_ddp(ctx.core, ctx.batch, ctx.link, on_step, elastic=True,
            on_catch_up=lambda ours, group: ctx.events.write(
                ElasticCatchUp(learner=learner, from_step=ours, to_step=group)),
            on_regroup=ctx.on_regroup)


def syncer_handler(sc: Scenario, run_dir: str, events: EventLog, transport: Transport,
                   shard: int) -> AlgorithmHandler:
    from diloco_chaos.harness.config.task_check import scenario_task
    from diloco_chaos.harness.syncer.barrier import BarrierHandler
    from diloco_chaos.trainers.syncers.elastic_ddp import ElasticDdpSyncer

    rollback = None
    if sc.elastic.engine == "torchrun":
        from diloco_chaos.harness.hosts.elastic_torchrun import checkpoint_path

        path = checkpoint_path(run_dir)
        rollback = lambda: load_checkpoint(path)  # noqa: E731
    return BarrierHandler(sc, run_dir, events, transport,
                          ElasticDdpSyncer(scenario_task(sc), sc.train, sc.seed, sc.topology.learners,
                                           restart_from=rollback))


ALGORITHM = register(Algorithm(
    name="elastic_ddp", summary="data parallel whose global group drops a lost learner and admits it again",
    order=3, merge_unit="step", elastic=True, outer_step=False, shardable_syncer=False, restorable_syncer=False,
    gloo_timeout_s=barrier_gloo_timeout_s, run_learner=run_learner, resume_learner=resume_from_syncer,
    syncer_handler=syncer_handler, compare_order=1, goodput_rank=2, sim_method="elastic_dp", torchrun_engine=True))
