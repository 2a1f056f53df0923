# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# (sec-attention)=
# # Attention and FlashAttention in Triton
#
# **Question.** One head of attention over {glue:text}`q_seq:,` tokens reads and writes
# {glue:text}`q_io_mb:.1f` MB of queries, keys, values and output, yet naive attention keeps
# {glue:text}`q_before_gb:.2f` GB for its backward and peaks at {glue:text}`q_peak_gb:.2f` GB inside
# it. Where do those bytes come from, and how does a tiled kernel (FlashAttention-2) compute exactly
# the same result and gradients while never storing the $n \times n$ matrices?
#
# Cheat sheet: {doc}`../book/attention_onepager`.

# %% tags=["remove-cell"]
# Colab or a fresh kernel: install the book's library if it is missing (a no-op in the book's own
# environment). Offline, install it from a clone instead: `pip install -e .` at the clone's root.
import importlib
import importlib.util
import subprocess
import sys

MLSYS_SOURCE = "git+https://github.com/mlsys-book/mlsys-book"
if importlib.util.find_spec("mlsys") is None:
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", MLSYS_SOURCE],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        raise RuntimeError(
            f"This chapter needs the book's library `mlsys`, and `pip install {MLSYS_SOURCE}` "
            f"failed (offline?):\n{pip.stderr.strip()[-800:]}\nInstall it from a clone of the "
            "repository (`pip install -e .` at its root), then restart the kernel.")
    importlib.invalidate_caches()

# %% tags=["remove-input"]
from mlsys import env

print(env.describe())

# %% tags=["remove-cell"]
import math

import matplotlib.pyplot as plt
import torch

from mlsys import experiments, hardware, roofline, tables
from mlsys.accounting import attention as attention_cost
from mlsys.accounting import attention_traffic, tiles
from mlsys.book import Table, glue, solved_by
from mlsys.diagrams import tiling
from mlsys.experiments import attention_checks as checks
from mlsys.experiments import attention_model_step, attention_sweep, flash_benchmark, kit, pages
from mlsys.experiments import attention_sweep_seed as sweep_seed
from mlsys.kernels import _triton, aot, compile_predictions, compile_report, compile_tables
from mlsys.kernels.flash_tiles import TILES as FLASH_TILES
from mlsys.models.config import TransformerConfig
from mlsys.ops.attention import attention

# %% tags=["parameters"]
SEED = 0
# Napkin math (nothing measured): the question's head, the block of a preset, the GPUs
Q_SEQ, Q_D = 16_384, 64  # one sequence, one head
PRESET, BATCH, SEQ = "small", 4, 1_024
SPEC = hardware.H100_SXM
SWEEP_BATCH = 8  # the seed's sweep: batch 8, one head, fp32
TILE = 128  # query and key tile of the tiling examples
FLASH_TILE = FLASH_TILES["fwd"][-1]  # (query rows held, key rows streamed): a forward tile
# The diagrams: the tiling's length and head dim, the causal map's length, one row of scores
DRAW_SEQ, DRAW_D, MAP_SEQ, ROW_KEYS, ROW_BLOCK = 512, 64, 1_024, 64, 8  # and its key blocks
# Checks (run live): irregular shapes, (n_q, n_k, d) with n_q != n_k among them
SHAPES = ((1, 1, 16), (37, 37, 32), (29, 61, 16), (61, 29, 32), (100, 100, 64))
# The Triton kernels: the interpreter computes fp16 (not bf16) right; a GPU runs the book's dtypes
# at the head dim of its experiments (tiles compiled for exactly these in `make test`)
TRITON_SHAPES = env.pick(smoke=SHAPES[:4], cpu=SHAPES[:4],
                         gpu=tuple((n_q, n_k, 64) for n_q, n_k, _ in SHAPES[:4]))
TRITON_DTYPES = env.pick(smoke=(torch.float32, torch.float16), cpu=(torch.float32, torch.float16),
                         gpu=(torch.float32, torch.bfloat16))
# Measurements: sizes per profile live with each experiment (lib/mlsys/experiments/)
SWEEP = env.pick(**attention_sweep.SIZES)
BENCH = env.pick(**flash_benchmark.SIZES)
STEP = env.pick(**attention_model_step.SIZES)

# %% [markdown]
# Attention computes, for each query, a softmax-weighted average of the values, the weights coming
# from the query's dot products with every key {cite}`vaswani2017attention`. Written as tensor ops
# it materializes two $n \times n$ matrices per head, the scores and the probabilities; everything
# in this chapter follows from that. The napkin math counts them; the online softmax removes them; a
# Triton kernel {cite}`dao2022flashattention,dao2023flashattention2` does it on a GPU; the
# measurements check each step.
#
# ## Napkin math
#
# ### The block
#
# Multi-head attention projects the normalized input $x$ ($n \times D$) to $Q, K, V$ with three $D
# \times D$ matrices, splits them into $H$ heads of $d = D/H$, computes $O_h =
# \operatorname{softmax}(Q_h K_h^\top/\sqrt{d}\,[+\text{mask}])V_h$ per head, and projects the
# concatenated heads back with a fourth $D \times D$ matrix. For `small` at {glue:text}`blk_tokens`
# tokens per sequence, per layer and batch of {glue:text}`blk_batch`:

# %% tags=["hide-input"]
cfg = TransformerConfig.preset(PRESET)  # the laws are asserted where they are computed
for name, value in {**checks.block_numbers(cfg, BATCH, SEQ), **checks.io_numbers(
        SPEC, 65_536, heads=cfg.n_heads, d_head=cfg.d_head, block_q=TILE)}.items():
    glue(name, value)  # FLOP shares; the IO bound at the table's longest row
Table(*tables.attention_block_table(TransformerConfig.preset(PRESET, context_length=65_536),
                                    (256, 1_024, 4_096, 16_384, 65_536), tile=TILE))

