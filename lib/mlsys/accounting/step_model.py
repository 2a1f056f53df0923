"""The time of one training step from first principles, broken down: every GEMM from its shape,
the other kernels from their bytes, every collective from its bytes and latency, the overlap rules
and the pipeline bubble.

One device of the busiest pipeline stage runs m micro-batches of b sequences (seq / cp tokens
each); per micro-batch and block it runs:
- GEMMs (`Gemm`): the forward's (q, k, v fused; output projection; the MLP's one or two
  matrices; experts), each backward as two GEMMs of the same size (data and weight gradient;
  the weight gradient accumulates into fp32 main gradients: its output is read and written in
  fp32). A GEMM's time (`gemm_time_s`) is its tiles in waves on the SMs, under its own roofline:
  T = ceil(M / b_m) ceil(N / b_n) tiles of the best of `hardware.GEMM_TILES` run in ceil(T / S)
  waves, each as long as one tile's 2 b_m b_n K FLOPs at peak x `gemm_fraction` / S; or, if
  longer, the bytes of A, B and C at HBM bandwidth x `hbm_fraction`. Tile and wave quantization
  come out of the ceilings (NVIDIA, "Matrix Multiplication Background User's Guide").
- non-matmul kernels (norms, activation, residual adds, dropout, softmax, RoPE, casts) by the
  bytes each reads and writes (`_ELEMENTWISE`), at HBM bandwidth x `hbm_fraction`. Without
  sequence parallelism the norms, dropouts and residual adds run whole on every TP rank.
- attention: "flash" (FlashAttention-2, `accounting.attention`: the causal tiles' FLOPs, forward
  2 matmuls, backward 5) at peak x `hardware.FLASH_FRACTION`; "materialized" (Megatron-LM 2021:
  Q K^T and P V as batched GEMMs, the s x s scores written out and passed through a fused
  scale-mask-softmax and a dropout).
- recomputation: "full" reruns the block's forward (its TP collectives too) in the backward;
  "selective" reruns the attention core (Korthikanti et al. 2022).
- fp8 (`dtype="fp8"`): the linear layers' GEMMs at the fp8 peak with 1-byte operands, plus the
  casts of their bf16 inputs (read 2, write 1 byte an element) and an amax pass; attention,
  norms, activations' communication and the optimizer as in bf16.
Collectives (`collective_s`) are alpha-beta: steps x alpha + bus bytes (`accounting.comms`) /
(link x `nccl_fraction`), the link from `Cluster.group_link` (NVLink in a node; across nodes k x
the NIC for a group with k ranks in its emptiest node).
Overlap rules: TP all-reduces (or SP all-gathers and reduce-scatters) and EP all-to-alls sit on
the critical path; pipeline sends are blocking, 2 v per micro-batch; ring attention hides behind
the attention it feeds; FSDP's gathers and reduce-scatters behind each micro-batch's compute,
except the first gather and the last reduce-scatter; the data-parallel gradient reduction behind
the last micro-batch's backward except its last bucket (or none of it with
`overlap_grad_reduce=False`, Megatron-LM 2021's "local" DDP); ZeRO-1/2's gather of the updated
weights after the optimizer is exposed. Bubble: (p - 1) / v micro-batch times of the busiest
stage (interleaved 1F1B, `pipeline.interleaved_bubble_fraction` x m). Optimizer: its bytes per
parameter on this device at HBM bandwidth.
Left out: data loading, logging, kernel launch gaps, stragglers, the imbalance of uneven expert
routing. The constants are `hardware.StepConstants`, fitted on Megatron-LM's Table 1 only
(`accounting.calibration`). Over 300 lines because the GEMM list, the kernels' bytes, the
collectives and the overlap rules are one model read together. Pure Python.
Used in: `accounting.planner` (model="calibrated"), chapter 09's page on published runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mlsys import checks, hardware
from mlsys.accounting.attention import tiled_attention_forward_flops
from mlsys.accounting.comms import collective_cost
from mlsys.accounting.parallel import MESH_AXES, ParallelDims
from mlsys.dtypes import bytes_per_element

RECOMPUTE = ("none", "selective", "full")
ATTENTION_KINDS = ("flash", "materialized")
DTYPES = ("bf16", "fp16", "fp8")
AXES = ("dp", "fsdp", "tp", "cp", "pp", "ep")
FLASH_BACKWARD_MATMULS = 5  # FlashAttention-2's backward: S recomputed, dV, dP, dQ, dK
FLASH_BLOCK = 128  # the causal tiles a flash kernel computes (`attention.tiled_score_pairs`)


@dataclass(frozen=True)
class Software:
    """How the training code runs a step, where implementations differ.

    attention: "flash" or "materialized" scores; dropout: the model has dropout after attention
    probabilities and before both residual adds (a 1-byte mask each); grad_dtype: the dtype the
    gradients are reduced in; overlap_grad_reduce: the data-parallel reduction runs during the
    backward (buckets of `bucket_bytes`); scatter_gather: a pipeline send goes out as 1/tp of the
    activation from every TP rank and is all-gathered in the next node (Narayanan et al. 2021,
    section 4.1); optimizer_bytes: bytes the optimizer step reads and writes per parameter."""

    name: str
    attention: str = "flash"
    dropout: bool = False
    grad_dtype: str = "fp32"
    overlap_grad_reduce: bool = True
    bucket_bytes: float = 25e6  # PyTorch DDP's default bucket_cap_mb = 25
    scatter_gather: bool = True
    optimizer_bytes: float = 34.0  # fused Adam: grad 4, master/m/v 8 each, bf16 copy 2, norm 4

    def __post_init__(self) -> None:
        checks.choice(self.attention, "attention", ATTENTION_KINDS)
        checks.choice(self.dropout, "dropout", (True, False))
        checks.choice(self.overlap_grad_reduce, "overlap_grad_reduce", (True, False))
        checks.choice(self.scatter_gather, "scatter_gather", (True, False))
        bytes_per_element(self.grad_dtype)
        checks.positive(self.bucket_bytes, "bucket_bytes")
        checks.positive(self.optimizer_bytes, "optimizer_bytes")


MODERN = Software("modern (FlashAttention, no dropout, fp32 gradient reduction, overlapped)")
"""A 2024 stack: Megatron-Core / torchtitan with FlashAttention and fused Adam."""
MEGATRON_2021 = Software(
    "Megatron-LM 2021 (materialized scores, dropout 0.1, fp16 gradients)",
    attention="materialized", dropout=True, grad_dtype="fp16", overlap_grad_reduce=True,
    optimizer_bytes=54.0)
"""Megatron-LM as the SC21 paper ran it: scores written out (fused scale-mask-softmax), dropout
0.1 on the probabilities and hidden states, fp16 gradients (no fp32 accumulation flag), the
fp16 optimizer's extra passes (copy to fp32, inf check, unscale, norm, Adam, copy back: ~54 B
per parameter). Its DDP ("torch" or "local") sets overlap_grad_reduce per run."""


@dataclass(frozen=True)
class Gemm:
    """One GEMM C[M, N] = A[M, K] B[K, N] (`batch` of them), bytes per element of A, B and C
    (C read and written when it accumulates), and whether it is a linear layer's (fp8-able)."""

    name: str
    m: int
    n: int
    k: int
    batch: int = 1
    a_bytes: float = 2.0
    b_bytes: float = 2.0
    c_bytes: float = 2.0

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    @property
    def bytes(self) -> float:
        return self.batch * (self.m * self.k * self.a_bytes + self.k * self.n * self.b_bytes
                             + self.m * self.n * self.c_bytes)


