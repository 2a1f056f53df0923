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
# **Question.** How many days does it take to train a 70-billion-parameter model on 15 trillion tokens with
# 1,024 H100 GPUs?

# %% tags=["remove-cell"]
# Colab or a fresh kernel: install the book's library when it is missing (a no-op in the book's own environment).
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("mlsys") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+https://github.com/mlsys-book/mlsys-book.git"], check=True)

# %%
import mlsys  # noqa: F401 (the template's first import; the modules used are imported below)
from mlsys import env

print(env.describe())

# %%
import datetime
import math

import matplotlib.pyplot as plt
import torch
from torch.utils.flop_counter import FlopCounterMode

from mlsys import bench, hardware, plotting, roofline
from mlsys.accounting import flops
from mlsys.accounting.params import count_params, param_counts
from mlsys.book import Table, glue, num
from mlsys.models.config import TransformerConfig
from mlsys.models.train import make_train_step
from mlsys.models.transformer import Transformer
from mlsys.models.counting import count_model_flops

# %% tags=["parameters"]
SEED = 0
# The question: a 70B model, 15T tokens, 1,024 H100s at 50% MFU (dense bf16 peak)
N_PARAMS, N_TOKENS, N_GPUS, TARGET_MFU = 70_000_000_000, 15 * 10**12, 1_024, 0.5
GPU, PEAK_DTYPE = hardware.H100_SXM, "bf16"
# A 70B model of the book's shape (multi-head attention, SwiGLU), trained on sequences of SEQ_70B tokens
SHAPE_70B = TransformerConfig(vocab_size=32_000, context_length=4_096, d_model=8_192, n_layers=80, n_heads=64,
                              d_ff=24_576)
SEQ_70B = 4_096
MATMUL_SHAPE = (37, 53, 71)  # m, n, k: irregular on purpose
LINEAR_TOKENS, LINEAR_D_IN, LINEAR_D_OUT = 45, 96, 160
BREAKDOWN_PRESET, BATCH, SEQ = "small", 4, 512  # the per-layer tables, and the H100 step-time question
PRESETS_UP_TO_XL = ("debug", "small", "medium", "large", "xl")
COUNTER_BATCH, COUNTER_SEQ = 3, 100  # the per-preset counter table (irregular, fits every context)
BACKWARD_PRESETS = env.pick(smoke=("debug", "small", "medium"), cpu=PRESETS_UP_TO_XL, gpu=PRESETS_UP_TO_XL)
RULE_PRESETS = ("debug", "small", "medium", "large", "xl", "2.7B")  # the 6N plot
RULE_SEQS = tuple(2**k for k in range(6, 18))  # 64 ... 131,072 tokens
STATED_MFU = 0.4  # the H100 step-time table
# Measured MFU of a training step (forward + backward + AdamW) on this machine
TRAIN_CONFIG = env.pick(
    smoke=TransformerConfig.preset("debug"),
    cpu=TransformerConfig(vocab_size=4_096, context_length=256, d_model=256, n_layers=4, n_heads=4, d_ff=1_024),
    gpu=TransformerConfig.preset("small"),
)
TRAIN_BATCH = 4
TRAIN_SEQS = env.pick(smoke=(32, 64, 128), cpu=(64, 128, 256), gpu=(128, 256, 512))
TRAIN_DTYPE = env.pick(smoke="fp32", cpu="fp32", gpu="bf16")  # matmul dtype (bf16: autocast)
CEILING_SIZES = env.pick(smoke=(128, 256, 512), cpu=(256, 512, 1_024), gpu=(2_048, 4_096, 8_192))
WARMUP, REPEATS = env.pick(smoke=(2, 5), cpu=(3, 10), gpu=(5, 20))


# %% tags=["remove-cell"]
SECONDS_PER_DAY = datetime.timedelta(days=1).total_seconds()


# %% [markdown]
# Training compute is arithmetic: a number of floating-point operations (FLOPs) that the model's shape
# fixes before anything runs. This chapter counts them for every matrix multiply in the book's
# transformer, checks each count against PyTorch's own FLOP counter, and turns the total into time with one
# more number, the fraction of the hardware's peak a real training step reaches (MFU).
#
# ## Napkin math
#
# The rule of thumb {cite}`kaplan2020scaling`: training costs **6 FLOPs per parameter per token**, 2 in
# the forward pass and 4 in the backward pass. The section on FLOPs per token derives it from the model
# and shows where it breaks. Time is then total FLOPs divided by what the GPUs deliver: their count, the
# peak FLOP/s of one, and the model FLOPs utilization (MFU), the fraction of that peak the run achieves.

# %%
peak = GPU.peak_flop_per_s(PEAK_DTYPE)  # dense peak
total_flops = flops.six_n_flops_per_token(N_PARAMS) * N_TOKENS
days = flops.training_time_s(total_flops, N_GPUS, peak, TARGET_MFU) / SECONDS_PER_DAY
assert math.isclose(days * SECONDS_PER_DAY, 6 * N_PARAMS * N_TOKENS / (N_GPUS * peak * TARGET_MFU), rel_tol=1e-12)
sparse_peak = GPU.sparse_flop_per_s(PEAK_DTYPE)
sparse_days = flops.training_time_s(total_flops, N_GPUS, sparse_peak, TARGET_MFU) / SECONDS_PER_DAY
print(f"{N_PARAMS / 1e9:.0f}B parameters x {N_TOKENS / 1e12:.0f}T tokens x 6 = {total_flops:.3g} FLOPs")
print(f"{N_GPUS} x {GPU.name} at {peak / 1e12:.1f} TFLOP/s dense {PEAK_DTYPE}, MFU {TARGET_MFU:.0%}: {days:.1f} days")
print(f"with the spec sheet's sparse {sparse_peak / 1e12:.0f} TFLOP/s instead: {sparse_days:.1f} days (wrong)")
for name, value in {"n_params_b": N_PARAMS / 1e9, "n_tokens_t": N_TOKENS / 1e12, "n_gpus": N_GPUS,
                    "gpu_name": GPU.name, "target_mfu_pct": 100 * TARGET_MFU, "total_flops": total_flops,
                    "peak_tflops": peak / 1e12, "sparse_tflops": sparse_peak / 1e12, "days": days,
                    "sparse_days": sparse_days}.items():
    glue(name, value)

