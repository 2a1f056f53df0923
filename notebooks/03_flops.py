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
# (sec-flops)=
# # FLOPs: counting the arithmetic of training
#
# **Question.** How many days does it take to train a {glue:text}`n_params_b:.0f`-billion-parameter
# model on {glue:text}`n_tokens_t:.0f` trillion tokens with {glue:text}`n_gpus:,`
# {glue:text}`gpu_name` GPUs?
#
# Cheat sheet: {doc}`../book/flops_onepager`.

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
import datetime
import math

import matplotlib.pyplot as plt
import torch
from IPython.display import display
from torch.utils.flop_counter import FlopCounterMode

from mlsys import experiments, hardware, third_party
from mlsys.accounting import flops, memory, utilization
from mlsys.accounting.params import count_params, param_counts
from mlsys.book import glue, solved_by
from mlsys.diagrams import flops as flop_diagrams
from mlsys.experiments import flop_counts, kit, train_step
from mlsys.models.config import TransformerConfig
from mlsys.models.counting import count_model_flops
from mlsys.numerics import precision

# %% tags=["parameters"]
SEED = 0
# The question: a 70B model, 15T tokens, 1,024 H100s at 50% MFU (dense bf16 peak)
N_PARAMS, N_TOKENS, N_GPUS, TARGET_MFU = 70_000_000_000, 15 * 10**12, 1_024, 0.5
GPU, PEAK_DTYPE = hardware.H100_SXM, "bf16"
# A 70B model of the book's shape (multi-head attention, SwiGLU), trained on SEQ_70B-token sequences
SHAPE_70B = TransformerConfig(vocab_size=32_000, context_length=4_096, d_model=8_192, n_layers=80,
                              n_heads=64, d_ff=24_576)
SEQ_70B = 4_096
MATMUL_SHAPE = (37, 53, 71)  # m, n, k: irregular on purpose
LINEAR_TOKENS, LINEAR_D_IN, LINEAR_D_OUT = 45, 96, 160
BREAKDOWN_PRESET, BATCH, SEQ = "small", 4, 512  # per-layer tables, the H100 step-time table
PRESETS_UP_TO_XL = ("debug", "small", "medium", "large", "xl")
COUNTER_BATCH, COUNTER_SEQ = 3, 100  # the per-preset counter table (irregular, fits every context)
BACKWARD_PRESETS = env.pick(smoke=PRESETS_UP_TO_XL[:3], cpu=PRESETS_UP_TO_XL, gpu=PRESETS_UP_TO_XL)
RULE_PRESETS = ("debug", "small", "medium", "large", "xl", "2.7B")  # the 6N plot
RULE_SEQS = tuple(2**k for k in range(6, 18))  # 64 ... 131,072 tokens
# Measured MFU of training steps on this machine: sizes per profile live with the experiment
STEPS = env.pick(**train_step.SIZES)
DECODE_PRESET, DECODE_CONTEXTS = "2.7B", (1, 256, 1_024)  # generation with a KV cache


# %% tags=["remove-cell"]
SECONDS_PER_DAY = datetime.timedelta(days=1).total_seconds()


# %% [markdown]
# Training compute is arithmetic: a number of floating-point operations (FLOPs) that the model's
# shape fixes before anything runs. This chapter counts them for every matrix multiply in the book's
# transformer, checks each count against PyTorch's own FLOP counter, and turns the total into time
# with one more number, the fraction of the hardware's peak a real training step reaches (MFU).
#
# ## Napkin math
#
# The rule of thumb {cite}`kaplan2020scaling`: training costs **6 FLOPs per parameter per token**, 2
# in the forward pass and 4 in the backward pass. The section on FLOPs per token derives it from the
# model and shows where it breaks. Time is then total FLOPs divided by what the GPUs deliver: their
# count, the peak FLOP/s of one, and the model FLOPs utilization (MFU), the fraction of that peak
# the run achieves.

# %%
peak = GPU.peak_flop_per_s(PEAK_DTYPE)  # dense peak
total_flops = flops.six_n_flops_per_token(N_PARAMS) * N_TOKENS
days = utilization.training_time_s(total_flops, N_GPUS, peak, TARGET_MFU) / SECONDS_PER_DAY
assert math.isclose(days * SECONDS_PER_DAY,
                    6 * N_PARAMS * N_TOKENS / (N_GPUS * peak * TARGET_MFU), rel_tol=1e-12)
sparse_peak = GPU.sparse_flop_per_s(PEAK_DTYPE)
sparse_days = utilization.training_time_s(total_flops, N_GPUS, sparse_peak,
                                          TARGET_MFU) / SECONDS_PER_DAY
print(f"6 N D = {total_flops:.3g} FLOPs: {days:.1f} days ({sparse_days:.1f} with the sparse "
      "peak, which is wrong)")

# %% tags=["remove-cell"]
for name, value in {"n_params_b": N_PARAMS / 1e9, "n_tokens_t": N_TOKENS / 1e12, "n_gpus": N_GPUS,
                    "gpu_name": GPU.name, "target_mfu_pct": 100 * TARGET_MFU, "days": days,
                    "total_flops": total_flops, "peak_tflops": peak / 1e12,
                    "sparse_days": sparse_days, "sparse_tflops": sparse_peak / 1e12}.items():
    glue(name, value)

# %% [markdown]
# {glue:text}`n_params_b:.0f`B parameters × {glue:text}`n_tokens_t:.0f`T tokens × 6 is
# {glue:text}`total_flops:.3g` FLOPs. At {glue:text}`target_mfu_pct:.0f`% of the dense bf16 peak of
# {glue:text}`n_gpus:,` {glue:text}`gpu_name` GPUs ({glue:text}`peak_tflops:.1f` TFLOP/s each), that
# is **{glue:text}`days:.0f` days**.
#
# The peak must be the *dense* one. The H100 spec sheet headlines {glue:text}`sparse_tflops:,.0f`
# TFLOP/s for bf16, but that figure assumes 2:4 structured sparsity (two of every four weights are
# zero and the tensor cores skip them), which a dense training run never has; the library stores the
# dense figure and derives the sparse one as exactly twice it (see {ref}`sec-hardware`). Taking the
# sparse figure would predict {glue:text}`sparse_days:.0f` days, and would make every MFU look half
# as good as it is.
#
# The 6N rule leaves out the attention scores, whose cost grows with the sequence length. For a 70B
# model shaped like the book's transformer, the detailed count derived below says:

# %%
n_70b = count_params(SHAPE_70B)
detailed_70b = flops.training_flops_per_token(SHAPE_70B, SEQ_70B)
ratio_70b = detailed_70b / flops.six_n_flops_per_token(n_70b)
days_detailed = utilization.training_time_s(detailed_70b * N_TOKENS, N_GPUS, peak, TARGET_MFU)
days_detailed /= SECONDS_PER_DAY
print(f"N = {n_70b:,}; detailed / 6N at seq {SEQ_70B}: {ratio_70b:.3f} -> {days_detailed:.1f} days")

# %% tags=["remove-cell"]
for name, value in {"n_70b_b": n_70b / 1e9, "layers_70b": SHAPE_70B.n_layers, "seq_70b": SEQ_70B,
                    "d_model_70b": SHAPE_70B.d_model, "ratio_70b_pct": 100 * (ratio_70b - 1),
                    "days_detailed": days_detailed}.items():
    glue(name, value)

# %% [markdown]
# {glue:text}`layers_70b` layers of width {glue:text}`d_model_70b:,` give {glue:text}`n_70b_b:.1f`B
# parameters; attention over {glue:text}`seq_70b:,`-token sequences adds
# {glue:text}`ratio_70b_pct:.1f`% to the 6N count, so about **{glue:text}`days_detailed:.0f` days**.
# The rest of the chapter builds each piece of this estimate and checks it: the FLOPs of a matmul,
# of a linear layer's forward and backward, of every component of a transformer block, the per-token
# total, and what fraction of peak a real training step reaches on the machine running this page.
#
# ## A matrix multiply: 2mnk
#
# $C = AB$ with $A$ of shape $(m, k)$ and $B$ of shape $(k, n)$ computes $mn$ dot products of length
# $k$: $k$ multiplies and $k$ adds each (the first add is into zero), so **$2mnk$ FLOPs**. One
# multiply-add counts as two FLOPs, the convention of peak FLOP/s figures too.
#
# ```{literalinclude} ../lib/mlsys/accounting/flops.py
# :pyobject: matmul_flops
# ```
#
# PyTorch ships a FLOP counter, `torch.utils.flop_counter.FlopCounterMode`, which intercepts every
# operator and applies a per-operator formula. It agrees:

# %%
m, n, k = MATMUL_SHAPE
g = torch.Generator().manual_seed(SEED)
a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
with FlopCounterMode(display=False) as counter:
    a @ b
assert counter.get_total_flops() == flops.matmul_flops(m, n, k) == 2 * m * n * k
print(f"({m} x {k}) @ ({k} x {n}): counter {counter.get_total_flops():,} = 2mnk")

# %% [markdown]
# ## A linear layer, forward and backward
#
# A bias-free linear layer $Y = XW$ over $t$ tokens ($X$ is $t \times d_\text{in}$, $W$ is
# $d_\text{in} \times d_\text{out}$) is one matmul: $2\,t\,d_\text{in}\,d_\text{out}$ FLOPs, that is
# **2 FLOPs per weight per token**. The backward pass receives $\partial L/\partial Y$ and computes
# two matmuls of the same size:
#
# - the gradient for the layer below, $\partial L/\partial X = (\partial L/\partial Y)\, W^\top$:
#   $2\,t\,d_\text{out}\,d_\text{in}$;
# - the weight gradient, $\partial L/\partial W = X^\top (\partial L/\partial Y)$:
#   $2\,d_\text{in}\,t\,d_\text{out}$.
#
# So **backward = 2 × forward** and forward + backward = 3 × forward, 6 FLOPs per weight per
# token. Drawn to scale for {glue:text}`lin_tokens` tokens and a {glue:text}`lin_d_in` →
# {glue:text}`lin_d_out` layer (`mlsys.diagrams.flops`), each matmul's output $C$ below its right
# operand and beside its left one, so that a row and a column meet at the element they make:

# %% tags=["remove-input"]
for name, value in {"lin_tokens": LINEAR_TOKENS, "lin_d_in": LINEAR_D_IN,
                    "lin_d_out": LINEAR_D_OUT}.items():
    glue(name, value)
flop_diagrams.draw_linear_passes(LINEAR_TOKENS, LINEAR_D_IN, LINEAR_D_OUT)
plt.show()

# %% [markdown]
# The three products are built from the same three sizes in a different order: each multiplies
# along a different one of them (the forward along $d_\text{in}$, $dX$ along $d_\text{out}$, $dW$
# along the tokens), and each costs $2\,t\,d_\text{in}\,d_\text{out}$.
#
# ```{literalinclude} ../lib/mlsys/accounting/flops.py
# :pyobject: linear_backward_flops
# ```
#
# Counting the forward and the backward separately on a real `nn.Linear`:

# %%
layer = torch.nn.Linear(LINEAR_D_IN, LINEAR_D_OUT, bias=False)
x = torch.randn(LINEAR_TOKENS, LINEAR_D_IN, requires_grad=True, generator=g)
with FlopCounterMode(display=False) as forward_counter:
    y = layer(x)
with FlopCounterMode(display=False) as backward_counter:
    y.sum().backward()  # the gradient of a sum is an expand: no FLOPs of its own
fwd = flops.linear_flops(LINEAR_TOKENS, LINEAR_D_IN, LINEAR_D_OUT)
assert forward_counter.get_total_flops() == fwd
bwd = flops.linear_backward_flops(LINEAR_TOKENS, LINEAR_D_IN, LINEAR_D_OUT)
assert backward_counter.get_total_flops() == bwd == 2 * fwd
print(f"forward {fwd:,}, backward {bwd:,} (2x)")

