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
# (sec-mixed-precision)=
# # Mixed precision
#
# **Question.** An H100's bf16 matrix units run {glue:text}`q_peak_ratio:.0f` times faster than its
# fp32 ones, and a bf16 number takes half the bytes; yet mixed-precision AdamW keeps
# {glue:text}`q_mixed_bpp` bytes per parameter, as many as fp32 AdamW. Which tensors really change
# dtype under autocast, which computations must stay in fp32 and why, how is fp16's narrow range
# survived, and how much time and memory does it save for the book's presets, measured?

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

# %%
from mlsys import env

print(env.describe())

# %%
import matplotlib.pyplot as plt
import torch
from IPython.display import display

from mlsys import experiments, hardware, plotting, policies
from mlsys.accounting import activations, flops, memory
from mlsys.accounting.params import count_params
from mlsys.book import Table, glue, num
from mlsys.experiments import (
    amp_memory,
    amp_speed,
    autocast_dtypes,
    autocast_overhead,
    mixed_precision,
)
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.numerics import norm_numerics as norms
from mlsys.numerics.weight_updates import adam_first_step_stalls, stall_threshold

# %% tags=["parameters"]
SEED = 0
# Napkin math (nothing measured): the device and the model of the predictions
SPEC, PRESET, BATCH, SEQ = hardware.H100_SXM, "xl", 4, 1_024
EPSILONS = (1e-5, 1e-6, 1e-8)
NORM_D = 4_096  # the width of the overflow example
STALL_LR = 1e-5
# Live numerics on the debug model (cheap on any machine)
LOSS_SCALES = (1.0, 2.0**8, 2.0**16)
STAGNATION_STEPS = 40
# Measurements: sizes per profile live with each experiment (lib/mlsys/experiments/)
DTYPES = env.pick(**autocast_dtypes.SIZES)
SPEED = env.pick(**amp_speed.SIZES)
OVERHEAD = env.pick(**autocast_overhead.SIZES)
MEMORY = env.pick(**amp_memory.SIZES)
print(DTYPES, SPEED, OVERHEAD, MEMORY, sep="\n")

# %% [markdown]
# Chapter 01 showed what 16-bit formats keep and lose; chapter 02 priced each training recipe in
# bytes per parameter. Mixed precision puts the two together: run the matmuls, where the FLOPs are,
# in a 16-bit format on the matrix units, and keep in fp32 what needs its range or its precision
# {cite}`micikevicius2018mixed`. This chapter measures which is which.
#
# ## Napkin math
#
# ### What it can buy
#
# Two things get cheaper: matmul FLOPs (the bf16 peak against the fp32 and TF32 peaks) and the bytes
# of every tensor stored in 16 bits. Model states need not be among them: the recipes of
# `accounting.memory`, each a runnable `training` policy under the same name:

# %%
spec_fp32, spec_tf32, spec_bf16 = (SPEC.peak_flop_per_s(dt) for dt in ("fp32", "tf32", "bf16"))
glue("q_peak_ratio", spec_bf16 / spec_fp32)
glue("tf32_ratio", spec_bf16 / spec_tf32)
glue("spec_name", SPEC.name)
cfg = TransformerConfig.preset(PRESET)
n_params = count_params(cfg)
recipe_rows = []
for name, pol in policies.POLICIES.items():
    assert pol.breakdown() == memory.recipe(name).breakdown()  # one name, the same bytes
    recipe_rows.append([f"`{name}`", pol.param_dtype, pol.grad_dtype, pol.master_dtype or "-",
                        pol.optimizer, memory.recipe(name).bytes_per_param,
                        num(memory.model_state_bytes(n_params, name) / 1e9)])
glue("q_mixed_bpp", memory.recipe("bf16_mixed_adamw").bytes_per_param)
assert memory.recipe("bf16_mixed_adamw").bytes_per_param == memory.recipe(
    "fp32_adamw").bytes_per_param
glue("xl_params_b", n_params / 1e9)
Table(["policy = recipe", "weights", "gradients", "master", "optimizer", "B/param",
       f"{PRESET} states (GB)"], recipe_rows)

