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
# **Question.** An H100 reads memory at {glue:text}`h100_tb_per_s:.2f` TB/s and multiplies bf16 matrices at
# {glue:text}`h100_tflops:.0f` TFLOP/s: how large must a square bf16 matmul be before arithmetic, not memory,
# limits it, and what fraction of the peak can an elementwise op ever reach?

# %% tags=["remove-cell"]
# Colab or a fresh kernel: install the book's library when it is missing (a no-op in the book's own environment).
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("mlsys") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+https://github.com/mlsys-book/mlsys-book.git"], check=True)

# %%
from mlsys import env

env.setup_triton()  # before any Triton kernel is defined: without a GPU, kernels run in Triton's CPU interpreter
print(env.describe())

# %%
# The kernel modules first: they define Triton kernels, which must come after setup_triton().
from mlsys.kernels import _triton, elementwise, rmsnorm, softmax  # isort: skip
from mlsys.kernels import benchmark as kernel_benchmark  # isort: skip

import contextlib
import functools
import math
import statistics

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from IPython.display import display
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mlsys import bench, hardware, plotting, results, roofline
from mlsys.accounting import bytes as B
from mlsys.accounting import flops
from mlsys.dtypes import bytes_per_element
from mlsys.book import Table, glue, num
from mlsys.plotting import COLORS, CYCLE, finish, subplots
from mlsys.counters import ByteCounter

