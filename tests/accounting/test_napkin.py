"""The napkin trace against arithmetic done here by hand, and against the accounting it calls."""

import dataclasses
import math
import subprocess
import sys

import pytest

from mlsys import hardware, tables
from mlsys.accounting import flops, memory, params, utilization
from mlsys.accounting.napkin import kernel_costs, napkin
from mlsys.models.config import TransformerConfig
from mlsys.roofline import Ceilings

# xl (CS336 table): V = 10,000, D = 1,600, F = 6,400, L = 48, H = 25 (d_head 64), context 1,024
V, D, F, L, H, DH = 10_000, 1_600, 6_400, 48, 25, 64
BATCH, SEQ, DEVICES, MFU = 8, 1_024, 8, 0.4
TOKENS = BATCH * SEQ
H100 = hardware.H100_SXM


@pytest.fixture(scope="module")
def xl():
    xl = TransformerConfig.preset("xl")
    return napkin(xl, "H100", batch=BATCH, seq=SEQ, n_devices=DEVICES, mfu=MFU, name="xl")


def test_parameters_and_model_states_by_hand(xl):
    per_layer = 4 * D * D + 3 * D * F + 2 * D
    n = V * D + L * per_layer + D + D * V
    assert xl.n_params == n == 1_998_235_200
    assert xl.n_params_matmul == n - V * D - L * 2 * D - D
    assert xl.bytes_per_param == 2 + 2 + 4 + 8
    assert xl.model_state_bytes == 16 * n == xl.replicated_bytes_per_device
    assert xl.sharded_bytes_per_device == 16 * n // 8  # 16 N is divisible by 8: no rounding
    assert xl.hbm_bytes == 80e9
    assert xl.replicated_fits and xl.sharded_fits  # 32 GB and 4 GB of 80 GB


def test_flops_per_token_and_per_step_by_hand(xl):
    n_matmul = xl.n_params_matmul
    per_token = 6 * n_matmul + 12 * L * SEQ * D  # 6 N_matmul + the attention term
    assert xl.training_flops_per_token == per_token
    assert xl.forward_flops_per_token == per_token / 3
    assert xl.six_n_flops_per_token == 6 * xl.n_params
    assert xl.tokens_per_device == TOKENS
    assert xl.step_flops_per_device == per_token * TOKENS
    assert xl.step_flops == DEVICES * per_token * TOKENS


def test_step_time_and_throughput_by_hand(xl):
    peak = 989.4e12  # H100 SXM dense bf16
    assert xl.peak_flop_per_s == peak and xl.hbm_bytes_per_s == 3.35e12
    assert math.isclose(xl.ridge_flop_per_byte, peak / 3.35e12)
    step_s = xl.step_flops_per_device / (MFU * peak)
    assert math.isclose(xl.step_s, step_s, rel_tol=1e-12)
    assert math.isclose(xl.tokens_per_s, DEVICES * TOKENS / step_s, rel_tol=1e-12)
    assert 0.2 < xl.step_s < 0.3  # 105 TFLOP at 396 TFLOP/s


def test_kernels_by_hand(xl):
    b = 2  # bf16
    bh, scores = BATCH * H, BATCH * H * SEQ * SEQ
    expected = {  # name: (FLOPs, bytes read, bytes written)
        "attention projection q": (2 * TOKENS * D * D, (TOKENS * D + D * D) * b, TOKENS * D * b),
        "SwiGLU up-projection w1": (2 * TOKENS * D * F, (TOKENS * D + D * F) * b, TOKENS * F * b),
        "output head": (2 * TOKENS * D * V, (TOKENS * D + D * V) * b, TOKENS * V * b),
        "attention scores QK^T (naive)": (2 * scores * DH, 2 * bh * SEQ * DH * b, scores * b),
        "softmax of the scores": (5 * scores, scores * b, scores * b),
        "RMSNorm": (4 * TOKENS * D + 3 * TOKENS, (TOKENS * D + D) * b, TOKENS * D * b),
        "residual add": (TOKENS * D, 2 * TOKENS * D * b, TOKENS * D * b),
    }
    assert [k.name for k in xl.kernels] == list(expected)
    ridge = xl.ridge_flop_per_byte
    for k in xl.kernels:
        n_flops, read, write = expected[k.name]
        assert (k.flops, k.read_bytes, k.write_bytes) == (n_flops, read, write), k.name
        assert math.isclose(k.intensity_flop_per_byte, n_flops / (read + write)), k.name
        assert k.bound == ("compute-bound" if n_flops / (read + write) >= ridge else "memory-bound")
        time_s = max(n_flops / xl.peak_flop_per_s, (read + write) / xl.hbm_bytes_per_s)
        assert math.isclose(k.roofline_s, time_s), k.name
    bounds = {k.name: k.bound for k in xl.kernels}
    assert bounds["SwiGLU up-projection w1"] == "compute-bound"  # intensity about 1,100
    assert bounds["attention scores QK^T (naive)"] == "memory-bound"  # about 57: the S^2 write
    largest = max(xl.kernels, key=lambda k: k.flops)
    assert largest.name == "output head"  # V = 10,000 > F = 6,400


