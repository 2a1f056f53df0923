"""Context parallelism by hand: the sequence split over the ranks of a group, attention as a ring.

Each of the n ranks holds s / n positions of every sequence (its queries, keys and values) and
computes everything but attention on them alone. `ring_attention` passes the key/value blocks
around the ring (n - 1 sends each way per layer): at step t rank r holds the block of rank r - t,
computes the partial attention of its queries over it with the reference
(`mlsys.ops.attention.attention(..., mask=..., return_lse=True)`: output O_j and log-sum-exp
L_j), and merges it with what it has so far, exactly, by the log-sum-exp (the online softmax of
FlashAttention): L = logaddexp(L_a, L_b), O = e^(L_a - L) O_a + e^(L_b - L) O_b (Liu et al., 2023,
"Ring Attention with Blockwise Transformers"). A block whose keys all lie in the queries' future is
passed on without being computed.

The backward is written out, block by block (FlashAttention-2's): with D = rowsum(dO * O),
P = exp(S - L), dV_j += P^T dO, dS = P * (dO V_j^T - D), dQ += dS K_j * scale, dK_j += dS^T Q *
scale. The key/value blocks travel the ring again, each with its accumulators dK_j, dV_j (kept in
fp32), which take one last hop back to their owner: `accounting.parallel_traffic.cp_sent_bytes`.

Causal load balance: with contiguous shards, rank r's queries see r + 1 of the n key blocks (about
(r + 1/2) (s/n)^2 scores), so the last rank works 2n - 1 times as long as the first and the step
waits for it. The zig-zag layout gives rank r chunks r and 2n - 1 - r of 2n (one early, one late):
every rank then has n/2 (s/n)^2 scores (`causal_work` counts them; the layout of Megatron-LM's
context parallelism; Brandon et al., 2023, "Striped Attention", stripes instead). This teaching
version computes every block that holds any allowed score whole, masked, so it does not itself
save the masked half: a kernel that skips masked tiles does. `apply_cp` points
the model's attention at the ring and its RoPE at this rank's positions; `shard_tokens` gives each
rank its inputs and targets. Each rank's loss is the mean over its tokens, so the gradients must be
averaged over the group (`average_gradients`, or FSDP over dp_shard x cp). Used in: chapter 09.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from jaxtyping import Float
from torch import Tensor, nn

from mlsys import checks
from mlsys.distributed.groups import check_blocks, check_group
from mlsys.ops.attention import attention

LAYOUTS = ("contiguous", "zigzag")


def positions(seq: int, n_ranks: int, rank: int, layout: str = "zigzag") -> Tensor:
    """The sequence positions rank `rank` holds: s / n contiguous ones, or chunks r and 2n - 1 - r
    of 2n (zig-zag)."""
    s, n = checks.positive_int(seq, "seq"), checks.positive_int(n_ranks, "n_ranks")
    r = checks.integer(rank, "rank", minimum=0)
    if r >= n:
        raise ValueError(f"rank ({r}) must be < n_ranks ({n}): ranks are numbered from 0")
    checks.choice(layout, "layout", LAYOUTS)
    parts = n if layout == "contiguous" else 2 * n
    if s % parts:
        raise ValueError(f"seq ({s}) must be divisible by {parts} for the {layout} layout over "
                         f"{n} ranks")
    chunk = s // parts
    chunks = (r,) if layout == "contiguous" else (r, 2 * n - 1 - r)
    return torch.cat([torch.arange(c * chunk, (c + 1) * chunk) for c in chunks])


def causal_work(seq: int, n_ranks: int, layout: str = "zigzag") -> list[int]:
    """Query-key pairs each rank's queries may attend (the causal scores it must compute), for
    sequences of `seq` tokens: about (r + 1/2) (s/n)^2 for rank r with contiguous shards, and
    n/2 (s/n)^2 for every rank with the zig-zag layout."""
    n = checks.positive_int(n_ranks, "n_ranks")
    return [int((positions(seq, n, r, layout) + 1).sum()) for r in range(n)]


def shard_tokens(tokens: Tensor, n_ranks: int, rank: int, layout: str = "zigzag"
                 ) -> tuple[Tensor, Tensor]:
    """This rank's (inputs, targets), each (batch, s / n), from a (batch, s + 1) batch."""
    if not isinstance(tokens, Tensor) or tokens.ndim != 2:
        raise ValueError(f"tokens must be a (batch, seq + 1) tensor, got "
                         f"{getattr(tokens, 'shape', type(tokens).__name__)}")
    pos = positions(tokens.shape[1] - 1, n_ranks, rank, layout).to(tokens.device)
    return tokens[:, :-1][:, pos], tokens[:, 1:][:, pos]


