"""A hostile peer of a live syncer: connections that send malformed, forged or replayed frames, each bounded.

Why: the wire's checks (`diloco_chaos/harness/wire/framing.py`, `diloco_chaos/harness/wire/frame_auth.py`,
`diloco_chaos/harness/wire/messages.py`) are tested
frame by frame, but the promise that matters is the syncer's: a hostile frame from any peer, with or without
the run's secret, closes that one connection with a logged reason, never stops the syncer, and leaks no
socket, while the real learners go on training and their pushes are merged. `tests/wire/test_hostile_peers.py`
and `bench/fuzz.py --live` attack a real run with the same `attack` (`diloco_chaos/harness/testing/hostile_run.py`).

Two families of attack, one connection each (`KINDS`):

* unauthenticated (no secret needed): garbage, a truncated header, a length over the limit, a bad CRC, a
  version we do not speak, a signed frame before the handshake, a first frame that is not HELLO, a HELLO
  whose learner id is a list, null, Infinity, negative or past int64, a learner id past the run's, a wrong
  challenge answer, an AUTH naming another learner;
* authenticated (with the secret): the handshake passes as learner `HostileConfig.learner`, then a frame
  with flipped bits (CRC left, or made right again), a wrong key, no tag, an unknown flag, an unknown type,
  a missing or ill-typed field, tensor sizes that do not add up, a replay of the frame before, and
  well-formed PUSHes that must not be merged (NaN values, wrong shapes, wrong dtype, a tensor missing, another
  learner's id), and a WELCOME, which only the syncer sends.

A peer holding the secret is trusted as the learner it names, and the syncer keeps one connection per
learner: each authenticated attack *replaces* that real learner's connection (its link reconnects at once,
and the syncer forgets its pending pushes, as for any reconnect). Aim them at one learner to spare the others;
`attack` spreads them between the unauthenticated ones, so that the learner is mostly back before the next,
and makes an attempt again when the learner's reconnect replaced it before its frame went.

A WELCOME is refused by the syncer's reader (a type learners never send: `wrong_direction`). Frames the wire
accepts but the algorithm refuses (the PUSHes: `push_rejected` or `push_superseded`) leave the connection
open, as a learner's push based on an old version does; the peer then half-closes it, and the syncer ends it
on the clean close. Every attempt ends with a half-close and a read until the syncer's close (EOF or
reset): `Attempt.closed_by_syncer`.
"""

from __future__ import annotations

import json
import math
import random
import socket
import struct
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from diloco_chaos.harness.wire.frame_auth import FrameAuth
from diloco_chaos.harness.wire.framing import (
    FLAG_MAC,
    HEADER,
    MAGIC,
    VERSION,
    ConnectionClosed,
    FrameError,
    Message,
    MsgType,
    encode,
    recv_message,
)
from diloco_chaos.harness.wire.handshake import new_secret, sign_challenge

__all__ = ["KINDS", "PUSH_TOKENS", "Attempt", "HostileConfig", "attack", "fix_crc", "mutate", "one", "raw_frame"]

PUSH_TOKENS = 7
"""`c_tokens` of every hostile PUSH: how a test tells them from the learners' in the `push` events."""
_CRC_AT = HEADER.size - 4
_HANDSHAKE_MAX = 4096
_READ_MAX = 64 << 20


@dataclass(frozen=True)
class HostileConfig:
    """Where the syncer is and what the attacker knows."""

    port: int
    """The syncer's TCP port (its `syncer_start` event)."""
    learners: int
    """The run's learner count: ids from it up are out of range."""
    secret: bytes | None = None
    """The run's secret; None: only the unauthenticated attacks are made."""
    learner: int = 0
    """The learner id the authenticated attacks claim (its real connection is replaced by each)."""
    host: str = "127.0.0.1"
    """The syncer's address (runs bind loopback)."""
    timeout_s: float = 5.0
    """Bound on every connect, send and receive, and on waiting for the syncer's close."""