# %% tags=["parameters"]
SEED = 0
USE_COMPILE = env.pick(smoke=False, cpu=True, gpu=True)  # torch.compile: ~25 s cold per process on a CPU
DTYPE = env.pick(smoke="fp32", cpu="fp32", gpu="bf16")  # dtype of the roofline measurements
COPY_BYTES = env.pick(smoke=2**26, cpu=2**28, gpu=2**31)  # bandwidth probe buffer, far above the last-level cache
MATMUL_SIZES = env.pick(smoke=(128, 256, 512, 1024), cpu=(256, 512, 1024, 2048), gpu=(1024, 2048, 4096, 8192))
SKINNY_ROWS = 16  # rows of the skinny matmul: a decode step's tokens against a square weight
NUMEL = env.pick(smoke=2**24, cpu=2**24, gpu=2**26)  # elements per tensor of the elementwise / row-wise ops
ROW = env.pick(smoke=1024, cpu=1024, gpu=4096)  # row length of softmax and RMSNorm
ATTN_SHAPE = env.pick(smoke=(1, 8, 1024, 64), cpu=(1, 8, 2048, 64), gpu=(4, 16, 2048, 64))  # batch heads seq d_head
SWEEP_NUMEL = env.pick(smoke=2**24, cpu=2**24, gpu=2**26)  # (a): fp32 elements of the k-sweep
KS = env.pick(smoke=(1, 2, 4, 8, 16), cpu=(1, 2, 4, 8, 16, 32, 64), gpu=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
OVERHEAD_SIZES = tuple(4**i for i in range(13))  # (c): 1 ... 16M elements
OPS_PER_SAMPLE = 20  # (c): ops timed back to back per sample; the time per op is the sample / this
CHAIN_LEN, SMALL_NUMEL, BIG_FACTOR = 10, 4096, 64  # (c): a chain of 10 small ops, and the same on 64x the data
WARMUP, REPEATS = env.pick(smoke=(2, 7), cpu=(3, 15), gpu=(5, 30))
# Napkin math (no measurement): the device, dtype and sizes of the intensity tables
SPEC, SPEC_DTYPE = hardware.H100_SXM, "bf16"
EXAMPLE_D, EXAMPLE_TOKENS, EXAMPLE_BATCH = 4096, 4096, 64  # linear layers, batched matmuls
EXAMPLE_ATTN = (1, 32, 4096, 128)  # batch heads seq d_head

# %% tags=["remove-cell"]
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


MARKERS = ["o", "s", "D", "^", "v", "<", ">", "P", "X", "*", "h", "p"]


timed = functools.partial(bench.benchmark, warmup=WARMUP, repeats=REPEATS)  # the chapter's one way to time


# %% [markdown]
# A kernel does arithmetic on data that lives in memory. Every byte it needs has to be read from memory
# (HBM on a GPU, DRAM on a CPU) and every result written back, and the arithmetic units can only go as fast
# as those bytes arrive. This chapter counts the bytes, as {ref}`sec-flops` counted the FLOPs, and puts the
# two together in the roofline model {cite}`williams2009roofline,austin2025scaling`: one number per kernel, its arithmetic
# intensity, says whether memory or arithmetic limits it. Then it measures both limits on the machine
# running this page and checks the predictions against kernels of every kind.
#
# ## Napkin math
#
# ### Intensity and the roofline
#
# A kernel that does $F$ FLOPs while moving $Q$ bytes has **arithmetic intensity** $I = F / Q$ FLOP per
# byte. On a device with peak $P$ FLOP/s and memory bandwidth $\beta$ bytes/s it takes at least
#
# $$ T = \max\left(\frac{F}{P}, \frac{Q}{\beta}\right), \qquad
#    \text{attainable FLOP/s} = \frac{F}{T} = \min(P,\; I \cdot \beta). $$
#
# The two terms are equal at the **ridge point** $I^* = P / \beta$. Below it a kernel is *memory-bound*
# (faster memory would speed it up, faster arithmetic would not); above it, *compute-bound*. Both $F$ and $Q$
# depend on the dtype: $Q$ through the bytes per element $b$, and $P$ because matrix units run faster on
# narrower types. On an H100 in bf16:

# %%
h100_peak = SPEC.peak_flop_per_s(SPEC_DTYPE)
h100_bw = SPEC.hbm_bytes_per_s
h100_ridge = SPEC.ridge_intensity(SPEC_DTYPE)
b_spec = bytes_per_element(SPEC_DTYPE)
# A square N-matmul has I = 2N / (3b): compute-bound from N = 3 b I* / 2.
n_star = math.ceil(3 * b_spec * h100_ridge / 2)
assert B.matmul_intensity(n_star, n_star, n_star, SPEC_DTYPE) >= h100_ridge > B.matmul_intensity(
    n_star - 1, n_star - 1, n_star - 1, SPEC_DTYPE)
# An elementwise op doing one FLOP per element in bf16 reads 2 bytes and writes 2.
ew_intensity = B.elementwise_intensity(1, SPEC_DTYPE)
ew_fraction = roofline.Ceilings.from_spec(SPEC, SPEC_DTYPE).attainable_flop_per_s(ew_intensity) / h100_peak
assert ew_intensity == 1 / (2 * b_spec) and math.isclose(ew_fraction, ew_intensity / h100_ridge)
for name, value in {"h100_tb_per_s": h100_bw / 1e12, "h100_tflops": h100_peak / 1e12, "h100_ridge": h100_ridge,
                    "n_star": n_star, "ew_intensity": ew_intensity, "ew_fraction_pct": 100 * ew_fraction,
                    "spec_name": SPEC.name}.items():
    glue(name, value)
print(f"{SPEC.name}: {h100_peak / 1e12:.1f} TFLOP/s dense {SPEC_DTYPE}, {h100_bw / 1e12:.2f} TB/s "
      f"-> ridge {h100_ridge:.0f} FLOP/byte")
print(f"square {SPEC_DTYPE} matmul compute-bound from N = {n_star}; "
      f"elementwise (1 FLOP/element): I = {ew_intensity} FLOP/byte, at most {ew_fraction:.3%} of peak")

# %% [markdown]
# The answer to the question, before anything runs: a square bf16 matmul needs $N \ge$
# {glue:text}`n_star` to be compute-bound on an {glue:text}`spec_name` (ridge {glue:text}`h100_ridge:.0f`
# FLOP/byte), and an elementwise op that does one FLOP per element has intensity
# {glue:text}`ew_intensity` FLOP/byte in bf16, so it can never use more than
# {glue:text}`ew_fraction_pct:.2g`% of the peak, however well it is written. The sections below derive the
# intensity of every kind of kernel in a transformer; all of it comes from `mlsys.accounting.bytes`, which
# counts the *minimum* traffic: each input read once, each output written once.
#
# ### Matrix multiplication
#
# $C = AB$ with $A$ of $m \times k$ and $B$ of $k \times n$ does $2mnk$ FLOPs and, at minimum, reads
# $(mk + kn)$ elements and writes $mn$:
#
# ```{literalinclude} ../lib/mlsys/accounting/bytes.py
# :pyobject: matmul_traffic
# ```
#
# For a square matmul, $I = 2N^3 / (3N^2 b) = 2N / (3b)$: intensity grows with size, so a small matmul is
# memory-bound and a large one compute-bound. A *skinny* matmul, $m$ tokens against an $n \times n$ weight
# (a decode step, a small batch), has $I \approx 2m / b$ once $n \gg m$: its intensity is set by the number of
# tokens, not by the weight's size.

# %%
square_rows = []
for n in (16, 64, 256, 1024, 4096, 16384):
    row = [n]
    for dt in ("fp32", "bf16"):
        i_sq = B.matmul_intensity(n, n, n, dt)
        assert math.isclose(i_sq, 2 * n / (3 * bytes_per_element(dt)), rel_tol=1e-12)  # the law
        row.append(f"{i_sq:,.1f}")
    row.append(roofline.Ceilings.from_spec(SPEC, SPEC_DTYPE).bound(B.matmul_intensity(n, n, n, SPEC_DTYPE)))
    square_rows.append(row)
display(Table(["N", "I fp32 (FLOP/B)", "I bf16 (FLOP/B)", f"{SPEC.name}, {SPEC_DTYPE}"], square_rows))

skinny_rows = []
for m in (1, 16, 128, 1024, EXAMPLE_TOKENS):
    i_sk = B.matmul_intensity(m, EXAMPLE_D, EXAMPLE_D, SPEC_DTYPE)
    assert i_sk < 2 * m / b_spec  # the large-n limit is an upper bound
    skinny_rows.append([m, f"{i_sk:,.1f}", f"{2 * m / b_spec:,.0f}", roofline.Ceilings.from_spec(
        SPEC, SPEC_DTYPE).bound(i_sk)])
display(Table([f"tokens m (x [{EXAMPLE_D} x {EXAMPLE_D}] weight)", "I bf16", "2m/b", f"{SPEC.name}"], skinny_rows))

# %% [markdown]
# A **batched** matmul multiplies many $A_i$ by either one shared $B$ (a linear layer applied to every
# sequence of a batch) or a different $B_i$ each (attention's per-head products, per-sample weights). A
# shared operand is read once for the whole batch:
#
# ```{literalinclude} ../lib/mlsys/accounting/bytes.py
# :pyobject: batched_matmul_traffic
# ```

# %%
batch_rows = []
for m in (1, 16, 128):
    row = [EXAMPLE_BATCH, m]
    for shared in (True, False):
        tr = B.batched_matmul_traffic(EXAMPLE_BATCH, m, EXAMPLE_D, EXAMPLE_D, SPEC_DTYPE, shared_b=shared)
        row.append(f"{B.intensity(EXAMPLE_BATCH * flops.matmul_flops(m, EXAMPLE_D, EXAMPLE_D), tr):,.1f}")
    # sharing B makes the batch one big matmul of batch*m rows
    shared_tr = B.batched_matmul_traffic(EXAMPLE_BATCH, m, EXAMPLE_D, EXAMPLE_D, SPEC_DTYPE, shared_b=True)
    assert shared_tr == B.matmul_traffic(EXAMPLE_BATCH * m, EXAMPLE_D, EXAMPLE_D, SPEC_DTYPE)
    batch_rows.append(row)
glue("example_batch", EXAMPLE_BATCH)
glue("example_d", EXAMPLE_D)
Table(["batch", "rows per item m", "I, shared B (bf16)", "I, one B per item (bf16)"], batch_rows)

# %% [markdown]
# With a shared weight the batch is one matmul of $\text{batch} \cdot m$ rows (the assert checks it), and its
# intensity grows with the batch; with a weight per item, every item pays for its own $B$ and the intensity
# stays that of one skinny matmul. This is why batching tokens through the same weights is the first thing
# that makes a GPU efficient.
#
# ### Elementwise ops, softmax and norms: FLOPs per *byte*
#
# An elementwise op reads each input element and writes each output element once, so its intensity is
# $\text{FLOPs per element} / ((\text{inputs} + 1)\, b)$:
#
# ```{literalinclude} ../lib/mlsys/accounting/bytes.py
# :pyobject: elementwise_intensity
# ```
#
# Softmax and RMSNorm are row-wise: a fused kernel reads a row once, reduces it, and writes it once, so they
# are elementwise ops with a few FLOPs per element. LayerNorm also reads a bias. The FLOP counts per element
# are the kernel modules' (`softmax_flops`, `rmsnorm_flops`) and, for LayerNorm, the estimate in the
# parameters cell.

# %%
def op_intensities(dt):
    """Intensity (FLOP/byte) of the book's operations at the napkin sizes, in dtype `dt`."""
    rows, cols = EXAMPLE_TOKENS, EXAMPLE_D
    bsz, heads, seq, d_head = EXAMPLE_ATTN
    attn_flops = bsz * heads * 2 * flops.matmul_flops(seq, seq, d_head) + softmax.softmax_flops((bsz, heads, seq, seq))
    lin = B.linear_traffic(EXAMPLE_TOKENS, EXAMPLE_D, EXAMPLE_D, dt)
    lin_flops = flops.linear_flops(EXAMPLE_TOKENS, EXAMPLE_D, EXAMPLE_D) + flops.linear_backward_flops(
        EXAMPLE_TOKENS, EXAMPLE_D, EXAMPLE_D)
    return {
        f"square matmul N = {EXAMPLE_D}": B.matmul_intensity(EXAMPLE_D, EXAMPLE_D, EXAMPLE_D, dt),
        "square matmul N = 64": B.matmul_intensity(64, 64, 64, dt),
        f"skinny matmul {SKINNY_ROWS} x {EXAMPLE_D} x {EXAMPLE_D}": B.matmul_intensity(
            SKINNY_ROWS, EXAMPLE_D, EXAMPLE_D, dt),
        f"linear layer fwd + bwd, {EXAMPLE_TOKENS} tokens, d = {EXAMPLE_D}": B.intensity(lin_flops, lin.total),
        "elementwise unary (1 FLOP/element)": B.elementwise_intensity(1, dt),
        "elementwise binary add": B.elementwise_intensity(1, dt, n_inputs=2),
        f"softmax, rows of {cols}": B.intensity(softmax.softmax_flops((rows, cols)), B.softmax_traffic(rows, cols, dt)),
        f"RMSNorm, rows of {cols}": B.intensity(rmsnorm.rmsnorm_flops((rows, cols)), B.norm_traffic(rows, cols, dt)),
        f"LayerNorm, rows of {cols}": B.intensity(flops.LAYERNORM_OPS_PER_ELEMENT * rows * cols,
                                                  B.norm_traffic(rows, cols, dt, has_bias=True)),
        f"naive attention, seq {seq}, d_head {d_head}": B.intensity(
            attn_flops, B.naive_attention_traffic(bsz, heads, seq, d_head, dt)),
        f"tiled attention, seq {seq}, d_head {d_head}": B.intensity(
            attn_flops, B.tiled_attention_traffic(bsz, heads, seq, d_head, dt)),
    }


napkin = {dt: op_intensities(dt) for dt in ("fp32", "bf16")}
spec_roof = roofline.Ceilings.from_spec(SPEC, SPEC_DTYPE)
assert napkin["fp32"]["elementwise unary (1 FLOP/element)"] == 1 / 8  # read 4 B, write 4 B
assert napkin["bf16"]["elementwise unary (1 FLOP/element)"] == 1 / 4
assert napkin["fp32"]["elementwise binary add"] == 1 / 12
Table(["operation", "I fp32 (FLOP/B)", "I bf16 (FLOP/B)", f"{SPEC.name} {SPEC_DTYPE}: bound",
       "at most % of peak"],
      [[op, f"{napkin['fp32'][op]:.3g}", f"{napkin['bf16'][op]:.3g}", spec_roof.bound(napkin["bf16"][op]),
        f"{100 * spec_roof.attainable_flop_per_s(napkin['bf16'][op]) / spec_roof.flop_per_s:.3g}"]
       for op in napkin["bf16"]])

# %% [markdown]
# Everything that is not a large matmul sits two to three orders of magnitude below the ridge. That is the
# whole case for **fusion**: an elementwise op cannot be made compute-bound, only merged into a neighbour so
# its bytes never travel on their own.
#
# ### Attention: the $S^2$ terms
#
# Attention computes $S = QK^\top$, $P = \operatorname{softmax}(S)$ and $O = PV$. Written as three kernels,
# the $S \times S$ matrices $S$ and $P$ go to memory and back: four $S^2$ terms per head. A tiled
# (FlashAttention-style) kernel {cite}`dao2022flashattention` keeps each block of scores on chip and moves only
# $Q, K, V$ and $O$, or, streaming $K$ and $V$ once per block of `block_q` queries, $\lceil S/\text{block\_q}
# \rceil$ passes over them.
#
# ```{literalinclude} ../lib/mlsys/accounting/bytes.py
# :pyobject: naive_attention_traffic
# ```
#
# The FLOPs, $4S^2 d$ per head for the two matmuls, are the same for both. So the naive kernel's intensity
# *saturates* near $4S^2d / (4S^2 b) = d/b$ (the $S^2$ traffic grows as fast as the FLOPs), while the tiled
# kernel's grows with $S$:

# %%
bsz, heads, _, d_head = EXAMPLE_ATTN
attn_rows = []
for seq in (256, 1024, 4096, 16384, 65536):
    attn_flops = bsz * heads * 2 * flops.matmul_flops(seq, seq, d_head)
    naive = B.naive_attention_traffic(bsz, heads, seq, d_head, SPEC_DTYPE)
    tiled = B.tiled_attention_traffic(bsz, heads, seq, d_head, SPEC_DTYPE)
    blocked = B.tiled_attention_traffic(bsz, heads, seq, d_head, SPEC_DTYPE, block_q=128)
    assert naive.total_bytes - tiled.total_bytes == bsz * heads * 4 * seq * seq * b_spec  # the S^2 terms
    assert B.intensity(attn_flops, naive) < d_head / b_spec  # the ceiling of the naive kernel
    attn_rows.append([f"{seq:,}", f"{naive.total_bytes / 1e9:,.3g}", f"{tiled.total_bytes / 1e9:,.3g}",
                      f"{blocked.total_bytes / 1e9:,.3g}", f"{naive.total_bytes / tiled.total_bytes:,.0f}",
                      f"{B.intensity(attn_flops, naive):,.1f}", f"{B.intensity(attn_flops, tiled):,.0f}"])
glue("attn_desc", f"batch {bsz}, {heads} heads, d_head {d_head}")
tiled_cross = next(s_ for s_ in range(1, 1 << 20) if B.intensity(
    bsz * heads * 2 * flops.matmul_flops(s_, s_, d_head), B.tiled_attention_traffic(bsz, heads, s_, d_head, SPEC_DTYPE)
) >= h100_ridge)
glue("tiled_cross", tiled_cross)
glue("naive_attn_cap", d_head / b_spec)
Table(["seq", "naive GB", "tiled GB (ideal)", "tiled GB (block_q 128)", "naive / tiled", "I naive", "I tiled"],
      attn_rows)

# %% [markdown]
# ({glue:text}`attn_desc`, bf16, forward only.) The naive kernel is memory-bound at every length: its
# intensity approaches {glue:text}`naive_attn_cap:.0f` FLOP/byte from below, under every GPU's ridge point.
# The tiled kernel crosses the {glue:text}`spec_name` ridge at {glue:text}`tiled_cross` tokens and keeps going.
#
# ### A linear layer, forward and backward
#
# $Y = XW^\top$ with $X$ of `tokens` $\times d_\text{in}$ and $W$ of $d_\text{out} \times d_\text{in}$ runs three
# matmuls per training step: the forward, the input gradient $dX = dY\,W$ and the weight gradient
# $dW = dY^\top X$.
#
# ```{literalinclude} ../lib/mlsys/accounting/bytes.py
# :pyobject: linear_traffic
# ```

# %%
tokens, d_in, d_out = EXAMPLE_TOKENS, EXAMPLE_D, EXAMPLE_D
lin = B.linear_traffic(tokens, d_in, d_out, SPEC_DTYPE)
lin_acc = B.linear_traffic(tokens, d_in, d_out, SPEC_DTYPE, accumulate_grad=True)
w_bytes = d_in * d_out * b_spec
lin_rows = []
for name, tr, reads, writes in [("forward Y = X W^T", lin.forward, "X, W", "Y"),
                                ("grad input dX = dY W", lin.grad_input, "dY, W", "dX"),
                                ("grad weight dW = dY^T X", lin.grad_weight, "dY, X", "dW"),
                                ("grad weight, accumulating dW += dY^T X", lin_acc.grad_weight, "dY, X, dW", "dW")]:
    lin_rows.append([name, reads, writes, f"{tr.read_bytes / 1e6:,.1f}", f"{tr.write_bytes / 1e6:,.1f}"])
assert lin.weight_reads == 2
# the forward and dX read W once each; the rest of their reads are X and dY
assert lin.forward.read_bytes + lin.grad_input.read_bytes - 2 * w_bytes == (tokens * d_in + tokens * d_out) * b_spec
assert lin.grad_weight.write_bytes == w_bytes and lin_acc.grad_weight.read_bytes - lin.grad_weight.read_bytes == w_bytes
Table(["matmul", "reads", "writes", "MB read (bf16)", "MB written"], lin_rows)

# %% [markdown]
# The weight $W$ is **read twice**, by the forward and by $dX$. A weight-*shaped* tensor is touched a third
# time, but it is the gradient $dW$, and it is *written*; with gradient accumulation the old $dW$ is read as
# well. The tally below runs a real `nn.Linear` forward and backward under PyTorch's dispatcher and lists
# every operation that touches $W$ or $dW$ (view operations such as the transpose `t` move no data and are
# left out). It is a throwaway tool written for this page, a dozen lines; the library's `ByteCounter`
# (`mlsys.counters`) then checks the bytes of all three matmuls against `linear_traffic`.

# %%
class Touches(TorchDispatchMode):
    """List the aten ops (not views) that read or write the storage of the named tensors."""

    def __init__(self, **tensors):
        super().__init__()
        self.storage = {name: t.untyped_storage().data_ptr() for name, t in tensors.items()}
        self.log = []

    def _names(self, obj):
        return sorted({name for t in tree_leaves(obj) if isinstance(t, torch.Tensor)
                       for name, ptr in self.storage.items() if t.untyped_storage().data_ptr() == ptr})

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            self.log.append((str(func), self._names((args, kwargs or {})), self._names(out)))
        return out


torch.manual_seed(SEED)
layer = torch.nn.Linear(11, 13, bias=False)  # d_in = 11, d_out = 13: irregular on purpose
x_small = torch.randn(7, 11, requires_grad=True)
layer(x_small).sum().backward()  # first step: creates W.grad
with Touches(W=layer.weight, dW=layer.weight.grad) as tally:
    layer(x_small).sum().backward()  # second step: dW accumulates
touch_rows = [[op, ", ".join(reads) or "-", ", ".join(writes) or "-"] for op, reads, writes in tally.log
              if reads or writes]
w_reads = sum("W" in reads for _, reads, _ in tally.log)
dw_reads = sum("dW" in reads for _, reads, _ in tally.log)
assert w_reads == lin.weight_reads == 2 and dw_reads == 1
glue("w_reads", w_reads)
# And the bytes: the library's ByteCounter adds up every tensor each op reads and writes.
x_l = torch.randn(7, 11, requires_grad=True)
w_l = torch.randn(13, 11, requires_grad=True)
dy_l = torch.randn(7, 13)
with ByteCounter() as counted:
    y_l = x_l @ w_l.t()  # forward
    torch.autograd.grad(y_l, (x_l, w_l), dy_l)  # dX and dW
expected_l = B.linear_traffic(7, 11, 13, "fp32").total
assert (counted.read_bytes, counted.write_bytes) == (expected_l.read_bytes, expected_l.write_bytes)
print(f"ByteCounter: read {counted.read_bytes} B, wrote {counted.write_bytes} B; linear_traffic: "
      f"read {expected_l.read_bytes} B, wrote {expected_l.write_bytes} B")
Table(["aten op (forward + backward)", "reads", "writes"], touch_rows)

# %% [markdown]
# #### Two claims from a widely shared one-pager, checked
#
# A one-page summary of these formulas that circulates widely says that a linear layer's forward plus backward
# *reads the weight matrix three times* ($3 D_\text{in} D_\text{out}$ elements) and that elementwise ops have an
# intensity of *1 FLOP/byte*. Both are off:

# %%
claims = [
    ["reads of W in forward + backward", "3", f"{lin.weight_reads} (forward, dX)",
     "the third weight-sized access is the write of dW"],
    ["weight-sized traffic, forward + backward (elements)", "3 D_in D_out reads",
     f"{lin.weight_reads} reads of W + 1 write of dW (+1 read of dW when accumulating)",
     f"{(2 * w_bytes + w_bytes) / 1e6:,.1f} MB, {4 * w_bytes / 1e6:,.1f} MB accumulating (bf16, d = {EXAMPLE_D})"],
    ["intensity of a unary elementwise op", "1 FLOP/byte",
     f"fp32 {B.elementwise_intensity(1, 'fp32')}, bf16 {B.elementwise_intensity(1, 'bf16')} FLOP/byte",
     "1 FLOP per element, and each element moves 2b bytes"],
    ["intensity of an elementwise add", "1 FLOP/byte",
     f"fp32 {B.elementwise_intensity(1, 'fp32', n_inputs=2):.4g}, bf16 "
     f"{B.elementwise_intensity(1, 'bf16', n_inputs=2):.4g} FLOP/byte", "two inputs and one output per FLOP"],
]
glue("claim_ew_fp32", B.elementwise_intensity(1, "fp32"))
glue("claim_ew_bf16", B.elementwise_intensity(1, "bf16"))
Table(["quantity", "the one-pager", "correct", "why"], claims)

# %% [markdown]
# The "1 FLOP/byte" figure confuses FLOPs per element with FLOPs per byte: it is wrong by a factor of
# $2b$, {glue:text}`claim_ew_fp32` FLOP/byte in fp32 and {glue:text}`claim_ew_bf16` in bf16. The factor
# matters: it moves the elementwise ops from "a few times below the ridge" to "hundreds of times below".
#
# ### Ridge points of every device
#
# The ridge $P/\beta$ of each accelerator in `mlsys.hardware` (see {ref}`sec-hardware`), from the dense
# peak of each dtype and the HBM bandwidth:

# %%
ridge_rows = []
for acc in hardware.ACCELERATORS.values():
    cells = [acc.name, f"{acc.hbm_bytes_per_s / 1e12:.3g}"]
    for dt in ("fp32", "bf16", "fp8"):
        cells.append(f"{acc.ridge_intensity(dt):,.0f}" if dt in acc.dense_flop_per_s else "-")
        if dt in acc.dense_flop_per_s:
            assert math.isclose(acc.ridge_intensity(dt), acc.peak_flop_per_s(dt) / acc.hbm_bytes_per_s)
    ridge_rows.append(cells)
a100 = hardware.A100_80GB_SXM
a100_ridge = a100.ridge_intensity("fp16")
a100_bw_rounded = float(f"{a100.hbm_bytes_per_s:.1g}")  # the bandwidth rounded to one significant digit
a100_ridge_rounded = a100.peak_flop_per_s("fp16") / a100_bw_rounded
assert a100_bw_rounded < a100.hbm_bytes_per_s and a100_ridge_rounded > a100_ridge
for name, value in {"a100_ridge": a100_ridge, "a100_ridge_rounded": a100_ridge_rounded,
                    "a100_tb_per_s": a100.hbm_bytes_per_s / 1e12, "a100_tb_rounded": a100_bw_rounded / 1e12,
                    "a100_tflops": a100.peak_flop_per_s("fp16") / 1e12}.items():
    glue(name, value)
Table(["device", "HBM TB/s", "ridge fp32 (FLOP/B)", "ridge bf16", "ridge fp8"], ridge_rows)

# %% [markdown]
# The A100's fp16 ridge is often quoted as {glue:text}`a100_ridge_rounded:.0f` FLOP/byte. With the A100 80GB's
# spec bandwidth, {glue:text}`a100_tb_per_s:.3f` TB/s, it is {glue:text}`a100_tflops:.0f` /
# {glue:text}`a100_tb_per_s:.3f` = **{glue:text}`a100_ridge:.0f`**; the quoted figure comes from rounding the
# bandwidth to {glue:text}`a100_tb_rounded:.0f` TB/s. Newer GPUs raise the peak faster than the bandwidth,
# so the ridge climbs: ever more FLOPs per byte are needed to use them. The fp32 column uses the GPUs'
# non-tensor-core rate, the relevant roof for elementwise arithmetic.
#
# Placing the operations of the table above on the {glue:text}`spec_name`'s roofline (bf16) shows how few of
# them can reach the flat part:

# %% tags=["remove-input"]
fig, ax = subplots(width=9.0, height=4.2)
plotting.roofline(ax, spec_roof, lo=-5, hi=14, lw=2,
        label=f"{SPEC.name} roof, {SPEC_DTYPE} (spec)")
ax.axvline(spec_roof.ridge_intensity, color=COLORS["muted"], ls=":", lw=1)
for color, marker, (op, i_op) in zip(CYCLE * 2, MARKERS, napkin["bf16"].items(), strict=False):
    ax.plot([i_op], [spec_roof.attainable_flop_per_s(i_op)], marker, color=color, ms=7, label=op)
finish(ax, title=f"Napkin roofline: operations on an {SPEC.name} ({SPEC_DTYPE}), predicted",
       xlabel="arithmetic intensity (FLOP/byte)", ylabel="attainable FLOP/s", logx=2, logy=True)
ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
plt.show()

# %% [markdown]
# ## The code
#
# The roofline model is a few lines. `Ceilings` holds the two roofs, from a spec or from measurement, and
# `estimate` turns a kernel's FLOPs and bytes into the two times:
#
# ```{literalinclude} ../lib/mlsys/roofline.py
# :pyobject: Ceilings
# ```
#
# ```{literalinclude} ../lib/mlsys/roofline.py
# :pyobject: estimate
# ```
#
# The measured roofs come from two probes. Bandwidth: a large copy, counting the bytes read **plus** the
# bytes written (a copy of $Q$ bytes moves $2Q$); the buffer must be much larger than the last-level cache,
# or the probe measures the cache. Arithmetic: square matmuls of several sizes, keeping the best.
#
# ```{literalinclude} ../lib/mlsys/roofline.py
# :pyobject: measure_copy_bandwidth
# ```
#
# ```{literalinclude} ../lib/mlsys/roofline.py
# :pyobject: measure_matmul_flop_per_s
# ```
#
# ## Measurement
#
# ### First, fresh memory on a CPU
#
# One effect has to be taken out of the way before any byte counting on a CPU. PyTorch's CUDA allocator
# keeps freed GPU memory and hands it to the next tensor; its CPU allocator returns large blocks to the
# operating system, so every fresh output of tens of MB is new memory that the OS must map and zero, page by
# page, the first time the kernel writes it. Compare an op writing into a fresh output with the same op
# writing into one that already exists (`out=`):

# %%
device = env.device()
torch_dtype = TORCH_DTYPES[DTYPE]
gen = torch.Generator().manual_seed(SEED)


def randn(*shape, dtype=None):
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype or torch_dtype)