# %% [markdown]
# On the {glue:text}`spec_name` bf16 matmuls run {glue:text}`q_peak_ratio:.0f` times faster than
# fp32 on CUDA cores and {glue:text}`tf32_ratio:.0f` times faster than TF32. The mixed recipe trades
# 4 bytes of fp32 weights for 2 of bf16 weights *plus* 4 of an fp32 master copy, and halves the
# gradients: 16 bytes per parameter, like fp32 AdamW. What shrinks is the activations saved for the
# backward, the ones the matmuls read. For {glue:text}`napkin_model`, per training step:

# %%
saved32 = activations.saved_bytes(cfg, BATCH, SEQ, dtype="fp32")
saved16 = activations.saved_bytes(cfg, BATCH, SEQ, dtype="bf16")
glue("napkin_model", f"`{PRESET}` at {BATCH} × {SEQ:,} tokens")
napkin_rows = []
for label, states, saved in (("fp32 AdamW", "fp32_adamw", saved32),
                             ("bf16 mixed AdamW", "bf16_mixed_adamw", saved16),
                             ("pure bf16 AdamW", "bf16_pure_adamw", saved16)):
    s = memory.model_state_bytes(n_params, states)
    napkin_rows.append([label, num(s / 1e9), num(saved.total_bytes / 1e9),
                        num((s + saved.total_bytes) / 1e9)])
mixed_total = memory.model_state_bytes(n_params, "bf16_mixed_adamw") + saved16.total_bytes
fp32_total = memory.model_state_bytes(n_params, "fp32_adamw") + saved32.total_bytes
glue("mixed_over_fp32", mixed_total / fp32_total)
assert 0.5 < mixed_total / fp32_total < 1
Table(["recipe", "model states (GB)", "saved activations (GB)", "sum (GB)"], napkin_rows)

# %% [markdown]
# The mixed recipe's sum is {glue:text}`mixed_over_fp32:.2f`× fp32's: "half the bytes" holds for
# the activations (RMSNorm keeps its statistics in fp32, so not quite), not for the step.
#
# ### What fp16's range and bf16's precision cost
#
# fp16 keeps 10 mantissa bits and 5 exponent bits: values from $6.0 \times 10^{-8}$ (subnormal) to
# 65,504. bf16 keeps fp32's 8 exponent bits and 7 mantissa bits. Three consequences, each computed
# by `mlsys.numerics.norm_numerics` and `mlsys.numerics.weight_updates`:

# %%
eps_rows = []
for eps in EPSILONS:
    for fmt in ("fp16", "bf16", "fp32"):
        f = norms.eps_facts(eps, fmt)
        eps_rows.append([f"{eps:g}", fmt, f"{f.stored:.6g}", f.kind, f"{f.rel_error:.2%}",
                         f"{f.absorbed_from:g}"])
e16, e_bf = norms.eps_facts(1e-5, "fp16"), norms.eps_facts(1e-5, "bf16")
assert e16.kind == "subnormal" and e16.stored == e_bf.stored  # subnormal, yet as good as bf16's
overflow_rms = norms.square_overflow_rms(NORM_D, "fp16")
flush = norms.square_flush_below("fp16")
stall = stall_threshold(1.0, "bf16")
for name, value in {"eps16_stored": e16.stored, "eps16_err": 100 * e16.rel_error,
                    "eps_absorbed16": e16.absorbed_from, "eps_absorbed_bf": e_bf.absorbed_from,
                    "overflow_rms": overflow_rms, "norm_d": f"{NORM_D:,}", "flush": flush,
                    "stall_one": stall, "stall_lr": f"{STALL_LR:g}"}.items():
    glue(name, value)
Table(["eps", "format", "stored as", "kind", "error", "absorbed by mean squares ≥"], eps_rows)

