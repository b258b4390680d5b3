"""Length-prefixed, checksummed framing of messages (JSON metadata + raw tensors) over TCP.

Why: learners and the central synchronizer talk over plain TCP, often through a
fault-injecting proxy that slices the byte stream into arbitrary pieces,
truncates it, or resets the connection. The receiver must therefore never trust
the stream: every frame carries a magic, a version, its message type, flags, its
exact payload length and a CRC-32 over the rest of the header and the payload
(a flipped type bit cannot turn a PING into a META), and the receiver

* refuses a frame whose announced length exceeds its limit *before* reading or
  buffering any of the payload (a corrupted or hostile length cannot make it
  allocate gigabytes),
* reads exactly the announced number of bytes with ``recv_into`` into one
  preallocated buffer, however the bytes are sliced on the way,
* bounds the whole receive by one overall deadline (a peer that drips one byte
  at a time cannot keep it waiting forever),
* rejects unknown flag bits and unknown types, and metadata that breaks its
  type's schema (`diloco_chaos/harness/wire/messages.py`): receivers can read its fields,
* tells apart a clean close between frames (:class:`ConnectionClosed`), a close
  inside a frame (:class:`Truncated`), and a rejected frame (the other
  :class:`FrameError` subclasses, each with a short ``kind`` string for logs and
  counters). A connection reset surfaces as the ``OSError`` the socket raised.

After any :class:`FrameError` or ``TimeoutError`` raised by :func:`recv_message`
the position in the byte stream is unknown; the caller must close the
connection rather than try to read another frame from it.

Frame layout (all integers big-endian)::

    header  (16 bytes, HEADER = ">4sBBHII"):
        magic b"DLCX" | version u8 (=2) | msg type u8 | flags u16 (FLAG_MAC or 0)
        | payload length u32 | crc32(header bytes 0-11, then payload) u32
    payload:
        meta_len u32 | meta JSON (utf-8, meta_len bytes) | tensor bytes
        | tag (16 bytes, only with FLAG_MAC: diloco_chaos/harness/wire/frame_auth.py)

After the handshake both ends pass their `FrameAuth` to every send and receive: each frame is then signed,
and a received frame without a valid tag is rejected (:class:`BadMac`). Before it, and for frames kept in
memory (checkpoint slots), frames carry no tag and a tagged one is rejected.

Magic, version and length are checked once the header is in; the checksum once
the payload is, then flags and type (a damaged header reads as a bad checksum).

The meta JSON is the message's ``meta`` dict plus the reserved key
``"_tensors"``: a list of ``[name, dtype, shape, nbytes]``, one per tensor, in
order; the tensor bytes are their raw contents concatenated in that order
(C-contiguous, the host's native byte order: both ends are assumed to share it,
as all little-endian hosts do). Sizes must add up exactly or the payload is
rejected. Only float32, float16, bfloat16, int64, int32 and uint8 are carried.

The handshake's secrets and HMAC are in `diloco_chaos/harness/wire/handshake.py`.
"""

from __future__ import annotations

import fcntl
import json
import math
import socket
import struct
import termios
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch

from diloco_chaos.harness.wire.frame_auth import TAG_BYTES, FrameAuth
from diloco_chaos.harness.wire.messages import MetaError, MsgType, check_meta

__all__ = [
    "HEADER",
    "MAGIC",
    "VERSION",
    "BadChecksum",
    "BadFlags",
    "BadMac",
    "BadMagic",
    "BadMessage",
    "BadPayload",
    "ConnectionClosed",
    "FrameError",
    "FrameTooLarge",
    "Message",
    "MsgType",
    "Truncated",
    "UnknownType",
    "decode_frame",
    "decode_payload",
    "encode",
    "recv_message",
    "send_message",
]

MAGIC = b"DLCX"
VERSION = 2
HEADER = struct.Struct(">4sBBHII")  # magic, version, msg type, flags, payload length, crc32(header[:12] + payload)
_CRC_AT = HEADER.size - 4  # the CRC field; the checksum covers the header bytes before it, then the payload
FLAG_MAC = 0x0001
"""The payload ends with a `diloco_chaos/harness/wire/frame_auth.py` tag: every frame after the handshake."""
KNOWN_FLAGS = FLAG_MAC
"""A frame with any other flag bit set is from a protocol this one does not speak, and rejected."""
_META_LEN = struct.Struct(">I")
_U32_MAX = 0xFFFFFFFF
_TENSORS_KEY = "_tensors"

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
}
_DTYPE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in _DTYPES.items()}


