"""Chapter 06's live checks (`mlsys.experiments.attention_checks`): FlashAttention-2 in PyTorch and
in Triton against the float64 reference, causal and not."""

import pytest
import torch
from kernel_cases import needs_triton

from mlsys.experiments import attention_checks

SHAPES = ((1, 1, 16), (29, 61, 16), (61, 29, 16))  # n_q != n_k both ways


def test_flash_torch_rows_per_dtype_and_mask():
    table = attention_checks.flash_torch_table(SHAPES, torch.Generator().manual_seed(0))
    assert table.header == attention_checks.HEADER
    assert [row[:3] for row in table.rows] == [["flash_torch", dt, causal]
                                               for dt in ("float64", "float32")
                                               for causal in ("False", "True")]
    errors = [float(row[3]) for row in table.rows]
    assert max(errors[:2]) < 1e-10 and max(errors[2:]) < 1e-4


def test_an_error_above_its_bound_stops_the_page():
    def wrong(q, k, v, causal):
        return attention_checks.FlashAttentionTorch.apply(q, k, v, causal) + 1e-3

    with pytest.raises(AssertionError, match="wrong torch.float32 causal=False"):
        attention_checks._rows("wrong", wrong, SHAPES, torch.float32, 1e-4,
                               torch.Generator().manual_seed(0))


@needs_triton
def test_flash_triton_rows_show_the_tests_tolerance():
    table = attention_checks.flash_triton_table(SHAPES[:2], (torch.float32,),
                                                torch.Generator().manual_seed(0), "cpu")
    assert table.header == [*attention_checks.HEADER, "tests' tolerance"]
    assert [row[:3] for row in table.rows] == [["flash_triton", "float32", "False"],
                                               ["flash_triton", "float32", "True"]]
    assert all(row[4].endswith("·|ref|") for row in table.rows)