# %% [markdown]
# Parameters: $4D^2$ per layer. FLOPs: the projections cost $8nD^2$, linear in the length; the two
# products with the $n \times n$ scores cost $4n^2D$ (dense; a causal mask does about half of it),
# and overtake the projections from $n = 2D$ = {glue:text}`core_cross` tokens. Bytes (one sequence,
# causal, bf16, the forward alone): the naive sequence of eager ops moves every $n \times n$ matrix
# through memory several times (`naive_attention_ops`), the tiled kernel moves $Q, K, V, O$, reading
# $K$ and $V$ once per query tile of {glue:text}`tile` rows. At {glue:text}`blk_tokens` tokens the
# two $n^2$ matmuls are {glue:text}`blk_core_share:.0f`% of the attention FLOPs of `small`.
#
# ### Bytes: the IO complexity
#
# Why does the last column stop growing? Count accesses to main memory in elements, for one head of
# $N$ tokens and head dim $d$, on a chip that keeps $M$ elements beside its cores (Dao et al.,
# Theorem 2 {cite}`dao2022flashattention`). Standard attention reads $Q, K, V$ and writes $O$,
# $\Theta(Nd)$, and writes $S$ and $P$ and reads them back, $\Theta(N^2)$: $\Theta(Nd + N^2)$. The
# tiled kernel never writes $S$ or $P$; it pays instead by reading $K$ and $V$ again for every
# query tile. How large can a tile be? A program keeps its tile of $Q$, its output accumulator and
# the tiles of $K$ and $V$ it streams on chip, each of $b \times d$ elements, so $b = \Theta(M/d)$:
# the paper takes $B_c = \lceil M/4d \rceil$ key rows and $B_r = \min(B_c, d)$ query rows. One H100
# SM's {glue:text}`io_smem_kib:.0f` KiB of shared memory hold $M$ = {glue:text}`io_m:,` bf16
# elements: $B_c$ = {glue:text}`io_block_c` and $B_r$ = {glue:text}`io_block_r` at $d$ =
# {glue:text}`io_d`. With $N/b$ query tiles each reading the $2Nd$ elements of $K$ and $V$, the
# tiled kernel makes $\Theta(N^2d/b) = \Theta(N^2d^2/M)$ accesses; as $d^2$ =
# {glue:text}`io_d2:,` is below $M$, that is fewer than $N^2$, by a factor $\Theta(M/d^2)$ that
# does not depend on $N$. No exact attention does better for every $M$ (their Proposition 3).
#
# So tiling divides the bytes by a constant that the chip and the head dim set; it does not change
# how they grow. In the table's bytes (causal, bf16, `attention_traffic`), the naive ops move 8 $n
# \times n$ matrices per head (`naive_attention_ops`: scores, scale, mask, softmax, each written
# and read back), while the tiled kernel reads the $K$ and $V$ rows up to each query tile's
# diagonal, about $n^2 d / b_q$ elements per head. Both are quadratic, so their ratio saturates at
# $8n^2 / (n^2 d / b_q) = 8 b_q / d$ = {glue:text}`io_limit:.0f` for `small` ($d$ =
# {glue:text}`io_d`, $b_q$ = {glue:text}`tile`), plus the bool mask's small share: at
# {glue:text}`io_seq` tokens it is {glue:text}`io_ratio:.2f`. Larger query tiles raise the limit, a
# larger head dim lowers it.
#
# ### Memory of naive attention
#
# Autograd keeps what each op's backward needs. For `naive_attention` = `softmax(q @ k.T / sqrt(d))
# @ v`: the softmax keeps its output $P$, and so does $PV$ (the same storage). The backward then
# makes $dP = dO\,V^\top$ and the softmax's backward makes $dS = P \circ (dP -
# \operatorname{rowsum}(dP \circ P))$ while both $P$ and $dP$ are alive: three $n \times n$ matrices
# at its peak. `accounting.attention.naive_memory` counts it, byte for byte:
#
# ```{literalinclude} ../lib/mlsys/accounting/attention.py
# :pyobject: NaiveMemory
# ```

# %% tags=["hide-input"]
q_mem = attention_cost.naive_memory(1, 1, Q_SEQ, Q_SEQ, Q_D, "fp32")
for name, value in {"q_seq": Q_SEQ, "q_io_mb": 4 * Q_SEQ * Q_D * 4 / 1e6,  # q, k, v, O
                    "q_before_gb": q_mem.before_backward_bytes / 1e9,
                    "q_peak_gb": q_mem.backward_peak_bytes / 1e9, "tile": TILE}.items():
    glue(name, value)
seed = sweep_seed.seed_numbers(SWEEP_BATCH)  # at 16,384 tokens, d = 16
our_extra = glue("our_extra", (q_mem.backward_peak_bytes - q_mem.before_backward_bytes)
                 / q_mem.matrix_bytes)
assert abs(seed["bytes_per_pair"] - seed["per_pair"]) < 1  # settles near 32: P, batch x fp32
assert round(seed["their_extra"] - our_extra) == 1  # one n x n matrix more than the book's code
assert seed["qkv_short_mib"] < 0.5 < 8 < seed["offset_lo_mib"] < seed["offset_hi_mib"] < 17
for name, value in seed.items():  # the offset: memory held before, not q, k, v (MiB)
    glue(name, value)
sweep_seed.seed_table(SWEEP_BATCH)

# %% [markdown]
# The seed's sweep (a third party's measurement {cite}`cs336_2025`: batch 8, one head, fp32, on an
# Ampere GPU) checked against the count. Their readings in bytes per $n^2$ settle near
# {glue:text}`per_pair` because $P$ holds one fp32 number per (query, key) pair for each of 8
# sequences: $8 \times 4$ (the seed's own "Memory/seq²" column says otherwise: Q5). At short
# lengths a fixed offset dominates: every reading lies {glue:text}`offset_lo_mib:.1f` to
# {glue:text}`offset_hi_mib:.1f` MiB above the count with $q, k, v$ (fifth column), memory their
# allocator already held when the reading began. It is not $q, k, v$, which at 256 tokens and $d$
# = 16 are {glue:text}`qkv_short_mib:.3f` MiB, nor the CUDA context, which lives outside the
# caching allocator and which its counters never include. During the backward their run added
# {glue:text}`their_extra:.2f` matrices of that size, where the book's `naive_attention` adds
# {glue:text}`our_extra:.2f` ($dP$, $dS$, and the small $dV$): their code holds one more $n \times
# n$ temporary than ours (which, their table does not say). Compiled, they add
# {glue:text}`their_comp_extra:.2f`: the fused backward never holds $P$, $dP$ and a separate $dS$
# at once. Where does the peak stop fitting? Batch 8, fp32, one head, the eager peak against
# each device's memory:

# %% tags=["hide-input"]
sweep_seed.fits_table(SWEEP_BATCH)

# %% [markdown]
# At its peak the seed's run held {glue:text}`seed_peak_gb:.1f` GB at 16,384 tokens; at 32,768 its
# $n^2$ terms alone would need {glue:text}`seed_peak_2x_gb:.0f` GB.
#
# ## The online softmax
#
# Softmax needs the row's maximum (for stability) and its sum before it can write any output: two
# passes over the row. Milakov and Gimelshein {cite}`milakov2018online` keep both as running values
# instead. After seeing keys $1..j$ with running max $m_j$ and running sum $\ell_j = \sum_{i \le j}
# e^{s_i - m_j}$, a new block of scores $s'$ gives
#
# $$ m_{j'} = \max(m_j, \max s'), \qquad
#    \ell_{j'} = \ell_j\, e^{m_j - m_{j'}} + \textstyle\sum e^{s' - m_{j'}}, $$
#
# and the same rescaling applies to a running output $o_j = \sum_{i \le j} e^{s_i - m_j} v_i$. At
# the end $O = o/\ell$ and $L = m + \log \ell$, the log-sum-exp, which is all the backward needs to
# rebuild $P = e^{S - L}$. Checked on random rows, block by block, and by merging two halves of the
# keys computed apart (what context parallelism does, chapter 09):

# %%
g = torch.Generator().manual_seed(SEED)
scores = torch.randn(5, 1_000, generator=g, dtype=torch.float64) * 20
values = torch.randn(1_000, 8, generator=g, dtype=torch.float64)
m = torch.full((5, 1), -math.inf, dtype=torch.float64)
ell = torch.zeros(5, 1, dtype=torch.float64)
acc = torch.zeros(5, 8, dtype=torch.float64)
for start in range(0, 1_000, 128):  # one block of keys at a time
    block = scores[:, start:start + 128]
    m_new = torch.maximum(m, block.amax(dim=1, keepdim=True))
    p = torch.exp(block - m_new)
    ell = ell * torch.exp(m - m_new) + p.sum(dim=1, keepdim=True)
    acc = acc * torch.exp(m - m_new) + p @ values[start:start + 128]
    m = m_new
