"""Wire precision of the outer traffic (`diloco.wire_dtype`): one codec per connection, at both of its ends.

Why: fragments crossed the links as fp32; the paper sends bf16 by default and reports int4 nearly lossless
(issue 17). Quantising a *parameter* to int4 (15 levels per block of 64) would wipe out the small change one
sync makes to it; what the paper compresses is the outer gradient, a *difference*. So every tensor-carrying
frame of the outer loop is sent as a delta against a reference that both ends of the connection hold
bit for bit, quantised with diloco_chaos/trainers/quantize.py:

* down (syncer -> learner: FRAGMENT, diloco's PARAMS_MERGED): against the value the learner reconstructed
  from the previous frame of the same stream (fragment p, or diloco's parameters) on this connection. The
  syncer computes that reconstruction too (round to nearest is deterministic), so the loop is closed: what
  one frame's quantisation dropped is part of the next frame's delta, never summed up.
* up (learner -> syncer: PUSH, diloco's PARAMS): against the newest down value of the same stream the learner
  has received on this connection (meta ``wire_ref`` names it by its per-connection sequence number); the
  syncer keeps its last `HISTORY` down values per stream to decode against. The pushed value's error is then
  that of the learner's own progress since its reference (its outer gradient's size), not the parameter's.

Without a reference (a stream's first frame on a connection: the current values sent on every (re)connect,
a push before any), a frame carries the full values (`FULL_DTYPE`: int8 for int4, otherwise the dtype
itself). A connection's codec starts empty on both ends and dies with it, so a reconnect or a dropped frame
cannot desynchronise them: frames are encoded by the writer thread just before they go on the socket (a frame
dropped from a full queue was never encoded) and TCP delivers the rest in order.

No error-feedback residual is kept on the learner: downstream errors are closed-loop as above, and an upstream
delta is re-anchored at a fresh reference each time, so its rounding errors are independent per push rather
than a bias that accumulates (round to nearest on a delta much larger than the grid step).

A tensor with NaN or Inf is refused by the quantiser before anything is encoded; the frame then goes as it is
(fp32, meta ``wire`` absent), so the syncer's merge guard declines it and counts it exactly as before
(diloco_chaos/trainers/merge/outer_gradient.py: a NaN update is never merged). ddp and elastic_ddp (gradients and
optimizer state each
step) never use the codec: their frames stay fp32.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import torch
from torch import Tensor

from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.wire.framing import Message, MsgType
from diloco_chaos.trainers.quantize import WIRE_DTYPES, NonFiniteError, Quantized, dequantize, quantize

DOWN = frozenset({MsgType.FRAGMENT, MsgType.PARAMS_MERGED})
UP = frozenset({MsgType.PUSH, MsgType.PARAMS})
HISTORY = 8
"""Down values per stream the syncer keeps for decoding pushes (a push answers a value at most a few frames old)."""
SCALE_SUFFIX = "#scale"
FULL_DTYPE = {"fp32": "fp32", "bf16": "bf16", "int8": "int8", "int4": "int8"}
"""What a frame without a reference carries its values in: int4's 15 levels per block would move a parameter
by up to 1/14 of its block's largest, so int4 sends those in int8 (1/254, about bf16's 1/256 relative)."""

Tensors = dict[str, Tensor]


class WireDecodeError(ValueError):
    """A frame's wire encoding cannot be decoded (unknown dtype, missing part, unknown reference)."""


def _stream(msg: Message) -> tuple[str, int]:
    if msg.type in (MsgType.FRAGMENT, MsgType.PUSH):
        return ("f", int(msg.meta["fragment"]))
    return ("p", 0)


def _same_layout(ref: Tensors, tensors: Tensors) -> bool:
    return ref.keys() == tensors.keys() and all(ref[n].shape == t.shape for n, t in tensors.items())


