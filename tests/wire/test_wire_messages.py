"""Tests for diloco_chaos/harness/wire/messages.py: every message the project sends fits its type's schema, every
malformed one is refused on decode with the wire's BadMessage, and a live syncer that receives one closes only that
connection, logs why, and goes on serving the others.

Why: a frame with intact framing but a missing or wrong-typed field (a HELLO whose learner id is a list, null
or Infinity; a META without its step) used to kill the syncer's reader thread, leaking its socket without an
`auth_failed` event, or stop the syncer's main loop with a KeyError.
"""

from __future__ import annotations

import json
import math
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from diloco_chaos.harness.record.events import EventLog
from diloco_chaos.harness.syncer.fragment_checkpoint import state_to_message
from diloco_chaos.harness.syncer.service import SyncerService
from diloco_chaos.harness.wire.convert import grads_request, merged_to_message, params_request, push_to_message
from diloco_chaos.harness.wire.frame_auth import FrameAuth
from diloco_chaos.harness.wire.framing import (
    BadMessage,
    BadPayload,
    ConnectionClosed,
    FrameError,
    Message,
    MsgType,
    decode_frame,
    encode,
    recv_message,
    send_message,
)
from diloco_chaos.harness.wire.handshake import new_nonce, sign_challenge
from diloco_chaos.harness.wire.messages import SCHEMAS
from diloco_chaos.trainers.messages import FragmentPush
from tests.conftest import tiny

MAX = 1 << 20
WAIT_S = 10.0
"""Bound on every wait and socket call here."""
SECRET = b"s" * 32


def _round_trip(msg: Message) -> Message:
    return decode_frame(encode(msg), MAX)


def _sent_by_the_project() -> list[Message]:
    """One message of every kind the project sends, built the way its senders build them."""
    push = FragmentPush(1, 2, 3, 4, 512, 5, 8, 0.125, {"w": torch.ones(2)}, final=True)
    ping = {"learner": 1, "seq": 7, "t": 1234.5}
    return [
        Message(MsgType.HELLO, {"learner": 1, "proto": 1}), Message(MsgType.HELLO, {"learner": 0}),
        Message(MsgType.CHALLENGE, {"nonce": new_nonce().hex()}),
        Message(MsgType.AUTH, {"learner": 1, "sig": sign_challenge(SECRET, new_nonce(), 1)}),
        Message(MsgType.WELCOME, {"algorithm": "decoupled"}), Message(MsgType.WELCOME, {"connects": 2}),
        Message(MsgType.REJECT, {"reason": "bad credentials"}),
        push_to_message(push, 3), push_to_message(push), push_to_message(FragmentPush(0, 1, 0, 0, 0, 1, 0, 0.0, {})),
        merged_to_message(2, 5, {"w": torch.ones(2)}, 8), merged_to_message(2, 5, {"w": torch.ones(2)}),
        Message(MsgType.PULL, {"fragment": 1, "round": 4}),
        Message(MsgType.META, {"learner": 1, "step": 9, "step_time_s": 0.2}),
        Message(MsgType.STOP, {"total": 120}),
        grads_request(1, 3, 256, {"g": torch.ones(2)}), Message(MsgType.GRADS_AVG, {"step": 3}),
        params_request(1, 2, 8, 256, {"p": torch.ones(2)}), Message(MsgType.PARAMS_MERGED, {"round": 2}),
        Message(MsgType.RESUME, {"step": 40}),
        Message(MsgType.ERROR, {"step": 3, "detail": "timed out"}), Message(MsgType.ERROR, {"round": 2, "detail": "x"}),
        Message(MsgType.HEARTBEAT, {}), Message(MsgType.PING, ping), Message(MsgType.PONG, ping),
        Message(MsgType.BYE, {"learner": 1}), Message(MsgType.BYE, {"flush_timeout_s": 2.0}),
        Message(MsgType.BYE, {"threads": {"relay": 0.5}, "cpu_s": 1.25}),
        state_to_message({"fragment": 1, "version": 3, "round_id": 2, "params": {"w": torch.ones(2)},
                          "momentum": {}, "clock": 9, "reported_step": {"0": 9}, "merged_into": {}}),
    ]


def test_every_type_has_a_schema() -> None:
    assert set(SCHEMAS) == set(MsgType)


