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
import math

import matplotlib.pyplot as plt
import torch

from mlsys import book, experiments, hardware, policies
from mlsys.accounting import flops, memory
from mlsys.book import glue
from mlsys.diagrams import precision as diagrams
from mlsys.experiments import amp_memory, amp_speed, autocast_dtypes, autocast_overhead
from mlsys.experiments import mixed_precision as mp
from mlsys.models.config import TransformerConfig
from mlsys.numerics import norm_numerics as norms
from mlsys.numerics.precision import FORMATS
from mlsys.numerics.weight_updates import stall_threshold

# %% tags=["parameters"]
SEED = 0
# Napkin math (nothing measured): the device and the model of the predictions
SPEC, PRESET, BATCH, SEQ = hardware.H100_SXM, "xl", 4, 1_024
EPSILONS = (1e-5, 1e-6, 1e-8)
NORM_D = 4_096  # the width of the overflow example
STALL_LR = 1e-5
# Live numerics on the debug model (cheap on any machine)
LOSS_SCALES = (1.0, 2.0**8, 2.0**16)
SAWTOOTH_STEPS = env.pick(smoke=300, cpu=500, gpu=500)
GROWTH_INTERVAL = 10  # torch's default is 2,000: 10 shows the teeth within hundreds of steps
STAGNATION_STEPS = 40
AGREE_LR = 1e-3  # AdamW's learning rate in the runs that compare autocast with hand-written fp16
# Measurements: sizes per profile live with each experiment (lib/mlsys/experiments/)
DTYPES = env.pick(**autocast_dtypes.SIZES)
SPEED = env.pick(**amp_speed.SIZES)
OVERHEAD = env.pick(**autocast_overhead.SIZES)
MEMORY = env.pick(**amp_memory.SIZES)

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

# %% tags=["hide-input"]
spec_fp32, spec_tf32, spec_bf16 = (SPEC.peak_flop_per_s(dt) for dt in ("fp32", "tf32", "bf16"))
glue("q_peak_ratio", spec_bf16 / spec_fp32)
glue("tf32_ratio", spec_bf16 / spec_tf32)
glue("spec_name", SPEC.name)
cfg = TransformerConfig.preset(PRESET)
assert all(p.breakdown() == memory.recipe(k).breakdown() for k, p in policies.POLICIES.items())
glue("q_mixed_bpp", memory.recipe("bf16_mixed_adamw").bytes_per_param)
assert memory.recipe("bf16_mixed_adamw").bytes_per_param == memory.recipe(
    "fp32_adamw").bytes_per_param
amp_memory.recipe_table(cfg)  # the model states for the preset

# %% [markdown]
# On the {glue:text}`spec_name` bf16 matmuls run {glue:text}`q_peak_ratio:.0f` times faster than
# fp32 on CUDA cores and {glue:text}`tf32_ratio:.0f` times faster than TF32. Two recipes get there,
# and neither shrinks the model states. Autocast keeps fp32 weights (`fp32_adamw`'s 16 bytes per
# parameter) and hands each matmul a bf16 copy; the mixed recipe stores the weights in bf16 and
# adds an fp32 master copy, 2 + 4 bytes where fp32 had 4, and halves the gradients: 16 bytes, like
# fp32 AdamW. What changes is the activations saved for the backward. For
# {glue:text}`napkin_model`, per training step, autocast's counted with CUDA's op lists
# (`amp_memory.autocast_saved_bytes`, checked against the counted GPU record at the end of the
# measurements):

# %% tags=["hide-input"]
napkin = amp_memory.napkin(cfg, BATCH, SEQ)  # what autocast saves, by CUDA's lists
facts = amp_memory.napkin_facts(cfg, BATCH, SEQ)
for name, value in {"napkin_model": f"`{PRESET}` at {BATCH} × {SEQ:,} tokens", **facts}.items():
    glue(name, value)
assert facts["amp_act"] > facts["mixed_act"] > 0.5
amp_memory.napkin_table(napkin)

# %% [markdown]
# With bf16 weights the activations come to {glue:text}`mixed_act:.2f`× fp32's, not half: every
# RMSNorm keeps its up-cast input and $x/\mathrm{rms}$ in fp32, two full $(N, D)$ tensors per
# norm ({glue:text}`norms_gb:.1f` GB here), and the step's sum is
# {glue:text}`mixed_over_fp32:.2f`× fp32's. Autocast, with the same 16 bytes of states, saves
# {glue:text}`amp_act:.2f`× fp32's activations and sums to {glue:text}`amp_over_fp32:.2f`×: its
# residual stream and norms stay fp32, every projection saves its own bf16 copy of its input
# (three of the normed $x$ for q, k and v, two for w1 and w3), it caches a bf16 copy of every
# weight, and CUDA's autocast runs softmax in fp32, so naive attention keeps its $S \times S$
# probabilities in fp32 and again in bf16. With SDPA, which keeps no $S \times S$ matrix, the same
# count gives {glue:text}`amp_sdpa:.2f`× fp32's.
#
# ### What fp16's range and bf16's precision cost
#
# fp16 keeps 10 mantissa bits and 5 exponent bits: values from $6.0 \times 10^{-8}$ (subnormal) to
# 65,504. bf16 keeps fp32's 8 exponent bits and 7 mantissa bits. Three consequences, each computed
# by `mlsys.numerics.norm_numerics` and `mlsys.numerics.weight_updates`:

