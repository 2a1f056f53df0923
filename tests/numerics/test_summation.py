"""mlsys.numerics.summation: predicted plateaus against measured sums, Kahan and recursive-sum
bounds."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from numerics_cases import CreatedDevices

from mlsys.numerics import precision, summation

# ---------------------------------------------------------------- running sums


def _steps_to_plateau(addend: float, fmt: str) -> int:
    """Enough additions to reach the plateau: every step adds at least about a/2 on the way."""
    plateau = summation.plateau_value(precision.round_to(addend, fmt), fmt)
    return min(20_000, math.ceil(2.2 * plateau / addend))


@pytest.mark.parametrize("addend", [0.01, 0.001, 0.1, 1 / 3])
@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp32"])
def test_plateau_prediction_equals_measured_sum(addend, fmt):
    n = 3000 if fmt == "fp32" else _steps_to_plateau(addend, fmt)
    predicted = summation.plateau_sum(addend, n, fmt)
    measured = summation.running_sum(addend, n, fmt)
    assert measured.dtype == precision.FORMATS[fmt].dtype
    assert measured.double().tolist() == predicted.trajectory()  # bit for bit, every step
    assert measured[-1].item() == predicted.final
    if fmt == "fp32":
        assert predicted.stall_step is None
    else:
        assert predicted.stall_step is not None
        assert predicted.final == summation.plateau_value(predicted.addend, fmt)
        # The addition after the stall is the first that is below half an ulp of the sum.
        assert predicted.addend <= precision.ulp(predicted.final, fmt) / 2
        assert measured[predicted.stall_step - 1].item() == predicted.final
        assert measured[predicted.stall_step - 2].item() < predicted.final


@pytest.mark.parametrize("addend_fmt", ["fp16", "bf16"])
@pytest.mark.parametrize("explicit_cast", [False, True])
def test_fp32_accumulator_with_low_precision_addends(addend_fmt, explicit_cast):
    predicted = summation.plateau_sum(0.01, 1000, "fp32", addend_format=addend_fmt)
    measured = summation.running_sum(0.01, 1000, addend_fmt, "fp32", explicit_cast=explicit_cast)
    assert measured.dtype == torch.float32
    assert measured.double().tolist() == predicted.trajectory()
    # Partial sums k * a need few bits, so fp32 holds them exactly: only the stored addend's error
    # is left.
    assert predicted.final == predicted.exact == 1000 * precision.round_to(0.01, addend_fmt)


def _stepwise(addend: float, n: int, fmt: str) -> list[float]:
    """The recurrence s <- round(s + a), one exact rounding per step (not the binade rule)."""
    s, out = Fraction(0), []
    for _ in range(n):
        # s + a is exact in float64 here
        s = Fraction(precision.round_to(float(s + Fraction(addend)), fmt))
        out.append(float(s))
    return out


@pytest.mark.parametrize("fmt", ["tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("addend", [1.0, 0.01, 3 * 2**-12, -0.3, 1.5 * 2**-9, 7.0])
def test_binade_rule_equals_stepwise_rounding(fmt, addend):
    stored = precision.round_to(addend, fmt)
    n = 1500
    predicted = summation.plateau_sum(addend, n, fmt)
    assert predicted.addend == stored
    assert predicted.trajectory() == _stepwise(stored, n, fmt)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_prediction_equals_torch_cast_arithmetic(fmt):
    # torch has no fp8 addition; fp8 "arithmetic" is an exact fp32 add followed by torch's cast.
    dtype = precision.FORMATS[fmt].dtype
    a = torch.tensor(0.01).to(dtype)
    s, measured = torch.zeros((), dtype=dtype), []
    for _ in range(200):
        s = (s.float() + a.float()).to(dtype)
        measured.append(s.float().item())
    assert measured == summation.plateau_sum(0.01, 200, fmt).trajectory()


@pytest.mark.parametrize(
    ("addend", "fmt"), [(1000.0, "fp16"), (977.0, "fp16"), (1e37, "bf16"), (3e37, "fp32")]
)
def test_overflow_to_infinity_is_predicted(addend, fmt):
    predicted = summation.plateau_sum(addend, 120, fmt)
    measured = summation.running_sum(addend, 120, fmt)
    assert measured.double().tolist() == predicted.trajectory()
    assert predicted.final == math.inf and predicted.stall_step is not None


def test_fp8_e4m3_saturates_instead_of_overflowing():
    dtype = precision.FORMATS["fp8_e4m3"].dtype
    a = torch.tensor(60.0).to(dtype)
    s, measured = torch.zeros((), dtype=dtype), []
    for _ in range(12):
        # saturates at 448: torch 2.13's cast (torch 2.11's gives NaN, saturating_cast clamps)
        s = precision.saturating_cast(s.float() + a.float(), dtype)
        measured.append(s.float().item())
    predicted = summation.plateau_sum(60.0, 12, "fp8_e4m3")
    assert measured == predicted.trajectory() and predicted.final == 448.0


def test_plateau_value_closed_form():
    # 2^(0 + 10 + 1): 2048 + 1 is a tie: 2048
    assert summation.plateau_value(1.0, "fp16") == 2.0**11
    prediction = summation.plateau_sum(1.0, 3000, "fp16")
    assert (prediction.stall_step, prediction.final) == (2048, 2048.0)
    assert summation.plateau_value(0.01, "bf16") == 2.0 ** (-7 + 7 + 2)
    # same mantissa width
    assert summation.plateau_value(0.01, "fp16") == summation.plateau_value(0.01, "tf32")
    assert summation.plateau_value(1000.0, "fp8_e4m3") == 448.0  # saturates before the plateau
    with pytest.raises(ValueError, match="addend must be > 0, got 0.0"):
        summation.plateau_value(0.0, "fp16")


def test_negative_addend_mirrors():
    up, down = summation.plateau_sum(0.01, 1000, "bf16"), summation.plateau_sum(-0.01, 1000, "bf16")
    assert down.trajectory() == [-v for v in up.trajectory()] and down.stall_step == up.stall_step
    assert summation.running_sum(-0.01, 1000, "bf16")[-1].item() == down.final


def test_kahan_beats_naive_and_meets_its_bound():
    g = torch.Generator().manual_seed(4)
    for values in (torch.full((1000,), 0.01), torch.rand(3000, generator=g, dtype=torch.float64)):
        for fmt in ("fp16", "bf16"):
            stored = values.to(precision.FORMATS[fmt].dtype)
            exact = float(sum(Fraction(v) for v in stored.double().tolist()))
            naive = summation.sequential_sum(stored, fmt).item()
            kahan = summation.kahan_sum(values, fmt)
            assert kahan.dtype == precision.FORMATS[fmt].dtype
            error = abs(kahan.item() - exact)
            assert error < abs(naive - exact)
            # First-order bound for compensated summation (Higham 2002, sec. 4.3): 2u * sum|x_i|.
            assert error <= 2 * precision.FORMATS[fmt].unit_roundoff * exact


def test_sequential_sum_meets_recursive_bound():
    g = torch.Generator().manual_seed(5)
    values = torch.rand(8, 512, generator=g).half()
    exact = values.double().sum(-1)
    for fmt in ("fp16", "bf16", "fp32"):
        got = summation.sequential_sum(values, fmt)
        assert got.shape == (8,) and got.dtype == precision.FORMATS[fmt].dtype
        # all terms positive: sum|x| = sum x
        bound = summation.recursive_sum_error_bound(512, fmt) * exact
        assert torch.all((got.double() - exact).abs() <= bound)
    # (n-1) u = 1: no bound at all
    assert summation.recursive_sum_error_bound(2049, "fp16") == math.inf


def test_sums_are_computed_on_the_values_device():
    values = torch.ones(3, 8, device="meta")  # no data: mixing it with a CPU tensor fails
    with CreatedDevices() as created:
        sequential = summation.sequential_sum(values, "fp32")
        kahan = summation.kahan_sum(values, "bf16")
    assert (sequential.device.type, sequential.shape) == ("meta", (3,))
    assert (kahan.device.type, kahan.dtype) == ("meta", torch.bfloat16)
    assert created.seen and all(device == "meta" for _, device in created.seen), created.seen


NAN, INF = float("nan"), float("inf")
VALUES = torch.ones(2, 5)

INVALID_CALLS = [  # (call, error, message fragment)
    (lambda: summation.plateau_sum(0.01, -1, "fp16"), ValueError,
     "n must be an integer >= 0, got -1"),
    (lambda: summation.plateau_sum(0.01, 2.5, "fp16"), TypeError, "n must be an integer, got 2.5"),
    (lambda: summation.plateau_sum(0.01, True, "fp16"), TypeError,
     "n must be an integer, got True"),
    (lambda: summation.plateau_sum(NAN, 10, "fp16"), ValueError, "addend must be finite, got nan"),
    (lambda: summation.plateau_sum(INF, 10, "fp16"), ValueError, "addend must be finite, got inf"),
    (lambda: summation.plateau_sum("0.01", 10, "fp16"), TypeError, "addend must be a real number"),
    (lambda: summation.plateau_sum(0.01, 10, "fp12"), ValueError, "fmt='fp12'"),
    (lambda: summation.plateau_sum(0.01, 10, "fp16", addend_format="fp12"), ValueError,
     "addend_format='fp12' is not a floating-point format"),
    (lambda: summation.plateau_value(0.0, "fp16"), ValueError, "addend must be > 0, got 0.0"),
    (lambda: summation.plateau_value(-1.0, "fp16"), ValueError, "addend must be > 0"),
    (lambda: summation.plateau_value(NAN, "fp16"), ValueError, "addend must be finite"),
    (lambda: summation.plateau_value(0.01, None), TypeError, "fmt must be a format name"),
    (lambda: summation.running_sum(0.01, -1, "fp16"), ValueError, "n must be an integer >= 0"),
    (lambda: summation.running_sum(0.01, 2.5, "fp16"), TypeError, "n must be an integer, got 2.5"),
    (lambda: summation.running_sum(NAN, 10, "fp16"), ValueError, "addend must be finite"),
    (lambda: summation.running_sum(INF, 10, "fp16"), ValueError, "addend must be finite"),
    (lambda: summation.running_sum(0.01, 10, "fp8_e4m3"), ValueError,
     "dtype='fp8_e4m3': torch has no addition"),
    (lambda: summation.running_sum(0.01, 10, "fp16", "tf32"), ValueError,
     "accumulator_dtype='tf32'"),
    (lambda: summation.running_sum(0.01, 10, "fp12"), ValueError,
     "dtype='fp12' is not a floating-point"),
    (lambda: summation.running_sum(0.01, 10, "fp16", explicit_cast="yes"), ValueError,
     "explicit_cast='yes'"),
    (lambda: summation.recursive_sum_error_bound(-1, "fp16"), ValueError,
     "n must be an integer >= 0"),
    (lambda: summation.recursive_sum_error_bound(2.5, "fp16"), TypeError, "n must be an integer"),
    (lambda: summation.kahan_sum(torch.arange(5), "fp16"), TypeError,
     "values must be a floating-point"),
    (lambda: summation.kahan_sum(VALUES, None), TypeError, "dtype must be a format name"),
    (lambda: summation.kahan_sum([0.1, 0.2], "fp16"), TypeError,
     "values must be a floating-point tensor"),
    (lambda: summation.sequential_sum(torch.tensor(1.0), "fp32"), TypeError,
     "a last dim to sum over"),
    (lambda: summation.sequential_sum(VALUES, "fp12"), ValueError, "accumulator_dtype='fp12'"),
    (lambda: summation.sequential_sum(VALUES, "fp8_e5m2"), ValueError,
     "torch has no addition in fp8"),
    (lambda: summation.plateau_sum(0.01, 10, "fp16").run_starting_in("4", 8), TypeError,
     "lo must be a real number"),
    (lambda: summation.Segment(0.0, 1.0, 3, 1.0).after(-1), ValueError,
     "j must be an integer >= 0"),
]


@pytest.mark.parametrize(("call", "error", "message"), INVALID_CALLS)
def test_invalid_calls_raise_clear_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_run_starting_in_finds_the_long_run_of_a_binade():
    prediction = summation.plateau_sum(0.01, 1000, "fp16")
    run = prediction.run_starting_in(4, 8)
    assert 4 <= run.start < 8 and run.steps > 1 and run.ulp == 2.0**-8
    with pytest.raises(ValueError, match="no run of equal additions"):
        prediction.run_starting_in(1000, 2000)
