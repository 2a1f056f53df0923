"""A Hugging Face `config.json` read into a `TransformerConfig`, for the accounting and the planner.

`from_hf_config("path/to/config.json")` (or the folder holding it; no download) understands the
decoder-only families whose arithmetic `TransformerConfig` describes exactly:

    llama, mistral, qwen2   RMSNorm, RoPE, SwiGLU (hidden_act "silu"), grouped-query attention
    mixtral                 the same with a mixture of experts (num_local_experts, top-k)
    gpt2                    LayerNorm, learned positions, GeLU, biases, tied head
    opt                     LayerNorm, learned positions, ReLU (activation_function), biases, tied

Every key is sorted into one of three kinds, and the rest is refused: the keys read (sizes and the
architecture), the keys known not to change the arithmetic (`IGNORED_KEYS`: token ids, dtypes,
dropout, initialisation, RoPE scaling, router loss weights, ...), and the keys that would change
it in a way the config cannot say (`REFUSED_KEYS`, and values such as a `head_dim` other than
hidden / heads, a sliding window in use, an unknown activation). A refusal is a ValueError naming
the key and the file; so is a required key missing or of the wrong type.

Faithfulness, where a family does something the config has no field for:
- Qwen2 (and Llama's `attention_bias` alone) has biases on the attention projections only, where
  `TransformerConfig.bias` puts them on every linear. Refused by default, naming the biases and
  their count; `drop_attention_bias=True` reads the model without them (short by d + 2 kv_heads
  d_head parameters per layer for Qwen2, 2 d + 2 kv_heads d_head for Llama: under 0.002% of
  Qwen2-7B; the matmul FLOPs are unchanged).
- OPT's learned position table has max_position_embeddings + 2 rows (an offset kept from
  fairseq); the config counts max_position_embeddings rows: 2 d parameters short (0.001% of OPT
  125M).
- BLOOM (ALiBi and a LayerNorm after the embedding), DeepSeek (multi-head latent attention),
  Qwen2-MoE (shared experts of their own width), Gemma, Phi, Falcon, GPT-NeoX: refused by
  `model_type`.

Over 300 lines, one module: most of it is data (each family's keys, read, ignored and refused),
best read beside the readers that sort them. Pure Python (json, pathlib); no torch.
Used in: `python -m mlsys plan --config`, chapter 09.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlsys.models.config import TransformerConfig

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "mixtral")
GPT_FAMILY = ("gpt2", "opt")
MODEL_TYPES = LLAMA_FAMILY + GPT_FAMILY
"""The `model_type`s read; any other is refused (see `REFUSED_MODEL_TYPES` for why some are)."""

REFUSED_MODEL_TYPES = {
    "bloom": "ALiBi positions and a LayerNorm after the embedding (2 d parameters)",
    "deepseek_v2": "multi-head latent attention and fine-grained experts",
    "deepseek_v3": "multi-head latent attention and fine-grained experts",
    "qwen2_moe": "shared experts of their own width, and experts on some layers only",
    "gemma": "a head_dim apart from hidden / heads and a GeGLU MLP",
    "gemma2": "sliding windows on alternate layers, logit soft-capping, four norms per block",
    "gpt_neox": "parallel attention and MLP, RoPE on part of each head",
    "falcon": "parallel attention and MLP, multi-query attention in its own layout",
    "phi": "parallel attention and MLP, RoPE on part of each head",
}
"""Known `model_type`s that `TransformerConfig` cannot describe, with what it lacks."""

READ_KEYS = {
    "llama": ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "tie_word_embeddings", "hidden_act",
              "max_position_embeddings", "rope_theta", "rms_norm_eps", "attention_bias",
              "mlp_bias", "head_dim", "sliding_window", "use_sliding_window",
              "num_local_experts", "num_experts_per_tok"),
    "gpt2": ("n_embd", "n_layer", "n_head", "n_inner", "n_positions", "vocab_size",
             "activation_function", "layer_norm_epsilon", "tie_word_embeddings",
             "add_cross_attention"),
    "opt": ("hidden_size", "ffn_dim", "num_hidden_layers", "num_attention_heads", "vocab_size",
            "max_position_embeddings", "activation_function", "tie_word_embeddings",
            "word_embed_proj_dim", "do_layer_norm_before", "_remove_final_layer_norm",
            "enable_bias", "layer_norm_elementwise_affine"),
}
"""The keys each family's reader looks at (`llama` stands for the whole Llama family)."""

