"""The step_memory experiment (chapter 05, smoke sizes): the saved bytes counted exactly, the peak's
parts, the seed's 2.7B arithmetic; and the timeline record its rows keep."""

import pytest

from mlsys.accounting import activations
from mlsys.experiments import step_memory
from mlsys.profiling import memory_timeline


@pytest.fixture(scope="module")
def memory_rows():
    return step_memory.run(step_memory.SIZES["smoke"], device="cpu")


def test_step_memory_counts_the_saved_bytes_exactly(memory_rows):
    s = step_memory.SIZES["smoke"]
    cfg = step_memory.TransformerConfig.preset(s.preset)
    for segment in (None, *s.segments):
        for r in step_memory.steps(memory_rows, segment=segment):
            exact = activations.saved_bytes(cfg, s.batch, r["seq"], checkpoint_segment=segment)
            assert r["saved_bytes"] == exact.total_bytes
    plain = step_memory.steps(memory_rows)
    assert [r["seq"] for r in plain] == list(s.seqs)
    assert all(r["param_bytes"] * 2 == r["optimizer_bytes"] - r["optimizer_bytes"] % 4
               or r["optimizer_bytes"] >= 2 * r["param_bytes"] for r in plain)
    assert "exactly" in step_memory.verdicts(memory_rows)["saved"]


def test_step_memory_peak_parts_sum_to_the_timeline_peak(memory_rows):
    r = next(r for r in step_memory.steps(memory_rows) if "timeline" in r)
    tl = memory_timeline.Timeline.from_record(r["timeline"])
    _, top = tl.peak()
    assert sum(r["at_peak"].values()) == top == step_memory.peak(r)[0]
    parts = step_memory.breakdown(memory_rows)
    # made in the forward and live at the peak (early in backward): saved tensors, the loss's
    # already freed, and the 0-d loss itself; the token batch is resident, not made in forward
    assert 0.9 * r["saved_bytes"] < parts["activations"] <= r["saved_bytes"] - r["token_bytes"] + 64
    table = step_memory.breakdown_table(memory_rows)
    assert table.rows[-1][0] == "total"
    assert len(step_memory.checkpoint_table(memory_rows).rows) == 1 + len(
        step_memory.SIZES["smoke"].segments)
    assert set(step_memory.verdicts(memory_rows)) == {"saved", "napkin", "holds", "checkpoint"}


def test_the_seed_2p7b_arithmetic_is_checked():
    rows = {r["seq"]: r for r in step_memory.seed_rows()}
    assert rows[512]["formula_gib"] == pytest.approx(20_352 / 1024)  # their own verification
    assert rows[256]["formula_gib"] > rows[256]["claimed_forward_gb"] + 0.8  # 7.94 vs 7.1
    assert rows[1024]["formula_gib"] < rows[1024]["claimed_forward_gb"] - 17  # 55.75 vs 73.7
    assert all(r["exact_gb"] != pytest.approx(r["formula_gb"], rel=0.02) for r in rows.values())
    # their measured peaks sit below 16 B/param + all activations: the two never peak together
    assert all(r["measured_training_gb"] < r["napkin_gb"] for r in rows.values()
               if r["measured_training_gb"])




def test_step_memory_keeps_the_step_by_part(memory_rows):
    got, want = step_memory.step_parts(memory_rows)
    r = next(r for r in step_memory.steps(memory_rows) if "parts" in r)
    _, at = got.peak()
    assert sum(at.values()) == r["param_bytes"] + r["optimizer_bytes"] + step_memory.peak(r)[0]
    assert {k: at[k] for k in ("activations", "gradients", "temporaries")} == r["at_peak"]
    assert want.phases == got.phases and want.kind == "predicted"
    n = step_memory.setup(memory_rows)["n_params"]
    assert max(want.total()) == 12 * n + max(4 * n, step_memory.predicted(
        memory_rows, r["seq"]).total_bytes)


def test_the_seed_values_are_read_from_its_rows():
    rows = step_memory.seed_rows()
    values = step_memory.seed_values(rows)
    at = {r["seq"]: r for r in rows}
    assert values["seed_512_claim"] == at[512]["claimed_forward_gb"] == 20.4
    assert values["seed_256_formula"] == at[256]["formula_gib"]
    assert values["seed_512_gb"] == pytest.approx(values["seed_512_gib"] * 2**30 / 1e9)