# %% [markdown]
# (When a layer's input needs no gradient, like raw data entering the first layer, autograd skips
# $\partial L/\partial X$ and the backward costs 1 × forward; in a transformer that happens
# nowhere, since the first projections read the trainable embedding's output.)
#
# ## Every component of a transformer block
#
# The book's model (`mlsys.models.transformer`) is a pre-norm decoder: each block applies RMSNorm,
# causal multi-head attention with RoPE on q and k, RMSNorm again and a SwiGLU feed-forward
# {cite}`shazeer2020glu`, with two residual adds; after the last block come a final RMSNorm and the
# output head. With $B$ = batch, $T$ = sequence length, $D$ = d_model, $H$ = heads, $F$ = d_ff and
# $V$ = vocab, the forward FLOPs of one block are nine matmuls (four $D \times D$ projections; the
# scores $QK^\top$, per head $2T^2 d_\text{head}$ and over the heads $2BT^2D$ because $H
# d_\text{head} = D$; the weighted values, the same; SwiGLU's three $D \times F$ matrices) plus
# elementwise work estimated in operations per element. The library writes exactly this down:
#
# ```{literalinclude} ../lib/mlsys/accounting/flops.py
# :pyobject: layer_flops
# ```
#
# For the {glue:text}`breakdown_preset` preset at batch {glue:text}`batch` and sequence
# {glue:text}`seq` the block's budget is (shares of the block's total):

# %% tags=["hide-input"]
cfg = TransformerConfig.preset(BREAKDOWN_PRESET)
lf = flops.layer_flops(cfg, BATCH, SEQ)
block_total = lf.matmul_flops + lf.elementwise_flops
for name, value in {"elementwise_share_pct": 100 * lf.elementwise_flops / block_total,
                    "breakdown_preset": BREAKDOWN_PRESET, "batch": BATCH, "seq": SEQ}.items():
    glue(name, value)
flop_counts.block_table(cfg, BATCH, SEQ)  # each term against `flop_counts.BLOCK_FORMULAS`

# %% [markdown]
# The elementwise estimates add up to {glue:text}`elementwise_share_pct:.2f`% of the block: norms,
# RoPE, softmax and residual adds are a rounding error in FLOPs. (They are not a rounding error in
# *time*: each reads and writes whole activation tensors, and the byte-movement chapters show they
# are limited by memory bandwidth, not arithmetic.) `torch.utils.flop_counter` counts only matmuls
# and convolutions for the same reason, and from here on "FLOPs" means matmul FLOPs unless a table
# says otherwise.
#
# The nine matmuls of the block with their backward, each split into the gradients of its two
# operands as for the linear layer above (for the scores $QK^\top$ they are $dQ$ and $dK$, for the
# weighted values $dP$ and $dV$: the same rule, no weight involved):

# %% tags=["remove-input"]
glue("t2_share_pct", 100 * (lf.attention_scores + lf.attention_values) / lf.matmul_flops)
flop_diagrams.draw_block_flops(cfg, BATCH, SEQ)
plt.show()

# %% [markdown]
# Every row is three equal parts, so the block's backward is twice its forward whatever the sizes;
# what the sizes decide is the length of the rows. Here the SwiGLU matrices are the longest, and
# the two $T^2$ matmuls are {glue:text}`t2_share_pct:.0f`% of the block's matmul FLOPs.
#
# The whole model adds the output head, a $D \times V$ linear layer ($2BTDV$), and the final norm;
# the embedding is a table lookup and costs no FLOPs. `transformer_flops` assembles the totals, and
# knows the module path of each term in the PyTorch model (`ModelFlops.module_flops`).
#
# ## Checking against a real counter
#
# A formula is only as good as its check. We build the real model on PyTorch's *meta* device, where
# tensors have shapes but no storage: even the largest preset costs no memory and no arithmetic
# runs, but every operator still dispatches, so `FlopCounterMode` sees each matmul with its shapes
# and attributes it to the module that ran it.

# ```{literalinclude} ../lib/mlsys/models/counting.py
# :pyobject: count_model_flops
# ```

# %%
counter = count_model_flops(cfg, BATCH, SEQ)
counted = counter.get_flop_counts()  # {"Transformer.blocks.0.attn": {aten.mm: ..., ...}, ...}
predicted = flops.transformer_flops(cfg, BATCH, SEQ)
for module, value in predicted.module_flops().items():  # every module of every block, and the head
    assert sum(counted[f"Transformer.{module}"].values()) == value, module
assert counter.get_total_flops() == predicted.forward_matmul_flops

# %% [markdown]
# Every module of every block matches exactly: the cell asserts all of them (the attention module's
# own operators are the two batched matmuls `bmm`, scores and weighted values, on top of its four
# projections' `mm`). The same check for every preset up to `xl`, on the whole model's forward, and
# for the forward + backward where this profile runs it (the backward on the meta device takes a few
# seconds per preset):

# %% tags=["hide-input"]
# each total asserted against `transformer_flops`, and forward + backward against 3 forwards
preset_table, counted_totals = flop_counts.preset_counts(PRESETS_UP_TO_XL, COUNTER_BATCH,
                                                         COUNTER_SEQ, BACKWARD_PRESETS)
for name, value in {"counter_batch": COUNTER_BATCH, "counter_seq": COUNTER_SEQ}.items():
    glue(name, value)
preset_table

# %% [markdown]
# At batch {glue:text}`counter_batch` and sequence {glue:text}`counter_seq` (irregular on purpose),
# the analytic forward equals the counter for every preset, and forward + backward is exactly three
# forwards. The unit tests (`tests/accounting/test_flops.py`) repeat the module-by-module forward
# check for every preset up to `xl`, and the 3 × check with both attention backends.
#
# ```{note}
# The scores are counted for the full $T \times T$ matrix, as the naive implementation computes them
# and as the counter counts them, although the causal mask makes half of them useless
# (FlashAttention-style kernels skip the masked blocks {cite}`dao2022flashattention`). And the
# counter books *backward* operators to modules only approximately: compare backward totals.
# ```
#
# ### The causal convention changes MFU
#
# A causal model uses only the pairs $j \le i$ of the $T^2$ scores, $T(T+1)/2$ of them, and three
# ways of counting them circulate (`mlsys.accounting.attention.CAUSAL_CONVENTIONS`): **dense**, all
# $T^2$ pairs, what the naive kernel executes, what the counter reports and what the MFU formulas of
# PaLM and Megatron-LM count {cite}`chowdhery2022palm` {cite}`korthikanti2022reducing`; **half**,
# $T^2/2$, the FlashAttention-2 paper's benchmarks {cite}`dao2023flashattention2`; **exact**, the
# pairs attended. The attention term of a training token drops from $12LTD$ to about $6LTD$. The
# step's time does not change, so the MFU reported for the *same* run drops with its FLOP count: at
# the question's {glue:text}`target_mfu_pct:.0f`% (dense),

