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
# (sec-bytes)=
# # Byte movement and the roofline
#
# **Question.** An H100 reads memory at {glue:text}`h100_tb_per_s:.2f` TB/s and multiplies bf16
# matrices at {glue:text}`h100_tflops:.0f` TFLOP/s: how large must a square bf16 matmul be before
# arithmetic, not memory, limits it, and what fraction of the peak can an elementwise op ever reach?
#
# Cheat sheet: {doc}`../book/bytes_onepager`.

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
from IPython.display import display

from mlsys import experiments, hardware, plotting, roofline, tables
from mlsys.accounting import bytes as bytes_moved
from mlsys.accounting import flops, params
from mlsys.accounting.napkin import napkin
from mlsys.accounting.op_costs import op_costs
from mlsys.book import Table, glue, num, solved_by
from mlsys.diagrams import hierarchy
from mlsys.dtypes import bytes_per_element
from mlsys.experiments import elementwise_fusion, fused_kernels, kit, op_overhead, roofline_ops
from mlsys.experiments.byte_checks import kernel_table, linear_touches, touches_table
from mlsys.experiments.pages import show_roofline_ops
from mlsys.kernels import compile_predictions, compile_report, compile_tables
from mlsys.models.config import TransformerConfig

# %% tags=["parameters"]
SEED = 0
# Napkin math (nothing measured): the device, dtype and sizes of the intensity tables
SPEC, SPEC_DTYPE = hardware.H100_SXM, "bf16"
EXAMPLE_D, EXAMPLE_TOKENS, SKINNY_ROWS = 4096, 4096, 16  # linear layers, square and skinny matmuls
EXAMPLE_ATTN = (1, 32, 4096, 128)  # batch heads seq d_head
ATTN_SEQS = (256, 1024, 4096, 16384, 65536)
LINEAR_SHAPE = (7, 11, 13)  # tokens, d_in, d_out of the tallied layer: irregular on purpose
# Measurements: sizes per profile live with each experiment (lib/mlsys/experiments/)
OPS = env.pick(**roofline_ops.SIZES)
FUSION = env.pick(**elementwise_fusion.SIZES)
OVERHEAD = env.pick(**op_overhead.SIZES)

# %% [markdown]
# A kernel does arithmetic on data that lives in memory. Every byte it needs has to be read from
# memory (HBM on a GPU, DRAM on a CPU) and every result written back, and the arithmetic units can
# only go as fast as those bytes arrive. This chapter counts the bytes, as {ref}`sec-flops` counted
# the FLOPs, and puts the two together in the roofline model
# {cite}`williams2009roofline,austin2025scaling`: one number per kernel, its arithmetic intensity,
# says whether memory or arithmetic limits it. Then it measures both limits on the machine running
# this page and checks the predictions against kernels of every kind.
#
# Where those bytes live, on the {glue:text}`spec_name` as `mlsys.hardware` describes it
# (`mlsys.diagrams.hierarchy`): the levels on the chip, HBM beside it on the package, and the two
# links that leave the package:

# %% tags=["remove-input"]
levels = {lv.name: lv for lv in hierarchy.memory_levels(SPEC)}
on_chip = sum(levels[name].total_bytes for name in ("registers", "shared memory / L1"))
assert on_chip > SPEC.l2_bytes and SPEC.hbm_bytes_per_s > SPEC.interconnect_bytes_per_s  # as said
for name, value in {"regs_per_sm_kib": levels["registers"].per_sm_bytes / 2**10,
                    "sm_count": SPEC.sm_count, "on_chip_mib": on_chip / 2**20,
                    "l2_mib": SPEC.l2_bytes / 2**20, "hbm_over_l2": SPEC.hbm_bytes / SPEC.l2_bytes,
                    "hbm_over_nvlink": SPEC.hbm_bytes_per_s / SPEC.interconnect_bytes_per_s,
                    "hbm_over_pcie": SPEC.hbm_bytes_per_s / SPEC.pcie_bytes_per_s}.items():
    glue(name, value)
hierarchy.draw_memory_hierarchy(SPEC)
plt.show()

# %% [markdown]
# A kernel's data starts and ends in HBM, {glue:text}`hbm_over_l2:,.0f` times the L2's size. On
# the chip, each of the {glue:text}`sm_count` SMs has its own {glue:text}`regs_per_sm_kib:.0f` KiB
# of registers and its shared memory, {glue:text}`on_chip_mib:.0f` MiB in all, more than the
# {glue:text}`l2_mib:.0f` MiB L2; one program sees only its own SM's share. Off the package,
# NVLink is {glue:text}`hbm_over_nvlink:.0f` times and PCIe {glue:text}`hbm_over_pcie:.0f` times
# slower than HBM. The table holds no bandwidth for the on-chip levels, so the figure draws none:
# what matters here is that they are faster than HBM, and a kernel that keeps its data there (a
# fused or tiled one) moves only the HBM bytes counted below.
#
# ## Napkin math
#
# A kernel that does $F$ FLOPs while moving $Q$ bytes has **arithmetic intensity** $I = F / Q$ FLOP
# per byte. On a device with peak $P$ FLOP/s and memory bandwidth $\beta$ bytes/s it takes at least
#
# $$ T = \max\left(\frac{F}{P}, \frac{Q}{\beta}\right), \qquad
#    \text{attainable FLOP/s} = \frac{F}{T} = \min(P,\; I \cdot \beta). $$
#
# The two terms are equal at the **ridge point** $I^* = P / \beta$. Below it a kernel is
# *memory-bound*; above it, *compute-bound*. Both $Q$ (through the bytes per element $b$) and $P$
# (narrower types run faster on matrix units) depend on the dtype. On an H100 in bf16:

# %%
h100_peak, h100_bw = SPEC.peak_flop_per_s(SPEC_DTYPE), SPEC.hbm_bytes_per_s
h100_ridge = SPEC.ridge_intensity(SPEC_DTYPE)
spec_roof = roofline.Ceilings.from_spec(SPEC, SPEC_DTYPE)
b_spec = bytes_per_element(SPEC_DTYPE)
n_star = math.ceil(3 * b_spec * h100_ridge / 2)  # a square N-matmul has I = 2N / (3b)
assert (bytes_moved.matmul_intensity(n_star, n_star, n_star, SPEC_DTYPE) >= h100_ridge
        > bytes_moved.matmul_intensity(n_star - 1, n_star - 1, n_star - 1, SPEC_DTYPE))
