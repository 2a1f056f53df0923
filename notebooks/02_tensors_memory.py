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
# **Question.** What is the largest model whose training state fits on 8 H100 80 GB GPUs with AdamW in fp32, and
# how much larger does it get with bf16 mixed precision?

# %% tags=["remove-cell"]
# Colab or a fresh kernel: install the book's library when it is missing (a no-op in the book's own environment).
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("mlsys") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+https://github.com/mlsys-book/mlsys-book.git"], check=True)

# %%
from mlsys import env

print(env.describe())

# %%
import io
import itertools
import math

import einops
import matplotlib.pyplot as plt
import torch
from beartype import beartype
from IPython.display import display
from jaxtyping import jaxtyped

from mlsys import hardware, plotting
from mlsys.accounting import memory
from mlsys.accounting.params import count_params, param_counts
from mlsys.book import Table, glue
from mlsys.models.config import PRESETS, TransformerConfig
from mlsys.models.train import state_after_one_step, training_state_bytes
from mlsys.models.transformer import Transformer
from mlsys.tensors import (
    contiguous_strides,
    element_offset,
    flattens_to_view,
    is_contiguous,
    matmul_shape,
    merge_heads,
    shares_storage,
    split_heads,
)

# %% tags=["parameters"]
SEED = 0
N_DEVICES = 8  # the GPUs of the question
ACCELERATOR = hardware.H100_SXM  # their memory: ACCELERATOR.hbm_bytes
DEMO_SHAPE = (2, 3, 4)  # the small tensor whose strides we take apart
MEASURE_PRESET = env.pick(smoke="debug", cpu="debug", gpu="small")  # the model trained for one step
BATCH, SEQ = env.pick(smoke=(2, 16), cpu=(4, 64), gpu=(8, 256))  # its batch: sequences x tokens
ASIDE_PRESET, ASIDE_BATCH = "2.7B", 8  # the activation aside: sequences of full context per GPU


# %% [markdown]
# This chapter has two halves that meet at one number. The first half takes a tensor apart: a block of
# bytes (the *storage*) plus a little metadata (shape, strides, offset) that says where each element lives.
# That is what makes transposes free, `.view` fail, and `torch.save` of a small slice write a large file.
# The second half counts the bytes that training keeps for every parameter, predicts from that count the
# largest model that fits in a given amount of memory, and checks the prediction against the tensors of a
# real training step.
#
# ## Napkin math
#
# Training with AdamW {cite}`loshchilov2019adamw` keeps, for every parameter, the weight, its gradient, and
# the optimizer's two moment estimates $m$ and $v$. Mixed precision {cite}`micikevicius2018mixed` stores
# weights and gradients in 16 bits, but keeps an fp32 *master* copy of the weights for the update, and fp32
# moments. `mlsys.accounting.memory` names these recipes; each fixes the bytes one parameter costs:

# %%
display(Table(
    ["recipe", "weights", "grads", "master", "optimizer", "bytes/param"],
    [[f"`{r.name}`", *r.breakdown().values(), r.bytes_per_param] for r in memory.RECIPES.values()],
))

# %% [markdown]
# The mixed-precision recipe halves the bytes of the weights and of the gradients, and spends exactly what
# it saved on the fp32 master copy: its total equals fp32 AdamW's (the "16Ψ" for Ψ parameters of the ZeRO
# paper {cite}`rajbhandari2020zero`). So the prediction for the question is the same number twice:

# %%
GB = hardware.GIGA  # bytes per (spec-sheet) gigabyte; also 1e9 parameters = one billion
hbm_bytes = ACCELERATOR.hbm_bytes
max_fp32 = memory.max_trainable_params(N_DEVICES, hbm_bytes, "fp32_adamw")
max_mixed = memory.max_trainable_params(N_DEVICES, hbm_bytes, "bf16_mixed_adamw")
adamw_bytes_per_param = memory.recipe("fp32_adamw").bytes_per_param
assert adamw_bytes_per_param == memory.recipe("bf16_mixed_adamw").bytes_per_param == 16
assert max_mixed == max_fp32 == N_DEVICES * int(hbm_bytes) // adamw_bytes_per_param

glue("n_devices", N_DEVICES)
glue("accelerator", ACCELERATOR.name)
glue("hbm_gb", hbm_bytes / GB)
glue("adamw_bytes_per_param", adamw_bytes_per_param)
glue("max_fp32_billion", max_fp32 / GB)
glue("max_mixed_billion", max_mixed / GB)
print(f"{N_DEVICES} x {ACCELERATOR.name} ({hbm_bytes / GB:.0f} GB each)")
print(f"fp32 AdamW:       {max_fp32:,} parameters")
print(f"bf16 mixed AdamW: {max_mixed:,} parameters")