# %% tags=["hide-input"]
per_70b = flop_counts.causal_flops_per_token(SHAPE_70B, SEQ_70B)  # dense, half, exact
glue("causal_mfu_70b_pct", 100 * TARGET_MFU * per_70b["half"] / per_70b["dense"])
flop_counts.causal_table([(f"`{BREAKDOWN_PRESET}`", cfg, SEQ), ("70B shape", SHAPE_70B, SEQ_70B)],
                         TARGET_MFU)

# %% [markdown]
# The 70B run of the question is a {glue:text}`causal_mfu_70b_pct:.1f`% MFU run by the causal
# count: the same days, a different number. Two MFUs compare only under one convention; this book
# uses the dense one, the counter's, and so do the published figures below.
#
# ## FLOPs per token and the 6N rule
#
# Divide by the $BT$ tokens. Every weight matrix costs 2 FLOPs per weight per token in the forward
# pass and 4 in the backward, so the matmuls with parameters cost $6 N_\text{matmul}$ per token,
# where $N_\text{matmul}$ counts the parameters that take part in a matmul: every weight except the
# embedding table (a lookup) and the norm gains (elementwise). The two attention matmuls have no
# parameters: per token and layer they cost $2 \cdot 2TD$ forward, $3 \times 4TD = 12TD$ for
# training. Hence
#
# $$
# \frac{\text{training FLOPs}}{\text{token}} = 6\,N_\text{matmul} + 12\,L\,T\,D ,
# $$
#
# the same form as the model FLOPs of the PaLM paper {cite}`chowdhery2022palm`. The 6N rule replaces
# $N_\text{matmul}$ by the total $N$ and drops the second term:
#
# ```{literalinclude} ../lib/mlsys/accounting/flops.py
# :pyobject: training_flops_per_token
# ```

# %% tags=["hide-input"]
flop_counts.six_n_table(RULE_PRESETS)  # asserts: detailed = 6 N_matmul + 12 LTD

# %% [markdown]
# Two things separate the rule from the count, and the plot below shows both over sequence length:
#
# - **Long sequences.** The attention term grows with $T$. Relative to the parameter term it is
#   $12LTD / 6N_\text{matmul}$; with $N_\text{matmul} \approx 16 L D^2$ (SwiGLU with $F = 4D$) that
#   is about $T / (8D)$: negligible while $T \ll 8D$, equal to the rest at $T \approx 8D$.
# - **Small models.** The embedding table is in $N$ but costs no FLOPs. In a large model it is a
#   sliver of $N$; in the `debug` model it is a large share, and 6N overcounts.

# %% tags=["remove-cell"]
ratios = {name: [flops.six_n_ratio(TransformerConfig.preset(name), s) for s in RULE_SEQS]
          for name in RULE_PRESETS}
LONG_PRESET, LONG_SEQ, SHORT_SEQ = "xl", 16_384, 128
xl_long = ratios[LONG_PRESET][RULE_SEQS.index(LONG_SEQ)]
xl_short = ratios[LONG_PRESET][RULE_SEQS.index(SHORT_SEQ)]
debug_short = ratios["debug"][0]  # at the shortest sequence plotted
assert 0.9 < xl_short < 1.05 and xl_long > 1.5  # close for xl at short T, far off at long T
assert debug_short < 1  # and an overcount for a model that is mostly embedding
debug = TransformerConfig.preset("debug")
for name, value in {"xl_long": xl_long, "xl_short": xl_short, "debug_short": debug_short,
                    "long_seq": LONG_SEQ, "short_seq": SHORT_SEQ, "debug_seq": RULE_SEQS[0],
                    "debug_embedding_pct": 100 * param_counts(debug).embedding / count_params(debug)
                    }.items():
    glue(name, value)

# %% tags=["remove-input"]
kit.draw(flop_counts.plot_six_n, RULE_PRESETS, width=6.8, height=4.0, seqs=RULE_SEQS,
         counted=counted_totals, batch=COUNTER_BATCH, seq=COUNTER_SEQ, shape_70b=SHAPE_70B)

# %% [markdown]
# For `xl` the rule is within a few percent at short sequences ({glue:text}`xl_short:.3f` at
# {glue:text}`short_seq` tokens) but undercounts by a factor of {glue:text}`xl_long:.2f` at
# {glue:text}`long_seq:,` tokens; at {glue:text}`debug_seq` tokens the `debug` model's true count is
# only {glue:text}`debug_short:.2f` × 6N, because {glue:text}`debug_embedding_pct:.0f`% of its
# parameters are the embedding table. The diamonds are the counter's totals from the table above.
# Kaplan et al. {cite}`kaplan2020scaling` count $N$ without the embeddings for this reason, and keep
# the context-dependent term in their forward count.
#
# Where do the FLOPs go? Per preset at sequence {glue:text}`seq`, as shares of the forward pass:

# %% tags=["remove-input"]
kit.draw(flop_counts.plot_shares, RULE_PRESETS, width=6.8, height=4.0, seq=SEQ)

# %% [markdown]
# The feed-forward dominates every preset: with $F = 4D$ its three matrices hold $12D^2$ of the
# block's $16D^2$ weights. The output head is a large slice of the small models (a vocabulary of
# {glue:text}`vocab:,` tokens against a narrow $D$) and fades with size, and the two $T^2$ attention
# matmuls take a share that shrinks as $D$ grows at fixed $T$.
#
# ## Formulas that circulate, checked
#
# Per-layer FLOP formulas are passed around in posts and slides. Three common ones, as the library
# keeps them, each checked here against the counter on the real module:
#
# ```{literalinclude} ../lib/mlsys/accounting/flops.py
# :pyobject: claimed_attention_flops
# ```