online = acc / ell
exact = torch.softmax(scores, dim=1) @ values
err_online = glue("err_online", (online - exact).abs().max().item())
assert err_online < 1e-12 and torch.allclose(m + torch.log(ell), torch.logsumexp(scores, 1, True))

# %% [markdown]
# Block by block, the result equals the two-pass softmax to {glue:text}`err_online:.1e` in float64.
# The same recurrence drawn for one row of random unit-normal scores
# (`tiling.online_softmax_steps`):

# %% tags=["remove-input"]
row = torch.randn(ROW_KEYS, generator=torch.Generator().manual_seed(SEED), dtype=torch.float64)
steps = tiling.online_softmax_steps(row, block_k=ROW_BLOCK)
assert math.isclose(steps[-1].m_new + math.log(steps[-1].l_new), torch.logsumexp(row, 0).item())
for name, value in {"row_grew": sum(st.rescale < 1 for st in steps[1:]), "row_m": steps[-1].m_new,
                    "row_least": min(st.rescale for st in steps), "row_l": steps[-1].l_new}.items():
    glue(name, value)
tiling.draw_online_softmax(row, block_k=ROW_BLOCK)
plt.show()

# %% [markdown]
# The running max $m$ (top) grew {glue:text}`row_grew` times after the first block. Each time, the
# sum so far (bottom, black mark) was multiplied by $e^{m_\text{old} - m_\text{new}}$, the factor
# written above the block, as low as {glue:text}`row_least:.2f`, before the block's own terms were
# added; where the max held, the factor is 1 and the sum only grows. At the end $m$ =
# {glue:text}`row_m:.3f` and $\ell$ = {glue:text}`row_l:.3f`: $m + \log \ell$ is the row's
# log-sum-exp, exactly as the two-pass softmax computes it.
#
# Merging partial results computed on disjoint key sets uses only their outputs and log-sum-exps: $L
# = \log(e^{L_1} + e^{L_2})$, $O = e^{L_1 - L}O_1 + e^{L_2 - L}O_2$:

# %%
q_m = torch.randn(2, 3, 40, 16, generator=g, dtype=torch.float64)
k_m, v_m = (torch.randn(2, 3, 70, 16, generator=g, dtype=torch.float64) for _ in range(2))
o_1, l_1 = attention(q_m, k_m[..., :30, :], v_m[..., :30, :], return_lse=True)
o_2, l_2 = attention(q_m, k_m[..., 30:, :], v_m[..., 30:, :], return_lse=True)
l_all = torch.logaddexp(l_1, l_2)
merged = torch.exp(l_1 - l_all)[..., None] * o_1 + torch.exp(l_2 - l_all)[..., None] * o_2
o_ref, l_ref = attention(q_m, k_m, v_m, return_lse=True)
err_merge = max((merged - o_ref).abs().max().item(), (l_all - l_ref).abs().max().item())
assert glue("err_merge", err_merge) < 1e-12

# %% [markdown]
# Merged: equal to attention over all 70 keys to {glue:text}`err_merge:.1e`.
#
# ## The code
#
# ### FlashAttention-2 in PyTorch
#
# The tiled algorithm, one query tile at a time, with the online softmax over key tiles; causal
# tiles above the diagonal are never visited. It is slow in Python (a loop of small matmuls) and
# exists to be read once:
#
# ```{literalinclude} ../lib/mlsys/ops/flash_attention.py
# :pyobject: flash_attention_torch
# ```
#
# Its backward rebuilds $P$ tile by tile from $Q$, $K$ and $L$: with $D = \operatorname{rowsum}(dO
# \circ O)$ (equal to $\operatorname{rowsum}(P \circ dP)$), $dS = P \circ (dP - D)$ needs no $n
# \times n$ matrix either. `FlashAttentionTorch` saves exactly $q, k, v, O, L$. Against the float64
# reference on irregular shapes, causal (bottom-right when $n_q \ne n_k$), forward and backward:

# %% tags=["hide-input"]
checks.flash_torch_table(SHAPES, g)  # each error asserted below its bound

# %% [markdown]
# ### The Triton kernels
#
# `mlsys.kernels.flash_attention` runs the same algorithm on a GPU, one program per query tile and
# (batch, head): $Q$'s tile stays in registers, $K$ and $V$ stream through in tiles, the running max
# and sum stay in fp32. For a causal mask the loop over key tiles stops at the diagonal, so tiles
# entirely above it are never loaded. Inside the loop the kernel applies the causal comparison and
# its `tl.where` to every tile it visits: on a tile wholly below the diagonal that keeps every
# score, an elementwise pass that changes nothing. FlashAttention-2's CUDA kernels and the Triton
# tutorial {cite}`triton_tutorials` split the loop instead, the full tiles first without a mask,
# then the diagonal tiles with it; the causal map below counts how many visited tiles need no
# mask. One program, causal, with one of the forward's tiles on a GPU (`flash_tiles.TILES`):
# {glue:text}`tile_q` query rows held, {glue:text}`tile_k` key rows streamed:

# %% tags=["remove-input"]
tiling.draw_flash_tiling(DRAW_SEQ, DRAW_SEQ, DRAW_D, block_q=FLASH_TILE[0],
                         block_k=FLASH_TILE[1], causal=True)
plt.show()

# %% [markdown]
# The program loads its block of $Q$ once and keeps it, then streams the tiles of $K$ and $V$
# through in order, each used for one score tile $S = QK^\top$ and one update of $m$, $\ell$ and
# the output accumulator; the tiles past its diagonal are never loaded. It writes its block of $O$
# (and of $L$) once, at the end. The other query blocks are other programs, run at the same time
# on other SMs, each reading the same $K$ and $V$ again: that is the $2\,n\,d\,\lceil n/b_q \rceil$
# term of the tiled kernel's traffic. The kernel:
#
# ```{literalinclude} ../lib/mlsys/kernels/flash_attention.py
# :pyobject: _flash_fwd_kernel
# ```
#
# The backward is three kernels: $D = \operatorname{rowsum}(dO \circ O)$; one program per key tile
# accumulating $dK$ and $dV$ over the query tiles that see it; one per query tile accumulating $dQ$
# over its key tiles. $dQ$ sums over key tiles, which the $dK/dV$ programs own: FlashAttention-2's
# CUDA code adds each contribution with atomics into an fp32 buffer (5 matmuls per tile pair, a
# summation order that changes from run to run); the book's kernel recomputes $S$ and $dP$ in a
# separate $dQ$ kernel instead (7 matmuls, no atomics, bit-for-bit reproducible gradients). The
# dK/dV kernel: its key tile stays on chip while the query tiles that see it stream past, $P^\top$
# rebuilt from $L$ for each:
#
# ```{literalinclude} ../lib/mlsys/kernels/flash_attention.py
# :pyobject: _flash_bwd_dkdv_kernel
# ```
#
# The $dQ$ kernel (`_flash_bwd_dq_kernel`) is the forward's loop over key tiles, recomputing $S$
# and $dP$ the same way and accumulating $dQ$ on chip. Without a GPU the kernels run in Triton's
# interpreter, slowly but exactly:

