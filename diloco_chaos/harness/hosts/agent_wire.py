"""The messages between the supervisor and a remote host agent (`[launch] hosts = "remote"`), as typed records.

Why typed: the connection crosses machines, so every message is parsed once at the boundary into one of the
dataclasses below (`decode` checks its kind and each field's type, and raises AgentProtocolError naming what is
wrong) and the code on either side handles records, never loose dicts. The framing is one JSON object per line
(`{"kind": ..., fields...}`), at most MAX_LINE bytes.

A connection: the agent sends Hello (a nonce), the client answers Auth (the HMAC of
diloco_chaos/harness/wire/handshake.py over
the nonce, under the agents' shared secret), the agent sends Welcome or Refused. Then the client sends
requests one at a time (Clock, Start, Pids, Signal, Stop) and the agent answers each with its reply (ClockReply,
Started, PidsReply, SignalReply, Stopped, or Failed). Unprompted, the agent also sends Events (new lines of the
workers' event log, in order) and Exited (torchrun ended; every event written before it has been sent first).

The run's secret travels in Start sealed (`seal`): XORed with an HMAC-SHA256 keystream under the agents' secret
and a fresh nonce, so a reader of the network does not learn it. The rest of the connection is authenticated
once, at connect, not per message, and not encrypted: use it on a network you trust (docs/multi-host.md).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Protocol

MAX_LINE = 1 << 20
"""Longest line either side accepts (a Start carries the pickled scenario: a few KiB)."""
AUTH_ID = -2
"""The id signed in a remote agent's challenge (learner ids are >= 0; the local agent signs -1)."""


class AgentProtocolError(ValueError):
    """A line that is not one of the messages below, or a field of the wrong type; the message says which."""


@dataclass(frozen=True)
class Hello:
    """Agent -> client, first: prove you hold the agents' secret."""

    nonce: str
    """16 random bytes, hex."""


@dataclass(frozen=True)
class Auth:
    """Client -> agent: the proof."""

    mac: str
    """diloco_chaos/harness/wire/handshake.py sign_challenge(secret, nonce, AUTH_ID)."""


@dataclass(frozen=True)
class Welcome:
    """Agent -> client: authenticated."""

    agent_pid: int
    work_dir: str
    """This connection's directory on the agent's host (spec, workers' events, torchrun's log)."""


@dataclass(frozen=True)
class Refused:
    """Agent -> client: authentication failed; the agent closes the connection."""

    why: str


@dataclass(frozen=True)
class Clock:
    """Client -> agent: what is your CLOCK_MONOTONIC now (the clock the workers' events' `t` is on)."""


@dataclass(frozen=True)
class ClockReply:
    now: float


@dataclass(frozen=True)
class Start:
    """Client -> agent: write this learner's spec and start its torchrun (ending any earlier one first)."""

    learner: int
    chips: int
    """--nproc-per-node."""
    rdzv_port: int
    """torchrun's c10d rendezvous port on the host's loopback."""
    spec: str
    """The pickled ChipSpec, base64, with its secret_hex empty (the agent fills in `run_dir` and the secret)."""
    sealed_secret: str
    """The run's secret, `seal`ed under the agents' secret with `seal_nonce`, hex."""
    seal_nonce: str


@dataclass(frozen=True)
class Started:
    torchrun_pid: int


@dataclass(frozen=True)
class Pids:
    """Client -> agent: the live workers' pids, by local rank."""


@dataclass(frozen=True)
class PidsReply:
    pids: list[int]


@dataclass(frozen=True)
class Signal:
    """Client -> agent: signal these workers (and, with `children`, their descendants); only workers of the
    connection's torchrun may be named."""

    pids: list[int]
    signal: str
    """SIGKILL, SIGSTOP, SIGCONT or SIGTERM."""
    children: bool


@dataclass(frozen=True)
class SignalReply:
    hit: list[int]


@dataclass(frozen=True)
class Stop:
    """Client -> agent: end the learner's torchrun and its workers with this signal (the supervisor stopping a
    failed learner's survivors, or the run)."""

    signal: str


@dataclass(frozen=True)
class Stopped:
    signalled: list[int]