@dataclass(frozen=True)
class Attempt:
    """One hostile connection and how it ended, as the attacker saw it."""

    kind: str
    """The attack (a `KINDS` key)."""
    authenticated: bool
    """Whether it passed the handshake with the run's secret first."""
    peer: str
    """The attacker's end, "host:port", as the syncer logs the connection."""
    frames: int
    """Hostile frames sent on it (0 when the syncer closed it before the hostile frame could go)."""
    closed_by_syncer: bool
    """The syncer closed the connection (EOF or reset) within `timeout_s` of the attacker's half-close."""
    detail: str = ""
    """What went wrong on the attacker's side, if anything (the handshake refused, a send failed)."""
    opened: float = 0.0
    """Monotonic time before connecting (the clock of the run's events)."""
    ended: float = 0.0
    """Monotonic time the attacker saw the close (or gave up waiting). Between the two, this peer address is
    this attempt's: the kernel reuses client ports, so a later connection may log the same one."""


class _Peer:
    """The attacker's end of one connection: its socket, keys after the handshake, and a random source."""

    def __init__(self, sock: socket.socket, cfg: HostileConfig, rng: random.Random,
                 known: dict[str, Message] | None = None) -> None:
        self.sock, self.cfg, self.rng = sock, cfg, rng
        self.known: dict[str, Message] = {} if known is None else known
        """What earlier connections of the same attack learnt: the newest FRAGMENT seen ("fragment")."""
        self.auth: FrameAuth | None = None
        self.frames = 0

    def send(self, data: bytes, hostile: bool = True) -> None:
        self.sock.settimeout(self.cfg.timeout_s)
        self.sock.sendall(data)
        self.frames += hostile

    def recv(self) -> Message:
        return recv_message(self.sock, _READ_MAX, self.cfg.timeout_s, auth=self.auth)

    def handshake(self, learner: int, hello_learner: int | None = None, sig: str | None = None) -> MsgType:
        """HELLO (as `hello_learner`, default `learner`), then AUTH as `learner` with `sig` (default: the right
        answer under the secret); returns the syncer's answer type and keeps the keys on WELCOME."""
        hello = learner if hello_learner is None else hello_learner
        self.send(encode(Message(MsgType.HELLO, {"learner": hello, "proto": 1})), hostile=False)
        nonce = bytes.fromhex(self.recv().meta["nonce"])
        if sig is None:
            sig = sign_challenge(self.cfg.secret or new_secret(), nonce, learner)
        self.send(encode(Message(MsgType.AUTH, {"learner": learner, "sig": sig})), hostile=False)
        answer = self.recv().type
        if answer is MsgType.WELCOME and self.cfg.secret is not None:
            self.auth = FrameAuth.for_learner(self.cfg.secret, nonce, learner)
        return answer

    def fragment(self) -> Message:
        """The first FRAGMENT the syncer sends after WELCOME (the joining learner's pull)."""
        deadline = time.monotonic() + self.cfg.timeout_s
        while time.monotonic() < deadline:
            msg = self.recv()
            if msg.type is MsgType.FRAGMENT:
                return msg
        raise TimeoutError("no FRAGMENT after WELCOME")


def raw_frame(msg_type: int, meta: Any, data: bytes = b"", auth: FrameAuth | None = None, flags: int | None = None,
              tensors: list[list[Any]] | None = None) -> bytes:
    """A frame with any type byte, flags and meta (not necessarily an object), signed with `auth` if given,
    with a right CRC: what only a peer writing frames on purpose sends."""
    if isinstance(meta, dict):
        meta = {**meta, "_tensors": tensors or []}
    meta_bytes = json.dumps(meta, separators=(",", ":")).encode()
    body = struct.pack(">I", len(meta_bytes)) + meta_bytes + data
    if flags is None:
        flags = FLAG_MAC if auth is not None else 0
    tag_len = 16 if auth is not None else 0
    head = struct.pack(">4sBBHI", MAGIC, VERSION, msg_type, flags, len(body) + tag_len)
    if auth is not None:
        body += auth.sign(head, body)
    return head + struct.pack(">I", zlib.crc32(body, zlib.crc32(head))) + body


def fix_crc(frame: bytes | bytearray) -> bytes:
    """The frame with its CRC made right again over what its header announces (what a forger does)."""
    out = bytearray(frame)
    if len(out) >= HEADER.size:
        body_end = HEADER.size + struct.unpack_from(">I", out, 8)[0]
        struct.pack_into(">I", out, _CRC_AT, zlib.crc32(out[HEADER.size:body_end], zlib.crc32(out[:_CRC_AT])))
    return bytes(out)