# %% tags=["hide-input"]
e16, e_bf = norms.eps_facts(1e-5, "fp16"), norms.eps_facts(1e-5, "bf16")
assert e16.kind == "subnormal" and e16.stored == e_bf.stored  # subnormal, yet as good as bf16's
overflow_rms = norms.square_overflow_rms(NORM_D, "fp16")
sum_inf, mean_inf = mp.first_overflow_rms(NORM_D, "fp16").values()  # two ways to write it
assert math.isclose(sum_inf, overflow_rms, rel_tol=1e-3) and mean_inf > 50 * sum_inf
for name, value in {"eps16_stored": e16.stored, "eps16_err": 100 * e16.rel_error,
                    "eps_absorbed16": e16.absorbed_from, "eps_absorbed_bf": e_bf.absorbed_from,
                    "overflow_sum": sum_inf, "overflow_mean": mean_inf, "norm_d": f"{NORM_D:,}",
                    "flush": norms.square_flush_below("fp16"),
                    "stall_one": stall_threshold(1.0, "bf16"), "stall_lr": f"{STALL_LR:g}"}.items():
    glue(name, value)
mp.eps_table(EPSILONS)

# %% [markdown]
# - **Epsilon.** The seed says 1e-5 is hard to represent in fp16 because its smallest *normal*
#   number is $6.1 \times 10^{-5}$. 1e-5 is subnormal there, but stored as
#   {glue:text}`eps16_stored:.6g` ({glue:text}`eps16_err:.2f`% off), the very value bf16 stores.
#   What matters is when adding it changes anything: every mean square from
#   {glue:text}`eps_absorbed16:g` up absorbs it in fp16 ({glue:text}`eps_absorbed_bf:g` in bf16).
#   Only far smaller values (1e-8) vanish in fp16.
# - **Squares.** Where the mean square overflows depends on how it is written. Summed into an fp16
#   result and then divided by $d$ (a kernel whose sum is 16-bit, or `x.pow(2).sum() / d`), a row
#   of {glue:text}`norm_d` values overflows once its rms reaches {glue:text}`overflow_sum:.1f`
#   ($\sqrt{65504/d}$), and the normalizer comes out $1/\sqrt{\infty} = 0$: finite and wrong.
#   PyTorch's `x.pow(2).mean()` sums fp16 squares in fp32 and divides before it rounds, so it
#   overflows only when the mean square itself passes 65,504: at rms {glue:text}`overflow_mean:.1f`,
#   whatever $d$ (the first rms at which each comes out inf, found by bisection with torch).
#   Squares of $|x| <$ {glue:text}`flush:.2e` flush to 0. bf16 has neither problem.
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
# `dtype_recorder.DtypeRecorder` watches every op of a forward and backward (a
# `TorchDispatchMode`) and records, per module, the dtypes of parameters, matmul inputs, outputs
# and gradients. Two models under fp16 autocast: the seed's toy model (fc1 → ReLU → LayerNorm →
# fc2) and one block and the head of the book's model (`LM`), on this device and, where one is
# recorded, on a GPU:

# %%
dtype_rows = autocast_dtypes.run(DTYPES)
panels = autocast_dtypes.map_panels(dtype_rows, experiments.recorded("autocast_dtypes"))

# %% tags=["remove-input"]
diagrams.draw_autocast_map(panels)
plt.show()

# %% tags=["hide-input"]
seed_items = autocast_dtypes.seed_check(dtype_rows)
glue("seed_ln", seed_items["ln output"])
glue("seed_grads", seed_items["gradients"])
weights = {c["weights"] for m in panels.values() for c in m.values()} - {"-"}
assert weights == {"fp32"}  # autocast casts copies, never the weights themselves
assert all(m["LM attn_norm (RMSNorm)"]["output"] == "fp32" for m in panels.values())
glue("map_devices", " and ".join(panels))
autocast_dtypes.seed_table(dtype_rows)

# %% [markdown]
# The map's panels: {glue:text}`map_devices`. The weights stay fp32 in every row (autocast casts
# copies, not weights), the matmuls read 16-bit copies and write 16-bit outputs, the loss is fp32,
# and the weight gradients are stored in fp32 ({glue:text}`seed_grads`), though those of the
# matmuls hold only 16-bit values (the last column: stored / the narrowest format that holds their
# values): the backward matmul ran in 16 bits and was cast up. LayerNorm's output here:
# {glue:text}`seed_ln`. The book's RMSNorm upcasts its input itself, so its rows are fp32 in every
# panel.
#
# Behind the map are autocast's op lists, one set per device. Asked of torch op by op
# (`autocast_dtypes.op_lists`: the output's dtype from fp32 inputs and from fp16 inputs, and
# whether the dispatcher holds an autocast kernel for the op), on this CPU and for CUDA, whose
# lists any machine can read: the ops run on fake CUDA tensors (shapes and dtypes, no data) through
# CUDA's autocast. The maps above, live and recorded, agree with them (asserted):

# %% tags=["hide-input"]
ops = autocast_dtypes.op_lists("fp16", device_type="cpu") + autocast_dtypes.op_lists("fp16")
for rows in [dtype_rows, *(r["results"] for r in experiments.recorded("autocast_dtypes"))]:
    assert not autocast_dtypes.op_record_agreement(ops, rows)  # the lists explain each map
