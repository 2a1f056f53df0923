"""The training_memory experiment: the CPU allocator's bytes, phase by phase, against the count."""

import json

import matplotlib
import pytest

from mlsys.accounting import memory
from mlsys.accounting.params import count_params
from mlsys.experiments import kit, training_memory
from mlsys.models.config import TransformerConfig

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def rows():
    return training_memory.run(training_memory.SIZES["smoke"], device="cpu")


def _live(rows, run, step, phase):
    return training_memory.phase(rows, run, step, phase)["live_bytes"]


def test_rows_are_json_and_name_the_method(rows):
    assert json.loads(json.dumps(rows)) == rows
    assert "profiler" in kit.setup(rows)["method"]
    assert list(training_memory.runs(rows)) == list(training_memory.RUNS)
    n_phases = 1 + len(training_memory.PHASES) * training_memory.SIZES["smoke"].steps
    assert len(training_memory.phases(rows, "fp32 AdamW")) == n_phases


@pytest.mark.parametrize("run", list(training_memory.RUNS))
def test_each_phase_adds_what_the_count_predicts(rows, run):
    """On a CPU the allocator sees requested bytes, so the laws hold to the byte."""
    r = training_memory.runs(rows)[run]
    states = memory.model_state_breakdown(r["n_params"], r["recipe"])
    model = _live(rows, run, 0, "model")
    assert model == r["param_bytes"] + r["buffer_bytes"] + r["token_bytes"]
    assert r["param_bytes"] == states["weights"]
    assert _live(rows, run, 1, "backward") - model == states["grads"]  # activations all freed
    step = _live(rows, run, 1, "optimizer step")
    assert step - _live(rows, run, 1, "backward") == states["optimizer"] + r["step_counter_bytes"]
    assert r["step_counter_bytes"] == 4 * r["param_tensors"]  # one fp32 scalar per parameter tensor
    assert _live(rows, run, 1, "zero_grad") == step - states["grads"]
    assert _live(rows, run, 2, "optimizer step") == step  # the steady state holds no more
    for p in training_memory.phases(rows, run):
        assert p["peak_bytes"] >= p["live_bytes"]


def test_readings_explain_every_byte_after_the_step(rows):
    readings = {r.run: r for r in training_memory.readings(rows)}
    for r in readings.values():
        assert r.unexplained == 0
        # the loss and a few scalars
        assert 0 <= r.forward_growth - r.saved <= training_memory.SCALARS_BYTES
        assert r.peak > r.after_step
    fp32, bf16 = readings["fp32 AdamW"], readings["pure bf16 AdamW"]
    amp = readings["fp32 AdamW + bf16 autocast"]
    assert 2 * bf16.predicted_states == fp32.predicted_states == amp.predicted_states
    assert amp.after_step == fp32.after_step and amp.saved != fp32.saved


def test_the_forward_saves_what_the_accounting_predicts(rows):
    from mlsys.accounting.activations import saved_bytes

    s = training_memory.SIZES["smoke"]
    cfg = TransformerConfig.preset(s.preset)
    total = training_memory.runs(rows)["fp32 AdamW"]["saved_bytes"][-1]
    token_bytes = s.batch * (s.seq + 1) * 8  # the batch: excluded by the experiment, yet saved
    assert total + token_bytes == saved_bytes(cfg, s.batch, s.seq, dtype="fp32").total_bytes


def test_tables_verdicts_and_plot(rows):
    import matplotlib.pyplot as plt

    table = training_memory.table(rows)
    assert table.header[1:] == list(training_memory.RUNS)  # one column per run: a narrow table
    assert table.rows[0][1:] == [f"`{recipe}`" for *_, recipe in training_memory.RUNS.values()]
    v = training_memory.verdicts(rows)
    assert v["states"].startswith("in every run the allocator holds exactly")
    assert v["forward"].startswith("in every run it grows the allocation by what autograd saves")
    assert "pure bf16 holds 0.50x" in v["compare"]
    assert v["exactness"] == "to the byte"  # the CPU allocator reports the bytes requested
    training_memory.check_laws(rows)
    broken = [dict(r, saved_bytes=[b + 10**6 for b in r["saved_bytes"]]) if r["kind"] == "run"
              else r for r in rows]  # the forward would save more than it grows by
    with pytest.raises(AssertionError, match="forward growth"):
        training_memory.check_laws(broken)
    page = training_memory.page_numbers(rows)
    sizes = training_memory.SIZES["smoke"]
    assert (page["preset"], page["batch"], page["seq"]) == (sizes.preset, sizes.batch, sizes.seq)
    assert page["params"] == count_params(TransformerConfig.preset(sizes.preset))
    assert page["exactness"] == v["exactness"] and page["method"]
    fig, ax = plt.subplots()
    training_memory.plot(rows, ax, title="t")
    assert len(ax.lines) == 3 * len(training_memory.RUNS)
    plt.close(fig)


def test_sizes_and_devices_are_checked():
    with pytest.raises(ValueError, match="context_length"):
        training_memory.Sizes("debug", 2, 4096)
    with pytest.raises(ValueError, match="steps must be >= 2"):
        training_memory.Sizes("debug", 2, 16, steps=1)
    with pytest.raises(ValueError, match="device"):
        training_memory.run(training_memory.SIZES["smoke"], device="mps")


def test_the_first_block_saves_the_closed_form(rows):
    # one block: (6 N D + 4 N F + B H T^2) b + 16 N D + 8 N + T^2 bytes (chapter 02's derivation;
    # the tensors `accounting.activations` lists), measured by the saved-tensor hooks
    s = training_memory.SIZES["smoke"]
    cfg = TransformerConfig.preset(s.preset)
    n, d, f, h, t = s.batch * s.seq, cfg.d_model, cfg.d_ff, cfg.n_heads, s.seq
    for run, b in (("fp32 AdamW", 4), ("pure bf16 AdamW", 2)):
        measured = training_memory.runs(rows)[run]["block_saved_bytes"]
        assert len(measured) == s.steps
        assert set(measured) == {(6 * n * d + 4 * n * f + s.batch * h * t * t) * b
                                 + 16 * n * d + 8 * n + t * t}


def test_recipe_needs_add_states_and_activations():
    cfg = TransformerConfig.preset("small")
    needs = training_memory.recipe_needs(cfg, 2, 64, 8)
    assert list(needs) == list(memory.RECIPES)
    fp32, pure = needs["fp32_adamw"], needs["bf16_pure_adamw"]
    assert fp32["states"] == memory.model_state_bytes(count_params(cfg), "fp32_adamw")
    assert fp32["activations"] > pure["activations"] > 0  # fp32 against bf16 activations
    assert fp32["sharded"] == fp32["states"] / 8 + fp32["activations"]
    table = training_memory.needs_table(needs, hbm_bytes=fp32["sharded"])
    fp32_row = table.rows[0]
    assert fp32_row[-2].endswith(" ✗") and not fp32_row[-1].endswith(" ✗")  # equal fits
    with pytest.raises(ValueError, match="n_devices must be a positive integer"):
        training_memory.recipe_needs(cfg, 2, 64, 0)


def test_the_recipe_sentences():
    words = training_memory.mixed_answers(8, 80e9)
    assert words.startswith("bf16_mixed_adamw (16 B/param) gives the same answer")
    assert "bf16_pure_adamw (8 B/param) gives 2.00x the answer (80.0 billion)" in words
    assert "bf16_mixed_adamw dashed on fp32_adamw" in training_memory.shared_lines()
