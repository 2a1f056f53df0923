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
# (sec-tensors-memory)=
# # Tensors, strides and memory
#
# **Question.** What is the largest model whose training state fits on {glue:text}`n_devices`
# {glue:text}`accelerator` GPUs of {glue:text}`hbm_gb:.0f` GB with AdamW in fp32, and how does the
# answer change with bf16 mixed precision?
#
# Cheat sheet: {doc}`../book/memory_onepager`.

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
import io
import itertools
import math

import einops
import matplotlib.pyplot as plt
import torch
from beartype import beartype
from jaxtyping import jaxtyped

from mlsys import experiments, hardware, plotting, tables, tensors
from mlsys.accounting import memory
from mlsys.accounting.activations import saved_bytes
from mlsys.accounting.params import count_params, param_counts
from mlsys.book import Table, glue, solved_by
from mlsys.diagrams import views as view_diagram
from mlsys.experiments import kit, pages
from mlsys.experiments import training_memory as TM
from mlsys.models.config import PRESETS, TransformerConfig
from mlsys.models.transformer import INIT_STD, Transformer

# %% tags=["parameters"]
SEED = 0
N_DEVICES = 8  # the GPUs of the question
ACCELERATOR = hardware.H100_SXM  # their memory: ACCELERATOR.hbm_bytes
DEMO_SHAPE, RESHAPED = (2, 3, 4), (4, 6)  # the small tensor whose strides we take apart; a .view
HEADS_DEMO = (1, 3, 4, 2)  # a tiny (batch, seq, d_model) activation, and its heads, drawn
MEMORY = TM.EXPERIMENT.sizes_for()  # the measured training steps: preset, batch, seq (by profile)
PERMUTED_SHAPE, PERMUTED_INDEX = (2, 3, 4, 5), (1, 2, 0, 3)  # Q1: (batch, seq, heads, d_head)
CHAIN_PRESET, CHAIN_BATCH, CHAIN_SEQ = "xl", 8, 1024  # Q3: a preset, sequences per GPU, tokens
INIT_PRESETS, INIT_TOKENS = ("debug", "small", "xl", "2.7B"), 256  # widths of the init demo

# %% tags=["remove-cell"]
GB = hardware.GIGA  # bytes per (spec-sheet) gigabyte; also 1e9 parameters = one billion
hbm_bytes = ACCELERATOR.hbm_bytes
for name, value in [("n_devices", N_DEVICES), ("accelerator", ACCELERATOR.name),
                    ("hbm_gb", hbm_bytes / GB), ("init_std", INIT_STD), ("init_d", INIT_STD**-2)]:
    glue(name, value)  # init_width: where INIT_STD = 1 / sqrt(d_in)

# %% [markdown]
# Two halves meet at one number: what a tensor is (a storage plus the metadata that places each
# element in it), and the bytes training keeps per parameter, counted, then checked against the
# memory allocator during real training steps.
#
# ## Napkin math
#
# Training with AdamW {cite}`loshchilov2019adamw` keeps, for every parameter, the weight, its
# gradient and the two moment estimates $m$ and $v$. Mixed precision {cite}`micikevicius2018mixed`
# stores weights (and often gradients) in 16 bits and keeps an fp32 *master* copy of the weights for
# the update. `mlsys.accounting.memory` names the recipes; each fixes the bytes one parameter costs,
# and with $N$ parameters sharded over the devices (each holds $1/n$ of the states) the answer is $n
# \cdot \text{memory} / \text{bytes per parameter}$; replicated, as in plain data parallelism, it is
# what one device holds.

# %% tags=["hide-input"]
answers = {r.name: memory.max_trainable_params(N_DEVICES, hbm_bytes, r)
           for r in memory.RECIPES.values()}  # n * memory // bytes per parameter
glue("max_fp32_billion", answers["fp32_adamw"] / GB)
glue("max_one_gpu_billion", memory.max_trainable_params(1, hbm_bytes, "fp32_adamw") / GB)
glue("mixed_answers", TM.mixed_answers(N_DEVICES, hbm_bytes))  # each recipe against fp32's
Table(*tables.max_params_table(N_DEVICES, hbm_bytes))

# %% [markdown]
# With fp32 AdamW (16 bytes per parameter), {glue:text}`n_devices` GPUs hold the model states of at
# most {glue:text}`max_fp32_billion:.1f` billion parameters, if the states are sharded; replicated,
# {glue:text}`max_one_gpu_billion:.1f` billion, however many GPUs train together. Whether mixed
# precision moves the answer depends on the recipe: {glue:text}`mixed_answers`. Only ZeRO's 2 + 2 +
# 12 recipe {cite}`rajbhandari2020zero` leaves it where it was: the 4 bytes saved on weights and
# gradients pay for the 4-byte master copy. Keeping the gradients in fp32 as well (18 B, as
# Megatron-LM's [distributed-optimizer
# notes](https://docs.nvidia.com/megatron-core/developer-guide/latest/distrib_optimizer.html) count
# for 16-bit parameters with fp32 gradients) *lowers* it; only dropping the fp32 copies altogether
# (pure bf16) raises it. PyTorch's autocast is yet another recipe: the fp32 weights are the master
# copy, bf16 copies are made on the fly, and the states are fp32 AdamW's; the measurement below
# shows it. To count bytes we first need to know what a tensor is.
#
# ## A tensor is a storage plus strides
#
# A PyTorch tensor is a view into a one-dimensional block of memory, its *storage*. Three pieces of
# metadata map an index to a place in it: the **shape**, the **strides** (elements to skip to move
# one step along each dimension) and the **storage offset** {cite}`pytorch_tensor_views`. A fresh
# tensor owns a storage of `numel × element_size` bytes, which the pure function
# `memory.tensor_bytes(shape, dtype)` predicts. A view has its own shape but shares its parent's
# storage: the last token's activations `x[:, -1]` keep the whole (batch, seq, d_model) block alive.