IGNORED_KEYS = frozenset({
    "model_type", "architectures", "auto_map", "transformers_version", "_name_or_path",
    "torch_dtype", "dtype", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id",
    "unk_token_id", "sep_token_id", "decoder_start_token_id", "prefix", "is_decoder",
    "initializer_range", "init_std", "rope_scaling", "pretraining_tp", "n_ctx",
    "attention_dropout", "hidden_dropout", "dropout", "activation_dropout", "attn_pdrop",
    "embd_pdrop", "resid_pdrop", "layerdrop", "summary_type", "summary_use_proj",
    "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
    "task_specific_params", "scale_attn_weights", "reorder_and_upcast_attn",
    "scale_attn_by_inverse_layer_idx", "n_special", "predict_special_tokens",
    "output_router_logits", "router_aux_loss_coef", "router_jitter_noise", "max_window_layers",
    "output_attentions", "output_hidden_states", "return_dict", "id2label", "label2id",
    "layer_norm_eps", "quantization_config",
})
"""Keys that change no parameter count and no FLOP: token ids, dtypes, dropout, initialisation,
RoPE frequency scaling (same matmuls), router loss weights, and Qwen2's window bookkeeping
(`max_window_layers` matters only with `use_sliding_window`). `layer_norm_eps` is read by no
family here (OPT's LayerNorm eps is fixed in its code)."""

REFUSED_KEYS = {
    "q_lora_rank": "low-rank query projections (multi-head latent attention, DeepSeek-V2/V3)",
    "kv_lora_rank": "low-rank key/value projections (multi-head latent attention)",
    "qk_rope_head_dim": "a RoPE part of each head of its own width (multi-head latent attention)",
    "qk_nope_head_dim": "query/key heads of their own width (multi-head latent attention)",
    "v_head_dim": "value heads of their own width",
    "moe_intermediate_size": "experts of a width apart from intermediate_size",
    "shared_expert_intermediate_size": "a shared expert of its own width (Qwen2-MoE)",
    "n_routed_experts": "routed experts as DeepSeek counts them (with shared ones beside)",
    "n_shared_experts": "shared experts (DeepSeek)",
    "num_experts": "experts as Qwen-MoE counts them (with a shared expert beside)",
    "first_k_dense_replace": "dense feed-forwards in the first layers of a MoE",
    "moe_layer_freq": "experts on some layers only",
    "decoder_sparse_step": "experts on some layers only",
    "partial_rotary_factor": "RoPE on part of each head",
    "rotary_pct": "RoPE on part of each head",
    "parallel_attn": "attention and MLP side by side",
    "use_parallel_residual": "attention and MLP side by side",
    "alibi": "ALiBi positions",
    "multi_query": "multi-query attention in Falcon's layout",
    "new_decoder_architecture": "Falcon's parallel blocks",
    "attn_logit_softcapping": "soft-capped attention logits",
    "final_logit_softcapping": "soft-capped output logits",
}
"""Keys whose arithmetic `TransformerConfig` cannot describe, with what they would change."""

SWIGLU_ACTIVATIONS = ("silu", "swish")
"""`hidden_act` of a Llama-family MLP read as SwiGLU: w2(silu(w1 x) * w3 x)."""
GPT_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu", "gelu_fast": "gelu",
                   "gelu_pytorch_tanh": "gelu", "relu": "relu"}
