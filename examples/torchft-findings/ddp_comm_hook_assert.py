"""Reproduction, without diloco-chaos: torchft's DDP comm hook crashes the surviving replica group with
`AssertionError` (torchft/ddp.py, `assert fut._fut`) when the cross-group allreduce fails, instead of reporting the
error to the Manager and letting `should_commit()` reject the step.

Setup: a torchft Lighthouse (explicit flags, a free port on 127.0.0.1) and 2 replica groups of 1 rank, each a
trainer written the way torchft's README and train_ddp.py show: `Manager` with every timeout explicit,
`ProcessGroupGloo(timeout=...)`, `torchft.ddp.DistributedDataParallel(manager, model)`,
`torchft.optim.OptimizerWrapper(manager, optim)`, `zero_grad()` / forward / `backward()` / `step()`, a tiny MLP on
synthetic regression data. `use_async_quorum=False` so that the quorum is known when `zero_grad()` returns (the
trigger below reads it); the comm hook's code path is the same either way.

The fault is triggered by progress, never by wall time. Both groups start training together (a start barrier
after each Manager exists). Group 1 stands for a slow replica: at the first step from `--fault-step` on whose
quorum holds both groups, it waits before its backward. Group 0 writes a line right before its `backward()` of
that step; its comm hook then runs `Manager.allreduce`, which cannot complete while group 1 holds. When the
parent has seen both lines it hits group 1:

- `--fault kill`: SIGKILL. Group 0's Gloo pair sees "Connection reset by peer" / "Connection closed by peer".
- `--fault freeze --freeze-s N`: SIGSTOP, group 1's hold released, SIGCONT after N s. With N above the Gloo
  timeout (`--gloo-timeout-s`) group 0's allreduce times out; with N below it (the control) group 0 only stalls.

Then the parent waits (bounded) for group 0's outcome: a crash (its exception and traceback, written by the
trainer), or its step's `should_commit()` result and, after a failed commit, two more committed steps (it went on
alone), or the end of its steps. It prints ONE JSON line and exits 0 whether or not the crash reproduced. Every
process it started (Lighthouse, both trainers) is in its own session, dies with the parent (PR_SET_PDEATHSIG)
and is SIGKILLed by process group on every exit path; the JSON lists their pids.

Run it with the interpreter of the torchft under test (its `torchft_lighthouse` is found beside it):

    python examples/torchft-findings/ddp_comm_hook_assert.py --fault kill
    python examples/torchft-findings/ddp_comm_hook_assert.py --fault freeze --freeze-s 8
    python examples/torchft-findings/ddp_comm_hook_assert.py --fault freeze --freeze-s 1   # control
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
POLL_S = 0.02
"""How often the parent reads the trainers' progress files (a condition polled with a deadline)."""


# -- the trainer (one replica group, one rank) ------------------------------------------------------------------


