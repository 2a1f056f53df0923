import pytest
import torch

from mlsys import dtypes
from mlsys.dtypes import DTYPES, bytes_per_element, canonical, torch_dtype


@pytest.mark.parametrize("name", [n for n, d in DTYPES.items() if d.torch_name is not None])
def test_every_registered_dtype_matches_torch(name):
    t = torch.empty((), dtype=torch_dtype(name))
    assert bytes_per_element(name) == t.element_size()
    assert canonical(t.dtype) == name  # and back: torch's dtype gives the short name


def test_aliases_agree():
    assert canonical("bfloat16") == canonical(torch.bfloat16) == canonical("BF16") == "bf16"
    assert canonical("half") == "fp16"
    assert bytes_per_element("tf32") == 4  # tf32 is stored in 32 bits


def test_unknown_and_wrong_dtypes_are_clear_errors():
    with pytest.raises(ValueError, match="unknown dtype='fp12'"):
        bytes_per_element("fp12")
    with pytest.raises(TypeError, match="dtype must be a name"):
        canonical(4)
    with pytest.raises(TypeError, match="dtype must be a name"):
        canonical(None)
    with pytest.raises(ValueError, match="no torch dtype"):
        torch_dtype("tf32")


def test_no_other_module_keeps_a_name_to_dtype_map():
    """One registry: no hand-made {"fp32": torch.float32, ...} map elsewhere in lib/ or chapters."""
    from pathlib import Path

    root = Path(dtypes.__file__).resolve().parents[2]
    offenders = []
    for path in [*root.glob("lib/mlsys/**/*.py"), *root.glob("notebooks/*.py")]:
        text = path.read_text()
        if path.name != "dtypes.py" and '"bf16": torch.bfloat16' in text:
            offenders.append(path.name)
    assert not offenders, offenders