def _exchange(sends: list[Tensor], group) -> list[Tensor]:
    """Send each tensor to the right neighbour and receive the same shapes from the left."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    right = dist.get_global_rank(group, (r + 1) % n)
    left = dist.get_global_rank(group, (r - 1) % n)
    received = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in sends]
    works = [dist.isend(t.contiguous(), dst=right, group=group) for t in sends]
    works += [dist.irecv(t, src=left, group=group) for t in received]
    for work in works:
        work.wait()
    return received


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, all_positions, group):
        n, r = dist.get_world_size(group), dist.get_rank(group)
        wide = torch.promote_types(q.dtype, torch.float32)
        qpos = all_positions[r]
        out = torch.zeros(q.shape, dtype=wide, device=q.device)
        lse = torch.full(q.shape[:-1], -math.inf, dtype=wide, device=q.device)
        kv = [k, v]
        for step in range(n):
            allowed = all_positions[(r - step) % n][None, :] <= qpos[:, None]  # (s_q, s_k)
            if allowed.any():
                o_b, l_b = attention(q.to(wide), kv[0].to(wide), kv[1].to(wide), mask=allowed,
                                     return_lse=True)
                new = torch.logaddexp(lse, l_b)
                safe = torch.where(torch.isinf(new), 0.0, new)  # rows with no key yet: stay 0
                out = (out * torch.exp(lse - safe)[..., None]
                       + o_b * torch.exp(l_b - safe)[..., None])
                lse = new
            if step < n - 1:
                kv = _exchange(kv, group)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.all_positions, ctx.group = all_positions, group
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, all_positions = ctx.group, ctx.all_positions
        n, r = dist.get_world_size(group), dist.get_rank(group)
        wide = out.dtype
        scale = 1.0 / math.sqrt(q.shape[-1])
        qw, do = q.to(wide), dout.to(wide)
        delta = (do * out).sum(-1, keepdim=True)  # D = rowsum(dO * O)
        safe_lse = torch.where(torch.isinf(lse), 0.0, lse)[..., None]
        dq = torch.zeros_like(qw)
        blk = [k, v, torch.zeros(k.shape, dtype=wide, device=k.device),
               torch.zeros(v.shape, dtype=wide, device=v.device)]  # K_j, V_j, dK_j, dV_j
        for step in range(n):
            allowed = all_positions[(r - step) % n][None, :] <= all_positions[r][:, None]
            if allowed.any():
                kw, vw = blk[0].to(wide), blk[1].to(wide)
                scores = (qw @ kw.transpose(-2, -1)) * scale
                p = torch.where(allowed, torch.exp(scores - safe_lse), 0.0)
                blk[3] = blk[3] + p.transpose(-2, -1) @ do
                ds = p * (do @ vw.transpose(-2, -1) - delta)
                dq = dq + ds @ kw * scale
                blk[2] = blk[2] + ds.transpose(-2, -1) @ qw * scale
            if step < n - 1:
                blk = _exchange(blk, group)
            else:  # the accumulators take one more hop, home to their owner
                blk[2:] = _exchange(blk[2:], group)
        return dq.to(q.dtype), blk[2].to(k.dtype), blk[3].to(v.dtype), None, None


def ring_attention(
    q: Float[Tensor, "batch heads seq_local d_head"],
    k: Float[Tensor, "batch heads seq_local d_head"],
    v: Float[Tensor, "batch heads seq_local d_head"],
    all_positions: list[Tensor],
    group,
) -> Float[Tensor, "batch heads seq_local d_head"]:
    """Causal attention of this rank's queries over every rank's keys (the module docstring);
    `all_positions[j]` are rank j's sequence positions (`positions`)."""
    check_group(group)
    n = dist.get_world_size(group)
    if len(all_positions) != n:
        raise ValueError(f"all_positions must hold one tensor per rank ({n}), got "
                         f"{len(all_positions)}")
    if q.shape != k.shape or k.shape != v.shape or q.shape[-2] != len(all_positions[0]):
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} must be "
                         f"(batch, heads, {len(all_positions[0])}, d_head)")
    return _RingAttention.apply(q, k, v, [p.to(q.device) for p in all_positions], group)


class _ShardedRope(nn.Module):
    """RoPE tables at this rank's positions: forward(seq) with seq = the local length."""

    def __init__(self, rope: nn.Module, mine: Tensor):
        super().__init__()
        self.inner, self.mine = rope, mine

    def forward(self, seq: int) -> tuple[Tensor, Tensor]:
        if seq != len(self.mine):
            raise ValueError(f"this rank holds {len(self.mine)} positions, got seq={seq}")
        cos, sin = self.inner(self.inner.context_length)
        index = self.mine.to(cos.device)
        return cos[index], sin[index]


def apply_cp(module: nn.Module, group, *, seq: int, layout: str = "zigzag") -> nn.Module:
    """Run `module`'s attention as a ring over `group`, for sequences of `seq` tokens split by
    `layout`; returns it. Feed each rank `shard_tokens(...)` (its positions only). RoPE models
    only: a learned position table is added inside the embedding, at positions 0.. of each
    rank's shard, which this ring does not remap."""
    kind = getattr(getattr(module, "config", None), "positions", "rope")
    if kind != "rope":
        raise ValueError(f"apply_cp needs a RoPE model (positions='rope'), got positions={kind!r}: "
                         "a learned position table would give every rank's shard positions 0, "
                         "1, ... instead of its own")
    check_blocks(module)
    check_group(group)
    n, r = dist.get_world_size(group), dist.get_rank(group)
    everyone = [positions(seq, n, j, layout) for j in range(n)]
    for block in module.blocks:
        block.attn.attend = lambda q, k, v: ring_attention(q, k, v, everyone, group)
        block.attn.backend = f"ring ({layout}, {n} ranks)"
    module.rope = _ShardedRope(module.rope, everyone[r])
    return module


def average_gradients(module: nn.Module, group) -> None:
    """Average every gradient of `module` over `group` in one flat all-reduce (the context-
    parallel ranks each saw 1/n of the tokens)."""
    check_group(group)
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat.div_(dist.get_world_size(group))
    for g, piece in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(piece.view_as(g))