# %% [markdown]
# - **Epsilon.** The seed says 1e-5 is hard to represent in fp16 because its smallest *normal*
#   number is $6.1 \times 10^{-5}$. 1e-5 is subnormal there, but stored as
#   {glue:text}`eps16_stored:.6g` ({glue:text}`eps16_err:.2f`% off), the very value bf16 stores.
#   What matters is when adding it changes anything: every mean square from
#   {glue:text}`eps_absorbed16:g` up absorbs it in fp16 ({glue:text}`eps_absorbed_bf:g` in bf16).
#   Only far smaller values (1e-8) vanish in fp16.
# - **Squares.** A row of {glue:text}`norm_d` values whose rms exceeds {glue:text}`overflow_rms:.1f`
#   overflows fp16's sum of squares ($\sqrt{65504/d}$), and the normalizer comes out
#   $1/\sqrt{\infty} = 0$: finite and wrong. Squares of $|x| <$ {glue:text}`flush:.2e` flush to 0.
#   bf16 has neither problem.
# - **Updates.** A bf16 weight $w$ moves only if the update reaches half its spacing: for $w = 1$,
#   {glue:text}`stall_one:.2e`. AdamW's first steps move every weight by about the learning rate, so
#   at {glue:text}`stall_lr` most weights do not move at all (chapter 01's plateau).
#
# ## The code
#
# A policy names every dtype of a step; `make_policy_step` runs it (the master copy, the casts, the
# loss scale), and a test checks that the bytes it holds equal the recipe's, policy by policy:
#
# ```{literalinclude} ../lib/mlsys/policies.py
# :pyobject: PrecisionPolicy.breakdown
# ```
#
# Dynamic loss scaling multiplies the loss by $S$ so that small gradients survive fp16's range,
# divides them back before the update, and adapts $S$: an overflow skips the step and halves it, a
# run of good steps doubles it {cite}`micikevicius2018mixed`:
#
# ```{literalinclude} ../lib/mlsys/numerics/loss_scaling.py
# :pyobject: DynamicLossScaler.update
# ```
#
# ## Measurement
#
# ### What autocast really does
#
# `dtype_recorder.DtypeRecorder` watches every op of a forward and backward (a `TorchDispatchMode`)
# and records, per module, the dtypes of parameters, matmul inputs, outputs and gradients. The
# seed's toy model (fc1 → ReLU → LayerNorm → fc2) under autocast on this device:

# %%
dtype_rows = autocast_dtypes.run(DTYPES)
seed_items = autocast_dtypes.seed_check(dtype_rows)
glue("seed_ln", seed_items["ln output"])
glue("seed_grads", seed_items["gradients"])
display(autocast_dtypes.table(dtype_rows))
Table(["item (fp16 autocast)", "measured here, against the seed's answer"],
      [[k, v] for k, v in seed_items.items()])

# %% [markdown]
# The parameters stay fp32 (autocast casts copies, not weights), the matmuls read 16-bit copies and
# write 16-bit outputs, the loss is fp32, and the gradients are stored in fp32
# ({glue:text}`seed_grads`), though the matmul weight gradients hold only 16-bit values: the
# backward matmul ran in 16 bits and was cast up. LayerNorm's output here: {glue:text}`seed_ln`.
# Autocast's op lists differ by device (on CUDA layer_norm and softmax run in fp32; this CPU's list
# keeps them in the input's dtype), which is why the table is recorded, not copied. The book's
# transformer:

# %%
autocast_dtypes.table(dtype_rows, model="transformer")

# %% [markdown]
# ### Normalization in low precision
#
# The inputs of every RMSNorm of the debug model, captured, normalized in fp16 and bf16 (squares,
# sum and mean in the 16-bit format, summed by PyTorch's reduction, which accumulates in fp32, or
# one addition at a time, as a kernel with a 16-bit accumulator would), against float64:

# %%
torch.manual_seed(SEED)
debug = Transformer(TransformerConfig.preset("debug"))
debug.init_weights(seed=SEED)
tokens = torch.randint(debug.config.vocab_size, (8, 64), generator=torch.Generator()
                       .manual_seed(SEED))
inputs = norms.norm_inputs(debug, tokens)
x_all = torch.cat([t.flatten(0, -2) for t in inputs.values()])
norm_rows = norms.norm_errors(x_all)
by = {(r["dtype"], r["accumulate"]): r for r in norm_rows}
glue("norm_bf16_seq", 100 * by[("bf16", "sequential")]["median_rel_error"])
glue("norm_bf16_torch", 100 * by[("bf16", "torch")]["median_rel_error"])
glue("norm_fp16_torch", 100 * by[("fp16", "torch")]["median_rel_error"])
glue("norm_flushed", 100 * by[("fp16", "torch")]["squares_flushed"])
plateau = norms.rms_inv(torch.ones(1, NORM_D), "bf16", accumulate="sequential").item()
assert by[("bf16", "sequential")]["median_rel_error"] > 1.5 * by[("bf16", "torch")][
    "median_rel_error"] and plateau > 1.5  # the 16-bit accumulator, not the format, is the issue