class WireCodec:
    """One connection's encoder and decoder for `dtype` (one of diloco_chaos.trainers.quantize.WIRE_DTYPES)."""

    def __init__(self, dtype: str) -> None:
        if dtype not in WIRE_DTYPES:
            raise ValueError(f"unknown wire dtype {dtype!r}")
        self.dtype = dtype
        self._lock = threading.Lock()
        self._seq: dict[tuple[str, int], int] = collections.defaultdict(int)
        self._sent: dict[tuple[str, int], collections.OrderedDict[int, Tensors]] = {}
        """Syncer end: per stream, the learner's reconstruction of each recent down frame, by sequence number."""
        self._got: dict[tuple[str, int], tuple[int, Tensors]] = {}
        """Learner end: per stream, the newest down frame's sequence number and reconstructed values."""

    @property
    def active(self) -> bool:
        return self.dtype != "fp32"

    # -- encoding ------------------------------------------------------------------------------------
    def _encode(self, msg: Message, ref: Tensors | None, ref_seq: int | None) -> tuple[Message, Tensors]:
        """`msg` with its tensors quantised (against `ref` if given), and what the receiver will rebuild."""
        use_ref = ref is not None and _same_layout(ref, msg.tensors)
        dtype = self.dtype if use_ref else FULL_DTYPE[self.dtype]
        out: Tensors = {}
        rebuilt: Tensors = {}
        shapes: dict[str, list[int]] = {}
        for name, t in msg.tensors.items():
            x = t.detach().to(torch.float32)
            base = ref[name].to(torch.float32) if use_ref and ref is not None else None
            q = quantize(x - base if base is not None else x, dtype)  # NonFiniteError: the caller sends as is
            out[name] = q.data
            if q.scales is not None:
                out[name + SCALE_SUFFIX] = q.scales
            shapes[name] = list(t.shape)
            back = dequantize(q).reshape(t.shape)
            rebuilt[name] = back + base if base is not None else back
        meta = dict(msg.meta, wire=dtype, wire_ref=ref_seq if use_ref else None, wire_shapes=shapes)
        return Message(msg.type, meta, out), rebuilt

    def encode(self, msg: Message) -> Message:
        """The frame to put on the socket for `msg` (an outer-loop frame, or anything else as it is)."""
        if not self.active or not msg.tensors or msg.type not in DOWN | UP:
            return msg
        key = _stream(msg)
        with self._lock:
            try:
                if msg.type in DOWN:
                    hist = self._sent.setdefault(key, collections.OrderedDict())
                    last = next(reversed(hist)) if hist else None
                    enc, rebuilt = self._encode(msg, hist[last] if last is not None else None, last)
                    self._seq[key] += 1
                    seq = self._seq[key]
                    enc.meta["wire_seq"] = seq
                    hist[seq] = rebuilt
                    while len(hist) > HISTORY:
                        hist.popitem(last=False)
                    return enc
                got = self._got.get(key)
                enc, _ = self._encode(msg, got[1] if got else None, got[0] if got else None)
                return enc
            except NonFiniteError:
                return msg

    # -- decoding ------------------------------------------------------------------------------------
    def decode(self, msg: Message) -> Message:
        """`msg` with its tensors rebuilt, if it was encoded (meta "wire"); raises WireDecodeError."""
        if "wire" not in msg.meta:
            return msg
        meta = dict(msg.meta)
        dtype, ref_seq, shapes = meta.pop("wire"), meta.pop("wire_ref", None), meta.pop("wire_shapes", None)
        seq = meta.pop("wire_seq", None)
        if (dtype not in WIRE_DTYPES or not isinstance(shapes, dict) or msg.type not in DOWN | UP
                or not (ref_seq is None or (isinstance(ref_seq, int) and not isinstance(ref_seq, bool)))):
            raise WireDecodeError(f"bad wire encoding {dtype!r} on a {msg.type.name}")
        key = _stream(msg)
        with self._lock:
            ref: Tensors | None = None
            if ref_seq is not None:
                if msg.type in UP:
                    hist = self._sent.get(key)
                    ref = hist.get(ref_seq) if hist is not None else None
                else:
                    got = self._got.get(key)
                    ref = got[1] if got is not None and got[0] == ref_seq else None
                if ref is None:
                    raise WireDecodeError(f"{msg.type.name} {key}: no reference value #{ref_seq}")
            tensors = {n: self._rebuild(dtype, n, shape, msg.tensors, ref) for n, shape in shapes.items()}
            if msg.type in DOWN:
                if not isinstance(seq, int):
                    raise WireDecodeError(f"{msg.type.name} without wire_seq")
                self._got[key] = (seq, tensors)
        return Message(msg.type, meta, tensors)

    @staticmethod
    def _rebuild(dtype: str, name: str, shape: Any, parts: Tensors, ref: Tensors | None) -> Tensor:
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise WireDecodeError(f"tensor {name!r}: bad shape {shape!r}")
        if name not in parts:
            raise WireDecodeError(f"tensor {name!r} missing")
        numel = 1
        for d in shape:
            numel *= d
        try:
            back = dequantize(Quantized(dtype, numel, parts[name], parts.get(name + SCALE_SUFFIX))).reshape(shape)
        except (ValueError, RuntimeError) as e:
            raise WireDecodeError(f"tensor {name!r}: {e}") from e
        if ref is not None:
            base = ref.get(name)
            if base is None or list(base.shape) != shape:
                raise WireDecodeError(f"tensor {name!r}: reference has no such tensor of shape {shape}")
            back = back + base
        return back


def wire_dtype_for(algorithm: str, wire_dtype: str) -> str:
    """The wire dtype a run's links use: `wire_dtype` for an algorithm with an outer step (its descriptor's
    `outer_step` trait: decoupled and diloco), fp32 for the others (ddp and elastic_ddp exchange gradients)."""
    return wire_dtype if algorithms.get(algorithm).outer_step else "fp32"
