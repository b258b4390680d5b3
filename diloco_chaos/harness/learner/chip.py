"""Entry point of one chip process: join the learner's Gloo group and train.

Rank 0 of each learner is its host: the only process with a link to the
syncer. Every collective inside the learner is bounded by `timeouts.gloo_s`
(set on the process group, never Gloo's 30-minute default).
"""

from __future__ import annotations

import datetime
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.config import scenario as scenario_mod
from diloco_chaos.harness.config.sections import learner_policy
from diloco_chaos.harness.config.task_check import scenario_task
from diloco_chaos.harness.learner.link_process import LinkProcess
from diloco_chaos.harness.record.events import EVENTS_FILE, EventLog
from diloco_chaos.harness.record.learner import (
    Apply,
    ApplyWait,
    ChipError,
    ChipJoined,
    ChipStart,
    FragmentOverwritten,
    GlooGroup,
    LearnerDone,
    LearnerNonfinite,
    LockstepWaitExpired,
    Regroup,
    Step,
)
from diloco_chaos.harness.run.procutil import become_run_process, cpu_seconds, print_error, stderr_to_file
from diloco_chaos.harness.wire.frame_limit import max_frame_bytes
from diloco_chaos.harness.wire.precision import wire_dtype_for
from diloco_chaos.trainers import mutations
from diloco_chaos.trainers.learner.core import CollectiveFailed, LearnerCore
from diloco_chaos.trainers.learner.lockstep import await_round, due_here
from diloco_chaos.trainers.learner.loops import ApplyHook, BatchFn, RegroupHook, StepHook, sync_replicas
from diloco_chaos.trainers.syncers.shards import assign_shards, fragment_sizes

CPU_MARK_EVERY = 50
"""Every this many steps, the host's step event carries the process's CPU seconds so far (cost accounting)."""


def lockstep_hook(core: LearnerCore, link: LinkProcess | None, events: EventLog,
                  bound_s: float) -> Callable[[], None]:
    """Deterministic mode: after each publish, wait (at most `bound_s`, the liveness timeout after which the
    syncer merges without a silent learner) for the merges of the fragments due at this step."""

    def after_publish() -> None:
        if link is None or not due_here(core):
            return
        deadline = time.monotonic() + bound_s

        def wait() -> bool:
            left = deadline - time.monotonic()
            return left > 0 and link.wait_inbox(left)

        if not await_round(core, link, wait):
            events.write(LockstepWaitExpired(learner=core.learner, step=core.step, bound_s=bound_s))

    return after_publish


@dataclass(frozen=True)
class ChipSpec:
    """Everything a chip process needs; picklable."""

    run_dir: str
    scenario: scenario_mod.Scenario
    """The scenario the supervisor validated, as it is: the chip never parses a document again."""
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
    members: tuple[int, ...] = ()
    """Chip ids (ranks at generation 0) in this generation's group, in rank order; empty: all `size` chips."""
    joining: bool = False
    """A repaired chip joining a running learner (shrink policy): it takes the host's state, then trains."""
    netns: str = ""
    """The learner host's network namespace (`[launch] hosts = "netns"`), entered first; "": this machine's."""
    syncer_host: str = "127.0.0.1"
    """Where the syncer and the rendezvous store listen (the netns hosts' bridge address, or loopback)."""
    shard_ports: tuple[int, ...] = ()
    """syncer.shards > 1: where the host's link reaches shards 1..S-1 (`syncer_port` is shard 0's)."""
    plugins: tuple[algorithms.PluginRef, ...] = field(default_factory=algorithms.plugin_refs)
    """The algorithm plugins registered where the spec was made, imported first (a forkserver may predate them)."""


@dataclass(frozen=True)
class LearnerContext:
    """What an algorithm's learner loop and resume (its descriptor's `run_learner`, `resume_learner`) get from
    the chip: its spec, its core and link, the event log and the hooks that write the chip's events."""

    spec: ChipSpec
    core: LearnerCore
    link: LinkProcess | None
    """The host's link to the syncer; None on the other chips."""
    events: EventLog
    batch: BatchFn
    on_step: StepHook
    on_apply: ApplyHook
    on_regroup: RegroupHook
    joined_s: float = 0.0
    """Seconds from this chip's start forming its learner's Gloo group to its host's link connected to the syncer
    (the process-group init a restart pays; elastic.engine = "torchrun" logs it)."""


def _owners(partition: list[list[str]], numel: dict[str, int], shards: int) -> tuple[int, ...]:
    """The owning synchronizer shard of each fragment (empty without sharding)."""
    return tuple(assign_shards(fragment_sizes(partition, numel), shards)) if shards > 1 else ()


def members_key(learner: int, generation: int) -> str:
    """TCPStore key where the supervisor publishes a generation's members (comma-separated chip ids)."""
    return f"learner{learner}/gen{generation}/members"


