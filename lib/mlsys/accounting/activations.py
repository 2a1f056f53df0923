"""Bytes autograd saves for backward in the book's transformer, tensor by tensor.

The count is of `next_token_loss(model, tokens)` (`mlsys.training`): tokens (batch, seq + 1)
int64, the model in one dtype (its parameters'), the loss in fp32. Write b for that dtype's bytes,
w for the bytes of the "wide" dtype (fp32, or fp64 for an fp64 model: RMSNorm's arithmetic and
SDPA's logsumexp), B = batch, S = seq, N = B S tokens, D = d_model, F = d_ff, H = n_heads,
V = vocab_size.
One block saves, each storage once (views of one storage, such as the single input that q, k and
v read, are one tensor; parameters and the RoPE tables are model state, not counted):

    each RMSNorm     x, x/rms: 2 (N, D) and 1/rms: (N, 1), all in w: in a 16-bit model, x's up-cast
                     copy (the 16-bit x itself is then not kept)         2 N D w + N w
    projections      normed x (read by q, k, v); heads merged (o)        2 N D b
    RoPE             only cos and sin (buffers): nothing new              0
    attention naive  q, k after RoPE, v copied contiguous: 3 N D b; softmax(QK^T) (B, H, S, S) in b;
                     the causal mask (S, S) bool, 1 byte each: B H S^2 b + S^2
    attention sdpa   q, k, v, output: 4 N D b; logsumexp (B, H, S) in w: no S x S matrix
                     (CPU runs the flash kernel; on the meta device SDPA takes the math path)
    flash_torch,     the same as sdpa: q, k, v, O and L, saved by their autograd Functions
    flash_triton     (`mlsys.accounting.attention.attention_saved_tensors`, one list for all)
    SwiGLU           normed x; w1 x, w3 x, silu(w1 x), their product: 4 (N, F)   N D b + 4 N F b
    residual adds    nothing (an fp32 model keeps the stream as the norms' x)    0

So a naive fp32 block saves 10 N D + 4 N F + 2 N elements of 4 bytes, plus B H S^2 fp32 and S^2
bytes; sdpa: 11 N D + 4 N F + 2 N + B H S (fp32). Outside the blocks: the token ids (the whole
(batch, seq + 1) batch, int64: the embedding keeps a view of it), the final RMSNorm (as above), the
head's input N D b, the log-probabilities (N, V) fp32, the flattened targets N int64 (a copy; a
view of the batch when batch or seq is 1) and a 0-d fp32 weight of the loss. Exact: the tests
compare every preset and backend with `mlsys.counters.SavedTensors`, on the meta device
(naive) and on the CPU (sdpa, flash_torch, flash_triton under Triton's interpreter). On CUDA,
expected but not checked here (no GPU): SDPA's flash kernel also keeps two small RNG-state
tensors, and its output is laid out (B, S, H, d_head), so merging the heads is a view there, one
N D b less.

The other shapes of `TransformerConfig` (each checked against the counter like the above):

    grouped-query    the same as multi-head attention: the key/value heads are repeated for
    (n_kv_heads)     their query heads before the backend, so the backend keeps n_heads of each;
                     the narrower k and v projections and RoPE on them keep nothing. (A kernel
                     that reads the shared heads itself, FlashAttention-2's or SDPA's with
                     enable_gqa, would keep k and v at kv_heads: 2 N D b (1 - kv_heads/n_heads)
                     less per block; not what this model runs.)
    GeLU MLP         normed x; w1 x (GeLU's input), GeLU(w1 x) (w2's input): N D b + 2 N F b
    ReLU MLP         normed x; relu(w1 x), one storage for ReLU's backward and w2's: N D b + N F b
    LayerNorm        x itself in b (no up-cast copy) and its mean and 1/std, (N, 1) each, in w
                     (as CUDA's kernel and the meta device keep them; the CPU kernel keeps those
                     two in b, 2 N (w - b) bytes less, and the CPU tests say so): N D b + 2 N w
    biases           nothing: a linear keeps its input and weight, the bias add nothing
    learned positions nothing: the table's first seq rows are a slice, added to the embedding;
                     without RoPE, SDPA's CPU kernel lays its output out as q is, (B, S, H, d_head),
                     so merging the heads is a view there and the o_proj input no copy (N D b less)
    tied head        nothing changes: the head keeps its input; the weight is model state

The seeds' formulas, counted against this. "~5 B S D + B H S^2 bytes per layer" (a byte-movement
one-pager) counts elements and calls them bytes; it drops the feed-forward it lists just above (a
SwiGLU saves 4 (N, F) tensors: 16 N D at F = 4D, the largest term), the norms and the head
merge, and so has 5 N D where the naive block has 10 N D. Its B H S^2 is right, once, for naive
attention (and 0 with SDPA). A student's 2.7B answer (CS336 assignment 2, memory profiling (d))
counts per layer 7 N D + 3 N F + 2 B H S^2 elements, times 4 bytes: it keeps both the scores and
the softmax (only the softmax is saved; the scaled scores and QK^T are not), the FFN output (the
residual add saves nothing) but misses x/rms of both norms, the shared normed inputs, the
silu-times-w3 product as a fourth (N, F) tensor and the S^2 mask; it leaves out the loss's
(N, V) fp32 log-probabilities, and divides by 2^20 to say "MB". At B=4, S=512 in fp32 it claims
20,352 "MB" (21.3e9 bytes: 8.6e9 of S^2, 12.7e9 linear); this count gives 21.9e9 with naive
attention (4.3e9 of S^2, half the claim's; 17.6e9 linear) and 18.3e9 with SDPA: the total is
close only because the two errors cancel. Its own table disagrees with its formula at S = 128,
256 and 1024.

Activation checkpointing (`mlsys.models.checkpointing.checkpoint_blocks`, segments of k blocks):
the forward keeps only each segment's input, ceil(L / k) (N, D) tensors in b, and the backward
recomputes one segment at a time: `recompute_bytes` (k blocks' tensors, less the segment input
the checkpoint already holds). Memory ~ (L / k) N D b + k * block. A block is r ~ 27 (N, D)
tensors (sdpa, F = 4 D; 34 naive at S = 512), so k = 1 is the cheapest while L < 2 r (every
preset), and the best k ~ sqrt(L / r) stays far below sqrt(L): the "O(sqrt L)" of Chen et al.
(2016) is right as L grows, k proportional to sqrt(L), but k = sqrt(L) is not this model's best.
The FLOPs the recomputation costs are `accounting.recompute`.

One module though over 300 lines: each part's saved-tensor list and the sums over them share the
conventions of the table above, which split files would repeat. Pure: configs, ints and dtype
names in, numbers and frozen dataclasses out. Used in: chapter 05.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlsys import checks
from mlsys.accounting.attention import BACKENDS, attention_saved_tensors
from mlsys.accounting.memory import tensor_bytes
from mlsys.accounting.params import architecture, config_sizes
from mlsys.dtypes import canonical

FLOAT_DTYPES = ("fp64", "fp32", "bf16", "fp16")
"""Dtypes the model can be cast to (parameters and activations)."""
ATTENTION = BACKENDS
"""Attention backends with a saved-tensor formula (`mlsys.models.attention`): every backend of
`mlsys.models.config.ATTENTION_BACKENDS`."""
BLOCK_COMPONENTS = ("attn_norm", "qkv_input", "rope", "attention", "o_proj_input", "ffn_norm",
                    "ffn_input", "w1_output", "w3_output", "silu_output", "w2_input", "residual")
"""The parts of a block, in forward order; "rope" and "residual" save nothing new. A GeLU MLP's
activation input is "w1_output" and its output "w2_input" (no "w3_output", "silu_output"); a ReLU
MLP keeps only "w2_input", its output."""


@dataclass(frozen=True)
class SavedTensor:
    """One storage autograd keeps for backward."""

    component: str  # where it is saved: "attn_norm", "attention", "loss", ...
    what: str  # what it holds
    shape: tuple[int, ...]
    dtype: str  # the book's short name

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.shape, self.dtype)


def _total(tensors: tuple[SavedTensor, ...]) -> int:
    return sum(t.nbytes for t in tensors)


@dataclass(frozen=True)
class ActivationBytes:
    """What one forward of `next_token_loss` keeps for backward, and with checkpointing."""

    batch: int
    seq: int
    n_layers: int
    dtype: str  # the model's
    attention: str
    checkpoint_segment: int | None  # blocks per checkpointed segment; None: no checkpointing
    block: tuple[SavedTensor, ...]  # one block, without checkpointing
    outside: tuple[SavedTensor, ...]  # token ids, final norm, head, loss
    segment_input: SavedTensor  # what a checkpointed segment keeps: its input (N, D)
    norm: str = "rmsnorm"  # the blocks' first norm: LayerNorm keeps x itself in every dtype

    @property
    def n_segments(self) -> int:
        """ceil(n_layers / checkpoint_segment); 0 without checkpointing."""
        k = self.checkpoint_segment
        return 0 if k is None else math.ceil(self.n_layers / k)

    @property
    def block_bytes(self) -> int:
        """One block without checkpointing."""
        return _total(self.block)

    def components(self) -> dict[str, int]:
        """One block's bytes by `BLOCK_COMPONENTS`, zeros included; sums to `block_bytes`."""
        out = dict.fromkeys(BLOCK_COMPONENTS, 0)
        for t in self.block:
            out[t.component] += t.nbytes
        return out

    @property
    def blocks_bytes(self) -> int:
        """What the blocks keep when the forward ends: n_layers blocks, or the segment inputs."""
        if self.checkpoint_segment is None:
            return self.n_layers * self.block_bytes
        return self.n_segments * self.segment_input.nbytes

    @property
    def outside_bytes(self) -> int:
        return _total(self.outside)

    def outside_components(self) -> dict[str, int]:
        """Bytes outside the blocks: embedding (token ids), final_norm, lm_head_input, loss."""
        out: dict[str, int] = {}
        for t in self.outside:
            out[t.component] = out.get(t.component, 0) + t.nbytes
        return out

    @property
    def total_bytes(self) -> int:
        """Everything saved for backward when the forward ends."""
        return self.blocks_bytes + self.outside_bytes

    @property
    def per_sequence_bytes(self) -> float:
        return self.total_bytes / self.batch

    @property
    def per_token_bytes(self) -> float:
        """total / (batch * seq): not a constant, the S^2 terms grow with seq."""
        return self.total_bytes / (self.batch * self.seq)

    @property
    def recompute_bytes(self) -> int:
        """Extra saved during backward with checkpointing: the largest segment's blocks saved again,
        less the segment input where the first norm saves x itself (LayerNorm, or RMSNorm in
        fp32 and fp64: the checkpoint holds it already); 0 without."""
        if self.checkpoint_segment is None:
            return 0
        blocks = min(self.checkpoint_segment, self.n_layers) * self.block_bytes
        input_is_kept = self.norm == "layernorm" or _wide(self.dtype) == self.dtype
        return blocks - (self.segment_input.nbytes if input_is_kept else 0)

    @property
    def peak_bytes(self) -> int:
        """total_bytes + recompute_bytes: a bound on the saved bytes alive at once (in backward the
        head's and loss's tensors are freed before the first segment is recomputed)."""
        return self.total_bytes + self.recompute_bytes