# %% [markdown]
# {glue:text}`n_params_b:.0f`B parameters × {glue:text}`n_tokens_t:.0f`T tokens × 6 is
# {glue:text}`total_flops:.3g` FLOPs. At {glue:text}`target_mfu_pct:.0f`% of the dense bf16 peak of
# {glue:text}`n_gpus:,` {glue:text}`gpu_name` GPUs ({glue:text}`peak_tflops:.1f` TFLOP/s each), that is
# **{glue:text}`days:.0f` days**.
#
# The peak must be the *dense* one. The H100 spec sheet headlines {glue:text}`sparse_tflops:,.0f` TFLOP/s
# for bf16, but that figure assumes 2:4 structured sparsity (two of every four weights are zero and the
# tensor cores skip them), which a dense training run never has; the library stores the dense figure and
# derives the sparse one as exactly twice it (see {ref}`sec-hardware`). Taking the sparse figure would
# predict {glue:text}`sparse_days:.0f` days, and would make every MFU look half as good as it is.
#
# The 6N rule leaves out the attention scores, whose cost grows with the sequence length. For a 70B model
# shaped like the book's transformer, the detailed count derived below says:

# %%
n_70b = count_params(SHAPE_70B)
detailed_70b = flops.training_flops_per_token(SHAPE_70B, SEQ_70B)
ratio_70b = detailed_70b / flops.six_n_flops_per_token(n_70b)
days_detailed = flops.training_time_s(detailed_70b * N_TOKENS, N_GPUS, peak, TARGET_MFU) / SECONDS_PER_DAY
print(f"{SHAPE_70B.n_layers} layers, d_model {SHAPE_70B.d_model}: N = {n_70b:,}")
print(f"detailed / 6N at seq {SEQ_70B}: {ratio_70b:.3f} -> {days_detailed:.1f} days")
for name, value in {"n_70b_b": n_70b / 1e9, "layers_70b": SHAPE_70B.n_layers, "d_model_70b": SHAPE_70B.d_model,
                    "seq_70b": SEQ_70B, "ratio_70b_pct": 100 * (ratio_70b - 1), "days_detailed": days_detailed}.items():
    glue(name, value)

# %% [markdown]
# {glue:text}`layers_70b` layers of width {glue:text}`d_model_70b:,` give {glue:text}`n_70b_b:.1f`B
# parameters; attention over {glue:text}`seq_70b:,`-token sequences adds {glue:text}`ratio_70b_pct:.1f`% to
# the 6N count, so about **{glue:text}`days_detailed:.0f` days**. The rest of the chapter builds each piece
# of this estimate and checks it: the FLOPs of a matmul, of a linear layer's forward and backward, of every
# component of a transformer block, the per-token total, and what fraction of peak a real training step
# reaches on the machine running this page.
#
# ## A matrix multiply: 2mnk
#
# $C = AB$ with $A$ of shape $(m, k)$ and $B$ of shape $(k, n)$ computes $mn$ dot products of length $k$:
# $k$ multiplies and $k$ adds each (the first add is into zero), so **$2mnk$ FLOPs**. One multiply-add counts
# as two FLOPs, the convention of peak FLOP/s figures too.
#
# ```{literalinclude} ../lib/mlsys/accounting/flops.py
# :pyobject: matmul_flops
# ```
#
# PyTorch ships a FLOP counter, `torch.utils.flop_counter.FlopCounterMode`, which intercepts every operator
# and applies a per-operator formula. It agrees:

# %%
m, n, k = MATMUL_SHAPE
g = torch.Generator().manual_seed(SEED)
a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
with FlopCounterMode(display=False) as counter:
    a @ b
assert counter.get_total_flops() == flops.matmul_flops(m, n, k) == 2 * m * n * k
print(f"({m} x {k}) @ ({k} x {n}): counter {counter.get_total_flops():,} = 2mnk {flops.matmul_flops(m, n, k):,}")

# %% [markdown]
# ## A linear layer, forward and backward
#
# A bias-free linear layer $Y = XW$ over $t$ tokens ($X$ is $t \times d_\text{in}$, $W$ is
# $d_\text{in} \times d_\text{out}$) is one matmul: $2\,t\,d_\text{in}\,d_\text{out}$ FLOPs, that is **2 FLOPs
# per weight per token**. The backward pass receives $\partial L/\partial Y$ and computes two matmuls of the
# same size:
#
# - the gradient for the layer below, $\partial L/\partial X = (\partial L/\partial Y)\, W^\top$:
#   $2\,t\,d_\text{out}\,d_\text{in}$;
# - the weight gradient, $\partial L/\partial W = X^\top (\partial L/\partial Y)$: $2\,d_\text{in}\,t\,d_\text{out}$.
#
# So **backward = 2 × forward** and forward + backward = 3 × forward, 6 FLOPs per weight per token.
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
assert backward_counter.get_total_flops() == flops.linear_backward_flops(LINEAR_TOKENS, LINEAR_D_IN, LINEAR_D_OUT) == 2 * fwd
x_data = x.detach()  # an input that needs no gradient, like raw data entering the first layer
with FlopCounterMode(display=False) as data_counter:
    layer(x_data).sum().backward()
assert data_counter.get_total_flops() == 2 * fwd  # forward + grad weight only
print(f"forward {fwd:,}  backward {backward_counter.get_total_flops():,}  (backward / forward = "
      f"{backward_counter.get_total_flops() / fwd:g}); input without grad: backward = {data_counter.get_total_flops() - fwd:,}")

# %% [markdown]
# The last line is a detail worth knowing: when a layer's input needs no gradient, autograd skips
# $\partial L/\partial X$ and the backward costs 1 × forward. In a transformer that happens nowhere: the first
# projections read the output of the (trainable) embedding, so every linear layer pays the full 2 ×.
#
# ## Every component of a transformer block
#
# The book's model (`mlsys.models.transformer`) is a pre-norm decoder: each block applies RMSNorm, causal
# multi-head attention with RoPE on q and k, RMSNorm again and a SwiGLU feed-forward
# {cite}`shazeer2020glu`, with two residual adds; after the last block come a final RMSNorm and the output
# head. With $B$ = batch, $T$ = sequence length, $D$ = d_model, $H$ = heads, $F$ = d_ff and $V$ = vocab, the
# forward FLOPs of one block are the sum of nine matmuls plus some elementwise work:
#
# - **q, k, v, o projections**: four $D \times D$ linear layers, $2BTD^2$ each;
# - **attention scores** $QK^\top$: per head, a $(T \times d_\text{head}) @ (d_\text{head} \times T)$ matmul,
#   $2T^2 d_\text{head}$; over $H$ heads and $B$ sequences $2BT^2 D$, because $H\, d_\text{head} = D$;
# - **attention-weighted values** $PV$: $(T \times T) @ (T \times d_\text{head})$ per head, again $2BT^2 D$;
# - **SwiGLU**: three matrices, $w_2(\mathrm{silu}(w_1 x) \odot w_3 x)$, with $w_1, w_3$ of shape $D \times F$
#   and $w_2$ of shape $F \times D$: $3 \times 2BTDF$;
# - **elementwise work** (not matmuls, estimated in operations per element): the two RMSNorms, RoPE, the
#   softmax over the $B H T^2$ scores, SwiGLU's gate and the residual adds.
#
# The library writes exactly this down, term by term:
#
# ```{literalinclude} ../lib/mlsys/accounting/flops.py
# :pyobject: layer_flops
# ```
#
# For the {glue:text}`breakdown_preset` preset at batch {glue:text}`batch` and sequence {glue:text}`seq` the
# block's budget is (shares of the block's total):

