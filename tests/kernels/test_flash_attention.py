"""FlashAttention-2 Triton kernels (`mlsys.kernels.flash_attention`) against the float64 reference.

Under the CPU interpreter: fp32 and fp16 (bf16 arithmetic is wrong there and is refused), tiny
shapes (seq <= 40, d 16 and 32) with tiles of 16 and 32 so that most cases span several tiles and
end in a ragged one. bf16, larger shapes and the autotuned path run on a GPU (`gpu` marker).
"""

import pytest
import torch
from attention_cases import check_case, one_step_gradients, random_cases
from kernel_cases import DEVICE, needs_gpu, needs_triton

from mlsys.accounting import attention as attention_cost
from mlsys.accounting import attention_traffic
from mlsys.counters import SavedTensors
from mlsys.kernels import _triton
from mlsys.kernels import flash_attention as FA
from mlsys.kernels._triton import ATTENTION_TOLERANCES, INTERPRETED
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.ops.attention import attention


def _triton_apply(q, k, v, case):
    return FA.FlashAttentionTriton.apply(q, k, v, case["causal"], case["blocks"])


@needs_triton
@pytest.mark.parametrize(("seed", "dtype", "count"), [(11, torch.float32, 70),
                                                      (12, torch.float32, 70),
                                                      (13, torch.float16, 70)])
def test_kernels_match_the_float64_reference(seed, dtype, count):
    """210 random cases: lengths 1 to 40 (primes, n_q != n_k), causal or not, d 16 or 32, tiles
    (16 | 32) x (16 | 32), contiguous and strided inputs, 3-D and 4-D; O, L, dQ, dK, dV."""
    for case in random_cases(seed, count, head_dims=(16, 32), dtypes=(dtype,), blocks=(16, 32),
                             heads=(None, 1, 2)):
        check_case(_triton_apply, case)


@needs_triton
def test_default_tiles_and_the_public_function():
    q, k, v = (torch.randn(2, 2, n, 32, generator=torch.Generator().manual_seed(n))
               .to(DEVICE).requires_grad_() for n in (37, 37, 37))
    out = FA.flash_attention(q, k, v, is_causal=True)  # INTERPRETER_TILES, or autotuned on a GPU
    ref = attention(*(x.detach().double() for x in (q, k, v)), is_causal=True)
    torch.testing.assert_close(out.double(), ref, **ATTENTION_TOLERANCES[torch.float32]["forward"])
    out.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


@needs_triton
def test_queries_that_attend_nothing_get_zero_and_minus_inf():
    q, k, v = (torch.randn(1, 2, n, 16, generator=torch.Generator().manual_seed(n))
               .to(DEVICE) for n in (29, 5, 5))
    out, lse = FA._flash_forward(q, k, v, True, (16, 16))  # causal, n_q > n_k: rows 0..23 empty
    assert (out[:, :, :24] == 0).all() and torch.isneginf(lse[:, :, :24]).all()
    ref, ref_lse = FA.flash_attention_ref(q.double(), k.double(), v.double(), is_causal=True)
    torch.testing.assert_close(lse.double(), ref_lse)
    torch.testing.assert_close(out.double(), ref, **ATTENTION_TOLERANCES[torch.float32]["forward"])
    dq, dk, dv = FA._flash_backward(q, k, v, out, lse, torch.ones_like(out), True, (16, 16))
    assert (dq[:, :, :24] == 0).all() and all(torch.isfinite(g).all() for g in (dq, dk, dv))


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_saves_exactly_q_k_v_o_and_an_fp32_l(dtype):
    q, k, v = (torch.randn(2, 3, n, 16).to(DEVICE, dtype).requires_grad_() for n in (9, 13, 13))
    with SavedTensors() as saved:
        out = FA.FlashAttentionTriton.apply(q, k, v, True)
    name = {torch.float32: "fp32", torch.float16: "fp16"}[dtype]
    assert [(s.shape, s.dtype, s.saves) for s in saved.storages] == [
        ((2, 3, 9, 16), name, 1), ((2, 3, 13, 16), name, 1), ((2, 3, 13, 16), name, 1),
        ((2, 3, 9, 16), name, 1), ((2, 3, 9), "fp32", 1)]
    assert saved.activation_bytes == attention_cost.attention_saved_bytes(
        2, 3, 9, 13, 16, name, backend="flash_triton")
    assert out.grad_fn.saved_tensors[3].data_ptr() == out.data_ptr()


@needs_triton
def test_gradients_are_deterministic_bit_for_bit():
    """The dQ kernel sums its key tiles in a fixed order (no atomics): reruns agree exactly."""
    q, k, v = (torch.randn(2, 2, 37, 16, generator=torch.Generator().manual_seed(i))
               .to(DEVICE).requires_grad_() for i in range(3))
    runs = []
    for _ in range(2):
        out = FA.FlashAttentionTriton.apply(q, k, v, True, (16, 16))
        runs.append(torch.autograd.grad(out, (q, k, v), torch.ones_like(out)))
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


@needs_triton
def test_one_training_step_gives_the_naive_gradients():
    grads, params = one_step_gradients("flash_triton", torch.float32)
    naive_grads, naive_params = one_step_gradients("naive", torch.float32)
    for key in naive_grads:  # fp32 both: attention's rounding differs, nothing else
        torch.testing.assert_close(grads[key], naive_grads[key], rtol=1e-4, atol=1e-6, msg=key)
        torch.testing.assert_close(params[key], naive_params[key], rtol=1e-5, atol=1e-6, msg=key)