# %% tags=["hide-input"]
glue("triton_mode", "interpreted on the CPU" if _triton.INTERPRETED else "compiled on the GPU"
     if _triton.HAS_TRITON else "not run: Triton is not installed (Linux only)")
checks.flash_triton_table(TRITON_SHAPES, TRITON_DTYPES, g,
                          "cuda" if env.device() == "cuda" else "cpu")

# %% [markdown]
# The kernels ({glue:text}`triton_mode`) match the float64 reference; the test suite checks them on
# over 200 random irregular shapes. How much of the $n \times n$ work does causal tile skipping
# save, and what does the backward pay for not storing $P$? With tiles of {glue:text}`tile`:

# %% tags=["hide-input"]
n_big, d_big = Q_SEQ, 128  # pairs, P's bytes, backward FLOPs: each law asserted in causal_work
for name, value in {"big_seq": f"{n_big:,}", **checks.causal_work(n_big, d_big, TILE)}.items():
    glue(name, value)

# %% [markdown]
# At {glue:text}`big_seq` tokens the causal kernel computes {glue:text}`tiled_share:.2f`% of the
# dense pairs (the exact triangle is {glue:text}`exact_share:.2f`%; the diagonal tiles are computed
# whole). Keeping $P$ would cost {glue:text}`p_mb:,.0f` MB per head in bf16, read back in the
# backward; recomputing it costs matmuls instead: the backward does {glue:text}`bwd_stored_p:.1f`×
# the forward's FLOPs with $P$ stored, {glue:text}`bwd_atomic_dq:.1f`× with atomics and
# {glue:text}`bwd_separate_dq:.1f`× with the book's separate $dQ$ kernel. FLOPs are cheap next to
# $n^2$ bytes: the recomputation is what makes the backward fit and what makes it fast. Against
# naive autograd, which computes every pair and masks afterwards, the causal tiled backward does
# {glue:text}`fa2_fewer:.0f`% fewer matmul FLOPs with FlashAttention-2's atomics and
# {glue:text}`book_fewer:.0f`% fewer with the book's kernels: the skipped tiles outweigh the
# recomputation. Only without a mask does the tiled backward do more work than naive (Q2).
#
# Which tiles are those? The map of a causal kernel's tiles at {glue:text}`map_seq` tokens, with
# the forward's {glue:text}`tile_q` × {glue:text}`tile_k` tiles drawn above, sorted by the kernel's
# own loop bound and mask (`tiling.causal_tiles`):

# %% tags=["remove-input"]
kinds = tiling.causal_tiles(MAP_SEQ, MAP_SEQ, block_q=FLASH_TILE[0], block_k=FLASH_TILE[1])
for name, value in {"map_seq": f"{MAP_SEQ:,}", "map_tiles": sum(map(len, kinds.values())),
                    "tile_q": FLASH_TILE[0], "tile_k": FLASH_TILE[1],  # the tiling's, too
                    "map_needless": 100 * len(kinds["full"]) / (len(kinds["full"])
                                                                + len(kinds["diagonal"])),
                    **{f"map_{k}": len(found) for k, found in kinds.items()}}.items():
    glue(name, value)
for name, value in checks.fa2_changes(SPEC, hardware.A100_80GB_SXM, heads=16, seq=Q_SEQ,
                                      block_q=TILE).items():  # the next section's numbers
    glue(name, value)
tiling.draw_causal_tiles(MAP_SEQ, MAP_SEQ, block_q=FLASH_TILE[0], block_k=FLASH_TILE[1])
plt.show()

# %% [markdown]
# Of the {glue:text}`map_tiles` tiles, {glue:text}`map_skipped` lie past the loop bound and are
# never loaded, {glue:text}`map_full` have no pair to mask, and {glue:text}`map_diagonal` cross the
# diagonal: computed whole, then masked, which is where the tiled kernel does more work than the
# exact triangle. The book's kernel evaluates the mask on the full tiles too:
# {glue:text}`map_needless:.0f`% of the tiles it visits need none, a share that grows with the
# length. Smaller tiles follow the diagonal more closely but reload $K$ and $V$ more often.
#
# ### FlashAttention, FlashAttention-2, FlashAttention-3
#
# The book's kernels follow FlashAttention-2 {cite}`dao2023flashattention2`, which kept the tiling
# and the online softmax of FlashAttention {cite}`dao2022flashattention` and changed four things:
#
# - **Loop order.** FlashAttention's outer loop ran over key and value blocks and its inner loop
#   over query blocks, so every query block's $O$, $m$ and $\ell$ went back to main memory after
#   each key block and were read again for the next. FlashAttention-2 swaps the loops: a program
#   owns one query tile, streams every key tile past it, and writes $O$ and $L$ once, as
#   `_flash_fwd_kernel` above does.
# - **Parallelism over the sequence.** FlashAttention launched one thread block per (batch, head).
#   FlashAttention-2 adds the query tiles to the forward's grid (and the key tiles to the dK/dV
#   kernel's). One sequence of {glue:text}`fa2_heads` heads at {glue:text}`big_seq` tokens on an
#   H100:
#   {glue:text}`fa2_fa1_blocks` blocks for {glue:text}`fa2_sms` SMs, so at most
#   {glue:text}`fa2_fa1_busy:.0f`% of the SMs busy, against {glue:text}`fa2_programs:,` programs,
#   {glue:text}`fa2_waves:.1f` waves of one per SM. Long sequences come in small batches: this is
#   where it matters.
# - **The division by $\ell$ deferred.** FlashAttention rescaled its output by the running sum's
#   inverse at every key block; FlashAttention-2 keeps the unnormalized accumulator, multiplies it
#   only by $e^{m_\text{old} - m_\text{new}}$, and divides once at the end ($O = o/\ell$ above).
#   It also saves one number per row for the backward, $L = m + \log \ell$, instead of $m$ and
#   $\ell$.
# - **Fewer non-matmul FLOPs.** Those changes cut elementwise work, and the work within a program
#   is split among its warps by query rows instead of by keys, so warps no longer add partial
#   results through shared memory. Elementwise FLOPs matter beyond their count: a bf16 matmul FLOP
#   on the tensor cores is {glue:text}`fa2_rate_old:.0f`× cheaper than an fp32 FLOP off them on the
#   A100, {glue:text}`fa2_rate_new:.0f`× on the H100 (`hardware`).
#
# FlashAttention-3 {cite}`shah2024flashattention3` is written for the H100 and uses what Hopper
# added. The TMA unit copies tiles and `wgmma` multiplies asynchronously, so producer warps load
# $K$ and $V$ while consumer warpgroups compute (warp specialization); two warpgroups take turns,
# one's softmax running while the other's matmuls do, and within a warpgroup the softmax of one
# tile overlaps the matmuls of the next; and an fp8 path quantizes per block and first multiplies
# $Q$ and $K$ by a random orthogonal matrix that spreads outliers across the dimensions
# (incoherent processing). The book's Triton kernel gets `wgmma` and the `cp.async` pipeline from
# the compiler, as the next section shows, but no warp specialization.
#
# ### What the compiler made of it
#
# The interpreter checks values, not what a GPU would run. That needs no GPU either: Triton
# compiles for a named target without one, the Python kernel becomes PTX, and `ptxas`, shipped in
# the Triton wheel, turns the PTX into SASS, the machine code of an A100 (sm_80) or an H100
# (sm_90), saying how many registers each thread needs and what it spilled to slow local memory
# when they ran out (`mlsys.kernels.aot`). `python -m mlsys.kernels.compile_report` does this for
# every tile the autotuner could try, for both targets, and removes from the search space every
# tile that spills, asks for more shared memory than a block may have, or whose 16-bit dot
# products miss the tensor cores; `make test` compiles every tile left for the problems the
# chapters launch. The committed
# report ({glue:text}`aot_provenance`) for bf16, $d$ = 128, causal, on the H100:

