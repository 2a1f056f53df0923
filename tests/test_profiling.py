import torch

from mlsys.profiling import ByteCounter, count_bytes, count_model_flops


def test_counts_reads_and_writes_per_op():
    a, b = torch.ones(3, 5), torch.ones(1, 5, dtype=torch.float16)
    counter = count_bytes(lambda: torch.exp(a + b))
    assert [(op.op, op.read_bytes, op.write_bytes) for op in counter.ops] == [("add", 70, 60), ("exp", 60, 60)]
    assert (counter.read_bytes, counter.write_bytes, counter.total_bytes) == (130, 120, 250)


def test_views_move_nothing_and_copies_do():
    x = torch.randn(8, 16)
    with ByteCounter() as counter:
        x.t()
        x.view(16, 8)
        x[:, ::2]
    assert counter.ops == []
    with ByteCounter() as counter:
        x.t().contiguous()
    assert counter.total_bytes == 2 * x.numel() * 4


def test_scalars_are_arguments_not_traffic():
    x = torch.randn(10)
    counter = count_bytes(torch.mul, x, torch.tensor(2.0))
    assert counter.read_bytes == 40 and counter.write_bytes == 40


def test_count_model_flops_on_meta_matches_the_formula():
    from mlsys.accounting.flops import transformer_flops
    from mlsys.models.config import TransformerConfig

    cfg = TransformerConfig.preset("small")
    assert count_model_flops(cfg, 2, 33).get_total_flops() == transformer_flops(cfg, 2, 33).forward_matmul_flops
    import pytest

    with pytest.raises(ValueError, match="seq \\(0\\)"):
        count_model_flops(cfg, 1, 0)