# %% [markdown]
# {glue:text}`n_devices` GPUs of {glue:text}`hbm_gb:.0f` GB hold the model states of at most
# {glue:text}`max_fp32_billion:.1f` billion parameters with fp32 AdamW, and of
# {glue:text}`max_mixed_billion:.1f` billion with bf16 mixed precision: **mixed precision does not move the
# answer at all.** What it buys is smaller activations and faster matrix multiplies, not smaller model
# states. The rest of the chapter checks this prediction byte by byte and then asks what it leaves out. To
# count bytes we first need to know what a tensor is.
#
# ## A tensor is a storage plus strides
#
# A PyTorch tensor is a view into a one-dimensional block of memory, its *storage*. Three pieces of metadata
# map an index to a place in that block: the **shape**, the **strides** (how many elements to skip to move
# one step along each dimension) and the **storage offset** (where element 0 sits)
# {cite}`pytorch_tensor_views`.
#
# ### Bytes of a tensor
#
# A freshly allocated tensor owns a storage of exactly `numel × element_size` bytes, which is what the pure
# accounting function `tensor_bytes(shape, dtype)` predicts without touching torch. We check it on an
# activation of the {glue:text}`measure_preset` model, shape (batch, seq, d_model), in several dtypes:

# %%
cfg = TransformerConfig.preset(MEASURE_PRESET)
glue("measure_preset", MEASURE_PRESET)
shape = (BATCH, SEQ, cfg.d_model)
rows = []
for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
    t = torch.zeros(shape, dtype=dtype)
    predicted = memory.tensor_bytes(shape, dtype)
    assert predicted == t.numel() * t.element_size() == t.untyped_storage().nbytes()
    storage = t.untyped_storage().nbytes()
    rows.append([str(dtype), shape, t.element_size(), f"{predicted:,}", f"{storage:,}"])
display(Table(["dtype", "shape", "bytes/element", "tensor_bytes", "storage nbytes"], rows))

# %% [markdown]
# A view is different: it has its own shape but shares its parent's storage. The last token's activations
# `x[:, -1]` are a small tensor that keeps the whole block alive:

# %%
x = torch.randn(shape, generator=torch.Generator().manual_seed(SEED))
last = x[:, -1]  # (batch, d_model), a view
slice_bytes = glue("slice_bytes", memory.tensor_bytes(last.shape, last.dtype))
storage_bytes = glue("slice_storage_bytes", last.untyped_storage().nbytes())
assert last.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
assert storage_bytes == memory.tensor_bytes(x.shape, x.dtype) == SEQ * slice_bytes
assert last.clone().untyped_storage().nbytes() == slice_bytes  # a copy owns only what it shows
print(f"x[:, -1]: {slice_bytes:,} bytes of data, holding a storage of {storage_bytes:,} bytes")

# %% [markdown]
# The slice shows {glue:text}`slice_bytes:,` bytes but pins {glue:text}`slice_storage_bytes:,`. Keeping
# such slices around (a list of last-token logits, say) keeps every parent alive; `.clone()` cuts the tie.
# Exercise Q5 shows that `torch.save` writes the whole storage too.
#
# ### Indexing is pointer arithmetic
#
# Element `index` of a tensor sits at storage position
#
# $$\text{offset}(i_0, \ldots, i_{n-1}) = \text{storage\_offset} + \sum_d i_d \cdot \text{stride}_d ,$$
#
# counted in elements (multiply by the element size for bytes). That is all `element_offset` does:
#
# ```{literalinclude} ../lib/mlsys/tensors.py
# :pyobject: element_offset
# ```
#
# A fresh tensor is laid out row-major: the last dimension has stride 1 and each earlier stride is the
# product of the sizes after it (`contiguous_strides`). Views change only the metadata. We build a base
# tensor whose values *are* their storage positions (`arange`), take several views of it, and compare the
# formula with what PyTorch reports: `t[index].storage_offset()`, and the distance in bytes between the
# element's address and the start of the storage (`data_ptr`).

# %%
base = torch.arange(math.prod(DEMO_SHAPE), dtype=torch.float32).reshape(DEMO_SHAPE)
assert base.stride() == contiguous_strides(DEMO_SHAPE)
views = {
    "base": base,
    "transpose(0, 2)": base.transpose(0, 2),
    "permute(2, 0, 1)": base.permute(2, 0, 1),
    "[:, ::2, 1:]": base[:, ::2, 1:],
    "[1:, :1].expand": base[1:, :1].expand(-1, DEMO_SHAPE[1], -1),
}
rows = []
for name, v in views.items():
    for index in itertools.product(*(range(n) for n in v.shape)):
        predicted = element_offset(index, v.stride(), v.storage_offset())
        byte_distance = v[index].data_ptr() - v.untyped_storage().data_ptr()
        assert predicted == v[index].storage_offset() == byte_distance // v.element_size()
        assert predicted == v[index].item()  # arange: the value is its own storage position
    last_index = tuple(n - 1 for n in v.shape)
    rows.append([f"`{name}`", tuple(v.shape), v.stride(), v.storage_offset(), last_index,
                 element_offset(last_index, v.stride(), v.storage_offset()), v.is_contiguous()])
display(Table(["view", "shape", "stride", "offset", "index", "predicted", "contiguous"], rows))

# %% [markdown]
# Every element of every view agrees (the loop asserts all of them; the table shows the last one). Three
# patterns to read off the strides:
#
# - **transpose and permute** reorder the strides: no data moves, so they cost nothing, whatever the size;
# - **a slice with a step** multiplies a stride by the step and moves the offset to the first element kept;
# - **expand** gives the broadcast dimension stride 0: every index along it reads the same element, so a
#   tensor can look much larger than its storage.
#
# ### Views versus copies
#
# Because a view shares storage, writing through it writes into the parent. Two tensors share memory exactly
# when their storages start at the same address:
#
# ```{literalinclude} ../lib/mlsys/tensors.py
# :pyobject: shares_storage
# ```

