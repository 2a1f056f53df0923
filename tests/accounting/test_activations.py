"""`mlsys.accounting.activations` against `mlsys.counters.SavedTensors`: exact, byte for byte.

Naive attention is counted on the meta device for whole models of every preset; SDPA on the meta
device takes the math path (not what a CPU or GPU runs), so it is counted on the CPU: one real
block at each preset's sizes, and whole small models for what is saved outside the blocks. The
other shapes of the config (grouped-query attention, GeLU and ReLU MLPs, LayerNorm, biases,
learned positions, a tied head) are counted the same way, alone and together.
"""

import dataclasses
import math
from collections import Counter

import pytest
import torch
from kernel_cases import needs_triton

from mlsys.accounting import activations, recompute
from mlsys.accounting.params import param_counts
from mlsys.counters import SavedTensors
from mlsys.dtypes import bytes_per_element, torch_dtype
from mlsys.models.config import PRESETS, TransformerConfig
from mlsys.models.transformer import Block, RotaryEmbedding, Transformer
from mlsys.training import next_token_loss

FLASH_TRITON = pytest.param("flash_triton", marks=needs_triton)
"""The Triton backend: d_head 16 to 128, fp16/fp32 under the CPU interpreter (bf16 on a GPU)."""


def count_model(cfg, batch, seq, *, dtype="fp32", device="meta"):
    """SavedTensors of `next_token_loss` on a (batch, seq + 1) batch; the model built on meta."""
    with torch.device("meta"):
        model = Transformer(cfg).to(torch_dtype(dtype))
    if device != "meta":
        model.to_empty(device=device)
        model.init_weights(seed=0)
    tokens = torch.randint(cfg.vocab_size, (batch, seq + 1), generator=torch.Generator()
                           .manual_seed(0)).to(device)
    with SavedTensors(model) as saved:
        loss = next_token_loss(model, tokens)
    assert loss.requires_grad  # the graph, and so every saved tensor, is alive while counted
    return saved


def count_block(cfg, batch, seq, *, dtype="fp32"):
    """SavedTensors of one real block on the CPU (weights zeroed: what is saved does not depend
    on values), its input made outside the counter as in the model."""
    with torch.device("meta"):
        block = Block(cfg)
    block.to_empty(device="cpu").to(torch_dtype(dtype))
    for p in block.parameters():
        p.detach().zero_()
    cos, sin = (t.to(torch_dtype(dtype)) for t in RotaryEmbedding(cfg.d_head, seq)(seq))
    x = torch.ones(batch, seq, cfg.d_model, dtype=torch_dtype(dtype), requires_grad=True)
    with SavedTensors(block, exclude=(cos, sin)) as saved:
        out = block(x, cos, sin)
    assert out.requires_grad
    return saved


def sizes(saved):
    """The activations as a multiset of (bytes, dtype): a check of every tensor, not a sum."""
    return Counter((s.nbytes, s.dtype) for s in saved.storages if s.kind == "activation")


def predicted_sizes(tensors):
    return Counter((t.nbytes, t.dtype) for t in tensors)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("preset", list(PRESETS))
def test_naive_whole_model_on_meta_is_exact(preset, dtype):
    cfg = TransformerConfig.preset(preset, attention="naive")
    batch, seq = 3, 33
    saved = count_model(cfg, batch, seq, dtype=dtype)
    predicted = activations.saved_bytes(cfg, batch, seq, dtype=dtype)
    assert saved.activation_bytes == predicted.total_bytes
    assert sizes(saved) == predicted_sizes(
        predicted.block * cfg.n_layers + predicted.outside)
    per_block = saved.by_module(depth=2)
    assert all(per_block[f"blocks.{i}"] == predicted.block_bytes for i in range(cfg.n_layers))
    # every weight a matmul reads is saved once; the embedding saves its indices, not its table
    counts = param_counts(cfg)
    assert saved.parameter_bytes == (counts.total - counts.embedding) * bytes_per_element(dtype)