# %% tags=["hide-input"]
report = compile_report.load()
glue("aot_provenance", f"Triton {report.provenance['triton_version']}, "
     f"{report.provenance['date'][:10]}, {len(report.entries):,} compiles")
compile_tables.flash_table(report, "sm_90", dtype="bf16", head_dim=128, causal=True)

# %% [markdown]
# Per tile: registers per thread and spilled bytes (ptxas), the shared memory a block asks for at
# launch beside the rule of `mlsys.accounting.tiles` in parentheses, the warps an SM can keep
# resident with these resources and which resource caps them (`mlsys.accounting.occupancy`), and
# the tensor-core instructions in the SASS. The A100's table is behind the toggle: there
# {glue:text}`more_regs` tiles need more registers than on the H100, since `mma.sync` keeps both
# operands in registers where `wgmma` reads them from shared memory.

# %% tags=["hide-cell"]
more, both = compile_tables.more_registers(report, "sm_80", "sm_90", dtype="bf16", head_dim=128,
                                           causal=True)
glue("more_regs", f"{more} of {both}")
compile_tables.flash_table(report, "sm_80", dtype="bf16", head_dim=128, causal=True)

# %% [markdown]
# Two formulas are checked here as counters are elsewhere in the book. Shared memory: the tiles a
# program holds, plus the pipeline's copies of the tiles it streams (`num_stages` of them on
# sm_90, one fewer on sm_80), plus the dK/dV kernel's streamed rows of $L$ and $D$. It equals
# what the compiler asked for in {glue:text}`smem_exact` of {glue:text}`smem_total` 16-bit tiles;
# the other {glue:text}`smem_plus` (sm_80, $d$ = 128, 64-row tiles) ask for exactly one 16-bit
# $P$ tile more, which the compiler moves between the accumulator's layout and the dot operand's
# through shared memory. For fp32 inputs, whose IEEE dot runs on the FMA units, the rule does not
# hold (the compiler used {glue:text}`smem_fp32` of it). Registers: the fp32 accumulators, which
# live through the whole loop, and the score tile a loop step holds whole, spread over the
# program's threads, give a floor; past 255 per thread (fewer with 16 or 32 warps) a tile must
# spill on paper. {glue:text}`regs_must` 16-bit tiles must, and all of them did;
# {glue:text}`regs_early` more spilled below the cap, some at a floor of only
# {glue:text}`regs_low` of it, because the compiler also keeps operand fragments, addresses and
# masks live: the floor says which tiles cannot fit, not which will. No tile that compiled clean
# used fewer registers than its floor.

# %% tags=["hide-input"]
smem, regs = compile_tables.shared_memory_check(report), compile_tables.register_check(report)
assert smem.exact + smem.plus_p_tile == smem.total and regs.below_floor == 0
assert regs.must_spill_and_spilled == regs.must_spill
dkdv = tiles.flash_register_floor("dkdv", 64, 128, 128, 4)
for name, value in {"smem_exact": f"{smem.exact:,}", "smem_total": f"{smem.total:,}",
                    "smem_fp32": f"{smem.fp32_ratio[0]:.0%} to {smem.fp32_ratio[1]:.0%}",
                    "regs_must": regs.must_spill, "regs_early": regs.spilled - regs.must_spill,
                    "regs_low": f"{regs.smallest_spilling_floor:.0%}", "regs_cap": dkdv.limit,
                    "dkdv_acc": dkdv.parts["accumulators"], "smem_plus": smem.plus_p_tile}.items():
    glue(name, value)
compile_tables.removal_table(report)

# %% [markdown]
# What the removed flash tiles have in common: 4 warps holding large fp32 accumulators (the dK/dV
# kernel's two $128 \times 128$ tiles alone are {glue:text}`dkdv_acc` registers a thread at 4
# warps, past the {glue:text}`regs_cap` a thread may have). fp32 inputs have a space of their own
# from the start, small tiles with 8 warps: their IEEE dot product has no tensor-core path and
# keeps each thread's slices of both operands in registers, so the 16-bit space's tiles spill, or
# leave nothing at $d$ = 128. The row kernels lost their widest tiles; where none was left,
# their rows stop (`MAX_COLS`, {ref}`sec-bytes`).
#
# One forward tile compiled now, for each target: the tensor-core instructions and the
# asynchronous copies that feed them, in PTX and in SASS.

# %%
tile = {"BLOCK_M": 64, "BLOCK_N": 64}
problem = {"batch": 1, "heads": 16, "seq": 4096, "head_dim": 64, "causal": True}
if _triton.HAS_TRITON:  # compiling needs Triton (Linux), not a GPU
    sm80, sm90 = aot.compiled_asm(*(aot.Launch("flash_attention.fwd", "bf16", problem, tile,
                                               4, 3, target) for target in ("sm_80", "sm_90")))
    print(compile_tables.ptx_excerpt(sm90["ptx"], ["wgmma.mma_async", "cp.async.cg.shared"]))
    print(compile_tables.excerpt(sm90["sass"], ["HGMMA", "LDGSTS", "LDGDEPBAR"]))
    print(compile_tables.excerpt(sm80["sass"], ["LDSM", "HMMA"]))

# %% [markdown]
# On the A100 each warp issues `mma.sync` (SASS `HMMA.16816`): a $16 \times 8 \times 16$ product
# on its SM's tensor cores, operands and accumulator in the warp's registers, loaded from shared
# memory by `LDSM` (`ldmatrix`). On the H100 a warpgroup of four warps issues `wgmma.mma_async`
# (`HGMMA.64xNx16`): a $64 \times N \times 16$ product that reads its operands from shared memory
# and runs asynchronously while the warps go on; `wgmma.wait_group` waits for it. Both are fed by
# `cp.async` (`LDGSTS`): copies from global memory straight into shared memory that do not pass
# through registers and do not block, so the program starts loading the next $K$ and $V$ tiles
# before it multiplies the current ones; `cp.async.commit_group` (`LDGDEPBAR`) closes a batch of
# copies and `cp.async.wait_group` (`DEPBAR`) waits for the oldest. That overlap is the software
# pipeline: `num_stages` deep, and its buffers are the shared memory the rule above counts.
#
# **Why this tile.** The report says which tiles may run; a prediction says which should win:
# the roofline time of the tile's FLOPs and bytes (larger query tiles read $K$ and $V$ fewer
# times) on the H100, stretched by the last wave of programs (a grid that does not fill its last
# wave of SMs x resident blocks leaves SMs idle). {glue:text}`why_tile` On a GPU the autotuner
# times the kept tiles and picks by measurement; an H100 record, where one exists, fills the last
# column with the forward it timed.

