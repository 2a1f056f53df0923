"""`mlsys.models.checkpointing` on the unmodified model, against `mlsys.accounting.activations`:
what the forward keeps (`SavedTensors`), what the backward reruns (`FlopCounterMode`)."""

import pytest
import torch
from torch.utils.checkpoint import set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode

from mlsys.accounting import activations, recompute
from mlsys.accounting.flops import transformer_flops
from mlsys.counters import SavedTensors
from mlsys.dtypes import torch_dtype
from mlsys.models.checkpointing import CheckpointedBlocks, checkpoint_blocks, uncheckpoint_blocks
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.training import next_token_loss


def build(cfg, *, device="meta", dtype="fp32"):
    with torch.device("meta"):
        model = Transformer(cfg).to(torch_dtype(dtype))
    if device != "meta":
        model.to_empty(device=device)
        model.init_weights(seed=0)
    return model


def batch_of(cfg, batch, seq, device="meta"):
    gen = torch.Generator().manual_seed(1)
    return torch.randint(cfg.vocab_size, (batch, seq + 1), generator=gen).to(device)


def test_same_loss_gradients_and_names_as_the_plain_model():
    cfg = TransformerConfig.preset("debug", n_layers=5)
    model = build(cfg, device="cpu")
    tokens = batch_of(cfg, 2, 16, "cpu")
    names = list(model.state_dict())
    loss = next_token_loss(model, tokens)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    for segment in (1, 2, 5, 7):
        model.zero_grad()
        assert checkpoint_blocks(model, segment) is model  # in place
        assert isinstance(model.blocks, CheckpointedBlocks) and list(model.state_dict()) == names
        assert len(model.blocks) == 5 and type(model.blocks[4]).__name__ == "Block"
        assert type(model.blocks[1:3]) is torch.nn.ModuleList and f"segment={segment}" in repr(
            model.blocks)
        again = next_token_loss(model, tokens)
        again.backward()
        assert torch.equal(again, loss)
        assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))
    assert uncheckpoint_blocks(model) is model and type(model.blocks) is torch.nn.ModuleList
    assert list(model.state_dict()) == names


def test_backward_recomputes_one_segment_at_a_time_last_first():
    cfg = TransformerConfig.preset("debug", n_layers=5)
    model = checkpoint_blocks(build(cfg, device="cpu"), 2)
    calls = []
    for i, block in enumerate(model.blocks.children()):
        block.register_forward_pre_hook(lambda mod, args, i=i: calls.append(i))
    loss = next_token_loss(model, batch_of(cfg, 2, 8, "cpu"))
    assert calls == [0, 1, 2, 3, 4]
    calls.clear()
    loss.backward()
    assert calls == [4, 2, 3, 0, 1]  # segments (4), (2, 3), (0, 1): each rerun once


