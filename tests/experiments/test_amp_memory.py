"""The amp_memory experiment (chapter 07, smoke sizes): the states and the cast cache counted, and
the verdicts."""

import copy

import pytest
import torch

from mlsys import experiments
from mlsys.accounting import activations
from mlsys.counters import SavedTensors
from mlsys.experiments import amp_memory, kit
from mlsys.experiments.kit import setup
from mlsys.models.config import TransformerConfig
from mlsys.training import next_token_loss


@pytest.fixture(scope="module")
def memory_rows():
    return amp_memory.run(amp_memory.SIZES["smoke"], device="cpu")


def test_amp_memory_counts_and_verdicts(memory_rows):
    rs = amp_memory.runs(memory_rows)
    n = rs[("debug", "fp32")]["n_params"]
    assert rs[("debug", "fp32")]["states_bytes"] == 16 * n
    assert rs[("debug", "pure bf16")]["states_bytes"] == 8 * n
    amp = rs[("debug", "bf16 autocast")]
    cfg = TransformerConfig.preset("debug")
    linear = cfg.n_layers * (4 * cfg.d_model**2 + 3 * cfg.d_model * cfg.d_ff) + \
        cfg.d_model * cfg.vocab_size
    assert amp["cast_cache_bytes"] == 2 * linear
    rise = (amp_memory.peak(memory_rows, "debug", "bf16 autocast", "inference forward")
            - amp_memory.peak(memory_rows, "debug", "fp32", "inference forward"))
    assert 0.8 * amp["cast_cache_bytes"] < rise < 1.2 * amp["cast_cache_bytes"]
    assert amp["saved_bytes"] > 0 and len(amp_memory.table(memory_rows).rows) == 3
    text = amp_memory.verdicts(memory_rows)
    assert set(text) == {"inference", "training", "saved", "split"}
    assert "cached bf16 weight copies" in text["inference"]
    assert "the states stay" in text["training"]
    assert "to the byte" in text["saved"]
    record = {"results": memory_rows}
    assert amp_memory.show(record).startswith("Inference: debug peaked ")


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_autocast_saved_bytes_is_what_autograd_saves_under_cpu_autocast(attention):
    cfg = TransformerConfig.preset("debug", attention=attention)
    model = kit.fresh_model(cfg, "cpu")
    tokens = torch.randint(cfg.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    counter = SavedTensors(model)
    with counter, torch.autocast("cpu", dtype=torch.bfloat16):
        loss = next_token_loss(model, tokens)
    assert counter.activation_bytes == amp_memory.autocast_saved_bytes(
        cfg, 2, 16, device_type="cpu")
    del loss
    bf16 = activations.saved_bytes(cfg, 2, 16, dtype="bf16").total_bytes
    assert amp_memory.autocast_saved_bytes(cfg, 2, 16, device_type="cpu") > bf16
    extra = amp_memory.autocast_saved_bytes(cfg, 2, 16) - amp_memory.autocast_saved_bytes(
        cfg, 2, 16, device_type="cpu")  # CUDA's fp32 softmax: 4 more bytes per probability
    assert extra == (cfg.n_layers * 4 * 2 * cfg.n_heads * 16**2 if attention == "naive" else 0)
    with pytest.raises(ValueError, match="device_type='tpu' is not one of"):
        amp_memory.autocast_saved_bytes(cfg, 2, 16, device_type="tpu")


def test_every_recorded_count_equals_its_closed_form():
    for record in experiments.recorded("amp_memory"):
        rows = record["results"]
        assert "to the byte" in amp_memory.saved_verdict(rows)
        s = setup(rows)
        for (preset, run), r in amp_memory.runs(rows).items():
            assert r["saved_bytes"] == amp_memory.predicted_saved_bytes(
                preset, run, s["batch"], s["seq"], "cuda"), (preset, run)


def test_the_napkin_separates_autocast_from_bf16_weights():
    cfg = TransformerConfig.preset("xl")
    n = amp_memory.napkin(cfg, 4, 1024)
    assert list(n) == list(amp_memory.NAPKIN)
    assert n["bf16 autocast"]["states_bytes"] == n["fp32 AdamW"]["states_bytes"] == \
        n["bf16 mixed AdamW"]["states_bytes"] == 2 * n["pure bf16 AdamW"]["states_bytes"]
    assert n["bf16 mixed AdamW"]["saved_bytes"] == activations.saved_bytes(
        cfg, 4, 1024, dtype="bf16").total_bytes
    # on a GPU with naive attention autocast saves more than fp32 itself; on a CPU, less
    assert n["bf16 autocast"]["saved_bytes"] > n["fp32 AdamW"]["saved_bytes"]
    cpu = amp_memory.napkin(cfg, 4, 1024, device_type="cpu")["bf16 autocast"]
    assert n["bf16 mixed AdamW"]["saved_bytes"] < cpu["saved_bytes"] < n["fp32 AdamW"][
        "saved_bytes"]
    assert all(r["total_bytes"] == r["states_bytes"] + r["saved_bytes"] for r in n.values())
    assert amp_memory.napkin_table(n).rows[0][4] == "1.00x"


def _with_peaks(rows, inference):
    """`rows` with each (preset, run)'s inference-forward peak replaced."""
    rows = copy.deepcopy(rows)
    for r in rows:
        if r["kind"] == "phase" and r["phase"] == "inference forward":
            r["peak_bytes"] = inference.get((r["preset"], r["run"]), r["peak_bytes"])
    return rows


def test_the_inference_verdict_reads_every_preset(memory_rows):
    rows = copy.deepcopy(memory_rows)
    laptop = [dict(r, preset="laptop") for r in rows if r["kind"] in ("run", "phase")]
    rows += laptop
    copies = amp_memory.runs(rows)[("debug", "bf16 autocast")]["cast_cache_bytes"]
    # debug: no rise (activations outweigh the copies); laptop: a rise the copies explain
    rows = _with_peaks(rows, {("debug", "fp32"): 10 * copies, ("debug", "bf16 autocast"): copies,
                              ("laptop", "fp32"): copies, ("laptop", "bf16 autocast"): 2 * copies})
    text = amp_memory.inference_verdict(rows)
    assert "debug" in text and "no rise, the halved activations outweigh the copies" in text
    assert "1.00x the rise" in text and text.endswith(
        "more memory than fp32's for laptop, where the weight copies outweigh the activations "
        "it halves")
    rows = _with_peaks(rows, {("laptop", "bf16 autocast"): copies // 2})
    assert amp_memory.inference_verdict(rows).endswith("no preset's forward rose under autocast "
                                                      "here: the activations outweigh the weight "
                                                      "copies")


def test_the_saved_verdict_names_a_count_that_misses_its_closed_form(memory_rows):
    assert "to the byte" in amp_memory.saved_verdict(memory_rows)
    rows = copy.deepcopy(memory_rows)
    amp = next(r for r in rows if r.get("run") == "bf16 autocast" and r["kind"] == "run")
    amp["saved_bytes"] *= 5  # a systematic 5x miss
    text = amp_memory.saved_verdict(rows)
    assert "to the byte" not in text and "debug bf16 autocast 5.000x" in text


def test_the_napkin_facts_and_the_recipe_table():
    cfg = TransformerConfig.preset("xl")
    facts = amp_memory.napkin_facts(cfg, 4, 1024)
    n = amp_memory.napkin(cfg, 4, 1024)
    assert facts["amp_act"] == n["bf16 autocast"]["saved_bytes"] / n["fp32 AdamW"]["saved_bytes"]
    assert facts["mixed_act"] < facts["amp_sdpa"] < 1 < facts["amp_act"]
    # each norm of each block keeps x, x/rms (N, D) and 1/rms (N, 1) in fp32
    tokens = 4 * 1024
    assert facts["norms_gb"] * 1e9 == pytest.approx(
        cfg.n_layers * 2 * (2 * tokens * cfg.d_model + tokens) * 4)
    rows = amp_memory.recipe_table(cfg).rows
    assert [r[0] for r in rows][:2] == ["`fp32_adamw`", "`bf16_mixed_adamw`"]