glue("plateau_scale", plateau)
Table(["dtype", "summed", "median error of 1/rms", "max error", "rows overflowed",
       "squares flushed to 0"],
      [[r["dtype"], r["accumulate"], f"{r['median_rel_error']:.2%}",
        f"{r['max_rel_error']:.2%}", f"{r['overflowed_rows']:.1%}",
        f"{r['squares_flushed']:.2%}"] for r in norm_rows])

# %% [markdown]
# With PyTorch's reductions the normalizer is off by a median {glue:text}`norm_fp16_torch:.2f`% in
# fp16 and {glue:text}`norm_bf16_torch:.2f`% in bf16: one rounding of each step. Summed in bf16 one
# term at a time the error is {glue:text}`norm_bf16_seq:.2f`%, and on a row of {glue:text}`norm_d`
# ones the computed $1/\mathrm{rms}$ is {glue:text}`plateau_scale:.3g`, not 1: the running sum stops
# growing (chapter 01). In fp16, {glue:text}`norm_flushed:.2f`% of these squares flush to zero. So
# under bf16 the norms need an fp32 *accumulator* but not fp32 range; under fp16 they need both, as
# the RMSNorm of the book's model does by upcasting its input.
#
# ### Loss scaling
#
# One batch of the debug model, backward in fp16 against fp32, gradient by gradient, for three loss
# scales:

# %%
under = mixed_precision.gradient_underflow(scales=LOSS_SCALES)
summary = []
for scale in LOSS_SCALES:
    mine = [r for r in under if r["scale"] == scale]
    total = sum(r["numel"] for r in mine)
    summary.append([f"{scale:g}", *(f"{sum(r[k] * r['numel'] for r in mine) / total:.3%}"
                                    for k in ("flushed", "subnormal", "overflowed")),
                    f"{max(r['median_rel_error'] for r in mine):.2%}"])
worst_layer = max((r for r in under if r["scale"] == 1.0), key=lambda r: r["subnormal"])
glue("under_layer", worst_layer["parameter"])
glue("under_layer_sub", 100 * worst_layer["subnormal"])
scaled = next(r for r in under if r["scale"] == LOSS_SCALES[1]
              and r["parameter"] == worst_layer["parameter"])
assert scaled["subnormal"] < worst_layer["subnormal"]
glue("under_layer_scaled", 100 * scaled["subnormal"])
glue("under_scale", f"{LOSS_SCALES[1]:g}")
Table(["loss scale", "flushed to 0", "subnormal", "overflowed", "worst median error"], summary)

# %% [markdown]
# Unscaled, {glue:text}`under_layer_sub:.1f`% of the entries of `{glue:text}`under_layer`` are
# subnormal in fp16 (a few significant bits left); scaled by {glue:text}`under_scale`,
# {glue:text}`under_layer_scaled:.2f`%. A scale can also be too large: the gradients then overflow,
# which a dynamic scaler detects. The dynamic scaler, started far too high, on the hand-written fp16
# recipe (fp16 weights, fp32 master):

# %%
trace = mixed_precision.trace_loss_scale()
skips = sum(not r["finite"] for r in trace)
glue("trace_skips", skips)
glue("trace_final", trace[-1]["scale"])
assert any(r["action"].startswith("grow") for r in trace)
agree = mixed_precision.amp_agreement()
same = max(r["max_weight_diff"] for r in agree if r["run"] == "book scaler")
hand = max(r["max_weight_diff"] for r in agree if r["run"] == "hand-written")
assert same == 0.0  # the book's scaler on autocast is torch's GradScaler, bit for bit
glue("agree_hand", hand)
Table(["step", "scale", "finite", "action", "loss"],
      [[r["step"], f"{r['scale']:g}", r["finite"], r["action"], f"{r['loss']:.4f}"]
       for r in trace])