_MSG_TYPE_VALUES = frozenset(int(t) for t in MsgType)


@dataclass
class Message:
    """One protocol message: its type, JSON-serialisable metadata, and named tensors (order preserved)."""

    type: MsgType
    meta: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


class FrameError(Exception):
    """A received frame was rejected. ``kind`` is a short stable label for logs and counters."""

    kind: str = "frame_error"


class BadMagic(FrameError):
    """The header does not start with the magic, or names a protocol version we do not speak."""

    kind = "bad_magic"


class BadChecksum(FrameError):
    """The CRC-32 of the header and payload does not match the header's."""

    kind = "bad_checksum"


class FrameTooLarge(FrameError):
    """The header announces a payload longer than the receiver accepts (the payload was not read)."""

    kind = "frame_too_large"


class Truncated(FrameError):
    """The peer closed the connection in the middle of a frame."""

    kind = "truncated"


class BadFlags(FrameError):
    """The header sets a flag bit this protocol version does not define."""

    kind = "bad_flags"


class BadMac(FrameError):
    """A frame after the handshake whose tag is missing or wrong: forged, replayed, reordered or reflected."""

    kind = "bad_mac"


class BadPayload(FrameError):
    """The frame is intact but its content is malformed (bad JSON, sizes that do not add up)."""

    kind = "bad_payload"


class UnknownType(BadPayload):
    """The header names a message type this protocol does not have."""

    kind = "unknown_type"


class BadMessage(BadPayload):
    """The payload decodes, but its metadata breaks its message type's schema (`diloco_chaos/harness/wire/messages.py`):
    a field missing, of the wrong type, not finite or out of range. The message names the type and field."""

    kind = "bad_message"


class ConnectionClosed(Exception):
    """The peer closed the connection cleanly, between frames."""


# --------------------------------------------------------------------------- encoding


def _tensor_entry(name: object, tensor: object) -> tuple[str, torch.Tensor, list[Any]]:
    if not isinstance(name, str):
        raise TypeError(f"tensor names must be str, got {type(name).__name__}")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor {name!r} is a {type(tensor).__name__}, not a torch.Tensor")
    dtype_name = _DTYPE_NAMES.get(tensor.dtype)
    if dtype_name is None:
        raise ValueError(
            f"tensor {name!r} has unsupported dtype {tensor.dtype}; supported: {sorted(_DTYPES)}"
        )
    flat = tensor.detach().to("cpu").contiguous()
    nbytes = flat.numel() * flat.element_size()
    return name, flat, [name, dtype_name, list(flat.shape), nbytes]