def mutate(frame: bytes, rng: random.Random, forge: bool) -> bytes:
    """1-8 bit flips, a byte run overwritten, the frame cut short or extended; with `forge`, the CRC made right
    again. Shared with `bench/fuzz.py`'s frame fuzzing."""
    out = bytearray(frame)
    how = rng.randrange(4)
    if how == 0:
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    elif how == 1:
        at = rng.randrange(len(out))
        out[at:at + rng.randint(1, 16)] = bytes(rng.randrange(256) for _ in range(16))[: len(out[at:at + 16])]
    elif how == 2:
        del out[rng.randrange(len(out)):]
    else:
        out += bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
    return fix_crc(out) if forge else bytes(out)


def _hello() -> bytes:
    return encode(Message(MsgType.HELLO, {"learner": 0, "proto": 1}))


# -- unauthenticated attacks -----------------------------------------------------------------------------


def _garbage(p: _Peer) -> None:
    p.send(bytes(p.rng.randrange(256) for _ in range(p.rng.randint(1, 512))))


def _truncated_header(p: _Peer) -> None:
    p.send(_hello()[: p.rng.randint(1, HEADER.size - 1)])


def _oversized_length(p: _Peer) -> None:
    p.send(struct.pack(">4sBBHII", MAGIC, VERSION, int(MsgType.HELLO), 0, 0xFFFFFFFF, 0) + b"x" * 64)


def _bad_crc(p: _Peer) -> None:
    frame = bytearray(_hello())
    frame[_CRC_AT] ^= 0x55
    p.send(bytes(frame))


def _bad_version(p: _Peer) -> None:
    frame = bytearray(_hello())
    frame[4] = VERSION + 1
    p.send(fix_crc(frame))


def _signed_before_handshake(p: _Peer) -> None:
    p.send(encode(Message(MsgType.HELLO, {"learner": 0}), FrameAuth.for_learner(new_secret(), b"n" * 16, 0)))


def _not_hello(p: _Peer) -> None:
    p.send(encode(Message(MsgType.META, {"learner": 0, "step": 1, "step_time_s": 0.1})))


_BAD_IDS: list[Any] = [[1], None, math.inf, -1, 2**64, "0", True, 0.5]


def _hello_bad_learner(p: _Peer) -> None:
    p.send(raw_frame(MsgType.HELLO, {"learner": p.rng.choice(_BAD_IDS), "proto": 1}))


def _learner_out_of_range(p: _Peer) -> None:
    p.frames += 1  # the HELLO and AUTH of an id the run does not have
    p.handshake(p.rng.choice([p.cfg.learners, p.cfg.learners + 7, 2**63 - 1]))


def _wrong_answer(p: _Peer) -> None:
    p.frames += 1
    p.handshake(p.cfg.learner, sig=bytes(p.rng.randrange(256) for _ in range(32)).hex())


def _auth_other_learner(p: _Peer) -> None:
    p.frames += 1  # AUTH names another id than HELLO (with that id's right answer when the secret is known)
    p.handshake((p.cfg.learner + 1) % max(2, p.cfg.learners), hello_learner=p.cfg.learner)


# -- authenticated attacks: the handshake passes first ---------------------------------------------------


def _signed(p: _Peer, msg: Message | None = None) -> bytes:
    return encode(msg or Message(MsgType.HEARTBEAT, {}), p.auth)


def _flipped_bits(p: _Peer) -> None:
    frame = bytearray(_signed(p, Message(MsgType.PING, {"learner": p.cfg.learner, "seq": 1, "t": 1.0})))
    frame[p.rng.randrange(HEADER.size, len(frame))] ^= 1 << p.rng.randrange(8)
    p.send(bytes(frame))


def _forged_bits(p: _Peer) -> None:
    frame = bytearray(_signed(p, Message(MsgType.PING, {"learner": p.cfg.learner, "seq": 1, "t": 1.0})))
    frame[p.rng.randrange(HEADER.size, len(frame))] ^= 1 << p.rng.randrange(8)
    p.send(fix_crc(frame))


def _mutated(p: _Peer) -> None:
    p.send(mutate(_signed(p), p.rng, forge=p.rng.random() < 0.5))


