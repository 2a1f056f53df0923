"""mlsys.distributed.fsdp_units: wrap policies (classes, a set, a predicate, the default `.blocks`)
cut a module into its outermost matches and the root keeps the rest, tied modules included; on 2
gloo ranks that cut it differently, the hand-written FSDP and PyTorch's FSDP2 both give a clear
error and leave the module as it was. The models are fsdp_cases.py's.

Rank functions live in fsdp_cases.py (the ranks import it).
"""

import pytest
from fsdp_cases import MLP, UNITS, WRAPS, all_cases, build
from torch import nn

from mlsys.distributed import launch, pp
from mlsys.distributed.fsdp_units import wrap_units
from mlsys.models.transformer import Transformer, TransformerConfig


@pytest.fixture(scope="module")
def results():
    """Every rank's extras (no training case): among them, ranks that disagree on the units."""
    with launch.start(2, timeout_s=60, collective_timeout_s=30) as job:
        return job.run(all_cases, args=((),), timeout_s=120)


@pytest.mark.parametrize(("model_name", "wrap"), list(UNITS))
def test_wrap_units_are_the_outermost_matches_and_the_root_keeps_the_rest(model_name, wrap):
    model = build(model_name)
    units, root = UNITS[(model_name, wrap)]
    assert [name for name, _ in wrap_units(model, WRAPS[wrap])] == units
    in_units = {f"{u}.{n}" for u in units for n, _ in model.get_submodule(u).named_parameters()}
    assert [n for n, _ in model.named_parameters() if n not in in_units] == root


def test_wrap_units_nested_matches_tied_modules_and_the_default():
    tied = build("tied")
    assert [n for n, _ in wrap_units(tied, (MLP, nn.Linear))] == ["layers.0", "layers.1"]
    assert wrap_units(tied, (nn.Embedding, nn.Linear)) == [  # both halves of the tie drop
        (f"layers.{i}.fc{j}", tied.layers[i].get_submodule(f"fc{j}"))
        for i in range(2) for j in (1, 2)]
    assert wrap_units(tied, ()) == []  # explicitly: the root is the only unit
    cfg = TransformerConfig(vocab_size=32, context_length=8, d_model=8, n_layers=4, n_heads=2,
                            d_ff=8)
    model = Transformer(cfg)
    assert [n for n, _ in wrap_units(model)] == [f"blocks.{i}" for i in range(4)]
    stage = pp.PipelineStage(model, 1, 2, None)
    assert [n for n, _ in wrap_units(stage)] == ["blocks.0", "blocks.1"]


@pytest.mark.timeout(200)
def test_ranks_that_disagree_on_units_get_a_clear_error_and_keep_their_module(results):
    before = sorted(n for n, _ in build("stack").named_parameters())
    for r in results:
        for impl in ("ours", "torch"):
            assert "cut the module into different units" in r["extras"][impl]
            assert r["extras"][f"{impl} intact"] == before
