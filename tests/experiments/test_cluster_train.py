"""The cluster_train experiment (chapter 10): the entry point's flags per world size, the planner's
prediction, and the table and verdicts read from "run" and "skipped" rows built here. (The
torchrun jobs themselves run in the smoke records of tests/experiments/test_preflight.py.)"""

import warnings

import pytest

from mlsys import hardware
from mlsys.experiments import cluster_train

S = cluster_train.SIZES["smoke"]


def _run(world, tokens_per_s, mfu, predicted_mfu=None):
    return {"kind": "run", "world_size": world, "first_loss": 6.0, "last_loss": 5.5,
            "step_s": 0.25, "tokens_per_s": tokens_per_s, "mfu": mfu, "peak_memory_bytes": 2**30,
            "predicted_step_s": 0.2 if predicted_mfu else None, "predicted_mfu": predicted_mfu,
            "prediction": "planner at 100% of the spec" if predicted_mfu else "no prediction"}


def test_each_job_gets_the_entry_points_flags_and_its_share_of_the_batch(tmp_path):
    log = tmp_path / "log.jsonl"
    one = cluster_train.argv(S, 1, log)
    assert one[one.index("--micro-batch") + 1] == str(S.micro_batch)
    assert one[one.index("--global-batch") + 1] == str(S.global_batch)
    assert one[one.index("--log-file") + 1] == str(log) and one[-1] == "--quiet"
    many = cluster_train.argv(S, 4, log)  # 8 sequences over 4 ranks: 2 each, below micro_batch 4
    assert many[many.index("--micro-batch") + 1] == str(S.global_batch // 4) == "2"


def test_the_prediction_is_the_spec_the_measured_ceiling_or_none():
    if hardware.detect() is None:  # no spec for this device
        none = cluster_train.prediction(S, 2)
        assert none["predicted_step_s"] is none["predicted_mfu"] is None
        assert "no prediction" in none["prediction"]
        measured = cluster_train.prediction(S, 2, flop_per_s=1e10)
        assert "this CPU's measured matmul ceiling" in measured["prediction"]
    else:
        measured = cluster_train.prediction(S, 2, flop_per_s=1e10)
        assert "spec (an upper bound)" in measured["prediction"]
    assert measured["predicted_step_s"] > 0 and 0 < measured["predicted_mfu"] <= 1


def test_the_table_and_verdicts_read_the_rows():
    steps = [{"kind": "step", "world_size": w, "step": i} for w in (1, 2) for i in range(3)]
    skipped = {"kind": "skipped", "world_size": 8, "why": "8 ranks need 8 GPUs; this machine has 2"}
    rows = [*steps, _run(1, 1000.0, 0.30, predicted_mfu=0.5), _run(2, 1900.0, 0.28), skipped]
    assert [r["world_size"] for r in cluster_train.runs(rows)] == [1, 2]
    assert [r["step"] for r in cluster_train.steps_of(rows, 2)] == [0, 1, 2]
    table = cluster_train.table(rows)
    assert [r[0] for r in table.rows] == ["1", "2", "8"]
    assert table.rows[1][5] == "none" and table.rows[2][1] == skipped["why"]
    assert "1.90x, linear would be 2x): it scaled almost linearly" in \
        cluster_train.scaling_verdict(rows)
    slower = [_run(1, 1000.0, 0.3), _run(4, 900.0, 0.1)]
    assert cluster_train.scaling_verdict(slower).endswith("it slowed down.")
    assert cluster_train.scaling_verdict(rows[-3:-2]) == "One world size ran: nothing to compare."
    assert "0.60x, below the planner's bound" in cluster_train.mfu_verdict(rows[-3])
    assert cluster_train.mfu_verdict(rows[-2]) == "Measured MFU 28.0%; no prediction."


def test_train_expecting_hands_back_the_expected_warning_and_shows_the_others(monkeypatch):
    def loop(rank, argv):
        warnings.warn(f"/tmp/x was saved by 2 ranks: {cluster_train.RNG_NOT_RESTORED}",
                      UserWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
        return [{"step": 1}]

    monkeypatch.setattr(cluster_train.loop, "train_in_launch", loop)
    with pytest.warns(UserWarning, match="something else") as shown:
        rows, said = cluster_train.train_expecting(None, [], cluster_train.RNG_NOT_RESTORED)
    assert rows == [{"step": 1}] and len(said) == 1 and "saved by 2 ranks" in said[0]
    assert [str(w.message) for w in shown] == ["something else"]