# %%
cfg = TransformerConfig.preset(BREAKDOWN_PRESET)
lf = flops.layer_flops(cfg, BATCH, SEQ)
B, T, D, H, Fd = BATCH, SEQ, cfg.d_model, cfg.n_heads, cfg.d_ff
formulas = {  # component: (formula as text, the same formula evaluated here, independently of the library)
    "q_proj": ("2·B·T·D²", 2 * B * T * D * D), "k_proj": ("2·B·T·D²", 2 * B * T * D * D),
    "v_proj": ("2·B·T·D²", 2 * B * T * D * D), "o_proj": ("2·B·T·D²", 2 * B * T * D * D),
    "attention_scores": ("2·B·T²·D", 2 * B * T * T * D), "attention_values": ("2·B·T²·D", 2 * B * T * T * D),
    "ffn_w1": ("2·B·T·D·F", 2 * B * T * D * Fd), "ffn_w3": ("2·B·T·D·F", 2 * B * T * D * Fd),
    "ffn_w2": ("2·B·T·F·D", 2 * B * T * Fd * D),
    "norms": (f"2 · {flops.RMSNORM_OPS_PER_ELEMENT}·B·T·D", 2 * flops.RMSNORM_OPS_PER_ELEMENT * B * T * D),
    "rope": (f"2 · {flops.ROPE_OPS_PER_ELEMENT}·B·T·D", 2 * flops.ROPE_OPS_PER_ELEMENT * B * T * D),
    "softmax": (f"{flops.SOFTMAX_OPS_PER_SCORE}·B·H·T²", flops.SOFTMAX_OPS_PER_SCORE * B * H * T * T),
    "swiglu_gate": (f"{flops.SWIGLU_OPS_PER_HIDDEN}·B·T·F", flops.SWIGLU_OPS_PER_HIDDEN * B * T * Fd),
    "residual": (f"{flops.RESIDUAL_OPS_PER_ELEMENT}·B·T·D", flops.RESIDUAL_OPS_PER_ELEMENT * B * T * D),
}
block_total = lf.matmul_flops + lf.elementwise_flops
rows = []
for name, value in lf.as_dict().items():
    text, independent = formulas[name]
    assert value == independent, name
    kind = "matmul" if name in lf.MATMUL_TERMS else "elementwise (estimate)"
    rows.append([f"`{name}`", kind, text, f"{value / 1e9:,.3f}", f"{value / block_total:.1%}"])
rows.append(["block", "", "", f"{block_total / 1e9:,.3f}", "100%"])
for name, value in {"elementwise_share_pct": 100 * lf.elementwise_flops / block_total,
                    "breakdown_preset": BREAKDOWN_PRESET, "batch": BATCH, "seq": SEQ}.items():
    glue(name, value)

# %% tags=["remove-input"]
Table(["component", "kind", "forward FLOPs (formula)", "GFLOP", "share of the block"], rows)

# %% [markdown]
# The elementwise estimates add up to {glue:text}`elementwise_share_pct:.2f`% of the block: norms, RoPE,
# softmax and residual adds are a rounding error in FLOPs. (They are not a rounding error in *time*: each
# reads and writes whole activation tensors, and the byte-movement chapters show they are limited by memory
# bandwidth, not arithmetic.) `torch.utils.flop_counter` counts only matmuls and convolutions for the same
# reason, and from here on "FLOPs" means matmul FLOPs unless a table says otherwise.
#
# The whole model adds the output head, a $D \times V$ linear layer ($2BTDV$), and the final norm; the
# embedding is a table lookup and costs no FLOPs. `transformer_flops` assembles the totals, and knows the
# module path of each term in the PyTorch model:
#
# ```{literalinclude} ../lib/mlsys/accounting/flops.py
# :pyobject: ModelFlops.module_flops
# ```
#
# ## Checking against a real counter
#
# A formula is only as good as its check. We build the real model on PyTorch's *meta* device, where tensors
# have shapes but no storage: even the largest preset costs no memory and no arithmetic runs, but
# every operator still dispatches, so `FlopCounterMode` sees each matmul with its shapes and attributes it to
# the module that ran it.

# ```{literalinclude} ../lib/mlsys/models/counting.py
# :pyobject: count_model_flops
# ```

# %%
counter = count_model_flops(cfg, BATCH, SEQ)
counted = counter.get_flop_counts()  # {"Transformer.blocks.0.attn": {aten.mm: ..., aten.bmm: ...}, ...}
predicted = flops.transformer_flops(cfg, BATCH, SEQ)
for module, value in predicted.module_flops().items():  # every module of every block, and the head
    assert sum(counted[f"Transformer.{module}"].values()) == value, module
assert counter.get_total_flops() == predicted.forward_matmul_flops

# %% [markdown]
# Every module of every block matches exactly (the cell asserts all of them). The first block and the head,
# side by side, with the operators the counter saw:

# %% tags=["remove-input"]
rows = []
shown = [m for m in predicted.module_flops() if m.startswith("blocks.0") or m == "lm_head"]
for module in [*shown, ""]:
    key = f"Transformer.{module}" if module else "Transformer"
    analytic = predicted.module_flops()[module] if module else predicted.forward_matmul_flops
    ops = ", ".join(f"{str(op).removeprefix('aten.')}" for op in counted[key])
    measured = sum(counted[key].values())
    rows.append([f"`{module or '(whole model)'}`", ops, f"{analytic:,}", f"{measured:,}",
                 "yes" if analytic == measured else "NO"])