def _wide(dtype: str) -> str:
    """The dtype promoted with fp32: what RMSNorm computes in and SDPA's logsumexp is stored in."""
    return "fp64" if dtype == "fp64" else "fp32"


def _norm(component: str, rows: tuple[int, ...], d: int, dtype: str,
          kind: str = "rmsnorm") -> tuple[SavedTensor, ...]:
    """What one norm keeps: RMSNorm x (up-cast to the wide dtype), 1/rms and x/rms; LayerNorm
    (one fused op) x in the model's dtype, its mean and 1/std in the wide one (as on CUDA)."""
    wide = _wide(dtype)
    if kind == "layernorm":
        return (SavedTensor(component, "x", (*rows, d), dtype),
                SavedTensor(component, "mean", (*rows, 1), wide),
                SavedTensor(component, "1/std", (*rows, 1), wide))
    x = "x" if wide == dtype else f"x up-cast to {wide}"
    return (SavedTensor(component, x, (*rows, d), wide),
            SavedTensor(component, "1/rms", (*rows, 1), wide),
            SavedTensor(component, "x/rms", (*rows, d), wide))


def _mlp(rows: tuple[int, ...], d: int, f: int, dtype: str, kind: str) -> tuple[SavedTensor, ...]:
    """What the feed-forward keeps after its norm: its input, then the hidden (N, F) tensors."""
    hidden = (*rows, f)
    if kind == "swiglu":
        inner = (SavedTensor("w1_output", "w1 x (silu's input)", hidden, dtype),
                 SavedTensor("w3_output", "w3 x", hidden, dtype),
                 SavedTensor("silu_output", "silu(w1 x)", hidden, dtype),
                 SavedTensor("w2_input", "silu(w1 x) * w3 x", hidden, dtype))
    elif kind == "gelu":
        inner = (SavedTensor("w1_output", "w1 x (GeLU's input)", hidden, dtype),
                 SavedTensor("w2_input", "GeLU(w1 x)", hidden, dtype))
    else:  # relu's backward reads its output, the same storage as w2's input
        inner = (SavedTensor("w2_input", "relu(w1 x), read by relu's backward and w2", hidden,
                             dtype),)
    reads = "w1 and w3" if kind == "swiglu" else "w1"
    return (SavedTensor("ffn_input", f"normed x, read by {reads}", (*rows, d), dtype), *inner)