def _emit(path: Path, **fields: Any) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({"t": time.monotonic(), **fields}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _wait_file(path: Path, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s} s")
        threading.Event().wait(POLL_S)


def trainer(a: argparse.Namespace) -> None:
    """One replica group: README-style torchft DDP training; progress and any crash written to a JSON-lines file."""
    import logging

    import torch
    from torch import nn
    from torchft import Manager, ProcessGroupGloo
    from torchft.ddp import DistributedDataParallel
    from torchft.optim import OptimizerWrapper

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    g, work = a.group, Path(a.work)
    out = work / f"group{g}.jsonl"
    timeout = timedelta(seconds=a.gloo_timeout_s)
    store = torch.distributed.TCPStore("127.0.0.1", a.store_port, 1, is_master=True, wait_for_workers=False,
                                       timeout=timedelta(seconds=30))
    torch.manual_seed(0)  # the same initial weights in both groups
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    teacher = torch.randn(8, 1)
    opt_box: list[Any] = []

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": opt_box[0].state_dict()}

    def load_state_dict(sd: dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        opt_box[0].load_state_dict(sd["optim"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1, load_state_dict=load_state_dict,
        state_dict=state_dict, use_async_quorum=False, replica_id=f"ddp_repro_{g}", rank=0, world_size=1,
        store_addr="127.0.0.1", store_port=a.store_port, lighthouse_addr=a.lighthouse, hostname="127.0.0.1",
        timeout=timeout, quorum_timeout=timedelta(seconds=a.quorum_timeout_s),
        connect_timeout=timedelta(seconds=a.gloo_timeout_s), init_sync=False)
    ddp = DistributedDataParallel(manager, model)
    optimizer = OptimizerWrapper(manager, torch.optim.SGD(ddp.parameters(), lr=0.05))
    opt_box.append(optimizer)
    _emit(out, ev="ready", pid=os.getpid())
    _wait_file(work / "go", 60.0, "start signal")
    held = False
    try:
        while manager.current_step() < a.steps:
            optimizer.zero_grad()  # start_quorum: with use_async_quorum=False the quorum is formed on return
            step = manager.current_step()
            participants = manager.num_participants()
            _emit(out, ev="quorum", step=step, participants=participants)
            gen = torch.Generator().manual_seed(1000 * g + step)
            x = torch.randn(16, 8, generator=gen)
            loss = nn.functional.mse_loss(ddp(x), x @ teacher)
            if g == 1 and not held and step >= a.fault_step and participants == 2:
                held = True  # the slow replica: group 0 waits for it inside its allreduce
                _emit(out, ev="held", step=step)
                _wait_file(work / "release", 60.0, "release")
            _emit(out, ev="backward", step=step, participants=participants)
            loss.backward()  # torchft's comm hook: Manager.allreduce of each bucket
            optimizer.step()  # should_commit(); steps the inner optimizer only if the step is committed
            err = manager.errored()
            _emit(out, ev="step", step=step, committed=manager.current_step() > step, after=manager.current_step(),
                  errored=None if err is None else repr(getattr(err, "original_exception", err))[:300])
        _emit(out, ev="done", step=manager.current_step())
    except BaseException as e:  # noqa: BLE001 - the reproduction reports whatever ends the trainer
        frames = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(e.__traceback__)]
        _emit(out, ev="crash", type=type(e).__name__, message=str(e)[:500], frames=frames,
              traceback=traceback.format_exc()[-3000:])
        sys.stderr.flush()
        os._exit(1)  # torchft's threads (heartbeats, futures) would keep the interpreter alive
    finally:
        del store
    sys.stderr.flush()
    os._exit(0)


# -- the parent: Lighthouse, two trainers, the fault, the verdict ------------------------------------------------


@dataclass
class Result:
    """The one JSON line the reproduction prints."""

    mode: str
    freeze_s: float | None
    gloo_timeout_s: float
    torchft: str
    """The installed distribution and version, "torchft 0.2.0" or "torchft-nightly 2026.10.26"."""
    torch: str
    reproduced: bool = False
    """Group 0 crashed with AssertionError raised in torchft/ddp.py."""
    crash: dict[str, Any] | None = None
    """Group 0's crash: type, message, `at` (the innermost torchft/ddp.py frame, file:line), `innermost`."""
    failed_commit_then_continued: bool = False
    """Group 0's faulted step was not committed (should_commit False) and it committed later steps alone."""
    outcome: str = "undecided"
    """crash_assert_ddp | crash_other | failed_commit_continued | failed_commit | committed | timeout | error."""
    fault_step: int | None = None
    fault_step_committed: bool | None = None
    fault_step_errored: str | None = None
    """group 0's Manager.errored() after its faulted step (what it reported to the manager)."""
    stall_s: float | None = None
    """Group 0: its backward of the faulted step to that step's result (or to its crash)."""
    group0_steps: int = 0
    """Group 0's last manager step reached."""
    commits_after_fault: int = 0
    gloo_error: str | None = None
    """The first 'got exception waiting for work' line group 0's torchft logged."""
    pids: dict[str, int] = field(default_factory=dict)
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    alive_after: list[int] = field(default_factory=list)
    """Pids still alive after the cleanup (empty unless the cleanup failed)."""
    elapsed_s: float = 0.0
    error: str | None = None
    """Why the reproduction itself could not decide (a start that failed, a bound that passed)."""
    work_dir: str | None = None
    """Kept with --keep: the trainers' progress files and stderr."""


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6").prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _version() -> str:
    from importlib import metadata

    for dist in ("torchft", "torchft-nightly"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


class Run:
    """The processes of one reproduction, all killed by `close` however it ends."""

    def __init__(self, a: argparse.Namespace, work: Path) -> None:
        self.a, self.work = a, work
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.seen: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
        self._offsets = {0: 0, 1: 0}
        self.faulted = False
        """The fault was sent: from then on the trainers' exits are outcomes, not failures of the reproduction."""
        self.thaw: tuple[float, int] | None = None
        """(monotonic time, pid): a frozen group's SIGCONT, sent by the first poll at or after that time."""

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        err = open(self.work / f"{name}.stderr", "wb")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True,
                             preexec_fn=_die_with_parent, env={**os.environ, "OMP_NUM_THREADS": "1"})
        err.close()
        self.procs[name] = p
        return p

    def lighthouse(self, port: int) -> None:
        script = shutil.which("torchft_lighthouse", path=os.path.dirname(sys.executable))
        if script is None:
            raise RuntimeError(f"torchft_lighthouse not found beside {sys.executable}")
        self.spawn("lighthouse", [script, "--min_replicas", "1", "--join_timeout_ms", "1000",
                                  "--heartbeat_timeout_ms", "1000", "--quorum_tick_ms", "100",
                                  "--bind", f"127.0.0.1:{port}"])
        self.until(lambda: self._accepts(port), self.a.start_timeout_s, "the Lighthouse's port")

    @staticmethod
    def _accepts(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    def poll(self) -> None:
        if self.thaw is not None and time.monotonic() >= self.thaw[0]:
            os.killpg(self.thaw[1], signal.SIGCONT)
            self.thaw = None
        for g in (0, 1):
            path = self.work / f"group{g}.jsonl"
            if not path.exists():
                continue
            with open(path) as f:
                f.seek(self._offsets[g])
                data = f.read()
            lines = data.split("\n")
            whole = lines[:-1]  # a line still being written waits for the next poll
            self._offsets[g] += sum(len(x) + 1 for x in whole)
            self.seen[g].extend(json.loads(x) for x in whole if x)

    def events(self, g: int, ev: str) -> list[dict[str, Any]]:
        return [e for e in self.seen[g] if e["ev"] == ev]

    def until(self, cond: Any, timeout_s: float, what: str) -> Any:
        """Poll the trainers' files until `cond()` is true; a trainer or the Lighthouse exiting first, or the
        bound passing, raises with `what`."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.poll()
            value = cond()
            if value:
                return value
            dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
            if dead and not self.exits_expected(dead):
                self.poll()
                value = cond()
                if value:
                    return value
                raise RuntimeError(f"{', '.join(sorted(dead))} exited ({dead}) while waiting for {what}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
            threading.Event().wait(POLL_S)

    def exits_expected(self, dead: dict[str, int | None]) -> bool:
        """After the fault, group 1's end is the fault's and group 0's is its outcome."""
        return self.faulted and set(dead) <= {"group0", "group1"}

    def close(self) -> tuple[dict[str, int | None], list[int]]:
        """SIGKILL every process group started (all of them, also on errors), reap them, return the exit codes
        and any pid still alive."""
        for p in self.procs.values():
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        alive = []
        for p in self.procs.values():
            try:
                os.kill(p.pid, 0)
                alive.append(p.pid)
            except ProcessLookupError:
                pass
        return {n: p.returncode for n, p in self.procs.items()}, alive


def _ddp_frame(frames: list[list[Any]]) -> str | None:
    hits = [f for f in frames if f[0].replace(os.sep, "/").endswith("torchft/ddp.py")]
    return f"torchft/ddp.py:{hits[-1][1]}" if hits else None


def _gloo_error(work: Path) -> str | None:
    path = work / "group0.stderr"
    if not path.exists():
        return None
    for line in path.read_text(errors="replace").splitlines():
        if "got exception waiting for work" in line:
            return line.split("got exception waiting for work", 1)[1].strip()[:300]
    return None


def reproduce(a: argparse.Namespace, res: Result, run: Run) -> None:
    lh_port = _free_port()
    run.lighthouse(lh_port)
    me = [sys.executable, os.path.abspath(__file__), "--child", "--work", str(run.work),
          "--lighthouse", f"http://127.0.0.1:{lh_port}", "--steps", str(a.steps), "--fault-step", str(a.fault_step),
          "--gloo-timeout-s", str(a.gloo_timeout_s), "--quorum-timeout-s", str(a.quorum_timeout_s)]
    for g in (0, 1):
        run.spawn(f"group{g}", [*me, "--group", str(g), "--store-port", str(_free_port())])
    res.pids = {n: p.pid for n, p in run.procs.items()}
    run.until(lambda: run.events(0, "ready") and run.events(1, "ready"), a.start_timeout_s, "both trainers ready")
    (run.work / "go").touch()
    held = run.until(lambda: run.events(1, "held"), a.start_timeout_s, "group 1 to reach the fault step")
    step = held[0]["step"]
    res.fault_step = step
    b0 = run.until(lambda: [e for e in run.events(0, "backward") if e["step"] == step], 30.0,
                   f"group 0's backward of step {step}")[0]
    victim = run.procs["group1"]
    run.faulted = True
    if a.fault == "kill":
        os.killpg(victim.pid, signal.SIGKILL)
    else:
        os.killpg(victim.pid, signal.SIGSTOP)
        (run.work / "release").touch()
        assert a.freeze_s is not None
        run.thaw = (time.monotonic() + a.freeze_s, victim.pid)  # the fault's duration, not a synchronisation

    def settled() -> bool:
        crash = run.events(0, "crash")
        if crash:
            return True
        mine = [e for e in run.events(0, "step") if e["step"] >= step]
        if not mine:
            return False
        if mine[0]["committed"]:
            return True
        later = [e for e in mine[1:] if e["committed"]]
        return len(later) >= 2 or bool(run.events(0, "done"))

    bound = a.gloo_timeout_s * 3 + a.quorum_timeout_s + (a.freeze_s or 0) + 10
    run.until(settled, bound, "group 0's outcome")
    crash = run.events(0, "crash")
    mine = [e for e in run.events(0, "step") if e["step"] >= step]
    steps = run.events(0, "step")
    res.group0_steps = max([e["after"] for e in steps], default=0)
    if crash:
        try:  # its own exit (code 1) after writing the crash, before the cleanup's SIGKILL
            run.procs["group0"].wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        c = crash[0]
        at = _ddp_frame(c["frames"])
        inner = c["frames"][-1] if c["frames"] else None
        res.crash = {"type": c["type"], "message": c["message"], "at": at,
                     "innermost": None if inner is None else f"{inner[0]}:{inner[1]} in {inner[2]}",
                     "traceback": c["traceback"]}
        res.reproduced = c["type"] == "AssertionError" and at is not None
        res.outcome = "crash_assert_ddp" if res.reproduced else "crash_other"
        res.stall_s = round(c["t"] - b0["t"], 3)
    if mine:
        first = mine[0]
        res.fault_step_committed = bool(first["committed"])
        res.fault_step_errored = first["errored"]
        res.stall_s = round(first["t"] - b0["t"], 3)
        res.commits_after_fault = sum(1 for e in mine[1:] if e["committed"])
        if not first["committed"]:
            res.failed_commit_then_continued = res.commits_after_fault > 0
            res.outcome = "failed_commit_continued" if res.failed_commit_then_continued else "failed_commit"
        elif not crash:
            res.outcome = "committed"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fault", choices=("kill", "freeze"), default="kill")
    p.add_argument("--freeze-s", type=float, default=None, help="freeze length (default: 2 x the Gloo timeout)")
    p.add_argument("--gloo-timeout-s", type=float, default=3.0,
                   help="ProcessGroupGloo(timeout=), Manager timeout and connect_timeout")
    p.add_argument("--quorum-timeout-s", type=float, default=15.0)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--fault-step", type=int, default=3)
    p.add_argument("--start-timeout-s", type=float, default=60.0, help="bound on starting (torch imports)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (progress files, stderr)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--group", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--work", default="", help=argparse.SUPPRESS)
    p.add_argument("--lighthouse", default="", help=argparse.SUPPRESS)
    p.add_argument("--store-port", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        trainer(a)
        return 0
    if a.fault == "freeze" and a.freeze_s is None:
        a.freeze_s = 2 * a.gloo_timeout_s
    import torch

    t0 = time.monotonic()
    res = Result(mode=a.fault, freeze_s=a.freeze_s if a.fault == "freeze" else None, gloo_timeout_s=a.gloo_timeout_s,
                 torchft=_version(), torch=torch.__version__)
    work = Path(tempfile.mkdtemp(prefix="ddp-hook-repro-"))
    run = Run(a, work)

    def on_signal(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # the finally below kills every process

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        reproduce(a, res, run)
    except Exception as e:  # noqa: BLE001 - reported in the JSON line; the run still exits 0
        res.error = f"{type(e).__name__}: {e}"
        if res.outcome == "undecided":
            res.outcome = "timeout" if isinstance(e, TimeoutError) else "error"
    finally:
        res.exit_codes, res.alive_after = run.close()
        res.gloo_error = _gloo_error(work)
        res.elapsed_s = round(time.monotonic() - t0, 2)
        if a.keep:
            res.work_dir = str(work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(asdict(res)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
