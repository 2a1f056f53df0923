"""The files under examples/ as a reader uses them: each Hugging Face config.json is read and
planned from the command line (`python -m mlsys plan --config PATH ... --json`), and each cluster
file loads and plans the same meshes as the cluster it describes."""

import json
import os
import pathlib
import subprocess
import sys
from dataclasses import replace

import pytest

import mlsys
from mlsys import hardware
from mlsys.accounting import planner
from mlsys.accounting.params import count_params
from mlsys.cluster_file import load_cluster
from mlsys.models import catalog
from mlsys.models.hf_config import from_hf_config

ROOT = pathlib.Path(__file__).resolve().parents[1]
HF = ROOT / "examples" / "hf_configs"
CLUSTERS = sorted((ROOT / "examples" / "clusters").glob("*.json"))
KEYS = {"mesh", "step_s", "tokens_per_s", "model_tflops_per_device",
        "hardware_tflops_per_device", "mfu", "hfu", "memory_bytes_per_device", "fits"}
"""What `--json` prints for every mesh (issue 22, part 5)."""


def _plan_json(*args: str) -> list[dict]:
    """`python -m mlsys plan ARGS --json` in a fresh interpreter on this tree's library: one JSON
    object per line."""
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(mlsys.__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-m", "mlsys", "plan", *args, "--json"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_the_llama3_70b_config_is_the_published_model():
    cfg = from_hf_config(HF / "llama3-70b" / "config.json")
    named = catalog.named_config("llama3-70b")
    assert count_params(cfg) == catalog.NAMED_MODELS["llama3-70b"].published_params
    # the same model; the release's config states Llama 3's context, the catalog Llama 3.1's
    assert replace(cfg, context_length=named.context_length) == named
    assert cfg.context_length == 8_192 and cfg.kv_heads == 8 and cfg.mlp == "swiglu"


def test_the_gpt2_config_is_gpt2_small():
    cfg = from_hf_config(HF / "gpt2")  # the folder holding config.json reads the same
    assert cfg == from_hf_config(HF / "gpt2" / "config.json")
    assert (cfg.mlp, cfg.norm, cfg.positions, cfg.tie_embeddings, cfg.bias) == (
        "gelu", "layernorm", "learned", True, True)
    assert round(count_params(cfg) / 1e6) == 124  # "124M parameters" (the model card)


@pytest.mark.parametrize("name, cluster, devices, batch, seq", [
    ("gpt2", "dgx-a100", 8, 64, 1_024),
    ("llama3-70b", "dgx-h100", 64, 512, 8_192),
])
def test_each_config_plans_from_the_command_line(name, cluster, devices, batch, seq):
    path = HF / name / "config.json"
    rows = _plan_json("--config", str(path), "--cluster", cluster, "--devices", str(devices),
                      "--batch", str(batch), "--seq", str(seq))
    assert rows and all(KEYS <= set(row) for row in rows)
    best = rows[0]
    mesh = best["mesh"]
    degrees = (mesh["dp_replicate"], mesh["dp_shard"], mesh["tp"], mesh["pp"], mesh["cp"])
    assert best["fits"] and mesh["dp_replicate"] * mesh["dp_shard"] * mesh["tp"] * mesh["pp"] \
        * mesh["cp"] == devices, degrees
    assert 0 < best["mfu"] <= best["hfu"] < 1
    plans = planner.plan(from_hf_config(path), cluster, n_devices=devices, batch=batch, seq=seq,
                         model="calibrated")
    assert best == json.loads(json.dumps(plans[0].as_json()))  # the library's first mesh


@pytest.mark.parametrize("path", CLUSTERS, ids=[p.stem for p in CLUSTERS])
def test_each_cluster_file_plans_as_the_cluster_it_describes(path):
    cluster = load_cluster(path)
    assert cluster.per_node >= 1 and cluster.accelerator.hbm_bytes > 0
    args = ["--config", str(HF / "gpt2"), "--devices", "16", "--batch", "64", "--seq", "1024",
            "--top", "3"]
    from_file = _plan_json(*args, "--cluster", str(path))
    assert from_file and from_file[0]["fits"]
    if path.stem in hardware.CLUSTERS:  # a copy of a built-in cluster plans exactly as it does
        assert from_file == _plan_json(*args, "--cluster", path.stem)