def _block_tensors(cfg, batch: int, seq: int, *, dtype: str,
                   attention: str) -> tuple[SavedTensor, ...]:
    """The tensors one block saves, in forward order (the module docstring's list)."""
    d, h, f = config_sizes(cfg, "d_model", "n_heads", "d_ff")
    arch = architecture(cfg)
    rows = (batch, seq)
    # q, k after RoPE; v the projection's output (naive: copied contiguous by the matmul); with
    # grouped-query attention the same: the backend gets every key/value head repeated
    core = attention_saved_tensors(batch, h, seq, seq, d // h, dtype, backend=attention)
    # fused backends keep their output; merging the heads copies it unless heads or seq is 1, or
    # SDPA's output already has q's (batch, seq, heads, d_head) layout (q not rotated: a view)
    view = attention != "naive" and (1 in (h, seq) or (
        attention == "sdpa" and arch.positions == "learned"))
    merged = () if view else (
        SavedTensor("o_proj_input", "heads merged (a copy)", (*rows, d), dtype),)
    return (
        *_norm("attn_norm", rows, d, dtype, arch.norm),
        SavedTensor("qkv_input", "normed x, read by q, k and v", (*rows, d), dtype),
        *(SavedTensor("attention", *spec) for spec in core),
        *merged,
        *_norm("ffn_norm", rows, d, dtype, arch.norm),
        *_mlp(rows, d, f, dtype, arch.mlp),
    )


def _outside_tensors(cfg, batch: int, seq: int, *, dtype: str) -> tuple[SavedTensor, ...]:
    """What the model and loss save outside the blocks (the module docstring's list)."""
    d, vocab = config_sizes(cfg, "d_model", "vocab_size")
    norm = architecture(cfg).norm
    rows = (batch, seq)
    targets = () if 1 in (batch, seq) else (  # tokens[:, 1:] is contiguous only then
        SavedTensor("loss", "targets, flattened (a copy)", (batch * seq,), "int64"),)
    return (
        SavedTensor("embedding", "token ids: the whole batch", (batch, seq + 1), "int64"),
        *_norm("final_norm", rows, d, dtype, norm),
        SavedTensor("lm_head_input", "normed x", (*rows, d), dtype),
        SavedTensor("loss", "log-probabilities (logits in fp32)", (*rows, vocab), "fp32"),
        *targets,
        SavedTensor("loss", "total weight (0-d)", (), "fp32"),
    )


def _check(cfg, batch: int, seq: int, dtype: object, attention: object) -> tuple[str, str]:
    """Validated (dtype, attention); attention None means cfg.attention."""
    checks.positive_ints(batch=batch, seq=seq)
    (context,) = config_sizes(cfg, "context_length")
    if seq > context:
        raise ValueError(f"seq ({seq}) exceeds cfg.context_length ({context})")
    name = checks.choice(canonical(dtype), "dtype", FLOAT_DTYPES)
    if attention is None:
        checks.attributes(cfg, "cfg", ("attention",), example="e.g. a TransformerConfig")
        attention = cfg.attention
    return name, checks.choice(attention, "attention", ATTENTION)


def saved_bytes(cfg, batch: int, seq: int, *, dtype: str = "fp32", attention: str | None = None,
                checkpoint_segment: int | None = None) -> ActivationBytes:
    """Bytes saved for backward by `next_token_loss` on a (batch, seq + 1) batch.

    `dtype`: the model's ("fp32", "bf16", "fp16", "fp64"); `attention`: a backend of `ATTENTION`
    (default: cfg.attention); `checkpoint_segment`: blocks per checkpointed segment, as
    `mlsys.models.checkpointing.checkpoint_blocks` applies them (None: no checkpointing).
    """
    dtype, attention = _check(cfg, batch, seq, dtype, attention)
    n_layers, d = config_sizes(cfg, "n_layers", "d_model")
    if checkpoint_segment is not None:
        checks.positive_int(checkpoint_segment, "checkpoint_segment")
    return ActivationBytes(
        batch=batch, seq=seq, n_layers=n_layers, dtype=dtype, attention=attention,
        checkpoint_segment=checkpoint_segment,
        block=_block_tensors(cfg, batch, seq, dtype=dtype, attention=attention),
        outside=_outside_tensors(cfg, batch, seq, dtype=dtype),
        segment_input=SavedTensor("checkpoint", "segment input", (batch, seq, d), dtype),
        norm=architecture(cfg).norm)


# --- formulas as the seeds write them, kept so the book can check them ---------------------------


def claimed_layer_bytes(batch: int, seq: int, d_model: int, heads: int) -> int:
    """As a one-pager writes it: "~5 B S D + B H S^2 bytes" per layer (elements, no FFN)."""
    checks.positive_ints(batch=batch, seq=seq, d_model=d_model, heads=heads)
    return 5 * batch * seq * d_model + batch * heads * seq * seq


def claimed_swiglu_layer_elements(batch: int, seq: int, d_model: int, heads: int,
                                  d_ff: int) -> int:
    """As a student's 2.7B answer counts a layer: 7 B S D + 3 B S d_ff + 2 B H S^2 elements (the
    scores and the softmax both; the FFN output; times 4 for fp32 bytes)."""
    checks.positive_ints(batch=batch, seq=seq, d_model=d_model, heads=heads, d_ff=d_ff)
    tokens = batch * seq
    return 7 * tokens * d_model + 3 * tokens * d_ff + 2 * batch * heads * seq * seq