@pytest.mark.parametrize("attention", ["sdpa", "naive", "flash_torch"])
@pytest.mark.parametrize("preset", list(PRESETS))
def test_one_block_on_cpu_is_exact_at_every_preset(preset, attention):
    cfg = TransformerConfig.preset(preset, attention=attention)
    saved = count_block(cfg, 2, 8)
    predicted = activations.saved_bytes(cfg, 2, 8)
    assert saved.activation_bytes == predicted.block_bytes
    assert sizes(saved) == predicted_sizes(predicted.block)
    by_module = saved.by_module()  # paths inside the block
    assert by_module["attn"] == predicted.components()["attention"]  # the core, not projections
    assert by_module["attn.o_proj"] == predicted.components()["o_proj_input"]


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16", "fp64"])
@pytest.mark.parametrize("attention", ["sdpa", "naive", "flash_torch"])
def test_whole_small_model_on_cpu_is_exact(attention, dtype):
    cfg = TransformerConfig.preset("debug", attention=attention, n_layers=3)
    for batch, seq in [(3, 16), (1, 7)]:  # batch 1: the targets are a view of the batch
        saved = count_model(cfg, batch, seq, dtype=dtype, device="cpu")
        predicted = activations.saved_bytes(cfg, batch, seq, dtype=dtype)
        assert saved.activation_bytes == predicted.total_bytes
        assert sizes(saved) == predicted_sizes(predicted.block * 3 + predicted.outside)


@pytest.mark.parametrize("attention", ["sdpa", "naive", "flash_torch"])
def test_shapes_where_views_merge_storages(attention):
    """One head or one position: merging the heads is a view, and SDPA's output is the o_proj
    input; batch 1: the targets are a view of the token batch."""
    for heads, batch, seq in [(1, 2, 5), (2, 2, 1), (2, 1, 1)]:
        cfg = TransformerConfig(d_model=8, n_heads=heads, d_ff=24, n_layers=2, vocab_size=50,
                                context_length=8, attention=attention)
        saved = count_model(cfg, batch, seq, device="cpu")
        assert saved.activation_bytes == activations.saved_bytes(cfg, batch, seq).total_bytes


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("preset", ["debug", "small"])
@pytest.mark.parametrize("attention", ["flash_torch", FLASH_TRITON])
def test_flash_backends_save_what_sdpa_saves(attention, preset, dtype):
    """q, k, v, O and an fp32 L, saved by the backends' autograd Functions: one block at a preset,
    then a small model with one head or one position (views), all exact on the CPU."""
    cfg = TransformerConfig.preset(preset, attention=attention)
    saved = count_block(cfg, 2, 8, dtype=dtype)
    predicted = activations.saved_bytes(cfg, 2, 8, dtype=dtype)
    assert saved.activation_bytes == predicted.block_bytes
    assert sizes(saved) == predicted_sizes(predicted.block)
    assert predicted.block_bytes == activations.saved_bytes(cfg, 2, 8, dtype=dtype,
                                                  attention="sdpa").block_bytes
    attn = [t for t in predicted.block if t.component == "attention"]
    assert [t.dtype for t in attn] == [dtype] * 4 + ["fp32"] and attn[-1].shape == (
        2, cfg.n_heads, 8)
    for heads, batch, seq in [(1, 2, 5), (2, 2, 1), (2, 1, 1), (2, 3, 9)]:  # d_head 32 or 16
        small = TransformerConfig(d_model=32, n_heads=heads, d_ff=24, n_layers=2, vocab_size=50,
                                  context_length=16, attention=attention)
        saved = count_model(small, batch, seq, dtype=dtype, device="cpu")
        assert saved.activation_bytes == activations.saved_bytes(small, batch, seq,
                                                       dtype=dtype).total_bytes