Table(["module", "operators", "analytic", "counter", "equal"], rows)

# %% [markdown]
# The attention module's own operators are the two batched matmuls `bmm` (scores and weighted values)
# on top of its four projections' `mm`. The same check for every preset up to `xl`, on the whole model's
# forward, and for the forward + backward where this profile runs it (the backward on the meta device
# takes a few seconds per preset):

# %%
rows, counted_totals = [], {}
for name in PRESETS_UP_TO_XL:
    preset = TransformerConfig.preset(name)
    predicted_p = flops.transformer_flops(preset, COUNTER_BATCH, COUNTER_SEQ)
    forward_count = count_model_flops(preset, COUNTER_BATCH, COUNTER_SEQ).get_total_flops()
    assert forward_count == predicted_p.forward_matmul_flops, name
    counted_totals[name] = forward_count
    row = [f"`{name}`", f"{predicted_p.forward_matmul_flops:,}", f"{forward_count:,}"]
    if name in BACKWARD_PRESETS:
        training_count = count_model_flops(preset, COUNTER_BATCH, COUNTER_SEQ, backward=True).get_total_flops()
        assert training_count == predicted_p.training_matmul_flops == 3 * forward_count, name
        row += [f"{predicted_p.training_matmul_flops:,}", f"{training_count:,}", f"{training_count / forward_count:g}"]
    else:
        row += [f"{predicted_p.training_matmul_flops:,}", "(not run in this profile)", ""]
    rows.append(row)
for name, value in {"counter_batch": COUNTER_BATCH, "counter_seq": COUNTER_SEQ}.items():
    glue(name, value)

# %% tags=["remove-input"]
Table(["preset", "forward (analytic)", "forward (counter)", "fwd + bwd (analytic, 3×)", "fwd + bwd (counter)",
                "counter ratio"], rows)

# %% [markdown]
# At batch {glue:text}`counter_batch` and sequence {glue:text}`counter_seq` (irregular on purpose), the
# analytic forward equals the counter for every preset, and forward + backward is exactly three forwards.
# The unit tests (`tests/test_flops.py`) repeat the module-by-module forward check for every preset up to `xl`,
# and the 3 × check with both attention backends.
#
# ```{note}
# Two conventions hide in these numbers. The attention scores are counted for the full $T \times T$ matrix,
# as the naive implementation computes them and as the counter counts them, although the causal mask makes
# half of them useless; FlashAttention-style kernels skip the masked blocks {cite}`dao2022flashattention`,
# and some authors count half. And the counter attributes *backward* operators to modules only
# approximately (in our runs, part of the backward of the two attention matmuls, which belong to no
# projection, was booked under `k_proj` and `v_proj`), so compare backward totals, not per-module backward
# counts.
# ```
#
# ## FLOPs per token and the 6N rule
#
# Divide by the $BT$ tokens. Every weight matrix costs 2 FLOPs per weight per token in the forward pass and 4
# in the backward, so the matmuls with parameters cost $6 N_\text{matmul}$ per token, where
# $N_\text{matmul}$ counts the parameters that take part in a matmul: every weight except the embedding table
# (a lookup) and the norm gains (elementwise). The two attention matmuls have no parameters: per token and
# layer they cost $2 \cdot 2TD$ forward, $3 \times 4TD = 12TD$ for training. Hence
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

# %%
rows = []
for name in RULE_PRESETS:
    preset = TransformerConfig.preset(name)
    seq = preset.context_length
    pc = param_counts(preset)
    n_matmul = pc.matmul
    detailed = flops.training_flops_per_token(preset, seq)
    assert detailed == 6 * n_matmul + 12 * preset.n_layers * seq * preset.d_model  # the formula above
    six_n = flops.six_n_flops_per_token(pc.total)
    rows.append([f"`{name}`", seq, f"{pc.total:,}", f"{n_matmul:,}", f"{pc.embedding / pc.total:.1%}",
                 num(six_n / 1e9), num(detailed / 1e9), f"{detailed / six_n:.3f}"])

# %% tags=["remove-input"]
Table(["preset", "T (its context)", "N", "N_matmul", "embedding share of N", "6N (GFLOP/token)",
                "detailed (GFLOP/token)", "detailed / 6N"], rows)

# %% [markdown]
# Two things separate the rule from the count, and the plot below shows both over sequence length:
#
# - **Long sequences.** The attention term grows with $T$. Relative to the parameter term it is
#   $12LTD / 6N_\text{matmul}$; with $N_\text{matmul} \approx 16 L D^2$ (SwiGLU with $F = 4D$) that is about
#   $T / (8D)$: negligible while $T \ll 8D$, equal to the rest at $T \approx 8D$.
# - **Small models.** The embedding table is in $N$ but costs no FLOPs. In a large model it is a sliver of
#   $N$; in the `debug` model it is a large share, and 6N overcounts.

# %%
ratios = {name: [flops.training_flops_per_token(TransformerConfig.preset(name), s)
                 / flops.six_n_flops_per_token(count_params(TransformerConfig.preset(name))) for s in RULE_SEQS]
          for name in RULE_PRESETS}
LONG_PRESET, LONG_SEQ, SHORT_SEQ = "xl", 16_384, 128
xl_long = ratios[LONG_PRESET][RULE_SEQS.index(LONG_SEQ)]
xl_short = ratios[LONG_PRESET][RULE_SEQS.index(SHORT_SEQ)]
debug_short = ratios["debug"][0]  # at the shortest sequence plotted
assert 0.9 < xl_short < 1.05 and xl_long > 1.5  # 6N: close for a large model at short T, far off at long T
assert debug_short < 1  # and an overcount for a model that is mostly embedding
for name, value in {"xl_long": xl_long, "xl_short": xl_short, "debug_short": debug_short, "long_seq": LONG_SEQ,
                    "short_seq": SHORT_SEQ, "debug_seq": RULE_SEQS[0],
                    "debug_embedding_pct": 100 * param_counts(TransformerConfig.preset("debug")).embedding
                    / count_params(TransformerConfig.preset("debug"))}.items():
    glue(name, value)

