"""A Toxiproxy server shared by several runs (TOXIPROXY_URL): an exclusive lock per server URL, and the
`ToxiproxyServer` record the pytest plugin's `toxiproxy` fixture yields.

Why: with a shared server every run would create the same proxy names (learner-<i>), so runs on it take turns;
a file lock in the temp directory is shared by every pytest-xdist worker on the machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from diloco_chaos.harness.config.scenario import Scenario

LOCK_POLL_S = 0.1
"""Seconds between tries of a held lock."""


class _ServerLock:
    """An exclusive, cross-process lock per Toxiproxy URL (a file lock shared by every xdist worker on the
    machine), re-entrant within a process: a test holding it through `toxiproxy` can still make runs."""

    _guard = threading.Lock()
    _held: dict[str, list[Any]] = {}  # url -> [fd, count]

    @classmethod
    def path(cls, url: str) -> Path:
        digest = hashlib.sha1(url.rstrip("/").encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"diloco-chaos-toxiproxy-{digest}.lock"

    @classmethod
    @contextlib.contextmanager
    def hold(cls, url: str, wait_s: float | None) -> Iterator[None]:
        key = url.rstrip("/")
        with cls._guard:
            held = cls._held.get(key)
            if held is not None:
                held[1] += 1
        if held is None:
            fd = os.open(cls.path(key), os.O_RDWR | os.O_CREAT, 0o666)
            deadline = None if wait_s is None else time.monotonic() + max(0.0, wait_s)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if deadline is not None and time.monotonic() >= deadline:
                        os.close(fd)
                        pytest.fail(f"waited {wait_s:.0f} s for the shared Toxiproxy server at {key} "
                                    "(TOXIPROXY_URL): another test's run holds it; runs sharing one server "
                                    "take turns because their proxy names (learner-<i>) are fixed", pytrace=False)
                    time.sleep(LOCK_POLL_S)
            with cls._guard:
                cls._held[key] = [fd, 1]
        try:
            yield
        finally:
            with cls._guard:
                entry = cls._held[key]
                entry[1] -= 1
                if entry[1] == 0:
                    del cls._held[key]
                    fcntl.flock(entry[0], fcntl.LOCK_UN)
                    os.close(entry[0])


def _shared_url(sc: Scenario) -> str | None:
    """The TOXIPROXY_URL this run would share with others, if any (links.proxy auto only)."""
    return (os.environ.get("TOXIPROXY_URL") or None) if sc.links.proxy == "auto" else None


@dataclass
class ToxiproxyServer:
    """A Toxiproxy server for one test. `kind`: external (TOXIPROXY_URL, held exclusively for the test),
    toxiproxy-server or embedded (started for the test). `client` is a
    diloco_chaos.chaos.toxiproxy_client.ToxiproxyClient."""

    url: str
    kind: str
    version: str
    client: Any

    def create_proxy(self, name: str, upstream: str, listen: str = "127.0.0.1:0") -> Any:
        """A proxy on this server (removed at teardown); returns its ProxyInfo (`listen_port`)."""
        return self.client.create_proxy(name, upstream, listen=listen)