for dev, lst in [(d, x) for d in ("cpu", "cuda") for x in ("fp32", "none")]:
    glue(f"ops_{dev}_{lst}", autocast_dtypes.members(ops, dev, lst))
autocast_dtypes.op_table(ops)

# %% [markdown]
# CUDA's fp32 list holds {glue:text}`ops_cuda_fp32`; the CPU's, {glue:text}`ops_cpu_fp32`, so on
# a CPU LayerNorm follows its input, as the map shows. On none of CUDA's lists:
# {glue:text}`ops_cuda_none`; on none of the CPU's: {glue:text}`ops_cpu_none`. Those run in their
# inputs' dtype, mixed inputs following ordinary type promotion. A "promote" op is one autocast
# intercepts to cast its inputs to the widest. The lists are the device's, which is why the map is
# recorded, not copied.
#
# ### Normalization in low precision
#
# The inputs of every RMSNorm of the debug model, captured, normalized in fp16 and bf16 (squares,
# sum and mean in the 16-bit format, summed by PyTorch's reduction, which accumulates in fp32, or
# one addition at a time, as a kernel with a 16-bit accumulator would), against float64:

# %% tags=["hide-input"]
norm_rows = mp.norm_errors(batch=8, seq=64, seed=SEED)
by = {(r["dtype"], r["accumulate"]): r for r in norm_rows}
glue("norm_bf16_seq", 100 * by[("bf16", "sequential")]["median_rel_error"])
glue("norm_bf16_torch", 100 * by[("bf16", "torch")]["median_rel_error"])
glue("norm_fp16_torch", 100 * by[("fp16", "torch")]["median_rel_error"])
glue("norm_flushed", 100 * by[("fp16", "torch")]["squares_flushed"])
plateau = norms.rms_inv(torch.ones(1, NORM_D), "bf16", accumulate="sequential").item()
assert by[("bf16", "sequential")]["median_rel_error"] > 1.5 * by[("bf16", "torch")][
    "median_rel_error"] and plateau > 1.5  # the 16-bit accumulator, not the format, is the issue
glue("plateau_scale", plateau)
mp.norm_table(norm_rows)

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
# Where do the gradients of the debug model lie in fp16's range? Every entry of one batch's fp32
# gradients, one bin per power of two, as they are and multiplied by a loss scale of
# {glue:text}`under_scale`, against the zones that follow from fp16's 5 exponent and 10 mantissa
# bits:

# %% tags=["remove-input"]
grads = list(mp.gradients(batch=8, seq=64, seed=SEED).values())
diagrams.draw_gradient_histogram(grads, scales=LOSS_SCALES[:2])
plt.show()

# %% [markdown]
# Unscaled, {glue:text}`hist_sub1:.1f`% of the entries would be subnormal in fp16 (fewer
# significant bits) and {glue:text}`hist_under1:.3f`% would round to zero; multiplied by
# {glue:text}`under_scale`, {glue:text}`hist_sub8:.2f`% and {glue:text}`hist_under8:.0f`%, and the
# largest is still {glue:text}`hist_headroom:.0f` powers of two below fp16's max. The histogram
# casts fp32 gradients; an fp16 backward computes them in fp16 from the start, so its own
# intermediate gradients can underflow too. Measured, tensor by tensor, against fp32:

# %% tags=["hide-input"]
under = mp.gradient_underflow(scales=LOSS_SCALES, seed=SEED)
facts = mp.underflow_facts(under, grads, LOSS_SCALES)  # the worst tensor, the histogram's shares
assert facts["under_layer_scaled"] < facts["under_layer_sub"] and facts["hist_sub8"] < facts[
    "hist_sub1"]
for name, value in facts.items():
    glue(name, value)
mp.underflow_table(under)

# %% [markdown]
# Unscaled, {glue:text}`under_layer_sub:.1f`% of the entries of `{glue:text}`under_layer`` are
# subnormal in the fp16 backward; scaled by {glue:text}`under_scale`,
# {glue:text}`under_layer_scaled:.2f`%. A scale can also be too large: the gradients then overflow,
# which a dynamic scaler detects. The dynamic scaler on the hand-written fp16 recipe (fp16 weights,
# fp32 master), started far too high, for {glue:text}`saw_steps` steps on one batch:

# %%
trace = mp.trace_loss_scale(steps=SAWTOOTH_STEPS, init_scale=2.0**24,
                            growth_interval=GROWTH_INTERVAL, seed=SEED)

# %% tags=["remove-input"]
diagrams.draw_loss_scale([r["scale"] for r in trace], [r["finite"] for r in trace],
                         [r["grad_amax"] for r in trace])
plt.show()

# %% tags=["remove-cell"]
saw = mp.sawtooth_summary(trace)
assert saw["settling"] > 0 and saw["skips"] > 0
assert trace[-1]["scale"] > trace[saw["settling"]]["scale"]  # the scale follows the gradients
agree = mp.amp_agreement(lr=AGREE_LR)
assert max(r["max_weight_diff"] for r in agree if r["run"] == "book scaler") == 0.0  # bit for bit
hand = mp.agreement_summary(agree)
assert hand["sooner"] is not None and hand["update_rel_diff"] < 0.5
for name, value in {**saw, "steps": SAWTOOTH_STEPS, "growth": GROWTH_INTERVAL,
                    "hand_sooner": mp.power_text(hand["sooner"]), "hand_n": hand["updates"],
                    "torch_n": hand["torch_updates"], "agree_steps": len(agree) // 3,
                    "cmp_n": hand["compared_updates"], "lr": f"{AGREE_LR:g}",
                    "hand_max_lr": hand["max_weight_diff"] / AGREE_LR,
                    "hand_rel": 100 * hand["update_rel_diff"]}.items():
    glue(f"saw_{name}", value)