# %% tags=["remove-input"]
fig, ax = plotting.subplots(width=6.8, height=4.0)
for color, name in zip(plotting.CYCLE, RULE_PRESETS, strict=False):
    ax.plot(RULE_SEQS, ratios[name], marker=".", color=color, label=name)
    if name in counted_totals:  # the counter's forward x 3, per token, at the counter table's sequence length
        preset = TransformerConfig.preset(name)
        per_token = 3 * counted_totals[name] / (COUNTER_BATCH * COUNTER_SEQ)
        ax.plot(COUNTER_SEQ, per_token / flops.six_n_flops_per_token(count_params(preset)), "D", color=color,
                markeredgecolor="white", markersize=7)
shape_70b_ratios = [flops.training_flops_per_token(SHAPE_70B, s) / flops.six_n_flops_per_token(n_70b) for s in RULE_SEQS]
ax.plot(RULE_SEQS, shape_70b_ratios, ":", color=plotting.COLORS["ceiling"], label="70B shape")
ax.plot([], [], "D", color=plotting.COLORS["muted"], label="counter (forward × 3)")
ax.axhline(1.0, color=plotting.COLORS["ceiling"], lw=1, linestyle="--", label="6N")
plotting.finish(ax, title="Detailed training FLOPs per token / 6N", xlabel="sequence length T (tokens)",
                ylabel="detailed / 6N", logx=2, logy=True)
ax.legend(ncol=2, fontsize=8)
plt.show()

# %% [markdown]
# For `xl` the rule is within a few percent at short sequences ({glue:text}`xl_short:.3f` at
# {glue:text}`short_seq` tokens) but undercounts by a factor of {glue:text}`xl_long:.2f` at
# {glue:text}`long_seq:,` tokens; at {glue:text}`debug_seq` tokens the `debug` model's true count is only
# {glue:text}`debug_short:.2f` × 6N,
# because {glue:text}`debug_embedding_pct:.0f`% of its parameters are the embedding table. The diamonds are the counter's totals from the table
# above. Kaplan et al. {cite}`kaplan2020scaling` count $N$ without the embeddings for this reason, and keep the
# context-dependent term in their forward count.
#
# Where do the FLOPs go? Per preset at sequence {glue:text}`seq`, as shares of the forward pass:

# %% tags=["remove-input"]
groups = {
    "q, k, v projections": ("q_proj", "k_proj", "v_proj"),
    "attention scores QKᵀ": ("attention_scores",),
    "attention values PV": ("attention_values",),
    "output projection": ("o_proj",),
    "SwiGLU (3 matrices)": ("ffn_w1", "ffn_w3", "ffn_w2"),
}
parts = {group: [] for group in [*groups, "output head", "elementwise (estimate)"]}
for name in RULE_PRESETS:
    preset = TransformerConfig.preset(name)
    mf = flops.transformer_flops(preset, 1, SEQ)
    terms = mf.layer.as_dict()
    for group, names in groups.items():
        parts[group].append(100 * mf.n_layers * sum(terms[t] for t in names) / mf.forward_flops)
    parts["output head"].append(100 * mf.lm_head / mf.forward_flops)
    parts["elementwise (estimate)"].append(100 * (mf.forward_flops - mf.forward_matmul_flops) / mf.forward_flops)
assert all(math.isclose(sum(p[i] for p in parts.values()), 100) for i in range(len(RULE_PRESETS)))
fig, ax = plotting.subplots(width=6.8, height=4.0)
plotting.stacked_bars(ax, list(RULE_PRESETS), parts, ylabel="share of forward FLOPs (%)")
plotting.finish(ax, title=f"Where the forward FLOPs go (sequence {SEQ})", legend=False)
ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
plt.show()

# %% [markdown]
# The feed-forward dominates every preset: with $F = 4D$ its three matrices hold $12D^2$ of the block's
# $16D^2$ weights. The output head is a large slice of the small models (a vocabulary of
# {glue:text}`vocab:,` tokens against a narrow $D$) and fades with size, and the two $T^2$ attention matmuls take a share that shrinks as $D$ grows
# at fixed $T$.
#
# ## Formulas that circulate, checked
#
# Per-layer FLOP formulas are passed around in posts and slides. Three common ones, as the library keeps
# them, each checked here against the counter on the real module:
#
# ```{literalinclude} ../lib/mlsys/accounting/flops.py
# :pyobject: claimed_attention_flops
# ```

# %%
block = counted  # the counter's per-module counts of the `small` model at (BATCH, SEQ), from above
with torch.device("meta"):
    linear = torch.nn.Linear(D, D, bias=False)
    two_matrix_mlp = torch.nn.Sequential(torch.nn.Linear(D, Fd, bias=False), torch.nn.GELU(),
                                         torch.nn.Linear(Fd, D, bias=False))
    with FlopCounterMode(display=False) as linear_counter:
        linear(torch.zeros(B, T, D))
    with FlopCounterMode(display=False) as mlp_counter:
        two_matrix_mlp(torch.zeros(B, T, D))
checks = {  # name: (claimed formula, its value, corrected formula, its value, the counter)
    "linear (D x D)": ("2·B·D_in·D_out", flops.claimed_linear_flops(B, D, D),
                       "2·B·T·D_in·D_out", 2 * B * T * D * D, linear_counter.get_total_flops()),
    "attention sub-layer": ("2·B·T·D·(4D + 2T·H)", flops.claimed_attention_flops(B, T, D, H),
                            "2·B·T·D·(4D + 2T)", 2 * B * T * D * (4 * D + 2 * T),
                            sum(block["Transformer.blocks.0.attn"].values())),
    "SwiGLU feed-forward": ("4·B·T·D·F", flops.claimed_ffn_flops(B, T, D, Fd),
                            "6·B·T·D·F", 6 * B * T * D * Fd, sum(block["Transformer.blocks.0.ffn"].values())),
    "two-matrix MLP (GELU)": ("4·B·T·D·F", flops.claimed_ffn_flops(B, T, D, Fd),
                              "4·B·T·D·F", 4 * B * T * D * Fd, mlp_counter.get_total_flops()),
}
rows = []
for name, (claim, claimed, fix, fixed, count) in checks.items():
    assert fixed == count, name
    rows.append([name, claim, f"{claimed / count:.4g}", fix, f"{count:,}"])
assert checks["linear (D x D)"][1] * T == linear_counter.get_total_flops()
assert checks["attention sub-layer"][1] != checks["attention sub-layer"][4]
assert 3 * checks["SwiGLU feed-forward"][1] == 2 * checks["SwiGLU feed-forward"][4]
assert checks["two-matrix MLP (GELU)"][1] == checks["two-matrix MLP (GELU)"][4]  # right for two matrices
for name, value in {"attention_claim_ratio": checks["attention sub-layer"][1] / checks["attention sub-layer"][4],
                    "n_heads": H, "vocab": cfg.vocab_size}.items():
    glue(name, value)