def test_saved_tensors_of_a_block_by_dtype_and_component():
    cfg = TransformerConfig.preset("2.7B")
    n, d, f, h, s = 4 * 512, 2560, 10240, 32, 512
    naive = activations.saved_bytes(cfg, 4, 512, attention="naive")
    sdpa = activations.saved_bytes(cfg, 4, 512, attention="sdpa")
    assert naive.block_bytes == 4 * (10 * n * d + 4 * n * f + 2 * n + 4 * h * s * s) + s * s
    assert sdpa.block_bytes == 4 * (11 * n * d + 4 * n * f + 2 * n + 4 * h * s)
    assert sum(naive.components().values()) == naive.block_bytes
    assert naive.components()["rope"] == naive.components()["residual"] == 0
    # bf16: the matmul-side tensors halve, the norms stay fp32, the loss stays fp32
    bf16 = activations.saved_bytes(cfg, 4, 512, attention="sdpa", dtype="bf16")
    parts = bf16.components()
    assert parts["attn_norm"] == sdpa.components()["attn_norm"] == 4 * (2 * n * d + n)
    assert parts["w1_output"] * 2 == sdpa.components()["w1_output"]
    assert [t.dtype for t in bf16.block if t.component == "attention"] == ["bf16"] * 4 + ["fp32"]
    assert {t.what: t.dtype for t in bf16.outside}["log-probabilities (logits in fp32)"] == "fp32"
    assert bf16.outside[0].dtype == "int64" and bf16.outside[0].shape == (4, 513)
    assert naive.per_token_bytes == naive.total_bytes / n
    assert naive.per_sequence_bytes == naive.total_bytes / 4


def test_the_seeds_formulas_against_the_count():
    cfg = TransformerConfig.preset("2.7B")
    b, s, d, h, f, layers = 4, 512, 2560, 32, 10240, 32
    naive = activations.saved_bytes(cfg, b, s, attention="naive")
    # the one-pager's "5 B S D + B H S^2 bytes": elements, and less than half a naive block
    assert activations.claimed_layer_bytes(b, s, d, h) * 4 < naive.block_bytes / 2
    # the student's 2.7B total: 20,352 "MB" (MiB) in fp32 at B=4, S=512
    claimed = 4 * layers * activations.claimed_swiglu_layer_elements(b, s, d, h, f)
    assert claimed == 20_352 * 2**20
    # its S^2 terms are twice the real ones (scores and softmax; only the softmax is saved) ...
    real_s2 = layers * 4 * b * h * s * s
    assert 4 * layers * 2 * b * h * s * s == 2 * real_s2
    # ... and its linear terms are short: 7 N D + 3 N F against 10 N D + 4 N F (+ the loss)
    linear = naive.total_bytes - real_s2 - layers * s * s
    assert linear / (claimed - 2 * real_s2) > 1.35
    assert 0.95 < claimed / naive.total_bytes < 1  # near the total only by compensating errors


def test_checkpointed_bytes_and_the_sqrt_l_claim():
    cfg = TransformerConfig.preset("2.7B")
    full = activations.saved_bytes(cfg, 4, 512)
    n_d = 4 * 512 * 2560 * 4
    for k in (1, 2, 6, 32, 40):
        ck = activations.saved_bytes(cfg, 4, 512, checkpoint_segment=k)
        assert ck.blocks_bytes == math.ceil(32 / k) * n_d
        assert ck.recompute_bytes == min(k, 32) * full.block_bytes - n_d  # fp32 norm keeps x
        assert ck.peak_bytes == ck.total_bytes + ck.recompute_bytes
        assert (ck.peak_bytes < full.total_bytes) == (k < 32)  # one segment of all saves nothing
    assert full.recompute_bytes == 0 and full.peak_bytes == full.total_bytes
    bf16 = activations.saved_bytes(cfg, 4, 512, dtype="bf16", checkpoint_segment=2)
    assert bf16.recompute_bytes == 2 * bf16.block_bytes  # the norm keeps an fp32 copy instead
    # a block keeps ~26 (N, D) tensors: one block per segment beats sqrt(L) at every preset
    for preset in PRESETS:
        c = TransformerConfig.preset(preset)
        peaks = {k: activations.saved_bytes(c, 4, 128, checkpoint_segment=k).peak_bytes
                 for k in range(1, c.n_layers + 1)}
        assert min(peaks, key=peaks.get) == 1
        sqrt_l = round(math.sqrt(c.n_layers))
        assert sqrt_l == 1 or peaks[1] < peaks[sqrt_l]
    # O(sqrt L) holds as L grows: the best peak's blocks part grows ~2x per 4x layers, at the best
    # k ~ sqrt(L * N D / block) (24 at 16,384 layers), not at k = sqrt(L)
    def best(layers):
        c = TransformerConfig.preset("small", n_layers=layers)
        return min(activations.saved_bytes(c, 1, 64, checkpoint_segment=k).peak_bytes
                   - activations.saved_bytes(c, 1, 64).outside_bytes for k in range(1, 200))
    assert 1.9 < best(16_384) / best(4_096) < 2.1