# %%
parent = base.clone()
view = parent.transpose(0, 2)
view[-1, 0, 0] = -1.0  # writes parent[0, 0, -1]
assert parent[0, 0, -1] == -1.0 and shares_storage(view, parent)
operations = {
    "t.transpose(0, 1)": lambda t: t.transpose(0, 1),
    "t[:, 1]": lambda t: t[:, 1],
    "t.unsqueeze(0).expand(BATCH, -1, -1, -1)": lambda t: t.unsqueeze(0).expand(BATCH, -1, -1, -1),
    "t.view(-1)": lambda t: t.view(-1),
    "t[[0, 1]] (index with a list)": lambda t: t[[0, 1]],
    "t.clone()": lambda t: t.clone(),
}
rows = [[f"`{name}`", shares_storage(op(base), base)] for name, op in operations.items()]
display(Table(["operation", "shares storage (view)"], rows))

# %% [markdown]
# Slicing with integers, ranges and steps gives views; indexing with a list or a tensor of indices
# ("advanced indexing") gathers arbitrary elements, which no stride can describe, so it copies.
#
# ### Contiguity
#
# A tensor is *contiguous* when its strides are the row-major ones for its shape, so that walking the
# elements in index order walks the storage without gaps. PyTorch ignores the stride of a size-1 dimension:
#
# ```{literalinclude} ../lib/mlsys/tensors.py
# :pyobject: is_contiguous
# ```
#
# `.view(new_shape)` never copies: it must express the new shape with new strides over the same storage.
# After a transpose that is impossible for a flat shape, and `.view` refuses:

# %%
transposed = base.transpose(0, 2)
assert not is_contiguous(transposed.shape, transposed.stride()) and not transposed.is_contiguous()

# %%
try:
    transposed.view(-1)
    view_refused = False
except RuntimeError as err:  # in index order the elements are not evenly spaced
    view_refused = True
    print(f"RuntimeError: {err}")
assert view_refused

# %% [markdown]
# `.contiguous()` copies the elements into a fresh storage in row-major order (and returns the tensor itself
# when it is already contiguous):

# %%
fresh = transposed.contiguous()
assert not shares_storage(fresh, base) and fresh.stride() == contiguous_strides(fresh.shape)
assert base.contiguous() is base

# %% [markdown]
# `.reshape` is `.view` when a view is possible and a copy otherwise. When is a flat view possible? When the
# elements in index order are evenly spaced in the storage: every dimension must step exactly over the block
# of the next one. Contiguity is the special case with spacing 1, so contiguous tensors always flatten for
# free, but so does, for example, every other element of a flat tensor:
#
# ```{literalinclude} ../lib/mlsys/tensors.py
# :pyobject: flattens_to_view
# ```

# %%
candidates = {**views, "view(-1)[::2]": base.view(-1)[::2]}
rows = []
for name, v in candidates.items():
    copies = not shares_storage(v.reshape(-1), v)
    assert copies == (not flattens_to_view(v.shape, v.stride())), name
    rows.append([f"`{name}`", v.stride(), v.is_contiguous(), flattens_to_view(v.shape, v.stride()),
                 "copies" if copies else "view"])
display(Table(["tensor", "stride", "contiguous", "flattens_to_view", "reshape(-1)"], rows))

# %% [markdown]
# Copies are where layout costs time: `.contiguous()` on a tensor of $n$ bytes reads $n$ and writes $n$
# bytes of memory, which for large activations is a real kernel (the byte-movement chapters measure it).
#
# ## Broadcasting, einsum and einops
#
# ### Matrix multiplication over leading dimensions
#
# `torch.matmul` treats the last two dimensions as matrices and *broadcasts* all earlier ones: a
# (batch, seq, d_model) activation times a (d_model, d_ff) weight is one (batch·seq, d_model) × (d_model,
# d_ff) product, with no copy of the weight per sequence. `matmul_shape` predicts the result shape from the
# rule, before anything runs:
#
# ```{literalinclude} ../lib/mlsys/tensors.py
# :pyobject: matmul_shape
# ```

# %%
g = torch.Generator().manual_seed(SEED)
heads, d_head = cfg.n_heads, cfg.d_head
cases = {
    "activation @ weight": ((BATCH, SEQ, cfg.d_model), (cfg.d_model, cfg.d_ff)),
    "q @ k^T per head": ((BATCH, heads, SEQ, d_head), (BATCH, heads, d_head, SEQ)),
    "one query vs all heads": ((BATCH, 1, 1, d_head), (heads, d_head, SEQ)),
    "vector @ matrix": ((cfg.d_model,), (cfg.d_model, cfg.d_ff)),
}
rows = []
for name, (a_shape, b_shape) in cases.items():
    predicted = matmul_shape(a_shape, b_shape)
    measured = tuple((torch.randn(a_shape, generator=g) @ torch.randn(b_shape, generator=g)).shape)
    assert predicted == measured, name
    rows.append([name, a_shape, b_shape, predicted, measured])
display(Table(["case", "a", "b", "predicted", "torch.matmul"], rows))

# %% [markdown]
# The broadcast weight behaves like `w.expand(batch, d_model, d_ff)`, a view with stride 0 along the
# batch: no copy of the weight is ever made. And because the weight has no batch dimension, the leading
# dimensions of the activation fold into one big matrix multiply:

