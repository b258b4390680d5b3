"""torchft's Lighthouse for one run: started on its own free port with every flag explicit, bound to the run's
listen address (127.0.0.1; on netns hosts the bridge's address in the root namespace, where every group's
namespace reaches it), waited for until its port accepts (bounded by timeouts.startup_s), its stderr in the
run's logs/lighthouse.stderr, and always stopped (its process group SIGTERMed, then SIGKILLed after
timeouts.shutdown_s).

Why a console script: `torchft_lighthouse` (installed with torchft next to the interpreter) hands the process's
own argv to the Rust argument parser, so it cannot be started as `python -c` or `python -m` (the parser would
see those flags). Starting it imports torch: 1-2 s on an idle box, up to ~20 s under load (a condition with a
timeout, never a fixed sleep).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.run.procutil import die_with_parent
from diloco_chaos.harness.run.rundir import stderr_file

PROC = "lighthouse"
"""Its name in processes.json and logs/."""
POLL_S = 0.05
"""How often readiness is probed."""


class LighthouseFailed(RuntimeError):
    """The Lighthouse could not be started or did not become ready in time; the message says which."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel gives free now (a small race with other programs is accepted: the start fails loudly)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def lighthouse_command(sc: Scenario, host: str, port: int) -> list[str]:
    """The command line: the console script beside this interpreter (else on PATH) with explicit flags."""
    script = shutil.which("torchft_lighthouse", path=os.path.dirname(sys.executable)) or shutil.which(
        "torchft_lighthouse")
    if script is None:
        raise LighthouseFailed("torchft_lighthouse not found beside the interpreter nor on PATH "
                               "(pip install 'diloco-chaos[torchft]')")
    t = sc.torchft
    return [script, "--min_replicas", str(t.min_replicas), "--join_timeout_ms", str(round(t.join_timeout_s * 1000)),
            "--heartbeat_timeout_ms", str(round(t.heartbeat_timeout_s * 1000)),
            "--quorum_tick_ms", str(t.quorum_tick_ms), "--bind", f"{host}:{port}"]


class Lighthouse:
    """One Lighthouse process (`start`, then `stop` however the run ends)."""

    def __init__(self, sc: Scenario, run_dir: Path, host: str = "127.0.0.1") -> None:
        self.sc = sc
        self.run_dir = run_dir
        self.host = host
        """Where it listens and the managers dial it."""
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_s = 0.0

    @property
    def address(self) -> str:
        """What the managers are given (TORCHFT_LIGHTHOUSE)."""
        return f"http://{self.host}:{self.port}"

    def start(self, port: int = 0) -> None:
        """Start it (on `port`, 0: a free one) and return once its port accepts; LighthouseFailed if it exits or
        startup_s passes first. A Lighthouse restarted after a `kill_syncer` gets its predecessor's port, which
        the managers keep dialling (the Rust listener binds with SO_REUSEADDR, so the port is free again at once)."""
        self.port = port or free_port(self.host)
        log = stderr_file(self.run_dir, PROC)
        log.parent.mkdir(exist_ok=True)
        t0 = time.monotonic()
        parent = os.getpid()
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(lighthouse_command(self.sc, self.host, self.port),
                                         stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True,
                                         preexec_fn=lambda: die_with_parent(parent),  # the kernel kills it with us
                                         env={**os.environ, "RUST_BACKTRACE": "1"})
        deadline = t0 + self.sc.timeouts.startup_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise LighthouseFailed(f"the lighthouse exited with code {code} before it was ready (see {log})")
            try:
                with socket.create_connection((self.host, self.port), timeout=POLL_S * 4):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise LighthouseFailed(f"the lighthouse's port {self.port} did not accept within timeouts.startup_s "
                                       f"= {self.sc.timeouts.startup_s}s (see {log})")
            time.sleep(POLL_S)  # polling a condition (the port) with a deadline, not synchronising on time
        self.ready_s = time.monotonic() - t0

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def exitcode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def join(self, timeout: float | None = None) -> None:
        """Wait for it to exit (at most `timeout`): with pid, exitcode and is_alive, what the supervisor's
        registry of the run's processes (processes.json, stopping them) needs."""
        if self.proc is not None:
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass

    def stop(self) -> None:
        """SIGTERM its process group, SIGKILL it after timeouts.shutdown_s; safe to call twice."""
        p = self.proc
        if p is None or p.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, self.sc.timeouts.shutdown_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                return
            try:
                p.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                continue