# %% tags=["hide-input"]
# name: (claimed formula, its value, corrected formula, its value, the counter); each asserted
checks = flop_counts.claimed_checks(cfg, BATCH, SEQ, counted)  # the `small` model's counts, above
attention_check = checks["attention sub-layer"]
for name, value in {"attention_claim_ratio": attention_check[1] / attention_check[4],
                    "n_heads": cfg.n_heads, "vocab": cfg.vocab_size}.items():
    glue(name, value)
flop_counts.claimed_table(checks)

# %% [markdown]
# - **Linear, $2 B D_\text{in} D_\text{out}$**: right *per token*, but a batch of sequences has $BT$
#   rows; the formula is short by the factor $T$.
# - **Attention, $2BTD(4D + 2TH)$**: the $4D$ part (four projections) is right, but the $T^2$ part
#   carries an extra factor $H$. Per head the scores cost $2T^2 d_\text{head}$, and summing over
#   heads gives $2T^2 H d_\text{head} = 2T^2 D$: the head count is already inside $D$. With
#   {glue:text}`n_heads` heads the claim overcounts this sub-layer by
#   {glue:text}`attention_claim_ratio:.2f` × at $T$ = {glue:text}`seq`, and by more at longer
#   sequences.
# - **Feed-forward, $4BTDF$**: right for the two-matrix MLP (the last row), but SwiGLU has three
#   matrices, $6BTDF$. Models that adopt SwiGLU usually shrink $F$ to about $\tfrac{8}{3}D$
#   {cite}`shazeer2020glu` to keep the FLOPs of the $F = 4D$ MLP; the CS336 presets keep $F = 4D$.
#
# ## Generating a token: decode FLOPs with a KV cache
#
# Training takes all $T$ tokens of a sequence at once. Generation makes one token at a time, and
# each new token attends to every earlier one. Re-running the model over the whole prefix for every
# new token would cost a full forward each time; a *KV cache* keeps every layer's keys and values
# of the earlier positions, so the new token needs only its own row: each weight once, $2N_\text{
# matmul}$ FLOPs, and the scores and weighted values against the $t$ cached positions, $2 \cdot 2tD$
# per layer:
#
# $$ \frac{\text{decode FLOPs}}{\text{token}} = 2N_\text{matmul} + 4LDt , $$
#
# a third of a training token at sequence length $t$. `decode_flops` counts it with PyTorch's
# counter (one token through the real model on the meta device, plus one query's attention against
# $t$ cached keys and values) and asserts the formula, here for the {glue:text}`decode_preset`
# preset:

# %% tags=["hide-input"]
decode_cfg = TransformerConfig.preset(DECODE_PRESET)
t_equal = param_counts(decode_cfg).matmul / (2 * decode_cfg.n_layers * decode_cfg.d_model)
for name, value in {"decode_preset": DECODE_PRESET, "decode_t_equal": t_equal}.items():
    glue(name, value)
flop_counts.decode_table(decode_cfg, DECODE_CONTEXTS)  # counted, and asserted = the formula

# %% [markdown]
# The weights dominate: the cached attention equals them only at $t = N_\text{matmul}/(2LD) =$
# {glue:text}`decode_t_equal:,.0f` positions. The cache turns each new token's forward over the
# whole prefix into one token's work, $t$ times less. Few FLOPs per token is not the same as a fast
# token, though: each decoded token reads every weight and the whole cache for them, and the
# byte-movement chapters show that reading, not arithmetic, sets the pace of decoding.
#
# ## MFU and HFU
#
# **Model FLOPs utilization** (MFU), introduced with PaLM {cite}`chowdhery2022palm`, divides the
# FLOPs the *model* requires (forward + backward, $3\times$ forward) by the time and the peak; it
# does not reward extra work. **Hardware FLOPs utilization** (HFU) counts every FLOP executed,
# including the forward recomputed during the backward when activations are checkpointed
# {cite}`korthikanti2022reducing`: with full recomputation a step executes about four forwards'
# worth instead of three {cite}`narayanan2021efficient`, so HFU $\approx \tfrac{4}{3}$ MFU for the
# same run (a run reporting 45% MFU with full recomputation has about 60% HFU; MFU is the number
# to compare). How close to $\tfrac{4}{3}$ depends on what is rerun, below.
#
# ```{literalinclude} ../lib/mlsys/accounting/utilization.py
# :pyobject: mfu
# ```

# %%
forward_flops, step_s = 1e15, 10.0  # any forward and any step time
step_mfu = utilization.mfu(3 * forward_flops, step_s, peak)
step_hfu = utilization.hfu(utilization.hardware_training_flops(forward_flops, recompute="full"),
                           step_s, peak)
assert math.isclose(step_hfu, 4 / 3 * step_mfu)

# %% [markdown]
# "HFU = $\tfrac{4}{3}$ MFU" counts a whole extra forward, the output head included. Megatron-LM's
# full recomputation reruns every block but not the head (its FLOP formula keeps the head's term
# at $6BTDV$ {cite}`narayanan2021efficient`), a little under $\tfrac{4}{3}$. PyTorch's
# non-reentrant `torch.utils.checkpoint` around each block also stops each rerun as soon as the
# tensors the backward needs are back, so a block's last matmul ($w_2$) is never rerun: chapter
# {ref}`sec-benchmarking` counts {glue:text}`hfu_early_pct:.1f`% recomputed, not 33%. Each number
# is right for what it reruns. For the {glue:text}`breakdown_preset` model at batch
# {glue:text}`batch` × {glue:text}`seq` (chapter 05's sizes), with the HFU that a run at
# {glue:text}`target_mfu_pct:.0f`% MFU would report:

# %% tags=["hide-input"]
hfu_ratios = flop_counts.recompute_ratios(cfg, BATCH, SEQ)  # HFU / MFU, per convention
glue("hfu_early_pct", 100 * (hfu_ratios[flop_counts.RECOMPUTE_CONVENTIONS[-1]] - 1))
flop_counts.recompute_table(cfg, BATCH, SEQ, TARGET_MFU)