# %%
w = torch.randn(cfg.d_model, cfg.d_ff, generator=g)
y = x @ w  # (batch, seq, d_ff)
torch.testing.assert_close(y, (x.reshape(-1, cfg.d_model) @ w).reshape(BATCH, SEQ, cfg.d_ff))
expanded = w.expand(BATCH, -1, -1)
assert expanded.stride()[0] == 0 and shares_storage(expanded, w)
torch.testing.assert_close(y, torch.bmm(x, expanded))

# %% [markdown]
# ### einsum with named dimensions
#
# `einsum` writes a contraction as index names: repeated names on the inputs that are missing from the
# output are summed. `torch.einsum` takes one letter per dimension; einops {cite}`rogozhnikov2022einops`
# accepts whole words, so the book's dimension names can appear in the code, and `...` stands for any
# number of leading dimensions:

# %%
y_letters = torch.einsum("bsd,df->bsf", x, w)
y_named = einops.einsum(x, w, "batch seq d_model, d_model d_ff -> batch seq d_ff")
y_any = einops.einsum(x, w, "... d_model, d_model d_ff -> ... d_ff")
for other in (y_letters, y_named, y_any):
    torch.testing.assert_close(other, y)
one_sequence = einops.einsum(x[0], w, "... d_model, d_model d_ff -> ... d_ff")  # (seq, d_ff)
torch.testing.assert_close(one_sequence, y[0])

# %% [markdown]
# `einops.reduce` names the dimensions a reduction removes, and `einops.rearrange` reshapes and permutes in
# one readable pattern. The mean square over d_model (the heart of RMSNorm) and splitting the model
# dimension into attention heads:

# %%
mean_square = einops.reduce(x**2, "batch seq d_model -> batch seq 1", "mean")
torch.testing.assert_close(mean_square, x.pow(2).mean(dim=-1, keepdim=True))
per_sequence_max = einops.reduce(x, "batch ... -> batch", "max")
torch.testing.assert_close(per_sequence_max, x.flatten(1).amax(dim=1))

# %% [markdown]
# ```{literalinclude} ../lib/mlsys/tensors.py
# :pyobject: split_heads
# ```
#
# `rearrange` returns a view whenever the strides allow one, so splitting the heads is free. Merging them
# back after attention is not: attention's output is a fresh contiguous (batch, heads, seq, d_head) tensor,
# and (heads, d_head) can only become one d_model dimension after heads and seq swap places in memory.

# %%
q = split_heads(x, heads)  # (batch, heads, seq, d_head)
assert q.shape == (BATCH, heads, SEQ, d_head) and shares_storage(q, x) and not q.is_contiguous()
assert shares_storage(merge_heads(q), x)  # undoing the split: still the same bytes
attention_output = torch.randn(BATCH, heads, SEQ, d_head, generator=g)  # as attention returns it
merged = merge_heads(attention_output)
assert merged.shape == (BATCH, SEQ, cfg.d_model) and not shares_storage(merged, attention_output)
torch.testing.assert_close(merged, attention_output.transpose(1, 2).reshape(merged.shape))

# %% [markdown]
# ### Shapes as types: jaxtyping
#
# The signature of `split_heads` above carries its shapes: `Float[Tensor, "batch seq d_model"]` in and
# `Float[Tensor, "batch heads seq d_head"]` out, with the book's dimension names ({ref}`sec-notation`).
# These jaxtyping {cite}`kidger2022jaxtyping` annotations are documentation in the library, where checking
# every call would cost time. The tests (`tests/test_shapes.py`) wrap the public functions with
# `jaxtyped(typechecker=beartype)`, which binds each name to a size on the first argument that uses it and
# checks every later use, including the return value. Wrapped, a call with consistent shapes passes:

# %%
checked_split_heads = jaxtyped(typechecker=beartype)(split_heads)
checked_merge_heads = jaxtyped(typechecker=beartype)(merge_heads)
assert checked_merge_heads(checked_split_heads(x, heads)).shape == x.shape

# %% [markdown]
# and a tensor without the batch dimension fails *before* the function body runs, with a
# `jaxtyping.TypeCheckError` (a `TypeError`) naming the parameter, the annotation and the sizes bound so far:

# %%
try:
    checked_split_heads(x[0], heads)  # (seq, d_model): no batch dimension
except TypeError as error:
    print("\n".join(str(error).splitlines()[:4]))
else:
    raise AssertionError("a (seq, d_model) tensor passed as (batch, seq, d_model)")

# %% [markdown]
# ## Counting parameters
#
# Back to memory. Model states are bytes per parameter times parameters, so we need exact parameter counts.
# `mlsys.accounting.params` counts them from the configuration alone (no torch), component by component;
# the model itself is built on PyTorch's *meta* device, where tensors have shapes and strides but no
# storage, so even the 2.7B model costs no memory and the count `sum(p.numel())` can be compared with the
# formula for every preset:

# %%
GOLDEN_COUNTS = {"small": 128_625_408, "medium": 423_183_360, "large": 969_411_840,
                 "xl": 1_998_235_200, "2.7B": 3_406_809_600}
