"""Quantise and dequantise tensors for the wire: fp32, bf16, int8 and int4 (issue 17, wire precision).

Why: the outer traffic (fragments up, merged fragments down) crossed the links as fp32, four times what the
paper sends (bf16 by default, int4 reported nearly lossless), so link-chaos runs overstated what a slow link
costs. This module is the numerical part only (pure torch, no harness imports); what is quantised (a delta
against a reference both ends hold, diloco_chaos/harness/wire/precision.py) and why is decided there.

Formats, per element (`bytes_per_element`):

* ``fp32``: the tensor as it is (4 bytes).
* ``bf16``: ``Tensor.to(bfloat16)``, round to nearest even: relative error <= 2^-8 of |x| (half an ulp) (2 bytes).
* ``int8`` / ``int4``: symmetric per-block scales over blocks of ``BLOCK`` = 64 consecutive elements of the
  flattened tensor: scale = absmax(block) / QMAX (127, 7), stored as bfloat16 and rounded *up*, so
  |x| / scale <= QMAX and nothing clips; q = round(x / scale) (round to nearest, ties to even), so
  |x - scale * q| <= scale / 2 per element. int8 stores q as one signed byte; int4 stores q + 8 (1..15) as a
  nibble, two per byte, the low nibble first; an odd count is padded with one nibble. 64 elements of int4
  take 32 + 2 bytes (0.53 bytes per element, 0.133 of fp32); of int8, 64 + 2 (1.03).

Choices: block 64 keeps one outlier from coarsening more than 64 neighbours' grid (128 would save 0.016
bytes per element at int4 and double that reach). Rounding is to nearest, not stochastic: both ends can
compute the receiver's value from what was sent without sharing a random stream, and the wire codec sends
deltas against the receiver's own reconstruction (closed loop), so a rounding error is not carried forward
or summed: the next transfer's delta includes it. NaN or Inf in the input raise `NonFiniteError` before
anything is encoded: a NaN must never reach a merge (diloco_chaos/trainers/merge/outer_gradient.py), and a scale taken
from an Inf
would turn a whole block into NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

WireDtype = Literal["fp32", "bf16", "int8", "int4"]
WIRE_DTYPES: tuple[str, ...] = ("fp32", "bf16", "int8", "int4")
BLOCK = 64
"""Elements per int8/int4 scale."""
QMAX = {"int8": 127, "int4": 7}
"""Largest |q| of each integer format (symmetric: -QMAX..QMAX, so 0 is exact and the grid has no bias)."""
_MIN_SCALE = 1e-30
"""A block of zeros (or of values this small) gets this scale instead of 0, so dividing by it is safe."""


class NonFiniteError(ValueError):
    """The tensor to send holds NaN or Inf: refused before anything is encoded."""


@dataclass(frozen=True)
class Quantized:
    """One tensor in a wire format: `data` (fp32, bf16 or uint8 bytes) and, for int8/int4, per-block scales."""

    dtype: str
    """One of WIRE_DTYPES."""
    numel: int
    """Elements of the original (flattened) tensor."""
    data: Tensor
    """fp32 / bf16: the values, flat. int8: one byte per element (q as int8, viewed as uint8). int4: ceil(numel
    / 2) bytes, two nibbles (q + 8) per byte, low nibble first."""
    scales: Tensor | None = None
    """int8 / int4: bfloat16, one per block of BLOCK elements (ceil(numel / BLOCK)); None otherwise."""

    def nbytes(self) -> int:
        """Bytes this takes on the wire (data and scales)."""
        n = self.data.numel() * self.data.element_size()
        return n + (0 if self.scales is None else self.scales.numel() * self.scales.element_size())


def bytes_per_element(dtype: str, numel: int = BLOCK * 1024) -> float:
    """Wire bytes per element of a tensor of `numel` elements (scales included)."""
    check_dtype(dtype)
    if dtype == "fp32":
        return 4.0
    if dtype == "bf16":
        return 2.0
    blocks = -(-numel // BLOCK)
    data = numel if dtype == "int8" else -(-numel // 2)
    return (data + 2 * blocks) / numel


def check_dtype(dtype: str) -> None:
    if dtype not in WIRE_DTYPES:
        raise ValueError(f"unknown wire dtype {dtype!r}; one of {WIRE_DTYPES}")


def check_finite(x: Tensor, what: str = "tensor") -> None:
    """Raise NonFiniteError if `x` holds NaN or Inf."""
    if x.numel() and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise NonFiniteError(f"{what}: {bad} of {x.numel()} values are NaN or Inf; not sent")


def quantize(x: Tensor, dtype: str) -> Quantized:
    """`x` (any shape, floating) in wire format `dtype`. Raises NonFiniteError on NaN/Inf, ValueError on an
    unknown dtype."""
    check_dtype(dtype)
    flat = x.detach().reshape(-1).to(torch.float32)
    check_finite(flat)
    n = flat.numel()
    if dtype == "fp32":
        return Quantized(dtype, n, flat.clone())
    if dtype == "bf16":
        data = flat.to(torch.bfloat16)
        check_finite(data, "tensor in bf16 (a value beyond bf16's range)")
        return Quantized(dtype, n, data)
    qmax = QMAX[dtype]
    blocks = -(-n // BLOCK)
    padded = torch.zeros(blocks * BLOCK, dtype=torch.float32)
    padded[:n] = flat
    view = padded.view(blocks, BLOCK)
    scale = (view.abs().amax(dim=1) / qmax).clamp_min(_MIN_SCALE)
    # bf16 keeps 8 significant bits, so scaling up by 2^-7 first makes the stored scale >= the exact one
    scales = (scale * (1.0 + 2.0**-7)).to(torch.bfloat16)
    q = torch.round(view / scales.to(torch.float32).unsqueeze(1)).clamp_(-qmax, qmax).to(torch.int8)
    q = q.reshape(-1)[:n]
    if dtype == "int8":
        return Quantized(dtype, n, q.view(torch.uint8).clone(), scales)
    nib = (q.to(torch.int16) + 8).to(torch.uint8)
    if n % 2:
        nib = torch.cat([nib, torch.full((1,), 8, dtype=torch.uint8)])
    pairs = nib.view(-1, 2)
    packed = pairs[:, 0] | (pairs[:, 1] << 4)
    return Quantized(dtype, n, packed.contiguous(), scales)


def dequantize(q: Quantized) -> Tensor:
    """The flat float32 tensor `q` stands for. Raises ValueError if `q`'s parts do not fit together."""
    check_dtype(q.dtype)
    n = q.numel
    if q.dtype in ("fp32", "bf16"):
        want = torch.float32 if q.dtype == "fp32" else torch.bfloat16
        if q.data.dtype != want or q.data.numel() != n:
            raise ValueError(f"{q.dtype}: data is {q.data.dtype}[{q.data.numel()}], expected {want}[{n}]")
        return q.data.to(torch.float32).reshape(-1)
    blocks = -(-n // BLOCK)
    if q.scales is None or q.scales.dtype != torch.bfloat16 or q.scales.numel() != blocks:
        raise ValueError(f"{q.dtype}: expected {blocks} bfloat16 scales")
    want_bytes = n if q.dtype == "int8" else -(-n // 2)
    if q.data.dtype != torch.uint8 or q.data.numel() != want_bytes:
        raise ValueError(f"{q.dtype}: data is {q.data.dtype}[{q.data.numel()}], expected uint8[{want_bytes}]")
    if q.dtype == "int8":
        vals = q.data.reshape(-1).view(torch.int8).to(torch.float32)
    else:
        b = q.data.reshape(-1)
        vals = torch.stack([b & 0x0F, b >> 4], dim=1).reshape(-1)[:n].to(torch.float32) - 8.0
    scales = q.scales.to(torch.float32)
    if not bool(torch.isfinite(scales).all()):
        raise ValueError(f"{q.dtype}: non-finite scale")
    per_elem = scales.repeat_interleave(BLOCK)[:n]
    return vals * per_elem


def round_trip(x: Tensor, dtype: str) -> Tensor:
    """dequantize(quantize(x, dtype)), in `x`'s shape: what the receiver of `x` gets."""
    return dequantize(quantize(x, dtype)).reshape(x.shape)
