import pytest
import torch

from mlsys.accounting.dtypes import BYTES_PER_ELEMENT, bytes_per_element, canonical_dtype


@pytest.mark.parametrize(
    "dtype",
    [torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2,
     torch.int64, torch.int32, torch.int8, torch.bool],
)
def test_bytes_match_torch(dtype):
    assert bytes_per_element(dtype) == torch.empty((), dtype=dtype).element_size()


def test_aliases_agree():
    assert canonical_dtype("bfloat16") == canonical_dtype(torch.bfloat16) == canonical_dtype("BF16") == "bf16"
    assert canonical_dtype("half") == "fp16"
    assert bytes_per_element("tf32") == 4  # tf32 is stored in 32 bits


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown dtype='fp12'"):
        bytes_per_element("fp12")


def test_table_is_consistent():
    assert all(isinstance(n, int) and n > 0 for n in BYTES_PER_ELEMENT.values())