rows, n_params = [], {}
for name in PRESETS:
    preset = TransformerConfig.preset(name)
    with torch.device("meta"):
        model = Transformer(preset)
    counted = sum(p.numel() for p in model.parameters())
    assert counted == count_params(preset) == model.num_params() == GOLDEN_COUNTS.get(name, counted)
    n_params[name] = counted
    parts = param_counts(preset)
    dims = [preset.d_model, preset.n_layers, preset.n_heads, preset.d_ff, preset.vocab_size]
    counts = [parts.embedding + parts.lm_head, parts.per_layer, parts.total]
    rows.append([f"`{name}`", *dims, *(f"{c:,}" for c in counts)])
display(Table(["preset", "d_model", "n_layers", "n_heads", "d_ff", "vocab", "embedding + head",
                        "per layer", "total"], rows))

# %% [markdown]
# ```{literalinclude} ../lib/mlsys/accounting/params.py
# :pyobject: param_counts
# ```
#
# Each block holds $4d^2$ attention weights and $3 d\, d_\text{ff}$ feed-forward weights; with
# $d_\text{ff} = 4d$ that is $16 d^2$ per layer, and the vocabulary adds $2Vd$ for the untied embedding and
# head.
#
# ## Measurement: the bytes of one training step
#
# The napkin math says fp32 AdamW costs {glue:text}`adamw_bytes_per_param` bytes per parameter. We train the
# {glue:text}`measure_preset` model for one step, then add up `numel × element_size` over every tensor that
# training keeps: the parameters, their `.grad`, and everything in `optimizer.state`. Then the same for a
# model cast to bf16 entirely ("pure bf16"), whose AdamW moments take the parameters' dtype.

# ```{literalinclude} ../lib/mlsys/models/train.py
# :pyobject: training_state_bytes
# ```

# %%
n = count_params(cfg)
rows, measured_per_param = [], {}
for recipe_name, dtype in (("fp32_adamw", torch.float32), ("bf16_pure_adamw", torch.bfloat16)):
    measured = training_state_bytes(*state_after_one_step(cfg, dtype=dtype, batch=BATCH, seq=SEQ, seed=SEED))
    predicted = memory.model_state_breakdown(n, recipe_name)
    assert predicted["master"] == 0  # neither recipe keeps a second copy of the weights
    for kind in ("weights", "grads", "optimizer"):
        assert measured[kind] == predicted[kind], (recipe_name, kind)
    total = sum(measured.values())
    assert measured["step counters"] < 1e-3 * total  # AdamW's step: one scalar per parameter tensor
    measured_per_param[recipe_name] = total / n
    prediction = memory.model_state_bytes(n, recipe_name)
    row = [*measured.values(), total, prediction]
    rows.append([f"`{recipe_name}`", *(f"{b:,}" for b in row), f"{total / prediction:.6f}"])
glue("measured_fp32_per_param", measured_per_param["fp32_adamw"])
glue("measured_bf16_per_param", measured_per_param["bf16_pure_adamw"])
print(f"{MEASURE_PRESET} model: {n:,} parameters; bytes by kind:")
display(Table(["recipe", "weights", "grads", "optimizer", "step counters", "measured total", "predicted",
               "measured / predicted"], rows))

# %% [markdown]
# Weights, gradients and moments match the prediction to the byte. The only extra is AdamW's step count,
# which PyTorch keeps as one 0-dimensional tensor per parameter *tensor* (not per parameter): a few bytes
# per matrix, so the measured total is {glue:text}`measured_fp32_per_param:.5f` bytes per parameter for
# fp32 AdamW and {glue:text}`measured_bf16_per_param:.5f` for pure bf16.
#
# ## Plot: bytes per parameter, and what fits
#
# The first figure stacks each recipe's bytes per parameter by kind of state; the diamonds are the two
# recipes we just measured.

# %% tags=["remove-input"]
adam8bit = memory.TrainingRecipe(  # not in RECIPES: drawn to show what shrinks the bound
    "bf16_mixed_adam8bit", "bf16 weights and grads, fp32 master, 8-bit moments (2 + 2 + 4 + 2)",
    weight_bytes=2, grad_bytes=2, master_bytes=4, optimizer_bytes=2,
)
shown = [*memory.RECIPES.values(), adam8bit]
fig, ax = plotting.subplots(width=7.5, height=4.2)
labels = [r.name for r in shown]
kinds = ("weights", "grads", "master", "optimizer")
parts = {k: [r.breakdown()[k] for r in shown] for k in kinds}
plotting.stacked_bars(ax, labels, parts, ylabel="bytes per parameter")
for name, per_param in measured_per_param.items():
    position = [r.name for r in shown].index(name)
    ax.plot(position, per_param, "D", color=plotting.COLORS["measured"], markeredgecolor="white",
            markersize=9, label="measured" if position == 0 else None)
plt.setp(ax.get_xticklabels(), rotation=20, ha="right", fontsize=8)
plotting.finish(ax, title="Model-state bytes per parameter (prediction: bars; measured: diamonds)")
plt.show()

# %% [markdown]
# The second figure turns bytes per parameter into total model-state bytes as the model grows (one line per
# recipe; fp32 AdamW and bf16 mixed AdamW lie on top of each other), with the book's presets marked on it and
# the memory of one and of {glue:text}`n_devices` {glue:text}`accelerator` GPUs as ceilings. A line crosses a
# ceiling at the largest trainable model.