x = randn(NUMEL)
out = torch.empty_like(x)
fresh = timed(lambda: torch.mul(x, 2.0))
reused = timed(lambda: torch.mul(x, 2.0, out=out))
fresh_ratio = glue("fresh_ratio", fresh.median_s / reused.median_s)
glue("numel_mb", x.nbytes / 1e6)
print(f"x * 2 on {x.nbytes / 1e6:.0f} MB ({DTYPE}, {device}): fresh output {fresh}; existing output {reused}")

# Keep freed CPU memory mapped for the rest of the chapter (closed in the last cell), like the CUDA caching
# allocator; see `mlsys.bench.kept_cpu_memory`.
allocator = contextlib.ExitStack()
kept = device == "cpu" and allocator.enter_context(bench.kept_cpu_memory())
if kept:
    fresh_after = timed(lambda: torch.mul(x, 2.0))
    glue("fresh_ratio_after", fresh_after.median_s / reused.median_s)
    allocator_note = (f"glibc now keeps freed memory: a fresh output costs {fresh_after.median_s / reused.median_s:.2f}x "
                      "an existing one")
else:
    glue("fresh_ratio_after", fresh_ratio)
    allocator_note = "no change made (the device has a caching allocator, or the C library is not glibc)"
glue("allocator_note", allocator_note)
print(allocator_note)

