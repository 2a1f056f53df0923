"""`python -m mlsys` (mlsys.__main__) in a subprocess: `napkin` and `plan` print what the
library returns; bad arguments are one-line errors with status 2."""

import json
import pathlib
import subprocess
import sys

import pytest

from mlsys import hardware, tables
from mlsys.accounting import planner
from mlsys.accounting.napkin import napkin
from mlsys.models.config import TransformerConfig
from mlsys.models.hf_config import from_hf_config

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples" / "clusters"

XL_ON_8_H100 = "--preset xl --gpu H100 --batch 8 --seq 1024 --devices 8".split()


def _run(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mlsys", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_napkin_prints_the_library_summary():
    done = _run("napkin", *XL_ON_8_H100, "--mfu", "0.4")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    xl = TransformerConfig.preset("xl")
    expected = tables.napkin_lines(napkin(xl, "h100", batch=8, seq=1_024, n_devices=8, mfu=0.4,
                                          name="xl"))
    assert done.stdout.splitlines() == expected
    for needle in ("N = 1,998,235,200", "sharded over 8: 4 GB", "12.8 GFLOP", "0.266 s"):
        assert needle in done.stdout, needle


def test_names_are_case_insensitive_and_options_reach_the_library():
    done = _run("napkin", "--preset", "small", "--gpu", "a100", "--batch", "2", "--seq", "256",
                "--recipe", "fp32_adamw", "--dtype", "fp32", "--mfu", "0.5")  # fmt: skip
    assert done.returncode == 0, done.stderr
    expected = napkin(TransformerConfig.preset("small"), "A100", batch=2, seq=256,
                      recipe="fp32_adamw", dtype="fp32", mfu=0.5, name="small")
    assert done.stdout.splitlines() == tables.napkin_lines(expected)


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        (("--preset", "huge"), ("argument --preset:", "'huge'", "xl")),
        (("--gpu", "X100"), ("argument --gpu:", "'X100'", "h100")),
        (("--batch", "0"), ("argument --batch:", "batch must be a positive integer, got 0")),
        (("--batch", "eight"), ("argument --batch:", "positive integer, got 'eight'")),
        (("--seq", "2048"), ("seq (2048) must be <= context_length (1024)",)),
        (("--devices", "-1"), ("argument --devices:", "positive integer, got -1")),
        (("--mfu", "1.5"), ("argument --mfu:", "mfu must be <= 1, got 1.5")),
        (("--recipe", "adam"), ("argument --recipe:", "'adam'", "bf16_mixed_adamw")),
        (("--dtype", "fp9"), ("argument --dtype:", "'fp9'")),
    ],
)
def test_bad_arguments_exit_2_with_one_line_naming_the_argument(change, fragments):
    args = list(XL_ON_8_H100)
    flag, value = change
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    done = _run("napkin", *args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    error_lines = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(error_lines) == 1, done.stderr
    for fragment in fragments:
        assert fragment in error_lines[0], (fragment, error_lines[0])


def test_a_command_is_required_and_help_lists_napkin():
    done = _run()
    assert done.returncode == 2 and "required" in done.stderr
    helped = _run("--help")
    assert helped.returncode == 0 and "napkin" in helped.stdout


# --- plan -----------------------------------------------------------------------------------------


SMALL = TransformerConfig.preset("small")  # 12 heads, d_ff 3,072
KW = {"n_devices": 16, "batch": 64, "seq": 1024}

# the `plan` command and its arguments, for `_run`
ARGS = ["plan", "--preset", "small", "--cluster", "DGX-H100", "--devices", "16", "--batch", "64",
        "--seq", "1024"]


@pytest.fixture(scope="module")
def plans():
    return planner.plan(SMALL, "dgx-h100", **KW, model="calibrated")


def test_the_command_prints_the_planners_table(plans):
    done = _run(*ARGS, "--top", "5")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("plan: small (") and "16 x H100 SXM" in lines[0]
    assert f"{len(plans)} valid meshes" in lines[1]
    assert lines[2:8] == tables.plan_table(plans, top=5)
    # the best three meshes' step time, broken down: compute, recomputation, bubble, axes
    assert lines[8] == "" and len(lines[9:]) == 3
    for i, (line, p) in enumerate(zip(lines[9:], plans, strict=False), 1):
        assert line.startswith(f"#{i} {tables.mesh_text(p.dims)} (micro-batch {p.micro_batch} "
                               f"x {p.microbatches}, v {p.virtual_stages}, recompute "
                               f"{p.recompute}")
        assert f"step {p.step_s * 1e3:.4g} ms = compute " in line
        assert " + recompute " in line and " + bubble " in line
        for axis, seconds in p.exposed_s.items():
            assert (f" + {axis} {seconds * 1e3:.4g}" in line) is (seconds > 0)


@pytest.mark.parametrize(("extra", "fragment"), [
    (["--tp", "3"], "--tp 3: tp (3) does not divide the devices (16)"),
    (["--tp", "8", "--pp", "4"], "= 32 != world_size (16)"),
    (["--cluster", "dgx-v100"], "cluster='dgx-v100' is not one of"),
    (["--efficiency", "0"], "efficiency must be > 0"),
])
def test_the_command_rejects_impossible_meshes_in_one_line(extra, fragment):
    done = _run(*ARGS, *extra)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and fragment in errors[0], done.stderr


def test_a_sequence_longer_than_the_preset_raises_its_context_and_says_so():
    args = [a if a != "1024" else "4096" for a in ARGS]
    done = _run(*args, "--top", "2")
    assert done.returncode == 0, done.stderr
    assert "(context length raised to 4096: no parameter depends on it)" in done.stdout
    cfg = TransformerConfig.preset("small", context_length=4096)
    expected = planner.plan(cfg, "dgx-h100", n_devices=16, batch=64, seq=4096,
                            model="calibrated")
    assert done.stdout.splitlines()[2:5] == tables.plan_table(expected, top=2)


def test_the_command_draws_the_plans_when_asked(tmp_path):
    path = tmp_path / "plans.png"
    done = _run(*ARGS, "--top", "2", "--plot", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"figure: {path}"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for bad, fragment in ((tmp_path / "plans.jpg", "plot must end in .png, .svg, .pdf"),
                          (tmp_path / "nope" / "plans.png", "does not exist")):
        done = _run(*ARGS, "--plot", str(bad))
        assert done.returncode == 2 and fragment in done.stderr and not bad.exists()


# --- any model: Hugging Face configs, named configs, cluster files, JSON out ----------------------

LLAMA_STYLE = {"model_type": "llama", "hidden_size": 768, "intermediate_size": 1536,
               "num_hidden_layers": 8, "num_attention_heads": 12, "num_key_value_heads": 4,
               "vocab_size": 32_000, "max_position_embeddings": 2048, "hidden_act": "silu",
               "tie_word_embeddings": False, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}
GPT2_STYLE = {"model_type": "gpt2", "n_embd": 512, "n_layer": 6, "n_head": 8, "n_inner": None,
              "n_positions": 1024, "vocab_size": 50_257, "activation_function": "gelu_new",
              "layer_norm_epsilon": 1e-5, "attn_pdrop": 0.1, "resid_pdrop": 0.1}
MIXTRAL_STYLE = {**LLAMA_STYLE, "model_type": "mixtral", "num_local_experts": 8,
                 "num_experts_per_tok": 2}
JSON_KEYS = {"mesh", "step_s", "tokens_per_s", "model_tflops_per_device",
             "hardware_tflops_per_device", "mfu", "hfu", "memory_bytes_per_device", "fits"}


def _config(tmp_path, data: dict, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def _plan_json(*args: str) -> list[dict]:
    done = _run("plan", *args, "--json")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.parametrize("data", [LLAMA_STYLE, GPT2_STYLE], ids=["llama", "gpt2"])
def test_a_hugging_face_config_plans_with_json_out(tmp_path, data):
    path = _config(tmp_path, data)
    rows = _plan_json("--config", path, "--cluster", "dgx-h100", "--devices", "16",
                      "--batch", "32", "--seq", "1024")
    assert rows and all(JSON_KEYS <= set(row) for row in rows)
    assert all(set(row["mesh"]) >= {"dp_replicate", "dp_shard", "tp", "pp", "cp"} for row in rows)
    assert rows[0]["fits"] is True  # a small model on 16 H100s
    fitting = [row["step_s"] for row in rows if row["fits"]]
    assert fitting == sorted(fitting)  # best first
    cfg = from_hf_config(path)
    want = planner.plan(cfg, "dgx-h100", n_devices=16, batch=32, seq=1024, model="calibrated")
    assert rows == [json.loads(json.dumps(p.as_json())) for p in want]


def test_held_degrees_and_knobs_reach_the_planner(tmp_path):
    path = _config(tmp_path, GPT2_STYLE)
    rows = _plan_json("--config", path, "--cluster", "dgx-h100", "--devices", "16",
                      "--batch", "32", "--seq", "1024", "--tp", "2", "--zero", "3", "--dp", "8",
                      "--recompute", "full", "--micro-batch", "1")
    assert rows and all(row["mesh"]["tp"] == 2 and row["mesh"]["dp_shard"] == 8
                        and row["mesh"]["dp_replicate"] == 1 for row in rows)
    cfg = from_hf_config(path)
    want = planner.plan(cfg, "dgx-h100", n_devices=16, batch=32, seq=1024, model="calibrated",
                        recompute="full", micro_batch=1,
                        fixed={"tp": 2, "dp_shard": 8, "dp_replicate": 1})
    assert rows == [json.loads(json.dumps(p.as_json())) for p in want]
    both = _plan_json("--config", path, "--cluster", "dgx-h100", "--devices", "16",
                      "--batch", "32", "--seq", "1024", "--dp", "8")  # the split searched
    assert both and all(row["mesh"]["dp_replicate"] * row["mesh"]["dp_shard"] == 8
                        for row in both)


def test_a_cluster_file_plans_as_the_named_cluster():
    named = _run(*ARGS, "--top", "3")
    from_file = _run(*[str(EXAMPLES / "dgx-h100.json") if a == "DGX-H100" else a for a in ARGS],
                     "--top", "3")
    assert named.returncode == from_file.returncode == 0, from_file.stderr
    assert from_file.stdout == named.stdout
    assert hardware.get_cluster("dgx-h100").name in named.stdout


def test_named_models_plan_and_napkin():
    from mlsys.models import catalog

    name = "llama3-8b"
    done = _run("napkin", "--model", name, "--gpu", "h100", "--batch", "1", "--seq", "2048",
                "--devices", "8")
    assert done.returncode == 0, done.stderr
    expected = napkin(catalog.named_config(name), "h100", batch=1, seq=2048, n_devices=8,
                      name=name)
    assert done.stdout.splitlines() == tables.napkin_lines(expected)


def test_napkin_reads_a_config_file(tmp_path):
    path = _config(tmp_path, LLAMA_STYLE)
    done = _run("napkin", "--config", path, "--gpu", "h100", "--batch", "2", "--seq", "1024")
    assert done.returncode == 0, done.stderr
    expected = napkin(from_hf_config(path), "h100", batch=2, seq=1024, name="config.json")
    assert done.stdout.splitlines() == tables.napkin_lines(expected)


PLAN = ["--cluster", "dgx-h100", "--devices", "16", "--batch", "32", "--seq", "1024"]


def _bad_cluster(tmp_path) -> str:
    data = json.loads((EXAMPLES / "dgx-h100.json").read_text())
    del data["nics_per_node"]
    return _config(tmp_path, data, "cluster.json")


@pytest.mark.parametrize(("model", "extra", "fragments"), [
    (["--model", "llama-9000"], [], ("argument --model:", "'llama-9000'")),
    (["--config", "{tmp}/nope.json"], [], ("argument --config:", "nope.json")),
    (["--config", "{llama_missing}"], [], ("argument --config:", "'num_hidden_layers'",
                                          "missing")),
    (["--config", "{llama_wrong}"], [], ("argument --config:", "'num_hidden_layers'",
                                        "must be int", "'eight'")),
    (["--config", "{llama}"], ["--tp", "6", "--devices", "12"],
     ("--tp 6:", "n_kv_heads (4) and tp (6) must divide one another")),
    (["--config", "{llama}"], ["--tp", "16"], ("--tp 16:", "n_heads (12) is not divisible by "
                                               "tp (16)")),
    (["--config", "{llama}"], ["--pp", "2", "--virtual-stages", "3"],
     ("--pp 2", "--virtual-stages 3", "n_layers (8) is not divisible by pp * virtual_stages")),
    (["--config", "{llama}"], ["--pp", "16"], ("--pp 16:", "pp (16) must be <= n_layers (8)")),
    (["--config", "{llama}"], ["--ep", "2"], ("--ep 2:", "needs a mixture of experts")),
    (["--config", "{mixtral}"], ["--ep", "3", "--devices", "12"],
     ("--ep 3:", "n_experts (8) is not divisible by ep (3)")),
    (["--config", "{llama}"], ["--pp", "3"], ("--pp 3:", "pp (3) does not divide the devices "
                                              "(16)")),
    (["--config", "{llama}"], ["--cluster", "{cluster}"],
     ("argument --cluster:", "cluster.json", "'nics_per_node' is missing")),
    (["--config", "{llama}", "--model", "llama3-8b"], [],
     ("argument --model: not allowed with argument --config",)),
    (["--config", "{llama}"], ["--zero", "3", "--dp-replicate", "2"],
     ("--zero 3 shards every data-parallel rank", "--dp-replicate (2) must be 1")),
    (["--config", "{llama}"], ["--zero", "1", "--dp", "8", "--dp-replicate", "4"],
     ("--dp (8) and --dp-replicate (4) disagree",)),
    (["--config", "{llama}"], ["--dp", "8", "--dp-replicate", "4", "--dp-shard", "4"],
     ("--dp (8) != --dp-replicate x --dp-shard = 4 x 4",)),
    (["--config", "{llama}"], ["--zero", "4"], ("argument --zero:", "zero must be 0, 1, 2 or 3")),
])
def test_bad_input_is_one_line_naming_the_flag_before_any_search(tmp_path, model, extra,
                                                                 fragments):
    files = {"tmp": str(tmp_path), "llama": _config(tmp_path, LLAMA_STYLE),
             "mixtral": _config(tmp_path, MIXTRAL_STYLE, "mixtral.json"),
             "llama_missing": _config(tmp_path, {k: v for k, v in LLAMA_STYLE.items()
                                                 if k != "num_hidden_layers"}, "missing.json"),
             "llama_wrong": _config(tmp_path, {**LLAMA_STYLE, "num_hidden_layers": "eight"},
                                    "wrong.json"),
             "cluster": _bad_cluster(tmp_path)}
    args = [*(a.format(**files) for a in model), *PLAN]
    for flag, value in zip(extra[::2], extra[1::2], strict=True):
        value = value.format(**files)
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    done = _run("plan", *args)
    assert done.returncode == 2, done.stdout
    assert done.stdout == "" and "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, done.stderr
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])
