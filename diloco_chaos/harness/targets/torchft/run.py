"""The supervisor of a torchft run: the builtin `Supervisor` (diloco_chaos/harness/run/supervisor.py) with its
launch-and-watch part replaced. Everything around it is the builtin run's: the run directory, config.json,
run_start, processes.json, SIGTERM/Ctrl-C handling, ending every active fault and stopping every process
(SIGTERM, then SIGKILL after timeouts.shutdown_s) however the run ends, and the post-run phase
(diloco_chaos/harness/run/finish.py: final eval of global.pt, run_end, report.json, invariants.json).

What it launches: torchft's Lighthouse (lighthouse.py; `lighthouse_ready`), then, for each learner m, replica
group m: topology.chips_per_learner trainer processes (trainer.py) forked from the run's forkserver, with their
group's store port.

Where (`[launch] hosts`): on this machine's loopback ("local"), or on netns hosts ("netns"): the run's hosts are
opened by the builtin launch code (diloco_chaos/harness/hosts/launch.py `open_hosts`, a `NetnsRun`: one network
namespace per replica group behind a veth and a bridge); the Lighthouse listens in the root namespace on the
bridge's address, and each group's ranks enter its namespace with its address as their hostname, store address
and Manager hostname. The kernel link backend's rules (links.backend = "kernel") are made with port 0, so a link
fault on learner m matches every TCP port of group m's veth, both ways: its Lighthouse link, its store, the Gloo
pairs to and from the other groups and the checkpoint server. `Supervisor.run` closes the hosts after every
process has stopped, however the run ends (`hosts_removed`: namespaces, veths, bridge, qdiscs, nft tables).

Faults (docs/targets/torchft.md "Faults"): the scenario's schedule runs through the builtin `FaultRunner`
(diloco_chaos/harness/run/fault_runner.py) and `ProcessChaos` (diloco_chaos/chaos/processes.py), fed with the
records the trainers write (rank 0's `step` is a group's progress, so `at = {step = N, learner = m}` fires on
it); ProcessChaos hits pids from this registry: a group's live ranks, and the Lighthouse as the "syncer".
The reactions are written as the builtin supervisor's records, so report.json's fault_response and timeline
read them unchanged:
- a group one of whose ranks died of a kill the schedule sent it (kill_chip, kill_learner, crash_host): its other
  ranks are SIGKILLed (torchft cannot shrink a group: its ManagerServer lives in rank 0 and its store in rank 0's
  process), `learner_down`, and after the repair delay the whole group starts again as new processes of the next
  generation (`learner_restart`); it heals from a live peer through torchft. A group whose repair comes when
  every other group has finished is not restarted (`chip_repair_skipped`): with no live peer to heal from it
  would retrain from step 0 alone;
- the Lighthouse killed by `kill_syncer`: `syncer_down`, and after the repair delay a new Lighthouse on the same
  port (`syncer_restart`, then its `lighthouse_ready`).
A rank exiting non-zero that no fault explains, or the Lighthouse exiting unkilled, fails the run (RunFailed
naming the group or the Lighthouse); so does recovery.policy = 'fail' or max_restarts used up, a scheduled fault
that never fired, and timeouts.run_s.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from diloco_chaos.chaos.links import LinkChaos
from diloco_chaos.chaos.processes import ProcessChaos
from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.hosts.base import HostsUnavailable
from diloco_chaos.harness.hosts.launch import open_hosts
from diloco_chaos.harness.record.events import EVENTS_FILE, EventTail
from diloco_chaos.harness.record.run import ChipRepairSkipped, LearnerRestart, SyncerRestart
from diloco_chaos.harness.record.torchft import LighthouseReady
from diloco_chaos.harness.run.fault_runner import FaultRunner
from diloco_chaos.harness.run.procutil import running, wait_any
from diloco_chaos.harness.run.supervisor import FAULT_POLL_S, POLL_S, RunFailed, Supervisor
from diloco_chaos.harness.targets.torchft.lighthouse import PROC, Lighthouse, LighthouseFailed, free_port
from diloco_chaos.harness.targets.torchft.trainer import TrainerSpec, trainer_main

if TYPE_CHECKING:
    from diloco_chaos.harness.hosts.netns_run import NetnsRun

GROUP_KILLS = frozenset({"kill_chip", "kill_learner", "crash_host"})
"""The process faults that end a replica group (one rank or all of them): the group restarts after repair."""
EVERY_PORT = 0
"""The port the kernel link backend's rules match on netns hosts: 0, every TCP port (chaos/kernel_links.py
HostLink.syncer_port): torchft's Gloo pairs and checkpoint server use ephemeral ports."""