@pytest.mark.parametrize("msg", _sent_by_the_project(), ids=lambda m: m.type.name)
def test_what_the_project_sends_is_accepted(msg: Message) -> None:
    got = _round_trip(msg)
    assert got.type is msg.type and got.meta == msg.meta


INF = float("inf")
MALFORMED: list[tuple[MsgType, dict[str, Any]]] = [
    (MsgType.HELLO, {"learner": [1]}),
    (MsgType.HELLO, {"learner": None}),
    (MsgType.HELLO, {"learner": INF}),
    (MsgType.HELLO, {"learner": -1}),
    (MsgType.HELLO, {"learner": 2**63}),
    (MsgType.HELLO, {"learner": True}),
    (MsgType.HELLO, {"learner": "1"}),
    (MsgType.HELLO, {"learner": 1.0}),
    (MsgType.HELLO, {}),
    (MsgType.HELLO, {"learner": 1, "proto": "1"}),
    (MsgType.CHALLENGE, {"nonce": "not hex"}),
    (MsgType.CHALLENGE, {"nonce": "ab"}),
    (MsgType.AUTH, {"learner": 1, "sig": 5}),
    (MsgType.AUTH, {"learner": 1}),
    (MsgType.AUTH, {"learner": {"x": 1}, "sig": "0" * 64}),
    (MsgType.WELCOME, {"connects": -1}),
    (MsgType.REJECT, {"reason": ["x"]}),
    (MsgType.META, {"learner": 1, "step_time_s": 0.1}),
    (MsgType.META, {"learner": 1, "step": 3, "step_time_s": math.nan}),
    (MsgType.META, {"learner": 1, "step": 3, "step_time_s": INF}),
    (MsgType.META, {"learner": 1, "step": 3, "step_time_s": -0.5}),
    (MsgType.META, {"learner": 1, "step": 3, "step_time_s": 10**400}),
    (MsgType.PULL, {"fragment": "0", "round": 1}),
    (MsgType.PULL, {"fragment": 0}),
    (MsgType.PING, {"learner": 0, "seq": 1, "t": -INF}),
    (MsgType.PONG, {"learner": 0, "seq": None, "t": 1.0}),
    (MsgType.STOP, {"total": "all"}),
    (MsgType.RESUME, {}),
    (MsgType.GRADS, {"learner": 0, "step": 1}),
    (MsgType.GRADS_AVG, {"step": [1]}),
    (MsgType.PARAMS, {"learner": 0, "round": 1.5, "step": 1, "tokens": 1}),
    (MsgType.PARAMS_MERGED, {}),
    (MsgType.ERROR, {"detail": "neither step nor round"}),
    (MsgType.ERROR, {"step": 1, "round": 1}),
    (MsgType.BYE, {"flush_timeout_s": -1.0}),
    (MsgType.BYE, {"threads": []}),
    (MsgType.FRAGMENT, {"fragment": 0, "version": None}),
    (MsgType.FRAGMENT, {"fragment": 0, "version": 1, "pulled_step": "3"}),
    (MsgType.PUSH, {**push_to_message(FragmentPush(0, 1, 0, 0, 0, 1, 0, 0.0, {}), 3).meta, "round": "3"}),
    (MsgType.PUSH, {**push_to_message(FragmentPush(0, 1, 0, 0, 0, 1, 0, 0.0, {}), 3).meta, "final": 1}),
    (MsgType.FRAGMENT_STATE, {"fragment": 0}),
]


@pytest.mark.parametrize(("msg_type", "meta"), MALFORMED, ids=lambda v: v.name if isinstance(v, MsgType) else None)
def test_malformed_metadata_is_bad_message(msg_type: MsgType, meta: dict[str, Any]) -> None:
    with pytest.raises(BadMessage, match=msg_type.name) as info:
        _round_trip(Message(msg_type, meta))
    assert info.value.kind == "bad_message"
    assert isinstance(info.value, BadPayload) and isinstance(info.value, FrameError)


def test_undeclared_keys_are_carried_through() -> None:
    meta = {"learner": 1, "step": 3, "step_time_s": 0.5, "extra": [1, {"x": None}]}
    assert _round_trip(Message(MsgType.META, meta)).meta == meta


# --------------------------------------------------------------------------- a live syncer