# %% [markdown]
# The first {glue:text}`saw_settling` steps overflowed, each halving $S$, down to
# {glue:text}`saw_settled`. From there the sawtooth: {glue:text}`saw_growth` finite steps double
# $S$, and a doubling that pushes the largest stored gradient past 65,504 costs a skipped step and
# halves it back: {glue:text}`saw_skips` skipped steps, {glue:text}`saw_skip_rate:.1f`% of the
# rest of the run. As the model learns, its gradients shrink (the lower curve) and $S$ climbs to
# {glue:text}`saw_final`, keeping the stored gradients just under the max.
# torch's `GradScaler` waits 2,000 steps before it doubles, so it skips at most about one step in
# 2,000 once settled.
# With autocast, the book's scaler reproduces `GradScaler` bit for bit (same weights, scales and
# skipped steps). The hand-written recipe runs every op in fp16, where autocast keeps the residual
# stream and the norms in fp32, so it overflowed at a scale autocast survived
# ({glue:text}`saw_hand_sooner`); in {glue:text}`saw_agree_steps` steps it took
# {glue:text}`saw_hand_n` updates, torch {glue:text}`saw_torch_n`. The largest weight difference at
# the end, {glue:text}`saw_hand_max_lr:.1f` times the learning rate {glue:text}`saw_lr`, says
# little: AdamW's first steps move every weight by about the learning rate whatever its gradient's
# size, so a tiny gradient that changes sign moves its weight the other way, and one update taken
# or skipped shifts every weight by that much. Compared after as many updates
# ({glue:text}`saw_cmp_n`), the distance between the two runs' weights is
# {glue:text}`saw_hand_rel:.1f`% of the distance torch's moved from their start.
#
# ### Weights that do not move
#
# The same debug model, AdamW at {glue:text}`stall_lr` for {glue:text}`stag_steps` steps, the
# weights stored in bf16 with each rounding of `weight_updates.RoundedAdamW`, against fp32:

# %%
stag = mp.stagnation(steps=STAGNATION_STEPS, lr=STALL_LR, seed=SEED)

# %% tags=["remove-input"]
diagrams.draw_stagnation({mp.STAGNATION_LABELS[k]: v["losses"] for k, v in stag.items()},
                         reference=mp.STAGNATION_LABELS["none"])
plt.show()

# %% tags=["hide-input"]
glue("stall_predicted", 100 * mp.first_step_stalls(lr=STALL_LR, seed=SEED))
glue("stag_steps", STAGNATION_STEPS)
moved, drop = mp.stagnation_shares(stag)  # weights that ever moved; loss drop over fp32's
glue("stag_nearest_moved", 100 * moved["nearest"])
glue("stag_nearest_drop", drop["nearest"])
remedies = ("master", "kahan", "stochastic")
assert moved["nearest"] < 0.5 < min(moved[k] for k in remedies)
assert drop["nearest"] < 0.5 and all(drop[k] > 0.9 for k in remedies)
mp.stagnation_table(stag)

# %% [markdown]
# Rounded to nearest, only {glue:text}`stag_nearest_moved:.1f`% of the weights ever moved, and the
# loss fell {glue:text}`stag_nearest_drop:.2f`× as far as in fp32 (AdamW's first step alone leaves
# {glue:text}`stall_predicted:.1f`% of the bf16 weights unchanged, predicted from their values). An
# fp32 master copy (4 bytes per parameter), a Kahan compensation term (2 bytes) or stochastic
# rounding (none) each restore fp32's curve: in the left panel they lie on top of it, in the right
# one their gap to it stays near zero while round-to-nearest's grows.
#
# ### fp8
#
# E4M3 (3 mantissa bits, max 448) for the forward, E5M2 (2 bits, max 57,344) for gradients, each
# tensor scaled so that its largest value lands near the format's maximum
# {cite}`micikevicius2022fp8`. One linear layer of the model, its real input, weight and output
# gradient, through `fp8.Fp8Linear` (simulated by casting on a CPU; `torch._scaled_mm` where the
# hardware has it):

# %% tags=["hide-input"]
f8 = mp.fp8_linear_errors(seed=SEED, scalings=("current", "none"))
for name, value in mp.fp8_facts(f8).items():
    glue(name, value)
mp.fp8_table(f8)

# %% [markdown]
# Scaled per tensor, the output is within {glue:text}`fp8_out:.1f`% of fp32 (3 mantissa bits: half
# an ulp is 6%); unscaled, E5M2 flushes {glue:text}`fp8_flushed:.0f`% of the output gradient's
# entries to zero: the gradients lie far below 1, under E5M2's smallest numbers, and the scale
# lifts them into its range. Where the scale comes from is the next choice. *Current* scaling
# reads the tensor's own amax, one more pass over it before the cast; *delayed* scaling (NVIDIA's
# Transformer Engine) takes the largest amax of the last 16 steps, known before the tensor is.
# They agree while the amax holds still. The same layer over a few steps, one of them a spike in
# its input (`mp.fp8_amax_trace`):