# %% [markdown]
# ## Measurement: MFU of a training step on this machine
#
# We time full training steps (forward, backward and an AdamW update) and compare them with the
# matmul FLOPs `transformer_flops` predicts. The ceiling is the best FLOP/s this device reaches on
# square matmuls, measured *interleaved* with the steps in one run (a ceiling measured minutes apart
# can move threefold on a shared machine), and the run is repeated until the ceiling holds still, no
# step beats it and no timing is too spread to read; otherwise the page withholds its verdict. On a
# GPU the library knows, the spec's dense peak gives a second MFU. The experiment lives in
# `mlsys.experiments.train_step`; the training step is the library's:
#
# ```{literalinclude} ../lib/mlsys/training.py
# :pyobject: make_train_step
# ```

# %%
step_rows = train_step.run(STEPS)
train_step.table(step_rows, hardware.detect())

# %% tags=["remove-cell"]
for name, value in {"mfu_verdict": train_step.mfu_verdict(step_rows),
                    "device_name": env.device_name(),
                    "train_desc": f"{STEPS.dtype} matmuls, d_model {STEPS.config.d_model}, "
                                  f"{STEPS.config.n_layers} layers, batch {STEPS.batch}",
                    "best_mfu_pct": 100 * max(train_step.mfus(step_rows).values())}.items():
    glue(name, value)

# %% tags=["remove-input"]
kit.draw(train_step.plot, step_rows, width=6.4, height=3.8, accelerator=hardware.detect(),
         label=f", {env.device_name()}")

# %% [markdown]
# On {glue:text}`device_name` ({glue:text}`train_desc`): {glue:text}`mfu_verdict`. The same
# experiment at GPU sizes: {glue:text}`step_records`

# %% tags=["remove-input"]
step_records = experiments.recorded("train_step")
glue("step_records", "no GPU record of it exists yet; 'python -m mlsys.experiments train_step' "
     "on a CUDA GPU records one, and this page then shows it here." if not step_records else
     "; ".join(f"recorded on {r['provenance']['device']} (torch {r['provenance']['torch_version']}"
               f", {r['provenance']['date'][:10]}), {train_step.mfu_verdict(r['results'])}"
               for r in step_records) + ".")
for record in step_records:
    accelerator = hardware.match_device_name(record["provenance"]["device"])
    display(train_step.table(record["results"], accelerator))
    kit.draw(train_step.plot, record["results"], width=6.4, height=3.8, accelerator=accelerator,
             label=f", {record['provenance']['device']} (recorded)")

# %% [markdown]
# ### What large runs report
#
# Published utilizations, each from its paper, beside this book's: PaLM {cite}`chowdhery2022palm`
# (whose Table 3 also estimates three earlier runs), Megatron-LM {cite}`narayanan2021efficient`
# {cite}`korthikanti2022reducing` and Llama 3 {cite}`dubey2024llama3`. They are whole training runs
# of hundreds of billions of parameters on thousands of chips, with communication, pipeline
# bubbles and failures included; the book's rows are one device, one small model, no
# communication, and the live row is measured against this device's own matmul ceiling rather
# than a spec sheet.

# %% tags=["hide-input"]
measured = [(f"book, d_model {STEPS.config.d_model} ({env.device_name()})", "1 (this machine)",
             max(train_step.mfus(step_rows).values()), "vs the measured matmul ceiling")]
for record in step_records:
    dtype = next(r["dtype"] for r in record["results"] if r["kind"] == "consistency")
    spec = hardware.match_device_name(record["provenance"]["device"]).peak_flop_per_s(dtype)
    measured.append(("book (recorded)", f"1 {record['provenance']['device']}",
                     max(train_step.mfus(record["results"], spec).values()),
                     f"{dtype}, vs the dense spec peak"))
mfus = {r.run: r.mfu for r in third_party.PUBLISHED_MFU if r.mfu}  # a run's last row
glue("palm_mfu_pct", 100 * mfus["PaLM 540B"])
glue("published_mfus", f"{min(mfus.values()):.0%} to {max(mfus.values()):.0%}")
flop_counts.published_mfu_table(measured)

# %% [markdown]
# Reaching PaLM's {glue:text}`palm_mfu_pct:.1f`% takes large matmuls, fused kernels, and the
# parallelism chapters' overlap of communication with compute; the ceiling is the same for all of
# them, and the conventions (dense attention, recomputation counted or not) are the ones above.

# %% [markdown]
# With the FLOPs known, the step time of any preset on any accelerator at a stated MFU is one
# division: `python -m mlsys napkin --preset xl --gpu H100 --batch 8 --seq 1024 --mfu 0.4` traces a
# model from its parameters to its step time, and {ref}`sec-napkin-onepager` does it for one model.
#
# ```{admonition} Takeaway
# :class: tip
# Training costs $6N$ FLOPs per token ($N$ counting the weights that enter matmuls) plus $12LTD$ for
# attention, and the count matches `torch.utils.flop_counter` exactly, module by module:
# {glue:text}`n_params_b:.0f`B parameters on {glue:text}`n_tokens_t:.0f`T tokens take
# {glue:text}`days:.0f` days on {glue:text}`n_gpus:,` {glue:text}`gpu_name` GPUs at
# {glue:text}`target_mfu_pct:.0f`% MFU of the dense peak ({glue:text}`days_detailed:.0f` with the
# attention term at {glue:text}`seq_70b:,` tokens), and {glue:text}`sparse_days:.0f` if one mistakes
# the sparse figure for the peak. A real step on this machine reached {glue:text}`best_mfu_pct:.0f`%
# of its measured matmul ceiling.
# ```
#
# ## Exercises
#
# ### Q1 When attention catches up
#
# At what sequence length do the two attention matmuls (scores and weighted values) account for half
# of all the matmul FLOPs of the `small` preset?

