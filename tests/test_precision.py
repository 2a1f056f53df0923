"""Tests for mlsys.precision: formats against IEEE definitions and torch.finfo, exact rounding
against torch casts, stochastic rounding, and clear errors for invalid arguments."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from mlsys import precision as P

TORCH_FORMATS = [name for name, f in P.FORMATS.items() if f.torch_dtype is not None]
SMALL_FORMATS = ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]  # few enough bit patterns to enumerate
INT_VIEW = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}


def _finite_values(name: str) -> torch.Tensor:
    """Every finite value of an 8- or 16-bit format, ascending, as float64 (from bit patterns)."""
    f = P.FORMATS[name]
    patterns = torch.arange(2**f.bits, dtype=torch.int64)
    if f.bits == 16:
        patterns = torch.where(patterns >= 2**15, patterns - 2**16, patterns)
    values = patterns.to(INT_VIEW[f.bits]).view(f.dtype).double()
    return torch.unique(values[torch.isfinite(values)])  # sorted; +0 and -0 merge


class CreatedDevices(TorchDispatchMode):
    """Records (op, device) of every tensor each aten op creates inside the `with` block."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self.seen += [(str(func), t.device.type) for t in tensors]
        return out


def _bits_of(value: float, name: str) -> int:
    f = P.FORMATS[name]
    raw = torch.tensor([value], dtype=torch.float64).to(f.dtype).view(INT_VIEW[f.bits]).item()
    return raw % 2**f.bits


# ---------------------------------------------------------------- the format table


@pytest.mark.parametrize("name", TORCH_FORMATS)
def test_table_matches_torch_finfo(name):
    f = P.FORMATS[name]
    info = torch.finfo(f.dtype)
    ours = (f.bits, f.max, f.smallest_normal, f.eps)
    assert ours == (info.bits, info.max, info.smallest_normal, info.eps)
    assert -f.max == info.min
    # The smallest subnormal is the bit pattern 0...01.
    one = torch.ones(1, dtype=INT_VIEW[f.bits]).view(f.dtype).item()
    assert f.smallest_subnormal == one


def test_table_matches_ieee_definitions():
    fp16, bf16, fp32, tf32 = (P.FORMATS[k] for k in ("fp16", "bf16", "fp32", "tf32"))
    assert fp16.max == (2 - 2**-10) * 2**15 and fp16.bias == 15
    assert fp16.smallest_normal == 2**-14 and fp16.smallest_subnormal == 2**-24
    assert fp32.max == (2 - 2**-23) * 2.0**127 and fp32.smallest_subnormal == 2.0**-149
    assert bf16.eps == 2**-7 and bf16.smallest_normal == fp32.smallest_normal
    # tf32: fp32's 8-bit exponent with fp16's 10-bit mantissa, 19 bits in all.
    assert (tf32.bits, tf32.bias, tf32.eps) == (19, 127, 2**-10)
    assert tf32.max == (2 - 2**-10) * 2.0**127 and tf32.smallest_normal == 2.0**-126
    assert tf32.smallest_subnormal == 2.0**-136
    e4m3, e5m2 = P.FORMATS["fp8_e4m3"], P.FORMATS["fp8_e5m2"]
    assert e4m3.max == 1.75 * 2**8 and e4m3.emax == 8  # all-ones exponent used; mantissa 111 is NaN
    assert e5m2.max == 1.75 * 2**15 and e5m2.emax == 15  # IEEE-style: all-ones exponent is inf/NaN
    assert [row["format"] for row in P.format_table()] == list(P.FORMATS)
    for row in P.format_table():
        assert row["bits"] == 1 + row["exponent_bits"] + row["mantissa_bits"]
        assert row["eps"] == 2.0 ** -row["mantissa_bits"]
        assert row["smallest_subnormal"] == row["smallest_normal"] * row["eps"]