# %% [markdown]
# Here `x * 2` into a fresh output took {glue:text}`fresh_ratio:.1f` times as long as into an existing one;
# {glue:text}`allocator_note`. On a GPU the ratio is close to 1 to begin with. Everything below is
# measured in this state, so the times are the kernels' own.
#
# ### The ceilings of this device

# %%
spec = hardware.detect()
matmul_sweep = roofline.measure_matmul_flop_per_s(MATMUL_SIZES, dtype=DTYPE, repeats=REPEATS)
copy_bw = roofline.measure_copy_bandwidth(COPY_BYTES, repeats=REPEATS)
measured = roofline.Ceilings(max(matmul_sweep.values()), copy_bw, f"measured on {env.device_name()} ({DTYPE})")
spec_ceil = roofline.Ceilings.from_spec(spec, DTYPE) if spec is not None else None
ceiling_rows = [[f"matmul {n} x {n} x {n}", f"{f / 1e9:,.1f} GFLOP/s"] for n, f in matmul_sweep.items()]
ceiling_rows += [[f"copy of {COPY_BYTES / 2**20:,.0f} MiB (read + write)", f"{copy_bw / 1e9:,.1f} GB/s"],
                 ["ridge point (measured)", f"{measured.ridge_intensity:,.1f} FLOP/byte"]]
if spec_ceil is not None:
    ceiling_rows += [[f"{spec.name} spec, {DTYPE}", f"{spec_ceil.flop_per_s / 1e12:,.0f} TFLOP/s, "
                      f"{spec_ceil.bytes_per_s / 1e12:.2f} TB/s, ridge {spec_ceil.ridge_intensity:,.0f}"],
                     ["measured / spec", f"compute {measured.flop_per_s / spec_ceil.flop_per_s:.0%}, "
                      f"bandwidth {measured.bytes_per_s / spec_ceil.bytes_per_s:.0%}"]]
for name, value in {"device_name": env.device_name(), "dtype": DTYPE, "meas_gflops": measured.flop_per_s / 1e9,
                    "meas_gbps": measured.bytes_per_s / 1e9, "meas_ridge": measured.ridge_intensity,
                    "spec_text": (f"the {spec.name} spec roof ({DTYPE}) is drawn dashed" if spec_ceil is not None
                                  else "this device is not in mlsys.hardware, so there is no spec roof")}.items():
    glue(name, value)
Table(["probe", "result"], ceiling_rows)

# %% [markdown]
# On {glue:text}`device_name` the roofs are {glue:text}`meas_gflops:,.0f` GFLOP/s ({glue:text}`dtype` matmul)
# and {glue:text}`meas_gbps:,.1f` GB/s, a ridge of {glue:text}`meas_ridge:.1f` FLOP/byte. The small matmuls
# fall short of the best: their intensity is lower, and fixed costs (and, for the first size, one-time start-up
# work in the math library) weigh more.
#
# ### Operations on the measured roofline
#
# Now eager PyTorch ops of every kind, each timed here and placed at its analytic intensity from
# `mlsys.accounting.bytes`; the prediction is the roofline estimate with the measured ceilings.

# %%
rows_n = NUMEL // ROW
xm, wn = x.view(rows_n, ROW), randn(ROW)
y = randn(NUMEL)
bsz_a, heads_a, seq_a, d_a = ATTN_SHAPE
q, k, v = (randn(bsz_a, heads_a, seq_a, d_a) for _ in range(3))
n_big = max(MATMUL_SIZES)
skinny_a, big_b = randn(SKINNY_ROWS, n_big), randn(n_big, n_big)
attn_flops = bsz_a * heads_a * 2 * flops.matmul_flops(seq_a, seq_a, d_a)

points = []  # (name, fn, flops, traffic)
for n in MATMUL_SIZES:
    a_n, b_n = randn(n, n), randn(n, n)
    points.append((f"matmul {n}", lambda a=a_n, b=b_n: a @ b, flops.matmul_flops(n, n, n),
                   B.matmul_traffic(n, n, n, DTYPE)))
points += [
    (f"skinny matmul {SKINNY_ROWS}x{n_big}x{n_big}", lambda: skinny_a @ big_b,
     flops.matmul_flops(SKINNY_ROWS, n_big, n_big), B.matmul_traffic(SKINNY_ROWS, n_big, n_big, DTYPE)),
    ("x * 2", lambda: x * 2.0, NUMEL, B.elementwise_traffic(NUMEL, DTYPE)),
    ("x + y", lambda: x + y, NUMEL, B.elementwise_traffic(NUMEL, DTYPE, n_inputs=2)),
    (f"softmax, rows of {ROW}", lambda: torch.softmax(xm, dim=-1), softmax.softmax_flops(xm.shape),
     B.softmax_traffic(rows_n, ROW, DTYPE)),
    (f"RMSNorm (F.rms_norm), rows of {ROW}", lambda: F.rms_norm(xm, (ROW,), wn, 1e-5),
     rmsnorm.rmsnorm_flops(xm.shape), B.norm_traffic(rows_n, ROW, DTYPE)),
    (f"naive attention, seq {seq_a}", lambda: torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v,
     attn_flops + softmax.softmax_flops((bsz_a, heads_a, seq_a, seq_a)),
     B.naive_attention_traffic(bsz_a, heads_a, seq_a, d_a, DTYPE)),
    (f"SDPA (fused attention), seq {seq_a}", lambda: F.scaled_dot_product_attention(q, k, v),
     attn_flops + softmax.softmax_flops((bsz_a, heads_a, seq_a, seq_a)),
     B.tiled_attention_traffic(bsz_a, heads_a, seq_a, d_a, DTYPE)),
]
point_results = []
for name, fn, n_flops, traffic in points:
    t = timed(fn)
    est = roofline.estimate(n_flops, traffic.total_bytes, measured)
    point_results.append((name, n_flops, traffic, t, est))
table_rows = []
for name, n_flops, traffic, t, est in point_results:
    ratio = t.median_s / est.time_s
    # Sanity band, asserted on a known GPU only (DESIGN: hardware-dependent bands need a known device)
    in_band = 0.05 < ratio < 20
    assert in_band or spec is None, f"{name}: measured / predicted = {ratio:.2f}, outside the sanity band"
    if not in_band:
        print(f"note: {name}: measured / predicted = {ratio:.2f}, outside 0.05-20 (a noisy or cached measurement)")
    table_rows.append([name, f"{B.intensity(n_flops, traffic):.3g}", est.bound, num(1e3 * est.time_s), num(1e3 * t.median_s),
                       f"{num(1e3 * t.p20_s)} – {num(1e3 * t.p80_s)}", f"{ratio:.2f}",
                       num(bench.achieved_flop_per_s(n_flops, t.median_s) / 1e9),
                       num(bench.achieved_bytes_per_s(traffic.total_bytes, t.median_s) / 1e9)])
ratios = {name: t.median_s / est.time_s for name, _, _, t, est in point_results}
glue("ratio_mul", ratios["x * 2"])
glue("ratio_big_matmul", ratios[f"matmul {n_big}"])
glue("ratio_naive_attn", ratios[f"naive attention, seq {seq_a}"])
glue("ratio_rms", ratios[f"RMSNorm (F.rms_norm), rows of {ROW}"])
glue("ratio_softmax", ratios[f"softmax, rows of {ROW}"])
glue("ratio_add", ratios["x + y"])
glue("ratio_sdpa", ratios[f"SDPA (fused attention), seq {seq_a}"])
naive_pt = next(p for p in point_results if p[0].startswith("naive attention"))
sdpa_pt = next(p for p in point_results if p[0].startswith("SDPA"))
glue("naive_attn_i", B.intensity(naive_pt[1], naive_pt[2]))
glue("naive_attn_bound", naive_pt[4].bound)
glue("attn_byte_ratio", naive_pt[2].total_bytes / sdpa_pt[2].total_bytes)
Table(["op", "I (FLOP/B)", "bound (measured roofs)", "predicted ms", "measured ms", "p20 – p80",
       "measured / predicted", "GFLOP/s", "GB/s"], table_rows)

