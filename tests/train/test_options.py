"""mlsys.train.options: bad flags and bad paths are clear errors before any process-group work, a
checkpoint of another model is refused, and the flags of the sbatch example are valid. The
refused checkpoint is a real run's (a torchrun job, train_runs.py)."""

import json
from pathlib import Path

import pytest
import torch
from train_runs import trained

from mlsys.models.config import TransformerConfig
from mlsys.models.hf_config import from_hf_config
from mlsys.train import options


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("single"), "one")


@pytest.mark.parametrize(("argv", "world", "match"), [
    (["--mesh", "dp_shard=3"], 2, "product must equal the world size"),
    (["--mesh", "tp=3"], 3, "not divisible by tp"),
    (["--mesh", "cp=2"], 2, "context parallelism"),
    (["--mesh", "dp_shard=2,ep=2"], 4, "AXIS=N"),
    (["--preset", "2.7B", "--device", "cpu", "--seq-len", "1024", "--global-batch", "64"], 1,
     "does not fit"),
    (["--global-batch", "6"], 4, "divisible by dp"),
    (["--seq-len", "4096"], 1, "context_length"),
    (["--warmup", "9", "--steps", "9"], 1, "--warmup"),
    (["--sequence-parallel"], 2, "needs tp > 1"),
    (["--kill-rank-at", "3:2"], 2, "rank must be < the world size"),
])
def test_bad_flags_are_clear_errors_before_any_process_group(argv, world, match):
    with pytest.raises(ValueError, match=match):
        options.resolve(options.parse(argv), world)
    assert not torch.distributed.is_initialized()


def test_bad_paths_are_clear_errors(tmp_path):
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    for argv, error in ((["--data", str(tmp_path / "missing.bin")], FileNotFoundError),
                        (["--data", str(empty)], ValueError)):
        with pytest.raises(error, match="data|empty|missing"):
            options.check_paths(options.resolve(options.parse(argv), 1))
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    with pytest.raises(PermissionError, match="not a writable directory"):
        options.check_paths(options.resolve(options.parse(["--ckpt", str(a_file / "ck")]), 1))


def test_the_sbatch_example_flags_are_valid(monkeypatch):
    text = (Path(__file__).resolve().parents[2] / "examples" / "train.sbatch").read_text()
    flags = text.split("-m mlsys.train", 1)[1].replace("\\\n", " ").split()
    monkeypatch.setattr(options, "memory_limit_bytes", lambda device: (80e9, "an H100's"))
    run = options.resolve(options.parse([f.strip('"') for f in flags]), 32)
    assert run.dims.world_size == 32 and run.why_mesh.startswith("--mesh auto")


def test_a_checkpoint_of_another_model_is_refused(single):
    ckpt = single[2]
    with pytest.raises(ValueError, match="vocab_size|shape|differ"):
        options.check_paths(options.resolve(options.parse(
            ["--preset", "laptop", "--ckpt", str(ckpt)]), 1))


# --- the model's architecture flags: a Llama-shaped or GPT-shaped model ---------------------------

def test_without_architecture_flags_the_preset_is_unchanged():
    assert options.resolve(options.parse([]), 1).config == TransformerConfig.preset("debug")
    assert options.resolve(options.parse(["--preset", "laptop"]), 1).config == \
        TransformerConfig.preset("laptop")


def test_architecture_flags_reshape_the_preset():
    gpt = options.resolve(options.parse(
        ["--mlp", "gelu", "--d-ff", "256", "--norm", "layernorm", "--positions", "learned",
         "--tie-embeddings", "--bias"]), 1).config
    assert gpt == TransformerConfig.preset("debug", mlp="gelu", d_ff=256, norm="layernorm",
                                           positions="learned", tie_embeddings=True, bias=True)
    llama = options.resolve(options.parse(["--n-kv-heads", "2", "--no-bias"]), 1)
    assert (llama.config.kv_heads, llama.config.bias) == (2, False)
    assert "4 heads (2 key/value), swiglu, rmsnorm, rope positions" in options.describe(llama)


@pytest.mark.parametrize(("argv", "world", "match"), [
    (["--n-kv-heads", "3"], 1, r"--preset debug --n-kv-heads 3: n_heads \(4\) must be a multiple"),
    (["--n-kv-heads", "0"], 1, "n_kv_heads must be a positive integer"),
    (["--d-ff", "0", "--mlp", "relu"], 1, "--d-ff 0: d_ff must be a positive integer"),
    (["--n-kv-heads", "2", "--mesh", "tp=4"], 4, "tp=4 must divide the 2 key/value heads"),
    (["--tie-embeddings", "--mesh", "pp=2", "--micro-batch", "2"], 2, "--tie-embeddings with pp"),
    (["--positions", "learned", "--mesh", "tp=2", "--sequence-parallel"], 2,
     "not with --tie-embeddings or --positions learned"),
])
def test_bad_architecture_flags_are_clear_errors_before_any_process_group(argv, world, match):
    with pytest.raises(ValueError, match=match):
        options.resolve(options.parse(argv), world)
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("argv", [["--mlp", "swish"], ["--norm", "batchnorm"],
                                  ["--positions", "alibi"], ["--preset", "debug", "--config", "c"],
                                  ["--n-kv-heads", "two"]])
def test_malformed_architecture_flags_are_argparse_errors(argv, capsys):
    with pytest.raises(SystemExit):
        options.parse(argv)
    assert "error:" in capsys.readouterr().err


def test_a_hugging_face_config_trains_with_its_shape(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 128,
        "hidden_act": "silu", "tie_word_embeddings": False, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0}))
    run = options.resolve(options.parse(["--config", str(path)]), 1)
    assert run.config == from_hf_config(path)
    assert run.config.kv_heads == 2
    mixtral = json.loads(path.read_text()) | {"architectures": ["MixtralForCausalLM"],
                                               "model_type": "mixtral", "num_local_experts": 4,
                                               "num_experts_per_tok": 2}
    path.write_text(json.dumps(mixtral))
    with pytest.raises(ValueError, match="experts are costed by the planner, not built"):
        options.resolve(options.parse(["--config", str(path)]), 1)
