"""Shared helpers for the harness's own tests."""

from __future__ import annotations

import os
import socketserver
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from diloco_chaos.harness.config.scenario import Scenario, from_dict
from diloco_chaos.harness.record.events import STRICT_ENV

os.environ.setdefault(STRICT_ENV, "1")
"""Every event a test's runs write is checked against its record (diloco_chaos/harness/record) as it is written, so each
test that runs the real processes also checks that the emitters match the schema (docs/events.md)."""


def tiny_table(algorithm: str = "decoupled", learners: int = 2, chips: int = 2, steps: int = 60,
               **extra: Any) -> dict[str, Any]:
    """A scenario table small enough for a 2-core machine: a few seconds of training."""
    table: dict[str, Any] = {
        "name": f"tiny-{algorithm}",
        "seed": 1,
        "algorithm": algorithm,
        "topology": {"learners": learners, "chips_per_learner": chips},
        "train": {"steps": steps, "warmup_steps": 10, "lr": 3e-3},
        "diloco": {"fragments": 4, "sync_every": 4, "overlap": 1},
        "eval": {"every_s": 1.0, "batches": 2},
        "timeouts": {"run_s": 240.0},
    }
    for key, value in extra.items():
        table.setdefault(key, {}).update(value) if isinstance(value, dict) else table.__setitem__(key, value)
    return table


def tiny(algorithm: str = "decoupled", **kw: Any) -> Scenario:
    return from_dict(tiny_table(algorithm, **kw))


@pytest.fixture
def runs_dir(tmp_path):
    return tmp_path / "runs"


ECHO_SOCK_TIMEOUT_S = 5.0
"""Bound on every socket call of the echo upstream (and of the tests that talk to it)."""


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.settimeout(ECHO_SOCK_TIMEOUT_S)
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except OSError:
            pass


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    """A threaded TCP echo server on loopback: the upstream behind a Toxiproxy proxy. Yields 'host:port'."""
    srv = _EchoServer(("127.0.0.1", 0), _EchoHandler)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
    thread.join(ECHO_SOCK_TIMEOUT_S)


def _zero(tp: Any) -> Any:
    """A placeholder value of a record field's type, for a field a hand-built test event does not care about."""
    import enum
    import types
    import typing
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return None if type(None) in typing.get_args(tp) else _zero(typing.get_args(tp)[0])
    if origin is typing.Literal:
        return typing.get_args(tp)[0]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return next(iter(tp)).value
    return {list: [], dict: {}, float: 0.0, int: 0, str: "", bool: False}.get(origin or tp)


def complete(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Hand-built test events made whole: t/wall/pid/proc default to 0.0/0.0/0/"test", and every required field
    of the kind's record that the test left out gets a placeholder of its type (None where the type admits it).
    Fields the test gives are kept as they are, so an unknown or mistyped one still fails `parse`."""
    from diloco_chaos.harness.record.base import REGISTRY, hints, required
    out = []
    for e in evs:
        cls = REGISTRY[e["ev"]]
        full = {"t": 0.0, "wall": 0.0, "pid": 0, "proc": "test", **e}
        h = hints(cls)
        for name in required(cls) - full.keys():
            full[name] = _zero(h[name])
        out.append(full)
    return out


def as_records(evs: list[dict[str, Any]]) -> list[Any]:
    """Hand-built test events as their typed records (see `complete`), for the readers that take records."""
    from diloco_chaos.harness.record import parse
    return [parse(e) for e in complete(evs)]