def test_agrees_with_the_accounting_functions(xl):
    cfg = TransformerConfig.preset("xl")
    assert xl.config == cfg and xl.model_name == "xl"
    assert xl.n_params == params.count_params(cfg)
    assert xl.model_state_bytes == memory.model_state_bytes(xl.n_params, "bf16_mixed_adamw")
    model = flops.transformer_flops(cfg, BATCH, SEQ)
    assert xl.step_flops_per_device == model.training_matmul_flops
    assert xl.training_flops_per_token == flops.training_flops_per_token(cfg, SEQ)
    total_s = utilization.training_time_s(xl.step_flops, DEVICES, H100.peak_flop_per_s("bf16"), MFU)
    assert math.isclose(xl.step_s, total_s)
    layer = flops.layer_flops(cfg, BATCH, SEQ)
    by_name = {k.name: k.flops for k in xl.kernels}
    assert by_name["attention projection q"] == layer.q_proj
    assert by_name["SwiGLU up-projection w1"] == layer.ffn_w1
    assert by_name["attention scores QK^T (naive)"] == layer.attention_scores
    assert by_name["softmax of the scores"] == layer.softmax
    assert by_name["output head"] == model.lm_head


def test_sharding_decides_whether_the_states_fit():
    cfg = TransformerConfig(
        vocab_size=32_000, context_length=2_048, d_model=4_096, n_layers=32, n_heads=32, d_ff=11_008
    )  # 6.7B parameters: 108 GB of mixed-precision AdamW states
    one = napkin(cfg, "h100", batch=1, seq=2_048, n_devices=8)
    assert one.model_name == "custom"
    assert not one.replicated_fits and one.sharded_fits
    assert one.sharded_bytes_per_device == math.ceil(one.model_state_bytes / 8)
    lines = "\n".join(tables.napkin_lines(one))
    assert "does not fit" in lines and "(17% of HBM, fits)" in lines


def test_dtype_and_recipe_change_what_they_should():
    small = TransformerConfig.preset("small")
    fp32 = napkin(small, "a100", batch=4, seq=512, recipe="fp32_adamw", dtype="fp32")
    bf16 = napkin(small, "a100", batch=4, seq=512)
    assert fp32.bytes_per_param == 16 == bf16.bytes_per_param  # 4 + 4 + 8 and 2 + 2 + 4 + 8
    assert fp32.peak_flop_per_s == hardware.A100_80GB_SXM.peak_flop_per_s("fp32")
    assert fp32.kernels[0].read_bytes == 2 * bf16.kernels[0].read_bytes  # 4 B vs 2 B elements
    fp8 = napkin(small, "h100", batch=4, seq=512, dtype="fp8")
    assert fp8.dtype == "fp8_e4m3" and fp8.peak_flop_per_s == H100.peak_flop_per_s("fp8")
    assert napkin(small, hardware.B200, batch=1, seq=8).accelerator_name == hardware.B200.name


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(model=42), TypeError, "model needs a 'vocab_size' attribute"),
        (dict(name=""), TypeError, "name must be a non-empty string"),
        (dict(accelerator="x100"), ValueError, r"'x100'.*a100.*tpu-v5p"),
        (dict(accelerator=None), TypeError, "accelerator must be a name"),
        (dict(recipe="adam"), ValueError, r"'adam'.*fp32_adamw"),
        (dict(batch=0), ValueError, "batch must be a positive integer, got 0"),
        (dict(batch=2.0), TypeError, "batch must be an integer"),
        (dict(seq=2_048), ValueError, r"seq \(2048\) must be <= context_length \(1024\)"),
        (dict(n_devices=0), ValueError, "n_devices must be a positive integer"),
        (dict(mfu=0), ValueError, "mfu must be > 0"),
        (dict(mfu=1.5), ValueError, "mfu must be <= 1"),
        (dict(dtype="fp9"), ValueError, r"'fp9'.*bf16"),
        (dict(accelerator="tpu-v5p", dtype="fp32"), ValueError, "no dense peak for dtype='fp32'"),
    ],
)
def test_bad_arguments_are_refused_with_the_rule(kwargs, error, match):
    xl = TransformerConfig.preset("xl")
    args = dict(model=xl, accelerator="h100", batch=8, seq=1_024) | kwargs
    with pytest.raises(error, match=match):
        napkin(args.pop("model"), args.pop("accelerator"), **args)


def test_summary_is_frozen_and_torch_free(xl):
    with pytest.raises(dataclasses.FrozenInstanceError):
        xl.step_s = 0.0
    code = "import sys, mlsys.accounting.napkin, mlsys.__main__; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_kernel_rows_follow_the_architecture():
    """A GPT's rows say LayerNorm and GeLU; a mixture of experts runs each token's top-k rows
    through an expert's width and reads every expert's weights (bf16, by hand)."""
    roof = Ceilings(1e15, 3e12, "test")
    gpt = TransformerConfig(mlp="gelu", norm="layernorm", positions="learned", bias=True)
    names = [k.name for k in kernel_costs(gpt, 2, 16, roof)]
    assert "GeLU MLP up-projection w1" in names and "LayerNorm" in names
    assert "RMSNorm" not in names and not any("SwiGLU" in n for n in names)
    moe = TransformerConfig(n_experts=4, experts_per_token=2, d_ff_expert=96)
    up = next(k for k in kernel_costs(moe, 2, 16, roof) if "experts" in k.name)
    tok, d, f = 2 * 16, moe.d_model, 96
    assert up.name == "SwiGLU up-projection w1 (top-2 of 4 experts)"
    assert up.flops == 2 * (tok * 2) * d * f
    assert up.read_bytes == ((tok * 2) * d + 4 * d * f) * 2
    assert up.write_bytes == (tok * 2) * f * 2