# %% tags=["hide-cell"]
small = TransformerConfig.preset("small")
pc = param_counts(small)
n_matmul = pc.matmul
t_half = n_matmul / (2 * small.n_layers * small.d_model)  # 12 L T D = 6 N_matmul
assert flops.attention_share(small, math.floor(t_half)) < 0.5
assert flops.attention_share(small, math.ceil(t_half)) >= 0.5
for name, value in {"q2_t_half": t_half, "q2_over_context": t_half / small.context_length}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# Per token the attention matmuls cost $12LTD$ (training) against $6N_\text{matmul}$ for everything
# else (the section on FLOPs per token). They are half the total when the two are equal:
# $12LTD = 6N_\text{matmul}$, so $T = N_\text{matmul} / (2LD)$ =
# {glue:text}`q2_t_half:,.0f` tokens, about $8D$ as the rule of thumb above says, and
# {glue:text}`q2_over_context:.1f` times `small`'s context length.
# ```
#
# ### Q2 Chain: 2.7B on 8 H100s, from bits to days
#
# Train the `2.7B` preset on 8 H100s with bf16 mixed-precision AdamW on 50B tokens of 1,024-token
# sequences. (a) Do its model states fit on one GPU? (b) Why does the recipe keep fp32 master
# weights: what is the smallest update a bf16 weight of magnitude 0.02 (the init std) can absorb?
# (c) How many training FLOPs per token (detailed count), and how many days at 40% MFU?

# %% tags=["hide-cell"]
big, tokens_q5, mfu_q5 = TransformerConfig.preset("2.7B"), 50 * 10**9, 0.4
state_q5 = memory.model_state_bytes(count_params(big), "bf16_mixed_adamw")  # chapter 02
smallest_update = precision.ulp(0.02, "bf16") / 2  # chapter 01: anything smaller rounds away
per_token_q5 = flops.training_flops_per_token(big, big.context_length)
days_q5 = utilization.training_time_s(per_token_q5 * tokens_q5, 8, peak, mfu_q5) / SECONDS_PER_DAY
lr_q5 = 1.6e-5  # GPT-3's 2.7B: peak 1.6e-4, decayed to 10% of it; an Adam step is about lr
assert state_q5 < GPU.hbm_bytes and lr_q5 < smallest_update
assert precision.round_to(0.02 + lr_q5, "bf16") == precision.round_to(0.02, "bf16")  # lost
for name, value in {"q5_state_gb": state_q5 / 1e9, "q5_update": smallest_update, "q5_lr": lr_q5,
                    "q5_gflop": per_token_q5 / 1e9, "q5_days": days_q5}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# (a) 16 B/param: {glue:text}`q5_state_gb:.1f` GB, which fits one 80 GB GPU before activations. (b)
# At 0.02 a bf16 weight's spacing is $2^{-13}$, so an update below {glue:text}`q5_update:.2g` rounds
# away entirely (chapter 01's plateau). An Adam step is about the learning rate in size, and GPT-3
# trained its 2.7B model with a peak of $1.6 \times 10^{-4}$ decayed to 10% {cite}`brown2020gpt3`: a
# step of {glue:text}`q5_lr:.2g` would leave the weight unchanged. The fp32 master copy keeps it.
# (c) {glue:text}`q5_gflop:.1f` GFLOP per token, so {glue:text}`q5_days:.1f` days on 8 GPUs at 40%
# MFU.
# ```
#
# ### Q3 (find the error) 6N whatever the context
#
# "Training costs 6N FLOPs per token whatever the context: the 2.7B preset costs the same per token
# at 32,768 tokens as at 1,024." Find the error, and check it with `training_flops_per_token`.

# %% tags=["hide-cell"]
short_q6, long_q6 = (flops.training_flops_per_token(big, t) for t in (1_024, 32_768))
assert long_q6 - short_q6 == 12 * big.n_layers * (32_768 - 1_024) * big.d_model  # the 12LTD term
for name, value in {"q6_ratio": long_q6 / short_q6, "q6_six_n": 6 * count_params(big) / 1e9,
                    "q6_long": long_q6 / 1e9, "q6_short": short_q6 / 1e9}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# The rule drops the attention matmuls (scores and weighted values), which have no parameters and
# cost $12LTD$ per token: they grow with $T$. The cell checks that the whole difference between
# the two lengths is that term. At 1,024 tokens a token costs {glue:text}`q6_short:.1f` GFLOP,
# close to 6N = {glue:text}`q6_six_n:.1f`; at 32,768 tokens it costs {glue:text}`q6_long:.0f`
# GFLOP, {glue:text}`q6_ratio:.1f`× as much. The corrected rule: $6N_\text{matmul} + 12LTD$.
# ```
#
# ### Q4 (multi-step) What a month of 8 H100s buys
#
# You have 8 H100s for 30 days and train the `2.7B` preset at 40% MFU of the dense bf16 peak.
# (a) What does one token cost in training FLOPs at 1,024-token sequences (the detailed count)?
# (b) How many tokens can the month train, from (a)? (c) The Chinchilla rule of thumb asks for
# about 20 tokens per parameter {cite}`hoffmann2022chinchilla`: how many tokens per parameter
# does (b) give, and how many days would the Chinchilla amount take? (d) Train on 8,192-token
# sequences instead: by how much does (a) grow, and how many tokens does the month train then?

# %% tags=["hide-cell"]
month_s, gpus_q4, mfu_q4 = 30 * SECONDS_PER_DAY, 8, 0.4
per_token_1k = flops.training_flops_per_token(big, 1_024)  # (a)
tokens_1k = month_s * gpus_q4 * peak * mfu_q4 / per_token_1k  # (b): delivered FLOPs / cost
chinchilla = 20 * count_params(big)  # (c)
days_chinchilla = 30 * chinchilla / tokens_1k
per_token_8k = flops.training_flops_per_token(big, 8_192)  # (d): the 12 L T D term grows
tokens_8k = tokens_1k * per_token_1k / per_token_8k
assert math.isclose(utilization.training_time_s(per_token_1k * tokens_1k, gpus_q4, peak, mfu_q4),
                    month_s)  # (b) is the inverse of the chapter's time formula