def _wrong_key(p: _Peer) -> None:
    p.send(encode(Message(MsgType.HEARTBEAT, {}), FrameAuth.for_learner(new_secret(), b"n" * 16, p.cfg.learner)))


def _unsigned(p: _Peer) -> None:
    p.send(encode(Message(MsgType.HEARTBEAT, {})))


def _unknown_flag(p: _Peer) -> None:
    p.send(raw_frame(MsgType.HEARTBEAT, {}, auth=p.auth, flags=FLAG_MAC | 0x0100))


def _unknown_type(p: _Peer) -> None:
    p.send(raw_frame(p.rng.choice([0, 99, 255]), {}, auth=p.auth))


def _missing_field(p: _Peer) -> None:
    meta = {"learner": p.cfg.learner, "base_version": 0, "c_steps": 1, "c_tokens": 1, "first_step": 0,
            "last_step": 1, "step_time_s": 0.1}  # a PUSH without its fragment
    p.send(raw_frame(MsgType.PUSH, meta, auth=p.auth))


def _ill_typed_field(p: _Peer) -> None:
    step = p.rng.choice([[3], None, "3", -1, 2**64, True, math.nan])
    p.send(raw_frame(MsgType.META, {"learner": p.cfg.learner, "step": step, "step_time_s": 0.1}, auth=p.auth))


def _meta_not_object(p: _Peer) -> None:
    p.send(raw_frame(MsgType.HEARTBEAT, p.rng.choice([[], "x", 7, None]), auth=p.auth))


def _sizes_do_not_add_up(p: _Peer) -> None:
    p.send(raw_frame(MsgType.HEARTBEAT, {}, b"\0" * 8, auth=p.auth, tensors=[["w", "float32", [4], 16]]))


def _replay(p: _Peer) -> None:
    frame = _signed(p)
    p.send(frame, hostile=False)
    p.send(frame)  # the same bytes again: the sequence number moved on


def _push(p: _Peer, tensors: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]],
          learner: int | None = None) -> None:
    frag = p.known.get("fragment")
    fresh = frag is None
    if frag is None:  # the first PUSH of an attack waits for the syncer's pull to learn a fragment's layout
        frag = p.known["fragment"] = p.fragment()
    meta = {"learner": p.cfg.learner if learner is None else learner, "fragment": frag.meta["fragment"],
            "base_version": frag.meta["version"], "c_steps": 1, "c_tokens": PUSH_TOKENS, "first_step": 1,
            "last_step": 1, "step_time_s": 0.01, "final": False, "round": None}
    p.send(encode(Message(MsgType.PUSH, meta, tensors(frag.tensors)), p.auth))
    if not fresh:  # the later ones send at once, on the version seen last, and then read the current one: the
        p.known["fragment"] = p.fragment()  # real learner, reconnecting, soon replaces this connection


def _push_nan(p: _Peer) -> None:
    _push(p, lambda ts: {k: torch.full_like(t, math.nan) for k, t in ts.items()})


def _push_wrong_shape(p: _Peer) -> None:
    _push(p, lambda ts: {k: torch.zeros(t.numel() + 1) for k, t in ts.items()})


def _push_wrong_dtype(p: _Peer) -> None:
    _push(p, lambda ts: {k: torch.zeros(t.shape, dtype=torch.int32) for k, t in ts.items()})


def _push_missing_tensor(p: _Peer) -> None:
    _push(p, lambda ts: dict(list(ts.items())[1:]) if len(ts) > 1 else {})


def _push_other_learner(p: _Peer) -> None:
    _push(p, lambda ts: {k: t.clone() for k, t in ts.items()}, learner=p.cfg.learner + 1)


def _wrong_direction(p: _Peer) -> None:
    p.send(encode(Message(MsgType.WELCOME, {"algorithm": "decoupled"}), p.auth))


