"""Conversions between the trainers' dataclasses and wire messages (not the per-connection precision codec, which
is diloco_chaos/harness/wire/precision.py's `WireCodec`).

Kept apart from both sides so that `diloco_chaos/trainers/` never imports the wire format
and the syncer and the learner link agree on one mapping.
"""

from __future__ import annotations

from diloco_chaos.harness.wire.framing import Message, MsgType
from diloco_chaos.trainers.messages import FragmentPush, MergedFragment

_PUSH_FIELDS = ("learner", "fragment", "base_version", "c_steps", "c_tokens", "first_step", "last_step",
                "step_time_s", "final")


def push_to_message(push: FragmentPush, round_id: int | None = None) -> Message:
    """A push; `round_id` names the pull it answers (None: an unsolicited final push)."""
    meta = {k: getattr(push, k) for k in _PUSH_FIELDS}
    meta["round"] = round_id
    return Message(MsgType.PUSH, meta, push.tensors)


def push_round(msg: Message) -> int | None:
    r = msg.meta.get("round")
    return None if r is None else int(r)


def message_to_push(msg: Message) -> FragmentPush:
    """Raises KeyError / TypeError / ValueError on a malformed push (the caller rejects and counts it)."""
    m = msg.meta
    return FragmentPush(
        learner=int(m["learner"]), fragment=int(m["fragment"]), base_version=int(m["base_version"]),
        c_steps=int(m["c_steps"]), c_tokens=int(m["c_tokens"]), first_step=int(m["first_step"]),
        last_step=int(m["last_step"]), step_time_s=float(m["step_time_s"]), tensors=dict(msg.tensors),
        final=bool(m.get("final", False)),
    )


def merged_to_message(fragment: int, version: int, tensors: dict, pulled_step: int | None = None,
                      broadcast: bool = False, merged_step: int = -1) -> Message:
    """A merged fragment; `broadcast`: sent to a learner that was not in the merge (diloco.broadcast = all), with
    the last step of its work on the fragment merged (`merged_step`)."""
    meta: dict[str, object] = {"fragment": fragment, "version": version, "pulled_step": pulled_step}
    if broadcast:
        meta["broadcast"] = True
        meta["merged_step"] = merged_step
    return Message(MsgType.FRAGMENT, meta, tensors)


def message_to_merged(msg: Message) -> MergedFragment:
    pulled = msg.meta.get("pulled_step")
    return MergedFragment(fragment=int(msg.meta["fragment"]), version=int(msg.meta["version"]),
                          tensors=dict(msg.tensors), pulled_step=None if pulled is None else int(pulled),
                          broadcast=bool(msg.meta.get("broadcast", False)),
                          merged_step=int(msg.meta.get("merged_step", -1)))


def grads_request(learner: int, step: int, tokens: int, grads: dict) -> Message:
    """ddp: a learner's gradients for `step`, answered by GRADS_AVG {"step"}."""
    return Message(MsgType.GRADS, {"learner": learner, "step": step, "tokens": tokens}, grads)


def params_request(learner: int, round_: int, step: int, tokens: int, params: dict) -> Message:
    """diloco: a learner's parameters for `round_`, answered by PARAMS_MERGED {"round"}."""
    return Message(MsgType.PARAMS, {"learner": learner, "round": round_, "step": step, "tokens": tokens}, params)


def exchange_id(msg: Message) -> tuple[str, int]:
    """Which synchronous exchange a request (GRADS, PARAMS), its answer (GRADS_AVG, PARAMS_MERGED) or an ERROR
    about it belongs to: ("round", r) for diloco, ("step", s) for ddp. `dict([exchange_id(msg)])` is the meta
    an answer carries."""
    return ("round", int(msg.meta["round"])) if "round" in msg.meta else ("step", int(msg.meta["step"]))