# %% tags=["hide-input"]
GPU_BENCH = flash_benchmark.SIZES["gpu"]  # predictions at the GPU run's sizes, on any machine
problems = [(flash_benchmark.batch_for(GPU_BENCH, n), n) for n in GPU_BENCH.seqs]
glue("why_tile", compile_predictions.why_this_tile(report, "sm_90", heads=GPU_BENCH.heads,
                                                  seq=16_384)[1])
seen = flash_benchmark.recorded_forward_seconds(hardware.H100_SXM)
compile_predictions.flash_predictions(report, "sm_90", problems, heads=GPU_BENCH.heads,
                                      measured=seen)

# %% [markdown]
# ## Measurement
#
# ### The naive sweep, eager and compiled
#
# The seed's sweep on this machine: batch {glue:text}`sweep_batch`, one head, each length's memory
# read by the allocator from fresh inputs and predicted by `naive_memory` before it is read:

# %%
sweep_rows = attention_sweep.run(SWEEP)
attention_sweep.table(sweep_rows)

# %% tags=["remove-input"]
glue("sweep_batch", SWEEP.batch)
for key, text in attention_sweep.verdicts(sweep_rows).items():  # memory, compiled
    glue(f"sweep_{key}", text)
kit.draw(attention_sweep.plot, sweep_rows, ncols=2, width=11.0, height=4.0)

# %% [markdown]
# Memory: {glue:text}`sweep_memory`. Compiled: {glue:text}`sweep_compiled`. What Inductor does
# depends on the dtype and a setting, not on the device. Its pattern matcher can replace the whole
# pattern by PyTorch's fused attention (`scaled_dot_product_attention`), keeping no $n \times n$
# matrix at all; but it skips fp32 inputs on a CUDA GPU unless TF32 matmuls are allowed
# (`torch.set_float32_matmul_precision("high")`), since the fused kernels would compute in TF32
# (`_sfdp_params_check` in torch's `fuse_attention.py`). The seed's sweep and the recorded one
# are fp32 with TF32 off, so there Inductor only fused the scale, mask and softmax, forward and
# backward, into single kernels: compiled, they keep $P$ for the backward as eager does, and the
# seed's compiled peak is half its eager one. A CPU has no such check, and on a GPU bf16 inputs
# are rewritten too. Where it loses: each new shape compiles again,
# and a fused softmax still writes $P$ to memory once, which a tiled kernel never does.
#
# Does the eager forward grow as $n^2$? At this sweep's last doubling in the cpu profile it can
# grow far faster, and two explanations fit the size of its $n \times n$ matrices there: they
# outgrow the CPU's caches, or each is fresh memory that the OS maps and zeroes page by page on
# first write, because PyTorch's CPU allocator returns large freed blocks to it
# ({ref}`sec-bytes`). A probe tells them apart: that doubling (the sweep's batch, its smallest
# head dim) timed with the allocator as it is and with freed memory kept mapped
# (`bench.kept_cpu_memory`), and the page faults of one forward:

# %%
probe_rows = checks.allocation_probe()  # on this machine's CPU, whatever the profile
glue("sweep_jump", checks.jump_verdict(probe_rows))
checks.probe_table(probe_rows)

# %% [markdown]
# On this machine: {glue:text}`sweep_jump`.
#
# ### Every implementation, timed
#
# The Triton kernel, the PyTorch tiled version, naive, compiled naive and the SDPA backends, round
# robin per configuration; achieved TFLOP/s count only the useful work (the pairs attended, and a
# backward of 2× the forward), so a kernel that recomputes gets no credit for it:

# %%
bench_rows = flash_benchmark.run(BENCH)
flash_benchmark.table(bench_rows)

# %% tags=["remove-input"]
for key, text in flash_benchmark.verdicts(bench_rows).items():  # speed, memory
    glue(f"bench_{key}", text)
kit.draw(flash_benchmark.plot, bench_rows, width=8.0, height=4.0,  # the first configuration
         **dict(zip(("dtype", "causal", "d_head"), BENCH.combos[0], strict=True)))

# %% [markdown]
# On this machine: {glue:text}`bench_speed`; {glue:text}`bench_memory`. On a CPU the pure-PyTorch
# tiled version pays Python's overhead for every tile; it is the algorithm, not a fast kernel.
#
# ### The model with each backend
#
# The book's model, one training step per attention backend, from the same weights and batch:

# %%
step_rows = attention_model_step.run(STEP)
attention_model_step.table(step_rows)

# %% tags=["remove-cell"]
for key, text in attention_model_step.verdicts(step_rows).items():  # memory, time
    glue(f"step_{key}", text)

# %% [markdown]
# Memory: {glue:text}`step_memory`. Time: {glue:text}`step_time`. The saved bytes equal
# `saved_bytes` for every backend; the fused backends keep $q, k, v, O$ and $L$ where naive keeps
# $P$ and the mask.
#
# ### Recorded GPU results
#
# `python -m mlsys.experiments` runs the three experiments in GPU sizes: the seed's sweep (batch 8,
# d 16 to 128, up to 32,768 tokens), every implementation in bf16 and fp32 up to 65,536 tokens
# (naive stops where it runs out of memory), and the `small` model with each backend. The kernel's
# targets, read from the record: at bf16, causal, d = 128 and 16,384 tokens on one H100, the
# forward at least as fast as the best SDPA backend and at least half the dense peak, forward +
# backward at least 0.9× the best SDPA backend. {glue:text}`missing_records`

# %% tags=["remove-input"]
missing = glue("missing_records", experiments.show_records(
    ("attention_sweep", "flash_benchmark", "attention_model_step"),
    shows={"flash_benchmark": pages.show_flash_benchmark}))

# %% [markdown]
# ```{admonition} Takeaway
# :class: tip
# Naive attention keeps one $n \times n$ matrix per head for the backward and holds three at the
# backward's peak ({glue:text}`q_before_gb:.2f` GB and {glue:text}`q_peak_gb:.2f` GB for one head at
# {glue:text}`q_seq:,` tokens). The online softmax computes the same output one key tile at a time
# from a running max and sum, and the log-sum-exp it leaves behind lets the backward rebuild $P$
# tile by tile: $O(n)$ memory, exact results, far fewer bytes, and more FLOPs without a mask
# (with a causal one, {glue:text}`fa2_fewer:.0f`% fewer in the backward than naive autograd's: the
# skipped tiles).
# ```
#
# ## Exercises
#
# ### Q1 (multi-step) 32k tokens, one layer
#
# One layer of attention, batch 1, 32 heads of 128, bf16, causal, 32,768 tokens. (a) What does naive
# attention keep for the backward, and what does a FlashAttention backend keep? (b) How many bytes
# does each move in the forward (tiles of 128)? (c) On an H100, what lower bound on the forward's
# time do those bytes and the FLOPs give each, and which is memory-bound? (d) By how much is the
# tiled kernel's bound below naive's?

