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

Pure: configs, ints and dtype names in, numbers and frozen dataclasses out. Used in: chapter 05.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlsys import checks
from mlsys.accounting.attention import BACKENDS, attention_saved_tensors
from mlsys.accounting.memory import tensor_bytes
from mlsys.accounting.params import config_sizes
from mlsys.dtypes import canonical

FLOAT_DTYPES = ("fp64", "fp32", "bf16", "fp16")
"""Dtypes the model can be cast to (parameters and activations)."""
ATTENTION = BACKENDS
"""Attention backends with a saved-tensor formula (`mlsys.models.attention`): every backend of
`mlsys.models.config.ATTENTION_BACKENDS`."""
BLOCK_COMPONENTS = ("attn_norm", "qkv_input", "rope", "attention", "o_proj_input", "ffn_norm",
                    "ffn_input", "w1_output", "w3_output", "silu_output", "w2_input", "residual")
"""The parts of a block, in forward order; "rope" and "residual" save nothing new."""


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
        less the segment input where the first norm saves x itself (fp32, fp64: the checkpoint
        holds it already); 0 without."""
        if self.checkpoint_segment is None:
            return 0
        blocks = min(self.checkpoint_segment, self.n_layers) * self.block_bytes
        input_is_kept = _wide(self.dtype) == self.dtype  # the norm keeps x itself (fp32, fp64)
        return blocks - (self.segment_input.nbytes if input_is_kept else 0)

    @property
    def peak_bytes(self) -> int:
        """total_bytes + recompute_bytes: a bound on the saved bytes alive at once (in backward the
        head's and loss's tensors are freed before the first segment is recomputed)."""
        return self.total_bytes + self.recompute_bytes


def _wide(dtype: str) -> str:
    """The dtype promoted with fp32: what RMSNorm computes in and SDPA's logsumexp is stored in."""
    return "fp64" if dtype == "fp64" else "fp32"


def _rmsnorm(component: str, rows: tuple[int, ...], d: int, dtype: str) -> tuple[SavedTensor, ...]:
    wide = _wide(dtype)
    x = "x" if wide == dtype else f"x up-cast to {wide}"
    return (SavedTensor(component, x, (*rows, d), wide),
            SavedTensor(component, "1/rms", (*rows, 1), wide),
            SavedTensor(component, "x/rms", (*rows, d), wide))


def _block_tensors(cfg, batch: int, seq: int, *, dtype: str,
                   attention: str) -> tuple[SavedTensor, ...]:
    """The tensors one block saves, in forward order (the module docstring's list)."""
    d, h, f = config_sizes(cfg, "d_model", "n_heads", "d_ff")
    rows = (batch, seq)
    # q, k after RoPE; v the projection's output (naive: copied contiguous by the matmul)
    core = attention_saved_tensors(batch, h, seq, seq, d // h, dtype, backend=attention)
    # fused backends keep their output; merging the heads copies it unless heads or seq is 1
    merged = () if attention != "naive" and 1 in (h, seq) else (
        SavedTensor("o_proj_input", "heads merged (a copy)", (*rows, d), dtype),)
    hidden = (*rows, f)
    return (
        *_rmsnorm("attn_norm", rows, d, dtype),
        SavedTensor("qkv_input", "normed x, read by q, k and v", (*rows, d), dtype),
        *(SavedTensor("attention", *spec) for spec in core),
        *merged,
        *_rmsnorm("ffn_norm", rows, d, dtype),
        SavedTensor("ffn_input", "normed x, read by w1 and w3", (*rows, d), dtype),
        SavedTensor("w1_output", "w1 x (silu's input)", hidden, dtype),
        SavedTensor("w3_output", "w3 x", hidden, dtype),
        SavedTensor("silu_output", "silu(w1 x)", hidden, dtype),
        SavedTensor("w2_input", "silu(w1 x) * w3 x", hidden, dtype),
    )


def _outside_tensors(cfg, batch: int, seq: int, *, dtype: str) -> tuple[SavedTensor, ...]:
    """What the model and loss save outside the blocks (the module docstring's list)."""
    d, vocab = config_sizes(cfg, "d_model", "vocab_size")
    rows = (batch, seq)
    targets = () if 1 in (batch, seq) else (  # tokens[:, 1:] is contiguous only then
        SavedTensor("loss", "targets, flattened (a copy)", (batch * seq,), "int64"),)
    return (
        SavedTensor("embedding", "token ids: the whole batch", (batch, seq + 1), "int64"),
        *_rmsnorm("final_norm", rows, d, dtype),
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
        segment_input=SavedTensor("checkpoint", "segment input", (batch, seq, d), dtype))


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