# %% tags=["remove-input"]
Table(["layer", "claimed", "claimed / counter", "correct", "counter (= correct)"], rows)

# %% [markdown]
# - **Linear, $2 B D_\text{in} D_\text{out}$**: right *per token* (or for a batch of vectors), but a batch of
#   sequences has $BT$ rows; the formula is short by the factor $T$.
# - **Attention, $2BTD(4D + 2TH)$**: the $4D$ part (four projections) is right, but the $T^2$ part carries an
#   extra factor $H$. Per head the scores cost $2T^2 d_\text{head}$, and summing over heads gives
#   $2T^2 H d_\text{head} = 2T^2 D$: the head count is already inside $D$. With {glue:text}`n_heads` heads the
#   claim overcounts this sub-layer by {glue:text}`attention_claim_ratio:.2f` × at $T$ = {glue:text}`seq`, and by more at
#   longer sequences.
# - **Feed-forward, $4BTDF$**: right for the classic two-matrix MLP (the last row: the counter agrees), but
#   SwiGLU has three matrices, $6BTDF$. Models that adopt SwiGLU usually shrink $F$ to about $\tfrac{8}{3}D$
#   {cite}`shazeer2020glu` to keep the parameter count, and FLOPs, of the two-matrix $F = 4D$ MLP; the CS336 presets keep $F = 4D$.
#
# ## MFU and HFU
#
# A training step's time is its FLOPs divided by the FLOP/s it achieves. **Model FLOPs utilization** (MFU),
# introduced with PaLM {cite}`chowdhery2022palm`, divides the FLOPs the *model* requires (forward + backward,
# $3\times$ forward) by the time and the peak; it does not reward doing extra work. **Hardware FLOPs
# utilization** (HFU) counts every FLOP executed, including the forward pass recomputed during the backward
# when activations are checkpointed instead of stored {cite}`korthikanti2022reducing`: with full
# recomputation a step executes four forwards' worth instead of three {cite}`narayanan2021efficient`, so
# HFU = $\tfrac{4}{3}$ MFU for the same run.
#
# ```{literalinclude} ../lib/mlsys/accounting/flops.py
# :pyobject: mfu
# ```
#
# ```{literalinclude} ../lib/mlsys/accounting/flops.py
# :pyobject: hardware_training_flops
# ```
#
# ## Measurement: MFU of a training step on this machine
#
# We time full training steps (forward, backward and an AdamW update) of a model, and compare them with the
# matmul FLOPs `transformer_flops` predicts. Two ceilings give two MFUs: the spec sheet's dense peak from
# `mlsys.hardware` where the device is known (a GPU in the table), and always the best FLOP/s this device
# reaches on plain square matmuls, measured first. On a CPU only the second exists.
#
# The prediction, before timing anything: the step cannot be faster than its matmul FLOPs at the matmul
# ceiling.

# %%
device = env.device()
spec = hardware.detect()
ceiling_sweep = roofline.measure_matmul_flop_per_s(CEILING_SIZES, dtype=TRAIN_DTYPE, repeats=REPEATS)
ceiling = max(ceiling_sweep.values())  # measured again after the steps; the roof is the best of both sweeps
spec_peak = spec.peak_flop_per_s(TRAIN_DTYPE) if spec is not None else None
train_flops = {s: flops.transformer_flops(TRAIN_CONFIG, TRAIN_BATCH, s).training_matmul_flops for s in TRAIN_SEQS}
fastest_s = {s: f / ceiling for s, f in train_flops.items()}
glue("device_name", env.device_name())
print(f"{env.device_name()}, {TRAIN_DTYPE} matmul ceiling: {ceiling / 1e9:,.1f} GFLOP/s "
      f"(best of N = {', '.join(map(str, ceiling_sweep))}); spec peak: "
      + (f"{spec_peak / 1e12:.1f} TFLOP/s ({spec.name})" if spec_peak else "none (device not in mlsys.hardware)"))
for s in TRAIN_SEQS:
    print(f"seq {s}: {train_flops[s] / 1e9:.3g} GFLOP per step -> at least {fastest_s[s] * 1e3:.3g} ms")


# %% [markdown]
# The training step comes from the library (on a GPU the matmuls run in bf16 under autocast):
#
# ```{literalinclude} ../lib/mlsys/models/train.py
# :pyobject: make_train_step
# ```

# %%
torch.manual_seed(SEED)
model = Transformer(TRAIN_CONFIG).to(device)
model.init_weights(seed=SEED)
optimizer = torch.optim.AdamW(model.parameters())
timings = {}
for s in TRAIN_SEQS:
    tokens = torch.randint(TRAIN_CONFIG.vocab_size, (TRAIN_BATCH, s + 1), generator=g).to(device)
    step = make_train_step(model, optimizer, tokens, autocast_dtype="bf16" if TRAIN_DTYPE == "bf16" else None)
    timings[s] = bench.benchmark(step, warmup=WARMUP, repeats=REPEATS)
    print(f"seq {s}: {timings[s]}")
ceiling_after = max(roofline.measure_matmul_flop_per_s(CEILING_SIZES, dtype=TRAIN_DTYPE, repeats=REPEATS).values())
print(f"matmul ceiling before the steps {ceiling / 1e9:,.1f} GFLOP/s, after {ceiling_after / 1e9:,.1f} GFLOP/s")
ceiling = max(ceiling, ceiling_after)
fastest_s = {s: f / ceiling for s, f in train_flops.items()}

# %%
rows, mfus = [], {}
for s in TRAIN_SEQS:
    t = timings[s]
    mfus[s] = flops.mfu(train_flops[s], t.median_s, ceiling)
    spec_mfu = f"{flops.mfu(train_flops[s], t.median_s, spec_peak):.1%}" if spec_peak else "—"
    rows.append([s, num(train_flops[s] / 1e9), num(fastest_s[s] * 1e3), num(t.median_s * 1e3),
                 f"{num(t.p20_s * 1e3)} – {num(t.p80_s * 1e3)}", f"{t.median_s / fastest_s[s]:.2f}",
                 f"{mfus[s]:.1%}", spec_mfu])
    # Sanity, not a law: a step's matmuls cannot beat the best bare matmul by much; > 1.5 means a wrong count
    # (asserted on a known GPU only; on a shared CPU a noisy ceiling measurement could trip it).
    plausible = 0 < mfus[s] < 1.5
    assert plausible or spec is None, f"MFU {mfus[s]:.2f} against the measured ceiling is implausible"
    if not plausible:
        print(f"note: MFU {mfus[s]:.2f} against the measured ceiling at seq {s}: the ceiling probe was disturbed")