KINDS: dict[str, tuple[bool, Callable[[_Peer], None]]] = {
    "garbage": (False, _garbage),
    "truncated header": (False, _truncated_header),
    "oversized length": (False, _oversized_length),
    "bad crc": (False, _bad_crc),
    "bad version": (False, _bad_version),
    "signed before handshake": (False, _signed_before_handshake),
    "not hello": (False, _not_hello),
    "hello bad learner": (False, _hello_bad_learner),
    "learner out of range": (False, _learner_out_of_range),
    "wrong answer": (False, _wrong_answer),
    "auth other learner": (False, _auth_other_learner),
    "push nan": (True, _push_nan),
    "push wrong shape": (True, _push_wrong_shape),
    "push wrong dtype": (True, _push_wrong_dtype),
    "push missing tensor": (True, _push_missing_tensor),
    "push other learner": (True, _push_other_learner),
    "wrong direction": (True, _wrong_direction),
    "flipped bits": (True, _flipped_bits),
    "forged bits": (True, _forged_bits),
    "mutated": (True, _mutated),
    "wrong key": (True, _wrong_key),
    "unsigned": (True, _unsigned),
    "unknown flag": (True, _unknown_flag),
    "unknown type": (True, _unknown_type),
    "missing field": (True, _missing_field),
    "ill-typed field": (True, _ill_typed_field),
    "meta not object": (True, _meta_not_object),
    "sizes do not add up": (True, _sizes_do_not_add_up),
    "replay": (True, _replay),
}
"""Attack name -> (needs the secret and a passed handshake, what it sends after connecting)."""


def _wait_closed(sock: socket.socket, timeout_s: float) -> bool:
    """Half-close, then read (and drop) until the syncer closes: EOF or reset within `timeout_s`."""
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        return True  # already reset by the syncer
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(1 << 16):
                return True
        except TimeoutError:
            return False
        except OSError:  # reset, or any other end of the connection
            return True
    return False


def one(cfg: HostileConfig, kind: str, rng: random.Random, known: dict[str, Message] | None = None) -> Attempt:
    """Open one connection, make the attack `kind`, and wait for the syncer to close it. `known` carries what
    one attempt learnt (a fragment's layout and version) to the next."""
    authenticated, body = KINDS[kind]
    opened = time.monotonic()
    sock = socket.create_connection((cfg.host, cfg.port), timeout=cfg.timeout_s)
    host, port = sock.getsockname()[:2]
    p = _Peer(sock, cfg, rng, known)
    detail = ""
    try:
        try:
            if authenticated:
                answer = p.handshake(cfg.learner)
                if answer is not MsgType.WELCOME:
                    raise ConnectionError(f"handshake answered {answer.name}")
            body(p)
        except (OSError, FrameError, ConnectionClosed, ConnectionError, KeyError, ValueError) as e:
            detail = f"{type(e).__name__}: {e}"
        closed = _wait_closed(sock, cfg.timeout_s)
    finally:
        sock.close()
    return Attempt(kind, authenticated, f"{host}:{port}", p.frames, closed, detail, opened, time.monotonic())


def attack(cfg: HostileConfig, frames: int, seed: int = 0, kinds: Iterable[str] | None = None,
           stop: Callable[[], bool] | None = None, into: list[Attempt] | None = None) -> list[Attempt]:
    """Attempts, one connection each, cycling through `kinds` (default: every kind the config allows; the
    authenticated ones only with a secret) until `frames` hostile frames are sent (at most 2 * frames + 10
    attempts) or `stop()` is true. Each attempt is appended to `into` (returned; a new list by default) as it ends, so
    an error (the syncer refusing connections) leaves the attempts made before it there."""
    wanted = [k for k in (kinds or KINDS) if cfg.secret is not None or not KINDS[k][0]]
    # authenticated attacks spread between the others: each one replaces the real learner's connection, which
    # then reconnects; one right after another would mostly be replaced in turn before its frame is read
    plain, auth = [k for k in wanted if not KINDS[k][0]], [k for k in wanted if KINDS[k][0]]
    names = [k for i in range(max(len(plain), len(auth))) for k in (plain[i:i + 1] + auth[i:i + 1])]
    rng = random.Random(seed)
    out: list[Attempt] = [] if into is None else into
    known: dict[str, Message] = {}
    sent = 0
    i = 0
    while sent < frames and len(out) < 2 * frames + 10 and not (stop is not None and stop()):
        got = one(cfg, names[i % len(names)], rng, known)
        out.append(got)
        sent += got.frames
        i += got.frames > 0  # an attempt cut off before its frame went (replaced by the real learner) is made again
    return out