"""`activation_function` of a GPT-2 or OPT MLP -> `TransformerConfig.mlp` (the tanh forms
count as GeLU: the same two matrices, about the same elementwise work)."""


def from_hf_config(path: str | Path, *, drop_attention_bias: bool = False) -> TransformerConfig:
    """The `TransformerConfig` of a Hugging Face `config.json` at `path` (the file, or a folder
    holding it). ValueError naming the key and the file for anything not understood (see the
    module docstring); `drop_attention_bias` as in `from_hf_dict`."""
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"no Hugging Face config at {file} (a config.json, or a folder "
                                "holding one; nothing is downloaded)")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{file} is not a JSON file: {error}") from None
    return from_hf_dict(data, source=str(file), drop_attention_bias=drop_attention_bias)


def from_hf_dict(config: dict[str, Any], *, source: str = "config",
                 drop_attention_bias: bool = False) -> TransformerConfig:
    """The `TransformerConfig` of a Hugging Face config already read into a dict; `source` names
    it in errors. `drop_attention_bias=True` accepts biases on the attention projections alone
    (Qwen2, Llama's `attention_bias`) and leaves them out of the config (module docstring)."""
    if not isinstance(config, dict):
        raise ValueError(f"{source}: a config must be a JSON object, got {type(config).__name__}")
    if not isinstance(drop_attention_bias, bool):
        raise TypeError(f"drop_attention_bias must be True or False, got {drop_attention_bias!r}")
    refused = [key for key in config if key in REFUSED_KEYS]
    if refused:
        reasons = "; ".join(f"{key!r}: {REFUSED_KEYS[key]}" for key in refused)
        raise ValueError(f"{source}: key(s) {refused} change the arithmetic in a way "
                         f"TransformerConfig cannot describe ({reasons})")
    model_type = _get(config, "model_type", str, source)
    if model_type not in MODEL_TYPES:
        why = REFUSED_MODEL_TYPES.get(model_type, "not a family this reader knows")
        raise ValueError(f"{source}: model_type {model_type!r} is not understood ({why}); "
                         f"understood: {', '.join(MODEL_TYPES)}")
    family = "llama" if model_type in LLAMA_FAMILY else model_type
    unknown = sorted(set(config) - set(READ_KEYS[family]) - IGNORED_KEYS)
    if unknown:
        raise ValueError(f"{source}: key(s) {unknown} not understood for model_type "
                         f"{model_type!r}: they may change the arithmetic, so the config is "
                         "refused rather than read without them")
    reader = {"llama": _llama, "gpt2": _gpt2, "opt": _opt}[family]
    fields = reader(config, model_type, source, drop_attention_bias)
    try:
        return TransformerConfig(**fields)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{source}: {error}") from None


_MISSING = object()


def _get(config: dict[str, Any], key: str, kind: type, source: str, default: Any = _MISSING,
         *, nullable: bool = False) -> Any:
    """config[key], checked to be of `kind` (int: not a bool; float: any number); `default`
    when absent (or null, with `nullable`); ValueError naming the key and the file otherwise."""
    value = config.get(key, _MISSING)
    if value is _MISSING or (nullable and value is None):
        if default is _MISSING:
            raise ValueError(f"{source}: required key {key!r} is missing")
        return default
    ok = {int: isinstance(value, int) and not isinstance(value, bool),
          float: isinstance(value, (int, float)) and not isinstance(value, bool),
          bool: isinstance(value, bool), str: isinstance(value, str)}[kind]
    if not ok:
        raise ValueError(f"{source}: key {key!r} must be {kind.__name__} "
                         f"(JSON {'number' if kind in (int, float) else kind.__name__}), "
                         f"got {value!r} ({type(value).__name__})")
    return float(value) if kind is float else value