class TorchftRun(Supervisor):
    """One run of a scenario on the torchft target."""

    lighthouse: Lighthouse | None = None
    netns: NetnsRun | None = None
    """The run's netns hosts (`[launch] hosts = "netns"`), None on this machine's loopback."""

    def launch_and_watch(self, t0: float) -> None:
        sc = self.sc
        self._hit: set[int] = set()  # groups a kill fault hit since their last start
        self._touched: dict[int, list[str]] = {}  # group -> the other process faults that hit it (freeze, ...)
        self._lighthouse_hit = False  # a kill_syncer hit the Lighthouse since its last start (its repair: shard 0's)
        if sc.launch.hosts == "netns":
            self._open_netns()
        self.lighthouse = self._start_lighthouse(0)
        link_chaos = self._connect_links()
        procs = ProcessChaos(self._group_pids, sc.topology.learners, on_event=self._on_chaos,
                             syncer_pids=self._lighthouse_pids, progress=self._progress, seed=sc.seed)
        self.procs_chaos = procs
        self.faults = FaultRunner(sc.faults, link_chaos, self.events, procs)
        for m in range(sc.topology.learners):
            self._start_group(m, 0)
        self._watch_groups(t0)
        never = self.faults.never_fired()
        if never:
            raise RunFailed("scheduled fault(s) never fired: " + "; ".join(never))

    # -- hosts -----------------------------------------------------------------------------------------

    def _open_netns(self) -> None:
        """The run's netns hosts through the builtin launch code; `self.hosts` is set at once, so that
        `Supervisor.run` closes them on every way out. RunFailed if they cannot be made here."""
        from diloco_chaos.harness.hosts.netns_run import NetnsRun  # only runs on netns hosts load it

        try:
            hosts = self.hosts = open_hosts(self.sc, self.run_dir, self.secret, self.events, self)
        except HostsUnavailable as e:
            raise RunFailed(str(e)) from e
        assert isinstance(hosts, NetnsRun)  # validation: torchft runs netns hosts with the local backend only
        self.netns = hosts
        self.listen = hosts.listen

    def _connect_links(self) -> LinkChaos | None:
        """On netns hosts, the kernel link backend on every group's veth (links.backend = "kernel"; EVERY_PORT);
        None elsewhere (torchft's links carry no faults on loopback: validation refuses link faults there)."""
        if self.netns is None:
            return None
        try:
            self.netns.connect([EVERY_PORT])
        except HostsUnavailable as e:
            raise RunFailed(str(e)) from e
        return self.netns.link_chaos

    def _group_host(self, m: int) -> tuple[str, str]:
        """(namespace, address) of replica group m: ("", 127.0.0.1) on this machine's loopback."""
        if self.netns is None:
            return "", "127.0.0.1"
        host = self.netns.hosts.hosts[m]
        return host.netns, host.address

    # -- processes ---------------------------------------------------------------------------------------

    def _start_lighthouse(self, port: int) -> Lighthouse:
        """A Lighthouse on `port` (0: a free one), registered as PROC; its predecessor is retired."""
        lh = Lighthouse(self.sc, self.run_dir, self.listen)
        try:
            lh.start(port)
        except LighthouseFailed as e:
            raise RunFailed(str(e)) from e
        if PROC in self.procs:
            self.retired.append(self.procs[PROC])
        self.lighthouse = lh
        pid = lh.pid
        assert pid is not None
        self.register_process(PROC, lh)  # processes.json; stopped with the others
        self.events.write(LighthouseReady(port=lh.port, child_pid=pid, ready_s=round(lh.ready_s, 3)))
        return lh

    def _start_group(self, m: int, generation: int) -> None:
        """Replica group m's ranks as new processes (its earlier generation's are retired), with a new store."""
        assert self.lighthouse is not None
        size = self.sc.topology.chips_per_learner
        store_port = free_port()
        netns, address = self._group_host(m)
        for r in range(size):
            name = f"learner{m}.chip{r}"
            if name in self.procs:
                self.retired.append(self.procs[name])
            spec = TrainerSpec(str(self.run_dir), self.sc, m, r, size, self.lighthouse.address, store_port,
                               os.getpid(), algorithms.plugin_refs(), generation=generation, netns=netns,
                               address=address)
            self.start_process(name, trainer_main, (spec,))
        self.generation[m] = generation
        self.learner_state[m] = "up"
        self._hit.discard(m)

    def _ranks(self, m: int) -> list[Any]:
        return [self.procs[f"learner{m}.chip{r}"] for r in range(self.sc.topology.chips_per_learner)]

    def _chips_of(self, m: int) -> list[Any]:
        """Every rank of group m: the builtin recovery stops them all (torchft cannot shrink a group)."""
        return self._ranks(m)

    def _group_pids(self, m: int) -> list[int]:
        """Live ranks of group m by rank (what a process fault on learner m hits); none while it is down."""
        if self.learner_state.get(m) != "up":
            return []
        return [p.pid for p in self._ranks(m) if running(p)]  # a fault's thread asks (procutil.running)

    def _lighthouse_pids(self) -> dict[int, int]:
        """The Lighthouse as syncer shard 0, while it runs (what kill_syncer hits)."""
        lh = self.lighthouse
        if lh is None or lh.pid is None or not lh.is_alive() or 0 in self.syncer_restart_at:
            return {}
        return {0: lh.pid}

    def _on_chaos(self, kind: str, /, **fields: Any) -> None:
        """ProcessChaos's events, written as the builtin run writes them; a kill it sends is remembered, so the
        death it causes is an expected one."""
        self.events.named(kind, **fields)
        if kind == "process_fault" and fields.get("kind") in GROUP_KILLS and fields.get("learner") is not None:
            self._hit.add(int(fields["learner"]))
        elif kind == "process_fault" and fields.get("learner") is not None:
            self._touched.setdefault(int(fields["learner"]), []).append(str(fields.get("kind")))
        elif kind == "process_fault" and fields.get("kind") == "kill_syncer":
            self._lighthouse_hit = True

    # -- reactions -------------------------------------------------------------------------------------

    def _group_failed(self, m: int, codes: dict[str, int | None], step: int) -> None:
        """A rank of group m exited non-zero: if a kill of the schedule explains it, the builtin recovery policy
        (the whole group stopped, restarted after its repair delay); otherwise the run fails."""
        if m not in self._hit:
            touched = sorted(set(self._touched.get(m, [])))
            after = (f"after a {', '.join(touched)} of the schedule, which is not a kill (no restart follows)"
                     if touched else "and no fault of the schedule hit it")
            raise RunFailed(f"replica group {m} (learner {m}) failed: {codes} {after} (see logs/)")
        self._learner_failed(m, codes, time.monotonic(), step)

    def _repair_group(self, m: int, step: int) -> None:
        """Group m's repair delay is over: start its next generation, unless no other group is left to heal it."""
        others = [k for k in self.learner_state if k != m and self.learner_state[k] == "up"]
        if not others:
            self.learner_state[m] = "done"
            for r in range(self.sc.topology.chips_per_learner):
                self.events.write(ChipRepairSkipped(learner=m, chip=r, step=step,
                                                    reason="every other replica group has finished: no live peer "
                                                           "to heal from"))
            return
        self.restarts[m] = self.restarts.get(m, 0) + 1
        self._start_group(m, self.generation[m] + 1)
        self.events.write(LearnerRestart(learner=m, generation=self.generation[m], start_step=step,
                                         restarts=self.restarts[m]))

    def _check_lighthouse(self, now: float) -> None:
        """The Lighthouse: killed by a kill_syncer (the builtin syncer recovery: restarted on its port after its
        repair delay), or exited unexplained (the run fails)."""
        lh = self.lighthouse
        assert lh is not None
        if 0 not in self.syncer_restart_at:
            code = lh.exitcode
            if code is None:
                return
            if not self._lighthouse_hit:
                raise RunFailed(f"the torchft lighthouse exited with code {code} and no fault of the schedule hit "
                                "it (see logs/lighthouse.stderr)")
            self._syncer_failed(0, code, now, name="the torchft lighthouse")
        elif now >= self.syncer_restart_at[0]:
            self.syncer_restarts[0] = self.syncer_restarts.get(0, 0) + 1
            new = self._start_lighthouse(lh.port)
            del self.syncer_restart_at[0]
            self._lighthouse_hit = False
            assert new.pid is not None
            self.events.write(SyncerRestart(restarts=self.syncer_restarts[0], port=new.port, child_pid=new.pid,
                                            shard=0))

    # -- the watch loop --------------------------------------------------------------------------------

    def _watch_groups(self, t0: float) -> None:
        sc, faults = self.sc, self.faults
        assert faults is not None
        tail = self._tail = EventTail(self.run_dir / EVENTS_FILE)
        groups = range(sc.topology.learners)
        while True:
            new = tail.poll()
            if self.on_events is not None:
                self.on_events(new)
            faults.tick(new, time.monotonic() - t0)
            now = time.monotonic()
            steps = faults.schedule.progress.steps
            for m in groups:
                state = self.learner_state[m]
                if state == "up":
                    codes = {f"learner{m}.chip{r}": p.exitcode for r, p in enumerate(self._ranks(m))}
                    if any(c not in (None, 0) for c in codes.values()):
                        self._group_failed(m, codes, steps.get(m, 0))
                    elif all(c == 0 for c in codes.values()):
                        self.learner_state[m] = "done"
                elif state == "down" and now >= self.restart_at[m]:
                    self._repair_group(m, steps.get(m, 0))
            self._check_lighthouse(now)
            if all(self.learner_state[m] == "done" for m in groups):
                if self.on_events is not None:
                    self.on_events(tail.poll())
                return
            if now - t0 > sc.timeouts.run_s:
                raise RunFailed(f"run exceeded timeouts.run_s = {sc.timeouts.run_s}s")
            waits = [self.restart_at[m] - now for m in groups if self.learner_state[m] == "down"]
            waits += [at - now for at in self.syncer_restart_at.values()]
            poll_s = min([FAULT_POLL_S if faults.pending() else POLL_S, *[max(0.0, w) for w in waits]])
            wait_any([p for m in groups if self.learner_state[m] == "up" for p in self._ranks(m) if p.exitcode is None],
                     poll_s)  # the Lighthouse (a Popen, no sentinel) is checked at each poll

    def _stop_all(self) -> None:
        """Every process as the builtin supervisor stops them (the Lighthouse included, by its pid), then the
        Lighthouse's process group, in case it was not registered yet."""
        super()._stop_all()
        if self.lighthouse is not None:
            self.lighthouse.stop()
