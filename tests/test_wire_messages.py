"""Tests for harness/wire_messages.py: every message the project sends fits its type's schema, and every
malformed one is refused on decode with the wire's BadMessage.

Why: a frame with intact framing but a missing or wrong-typed field (a HELLO whose learner id is a list, null
or Infinity; a META without its step) used to kill the syncer's reader thread, leaking its socket without an
`auth_failed` event, or stop the syncer's main loop with a KeyError.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from harness.codec import grads_request, merged_to_message, params_request, push_to_message
from harness.fragment_checkpoint import state_to_message
from harness.wire import (
    BadMessage,
    BadPayload,
    FrameError,
    Message,
    MsgType,
    decode_frame,
    encode,
    new_nonce,
    sign_challenge,
)
from harness.wire_messages import SCHEMAS
from trainers.learner import FragmentPush

MAX = 1 << 20
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