# %%
cfg = TransformerConfig.preset(MEMORY.preset)
BATCH, SEQ = MEMORY.batch, MEMORY.seq  # one activation of the measured model, (batch, seq, d_model)
shape = (BATCH, SEQ, cfg.d_model)
x = torch.randn(shape, generator=torch.Generator().manual_seed(SEED))
assert memory.tensor_bytes(shape, "fp32") == x.untyped_storage().nbytes() == x.numel() * 4
last = x[:, -1]  # (batch, d_model), a view
slice_bytes = glue("slice_bytes", memory.tensor_bytes(last.shape, last.dtype))
storage_bytes = glue("slice_storage_bytes", last.untyped_storage().nbytes())
assert tensors.shares_storage(last, x) and storage_bytes == SEQ * slice_bytes
assert last.clone().untyped_storage().nbytes() == slice_bytes  # a copy owns only what it shows
shape_text = glue("shape", str(shape))

# %% [markdown]
# For the {glue:text}`shape` activation, `x[:, -1]` shows {glue:text}`slice_bytes:,` bytes but pins
# {glue:text}`slice_storage_bytes:,`: a list of last-token slices keeps every parent alive, and
# `.clone()` cuts the tie (Q2 shows that `torch.save` writes the whole storage too).
#
# ### Indexing is pointer arithmetic
#
# Element `index` sits at storage position $\text{storage\_offset} + \sum_d i_d \cdot
# \text{stride}_d$, counted in elements:
#
# ```{literalinclude} ../lib/mlsys/tensors.py
# :pyobject: element_offset
# ```
#
# A fresh tensor is row-major: the last dimension has stride 1 and each earlier stride is the
# product of the sizes after it (`contiguous_strides`). Views change only the metadata. The base
# tensor below holds its own storage positions as values (`arange`); for several views, the formula
# is compared with PyTorch's `storage_offset()`, the byte distance between `data_ptr`s, and the
# value itself, for every element. The diagram draws them: the storage on top, one numbered cell
# per element, and under it each view as the storage positions it reaches, in the order its
# indices visit them (`view_diagram.positions`: `element_offset` with the view's own strides and
# offset), each cell coloured by its position, runs of the last dimension set apart.

# %% tags=["hide-input"]
base = torch.arange(math.prod(DEMO_SHAPE), dtype=torch.float32).reshape(DEMO_SHAPE)
assert base.stride() == tensors.contiguous_strides(DEMO_SHAPE)
views = {"base": base, "transpose(0, 2)": base.transpose(0, 2), "[:, ::2, 1:]": base[:, ::2, 1:],
         f"view{RESHAPED}": base.view(RESHAPED),
         f"[1:, :1].expand(-1, {DEMO_SHAPE[1]}, -1)": base[1:, :1].expand(-1, DEMO_SHAPE[1], -1)}
for v in views.values():
    for index in itertools.product(*(range(n) for n in v.shape)):
        predicted = tensors.element_offset(index, v.stride(), v.storage_offset())
        byte_distance = v[index].data_ptr() - v.untyped_storage().data_ptr()
        assert predicted == v[index].storage_offset() == byte_distance // v.element_size()
        assert predicted == v[index].item()  # arange: the value is its own storage position
view_diagram.draw_views(views)  # shape, stride, offset and contiguity in each view's label
plt.show()

# %% [markdown]
# Transpose and permute reorder the strides (no data moves, whatever the size); a slice with a step
# multiplies a stride and moves the offset; expand gives the broadcast dimension stride 0, so a
# tensor can look much larger than its storage. Because a view shares storage, writing through it
# writes into the parent. Integer, range and step slicing give views; indexing with a list of
# indices gathers elements no stride can describe, so it copies:
#
# ```{literalinclude} ../lib/mlsys/tensors.py
# :pyobject: shares_storage
# ```

# %%
parent = base.clone()
parent.transpose(0, 2)[-1, 0, 0] = -1.0  # writes parent[0, 0, -1]
assert parent[0, 0, -1] == -1.0
results = {"t.transpose(0, 1)": base.transpose(0, 1), "t[:, 1]": base[:, 1],
           "t.unsqueeze(0).expand(4, -1, -1, -1)": base.unsqueeze(0).expand(4, -1, -1, -1),
           "t.view(-1)": base.view(-1), "t[[0, 1]]": base[[0, 1]], "t.clone()": base.clone()}
shared = {name: tensors.shares_storage(out, base) for name, out in results.items()}
assert [n for n, v in shared.items() if not v] == ["t[[0, 1]]", "t.clone()"]
Table(["operation on t", "shares storage (a view)"], [[f"`{n}`", v] for n, v in shared.items()])