# %% tags=["remove-input"]
fig, ax = subplots(width=9.5, height=4.6)
intensities = [B.intensity(f, tr) for _, f, tr, _, _ in point_results]
lo, hi = math.floor(math.log2(min(intensities))) - 1, math.ceil(math.log2(max(intensities))) + 3
plotting.roofline(ax, measured, lo=lo, hi=hi, lw=2,
        label=f"measured roof: {measured.flop_per_s / 1e9:,.0f} GFLOP/s, {measured.bytes_per_s / 1e9:,.1f} GB/s")
if spec_ceil is not None:
    plotting.roofline(ax, spec_ceil, lo=lo, hi=hi, lw=1.2, ls="--",
            label=f"{spec_ceil.label} roof")
for color, marker, (name, n_flops, traffic, t, est) in zip(CYCLE * 2, MARKERS, point_results, strict=False):
    i_op = B.intensity(n_flops, traffic)
    ax.plot([i_op], [bench.achieved_flop_per_s(n_flops, t.median_s)], marker, color=color, ms=7,
            label=f"{name} (measured)")
    ax.plot([i_op], [n_flops / est.time_s], "x", color=COLORS["predicted"], ms=7)
ax.plot([], [], "x", color=COLORS["predicted"], label="predicted (estimate on the measured roofs)")
finish(ax, title=f"Roofline of {env.device_name()}, {DTYPE}", xlabel="arithmetic intensity (FLOP/byte)",
       ylabel="achieved FLOP/s", logx=2, logy=True)
ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
plt.show()

# %% [markdown]
# Reading the table and the plot ({glue:text}`spec_text`):
#
# - **Memory-bound ops** (elementwise, softmax, RMSNorm) belong on the sloped part. `x * 2` took
#   {glue:text}`ratio_mul:.2f` times its predicted time, `x + y` {glue:text}`ratio_add:.2f` times: simple
#   elementwise ops run at about the copy bandwidth. Softmax took {glue:text}`ratio_softmax:.2f`× and RMSNorm
#   {glue:text}`ratio_rms:.2f`×; where such ops fall short of the roof, the cause is work beyond the minimum
#   traffic: exponentials and reductions are costly on a CPU's few vector units, and an unfused `F.rms_norm`
#   runs as several kernels, each a round trip (the fused Triton kernel makes one).
# - **Large matmuls** are the flat part ({glue:text}`ratio_big_matmul:.2f`× for the largest: it *is* the
#   roof); small and skinny matmuls reach less, as their intensity and fixed costs say.
# - **Attention.** The naive version has intensity {glue:text}`naive_attn_i:.3g` FLOP/byte, so it is
#   {glue:text}`naive_attn_bound` on this device (ridge {glue:text}`meas_ridge:.1f`); on every GPU in the ridge
#   table it is memory-bound, and there the fused SDPA kernel, doing the same FLOPs with
#   {glue:text}`attn_byte_ratio:.0f` times fewer bytes, wins by a wide margin. Here naive took
#   {glue:text}`ratio_naive_attn:.2f`× its prediction and SDPA {glue:text}`ratio_sdpa:.2f`×.
#
# ### Three regimes
#
# Every kernel is in one of three regimes, and the fix depends on which:
#
# 1. **Memory-bound**: $Q/\beta > F/P$. Time is bytes over bandwidth. Fix: move fewer bytes (fuse, use a
#    narrower dtype, keep data on chip).
# 2. **Compute-bound**: $F/P > Q/\beta$. Time is FLOPs over peak. Fix: do fewer FLOPs, or use faster units
#    (tensor cores, lower precision).
# 3. **Overhead-bound**: neither: the op is so small that the fixed cost of launching it (Python, the
#    dispatcher, a kernel launch) dominates. Fix: bigger ops, compilation, CUDA graphs.
#
# The three experiments below put one kernel in each regime, following the order of He's "Making deep
# learning go brrrr from first principles" {cite}`he2022brrrr`.
#
# ### The Triton kernels, checked
#
# The experiments use the library's fused Triton kernels, written in the style of the Triton tutorials
# {cite}`triton_tutorials`. On a GPU they are compiled and timed; without one
# they run in Triton's CPU interpreter, which is for correctness only (never timed here). Each is compared with
# its float64 reference on small, irregular inputs, at the library's per-dtype tolerances:

# %%
kernel_device = "cuda" if device == "cuda" else "cpu"
checks = []
g_check = torch.Generator().manual_seed(SEED)
for dt in (torch.float32, torch.float16):
    tol = _triton.TOLERANCES[dt]
    xs_ = torch.randn(1003, generator=g_check).to(kernel_device, dt)
    xr = torch.randn(37, 61, generator=g_check).to(kernel_device, dt)
    wr = (1 + 0.1 * torch.randn(61, generator=g_check)).to(kernel_device, dt)
    cases = [(f"repeat_unary fma, k=5, {xs_.numel()} elements", elementwise.repeat_unary(xs_, 5, "fma"),
              elementwise.repeat_unary_ref(xs_.double(), 5, "fma")),
             (f"repeat_unary cos, k=2, {xs_.numel()} elements", elementwise.repeat_unary(xs_, 2, "cos"),
              elementwise.repeat_unary_ref(xs_.double(), 2, "cos")),
             (f"softmax {tuple(xr.shape)}", softmax.softmax(xr), softmax.softmax_ref(xr.double())),
             (f"rmsnorm {tuple(xr.shape)}", rmsnorm.rmsnorm(xr, wr), rmsnorm.rmsnorm_ref(xr.double(), wr.double()))]
    for name, got, ref in cases:
        torch.testing.assert_close(got.double(), ref.to(got.device), **tol)
        checks.append([name, str(dt).removeprefix("torch."), f"{(got.double() - ref).abs().max().item():.2g}",
                       f"rtol {tol['rtol']:g}, atol {tol['atol']:g}", "ok"])
glue("kernel_mode", "compiled on the GPU" if not _triton.INTERPRETED else "interpreted on the CPU")
Table(["kernel", "dtype", "max |error| vs float64", "tolerance", "check"], checks)

# %% [markdown]
# All equal their references ({glue:text}`kernel_mode`).
#
# ### (a) Memory-bound to compute-bound: one kernel, k operations per element
#
# `repeat_unary(x, k, "fma")` loads each element once, applies $y \leftarrow ay + b$ $k$ times in registers
# and stores it once: $2k$ FLOPs per element for a fixed $2b$ bytes, so $I = k/b$. Sweeping $k$ walks one
# kernel along the roofline, from memory-bound to compute-bound.
#
# ```{literalinclude} ../lib/mlsys/kernels/elementwise.py
# :pyobject: repeat_unary_ref
# ```
#
# Which roof is the right one matters here. These FMAs run on the ordinary vector units, not the matrix
# units: on a GPU the compute roof is the CUDA-core fp32 rate (`dense_flop_per_s["fp32"]`), not the tensor-core
# bf16 peak; on a CPU no spec is known, so the compute roof for elementwise work is measured by the sweep
# itself, as the best FLOP/s of the fused kernel over all $k$. The prediction for the fused kernel is then
# $T(k) = \max(2kn / P_\text{vector},\ 2nb/\beta)$.
#
# What runs where: on a GPU, the Triton kernel. On a CPU, the stand-in for the fused kernel is `torch.compile`
# of the $k$-step chain (inductor fuses it into one loop), when the profile compiles. Every profile also times
# the **eager** chain, $k$ separate ops and $k$ round trips through memory (`eager_chain_bytes`), whose
# intensity stays at $1/(2b)$ whatever $k$ is.

# %%
SWEEP_DTYPE = "fp32"  # fma in fp32 arithmetic: the vector units' fp32 rate is the compute roof
b_sweep = bytes_per_element(SWEEP_DTYPE)
xw = randn(SWEEP_NUMEL, dtype=TORCH_DTYPES[SWEEP_DTYPE])
n_w = xw.numel()
fused_impl = "triton" if device == "cuda" else ("torch.compile" if USE_COMPILE else None)
sweep = {"eager": {}, "fused": {}}
compiled_chains = {}
for k in KS:
    sweep["eager"][k] = timed(lambda k=k: elementwise.repeat_unary_ref(xw, k, "fma"))
    if fused_impl == "triton":
        sweep["fused"][k] = timed(lambda k=k: elementwise.repeat_unary(xw, k, "fma"))
    elif fused_impl == "torch.compile":
        torch._dynamo.reset()  # a fresh graph per k (k is baked into the unrolled chain)
        compiled_chains[k] = torch.compile(lambda t, k=k: elementwise.repeat_unary_ref(t, k, "fma"), dynamic=False)
        torch.testing.assert_close(compiled_chains[k](xw), elementwise.repeat_unary_ref(xw, k, "fma"))
        sweep["fused"][k] = timed(lambda k=k: compiled_chains[k](xw))

flops_k = {k: elementwise.repeat_unary_flops(n_w, k, "fma") for k in KS}
if sweep["fused"]:
    measured_vector_roof = max(flops_k[k] / sweep["fused"][k].median_s for k in KS)
if device == "cuda" and spec is not None:
    vector_roof, vector_roof_label = spec.peak_flop_per_s("fp32"), f"{spec.name} fp32 CUDA-core peak (spec)"
elif sweep["fused"]:
    vector_roof, vector_roof_label = measured_vector_roof, "vector roof, measured (best of the fused sweep)"
else:
    vector_roof, vector_roof_label = None, None
roof_for_fused = vector_roof if vector_roof is not None else measured.flop_per_s
vector_ceil = roofline.Ceilings(roof_for_fused, measured.bytes_per_s, "fused elementwise")
pred_fused = {k: roofline.estimate(flops_k[k], elementwise.repeat_unary_bytes(n_w, SWEEP_DTYPE), vector_ceil)
              for k in KS}
pred_eager = {k: k * roofline.estimate(2 * n_w, elementwise.repeat_unary_bytes(n_w, SWEEP_DTYPE), vector_ceil).time_s
              for k in KS}
assert all(elementwise.eager_chain_bytes(n_w, SWEEP_DTYPE, k) == k * elementwise.repeat_unary_bytes(
    n_w, SWEEP_DTYPE) for k in KS)