def _llama(config: dict[str, Any], model_type: str, source: str,
           drop_attention_bias: bool) -> dict[str, Any]:
    d = _get(config, "hidden_size", int, source)
    n_heads = _get(config, "num_attention_heads", int, source)
    n_kv = _get(config, "num_key_value_heads", int, source, None, nullable=True)
    head_dim = _get(config, "head_dim", int, source, None, nullable=True)
    if head_dim is not None and n_heads and head_dim * n_heads != d:
        raise ValueError(f"{source}: key 'head_dim' ({head_dim}) differs from hidden_size / "
                         f"num_attention_heads = {d} / {n_heads}: TransformerConfig's heads are "
                         "d_model / n_heads wide")
    act = _get(config, "hidden_act", str, source, "silu")
    if act not in SWIGLU_ACTIVATIONS:
        raise ValueError(f"{source}: key 'hidden_act' = {act!r} is not understood for "
                         f"{model_type!r}: a gated MLP is read only with {SWIGLU_ACTIVATIONS}")
    context = _get(config, "max_position_embeddings", int, source)
    _check_window(config, model_type, source, context)
    n_layers = _get(config, "num_hidden_layers", int, source)
    attention_bias = _get(config, "attention_bias", bool, source, False)
    mlp_bias = _get(config, "mlp_bias", bool, source, False)
    kv_dim = (n_kv or n_heads) * (d // max(n_heads, 1))
    if model_type == "qwen2":  # q, k, v biases in its code, whatever the keys say
        if attention_bias or mlp_bias:
            key = "attention_bias" if attention_bias else "mlp_bias"
            raise ValueError(f"{source}: key {key!r} is not read by model_type 'qwen2' (its q, "
                             "k and v projections have biases, nothing else)")
        attention_bias, where, per_layer = True, "q, k and v projections (Qwen2's)", d + 2 * kv_dim
    else:
        where = "q, k, v and o projections ('attention_bias': true)"
        per_layer = 2 * d + 2 * kv_dim
    if mlp_bias and not attention_bias:
        raise ValueError(f"{source}: key 'mlp_bias' is true and 'attention_bias' false: biases "
                         "on the MLP alone are not a TransformerConfig (its bias is on every "
                         "linear)")
    bias = attention_bias and mlp_bias
    if attention_bias and not mlp_bias and not drop_attention_bias:
        raise ValueError(f"{source}: biases on the {where} alone are not a TransformerConfig "
                         f"(its bias is on every linear): {per_layer:,} parameters per layer, "
                         f"{per_layer * n_layers:,} in all; from_hf_config(..., "
                         "drop_attention_bias=True) reads the model without them")
    fields = dict(
        vocab_size=_get(config, "vocab_size", int, source),
        context_length=context,
        d_model=d,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        d_ff=_get(config, "intermediate_size", int, source),
        rope_theta=_get(config, "rope_theta", float, source, 10_000.0),
        norm_eps=_get(config, "rms_norm_eps", float, source, 1e-6),
        tie_embeddings=_get(config, "tie_word_embeddings", bool, source, False),
        bias=bias,
    )
    n_experts = _get(config, "num_local_experts", int, source, 0, nullable=True)
    top_k = _get(config, "num_experts_per_tok", int, source, 0, nullable=True)
    if model_type == "mixtral":
        if "num_local_experts" not in config:
            raise ValueError(f"{source}: required key 'num_local_experts' is missing")
        fields.update(n_experts=n_experts, experts_per_token=top_k or 2)  # HF's default top-2
    elif n_experts or top_k:
        key = "num_local_experts" if n_experts else "num_experts_per_tok"
        raise ValueError(f"{source}: key {key!r} is set but model_type {model_type!r} is dense")
    return fields


def _check_window(config: dict[str, Any], model_type: str, source: str, context: int) -> None:
    """A sliding window in use is refused (it changes attention's FLOPs past the window):
    Mistral's (4096 when the key is absent, as in its Hugging Face class), Mixtral's, and
    Qwen2's with `use_sliding_window`; Llama has none (the keys are not read)."""
    if model_type == "llama":
        return
    default = 4_096 if model_type == "mistral" and "sliding_window" not in config else None
    window = _get(config, "sliding_window", int, source, default, nullable=True)
    in_use = _get(config, "use_sliding_window", bool, source, model_type != "qwen2")
    if window is not None and in_use and window < context:
        raise ValueError(f"{source}: key 'sliding_window' = {window} is in use (below the "
                         f"context of {context}): attention over a window is not a "
                         "TransformerConfig")


def _gpt2(config: dict[str, Any], model_type: str, source: str,
          drop_attention_bias: bool) -> dict[str, Any]:
    d = _get(config, "n_embd", int, source)
    act = _get(config, "activation_function", str, source, "gelu_new")
    if act not in GPT_ACTIVATIONS:
        raise ValueError(f"{source}: key 'activation_function' = {act!r} is not understood; "
                         f"understood: {', '.join(GPT_ACTIVATIONS)}")
    if _get(config, "add_cross_attention", bool, source, False):
        raise ValueError(f"{source}: key 'add_cross_attention' is true: a decoder with "
                         "cross-attention is not a TransformerConfig")
    return dict(
        vocab_size=_get(config, "vocab_size", int, source),
        context_length=_get(config, "n_positions", int, source),
        d_model=d,
        n_layers=_get(config, "n_layer", int, source),
        n_heads=_get(config, "n_head", int, source),
        d_ff=_get(config, "n_inner", int, source, 4 * d, nullable=True),
        norm_eps=_get(config, "layer_norm_epsilon", float, source, 1e-5),
        mlp=GPT_ACTIVATIONS[act], norm="layernorm", positions="learned", bias=True,
        tie_embeddings=_get(config, "tie_word_embeddings", bool, source, True),
    )


def _opt(config: dict[str, Any], model_type: str, source: str,
         drop_attention_bias: bool) -> dict[str, Any]:
    d = _get(config, "hidden_size", int, source)
    proj = _get(config, "word_embed_proj_dim", int, source, d, nullable=True)
    if proj != d:
        raise ValueError(f"{source}: key 'word_embed_proj_dim' ({proj}) differs from "
                         f"hidden_size ({d}): OPT's projections in and out of the embedding "
                         "are not a TransformerConfig")
    if not _get(config, "do_layer_norm_before", bool, source, True):
        raise ValueError(f"{source}: key 'do_layer_norm_before' is false: a post-norm OPT has "
                         "no final LayerNorm; TransformerConfig is pre-norm")
    if _get(config, "_remove_final_layer_norm", bool, source, False):
        raise ValueError(f"{source}: key '_remove_final_layer_norm' is true: TransformerConfig "
                         "has a final norm")
    if not _get(config, "layer_norm_elementwise_affine", bool, source, True):
        raise ValueError(f"{source}: key 'layer_norm_elementwise_affine' is false: LayerNorm "
                         "without gain and bias is not a TransformerConfig")
    act = _get(config, "activation_function", str, source, "relu")
    if act not in GPT_ACTIVATIONS:
        raise ValueError(f"{source}: key 'activation_function' = {act!r} is not understood; "
                         f"understood: {', '.join(GPT_ACTIVATIONS)}")
    return dict(
        vocab_size=_get(config, "vocab_size", int, source),
        context_length=_get(config, "max_position_embeddings", int, source),
        d_model=d,
        n_layers=_get(config, "num_hidden_layers", int, source),
        n_heads=_get(config, "num_attention_heads", int, source),
        d_ff=_get(config, "ffn_dim", int, source),
        mlp=GPT_ACTIVATIONS[act], norm="layernorm", positions="learned",
        bias=_get(config, "enable_bias", bool, source, True),
        tie_embeddings=_get(config, "tie_word_embeddings", bool, source, True),
    )