# %% tags=["remove-input"]
fig, ax = plotting.subplots(width=7.5, height=4.6)
sizes = torch.logspace(5, 12, 60, dtype=torch.float64).tolist()
for color, r in zip(plotting.CYCLE, shown, strict=False):
    style = (0, (4, 4)) if r.name == "bf16_mixed_adamw" else "-"  # dashed: it lies on fp32_adamw
    states_gb = [s * r.bytes_per_param / GB for s in sizes]
    ax.plot(sizes, states_gb, linestyle=style, color=color, label=r.name)
for name, p in n_params.items():
    preset_gb = memory.model_state_bytes(p, "fp32_adamw") / GB
    ax.plot(p, preset_gb, "o", color="white", markeredgecolor=plotting.COLORS["ceiling"],
            label="presets (16 B/param)" if name == "debug" else None)
    ax.annotate(name, (p, preset_gb), xytext=(-6, 6), textcoords="offset points", ha="right", fontsize=7)
for devices, style in ((1, ":"), (N_DEVICES, "-.")):
    ceiling_gb = devices * hbm_bytes / GB
    ax.axhline(ceiling_gb, color=plotting.COLORS["ceiling"], linestyle=style, lw=1,
               label=f"{devices} x {ACCELERATOR.name} ({ceiling_gb:.0f} GB)")
    limit = memory.max_trainable_params(devices, hbm_bytes, "fp32_adamw")
    ax.axvline(limit, color=plotting.COLORS["muted"], linestyle=style, lw=1)
    ax.annotate(f"{limit / GB:.0f}B", (limit, ceiling_gb), xytext=(4, -12), textcoords="offset points",
                fontsize=8)
plotting.finish(ax, title="Model states versus model size", xlabel="parameters",
                ylabel="model states (GB)", logx=True, logy=True)
ax.legend(fontsize=7, loc="upper left")
plt.show()

# %% [markdown]
# The same numbers for the presets, in GB of model state, next to one {glue:text}`accelerator`
# ({glue:text}`hbm_gb:.0f` GB):

# %%
recipes = list(memory.RECIPES.values())
header = ["preset", *[f"{r.name.replace('_', ' ')} ({r.bytes_per_param} B)" for r in recipes]]
rows = [[f"`{name}`", *[f"{memory.model_state_bytes(p, r) / GB:.3g}" for r in recipes]]
        for name, p in n_params.items()]
display(Table(header, rows))
largest_gb = glue("largest_preset_gb", memory.model_state_bytes(n_params["2.7B"], "fp32_adamw") / GB)
assert largest_gb * GB < hbm_bytes

# %% [markdown]
# Every preset's model states fit on a single GPU; the 2.7B model's take {glue:text}`largest_preset_gb:.1f`
# GB with AdamW. That does not mean it trains on one: the rest of memory goes to what the accounting leaves
# out.
#
# ## What shrinks the answer, and what it leaves out
#
# Mixed precision leaves the answer where it was, so what *does* change it? Only fewer bytes per parameter:
# moments stored in bf16 (pure bf16, which then needs care such as stochastic rounding or compensated
# summation {cite}`kahan1965summation` to keep small updates from vanishing), or 8-bit optimizer states {cite}`dettmers2022optimizers`
# (the `bf16_mixed_adam8bit` bar: two one-byte moments, plus block-wise scales this count ignores).
# Sharding is *already* assumed by `max_trainable_params`: it counts every device's memory towards one
# model, which is true only if each device keeps 1/{glue:text}`n_devices` of the states (ZeRO stage 3
# {cite}`rajbhandari2020zero` or FSDP {cite}`zhao2023fsdp`). With plain data parallelism every GPU holds
# everything, and the answer is what one GPU can hold:

# %%
rows = []
for r in shown:
    sharded = memory.max_trainable_params(N_DEVICES, hbm_bytes, r)
    replicated = memory.max_trainable_params(1, hbm_bytes, r)
    assert replicated == int(hbm_bytes) // r.bytes_per_param  # floor(memory / bytes per parameter)
    assert sharded == N_DEVICES * int(hbm_bytes) // r.bytes_per_param
    rows.append([f"`{r.name}`", r.bytes_per_param, f"{sharded / GB:.1f}", f"{replicated / GB:.2f}"])
max_pure_bf16 = memory.max_trainable_params(N_DEVICES, hbm_bytes, "bf16_pure_adamw")
assert max_pure_bf16 == 2 * max_fp32  # half the bytes per parameter, twice the parameters
glue("max_one_gpu_billion", memory.max_trainable_params(1, hbm_bytes, "fp32_adamw") / GB)
glue("max_pure_bf16_billion", max_pure_bf16 / GB)
display(Table(["recipe", "bytes/param", f"max params (billions), {N_DEVICES} GPUs sharded",
               "max params (billions), replicated (1 GPU)"], rows))