def encode(msg: Message, auth: FrameAuth | None = None) -> bytes:
    """Serialise ``msg`` into one whole frame (header + payload), signed with ``auth`` if given (which
    counts it as sent: encode only what will be sent, in order).

    Raises ``ValueError`` for an unsupported dtype, a ``"_tensors"`` key in
    ``meta`` (it is reserved), or a payload that does not fit the u32 length
    field; ``TypeError`` for metadata that is not JSON-serialisable.
    """
    msg_type = int(msg.type)
    if msg_type not in _MSG_TYPE_VALUES:
        raise ValueError(f"unknown message type {msg.type!r}")
    if _TENSORS_KEY in msg.meta:
        raise ValueError(f"meta key {_TENSORS_KEY!r} is reserved for the wire format")
    entries = [_tensor_entry(name, tensor) for name, tensor in msg.tensors.items()]
    meta = dict(msg.meta)
    meta[_TENSORS_KEY] = [entry for _, _, entry in entries]
    meta_bytes = json.dumps(meta, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    data_len = sum(entry[3] for _, _, entry in entries)
    tag_len = TAG_BYTES if auth is not None else 0
    payload_len = _META_LEN.size + len(meta_bytes) + data_len + tag_len
    if payload_len > _U32_MAX:
        raise ValueError(f"payload of {payload_len} bytes does not fit the u32 length field")

    frame = bytearray(HEADER.size + payload_len)
    offset = HEADER.size
    _META_LEN.pack_into(frame, offset, len(meta_bytes))
    offset += _META_LEN.size
    frame[offset : offset + len(meta_bytes)] = meta_bytes
    offset += len(meta_bytes)
    for _, flat, entry in entries:
        nbytes = entry[3]
        if nbytes:
            dst = torch.frombuffer(frame, dtype=torch.uint8, count=nbytes, offset=offset)
            dst.copy_(flat.reshape(-1).view(torch.uint8))
        offset += nbytes

    HEADER.pack_into(frame, 0, MAGIC, VERSION, msg_type, FLAG_MAC if auth is not None else 0, payload_len, 0)
    if auth is not None:
        frame[offset:] = auth.sign(frame[:_CRC_AT], memoryview(frame)[HEADER.size : offset])
    struct.pack_into(">I", frame, _CRC_AT, _frame_crc(frame[:_CRC_AT], memoryview(frame)[HEADER.size :]))
    return bytes(frame)


# --------------------------------------------------------------------------- decoding


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_entry(raw: object, index: int) -> tuple[str, torch.dtype, list[int], int]:
    if not isinstance(raw, list) or len(raw) != 4:
        raise BadPayload(f"tensor entry {index} is not [name, dtype, shape, nbytes]")
    name, dtype_name, shape, nbytes = raw
    if not isinstance(name, str):
        raise BadPayload(f"tensor entry {index}: name is not a string")
    dtype = _DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None:
        raise BadPayload(f"tensor {name!r}: unsupported dtype {dtype_name!r}")
    if not isinstance(shape, list) or not all(_is_int(d) and 0 <= d < 2**63 for d in shape):
        raise BadPayload(f"tensor {name!r}: shape {shape!r} is not a list of non-negative int64s")
    if not _is_int(nbytes) or nbytes < 0:
        raise BadPayload(f"tensor {name!r}: nbytes {nbytes!r} is not a non-negative int")
    expected = math.prod(shape) * dtype.itemsize
    if nbytes != expected:
        raise BadPayload(f"tensor {name!r}: nbytes {nbytes} != {expected} implied by {dtype_name}{shape}")
    return name, dtype, shape, nbytes


def decode_payload(msg_type: int, payload: bytes | bytearray | memoryview) -> Message:
    """Decode a frame's payload into a :class:`Message`; raises :class:`BadPayload` on malformed content
    (:class:`UnknownType` for an unknown type, :class:`BadMessage` for metadata that breaks the type's schema).

    ``payload`` may be any bytes-like object. The returned tensors own fresh
    memory (they do not alias ``payload``).
    """
    if msg_type not in _MSG_TYPE_VALUES:
        raise UnknownType(f"unknown message type {msg_type}")
    # torch.frombuffer wants a writable buffer; the tensors are copied out anyway.
    buf = payload if isinstance(payload, bytearray) else bytearray(payload)
    if len(buf) < _META_LEN.size:
        raise BadPayload(f"payload of {len(buf)} bytes is too short for the meta length")
    (meta_len,) = _META_LEN.unpack_from(buf, 0)
    data_start = _META_LEN.size + meta_len
    if data_start > len(buf):
        raise BadPayload(f"meta length {meta_len} overruns the {len(buf)}-byte payload")
    try:
        meta = json.loads(bytes(buf[_META_LEN.size : data_start]).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise BadPayload(f"meta is not valid UTF-8 JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise BadPayload(f"meta is a JSON {type(meta).__name__}, not an object")
    raw_entries = meta.pop(_TENSORS_KEY, None)
    if not isinstance(raw_entries, list):
        raise BadPayload(f"meta has no {_TENSORS_KEY!r} list")
    entries = [_parse_entry(raw, i) for i, raw in enumerate(raw_entries)]
    names = [entry[0] for entry in entries]
    if len(set(names)) != len(names):
        raise BadPayload("duplicate tensor names")
    data_len = sum(entry[3] for entry in entries)
    if data_start + data_len != len(buf):
        raise BadPayload(
            f"tensor sizes add up to {data_len} bytes but {len(buf) - data_start} bytes follow the meta"
        )
    try:
        check_meta(MsgType(msg_type), meta)
    except MetaError as exc:
        raise BadMessage(f"{MsgType(msg_type).name}: {exc}") from exc

    tensors: dict[str, torch.Tensor] = {}
    offset = data_start
    for name, dtype, shape, nbytes in entries:
        try:
            if nbytes == 0:
                tensor = torch.empty(shape, dtype=dtype)
            else:
                # Copy the bytes into a fresh (aligned) allocation, then reinterpret.
                raw = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=offset).clone()
                tensor = raw.view(dtype).reshape(shape)
        except (RuntimeError, ValueError, TypeError, OverflowError) as exc:
            raise BadPayload(f"tensor {name!r}: cannot build {dtype}{shape}: {exc}") from exc
        tensors[name] = tensor
        offset += nbytes
    return Message(MsgType(msg_type), meta, tensors)


# --------------------------------------------------------------------------- sockets


def send_message(sock: socket.socket, msg: Message, timeout_s: float, auth: FrameAuth | None = None) -> int:
    """Send ``msg`` as one frame (signed with ``auth`` after the handshake); the whole send is bounded by
    ``timeout_s``. Returns the bytes sent.

    Raises ``TimeoutError`` if the frame could not be handed to the kernel in
    time (then part of it may have been sent, and the connection should be
    dropped) and ``OSError`` for socket errors such as a reset.

    This sets the socket's timeout; a socket whose sends and receives run in
    different threads shares that one setting between them.
    """
    if timeout_s <= 0:
        raise TimeoutError("send_message: no time left")
    frame = encode(msg, auth)
    sock.settimeout(timeout_s)  # since Python 3.5 this bounds the whole sendall, not each chunk
    sock.sendall(frame)
    return len(frame)


def _readable_bytes(sock: socket.socket) -> int:
    """Bytes waiting in the socket's receive buffer (Linux FIONREAD); 0 where unsupported, or where another
    thread has closed the socket meanwhile (fileno() is then -1: ValueError), whose next recv reports it."""
    try:
        buf = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, ValueError):
        return 0
    return int(struct.unpack("i", buf)[0])


def frame_waiting(sock: socket.socket) -> bool:
    """For a socket that select() reports readable: whether a whole frame is already in its receive buffer
    (peeked, nothing consumed; Linux FIONREAD), so that `recv_message` returns without waiting for the
    sender. True as well when the peer has closed (reading then reports it at once)."""
    header = sock.recv(HEADER.size, socket.MSG_PEEK)
    if not header:
        return True
    if len(header) < HEADER.size:
        return False
    return _readable_bytes(sock) >= HEADER.size + HEADER.unpack(header)[4]


def _recv_exact(sock: socket.socket, view: memoryview, deadline: float, what: str) -> int:
    """Fill ``view`` from ``sock`` before ``deadline``; return the bytes read (short only on EOF)."""
    got = 0
    total = len(view)
    while got < total:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"recv_message: timed out reading {what} ({got}/{total} bytes)")
        sock.settimeout(remaining)
        n = sock.recv_into(view[got:], total - got)
        if n == 0:
            return got
        got += n
    return got