# %% tags=["hide-cell"]
heads_1, d_1, n_1 = 32, 128, 32_768
shape_1 = (1, heads_1, n_1, n_1, d_1)  # batch, heads, queries, keys, head dim
naive_keep, flash_keep = (attention_cost.attention_saved_bytes(*shape_1, "bf16", backend=b_)
                          for b_ in ("naive", "flash_triton"))
naive_io = attention_traffic.naive_attention_forward_traffic(*shape_1, "bf16", causal=True)
flash_io = attention_traffic.flash_forward_traffic(*shape_1, "bf16", block_q=128, block_k=128,
                                                   causal=True)
naive_t, flash_t = (roofline.estimate(attention_cost.attention_forward_flops(
    *shape_1, causal=causal), io.total_bytes, roofline.Ceilings.from_spec(SPEC, "bf16"))
    for causal, io in ((False, naive_io), (True, flash_io)))  # naive computes every pair
assert naive_t.bound == "memory-bound" and naive_t.time_s > 5 * flash_t.time_s
glue("q1_flash_bound", "its bytes take longer than its FLOPs: memory-bound by this count, which "
     "charges every re-read of K and V to HBM (most of them hit the L2 cache)"
     if flash_t.bound == "memory-bound" else "its FLOPs take longer than its bytes: compute-bound")
for name, value in {"q1_naive_gb": naive_keep / 1e9, "q1_flash_mb": flash_keep / 1e6,
                    "q1_naive_io": naive_io.total_bytes / 1e9, "q1_naive_bound": naive_t.bound,
                    "q1_flash_io": flash_io.total_bytes / 1e9, "q1_t_naive": naive_t.time_s * 1e3,
                    "q1_naive_flop_ms": naive_t.math_s * 1e3, "q1_t_flash": flash_t.time_s * 1e3,
                    "q1_flash_flop_ms": flash_t.math_s * 1e3, "q1_flash_byte_ms": flash_t.memory_s
                    * 1e3, "q1_speedup": naive_t.time_s / flash_t.time_s}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# (a) Naive keeps $q, k, v$, $P$ and the bool mask: {glue:text}`q1_naive_gb:.1f` GB, nearly all of
# it $P$; a FlashAttention backend keeps $q, k, v, O$ and $L$: {glue:text}`q1_flash_mb:.0f` MB.
# (b) Naive moves {glue:text}`q1_naive_io:.0f` GB (every eager op reads and writes an $n \times n$
# matrix), the tiled kernel {glue:text}`q1_flash_io:.1f` GB. (c) Each bound is the longer of
# FLOPs / peak and bytes / bandwidth. Naive (which computes every pair, masked or not):
# {glue:text}`q1_naive_flop_ms:.1f` ms of FLOPs against {glue:text}`q1_t_naive:.1f` ms of bytes,
# {glue:text}`q1_naive_bound`. Tiled: {glue:text}`q1_flash_flop_ms:.1f` ms of FLOPs and
# {glue:text}`q1_flash_byte_ms:.1f` ms of bytes; {glue:text}`q1_flash_bound`. (d) The ratio of the
# two bounds: the tiled kernel's is {glue:text}`q1_speedup:.0f` times below naive's.
# ```
#
# ### Q2 (find the error) FlashAttention does less work
#
# "FlashAttention is faster because it does less work: it never computes the full attention matrix,
# and its backward skips the matrix too." What is wrong? Count the backward's FLOPs against naive
# autograd's at {glue:text}`big_seq` tokens, $d$ = 64, without a mask and with a causal one
# (FlashAttention-2, tiles of {glue:text}`tile`).

# %% tags=["hide-cell"]
shape_2 = (1, 1, Q_SEQ, Q_SEQ, 64)  # batch, heads, queries, keys, head dim
q2 = {s_: attention_cost.attention_backward_flops(*shape_2, strategy=s_) for s_ in
      attention_cost.BACKWARD_MATMULS}
q2_more = glue("q2_more", q2["atomic_dq"] / q2["stored_p"])
assert q2["separate_dq"] > q2["atomic_dq"] > q2["stored_p"] and q2_more == 1.25  # 5 / 4 matmuls
naive_2 = attention_cost.attention_backward_flops(*shape_2, causal=True, convention="dense",
                                                  strategy="stored_p")  # every pair, then masked
fa2_2 = attention_cost.tiled_attention_backward_flops(*shape_2, block_q=TILE, block_k=TILE,
                                                      causal=True, strategy="atomic_dq")
share_2 = attention_cost.tiled_score_pairs(Q_SEQ, Q_SEQ, block_q=TILE, block_k=TILE, causal=True)
assert math.isclose(glue("q2_fewer", 100 * (1 - fa2_2 / naive_2)),
                    100 * (1 - 5 / 4 * share_2 / Q_SEQ**2))  # 5 matmuls on the tiles' pairs

# %% [markdown]
# ```{dropdown} Answer
# It computes every score it needs, tile by tile; it only never *stores* the matrix. Without a mask
# its backward does more FLOPs than naive autograd's, {glue:text}`q2_more:.2f`× with
# FlashAttention-2's atomics (it recomputes $S$ and $P$: 5 matmuls against 4), more with a separate
# $dQ$ kernel. With a causal mask it does less, {glue:text}`q2_fewer:.0f`% fewer FLOPs than naive:
# naive computes every pair and masks afterwards, while the tiled kernel never visits the tiles
# above the diagonal, and 5/4 of about half the pairs is less than all of them. The saving comes
# from the skipped tiles, not from leaving $P$ unstored. Either way it is faster because it moves
# $O(n^2 d^2/M)$ bytes instead of $O(n^2)$ (Dao et al.'s IO bound) and fuses the softmax into the
# matmuls: the time of attention is set by bytes, not FLOPs.
# ```
#
# ### Q3 (multi-step) How much does causal skipping save?
#
# With square tiles of $b$ rows and $n = tb$ tokens, how many tiles does a causal kernel compute,
# and what fraction of the dense work is that at $n$ = 16,384 with $b$ = 64 and 128?

