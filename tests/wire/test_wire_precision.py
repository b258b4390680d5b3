"""The per-connection wire codec (diloco_chaos/harness/wire/precision.py): both ends agree bit for bit, deltas stay
small, a frame that cannot be decoded is refused, and NaN pushes go out as they are for the merge guard to decline."""

from __future__ import annotations

import math

import pytest
import torch

from diloco_chaos.harness.wire.framing import Message, MsgType, decode_frame, encode
from diloco_chaos.harness.wire.precision import WireCodec, WireDecodeError, wire_dtype_for
from diloco_chaos.trainers.quantize import bytes_per_element


def _frag(p: int, version: int, tensors: dict[str, torch.Tensor]) -> Message:
    return Message(MsgType.FRAGMENT, {"fragment": p, "version": version, "pulled_step": None}, tensors)


def _push(p: int, tensors: dict[str, torch.Tensor]) -> Message:
    meta = {"learner": 0, "fragment": p, "base_version": 1, "c_steps": 4, "c_tokens": 64, "first_step": 1,
            "last_step": 4, "step_time_s": 0.1, "final": False, "round": 3}
    return Message(MsgType.PUSH, meta, tensors)


def _over_wire(msg: Message) -> Message:
    """Through a real frame: what the other end's reader gets."""
    return decode_frame(encode(msg), 1 << 26)


@pytest.mark.parametrize("dtype", ["bf16", "int8", "int4"])
def test_down_then_up_round_trip(dtype: str) -> None:
    syncer, learner = WireCodec(dtype), WireCodec(dtype)
    g = torch.Generator().manual_seed(0)
    theta = {"w": torch.randn(33, 17, generator=g), "b": torch.randn(5, generator=g)}
    got = {}
    for v in range(1, 6):  # the global value moves a little each merge; the learner follows it closely
        theta = {n: t + 1e-3 * torch.randn(t.shape, generator=g) for n, t in theta.items()}
        got = learner.decode(_over_wire(syncer.encode(_frag(2, v, theta)))).tensors
        for n in theta:
            assert got[n].shape == theta[n].shape
            # v1: the values themselves, in bf16 or int8; then deltas, each correcting the last one's error
            assert float((got[n] - theta[n]).abs().max()) <= (2e-2 if v == 1 else 2e-3)
    # the learner trains on from what it got; its push is a delta against that, decoded by the syncer
    local = {n: t + 1e-2 * torch.randn(t.shape, generator=g) for n, t in got.items()}
    sent = learner.encode(_push(2, local))
    assert sent.meta["wire"] == dtype and sent.meta["wire_ref"] == 5
    back = syncer.decode(_over_wire(sent)).tensors
    for n in local:  # the error is a fraction of the learner's progress (1e-2), not of the parameter (~1)
        step = (local[n] - got[n]).abs().max()
        assert float((back[n] - local[n]).abs().max()) <= float(step) * (0.01 if dtype == "bf16" else 0.1)


def test_closed_loop_does_not_drift() -> None:
    """100 int4 frames of a slowly moving value: the learner's copy stays within one frame's rounding."""
    syncer, learner = WireCodec("int4"), WireCodec("int4")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(640, generator=g)
    for v in range(1, 101):
        x = x + 1e-3 * torch.randn(640, generator=g)
        got = learner.decode(syncer.encode(_frag(0, v, {"w": x}))).tensors["w"]
    assert float((got - x).abs().max()) < 1e-3


@pytest.mark.parametrize("dtype", ["bf16", "int8", "int4"])
def test_frame_sizes(dtype: str) -> None:
    syncer = WireCodec(dtype)
    x = {"w": torch.randn(64 * 512)}
    full = len(encode(_frag(0, 1, x)))
    first = len(encode(syncer.encode(_frag(0, 1, x))))
    second = len(encode(syncer.encode(_frag(0, 2, {"w": x["w"] + 1e-3}))))
    assert first <= full * 0.52  # no reference yet: the values in bf16 or int8
    assert second <= full * (bytes_per_element(dtype) / 4 + 0.01)


def test_fp32_and_non_outer_frames_pass_through() -> None:
    msg = _frag(0, 1, {"w": torch.randn(10)})
    assert WireCodec("fp32").encode(msg) is msg
    grads = Message(MsgType.GRADS, {"learner": 0, "step": 1, "tokens": 4}, {"w": torch.randn(10)})
    assert WireCodec("int4").encode(grads) is grads
    assert wire_dtype_for("ddp", "int4") == "fp32" and wire_dtype_for("elastic_ddp", "bf16") == "fp32"
    assert wire_dtype_for("diloco", "int4") == "int4"


def test_nan_push_goes_as_is() -> None:
    w = torch.randn(100)
    w[3] = math.nan
    msg = _push(0, {"w": w})
    out = WireCodec("int4").encode(msg)
    assert out is msg and "wire" not in out.meta


def test_unknown_reference_refused() -> None:
    syncer, learner = WireCodec("int4"), WireCodec("int4")
    learner.decode(syncer.encode(_frag(0, 1, {"w": torch.randn(70)})))
    sent = learner.encode(_push(0, {"w": torch.randn(70)}))
    with pytest.raises(WireDecodeError):
        WireCodec("int4").decode(sent)  # another connection's syncer end: no such reference
    bad = Message(sent.type, dict(sent.meta, wire_ref=[1]), sent.tensors)
    with pytest.raises(WireDecodeError):
        syncer.decode(bad)
    cut = Message(sent.type, sent.meta, {"w": sent.tensors["w"][:-1], "w#scale": sent.tensors["w#scale"]})
    with pytest.raises(WireDecodeError):
        syncer.decode(cut)


def test_params_stream_for_diloco() -> None:
    syncer, learner = WireCodec("int8"), WireCodec("int8")
    p = {"w": torch.randn(200)}
    merged = Message(MsgType.PARAMS_MERGED, {"round": 1}, p)
    got = learner.decode(_over_wire(syncer.encode(merged))).tensors
    params = Message(MsgType.PARAMS, {"learner": 0, "round": 2, "step": 8, "tokens": 64},
                     {"w": got["w"] + 0.01})
    enc = learner.encode(params)
    assert enc.meta["wire"] == "int8" and enc.meta["wire_ref"] == 1
    back = syncer.decode(_over_wire(enc)).tensors["w"]
    assert float((back - (got["w"] + 0.01)).abs().max()) < 1e-4