# %% tags=["hide-input"]
trace8 = mp.fp8_amax_trace(seed=SEED)
facts = mp.fp8_trace_facts(trace8)  # at the spike
assert facts["f8_sat"] > 0 == facts["f8_cur_sat"] and facts["f8_spike"] > 5 * facts["f8_cur"]
for name, value in facts.items():
    glue(name, value)
mp.fp8_trace_table(trace8)

# %% [markdown]
# At the jump (×{glue:text}`f8_factor` at step {glue:text}`f8_step`), delayed scaling saturates
# {glue:text}`f8_sat:.0f`% of the input's entries at 448 and the output is
# {glue:text}`f8_spike:.0f`% off, where current scaling stays at
# {glue:text}`f8_cur:.1f`%. After it, the remembered spike keeps delayed's scale that much lower for
# the history's length; here the step after cost {glue:text}`f8_after:.2f`× current's error.
#
# One scale per tensor is the coarsest choice. A single outlier channel sets the scale for every
# entry and pushes the others toward E4M3's subnormals; blocks with scales of their own confine
# it. The MX formats share one power-of-two (E8M0) scale among 32 consecutive entries
# {cite}`rouhani2023microscaling`, and DeepSeek-V3 scales 1 × 128 tiles of activations and
# 128 × 128 blocks of weights {cite}`deepseek2024v3`. The same input with one channel multiplied
# by $2^k$, power-of-two scales per tensor and per 32 entries (`mp.block_quantize`):

# %% tags=["hide-input"]
blocks = mp.block_scaling_errors(seed=SEED)
facts = mp.block_facts(blocks)  # the largest outlier, blocks of 32 (MX's)
assert facts["blk_flush_b"] < facts["blk_flush_t"] and facts["blk_err_b"] < facts["blk_err_t"]
for name, value in facts.items():
    glue(name, value)
mp.block_table(blocks)

# %% [markdown]
# With an outlier {glue:text}`blk_outlier` times its neighbours, one scale per tensor flushes
# {glue:text}`blk_flush_t:.1f`% of the other entries to zero and leaves them
# {glue:text}`blk_err_t:.1f`% off; a scale per {glue:text}`blk_size` entries,
# {glue:text}`blk_flush_b:.1f`% and {glue:text}`blk_err_b:.1f`%.
#
# ### TF32
#
# TF32 is not a storage format: the tensors stay fp32, and the matrix units round the inputs of
# each product to 10 mantissa bits (fp32's 8-bit exponent, fp16's precision) and sum in fp32
# {cite}`nvidia_a100_datasheet`. It runs fp32 code at {glue:text}`tf32_speed:.1f`× the
# {glue:text}`spec_name`'s fp32 peak, half of bf16's, and PyTorch leaves it off for matmuls unless
# asked: `torch.get_float32_matmul_precision()` is {glue:text}`tf32_default` here
# (`torch.set_float32_matmul_precision("high")` switches TF32 on), while cuDNN's convolutions
# allow it by default ({glue:text}`tf32_cudnn`). What the rounding costs, emulated (inputs rounded
# as each format reads them, products summed in fp32, against float64):

# %% tags=["hide-input"]
tf32 = mp.tf32_matmul_errors(seed=SEED)
facts = {"tf32_speed": spec_tf32 / spec_fp32, **mp.tf32_facts(tf32)}
assert facts["tf32_vs_bf16"] > 4 and math.isclose(facts["tf32_vs_fp16"], 1, rel_tol=0.2)
for name, value in facts.items():
    glue(name, value)
mp.tf32_table(tf32)

# %% [markdown]
# TF32's error is fp16's (the same 10 bits, {glue:text}`tf32_err:.1e` here) and
# {glue:text}`tf32_vs_bf16:.0f` times smaller than bf16's, with fp32's range: for fp32 code on a
# GPU it is the free speed-up, and a benchmark in fp32 should say whether it was on.
#
# ### Speed
#
# fp32, bf16 autocast and pure bf16 (`bf16_pure_adamw`), forward, forward + backward and step, timed
# round-robin:

# %%
speed_rows = amp_speed.run(SPEED)

# %% tags=["hide-input"]
glue("speed_text", amp_speed.verdicts(speed_rows)["text"])
amp_speed.table(speed_rows)

# %% [markdown]
# {glue:text}`speed_text`
#
# The seed's bf16 table is flat from 128 to 512 tokens, and its author wrote that autocast "costs a
# fixed time". Its own tables say otherwise: {glue:text}`seed_floor`. What sets a floor, measured
# here op by op (every aten op counted with and without autocast, the weight casts timed alone, a
# bare op timed alone):

# %% tags=["hide-input"]
glue("seed_floor", autocast_overhead.seed_verdict())
overhead_rows = autocast_overhead.run(OVERHEAD)
glue("overhead", ". ".join(autocast_overhead.verdicts(overhead_rows).values()))
autocast_overhead.table(overhead_rows)

# %% [markdown]
# {glue:text}`overhead`.
#
# ### Memory
#
# One fresh model per preset and run: the allocator read around a forward without gradients
# (inference) and around a training step, beside the counts that explain them:

# %% tags=["hide-input"]
memory_rows = amp_memory.run(MEMORY)
for name, text in amp_memory.verdicts(memory_rows).items():
    glue(f"memory_{name}", text)
amp_memory.table(memory_rows)

# %% [markdown]
# Inference (a forward without gradients): {glue:text}`memory_inference`. The seed saw such a rise
# on a GPU ("in the forward the bf16 is even more than fp32"): autocast caches a bf16 copy of every
# weight it casts until its region ends, gradients or not. Training:
# {glue:text}`memory_training`. Per preset, {glue:text}`memory_saved`. The napkin used the same
# count with CUDA's lists, which add naive attention's softmax in fp32; CPU autocast leaves softmax
# in its input's dtype. Last, {glue:text}`memory_split`.
#
# ### Recorded GPU results
#
# `python -m mlsys.experiments` runs these four experiments in GPU sizes (the presets `small` to
# `2.7B`; fp16 and bf16 autocast dtypes on CUDA, whose op lists differ from the CPU's).
# {glue:text}`missing_records`

# %% tags=["hide-input"]
missing = glue("missing_records", experiments.show_records(
    ("autocast_dtypes", "amp_speed", "autocast_overhead", "amp_memory"),
    shows={"amp_memory": amp_memory.show}))

# %% [markdown]
# ```{admonition} Takeaway
# :class: tip
# Autocast runs the matmuls from 16-bit copies of fp32 weights and keeps the loss and the stored
# gradients in fp32. Both it and the mixed recipe hold {glue:text}`q_mixed_bpp` bytes per
# parameter, so only the activations change: with bf16 weights the `xl` step totals
# {glue:text}`mixed_over_fp32:.2f`× fp32's, under autocast on a GPU
# {glue:text}`amp_over_fp32:.2f`× (its fp32 norms, per-matmul copies and fp32 softmax). fp16
# needs a loss scale; bf16 needs an fp32 accumulator in reductions and an fp32 master copy (or
# Kahan or stochastic rounding) for small updates; epsilon is not the problem.
# ```
#
# ## Exercises
#
# ### Q1 (multi-step) The xl preset on one H100, four recipes
#
# For `xl` at batch 4 × 1,024 on an H100 ({glue:text}`q1_hbm:.0f` GB): (a) model states and saved
# activations under fp32 AdamW, bf16 autocast, the mixed recipe and pure bf16; (b) from (a), which
# fit; (c) for each recipe that fits, the lower bound on the step's matmul time at its matmul peak
# (bf16 for the 16-bit matmuls; TF32 for fp32 ones), and how much faster the fastest of them is
# than fp32 at TF32 would be.

# %% tags=["hide-cell"]
q1 = {label: r["total_bytes"] / 1e9 for label, r in napkin.items()}
fits = [label for label, gb in q1.items() if gb * 1e9 <= SPEC.hbm_bytes]
step_flops = flops.transformer_flops(cfg, BATCH, SEQ).training_matmul_flops
times = {label: step_flops / SPEC.peak_flop_per_s({"fp32": "tf32"}.get(r["matmul_dtype"], "bf16"))
         * 1e3 for label, r in napkin.items()}  # ms
fastest = min(fits, key=times.get) if fits else None
assert q1["bf16 autocast"] > q1["bf16 mixed AdamW"] > q1["pure bf16 AdamW"]
assert fastest is None or times[fastest] <= times["fp32 AdamW"]
short = dict(zip(("fp32", "amp", "mixed", "pure"), q1.values(), strict=True))
for name, value in {"q1_hbm": SPEC.hbm_bytes / 1e9, **{f"q1_{k}": gb for k, gb in short.items()},
                    "q1_fits": ", ".join(fits) or "none", "q1_bpp": ", ".join(
                        str(memory.recipe(r["recipe"]).bytes_per_param) for r in napkin.values()),
                    "q1_times": "; ".join(f"{k} {times[k]:.0f} ms" for k in fits) or "none",
                    "q1_t_tf": times["fp32 AdamW"],
                    "q1_speedup": times["fp32 AdamW"] / times[fastest] if fastest else 1.0}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# (a) Model states are parameters × bytes per parameter of the recipe ({glue:text}`q1_bpp` B);
# saved activations come from `activations.saved_bytes` in the model's dtype, and for autocast from
# `amp_memory.autocast_saved_bytes` (CUDA's lists). Sums: fp32 {glue:text}`q1_fp32:.1f` GB,
# autocast {glue:text}`q1_amp:.1f` GB, mixed {glue:text}`q1_mixed:.1f` GB, pure bf16
# {glue:text}`q1_pure:.1f` GB. (b) Within {glue:text}`q1_hbm:.0f` GB: {glue:text}`q1_fits`.
# (c) The step's matmul FLOPs (`flops.transformer_flops`: about 6 per parameter and token, plus
# attention's) over the peak of the format the matmuls run in: {glue:text}`q1_times`. At TF32's
# peak fp32 weights would need {glue:text}`q1_t_tf:.0f` ms, {glue:text}`q1_speedup:.1f`× as long
# as the fastest recipe that fits.
# ```
#
# ### Q2 (find the error) Epsilon in fp16
#
# "LayerNorm must stay in fp32 under fp16 autocast because its epsilon, 1e-5, is below fp16's
# smallest normal number and rounds away." What is wrong, and what does need fp32?