# %% [markdown]
# It skipped {glue:text}`trace_skips` steps while backing off, then settled at
# {glue:text}`trace_final:g` and grew. With autocast, the book's scaler reproduces PyTorch's
# `GradScaler` bit for bit (same weights, scales and skipped steps); the hand-written recipe runs
# every op in fp16, where autocast keeps some in fp32, and stays within {glue:text}`agree_hand:.1e`
# of it in the weights.
#
# ### Weights that do not move
#
# The same debug model, AdamW at {glue:text}`stall_lr` for {glue:text}`stag_steps` steps, the
# weights stored in bf16 with each rounding of `weight_updates.RoundedAdamW`, against fp32:

# %%
stag = mixed_precision.stagnation(steps=STAGNATION_STEPS, lr=STALL_LR)
first_step = torch.cat([p.detach().flatten().to(torch.bfloat16).float()
                        for p in debug.parameters()])
glue("stall_predicted", 100 * adam_first_step_stalls(first_step, STALL_LR))
glue("stag_steps", STAGNATION_STEPS)
drop = {k: v["losses"][0] - v["final_loss"] for k, v in stag.items()}
glue("stag_nearest_moved", 100 * stag["nearest"]["changed_fraction"])
glue("stag_nearest_drop", drop["nearest"] / drop["none"])
remedies = ("master", "kahan", "stochastic")
moved = {k: v["changed_fraction"] for k, v in stag.items()}
assert moved["nearest"] < 0.5 < min(moved[k] for k in remedies)
assert drop["nearest"] < 0.5 * drop["none"] and all(drop[k] > 0.9 * drop["none"] for k in remedies)
Table(["stored as", "loss drop", "vs fp32's", "weights that ever moved", "extra bytes/param"],
      [[k, f"{drop[k]:.4f}", f"{drop[k] / drop['none']:.2f}", f"{v['changed_fraction']:.1%}",
        v["extra_bytes_per_param"]] for k, v in stag.items()])

# %% tags=["remove-input"]
fig, ax = plotting.subplots(width=7.0, height=3.6)
for color, (name, v) in zip(plotting.CYCLE, stag.items(), strict=False):
    ax.plot(range(1, STAGNATION_STEPS + 1), v["losses"], color=color, label=name)
plotting.finish(ax, title="AdamW, weights stored in bf16 by rounding", xlabel="step",
                ylabel="loss")
ax.legend(fontsize=7)
plt.show()

# %% [markdown]
# Rounded to nearest, only {glue:text}`stag_nearest_moved:.1f`% of the weights ever moved, and the
# loss fell {glue:text}`stag_nearest_drop:.2f`× as far as in fp32 (AdamW's first step alone leaves
# {glue:text}`stall_predicted:.1f`% of the bf16 weights unchanged, predicted from their values). An
# fp32 master copy (4 bytes per parameter), a Kahan compensation term (2 bytes) or stochastic
# rounding (none) each restore fp32's curve.
#
# ### fp8
#
# E4M3 (3 mantissa bits, max 448) for the forward, E5M2 (2 bits, max 57,344) for gradients, each
# tensor scaled so that its largest value lands near the format's maximum
# {cite}`micikevicius2022fp8`. One linear layer of the model, its real input, weight and output
# gradient, through `fp8.Fp8Linear` (simulated by casting on a CPU; `torch._scaled_mm` where the
# hardware has it):

# %%
f8 = mixed_precision.fp8_linear_errors()
glue("fp8_out", 100 * next(r["rel_error"] for r in f8 if r["scaling"] == "current"
                           and r["tensor"] == "output"))
unscaled = next(r for r in f8 if r["scaling"] == "none")
glue("fp8_flushed", 100 * unscaled["grad_flushed"])
Table(["scaling", "tensor", "error vs fp32", "largest |value|", "gradient entries flushed"],
      [[r["scaling"], r["tensor"], f"{r['rel_error']:.2%}", f"{r['amax']:.3g}",
        f"{r['grad_flushed']:.1%}"] for r in f8])