def test_bad_arguments_are_refused_before_counting():
    cfg = TransformerConfig()
    with pytest.raises(ValueError, match="dtype='int8' is not one of"):
        activations.saved_bytes(cfg, 1, 8, dtype="int8")
    with pytest.raises(ValueError, match="unknown dtype"):
        activations.saved_bytes(cfg, 1, 8, dtype="fp33")
    with pytest.raises(ValueError, match="attention='flash' is not one of"):
        activations.saved_bytes(cfg, 1, 8, attention="flash")
    with pytest.raises(ValueError, match="seq .129. exceeds cfg.context_length .128."):
        activations.saved_bytes(cfg, 1, 129)
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        activations.saved_bytes(cfg, 0, 8)
    with pytest.raises(ValueError, match="checkpoint_segment must be a positive integer"):
        activations.saved_bytes(cfg, 1, 8, checkpoint_segment=0)
    with pytest.raises(TypeError, match="cfg needs a 'context_length' attribute"):
        activations.saved_bytes(object(), 1, 8)
    with pytest.raises(ValueError, match="early_stop"):
        recompute.recompute_flops(cfg, 1, 8, checkpoint_segment=1, early_stop=None)
    # the config's backend by default
    assert activations.saved_bytes(cfg, 1, 8).attention == "naive"
    assert activations.saved_bytes(TransformerConfig(attention="sdpa"), 1, 8).attention == "sdpa"


GPT = dict(norm="layernorm", positions="learned", bias=True, tie_embeddings=True, mlp="gelu")
KINDS = {
    "gqa": dict(n_kv_heads=2), "mqa": dict(n_kv_heads=1), "gelu": dict(mlp="gelu"),
    "relu": dict(mlp="relu"), "layernorm": dict(norm="layernorm"), "bias": dict(bias=True),
    "learned": dict(positions="learned"), "tied": dict(tie_embeddings=True), "gpt": GPT,
    "gpt_gqa": {**GPT, "n_kv_heads": 2}, "llama_gqa_bias": dict(n_kv_heads=2, bias=True),
}


def on_cpu(tensors, dtype):
    """The tensors as the CPU keeps them: LayerNorm's mean and 1/std in the model's dtype (the
    accounting has them in fp32 for a 16-bit model, as CUDA and the meta device keep them)."""
    return tuple(dataclasses.replace(t, dtype=dtype) if t.what in ("mean", "1/std") else t
                 for t in tensors)


@pytest.mark.parametrize(("kind", "dtype"), [
    *((kind, dtype) for kind in KINDS for dtype in ("fp32", "bf16")),
    ("gpt_gqa", "fp16"), ("gpt_gqa", "fp64"), ("relu", "fp16")])
@pytest.mark.parametrize("attention", ["sdpa", "naive", "flash_torch"])
def test_other_shapes_whole_small_model_on_cpu_is_exact(kind, attention, dtype):
    cfg = TransformerConfig(d_model=32, n_heads=4, d_ff=40, n_layers=2, vocab_size=50,
                            context_length=16, attention=attention, **KINDS[kind])
    for batch, seq in [(3, 16), (1, 7), (2, 1)]:
        saved = count_model(cfg, batch, seq, dtype=dtype, device="cpu")
        predicted = activations.saved_bytes(cfg, batch, seq, dtype=dtype)
        tensors = on_cpu(predicted.block * 2 + predicted.outside, dtype)
        assert saved.activation_bytes == sum(t.nbytes for t in tensors), (batch, seq)
        assert sizes(saved) == predicted_sizes(tensors)
        if cfg.norm == "layernorm" and dtype in ("bf16", "fp16"):  # 5 norms, 2 (N, 1) tensors
            gap = 5 * 2 * batch * seq * (4 - 2)
            assert predicted.total_bytes - saved.activation_bytes == gap


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["gpt", "gpt_gqa", "layernorm"])
def test_layernorm_models_on_meta_are_exact(kind, dtype):
    """The meta device keeps LayerNorm's statistics in fp32 as CUDA does: the accounting as is."""
    cfg = TransformerConfig.preset("small", attention="naive", **KINDS[kind])
    saved = count_model(cfg, 2, 17, dtype=dtype)
    predicted = activations.saved_bytes(cfg, 2, 17, dtype=dtype)
    assert saved.activation_bytes == predicted.total_bytes
    assert sizes(saved) == predicted_sizes(predicted.block * cfg.n_layers + predicted.outside)


