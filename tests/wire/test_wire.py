"""Tests for diloco_chaos.harness.wire.framing: framing, rejection of damaged frames, deadlines, and the HMAC handshake.

Why: the wire module is what stands between the learners/synchronizer and a
fault-injecting proxy, so every failure mode is exercised over real sockets
(``socket.socketpair()`` and a TCP loopback listener), never mocks.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from diloco_chaos.harness.wire.framing import (
    HEADER,
    MAGIC,
    VERSION,
    BadChecksum,
    BadFlags,
    BadMagic,
    BadPayload,
    ConnectionClosed,
    FrameError,
    FrameTooLarge,
    Message,
    MsgType,
    Truncated,
    UnknownType,
    decode_frame,
    decode_payload,
    encode,
    recv_message,
    send_message,
)
from diloco_chaos.harness.wire.handshake import new_nonce, new_secret, sign_challenge, verify_challenge

MAX = 64 << 20
TIMEOUT = 10.0

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8]


def _sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen) * 100).to(dtype)
    high = 256 if dtype == torch.uint8 else 2**31 - 1
    return torch.randint(0, high, shape, generator=gen).to(dtype)


def _assert_same(got: Message, want: Message) -> None:
    assert got.type == want.type
    assert isinstance(got.type, MsgType)
    assert got.meta == want.meta
    assert list(got.tensors) == list(want.tensors)
    for name, tensor in want.tensors.items():
        out = got.tensors[name]
        assert out.dtype == tensor.dtype, name
        assert out.shape == tensor.shape, name
        assert torch.equal(out, tensor), name


class _Thread:
    """Run ``fn`` in a worker thread; ``join`` waits for it and re-raises whatever it raised."""

    def __init__(self, fn: Callable[[], object]) -> None:
        pool = ThreadPoolExecutor(max_workers=1)
        self._future = pool.submit(fn)
        pool.shutdown(wait=False)

    def join(self, timeout: float = TIMEOUT) -> None:
        self._future.result(timeout)  # re-raises the worker's exception, or TimeoutError if it hangs


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


@pytest.fixture
def tcp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(client, server-side) connected over TCP on 127.0.0.1, Nagle off."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname(), timeout=TIMEOUT)
        server, _ = listener.accept()
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        yield client, server
    finally:
        client.close()
        server.close()


def _message() -> Message:
    return Message(
        MsgType.FRAGMENT,
        {"learner": 3, "step": 1234, "fragment": 2, "version": 9, "loss": 0.25, "tags": ["a", "ü"],
         "nested": {"x": None}},
        {"w": _sample(torch.float32, (64, 32)), "b": _sample(torch.bfloat16, (32,), seed=1)},
    )


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_each_dtype_over_socketpair(
    pair: tuple[socket.socket, socket.socket], dtype: torch.dtype
) -> None:
    a, b = pair
    msg = Message(
        MsgType.PARAMS,
        {"dtype": str(dtype), "learner": 0, "round": 3, "step": 7, "tokens": 64},
        {
            "matrix": _sample(dtype, (5, 7)),
            "scalar": _sample(dtype, (), seed=2),
            "empty": torch.empty((0, 3), dtype=dtype),
            "transposed": _sample(dtype, (4, 6), seed=3).t(),  # not contiguous on the sender side
        },
    )
    sent = send_message(a, msg, TIMEOUT)
    assert sent == len(encode(msg))
    got = recv_message(b, MAX, TIMEOUT)
    _assert_same(got, msg)
    assert all(t.is_contiguous() for t in got.tensors.values())


def test_round_trip_all_dtypes_and_metadata_over_tcp(tcp_pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = tcp_pair
    tensors = {f"t_{str(d).split('.')[-1]}": _sample(d, (3, 2, 5), seed=i) for i, d in enumerate(DTYPES)}
    tensors["special"] = torch.tensor([float("inf"), -float("inf"), -0.0, 1e-40])
    # Several MiB, so the kernel buffers fill and both ends must loop.
    tensors["big"] = _sample(torch.float32, (1024, 1024), seed=99)
    msg = Message(MsgType.PARAMS_MERGED, {"round": 5, "learners": [0, 1, 2], "name": "zażółć"}, tensors)
    sender = _Thread(lambda: send_message(client, msg, TIMEOUT))
    got = recv_message(server, MAX, TIMEOUT)
    sender.join()
    _assert_same(got, msg)
    assert torch.equal(torch.signbit(got.tensors["special"]), torch.signbit(tensors["special"]))


def test_several_frames_back_to_back_then_clean_close(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    msgs = [
        Message(MsgType.HELLO, {"learner": 1}, {}),
        _message(),
        Message(MsgType.HEARTBEAT, {}, {}),
        Message(MsgType.BYE, {"learner": 1, "reason": "done"}, {}),
    ]
    a.sendall(b"".join(encode(m) for m in msgs))
    a.close()
    for want in msgs:
        _assert_same(recv_message(b, MAX, TIMEOUT), want)
    with pytest.raises(ConnectionClosed):
        recv_message(b, MAX, TIMEOUT)


def test_decoded_tensors_do_not_alias_the_payload() -> None:
    msg = Message(MsgType.GRADS, {"learner": 0, "step": 1, "tokens": 8}, {"g": torch.arange(16, dtype=torch.int32)})
    payload = bytearray(encode(msg)[HEADER.size :])
    got = decode_payload(int(MsgType.GRADS), payload)
    payload[-4:] = b"\xff\xff\xff\xff"
    assert torch.equal(got.tensors["g"], torch.arange(16, dtype=torch.int32))


def test_header_fields() -> None:
    frame = encode(_message())
    magic, version, msg_type, flags, length, crc = HEADER.unpack_from(frame)
    assert HEADER.size == 16
    assert (magic, version, msg_type, flags) == (b"DLCX", 2, int(MsgType.FRAGMENT), 0)
    assert length == len(frame) - HEADER.size
    assert crc == zlib.crc32(frame[:12] + frame[HEADER.size :])  # the header's other fields, then the payload
    (meta_len,) = struct.unpack_from(">I", frame, HEADER.size)
    meta = json.loads(frame[HEADER.size + 4 : HEADER.size + 4 + meta_len])
    assert meta["_tensors"] == [["w", "float32", [64, 32], 64 * 32 * 4], ["b", "bfloat16", [32], 64]]


def test_encode_rejects_unsupported_dtype_and_reserved_key() -> None:
    with pytest.raises(ValueError, match="dtype"):
        encode(Message(MsgType.PUSH, {}, {"x": torch.zeros(2, dtype=torch.float64)}))
    with pytest.raises(ValueError, match="reserved"):
        encode(Message(MsgType.PUSH, {"_tensors": []}, {}))


# --------------------------------------------------------------------------- damaged frames


def test_truncated_payload(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    frame = encode(_message())
    a.sendall(frame[: len(frame) // 2])
    a.close()
    with pytest.raises(Truncated) as info:
        recv_message(b, MAX, TIMEOUT)
    assert info.value.kind == "truncated"


def test_truncated_header(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(encode(_message())[:7])
    a.close()
    with pytest.raises(Truncated):
        recv_message(b, MAX, TIMEOUT)


def test_flipped_payload_byte_is_bad_checksum(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    frame = bytearray(encode(_message()))
    frame[HEADER.size + (len(frame) - HEADER.size) // 2] ^= 0x01
    a.sendall(frame)
    with pytest.raises(BadChecksum) as info:
        recv_message(b, MAX, TIMEOUT)
    assert info.value.kind == "bad_checksum"


def test_bad_magic(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    frame = bytearray(encode(_message()))
    frame[0:4] = b"HTTP"
    a.sendall(frame)
    with pytest.raises(BadMagic) as info:
        recv_message(b, MAX, TIMEOUT)
    assert info.value.kind == "bad_magic"


def test_bad_version(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    frame = bytearray(encode(_message()))
    frame[4] = VERSION + 1
    a.sendall(frame)
    with pytest.raises(BadMagic, match="version"):
        recv_message(b, MAX, TIMEOUT)


def _reframed(frame: bytes, **fields: int) -> bytes:
    """``frame`` with header fields replaced (msg_type, flags) and its checksum made to match again: what an
    intact frame from a peer that means those values looks like."""
    magic, version, msg_type, flags, length, _ = HEADER.unpack_from(frame)
    msg_type, flags = fields.get("msg_type", msg_type), fields.get("flags", flags)
    head = struct.pack(">4sBBHI", magic, version, msg_type, flags, length)
    crc = zlib.crc32(frame[HEADER.size :], zlib.crc32(head))
    return head + struct.pack(">I", crc) + frame[HEADER.size :]


def test_unknown_message_type_is_rejected(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(_reframed(encode(_message()), msg_type=99))
    with pytest.raises(UnknownType, match="type") as info:
        recv_message(b, MAX, TIMEOUT)
    assert info.value.kind == "unknown_type" and isinstance(info.value, BadPayload)


@pytest.mark.parametrize("flags", [1, 0x8000, 0xFFFF])
def test_unknown_flag_bits_are_rejected(pair: tuple[socket.socket, socket.socket], flags: int) -> None:
    a, b = pair
    a.sendall(_reframed(encode(Message(MsgType.PING, {"learner": 0, "seq": 1, "t": 2.5})), flags=flags))
    with pytest.raises(BadFlags) as info:
        recv_message(b, MAX, TIMEOUT)
    assert info.value.kind == "bad_flags"


def test_flipped_type_bit_is_bad_checksum(pair: tuple[socket.socket, socket.socket]) -> None:
    """PING (21) and META (20) differ in one bit of the type byte: the checksum must cover it."""
    a, b = pair
    frame = bytearray(encode(Message(MsgType.PING, {"learner": 0, "step": 4, "seq": 1, "t": 2.5, "step_time_s": 0.1})))
    frame[5] ^= 0x01
    assert frame[5] == MsgType.META
    a.sendall(frame)
    with pytest.raises(BadChecksum):
        recv_message(b, MAX, TIMEOUT)


@pytest.mark.parametrize("byte", [5, 6, 7, 12, 13, 14, 15])  # type, flags, crc
def test_every_flipped_type_flag_or_crc_bit_is_rejected(byte: int) -> None:
    frame = encode(Message(MsgType.PING, {"learner": 0, "seq": 1, "t": 2.5}))
    for bit in range(8):
        damaged = bytearray(frame)
        damaged[byte] ^= 1 << bit
        with pytest.raises(BadChecksum):
            decode_frame(damaged, MAX)


def test_shorter_length_field_is_bad_checksum() -> None:
    frame = bytearray(encode(_message()))
    length = HEADER.unpack_from(frame)[4]
    struct.pack_into(">I", frame, 8, length - 1)  # one payload byte fewer: the frame ends early
    with pytest.raises(BadChecksum):
        decode_frame(frame, MAX)


def test_oversized_frame_rejected_from_header_alone(tcp_pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = tcp_pair
    # Only the header goes out and the connection stays open: if the receiver
    # tried to read (or buffer) the announced 1 GiB payload it would time out
    # instead of raising FrameTooLarge.
    client.sendall(HEADER.pack(MAGIC, VERSION, int(MsgType.PARAMS), 0, 1 << 30, 0))
    start = time.monotonic()
    with pytest.raises(FrameTooLarge) as info:
        recv_message(server, MAX, timeout_s=5.0)
    assert time.monotonic() - start < 2.0
    assert info.value.kind == "frame_too_large"


def test_real_frame_over_the_limit(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    frame = encode(_message())
    a.sendall(frame[: HEADER.size])
    with pytest.raises(FrameTooLarge):
        recv_message(b, max_frame_bytes=len(frame) - HEADER.size - 1, timeout_s=5.0)


def test_frame_exactly_at_the_limit_is_accepted(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    msg = _message()
    frame = encode(msg)
    a.sendall(frame)
    _assert_same(recv_message(b, max_frame_bytes=len(frame) - HEADER.size, timeout_s=TIMEOUT), msg)


def test_clean_close_is_connection_closed(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.close()
    with pytest.raises(ConnectionClosed):
        recv_message(b, MAX, TIMEOUT)


def test_connection_reset_surfaces_as_oserror(tcp_pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = tcp_pair
    client.sendall(encode(_message())[:100])
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close -> RST
    client.close()
    with pytest.raises(ConnectionResetError):
        recv_message(server, MAX, TIMEOUT)


def test_error_classes() -> None:
    classes = [BadMagic, BadChecksum, FrameTooLarge, Truncated, BadPayload]
    assert all(issubclass(cls, FrameError) for cls in classes)
    kinds = [cls.kind for cls in classes]
    assert len(set(kinds)) == len(kinds) and all(kinds)
    assert not issubclass(ConnectionClosed, FrameError)


# --------------------------------------------------------------------------- timeouts and slicing


def test_timeout_when_nothing_arrives(pair: tuple[socket.socket, socket.socket]) -> None:
    _, b = pair
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        recv_message(b, MAX, timeout_s=0.2)
    elapsed = time.monotonic() - start
    assert 0.15 <= elapsed < 2.0


def test_deadline_is_overall_not_per_recv(tcp_pair: tuple[socket.socket, socket.socket]) -> None:
    """A peer that keeps dripping bytes (each gap well under the timeout) still hits the deadline."""
    client, server = tcp_pair
    frame = encode(Message(MsgType.HEARTBEAT, {"pad": "x" * 150}, {}))  # ~200 bytes: ~4 s at the drip rate
    stop = threading.Event()

    def drip() -> None:
        for i in range(len(frame)):
            if stop.wait(0.02):  # pacing of the slow peer, not synchronisation
                return
            client.sendall(frame[i : i + 1])

    dripper = _Thread(drip)
    start = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            recv_message(server, MAX, timeout_s=0.3)
        elapsed = time.monotonic() - start
    finally:
        stop.set()
        dripper.join()
    assert len(frame) * 0.02 > 3.0  # a per-recv timeout would let the whole frame through
    assert elapsed < 1.5


def test_send_timeout_when_peer_does_not_read(pair: tuple[socket.socket, socket.socket]) -> None:
    a, _ = pair
    meta = {"learner": 0, "round": 1, "step": 1, "tokens": 1}
    big = Message(MsgType.PARAMS, meta, {"w": torch.zeros(8 << 20, dtype=torch.uint8)})  # far above buffers
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        send_message(a, big, timeout_s=0.2)
    assert time.monotonic() - start < 2.0


def test_frame_in_one_byte_slices_decodes(tcp_pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = tcp_pair
    msg = Message(
        MsgType.GRADS_AVG,
        {"step": 1},
        {"g": _sample(torch.float16, (300,)), "i": _sample(torch.int64, (20,), seed=4)},
    )
    frame = encode(msg)

    def slice_and_send() -> None:
        for i in range(len(frame)):
            client.sendall(frame[i : i + 1])

    sender = _Thread(slice_and_send)
    got = recv_message(server, MAX, TIMEOUT)
    sender.join()
    _assert_same(got, msg)


def test_one_byte_slices_through_a_forwarding_proxy(tcp_pair: tuple[socket.socket, socket.socket]) -> None:
    """Learner -> socketpair -> proxy thread re-sending 1 byte at a time over TCP -> synchronizer."""
    client, server = tcp_pair
    learner, proxy_in = socket.socketpair()
    msg = _message()

    def proxy() -> None:
        while chunk := proxy_in.recv(4096):
            for i in range(len(chunk)):
                client.sendall(chunk[i : i + 1])
        client.shutdown(socket.SHUT_WR)

    relay = _Thread(proxy)
    try:
        send_message(learner, msg, TIMEOUT)
        learner.shutdown(socket.SHUT_WR)
        got = recv_message(server, MAX, TIMEOUT)
        with pytest.raises(ConnectionClosed):
            recv_message(server, MAX, TIMEOUT)
        relay.join()
    finally:
        learner.close()
        proxy_in.close()
    _assert_same(got, msg)


# --------------------------------------------------------------------------- malformed payloads


def _payload(meta: object, data: bytes = b"") -> bytes:
    raw = json.dumps(meta).encode()
    return struct.pack(">I", len(raw)) + raw + data


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\x00\x00", id="short-meta-len"),
        pytest.param(struct.pack(">I", 100) + b"{}", id="meta-len-overruns"),
        pytest.param(struct.pack(">I", 3) + b"{x}", id="bad-json"),
        pytest.param(struct.pack(">I", 2) + b"\xff\xfe", id="bad-utf8"),
        pytest.param(_payload([1, 2]), id="meta-not-object"),
        pytest.param(_payload({}), id="no-tensors-key"),
        pytest.param(_payload({"_tensors": [["x", "float32", [2], 8]]}, b"\x00" * 7), id="missing-bytes"),
        pytest.param(_payload({"_tensors": [["x", "float32", [2], 8]]}, b"\x00" * 9), id="extra-bytes"),
        pytest.param(_payload({"_tensors": []}, b"\x00"), id="trailing-garbage"),
        pytest.param(_payload({"_tensors": [["x", "float32", [2], 4]]}, b"\x00" * 4), id="nbytes-vs-shape"),
        pytest.param(_payload({"_tensors": [["x", "float64", [1], 8]]}, b"\x00" * 8), id="bad-dtype"),
        pytest.param(_payload({"_tensors": [["x", "float32", [-1], 4]]}, b"\x00" * 4), id="negative-dim"),
        pytest.param(_payload({"_tensors": [["x", "float32", [0, 2**70], 0]]}), id="huge-dim"),
        pytest.param(
            _payload({"_tensors": [["x", "float32", [0, 2**62, 2**62], 0]]}), id="overflowing-shape"
        ),
        pytest.param(_payload({"_tensors": [["x", "float32", [1.0], 4]]}, b"\x00" * 4), id="float-dim"),
        pytest.param(_payload({"_tensors": [[7, "float32", [1], 4]]}, b"\x00" * 4), id="non-str-name"),
        pytest.param(_payload({"_tensors": [["x", "float32", [1]]]}, b"\x00" * 4), id="short-entry"),
        pytest.param(
            _payload({"_tensors": [["x", "uint8", [1], 1], ["x", "uint8", [1], 1]]}, b"\x00\x00"),
            id="duplicate-name",
        ),
    ],
)
def test_malformed_payload_is_bad_payload(payload: bytes) -> None:
    with pytest.raises(BadPayload):
        decode_payload(int(MsgType.PUSH), payload)


def test_decode_payload_unknown_type() -> None:
    with pytest.raises(BadPayload):
        decode_payload(200, _payload({"_tensors": []}))


def test_decode_payload_accepts_hand_built_payload() -> None:
    data = struct.pack("<3i", 1, -2, 3)
    meta = {"fragment": 0, "round": 2, "k": "v"}
    got = decode_payload(int(MsgType.PULL), _payload({**meta, "_tensors": [["x", "int32", [3], 12]]}, data))
    assert got.type is MsgType.PULL
    assert got.meta == meta
    assert torch.equal(got.tensors["x"], torch.tensor([1, -2, 3], dtype=torch.int32))


# --------------------------------------------------------------------------- handshake


def test_secrets_and_nonces_are_random_and_sized() -> None:
    assert len(new_secret()) == 32 and len(new_nonce()) == 16
    assert new_secret() != new_secret()
    assert new_nonce() != new_nonce()


def test_hmac_accepts_the_right_signature() -> None:
    secret, nonce = new_secret(), new_nonce()
    sig = sign_challenge(secret, nonce, 4)
    assert len(sig) == 64 and int(sig, 16) >= 0
    assert verify_challenge(secret, nonce, 4, sig)


def test_hmac_rejects_wrong_inputs() -> None:
    secret, nonce = new_secret(), new_nonce()
    sig = sign_challenge(secret, nonce, 4)
    assert not verify_challenge(new_secret(), nonce, 4, sig)  # wrong secret
    assert not verify_challenge(secret, nonce, 5, sig)  # wrong learner
    assert not verify_challenge(secret, new_nonce(), 4, sig)  # wrong nonce
    tampered = ("0" if sig[0] != "0" else "1") + sig[1:]
    assert not verify_challenge(secret, nonce, 4, tampered)
    assert not verify_challenge(secret, nonce, 4, sig[:-1])
    assert not verify_challenge(secret, nonce, 4, "")


def test_hmac_verify_returns_false_for_malformed_peer_input() -> None:
    secret, nonce = new_secret(), new_nonce()
    sig = sign_challenge(secret, nonce, 1)
    assert not verify_challenge(secret, nonce, 4, "é" * 64)
    assert not verify_challenge(secret, nonce, 4, None)  # type: ignore[arg-type]
    assert not verify_challenge(secret, nonce, "1", sig)  # type: ignore[arg-type]
    assert not verify_challenge(secret, nonce, True, sig)  # type: ignore[arg-type]
    assert not verify_challenge(secret, nonce, 2**80, sig)


def test_waiting_bytes_of_a_socket_closed_by_another_thread_is_zero() -> None:
    """The syncer's main loop closes a replaced connection while its reader may be between a frame's header and
    its payload, where recv_message asks how many bytes are waiting: that raised ValueError (fileno -1), which
    killed the reader thread. Now it reads 0, and the next read reports the close as an OSError."""
    from diloco_chaos.harness.wire.framing import _readable_bytes

    a, b = socket.socketpair()
    try:
        a.sendall(b"x" * 10)
        assert _readable_bytes(b) == 10
        b.close()
        assert _readable_bytes(b) == 0
        with pytest.raises(OSError):
            b.recv_into(bytearray(4), 4)
    finally:
        a.close()
        b.close()
