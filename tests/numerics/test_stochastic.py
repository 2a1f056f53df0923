"""mlsys.numerics.stochastic: stochastic rounding keeps a running sum unbiased where round to
nearest stalls (Gupta et al. 2015), with the spread its sqrt(n) bound allows; bad input refused."""

import math

import pytest
import torch

from mlsys.numerics import precision, stochastic, summation


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_a_bf16_sum_past_its_plateau_stays_unbiased():
    sums = stochastic.stochastic_sum(0.01, 1000, "bf16", trials=256, generator=_gen())
    assert sums.addend == precision.round_to(0.01, "bf16") and sums.trials == 256
    assert sums.exact == 1000 * sums.addend
    assert abs(sums.mean - sums.exact) < 4 * sums.standard_error  # no bias
    assert 0 < sums.std <= sums.std_bound  # noise, within sqrt(n) ulp_max / 2
    assert all(precision.round_to(v, "bf16") == v for v in sums.finals)  # values of bf16
    nearest = stochastic.nearest_sum(0.01, 1000, "bf16")
    assert nearest == summation.plateau_value(sums.addend, "bf16") == 4.0  # the stall
    assert abs(nearest - sums.exact) > 50 * sums.standard_error  # a bias, far beyond chance


def test_a_weight_gets_updates_below_half_its_ulp():
    sums = stochastic.stochastic_sum(1e-3, 500, "bf16", trials=128, generator=_gen(1), start=1.0)
    assert stochastic.nearest_sum(1e-3, 500, "bf16", start=1.0) == 1.0  # every update lost
    assert abs(sums.mean - sums.exact) < 4 * sums.standard_error and sums.exact > 1.4


def test_nearest_sum_is_the_plateau_walk_and_a_seed_repeats():
    for fmt in ("fp16", "bf16"):
        assert stochastic.nearest_sum(0.01, 700, fmt) == summation.plateau_sum(0.01, 700, fmt).final
    a = stochastic.stochastic_sum(0.01, 50, "fp16", trials=8, generator=_gen(3))
    b = stochastic.stochastic_sum(0.01, 50, "fp16", trials=8, generator=_gen(3))
    assert a == b
    zero = stochastic.stochastic_sum(0.5, 0, "bf16", trials=3, generator=_gen(), start=2.0)
    assert zero.finals == (2.0, 2.0, 2.0) and zero.std == 0 and zero.exact == 2.0


def test_an_exact_sum_has_no_spread():
    sums = stochastic.stochastic_sum(0.25, 64, "bf16", trials=16, generator=_gen())
    assert set(sums.finals) == {16.0} and sums.std == 0  # every partial sum is representable
    assert math.isclose(sums.std_bound, math.sqrt(64) * precision.ulp(16.0, "bf16") / 2)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(n=-1), ValueError, "n must be"),
    (dict(trials=0), ValueError, "trials must be a positive integer"),
    (dict(generator=0), TypeError, "generator must be a torch.Generator"),
    (dict(fmt="fp64"), ValueError, "at most 23"),
    (dict(fmt="int8"), ValueError, "fmt='int8'"),
    (dict(addend=float("nan")), ValueError, "addend must be finite"),
    (dict(addend=1e6, fmt="fp16"), ValueError, "addend=1000000.0 is not finite in fp16"),
    (dict(start="1"), TypeError, "start must be a real number"),
])
def test_bad_input_is_refused_before_any_work(kwargs, error, match):
    args = dict(addend=0.01, n=10, fmt="bf16", trials=4, generator=_gen())
    args.update(kwargs)
    with pytest.raises(error, match=match):
        stochastic.stochastic_sum(args.pop("addend"), args.pop("n"), args.pop("fmt"), **args)


def test_the_sum_leaving_the_range_is_an_error():
    with pytest.raises(OverflowError, match="left fp16's range"):
        stochastic.stochastic_sum(60000.0, 3, "fp16", trials=2, generator=_gen())


def test_nearest_sum_refuses_a_format_torch_cannot_store():
    with pytest.raises(ValueError, match="tf32.*no torch dtype"):
        stochastic.nearest_sum(0.01, 10, "tf32")
