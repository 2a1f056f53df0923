"""mlsys.numerics.scaling: an fp8 cast without a scale, with one per tensor and with one per MX
block of 32 (OCP Microscaling Formats v1.0; Rouhani et al. 2023), on tensors with outliers."""

import math

import pytest
import torch

from mlsys.numerics import precision, scaling


def _x(ratio: float, *, n: int = 1024, outliers: int = 2, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return scaling.outlier_tensor(n, std=1e-3, outliers=outliers, ratio=ratio, generator=gen)


def test_the_outlier_tensor_has_its_outliers():
    x = _x(1e4, outliers=3)
    assert x.dtype == torch.float64 and x.shape == (1024,)
    assert sorted(x.abs().topk(3).values.tolist()) == [10.0] * 3  # ratio * std
    assert x.abs().topk(4).values[-1] < 0.01


def test_without_a_scale_small_entries_flush_to_zero():
    x = _x(1.0)
    err = scaling.errors(x, scaling.quantize(x, "fp8_e4m3", "none"))
    smallest = precision.FORMATS["fp8_e4m3"].smallest_subnormal
    assert err.flushed == pytest.approx((x.abs() < smallest / 2).double().mean().item(), abs=2e-3)
    assert err.flushed > 0.5


def test_a_per_tensor_scale_puts_amax_on_max_and_rounds_within_half_an_ulp():
    x = _x(1.0)
    q = scaling.quantize(x, "fp8_e4m3", "tensor")
    assert q.abs().max().item() == pytest.approx(x.abs().max().item())  # amax lands on 448
    normal = x.abs() * 448 / x.abs().max() >= precision.FORMATS["fp8_e4m3"].smallest_normal
    assert ((q - x).abs() / x.abs())[normal].max() <= 2.0**-4  # half an ulp, relative


def test_an_outlier_costs_a_tensor_scale_everything_and_a_block_scale_its_block():
    x = _x(1e6)
    tensor = scaling.errors(x, scaling.quantize(x, "fp8_e4m3", "tensor"))
    block = scaling.errors(x, scaling.quantize(x, "fp8_e4m3", "block"))
    assert tensor.flushed > 0.9 and tensor.mean_relative > 0.9
    q = scaling.quantize(x, "fp8_e4m3", "block").reshape(-1, scaling.MX_BLOCK)
    hit = (x.reshape(-1, scaling.MX_BLOCK).abs() > 0.5).any(dim=1)  # the outliers' blocks
    assert (q[~hit] != 0).all() and block.flushed <= hit.sum().item() * scaling.MX_BLOCK / 1024


def test_block_scales_are_powers_of_two_as_mx_defines_them():
    x = torch.tensor([3.0, -1.0] + [0.0] * 30 + [0.25] * 32, dtype=torch.float64)
    q = scaling.quantize(x, "fp8_e4m3", "block")
    # block 1: amax 3, X = 2^(1 - 8): 3 / X = 384 and 1 / X = 128 are e4m3 numbers: exact
    assert q[:2].tolist() == [3.0, -1.0] and q[32:].tolist() == [0.25] * 32
    big = torch.tensor([1.9375] + [0.0] * 31, dtype=torch.float64)  # 1.9375 / 2^-8 = 496 > 448
    assert scaling.quantize(big, "fp8_e4m3", "block")[0].item() == 448 * 2.0**-8  # saturates
    assert torch.equal(scaling.quantize(torch.zeros(32), "fp8_e5m2", "block"),
                       torch.zeros(32, dtype=torch.float64))


def test_the_error_of_a_clean_tensor_is_e4m3s_rounding():
    x = _x(1.0, n=4096)
    err = scaling.errors(x, scaling.quantize(x, "fp8_e4m3", "block"))
    assert err.flushed == 0 and err.mean_relative < 2.0**-4 / 2 * 1.5
    assert math.isclose(err.mean_relative,
                        scaling.errors(x, scaling.quantize(x, "fp8_e4m3", "tensor")).mean_relative,
                        rel_tol=0.2)


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: scaling.quantize([1.0], "fp8_e4m3", "tensor"), TypeError, "x must be a floating"),
    (lambda: scaling.quantize(torch.ones(4, dtype=torch.int32), "fp8_e4m3", "none"), TypeError,
     "x must be a floating-point tensor, got torch.int32"),
    (lambda: scaling.quantize(torch.ones(4), "bf16", "tensor"), ValueError, "not an fp8 format"),
    (lambda: scaling.quantize(torch.ones(4), "fp8_e4m3", "row"), ValueError, "scaling='row'"),
    (lambda: scaling.quantize(torch.ones(40), "fp8_e4m3", "block"), ValueError,
     "40 elements, not a multiple of block=32"),
    (lambda: scaling.quantize(torch.ones(32), "fp8_e4m3", "block", block=0), ValueError,
     "block must be a positive integer"),
    (lambda: scaling.quantize(torch.tensor([1.0, float("inf")]), "fp8_e4m3", "tensor"),
     ValueError, "x must be finite"),
    (lambda: scaling.errors(torch.ones(3), torch.ones(4)), ValueError, "same shape"),
    (lambda: scaling.errors(torch.zeros(3), torch.zeros(3)), ValueError, "no nonzero entry"),
    (lambda: scaling.outlier_tensor(4, std=1.0, outliers=5, ratio=10.0,
                                    generator=torch.Generator()), ValueError, "at most n"),
    (lambda: scaling.outlier_tensor(4, std=0.0, outliers=1, ratio=10.0,
                                    generator=torch.Generator()), ValueError, "std must be > 0"),
    (lambda: scaling.outlier_tensor(4, std=1.0, outliers=1, ratio=10.0, generator=1),
     TypeError, "generator must be a torch.Generator"),
])
def test_bad_input_is_refused_before_any_work(call, error, match):
    with pytest.raises(error, match=match):
        call()
