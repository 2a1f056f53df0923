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