class GlooCollective:
    """The learner's Gloo group (the process's default group), re-formable under the shrink policy.

    Each chip keeps its id (its rank at generation 0, which also picks its data); its rank in the group is
    its position in the current generation's members. A generation's group lives under its own store
    prefix `learner<m>/gen<g>/`, so a re-formed group never meets the keys of a broken one. The supervisor
    decides memberships and publishes them under `members_key` (a shrink at once; a grow through the
    repaired chip, once it has built its replica, so the members never wait on its start-up); the chips only
    wait for them (bounded)."""

    RECHECK_S = 0.2
    """The host looks for a new membership at most this often (a store round trip)."""

    def __init__(self, store: dist.Store, learner: int, chip: int, generation: int, members: list[int],
                 timeout_s: float, reform_timeout_s: float, events: EventLog, announce: bool = False) -> None:
        self.store, self.learner, self.chip = store, learner, chip
        self.timeout_s, self.reform_timeout_s, self.events = timeout_s, reform_timeout_s, events
        self._checked = 0.0
        if announce:  # a repaired chip, ready to train: publish the membership the supervisor gave it
            store.set(members_key(learner, generation), ",".join(map(str, members)))
        self._form(generation, members)

    def _form(self, generation: int, members: list[int]) -> None:
        if self.chip not in members:
            raise CollectiveFailed(f"chip {self.chip} is not a member of generation {generation}: {members}")
        group = f"learner{self.learner}/gen{generation}"
        dist.init_process_group("gloo", store=dist.PrefixStore(group + "/", self.store),
                                rank=members.index(self.chip), world_size=len(members),
                                timeout=datetime.timedelta(seconds=self.timeout_s))
        self.generation, self.members = generation, members
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.events.write(GlooGroup(learner=self.learner, group=group, rank=self.rank, size=self.size,
                                    chip=self.chip, members=members))

    def allreduce_mean_(self, flat: torch.Tensor) -> None:
        try:
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        except RuntimeError as e:
            raise CollectiveFailed(str(e)[:300]) from e
        flat.div_(self.size)

    def broadcast_(self, flat: torch.Tensor, src: int = 0) -> None:
        try:
            dist.broadcast(flat, src=src)
        except RuntimeError as e:
            raise CollectiveFailed(str(e)[:300]) from e

    def pending_reform(self) -> bool:
        now = time.monotonic()
        if now - self._checked < self.RECHECK_S:
            return False
        self._checked = now
        return self.store.check([members_key(self.learner, self.generation + 1)])

    def reform(self) -> None:
        key = members_key(self.learner, self.generation + 1)
        try:
            self.store.wait([key], datetime.timedelta(seconds=self.reform_timeout_s))
            members = [int(x) for x in self.store.get(key).decode().split(",")]
        except RuntimeError as e:  # the store's timeout: no new membership came (not a loss the supervisor saw)
            raise CollectiveFailed(f"no membership for generation {self.generation + 1} within "
                                   f"{self.reform_timeout_s}s: {e}") from e
        dist.destroy_process_group()
        self._form(self.generation + 1, members)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def chip_main(spec: ChipSpec) -> None:
    if spec.netns:  # before any thread or socket exists: all of them, and the link process, live in the host
        from diloco_chaos.harness.hosts.netns import enter_netns

        enter_netns(spec.netns)
    become_run_process(spec.parent_pid)
    algorithms.load_plugins(spec.plugins)
    sc = spec.scenario
    algorithm = algorithms.get(sc.algorithm)
    proc = f"learner{spec.learner}.chip{spec.rank}"
    stderr_to_file(spec.run_dir, proc)
    events = EventLog(os.path.join(spec.run_dir, EVENTS_FILE), proc)
    events.write(ChipStart(learner=spec.learner, rank=spec.rank, size=spec.size, generation=spec.generation))
    t = sc.timeouts
    store = dist.TCPStore(spec.syncer_host, spec.store_port, is_master=False,
                          timeout=datetime.timedelta(seconds=t.startup_s))
    # Build the replica and load the data before joining the group: a repaired chip joining a running
    # learner keeps the others waiting in the group's first collective only for the state transfer.
    task = scenario_task(sc)  # imported from task.path, as the supervisor resolved it
    core = LearnerCore(spec.learner, task, sc.train, sc.diloco, sc.seed,
                       shrinkable=(learner_policy(sc.recovery.policy, sc.algorithm)[0] == "shrink"
                                   and sc.elastic.engine != "torchrun"),  # torchrun restarts every chip instead
                       apply_wait_s=t.liveness_s if sc.diloco.apply_wait == "block" else 0.0)
    task.train_batch(spec.learner, spec.rank, spec.start_step + 1)  # loads the task's data (a shard) now
    members = list(spec.members) or list(range(spec.size))
    link = None
    failed = False
    if members.index(spec.rank) == 0:  # the host: fork its link process now, while no Gloo thread exists
        link = LinkProcess(spec.syncer_host, spec.syncer_port, spec.learner, bytes.fromhex(spec.secret_hex), t,
                           max_frame_bytes(sc), os.path.join(spec.run_dir, EVENTS_FILE),
                           {n: p.shape for n, p in core.named.items()}, core.partition,
                           wire_dtype_for(sc.algorithm, sc.diloco.wire_dtype), spec.shard_ports,
                           _owners(core.partition, {n: p.numel() for n, p in core.named.items()},
                                   sc.syncer.shards)).start()
    coll = None
    t_join = time.monotonic()
    try:
        coll = GlooCollective(store, spec.learner, spec.rank, spec.generation, members, algorithm.gloo_timeout_s(sc),
                              t.gloo_s, events, announce=spec.joining)
        core.collective = coll

        def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
            return task.train_batch(spec.learner, spec.rank, step)

        nonfinite_logged = False

        def on_step(step: int, loss: float, tokens: int) -> None:
            nonlocal nonfinite_logged
            if not nonfinite_logged and not math.isfinite(loss):  # the learner trains on NaN from here: say so once
                nonfinite_logged = True
                events.write(LearnerNonfinite(
                    learner=spec.learner, step=step, loss=loss,
                    error=f"training loss {loss} at step {step}: the learner's work is non-finite"))
            for p, pulled, waited, outcome in core.waits:  # diloco.apply_wait = block: this step's waits
                events.write(ApplyWait(learner=spec.learner, fragment=p, step=step, waited_s=round(waited, 6),
                                       outcome=outcome, pulled=pulled))
            core.waits.clear()
            events.write(Step(learner=spec.learner, step=step, loss=round(loss, 5), tokens=tokens,
                              chips=core.collective.size, compute_s=round(core.last_compute_s, 5),
                              sync_s=round(core.last_sync_s, 5),
                              cpu_s=round(time.process_time(), 4) if step % CPU_MARK_EVERY == 0 else None))

        def on_apply(step: int, applied: list[tuple[int, int]]) -> None:
            facts = [core.frags[p].applied_from or (None, None, False) for p, _ in applied]
            events.write(Apply(learner=spec.learner, step=step, fragments=[p for p, _ in applied],
                               versions=[v for _, v in applied], pulled=[f[0] for f in facts],
                               arrived=[f[1] for f in facts], broadcast=[f[2] for f in facts]))
            for p, version in applied:  # diloco.broadcast = all: a merge it was not in discarded its work
                over = core.frags[p].overwrote
                if over is not None:
                    events.write(FragmentOverwritten(
                        learner=spec.learner, fragment=p, step=step, tokens=over[1],
                        reason=f"not in the merge of version {version}: its unmerged steps {over[0]}-{step} "
                               "overwritten"))

        if spec.joining:  # a repaired chip: the members re-form with it at a step boundary and send their state
            step = sync_replicas(core)
            events.write(ChipJoined(learner=spec.learner, chip=spec.rank, step=step, rank=coll.rank,
                                    size=coll.size, generation=coll.generation))

        def on_regroup(step: int, why: str) -> None:
            events.write(Regroup(learner=spec.learner, chip=spec.rank, step=step, rank=coll.rank, size=coll.size,
                                 generation=coll.generation, members=coll.members, why=why))

        if link is not None:  # connect only now, so that the syncer never counts a learner still starting up
            link.connect()
            link.wait_connected(t.connect_s)
        ctx = LearnerContext(spec, core, link, events, batch, on_step, on_apply, on_regroup,
                             joined_s=time.monotonic() - t_join)
        if spec.start_step > 0:  # a restarted learner resumes where it stopped, from the global model
            core.step = spec.start_step
            for st in core.frags:  # counters count from here (a fragment the pull does not update included)
                st.first_step = spec.start_step + 1
            algorithm.resume_learner(ctx)
            if mutations.active("resume_one_step_early"):  # mutation: the last logged step is trained again
                core.step -= 1
        algorithm.run_learner(ctx)
        if spec.rank == 0:
            events.write(LearnerDone(learner=spec.learner, steps=core.step, finite=core.finite(),
                                     timing={k: round(v, 4) for k, v in core.timing.items()}, cpu_s=cpu_seconds()))
    except Exception as e:
        failed = True
        print_error(e)  # logs/<proc>.stderr, before the event the supervisor reacts to; not printed twice
        events.write(ChipError(learner=spec.learner, rank=spec.rank, error=f"{type(e).__name__}: {e}"))
        raise SystemExit(1) from e
    finally:
        if link is not None:
            # finished: its final pushes wait (bounded) for a syncer that is down to come back
            link.close(flush_timeout_s=t.final_flush_s if not failed else t.socket_op_s * 2, finished=not failed)
        if coll is not None:
            coll.close()
        events.close()
