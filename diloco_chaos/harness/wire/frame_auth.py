"""Authentication of every frame after the handshake: a keyed MAC with an implicit sequence number.

The handshake (`diloco_chaos/harness/wire/handshake.py`) proves once that a learner knows the run's secret. Without
more, any frame after it is trusted on its CRC alone, and a CRC is no protection against a peer or a box in the middle
that writes frames on purpose. So both ends derive two keys from the secret, the challenge's nonce and the
learner id, one per direction, and every frame after the handshake carries a 16-byte tag: HMAC-SHA256
(truncated to 16 bytes) under its direction's key, over the frame's sequence number in that direction
(8 bytes, counted by both ends, never sent) and the frame (header without its CRC field, then the payload).

What that rules out: a forged frame (no key), a frame replayed, dropped or reordered within the connection
(the sequence number moves on), a frame reflected back to its sender (the other direction's key), and a
frame from another connection or run (another nonce or secret). HMAC-SHA256 rather than keyed BLAKE2b because
OpenSSL's SHA-256 uses the CPU's SHA instructions where they exist and then hashes about twice as fast;
`bench/wire_auth.py` measures the cost per frame.

The tag travels inside the payload's announced length, after the message, with the header's `FLAG_MAC`
set; the CRC covers it too, so damage on the way still reads as a bad checksum, and a frame whose checksum
holds but whose tag does not is an attack or a bug, rejected as `BadMac`.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass, field

TAG_BYTES = 16
"""Length of a frame's tag."""
_SEQ = struct.Struct(">Q")
_KEY_LABEL = b"diloco-chaos frame key v1"


def _direction_key(secret: bytes, nonce: bytes, learner: int, direction: bytes) -> bytes:
    if not secret:
        raise ValueError("the secret must not be empty")
    material = _KEY_LABEL + direction + bytes(nonce) + learner.to_bytes(8, "big", signed=True)
    return hmac.new(secret, material, hashlib.sha256).digest()


@dataclass
class FrameAuth:
    """One end's state of one connection: the key it signs with, the key it checks with, and the sequence
    number of the next frame in each direction. Not shared between threads: one sender and one receiver
    thread may use it at once (each touches only its own direction)."""

    send_key: bytes
    recv_key: bytes
    sent: int = field(default=0)
    """Frames signed so far (the next one's sequence number)."""
    received: int = field(default=0)
    """Frames verified so far."""

    @classmethod
    def for_learner(cls, secret: bytes, nonce: bytes, learner: int) -> FrameAuth:
        """The learner's end: signs with the learner-to-syncer key."""
        up, down = _direction_key(secret, nonce, learner, b"up"), _direction_key(secret, nonce, learner, b"down")
        return cls(send_key=up, recv_key=down)

    @classmethod
    def for_syncer(cls, secret: bytes, nonce: bytes, learner: int) -> FrameAuth:
        """The synchronizer's end of the same connection."""
        up, down = _direction_key(secret, nonce, learner, b"up"), _direction_key(secret, nonce, learner, b"down")
        return cls(send_key=down, recv_key=up)

    @staticmethod
    def _tag(key: bytes, seq: int, head: bytes | bytearray | memoryview,
             body: bytes | bytearray | memoryview) -> bytes:
        h = hmac.new(key, _SEQ.pack(seq), hashlib.sha256)
        h.update(head)
        h.update(body)
        return h.digest()[:TAG_BYTES]

    def sign(self, head: bytes | bytearray | memoryview, body: bytes | bytearray | memoryview) -> bytes:
        """The tag of the next frame sent: `head` is the header up to its CRC field, `body` the payload
        before the tag."""
        tag = self._tag(self.send_key, self.sent, head, body)
        self.sent += 1
        return tag

    def verify(self, head: bytes | bytearray | memoryview, body: bytes | bytearray | memoryview,
               tag: bytes | bytearray | memoryview) -> bool:
        """Whether `tag` is the next received frame's (constant-time). A frame that fails leaves the count
        where it was; its connection is closed anyway."""
        ok = hmac.compare_digest(self._tag(self.recv_key, self.received, head, body), bytes(tag))
        if ok:
            self.received += 1
        return ok
