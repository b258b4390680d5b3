"""Frames after the handshake are signed: forged, replayed, reordered, reflected and unsigned frames are
rejected as BadMac, over a real socket pair; any mutation of a frame is rejected or leaves its meaning."""

from __future__ import annotations

import socket
import struct
import zlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from diloco_chaos.harness.wire.frame_auth import TAG_BYTES, FrameAuth
from diloco_chaos.harness.wire.framing import (
    HEADER,
    BadFlags,
    BadMac,
    FrameError,
    Message,
    MsgType,
    decode_frame,
    encode,
    recv_message,
    send_message,
)

SECRET, NONCE, LEARNER = b"k" * 32, b"n" * 16, 3
MAX = 1 << 20
T = 5.0


def ends() -> tuple[FrameAuth, FrameAuth]:
    return FrameAuth.for_learner(SECRET, NONCE, LEARNER), FrameAuth.for_syncer(SECRET, NONCE, LEARNER)


def ping(seq: int) -> Message:
    return Message(MsgType.PING, {"learner": LEARNER, "seq": seq, "t": 1.5})


def push(values: list[float]) -> Message:
    meta = {"learner": LEARNER, "fragment": 0, "base_version": 0, "c_steps": 4, "c_tokens": 64, "first_step": 0,
            "last_step": 3, "step_time_s": 0.1}
    return Message(MsgType.PUSH, meta, {"w": torch.tensor(values, dtype=torch.float32)})


@pytest.fixture
def pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def recrc(frame: bytearray) -> bytes:
    """The frame with its CRC made right again: what a deliberate forger does."""
    struct.pack_into(">I", frame, HEADER.size - 4, zlib.crc32(frame[HEADER.size:], zlib.crc32(frame[:HEADER.size - 4])))
    return bytes(frame)


def test_signed_frames_round_trip_in_order(pair: tuple[socket.socket, socket.socket]) -> None:
    learner, syncer = ends()
    for i in range(3):
        send_message(pair[0], ping(i), T, learner)
    got = [recv_message(pair[1], MAX, T, auth=syncer).meta["seq"] for _ in range(3)]
    assert got == [0, 1, 2]
    assert (learner.sent, syncer.received) == (3, 3)
    send_message(pair[1], ping(9), T, syncer)  # and the other way, with the other key
    assert recv_message(pair[0], MAX, T, auth=learner).meta["seq"] == 9


def test_a_forged_tag_is_rejected_even_with_a_good_checksum(pair: tuple[socket.socket, socket.socket]) -> None:
    learner, syncer = ends()
    frame = bytearray(encode(ping(0), learner))
    frame[-1] ^= 0x01
    pair[0].sendall(recrc(frame))
    with pytest.raises(BadMac, match="wrong tag"):
        recv_message(pair[1], MAX, T, auth=syncer)


def test_a_changed_message_with_its_old_tag_is_rejected(pair: tuple[socket.socket, socket.socket]) -> None:
    learner, syncer = ends()
    frame = bytearray(encode(push([1.0, 2.0]), learner))
    at = len(frame) - TAG_BYTES - 4  # inside the last float: the value changes, the tag stays
    frame[at] ^= 0x40
    pair[0].sendall(recrc(frame))
    with pytest.raises(BadMac):
        recv_message(pair[1], MAX, T, auth=syncer)


def test_replayed_and_reordered_frames_are_rejected(pair: tuple[socket.socket, socket.socket]) -> None:
    learner, syncer = ends()
    first, second = encode(ping(0), learner), encode(ping(1), learner)
    pair[0].sendall(first + first)
    assert recv_message(pair[1], MAX, T, auth=syncer).meta["seq"] == 0
    with pytest.raises(BadMac):
        recv_message(pair[1], MAX, T, auth=syncer)  # the replay
    learner2, syncer2 = ends()
    first, second = encode(ping(0), learner2), encode(ping(1), learner2)
    pair[0].sendall(second)
    with pytest.raises(BadMac):
        recv_message(pair[1], MAX, T, auth=syncer2)  # frame 1 before frame 0


def test_a_reflected_frame_and_another_connections_frame_are_rejected(
        pair: tuple[socket.socket, socket.socket]) -> None:
    learner, _ = ends()
    pair[0].sendall(encode(ping(0), learner))
    with pytest.raises(BadMac):
        recv_message(pair[1], MAX, T, auth=FrameAuth.for_learner(SECRET, NONCE, LEARNER))  # its own key back
    other = FrameAuth.for_learner(SECRET, b"m" * 16, LEARNER)  # another handshake's nonce
    pair[0].sendall(encode(ping(0), other))
    with pytest.raises(BadMac):
        recv_message(pair[1], MAX, T, auth=ends()[1])


def test_unsigned_after_and_signed_before_the_handshake_are_rejected(
        pair: tuple[socket.socket, socket.socket]) -> None:
    learner, syncer = ends()
    pair[0].sendall(encode(ping(0)))
    with pytest.raises(BadMac, match="unsigned"):
        recv_message(pair[1], MAX, T, auth=syncer)
    with pytest.raises(BadFlags, match="signed frame"):
        decode_frame(encode(ping(0), learner), MAX)


def test_an_empty_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="secret"):
        FrameAuth.for_learner(b"", NONCE, LEARNER)


floats = st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=16)


@settings(max_examples=60, deadline=None)
@given(values=floats, signed=st.booleans(), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 7)),
                                                          min_size=1, max_size=4))
def test_a_mutated_frame_is_rejected_or_means_the_same(values: list[float], signed: bool,
                                                       flips: list[tuple[int, int]]) -> None:
    """Bit flips anywhere in a frame: decoding raises a FrameError, or (flips that cancel out) gives back the
    very message that was sent. Nothing else escapes, and no changed meaning is accepted."""
    msg = push(values)
    frame = bytearray(encode(msg, ends()[0] if signed else None))
    intact = decode_frame(frame, MAX) if not signed else _decode_signed(bytes(frame))
    assert intact.meta == msg.meta  # the frame is valid before it is mutated: a rejection below is the mutation's
    for pos, bit in flips:
        frame[pos % len(frame)] ^= 1 << bit
    try:
        got = decode_frame(frame, MAX) if not signed else _decode_signed(bytes(frame))
    except FrameError:
        return
    assert got.type is msg.type and got.meta == msg.meta
    assert torch.equal(got.tensors["w"], msg.tensors["w"])


def _decode_signed(frame: bytes) -> Message:
    a, b = socket.socketpair()
    try:
        a.sendall(frame)
        a.shutdown(socket.SHUT_WR)
        return recv_message(b, MAX, T, auth=ends()[1])
    finally:
        a.close()
        b.close()
