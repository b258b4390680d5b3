"""The protocol's message types and what each one's metadata must hold, checked on every frame decoded.

Why: a frame can pass every framing check (magic, length, checksum) and still carry metadata its receiver
cannot use: a HELLO whose learner id is a list, null or Infinity, a META without its step. The receivers
read fields with ``int(meta["step"])``, so such a frame used to raise KeyError, TypeError or OverflowError
in a reader thread (killing it and leaking its socket) or in the syncer's main loop (stopping the syncer).
Here each type's fields are declared once, as :class:`Field` values in :data:`SCHEMAS`, and
:func:`check_meta` tests a decoded meta dict against them: every required field present, of its JSON type
(a bool is not an int; an int is accepted where a float is expected), finite, and in range. The wire module
(`diloco_chaos/harness/wire/framing.py`) calls it for every frame it decodes and turns a failure into its ``BadMessage``
frame error, which every receiver already handles by closing that connection and logging why; past that point a
receiver can rely on the declared fields.

Keys not declared for a type are carried through unchecked (no receiver reads them). Checks that need the
receiver's context (a learner id below the run's learner count, a fragment index within the partition) stay
with the receiver. This module imports nothing from the project, so the wire module can import it.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["SCHEMAS", "Field", "MetaError", "MsgType", "check_meta"]

I64_MAX = 2**63 - 1
"""Ids, steps, versions and counters are non-negative int64s (the HMAC packs the learner id into 8 bytes)."""


class MsgType(enum.IntEnum):
    """Message types; the value is the type byte in the frame header."""

    HELLO = 1
    CHALLENGE = 2
    AUTH = 3
    WELCOME = 4
    REJECT = 5
    PUSH = 10
    FRAGMENT = 11
    GRADS = 12
    GRADS_AVG = 13
    PARAMS = 14
    PARAMS_MERGED = 15
    PULL = 16
    HEARTBEAT = 17
    BYE = 18
    ERROR = 19
    META = 20
    PING = 21
    PONG = 22
    RESUME = 23
    STOP = 24
    FRAGMENT_STATE = 25
    """Not sent on a link: the content of one slot of the syncer's checkpoint
    (diloco_chaos/harness/syncer/fragment_checkpoint.py)."""


class MetaError(ValueError):
    """A message's metadata breaks its type's schema; the message says which field and how."""


@dataclass(frozen=True)
class Field:
    """One metadata field: its JSON type, its range, and whether it may be absent or null."""

    type: type
    """int, float, str, bool, dict or list. A bool is never an int; an int is accepted for a float."""
    lo: float | None = None
    hi: float | None = None
    """Inclusive bounds of a number."""
    required: bool = True
    nullable: bool = False
    pattern: str | None = None
    """A str must match this regular expression in full."""

    def problem(self, value: Any) -> str | None:
        """Why ``value`` does not fit this field, or None if it does."""
        if value is None:
            return None if self.nullable else "is null"
        if isinstance(value, bool) and self.type is not bool:
            return f"is a bool, not {self.type.__name__}"
        if self.type is float:
            if not isinstance(value, (int, float)):
                return f"is a {type(value).__name__}, not a number"
            try:  # an int too large for a float would make the receiver's float() raise
                finite = math.isfinite(value)
            except OverflowError:
                finite = False
            if not finite:
                return f"is {str(value)[:40]}, not a finite float"
        elif not isinstance(value, self.type):
            return f"is a {type(value).__name__}, not {self.type.__name__}"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
                return f"= {value} is outside [{self.lo}, {self.hi}]"
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            return f"{value[:40]!r} does not match {self.pattern}"
        return None


COUNT = Field(int, 0, I64_MAX)
"""An id, step, version, round or counter."""
SECONDS = Field(float, 0.0)
TIME = Field(float)
"""A monotonic clock reading, echoed back (PING / PONG): any finite number."""
TEXT = Field(str, required=False)


def _optional(f: Field, nullable: bool = False) -> Field:
    return Field(f.type, f.lo, f.hi, False, nullable, f.pattern)


_PING = {"learner": COUNT, "seq": COUNT, "t": TIME}

SCHEMAS: dict[MsgType, dict[str, Field]] = {
    # the handshake (diloco_chaos/harness/learner/syncer_link.py <-> diloco_chaos/harness/syncer/service.py); HELLO also
    # asks the link process to connect
    MsgType.HELLO: {"learner": COUNT, "proto": _optional(COUNT)},
    MsgType.CHALLENGE: {"nonce": Field(str, pattern="[0-9a-f]{32}")},
    MsgType.AUTH: {"learner": COUNT, "sig": Field(str, pattern="[0-9a-f]{64}")},
    MsgType.WELCOME: {"algorithm": TEXT, "connects": _optional(COUNT)},
    MsgType.REJECT: {"reason": TEXT},
    # Decoupled DiLoCo (diloco_chaos/harness/wire/convert.py)
    MsgType.PUSH: {**{k: COUNT for k in ("learner", "fragment", "base_version", "c_steps", "c_tokens", "first_step",
                                         "last_step")},
                   "step_time_s": SECONDS, "final": Field(bool, required=False), "round": _optional(COUNT, True)},
    MsgType.FRAGMENT: {"fragment": COUNT, "version": COUNT, "pulled_step": _optional(COUNT, True),
                       "broadcast": Field(bool, required=False), "merged_step": Field(int, -1, I64_MAX, False)},
    MsgType.PULL: {"fragment": COUNT, "round": COUNT},
    MsgType.META: {"learner": COUNT, "step": COUNT, "step_time_s": SECONDS},
    MsgType.STOP: {"total": _optional(COUNT)},
    # the synchronous baselines
    MsgType.GRADS: {"learner": COUNT, "step": COUNT, "tokens": COUNT},
    MsgType.GRADS_AVG: {"step": COUNT},
    MsgType.PARAMS: {"learner": COUNT, "round": COUNT, "step": COUNT, "tokens": COUNT},
    MsgType.PARAMS_MERGED: {"round": COUNT},
    MsgType.RESUME: {"step": COUNT},
    MsgType.ERROR: {"step": _optional(COUNT), "round": _optional(COUNT), "detail": TEXT},
    # liveness and shutdown; BYE's fields differ by direction (diloco_chaos/harness/learner/syncer_link.py,
    # diloco_chaos/harness/learner/link_process.py)
    MsgType.HEARTBEAT: {},
    MsgType.PING: _PING,
    MsgType.PONG: _PING,
    MsgType.BYE: {"learner": _optional(COUNT), "flush_timeout_s": _optional(SECONDS),
                  "threads": Field(dict, required=False), "cpu_s": _optional(SECONDS)},
    MsgType.FRAGMENT_STATE: {"fragment": COUNT, "version": COUNT, "tensor_groups": Field(list, required=False)},
}
"""Per message type, the fields its receivers read."""

_ONE_OF: dict[MsgType, tuple[str, str]] = {MsgType.ERROR: ("step", "round")}
"""Types that must name exactly one of two fields: an ERROR answers one exchange (diloco_chaos/harness/wire/convert.py
`exchange_id`), a ddp step or a diloco round."""


def check_meta(msg_type: MsgType, meta: dict[str, Any]) -> None:
    """Raise :class:`MetaError` naming the first field of ``meta`` that breaks ``msg_type``'s schema."""
    for name, spec in SCHEMAS[msg_type].items():
        if name not in meta:
            if spec.required:
                raise MetaError(f"field {name!r} is missing")
            continue
        why = spec.problem(meta[name])
        if why is not None:
            raise MetaError(f"field {name!r} {why}")
    pair = _ONE_OF.get(msg_type)
    if pair is not None and (pair[0] in meta) == (pair[1] in meta):
        raise MetaError(f"exactly one of {pair[0]!r} and {pair[1]!r} must be present")
