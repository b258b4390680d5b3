"""Which Toxiproxy server a run uses, and its lifetime.

Real server first: `TOXIPROXY_URL` (a server someone else runs; we only add
and remove our own proxies on it), else a `toxiproxy-server` executable on
PATH (started on a free loopback port, stopped at the end of the run), else
our embedded Toxiproxy-compatible server (diloco_chaos/chaos/toxiproxy_server/) as its
own process, so that proxying never competes with the supervisor for a GIL.

A server we start is in its own session (a terminal's Ctrl-C goes to the
supervisor, which stops it in order) and dies with the supervisor even if the
supervisor is SIGKILLed (PR_SET_PDEATHSIG). The HTTP client is imported only
when a server is started: scenario validation needs PROXY_MODES and resolve_backend alone.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass

log = logging.getLogger(__name__)

PROXY_MODES = ("auto", "embedded", "off")
"""auto: TOXIPROXY_URL, then toxiproxy-server on PATH, then embedded; embedded: always ours; off: no proxies."""

_PR_SET_PDEATHSIG = 1
_START_TRIES = 3


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def free_port() -> int:
    """A loopback port free right now (it can be taken before it is bound: callers retry)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ToxiproxyBackend:
    """A reachable Toxiproxy API and, if we started it, its process."""

    url: str
    kind: str
    """external (TOXIPROXY_URL), toxiproxy-server (a real one we started) or embedded."""
    version: str
    proc: subprocess.Popen | None = None

    def stop(self, timeout_s: float) -> None:
        """Stop the server if we started it: SIGTERM, then SIGKILL after timeout_s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=timeout_s)


def _spawn(cmd: list[str], url: str, kind: str, ready_s: float, http_timeout_s: float) -> ToxiproxyBackend:
    from diloco_chaos.chaos.toxiproxy_client import ToxiproxyClient, ToxiproxyError

    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=_die_with_parent)
    client = ToxiproxyClient(url, timeout_s=http_timeout_s)
    try:
        version = client.wait_ready(ready_s)
    except ToxiproxyError:
        proc.kill()
        _, err = proc.communicate(timeout=ready_s)
        raise ToxiproxyError(f"{kind} did not come up at {url} within {ready_s}s: "
                             f"{err.decode(errors='replace').strip()[-500:]}") from None
    if proc.stderr is not None:  # nothing reads it from now on; do not let a chatty server block on a full pipe
        proc.stderr.close()
    return ToxiproxyBackend(url, kind, version, proc)


@dataclass(frozen=True)
class BackendChoice:
    """Which server a run's links will use, decided from links.proxy and the environment before anything
    starts (start_backend follows the same decision)."""

    family: str | None
    """"toxiproxy" (a real, upstream server), "embedded" (ours), or None (links.proxy = off)."""
    why: str
    """What decided it, for error messages: e.g. "TOXIPROXY_URL is set"."""
    url: str | None = None
    """TOXIPROXY_URL, when that decided it."""
    exe: str | None = None
    """The toxiproxy-server executable found on PATH, when that decided it."""


def resolve_backend(mode: str) -> BackendChoice:
    """The server links.proxy = `mode` leads to here and now: auto takes TOXIPROXY_URL, then toxiproxy-server on
    PATH, then the embedded server; embedded always takes ours; off none. Starts nothing."""
    if mode == "off":
        return BackendChoice(None, "links.proxy = 'off'")
    if mode == "auto":
        url = os.environ.get("TOXIPROXY_URL")
        if url:
            return BackendChoice("toxiproxy", f"links.proxy = 'auto' and TOXIPROXY_URL is set ({url})", url=url)
        exe = shutil.which("toxiproxy-server")
        if exe:
            return BackendChoice("toxiproxy", f"links.proxy = 'auto' and toxiproxy-server is on PATH ({exe})",
                                 exe=exe)
        return BackendChoice("embedded", "links.proxy = 'auto' and no real server was found")
    return BackendChoice("embedded", f"links.proxy = {mode!r}")


def start_backend(mode: str, seed: int, ready_s: float, http_timeout_s: float) -> ToxiproxyBackend:
    """Find or start the Toxiproxy server for one run. Raises ToxiproxyError if none comes up."""
    from diloco_chaos.chaos.toxiproxy_client import ToxiproxyClient, ToxiproxyError

    if mode not in PROXY_MODES or mode == "off":
        raise ValueError(f"links.proxy = {mode!r}: start_backend needs one of auto, embedded")
    choice = resolve_backend(mode)
    url, exe = choice.url, choice.exe
    if url:
        version = ToxiproxyClient(url, timeout_s=http_timeout_s).wait_ready(ready_s)
        return ToxiproxyBackend(url.rstrip("/"), "external", version)
    if exe:
        last: Exception | None = None
        for _ in range(_START_TRIES):  # a free port can be taken between our probe and its bind
            port = free_port()
            try:
                return _spawn([exe, "-host", "127.0.0.1", "-port", str(port)], f"http://127.0.0.1:{port}",
                              "toxiproxy-server", ready_s, http_timeout_s)
            except ToxiproxyError as e:
                last = e
        raise ToxiproxyError(f"toxiproxy-server at {exe} failed to start: {last}")
    last = None
    for _ in range(_START_TRIES):
        port = free_port()
        cmd = [sys.executable, "-m", "diloco_chaos.chaos.toxiproxy_server", "--host", "127.0.0.1", "--port", str(port),
               "--seed", str(seed), "--log-level", "WARNING"]
        try:
            return _spawn(cmd, f"http://127.0.0.1:{port}", "embedded", ready_s, http_timeout_s)
        except ToxiproxyError as e:
            last = e
    raise ToxiproxyError(f"embedded Toxiproxy server failed to start: {last}")