@pytest.mark.parametrize("attention", ["sdpa", "naive", "flash_torch"])
@pytest.mark.parametrize("kind", ["gpt", "gpt_gqa", "relu", "llama_gqa_bias"])
def test_other_shapes_one_block_at_the_small_preset_is_exact(kind, attention):
    cfg = TransformerConfig.preset("small", attention=attention, **KINDS[kind])
    for dtype in ("fp32", "bf16"):
        saved = count_block(cfg, 2, 8, dtype=dtype)
        block = on_cpu(activations.saved_bytes(cfg, 2, 8, dtype=dtype).block, dtype)
        assert saved.activation_bytes == sum(t.nbytes for t in block)
        assert sizes(saved) == predicted_sizes(block)


def test_what_each_kind_changes_in_a_block():
    """Per block, against the book's model (SwiGLU, RMSNorm, RoPE, MHA) at the same sizes:
    N = B S tokens, D, F, b = 2 bytes (bf16)."""
    b, s, d, f = 4, 512, 768, 3_072
    n = b * s

    def block(dtype="bf16", attention="sdpa", **fields):
        cfg = TransformerConfig.preset("small", attention=attention, **fields)
        return activations.saved_bytes(cfg, b, s, dtype=dtype)

    book = block()
    parts = book.components()
    assert block(n_kv_heads=4).block_bytes == book.block_bytes  # repeated heads: as MHA
    assert block(n_kv_heads=1).block_bytes == book.block_bytes
    assert block(bias=True).block_bytes == book.block_bytes
    assert block(tie_embeddings=True).total_bytes == book.total_bytes
    gelu = block(mlp="gelu").components()
    assert gelu["w3_output"] == gelu["silu_output"] == 0
    assert book.block_bytes - block(mlp="gelu").block_bytes == 2 * n * f * 2  # 2 of 4 (N, F)
    assert book.block_bytes - block(mlp="relu").block_bytes == 3 * n * f * 2  # 3 of 4
    ln = block(norm="layernorm").components()
    assert ln["attn_norm"] == n * d * 2 + 2 * n * 4  # x in bf16, mean and 1/std in fp32
    assert parts["attn_norm"] == 2 * n * d * 4 + n * 4  # RMSNorm: fp32 x and x/rms, 1/rms
    # without RoPE, SDPA's output is laid out as q is: the o_proj input is a view of it
    assert block(positions="learned").components()["o_proj_input"] == 0
    assert block(positions="learned", attention="naive").components()["o_proj_input"] == n * d * 2


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_recompute_bytes_keep_the_segment_input_in_a_layernorm(norm, dtype):
    """The backward's rerun of one segment saves its forward again, less the segment input where
    the first norm keeps x itself: a LayerNorm in every dtype, RMSNorm only in fp32 and fp64."""
    cfg = TransformerConfig.preset("small", norm=norm, mlp="gelu", attention="naive")
    with torch.device("meta"):
        model = Transformer(cfg).to(torch_dtype(dtype))
    batch, seq, segment = 2, 32, 3
    cos, sin = model.rope(seq)
    x = torch.empty(batch, seq, cfg.d_model, device="meta", dtype=torch_dtype(dtype),
                    requires_grad=True)
    with SavedTensors(exclude=(x, cos, sin)) as saved:
        for block in list(model.blocks)[:segment]:
            x = block(x, cos, sin)
    predicted = activations.saved_bytes(cfg, batch, seq, dtype=dtype, checkpoint_segment=segment)
    assert saved.activation_bytes == predicted.recompute_bytes
    kept = norm == "layernorm" or dtype == "fp32"
    assert predicted.recompute_bytes == segment * predicted.block_bytes - (
        predicted.segment_input.nbytes if kept else 0)