# %% [markdown]
# Scaled per tensor, the output is within {glue:text}`fp8_out:.1f`% of fp32 (3 mantissa bits: half
# an ulp is 6%); unscaled, E5M2 flushes {glue:text}`fp8_flushed:.0f`% of the output gradient's
# entries to zero. fp8 needs a scale per tensor, and delayed scaling (from an amax history) trades
# one more pass over the tensor for the risk of a spike it has not seen.
#
# ### Speed
#
# fp32, bf16 autocast and pure bf16 (`bf16_pure_adamw`), forward, forward + backward and step, timed
# round-robin:

# %%
speed_rows = amp_speed.run(SPEED)
speed_verdicts = amp_speed.verdicts(speed_rows)
glue("speed_speed", speed_verdicts["speed"])
glue("speed_floor", speed_verdicts["floor"])
amp_speed.table(speed_rows)

# %% [markdown]
# On this machine: {glue:text}`speed_speed`. How the step time follows the tokens:
# {glue:text}`speed_floor`.
#
# The seed's bf16 table is flat from 128 to 512 tokens, and its author wrote that autocast "costs a
# fixed time". Its own tables say otherwise: {glue:text}`seed_floor`. What sets a floor, measured
# here op by op (every aten op counted with and without autocast, the weight casts timed alone, a
# bare op timed alone):

# %%
glue("seed_floor", autocast_overhead.seed_verdict())
overhead_rows = autocast_overhead.run(OVERHEAD)
for i, text in enumerate(autocast_overhead.verdicts(overhead_rows).values()):
    glue(f"overhead_{i}", text)
autocast_overhead.table(overhead_rows)

# %% [markdown]
# {glue:text}`overhead_0`.
#
# ### Memory
#
# One fresh model per preset and run: the allocator read around a forward without gradients
# (inference) and around a training step, beside the counts that explain them:

# %%
memory_rows = amp_memory.run(MEMORY)
memory_verdicts = amp_memory.verdicts(memory_rows)
for name, text in memory_verdicts.items():
    glue(f"memory_{name}", text)
amp_memory.table(memory_rows)

# %% [markdown]
# Inference: {glue:text}`memory_inference`. The seed reported a rise on a GPU too ("in the forward
# the bf16 is even more than fp32"): autocast caches a bf16 copy of every weight it casts until its
# region ends, and the sentence above measures how much of the difference those copies explain.
# Training: {glue:text}`memory_training`. And {glue:text}`memory_split`.
#
# ### Recorded GPU results
#
# `python -m mlsys.experiments` runs these four experiments in GPU sizes (the presets `small` to
# `2.7B`; fp16 and bf16 autocast dtypes on CUDA, whose op lists differ from the CPU's):

# %%
for name in ("autocast_dtypes", "amp_speed", "autocast_overhead", "amp_memory"):
    experiments.show_recorded(name)

# %% [markdown]
# ```{admonition} Takeaway
# :class: tip
# Autocast runs the matmuls from 16-bit copies of fp32 weights and keeps the loss and the stored
# gradients in fp32; the mixed recipe still holds {glue:text}`q_mixed_bpp` bytes per parameter, so
# only the activations shrink ({glue:text}`mixed_over_fp32:.2f`× the fp32 total for `xl`). fp16
# needs a loss scale; bf16 needs an fp32 accumulator in reductions and an fp32 master copy (or Kahan
# or stochastic rounding) for small updates; epsilon is not the problem.
# ```
#
# ## Exercises
#
# ### Q1 [The xl preset on one H100, three recipes]
#
# For `xl` at batch 4 × 1,024 on an H100 ({glue:text}`q1_hbm:.0f` GB): (a) model states and saved
# activations under fp32 AdamW, the mixed recipe and pure bf16; (b) which fit; (c) the lower bound
# on the step's matmul time at the fp32, TF32 and bf16 peaks.

# %% tags=["hide-cell"]
q1 = {}
for label, recipe, saved in (("fp32", "fp32_adamw", saved32),
                             ("mixed", "bf16_mixed_adamw", saved16),
                             ("pure", "bf16_pure_adamw", saved16)):
    q1[label] = memory.model_state_bytes(n_params, recipe) + saved.total_bytes