def recv_message(sock: socket.socket, max_frame_bytes: int, timeout_s: float,
                 timing: dict[str, float] | None = None, auth: FrameAuth | None = None) -> Message:
    """Receive and decode exactly one frame, within ``timeout_s`` overall.

    Raises :class:`ConnectionClosed` on EOF before the first header byte,
    :class:`Truncated` on EOF inside the frame, :class:`BadMagic` /
    :class:`FrameTooLarge` (payload length over ``max_frame_bytes``, refused
    before any payload byte is read) / :class:`BadChecksum` / :class:`BadFlags`
    / :class:`UnknownType` / :class:`BadPayload` / :class:`BadMessage`
    (metadata that breaks its type's schema) / :class:`BadMac` (with ``auth``:
    a frame without its tag or with a wrong one) for rejected frames,
    ``TimeoutError`` when the deadline passes, and ``OSError`` for socket errors.

    If ``timing`` is given, it receives ``header_t`` (monotonic time the header
    had arrived), ``ready_bytes`` (bytes already waiting in the socket then),
    ``end_t`` (the whole frame had arrived) and ``bytes`` (frame size). The
    link's rate as the receiver saw it is then (bytes - header - ready_bytes)
    / (end_t - header_t): only bytes that arrived after the header count,
    so a throttled link delivering in pieces is measured exactly.

    This sets the socket's timeout; see :func:`send_message`.
    """
    deadline = time.monotonic() + timeout_s
    header = bytearray(HEADER.size)
    got = _recv_exact(sock, memoryview(header), deadline, "header")
    if got == 0:
        raise ConnectionClosed("peer closed the connection between frames")
    if got < HEADER.size:
        raise Truncated(f"connection closed after {got} of {HEADER.size} header bytes")

    if timing is not None:
        timing["header_t"] = time.monotonic()
        timing["ready_bytes"] = _readable_bytes(sock)
    length = _check_header(header, max_frame_bytes)

    payload = bytearray(length)
    got = _recv_exact(sock, memoryview(payload), deadline, "payload")
    if got < length:
        raise Truncated(f"connection closed after {got} of {length} payload bytes")
    if timing is not None:
        timing["end_t"] = time.monotonic()
        timing["bytes"] = HEADER.size + length
    return _decode_checked(header, payload, auth)