class _WatchedLog(EventLog):
    """The run's real event log, which also lets a test wait (bounded) for an event."""

    def __init__(self, path: str) -> None:
        super().__init__(path, "syncer")
        self.events: list[dict[str, Any]] = []
        self._cv = threading.Condition()

    def _append(self, kind: str, fields: dict[str, Any]) -> str:
        """The writer's one write path (typed records and the chaos layer's `named` both end here): keep each
        event as the line written decodes."""
        text = super()._append(kind, fields)
        with self._cv:
            self.events.append(json.loads(text))
            self._cv.notify_all()
        return text

    def wait_for(self, pred: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        with self._cv:
            assert self._cv.wait_for(lambda: any(pred(e) for e in self.events), timeout=WAIT_S), self.events
            return next(e for e in self.events if pred(e))


@pytest.fixture
def syncer(tmp_path) -> Iterator[tuple[SyncerService, _WatchedLog]]:
    """A real SyncerService (decoupled, 2 learners) serving in a thread; stopped and joined afterwards."""
    events = _WatchedLog(str(tmp_path / "events.jsonl"))
    sc = tiny(timeouts={"liveness_s": 8.0, "connect_s": WAIT_S})
    svc = SyncerService(sc, str(tmp_path), SECRET, events)
    stop = threading.Event()
    thread = threading.Thread(target=svc.serve, args=(stop,), name="test-syncer", daemon=True)
    thread.start()
    try:
        yield svc, events
    finally:
        stop.set()
        thread.join(timeout=WAIT_S)
        events.close()
    assert not thread.is_alive()


def _connect(svc: SyncerService) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", svc.port), timeout=WAIT_S)
    sock.settimeout(WAIT_S)
    return sock


_KEYS: dict[socket.socket, FrameAuth] = {}
"""The frame keys of each connection that passed the handshake (every frame after it is signed)."""


def _join(svc: SyncerService, learner: int) -> socket.socket:
    """Connect and pass the handshake as learner `learner`, as diloco_chaos/harness/learner/syncer_link.py does."""
    sock = _connect(svc)
    send_message(sock, Message(MsgType.HELLO, {"learner": learner, "proto": 1}), WAIT_S)
    challenge = recv_message(sock, MAX, WAIT_S)
    nonce = bytes.fromhex(challenge.meta["nonce"])
    send_message(sock, Message(MsgType.AUTH, {"learner": learner, "sig": sign_challenge(SECRET, nonce, learner)}),
                 WAIT_S)
    assert recv_message(sock, MAX, WAIT_S).type is MsgType.WELCOME
    _KEYS[sock] = FrameAuth.for_learner(SECRET, nonce, learner)
    return sock


def _expect_closed(sock: socket.socket) -> None:
    """The syncer closed this connection: reading ends (EOF or reset) within the bound, no frame in between
    but what it had queued."""
    with pytest.raises((ConnectionClosed, ConnectionResetError, BrokenPipeError)):
        while True:
            recv_message(sock, 64 << 20, WAIT_S, auth=_KEYS.get(sock))


def _pong(sock: socket.socket, seq: int) -> None:
    """Ping over `sock` and wait for its echo, skipping whatever else the syncer sends meanwhile."""
    ping = {"learner": 0, "seq": seq, "t": 1.5}
    send_message(sock, Message(MsgType.PING, ping), WAIT_S, _KEYS[sock])
    while (msg := recv_message(sock, 64 << 20, WAIT_S, auth=_KEYS[sock])).type is not MsgType.PONG:
        pass
    assert msg.meta == ping


@pytest.mark.parametrize("learner", [[1], None, INF, -1], ids=["list", "null", "infinity", "negative"])
def test_hostile_hello_closes_only_its_connection(syncer: tuple[SyncerService, _WatchedLog], learner: Any) -> None:
    svc, events = syncer
    good = _join(svc, 0)
    try:
        hostile = _connect(svc)
        try:
            send_message(hostile, Message(MsgType.HELLO, {"learner": learner}), WAIT_S)
            failed = events.wait_for(lambda e: e["ev"] == "auth_failed")
            assert failed["kind"] == "bad_message" and "learner" in failed["error"], failed
            _expect_closed(hostile)
        finally:
            hostile.close()
        closed = events.wait_for(lambda e: e["ev"] == "conn_closed" and e["reason"] == "handshake failed")
        # closed and forgotten; the connections the syncer still holds are all open
        assert all(c.peer != closed["peer"] and c.sock.fileno() != -1 for c in list(svc.conns.values()))
        _pong(good, 1)  # the other connection is still served
        _join(svc, 1).close()  # and the syncer still accepts new ones
    finally:
        good.close()
    assert not any(e["ev"] == "syncer_error" for e in events.events)


def test_authenticated_peer_sending_what_only_the_syncer_sends_is_cut_off(
        syncer: tuple[SyncerService, _WatchedLog]) -> None:
    """A signed, well-formed WELCOME from a learner: it used to be logged as unexpected and the connection kept.
    Learners never send it, so the reader refuses it (`wrong_direction`) and closes that connection alone."""
    svc, events = syncer
    good = _join(svc, 0)
    try:
        hostile = _join(svc, 1)
        try:
            send_message(hostile, Message(MsgType.WELCOME, {"algorithm": "decoupled"}), WAIT_S, _KEYS[hostile])
            rejected = events.wait_for(lambda e: e["ev"] == "frame_rejected")
            assert rejected["learner"] == 1 and rejected["kind"] == "wrong_direction", rejected
            assert rejected["peer"] == f"127.0.0.1:{hostile.getsockname()[1]}"
            _expect_closed(hostile)
        finally:
            hostile.close()
        events.wait_for(lambda e: e["ev"] == "conn_closed" and e["reason"] == "rejected frame: wrong_direction")
        _pong(good, 3)
    finally:
        good.close()
    assert not any(e["ev"] in ("syncer_error", "unexpected_message") for e in events.events)


def test_authenticated_peer_with_a_malformed_meta_is_cut_off(syncer: tuple[SyncerService, _WatchedLog]) -> None:
    """A META without its step, from a learner that passed the handshake: once, this stopped the syncer's main
    loop with a KeyError. Now the reader refuses the frame and closes that connection alone."""
    svc, events = syncer
    good = _join(svc, 0)
    try:
        hostile = _join(svc, 1)
        try:
            send_message(hostile, Message(MsgType.META, {"learner": 1, "step_time_s": 0.1}), WAIT_S, _KEYS[hostile])
            rejected = events.wait_for(lambda e: e["ev"] == "frame_rejected")
            assert rejected["learner"] == 1 and rejected["kind"] == "bad_message", rejected
            assert "'step'" in rejected["error"]
            _expect_closed(hostile)
        finally:
            hostile.close()
        events.wait_for(lambda e: e["ev"] == "learner_leave" and e["learner"] == 1)
        _pong(good, 2)
        assert svc.alive() == frozenset({0})
    finally:
        good.close()
    assert svc.frames_rejected == 1
    assert not any(e["ev"] == "syncer_error" for e in events.events)


@pytest.mark.parametrize("frame", ["unsigned", "forged", "replayed"])
def test_an_authenticated_peer_sending_an_unauthenticated_frame_is_cut_off(
        syncer: tuple[SyncerService, _WatchedLog], frame: str) -> None:
    """After the handshake every frame is signed: an unsigned, forged or replayed one (the CRC right each time)
    closes that connection alone, logged as bad_mac."""
    svc, events = syncer
    good = _join(svc, 0)
    try:
        hostile = _join(svc, 1)
        try:
            ping = Message(MsgType.PING, {"learner": 1, "seq": 1, "t": 1.5})
            if frame == "unsigned":
                send_message(hostile, ping, WAIT_S)
            elif frame == "forged":
                send_message(hostile, ping, WAIT_S, FrameAuth.for_learner(b"not the run's secret", b"n" * 16, 1))
            else:
                signed = encode(ping, _KEYS[hostile])
                hostile.sendall(signed + signed)
            rejected = events.wait_for(lambda e: e["ev"] == "frame_rejected")
            assert rejected["learner"] == 1 and rejected["kind"] == "bad_mac", rejected
            _expect_closed(hostile)
        finally:
            hostile.close()
        _pong(good, 3)
    finally:
        good.close()
    assert svc.frames_rejected == 1
    assert not any(e["ev"] == "syncer_error" for e in events.events)