def test_format_lookup_and_bad_formats():
    assert P.get_format(torch.bfloat16) is P.FORMATS["bf16"]
    assert P.get_format("float8_e4m3fn") is P.FORMATS["fp8_e4m3"]
    assert P.get_format("half") is P.FORMATS["fp16"]
    for bad in ("int8", "fp12", torch.int32):
        with pytest.raises(ValueError, match="fmt=.*not a floating-point format"):
            P.get_format(bad)
    with pytest.raises(ValueError, match="mantissa_bits must be a positive integer, got 0"):
        P.FloatFormat("odd", 4, 0)
    with pytest.raises(ValueError, match="has no torch dtype"):
        _ = P.FORMATS["tf32"].dtype


# ---------------------------------------------------------------- rounding, ulp, bits


@pytest.mark.parametrize("name", ["fp32", *SMALL_FORMATS])
def test_round_to_matches_torch_cast(name):
    f = P.FORMATS[name]
    g = torch.Generator().manual_seed(1)
    # Magnitudes from below the smallest subnormal to beyond max, both signs.
    lo, hi = math.log2(f.smallest_subnormal) - 2, math.log2(f.max) + 1
    source = torch.float64 if name == "fp32" else torch.float32  # a cast that rounds once
    mags = torch.exp2(lo + (hi - lo) * torch.rand(3000, generator=g, dtype=torch.float64))
    signs = torch.where(torch.rand(3000, generator=g) < 0.5, -1.0, 1.0).double()
    x = (mags * signs).to(source)
    x = x[torch.isfinite(x)]
    expected = P.saturating_cast(x, name).double().tolist()  # x.to(f.dtype) on torch 2.13
    assert [P.round_to(v, name) for v in x.tolist()] == expected