ew_intensity = bytes_moved.elementwise_intensity(1, SPEC_DTYPE)  # 1 FLOP per element, 2 B + 2 B
ew_fraction = spec_roof.attainable_flop_per_s(ew_intensity) / h100_peak
assert ew_intensity == 1 / (2 * b_spec) and math.isclose(ew_fraction, ew_intensity / h100_ridge)
print(f"{SPEC.name}: ridge {h100_ridge:.0f} FLOP/byte; square matmul compute-bound from N = "
      f"{n_star};\nelementwise op at most {ew_fraction:.3%} of the peak")

# %% tags=["remove-cell"]
for name, value in {"h100_tb_per_s": h100_bw / 1e12, "h100_tflops": h100_peak / 1e12,
                    "h100_ridge": h100_ridge, "n_star": n_star, "ew_intensity": ew_intensity,
                    "ew_fraction_pct": 100 * ew_fraction, "spec_name": SPEC.name}.items():
    glue(name, value)

# %% [markdown]
# The answer, before anything runs: a square bf16 matmul needs $N \ge$ {glue:text}`n_star` to be
# compute-bound on an {glue:text}`spec_name` (ridge {glue:text}`h100_ridge:.0f` FLOP/byte), and an
# elementwise op doing one FLOP per element has intensity {glue:text}`ew_intensity` FLOP/byte in
# bf16, so it never uses more than {glue:text}`ew_fraction_pct:.2g`% of the peak, however well it is
# written. The intensities below come from `mlsys.accounting.bytes`, which counts the *minimum*
# traffic: each input read once, each output written once.
#
# ```{literalinclude} ../lib/mlsys/accounting/bytes.py
# :pyobject: matmul_traffic
# ```
#
# A square matmul has $I = 2N^3 / (3N^2 b) = 2N / (3b)$: small ones are memory-bound, large ones
# compute-bound. A *skinny* matmul ($m$ tokens against an $n \times n$ weight: a decode step, a
# small batch) has $I \approx 2m / b$ once $n \gg m$: its intensity is set by the number of tokens.
# A weight shared by a batch is read once for all of it, so batching tokens through the same weights
# is what first makes a GPU efficient. Softmax and norms are row-wise: a fused kernel reads a row
# once and writes it once, so they are elementwise ops with a few FLOPs per element. Every operation
# of a transformer, at {glue:text}`example_tokens:,` tokens of width {glue:text}`example_d:,`:

# %% tags=["hide-input"]
glue("example_tokens", EXAMPLE_TOKENS)
glue("example_d", EXAMPLE_D)
costs = {dt: op_costs(dt, tokens=EXAMPLE_TOKENS, d_model=EXAMPLE_D, skinny_rows=SKINNY_ROWS,
                      attention=EXAMPLE_ATTN) for dt in ("fp32", "bf16")}
Table(*tables.op_intensity_table(costs["fp32"], costs["bf16"], spec_roof, SPEC.name))

# %% [markdown]
# {glue:text}`below_text`. Reaching the ridge: {glue:text}`above_text`. The spread is wide: naive
# attention and small matmuls miss it by factors of a few to a few tens, elementwise ops, softmax
# and norms by factors of hundreds to thousands. That is the case for **fusion**: an elementwise op
# cannot be made compute-bound, only merged into a neighbour so its bytes never travel on their own.

# %% tags=["remove-cell"]
below = [h100_ridge / op.intensity for op in costs["bf16"] if op.intensity < h100_ridge]
glue("below_text", tables.ridge_gap_text(costs["bf16"], SPEC, SPEC_DTYPE))
glue("above_text", ", ".join(op.name for op in costs["bf16"] if op.intensity >= h100_ridge))
assert min(below) < 10 < 1000 < max(below)  # "a few" to "thousands", as said

# %% [markdown]
# ### Attention: the $T^2$ terms
#
# Attention computes the scores $S = QK^\top$, the probabilities $\operatorname{softmax}(S)$ and the
# output $O = \operatorname{softmax}(S)V$. Written as three kernels, the two $T \times T$ matrices
# go to memory and back: four $T^2$ terms per head. A tiled (FlashAttention-style) kernel
# {cite}`dao2022flashattention` keeps each block of scores on chip and moves only $Q, K, V$ and $O$,
# or, streaming $K$ and $V$ once per block of `block_q` queries, $\lceil T/\text{block\_q} \rceil$
# passes over them.
#
# ```{literalinclude} ../lib/mlsys/accounting/bytes.py
# :pyobject: naive_attention_traffic
# ```
#
# The FLOPs are the same for both: $4T^2 d_\text{head}$ for the two matmuls and 6 per score for the
# scaling and the softmax. The naive kernel's intensity *saturates* below $(4 d_\text{head} +
# 6)/(4b) = (d_\text{head} + 3/2)/b$ (its $T^2$ traffic grows as fast as the FLOPs), while the tiled
# kernel's grows with $T$:

# %% tags=["hide-input"]
bsz, heads, _, d_head = EXAMPLE_ATTN
tiled_cross = next(seq for seq in ATTN_SEQS if bytes_moved.intensity(
    flops.scaled_dot_product_flops(bsz, heads, seq, d_head),
    bytes_moved.tiled_attention_traffic(bsz, heads, seq, d_head, SPEC_DTYPE)) >= h100_ridge)
glue("attn_desc", f"batch {bsz}, {heads} heads, d_head {d_head}")
glue("naive_attn_cap", (d_head + 1.5) / b_spec)
glue("tiled_cross", f"{tiled_cross:,}")
Table(*tables.attention_traffic_table(bsz, heads, d_head, ATTN_SEQS, SPEC_DTYPE, block_q=128))

# %% [markdown]
# ({glue:text}`attn_desc`, bf16, forward, with the scaling and the softmax counted as
# `mlsys.accounting.flops` does.) The naive kernel approaches {glue:text}`naive_attn_cap:.0f`
# FLOP/byte from below: memory-bound on every GPU of the ridge table further down. The tiled kernel
# crosses the {glue:text}`spec_name` ridge by $T =$ {glue:text}`tiled_cross` in this sweep.
#
# ### A linear layer, forward and backward
#
# $Y = XW^\top$ runs three matmuls per training step: the forward, $dX = dY\,W$ and $dW = dY^\top
# X$.
#
# ```{literalinclude} ../lib/mlsys/accounting/bytes.py
# :pyobject: linear_traffic
# ```
#
# The weight $W$ is **read twice** (forward and $dX$). A weight-*shaped* tensor is touched a third
# time, but it is the gradient $dW$, and it is *written*; with gradient accumulation the old $dW$ is
# read as well. `mlsys.counters.StorageTouches` runs a real `nn.Linear` forward and backward under
# PyTorch's dispatcher and lists every operation (views excluded) that touches $W$ or $dW$;
# `ByteCounter` then checks the bytes of all three matmuls against `linear_traffic`.