@pytest.mark.parametrize("segment", [1, 2, 3, 12, 20])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_forward_keeps_only_the_segment_inputs_on_meta(segment, dtype):
    cfg = TransformerConfig.preset("small", attention="naive")
    model = checkpoint_blocks(build(cfg, dtype=dtype), segment)
    with SavedTensors(model) as saved:
        loss = next_token_loss(model, batch_of(cfg, 2, 64))
    predicted = activations.saved_bytes(cfg, 2, 64, dtype=dtype, checkpoint_segment=segment)
    assert loss.requires_grad and saved.activation_bytes == predicted.total_bytes
    assert saved.excluded_bytes == sum(b.numel() * b.element_size() for b in model.buffers())


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("attention", ["sdpa", "naive"])
def test_forward_keeps_only_the_segment_inputs_on_cpu(attention, dtype):
    cfg = TransformerConfig.preset("debug", attention=attention, n_layers=5)
    model = checkpoint_blocks(build(cfg, device="cpu", dtype=dtype), 2)
    with SavedTensors(model) as saved:
        loss = next_token_loss(model, batch_of(cfg, 3, 16, "cpu"))
    predicted = activations.saved_bytes(cfg, 3, 16, dtype=dtype, checkpoint_segment=2)
    assert loss.requires_grad and saved.activation_bytes == predicted.total_bytes
    plain = activations.saved_bytes(cfg, 3, 16, dtype=dtype)
    assert plain.total_bytes - predicted.total_bytes == (
        5 * plain.block_bytes - 3 * predicted.segment_input.nbytes)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_backward_saves_each_segment_again_one_at_a_time(dtype, monkeypatch):
    """The tensors the recomputation saves, seen by wrapping the saved-tensor hook PyTorch's
    checkpoint installs while it reruns a segment (a private class: skipped if it moves)."""
    import torch.utils.checkpoint as ckpt

    if not isinstance(getattr(ckpt, "_recomputation_hook", None), type):
        pytest.skip("torch.utils.checkpoint._recomputation_hook is gone: recount another way")
    reruns: list[dict[int, int]] = []  # per segment rerun: storage -> bytes

    class Recording(ckpt._recomputation_hook):
        def __init__(self, *args):
            super().__init__(*args)
            reruns.append({})
            pack = self.pack_hook

            def record(x):
                storage = x.untyped_storage()
                reruns[-1][storage._cdata] = storage.nbytes()
                return pack(x)

            self.pack_hook = record

    monkeypatch.setattr(ckpt, "_recomputation_hook", Recording)
    cfg = TransformerConfig.preset("debug", attention="sdpa", n_layers=5)
    model = checkpoint_blocks(build(cfg, device="cpu", dtype=dtype), 2)
    inputs = []  # each segment's input (blocks 0, 2, 4), held by the checkpoint; kept alive here
    for i in (0, 2, 4):
        model.blocks[i].register_forward_pre_hook(lambda mod, args: inputs.append(args[0]))
    loss = next_token_loss(model, batch_of(cfg, 3, 16, "cpu"))
    held = {t.untyped_storage()._cdata
            for t in (*model.parameters(), *model.buffers(), *inputs[:3])}
    loss.backward()
    new = [sum(b for s, b in run.items() if s not in held) for run in reruns]
    predicted = activations.saved_bytes(cfg, 3, 16, dtype=dtype, checkpoint_segment=2)
    one_block = activations.saved_bytes(cfg, 3, 16, dtype=dtype,
                                        checkpoint_segment=1).recompute_bytes
    assert new == [one_block, predicted.recompute_bytes, predicted.recompute_bytes]
    assert max(new) == predicted.recompute_bytes


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_recompute_bytes_are_one_segment_less_its_input(dtype):
    """What the backward saves again for one segment: the segment's forward, its input held."""
    cfg = TransformerConfig.preset("medium")
    model = build(cfg, dtype=dtype)
    batch, seq, segment = 2, 32, 3
    cos, sin = model.rope(seq)
    x = torch.empty(batch, seq, cfg.d_model, device="meta", dtype=torch_dtype(dtype),
                    requires_grad=True)
    with SavedTensors(exclude=(x, cos, sin)) as saved:
        for block in list(model.blocks)[:segment]:
            x = block(x, cos, sin)
    predicted = activations.saved_bytes(cfg, batch, seq, dtype=dtype, checkpoint_segment=segment)
    assert saved.activation_bytes == predicted.recompute_bytes


@pytest.mark.parametrize("early_stop", [True, False])
@pytest.mark.parametrize("segment", [1, 2, 3, 4, 9])
def test_the_backward_reruns_the_predicted_forward_flops(segment, early_stop):
    cfg = TransformerConfig.preset("xl", n_layers=8, attention="naive")
    batch, seq = 2, 128
    model = checkpoint_blocks(build(cfg), segment)
    with set_checkpoint_early_stop(early_stop), FlopCounterMode(display=False) as counter:
        loss = next_token_loss(model, batch_of(cfg, batch, seq))
        forward = counter.get_total_flops()
        loss.backward()
    mf = transformer_flops(cfg, batch, seq)
    assert forward == mf.forward_matmul_flops
    recomputed = counter.get_total_flops() - mf.training_matmul_flops
    assert recomputed == recompute.recompute_flops(cfg, batch, seq, checkpoint_segment=segment,
                                                   early_stop=early_stop)
    assert recomputed / mf.training_matmul_flops < 1 / 3  # the head is never rerun


def test_bad_arguments():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        checkpoint_blocks("model", 1)
    with pytest.raises(TypeError, match="model.blocks must be an nn.ModuleList"):
        checkpoint_blocks(torch.nn.Linear(2, 2), 1)
    model = build(TransformerConfig())
    with pytest.raises(ValueError, match="segment must be a positive integer, got 0"):
        checkpoint_blocks(model, 0)
    with pytest.raises(TypeError, match="segment must be an integer"):
        checkpoint_blocks(model, 1.5)
    assert type(model.blocks) is torch.nn.ModuleList  # refused before any change
