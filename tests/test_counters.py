import torch
from kernel_cases import tally_bytes

from mlsys.counters import ByteCounter, StorageTouches, count_bytes


def test_counts_reads_and_writes_per_op():
    a, b = torch.ones(3, 5), torch.ones(1, 5, dtype=torch.float16)
    counter = count_bytes(lambda: torch.exp(a + b))
    traffic = [(op.op, op.read_bytes, op.write_bytes) for op in counter.ops]
    assert traffic == [("add", 70, 60), ("exp", 60, 60)]
    assert (counter.read_bytes, counter.write_bytes, counter.total_bytes) == (130, 120, 250)


def test_tally_counts_reads_and_writes_of_each_op():
    a, b = torch.ones(3, 5), torch.ones(1, 5, dtype=torch.float16)
    tally = tally_bytes(lambda: torch.exp(a + b))
    # add reads 15*4 + 5*2 bytes and writes 15*4; exp reads and writes 15*4
    ops = [(op.op, op.read_bytes, op.write_bytes) for op in tally.ops]
    assert ops == [("add", 70, 60), ("exp", 60, 60)]
    assert tally.total_bytes == 250


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


# --- SavedTensors ---------------------------------------------------------------------------------


def test_saved_tensors_counts_each_storage_once_at_its_full_size():
    from mlsys.counters import SavedTensors

    base = torch.randn(4, 10, requires_grad=True)
    with SavedTensors() as saved:
        x = base * 1.0  # a new (4, 10) storage: 160 bytes
        y = x[:, :5].sin() + x[:, 5:].cos()  # sin and cos save views of x
        z = x.exp()  # exp saves its output
    assert y.requires_grad and z.requires_grad
    first = saved.storages[0]
    assert (first.nbytes, first.shape, first.dtype, first.kind) == (160, (4, 5), "fp32",
                                                                    "activation")
    assert first.saves == 2  # the two halves of x: one storage, counted once, whole
    assert saved.activation_bytes == 160 + 160  # x and exp's output
    assert saved.by_dtype() == {"fp32": 320}


def test_saved_tensors_sorts_parameters_buffers_and_excluded_apart():
    from mlsys.counters import OUTSIDE, SavedTensors

    model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.SiLU(),
                                torch.nn.Linear(16, 2, bias=False))
    model.register_buffer("scale", torch.full((2,), 3.0))
    x = torch.randn(5, 8, requires_grad=True)
    with SavedTensors(model, exclude=[x]) as saved:
        out = model(x) * model.scale  # mul by a buffer saves the buffer
        loss = (out * out).sum()  # saved outside the model
    assert loss.requires_grad
    kinds = {(s.module, s.kind): s.nbytes for s in saved.storages}
    assert kinds == {("0", "parameter"): 8 * 16 * 4, ("0", "excluded"): 5 * 8 * 4,
                     ("1", "activation"): 5 * 16 * 4, ("2", "parameter"): 16 * 2 * 4,
                     ("2", "activation"): 5 * 16 * 4, (OUTSIDE, "excluded"): 2 * 4,
                     (OUTSIDE, "activation"): 5 * 2 * 4}
    assert saved.parameter_bytes == (8 * 16 + 16 * 2) * 4  # weights saved as weight.t() views
    assert saved.excluded_bytes == 5 * 8 * 4 + 2 * 4
    assert saved.by_module() == {"1": 320, "2": 320, OUTSIDE: 40}
    assert saved.by_module(depth=1) == saved.by_module()
    # the hooks are gone afterwards: nothing recorded, no module hooks left behind
    before = len(saved.storages)
    model(x).sum()
    assert len(saved.storages) == before == 7
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


def test_saved_tensors_without_a_model_still_knows_parameters():
    from mlsys.counters import SavedTensors

    layer = torch.nn.Linear(3, 4, bias=False)
    with SavedTensors() as saved:
        out = layer(torch.randn(2, 3))  # the input needs no grad: only the weight's use matters
    assert out.requires_grad and saved.activation_bytes == 2 * 3 * 4
    assert saved.parameter_bytes == 0  # the weight needs no saving: dW needs x, dx is not needed
    with SavedTensors() as saved:
        out = layer(torch.randn(2, 3, requires_grad=True))
    assert saved.parameter_bytes == 3 * 4 * 4


def test_saved_tensors_on_the_meta_device_keeps_storages_apart():
    from mlsys.counters import SavedTensors

    with torch.device("meta"):
        a = torch.empty(6, 7, requires_grad=True)
        with SavedTensors() as saved:
            b = a.sin()  # saves a
            c = b.exp().cos()  # exp saves its output, and cos the same storage again
    assert all(t.untyped_storage().data_ptr() == 0 for t in (a, b, c))  # why keys are _cdata
    assert [s.saves for s in saved.storages] == [1, 2]
    assert saved.activation_bytes == 2 * 6 * 7 * 4
    import pytest

    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        SavedTensors("model")
    with pytest.raises(TypeError, match=r"exclude\[1\] must be a tensor"):
        SavedTensors(exclude=[a, 3])
    with pytest.raises(ValueError, match="depth must be a positive integer"):
        saved.by_module(depth=0)