def tile_count(m: int, n: int, tile: tuple[int, int]) -> int:
    """ceil(M / b_m) x ceil(N / b_n): the output tiles of one GEMM."""
    return math.ceil(m / tile[0]) * math.ceil(n / tile[1])


def wave_efficiency(tiles: int, sms: int) -> float:
    """T / (S ceil(T / S)): the share of the waves' SM slots that hold a tile."""
    checks.positive_ints(tiles=tiles, sms=sms)
    return tiles / (sms * math.ceil(tiles / sms))


def gemm_time_s(g: Gemm, acc: hardware.Accelerator, peak: float,
                c: hardware.StepConstants) -> float:
    """Tiles in waves at peak x gemm_fraction, or the bytes at HBM x hbm_fraction if longer; the
    best tile shape of `hardware.GEMM_TILES` (cuBLAS picks among its kernels)."""
    sms = acc.sm_count or 1
    per_tile = sms / (peak * c.gemm_fraction)  # seconds per FLOP of one SM's tile
    compute = min(math.ceil(g.batch * tile_count(g.m, g.n, t) / sms) * 2 * t[0] * t[1] * g.k
                  for t in hardware.GEMM_TILES) * per_tile
    return max(compute, g.bytes / (acc.hbm_bytes_per_s * c.hbm_fraction))


