"""The amp_memory experiment (chapter 07, smoke sizes): the states and the cast cache counted, and
the verdicts."""

import pytest

from mlsys.experiments import amp_memory
from mlsys.models.config import TransformerConfig


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
    assert set(text) == {"inference", "training", "split"}
    assert "cached bf16 copies of the matmul weights" in text["inference"]
    assert "the states stay" in text["training"]