LONG_D = torch.ones(1, 4, 256)


@needs_triton
@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((torch.ones(1, 4, 24),) * 3, ValueError,
         r"q has head dim d = 24; the Triton kernels take d in 16, 32, 64, 128"),
        ((torch.ones(1, 4, 8),) * 3, ValueError, "head dim d = 8"),
        ((LONG_D, LONG_D, LONG_D), ValueError, "head dim d = 256"),
        ((torch.ones(1, 4, 16, dtype=torch.float64),) * 3, TypeError,
         "q has dtype torch.float64; expected one of float16, bfloat16, float32"),
        ((torch.ones(1, 4, 16, dtype=torch.int32),) * 3, TypeError,
         "q must be a floating-point tensor"),
        ((torch.ones(4, 16),) * 3, ValueError, r"q must have shape \(batch, seq, d\) or"),
        ((torch.ones(1, 4, 16), torch.ones(2, 4, 16), torch.ones(2, 4, 16)), ValueError,
         "must share batch"),
        ((torch.ones(1, 4, 16), torch.ones(1, 4, 16), torch.ones(1, 4, 16).half()), ValueError,
         "v is torch.float16 on cpu but q is torch.float32"),
        (("q", torch.ones(1, 4, 16), torch.ones(1, 4, 16)), TypeError,
         "q must be a torch.Tensor, got str"),
    ],
)
def test_bad_inputs_are_refused_before_launch(args, error, message):
    args = tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)
    with pytest.raises(error, match=message):
        FA.flash_attention(*args)


@needs_triton
def test_bad_flags_tiles_and_bf16_under_the_interpreter():
    q = torch.ones(1, 4, 16, device=DEVICE)
    with pytest.raises(TypeError, match="is_causal must be True or False"):
        FA.flash_attention(q, q, q, is_causal=None)
    for tiles in [(8, 16), (16, 24), (16,), "16x16", (16, True)]:
        with pytest.raises(ValueError, match="tiles must be None or .BLOCK_M, BLOCK_N."):
            FA.FlashAttentionTriton.apply(q, q, q, False, tiles)
    if INTERPRETED:
        with pytest.raises(TypeError, match="bfloat16, which Triton's CPU interpreter computes"):
            FA.flash_attention(q.bfloat16(), q.bfloat16(), q.bfloat16())
    else:
        with pytest.raises(ValueError, match="q is on cpu; Triton kernels here need a tensor"):
            FA.flash_attention(q.cpu(), q.cpu(), q.cpu())


def test_missing_triton_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(_triton, "HAS_TRITON", False)
    q = torch.ones(1, 4, 16)
    with pytest.raises(RuntimeError, match=r"Triton is not installed .* use flash_attention_ref"):
        FA.flash_attention(q, q, q)
    model = Transformer(TransformerConfig(d_model=32, n_heads=2, attention="flash_triton"))
    with pytest.raises(RuntimeError, match="Triton is not installed"):  # the model says it too
        model(torch.zeros(1, 4, dtype=torch.long))


def test_cost_helpers_delegate_to_accounting():
    size = (2, 4, 100, 120, 64)
    assert FA.flash_attention_flops(*size, is_causal=True) == (
        attention_cost.attention_forward_flops(*size, causal=True))
    assert FA.flash_attention_backward_flops(*size) == 3.5 * FA.flash_attention_flops(*size)
    assert FA.flash_attention_bytes(*size, "bf16", block_m=64, block_n=32) == (
        attention_traffic.flash_forward_traffic(*size, "bf16", block_q=64, block_k=32).total_bytes)
    assert FA.flash_attention_backward_bytes(*size, "bf16", block_m=64, block_n=32,
                                             is_causal=True) == (
        attention_traffic.flash_backward_traffic(*size, "bf16", block_q=64, block_k=32,
                                                 causal=True).total_bytes)


@pytest.mark.gpu
@needs_gpu
@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gpu_autotuned_and_bf16(dtype):
    for seed in range(6):
        for n_q, n_k, d, causal in [(1000, 1000, 64, True), (513, 2049, 128, True),
                                    (777, 300, 16, False), (2048, 2048, 128, True)]:
            case = dict(batch=2, heads=3, n_q=n_q, n_k=n_k, d=d, causal=causal, dtype=dtype,
                        blocks=None, strided=seed % 2 == 1, seed=seed)
            check_case(lambda q, k, v, c: FA.flash_attention(q.cuda(), k.cuda(), v.cuda(),
                                                             c["causal"]), case)


def test_the_backward_checks_o_l_and_do_before_launching():
    """`_flash_backward` (what autograd calls) refuses a wrong L or dO before any kernel runs,
    so this needs no Triton: a wrong shape would otherwise be read out of bounds."""
    q = k = v = torch.ones(1, 2, 4, 16)
    out, lse = torch.ones(1, 2, 4, 16), torch.ones(1, 2, 4)
    with pytest.raises(ValueError, match=r"lse must have shape \(1, 2, 4\).*got \(1, 2\)"):
        FA._flash_backward(q, k, v, out, lse[..., 0], torch.ones_like(out), False)
    with pytest.raises(ValueError, match=r"grad_out must have shape \(1, 2, 4, 16\)"):
        FA._flash_backward(q, k, v, out, lse, torch.ones(1, 2, 4, 8), False)