# %% tags=["hide-cell"]
eps16 = torch.tensor(1e-5).half()
assert eps16.item() == e16.stored > 0  # 1e-5 survives the cast: subnormal, not zero
tiny = norms.eps_facts(1e-8, "fp16")
assert tiny.stored == 0 and e16.rel_error < 0.01
row = torch.full((1, NORM_D), 1.1 * overflow_rms).half()  # an rms just past the first limit
assert torch.isinf(row.pow(2).sum(-1) / NORM_D) and torch.isfinite(row.pow(2).mean(-1)).all()
print(f"1e-5 in fp16: {eps16.item():.6g}; 1e-8: {tiny.stored:g}; at rms {1.1 * overflow_rms:.2f}"
      f" the fp16 sum / d is inf, torch's mean {row.pow(2).mean().item():.1f}")

# %% [markdown]
# ```{dropdown} Answer
# The error is "rounds away". 1e-5 is subnormal in fp16 but stored as
# {glue:text}`eps16_stored:.6g`, {glue:text}`eps16_err:.2f`% off, and it is absorbed by any mean
# square from {glue:text}`eps_absorbed16:g` up, in fp16 as in any format once the mean square is
# large enough. Only much smaller values (1e-8) round to zero. What needs fp32 is the range of the
# squares and the accumulator of their sum. A sum kept in fp16 and then divided overflows once the
# rms reaches {glue:text}`overflow_sum:.1f` for $d$ = {glue:text}`norm_d`; torch's
# `x.pow(2).mean()` divides inside its fp32 accumulator and overflows only at rms
# {glue:text}`overflow_mean:.1f`, as the cell shows on a row between the two; and a 16-bit running
# sum stalls.
# ```
#
# ### Q3 (multi-step) Which weights stall?
#
# A bf16 weight of 0.3 receives AdamW updates of size $10^{-4}$. Does it move? From what magnitude
# do weights stop moving at that update size?

# %% tags=["hide-cell"]
th = stall_threshold(0.3, "bf16")
limit = next(2.0**k for k in range(-20, 10) if stall_threshold(2.0**k, "bf16") >= 1e-4)
assert th == 2.0 ** (-2 - 7) / 2 and stall_threshold(limit / 2, "bf16") < 1e-4
w = torch.tensor([0.3, limit, limit / 2], dtype=torch.bfloat16)  # bf16 itself adds the update
assert ((w + 1e-4) != w).tolist() == [1e-4 > th, False, True]
glue("q3_moves", "it moves" if 1e-4 > th else "it does not move")
print(f"half the spacing at 0.3: {glue('q3_th', th):.2e}; updates of 1e-4 stall from "
      f"{glue('q3_limit', limit):g}")

# %% [markdown]
# ```{dropdown} Answer
# 0.3 lies in $[2^{-2}, 2^{-1})$, where bf16's 7 mantissa bits space numbers $2^{-2-7}$ apart; an
# update must exceed half of that, {glue:text}`q3_th:.2e`: {glue:text}`q3_moves`. The threshold
# doubles with every power of two, so updates of $10^{-4}$ vanish for every weight of magnitude
# {glue:text}`q3_limit:g` or more.
# ```
#
# ### Q4 (code) The dynamic loss-scale rule
#
# Write `loss_scales(finite, init_scale, growth_interval)`: the scale each step multiplies its loss
# by, given whether each step's gradients came out finite. An overflowing step halves the scale and
# restarts the count; `growth_interval` finite steps in a row double it. The check runs your
# function on the overflow pattern of the sawtooth run above and compares it with the scales that
# run used and with `torch.amp.GradScaler`'s, driven by the same pattern.

# %%
def loss_scales(finite, init_scale, growth_interval):  # <- your code here
    """The scale used at each step: a list as long as `finite`."""
    raise NotImplementedError("write the dynamic loss-scale rule")


# %% tags=["hide-cell"]
# The book's solution (opened on demand). `solved_by` checks the reader's function once it is
# written, and the book's while it is not.
def loss_scales_solution(finite, init_scale, growth_interval):
    scale, in_a_row, used = init_scale, 0, []
    for ok in finite:
        used.append(scale)
        in_a_row = in_a_row + 1 if ok else 0
        if not ok:
            scale /= 2
        elif in_a_row == growth_interval:
            scale, in_a_row = 2 * scale, 0
    return used


pattern = [r["finite"] for r in trace]
result, whose = book.solved_by(loss_scales, loss_scales_solution, pattern, 2.0**24,
                               GROWTH_INTERVAL)
torch_scales = mp.gradscaler_scales(pattern, init_scale=2.0**24, growth_interval=GROWTH_INTERVAL)
assert result == torch_scales == [r["scale"] for r in trace]
glue("q4_steps", len(pattern))
print(f"checked: {whose} solution gives GradScaler's scale at each of {len(pattern)} steps")

# %% [markdown]
# ```{dropdown} Answer
# Keep the scale and a count of finite steps in a row. Each step first records the scale it used;
# then an overflow halves the scale and resets the count, and a finite step adds one to the count,
# doubling the scale (and resetting the count) when it reaches `growth_interval`. The hidden cell
# holds the book's version; over the {glue:text}`q4_steps` steps of the run it gives the same
# scales as the book's `DynamicLossScaler` and as `torch.amp.GradScaler`.
# ```
#
# ### Q5 (multi-step) A static loss scale from the histogram
#
# Take the debug model's gradients of the histogram above. (a) What is the largest power-of-two
# loss scale that keeps every entry below fp16's max? (b) At that scale, what share of the entries
# is still subnormal, and what share rounds to zero? (c) What is the smallest power-of-two scale at
# which no entry rounds to zero, and how many doublings lie between (c) and (a)?

