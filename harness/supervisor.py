"""Launching and supervising one run: the syncer and M x C chip processes.

Processes start from a forkserver that has torch and the training code
preloaded (a fork costs ~0.1 s instead of ~0.5 s for a fresh interpreter
importing torch). The supervisor owns every process of the run: it records
their pids in the run directory, watches them, and whatever happens (normal
end, a failed chip, an exception, Ctrl-C, SIGTERM, the run deadline) stops
them all, SIGTERM then SIGKILL after `timeouts.shutdown_s`. If the supervisor
itself is killed, the forkserver exits and the kernel kills the run's
processes (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import datetime
import logging
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch.distributed as dist

from harness.chip import ChipSpec, chip_main
from harness.events import EVENTS_FILE, EventLog, EventTail
from harness.fault_runner import FaultRunner
from harness.rundir import CONFIG_FILE, PROCESSES_FILE, REPORT_FILE, make_run_dir, write_json
from harness.scenario import Scenario, validate
from harness.syncer_service import SyncerSpec, syncer_main
from harness.wire import new_secret

log = logging.getLogger(__name__)

POLL_S = 0.25
"""How often the supervisor reads new events and checks its processes."""
FAULT_POLL_S = 0.05
"""The same while a scheduled fault waits for its trigger: a fault fires within this of its step."""
PRELOAD = ["torch", "torch.distributed", "harness.chip", "harness.syncer_service"]
_ctx: Any = None


def context() -> Any:
    """The forkserver context, with the heavy imports preloaded once per supervisor process."""
    global _ctx
    if _ctx is None:
        _ctx = mp.get_context("forkserver")
        _ctx.set_forkserver_preload(PRELOAD)
    return _ctx


def fragment_bytes(sc: Scenario) -> int:
    """Average bytes of one fragment on the wire (float32), for scaling WAN profiles."""
    from trainers.model import build_model

    n = sum(p.numel() for p in build_model(sc.model, 0).parameters())
    return n * 4 // (sc.diloco.fragments if sc.algorithm == "decoupled" else 1)


class RunFailed(RuntimeError):
    """The run did not complete; the message says which process or bound failed."""


@dataclass
class RunResult:
    """What a finished run left behind."""

    run_dir: Path
    report: dict[str, Any]
    pids: list[int] = field(default_factory=list)


class _Terminate(Exception):
    pass


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminate(f"signal {signum}")


class Supervisor:
    """Starts, watches and always stops the processes of one run."""

    def __init__(self, sc: Scenario, run_root: str | os.PathLike[str],
                 on_events: Callable[[list[dict[str, Any]]], None] | None = None) -> None:
        validate(sc)
        self.sc = sc
        self.run_dir = make_run_dir(run_root, sc.name, sc.algorithm)
        self.on_events = on_events
        self.procs: dict[str, Any] = {}
        self.events = EventLog(self.run_dir / EVENTS_FILE, "supervisor")
        self.secret = new_secret()
        self.store: Any = None
        self.links: Any = None
        self.faults: FaultRunner | None = None

    def _start(self, name: str, target: Any, args: tuple) -> None:
        p = context().Process(target=target, args=args, name=name, daemon=False)
        p.start()
        self.procs[name] = p
        self.events.log("process_start", name=name, child_pid=p.pid)
        write_json(self.run_dir / PROCESSES_FILE, {n: q.pid for n, q in self.procs.items()})

    def run(self) -> RunResult:
        sc, t = self.sc, self.sc.timeouts
        write_json(self.run_dir / CONFIG_FILE, sc.to_dict())
        old_term = signal.signal(signal.SIGTERM, _on_sigterm) if _main_thread() else None
        t0 = time.monotonic()
        self.events.log("run_start", algorithm=sc.algorithm, learners=sc.topology.learners,
                        chips_per_learner=sc.topology.chips_per_learner, seed=sc.seed)
        try:
            self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                       timeout=datetime.timedelta(seconds=t.startup_s))
            ctx = context()
            parent, child = ctx.Pipe(duplex=False)
            stop = ctx.Event()
            spec = SyncerSpec(str(self.run_dir), sc.to_dict(), self.secret.hex(), os.getpid())
            self._start("syncer", syncer_main, (spec, child, stop))
            child.close()
            if not parent.poll(t.startup_s):
                raise RunFailed(f"syncer did not report its port within timeouts.startup_s = {t.startup_s}s")
            port = parent.recv()
            ports = {m: port for m in range(sc.topology.learners)}
            if sc.links.proxy != "off":
                from harness.link_proxies import RunLinks

                self.links = RunLinks.open(sc, port, self.events, fragment_bytes(sc))
                ports = self.links.ports
            self.faults = FaultRunner(sc.faults, self.links.chaos if self.links else None, self.events)
            for m in range(sc.topology.learners):
                for r in range(sc.topology.chips_per_learner):
                    cs = ChipSpec(str(self.run_dir), sc.to_dict(), m, r, sc.topology.chips_per_learner, 0,
                                  self.store.port, ports[m], self.secret.hex(), os.getpid())
                    self._start(f"learner{m}.chip{r}", chip_main, (cs,))
            self._watch(stop, t0)
        except (KeyboardInterrupt, _Terminate) as e:
            self.events.log("run_interrupted", reason=type(e).__name__)
            raise
        finally:
            if self.faults is not None:
                self.faults.stop_all(time.monotonic() - t0)
            self._stop_all()
            if self.links is not None:
                self.links.close(t.shutdown_s)
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
            self.events.log("run_end", wall_s=time.monotonic() - t0)
        from harness.report import build_report, final_eval

        final_eval(self.run_dir, sc, self.events)
        report = build_report(self.run_dir)
        write_json(self.run_dir / REPORT_FILE, report)
        self.events.close()
        return RunResult(self.run_dir, report, [p.pid for p in self.procs.values()])

    def _watch(self, stop: Any, t0: float) -> None:
        t = self.sc.timeouts
        tail = EventTail(self.run_dir / EVENTS_FILE)
        chips = {n: p for n, p in self.procs.items() if n != "syncer"}
        syncer = self.procs["syncer"]
        faults = self.faults
        while True:
            new = tail.poll()
            if self.on_events is not None:
                self.on_events(new)
            if faults is not None:
                faults.tick(new, time.monotonic() - t0)
            if time.monotonic() - t0 > t.run_s:
                raise RunFailed(f"run exceeded timeouts.run_s = {t.run_s}s")
            failed = {n: p.exitcode for n, p in chips.items() if p.exitcode not in (None, 0)}
            if failed:
                raise RunFailed(f"chip process(es) failed: {failed}")
            if syncer.exitcode is not None and syncer.exitcode != 0:
                raise RunFailed(f"syncer exited with code {syncer.exitcode}")
            if all(p.exitcode == 0 for p in chips.values()):
                stop.set()
                syncer.join(timeout=t.shutdown_s + 30)
                if syncer.exitcode != 0:
                    raise RunFailed(f"syncer did not finish cleanly (exit code {syncer.exitcode})")
                if self.on_events is not None:
                    self.on_events(tail.poll())
                return
            poll_s = FAULT_POLL_S if faults is not None and faults.pending() else POLL_S
            _wait_any([p for p in [*chips.values(), syncer] if p.exitcode is None], poll_s)

    def _stop_all(self) -> None:
        """SIGTERM every live process of the run, then SIGKILL what remains after shutdown_s."""
        live = [p for p in self.procs.values() if p.is_alive()]
        for p in live:
            _signal_tree(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.sc.timeouts.shutdown_s
        for p in live:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self.procs.values():
            if p.is_alive():
                _signal_tree(p.pid, signal.SIGKILL)
                p.join(timeout=5)
        self.store = None


def _signal_tree(pid: int, sig: int) -> None:
    try:
        proc = psutil.Process(pid)
        for q in [*proc.children(recursive=True), proc]:
            try:
                q.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
    except psutil.NoSuchProcess:
        pass


def _wait_any(procs: list[Any], timeout: float) -> None:
    from multiprocessing.connection import wait

    wait([p.sentinel for p in procs], timeout=timeout)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def run_scenario(sc: Scenario, run_root: str | os.PathLike[str] = "runs",
                 on_events: Callable[[list[dict[str, Any]]], None] | None = None) -> RunResult:
    """Run `sc` with real processes; returns when every process of the run has exited."""
    return Supervisor(sc, run_root, on_events).run()
