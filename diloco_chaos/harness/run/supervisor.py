"""Launching and supervising one run: the syncer (S shard processes with syncer.shards = S) and M x C chip
processes.

Processes start from a forkserver that has torch and the training code
preloaded (a fork costs ~0.1 s instead of ~0.5 s for a fresh interpreter
importing torch). The supervisor owns every process of the run: it records
their pids in the run directory, watches them, and whatever happens (normal
end, a failed chip, an exception, Ctrl-C, SIGTERM, the run deadline) stops
them all, SIGTERM then SIGKILL after `timeouts.shutdown_s`. If the supervisor
itself is killed, the forkserver exits and the kernel kills the run's
processes (PR_SET_PDEATHSIG).

Where the learners run (this machine, netns hosts, torchrun, remote hosts) is the run's `Hosts`
(diloco_chaos/harness/hosts/base.py), opened once from the scenario; nothing here depends on the launch mode.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist

from diloco_chaos.chaos.processes import ProcessChaos, syncer_repair_key
from diloco_chaos.harness.config.scenario import Scenario, validate
from diloco_chaos.harness.config.sections import learner_policy
from diloco_chaos.harness.hosts.base import Hosts, HostsUnavailable, Proc
from diloco_chaos.harness.hosts.launch import open_hosts
from diloco_chaos.harness.learner.chip import ChipSpec, members_key
from diloco_chaos.harness.record.base import SCHEMA_VERSION
from diloco_chaos.harness.record.events import EVENTS_FILE, EventLog, EventTail
from diloco_chaos.harness.record.run import (
    ChipJoinAbandoned,
    ChipRepairSkipped,
    LearnerDown,
    LearnerGrow,
    LearnerRestart,
    LearnerShrink,
    ProcessStart,
    RunEnd,
    RunInterrupted,
    RunStart,
    StoreReady,
    SyncerDown,
    SyncerRestart,
)
from diloco_chaos.harness.run.fault_runner import FaultRunner
from diloco_chaos.harness.run.finish import finish_run
from diloco_chaos.harness.run.forkserver import context
from diloco_chaos.harness.run.procutil import main_thread, signal_proc, wait_any
from diloco_chaos.harness.run.rundir import (
    CONFIG_FILE,
    MUTATION_KEY,
    PROCESSES_FILE,
    FinishedRun,
    make_run_dir,
    write_json,
)
from diloco_chaos.harness.syncer.service import SyncerSpec, syncer_main
from diloco_chaos.harness.syncer.shards import proc_name
from diloco_chaos.harness.wire.handshake import new_secret
from diloco_chaos.trainers import mutations

log = logging.getLogger(__name__)

POLL_S = 0.25
"""How often the supervisor reads new events and checks its processes."""
GROW_MARGIN = 0.1
"""A repaired chip is not started when its learner is in this last fraction of its steps (it could not join
before the learner finishes)."""
FAULT_POLL_S = 0.05
"""The same while a scheduled fault waits for its trigger: a fault fires within this of its step."""
SLOW_POLL_S = 0.02
"""The same while a `slow` fault holds a learner to a speed: its controller (diloco_chaos/chaos/processes.py) sees the
learners' steps this late at most, so a learner overshoots its step budget by about this much time."""
class RunFailed(RuntimeError):
    """The run did not complete; the message says which process or bound failed."""


@dataclass
class RunResult:
    """What a finished run left behind."""

    run_dir: Path
    report: dict[str, Any]
    pids: list[int] = field(default_factory=list)
    finished: FinishedRun | None = None
    """The run as its readers see it, read once as it ended (diloco_chaos/harness/run/finish.py)."""


class _Terminate(Exception):
    pass


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminate(f"signal {signum}")


