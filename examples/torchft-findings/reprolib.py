"""Shared plumbing for the standalone torchft reproductions in this folder: torch and torchft only, no diloco_chaos.

What it does, for the parent script:
- starts a real torchft Lighthouse, the `torchft_lighthouse` console script beside this interpreter, on a free
  127.0.0.1 port, with --min_replicas, --join_timeout_ms, --heartbeat_timeout_ms and --quorum_tick_ms explicit,
  and waits until its port accepts;
- forks trainer processes from itself after torch and torchft are imported once (a fork costs milliseconds, a
  fresh interpreter importing torch costs seconds on 2 shared cores). Each child is its own session and process
  group, gets torchft's environment (TORCHFT_LIGHTHOUSE, REPLICA_GROUP_ID, RANK, WORLD_SIZE, MASTER_ADDR/PORT,
  TORCHFT_MANAGER_PORT), has stdout and stderr (torchft's Rust log) in a file, and dies with the parent
  (PR_SET_PDEATHSIG), so a parent killed by a test's timeout leaves nothing either;
- waits on a condition over the children's JSON-lines records, always with a deadline;
- kills every process group it started on every exit path (a `with Cluster(...)` block, SIGTERM included);
- prints the one JSON line each script ends with.
For the child (trainers.py): `Recorder`, the JSON-lines writer that also copies torchft's Python loggers.
Why: each script must show one behaviour of torchft itself, bounded in time, and leave no process behind.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
POLL_S = 0.05


class Broken(RuntimeError):
    """The setup itself failed (a process did not start, a port did not open): the script exits non-zero."""


def torchft_version() -> str:
    for dist in ("torchft", "torchft-nightly"):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    raise Broken("torchft is not installed in this interpreter")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _lighthouse_child_setup() -> None:
    _die_with_parent()


def alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


@dataclass
class Child:
    label: str
    pid: int
    popen: subprocess.Popen[bytes] | None = None
    rc: int | None = None

    def poll(self) -> int | None:
        if self.rc is not None:
            return self.rc
        if self.popen is not None:
            self.rc = self.popen.poll()
            return self.rc
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            self.rc = -1
            return self.rc
        if pid:
            self.rc = os.waitstatus_to_exitcode(status)
        return self.rc


@dataclass
class Cluster:
    """Every process one reproduction starts, its records, and their end. Use as a context manager."""

    name: str
    keep: bool = False
    dir: Path = field(init=False)
    children: list[Child] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"tft-{self.name}-"))

    def __enter__(self) -> Cluster:
        signal.signal(signal.SIGTERM, _raise_exit)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- processes ---------------------------------------------------------------------------------------------

    def lighthouse(self, label: str, *, port: int, min_replicas: int, join_ms: int, heartbeat_ms: int,
                   tick_ms: int = 100, ready_s: float = 60.0) -> Child:
        """Start torchft_lighthouse on 127.0.0.1:port and wait (at most ready_s) until it accepts connections."""
        exe = Path(sys.executable).parent / "torchft_lighthouse"
        if not exe.exists():
            raise Broken(f"no torchft_lighthouse beside {sys.executable}")
        log = open(self.dir / f"{label}.log", "ab")
        cmd = [str(exe), "--bind", f"127.0.0.1:{port}", "--min_replicas", str(min_replicas),
               "--join_timeout_ms", str(join_ms), "--heartbeat_timeout_ms", str(heartbeat_ms),
               "--quorum_tick_ms", str(tick_ms)]
        env = {**os.environ, "RUST_BACKTRACE": "1"}
        popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                 start_new_session=True, preexec_fn=_lighthouse_child_setup)
        log.close()
        child = Child(label, popen.pid, popen)
        self.children.append(child)
        deadline = time.monotonic() + ready_s
        while True:
            if child.poll() is not None:
                raise Broken(f"{label} exited {child.rc}: {self.text(label)[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise Broken(f"{label} did not accept on port {port} within {ready_s} s") from None
                time.sleep(POLL_S)
        return child

    def fork(self, label: str, fn: Callable[..., None], env: dict[str, str], *args: Any) -> Child:
        """Fork a child that runs fn(*args) in its own session with env added; its output goes to label.log."""
        log_path = self.dir / f"{label}.log"
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # child: never returns
            code = 1
            try:
                os.setsid()
                _die_with_parent()
                fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.close(fd)
                os.environ.update(env)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                fn(*args)
                code = 0
            except BaseException:  # noqa: B036 - the child reports any failure in its log and exits non-zero
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        child = Child(label, pid)
        self.children.append(child)
        return child

    def signal(self, child: Child, sig: int) -> None:
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            os.kill(child.pid, sig)

    def kill(self, child: Child, timeout_s: float = 30.0) -> None:
        """SIGKILL child's process group and reap it."""
        self.signal(child, signal.SIGKILL)
        self.wait_exit(child, timeout_s)

    def wait_exit(self, child: Child, timeout_s: float) -> int:
        self.wait(lambda: child.poll() is not None, timeout_s, f"{child.label} to exit")  # rc 0 is falsy
        return int(child.rc) if child.rc is not None else -1

    def close(self) -> None:
        for child in self.children:
            if child.poll() is None:
                self.signal(child, signal.SIGCONT)
                self.signal(child, signal.SIGKILL)
        for child in self.children:
            deadline = time.monotonic() + 30
            while child.poll() is None and time.monotonic() < deadline:
                time.sleep(POLL_S)
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    def left_alive(self) -> list[int]:
        return [c.pid for c in self.children if alive(c.pid)]

    # --- records ------------------------------------------------------------------------------------------------

    def records(self, label: str | None = None) -> list[dict[str, Any]]:
        """Every complete JSON line the children wrote (label.jsonl), in file order per child."""
        out: list[dict[str, Any]] = []
        files = [self.dir / f"{label}.jsonl"] if label else sorted(self.dir.glob("*.jsonl"))
        for path in files:
            try:
                data = path.read_text()
            except FileNotFoundError:
                continue
            for line in data.splitlines(keepends=True):
                if line.endswith("\n"):
                    out.append(json.loads(line))
        return out

    def text(self, label: str) -> str:
        try:
            return (self.dir / f"{label}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait(self, cond: Callable[[], Any], timeout_s: float, what: str) -> Any:
        """Poll cond until it returns something truthy (returned) or timeout_s passes (TimeoutError)."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = cond()
            if got:
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout_s} s for {what}")
            time.sleep(POLL_S)

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def touch(self, name: str) -> None:
        (self.dir / name).touch()


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


class Recorder:
    """Child side: JSON lines to <dir>/<label>.jsonl, with torchft's Python loggers copied in as `log` records."""

    LOGGERS = ("torchft_quorums", "torchft_commits", "torchft_errors", "torchft.manager", "torchft.local_sgd",
               "torchft.checkpointing.http_transport")

    def __init__(self, path: Path, **base: Any) -> None:
        self._f = open(path, "a", buffering=1)
        self._base = base
        self.commits: list[bool] = []  # torchft_commits' commit_result, in order

    def emit(self, ev: str, **kw: Any) -> None:
        rec = {"t": round(time.time(), 3), "ev": ev, "pid": os.getpid(), **self._base, **kw}
        self._f.write(json.dumps(rec, default=str) + "\n")

    def capture_torchft_logs(self) -> None:
        import logging

        recorder = self
        std = set(vars(logging.LogRecord("x", 0, "", 0, "", None, None))) | {"message", "asctime"}

        class Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                extra = {k: v for k, v in vars(record).items() if k not in std}
                if record.name == "torchft_commits" and "commit_result" in extra:
                    recorder.commits.append(bool(extra["commit_result"]))
                recorder.emit("log", logger=record.name, level=record.levelname, msg=record.getMessage(), **extra)

        for name in self.LOGGERS:
            lg = logging.getLogger(name)
            lg.setLevel(logging.INFO)
            lg.addHandler(Handler())
            lg.propagate = False


def wait_file(path: Path, timeout_s: float) -> None:
    """Child side: block until path exists (the parent's go-ahead), at most timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path.name} within {timeout_s} s")
        time.sleep(POLL_S)


def report(finding: str, reproduced: bool, cluster: Cluster | None, **facts: Any) -> None:
    """Print the one JSON line a script ends with."""
    line: dict[str, Any] = {"finding": finding, "reproduced": reproduced, "torchft": torchft_version()}
    line.update(facts)
    if cluster is not None:
        line["pids"] = cluster.pids()
        line["seconds"] = cluster.now()
    print(json.dumps(line, default=str), flush=True)


def main(finding: str, body: Callable[[Cluster, dict[str, Any]], bool]) -> int:
    """Run body(cluster, facts) in a Cluster, always close it, then print the JSON line with the facts body set.

    body returns whether the finding reproduced. Exit status 0 either way; 2 only when the setup broke.
    An awaited record that never comes (TimeoutError) means torchft did not behave as the script expects:
    reproduced false, with the facts gathered until then and what was awaited.
    """
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch  # noqa: F401  - imported once here, so forked trainers start without importing it
    import torchft  # noqa: F401
    import torchft.local_sgd  # noqa: F401

    cluster = Cluster(finding, keep=bool(os.environ.get("REPRO_KEEP")))
    facts: dict[str, Any] = {}
    reproduced, code = False, 0
    try:
        with cluster:
            reproduced = body(cluster, facts)
    except Broken as e:
        facts["broken"], code = str(e), 2
    except TimeoutError as e:
        facts["stopped"] = str(e)
    report(finding, reproduced, cluster, **facts, left_alive=cluster.left_alive(),
           kept=str(cluster.dir) if cluster.keep else None)
    return code
