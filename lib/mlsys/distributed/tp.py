"""Tensor parallelism (Megatron-LM) by hand, with sequence parallelism as an option.

Each of the n ranks of `group` holds a slice of every block's matrices: q, k, v, w1 and w3 by
output columns (`ColumnParallelLinear`: whole heads, n_heads / n of them, and d_ff / n hidden
units), o_proj and w2 by input rows (`RowParallelLinear`), so attention and SwiGLU run on local
slices and only two sums per block cross ranks (Shoeybi et al., 2019, "Megatron-LM", figure 3):

- "f" (`copy_to_tp`) at the input of attention and of the feed-forward: identity in the forward
  (every rank has the whole input), all-reduce in the backward (each rank's slice contributes a
  partial gradient of the input);
- "g" (`reduce_from_tp`) after o_proj and w2: all-reduce in the forward (each rank's rows give a
  partial sum), identity in the backward.
Per block: 2 all-reduces of (b, s, d_model) forward and 2 backward (`accounting.parallel_traffic.
tp_sent_bytes`). Embedding, head and norm gains stay whole on every rank (a vocabulary-parallel
head is the next step Megatron takes; not done here).

Sequence parallelism (Korthikanti et al., 2022) keeps the residual stream split along the sequence
between the sub-layers, so the norms (and their saved activations) are split n ways: "f" becomes
an all-gather along the sequence (reduce-scatter in the backward) and "g" a reduce-scatter
(all-gather in the backward): the same bytes as the all-reduce they replace. The stream is split
after the embedding and gathered before the final norm; each norm gain, which now sees 1/n of the
tokens, gets its gradient all-reduced (it is reached through `copy_to_tp`, kept as `tp_gain`).

`apply_tp` changes module instances, not classes: linears are swapped for the parallel ones,
attention's `n_heads` becomes the local count, and forward hooks apply f/g at the sub-layers'
edges. `unsharded` gathers the slices back (for checks). DTensor's `parallelize_module` on the
same blocks is `torch_strategies.apply_dtensor_tp`. Used in: chapter 09 (§sec-parallelism).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from mlsys.distributed.comms import all_gather_single, reduce_scatter_single
from mlsys.distributed.groups import check_blocks, check_group


def _n_r(group) -> tuple[int, int]:
    return dist.get_world_size(group), dist.get_rank(group)


def _all_reduce(x: Tensor, group) -> Tensor:
    x = x.contiguous().clone()
    dist.all_reduce(x, group=group)
    return x


def _gather_stack(x: Tensor, group) -> Tensor:
    """Every rank's `x`, stacked in rank order: (n, *x.shape)."""
    n, _ = _n_r(group)
    out = torch.empty((n * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    all_gather_single(out, x.contiguous(), group=group)  # gloo: concatenated along dim 0
    return out.view(n, *x.shape)


def _gather_seq(x: Tensor, group) -> Tensor:
    """(b, s/n, d) on each rank -> (b, s, d), the ranks' pieces in rank order."""
    n, _ = _n_r(group)
    return _gather_stack(x, group).transpose(0, 1).reshape(x.shape[0], n * x.shape[1],
                                                           *x.shape[2:])


def _split_seq(x: Tensor, group) -> Tensor:
    n, r = _n_r(group)
    if x.shape[1] % n:
        raise ValueError(f"sequence parallelism needs seq ({x.shape[1]}) divisible by the "
                         f"tensor-parallel degree ({n})")
    return x.chunk(n, dim=1)[r].contiguous()


def _reduce_scatter_seq(x: Tensor, group) -> Tensor:
    """(b, s, d) partial sums -> (b, s/n, d): this rank's piece of the sum."""
    n, _ = _n_r(group)
    pieces = x.reshape(x.shape[0], n, x.shape[1] // n, *x.shape[2:]).transpose(0, 1)
    out = torch.empty(pieces.shape[1:], dtype=x.dtype, device=x.device)
    flat = pieces.contiguous().view(n * out.shape[0], *out.shape[1:])  # gloo: pieces along dim 0
    reduce_scatter_single(out, flat, group=group)
    return out


class _CopyToTP(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherSeq(torch.autograd.Function):
    """Sequence-parallel f: all-gather the sequence forward, reduce-scatter it backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_seq(grad, ctx.group), None


class _ReduceScatterSeq(torch.autograd.Function):
    """Sequence-parallel g: reduce-scatter the sequence forward, all-gather it backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_seq(grad, ctx.group), None


class _SplitSeq(torch.autograd.Function):
    """Into the split stream (after the embedding): keep this rank's piece; all-gather back."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_seq(grad, ctx.group), None


class _GatherSeqReplicated(torch.autograd.Function):
    """Out of the split stream into replicated compute (final norm, head): all-gather; the
    gradient, the same on every rank, is cut back to this rank's piece."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _split_seq(grad, ctx.group), None


def copy_to_tp(x: Tensor, group) -> Tensor:
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x: Tensor, group) -> Tensor:
    return _ReduceFromTP.apply(x, group)


class ColumnParallelLinear(nn.Module):
    """This rank's out_features / n rows of a bias-free linear's weight; no communication."""

    def __init__(self, linear: nn.Linear, group):
        super().__init__()
        n, r = _n_r(group)
        if linear.bias is not None or linear.out_features % n:
            raise ValueError(f"a column-parallel linear needs no bias and out_features "
                             f"({linear.out_features}) divisible by the TP degree ({n})")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        k = linear.out_features // n
        self.weight = nn.Parameter(linear.weight.detach()[r * k:(r + 1) * k].clone())

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out_local"]:
        return F.linear(x, self.weight)


class RowParallelLinear(nn.Module):
    """This rank's in_features / n columns of a bias-free linear's weight; sums the partial
    outputs ("g", or a reduce-scatter along the sequence)."""

    def __init__(self, linear: nn.Linear, group, *, sequence_parallel: bool = False):
        super().__init__()
        n, r = _n_r(group)
        if linear.bias is not None or linear.in_features % n:
            raise ValueError(f"a row-parallel linear needs no bias and in_features "
                             f"({linear.in_features}) divisible by the TP degree ({n})")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.group, self.sequence_parallel = group, sequence_parallel
        k = linear.in_features // n
        self.weight = nn.Parameter(linear.weight.detach()[:, r * k:(r + 1) * k].clone())

    def forward(self, x: Float[Tensor, "... d_in_local"]) -> Float[Tensor, "... d_out"]:
        partial = F.linear(x, self.weight)
        if self.sequence_parallel:
            return _ReduceScatterSeq.apply(partial, self.group)
        return reduce_from_tp(partial, self.group)


def _share_gain(norm: nn.Module, group) -> None:
    """Under sequence parallelism: reach the norm's gain through f, so its gradient (from this
    rank's tokens only) is all-reduced; the parameter is kept as `tp_gain`."""
    gain = norm._parameters.pop("weight")
    norm.register_parameter("tp_gain", gain)
    norm.register_forward_pre_hook(lambda m, args: setattr(m, "weight",
                                                           copy_to_tp(m.tp_gain, group)))


def _entry_hook(group, sequence_parallel: bool):
    """A forward pre-hook applying f (or, with sequence parallelism, the all-gather) to the
    sub-layer's input."""
    enter = _GatherSeq.apply if sequence_parallel else _CopyToTP.apply
    return lambda module, args: (enter(args[0], group), *args[1:])


def apply_tp(module: nn.Module, group, *, sequence_parallel: bool = False) -> nn.Module:
    """Split every block of `module` (a Transformer or a pp.PipelineStage) over the ranks of
    `group` (the module docstring); returns it."""
    check_blocks(module)
    check_group(group)
    if not isinstance(sequence_parallel, bool):
        raise TypeError(f"sequence_parallel must be True or False, got {sequence_parallel!r}")
    n, _ = _n_r(group)
    for i, block in enumerate(module.blocks):
        attn, ffn = block.attn, block.ffn
        if attn.n_heads % n:
            raise ValueError(f"blocks.{i}: n_heads ({attn.n_heads}) is not divisible by the TP "
                             f"degree ({n})")
        for name in ("q_proj", "k_proj", "v_proj"):
            setattr(attn, name, ColumnParallelLinear(getattr(attn, name), group))
        attn.o_proj = RowParallelLinear(attn.o_proj, group, sequence_parallel=sequence_parallel)
        attn.n_heads //= n  # split_heads reads the local width as local heads x d_head
        ffn.w1, ffn.w3 = ColumnParallelLinear(ffn.w1, group), ColumnParallelLinear(ffn.w3, group)
        ffn.w2 = RowParallelLinear(ffn.w2, group, sequence_parallel=sequence_parallel)
        for sub in (attn, ffn):
            sub.register_forward_pre_hook(_entry_hook(group, sequence_parallel))
        if sequence_parallel:
            _share_gain(block.attn_norm, group)
            _share_gain(block.ffn_norm, group)
    if sequence_parallel:
        if getattr(module, "token_embedding", None) is not None:
            module.token_embedding.register_forward_hook(
                lambda m, args, out: _SplitSeq.apply(out, group))
        if getattr(module, "final_norm", None) is not None:
            module.final_norm.register_forward_pre_hook(
                lambda m, args: (_GatherSeqReplicated.apply(args[0], group), *args[1:]))
    return module


def unsharded(named: dict[str, Tensor], module: nn.Module, group) -> dict[str, Tensor]:
    """`named` tensors of `module` (its parameters or their gradients, by name) with every TP
    slice gathered whole, by their names before `apply_tp` (a collective over `group`)."""
    n, _ = _n_r(group)
    out = {}
    for name, t in named.items():
        path, _, attr = name.rpartition(".")
        owner = module.get_submodule(path)
        if isinstance(owner, ColumnParallelLinear):
            whole = torch.empty((n * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
            all_gather_single(whole, t.contiguous(), group=group)
            out[name] = whole
        elif isinstance(owner, RowParallelLinear):
            out[name] = torch.cat(list(_gather_stack(t, group)), dim=1)
        else:
            out[f"{path}.weight" if attr == "tp_gain" else name] = t
    return out