# %% [markdown]
# ### Contiguity, `.view` and `.reshape`
#
# A tensor is *contiguous* when its strides are the row-major ones for its shape (PyTorch ignores
# the stride of a size-1 dimension). `.view` never copies, so after a transpose it cannot flatten
# the tensor and refuses; `.contiguous()` copies into a fresh row-major storage; `.reshape` is a
# view when one is possible and a copy otherwise. A flat view is possible exactly when the elements
# in index order are evenly spaced in storage, which `flattens_to_view` checks (the cell below
# compares it with `.reshape` on every view above): contiguous tensors qualify, and so does every
# other element of a flat tensor.
#
# ```{literalinclude} ../lib/mlsys/tensors.py
# :pyobject: flattens_to_view
# ```

# %%
transposed = base.transpose(0, 2)
assert not tensors.is_contiguous(transposed.shape, transposed.stride())
assert not transposed.is_contiguous()
try:
    transposed.view(-1)
    raise AssertionError(".view flattened a transposed tensor")
except RuntimeError as err:  # in index order the elements are not evenly spaced
    print("RuntimeError:", str(err).replace(" (", "\n("))  # two short lines
fresh = transposed.contiguous()
assert fresh.stride() == tensors.contiguous_strides(fresh.shape)
assert not tensors.shares_storage(fresh, base)
assert base.contiguous() is base  # already contiguous: no copy
for v in [*views.values(), base.view(-1)[::2]]:
    assert tensors.shares_storage(v.reshape(-1), v) == tensors.flattens_to_view(v.shape, v.stride())

# %% [markdown]
# Copies cost time: `.contiguous()` on $n$ bytes reads and writes $n$ bytes (the byte-movement
# chapters measure it).
#
# ## Broadcasting, einsum and einops
#
# `torch.matmul` treats the last two dimensions as matrices and *broadcasts* the others: a (batch,
# seq, d_model) activation times a (d_model, d_ff) weight is one (batch·seq, d_model) × (d_model,
# d_ff) product, with no copy of the weight (it behaves like `w.expand(batch, d_model, d_ff)`,
# stride 0 along the batch). `matmul_shape` predicts the result shape from the rule:
#
# ```{literalinclude} ../lib/mlsys/tensors.py
# :pyobject: matmul_shape
# ```

# %% tags=["hide-input"]
g = torch.Generator().manual_seed(SEED)
heads, d_head = cfg.n_heads, cfg.d_head
cases = {"activation @ weight": ((BATCH, SEQ, cfg.d_model), (cfg.d_model, cfg.d_ff)),
         "q @ k^T per head": ((BATCH, heads, SEQ, d_head), (BATCH, heads, d_head, SEQ)),
         "one query vs all heads": ((BATCH, 1, 1, d_head), (heads, d_head, SEQ)),
         "vector @ matrix": ((cfg.d_model,), (cfg.d_model, cfg.d_ff))}
rows = []
for name, (a_shape, b_shape) in cases.items():
    measured = tuple((torch.randn(a_shape, generator=g) @ torch.randn(b_shape, generator=g)).shape)
    assert tensors.matmul_shape(a_shape, b_shape) == measured, name
    rows.append([name, a_shape, b_shape, measured])
w = torch.randn(cfg.d_model, cfg.d_ff, generator=g)
y = x @ w  # (batch, seq, d_ff): one (batch*seq, d_model) x (d_model, d_ff) product
torch.testing.assert_close(y, (x.reshape(-1, cfg.d_model) @ w).reshape(BATCH, SEQ, cfg.d_ff))
Table(["case", "a", "b", "predicted = torch.matmul"], rows)

# %% [markdown]
# `einsum` writes a contraction as index names: names on the inputs that are missing from the output
# are summed. `torch.einsum` takes one letter per dimension; einops {cite}`rogozhnikov2022einops`
# accepts whole words, so the book's dimension names ({ref}`sec-notation`) appear in the code, and
# `...` stands for any leading dimensions. `einops.reduce` names what a reduction removes,
# `einops.rearrange` reshapes and permutes:

# %%
for other in (torch.einsum("bsd,df->bsf", x, w),
              einops.einsum(x, w, "batch seq d_model, d_model d_ff -> batch seq d_ff"),
              einops.einsum(x, w, "... d_model, d_model d_ff -> ... d_ff")):
    torch.testing.assert_close(other, y)
mean_square = einops.reduce(x**2, "batch seq d_model -> batch seq 1", "mean")  # RMSNorm's core
torch.testing.assert_close(mean_square, x.pow(2).mean(dim=-1, keepdim=True))

# %% [markdown]
# ```{literalinclude} ../lib/mlsys/tensors.py
# :pyobject: split_heads
# ```
#
# `rearrange` returns a view whenever the strides allow one, so splitting the heads is free. Merging
# them back after attention is not: attention's output is a fresh contiguous (batch, heads, seq,
# d_head) tensor, and (heads, d_head) become one d_model dimension only after heads and seq swap
# places in memory.

# %%
q = tensors.split_heads(x, heads)  # (batch, heads, seq, d_head)
assert q.shape == (BATCH, heads, SEQ, d_head) and not q.is_contiguous()
assert tensors.shares_storage(q, x)
assert tensors.shares_storage(tensors.merge_heads(q), x)  # undoing the split: still the same bytes
attention_output = torch.randn(BATCH, heads, SEQ, d_head, generator=g)  # as attention returns it
merged = tensors.merge_heads(attention_output)
assert merged.shape == (BATCH, SEQ, cfg.d_model)
assert not tensors.shares_storage(merged, attention_output)

