"""RMSNorm in low precision (`mlsys.numerics.norm_numerics`): squares, the long mean, and
epsilon."""

import math

import pytest
import torch

from mlsys.models.transformer import Transformer, TransformerConfig
from mlsys.numerics import norm_numerics as nn_
from mlsys.numerics.summation import plateau_value


def test_eps_1e5_is_subnormal_in_fp16_yet_stored_as_bf16_stores_it():
    """The seed says 1e-5 is hard to represent in fp16 because fp16's smallest normal is 6e-5;
    in fact fp16 stores it (a subnormal) as 168 * 2^-24, the very value bf16 stores."""
    f16, b16 = nn_.eps_facts(1e-5, "fp16"), nn_.eps_facts(1e-5, "bf16")
    assert (f16.kind, b16.kind) == ("subnormal", "normal")
    assert f16.stored == b16.stored == 168 * 2.0**-24 == torch.tensor(1e-5).half().item()
    assert f16.rel_error == pytest.approx(1.358e-3, rel=1e-3)
    assert nn_.eps_facts(1e-8, "fp16").stored == 0.0 and nn_.eps_facts(1e-8, "fp16").kind == "zero"
    assert nn_.eps_facts(1e-6, "fp16").rel_error == pytest.approx(0.0133, rel=1e-2)


@pytest.mark.parametrize(("fmt", "threshold"), [("fp16", 2**-5), ("bf16", 2**-8), ("fp32", 2**8)])
def test_eps_is_absorbed_exactly_from_the_predicted_mean_square_up(fmt, threshold):
    assert nn_.absorbed_from(1e-5, fmt) == threshold
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[fmt]
    eps = torch.tensor(1e-5, dtype=dt)
    for ms in (threshold, threshold * 1.5, threshold * 1024):
        m = torch.tensor(ms, dtype=dt)
        assert m + eps == m  # absorbed at and above the threshold
    below = torch.tensor(threshold * 0.75, dtype=dt)
    assert below + eps != below


def test_square_overflow_and_flush_thresholds():
    assert nn_.square_overflow_rms(4096, "fp16") == pytest.approx(3.999, abs=1e-3)
    over, under = torch.full((1, 4096), 4.01), torch.full((1, 4096), 3.99)
    assert torch.isinf(nn_.mean_square(over, "fp16")).item()
    assert not torch.isinf(nn_.mean_square(under, "fp16")).item()
    assert nn_.rms_inv(over, "fp16").item() == 0.0  # rsqrt(inf): a finite, wrong scale
    t = nn_.square_flush_below("fp16")
    assert t == math.sqrt(2.0**-25)
    lo, hi = torch.tensor([t * 0.99, t * 1.01], dtype=torch.float16)
    assert (lo * lo).item() == 0.0 and (hi * hi).item() > 0.0
    assert nn_.square_overflow_rms(64, "bf16") > 1e18


def test_a_bf16_running_sum_of_squares_stalls_at_the_plateau_torch_does_not():
    x = torch.ones(2, 4096)
    sequential = nn_.rms_inv(x, "bf16", accumulate="sequential")
    assert sequential.tolist() == [4.0, 4.0]  # mean = 256 / 4096: rsqrt(1/16) = 4
    assert plateau_value(1.0, "bf16") == 256.0
    assert nn_.rms_inv(x, "bf16").tolist() == [1.0, 1.0]  # torch accumulates in fp32 inside


def test_norm_errors_on_the_book_models_activations():
    model = Transformer(TransformerConfig())
    model.init_weights(seed=0)
    tokens = torch.randint(1000, (2, 32), generator=torch.Generator().manual_seed(0))
    xs = nn_.norm_inputs(model, tokens)
    assert list(xs) == ["blocks.0.attn_norm", "blocks.0.ffn_norm", "blocks.1.attn_norm",
                        "blocks.1.ffn_norm", "final_norm"]
    x = xs["blocks.1.ffn_norm"]
    rows = {(r["dtype"], r["accumulate"]): r for r in nn_.norm_errors(x)}
    assert rows[("bf16", "torch")]["median_rel_error"] > rows[("fp16", "torch")][
        "median_rel_error"]  # 8 significant bits against 11
    assert rows[("bf16", "sequential")]["max_rel_error"] > rows[("bf16", "torch")]["max_rel_error"]
    assert rows[("fp16", "torch")]["squares_flushed"] > 0  # |x| < 1.7e-4 at init (rms 0.02)
    assert rows[("bf16", "torch")]["squares_flushed"] == 0
    loud = {(r["dtype"], r["accumulate"]): r for r in nn_.norm_errors(x * 4000)}
    assert loud[("fp16", "torch")]["overflowed_rows"] > 0.5  # rms 96 > sqrt(65504 / 64) = 32
    assert loud[("fp16", "torch")]["max_rel_error"] == 1.0  # those rows are scaled by 0
    assert loud[("bf16", "torch")]["overflowed_rows"] == 0


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: nn_.rms_inv([1.0], "fp16"), TypeError, "floating-point tensor"),
    (lambda: nn_.rms_inv(torch.ones(3), "fp16", accumulate="pairwise"), ValueError,
     "accumulate='pairwise'"),
    (lambda: nn_.eps_facts(0.0, "fp16"), ValueError, "eps must be > 0"),
    (lambda: nn_.square_overflow_rms(0, "fp16"), ValueError, "d must be a positive"),
    (lambda: nn_.norm_inputs("model"), TypeError, "torch.nn.Module"),
])
def test_invalid_arguments_are_refused(call, error, message):
    with pytest.raises(error, match=message):
        call()