@dataclass(frozen=True)
class Failed:
    """Agent -> client: the request was refused or failed; why."""

    why: str


@dataclass(frozen=True)
class Events:
    """Agent -> client, unprompted: complete lines the workers appended to their event log, in order."""

    lines: list[str]


@dataclass(frozen=True)
class Exited:
    """Agent -> client, unprompted: the learner's torchrun ended with this exit code (negative: a signal)."""

    torchrun_pid: int
    """Which torchrun (a restarted learner's earlier one may report after its successor started)."""
    code: int


Message = (Hello | Auth | Welcome | Refused | Clock | ClockReply | Start | Started | Pids | PidsReply | Signal
           | SignalReply | Stop | Stopped | Failed | Events | Exited)
KINDS: dict[str, type] = {c.__name__.lower(): c for c in typing.get_args(Message)}
_HINTS = {c: typing.get_type_hints(c) for c in KINDS.values()}


def _ok(value: Any, hint: Any) -> bool:
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(_ok(v, item) for v in value)
    raise TypeError(f"unsupported field type {hint}")  # pragma: no cover - a message declared wrongly


def encode(msg: Message) -> bytes:
    """One line."""
    return json.dumps({"kind": type(msg).__name__.lower(), **dataclasses.asdict(msg)}).encode() + b"\n"


def decode(line: bytes) -> Message:
    """The message of one line; AgentProtocolError if it is none, or a field is missing, unknown or mistyped."""
    try:
        raw = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AgentProtocolError(f"not JSON: {e}") from e
    if not isinstance(raw, dict):
        raise AgentProtocolError("a message must be a JSON object")
    kind = raw.pop("kind", None)
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise AgentProtocolError(f"unknown message kind; known: {', '.join(KINDS)}")
    hints = _HINTS[cls]
    if set(raw) != set(hints):
        raise AgentProtocolError(f"{cls.__name__}: fields {sorted(raw)}, expected {sorted(hints)}")
    for name, hint in hints.items():
        if not _ok(raw[name], hint):
            raise AgentProtocolError(f"{cls.__name__}.{name} = {raw[name]!r:.80}: must be {_name(hint)}")
    if cls is ClockReply:
        raw["now"] = float(raw["now"])
    return typing.cast(Message, cls(**raw))


def _name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) and not isinstance(hint, types.GenericAlias) else str(hint)


class LineReader(Protocol):
    def readline(self, size: int = -1, /) -> bytes: ...


def read(f: LineReader) -> Message | None:
    """The next message (None at end of stream); AgentProtocolError for a bad or over-long line."""
    line = f.readline(MAX_LINE + 1)
    if not line:
        return None
    if len(line) > MAX_LINE or not line.endswith(b"\n"):
        raise AgentProtocolError(f"line longer than {MAX_LINE} bytes, or cut short")
    return decode(line)


def expect(msg: Message | None, cls: type[Any]) -> Any:
    """`msg` if it is a `cls`; else AgentProtocolError (a Failed or Refused one says the agent's reason)."""
    if isinstance(msg, cls):
        return msg
    if isinstance(msg, (Failed, Refused)):
        raise AgentProtocolError(msg.why)
    raise AgentProtocolError(f"expected {cls.__name__}, got {type(msg).__name__ if msg else 'end of stream'}")


def parse_agent(address: str) -> tuple[str, int]:
    """"host:port" (IPv6 in brackets) -> (host, port); ValueError saying what is wrong."""
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r}: must be host:port")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"{address!r}: port must be in [1, 65535]")
    return host, int(port)


def _keystream(key: bytes, nonce: bytes, n: int) -> bytes:
    out = b""
    block = 0
    while len(out) < n:
        out += hmac.new(key, b"diloco-chaos seal" + nonce + block.to_bytes(4, "big"), hashlib.sha256).digest()
        block += 1
    return out[:n]


def seal(key: bytes, nonce: bytes, data: bytes) -> bytes:
    """`data` XOR an HMAC-SHA256 keystream under `key` and `nonce` (a fresh nonce per message); its own inverse."""
    return bytes(a ^ b for a, b in zip(data, _keystream(key, nonce, len(data)), strict=True))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as e:
        raise AgentProtocolError(f"not base64: {e}") from e