# %% [markdown]
# Drawn small, for a tiny activation (the shapes are in the labels): the split reaches the same
# cells in another order, and merging the split back reaches them in the first order again, all in
# one storage.

# %% tags=["hide-input"]
small = torch.arange(math.prod(HEADS_DEMO[:3]), dtype=torch.float32).reshape(HEADS_DEMO[:3])
split = tensors.split_heads(small, HEADS_DEMO[3])
view_diagram.draw_views({"x": small, "split_heads(x)": split, "merge_heads(split)":
                         tensors.merge_heads(split)}, title="Splitting heads: one storage")
plt.show()

# %% [markdown]
# ### Shapes as types: jaxtyping
#
# `split_heads` carries its shapes in its signature, `Float[Tensor, "batch seq d_model"]` in and
# `Float[Tensor, "batch heads seq d_head"]` out. These jaxtyping {cite}`kidger2022jaxtyping`
# annotations are documentation in the library; the tests wrap the public functions with
# `jaxtyped(typechecker=beartype)`, which binds each name to a size on first use and checks every
# later use. Wrapped, a tensor without the batch dimension fails before the body runs, with a
# `TypeError` naming the parameter and the sizes bound so far:

# %%
checked_split_heads = jaxtyped(typechecker=beartype)(tensors.split_heads)
assert checked_split_heads(x, heads).shape == q.shape
try:
    checked_split_heads(x[0], heads)  # (seq, d_model): no batch dimension
    raise AssertionError("a (seq, d_model) tensor passed as (batch, seq, d_model)")
except TypeError as error:
    print("\n".join(str(error).splitlines()[:4]))

# %% [markdown]
# ## Counting parameters
#
# Model states are bytes per parameter times parameters. `mlsys.accounting.params` counts the
# parameters from the configuration alone, component by component; the model itself is built on
# PyTorch's *meta* device, where tensors have shapes but no storage, so even the 2.7B model costs no
# memory and `sum(p.numel())` can be compared with the formula for every preset:
#
# ```{literalinclude} ../lib/mlsys/accounting/params.py
# :pyobject: param_counts
# ```

# %% tags=["hide-input"]
GOLDEN_COUNTS = {"small": 128_625_408, "medium": 423_183_360, "large": 969_411_840,
                 "xl": 1_998_235_200, "2.7B": 3_406_809_600}
rows, n_params = [], {}
for name in PRESETS:
    preset = TransformerConfig.preset(name)
    with torch.device("meta"):
        n_params[name] = counted = sum(p.numel() for p in Transformer(preset).parameters())
    assert counted == count_params(preset) == GOLDEN_COUNTS.get(name, counted)
    parts, D = param_counts(preset), preset.d_model
    assert parts.per_layer == 4 * D * D + 3 * D * preset.d_ff + 2 * D  # attention, SwiGLU, gains
    rows.append([f"`{name}`", f"{D} / {preset.d_ff}", preset.n_layers, *(
        f"{n:,}" for n in (parts.total, parts.embedding + parts.lm_head, parts.per_layer))])
glue("gains_small", param_counts(TransformerConfig.preset("small")).norms_per_layer)
Table(["preset", "D / F", "layers", "total", "embedding + head", "per layer"], rows)

# %% [markdown]
# Each block holds $4D^2$ attention weights, $3DF$ feed-forward weights (SwiGLU) and the $2D$
# gains of its two RMSNorms ({glue:text}`gains_small:,` in `small`: a sliver, but counted, and the
# cell asserts the per-layer column equals $4D^2 + 3DF + 2D$). After the last block the final
# norm adds $D$, and the vocabulary adds $2VD$ for the untied embedding and head.
#
# ### Why the weights start at about $1/\sqrt{d_\text{in}}$
#
# A parameter's first value matters as much as its bytes. An output of a linear layer,
# $y_j = \sum_i x_i w_{ij}$, is a sum of $d_\text{in}$ products; with independent zero-mean entries
# its variance is $d_\text{in}\,\sigma_w^2\,\text{Var}(x)$. A fixed $\sigma_w$ therefore grows
# the signal by $\sigma_w\sqrt{d_\text{in}}$ per layer in a wide model and shrinks it in a narrow
# one, and the factor compounds over layers; $\sigma_w = 1/\sqrt{d_\text{in}}$ keeps
# $\text{Var}(y) = \text{Var}(x)$ at every width {cite}`lecun1998efficient` (Glorot and He
# initializations add a factor for the backward pass and for ReLU {cite}`glorot2010understanding`
# {cite}`he2015delving`; PyTorch's `nn.Linear` draws uniformly with standard deviation
# $1/\sqrt{3 d_\text{in}}$). The book's model uses GPT-2's fixed $\sigma_w =$
# {glue:text}`init_std` for every weight, which is $1/\sqrt{d_\text{in}}$ only at $d_\text{in} =$
# {glue:text}`init_d:,.0f`. Measured on one layer of each preset's width, with unit-variance
# inputs:

# %% tags=["hide-input"]
init_rows = []
for layer_cfg in map(TransformerConfig.preset, INIT_PRESETS):  # one D x D layer per preset
    d_in, sigmas = layer_cfg.d_model, (INIT_STD, layer_cfg.d_model**-0.5)
    x_in, w_in = (torch.randn(n, d_in, generator=g) for n in (INIT_TOKENS, d_in))
    stds = [(x_in @ (w_in * sigma)).std().item() for sigma in sigmas]  # std(x_in) = 1
    assert all(abs(v / (s * d_in**0.5) - 1) < 0.1 for v, s in zip(stds, sigmas, strict=True))
    init_rows.append([f"{d_in:,}", *(f"{v:.3f}" for v in stds),
                      f"{stds[0] ** layer_cfg.n_layers:.3g} ({layer_cfg.n_layers} layers)"])
Table(["d_in (a preset's D)", f"std of x W, σ = {INIT_STD}", "σ = 1/√d_in",
       f"σ = {INIT_STD} compounded over the preset's layers"], init_rows)

# %% [markdown]
# With $1/\sqrt{d_\text{in}}$ the output keeps unit spread at every width; with
# {glue:text}`init_std` it follows $\sigma_w\sqrt{d_\text{in}}$, and a stack of the preset's
# layers without anything in between would scale the signal by the last column. The book's model
# survives its fixed $\sigma_w$ because nothing is stacked bare: each block's RMSNorm rescales its
# input to unit RMS, and the residual stream adds each block's output to what passes through
# instead of replacing it.
#
# ## Measurement: what the allocator holds during training
#
# Adding up the bytes of the tensors a step leaves behind cannot disagree with the count: it *is*
# the count. The `training_memory` experiment asks the memory allocator instead. It trains the
# {glue:text}`mem_preset` model ({glue:text}`mem_params:,` parameters) for two steps on a batch of
# {glue:text}`mem_batch` × {glue:text}`mem_seq` tokens, once per recipe (fp32 AdamW, pure bf16
# AdamW, fp32 AdamW under bf16 autocast), and reads the allocator around every phase: the bytes live
# when it ends and the peak during it. On a CUDA GPU that is `torch.cuda.memory_allocated()` and
# `max_memory_allocated()`; on a CPU, the allocation and free events of PyTorch's profiler
# (`profile_memory=True`), summed in time order. Both count from zero before the model is built. The
# forward pass also counts, through autograd's saved-tensor hooks, the bytes it saves for backward.
#
# ```{literalinclude} ../lib/mlsys/experiments/training_memory.py
# :pyobject: _train
# ```

# %%
mem_rows = TM.EXPERIMENT.run(MEMORY)  # every recipe: two training steps, the allocator read

# %% tags=["hide-input"]
for name, value in TM.page_numbers(mem_rows).items():  # sizes, device, method, verdicts
    glue(f"mem_{name}", value)
TM.check_laws(mem_rows)  # states <= allocator <= peak; on a CPU, to the byte
TM.table(mem_rows)

# %% [markdown]
# Measured on {glue:text}`mem_device` with {glue:text}`mem_method`. After the optimizer step every
# model state exists, and {glue:text}`mem_states`. The forward pass: {glue:text}`mem_forward`. Peaks
# of the second step: {glue:text}`mem_peak`; {glue:text}`mem_compare`. What the allocator sees
# beyond the model states is what the count leaves out: the activations saved for backward, the
# logits and their gradient, the optimizer's temporaries during its step, buffers such as the RoPE
# tables, the token batch and AdamW's per-tensor step counters; at the first step the moments do not
# exist yet, so the steady state is the second step. In the plot, each run's live bytes (lines) and
# peaks (triangles) by phase, against its predicted model states (dashed):

# %% tags=["hide-input"]
kit.draw(TM.plot, mem_rows, width=8.5, height=4.2, title=f"Allocator during two training steps "
         f"({MEMORY.preset}, batch {BATCH} x {SEQ} tokens)")

# %% tags=["hide-input"]
experiments.show_recorded("training_memory", show=pages.show_training_memory, would_show=(
    "On a CUDA GPU it reads `torch.cuda.memory_allocated` around the same phases with the "
    "`small` preset, and the 'unexplained' column shows what the caching allocator adds."))

# %% [markdown]
# ### The activations of one block, by hand
#
# The forward's growth is the activations, and they can be counted before anything runs. With $N
# = BT$ tokens, $b$ bytes per element of the model's dtype, and the list of tensors autograd keeps
# (`mlsys.accounting.activations` names each one), one block of the book's model saves:
#
# - **two RMSNorms**, each its input and $x/\text{rms}$, $(N, D)$, and $1/\text{rms}$, $(N, 1)$,
#   all in fp32 (a bf16 model keeps an fp32 up-cast copy of $x$ instead of $x$): $2 \cdot (8ND +
#   4N)$ bytes whatever $b$;
# - **attention**: the normed input that q, k and v read, q and k after RoPE, v, and the merged
#   heads that the output projection reads, five $(N, D)$ tensors; the softmax output, $(B, H, T,
#   T)$; the causal mask, $T^2$ booleans of one byte: $5NDb + BHT^2 b + T^2$;
# - **SwiGLU**: its normed input and four $(N, F)$ tensors, $w_1x$, $w_3x$, $\text{silu}(w_1x)$ and
#   their product: $NDb + 4NFb$.
#
# Together:
#
# $$ \text{block} = (6ND + 4NF + BHT^2)\,b + 16ND + 8N + T^2 \ \text{bytes}. $$
#
# The training runs above counted what the first block saved, by module, with saved-tensor hooks:

# %%
N, D, F, H, B, T = BATCH * SEQ, cfg.d_model, cfg.d_ff, cfg.n_heads, BATCH, SEQ  # measured sizes
for run, dtype in (("fp32 AdamW", "fp32"), ("pure bf16 AdamW", "bf16")):
    b = memory.tensor_bytes((1,), dtype)  # bytes per element
    by_hand = (6 * N * D + 4 * N * F + B * H * T**2) * b + 16 * N * D + 8 * N + T**2
    assert by_hand == TM.runs(mem_rows)[run]["block_saved_bytes"][-1]  # measured by the hooks
    assert by_hand == saved_bytes(cfg, B, T, dtype=dtype).block_bytes  # the library
    print(f"{run}: one block saves {glue(f'block_{dtype}', by_hand):,} bytes")
square_share = glue("block_square_share", (B * H * T**2 * b + T**2) / by_hand)  # bf16: the last

# %% [markdown]
# The closed form, the hooks and the library agree to the byte. bf16 does not halve the block:
# the norms keep fp32 copies. The $T^2$ terms are {glue:text}`block_square_share:.0%` of the bf16
# block at $T =$ {glue:text}`mem_seq`, and they grow with the square of the length: Q3 takes the
# count to the {glue:text}`q3_preset` model at {glue:text}`q3_seq:,` tokens, and the attention
# chapter's fused kernels keep no $T \times T$ tensor at all.
#
# The same count, scaled up: model states against model size, one line per recipe
# ({glue:text}`shared_lines`), with the presets marked and the memory of one and of
# {glue:text}`n_devices` GPUs as ceilings. A line crosses a ceiling at the largest trainable model.

# %% tags=["remove-cell"]
glue("shared_lines", TM.shared_lines())  # recipes of equal bytes per parameter

# %% tags=["remove-input"]
kit.draw(plotting.plot_model_states, n_params, width=7.5, height=4.6, accelerator=ACCELERATOR,
         n_devices=N_DEVICES)

# %% [markdown]
# Even the sharded answer is an upper bound. Beyond what the allocator showed above, a GPU also
# holds communication buffers (ZeRO-3 gathers each layer's full weights before using them), loses
# some memory to the caching allocator's fragmentation, and spends hundreds of MB on the CUDA
# context before the first tensor. Cheaper optimizer state moves the bound the other way: 8-bit
# moments {cite}`dettmers2022optimizers`, or pure bf16 with care for small updates (chapter
# {ref}`sec-precision`).
#
# ```{admonition} Takeaway
# :class: tip
# AdamW costs 16 bytes per parameter in fp32, and so in ZeRO's bf16 mixed recipe; keeping fp32
# gradients costs 18 and pure bf16 8: {glue:text}`n_devices` {glue:text}`accelerator` GPUs hold at
# most {glue:text}`max_fp32_billion:.1f` billion parameters with fp32 AdamW, and only when the
# states are sharded. The allocator holds the model states {glue:text}`mem_exactness`, plus what the
# count leaves out; at the peak: {glue:text}`mem_peak`.
# ```
#
# ## Exercises
#
# ### Q1 The stride of a permuted tensor
#
# A contiguous tensor has shape (batch, seq, heads, d_head) = {glue:text}`q1_shape`. What are the
# strides of `t.permute(0, 2, 1, 3)`, is the result contiguous, and at which storage position is its
# element {glue:text}`q1_index`?
#
# ```{dropdown} Answer
# The strides permute with the dimensions: {glue:text}`q1_strides` becomes
# {glue:text}`q1_permuted_strides`, which is not row-major, so the result is not contiguous. Element
# {glue:text}`q1_index` sits at the sum of index times stride, {glue:text}`q1_position`.
# ```

# %% tags=["hide-cell"]
t = torch.arange(math.prod(PERMUTED_SHAPE)).reshape(PERMUTED_SHAPE)
strides = tensors.contiguous_strides(t.shape)  # (60, 20, 5, 1) for (2, 3, 4, 5)
p = t.permute(0, 2, 1, 3)
assert p.stride() == tuple(strides[d] for d in (0, 2, 1, 3))  # a permute permutes the strides
assert not tensors.is_contiguous(p.shape, p.stride()) and not p.is_contiguous()
position = tensors.element_offset(PERMUTED_INDEX, p.stride(), p.storage_offset())
assert position == sum(i * st for i, st in zip(PERMUTED_INDEX, p.stride(), strict=True))
assert position == p[PERMUTED_INDEX].item()  # arange: the value is its storage position
for name, value in [("shape", PERMUTED_SHAPE), ("index", list(PERMUTED_INDEX)),
                    ("strides", strides), ("permuted_strides", p.stride()), ("position", position)]:
    glue(f"q1_{name}", str(value))

# %% [markdown]
# ### Q2 What does torch.save write for a slice?
#
# Save only the last position's logits, `logits[:, -1]`, of fp32 logits of shape (batch, seq, vocab)
# with `torch.save` to an in-memory buffer. How many bytes are written, compared with the slice's
# own bytes? What changes with `.clone()`?
#
# ```{dropdown} Answer
# `torch.save` stores storages, so that views saved together are still views after loading
# {cite}`pytorch_serialization`: the view writes {glue:text}`q2_view:,` bytes, its parent's whole
# storage (seq times the slice, plus a small archive header); the clone owns only its own
# {glue:text}`q2_slice:,` bytes and writes {glue:text}`q2_clone:,`.
# ```

