"""The handshake's secrets and proof: the synchronizer sends a random nonce in CHALLENGE and a learner
proves it knows the run's secret by answering (AUTH) with an HMAC-SHA256 over the nonce and its learner id.

Why apart from `diloco_chaos/harness/wire/framing.py`: the framing does not depend on it, and the peer-supplied values
it checks (`verify_challenge`) are a security boundary of their own, kept small enough to read at once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

__all__ = ["new_nonce", "new_secret", "sign_challenge", "verify_challenge"]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def new_secret() -> bytes:
    """A fresh 32-byte run secret."""
    return secrets.token_bytes(32)


def new_nonce() -> bytes:
    """A fresh 16-byte challenge nonce."""
    return secrets.token_bytes(16)


def _challenge_mac(secret: bytes, nonce: bytes, learner: int) -> str:
    if not secret:
        raise ValueError("the secret must not be empty")
    if not _is_int(learner):
        raise TypeError(f"learner id must be an int, got {type(learner).__name__}")
    # Fixed-width learner id, so that nonce + id is unambiguous.
    id_bytes = learner.to_bytes(8, "big", signed=True)
    return hmac.new(secret, bytes(nonce) + id_bytes, hashlib.sha256).hexdigest()


def sign_challenge(secret: bytes, nonce: bytes, learner: int) -> str:
    """Hex HMAC-SHA256 under ``secret`` over ``nonce`` followed by the learner id (8 bytes, big-endian)."""
    return _challenge_mac(secret, nonce, learner)


def verify_challenge(secret: bytes, nonce: bytes, learner: int, signature: str) -> bool:
    """Whether ``signature`` is :func:`sign_challenge` of these inputs (constant-time comparison).

    ``learner`` and ``signature`` come from the peer, so anything malformed
    (not an int, out of range, not an ASCII string) yields ``False`` rather
    than an exception. An empty ``secret`` is a local misconfiguration and
    raises ``ValueError``.
    """
    if not secret:
        raise ValueError("the secret must not be empty")
    if not isinstance(signature, str):
        return False
    try:
        expected = _challenge_mac(secret, nonce, learner)
        given = signature.encode("ascii")
    except (TypeError, OverflowError, UnicodeEncodeError):
        return False
    return hmac.compare_digest(expected.encode("ascii"), given)
