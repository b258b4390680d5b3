"""The supervisor of a torchft run: the builtin `Supervisor` (diloco_chaos/harness/run/supervisor.py) with its
launch-and-watch part replaced. Everything around it is the builtin run's: the run directory, config.json,
run_start, processes.json, SIGTERM/Ctrl-C handling, stopping every process (SIGTERM, then SIGKILL after
timeouts.shutdown_s) however the run ends, and the post-run phase (diloco_chaos/harness/run/finish.py: final eval
of global.pt, run_end, report.json, invariants.json).

What it launches: torchft's Lighthouse (lighthouse.py; `lighthouse_ready`), then, for each learner m, replica
group m: topology.chips_per_learner trainer processes (trainer.py) forked from the run's forkserver, with their
group's store port. What it watches: a group is done when all its ranks exited 0; a rank that exits non-zero, or
the Lighthouse exiting, fails the run (RunFailed naming the group or the Lighthouse) since no fault is carried
yet and so no failure is expected; timeouts.run_s bounds the whole run.
"""

from __future__ import annotations

import os
import time

from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.record.events import EVENTS_FILE, EventTail
from diloco_chaos.harness.record.torchft import LighthouseReady
from diloco_chaos.harness.run.procutil import wait_any
from diloco_chaos.harness.run.supervisor import POLL_S, RunFailed, Supervisor
from diloco_chaos.harness.targets.torchft.lighthouse import PROC, Lighthouse, LighthouseFailed, free_port
from diloco_chaos.harness.targets.torchft.trainer import TrainerSpec, trainer_main


class TorchftRun(Supervisor):
    """One run of a scenario on the torchft target."""

    lighthouse: Lighthouse | None = None

    def launch_and_watch(self, t0: float) -> None:
        sc = self.sc
        self.lighthouse = Lighthouse(sc, self.run_dir)
        try:
            self.lighthouse.start()
        except LighthouseFailed as e:
            raise RunFailed(str(e)) from e
        pid = self.lighthouse.pid
        assert pid is not None
        self.events.write(LighthouseReady(port=self.lighthouse.port, child_pid=pid,
                                          ready_s=round(self.lighthouse.ready_s, 3)))
        self.register_process(PROC, self.lighthouse)  # processes.json; stopped with the others
        size = sc.topology.chips_per_learner
        for m in range(sc.topology.learners):
            store_port = free_port()
            for r in range(size):
                spec = TrainerSpec(str(self.run_dir), sc, m, r, size, self.lighthouse.address, store_port,
                                   os.getpid(), algorithms.plugin_refs())
                self.start_process(f"learner{m}.chip{r}", trainer_main, (spec,))
        self._watch_groups(t0)

    def _watch_groups(self, t0: float) -> None:
        sc, lighthouse = self.sc, self.lighthouse
        assert lighthouse is not None
        tail = self._tail = EventTail(self.run_dir / EVENTS_FILE)
        size = sc.topology.chips_per_learner
        groups = {m: [self.procs[f"learner{m}.chip{r}"] for r in range(size)] for m in range(sc.topology.learners)}
        while True:
            new = tail.poll()
            if self.on_events is not None:
                self.on_events(new)
            for m, ranks in groups.items():
                failed = {f"learner{m}.chip{r}": p.exitcode for r, p in enumerate(ranks) if p.exitcode not in (None, 0)}
                if failed:
                    raise RunFailed(f"replica group {m} (learner {m}) failed: {failed} (the torchft target carries no "
                                    "fault yet, so no failure is expected; see logs/)")
            if all(p.exitcode == 0 for ranks in groups.values() for p in ranks):
                if self.on_events is not None:
                    self.on_events(tail.poll())
                return
            code = lighthouse.exitcode
            if code is not None:
                raise RunFailed(f"the torchft lighthouse exited with code {code} (see logs/lighthouse.stderr)")
            if time.monotonic() - t0 > sc.timeouts.run_s:
                raise RunFailed(f"run exceeded timeouts.run_s = {sc.timeouts.run_s}s")
            wait_any([p for ranks in groups.values() for p in ranks if p.exitcode is None], POLL_S)

    def _stop_all(self) -> None:
        """Every process as the builtin supervisor stops them (the Lighthouse included, by its pid), then the
        Lighthouse's process group, in case it was not registered yet."""
        super()._stop_all()
        if self.lighthouse is not None:
            self.lighthouse.stop()