class Supervisor:
    """Starts, watches and always stops the processes of one run."""

    def __init__(self, sc: Scenario, run_root: str | os.PathLike[str],
                 on_events: Callable[[list[dict[str, Any]]], None] | None = None) -> None:
        validate(sc)
        mutations.current()  # an unknown DILOCO_CHAOS_MUTATION fails here, before any process starts
        from diloco_chaos.harness.config.task_check import check_memory, with_task_path

        sc = with_task_path(sc)  # children import the task's module from the directory found here
        check_memory(sc)  # a run that cannot fit in RAM is refused (ScenarioError, exit 2) before it starts
        self.sc = sc
        self.run_dir = make_run_dir(run_root, sc.name, sc.algorithm)
        self.on_events = on_events
        self.procs: dict[str, Any] = {}
        self.events = EventLog(self.run_dir / EVENTS_FILE, "supervisor")
        self.secret = new_secret()
        self.store: Any = None
        self.hosts: Hosts | None = None
        self.faults: FaultRunner | None = None
        self._tail: EventTail | None = None
        self.ports: dict[int, int] = {}
        self.retired: list[Any] = []  # processes of earlier generations of restarted learners
        self.learner_state: dict[int, str] = {}  # up, down (waiting for its repair delay) or done
        self.generation: dict[int, int] = {}
        self.restart_at: dict[int, float] = {}
        self.restarts: dict[int, int] = {}
        self.members: dict[int, list[int]] = {}  # chip ids in the learner's current group (shrink policy)
        self.joining: dict[int, set[int]] = {}  # repaired chips started but not yet in the group
        self.chip_repair_at: dict[tuple[int, int], float] = {}  # (learner, chip) -> when the lost chip returns
        self.procs_chaos: ProcessChaos | None = None
        self.shards = sc.syncer.shards
        self.syncer_ports = [0] * self.shards  # per shard: its port (kept across its restarts)
        self.syncer_restart_at: dict[int, float] = {}  # shard -> when it restarts, while it is down for repair
        self.syncer_restarts: dict[int, int] = {}  # shard -> restarts so far
        self.shard_ports: dict[int, tuple[int, ...]] = {}  # learner -> where it reaches shards 1..S-1
        self._syncer_stop: Any = None
        self.listen = "127.0.0.1"  # where the syncer and the store listen (the hosts' `listen`)

    def start_process(self, name: str, target: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """Fork `target(*args)` from the forkserver as `name`, one of the run's processes (hosts/base.py Spawner)."""
        p = context().Process(target=target, args=args, name=name, daemon=False)
        p.start()
        self.register_process(name, p)
        return p

    def register_process(self, name: str, p: Any) -> None:
        self.procs[name] = p
        self.events.write(ProcessStart(name=name, child_pid=p.pid))
        write_json(self.run_dir / PROCESSES_FILE, {n: q.pid for n, q in self.procs.items()})

    def run(self) -> RunResult:
        sc = self.sc
        mutation = mutations.current()
        write_json(self.run_dir / CONFIG_FILE, {**sc.to_dict(), **({MUTATION_KEY: mutation} if mutation else {})})
        old_term = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread() else None
        t0 = time.monotonic()
        policy, why = learner_policy(sc.recovery.policy, sc.algorithm)
        self.events.write(RunStart(algorithm=sc.algorithm, learners=sc.topology.learners,
                                   chips_per_learner=sc.topology.chips_per_learner, seed=sc.seed, learner_policy=policy,
                                   learner_policy_why=why, schema_version=SCHEMA_VERSION,
                                   mutation=mutation))
        try:
            self.launch_and_watch(t0)
        except (KeyboardInterrupt, _Terminate) as e:
            self.events.write(RunInterrupted(reason=type(e).__name__))
            raise
        finally:
            if self.faults is not None:
                self.faults.stop_all(time.monotonic() - t0)
                if self.on_events is not None and self._tail is not None:  # the faults ended just now, on screen
                    self.on_events(self._tail.poll())
            self._stop_all()
            if self.hosts is not None:
                self.hosts.close()
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
            if sys.exc_info()[0] is not None:  # the run raised: no post-run phase, but its log still ends
                stopped = time.monotonic()
                self.events.write(RunEnd(wall_s=stopped - t0, stopped_t=stopped))
                self.events.close()
        # the post-run phase (diloco_chaos/harness/run/finish.py): errors labelled and the final eval written before
        # run_end, the log's last line; then report.json and invariants.json from the log read once
        try:
            run = finish_run(self.run_dir, sc, self.events, t0)
        finally:
            self.events.close()
        return RunResult(self.run_dir, run.report, [p.pid for p in [*self.procs.values(), *self.retired]], run)

    def launch_and_watch(self, t0: float) -> None:
        """Start the run's processes and watch them until the run is done (returns) or failed (raises): the part of
        `run` a target other than the builtin one replaces (diloco_chaos/harness/targets/torchft/run.py)."""
        sc = self.sc
        hosts = self._open_hosts_and_syncer()
        procs = ProcessChaos(self._chip_pids, sc.topology.learners, on_event=self.events.named,
                             syncer_pids=self._syncer_pids, progress=self._progress, seed=sc.seed,
                             send=hosts.send)
        self.procs_chaos = procs
        self.faults = FaultRunner(sc.faults, hosts.link_chaos, self.events, procs)
        for m in range(sc.topology.learners):
            self._start_learner(m, generation=0, start_step=0)
        self._watch(self._syncer_stop, t0)
        never = self.faults.never_fired()
        if never:
            raise RunFailed("scheduled fault(s) never fired: " + "; ".join(never))

    def _open_hosts_and_syncer(self) -> Hosts:
        """The run's hosts (hosts/base.py), the store and the syncer's shards, and the learners' routes to them;
        RunFailed if the hosts cannot be used. `self.hosts` is set as soon as they are open, for `close`."""
        sc, t = self.sc, self.sc.timeouts
        try:
            hosts = self.hosts = open_hosts(sc, self.run_dir, self.secret, self.events, self)
            self.listen = hosts.listen
            self.store = dist.TCPStore(self.listen, 0, is_master=True, wait_for_workers=False,
                                       timeout=datetime.timedelta(seconds=t.startup_s))
            self.events.write(StoreReady(port=self.store.port))
            self._syncer_stop = context().Event()
            routes = hosts.connect([self._start_syncer(k, restore=False) for k in range(self.shards)])
        except HostsUnavailable as e:
            raise RunFailed(str(e)) from e
        self.ports, self.shard_ports = routes.ports, routes.shard_ports
        return hosts

    def _start_syncer(self, shard: int, restore: bool) -> int:
        """Start syncer shard `shard` (or, with `restore`, its replacement on the same port); returns its port."""
        t = self.sc.timeouts
        parent, child = context().Pipe(duplex=False)
        name = proc_name(shard, self.shards)
        if name in self.procs:
            self.retired.append(self.procs[name])
        spec = SyncerSpec(str(self.run_dir), self.sc, self.secret.hex(), os.getpid(),
                          port=self.syncer_ports[shard], restore=restore, shard=shard,
                          host=self.listen)
        self.start_process(name, syncer_main, (spec, child, self._syncer_stop))
        child.close()
        if not parent.poll(t.startup_s):
            raise RunFailed(f"{name} did not report its port within timeouts.startup_s = {t.startup_s}s")
        self.syncer_ports[shard] = parent.recv()
        parent.close()
        return self.syncer_ports[shard]

    def _syncer(self, shard: int) -> Any:
        return self.procs[proc_name(shard, self.shards)]

    def _syncer_pids(self) -> dict[int, int]:
        """Shard -> pid of each syncer shard running now (what `kill_syncer` may hit)."""
        out = {}
        for k in range(self.shards):
            p = self.procs.get(proc_name(k, self.shards))
            if p is not None and p.exitcode is None and k not in self.syncer_restart_at:
                out[k] = p.pid
        return out

    def _progress(self) -> dict[int, int]:
        return dict(self.faults.schedule.progress.steps) if self.faults is not None else {}

    def _syncer_failed(self, shard: int, code: int, now: float, name: str | None = None) -> None:
        """The recovery policy for a dead syncer shard (`name`: how the error names it, default its process name):
        RunFailed, or its repair delay starts (`syncer_restart_at`) and `syncer_down` is written."""
        rec = self.sc.recovery
        if rec.syncer_policy != "restart" or self.syncer_restarts.get(shard, 0) >= rec.max_restarts:
            why = ("recovery.syncer_policy = 'fail'" if rec.syncer_policy != "restart"
                   else f"max_restarts = {rec.max_restarts} used")
            raise RunFailed(f"{name or proc_name(shard, self.shards)} exited with code {code} ({why})")
        repair = rec.syncer_repair_s
        if self.procs_chaos is not None:
            repair = self.procs_chaos.repair_s.pop(syncer_repair_key(shard), repair)
        self.syncer_restart_at[shard] = now + repair
        self.events.write(SyncerDown(exitcode=code, repair_s=repair, shard=shard))

    def _check_syncers(self, now: float) -> None:
        """Each shard: seen dead (its repair delay starts), or repaired (restarted, restoring its checkpoint)."""
        for k in range(self.shards):
            p = self._syncer(k)
            if k not in self.syncer_restart_at and p.exitcode is not None and p.exitcode != 0:
                self._syncer_failed(k, p.exitcode, now)
            elif k in self.syncer_restart_at and now >= self.syncer_restart_at[k]:
                self.syncer_restarts[k] = self.syncer_restarts.get(k, 0) + 1
                self._start_syncer(k, restore=True)
                del self.syncer_restart_at[k]
                self.events.write(SyncerRestart(restarts=sum(self.syncer_restarts.values()), port=self.syncer_ports[k],
                                                child_pid=self._syncer(k).pid, shard=k))

    def _chips_of(self, m: int) -> list[Proc]:
        """The processes of learner m's current members, in rank order."""
        return [self.procs[f"learner{m}.chip{r}"] for r in self.members[m]]

    def _chip_pids(self, m: int) -> list[int]:
        """Live chip pids of learner m by rank: the registry process faults act on."""
        if self.learner_state.get(m) != "up" or self.hosts is None:
            return []
        return self.hosts.chip_pids(m, self._chips_of(m))

    def _chip_spec(self, m: int, rank: int, generation: int, **more: Any) -> ChipSpec:
        sc = self.sc
        return ChipSpec(str(self.run_dir), sc, m, rank, sc.topology.chips_per_learner, generation, self.store.port,
                        self.ports[m], self.secret.hex(), os.getpid(), syncer_host=self.listen,
                        shard_ports=self.shard_ports.get(m, ()), **more)

    def _start_learner(self, m: int, generation: int, start_step: int) -> None:
        sc = self.sc
        assert self.hosts is not None
        self.retired += [p for n, p in self.procs.items() if n.startswith(f"learner{m}.chip")]
        chips = self.hosts.start_learner(self._chip_spec(m, 0, generation, start_step=start_step))
        self.procs.update({f"learner{m}.chip{r}": p for r, p in chips.items()})  # a launcher may stand for all
        self.generation[m] = generation
        self.learner_state[m] = "up"
        self.members[m] = list(range(sc.topology.chips_per_learner))
        self.joining[m] = set()
        for key in [k for k in self.chip_repair_at if k[0] == m]:
            del self.chip_repair_at[key]

    def _shrink(self, m: int, lost: list[int], now: float, step: int) -> None:
        """Shrink policy: the surviving chips re-form a smaller group; the lost ones come back after repair."""
        rec = self.sc.recovery
        self.restarts[m] = self.restarts.get(m, 0) + 1
        self.generation[m] += 1
        self.members[m] = [r for r in self.members[m] if r not in lost]
        repair = rec.repair_s
        if self.procs_chaos is not None:
            repair = self.procs_chaos.repair_s.pop(m, repair)
        for r in lost:
            self.chip_repair_at[(m, r)] = now + repair
        # logged before the membership is published: the survivors re-form (and log their regroup) once it is
        self.events.write(LearnerShrink(learner=m, lost=lost, members=self.members[m], generation=self.generation[m],
                                        step=step, repair_s=repair))
        self.store.set(members_key(m, self.generation[m]), ",".join(map(str, self.members[m])))

    def _grow(self, m: int, r: int, step: int) -> None:
        """A repaired chip starts and joins its learner's group at the host's next step boundary."""
        assert self.hosts is not None
        self.generation[m] += 1
        members = sorted([*self.members[m], r])
        self.retired.append(self.procs[f"learner{m}.chip{r}"])
        self.hosts.start_chip(self._chip_spec(m, r, self.generation[m], members=tuple(members), joining=True))
        self.members[m] = members
        self.joining[m].add(r)  # it publishes the membership itself once its replica is built
        self.events.write(LearnerGrow(learner=m, chip=r, members=members, generation=self.generation[m], step=step))

    def _check_learner(self, m: int, now: float, step: int) -> None:
        """An up learner: done, failed (restart, or shrink when only non-host chips died), or a chip to rejoin."""
        rec = self.sc.recovery
        codes = {r: p.exitcode for r, p in zip(self.members[m], self._chips_of(m), strict=True)}
        settled = {r: c for r, c in codes.items() if r not in self.joining[m]}
        lost = [r for r, c in codes.items() if c not in (None, 0)]
        if lost:
            policy, _ = learner_policy(rec.policy, self.sc.algorithm)
            shrinkable = (policy == "shrink" and 0 not in lost and not set(lost) & self.joining[m]
                          and self.restarts.get(m, 0) < rec.max_restarts)
            if shrinkable:
                self._shrink(m, lost, now, step)
            else:
                self._learner_failed(m, {f"learner{m}.chip{r}": c for r, c in codes.items()}, now, step)
            return
        if all(c == 0 for c in settled.values()):
            for r in self.joining[m]:  # the learner finished before a repaired chip could join
                signal_proc(self.procs[f"learner{m}.chip{r}"], signal.SIGKILL)
                self.events.write(ChipJoinAbandoned(learner=m, chip=r))
            self.members[m] = [r for r in self.members[m] if r not in self.joining[m]]
            self.joining[m] = set()
            self.learner_state[m] = "done"
            return
        for (lm, r), at in sorted(self.chip_repair_at.items()):
            if lm == m and now >= at:
                del self.chip_repair_at[(lm, r)]
                if step < self.sc.train.steps * (1 - GROW_MARGIN):
                    self._grow(m, r, step)
                else:
                    why = f"the learner is in its last {GROW_MARGIN:.0%} of steps"
                    self.events.write(ChipRepairSkipped(learner=m, chip=r, step=step, reason=why))

    def _learner_failed(self, m: int, exitcodes: dict[str, int | None], now: float, step: int) -> None:
        """Apply the recovery policy to a learner one of whose chips died."""
        rec = self.sc.recovery
        if self.sc.elastic.engine == "torchrun":  # torchrun restarts its job itself; its exit means it gave up
            raise RunFailed(f"the torchrun job exited with {exitcodes} (elastic.max_restarts = "
                            f"{self.sc.elastic.max_restarts} used, or a worker failed; logs/torchrun.log)")
        if rec.policy == "fail" or self.restarts.get(m, 0) >= rec.max_restarts:
            why = "recovery.policy = 'fail'" if rec.policy == "fail" else f"max_restarts = {rec.max_restarts} used"
            raise RunFailed(f"chip process(es) of learner {m} failed ({why}): {exitcodes}")
        for p in self._chips_of(m):  # the group is broken: stop the survivors now, they cannot step alone
            if p.exitcode is None:
                signal_proc(p, signal.SIGKILL)
        for p in self._chips_of(m):
            p.join(timeout=self.sc.timeouts.shutdown_s)
        repair = rec.repair_s
        if self.procs_chaos is not None:
            repair = self.procs_chaos.repair_s.pop(m, repair)
        self.learner_state[m] = "down"
        self.restart_at[m] = time.monotonic() + repair  # from when it is down (its survivors stopped), as logged
        self.events.write(LearnerDown(learner=m, exitcodes=exitcodes, step=step, repair_s=repair))

    def _watch(self, stop: Any, t0: float) -> None:
        t = self.sc.timeouts
        tail = self._tail = EventTail(self.run_dir / EVENTS_FILE)
        faults = self.faults
        assert faults is not None
        m_all = range(self.sc.topology.learners)
        while True:
            new = tail.poll()
            if self.on_events is not None:
                self.on_events(new)
            for e in new:
                if e.get("ev") == "chip_joined":
                    self.joining.get(e["learner"], set()).discard(e["chip"])
            faults.tick(new, time.monotonic() - t0)
            now = time.monotonic()
            if now - t0 > t.run_s:
                raise RunFailed(f"run exceeded timeouts.run_s = {t.run_s}s")
            for m in m_all:
                state = self.learner_state[m]
                if state == "up":
                    self._check_learner(m, now, faults.schedule.progress.steps.get(m, 0))
                elif state == "down" and now >= self.restart_at[m]:
                    self.restarts[m] = self.restarts.get(m, 0) + 1
                    step = faults.schedule.progress.steps.get(m, 0)
                    self._start_learner(m, self.generation[m] + 1, step)
                    self.events.write(LearnerRestart(learner=m, generation=self.generation[m], start_step=step,
                                                     restarts=self.restarts[m]))
            self._check_syncers(now)
            if not self.syncer_restart_at and all(self.learner_state[m] == "done" for m in m_all):
                stop.set()
                deadline = time.monotonic() + t.shutdown_s + 30
                for k in range(self.shards):
                    syncer = self._syncer(k)
                    syncer.join(timeout=max(0.0, deadline - time.monotonic()))
                    if syncer.exitcode != 0:
                        raise RunFailed(f"{proc_name(k, self.shards)} did not finish cleanly "
                                        f"(exit code {syncer.exitcode})")
                if self.on_events is not None:
                    self.on_events(tail.poll())
                return
            down = [self.restart_at[m] - now for m in m_all if self.learner_state[m] == "down"]
            down += [at - now for at in self.chip_repair_at.values()]
            down += [at - now for at in self.syncer_restart_at.values()]
            slowing = self.procs_chaos is not None and self.procs_chaos.slowed()
            base = SLOW_POLL_S if slowing else FAULT_POLL_S if faults.pending() else POLL_S
            poll_s = min([base, *[max(0.0, d) for d in down]])
            live = [p for p in self.procs.values() if p.exitcode is None]
            wait_any(live, poll_s)

    def _stop_all(self) -> None:
        """SIGTERM every live process of the run, then SIGKILL what remains after shutdown_s."""
        every = [*self.procs.values(), *self.retired]
        live = [p for p in every if p.is_alive()]
        for p in live:
            signal_proc(p, signal.SIGTERM)
        deadline = time.monotonic() + self.sc.timeouts.shutdown_s
        for p in live:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in every:
            if p.is_alive():
                signal_proc(p, signal.SIGKILL)
                p.join(timeout=5)
        self.store = None


def run_scenario(sc: Scenario, run_root: str | os.PathLike[str] = "runs",
                 on_events: Callable[[list[dict[str, Any]]], None] | None = None) -> RunResult:
    """Run `sc` with real processes on its system under test (diloco_chaos/harness/targets/base.py: the builtin
    one is `Supervisor`); returns when every process of the run has exited."""
    from diloco_chaos.harness.targets.base import get, system_of

    validate(sc)
    return get(system_of(sc)).run(sc, run_root, on_events)
