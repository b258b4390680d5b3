"""Round trips of diloco_chaos/trainers/quantize.py: error bounds per wire dtype, int4 packing, NaN/Inf refused,
sizes."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from diloco_chaos.trainers.quantize import (
    BLOCK,
    QMAX,
    WIRE_DTYPES,
    NonFiniteError,
    Quantized,
    bytes_per_element,
    dequantize,
    quantize,
    round_trip,
)


def _per_element_scale(q: Quantized) -> torch.Tensor:
    assert q.scales is not None
    return q.scales.to(torch.float32).repeat_interleave(BLOCK)[: q.numel]


@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 127, 1000, 4097])
def test_int_error_within_half_a_step(dtype: str, n: int) -> None:
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * torch.logspace(-6, 2, n)  # blocks of very different magnitudes
    q = quantize(x, dtype)
    back = dequantize(q)
    assert back.shape == (n,)
    step = _per_element_scale(q)
    assert bool(((x - back).abs() <= step / 2 + 1e-12 * x.abs()).all())
    # the stored scale is at most 2^-7 (plus bf16 rounding) above absmax / QMAX: the grid is not coarsened
    blocks = -(-n // BLOCK)
    padded = torch.zeros(blocks * BLOCK)
    padded[:n] = x
    exact = padded.view(blocks, BLOCK).abs().amax(1) / QMAX[dtype]
    assert q.scales is not None
    ratio = q.scales.float() / exact.clamp_min(1e-30)
    assert bool((ratio >= 1.0).all()) and bool((ratio <= 1.0 + 2**-6).all())


def test_bf16_relative_error() -> None:
    x = torch.randn(10_000) * torch.logspace(-20, 20, 10_000)
    back = round_trip(x, "bf16")
    assert bool(((x - back).abs() <= x.abs() * 2.0**-8).all())


def test_fp32_is_exact() -> None:
    x = torch.randn(3, 5, 7)
    assert torch.equal(round_trip(x, "fp32"), x)


@pytest.mark.parametrize("dtype", WIRE_DTYPES)
def test_zeros_and_shape(dtype: str) -> None:
    x = torch.zeros(4, 33)
    back = round_trip(x, dtype)
    assert back.shape == x.shape and torch.equal(back, x)
    assert round_trip(torch.zeros(0), dtype).numel() == 0


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_block_extremes_exact(dtype: str) -> None:
    """A block's largest |value| is on the grid's end up to the scale's bf16 rounding, and 0 stays 0."""
    x = torch.tensor([0.0, 1.0, -1.0, 0.5] * 16)
    back = round_trip(x, dtype)
    assert back[0] == 0.0
    assert math.isclose(float(back[1]), 1.0, rel_tol=2**-6) and float(back[2]) == -float(back[1])


@pytest.mark.parametrize("n", [1, 3, 5, 63, 65, 129])
def test_int4_packing_odd_lengths(n: int) -> None:
    """Every value -7..7 survives packing at any length, low nibble first."""
    levels = torch.arange(n, dtype=torch.float32) % 15 - 7.0
    levels[0] = 7.0  # each block's absmax is 7 => scale 1 (stored a little above: rounded back exactly)
    x = levels.clone()
    for b in range(0, n, BLOCK):
        x[b] = 7.0
    q = quantize(x, "int4")
    assert q.data.numel() == -(-n // 2)
    back = dequantize(q)
    assert torch.equal(back.round(), x)


@pytest.mark.parametrize("dtype", WIRE_DTYPES)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_refused(dtype: str, bad: float) -> None:
    x = torch.randn(200)
    x[137] = bad
    with pytest.raises(NonFiniteError):
        quantize(x, dtype)


def test_bf16_overflow_refused() -> None:
    with pytest.raises(NonFiniteError):
        quantize(torch.tensor([3.4e38]), "bf16")


def test_unknown_dtype() -> None:
    with pytest.raises(ValueError):
        quantize(torch.ones(3), "int2")


@pytest.mark.parametrize("dtype", WIRE_DTYPES)
def test_bytes_per_element_matches_encoding(dtype: str) -> None:
    n = 64 * 100
    q = quantize(torch.randn(n), dtype)
    assert q.nbytes() == pytest.approx(bytes_per_element(dtype, n) * n)
    assert bytes_per_element("int4") / 4.0 <= 0.135
    assert bytes_per_element("bf16") / 4.0 == 0.5


def test_malformed_parts_rejected() -> None:
    q = quantize(torch.randn(100), "int4")
    with pytest.raises(ValueError):
        dequantize(Quantized("int4", 101, q.data, q.scales))
    with pytest.raises(ValueError):
        dequantize(Quantized("int4", 100, q.data, None))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=1, max_size=300),
       st.sampled_from(["int8", "int4"]))
def test_int_bound_property(values: list[float], dtype: str) -> None:
    x = torch.tensor(values, dtype=torch.float32)
    q = quantize(x, dtype)
    err = (x - dequantize(q)).abs()
    assert bool((err <= _per_element_scale(q) / 2 * (1 + 1e-6)).all())