assert per_token_8k - per_token_1k == 12 * big.n_layers * (8_192 - 1_024) * big.d_model
assert chinchilla < tokens_8k < tokens_1k
for name, value in {"q4_gflop_1k": per_token_1k / 1e9, "q4_tokens_b": tokens_1k / 1e9,
                    "q4_chinchilla_b": chinchilla / 1e9, "q4_days": days_chinchilla,
                    "q4_per_param": tokens_1k / count_params(big),
                    "q4_tokens_8k_b": tokens_8k / 1e9,
                    "q4_growth_pct": 100 * (per_token_8k / per_token_1k - 1)}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# (a) $6N_\text{matmul} + 12LTD$ at $T$ = 1,024: {glue:text}`q4_gflop_1k:.1f` GFLOP per token.
# (b) The month delivers 30 days × 8 GPUs × the dense peak × 0.4 FLOPs; divided by (a), that is
# {glue:text}`q4_tokens_b:.0f`B tokens. (c) That is {glue:text}`q4_per_param:.0f` tokens per
# parameter; 20 per parameter, {glue:text}`q4_chinchilla_b:.0f`B tokens, takes only
# {glue:text}`q4_days:.1f` days, and the rest of the month trains past it (as recent models do, to
# make a small model better at a fixed inference cost). (d) The attention term grows eightfold:
# a token costs {glue:text}`q4_growth_pct:.0f`% more, and the month trains
# {glue:text}`q4_tokens_8k_b:.0f`B tokens.
# ```
#
# ### Q5 (code) One block's forward, counted by hand
#
# Write the forward matmul FLOPs of one block of the book's transformer from its sizes alone:
# batch $B$, sequence $T$, width $D$ and the SwiGLU width $F$ (the head count does not appear:
# why?). The hidden cell checks your function against PyTorch's counter on the `small` model
# counted above, and against `layer_flops` at other sizes.

# %%
def block_forward_flops(batch, seq, d_model, d_ff):  # <- your code here
    """Forward matmul FLOPs of one block: attention (q, k, v, o, scores, values) and SwiGLU."""
    raise NotImplementedError("count the nine matmuls of one block")


# %% tags=["hide-cell"]
# The book's solution (opened on demand). `solved_by` checks the reader's function once it is
# written, and the book's while it is not.
def block_forward_flops_solution(batch, seq, d_model, d_ff):
    tokens = batch * seq
    projections = 4 * 2 * tokens * d_model * d_model  # q, k, v, o: (BT x D) @ (D x D)
    attention = 2 * 2 * batch * seq * seq * d_model  # scores and values: 2 T^2 d_head x H heads
    swiglu = 3 * 2 * tokens * d_model * d_ff  # w1 and w3: D -> F; w2: F -> D
    return projections + attention + swiglu


q5, whose = solved_by(block_forward_flops, block_forward_flops_solution, BATCH, SEQ, cfg.d_model,
                      cfg.d_ff)
assert q5 == sum(counted["Transformer.blocks.0"].values())  # PyTorch's counter, `small`
for preset, b, t in (("debug", 3, 37), ("medium", 2, 100), ("2.7B", 1, 1_000)):
    other = TransformerConfig.preset(preset)
    assert solved_by(block_forward_flops, block_forward_flops_solution, b, t, other.d_model,
                     other.d_ff)[0] == flops.layer_flops(other, b, t).matmul_flops, preset
glue("block_code_gflop", q5 / 1e9)
print(f"checked: {whose} solution gives the counter's {q5:,} FLOPs for one `small` block")

# %% [markdown]
# ```{dropdown} Answer
# Four $D \times D$ projections over $BT$ tokens, $4 \cdot 2BTD^2$; the scores and the weighted
# values, $2T^2 d_\text{head}$ each per head and sequence, so $2 \cdot 2BT^2D$ once the $H$ heads
# are summed ($H d_\text{head} = D$: that is why $H$ drops out); SwiGLU's three matrices,
# $3 \cdot 2BTDF$. For `small` at batch {glue:text}`batch` and sequence {glue:text}`seq`:
# {glue:text}`block_code_gflop:.2f` GFLOP, exactly what `FlopCounterMode` counted for `blocks.0`.
# ```
#
# ## Summary
#
# - A matmul costs $2mnk$ FLOPs; a linear layer costs 2 FLOPs per weight per token forward and twice
#   that backward (grad input + grad weight), so training is 3 × forward for every matmul.
# - Per transformer block: $8BTD^2$ for q, k, v, o; $4BT^2D$ for scores and weighted values; $6BTDF$
#   for SwiGLU; elementwise work is {glue:text}`elementwise_share_pct:.1f`% of the FLOPs (`small`,
#   $T$ = {glue:text}`seq`). The analytic count equals `torch.utils.flop_counter` module by module
#   for every preset, built on the meta device.
# - Per token, training costs $6N_\text{matmul} + 12LTD$. The 6N rule drops the attention term
#   (wrong at long sequences) and counts the embedding (wrong for small models).
# - Circulating formulas: a linear layer needs the factor $T$; the attention $T^2$ term has no
#   factor $H$; SwiGLU has three matrices ($6BTDF$, not $4BTDF$).
# - MFU = model FLOPs / (time × dense peak); HFU also counts recomputation: 4/3 × MFU for a whole
#   extra forward, {glue:text}`hfu_early_pct:.1f`% more for PyTorch's per-block checkpoint. Use
#   the dense peak: {glue:text}`sparse_tflops:,.0f` TFLOP/s is the H100's sparse figure. Count
#   attention one way: the causal half lowers a dense 50% MFU to
#   {glue:text}`causal_mfu_70b_pct:.1f`% for the 70B shape. Published runs report MFUs of
#   {glue:text}`published_mfus`.
# - Decoding with a KV cache costs $2N_\text{matmul} + 4LDt$ FLOPs per token, a third of a
#   training token at length $t$; without the cache, a forward over the whole prefix.
# - Time = FLOPs / (GPUs × peak × MFU): {glue:text}`n_params_b:.0f`B parameters on
#   {glue:text}`n_tokens_t:.0f`T tokens take about {glue:text}`days:.0f` days on
#   {glue:text}`n_gpus:,` H100s at {glue:text}`target_mfu_pct:.0f`% MFU.