best_seq = max(mfus, key=mfus.get)
spec_mfu_text = (f"{flops.mfu(train_flops[best_seq], timings[best_seq].median_s, spec_peak):.1%} of the "
                 f"{spec.name} dense {TRAIN_DTYPE} peak" if spec_peak
                 else "none (this device is not in mlsys.hardware)")
for name, value in {"train_desc": f"d_model {TRAIN_CONFIG.d_model}, {TRAIN_CONFIG.n_layers} layers, batch {TRAIN_BATCH}",
                    "best_mfu_pct": 100 * mfus[best_seq], "best_mfu_seq": best_seq, "train_dtype": TRAIN_DTYPE,
                    "spec_mfu_text": spec_mfu_text, "ceiling_gflops": ceiling / 1e9}.items():
    glue(name, value)

# %% tags=["remove-input"]
Table(["seq", "model GFLOP / step", "predicted at ceiling (ms)", "measured median (ms)",
                "p20 – p80 (ms)", "measured / predicted", "MFU vs measured ceiling", "MFU vs spec peak"], rows)

# %% tags=["remove-input"]
fig, ax = plotting.subplots(width=6.4, height=3.8)
seqs = list(TRAIN_SEQS)
medians = [timings[s].median_s * 1e3 for s in seqs]
errors = [[(timings[s].median_s - timings[s].p20_s) * 1e3 for s in seqs],
          [(timings[s].p80_s - timings[s].median_s) * 1e3 for s in seqs]]
ax.errorbar(seqs, medians, yerr=errors, fmt="o", color=plotting.COLORS["measured"], capsize=3,
            label=f"measured (median, p20–p80), {env.device_name()}")
ax.plot(seqs, [fastest_s[s] * 1e3 for s in seqs], "-", color=plotting.COLORS["predicted"],
        label=f"predicted: model FLOPs at the measured matmul ceiling ({ceiling / 1e9:,.0f} GFLOP/s)")
if spec_peak:
    ax.plot(seqs, [train_flops[s] / spec_peak * 1e3 for s in seqs], "--", color=plotting.COLORS["ceiling"],
            label=f"model FLOPs at the {spec.name} spec peak")
plotting.finish(ax, title="Training step time: measured versus FLOPs / ceiling", xlabel="sequence length",
                ylabel="ms per step", logx=2, logy=True)
ax.legend(fontsize=7)
plt.show()

# %% [markdown]
# On this machine ({glue:text}`device_name`, {glue:text}`train_dtype` matmuls, {glue:text}`train_desc`), the
# best step reaches {glue:text}`best_mfu_pct:.0f`% of the measured matmul ceiling
# ({glue:text}`ceiling_gflops:,.0f` GFLOP/s) at sequence {glue:text}`best_mfu_seq`; against the spec sheet:
# {glue:text}`spec_mfu_text`. The gap to 100% is time spent outside large matmuls: the elementwise
# kernels (norms, softmax, RoPE, the optimizer update) that move bytes rather than do arithmetic, matmuls
# too small or too thin to run at full speed, and, on a GPU, kernel-launch overhead that a model this small
# cannot hide. Large training runs report MFU around 40–50% (PaLM: 46% {cite}`chowdhery2022palm`); reaching that takes large matmuls, fused
# kernels, and the parallelism chapters' overlap of communication with compute.
#
# ## Step time of each preset on an H100
#
# With the FLOPs known, a step time is one division. At batch 4, sequence 512 and a stated MFU:

# %%
rows = []
for name in RULE_PRESETS:
    preset = TransformerConfig.preset(name)
    step_flops = flops.transformer_flops(preset, BATCH, SEQ).training_matmul_flops
    six_n_step = flops.six_n_flops_per_token(count_params(preset)) * BATCH * SEQ
    step_s = flops.training_time_s(step_flops, 1, peak, STATED_MFU)
    rows.append([f"`{name}`", f"{count_params(preset):,}", num(step_flops / 1e12), num(six_n_step / 1e12),
                 num(step_s * 1e3), f"{BATCH * SEQ / step_s:,.0f}"])
small_step_s = flops.training_time_s(flops.transformer_flops(cfg, BATCH, SEQ).training_matmul_flops, 1, peak, STATED_MFU)
for name, value in {"stated_mfu_pct": 100 * STATED_MFU, "small_step_ms": 1e3 * small_step_s}.items():
    glue(name, value)

# %% tags=["remove-input"]
Table(["preset", "parameters", "TFLOP / step (detailed)", "TFLOP / step (6N)",
                f"ms / step at {STATED_MFU:.0%} MFU", "tokens / s"], rows)

# %% [markdown]
# At {glue:text}`stated_mfu_pct:.0f`% MFU of one {glue:text}`gpu_name` ({glue:text}`peak_tflops:.1f` TFLOP/s
# dense bf16), a `small` step of {glue:text}`batch` × {glue:text}`seq` tokens needs only
# {glue:text}`small_step_ms:.2f` ms: at this size a GPU is limited by everything except arithmetic, which is
# why small models show low MFU. Compare the measured table above when this page runs on a GPU.
#
# ```{admonition} Takeaway
# :class: tip
# Training costs $6N$ FLOPs per token ($N$ counting the weights that enter matmuls) plus $12LTD$ for
# attention, and the count matches
# `torch.utils.flop_counter` exactly, module by module: {glue:text}`n_params_b:.0f`B parameters on
# {glue:text}`n_tokens_t:.0f`T tokens take {glue:text}`days:.0f` days on {glue:text}`n_gpus:,`
# {glue:text}`gpu_name` GPUs at {glue:text}`target_mfu_pct:.0f`% MFU of the dense peak
# ({glue:text}`days_detailed:.0f` with the attention term at {glue:text}`seq_70b:,` tokens), and
# {glue:text}`sparse_days:.0f` if one mistakes the sparse figure for the peak. A real step on this machine
# reached {glue:text}`best_mfu_pct:.0f`% of its measured matmul ceiling.
# ```
#
# ## Exercises
#
# ### Q1 [The forward pass of xl]
#
# How many FLOPs does one forward pass of the `xl` preset take at batch 1 and sequence 1,024? Write the
# closed form in $L, T, D, F, V$ and check it against `transformer_flops`.

