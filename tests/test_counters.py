import torch

from mlsys.counters import ByteCounter, StorageTouches, count_bytes
from mlsys.models.counting import count_model_flops


def test_counts_reads_and_writes_per_op():
    a, b = torch.ones(3, 5), torch.ones(1, 5, dtype=torch.float16)
    counter = count_bytes(lambda: torch.exp(a + b))
    traffic = [(op.op, op.read_bytes, op.write_bytes) for op in counter.ops]
    assert traffic == [("add", 70, 60), ("exp", 60, 60)]
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
    expected = transformer_flops(cfg, 2, 33).forward_matmul_flops
    assert count_model_flops(cfg, 2, 33).get_total_flops() == expected
    import pytest

    with pytest.raises(ValueError, match="seq must be a positive integer"):
        count_model_flops(cfg, 1, 0)


def test_storage_touches_finds_the_reads_of_w_and_the_write_of_dw():
    layer = torch.nn.Linear(11, 13, bias=False)
    x = torch.randn(7, 11, requires_grad=True)
    layer(x).sum().backward()  # creates W.grad
    with StorageTouches(W=layer.weight, dW=layer.weight.grad) as touches:
        layer(x).sum().backward()  # the second step accumulates into dW
    assert touches.count("W", kind="read") == 2  # the forward and dX
    assert touches.count("dW", kind="write") == 1 and touches.count("dW", kind="read") == 1
    import pytest

    with pytest.raises(ValueError, match="not watched"):
        touches.count("X", kind="read")