# %% tags=["hide-input"]
touches = linear_touches(*LINEAR_SHAPE, seed=SEED)  # asserted equal to linear_traffic
glue("w_reads", touches.count("W", kind="read"))
touches_table(touches)

# %% [markdown]
# #### Two claims from a widely shared one-pager, checked
#
# A widely shared one-page summary says that a linear layer's forward plus backward *reads the
# weight matrix three times* and that elementwise ops have an intensity of *1 FLOP/byte*:

# %% tags=["hide-input"]
for name, value in {"claim_ew_fp32": bytes_moved.elementwise_intensity(1, "fp32"),
                    "true_below": h100_ridge / ew_intensity, "claim_ew_bf16": ew_intensity,
                    "claimed_below": h100_ridge / 1.0}.items():
    glue(name, value)
Table(*tables.byte_claims_table(EXAMPLE_TOKENS, EXAMPLE_D, SPEC_DTYPE))

# %% [markdown]
# "1 FLOP/byte" confuses FLOPs per element with FLOPs per byte: it is off by a factor $2b$. The
# factor matters: against the {glue:text}`spec_name`'s bf16 ridge of {glue:text}`h100_ridge:.0f`
# FLOP/byte the claim puts an elementwise op {glue:text}`claimed_below:.0f` times below the ridge;
# it is {glue:text}`true_below:,.0f` times below.
#
# ### Ridge points of every device
#
# The ridge $P/\beta$ of each accelerator in `mlsys.hardware` ({ref}`sec-hardware`), from the dense
# peak of each dtype and the HBM bandwidth (the fp32 column uses the GPUs' non-tensor-core rate, the
# roof for elementwise arithmetic):

# %% tags=["hide-input"]
gpus = [hardware.get(k) for k in ("a100", "h100", "h200", "b200")]
ridges = [g.ridge_intensity("bf16") for g in gpus]
glue("ridge_path", tables.ridge_path(gpus, "bf16"))
glue("ridge_monotone", "climbs every generation" if ridges == sorted(ridges) else
     "does not only climb: a faster memory lowers it as surely as a faster tensor core raises it")
a100 = hardware.A100_80GB_SXM
a100_bw_rounded = float(f"{a100.hbm_bytes_per_s:.1g}")  # the bandwidth rounded to one digit
for name, value in {"a100_ridge": a100.ridge_intensity("fp16"),
                    "a100_ridge_rounded": a100.peak_flop_per_s("fp16") / a100_bw_rounded,
                    "a100_tb_per_s": a100.hbm_bytes_per_s / 1e12,
                    "a100_tb_rounded": a100_bw_rounded / 1e12,
                    "a100_tflops": a100.peak_flop_per_s("fp16") / 1e12}.items():
    glue(name, value)
Table(*tables.ridge_table(hardware.ACCELERATORS.values(), ("fp32", "bf16", "fp8")))

# %% [markdown]
# The bf16 ridge goes {glue:text}`ridge_path` FLOP/byte: it {glue:text}`ridge_monotone`. The A100's
# fp16 ridge is often quoted as {glue:text}`a100_ridge_rounded:.0f`; with its spec bandwidth,
# {glue:text}`a100_tb_per_s:.3f` TB/s, it is {glue:text}`a100_tflops:.0f` /
# {glue:text}`a100_tb_per_s:.3f` = **{glue:text}`a100_ridge:.0f`**, and the quoted figure comes from
# rounding the bandwidth to {glue:text}`a100_tb_rounded:.0f` TB/s.

# %% tags=["remove-input"]
kit.draw(plotting.plot_op_roofline, costs["bf16"], width=9.0, height=4.2, accelerator=SPEC,
         dtype=SPEC_DTYPE)

# %% [markdown]
# ### Tiles and waves
#
# The roofline treats a matmul as one smooth kernel. A GPU computes the output in tiles (128 × 128
# per block, say) and runs the tiles in waves, one per SM at a time here: a dimension one past a
# multiple of the tile pays for a whole row of tiles (**tile quantization**), one tile past a full
# wave pays for a whole wave (**wave quantization**) {cite}`nvidia_matmul_guide`.
# `roofline.tile_waves` counts both on the {glue:text}`spec_name`'s {glue:text}`sm_count` SMs:

# %% tags=["hide-input"]
tw = {(m, n): roofline.tile_waves(m, n, tile_m=128, tile_n=128, sms=SPEC.sm_count)
      for m, n in ((1_536, 1_408), (1_536, 1_536), (8_192, 50_257), (8_192, 50_304))}
assert tw[1_536, 1_536].waves == 2 * tw[1_536, 1_408].waves  # 9% more work, twice the waves
assert tw[8_192, 50_257].tiles == tw[8_192, 50_304].tiles and 50_304 % 64 == 0 < 50_257 % 8
glue("vocab_tiles", f"{tw[8_192, 50_304].tiles:,}")
glue("tw_extra", 100 * (1_536 / 1_408 - 1))  # the work the second wave adds
Table(["output m × n", "128 × 128 tiles", "waves", "useful share of the tiles", "of the waves"],
      [[f"{m:,} × {n:,}", f"{t.tiles:,}", t.waves, f"{t.useful_fraction:.2%}",
        f"{t.wave_fraction:.1%}"] for (m, n), t in tw.items()])

# %% [markdown]
# A 1,536 × 1,536 output is one tile column wider than 1,536 × 1,408,
# {glue:text}`tw_extra:.0f`% more work, and a second, nearly empty wave: about twice the time.
# GPT-2's vocabulary of 50,257 is padded to 50,304 in nanoGPT: for the logits of 8 × 1,024 tokens
# both fill the same {glue:text}`vocab_tiles` tiles, so the padding costs no tile. What it buys is
# alignment: 50,304 is a multiple of 64, so every row of the bf16 weight starts on a 16-byte
# boundary, as vectorized loads and tensor-core kernels want; 50,257 is odd. Pad a dimension to a
# multiple of the tile, and a grid to whole waves.
#
# ### A third roof: communication
#
# A kernel whose inputs or outputs cross a link has a third time, the bytes it sends over the
# link's bandwidth, and the slowest of the three bounds it: its *communication intensity*, FLOPs
# per byte sent, must pass the link's ridge $P/\beta_\text{link}$ {cite}`austin2025scaling`. A
# feed-forward block split over $N$ GPUs by tensor parallelism ($d$ =
# {glue:text}`example_d:,`, $d_\text{ff} = 4d$, {glue:text}`example_tokens:,` tokens, bf16) does
# $4td\,d_\text{ff}/N$ FLOPs per GPU and all-reduces its $t \times d$ output, $2(N-1)/N \cdot
# tdb$ bytes sent per GPU: an intensity of $2d_\text{ff}/((N-1)b)$, whatever the tokens:

# %% tags=["hide-input"]
t_tp, d_tp, link = EXAMPLE_TOKENS, EXAMPLE_D, SPEC.interconnect_bytes_per_s
tp = {n: roofline.estimate(4 * t_tp * d_tp * 4 * d_tp / n, 2 * bytes_moved.matmul_traffic(
    t_tp, 4 * d_tp // n, d_tp, SPEC_DTYPE).total_bytes, spec_roof, comm_bytes=2 * (n - 1) / n
    * t_tp * d_tp * b_spec, link_bytes_per_s=link) for n in (2, 4, 8)}
assert all(e.bound == "compute-bound" for e in tp.values()) and tp[8].comm_s > 0.9 * tp[8].math_s
glue("link_ridge", h100_peak / link)
glue("link_margin", tp[8].math_s / tp[8].comm_s)
Table(["GPUs", "µs: math", "memory", "link", "bound"], [[n, num(e.math_s * 1e6), num(
    e.memory_s * 1e6), num(e.comm_s * 1e6), e.bound] for n, e in tp.items()])

# %% [markdown]
# The link's ridge on the {glue:text}`spec_name` is {glue:text}`link_ridge:,.0f` FLOP per byte
# sent, against $2d_\text{ff}/((N-1)b)$: the intensity falls as $N$ grows, and at $N = 8$ the
# all-reduce takes nearly as long as the math. A link only {glue:text}`link_margin:.2f` times
# slower, or a narrower layer, would make it communication-bound, which is why tensor parallelism
# stays inside a node's NVLink. {ref}`sec-parallelism` prices every axis this way.

# %% [markdown]
# ## The code
#
# `Ceilings` holds the two roofs, from a spec or from measurement; `estimate` turns a kernel's FLOPs
# and bytes into the two times; `roof_problems` lists the measurements that beat their roof, which
# no kernel can do (so the roof or the measurement is wrong):
#
# ```{literalinclude} ../lib/mlsys/roofline.py
# :pyobject: estimate
# ```
#
# ```{literalinclude} ../lib/mlsys/roofline.py
# :pyobject: roof_problems
# ```
#
# The measured roofs come from `mlsys.probes`: a large copy for bandwidth, counting the bytes read
# **plus** the bytes written (the buffer far larger than the last-level cache, or the probe measures
# the cache), and a square matmul for compute:
#
# ```{literalinclude} ../lib/mlsys/probes.py
# :pyobject: copy_probe
# ```
#
# A roof measured minutes before the kernels it judges belongs to another machine when the load
# changes: the probes are timed **interleaved** with the operations, round-robin, and the run is
# repeated until nothing beats its roof, no probe drifts and no timing is too spread to read
# (`mlsys.bench.measure_consistently`). If that never happens, the page shows the numbers and
# withholds its verdict.
#
# ```{literalinclude} ../lib/mlsys/bench.py
# :pyobject: measure_consistently
# ```
#
# ## Measurement
#
# ### Operations on the measured roofline
#
# On a CPU one effect goes first. PyTorch's CPU allocator (c10's) takes its memory from glibc's
# `malloc`, which serves a block above its mmap threshold (128 KiB at first, raised up to 32 MiB on
# 64-bit Linux as large blocks are freed) from a fresh `mmap` and unmaps it on `free`: every fresh
# output of tens of MB is new memory that the OS maps and zeroes page by page (a GPU's caching
# allocator keeps it). The run keeps freed memory mapped (`mlsys.bench.kept_cpu_memory` tells
# glibc to serve large blocks from its heap and never trim it) before timing anything else.

# %%
ops_rows = roofline_ops.run(OPS)
roofline_ops.table(ops_rows)

# %% tags=["remove-cell"]
glue("device_name", env.device_name())
for name, value in roofline_ops.headline(ops_rows).items():  # roofs, attempts, verdicts
    glue(name, value)

# %% tags=["remove-input"]
kit.draw(roofline_ops.plot, ops_rows, width=9.5, height=4.6, accelerator=hardware.detect(),
         title=f"Roofline of {env.device_name()}, {OPS.dtype}")

# %% [markdown]
# On {glue:text}`device_name`: {glue:text}`allocation_text`. The roofs, measured interleaved with
# the operations ({glue:text}`ops_attempts` attempt(s) to a consistent run), are
# {glue:text}`meas_gflops:,.0f` GFLOP/s and {glue:text}`meas_gbps:,.1f` GB/s, a ridge of
# {glue:text}`meas_ridge:.1f` FLOP/byte. What the numbers say, computed from them:
#
# - **Memory-bound operations**: {glue:text}`verdict_memory`.
# - **Matmuls** against the compute roof (a larger matmul, not among them):
#   {glue:text}`verdict_matmul`.
# - **Attention**: {glue:text}`verdict_attention`.
#
# ### Three regimes
#
# 1. **Memory-bound**: $Q/\beta > F/P$. Time is bytes over bandwidth. Fix: move fewer bytes (fuse,
#    use a narrower dtype, keep data on chip).
# 2. **Compute-bound**: $F/P > Q/\beta$. Time is FLOPs over peak. Fix: fewer FLOPs, or faster units
#    (tensor cores, lower precision).
# 3. **Overhead-bound**: the op is so small that the fixed cost of launching it (Python, the
#    dispatcher, a kernel launch) dominates. Fix: bigger ops, compilation, CUDA graphs.
#
# The experiments below put one kernel in each regime, in the order of He's "Making deep learning go
# brrrr from first principles" {cite}`he2022brrrr`. They use the library's fused Triton kernels
# {cite}`triton_tutorials`: compiled and timed on a GPU; without one they run in Triton's CPU
# interpreter, for correctness only. Each is checked against its float64 reference on irregular
# inputs at the library's per-dtype tolerances:

# %% tags=["hide-input"]
from mlsys.kernels import _triton, elementwise, rmsnorm, softmax  # noqa: E402 (starts Triton)

glue("kernel_mode", "interpreted on the CPU" if _triton.INTERPRETED else "compiled on the GPU"
     if _triton.HAS_TRITON else "Triton is not installed (Linux only): the references stand in")
kernel_table(torch.Generator().manual_seed(SEED), "cuda" if env.device() == "cuda" else "cpu")

# %% [markdown]
# All equal their references ({glue:text}`kernel_mode`).
#
# ### (a) Memory-bound to compute-bound: one kernel, k operations per element
#
# `repeat_unary(x, k, "fma")` loads each element once, applies $y \leftarrow ay + b$ $k$ times in
# registers and stores once: $2k$ FLOPs for $2b$ bytes, $I = k/b$. Sweeping $k$ walks one kernel
# along the roofline. The **eager** chain, $k$ separate ops, makes $k$ round trips through memory
# (`eager_chain_bytes`); each of its ops has intensity $2/(2b) = 1/b$, whatever $k$ is. These FMAs
# run on the vector units, not the matrix units, so the compute roof is measured by a probe of its
# own: the fused chain at a large $k$ on a tensor small enough to stay in cache (on a GPU the spec's
# fp32 CUDA-core peak is drawn too). The prediction is $T(k) = \max(2kn / P_\text{vector},
# 2nb/\beta)$. Each eager op and each fused call writes a fresh output, so on a CPU this run too
# keeps freed memory mapped: without it every output would pay the page faults measured above.

# %%
fusion_rows = elementwise_fusion.run(FUSION)
elementwise_fusion.table(fusion_rows)

# %% tags=["remove-cell"]
glue("sweep_verdict", elementwise_fusion.sweep_verdict(fusion_rows))
glue("sweep_model", elementwise_fusion.model_sentence(fusion_rows))

# %% tags=["remove-input"]
kit.draw(elementwise_fusion.plot, fusion_rows, ncols=2, width=10.5, height=5.0,
         accelerator=hardware.detect())

# %% [markdown]
# Measured: {glue:text}`sweep_verdict`. {glue:text}`sweep_model`
#
# ### (b) Fusion: `x.cos().cos()`
#
# Eager PyTorch runs `x.cos().cos()` as two kernels: the first writes `cos(x)` to memory, the second
# reads it back. A fused kernel reads once and writes once. The byte ratio is exactly 2; the time
# ratio follows it only if both versions are memory-bound.

# %% tags=["hide-input"]
assert elementwise.eager_chain_bytes(FUSION.numel, "fp32", 2) == 2 * elementwise.repeat_unary_bytes(
    FUSION.numel, "fp32")
glue("cos_verdict", elementwise_fusion.cos_verdict(fusion_rows))
fp32_ridge = glue("h100_fp32_ridge", SPEC.ridge_intensity("fp32"))
cos_bytes = elementwise.repeat_unary_bytes(1, "fp32")  # fused cos(cos(x)): read + write, 1 element
glue("cos_break_even", fp32_ridge * cos_bytes / 2)  # instructions per cosine
glue("cos_recorded", elementwise_fusion.recorded_cos_text())
elementwise_fusion.cos_table(fusion_rows)

# %% [markdown]
# Measured: {glue:text}`cos_verdict`. The byte ratio predicts the time ratio only inside the
# memory-bound regime. On an {glue:text}`spec_name` the roof for this arithmetic is the fp32 ridge
# of {glue:text}`h100_fp32_ridge:.0f` FLOP/byte; the fused kernel computes two cosines per element
# it reads and writes, so it stays memory-bound, and near twice as fast as eager, as long as a
# cosine costs fewer than {glue:text}`cos_break_even:.0f` instructions.
# {glue:text}`cos_recorded`.
#
# ### (c) Overhead: when size stops mattering
#
# Each eager op costs a fixed amount before any data moves: Python, the dispatcher, on a GPU a
# kernel launch. `x.mul_(1.0)` is timed at sizes from one element up, $n$ and $2n$ interleaved; the
# model is $T(n) = T_0 + 8n/\beta$, $T_0$ the median of the smallest sizes and $\beta$ the same
# in-place op's bandwidth on a buffer far above the caches, in the same run (not the copy probe's:
# a copy on a CPU also reads each destination line before writing it, an in-place op does not).

# %%
overhead_rows = op_overhead.run(OVERHEAD)
display(op_overhead.table(overhead_rows))
op_overhead.remedy_table(overhead_rows)

# %% tags=["remove-cell"]
for name, key in {"doubling_verdict": "doubling", "remedy_verdict": "remedies"}.items():
    glue(name, op_overhead.verdicts(overhead_rows)[key])

# %% tags=["remove-input"]
kit.draw(op_overhead.plot, overhead_rows, ncols=2, width=10.5, height=3.9)

# %% [markdown]
# Measured: {glue:text}`doubling_verdict`. That is the "double the batch, time barely moves" test:
# if it passes, the work is overhead-bound and a bigger batch is nearly free. Remedies, on
# a chain of small fma ops: {glue:text}`remedy_verdict`. `torch.compile` makes the chain one kernel
# but has per-call costs of its own (guards, on a CPU waking the thread pool); a CUDA graph replays
# the recorded launches with one call.
#
# ### The fused kernels, compiled for a GPU
#
# The book's fused kernels (softmax, RMSNorm, the elementwise chain) are memory-bound: each element
# is loaded once, used a few times and stored. A program needs its tile in registers and little
# else, so many programs fit on an SM at once, and many resident warps are what hides the latency
# of their loads. Compiled for an H100 here, without one ({ref}`sec-attention` shows how, and
# `make test` checks every tile): {glue:text}`row_room`. The elementwise chain uses
# {glue:text}`chain_regs` registers whatever its length: its $k$ steps are unrolled into
# {glue:text}`chain_sass` SASS instructions, but each thread only ever holds its own
# {glue:text}`chain_values` values. Wider rows need more registers: past
# {glue:text}`softmax_cols` columns (softmax) and {glue:text}`rmsnorm_cols` (RMSNorm) every tile
# of the backward spills, so the kernels refuse such rows before launch. Predicted at the sizes
# of the GPU run (the roofline's memory time, stretched by the last wave of
# programs; a prediction, not a measurement):

# %% tags=["hide-input"]
report = compile_report.load()
glue("row_room", compile_tables.row_room(report, "sm_90"))
chains = {c.launch.problem["k"]: c for c in report.select("elementwise.repeat_unary", "fp32",
                                                          "sm_90", op="fma")}
glue("chain_regs", " to ".join(str(r) for r in sorted({c.registers for c in chains.values()})))
glue("chain_values", elementwise.BLOCK // (32 * elementwise.NUM_WARPS))
glue("chain_sass", f"{chains[0].sass_instructions} (k = 0) to "
     f"{chains[max(chains)].sass_instructions:,} (k = {max(chains)})")
glue("softmax_cols", f"{softmax.MAX_COLS:,}")
glue("rmsnorm_cols", f"{rmsnorm.MAX_COLS:,}")
FUSED_GPU = fused_kernels.SIZES["gpu"]
compile_predictions.row_predictions(report, "sm_90", FUSED_GPU.numel, FUSED_GPU.rows)

# %% [markdown]
# ### Recorded GPU results
#
# `python -m mlsys.experiments` runs the same experiments in GPU sizes on a GPU and records them
# under `results/` with their device, versions and date; `fused_kernels` also times the Triton
# kernels against eager PyTorch and `torch.compile`. Every record present is shown here through the
# same functions as the live run above. {glue:text}`missing_records`

# %% tags=["remove-input"]
missing = glue("missing_records", experiments.show_records(
    ("roofline_ops", "elementwise_fusion", "op_overhead", "fused_kernels"),
    shows={"roofline_ops": show_roofline_ops}))

# %% [markdown]
# ```{admonition} Takeaway
# :class: tip
# Intensity decides: a square bf16 matmul is compute-bound on an {glue:text}`spec_name` from $N =$
# {glue:text}`n_star`, while an elementwise op ({glue:text}`claim_ew_bf16` FLOP/byte in bf16, not 1)
# never uses more than {glue:text}`ew_fraction_pct:.2g`% of the peak, and naive attention never gets
# past $(d_\text{head} + 3/2)/b$ FLOP/byte. On this machine, with roofs of
# {glue:text}`meas_gflops:,.0f` GFLOP/s and {glue:text}`meas_gbps:,.1f` GB/s measured alongside:
# {glue:text}`verdict_memory`.
# ```
#
# ## Exercises
#
# ### Q1 When does a linear layer become compute-bound?
#
# A bf16 linear layer with $d_\text{in} = d_\text{out} = 4096$ runs on an H100. From how many tokens
# is its forward matmul compute-bound? Use `matmul_intensity`, then derive the closed form.

# %% tags=["hide-cell"]
d_q1, ridge_q1 = 4096, glue("q1_ridge", hardware.H100_SXM.ridge_intensity("bf16"))
tokens_q1 = next(t for t in range(1, 1 << 20)
                 if bytes_moved.matmul_intensity(t, d_q1, d_q1, "bf16") >= ridge_q1)
# I = 2 t d^2 / (2 (t d + d^2 + t d)) = t d / (d + 2t) >= R  <=>  t >= R d / (d - 2R)
assert glue("q1_tokens", tokens_q1) == math.ceil(ridge_q1 * d_q1 / (d_q1 - 2 * ridge_q1))

# %% [markdown]
# ```{dropdown} Answer
# $I = 2td^2 / (b(2td + d^2)) = td/(d + 2t)$ in bf16, which tends to $t$ for $t \ll d$: a linear
# layer's intensity is roughly its token count. Setting it equal to the ridge
# {glue:text}`q1_ridge:.0f` gives $t \ge Rd/(d - 2R)$ = **{glue:text}`q1_tokens` tokens**, which the
# search over `matmul_intensity` confirms. Below that (decoding one sequence, a tiny batch) the
# layer is memory-bound: its time is the time to read the weights.
# ```
#
# ### Q2 Naive against tiled attention at 8,192 tokens
#
# For one layer's attention forward at $T = 8192$, batch 1, 32 heads of 128, bf16: how many bytes do
# the naive and the tiled kernels move, and what does a tiled kernel with query blocks of 128 move?

# %% tags=["hide-cell"]
seq_q2, heads_q2, d_q2 = 8192, 32, 128
naive_q2 = bytes_moved.naive_attention_traffic(1, heads_q2, seq_q2, d_q2, "bf16").total_bytes
tiled_q2, blocked_q2 = (bytes_moved.tiled_attention_traffic(1, heads_q2, seq_q2, d_q2, "bf16",
                                                            block_q=b).total_bytes
                        for b in (None, 128))  # the ideal, and query blocks of 128
assert naive_q2 == heads_q2 * 4 * seq_q2 * (seq_q2 + d_q2) * 2  # 4T(T + d) per head
assert 2 * blocked_q2 == naive_q2  # exactly half, since block_q = d_head
for name, value in {"q2_naive_gb": naive_q2 / 1e9, "q2_tiled_mb": tiled_q2 / 1e6,
                    "q2_blocked_gb": blocked_q2 / 1e9, "q2_ratio": naive_q2 / tiled_q2}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# Naive: $4T(T + d)$ elements per head, {glue:text}`q2_naive_gb:.2f` GB. Tiled, ideally: $4Td$,
# {glue:text}`q2_tiled_mb:.0f` MB, {glue:text}`q2_ratio:.0f` times less. With query blocks of 128,
# $K$ and $V$ are read once per block: $2Td(T/b_q + 1)$ elements, {glue:text}`q2_blocked_gb:.2f` GB,
# which is *exactly half* the naive figure here because $b_q = d_\text{head}$ makes it $2T(T + d)$.
# It is an upper bound: the re-reads of $K$ and $V$ mostly hit the L2 cache.
# ```
#
# ### Q3 (multi-step) One preset, end to end: state, FLOPs, kernels, time
#
# Train the `xl` preset on 8 H100s with bf16 mixed-precision AdamW, batch 8 × 1,024 tokens per GPU,
# chaining chapters 02, 03 and this one. (a) How many bytes of model state does each GPU hold
# (replicated), and what is left of its memory for activations? (b) How many FLOPs does one step
# cost per GPU? (c) From (b), how long is a step at 40% MFU? (d) Is that MFU plausible: what are
# the intensities of the largest matmul (the SwiGLU up-projection) and of an RMSNorm against the
# ridge?

# %% tags=["hide-cell"]
xl = TransformerConfig.preset("xl")
trace = napkin(xl, "h100", batch=8, seq=1024, mfu=0.4, n_devices=8, name="xl")  # the whole chain
kernels = {k.name: k for k in trace.kernels}
up, norm = kernels["SwiGLU up-projection w1"], kernels["RMSNorm"]
assert trace.replicated_bytes_per_device == 16 * params.count_params(xl) < SPEC.hbm_bytes
assert trace.step_flops_per_device == flops.transformer_flops(xl, 8, 1024).training_matmul_flops
assert up.intensity_flop_per_byte == bytes_moved.matmul_intensity(8 * 1024, xl.d_ff, xl.d_model)
assert norm.bound == "memory-bound" and up.bound == "compute-bound"  # one on each side
for name, value in {"q4_state_gb": trace.replicated_bytes_per_device / 1e9,
                    "q4_params_b": params.count_params(xl) / 1e9,
                    "q4_left_gb": (SPEC.hbm_bytes - trace.replicated_bytes_per_device) / 1e9,
                    "q4_ms": trace.step_s * 1e3, "q4_tflop": trace.step_flops_per_device / 1e12,
                    "q4_up": up.intensity_flop_per_byte, "q4_norm": norm.intensity_flop_per_byte,
                    "q4_norm_below": h100_ridge / norm.intensity_flop_per_byte}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# (a) 16 B/param × {glue:text}`q4_params_b:.2f`B parameters = {glue:text}`q4_state_gb:.1f` GB per
# GPU (replicated: every GPU holds everything), which leaves {glue:text}`q4_left_gb:.0f` GB of
# the 80 for activations. (b) One step costs {glue:text}`q4_tflop:.1f` TFLOP per GPU: 3 × the
# forward matmuls of its 8 × 1,024 tokens (chapter 03). (c) At 40% of the dense peak, (b) takes
# {glue:text}`q4_ms:.0f` ms. (d) The up-projection has intensity {glue:text}`q4_up:,.0f`
# FLOP/byte, above the ridge of {glue:text}`h100_ridge:.0f`, so the matmuls that hold almost all
# the FLOPs can run near the peak; an RMSNorm has {glue:text}`q4_norm:.2g`,
# {glue:text}`q4_norm_below:.0f` times below the ridge: its time is bytes, not FLOPs, and it is
# part of what keeps MFU well below 100%. The cell asks `mlsys.accounting.napkin` for the whole
# chain and checks its links against the chapters' functions; `python -m mlsys napkin --preset xl
# --gpu H100 --batch 8 --seq 1024 --devices 8` prints it for any preset.
# ```
#
# ### Q4 (find the error) A GELU at the compute roof
#
# "A bf16 GELU over an 8,192 × 8,192 activation does about 20 FLOPs per element, 1.3 GFLOP in all;
# at the H100's 989 TFLOP/s that takes 1.4 µs." What is wrong, and how long does it take at least?

# %% tags=["hide-cell"]
n_q5, flops_per_element = 8192 * 8192, 20
gelu = roofline.estimate(flops_per_element * n_q5,
                         bytes_moved.elementwise_traffic(n_q5, "bf16").total_bytes, spec_roof)
claimed_s = flops_per_element * n_q5 / h100_peak
assert gelu.bound == "memory-bound" and gelu.time_s > 10 * claimed_s
assert flops_per_element / (2 * b_spec) < h100_ridge / 10  # more than ten times below the ridge
for name, value in {"q5_claimed_us": claimed_s * 1e6, "q5_us": gelu.time_s * 1e6,
                    "q5_intensity": flops_per_element / (2 * b_spec)}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# It uses the compute roof for a memory-bound op. Its intensity is $20/(2b) =$
# {glue:text}`q5_intensity:.0f` FLOP/byte, under a tenth of the ridge's
# {glue:text}`h100_ridge:.0f`, so the time is the bytes over the
# bandwidth: {glue:text}`q5_us:.0f` µs, not {glue:text}`q5_claimed_us:.1f` µs (and on the matrix
# units' peak at that: GELU runs on the vector units, whose fp32 peak is much lower).
# ```
#
# ### Q5 (find the error) Half a megabyte on chip
#
# A widely shared one-pager lists the A100's memory as: registers about 256 KB, L1/shared memory
# 192 KB, L2 40 MB, HBM 80 GB. A reader concludes: "besides its L2, the A100 keeps less than half a
# megabyte on the chip, about a hundredth of the L2". What is wrong? How much do the registers and
# the shared memory hold in all, against the L2? (Use `hierarchy.memory_levels`.)

# %% tags=["hide-cell"]
a100_levels = {lv.name: lv for lv in hierarchy.memory_levels(hardware.A100_80GB_SXM)}
regs_a100, smem_a100 = a100_levels["registers"], a100_levels["shared memory / L1"]
claimed_on_chip = (256 + 192) * 1e3  # the one-pager's two figures, as one chip's total
on_chip_a100 = regs_a100.total_bytes + smem_a100.total_bytes
assert regs_a100.per_sm_bytes == 256 * 2**10  # the one-pager's register figure is one SM's
assert on_chip_a100 > a100_levels["L2 cache"].total_bytes > 50 * claimed_on_chip
for name, value in {"q6_sms": hardware.A100_80GB_SXM.sm_count,
                    "q6_regs_mib": regs_a100.total_bytes / 2**20,
                    "q6_smem_kib": smem_a100.per_sm_bytes / 2**10,
                    "q6_smem_mib": smem_a100.total_bytes / 2**20,
                    "q6_on_chip_mib": on_chip_a100 / 2**20,
                    "q6_l2_mib": a100_levels["L2 cache"].total_bytes / 2**20,
                    "q6_factor": on_chip_a100 / claimed_on_chip}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# The register and shared-memory figures are *per SM*, and the L2 and HBM figures are for the
# whole chip: the table mixes the two. The A100 has {glue:text}`q6_sms` SMs, each with 64K 32-bit
# registers (256 KiB) and up to {glue:text}`q6_smem_kib:.0f` KiB of shared memory (of the 192 KB
# it shares with L1). In all: {glue:text}`q6_regs_mib:.1f` MiB of registers and
# {glue:text}`q6_smem_mib:.1f` MiB of shared memory, {glue:text}`q6_on_chip_mib:.0f` MiB, more
# than the {glue:text}`q6_l2_mib:.0f` MiB L2 and about {glue:text}`q6_factor:.0f` times the
# reader's half megabyte. What the per-SM figure does limit is one program: a kernel's tile must
# fit *one* SM's registers and shared memory ({ref}`sec-attention` picks FlashAttention's tiles by
# it).
# ```
#
# ### Q6 (code) A matmul on the roofline
#
# Write the attainable FLOP/s of $C[m, n] = A[m, k] \cdot B[k, n]$ on a device with peak
# `peak_flop_per_s` and memory bandwidth `bytes_per_s`, for elements of `bytes_per_element` bytes:
# its arithmetic intensity from the minimum traffic (each operand read once, $C$ written once),
# then the roof. The hidden cell checks it against `mlsys.accounting.bytes` and `mlsys.roofline`
# on the {glue:text}`spec_name` in bf16, from a decode step (one token) to a large square matmul.

# %%
def attainable_flop_per_s(m, n, k, bytes_per_element, peak_flop_per_s, bytes_per_s):
    """The roofline's attainable FLOP/s of an (m x k) @ (k x n) matmul."""  # <- your code here
    raise NotImplementedError("the intensity first, then the roof")


# %% tags=["hide-cell"]
# The book's solution (opened on demand). `solved_by` checks the reader's function once it is
# written, and the book's while it is not.
def attainable_flop_per_s_solution(m, n, k, bytes_per_element, peak_flop_per_s, bytes_per_s):
    intensity = 2 * m * n * k / (bytes_per_element * (m * k + k * n + m * n))  # FLOP per byte
    return min(peak_flop_per_s, intensity * bytes_per_s)


SHAPES_Q6 = ((1, 4096, 4096), (64, 4096, 4096), (1024, 4096, 4096), (4096, 4096, 4096))
roof_q6 = {}
for shape in SHAPES_Q6:
    roof_q6[shape], whose = solved_by(attainable_flop_per_s, attainable_flop_per_s_solution,
                                      *shape, b_spec, h100_peak, h100_bw)
    expected = spec_roof.attainable_flop_per_s(bytes_moved.matmul_intensity(*shape, SPEC_DTYPE))
    assert math.isclose(roof_q6[shape], expected, rel_tol=1e-9), shape
assert roof_q6[SHAPES_Q6[2]] == roof_q6[SHAPES_Q6[3]] == h100_peak > roof_q6[SHAPES_Q6[0]]
for name, value in {"q7_decode_tflops": roof_q6[SHAPES_Q6[0]] / 1e12,
                    "q7_decode_pct": 100 * roof_q6[SHAPES_Q6[0]] / h100_peak,
                    "q7_64_pct": 100 * roof_q6[SHAPES_Q6[1]] / h100_peak}.items():
    glue(name, value)
print(f"checked: {whose} solution matches mlsys.roofline on {len(SHAPES_Q6)} shapes")

# %% [markdown]
# ```{dropdown} Answer
# $I = 2mnk / (b\,(mk + kn + mn))$, then $\min(P, I\beta)$. With one token against a 4096 × 4096
# bf16 weight, $I \approx 1$ FLOP/byte: the matmul reaches {glue:text}`q7_decode_tflops:.1f`
# TFLOP/s, {glue:text}`q7_decode_pct:.2f`% of the peak, because it must read the whole weight for
# one row of output. With 64 tokens it reaches {glue:text}`q7_64_pct:.0f`%; from a little over the
# ridge's worth of tokens (Q1) it sits on the compute roof.
# ```
#
# ### Q7 (find the error) "About 50 operations"
#
# Notes on He's essay {cite}`he2022brrrr` say: an A100 moves 1.5 TB/s, 400 billion fp32 numbers a
# second, and computes 19.5 TFLOP/s, 20 trillion operations: so an elementwise op needs "roughly
# around 50 operations" per number before compute, not memory, limits it. What does that count
# leave out, and what are the numbers, reads only and read + write, on the A100 40 GB and 80 GB
# (`byte_checks.ops_per_element`)?

# %% tags=["hide-cell"]
checks_04 = experiments.byte_checks  # (imported above with kernel_table)
he = {(gpu, moved): checks_04.ops_per_element(a100.peak_flop_per_s("fp32"), bw, moved)
      for gpu, bw in (("40", hardware.A100_40GB_HBM_BYTES_PER_S), ("80", a100.hbm_bytes_per_s))
      for moved in (4, 8)}  # an fp32 element read (4 B), or read and written back (8 B)
assert round(he["40", 4]) == 50 and he["40", 8] > 2 * 49 and he["80", 4] < 40 < he["80", 8] < 80
for (gpu, moved), value in he.items():
    glue(f"he_{gpu}_{moved}", value)

# %% [markdown]
# ```{dropdown} Answer
# The 50 counts only the reads: a unary op also writes its result back, 8 bytes per fp32 element,
# not 4. And 1.5 TB/s is the 40 GB A100 ({cite}`nvidia_a100_datasheet`: 1,555 GB/s; the 80 GB has
# 2,039 GB/s at the same 19.5 TFLOP/s). Operations per element at the break-even, $P \cdot
# (\text{bytes per element}) / \beta$: on the 40 GB, {glue:text}`he_40_4:.0f` reads only and
# **{glue:text}`he_40_8:.0f`** read + write; on the 80 GB, {glue:text}`he_80_4:.0f` and
# **{glue:text}`he_80_8:.0f`**: about a hundred on the GPU of the notes, once the write is
# counted. The fused chain of (a) measures the same turn, $k^*$, on this machine.
# ```
#
# ## Summary
#
# - Arithmetic intensity $I = F/Q$ decides what limits a kernel: attainable FLOP/s $= \min(P,
#   I\beta)$, memory-bound below the ridge $P/\beta$, compute-bound above it; both depend on dtype.
# - A square matmul has $I = 2N/(3b)$ and a linear layer about $t$, its token count (bf16); batching
#   through shared weights raises intensity.
# - Elementwise ops, softmax and norms have intensity $O(1/b)$ ({glue:text}`claim_ew_fp32` FLOP/byte
#   for a unary fp32 op, not 1): only fusion makes them faster. Naive attention's $T^2$ traffic caps
#   its intensity at $(d_\text{head} + 3/2)/b$; tiled attention removes it.
# - A linear layer's forward and backward read $W$ twice and write $dW$ once, not "three reads".
# - Ridges: {glue:text}`a100_ridge:.0f` FLOP/byte for an A100 in fp16, {glue:text}`h100_ridge:.0f`
#   for an H100 in bf16; they do not only climb with each generation.
# - A matmul runs in whole tiles and whole waves of tiles (pad a dimension to the tile, as a
#   vocabulary to 50,304); a kernel that sends data has a third roof, its FLOPs per byte sent
#   against the link's ridge.
# - Roofs measured interleaved with the operations, and verdicts withheld when the numbers
#   contradict each other; below a size where bytes take less than the per-op overhead, only the
#   overhead matters.