k_star = b_sweep * vector_ceil.ridge_intensity  # I = k / b reaches the ridge
sweep_rows = []
for k in KS:
    row = [k, f"{k / b_sweep:.3g}", pred_fused[k].bound, num(1e3 * pred_fused[k].time_s)]
    if sweep["fused"]:
        t = sweep["fused"][k]
        row += [num(1e3 * t.median_s), num(flops_k[k] / t.median_s / 1e9),
                num(elementwise.repeat_unary_bytes(n_w, SWEEP_DTYPE) / t.median_s / 1e9)]
    else:
        row += ["not run", "-", "-"]
    row += [num(1e3 * pred_eager[k]), num(1e3 * sweep["eager"][k].median_s), num(flops_k[k] / sweep["eager"][k].median_s / 1e9)]
    sweep_rows.append(row)
sweep_note = {"triton": "the Triton kernel on the GPU",
              "torch.compile": "torch.compile of the chain (the CPU stand-in for the fused kernel)",
              None: "not measured: the smoke profile does not compile (a cold torch.compile costs ~25 s on a CPU), "
                    "and Triton only runs interpreted without a GPU; run the cpu profile or a GPU for it"}[fused_impl]
glue("sweep_note", sweep_note)
glue("k_star", k_star)
glue("vector_roof_text", (f"{vector_roof_label}: {vector_roof / 1e9:,.1f} GFLOP/s" if vector_roof is not None else
                          "unknown in this profile; the prediction uses the matmul roof, an upper bound"))
print(f"fused: {sweep_note}")
Table(["k", "I fused (FLOP/B)", "fused: bound", "fused predicted ms", "fused measured ms", "fused GFLOP/s",
       "fused GB/s", "eager predicted ms", "eager measured ms", "eager GFLOP/s"], sweep_rows)

# %% tags=["remove-input"]
fig, (ax1, ax2) = subplots(1, 2, width=10.5, height=5.0)
ks = list(KS)
ax1.plot(ks, [flops_k[k] / pred_fused[k].time_s for k in ks], "-", color=COLORS["predicted"],
         label="fused, predicted")
ax1.plot(ks, [flops_k[k] / pred_eager[k] for k in ks], "--", color=COLORS["predicted"], label="eager, predicted")
if sweep["fused"]:
    ax1.plot(ks, [flops_k[k] / sweep["fused"][k].median_s for k in ks], "o-", color=COLORS["measured"],
             label=f"fused ({fused_impl}), measured")
ax1.plot(ks, [flops_k[k] / sweep["eager"][k].median_s for k in ks], "s--", color=COLORS["measured"], mfc="none",
         label="eager chain, measured")
ax1.axhline(roof_for_fused, color=COLORS["ceiling"], lw=1,
            label=vector_roof_label or "matmul roof (upper bound; elementwise roof not measured)")
if vector_roof is not None:
    ax1.axhline(measured.flop_per_s, color=COLORS["muted"], lw=1, ls=":", label="matmul roof (measured)")
ax1.axvline(k_star, color=COLORS["muted"], ls=":", lw=1)
finish(ax1, title="Achieved FLOP/s against k", xlabel="k (fma steps per element)", ylabel="FLOP/s", logx=2, logy=True)
ax1.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
byte_fused = elementwise.repeat_unary_bytes(n_w, SWEEP_DTYPE)
ax2.plot(ks, [byte_fused / pred_fused[k].time_s for k in ks], "-", color=COLORS["predicted"], lw=3, alpha=0.7,
         label="fused, predicted")
if sweep["fused"]:
    ax2.plot(ks, [byte_fused / sweep["fused"][k].median_s for k in ks], "o-", color=COLORS["measured"],
             label=f"fused ({fused_impl}), measured")
ax2.plot(ks, [elementwise.eager_chain_bytes(n_w, SWEEP_DTYPE, k) / sweep["eager"][k].median_s for k in ks], "s--",
         color=COLORS["measured"], mfc="none", label="eager chain, measured (its own bytes)")
ax2.axhline(measured.bytes_per_s, color=COLORS["ceiling"], lw=1, label="copy bandwidth (measured)")
plotted = [line_y for line in ax2.get_lines() for line_y in line.get_ydata()]
ax2.set_ylim(min(plotted) / 3, max(plotted) * 3)  # a wide range, so noise does not look like structure
ax2.axvline(k_star, color=COLORS["muted"], ls=":", lw=1)
finish(ax2, title="Achieved bytes/s against k", xlabel="k (fma steps per element)", ylabel="bytes/s", logx=2,
       logy=True)
ax2.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
plt.show()

# %% [markdown]
# The fused kernel: {glue:text}`sweep_note`. Its compute roof: {glue:text}`vector_roof_text`. The prediction
# turns compute-bound at $k^* = b \cdot P_\text{vector} / \beta \approx$ {glue:text}`k_star:.0f` (dotted line):
# below it the fused kernel runs at the copy bandwidth and extra FLOPs are free; above it, bytes/s falls as
# $1/k$. The eager chain never gets there: each of its ops has intensity $2/(2b)$, so its FLOP/s stays flat
# and its time grows as $k$ round trips.
#
# ### (b) Fusion: `x.cos().cos()`
#
# Eager PyTorch runs `x.cos().cos()` as two kernels: the first writes `cos(x)` to memory, the second reads it
# back. A fused kernel (Triton's `repeat_unary(x, 2, "cos")`, or what `torch.compile` generates) reads $x$ once
# and writes once. The predicted byte ratio is exactly 2; if the ops are memory-bound, so is the time ratio.

# %%
xc = randn(NUMEL, dtype=TORCH_DTYPES[SWEEP_DTYPE])
byte_ratio = elementwise.eager_chain_bytes(NUMEL, SWEEP_DTYPE, 2) / elementwise.repeat_unary_bytes(NUMEL, SWEEP_DTYPE)
assert byte_ratio == 2
fusion = {"eager x.cos().cos() (2 ops)": timed(lambda: xc.cos().cos()),
          "eager x.cos() (1 op, for scale)": timed(lambda: xc.cos())}
if USE_COMPILE:
    torch._dynamo.reset()
    cos_cos_compiled = torch.compile(lambda t: t.cos().cos(), dynamic=False)
    torch.testing.assert_close(cos_cos_compiled(xc), xc.cos().cos())
    fusion["torch.compile (1 fused kernel)"] = timed(lambda: cos_cos_compiled(xc))
if device == "cuda":
    torch.testing.assert_close(elementwise.repeat_unary(xc, 2, "cos"), xc.cos().cos(), **_triton.TOLERANCES[xc.dtype])
    fusion["Triton repeat_unary(x, 2, 'cos')"] = timed(lambda: elementwise.repeat_unary(xc, 2, "cos"))
pred_2trip = elementwise.eager_chain_bytes(NUMEL, SWEEP_DTYPE, 2) / measured.bytes_per_s
pred_1trip = elementwise.repeat_unary_bytes(NUMEL, SWEEP_DTYPE) / measured.bytes_per_s
eager_s = fusion["eager x.cos().cos() (2 ops)"].median_s
fused_names = [n for n in fusion if n.startswith(("torch.compile", "Triton"))]
fusion_rows = [[name, num(1e3 * t.median_s), f"{num(1e3 * t.p20_s)} – {num(1e3 * t.p80_s)}", f"{eager_s / t.median_s:.2f}"]
               for name, t in fusion.items()]
if fused_names:
    best_fused = min(fused_names, key=lambda n: fusion[n].median_s)
    time_ratio = eager_s / fusion[best_fused].median_s
    if time_ratio > 1.5 * byte_ratio:
        why = ("more than the bytes explain: the eager ops were not memory-bound (they took "
               f"{eager_s / pred_2trip:.1f}x what their bytes need), and the fused code also computes cos faster")
    elif time_ratio < byte_ratio / 1.5:
        why = "less than the byte ratio: cos itself (compute on the vector units) sets the time here"
    else:
        why = "close to the byte ratio: the ops are memory-bound here, so time follows bytes"
    fusion_verdict = f"eager / {best_fused.split(' (')[0]} = {time_ratio:.2f} against a byte ratio of {byte_ratio:.0f}, {why}"
else:
    fusion_verdict = ("no fused version was timed in this profile (no torch.compile in smoke, and Triton is timed "
                      "only on a GPU); the predicted fused time is one round trip")
glue("fusion_verdict", fusion_verdict)
glue("byte_ratio", byte_ratio)
glue("cos_eager_vs_pred", eager_s / pred_2trip)
print(fusion_verdict)
Table(["implementation", "measured ms", "p20 – p80", "eager / this"], fusion_rows)

# %% tags=["remove-input"]
fig, ax = subplots(width=7.0, height=3.6)
labels = list(fusion) + ["predicted: 2 round trips", "predicted: 1 round trip (fused)"]
values = [t.median_s * 1e3 for t in fusion.values()] + [pred_2trip * 1e3, pred_1trip * 1e3]
colors = [COLORS["measured"]] * len(fusion) + [COLORS["predicted"]] * 2
ax.barh(labels, values, color=colors)
ax.invert_yaxis()
finish(ax, title=f"cos(cos(x)) on {NUMEL:,} {SWEEP_DTYPE} elements, {env.device_name()}", xlabel="ms", legend=False)
plt.show()

# %% [markdown]
# Measured: {glue:text}`fusion_verdict`. The eager pair took {glue:text}`cos_eager_vs_pred:.1f` times the
# time its bytes need at the copy bandwidth. On a GPU, where a cosine costs a handful of instructions against
# thousands of FLOP/s per byte of bandwidth, both are memory-bound and the fused kernel is close to twice as
# fast. On a CPU with few cores the cosine's arithmetic can outweigh its bytes, and then the time ratio says
# how well each version computes cos, not how many bytes it moves. The byte ratio predicts the time ratio only
# inside the memory-bound regime.
#
# ### (c) Overhead: when size stops mattering
#
# Each eager op costs a fixed amount before any data moves: Python, PyTorch's dispatcher, and on a GPU a
# kernel launch. For small tensors that fixed cost is the whole time. Below, `x.mul_(1.0)` (in place: read
# and write $n$ fp32 elements) is timed {glue:text}`ops_per_sample` times back to back per sample at sizes from
# one element up; the model is $T(n) = T_0 + 2 \cdot 4n/\beta$ with $T_0$ the per-op overhead, taken from the
# smallest sizes.

