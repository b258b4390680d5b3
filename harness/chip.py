"""Entry point of one chip process: join the learner's Gloo group and train.

Rank 0 of each learner is its host: the only process with a link to the
syncer. Every collective inside the learner is bounded by `timeouts.gloo_s`
(set on the process group, never Gloo's 30-minute default).
"""

from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from harness import scenario as scenario_mod
from harness.events import EVENTS_FILE, EventLog
from harness.link import SyncerLink
from harness.procutil import become_run_process, cpu_seconds
from harness.syncer_service import max_frame_bytes
from trainers.data import make_splits, train_batch
from trainers.learner import LearnerCore, initial_pull, resume_sync, run_ddp, run_decoupled, run_diloco

CPU_MARK_EVERY = 50
"""Every this many steps, the host's step event carries the process's CPU seconds so far (cost accounting)."""


def gloo_timeout_s(sc: scenario_mod.Scenario) -> float:
    """Bound of every collective in the learner's group. In the synchronous baselines the other chips wait in a
    broadcast while the host waits for the syncer (up to barrier_s), so there it is barrier_s + gloo_s."""
    t = sc.timeouts
    return t.gloo_s if sc.algorithm == "decoupled" else t.barrier_s + t.gloo_s


@dataclass(frozen=True)
class ChipSpec:
    """Everything a chip process needs; picklable."""

    run_dir: str
    scenario: dict
    learner: int
    rank: int
    size: int
    generation: int
    store_port: int
    syncer_port: int
    secret_hex: str
    parent_pid: int
    start_step: int = 0
    """0 for a fresh learner; for a restarted one, the step it resumes after (it pulls the global model first)."""


class GlooCollective:
    """The learner's Gloo group (the process's default group)."""

    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()

    def allreduce_mean_(self, flat: torch.Tensor) -> None:
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat.div_(self.size)

    def broadcast_(self, flat: torch.Tensor, src: int = 0) -> None:
        dist.broadcast(flat, src=src)


def chip_main(spec: ChipSpec) -> None:
    become_run_process(spec.parent_pid)
    sc = scenario_mod.from_dict(spec.scenario)
    proc = f"learner{spec.learner}.chip{spec.rank}"
    events = EventLog(os.path.join(spec.run_dir, EVENTS_FILE), proc)
    events.log("chip_start", learner=spec.learner, rank=spec.rank, size=spec.size, generation=spec.generation)
    t = sc.timeouts
    store = dist.TCPStore("127.0.0.1", spec.store_port, is_master=False,
                          timeout=datetime.timedelta(seconds=t.startup_s))
    group = f"learner{spec.learner}/gen{spec.generation}"
    dist.init_process_group("gloo", store=dist.PrefixStore(group + "/", store), rank=spec.rank,
                            world_size=spec.size, timeout=datetime.timedelta(seconds=gloo_timeout_s(sc)))
    events.log("gloo_group", learner=spec.learner, group=group, rank=spec.rank, size=spec.size)
    link = None
    try:
        core = LearnerCore(spec.learner, sc.model, sc.train, sc.diloco, sc.seed, GlooCollective())
        shard = make_splits(sc.data, sc.topology.learners).shards[spec.learner]
        seq, bs = sc.model.seq_len, sc.data.batch_size

        def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
            return train_batch(shard, seq, bs, sc.seed, spec.learner, spec.rank, step)

        def on_step(step: int, loss: float, tokens: int) -> None:
            extra = {"cpu_s": round(time.process_time(), 4)} if step % CPU_MARK_EVERY == 0 else {}
            events.log("step", learner=spec.learner, step=step, loss=round(loss, 5), tokens=tokens,
                       chips=core.collective.size, **extra)

        def on_apply(step: int, applied: list[tuple[int, int]]) -> None:
            events.log("apply", learner=spec.learner, step=step, fragments=[p for p, _ in applied],
                       versions=[v for _, v in applied])

        if spec.rank == 0:
            link = SyncerLink("127.0.0.1", spec.syncer_port, spec.learner, bytes.fromhex(spec.secret_hex), t,
                              max_frame_bytes(sc), events).start()
            link.wait_connected(t.connect_s)
        if spec.start_step > 0:  # a restarted learner resumes where it stopped, from the global model
            core.step = spec.start_step
            if sc.algorithm == "decoupled":
                deadline = time.monotonic() + 2 * t.connect_s

                def wait() -> bool:
                    left = deadline - time.monotonic()
                    return left > 0 and link is not None and link.wait_inbox(left)

                got = initial_pull(core, link, wait)
                if spec.rank == 0:
                    events.log("initial_pull", learner=spec.learner, step=core.step, fragments=len(got),
                               of=len(core.partition))
            else:
                state = None
                if spec.rank == 0:
                    assert link is not None
                    state = link.wait_resume(2 * t.connect_s)
                    if state is None:
                        raise TimeoutError(f"learner {spec.learner}: no resume state from the syncer "
                                           f"within {2 * t.connect_s}s")
                step = resume_sync(core, state)
                if spec.rank == 0:
                    events.log("resume", learner=spec.learner, step=step)
        if sc.algorithm == "decoupled":
            run_decoupled(core, batch, link, on_step, on_apply)
        elif sc.algorithm == "diloco":
            run_diloco(core, batch, link, on_step,
                       lambda r, s: events.log("apply", learner=spec.learner, step=s, round=r))
        else:
            run_ddp(core, batch, link, on_step)
        if spec.rank == 0:
            events.log("learner_done", learner=spec.learner, steps=core.step, finite=core.finite(),
                       timing={k: round(v, 4) for k, v in core.timing.items()}, cpu_s=cpu_seconds())
    except Exception as e:
        events.log("chip_error", learner=spec.learner, rank=spec.rank, error=f"{type(e).__name__}: {e}")
        raise
    finally:
        if link is not None:
            link.close(flush_timeout_s=t.socket_op_s * 2)
            events.log("link_cpu", learner=spec.learner, threads=link.thread_cpu_s,
                       main_thread_cpu_s=round(time.thread_time(), 4), cpu_s=cpu_seconds())
        dist.destroy_process_group()
        events.close()