# %% tags=["hide-input"]
xl = TransformerConfig.preset("xl")
L_, T_, D_, F_, V_ = xl.n_layers, 1_024, xl.d_model, xl.d_ff, xl.vocab_size
xl_forward = flops.transformer_flops(xl, 1, T_).forward_matmul_flops
closed_form = L_ * (8 * T_ * D_**2 + 6 * T_ * D_ * F_ + 4 * T_**2 * D_) + 2 * T_ * D_ * V_
assert xl_forward == closed_form
glue("q1_tflop", xl_forward / 1e12)
glue("q1_two_n_t", 2 * count_params(xl) * T_ / 1e12)
glue("q1_over_pct", 100 * (xl_forward / (2 * count_params(xl) * T_) - 1))
print(f"{xl_forward:,} FLOPs = {xl_forward / 1e12:.2f} TFLOP (2NT = {2 * count_params(xl) * T_ / 1e12:.2f} TFLOP)")

# %% [markdown]
# ```{dropdown} Answer
# $L(8TD^2 + 6TDF + 4T^2D) + 2TDV$: four projections, three SwiGLU matrices and the two attention matmuls per
# layer, plus the head. For `xl` that is {glue:text}`q1_tflop:.2f` TFLOP, {glue:text}`q1_over_pct:.0f`% more
# than $2NT$ = {glue:text}`q1_two_n_t:.2f` TFLOP: at this length the attention term outweighs the embedding,
# which $2NT$ counts but which costs no FLOPs.
# ```
#
# ### Q2 [When attention catches up]
#
# At what sequence length do the two attention matmuls (scores and weighted values) account for half of all
# the matmul FLOPs of the `small` preset?

# %% tags=["hide-input"]
small = TransformerConfig.preset("small")
pc = param_counts(small)
n_matmul = pc.matmul
t_half = n_matmul / (2 * small.n_layers * small.d_model)  # 12 L T D = 6 N_matmul

assert flops.attention_share(small, math.floor(t_half)) < 0.5 <= flops.attention_share(small, math.ceil(t_half))
glue("q2_t_half", t_half)
glue("q2_over_context", t_half / small.context_length)
print(f"T = N_matmul / (2 L D) = {t_half:,.1f} tokens")

# %% [markdown]
# ```{dropdown} Answer
# Per token the attention matmuls cost $12LTD$ (training) against $6N_\text{matmul}$ for everything else;
# they are half the total when $12LTD = 6N_\text{matmul}$, at $T = N_\text{matmul} / (2LD)$ =
# {glue:text}`q2_t_half:,.0f` tokens, about $8D$ as the rule of thumb above says, and
# {glue:text}`q2_over_context:.1f` times `small`'s context length.
# ```
#
# ### Q3 [HFU with full recomputation]
#
# A run with full activation recomputation reports 45% MFU. What is its HFU?

# %% tags=["hide-input"]
REPORTED_MFU = 0.45
forward = flops.transformer_flops(small, BATCH, SEQ).forward_matmul_flops  # any forward count will do
step_s = 3 * forward / (REPORTED_MFU * peak)  # the step time that gives this MFU
hfu = flops.hfu(flops.hardware_training_flops(forward, recompute="full"), step_s, peak)
assert math.isclose(hfu, 0.6)
glue("q3_hfu_pct", 100 * hfu)
print(f"HFU = {hfu:.1%}")

# %% [markdown]
# ```{dropdown} Answer
# The step executes four forwards' worth of FLOPs in the time the MFU charges for three, so HFU = 45% × 4/3 =
# {glue:text}`q3_hfu_pct:.0f`%. A high HFU with recomputation is not a faster run: MFU is the number to
# compare across setups.
# ```
#
# ### Q4 [Thirty days instead]
#
# How many H100s does the 70B / 15T-token run of the napkin math need to finish in 30 days at the same 50%
# MFU (6N count)?

# %% tags=["hide-input"]
DEADLINE_DAYS = 30
gpus_needed = math.ceil(total_flops / (peak * TARGET_MFU * DEADLINE_DAYS * SECONDS_PER_DAY))
assert flops.training_time_s(total_flops, gpus_needed, peak, TARGET_MFU) <= DEADLINE_DAYS * SECONDS_PER_DAY
assert flops.training_time_s(total_flops, gpus_needed - 1, peak, TARGET_MFU) > DEADLINE_DAYS * SECONDS_PER_DAY
glue("q4_gpus", gpus_needed)
print(f"{gpus_needed:,} GPUs")

# %% [markdown]
# ```{dropdown} Answer
# Time scales as 1 / GPUs, so {glue:text}`q4_gpus:,` GPUs (the cell checks that one fewer misses the
# deadline), assuming MFU holds at that scale; in practice communication makes it harder to keep, which is
# what the parallelism chapters are about.
# ```
#
# ## Summary
#
# - A matmul costs $2mnk$ FLOPs; a linear layer costs 2 FLOPs per weight per token forward and twice that
#   backward (grad input + grad weight), so training is 3 × forward for every matmul.
# - Per transformer block: $8BTD^2$ for q, k, v, o; $4BT^2D$ for scores and weighted values; $6BTDF$ for
#   SwiGLU; elementwise work is {glue:text}`elementwise_share_pct:.1f`% of the FLOPs (`small`, $T$ = {glue:text}`seq`). The analytic count equals
#   `torch.utils.flop_counter` module by module for every preset, built on the meta device.
# - Per token, training costs $6N_\text{matmul} + 12LTD$. The 6N rule drops the attention term (wrong at long
#   sequences) and counts the embedding (wrong for small models).
# - Circulating formulas: a linear layer needs the factor $T$; the attention $T^2$ term has no factor $H$;
#   SwiGLU has three matrices ($6BTDF$, not $4BTDF$).
# - MFU = model FLOPs / (time × dense peak); HFU also counts recomputation (4/3 × MFU with full
#   recomputation). Use the dense peak: {glue:text}`sparse_tflops:,.0f` TFLOP/s is the H100's sparse figure.
# - Time = FLOPs / (GPUs × peak × MFU): {glue:text}`n_params_b:.0f`B parameters on {glue:text}`n_tokens_t:.0f`T
#   tokens take about {glue:text}`days:.0f` days on {glue:text}`n_gpus:,` H100s at {glue:text}`target_mfu_pct:.0f`% MFU.
