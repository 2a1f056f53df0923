"""Tests for mlsys.numerics.precision: formats against IEEE definitions and torch.finfo, exact
rounding against torch casts, ulps, stochastic rounding, and clear errors for invalid arguments."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from numerics_cases import CreatedDevices

from mlsys.numerics import bit_fields, precision

TORCH_FORMATS = [name for name, f in precision.FORMATS.items() if f.torch_dtype is not None]
SMALL_FORMATS = ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]  # few enough bit patterns to enumerate
INT_VIEW = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}


def _finite_values(name: str) -> torch.Tensor:
    """Every finite value of an 8- or 16-bit format, ascending, as float64 (from bit patterns)."""
    f = precision.FORMATS[name]
    patterns = torch.arange(2**f.bits, dtype=torch.int64)
    if f.bits == 16:
        patterns = torch.where(patterns >= 2**15, patterns - 2**16, patterns)
    values = patterns.to(INT_VIEW[f.bits]).view(f.dtype).double()
    return torch.unique(values[torch.isfinite(values)])  # sorted; +0 and -0 merge


# ---------------------------------------------------------------- the format table


@pytest.mark.parametrize("name", TORCH_FORMATS)
def test_table_matches_torch_finfo(name):
    f = precision.FORMATS[name]
    info = torch.finfo(f.dtype)
    ours = (f.bits, f.max, f.smallest_normal, f.eps)
    assert ours == (info.bits, info.max, info.smallest_normal, info.eps)
    assert -f.max == info.min
    # The smallest subnormal is the bit pattern 0...01.
    one = torch.ones(1, dtype=INT_VIEW[f.bits]).view(f.dtype).item()
    assert f.smallest_subnormal == one


def test_table_matches_ieee_definitions():
    fp16, bf16, fp32, tf32 = (precision.FORMATS[k] for k in ("fp16", "bf16", "fp32", "tf32"))
    assert fp16.max == (2 - 2**-10) * 2**15 and fp16.bias == 15
    assert fp16.smallest_normal == 2**-14 and fp16.smallest_subnormal == 2**-24
    assert fp32.max == (2 - 2**-23) * 2.0**127 and fp32.smallest_subnormal == 2.0**-149
    assert bf16.eps == 2**-7 and bf16.smallest_normal == fp32.smallest_normal
    # tf32: fp32's 8-bit exponent with fp16's 10-bit mantissa, 19 bits in all.
    assert (tf32.bits, tf32.bias, tf32.eps) == (19, 127, 2**-10)
    assert tf32.max == (2 - 2**-10) * 2.0**127 and tf32.smallest_normal == 2.0**-126
    assert tf32.smallest_subnormal == 2.0**-136
    e4m3, e5m2 = precision.FORMATS["fp8_e4m3"], precision.FORMATS["fp8_e5m2"]
    assert e4m3.max == 1.75 * 2**8 and e4m3.emax == 8  # all-ones exponent used; mantissa 111 is NaN
    assert e5m2.max == 1.75 * 2**15 and e5m2.emax == 15  # IEEE-style: all-ones exponent is inf/NaN
    assert [row["format"] for row in precision.format_table()] == list(precision.FORMATS)
    for row in precision.format_table():
        assert row["bits"] == 1 + row["exponent_bits"] + row["mantissa_bits"]
        assert row["eps"] == 2.0 ** -row["mantissa_bits"]
        assert row["smallest_subnormal"] == row["smallest_normal"] * row["eps"]


def test_format_lookup_and_bad_formats():
    assert precision.get_format(torch.bfloat16) is precision.FORMATS["bf16"]
    assert precision.get_format("float8_e4m3fn") is precision.FORMATS["fp8_e4m3"]
    assert precision.get_format("half") is precision.FORMATS["fp16"]
    for bad in ("int8", "fp12", torch.int32):
        with pytest.raises(ValueError, match="fmt=.*not a floating-point format"):
            precision.get_format(bad)
    with pytest.raises(ValueError, match="mantissa_bits must be a positive integer, got 0"):
        precision.FloatFormat("odd", 4, 0)
    with pytest.raises(ValueError, match="has no torch dtype"):
        _ = precision.FORMATS["tf32"].dtype


# ---------------------------------------------------------------- rounding, ulp, bits


@pytest.mark.parametrize("name", ["fp32", *SMALL_FORMATS])
def test_round_to_matches_torch_cast(name):
    f = precision.FORMATS[name]
    g = torch.Generator().manual_seed(1)
    # Magnitudes from below the smallest subnormal to beyond max, both signs.
    lo, hi = math.log2(f.smallest_subnormal) - 2, math.log2(f.max) + 1
    source = torch.float64 if name == "fp32" else torch.float32  # a cast that rounds once
    mags = torch.exp2(lo + (hi - lo) * torch.rand(3000, generator=g, dtype=torch.float64))
    signs = torch.where(torch.rand(3000, generator=g) < 0.5, -1.0, 1.0).double()
    x = (mags * signs).to(source)
    x = x[torch.isfinite(x)]
    expected = precision.saturating_cast(x, name).double().tolist()  # x.to(f.dtype) on torch 2.13
    assert [precision.round_to(v, name) for v in x.tolist()] == expected


def test_torch_fn_cast_saturates_or_gives_nan_as_detected():
    cast = torch.tensor([460.0, 470.0, -1e4, math.inf]).to(torch.float8_e4m3fn).float().tolist()
    if precision.torch_fn_cast_saturates():  # torch 2.13
        assert cast == [448.0, 448.0, -448.0, 448.0]
    else:  # torch 2.11: from max + ulp/2 = 464 on, NaN
        assert cast[0] == 448.0 and all(math.isnan(v) for v in cast[1:])
    x = torch.tensor([460.0, 470.0, -1e4, math.inf, -math.inf, 3.0])
    assert precision.saturating_cast(x, "fp8_e4m3").float().tolist() == [
        448.0, 448.0, -448.0, 448.0, -448.0, 3.0]
    nan = precision.saturating_cast(torch.tensor([math.nan]), "fp8_e4m3").float().item()
    assert math.isnan(nan)
    assert precision.saturating_cast(torch.tensor([1e6]), "fp8_e5m2").float().item() == math.inf


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_round_to_ties_go_to_even(name):
    values = _finite_values(name)
    step = max(1, len(values) // 6000)  # every tie of the fp8 formats, a spread of 6000 for 16 bits
    lower, upper = values[:-1][::step], values[1:][::step]
    mids = ((lower + upper) / 2).float()  # exact: one more bit than the format holds
    assert torch.equal(mids.double(), (lower + upper) / 2)
    expected = mids.to(precision.FORMATS[name].dtype).double().tolist()
    got = [precision.round_to(v, name) for v in mids.tolist()]
    assert got == expected
    # The winner of every finite tie has an even mantissa field (last bit 0).
    for v in got[:: max(1, len(got) // 500)]:
        if math.isfinite(v) and abs(v) < precision.FORMATS[name].max:
            assert bit_fields.decompose(v, name).mantissa[-1] == "0"


def test_round_to_special_values():
    assert precision.round_to(65519.0, "fp16") == 65504.0  # below max + ulp/2 = 65520
    # the tie rounds to even: 2^16, which overflows
    assert precision.round_to(65520.0, "fp16") == math.inf
    assert precision.round_to(1e-8, "fp16") == 0.0 and precision.round_to(1e-8, "bf16") != 0.0
    assert math.copysign(1.0, precision.round_to(-1e-9, "fp16")) == -1.0  # underflow keeps the sign
    assert precision.round_to(2049.0, "fp16") == 2048.0
    assert precision.round_to(2051.0, "fp16") == 2052.0
    assert precision.round_to(math.inf, "fp8_e4m3") == 448.0
    assert precision.round_to(-1e6, "fp8_e4m3") == -448.0
    assert precision.round_to(math.inf, "fp16") == math.inf
    assert math.isnan(precision.round_to(math.nan, "bf16"))


@pytest.mark.parametrize("name", ["fp32", "fp64"])
def test_ulp_matches_nextafter(name):
    dtype = precision.FORMATS[name].dtype
    g = torch.Generator().manual_seed(2)
    x = torch.exp2(torch.randint(-140, 120, (500,), generator=g).double()) * (
        1 + torch.rand(500, generator=g, dtype=torch.float64))
    x = torch.cat([x.to(dtype), torch.tensor([0.0, 1.0, 2.0**-149], dtype=dtype)])
    gap = (torch.nextafter(x, torch.full_like(x, math.inf)) - x).double().tolist()
    assert [precision.ulp(v, name) for v in x.double().tolist()] == gap


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_ulp_is_the_gap_to_the_next_bit_pattern(name):
    values = _finite_values(name)
    positive = values[values >= 0]
    gaps = (positive[1:] - positive[:-1]).tolist()
    assert [precision.ulp(v, name) for v in positive[:-1].tolist()] == gaps
    with pytest.raises(ValueError, match="outside"):
        precision.ulp(2 * precision.FORMATS[name].max, name)


def test_stochastic_round_is_unbiased_and_lands_on_neighbours():
    g = torch.Generator().manual_seed(6)
    x = torch.full((20_000,), 1.0 + 2**-9)  # between bf16's 1 and 1 + 2^-7, a quarter of the way
    out = precision.stochastic_round(x, "bf16", generator=g)
    assert set(out.tolist()) == {1.0, 1.0 + 2**-7}
    # Bernoulli(1/4) draws: the mean lies within 5 standard errors of x.
    std_error = 2**-7 * math.sqrt(0.25 * 0.75 / x.numel())
    assert abs(out.mean().item() - (1 + 2**-9)) < 5 * std_error
    again = precision.stochastic_round(x, "bf16", generator=torch.Generator().manual_seed(6))
    assert torch.equal(out, again)
    y = torch.randn(1000, generator=g, dtype=torch.float64)
    rounded = precision.stochastic_round(y, "fp16", generator=g).tolist()
    assert all(precision.round_to(v, "fp16") == v for v in rounded)
    assert all(abs(r - v) < precision.ulp(v, "fp16")
               for r, v in zip(rounded, y.tolist(), strict=True))
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        precision.stochastic_round(torch.arange(3), "bf16", generator=g)


def test_stochastic_round_creates_everything_on_the_input_device():
    # meta tensors have a device but no data: an op mixing them with a CPU tensor fails, and the
    # recorder sees where every intermediate tensor is created
    x = torch.full((4, 3), 1.0 + 2**-9, device="meta")
    with CreatedDevices() as created:
        out = precision.stochastic_round(x, "bf16", generator=torch.Generator().manual_seed(0))
    assert out.device.type == "meta" and out.shape == x.shape and out.dtype == torch.float64
    # only the uniform draws live with the (CPU) generator, then move to x's device
    assert [op for op, device in created.seen if device != "meta"] == ["aten.rand.generator"]


NAN, INF = float("nan"), float("inf")
F16 = precision.FORMATS["fp16"]
X = torch.ones(3)

INVALID_CALLS = [  # (call, error, message fragment)
    (lambda: precision.get_format(None), TypeError, "fmt must be a format name"),
    (lambda: precision.get_format(["bf16"]), TypeError, "fmt must be a format name"),
    (lambda: precision.get_format(16), TypeError, "fmt must be a format name"),
    (lambda: precision.get_format("int8"), ValueError, "fmt='int8' is not a floating-point format"),
    (lambda: precision.get_format("fp12"), ValueError, "fmt='fp12' is not a floating-point format"),
    (lambda: precision.get_format(torch.int32), ValueError, "not a floating-point format"),
    (lambda: precision.get_format(None, name="dtype"), TypeError, "dtype must be a format name"),
    (lambda: precision.FloatFormat("x", 1, 3), ValueError, "exponent_bits must be an integer >= 2"),
    (lambda: precision.FloatFormat("x", 4, 0), ValueError,
     "mantissa_bits must be a positive integer"),
    (lambda: precision.FloatFormat("x", True, 3), TypeError,
     "exponent_bits must be an integer, got True"),
    (lambda: precision.FloatFormat("x", 4.0, 3), TypeError, "exponent_bits must be an integer"),
    (lambda: precision.FloatFormat("", 4, 3), TypeError, "name must be a non-empty string"),
    (lambda: precision.FloatFormat("x", 4, 3, finite_only="yes"), ValueError, "finite_only='yes'"),
    (lambda: precision.round_to("1", "fp16"), TypeError, "x must be a real number, got '1'"),
    (lambda: precision.round_to(None, "fp16"), TypeError, "x must be a real number"),
    (lambda: precision.round_to(1.0, "int8"), ValueError, "fmt='int8'"),
    (lambda: precision.round_to(1.0, None), TypeError, "fmt must be a format name"),
    (lambda: precision.ulp(INF, "fp16"), ValueError, "x must be finite, got inf"),
    (lambda: precision.ulp(NAN, "fp16"), ValueError, "x must be finite, got nan"),
    (lambda: precision.ulp("1", "fp16"), TypeError, "x must be a real number"),
    (lambda: precision.ulp(1e6, "fp16"), ValueError, "outside fp16's finite range"),
    (lambda: precision.floor_log2(Fraction(0)), ValueError, "q must be > 0, got 0"),
    (lambda: precision.floor_log2(Fraction(-1, 2)), ValueError, "q must be > 0"),
    (lambda: precision.floor_log2(0.5), TypeError, "q must be a Fraction or an int, got 0.5"),
    (lambda: precision.ulp_exponent(Fraction(-1), F16), ValueError, "magnitude must be >= 0"),
    (lambda: precision.ulp_exponent(Fraction(1), "fp16"), TypeError, "f must be a FloatFormat"),
    (lambda: precision.round_exact(0.1, F16), TypeError, "x must be a Fraction or an int, got 0.1"),
    (lambda: precision.round_exact(Fraction(1, 10), "fp16"), TypeError, "f must be a FloatFormat"),
    (lambda: precision.stochastic_round(torch.arange(3), "bf16", generator=torch.Generator()),
     TypeError, "x must be a floating-point tensor"),
    (lambda: precision.stochastic_round([1.0], "bf16", generator=torch.Generator()), TypeError,
     "x must be a floating-point tensor, got list"),
    (lambda: precision.stochastic_round(X, "bf16", generator=0), TypeError,
     "generator must be a torch.Generator, got int"),
    (lambda: precision.stochastic_round(X, "fp12", generator=torch.Generator()), ValueError,
     "fmt='fp12'"),
]


@pytest.mark.parametrize(("call", "error", "message"), INVALID_CALLS)
def test_invalid_calls_raise_clear_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()