# %%
glue("ops_per_sample", OPS_PER_SAMPLE)
per_op_s = functools.partial(roofline.measure_op_time_s, ops_per_sample=OPS_PER_SAMPLE, device=device,
                             warmup=WARMUP, repeats=REPEATS)
sizes = list(OVERHEAD_SIZES)
per_op_s(1)  # an untimed first round: one-time costs of the first tiny ops are not overhead per op
t_n, t_2n = {}, {}
for n in sizes:  # n and 2n back to back, so a change in the machine's load affects both alike
    t_n[n], t_2n[n] = per_op_s(n), per_op_s(2 * n)
overhead_s = statistics.median(t_n[n] for n in sizes[:4])  # the four smallest sizes: 1 ... 64 elements
# the model: read and write 4 bytes per element, after a fixed overhead
model_s = {m: roofline.overhead_time_s(2 * 4 * m, overhead_s, measured.bytes_per_s) for n in sizes for m in (n, 2 * n)}
n_flat = overhead_s * measured.bytes_per_s / 8  # where moving the bytes takes as long as the overhead
doubling = {n: t_2n[n] / t_n[n] for n in sizes}
small_n, large_n = sizes[2], sizes[-1]
for name, value in {"overhead_us": overhead_s * 1e6, "n_flat": n_flat, "double_small_n": small_n,
                    "double_small": doubling[small_n], "double_small_2n": 2 * small_n, "double_large_n": large_n,
                    "double_large": doubling[large_n]}.items():
    glue(name, value)
print(f"per-op overhead T0 = {overhead_s * 1e6:.2f} us; bytes take as long as T0 at n = {n_flat:,.0f} elements")
Table(["n (fp32 elements)", "measured us / op", "model us / op", "T(2n) / T(n) measured", "T(2n) / T(n) model"],
      [[f"{n:,}", num(t_n[n] * 1e6), num(model_s[n] * 1e6), f"{doubling[n]:.2f}",
        f"{model_s[2 * n] / model_s[n]:.2f}"] for n in sizes])

# %% tags=["remove-input"]
fig, (ax1, ax2) = subplots(1, 2, width=10.5, height=3.9)
ax1.plot(sizes, [t_n[n] * 1e6 for n in sizes], "o-", color=COLORS["measured"], label="measured")
ax1.plot(sizes, [model_s[n] * 1e6 for n in sizes], "-", color=COLORS["predicted"],
         label=r"model $T_0 + 8n/\beta$ (measured $T_0$, $\beta$)")
ax1.axhline(overhead_s * 1e6, color=COLORS["ceiling"], lw=1, ls=":", label="per-op overhead $T_0$")
ax1.axvline(n_flat, color=COLORS["muted"], lw=1, ls=":")
finish(ax1, title="Time per op against size", xlabel="n (fp32 elements)", ylabel="µs per op", logx=2, logy=True)
ax2.plot(sizes, [doubling[n] for n in sizes], "o-", color=COLORS["measured"], label="measured")
ax2.plot(sizes, [model_s[2 * n] / model_s[n] for n in sizes], "-", color=COLORS["predicted"], label="model")
ax2.axhline(1, color=COLORS["muted"], lw=1)
ax2.axhline(2, color=COLORS["muted"], lw=1)
finish(ax2, title="Double the size: T(2n) / T(n)", xlabel="n (fp32 elements)", ylabel="ratio", logx=2)
plt.show()

# %% [markdown]
# Up to about {glue:text}`n_flat:,.0f` elements the op costs its overhead, {glue:text}`overhead_us:.1f` µs,
# whatever its size: going from {glue:text}`double_small_n:,` to {glue:text}`double_small_2n:,` elements
# changed the time by a factor of {glue:text}`double_small:.2f`, while at {glue:text}`double_large_n:,` elements doubling costs
# {glue:text}`double_large:.2f`×. That is the "double the batch, time barely moves" test: if it passes, the
# work is overhead-bound and a bigger batch is nearly free. (In between, the data fits in cache and runs
# faster than the memory roof predicts.) On a GPU the flat region is far wider: a launch costs microseconds,
# in which HBM moves megabytes.
#
# What helps, measured on a chain of {glue:text}`chain_len` small fma ops (`repeat_unary_ref`):

# %%
glue("chain_len", CHAIN_LEN)
x_small_chain = randn(SMALL_NUMEL, dtype=torch.float32)
x_big_chain = randn(SMALL_NUMEL * BIG_FACTOR, dtype=torch.float32)
remedies = {f"eager, {CHAIN_LEN} ops on {SMALL_NUMEL:,} elements": timed(
    lambda: elementwise.repeat_unary_ref(x_small_chain, CHAIN_LEN, "fma"))}
remedies[f"bigger ops: eager, {CHAIN_LEN} ops on {BIG_FACTOR}x the elements"] = timed(
    lambda: elementwise.repeat_unary_ref(x_big_chain, CHAIN_LEN, "fma"))
remedy_notes = {}
if USE_COMPILE:
    torch._dynamo.reset()
    chain_compiled = torch.compile(lambda t: elementwise.repeat_unary_ref(t, CHAIN_LEN, "fma"), dynamic=False)
    torch.testing.assert_close(chain_compiled(x_small_chain), elementwise.repeat_unary_ref(x_small_chain, CHAIN_LEN))
    remedies["torch.compile: one fused kernel"] = timed(lambda: chain_compiled(x_small_chain))
else:
    remedy_notes["torch.compile: one fused kernel"] = "not run in the smoke profile (compiling costs ~25 s cold)"
if device == "cuda":
    static_x = x_small_chain.clone()
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up on a side stream before capture, as the CUDA-graph docs advise
            for _ in range(3):
                elementwise.repeat_unary_ref(static_x, CHAIN_LEN, "fma")
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = elementwise.repeat_unary_ref(static_x, CHAIN_LEN, "fma")
        graph.replay()
        torch.testing.assert_close(static_y, elementwise.repeat_unary_ref(static_x, CHAIN_LEN, "fma"))
        remedies["CUDA graph: the eager chain, replayed"] = timed(graph.replay)
    except RuntimeError as err:  # reported, not hidden: the row says what failed
        remedy_notes["CUDA graph: the eager chain, replayed"] = f"capture failed: {err}"
else:
    remedy_notes["CUDA graph: the eager chain, replayed"] = "needs a CUDA GPU"
base = next(iter(remedies.values())).median_s
remedy_rows = []
for name, t in remedies.items():
    n_el = SMALL_NUMEL * (BIG_FACTOR if name.startswith("bigger") else 1)
    remedy_rows.append([name, num(t.median_s * 1e6), num(t.median_s / (CHAIN_LEN * n_el) * 1e9),
                        f"{base / t.median_s:.2f}"])
remedy_rows += [[name, note, "-", "-"] for name, note in remedy_notes.items()]
big_name = f"bigger ops: eager, {CHAIN_LEN} ops on {BIG_FACTOR}x the elements"
glue("big_factor", BIG_FACTOR)
glue("big_time_ratio", remedies[big_name].median_s / base)
glue("remedy_text", "; ".join(f"{name.split(':')[0]}: {base / t.median_s:.2f}x the eager speed"
                              for name, t in remedies.items() if not name.startswith(("eager", "bigger")))
     or "neither torch.compile nor a CUDA graph ran in this profile")
Table(["version", "µs per chain", "ns per element-op", "speed-up over eager"], remedy_rows)

# %% [markdown]
# {glue:text}`big_factor`× the data took only {glue:text}`big_time_ratio:.1f`× the time: the cost per element
# collapses once ops are big enough to leave the flat region. When the sizes cannot grow, remove the per-op
# costs instead. `torch.compile` turns the chain into one kernel, one launch and one round trip, but a compiled
# function has per-call costs of its own (guards, its wrapper, on a CPU waking the thread pool), so on tiny
# inputs it can lose. A CUDA graph records the launches once and replays them with one call, skipping Python
# and the dispatcher for the whole chain. Measured here: {glue:text}`remedy_text`.
#
# ### Recorded GPU results
#
# `python -m mlsys.kernels.benchmark` times the same kernels on a CUDA GPU (the fused Triton kernels against
# eager PyTorch and `torch.compile`) and records the result, with its device, versions and date, under
# `results/`. This page shows every record present:

# %%
records = results.load_records(kernel_benchmark.EXPERIMENT)
if not records:
    record_text = (f"No GPU record of the `{kernel_benchmark.EXPERIMENT}` experiment exists yet. On a machine "
                   "with a CUDA GPU, run `python -m mlsys.kernels.benchmark`: it writes "
                   f"`results/<device>/{kernel_benchmark.EXPERIMENT}.json`, which this page then plots here.")
else:
    record_text = (f"{len(records)} recorded run(s) of `{kernel_benchmark.EXPERIMENT}`: "
                   + "; ".join(f"{r['provenance']['device']} on {r['provenance']['date'][:10]}" for r in records) + ".")
glue("record_text", record_text)
for record in records:
    prov = record["provenance"]
    print(f"\n{prov['device']} | torch {prov['torch_version']} | triton {prov['triton_version']} | "
          f"CUDA {prov['cuda_version']} | {prov['date']} | commit {prov['git_commit']}\n$ {prov['command']}")
    print(kernel_benchmark.table(record["results"]))

# %% tags=["remove-input"]
for record in records:
    rows_r = record["results"]
    fma = [r for r in rows_r if r["kernel"] == "repeat_unary_fma"]
    copy_rows = [r for r in rows_r if r["kernel"] == "copy"]
    if not fma or not copy_rows:
        continue
    acc = hardware.match_device_name(record["provenance"]["device"])
    fig, ax = subplots(width=7.0, height=3.8)
    for style, dt_name in zip(["-", "--", ":"], sorted({r["dtype"] for r in fma}), strict=False):
        sel = sorted((r for r in fma if r["dtype"] == dt_name and r["k"] > 0), key=lambda r: r["k"])
        ax.plot([r["k"] for r in sel], [r["flop_per_s"] for r in sel], "o-", label=f"Triton fma, {dt_name} (recorded)")
        if acc is not None and "fp32" in acc.dense_flop_per_s:
            rec_ceil = roofline.Ceilings(acc.peak_flop_per_s("fp32"), copy_rows[0]["bytes_per_s"], "recorded")
            ax.plot([r["k"] for r in sel], [r["model_flops"] / roofline.estimate(
                r["model_flops"], r["model_bytes"], rec_ceil).time_s for r in sel], style, color=COLORS["predicted"],
                label=f"predicted, {dt_name}: fp32 spec peak, recorded copy bandwidth")
    finish(ax, title=f"Recorded: {record['provenance']['device']}, {record['provenance']['date'][:10]}",
           xlabel="k (fma steps per element)", ylabel="FLOP/s", logx=2, logy=True)
    ax.legend(fontsize=7)
    plt.show()