def decode_frame(frame: bytes | bytearray | memoryview, max_frame_bytes: int) -> Message:
    """Decode one whole frame held in memory (the syncer's checkpoint slots), with every check
    :func:`recv_message` makes. Bytes after the frame's announced length are ignored (a slot rewritten in place
    with a shorter frame keeps the old tail); fewer bytes than it announces raise :class:`Truncated`."""
    view = memoryview(frame)
    if len(view) < HEADER.size:
        raise Truncated(f"{len(view)} bytes, fewer than the {HEADER.size}-byte header")
    length = _check_header(view[: HEADER.size], max_frame_bytes)
    if len(view) < HEADER.size + length:
        raise Truncated(f"{len(view) - HEADER.size} of {length} payload bytes")
    return _decode_checked(view[: HEADER.size], bytearray(view[HEADER.size : HEADER.size + length]))


def _check_header(header: bytes | bytearray | memoryview, max_frame_bytes: int) -> int:
    """The checks a header allows before its payload is read (magic, version, length); returns the length."""
    magic, version, _msg_type, _flags, length, _crc = HEADER.unpack(header)
    if magic != MAGIC:
        raise BadMagic(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise BadMagic(f"unsupported protocol version {version}, expected {VERSION}")
    if length > max_frame_bytes:
        raise FrameTooLarge(f"payload of {length} bytes exceeds the limit of {max_frame_bytes}")
    return length


def _frame_crc(head: bytes | bytearray | memoryview, payload: bytes | bytearray | memoryview) -> int:
    """CRC-32 of the header bytes before the CRC field, then the payload."""
    return zlib.crc32(payload, zlib.crc32(head))


def _decode_checked(header: bytes | bytearray | memoryview, payload: bytearray,
                    auth: FrameAuth | None = None) -> Message:
    """The checks that need the whole frame (checksum, flags, the tag, then type), then the payload's
    decoding."""
    _magic, _version, msg_type, flags, _length, crc = HEADER.unpack(header)
    got = _frame_crc(header[:_CRC_AT], payload)
    if got != crc:
        raise BadChecksum(f"header and payload crc32 {got:#010x} != header {crc:#010x}")
    if flags & ~KNOWN_FLAGS:
        raise BadFlags(f"unknown flag bits {flags & ~KNOWN_FLAGS:#06x}")
    tagged = bool(flags & FLAG_MAC)
    if auth is None:
        if tagged:
            raise BadFlags("a signed frame where no key is agreed (before the handshake, or stored)")
        return decode_payload(msg_type, payload)
    if not tagged:
        raise BadMac("an unsigned frame after the handshake")
    if len(payload) < TAG_BYTES:
        raise BadMac(f"payload of {len(payload)} bytes is shorter than its tag")
    with memoryview(payload) as view:
        ok = auth.verify(header[:_CRC_AT], view[:-TAG_BYTES], view[-TAG_BYTES:])
    if not ok:
        raise BadMac(f"wrong tag on frame {auth.received} from the peer (forged, replayed, reordered or reflected)")
    del payload[-TAG_BYTES:]  # the message without its tag, in place
    return decode_payload(msg_type, payload)
