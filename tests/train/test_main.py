"""`python -m mlsys.train` under torchrun on the CPU: the smoke run's loss falls; every mesh trains
like one process; a rank killed with SIGKILL is restarted by torchrun and the run resumes from
its checkpoint bit for bit; two torchrun "nodes" on one machine train a 2-D mesh; the exported
weights load into the book's model; a grouped-query GeLU model and a GPT-shaped one train end to
end (in this process, one rank). (Its flags: test_options.py.)

Each run is a real torchrun job (5-10 s on 2 cores, train_runs.py); all of them write under
tmp_path.
"""

import socket
import subprocess
import sys
import time

import pytest
import torch
from train_runs import BASE, ENV, RUN_TIMEOUT_S, rows, trained

from mlsys.models.transformer import Transformer
from mlsys.train import __main__ as entry
from mlsys.train import checkpoint, options


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("single"), "one")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The smoke run: no --mesh (FSDP over both ranks), timed; also the killed run's reference."""
    start = time.perf_counter()
    out = trained(tmp_path_factory.mktemp("two"), "two", "--ckpt-every", "3", nproc=2)
    print(f"torchrun --standalone --nproc-per-node=2, {len(out[0])} steps: "
          f"{time.perf_counter() - start:.1f} s")
    return out


def same_run(got: list, weights: dict, ref: tuple) -> None:
    """Loss and global gradient norm step by step, then the final weights, against `ref`."""
    for a, b in zip(got, ref[0], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4), (a["step"], a, b)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3), (a["step"], a, b)
    assert weights.keys() == ref[1].keys()
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, ref[1][name], rtol=1e-4, atol=1e-5,
                                   msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
def test_smoke_run_on_two_ranks_loss_falls_and_equals_one_process(two_ranks, single):
    got = two_ranks[0]
    assert [r["step"] for r in got] == list(range(1, 11))
    first, last = got[0]["loss"], sum(r["loss"] for r in got[-3:]) / 3
    assert last < first - 0.5, (first, last)
    assert all(r["tokens_per_s"] > 0 and 0 < r["mfu"] and r["peak_memory_bytes"] > 0
               for r in got)
    same_run(two_ranks[0], two_ranks[1], single)


@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
@pytest.mark.parametrize("mesh", ["tp=2", "pp=2", "dp_replicate=2", "tp=2 --sequence-parallel"])
def test_every_mesh_trains_like_one_process(tmp_path, single, mesh):
    args = ["--mesh", *mesh.split(" ")]
    if mesh.startswith("pp"):
        args += ["--micro-batch", "2"]
    got, weights, _ = trained(tmp_path, "mesh", *args, nproc=2)
    same_run(got, weights, single)


@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
def test_bf16_mixed_precision_keeps_fp32_masters_and_tracks_fp32(tmp_path, single):
    got, weights, _ = trained(tmp_path, "bf16", "--precision", "bf16_mixed_adamw", nproc=2)
    assert all(t.dtype == torch.float32 for t in weights.values())  # the shards are the masters
    for a, b in zip(got, single[0], strict=True):  # bf16 matmuls: within 2% of fp32 training
        assert a["loss"] == pytest.approx(b["loss"], rel=0.02), (a["step"], a, b)
    assert any(a["loss"] != b["loss"] for a, b in zip(got, single[0], strict=True))


@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
def test_killed_rank_is_restarted_and_resumes_bit_for_bit(tmp_path, two_ranks):
    log, killed, _ = trained(tmp_path, "killed", "--ckpt-every", "3", "--kill-rank-at", "1:5",
                          nproc=2, extra=("--standalone", "--max-restarts=1"))
    steps = [r["step"] for r in log]
    assert steps == [1, 2, 3, 4, 5, 4, 5, 6, 7, 8, 9, 10], steps  # resumed from step 3
    for name, tensor in two_ranks[1].items():
        assert torch.equal(killed[name], tensor), name


@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
def test_two_nodes_on_one_machine_train_a_2d_mesh(tmp_path, single):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ckpt = tmp_path / "two"
    node = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=two-nodes",
            "-m", "mlsys.train", *BASE, "--mesh", "dp_shard=2,tp=2", "--ckpt", str(ckpt)]
    procs = [subprocess.Popen(node, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=RUN_TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), [o[1][-3000:] for o in outs]
    same_run(rows(ckpt / "log.jsonl"), checkpoint.latest_weights(ckpt), single)


def test_export_loads_into_the_book_model(tmp_path, single):
    model = Transformer(options.resolve(options.parse(BASE), 1).config)
    model.load_state_dict(single[1])


def run_here(monkeypatch, *args: str) -> list[dict]:
    """`python -m mlsys.train` in this process, as one torchrun rank (about 2 s on a CPU): the
    rank's variables set for the call only, so nothing leaks into other tests."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                        "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
                        "MLSYS_PROFILE": "smoke"}.items():
        monkeypatch.setenv(name, value)
    for name in ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(name, raising=False)
    rows = entry.main([*BASE, *args])
    assert not torch.distributed.is_initialized()
    return rows


ARCHITECTURES = {
    "gqa_gelu": ["--n-kv-heads", "2", "--mlp", "gelu"],
    "gpt": ["--mlp", "gelu", "--norm", "layernorm", "--positions", "learned", "--tie-embeddings",
            "--bias"],
}


@pytest.mark.parametrize("shape", list(ARCHITECTURES))
def test_a_gqa_gelu_and_a_gpt_shaped_model_train_end_to_end(tmp_path, monkeypatch, shape):
    """The smoke run with grouped-query attention and a GeLU MLP (Llama's attention, GPT's MLP),
    then GPT-2's whole shape: the loss falls, the export loads into the book's model of that
    shape, the tied head stays the embedding, and the checkpoint refuses another shape."""
    ckpt = tmp_path / shape
    flags = [*ARCHITECTURES[shape], "--ckpt", str(ckpt)]
    got = run_here(monkeypatch, *flags)
    assert [r["step"] for r in got] == list(range(1, 11))
    first, last = got[0]["loss"], sum(r["loss"] for r in got[-3:]) / 3
    assert last < first - 0.5, (first, last)
    cfg = options.resolve(options.parse([*BASE, *flags]), 1).config
    weights = checkpoint.latest_weights(ckpt)
    model = Transformer(cfg)
    model.load_state_dict(weights)
    assert weights["blocks.0.attn.k_proj.weight"].shape == (cfg.kv_heads * cfg.d_head, 64)
    if cfg.tie_embeddings:
        assert torch.equal(weights["lm_head.weight"], weights["token_embedding.weight"])
        assert cfg.positions == "learned" and "token_embedding.position" in weights
    other = options.resolve(options.parse([*BASE, "--ckpt", str(ckpt)]), 1)  # the preset's shape
    with pytest.raises(ValueError, match="another model|differ|shape"):
        options.check_paths(other)