fits = [k for k, v in q1.items() if v <= SPEC.hbm_bytes]
glue("q1_hbm", SPEC.hbm_bytes / 1e9)
step_flops = flops.transformer_flops(cfg, BATCH, SEQ).training_matmul_flops
times = {dt: step_flops / SPEC.peak_flop_per_s(dt) for dt in ("fp32", "tf32", "bf16")}
assert times["fp32"] > times["tf32"] > times["bf16"]
for name, value in {"q1_fp32": q1["fp32"] / 1e9, "q1_mixed": q1["mixed"] / 1e9,
                    "q1_pure": q1["pure"] / 1e9, "q1_fits": ", ".join(fits) or "none",
                    "q1_t32": times["fp32"] * 1e3, "q1_t_tf": times["tf32"] * 1e3,
                    "q1_t16": times["bf16"] * 1e3}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# (a) States plus saved activations: fp32 {glue:text}`q1_fp32:.1f` GB, mixed
# {glue:text}`q1_mixed:.1f` GB, pure bf16 {glue:text}`q1_pure:.1f` GB. (b) Within
# {glue:text}`q1_hbm:.0f` GB: {glue:text}`q1_fits`. (c) At the peaks, the step's matmuls need at
# least {glue:text}`q1_t32:.0f` ms (fp32), {glue:text}`q1_t_tf:.0f` ms (TF32) and
# {glue:text}`q1_t16:.0f` ms (bf16).
# ```
#
# ### Q2 [Find the error]
#
# "LayerNorm must stay in fp32 under fp16 autocast because its epsilon, 1e-5, is below fp16's
# smallest normal number and rounds away." What is wrong, and what does need fp32?

# %% tags=["hide-cell"]
tiny = norms.eps_facts(1e-8, "fp16")
assert e16.stored > 0 and tiny.stored == 0 and e16.rel_error < 0.01

# %% [markdown]
# ```{dropdown} Answer
# 1e-5 is subnormal in fp16 but stored as {glue:text}`eps16_stored:.6g`, {glue:text}`eps16_err:.2f`%
# off; it is absorbed by any mean square from {glue:text}`eps_absorbed16:g` up, in fp16 as in any
# format once the mean square is large enough. Only much smaller values (1e-8) round to zero. What
# needs fp32 is the range of the squares (their sum overflows fp16 once the rms passes
# {glue:text}`overflow_rms:.1f` for $d$ = {glue:text}`norm_d`) and the accumulator of their sum (a
# 16-bit running sum stalls).
# ```
#
# ### Q3 [Which weights stall?]
#
# A bf16 weight of 0.3 receives AdamW updates of size $10^{-4}$. Does it move? From what magnitude
# do weights stop moving at that update size?

# %% tags=["hide-cell"]
th = stall_threshold(0.3, "bf16")
moves = 1e-4 > th
limit = next(2.0**k for k in range(-20, 10) if stall_threshold(2.0**k, "bf16") >= 1e-4)
glue("q3_th", th)
glue("q3_moves", "it moves" if moves else "it does not move")
glue("q3_limit", limit)

# %% [markdown]
# ```{dropdown} Answer
# The spacing of bf16 at 0.3 is $2^{-2-7}$; an update must exceed half of it,
# {glue:text}`q3_th:.2e`: {glue:text}`q3_moves`. Updates of $10^{-4}$ vanish for every weight of
# magnitude {glue:text}`q3_limit:g` or more.
# ```
#
# ## Summary
#
# - Mixed precision runs the matmuls in 16 bits from fp32 weights; the mixed AdamW recipe keeps
#   {glue:text}`q_mixed_bpp` bytes per parameter, and only the saved activations halve.
# - Autocast's dtypes are recorded, not assumed: the lists differ between CPU and CUDA.
# - fp16's range needs a loss scale (dynamic: back off on overflow, grow after good steps); bf16's
#   precision needs fp32 accumulators and a master copy, Kahan or stochastic rounding for updates.
# - Epsilon 1e-5 is fine in fp16; the squares' range and the sum's accumulator are what matter.
# - fp8 works per tensor with a scale; without one, E5M2 flushes small gradients to zero.