# %% [markdown]
# Without sharding, one {glue:text}`hbm_gb:.0f` GB GPU holds the states of about
# {glue:text}`max_one_gpu_billion:.1f` billion parameters, however many GPUs train together. Pure bf16
# AdamW doubles the sharded answer to {glue:text}`max_pure_bf16_billion:.1f` billion.
#
# Even the sharded answer is an upper bound. It leaves out:
#
# - **Activations**, the tensors the forward pass saves for the backward pass. They grow with batch × seq ×
#   d_model × n_layers and often exceed the model states; mixed precision halves them (that is one of its
#   real savings) and activation checkpointing trades them for recomputation. A single saved tensor per
#   layer already adds up, as the next cell shows.
# - **Temporary buffers**: the logits and their gradient, communication buckets for sharding (ZeRO-3
#   gathers each layer's full weights before using them), and the gradient of whatever is being computed.
# - **Allocator fragmentation**: the caching allocator rounds and splits blocks, so memory that is free in
#   total may not be free in one piece.
# - **The CUDA context and library workspaces** (cuBLAS, NCCL), typically hundreds of MB per GPU before the
#   first tensor; and the {glue:text}`hbm_gb:.0f` GB of the spec sheet is a little more than a program can use.

# %%
aside = TransformerConfig.preset(ASIDE_PRESET)
tokens_shape = (ASIDE_BATCH, aside.context_length)
logits_bytes = memory.tensor_bytes((*tokens_shape, aside.vocab_size), "fp32")
residual_bytes = aside.n_layers * memory.tensor_bytes((*tokens_shape, aside.d_model), "bf16")
glue("aside_preset", ASIDE_PRESET)
glue("aside_batch", ASIDE_BATCH)
glue("aside_logits_gb", logits_bytes / GB)
glue("aside_residual_gb", residual_bytes / GB)
print(f"{ASIDE_PRESET}, {tokens_shape} tokens: fp32 logits {logits_bytes / GB:.2f} GB; "
      f"one bf16 (batch, seq, d_model) per layer {residual_bytes / GB:.2f} GB")

# %% [markdown]
# For the {glue:text}`aside_preset` model with {glue:text}`aside_batch` sequences of full context per GPU,
# the fp32 logits alone take {glue:text}`aside_logits_gb:.2f` GB (and their gradient as much again), and
# keeping just the input of every layer in bf16 takes {glue:text}`aside_residual_gb:.2f` GB; a real layer
# saves several such tensors, some d_ff wide. The activation and mixed-precision chapters count them.
#
# ```{admonition} Takeaway
# :class: tip
# AdamW costs {glue:text}`adamw_bytes_per_param` bytes per parameter in fp32 *and* in bf16 mixed precision,
# so {glue:text}`n_devices` {glue:text}`accelerator` GPUs hold the model states of at most
# {glue:text}`max_fp32_billion:.1f` billion parameters either way, and only if the states are sharded
# (about {glue:text}`max_one_gpu_billion:.1f` billion without sharding). Only cheaper optimizer state moves
# the bound (pure bf16 AdamW: {glue:text}`max_pure_bf16_billion:.1f` billion), and activations, buffers and
# the CUDA context all come out of it.
# ```
#
# ## Exercises
#
# ### Q1 [Adam moments of the xl model]
#
# How many bytes do the two fp32 AdamW moments of the `xl` preset take, and what fraction of one
# {glue:text}`accelerator` is that?

# %% tags=["hide-input"]
xl_params = count_params(TransformerConfig.preset("xl"))
xl_moments_bytes = memory.model_state_breakdown(xl_params, "fp32_adamw")["optimizer"]
assert xl_moments_bytes == 2 * 4 * 1_998_235_200  # m and v, 4 bytes each, per parameter
glue("xl_params", xl_params)
glue("xl_moments_gb", xl_moments_bytes / GB)
glue("xl_moments_fraction", xl_moments_bytes / hbm_bytes)
xl_weights_grads_bytes = memory.model_state_bytes(xl_params, "fp32_adamw") - xl_moments_bytes
glue("xl_weights_grads_gb", xl_weights_grads_bytes / GB)
print(f"{xl_moments_bytes:,} bytes = {xl_moments_bytes / GB:.1f} GB "
      f"= {xl_moments_bytes / hbm_bytes:.0%} of one {ACCELERATOR.name}")

# %% [markdown]
# ```{dropdown} Answer
# Two moments × 4 bytes × {glue:text}`xl_params:,` parameters = {glue:text}`xl_moments_gb:.1f` GB,
# {glue:text}`xl_moments_fraction:.0%` of one {glue:text}`hbm_gb:.0f` GB GPU, before the fp32 weights and
# gradients (another {glue:text}`xl_weights_grads_gb:.1f` GB). The cell above computes it with
# `model_state_breakdown`.
# ```
#
# ### Q2 [The stride of a permuted tensor]
#
# A contiguous tensor has shape (batch, seq, heads, d_head) = (2, 3, 4, 5). What are the strides of
# `t.permute(0, 2, 1, 3)`, is the result contiguous, and at which storage position is its element
# `[1, 2, 0, 3]`?

# %% tags=["hide-input"]
t = torch.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
strides = contiguous_strides(t.shape)  # (60, 20, 5, 1)
permuted_strides = tuple(strides[d] for d in (0, 2, 1, 3))  # a permute permutes the strides
p = t.permute(0, 2, 1, 3)
assert p.stride() == permuted_strides == (60, 5, 20, 1)
assert not is_contiguous(p.shape, p.stride()) and not p.is_contiguous()
position = element_offset((1, 2, 0, 3), p.stride(), p.storage_offset())
assert position == 1 * 60 + 2 * 5 + 0 * 20 + 3 == p[1, 2, 0, 3].item()
glue("q2_strides", str(strides))
glue("q2_permuted_strides", str(p.stride()))
glue("q2_position", position)
print(p.stride(), position)