def test_torch_fn_cast_saturates_or_gives_nan_as_detected():
    cast = torch.tensor([460.0, 470.0, -1e4, math.inf]).to(torch.float8_e4m3fn).float().tolist()
    if P.TORCH_FN_CAST_SATURATES:  # torch 2.13
        assert cast == [448.0, 448.0, -448.0, 448.0]
    else:  # torch 2.11: from max + ulp/2 = 464 on, NaN
        assert cast[0] == 448.0 and all(math.isnan(v) for v in cast[1:])
    x = torch.tensor([460.0, 470.0, -1e4, math.inf, -math.inf, 3.0])
    assert P.saturating_cast(x, "fp8_e4m3").float().tolist() == [448.0, 448.0, -448.0, 448.0,
                                                                  -448.0, 3.0]
    assert math.isnan(P.saturating_cast(torch.tensor([math.nan]), "fp8_e4m3").float().item())
    assert P.saturating_cast(torch.tensor([1e6]), "fp8_e5m2").float().item() == math.inf


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_round_to_ties_go_to_even(name):
    values = _finite_values(name)
    step = max(1, len(values) // 6000)  # every tie of the fp8 formats, a spread of 6000 for 16 bits
    lower, upper = values[:-1][::step], values[1:][::step]
    mids = ((lower + upper) / 2).float()  # exact: one more bit than the format holds
    assert torch.equal(mids.double(), (lower + upper) / 2)
    expected = mids.to(P.FORMATS[name].dtype).double().tolist()
    got = [P.round_to(v, name) for v in mids.tolist()]
    assert got == expected
    # The winner of every finite tie has an even mantissa field (last bit 0).
    for v in got[:: max(1, len(got) // 500)]:
        if math.isfinite(v) and abs(v) < P.FORMATS[name].max:
            assert P.decompose(v, name).mantissa[-1] == "0"


def test_round_to_special_values():
    assert P.round_to(65519.0, "fp16") == 65504.0  # below max + ulp/2 = 65520
    assert P.round_to(65520.0, "fp16") == math.inf  # the tie rounds to even: 2^16, which overflows
    assert P.round_to(1e-8, "fp16") == 0.0 and P.round_to(1e-8, "bf16") != 0.0
    assert math.copysign(1.0, P.round_to(-1e-9, "fp16")) == -1.0  # underflow keeps the sign
    assert P.round_to(2049.0, "fp16") == 2048.0 and P.round_to(2051.0, "fp16") == 2052.0
    assert P.round_to(math.inf, "fp8_e4m3") == 448.0 and P.round_to(-1e6, "fp8_e4m3") == -448.0
    assert P.round_to(math.inf, "fp16") == math.inf and math.isnan(P.round_to(math.nan, "bf16"))


@pytest.mark.parametrize("name", ["fp32", "fp64"])
def test_ulp_matches_nextafter(name):
    dtype = P.FORMATS[name].dtype
    g = torch.Generator().manual_seed(2)
    x = torch.exp2(torch.randint(-140, 120, (500,), generator=g).double()) * (
        1 + torch.rand(500, generator=g, dtype=torch.float64))
    x = torch.cat([x.to(dtype), torch.tensor([0.0, 1.0, 2.0**-149], dtype=dtype)])
    gap = (torch.nextafter(x, torch.full_like(x, math.inf)) - x).double().tolist()
    assert [P.ulp(v, name) for v in x.double().tolist()] == gap


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_ulp_is_the_gap_to_the_next_bit_pattern(name):
    values = _finite_values(name)
    positive = values[values >= 0]
    gaps = (positive[1:] - positive[:-1]).tolist()
    assert [P.ulp(v, name) for v in positive[:-1].tolist()] == gaps
    with pytest.raises(ValueError, match="outside"):
        P.ulp(2 * P.FORMATS[name].max, name)


@pytest.mark.parametrize("name", TORCH_FORMATS)
def test_decompose_round_trips_and_matches_torch_bits(name):
    f = P.FORMATS[name]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(300, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-30, 30, (300,), generator=g).double())
    values = x.tolist() + [0.0, -0.0, f.smallest_subnormal, f.smallest_normal, f.max, -f.max, 1.0]
    for v in values:
        bits = P.decompose(v, name)
        stored = P.round_to(v, name)
        assert bits.reconstruct() == stored
        assert math.copysign(1, bits.reconstruct()) == math.copysign(1, stored)
        assert len(bits.pattern.replace(" ", "")) == f.bits
        assert int(bits.pattern.replace(" ", ""), 2) == _bits_of(stored, name)


def test_decompose_kinds():
    assert P.decompose(1.0, "fp16").pattern == "0 01111 0000000000"
    assert P.decompose(1.0, "fp16").unbiased_exponent == 0
    assert P.decompose(2**-24, "fp16").kind == "subnormal"
    assert P.decompose(1e-8, "fp16").kind == "zero"
    assert P.decompose(1e5, "fp16").kind == "inf"
    assert P.decompose(1e5, "fp16").unbiased_exponent is None
    assert P.decompose(1e5, "fp8_e4m3").value == 448.0
    assert P.decompose(math.nan, "fp8_e4m3").pattern == "0 1111 111"
    assert math.isnan(P.decompose(math.nan, "fp16").reconstruct())


def test_stochastic_round_is_unbiased_and_lands_on_neighbours():
    g = torch.Generator().manual_seed(6)
    x = torch.full((20_000,), 1.0 + 2**-9)  # between bf16's 1 and 1 + 2^-7, a quarter of the way
    out = P.stochastic_round(x, "bf16", generator=g)
    assert set(out.tolist()) == {1.0, 1.0 + 2**-7}
    # Bernoulli(1/4) draws: the mean lies within 5 standard errors of x.
    std_error = 2**-7 * math.sqrt(0.25 * 0.75 / x.numel())
    assert abs(out.mean().item() - (1 + 2**-9)) < 5 * std_error
    again = P.stochastic_round(x, "bf16", generator=torch.Generator().manual_seed(6))
    assert torch.equal(out, again)
    y = torch.randn(1000, generator=g, dtype=torch.float64)
    rounded = P.stochastic_round(y, "fp16", generator=g).tolist()
    assert all(P.round_to(v, "fp16") == v for v in rounded)
    assert all(abs(r - v) < P.ulp(v, "fp16") for r, v in zip(rounded, y.tolist(), strict=True))
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        P.stochastic_round(torch.arange(3), "bf16", generator=g)


def test_stochastic_round_creates_everything_on_the_input_device():
    # meta tensors have a device but no data: an op mixing them with a CPU tensor fails, and the
    # recorder sees where every intermediate tensor is created
    x = torch.full((4, 3), 1.0 + 2**-9, device="meta")
    with CreatedDevices() as created:
        out = P.stochastic_round(x, "bf16", generator=torch.Generator().manual_seed(0))
    assert out.device.type == "meta" and out.shape == x.shape and out.dtype == torch.float64
    # only the uniform draws live with the (CPU) generator, then move to x's device
    assert [op for op, device in created.seen if device != "meta"] == ["aten.rand.generator"]


NAN, INF = float("nan"), float("inf")
F16 = P.FORMATS["fp16"]
X = torch.ones(3)

INVALID_CALLS = [  # (call, error, message fragment)
    (lambda: P.get_format(None), TypeError, "fmt must be a format name"),
    (lambda: P.get_format(["bf16"]), TypeError, "fmt must be a format name"),
    (lambda: P.get_format(16), TypeError, "fmt must be a format name"),
    (lambda: P.get_format("int8"), ValueError, "fmt='int8' is not a floating-point format"),
    (lambda: P.get_format("fp12"), ValueError, "fmt='fp12' is not a floating-point format"),
    (lambda: P.get_format(torch.int32), ValueError, "not a floating-point format"),
    (lambda: P.get_format(None, name="dtype"), TypeError, "dtype must be a format name"),
    (lambda: P.FloatFormat("x", 1, 3), ValueError, "exponent_bits must be an integer >= 2"),
    (lambda: P.FloatFormat("x", 4, 0), ValueError, "mantissa_bits must be a positive integer"),
    (lambda: P.FloatFormat("x", True, 3), TypeError, "exponent_bits must be an integer, got True"),
    (lambda: P.FloatFormat("x", 4.0, 3), TypeError, "exponent_bits must be an integer"),
    (lambda: P.FloatFormat("", 4, 3), TypeError, "name must be a non-empty string"),
    (lambda: P.FloatFormat("x", 4, 3, finite_only="yes"), ValueError, "finite_only='yes'"),
    (lambda: P.round_to("1", "fp16"), TypeError, "x must be a real number, got '1'"),
    (lambda: P.round_to(None, "fp16"), TypeError, "x must be a real number"),
    (lambda: P.round_to(1.0, "int8"), ValueError, "fmt='int8'"),
    (lambda: P.round_to(1.0, None), TypeError, "fmt must be a format name"),
    (lambda: P.ulp(INF, "fp16"), ValueError, "x must be finite, got inf"),
    (lambda: P.ulp(NAN, "fp16"), ValueError, "x must be finite, got nan"),
    (lambda: P.ulp("1", "fp16"), TypeError, "x must be a real number"),
    (lambda: P.ulp(1e6, "fp16"), ValueError, "outside fp16's finite range"),
    (lambda: P.decompose(None, "fp16"), TypeError, "x must be a real number"),
    (lambda: P.decompose(1.0, "fp4"), ValueError, "fmt='fp4'"),
    (lambda: P.floor_log2(Fraction(0)), ValueError, "q must be > 0, got 0"),
    (lambda: P.floor_log2(Fraction(-1, 2)), ValueError, "q must be > 0"),
    (lambda: P.floor_log2(0.5), TypeError, "q must be a Fraction or an int, got 0.5"),
    (lambda: P.ulp_exponent(Fraction(-1), F16), ValueError, "magnitude must be >= 0"),
    (lambda: P.ulp_exponent(Fraction(1), "fp16"), TypeError, "f must be a FloatFormat"),
    (lambda: P.round_exact(0.1, F16), TypeError, "x must be a Fraction or an int, got 0.1"),
    (lambda: P.round_exact(Fraction(1, 10), "fp16"), TypeError, "f must be a FloatFormat"),
    (lambda: P.stochastic_round(torch.arange(3), "bf16", generator=torch.Generator()), TypeError,
     "x must be a floating-point tensor"),
    (lambda: P.stochastic_round([1.0], "bf16", generator=torch.Generator()), TypeError,
     "x must be a floating-point tensor, got list"),
    (lambda: P.stochastic_round(X, "bf16", generator=0), TypeError,
     "generator must be a torch.Generator, got int"),
    (lambda: P.stochastic_round(X, "fp12", generator=torch.Generator()), ValueError, "fmt='fp12'"),
]


@pytest.mark.parametrize(("call", "error", "message"), INVALID_CALLS)
def test_invalid_calls_raise_clear_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()