# %% tags=["hide-cell"]
g_max, g_min = (f(float(f(g[g != 0].abs())) for g in grads) for f in (max, min))
s_max = 2.0 ** math.floor(math.log2(FORMATS["fp16"].max / g_max))
s_min = 2.0 ** math.floor(math.log2(diagrams.zone_limits("fp16")["underflow"][1] / g_min) + 1)
at_max = diagrams.zone_shares(grads, "fp16", scale=s_max)
assert at_max["overflow"] == 0 and diagrams.zone_shares(grads, scale=2 * s_max)["overflow"] > 0
assert diagrams.zone_shares(grads, scale=s_min)["underflow"] == 0 < diagrams.zone_shares(
    grads, scale=s_min / 2)["underflow"]
for name, value in {"q5_gmax": g_max, "q5_smax": mp.power_text(s_max), "q5_gmin": g_min,
                    "q5_sub": 100 * at_max["subnormal"], "q5_under": 100 * at_max["underflow"],
                    "q5_smin": mp.power_text(s_min), "q5_window": math.log2(s_max / s_min),
                    }.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# (a) The largest |gradient| is {glue:text}`q5_gmax:.3g`; $65504 / g_{max}$ rounded down to a
# power of two gives $S$ = {glue:text}`q5_smax` (one doubling more overflows). (b) At that
# scale, {glue:text}`q5_sub:.3g`% of the entries are subnormal and {glue:text}`q5_under:.3g`% round
# to zero (`diagrams.zone_shares`). (c) The smallest non-zero |gradient| is
# {glue:text}`q5_gmin:.3g`; it must land above $2^{-25}$, which takes
# $S$ = {glue:text}`q5_smin`: {glue:text}`q5_window:.0f` doublings of room. A static scale
# works for this batch; as training shrinks the gradients (the sawtooth's lower curve), the window
# moves, which is why the scale is adapted.
# ```
#
# ### Q6 (find the error) The seed's autocast lists
#
# The seed explains fp16 autocast on a GPU with three lists: matmuls and convolutions run in fp16;
# "normalization layers (LayerNorm, BatchNorm)", softmax and cross-entropy, reductions (sum, mean),
# exp and log are kept in fp32; and "element-wise operations (add, multiply)" and "activation
# functions (ReLU, GELU)" promote to the widest input dtype. Which ops are on the wrong list, by
# the lists torch itself keeps for CUDA?

# %% tags=["hide-cell"]
wrong = autocast_dtypes.seed_list_errors(ops)  # CUDA's lists, from the table above
assert wrong["batch_norm"] == ("fp32", "none") and all(
    wrong[op] == ("promote", "none") for op in ("add", "mul", "relu", "gelu"))
glue("q6_wrong", "; ".join(f"`{op}` ({a} in the seed, {b} on CUDA)" for op, (a, b) in
                           wrong.items()))
glue("q6_promote", autocast_dtypes.members(ops, "cuda", "promote"))
glue("q6_right", autocast_dtypes.seed_list_right(ops))
print(f"{len(wrong)} ops on the wrong list: {', '.join(wrong)}")

# %% [markdown]
# ```{dropdown} Answer
# By CUDA's lists, as torch computes them in the table of the autocast section:
# {glue:text}`q6_wrong`. BatchNorm is on no list: fp16 in, fp16 out, as the table shows, and so
# for `mean`. Add, multiply, ReLU and GELU are on no list either: they run in their inputs' dtype,
# and with mixed inputs ordinary type promotion, not autocast, gives the wider one. Autocast's
# promote list is short and holds ops such as {glue:text}`q6_promote`, which it intercepts to cast
# every input to the widest. The seed has the rest right: {glue:text}`q6_right`.
# ```
#
# ## Summary
#
# - Mixed precision runs the matmuls in 16 bits. Autocast and the mixed AdamW recipe both keep
#   {glue:text}`q_mixed_bpp` bytes per parameter; only the saved activations change:
#   {glue:text}`mixed_act:.2f`× fp32's with bf16 weights, {glue:text}`amp_act:.2f`× under
#   autocast on a GPU for `xl` (fp32 norms, a copy per matmul, softmax in fp32).
# - Autocast's dtypes are recorded, not assumed: the lists differ between CPU and CUDA, and
#   BatchNorm, add, mul, ReLU and GELU are on none of CUDA's.
# - TF32 gives fp32 code fp16's 10 mantissa bits in the matrix units; PyTorch leaves it off for
#   matmuls by default.
# - fp16's range needs a loss scale (dynamic: back off on overflow, grow after good steps); bf16's
#   precision needs fp32 accumulators and a master copy, Kahan or stochastic rounding for updates.
# - Epsilon 1e-5 is fine in fp16; the squares' range and the sum's accumulator are what matter.
# - fp8 works per tensor with a scale; without one, E5M2 flushes small gradients to zero. Delayed
#   scaling misses a spike; per-block (MX) scales confine an outlier.
