"""bf16 weight updates (`mlsys.numerics.weight_updates`): the stall, and the three ways to keep
updates."""

import pytest
import torch

from mlsys.numerics.precision import stochastic_round, ulp
from mlsys.numerics.weight_updates import (
    RoundedAdamW,
    adam_first_step_stalls,
    stall_threshold,
    stochastic_round_bf16,
)


def test_stochastic_rounding_lands_on_a_neighbour_and_is_unbiased():
    x = torch.tensor([1.0 + 2**-9, -3.0e-3, 0.1, 1e-40, 5.0]).repeat(20_000, 1)  # 1e-40: subnormal
    out = stochastic_round_bf16(x, generator=torch.Generator().manual_seed(0)).float()
    spacing = torch.tensor([ulp(v, "bf16") for v in x[0].tolist()])
    assert torch.all((out - x).abs() < spacing)  # a bf16 value less than one spacing away
    assert len({*out[:, 0].tolist()}) == 2  # a value between two bf16 numbers goes both ways
    assert torch.allclose(out.double().mean(0), x[0].double(), rtol=2e-3, atol=1e-43)
    assert torch.equal(out[:, 4], x[:, 4])  # representable values stay exactly
    ref = stochastic_round(x[:, 0], "bf16", generator=torch.Generator().manual_seed(1))
    assert set(ref.tolist()) == set(out[:, 0].tolist())  # the same two neighbours
    specials = torch.tensor([float("inf"), float("-inf"), float("nan")])
    back = stochastic_round_bf16(specials, generator=torch.Generator()).float()
    assert back[0] == float("inf") and back[1] == float("-inf") and back[2].isnan()


def test_the_stall_threshold_is_half_an_ulp():
    assert stall_threshold(1.0) == 2**-8  # bf16 spacing at 1 is 2^-7
    assert stall_threshold(0.02) == 2**-14  # 0.02 lies in [2^-6, 2^-5): spacing 2^-13
    w = torch.tensor([1.0], dtype=torch.bfloat16)
    assert (w + 0.99 * 2**-8).item() == 1.0 and (w + 1.01 * 2**-8).item() != 1.0


def test_first_adam_step_stalls_exactly_where_predicted():
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(64, 64, generator=gen) * 0.02).to(torch.bfloat16)
    p = torch.nn.Parameter(w.float())
    p.grad = torch.randn(64, 64, generator=gen)  # |g| >> eps: the first step moves by lr exactly
    before = p.detach().clone()
    RoundedAdamW([p], lr=1e-5, rounding="nearest").step()
    stalled = float((p == before).double().mean())
    assert stalled == adam_first_step_stalls(w, 1e-5)
    assert 0.8 < stalled < 0.9  # |w| >= 2^-8 for about 85% of N(0, 0.02) weights


def test_one_weight_of_one_moves_only_with_a_remedy():
    """w = 1 in bf16 takes 200 AdamW steps of 1e-3 (half its spacing is 0.0039): round to
    nearest never moves it; master, Kahan and stochastic rounding travel about 0.2."""
    travelled = {}
    for rounding in ("none", "nearest", "master", "kahan", "stochastic"):
        p = torch.nn.Parameter(torch.ones(256, dtype=torch.bfloat16))
        opt = RoundedAdamW([p], lr=1e-3, rounding=rounding,
                           generator=torch.Generator().manual_seed(0))
        for _ in range(200):
            p.grad = torch.full_like(p, -1.0)  # always push up
            opt.step()
        travelled[rounding] = float(p.detach().float().mean()) - 1.0
    assert travelled["nearest"] == 0.0
    for rounding in ("master", "kahan", "stochastic"):
        assert travelled[rounding] == pytest.approx(0.2, rel=0.05), rounding


def test_no_rounding_is_adamw():
    gen = torch.Generator().manual_seed(0)
    a = torch.nn.Parameter(torch.randn(32, generator=gen))
    b = torch.nn.Parameter(a.detach().clone())
    ours, theirs = RoundedAdamW([a], lr=1e-2, rounding="none"), torch.optim.AdamW(
        [b], lr=1e-2, weight_decay=0.0)
    for _ in range(5):
        g = torch.randn(32, generator=gen)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: RoundedAdamW([torch.nn.Parameter(torch.ones(1))], rounding="up"), ValueError,
     "rounding='up' is not one of"),
    (lambda: RoundedAdamW([torch.nn.Parameter(torch.ones(1))], rounding="stochastic"), TypeError,
     "needs generator"),
    (lambda: RoundedAdamW([torch.nn.Parameter(torch.ones(1))], lr=-1.0), ValueError,
     "lr must be > 0"),
    (lambda: RoundedAdamW([torch.nn.Parameter(torch.ones(1))], betas=(1, 1)), ValueError,
     r"betas\[0\] must be in \[0, 1\) \(as torch.optim.AdamW requires"),
    (lambda: RoundedAdamW([torch.nn.Parameter(torch.ones(1))], betas=(0.9, 1.0)), ValueError,
     r"betas\[1\] must be in \[0, 1\)"),
    (lambda: RoundedAdamW([torch.nn.Parameter(torch.ones(1))], betas=0.9), TypeError,
     r"betas must be a pair \(beta1, beta2\)"),
    (lambda: RoundedAdamW([torch.nn.Parameter(torch.ones(1, dtype=torch.float16))]), TypeError,
     r"params\[0\] is torch.float16: RoundedAdamW stores bf16"),
    (lambda: stochastic_round_bf16(torch.ones(2, dtype=torch.float64),
                                   generator=torch.Generator()), TypeError, "float32 tensor"),
    (lambda: stochastic_round_bf16(torch.ones(2), generator=0), TypeError, "torch.Generator"),
    (lambda: adam_first_step_stalls([0.1], 1e-3), TypeError, "floating-point tensor"),
])
def test_invalid_arguments_are_refused(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_a_beta_of_one_is_refused_because_it_divides_zero_by_zero():
    """torch.optim.AdamW refuses beta = 1 too; what it would do: 1 - beta^t = 0 in the bias
    correction, 0 / 0 on the first step, NaN weights."""
    p = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(ValueError, match="Invalid beta parameter at index 0"):
        torch.optim.AdamW([p], betas=(1.0, 0.999))
    m, beta = torch.zeros(3).lerp_(torch.ones(3), 1 - 1.0), 1.0  # the first moment stays 0
    assert torch.isnan(m / (1 - beta**1)).all()


def test_only_bf16_and_fp32_parameters_are_taken_in_every_group():
    bf16, fp32 = (torch.nn.Parameter(torch.ones(2, dtype=d)) for d in (torch.bfloat16,
                                                                        torch.float32))
    opt = RoundedAdamW((p for p in (bf16, fp32)), lr=1e-3)  # a generator is read once: kept
    assert opt.param_groups[0]["params"] == [bf16, fp32]
    with pytest.raises(TypeError, match=r"params\[1\] is torch.float16"):
        opt.add_param_group({"params": [fp32.detach().bfloat16(), torch.ones(2).half()]})
    assert len(opt.param_groups) == 1  # nothing was added