def _backward(g: Gemm, grad_c_bytes: float = 8.0) -> tuple[Gemm, Gemm]:
    """A linear's data gradient dX = dY W^T (M x K, inner N) and weight gradient dW = X^T dY
    (K x N, inner M), accumulated into fp32 main gradients (C read and written: 8 bytes)."""
    dgrad = Gemm(g.name + ".dgrad", g.m, g.k, g.n, g.batch, g.c_bytes, g.b_bytes, g.a_bytes)
    wgrad = Gemm(g.name + ".wgrad", g.k, g.n, g.m, g.batch, g.a_bytes, g.c_bytes, grad_c_bytes)
    return dgrad, wgrad


@dataclass(frozen=True)
class _Shape:
    """The sizes of one block on one device and one micro-batch."""

    tokens: int  # T = micro_batch x seq / cp
    b: int
    s_q: int
    s_k: int
    h: int
    tp: int
    heads: int  # query heads on this rank
    kv: int  # key/value heads on this rank (replicated when tp > kv heads)
    d_head: int
    ffn_out: int  # columns of the first MLP GEMM on this rank (2 d_ff / tp for SwiGLU)
    ffn_in: int  # rows of the second: d_ff / tp
    sp: bool


def _block_shape(cfg, *, tp: int, cp: int, micro_batch: int, seq: int, sp: bool) -> _Shape:
    """One block's sizes on one of `tp` x `cp` ranks for one micro-batch."""
    h, a = cfg.d_model, cfg.n_heads
    kv = getattr(cfg, "kv_heads", a)
    up = (2 if getattr(cfg, "mlp", "swiglu") == "swiglu" else 1) * cfg.d_ff // tp
    return _Shape(micro_batch * seq // cp, micro_batch, seq // cp, seq, h, tp, a // tp,
                  kv // tp if kv % tp == 0 else 1, h // a, up, cfg.d_ff // tp, sp)


def _head_gemm(cfg, tokens: int, tp: int, e: float) -> Gemm:
    """The output head's forward GEMM on one TP rank (its vocabulary shard, rounded up)."""
    return Gemm("lm_head", tokens, -(-cfg.vocab_size // tp), cfg.d_model, 1, e, e)


def forward_gemms(cfg, *, micro_batch: int, seq: int, tp: int = 1, cp: int = 1,
                  dtype: str = "bf16", ep: int = 1) -> list[Gemm]:
    """The forward GEMMs `step_time` prices for one block on one rank and one micro-batch, then
    the output head's: M = micro_batch x seq / cp tokens, N and K the rank's shard (attention's
    score GEMMs aside). What `experiments.gemm_shapes` measures on a GPU."""
    checks.positive_ints(micro_batch=micro_batch, seq=seq, tp=tp, cp=cp, ep=ep)
    for name, size in (("n_heads", cfg.n_heads), ("d_ff", cfg.d_ff)):
        if size % tp:
            raise ValueError(f"{name} ({size}) is not divisible by tp ({tp})")
    if seq % cp:
        raise ValueError(f"seq ({seq}) is not divisible by cp ({cp})")
    e = float(bytes_per_element(dtype))
    shape = _block_shape(cfg, tp=tp, cp=cp, micro_batch=micro_batch, seq=seq, sp=False)
    return [*_layer_gemms(cfg, shape, e, ep), _head_gemm(cfg, shape.tokens, tp, e)]


def _layer_gemms(cfg, s: _Shape, lin_bytes: float, ep: int = 1) -> list[Gemm]:
    """The linear layers' forward GEMMs of one block (dense MLP or experts) on one device."""
    T, h, dh = s.tokens, s.h, s.d_head
    e = lin_bytes
    out = [Gemm("qkv", T, (s.heads + 2 * s.kv) * dh, h, 1, e, e),
           Gemm("o_proj", T, h, s.heads * dh, 1, e, e)]
    if getattr(cfg, "n_experts", 0):
        k, n_exp = cfg.experts_per_token, cfg.n_experts
        f = cfg.expert_d_ff
        gated = 2 if cfg.mlp == "swiglu" else 1
        out.append(Gemm("router", T, n_exp, h, 1, 2.0, 2.0))
        routed = T * k  # tokens x experts per token this rank computes (balanced routing)
        local = max(1, n_exp // ep)
        per = max(1, round(routed / local))
        out += [Gemm("expert.w_in", per, gated * f // s.tp, h, local, e, e),
                Gemm("expert.w_out", per, h, f // s.tp, local, e, e)]
        if cfg.n_shared_experts:
            fs = cfg.n_shared_experts * f
            out += [Gemm("shared.w_in", T, gated * fs // s.tp, h, 1, e, e),
                    Gemm("shared.w_out", T, h, fs // s.tp, 1, e, e)]
        return out
    return out + [Gemm("mlp.w_in", T, s.ffn_out, h, 1, e, e),
                  Gemm("mlp.w_out", T, h, s.ffn_in, 1, e, e)]


def _attention_gemms(s: _Shape) -> tuple[list[Gemm], list[Gemm]]:
    """Materialized attention: S = Q K^T and O = P V per head as batched GEMMs (forward), and
    the backward's dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q."""
    n = s.b * s.heads
    fwd = [Gemm("scores", s.s_q, s.s_k, s.d_head, n), Gemm("values", s.s_q, s.d_head, s.s_k, n)]
    bwd = [Gemm("d_probs", s.s_q, s.s_k, s.d_head, n), Gemm("d_values", s.s_k, s.d_head, s.s_q, n),
           Gemm("d_query", s.s_q, s.d_head, s.s_k, n), Gemm("d_keys", s.s_k, s.d_head, s.s_q, n)]
    return fwd, bwd


def _elementwise_bytes(cfg, s: _Shape, sw: Software, e: float) -> tuple[float, float, float]:
    """Bytes of one block's non-matmul kernels on one device: (forward, backward, the attention
    core's share of the forward). Per token: each norm reads and writes the stream (2 h e; its
    backward reads dy and x and writes dx: 3); the residual add (with its bias and dropout) reads
    2 and writes 1 (+ a 1-byte mask; backward 3 + mask); the activation reads and writes the MLP's
    hidden (GeLU 2 f e, backward 3; SwiGLU 3, backward 5); RoPE reads and writes q and k. Per
    score (materialized): softmax reads and writes (backward 3), dropout reads, writes and keeps a
    mask (backward 2 and the mask). The stream is h / tp wide with sequence parallelism."""
    T = s.tokens
    stream = T * s.h / (s.tp if s.sp else 1)
    mask = 1.0 if sw.dropout else 0.0
    gated = getattr(cfg, "mlp", "swiglu") == "swiglu"
    hidden = T * s.ffn_in * (getattr(cfg, "experts_per_token", 0) or 1)
    fwd = 2 * 2 * stream * e + 2 * (3 * e + mask) * stream + (3 if gated else 2) * hidden * e
    bwd = 2 * 3 * stream * e + 2 * (3 * e + mask) * stream + (5 if gated else 3) * hidden * e
    if getattr(cfg, "positions", "rope") == "rope":
        qk = T * (s.heads + s.kv) * s.d_head
        fwd += 2 * qk * e
        bwd += 2 * qk * e
    core = 0.0
    if sw.attention == "materialized":
        scores = s.b * s.heads * s.s_q * s.s_k
        core = scores * (2 * e + (2 * e + mask if sw.dropout else 0))
        fwd += core
        bwd += scores * (3 * e + (2 * e + mask if sw.dropout else 0))
    return fwd, bwd, core


def collective_s(kind: str, message_bytes: float, link: hardware.Link, n: int,
                 c: hardware.StepConstants, *, crosses: bool) -> float:
    """Alpha-beta time of one collective of `message_bytes` over n ranks on `link`: steps x
    alpha (the inter-node latency when the group `crosses` nodes) + bus bytes / (link x
    nccl_fraction)."""
    if n <= 1 and kind != "send_recv":
        return 0.0
    cost = collective_cost(kind, message_bytes, n)
    alpha = c.inter_latency_s if crosses else c.intra_latency_s
    return cost.steps * alpha + cost.bus_bytes / (link.bytes_per_s * c.nccl_fraction)


@dataclass(frozen=True)
class StepBreakdown:
    """One step on the busiest device, in seconds, and its FLOPs (whole step, all devices)."""

    compute_s: float  # GEMMs + non-matmul + attention of every micro-batch, recompute included
    recompute_s: float  # the part of compute_s that is recomputation
    bubble_s: float
    optimizer_s: float
    exposed_s: dict[str, float] = field(default_factory=dict)  # per axis, after overlap
    communication_s: dict[str, float] = field(default_factory=dict)  # per axis, before overlap
    model_flops: float = 0.0  # no recomputation (MFU)
    hardware_flops: float = 0.0  # with recomputation (HFU)
    devices: int = 1
    peak_flop_per_s: float = 1.0
    microbatches: int = 1

    @property
    def step_s(self) -> float:
        return self.compute_s + self.bubble_s + self.optimizer_s + sum(self.exposed_s.values())

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.step_s * self.devices * self.peak_flop_per_s)

    @property
    def hfu(self) -> float:
        return self.hardware_flops / (self.step_s * self.devices * self.peak_flop_per_s)

    def as_dict(self) -> dict[str, float]:
        return {"compute_s": self.compute_s, "recompute_s": self.recompute_s,
                "bubble_s": self.bubble_s, "optimizer_s": self.optimizer_s,
                **{f"exposed_{k}_s": v for k, v in self.exposed_s.items()}}


def _check(cfg, dims, batch, seq, micro_batch, virtual_stages, recompute, dtype, zero, ep,
           sequence_parallel) -> int:
    if not isinstance(dims, ParallelDims):
        raise TypeError(f"dims must be a ParallelDims, got {type(dims).__name__}")
    checks.positive_ints(batch=batch, seq=seq, micro_batch=micro_batch,
                         virtual_stages=virtual_stages, ep=ep)
    checks.choice(recompute, "recompute", RECOMPUTE)
    checks.choice(dtype, "dtype", DTYPES)
    checks.choice(zero, "zero", (0, 1, 2))
    checks.choice(sequence_parallel, "sequence_parallel", (True, False))
    if batch % (dims.dp * micro_batch):
        raise ValueError(f"batch ({batch}) is not divisible by dp x micro_batch = {dims.dp} x "
                         f"{micro_batch}")
    if seq % dims.cp:
        raise ValueError(f"seq ({seq}) is not divisible by cp ({dims.cp})")
    if virtual_stages > 1 and (dims.pp == 1 or cfg.n_layers < dims.pp * virtual_stages):
        raise ValueError(f"virtual_stages ({virtual_stages}) > 1 needs pp > 1 and pp x "
                         f"virtual_stages <= n_layers ({cfg.n_layers})")
    if ep > 1 and (not getattr(cfg, "n_experts", 0) or cfg.n_experts % ep
                   or (dims.dp * dims.cp) % ep):
        raise ValueError(f"ep ({ep}) must divide n_experts and dp x cp ({dims.dp * dims.cp})")
    for name, size in (("n_heads", cfg.n_heads), ("d_ff", cfg.d_ff)):
        if size % dims.tp:
            raise ValueError(f"{name} ({size}) is not divisible by tp ({dims.tp})")
    return batch // (dims.dp * micro_batch)


def step_time(cfg, cluster: hardware.Cluster, dims: ParallelDims, *, batch: int, seq: int,
              micro_batch: int, virtual_stages: int = 1, recompute: str = "none",
              sequence_parallel: bool = True, dtype: str = "bf16", zero: int = 0, ep: int = 1,
              software: Software = MODERN,
              constants: hardware.StepConstants | None = None) -> StepBreakdown:
    """The breakdown of one training step of `batch` global sequences of `seq` tokens (module
    docstring); `zero` shards the dp_replicate copies' optimizer state (1) and gradients (2);
    dp_shard is always ZeRO-3 (FSDP)."""
    m = _check(cfg, dims, batch, seq, micro_batch, virtual_stages, recompute, dtype, zero, ep,
               sequence_parallel)
    c = constants or hardware.STEP_CONSTANTS
    if not isinstance(c, hardware.StepConstants):
        raise TypeError(f"constants must be a hardware.StepConstants, got {type(c).__name__}")
    acc, tp, p, v = cluster.accelerator, dims.tp, dims.pp, virtual_stages
    act = "bf16" if dtype == "fp8" else dtype
    e = float(bytes_per_element(act))
    peak = acc.peak_flop_per_s(act)
    lin_peak = acc.peak_flop_per_s(dtype)
    lin_e = 1.0 if dtype == "fp8" else e
    h, a, L = cfg.d_model, cfg.n_heads, cfg.n_layers
    dh = h // a
    sp = sequence_parallel and tp > 1
    T = micro_batch * seq // dims.cp
    shape = _block_shape(cfg, tp=tp, cp=dims.cp, micro_batch=micro_batch, seq=seq, sp=sp)
    hbm = acc.hbm_bytes_per_s * c.hbm_fraction

    # --- one block, one micro-batch: forward and backward compute ---
    lin = _layer_gemms(cfg, shape, lin_e, ep)
    fwd_lin = sum(gemm_time_s(g, acc, lin_peak if g.name != "router" else peak, c) for g in lin)
    bwd_lin = sum(gemm_time_s(x, acc, lin_peak if g.name != "router" else peak, c)
                  for g in lin for x in _backward(g))
    if dtype == "fp8":  # casts of the bf16 inputs (read 2, write 1) and an amax pass (read 2)
        cast = sum(g.batch * (g.m * g.k + g.k * g.n) for g in lin if g.name != "router")
        grad_cast = sum(g.batch * g.m * g.n for g in lin if g.name != "router")
        fwd_lin += 5 * cast / hbm
        bwd_lin += 5 * grad_cast / hbm
    elem_f, elem_b, core_elem = _elementwise_bytes(cfg, shape, software, e)
    if software.attention == "materialized":
        af, ab = _attention_gemms(shape)
        att_f = sum(gemm_time_s(g, acc, peak, c) for g in af)
        att_b = sum(gemm_time_s(g, acc, peak, c) for g in ab)
    else:
        fl = tiled_attention_forward_flops(micro_batch, shape.heads, shape.s_q, shape.s_k, dh,
                                           block_q=FLASH_BLOCK, block_k=FLASH_BLOCK, causal=True)
        rate = peak * hardware.flash_fraction(acc)
        att_f, att_b = fl / rate, fl * FLASH_BACKWARD_MATMULS / 2 / rate
    core_f = att_f + core_elem / hbm
    fwd = fwd_lin + att_f + elem_f / hbm
    bwd = bwd_lin + att_b + elem_b / hbm
    recomp = {"none": 0.0, "selective": core_f, "full": fwd}[recompute]

    # --- collectives of one block and micro-batch ---
    def group(*axes):  # rank 0's group along adjacent mesh axes: n ranks, `stride` apart
        n = math.prod(getattr(dims, a) for a in axes)
        inner = MESH_AXES[max(MESH_AXES.index(a) for a in axes) + 1:]
        stride = math.prod(getattr(dims, a) for a in inner)
        if n == 1:
            return cluster.intra_node, 1, False
        return cluster.ring_link(n, stride=stride), n, (n - 1) * stride >= cluster.per_node

    tp_link, _, tp_x = group("tp")
    stream = T * h * e
    per_ar = (2 * collective_s("all_gather", stream, tp_link, tp, c, crosses=tp_x) if sp else
              collective_s("all_reduce", stream, tp_link, tp, c, crosses=tp_x))
    tp_block = per_ar * (2 + 2 + (2 if recompute == "full" else 0))
    ep_block = 0.0
    if ep > 1:
        ep_ranks = [i * tp for i in range(ep)]
        link = cluster.group_link(ep_ranks)
        x = ep_ranks[-1] // cluster.per_node != 0
        msg = T * cfg.experts_per_token * h * e
        n_a2a = 4 + (2 if recompute == "full" else 0)
        ep_block = n_a2a * collective_s("all_to_all", msg, link, ep, c, crosses=x)
    cp_block = cp_hidden = 0.0
    if dims.cp > 1:
        cp_link, _, cp_x = group("cp")
        kvb = T * shape.kv * dh * e
        hops = (dims.cp - 1) * (2 if recompute == "full" else 1)
        cp_block = (hops * collective_s("send_recv", 2 * kvb, cp_link, 2, c, crosses=cp_x)
                    + (dims.cp - 1) * collective_s("send_recv", 2 * kvb, cp_link, 2, c,
                                                   crosses=cp_x)
                    + dims.cp * collective_s("send_recv", 2 * kvb * 2, cp_link, 2, c,
                                             crosses=cp_x))
        cp_hidden = att_f * (2 if recompute == "full" else 1) + att_b

    # --- the busiest stage ---
    per_stage = -(-L // (p * v)) * v  # the busiest stage's blocks: v chunks, rounded up
    head = _head_gemm(cfg, T, tp, e)
    head_t = gemm_time_s(head, acc, peak, c) + sum(gemm_time_s(g, acc, peak, c)
                                                   for g in _backward(head))
    logits = T * head.n
    head_t += logits * (2 + 4 * 5 + 4 + 2) / hbm  # to fp32, softmax passes, grad, back to 16-bit
    head_t += 2 * collective_s("all_reduce", T * 4 * 3, tp_link, tp, c, crosses=tp_x)
    embed_t = (T * h * e * (3 if getattr(cfg, "positions", "rope") == "learned" else 2)
               + T * h * 4 * 2) / hbm  # gather (+ positions) forward; scatter-add backward
    edges = head_t + embed_t if p == 1 else max(head_t, embed_t)
    compute_mb = per_stage * (fwd + bwd + recomp) + edges
    recompute_mb = per_stage * recomp
    tp_mb = per_stage * tp_block + (2 * per_ar if sp else 0.0)
    ep_mb = per_stage * ep_block
    cp_mb = per_stage * max(0.0, cp_block - cp_hidden)

    pp_mb = 0.0
    if p > 1:
        link = cluster.send_link(dims.span("pp"))
        crosses = dims.span("pp") > cluster.per_node
        split = tp if (software.scatter_gather or sp) else 1
        send = collective_s("send_recv", stream / split, link, 2, c, crosses=crosses)
        if software.scatter_gather and not sp and tp > 1:
            send += collective_s("all_gather", stream, tp_link, tp, c, crosses=tp_x)
        pp_mb = 2 * v * send

    # --- parameters on this device, data parallelism and the optimizer ---
    params = _stage_params(cfg, per_stage, tp, ep, first_and_last=(p == 1))
    fsdp = dims.fsdp
    ge = float(bytes_per_element(software.grad_dtype))
    comm = {a: 0.0 for a in AXES}
    exposed = {a: 0.0 for a in AXES}
    bwd_last = per_stage * (bwd + recomp)
    if fsdp > 1:
        f_link, f_n, f_x = group("dp_shard", "cp")
        block = _stage_params(cfg, 1, tp, ep, first_and_last=False, blocks_only=True)
        gathers = 2 * per_stage
        ag = collective_s("all_gather", block * e, f_link, f_n, c, crosses=f_x)
        rs = collective_s("reduce_scatter", block * ge, f_link, f_n, c, crosses=f_x)
        mb = gathers * ag + per_stage * rs
        comm["fsdp"] = m * mb
        exposed["fsdp"] = m * max(0.0, mb - compute_mb) + ag + rs
    shard = params / fsdp
    r = dims.dp_replicate
    if r > 1:
        r_link, _, r_x = group("dp_replicate")
        msg = shard * ge
        if zero == 0:
            red = collective_s("all_reduce", msg, r_link, r, c, crosses=r_x)
            gather = 0.0
        else:
            red = collective_s("reduce_scatter", msg, r_link, r, c, crosses=r_x)
            gather = collective_s("all_gather", shard * e, r_link, r, c, crosses=r_x)
        last = red * min(1.0, software.bucket_bytes / msg) if msg else 0.0
        hidden = bwd_last if software.overlap_grad_reduce else 0.0
        comm["dp"] = red + gather
        exposed["dp"] = max(last, red - hidden) + gather
    tied = getattr(cfg, "tie_embeddings", False)
    if tied and p > 1:  # the first and last stages add their copies' gradients
        link = cluster.send_link(dims.span("pp"))
        emb = collective_s("all_reduce", cfg.vocab_size * h / tp * ge, link, 2, c,
                           crosses=dims.span("pp") > cluster.per_node)
        comm["pp"] += emb
        exposed["pp"] += emb
    opt_params = shard / (r if zero >= 1 else 1)
    optimizer = opt_params * software.optimizer_bytes / hbm

    comm["tp"] += m * tp_mb
    exposed["tp"] += m * tp_mb
    comm["ep"] = exposed["ep"] = m * ep_mb
    comm["cp"] = m * per_stage * cp_block
    exposed["cp"] = m * cp_mb
    comm["pp"] += m * pp_mb
    exposed["pp"] += m * pp_mb
    bubble = (p - 1) / v * (compute_mb + tp_mb + ep_mb + cp_mb)

    model, hw = step_flops(cfg, batch=batch, seq=seq, recompute=recompute)
    return StepBreakdown(m * compute_mb, m * recompute_mb, bubble, optimizer, exposed, comm,
                         model, hw, dims.world_size, peak, m)


def _stage_params(cfg, n_blocks: int, tp: int, ep: int, *, first_and_last: bool,
                  blocks_only: bool = False) -> float:
    """Parameters one device of a stage of `n_blocks` holds (TP-split matrices, experts over
    ep); the embedding and head on the busiest edge stage unless `blocks_only`."""
    h, f, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
    dh = h // cfg.n_heads
    kv = getattr(cfg, "kv_heads", cfg.n_heads)
    gated = getattr(cfg, "mlp", "swiglu") == "swiglu"
    attn = h * (cfg.n_heads + 2 * kv) * dh + cfg.n_heads * dh * h
    if getattr(cfg, "n_experts", 0):
        fe = cfg.expert_d_ff
        ffn = ((cfg.n_experts / ep + cfg.n_shared_experts) * (3 if gated else 2) * h * fe
               + h * cfg.n_experts * tp)
    else:
        ffn = (3 if gated else 2) * h * f
    block = (attn + ffn) / tp + 4 * h
    if blocks_only:
        return block
    vocab = V * h / tp
    edge = 2 * vocab if first_and_last and not getattr(cfg, "tie_embeddings", False) else vocab
    return n_blocks * block + edge


def step_flops(cfg, *, batch: int, seq: int, recompute: str = "none") -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) of one step, the book's convention (`accounting.flops`:
    every GEMM 2 MNK, attention scores over the full seq x seq): model = forward + backward of
    every GEMM (3 x forward); hardware adds the recomputed forward: the blocks' GEMMs and
    attention ("full") or the attention core ("selective"); the head is never recomputed."""
    checks.choice(recompute, "recompute", RECOMPUTE)
    T = batch * seq
    h, a = cfg.d_model, cfg.n_heads
    kv = getattr(cfg, "kv_heads", a)
    gated = getattr(cfg, "mlp", "swiglu") == "swiglu"
    s = _Shape(T, batch, seq, seq, h, 1, a, kv, h // a, (2 if gated else 1) * cfg.d_ff,
               cfg.d_ff, False)
    lin = _layer_gemms(cfg, s, 2.0)
    if getattr(cfg, "n_experts", 0):  # every token through its k experts, exactly
        k, f = cfg.experts_per_token, cfg.expert_d_ff
        lin = [g for g in lin if not g.name.startswith("expert")]
        lin += [Gemm("expert.w_in", T * k, (2 if gated else 1) * f, h),
                Gemm("expert.w_out", T * k, h, f)]
    block_lin = sum(g.flops for g in lin)
    core = 4 * batch * seq * seq * h  # Q K^T and P V over every head
    head = 2 * T * h * cfg.vocab_size
    forward_blocks = cfg.n_layers * (block_lin + core)
    model = 3 * (forward_blocks + head)
    extra = {"none": 0, "selective": cfg.n_layers * core, "full": forward_blocks}[recompute]
    return float(model), float(model + extra)


def megatron_flops(cfg, *, batch: int, seq: int) -> float:
    """Narayanan et al. 2021, Eq. 3: 96 B s l h^2 (1 + s / (6 h) + V / (16 l h)) FLOPs a step, for
    a GPT with d_ff = 4 h, counting full recomputation: the convention of their Table 1."""
    B, s, L, h, V = batch, seq, cfg.n_layers, cfg.d_model, cfg.vocab_size
    return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