# %% tags=["hide-cell"]
for b_3 in (64, 128):  # t(t + 1)/2 tiles of t^2, t = n / b
    share = glue(f"q3_{b_3}", 100 * attention_cost.tiled_score_pairs(
        Q_SEQ, Q_SEQ, block_q=b_3, block_k=b_3, causal=True) / Q_SEQ**2)
    assert math.isclose(share, 100 * (Q_SEQ // b_3 + 1) / (2 * (Q_SEQ // b_3)))

# %% [markdown]
# ```{dropdown} Answer
# The tiles on or below the diagonal: $t(t+1)/2$ of $t^2$, a fraction $(t+1)/(2t)$ =
# {glue:text}`q3_64:.2f`% at $b$ = 64 and {glue:text}`q3_128:.2f`% at $b$ = 128. Smaller tiles waste
# less on the diagonal but reload $K$ and $V$ more often.
# ```
#
# ### Q4 (code) Count the causal tiles
#
# Write `causal_tile_counts(n_q, n_k, block_q, block_k)`: how many tiles of a causal kernel (query
# $i$ sees keys $j \le i + n_k - n_q$) are skipped, computed full, and computed on the diagonal,
# as in the map above. Use it for a training sequence of 16,384 tokens with the forward's
# {glue:text}`tile_q` × {glue:text}`tile_k` tiles, and for a chunk of 1,000 new queries against
# 3,000 keys (a prefill that continues a cached context) with 64 × 64 tiles. Hint: for the query
# tile of rows $i_0 \ldots i_1 - 1$, which key does its last row see last, and its first row?

# %%
def causal_tile_counts(n_q, n_k, block_q, block_k):  # <- your code here
    """{"skipped": ..., "full": ..., "diagonal": ...}: the tiles of each kind."""
    raise NotImplementedError("count the tiles of each kind")


# %% tags=["hide-cell"]
# The book's solution (opened on demand). `solved_by` checks the reader's function once it is
# written, and the book's while it is not, against the tile map's own classification.
def causal_tile_counts_solution(n_q, n_k, block_q, block_k):
    counts = {"skipped": 0, "full": 0, "diagonal": 0}
    for i0 in range(0, n_q, block_q):  # the tile's first row sees keys <= first, its last <= last
        first, last = i0 + n_k - n_q, min(i0 + block_q, n_q) - 1 + n_k - n_q
        for j0 in range(0, n_k, block_k):
            counts["skipped" if j0 > last else "full" if min(j0 + block_k, n_k) - 1 <= first
                   else "diagonal"] += 1
    return counts


for name, (n_q, n_k, b_q, b_k) in {"q4_train": (16_384, 16_384, *FLASH_TILE),
                                   "q4_chunk": (1_000, 3_000, 64, 64)}.items():
    counts, whose = solved_by(causal_tile_counts, causal_tile_counts_solution, n_q, n_k, b_q, b_k)
    kinds = tiling.causal_tiles(n_q, n_k, block_q=b_q, block_k=b_k)
    assert counts == {kind: len(found) for kind, found in kinds.items()}
    pairs = attention_cost.tiled_score_pairs(n_q, n_k, block_q=b_q, block_k=b_k, causal=True)
    for key, value in {**counts, "share": 100 * pairs / (n_q * n_k), "offset": n_k - n_q}.items():
        glue(f"{name}_{key}", value)
assert counts["full"] > 4 * (counts["skipped"] + counts["diagonal"])  # the chunk: mostly full
print(f"checked: {whose} solution, against tiling.causal_tiles and the kernels' loop bound")

# %% [markdown]
# ```{dropdown} Answer
# For the query tile of rows $i_0 \ldots i_1 - 1$ and offset $n_k - n_q$: its last row sees keys
# up to $i_1 - 1 + n_k - n_q$, so a key tile that starts after that key is never loaded
# (skipped: the kernels' loop stops there); its first row sees keys up to $i_0 + n_k - n_q$, so a
# key tile that ends at or before that key has no masked pair (full); the tiles in between cross
# the diagonal. 16,384 tokens, {glue:text}`tile_q` × {glue:text}`tile_k`:
# {glue:text}`q4_train_skipped:,` skipped, {glue:text}`q4_train_full:,` full,
# {glue:text}`q4_train_diagonal:,` diagonal, {glue:text}`q4_train_share:.2f`% of the dense pairs
# computed. The chunk of 1,000 queries against 3,000 keys: {glue:text}`q4_chunk_skipped:,`
# skipped, {glue:text}`q4_chunk_full:,` full, {glue:text}`q4_chunk_diagonal:,` diagonal: the first
# query sees keys up to {glue:text}`q4_chunk_offset:,`, so most of the work is full tiles, and
# {glue:text}`q4_chunk_share:.1f`% of the pairs are computed.
# ```
#
# ### Q5 (find the error) The seed's memory per seq²
#
# The seed divides each "Mem Before" reading of its eager sweep by seq² and prints a "Memory/seq²"
# column that settles between {glue:text}`q5_lo:.1f` and {glue:text}`q5_hi:.1f` at 16,384 tokens.
# Yet $P$ alone holds {glue:text}`per_pair` bytes per (query, key) pair (batch 8, fp32). How was
# their column computed, and what are the right values?

# %% tags=["hide-cell"]
printed = sweep_seed.printed_per_seq2()  # (d, seq) -> (their reading in MiB, their column)
for (_, n_5), (mib, shown) in printed.items():  # their column: MiB x 10^6 / seq^2
    assert math.isclose(mib * 1e6 / n_5**2, shown, rel_tol=1e-3)  # readings printed rounded
long_5 = [(shown, mib * 2**20 / n_5**2) for (_, n_5), (mib, shown) in printed.items()
          if n_5 == sweep_seed.SEED_SEQ]  # (their column, bytes per pair)
theirs_5, bytes_5 = zip(*long_5, strict=True)
assert max(theirs_5) < seed["per_pair"] < min(bytes_5)  # below P alone; in bytes, above it
for name, value in {"q5_lo": min(theirs_5), "q5_hi": max(theirs_5), "q5_factor": 2**20 / 1e6,
                    "q5_true_lo": min(bytes_5), "q5_true_hi": max(bytes_5)}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# PyTorch's memory statistics count bytes. The seed divided them by $2^{20}$ and printed the result
# as "MB", then divided those MiB by seq² and multiplied by $10^6$: every value of the column is
# MiB × 10⁶ / seq², which reproduces each printed value, and is {glue:text}`q5_factor:.4f` times too
# small. In bytes, MiB × 2²⁰ / seq², the readings at 16,384 tokens are
# {glue:text}`q5_true_lo:.2f` to {glue:text}`q5_true_hi:.2f` bytes per pair: above the
# {glue:text}`per_pair` of $P$, as they must be, since $O$ and the fixed offset come on top. A
# column below what $P$ alone needs should have been the alarm. Their conclusion, memory growing as
# seq², survives: the error is a constant factor.
# ```
#
# ## Summary
#
# - Attention's projections cost $8nD^2$ FLOPs, its two $n^2$ matmuls $4n^2D$ (half with a causal
#   mask): they dominate from $n = 2D$.
# - Naive attention keeps $P$ for the backward and holds $P$, $dP$ and $dS$ at its peak: the seed's
#   memory per seq², in bytes, is near 32, 8 sequences × 4 bytes of $P$ (its printed column mixed
#   MiB with 10⁶).
# - The naive forward moves $\Theta(Nd + N^2)$ elements, the tiled one $\Theta(N^2d^2/M)$: the
#   byte ratio saturates at $8b_q/d$.
# - The online softmax (running max and sum, rescaled) gives the exact softmax one tile at a time,
#   and partial results merge through their log-sum-exp.
# - FlashAttention-2 keeps $q, k, v, O, L$, recomputes $P$ in the backward, and skips causal tiles
#   above the diagonal; it moves far fewer bytes, and does more FLOPs than naive only without a
#   mask.
# - A causal kernel's tiles are skipped (never loaded), full, or on the diagonal (computed whole,
#   then masked): the diagonal tiles are all its work beyond the exact triangle.