# %% tags=["hide-cell"]
logits = torch.randn(BATCH, SEQ, cfg.vocab_size, generator=g)
written = {}
for name, tensor in (("view", logits[:, -1]), ("clone", logits[:, -1].clone())):
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    written[name] = glue(f"q2_{name}", buffer.getbuffer().nbytes)
slice_only = glue("q2_slice", memory.tensor_bytes((BATCH, cfg.vocab_size), "fp32"))
assert written["view"] > memory.tensor_bytes(logits.shape, "fp32") > written["clone"] > slice_only

# %% [markdown]
# ### Q3 (multi-step) One preset on many GPUs: states, activations, sharding
#
# Take the {glue:text}`q3_preset` preset on {glue:text}`n_devices` {glue:text}`accelerator` GPUs,
# {glue:text}`q3_batch` sequences of {glue:text}`q3_seq:,` tokens per GPU. (a) How many GB of model
# states does each recipe of `memory.RECIPES` need? (b) How many bytes does one layer save for
# backward, in fp32 and in bf16? `mlsys.accounting.activations.saved_bytes` counts them (the
# profiling chapter checks it against what autograd saves, byte for byte). (c) With the activations
# of all layers (fp32 for the fp32 recipes, bf16 for the others), which recipes fit on one GPU when
# the states are replicated, which only when they are sharded over all {glue:text}`n_devices`, and
# which not at all?
#
# ```{dropdown} Answer
# (a) The table below, in GB (✗: more than one GPU's {glue:text}`hbm_gb:.0f` GB). (b) One layer
# saves {glue:text}`q3_layer_fp32:.2f` GB in fp32 and {glue:text}`q3_layer_bf16:.2f` GB in bf16; the
# naive attention weights (batch × heads × seq² elements) are {glue:text}`q3_attn_share:.0%` of the
# bf16 count. (c) Replicated, only
# {glue:text}`q3_both` fit; {glue:text}`q3_only_sharded` fit only when sharded;
# {glue:text}`q3_neither` do not fit even sharded{glue:text}`q3_neither_reason`. All of this is
# before logits, temporaries and the CUDA context.
# ```

# %% tags=["hide-cell"]
chain = TransformerConfig.preset(CHAIN_PRESET)
layer = {dt: saved_bytes(chain, CHAIN_BATCH, CHAIN_SEQ, dtype=dt, attention="naive").block_bytes
         for dt in ("fp32", "bf16")}
attention_weights = CHAIN_BATCH * chain.n_heads * CHAIN_SEQ**2 * 2  # bf16 softmax output
assert attention_weights < layer["bf16"] < layer["fp32"]
needs = TM.recipe_needs(chain, CHAIN_BATCH, CHAIN_SEQ, N_DEVICES)  # bytes: states, acts, per GPU
states = {name: need["states"] for name, need in needs.items()}
fits = {n: {k: v[k] <= hbm_bytes for k in ("replicated", "sharded")} for n, v in needs.items()}
groups = {"both": [n for n, f in fits.items() if f["replicated"]],
          "only_sharded": [n for n, f in fits.items() if f["sharded"] and not f["replicated"]],
          "neither": [n for n, f in fits.items() if not f["sharded"]]}
assert fits["bf16_pure_adamw"]["replicated"] and not fits["fp32_adamw"]["sharded"]
glue("q3_neither_reason", ": their activations alone exceed one GPU" if all(
    chain.n_layers * layer["fp32"] > hbm_bytes for _ in groups["neither"]) else "")
for name, value in [("preset", CHAIN_PRESET), ("batch", CHAIN_BATCH), ("seq", CHAIN_SEQ),
                    ("layer_fp32", layer["fp32"] / GB), ("layer_bf16", layer["bf16"] / GB),
                    ("attn_share", attention_weights / layer["bf16"]),
                    *((k, ", ".join(v) or "none") for k, v in groups.items())]:
    glue(f"q3_{name}", value)
TM.needs_table(needs, hbm_bytes)

# %% [markdown]
# ### Q4 (find the error) Mixed precision halves the memory
#
# A widely shared one-pager on byte movement says of mixed precision: *weights and gradients take 2
# bytes instead of 4, activations half the memory, fp32 master weights and optimizer states are
# kept, net savings about 1.5-2× memory for large models.* Check the claim for the
# {glue:text}`q3_preset` model at {glue:text}`q3_seq:,` tokens per sequence.
#
# ```{dropdown} Answer
# The model states do not shrink at all: 2 + 2 + 4 (master) + 8 (moments) is 16 bytes per parameter,
# as in fp32 ({glue:text}`q4_states_ratio:.2f`× saving), and with fp32 gradients it is 18
# ({glue:text}`q4_states_ratio18:.2f`×, a loss). Only the activations shrink, so the saving depends
# on how large they are next to the states: with one sequence per GPU it is
# {glue:text}`q4_saving_1:.2f`×, with {glue:text}`q3_batch` sequences
# {glue:text}`q4_saving_b:.2f`×; it reaches 1.5× only from {glue:text}`q4_batch_15` sequences per
# GPU, and never 2×: even the activations shrink only {glue:text}`q4_act_ratio:.2f`× (not every
# saved tensor is a 16-bit float).
# ```