# %% [markdown]
# ```{dropdown} Answer
# The strides permute with the dimensions: {glue:text}`q2_strides` becomes {glue:text}`q2_permuted_strides`,
# which is not row-major, so the result is not contiguous. Element [1, 2, 0, 3] sits at
# 1·60 + 2·5 + 0·20 + 3 = {glue:text}`q2_position`.
# ```
#
# ### Q3 [One H200, pure bf16]
#
# What is the largest model whose pure-bf16 AdamW model states fit on a single H200? Use
# `mlsys.hardware.H200_SXM`.

# %% tags=["hide-input"]
h200_max = memory.max_trainable_params(1, hardware.H200_SXM.hbm_bytes, "bf16_pure_adamw")
pure_bf16_bytes_per_param = memory.recipe("bf16_pure_adamw").bytes_per_param
assert h200_max == int(hardware.H200_SXM.hbm_bytes) // pure_bf16_bytes_per_param == 17_625_000_000
glue("h200_gb", hardware.H200_SXM.hbm_bytes / GB)
glue("pure_bf16_bytes_per_param", pure_bf16_bytes_per_param)
glue("h200_max_billion", h200_max / GB)
print(f"{h200_max:,} parameters ({h200_max / GB:.2f} billion)")

# %% [markdown]
# ```{dropdown} Answer
# {glue:text}`h200_gb:.0f` GB / {glue:text}`pure_bf16_bytes_per_param` bytes per parameter = {glue:text}`h200_max_billion:.2f` billion parameters, an upper bound for the same reasons as above
# (no activations, buffers or CUDA context), and with pure bf16's accuracy caveats.
# ```
#
# ### Q4 [Batched attention scores with einsum]
#
# Given `q` and `k` of shape (batch, heads, seq, d_head), write the attention scores
# $s_{bhij} = \sum_d q_{bhid} k_{bhjd}$ (shape (batch, heads, seq, seq)) with `einops.einsum` and named
# dimensions, and check it against a matmul. What shape does `matmul_shape` predict?

# %% tags=["hide-input"]
q, k = torch.randn(2, BATCH, heads, SEQ, d_head, generator=g)
pattern = "batch heads seq_q d_head, batch heads seq_k d_head -> batch heads seq_q seq_k"
scores = einops.einsum(q, k, pattern)
torch.testing.assert_close(scores, q @ k.transpose(-2, -1))
predicted_shape = matmul_shape(q.shape, k.transpose(-2, -1).shape)
assert tuple(scores.shape) == predicted_shape == (BATCH, heads, SEQ, SEQ)
print(tuple(scores.shape))

# %% [markdown]
# ```{dropdown} Answer
# `einops.einsum(q, k, "batch heads seq_q d_head, batch heads seq_k d_head -> batch heads seq_q seq_k")`:
# the two sequence positions need different names, and d_head, missing from the output, is summed. The
# matmul version needs `k.transpose(-2, -1)`, a free view; batch and heads are broadcast leading dimensions.
# ```
#
# ### Q5 [What does torch.save write for a slice?]
#
# Take the fp32 logits of the measurement's batch, shape (batch, seq, vocab), and save only the last
# position's logits, `logits[:, -1]`, with `torch.save` to an in-memory buffer. How many bytes are written,
# compared with the slice's own bytes? What changes with `.clone()`?

# %% tags=["hide-input"]
logits = torch.randn(BATCH, SEQ, cfg.vocab_size, generator=g)
written = {}
for name, tensor in (("view", logits[:, -1]), ("clone", logits[:, -1].clone())):
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    written[name] = buffer.getbuffer().nbytes
slice_only = memory.tensor_bytes((BATCH, cfg.vocab_size), "fp32")
assert written["view"] > memory.tensor_bytes(logits.shape, "fp32") > written["clone"] > slice_only
print(f"slice {slice_only:,} B; saved: view {written['view']:,} B, clone {written['clone']:,} B")

# %% [markdown]
# ```{dropdown} Answer
# `torch.save` stores storages, so that views saved together are still views after loading
# {cite}`pytorch_serialization`: the view writes its parent's whole storage, seq times the slice's bytes
# (plus a small archive header). The clone owns only its own bytes and writes just those.
# ```
#
# ## Summary
#
# - A tensor is a storage plus shape, strides and an offset; element `index` sits at
#   `storage_offset + Σ index[d]·stride[d]`, which `element_offset` computes and PyTorch confirms.
# - Transpose, permute, slicing and expand are views (metadata only); advanced indexing, `.clone()` and
#   `.contiguous()` on a non-contiguous tensor copy; `.view` refuses what needs a copy, `.reshape` copies
#   only then.
# - A small view keeps its parent's whole storage alive, and `torch.save` writes all of it.
# - `matmul` broadcasts leading dimensions; einsum and einops name dimensions (`...` for any leading ones);
#   jaxtyping puts the names in signatures, and the tests check them at run time.
# - Model states cost {glue:text}`adamw_bytes_per_param` bytes per parameter with AdamW in fp32 or bf16
#   mixed precision alike: at most {glue:text}`max_fp32_billion:.1f` billion parameters on
#   {glue:text}`n_devices` × {glue:text}`hbm_gb:.0f` GB, only when sharded, before activations, buffers,
#   fragmentation and the CUDA context.