# %% [markdown]
# {glue:text}`record_text`
#
# ```{admonition} Takeaway
# :class: tip
# Intensity decides: a square bf16 matmul is compute-bound on an {glue:text}`spec_name` from
# $N =$ {glue:text}`n_star`, while an elementwise op ({glue:text}`claim_ew_bf16` FLOP/byte in bf16, not 1) can
# never use more than {glue:text}`ew_fraction_pct:.2g`% of the peak, and naive attention never more than
# its $d/b$ cap. On this machine, memory-bound ops ran at {glue:text}`ratio_mul:.2f`× their predicted time
# at {glue:text}`meas_gbps:,.1f` GB/s, and below about {glue:text}`n_flat:,.0f` elements an op cost its
# {glue:text}`overhead_us:.1f` µs overhead whatever its size.
# ```
#
# ## Exercises
#
# ### Q1 [When does a linear layer become compute-bound?]
#
# A bf16 linear layer with $d_\text{in} = d_\text{out} = 4096$ runs on an H100. From how many tokens per
# batch is its forward matmul compute-bound? Use `matmul_intensity`, then derive the closed form.

# %% tags=["hide-input"]
d_q1 = 4096
ridge_q1 = hardware.H100_SXM.ridge_intensity("bf16")
lo_q1, hi_q1 = 1, 1 << 20  # smallest tokens with intensity >= ridge, by bisection on the library's formula
while lo_q1 < hi_q1:
    mid = (lo_q1 + hi_q1) // 2
    lo_q1, hi_q1 = (lo_q1, mid) if B.matmul_intensity(mid, d_q1, d_q1, "bf16") >= ridge_q1 else (mid + 1, hi_q1)
tokens_q1 = lo_q1
# closed form: I = 2 t d^2 / (2 (t d + d^2 + t d)) = t d / (d + 2t) >= R  <=>  t >= R d / (d - 2R)
closed_q1 = math.ceil(ridge_q1 * d_q1 / (d_q1 - 2 * ridge_q1))
assert tokens_q1 == closed_q1
glue("q1_tokens", tokens_q1)
glue("q1_ridge", ridge_q1)
print(f"compute-bound from {tokens_q1} tokens (ridge {ridge_q1:.0f} FLOP/byte)")

# %% [markdown]
# ```{dropdown} Answer
# $I = 2td^2 / (b(2td + d^2)) = td/(d + 2t)$ in bf16, which tends to $t$ for $t \ll d$: a linear layer's
# intensity is roughly its token count. Setting it equal to the ridge {glue:text}`q1_ridge:.0f` gives
# $t \ge Rd/(d - 2R)$ = **{glue:text}`q1_tokens` tokens**, which the search over `matmul_intensity` confirms.
# Below that (decoding one sequence, a tiny batch) the layer is memory-bound: its time is the time to read
# the weights.
# ```
#
# ### Q2 [Naive against tiled attention at 8,192 tokens]
#
# For one layer's attention forward at sequence 8,192, batch 1, 32 heads of 128, bf16: how many bytes do the
# naive and the tiled kernels move, and how much of the naive traffic is the $S^2$ terms?

# %% tags=["hide-input"]
seq_q2, heads_q2, d_q2, b_q2 = 8192, 32, 128, bytes_per_element("bf16")
naive_q2 = B.naive_attention_traffic(1, heads_q2, seq_q2, d_q2, "bf16")
tiled_q2 = B.tiled_attention_traffic(1, heads_q2, seq_q2, d_q2, "bf16")
blocked_q2 = B.tiled_attention_traffic(1, heads_q2, seq_q2, d_q2, "bf16", block_q=128)
s2_q2 = heads_q2 * 4 * seq_q2**2 * b_q2
assert naive_q2.total_bytes == s2_q2 + tiled_q2.total_bytes
assert tiled_q2.total_bytes == heads_q2 * 4 * seq_q2 * d_q2 * b_q2
for name, value in {"q2_naive_gb": naive_q2.total_bytes / 1e9, "q2_tiled_mb": tiled_q2.total_bytes / 1e6,
                    "q2_blocked_gb": blocked_q2.total_bytes / 1e9, "q2_s2_pct": 100 * s2_q2 / naive_q2.total_bytes,
                    "q2_ratio": naive_q2.total_bytes / tiled_q2.total_bytes}.items():
    glue(name, value)
print(f"naive {naive_q2.total_bytes / 1e9:.2f} GB, tiled {tiled_q2.total_bytes / 1e6:.0f} MB "
      f"(block_q 128: {blocked_q2.total_bytes / 1e9:.2f} GB)")

# %% [markdown]
# ```{dropdown} Answer
# Naive: {glue:text}`q2_naive_gb:.2f` GB, of which {glue:text}`q2_s2_pct:.1f`% are the four $S^2$ terms
# (writing and reading $S$ and $P$). Tiled, ideally: $4Sd$ elements per head, {glue:text}`q2_tiled_mb:.0f` MB,
# {glue:text}`q2_ratio:.0f` times less. A real tiled kernel with query blocks of 128 rereads $K$ and $V$ once per
# block, {glue:text}`q2_blocked_gb:.2f` GB, still far below the naive figure.
# ```
#
# ### Q3 [H200 against H100]
#
# The H200 has the H100's compute and faster memory. Compare their bf16 ridge points. Which kernels get
# faster on the H200, and by how much?

# %% tags=["hide-input"]
h100, h200 = hardware.H100_SXM, hardware.H200_SXM
assert h100.peak_flop_per_s("bf16") == h200.peak_flop_per_s("bf16")
ridge_ratio = h100.ridge_intensity("bf16") / h200.ridge_intensity("bf16")
bw_ratio = h200.hbm_bytes_per_s / h100.hbm_bytes_per_s
assert math.isclose(ridge_ratio, bw_ratio)
for name, value in {"q3_h100": h100.ridge_intensity("bf16"), "q3_h200": h200.ridge_intensity("bf16"),
                    "q3_speedup": bw_ratio}.items():
    glue(name, value)
print(f"ridge H100 {h100.ridge_intensity('bf16'):.0f}, H200 {h200.ridge_intensity('bf16'):.0f} FLOP/byte; "
      f"memory-bound kernels {bw_ratio:.2f}x faster")

# %% [markdown]
# ```{dropdown} Answer
# Ridge {glue:text}`q3_h100:.0f` FLOP/byte on the H100, {glue:text}`q3_h200:.0f` on the H200. Memory-bound
# kernels (elementwise ops, norms, naive attention, decoding) run {glue:text}`q3_speedup:.2f`× faster, the
# bandwidth ratio; compute-bound kernels (large matmuls) do not speed up at all; kernels with intensity between
# the two ridges move from memory-bound to compute-bound. A lower ridge makes a chip *easier* to keep busy.
# ```
#
# ### Q4 [How many FMAs per element make an elementwise kernel compute-bound?]
#
# On an H100, from which $k$ is `repeat_unary(x, k, "fma")` compute-bound, for fp32 inputs and for bf16 inputs
# (the arithmetic is fp32 in both)?

# %% tags=["hide-input"]
fp32_roof = roofline.Ceilings(h100.peak_flop_per_s("fp32"), h100.hbm_bytes_per_s, "H100 CUDA cores")
k_q4 = {}
for dt in ("fp32", "bf16"):
    k_q4[dt] = next(k for k in range(1, 10_000) if fp32_roof.bound(B.intensity(
        elementwise.repeat_unary_flops(1, k), elementwise.repeat_unary_bytes(1, dt))) == "compute-bound")
    assert k_q4[dt] == math.ceil(bytes_per_element(dt) * fp32_roof.ridge_intensity)
assert k_q4["bf16"] <= k_q4["fp32"] / 2 + 1
glue("q4_fp32", k_q4["fp32"])
glue("q4_bf16", k_q4["bf16"])
glue("q4_ridge", fp32_roof.ridge_intensity)
print(k_q4)

# %% [markdown]
# ```{dropdown} Answer
# $I = 2k/(2b) = k/b$ against the fp32 CUDA-core ridge of {glue:text}`q4_ridge:.0f` FLOP/byte: $k \ge$
# {glue:text}`q4_fp32` for fp32 inputs and {glue:text}`q4_bf16` for bf16 (half the bytes, so half the FMAs).
# Every real elementwise op (an activation, a residual add, a norm) does a handful of FLOPs per element, far
# below either: it runs at the memory bandwidth, and making its arithmetic cheaper changes nothing.
# ```
#
# ## Summary
#
# - Arithmetic intensity $I = F/Q$ (FLOP per byte moved) decides what limits a kernel: attainable FLOP/s $=
#   \min(P, I\beta)$, memory-bound below the ridge $P/\beta$, compute-bound above it. Both $Q$ and $P$ depend
#   on the dtype.
# - A square matmul has $I = 2N/(3b)$ and a linear layer about $t$ (its token count, in bf16); batching through
#   shared weights raises intensity, per-item weights do not.
# - Elementwise ops, softmax and norms have intensity $O(1/b)$: {glue:text}`claim_ew_fp32` FLOP/byte for a unary
#   fp32 op, not 1. They can only be made faster by moving fewer bytes, that is, by fusion.
# - Naive attention's $S^2$ traffic caps its intensity at about $d/b$; tiled attention removes it.
# - A linear layer's forward and backward read $W$ twice and write $dW$ once (plus one read of $dW$ when
#   accumulating), not "three reads".
# - Ridge points: {glue:text}`a100_ridge:.0f` FLOP/byte for an A100 in fp16 ({glue:text}`a100_ridge_rounded:.0f`
#   only with the bandwidth rounded), {glue:text}`h100_ridge:.0f` for an H100 in bf16.
# - Measured roofs on the reader's device (a large copy for bandwidth, the best matmul for compute) predict eager
#   ops' times; below a size where bytes take less than the per-op overhead, nothing but overhead matters.

# %% tags=["remove-cell"]
allocator.close()  # glibc's defaults again: freed CPU memory goes back to the OS