# %% tags=["hide-cell"]
act = {dt: chain.n_layers * saved_bytes(chain, 1, CHAIN_SEQ, dtype=dt,
                                        attention="naive").block_bytes
       for dt in ("fp32", "bf16")}  # per sequence (the causal mask aside, linear in the batch)
assert act["bf16"] < act["fp32"] <= 2 * act["bf16"] + chain.n_layers * CHAIN_SEQ**2
fp32_states, mixed_states = states["fp32_adamw"], states["bf16_mixed_adamw"]
# saving >= 1.5 once b * (act_fp32 - 1.5 act_bf16) >= 1.5 mixed - fp32 states:
batch_15 = math.ceil((1.5 * mixed_states - fp32_states) / (act["fp32"] - 1.5 * act["bf16"]))
saving = {b: (fp32_states + b * act["fp32"]) / (mixed_states + b * act["bf16"])
          for b in (1, CHAIN_BATCH, batch_15 - 1, batch_15)}  # total fp32 over mixed memory
assert saving[batch_15] >= 1.5 > saving[batch_15 - 1]
assert saving[1] < 1.5 and act["fp32"] / act["bf16"] < 2  # the limit for huge batches: below 2x
for name, value in [("states_ratio", fp32_states / mixed_states), ("batch_15", batch_15),
                    ("states_ratio18", fp32_states / states["bf16_mixed_adamw_fp32_grads"]),
                    ("saving_1", saving[1]), ("saving_b", saving[CHAIN_BATCH]),
                    ("act_ratio", act["fp32"] / act["bf16"])]:
    glue(f"q4_{name}", value)

# %% [markdown]
# ### Q5 (code) Every position a view reaches
#
# The diagram of the views above lists, for each view, the storage positions its elements occupy
# in index order. Write that list from the metadata alone: complete `reached(shape, stride,
# offset)` without torch, then count how many distinct storage cells the expand view reaches. The
# hidden cell checks your function on every view of the section against what torch reads.

# %%
def reached(shape, stride, offset):  # <- your code here
    """Storage position of every element of a view (shape, stride, offset), in index order."""
    raise NotImplementedError("offset + sum(index[d] * stride[d]) for every index, row-major")


# %% tags=["hide-cell"]
# The book's solution (opened on demand). `solved_by` checks the reader's function once it is
# written, and the book's while it is not.
def reached_solution(shape, stride, offset):
    found = [offset]
    for size, step in zip(shape, stride, strict=True):  # outermost dimension first
        found = [p + i * step for p in found for i in range(size)]  # each index of the next dim
    return found


for name, v in views.items():  # the arange base: each value read is its storage position
    found, whose = solved_by(reached, reached_solution, v.shape, v.stride(), v.storage_offset())
    assert found == v.reshape(-1).long().tolist() == view_diagram.positions(v), name
cells = glue("q5_cells", len(set(found)))  # the last view, the expand: one row, read again
assert name.startswith("[1:, :1].expand") and cells == DEMO_SHAPE[-1] < glue("q5_numel", v.numel())
print(f"checked: {whose} solution, on {len(views)} views")

# %% [markdown]
# ```{dropdown} Answer
# Start from the offset, then take one dimension at a time, outermost first: every position found
# so far is followed by itself plus $i \cdot \text{stride}$ for each index $i$ of the dimension.
# After the last dimension the list holds one position per element, in row-major index order:
# exactly `element_offset` of every index. The expand view has {glue:text}`q5_numel` elements but
# reaches only {glue:text}`q5_cells` distinct cells: its stride-0 dimension reads the same row
# again. The cell checks the function on every view of the section.
# ```
#
# ## Summary
#
# - A tensor is a storage plus shape, strides and an offset; element `index` sits at `storage_offset
#   + Σ index[d]·stride[d]`. Transpose, permute, slicing and expand are views; advanced indexing,
#   `.clone()` and `.contiguous()` copy; `.view` refuses what needs a copy.
# - A small view keeps its parent's whole storage alive, and `torch.save` writes all of it.
# - `matmul` broadcasts leading dimensions; einops names dimensions; jaxtyping puts the names in
#   signatures, checked in the tests.
# - Model states cost 16 bytes per parameter in fp32 AdamW and in ZeRO's mixed recipe, 18 with fp32
#   gradients, 8 in pure bf16: at most {glue:text}`max_fp32_billion:.1f` billion parameters on
#   {glue:text}`n_devices` × {glue:text}`hbm_gb:.0f` GB with fp32 AdamW, only when sharded.
# - The allocator confirms the count {glue:text}`mem_exactness` and shows what it leaves out:
#   activations, logits, optimizer temporaries, buffers and step counters.
# - One block saves $(6ND + 4NF + BHT^2)\,b + 16ND + 8N + T^2$ bytes, derived by hand and equal to
#   what autograd's hooks counted, byte for byte; a block's parameters are $4D^2 + 3DF + 2D$, the
#   last term its two norm gains.
# - A linear layer multiplies the variance by $d_\text{in}\sigma_w^2$: weights start near
#   $1/\sqrt{d_\text{in}}$; the book's fixed {glue:text}`init_std` matches only at $d_\text{in} =$
#   {glue:text}`init_d:,.0f`, and the pre-norm keeps the signal in range anyway.
