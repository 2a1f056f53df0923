"""mlsys.models.hf_config: Hugging Face config.json files (written here from the published
configs of Llama 3 8B, Mixtral 8x7B, GPT-2, OPT-125M, Qwen2-7B and Mistral 7B; nothing is
downloaded) read into TransformerConfigs, counted against published totals, and every refusal."""

import json
import subprocess
import sys

import pytest

from mlsys.accounting.params import param_counts
from mlsys.models.catalog import NAMED_MODELS, named_config
from mlsys.models.config import TransformerConfig
from mlsys.models.hf_config import (
    IGNORED_KEYS,
    READ_KEYS,
    REFUSED_KEYS,
    from_hf_config,
    from_hf_dict,
)

LLAMA3_8B = {  # meta-llama/Meta-Llama-3-8B, config.json
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0", "use_cache": True, "vocab_size": 128256,
}
LLAMA31_8B = {  # meta-llama/Llama-3.1-8B: a longer context, RoPE scaling, mlp_bias, head_dim
    **LLAMA3_8B, "max_position_embeddings": 131072, "mlp_bias": False, "head_dim": 128,
    "eos_token_id": [128001, 128008, 128009],
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
MIXTRAL_8X7B = {  # mistralai/Mixtral-8x7B-v0.1, config.json
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0", "use_cache": True, "vocab_size": 32000,
}
GPT2 = {  # openai-community/gpt2, config.json
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
    "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
    "n_head": 12, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1,
    "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
    "summary_type": "cls_index", "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "vocab_size": 50257,
}
OPT_125M = {  # facebook/opt-125m, config.json
    "_name_or_path": "facebook/opt-125m", "_remove_final_layer_norm": False,
    "activation_dropout": 0.0, "activation_function": "relu", "architectures": ["OPTForCausalLM"],
    "attention_dropout": 0.0, "bos_token_id": 2, "do_layer_norm_before": True, "dropout": 0.1,
    "eos_token_id": 2, "ffn_dim": 3072, "hidden_size": 768, "init_std": 0.02, "layerdrop": 0.0,
    "max_position_embeddings": 2048, "model_type": "opt", "num_attention_heads": 12,
    "num_hidden_layers": 12, "pad_token_id": 1, "prefix": "</s>", "torch_dtype": "float16",
    "transformers_version": "4.21.0.dev0", "use_cache": True, "vocab_size": 50272,
    "word_embed_proj_dim": 768,
}
QWEN2_7B = {  # Qwen/Qwen2-7B, config.json
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
    "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
    "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.37.2", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 152064,
}
MISTRAL_7B_V01 = {  # mistralai/Mistral-7B-v0.1: a 4,096-token sliding window
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.34.0",
    "use_cache": True, "vocab_size": 32000,
}

# Counts published by others for the models above: what Hugging Face's classes report
# (`model.num_parameters()`, shown on the model pages), independent of this code.
GPT2_PARAMS = 124_439_808  # openai-community/gpt2
OPT_125M_PARAMS = 125_239_296  # facebook/opt-125m
QWEN2_7B_PARAMS = 7_615_616_512  # Qwen/Qwen2-7B (the model page: 7.62B)


def write(tmp_path, config, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


def test_llama3_8b_from_its_file_is_the_catalog_model(tmp_path):
    cfg = from_hf_config(write(tmp_path, LLAMA3_8B))
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.kv_heads, cfg.d_ff) == (
        4096, 32, 32, 8, 14336)
    assert (cfg.mlp, cfg.norm, cfg.positions, cfg.tie_embeddings, cfg.bias) == (
        "swiglu", "rmsnorm", "rope", False, False)
    assert (cfg.rope_theta, cfg.norm_eps, cfg.context_length) == (500_000.0, 1e-5, 8192)
    assert NAMED_MODELS["llama3-8b"].published_params == param_counts(cfg).total
    # Llama 3.1: the same shapes; RoPE scaling, a list of eos ids and head_dim = 4096 / 32 read
    cfg31 = from_hf_config(write(tmp_path, LLAMA31_8B))
    assert cfg31 == named_config("llama3-8b")
    assert from_hf_config(tmp_path) == cfg31  # a folder holding config.json


def test_mixtral_total_and_active_agree_with_the_published_figures(tmp_path):
    cfg = from_hf_config(write(tmp_path, MIXTRAL_8X7B))
    assert (cfg.n_experts, cfg.experts_per_token, cfg.expert_d_ff) == (8, 2, 14336)
    entry, counts = NAMED_MODELS["mixtral-8x7b"], param_counts(cfg)
    assert entry.agrees(counts.total)
    assert entry.agrees(counts.active, entry.published_active_params)
    assert cfg == named_config("mixtral-8x7b")


def test_gpt2_counts_what_hugging_face_counts(tmp_path):
    cfg = from_hf_config(write(tmp_path, GPT2))
    assert cfg.d_ff == 4 * 768  # n_inner absent (None) = 4 n_embd
    assert (cfg.mlp, cfg.norm, cfg.positions, cfg.tie_embeddings, cfg.bias) == (
        "gelu", "layernorm", "learned", True, True)
    assert param_counts(cfg).total == GPT2_PARAMS
    assert from_hf_dict({**GPT2, "n_inner": None}) == cfg
    assert from_hf_dict({**GPT2, "n_inner": 1000}).d_ff == 1000
    untied = from_hf_dict({**GPT2, "tie_word_embeddings": False})
    assert param_counts(untied).total == GPT2_PARAMS + 50257 * 768


def test_opt_counts_two_position_rows_short(tmp_path):
    cfg = from_hf_config(write(tmp_path, OPT_125M))
    assert (cfg.mlp, cfg.d_ff, cfg.context_length, cfg.tie_embeddings) == ("relu", 3072, 2048,
                                                                            True)
    # OPT's position table has max_position_embeddings + 2 rows (a fairseq offset); the config
    # counts max_position_embeddings of them, as documented
    assert param_counts(cfg).total == OPT_125M_PARAMS - 2 * 768
    assert not from_hf_dict({**OPT_125M, "enable_bias": False}).bias


def test_qwen2_attention_biases_are_refused_or_dropped_as_asked(tmp_path):
    path = write(tmp_path, QWEN2_7B)
    per_layer = 3584 + 2 * 4 * 128  # q (d), k and v (kv_heads x d_head each)
    with pytest.raises(ValueError, match=rf"q, k and v.*{per_layer:,} parameters per layer, "
                                         rf"{28 * per_layer:,} in all.*drop_attention_bias"):
        from_hf_config(path)
    cfg = from_hf_config(path, drop_attention_bias=True)
    assert not cfg.bias and cfg.kv_heads == 4
    assert param_counts(cfg).total + 28 * per_layer == QWEN2_7B_PARAMS
    # Llama's attention_bias (q, k, v and o) alone: the same choice; with mlp_bias: every linear
    llama = {**LLAMA3_8B, "attention_bias": True}
    with pytest.raises(ValueError, match="q, k, v and o projections"):
        from_hf_dict(llama)
    assert not from_hf_dict(llama, drop_attention_bias=True).bias
    assert from_hf_dict({**llama, "mlp_bias": True}).bias
    with pytest.raises(TypeError, match="drop_attention_bias must be True or False"):
        from_hf_dict(QWEN2_7B, drop_attention_bias="yes")


def test_windows_that_never_bind_are_read():
    mistral_v02 = {**MISTRAL_7B_V01, "sliding_window": None, "rope_theta": 1e6}
    assert from_hf_dict(mistral_v02).kv_heads == 8
    # Qwen2's window is off (use_sliding_window false): read, as above with drop_attention_bias
    assert from_hf_dict(QWEN2_7B, drop_attention_bias=True).context_length == 131072
    # a window as long as the context changes nothing
    assert from_hf_dict({**MISTRAL_7B_V01, "sliding_window": 32768}).d_model == 4096


REFUSALS = [  # (config, message fragment)
    ({**LLAMA3_8B, "head_dim": 64}, "'head_dim' \\(64\\) differs"),
    ({**LLAMA3_8B, "q_lora_rank": 1536}, "q_lora_rank.*multi-head latent attention"),
    ({**LLAMA3_8B, "kv_lora_rank": 512}, "kv_lora_rank"),
    ({**MIXTRAL_8X7B, "moe_intermediate_size": 1408}, "moe_intermediate_size"),
    ({**MIXTRAL_8X7B, "shared_expert_intermediate_size": 5632}, "shared_expert_intermediate"),
    ({**MIXTRAL_8X7B, "n_routed_experts": 64}, "n_routed_experts"),
    (MISTRAL_7B_V01, "'sliding_window' = 4096 is in use"),
    ({k: v for k, v in MISTRAL_7B_V01.items() if k != "sliding_window"},
     "'sliding_window' = 4096 is in use"),  # Mistral's default window
    ({**QWEN2_7B, "use_sliding_window": True, "sliding_window": 4096}, "sliding_window"),
    ({**LLAMA3_8B, "hidden_act": "gelu"}, "'hidden_act' = 'gelu' is not understood"),
    ({**GPT2, "activation_function": "swish"}, "'activation_function' = 'swish'"),
    ({**LLAMA3_8B, "model_type": "bloom"}, "model_type 'bloom' is not understood \\(ALiBi"),
    ({**LLAMA3_8B, "model_type": "my_llama"}, "model_type 'my_llama' is not understood"),
    ({**LLAMA3_8B, "vision_config": {}}, "\\['vision_config'\\] not understood"),
    ({**LLAMA3_8B, "num_local_experts": 8}, "'num_local_experts' is set but .* dense"),
    ({**LLAMA3_8B, "mlp_bias": True}, "'mlp_bias' is true and 'attention_bias' false"),
    ({**QWEN2_7B, "mlp_bias": True}, "'mlp_bias' is not read by model_type 'qwen2'"),
    ({**OPT_125M, "word_embed_proj_dim": 512}, "'word_embed_proj_dim' \\(512\\) differs"),
    ({**OPT_125M, "do_layer_norm_before": False}, "do_layer_norm_before"),
    ({**OPT_125M, "_remove_final_layer_norm": True}, "_remove_final_layer_norm"),
    ({**OPT_125M, "layer_norm_elementwise_affine": False}, "layer_norm_elementwise_affine"),
    ({**GPT2, "add_cross_attention": True}, "add_cross_attention"),
    ({k: v for k, v in LLAMA3_8B.items() if k != "hidden_size"},
     "required key 'hidden_size' is missing"),
    ({k: v for k, v in MIXTRAL_8X7B.items() if k != "num_local_experts"},
     "required key 'num_local_experts' is missing"),
    ({k: v for k, v in GPT2.items() if k != "model_type"}, "required key 'model_type'"),
    ({**LLAMA3_8B, "hidden_size": "4096"}, "'hidden_size' must be int.*'4096' \\(str\\)"),
    ({**LLAMA3_8B, "hidden_size": 4096.0}, "'hidden_size' must be int.*4096.0 \\(float\\)"),
    ({**GPT2, "n_layer": True}, "'n_layer' must be int.*True \\(bool\\)"),
    ({**LLAMA3_8B, "tie_word_embeddings": "false"}, "'tie_word_embeddings' must be bool"),
    ({**LLAMA3_8B, "rope_theta": "1e4"}, "'rope_theta' must be float"),
    ({**LLAMA3_8B, "num_attention_heads": 30}, "d_model \\(4096\\) is not divisible"),
    ({**LLAMA3_8B, "num_key_value_heads": 5}, "multiple of n_kv_heads"),
]


@pytest.mark.parametrize(("config", "message"), REFUSALS)
def test_what_is_not_understood_is_refused_naming_the_key_and_file(tmp_path, config, message):
    path = write(tmp_path, config)
    with pytest.raises(ValueError, match=message) as error:
        from_hf_config(path)
    assert str(path) in str(error.value)


def test_files_that_are_not_configs(tmp_path):
    with pytest.raises(FileNotFoundError, match="no Hugging Face config at"):
        from_hf_config(tmp_path / "missing.json")
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_hf_config(tmp_path)  # a folder without one
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json is not a JSON file"):
        from_hf_config(bad)
    with pytest.raises(ValueError, match="must be a JSON object, got list"):
        from_hf_config(write(tmp_path, [LLAMA3_8B], "list.json"))


def test_every_key_of_the_example_configs_is_read_or_known_harmless():
    families = {"llama": LLAMA3_8B, "gpt2": GPT2, "opt": OPT_125M}
    for family, config in families.items():
        assert set(config) <= set(READ_KEYS[family]) | IGNORED_KEYS, family
    for config in (LLAMA31_8B, MIXTRAL_8X7B, QWEN2_7B, MISTRAL_7B_V01):
        assert set(config) <= set(READ_KEYS["llama"]) | IGNORED_KEYS
    # the three kinds of key are apart
    read = set().union(*map(set, READ_KEYS.values()))
    assert not read & IGNORED_KEYS and not read & set(REFUSED_KEYS)
    assert not IGNORED_KEYS & set(REFUSED_KEYS)


def test_a_result_is_a_config_and_the_reader_is_pure_python():
    assert isinstance(from_hf_dict(GPT2), TransformerConfig)
    code = ("import sys, mlsys.models.hf_config, mlsys.models.catalog\n"
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
