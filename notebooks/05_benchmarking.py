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
# (sec-benchmarking)=
# # Benchmarking and profiling a training step
#
# **Question.** A student timed the forward pass of the `small` preset (4 × 128 tokens) on an
# Ampere GPU (an 80 GB A100, inferred below) at {glue:text}`q_small_128_ms:.1f` ms, and at
# 4 × 256 tokens at {glue:text}`q_small_256_ms:.1f` ms: twice the work in the same time, where the
# A100's fp32 peak says {glue:text}`q_fp32_ms:.1f` ms. How long do a forward pass, a backward pass
# and an AdamW step of the book's presets take,
# where does that time go kernel by kernel, where does the memory go byte by byte, and does each
# agree with what chapters 02–04 predict?
#
# Cheat sheet: {doc}`../book/napkin_onepager`.

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

# %% tags=["hide-cell"]
import statistics
import time

import matplotlib.pyplot as plt
import torch
from IPython.display import display

from mlsys import bench, experiments, hardware, third_party
from mlsys.accounting import activations, flops, flops_by_class, memory, recompute
from mlsys.accounting import bytes as bytes_moved
from mlsys.accounting.params import count_params
from mlsys.book import Table, glue, num, solved_by
from mlsys.diagrams import trace
from mlsys.diagrams.step_memory import draw_step_memory
from mlsys.experiments import (
    compile_step,
    kit,
    step_benchmark,
    step_memory,
    step_profile,
    timing_pitfalls,
)
from mlsys.models.config import TransformerConfig
from mlsys.profiling import profiler

# %% tags=["parameters"]
# Napkin math (nothing measured): the seed's GPU, and the model and batch of the predictions
SEED_GPU = hardware.A100_80GB_SXM  # the student's table came from an Ampere GPU, in fp32
SPEC = hardware.H100_SXM
PRESET, BATCH, SEQ = "small", 4, 512
CHECKPOINT_SEGMENTS = (1, 3, 12)  # blocks per checkpointed segment; sqrt(12) ~ 3
# Measurements: sizes per profile live with each experiment (lib/mlsys/experiments/)
PITFALLS = env.pick(**timing_pitfalls.SIZES)
BENCH = env.pick(**step_benchmark.SIZES)
PROFILE = env.pick(**step_profile.SIZES)
MEMORY = env.pick(**step_memory.SIZES)
COMPILE = env.pick(**compile_step.SIZES)

# %% [markdown]
# Chapters 03 and 04 priced a step in FLOPs and bytes. This chapter measures one: first how to time
# it without fooling oneself, then the time of whole steps against their prediction, then a profile
# that splits the step into classes of kernels, then the memory, allocation by allocation. It
# follows the benchmarking and profiling part of Stanford CS336's second assignment
# {cite}`cs336_2025`, whose answers by one student (the book's seed) are checked throughout: their
# figures are a third party's measurements and are labelled so.
#
# ## Napkin math
#
# ### Time
#
# A training step is one forward, a backward that costs twice the forward's matmul FLOPs, and an
# optimizer step that reads and writes AdamW's state: at least {glue:text}`adamw_b_per_param` bytes
# per parameter in fp32 (`accounting.bytes.adamw_traffic`). With the matmul peak $P$ and bandwidth
# $\beta$:
#
# $$ T_\text{step} \approx \frac{3F_\text{fwd}}{P} + \frac{28N}{\beta}. $$
#
# ```{literalinclude} ../lib/mlsys/experiments/step_benchmark.py
# :pyobject: predicted_times
# ```
#
# The student's run was fp32, whose matmuls run on the A100's CUDA cores ({glue:text}`a100_fp32:.1f`
# TFLOP/s) unless TF32 is switched on ({glue:text}`a100_tf32:.0f` TFLOP/s, tensor cores). TF32
# keeps fp32's 8 exponent bits and only 10 of its 23 mantissa bits (bf16 keeps 7), so the inputs
# of each product are rounded by up to $2^{-11} \approx 5 \times 10^{-4}$, and it is a process-wide
# switch:
# `torch.set_float32_matmul_precision("high")` lets fp32 matmuls use it, `"highest"` (PyTorch's
# default) does not. An "fp32" time means little without the precision it ran at; the timing
# pitfalls below measure both. What their forward times imply, at the batch of 4 the assignment
# uses:

# %% tags=["hide-input"]
adamw_bytes = bytes_moved.adamw_traffic(count_params(TransformerConfig.preset(PRESET)), "fp32")
assert adamw_bytes.total_bytes == 28 * count_params(TransformerConfig.preset(PRESET))  # 28N
glue("adamw_b_per_param", 28)
seed_rows = step_benchmark.third_party_rows(SEED_GPU)
by_key = {(r["preset"], r["seq"]): r for r in seed_rows}
seed_values, seed_table = step_benchmark.seed_summary(SEED_GPU)  # asserts the lessons below
for name, value in seed_values.items():
    glue(name, value)
seed_table

# %% [markdown]
# Source: {cite}`cs336_2025`, a student's answers, on an Ampere GPU (their kernels are
# `ampere_sgemm_*`: fp32 CUDA-core GEMMs, not tensor-core ones). Which one:
# {glue:text}`seed_gpu_text`.
# Read against it: {glue:text}`seed_verdict`. Three lessons are in that table. The `small` preset at
# 128 and 256 tokens is in the overhead regime of {ref}`sec-bytes`: the GPU waits on Python and
# kernel launches, so doubling the work costs nothing. While a step is launch-bound its time follows
# the kernels it issues and what each costs the host, not its FLOPs: the backward issues about
# twice the forward's kernels, but from autograd's C++ engine rather than from Python modules, so
# each costs the host less, and backward / forward stays under 2 (in this chapter's own profile
# below, {glue:text}`profile_launch`). Once the matmuls dominate it is about 2, the ratio of their
# FLOPs. And an fp32 run can approach the fp32 peak, never the TF32 one it did not ask for.
#
# ### Where the FLOPs are, and where the time will be
#
# `flops_by_class.class_flops` puts `accounting.flops` into the classes a profiler sees. For
# `small` at batch 4 × 512 tokens, per training step:

# %% tags=["hide-input"]
cfg = TransformerConfig.preset(PRESET)
class_fl = flops_by_class.class_flops(cfg, BATCH, SEQ, training=True)
fl_share = profiler.shares(class_fl)
glue("norm_flop_pct", 100 * fl_share["normalization"])
glue("matmul_flop_pct", 100 * fl_share["matmul"])
attn_ratio = 2 * cfg.d_head / flops.SOFTMAX_OPS_PER_ELEMENT  # one attention matmul / softmax
glue("attn_flop_ratio", attn_ratio)
glue("seed_ratio", cfg.d_model / cfg.n_heads)
Table(["class", "training FLOPs (G)", "share"],
      [[c, num(v / 1e9), f"{fl_share[c]:.3%}"] for c, v in class_fl.items() if v])

# %% [markdown]
# Matmuls are {glue:text}`matmul_flop_pct:.2f`% of the FLOPs and normalization
# {glue:text}`norm_flop_pct:.2f`%. Ivanov et al. {cite}`ivanov2021data` measured the statistical
# normalizations of a BERT encoder layer (softmax and layer norm) at 0.17% of its FLOPs and 25.5%
# of its runtime, the "0.2% and a quarter" that He {cite}`he2022brrrr` quotes: a memory-bound op's
# time follows its bytes, not its FLOPs. Inside written-out attention, one matmul ($QK^\top$ or
# $PV$) does $2d_\text{head}$ FLOPs per score and the softmax about 5, a ratio of
# $2d_\text{head}/5$ =
# {glue:text}`attn_flop_ratio:.1f` (both matmuls together: $0.8\,d_\text{head}$). The seed calls it
# "roughly 64×": that is $d_\text{model}/n_\text{heads} = d_\text{head}$ =
# {glue:text}`seed_ratio:.0f`, the ratio of $d$ to $h$ in its two $O(\cdot)$ terms, with the
# constants dropped.
#
# ### Memory
#
# At the peak of a step live the weights, gradients and AdamW moments (16 B/param in fp32,
# {ref}`sec-tensors-memory`) and whatever the forward saved for the backward.
# `accounting.activations.saved_bytes` lists those tensors for the book's transformer, tensor by
# tensor, and the tests check it against the tensors autograd really saves (`counters.SavedTensors`,
# a `saved_tensors_hooks` counter) for every preset and both attention backends, exactly. One block
# of `small`, batch 4 × 512, fp32:

# %% tags=["hide-input"]
saved = activations.saved_bytes(cfg, BATCH, SEQ)
sdpa = activations.saved_bytes(cfg, BATCH, SEQ, attention="sdpa")
claim = activations.claimed_layer_bytes(BATCH, SEQ, cfg.d_model, cfg.n_heads)
glue("block_mb", saved.block_bytes / 1e6)
glue("sdpa_block_mb", sdpa.block_bytes / 1e6)
glue("claim_mb", claim / 1e6)
glue("claim_fp32_mb", 4 * claim / 1e6)
assert 4 * claim < saved.block_bytes  # even read as fp32 elements it falls short
parts = saved.components()
Table(["saved by", "naive attention (MB)", "sdpa (MB)"],
      [[name, num(parts[name] / 1e6), num(sdpa.components()[name] / 1e6)] for name in parts
       if parts[name] or sdpa.components()[name]]
      + [["one block", num(saved.block_bytes / 1e6), num(sdpa.block_bytes / 1e6)]])

# %% [markdown]
# A block keeps {glue:text}`block_mb:.0f` MB with written-out attention,
# {glue:text}`sdpa_block_mb:.0f` MB with the fused kernel. A widely shared one-pager gives "~5BSD +
# BHS² bytes" per layer: that is {glue:text}`claim_mb:.0f` MB here, and even read as elements (× 4
# bytes, {glue:text}`claim_fp32_mb:.0f` MB) it leaves out the feed-forward network's inputs and the
# norms: right about the shape (a linear term and a quadratic one), wrong in its units and its
# coefficients.
#
# **Activation checkpointing** keeps only each segment's input and reruns the segment's forward in
# the backward. Segments of $k$ blocks keep $\lceil L/k \rceil$ inputs and, during the backward, one
# segment's activations at a time; Chen et al.'s $k \approx \sqrt{L}$ {cite}`chen2016checkpointing`
# balances the two. The price is usually quoted as "+33%" (one more forward for three); the rerun
# stops early where nothing more is needed, and the head is not rerun:

# %% tags=["hide-input"]
states = memory.model_state_bytes(count_params(cfg), "fp32_adamw")
ck_rows = [["none", num(saved.total_bytes / 1e6), num(saved.peak_bytes / 1e6), "0%",
            num((states + saved.peak_bytes) / 1e9)]]
for k in CHECKPOINT_SEGMENTS:
    a = activations.saved_bytes(cfg, BATCH, SEQ, checkpoint_segment=k)
    share = recompute.recompute_overhead(cfg, BATCH, SEQ, checkpoint_segment=k)
    ck_rows.append([f"segments of {k}", num(a.total_bytes / 1e6), num(a.peak_bytes / 1e6),
                    f"{share:.1%}", num((states + a.peak_bytes) / 1e9)])
overhead_k1 = recompute.recompute_overhead(cfg, BATCH, SEQ, checkpoint_segment=1)
assert overhead_k1 < 1 / 3  # below the quoted +33%
peaks = {k: activations.saved_bytes(cfg, BATCH, SEQ, checkpoint_segment=k).peak_bytes
         for k in CHECKPOINT_SEGMENTS}
assert min(peaks, key=peaks.get) == 1  # one block per segment: the lowest peak
glue("ck_overhead_pct", 100 * overhead_k1)
glue("states_gb", states / 1e9)
Table(["checkpointing", "kept after forward (MB)", "saved at most (MB)",
       "recomputed / step matmul FLOPs", "16 B/param + saved (GB)"], ck_rows)

# %% [markdown]
# Per block ($k = 1$) the rerun costs {glue:text}`ck_overhead_pct:.1f`% of the step's matmul FLOPs,
# not 33%. Here segments of one block also give the lowest peak: a block saves many times its input,
# so holding one segment's worth during the backward costs more than holding more inputs.
#
# ## The code
#
# `profiler.Profile` wraps `torch.profiler` around named phases (a `record_function` range, and an
# NVTX range on a GPU so Nsight Systems shows the same phases) and sorts every op or kernel into a
# class by its name, then by the autograd node or module that ran it:
#
# ```{literalinclude} ../lib/mlsys/profiling/classes.py
# :pyobject: classify
# ```
#
# `memory_meter.meter` reads the live and peak bytes of each phase (on a GPU the caching
# allocator's counters and, on request, its history; on a CPU the profiler's allocation events), and
# `models.checkpointing` checkpoints the unmodified model's blocks:
#
# ```{literalinclude} ../lib/mlsys/models/checkpointing.py
# :pyobject: checkpoint_blocks
# ```
#
# ## Measurement
#
# ### Timing right
#
# Six mistakes, each measured on this machine ({ref}`sec-flops` introduced `mlsys.bench`, which
# avoids the first five: warm-up, synchronization, median and p20–p80 of many samples, optional
# cache flush; the sixth is the fp32 matmul precision above):

# %%
pitfall_rows = timing_pitfalls.run(PITFALLS)
timing_pitfalls.table(pitfall_rows)

# %% [markdown]
# On a CPU every op has finished when its call returns, so synchronizing changes nothing there and
# there are no device events to compare with; on a GPU an unsynchronized host timer measures the
# launches, not the kernels, a synchronized one adds the launch and the wait, and CUDA events time
# the kernel alone (see the recorded runs at the end). Exercise Q4 asks you to write the timer
# yourself.
#
# ### Forward, backward and step against their prediction
#
# Each row times the forward (autograd on), forward + backward and the full step round-robin with
# the matmul and copy probes of {ref}`sec-bytes`, so the prediction uses ceilings measured in the
# same seconds:

# %%
bench_rows = step_benchmark.run(BENCH)
step_benchmark.table(bench_rows)

# %% tags=["remove-input"]
for name, text in step_benchmark.verdicts(bench_rows).items():
    glue(f"bench_{name}", text)
kit.draw(step_benchmark.plot, bench_rows, width=8.0, height=4.0)

# %% [markdown]
# On this machine: {glue:text}`bench_overhead`; {glue:text}`bench_backward`;
# {glue:text}`bench_roof`. Where a model's time barely follows its tokens, the step is paying for
# Python and dispatch, and the measured/predicted ratio is large: the remedy is more work per op (a
# bigger batch) or fewer ops (compilation, below), not faster arithmetic.
#
# ### Where the time goes
#
# One model, a few warm-up steps, then steps profiled phase by phase:

# %%
profile_rows = step_profile.run(PROFILE)
step_profile.phase_table(profile_rows)

# %% tags=["hide-input"]
for name, text in step_profile.verdicts(profile_rows).items():
    glue(f"profile_{name}", text)
glue("profile_model", f"`{PROFILE.preset}`, batch {PROFILE.batch} × {PROFILE.seq} tokens")
step_profile.class_table(profile_rows)

# %% tags=["remove-input"]
kit.draw(step_profile.plot, profile_rows, width=9.0, height=3.8)

# %% [markdown]
# For {glue:text}`profile_model`: {glue:text}`profile_matmul`. The optimizer runs no matmul at all,
# so the matmul share of the full step is below that of forward and backward. He's comparison on the
# book's model: {glue:text}`profile_normalization`. The slowest operations that are not matmuls,
# and inside attention, op by op at the model's shapes (timed apart, round-robin):

# %% tags=["hide-input"]
display(step_profile.op_table(profile_rows, top=8, exclude=("matmul",)))
step_profile.core_table(profile_rows)

# %% [markdown]
# In attention's core: {glue:text}`profile_attention`. The profiler's own cost, the same step with
# and without it: {glue:text}`profile_overhead`.
#
# ### The trace: the host's calls against the device's work
#
# The tables sum each op's time over the step; a trace keeps the order. Below, the first
# {glue:text}`trace_ops` ops of the profiled forward on a time axis. The upper lane is what the
# model's Python code called, one top-level op after another (`aten::linear`, `aten::mul`, ...).
# The lower lane is where the arithmetic ran: on a GPU, each kernel on the device, launched
# asynchronously; on a CPU, which has no device apart from itself, the time each op with a kernel
# of its own spends in its own body (`aten::addmm`'s matrix product; not `aten::linear`, a wrapper
# that only calls other ops). The hatched gaps are the time in which nothing computes: Python, the
# dispatcher, wrappers and, under a profiler, the profiler's bookkeeping. This is the overhead
# regime of {ref}`sec-bytes` seen directly:

# %% tags=["remove-input"]
first_forward = step_profile.trace(profile_rows)
glue("trace_ops", len(first_forward.host))
glue("trace_sentence", step_profile.trace_sentence(profile_rows))
trace.draw_trace(first_forward)
plt.show()

# %% [markdown]
# In this trace, {glue:text}`trace_sentence`. On a GPU the same picture separates further: the host
# runs ahead, queueing kernels, and the device idles only where the host falls behind (small
# kernels, a `.item()` that waits for a result, a Python loop); a step whose device lane is
# mostly gaps gets faster with fewer, larger kernels (a bigger batch, fusion, `torch.compile`,
# CUDA graphs), not with faster arithmetic.
#
# ### Where the memory goes
#
# For each length a fresh model takes a warm-up step (AdamW creates its moments in the first), then
# one step whose phases are read by `memory_meter.meter`. Bytes count from the start of that
# step, above what is resident (weights, moments, buffers, the batch):

# %%
memory_rows = step_memory.run(MEMORY)
step_memory.peak_table(memory_rows)

# %% tags=["remove-input"]
for name, text in step_memory.verdicts(memory_rows).items():
    glue(f"memory_{name}", text)
kit.draw(step_memory.plot, memory_rows, ncols=2, width=11.0, height=4.0)

# %% [markdown]
# The counter and the formula agree: {glue:text}`memory_saved`. Against the napkin:
# {glue:text}`memory_napkin`.
#
# The same step, every allocation sorted by what it is: the parameters and AdamW's moments,
# resident throughout; the **activations**, made by the forward and still alive when it ends (what
# autograd saved), freed one by one as the backward passes them; the **gradients**, made by the
# backward and alive when it ends, freed by `zero_grad`; and the **temporaries**, everything that
# lives and dies inside one phase. On the left, measured at {glue:text}`memory_ck_seq` tokens; on
# the right, predicted on the same phases from the accounting alone: activations growing linearly
# to `saved_bytes` over the forward, then handing their place to the gradients over the backward.
# The dashed line is the napkin's 16 B/param + activations:

# %% tags=["remove-input"]
glue("memory_ck_seq", MEMORY.timeline_seq)
measured_step, predicted_step = step_memory.step_parts(memory_rows)
napkin_b = step_memory.napkin_bytes(memory_rows, MEMORY.timeline_seq)
glue("parts_measured_mb", sum(measured_step.peak()[1].values()) / 1e6)
glue("parts_predicted_mb", sum(predicted_step.peak()[1].values()) / 1e6)
glue("parts_napkin_mb", napkin_b / 1e6)
draw_step_memory(measured_step, predicted_step, napkin_bytes=napkin_b,
                 titles=[f"measured ({env.device_name()})", "predicted (accounting)"])
plt.show()

# %% [markdown]
# Peaks: {glue:text}`parts_measured_mb:.3g` MB measured, {glue:text}`parts_predicted_mb:.3g` MB
# predicted, {glue:text}`parts_napkin_mb:.3g` MB for the napkin. In parts, at the peak:

# %% tags=["hide-input"]
step_memory.breakdown_table(memory_rows)

# %% [markdown]
# {glue:text}`memory_holds`. During the backward each gradient is made as the saved tensors that
# produced it are freed, so "16 B/param + activations" counts in full two things that are never
# alive in full together: it overstates the peak unless temporaries (the loss's gradient, batch ×
# tokens × vocabulary floats; the optimizer's scratch) outgrow the gradients still missing. With
# checkpointing, at {glue:text}`memory_ck_seq` tokens:

# %% tags=["hide-input"]
step_memory.checkpoint_table(memory_rows)

# %% [markdown]
# {glue:text}`memory_checkpoint`.
#
# #### The seed's activation arithmetic for the 2.7B model
#
# The student derived $B S\,(5.9375 + 0.0078125\,S)$ MB of activations for the 2.7B preset, added
# "52.0 GB" of model states, and tabulated batch 4. Their table, their own formula, the exact count
# and the napkin, with their measured peaks:

# %% tags=["hide-input"]
seed_memory = step_memory.seed_rows()
at = {r["seq"]: r for r in seed_memory}
for name, value in step_memory.seed_values(seed_memory).items():
    glue(name, value)
assert at[512]["claimed_forward_gb"] == round(at[512]["formula_gib"] * 1024 / 1000, 1)
for seq_bad in (256, 1024):  # the table does not follow the formula
    assert abs(at[seq_bad]["formula_gib"] - at[seq_bad]["claimed_forward_gb"]) > 0.8
assert all(r["measured_training_gb"] < r["napkin_gb"] for r in seed_memory
           if r["measured_training_gb"])
states_27 = memory.model_state_bytes(count_params(TransformerConfig.preset("2.7B")), "fp32_adamw")
glue("seed_states_gb", states_27 / 1e9)
glue("seed_states_gib", states_27 / 2**30)
Table(["seq", "their table (GB)", "their formula (GiB)", "their formula (GB)", "exact (GB)",
       "their training total (GB)", "16 B/param + exact (GB)", "their measured peak (GB)"],
      [[r["seq"], r["claimed_forward_gb"], num(r["formula_gib"]), num(r["formula_gb"]),
        num(r["exact_gb"]), r["claimed_training_gb"], num(r["napkin_gb"]),
        r["measured_training_gb"] or "out of memory"] for r in seed_memory])

# %% [markdown]
# The errors, found by the count: the table does not follow its own formula (at 256 tokens the
# formula gives {glue:text}`seed_256_formula:.2f` GiB, the table {glue:text}`seed_256_claim`; at
# 1,024, {glue:text}`seed_1024_formula:.2f` against {glue:text}`seed_1024_claim`); at 512 tokens the
# formula's 20,352 MB (of $2^{20}$ bytes) is written {glue:text}`seed_512_claim` GB, divided by
# 1,000 ({glue:text}`seed_512_gib:.1f` GiB or {glue:text}`seed_512_gb:.1f` GB); the model states are
# {glue:text}`seed_states_gb:.1f` GB ({glue:text}`seed_states_gib:.1f` GiB), not 52.0 in either
# unit. In the formula itself, the scores *and* the probabilities are counted as saved (autograd
# keeps only the probabilities and a boolean mask), the FFN output is counted though nothing saves
# it, and the norms' saved tensors, SiLU's input and the logits are missing; the errors partly
# cancel. Their measured peaks sit below 16 B/param + activations.
#
# ### torch.compile
#
# The whole model compiled once (the optimizer stays eager), timed against eager in each mode; then
# the length changes twice, to show when it compiles again:

# %%
compile_rows = compile_step.run(COMPILE)
compile_step.table(compile_rows)

# %% tags=["remove-cell"]
for name, text in compile_step.verdicts(compile_rows).items():
    glue(f"compile_{name}", text)

# %% [markdown]
# {glue:text}`compile_speed`. Shapes: {glue:text}`compile_shapes`. A mean over calls that include
# the compilation, or a difference smaller than the spread, is not a speed-up: the verdict above is
# given only when the p20–p80 ranges do not overlap.
#
# ### Recorded GPU results
#
# `python -m mlsys.experiments` runs the five experiments of this chapter in GPU sizes (every preset
# from `small` to `2.7B` at 128 to 1,024 tokens, out-of-memory rows kept; the 2.7B memory sweep of
# the seed) and records them under `results/`. Every record present is shown below through the
# same functions as the live run. {glue:text}`missing_records`

# %% tags=["remove-input"]
missing = glue("missing_records", experiments.show_records(
    ("timing_pitfalls", "step_benchmark", "step_profile", "step_memory", "compile_step"),
    **step_benchmark.record_views()))

# %% [markdown]
# ```{admonition} Takeaway
# :class: tip
# Time a step with warm-up, synchronization and the median of many samples, against ceilings
# measured alongside. Doubling the tokens shows whether a model is overhead-bound
# ({glue:text}`bench_overhead`), and a trace shows it directly, as gaps between kernels. In a
# profile, time shares and FLOP shares part ways: matmuls are {glue:text}`matmul_flop_pct:.1f`% of
# the FLOPs, and {glue:text}`profile_normalization`. The peak memory is 16 B/param plus what the
# forward saves, minus what the backward has freed: {glue:text}`memory_napkin`.
# ```
#
# ## Exercises
#
# ### Q1 (multi-step) Does the 2.7B model train on one H100?
#
# The 2.7B preset, fp32 AdamW, batch 4 × 1,024 tokens, SDPA attention: the run that the seed
# reports as out of memory on its 80 GB A100 (with xl at 1,024 tokens; both ran at 512). (a) How
# many bytes do the model states and the saved activations take? (b) With (a)'s bytes, does it fit
# in an H100's {glue:text}`q1_device_gb:.0f` GB, and does the same count explain the seed's four
# runs (its written-out attention)? (c) With every block checkpointed, what is the most that is
# saved at once, does it fit now, and what share of the step's matmul FLOPs is recomputed? (d) At
# the seed's achieved forward rate for 2.7B at 512 tokens, how long do the step's matmuls take, and
# how much longer does (c)'s recomputation make it?

# %% tags=["hide-cell"]
big = TransformerConfig.preset("2.7B", attention="sdpa")
q1_states = memory.model_state_bytes(count_params(big), "fp32_adamw")
q1_plain = activations.saved_bytes(big, 4, 1024)
q1_ck = activations.saved_bytes(big, 4, 1024, checkpoint_segment=1)
q1_share = recompute.recompute_overhead(big, 4, 1024, checkpoint_segment=1)
device_bytes = SPEC.hbm_bytes
assert q1_states + q1_plain.total_bytes > device_bytes  # (b) does not fit as it is
assert device_bytes > q1_states + q1_ck.peak_bytes  # (c) fits with every block checkpointed
q1_rate = by_key[("2.7B", 512)]["achieved_flop_per_s"]
q1_fwd = flops.transformer_flops(big, 4, 1024).forward_matmul_flops
q1_step = 3 * q1_fwd / q1_rate
seed_need = {(p, n): memory.model_state_bytes(count_params(TransformerConfig.preset(p)),
                                               "fp32_adamw")
             + activations.saved_bytes(TransformerConfig.preset(p), 4, n).total_bytes
             for p in ("xl", "2.7B") for n in (512, 1024)}  # the seed's model: naive attention
assert {k for k, v in seed_need.items() if v > SEED_GPU.hbm_bytes} == {("xl", 1024), ("2.7B", 1024)}
for name, value in {"q1_device_gb": device_bytes / 1e9, "q1_states": q1_states / 1e9,
                    "q1_plain": q1_plain.total_bytes / 1e9, "q1_ck": q1_ck.peak_bytes / 1e9,
                    "q1_sum": (q1_states + q1_plain.total_bytes) / 1e9,
                    "q1_ck_sum": (q1_states + q1_ck.peak_bytes) / 1e9,
                    "q1_share": 100 * q1_share, "q1_fwd_tf": q1_fwd / 1e12,
                    "q1_rate": q1_rate / 1e12, "q1_step": q1_step,
                    "q1_extra": q1_step * q1_share, "q1_seed_27": seed_need[("2.7B", 1024)] / 1e9,
                    "q1_seed_xl": seed_need[("xl", 1024)] / 1e9,
                    "q1_seed_fit": seed_need[("2.7B", 512)] / 1e9}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# (a) Model states: 16 B/param × the parameter count = {glue:text}`q1_states:.1f` GB; saved
# activations (`saved_bytes`, batch 4 × 1,024): {glue:text}`q1_plain:.1f` GB.
# (b) No: their sum, {glue:text}`q1_sum:.1f` GB, passes {glue:text}`q1_device_gb:.0f` GB before
# any temporary. The same count with written-out attention gives the seed's four runs: 2.7B and
# xl at 1,024 tokens need {glue:text}`q1_seed_27:.0f` and {glue:text}`q1_seed_xl:.0f` GB, more than
# 80, while the largest run that worked, 2.7B at 512, needs {glue:text}`q1_seed_fit:.0f` GB.
# (c) Checkpointing keeps each block's input and reruns one block at a time: at most
# {glue:text}`q1_ck:.1f` GB saved at once, so states + saved = {glue:text}`q1_ck_sum:.1f` GB, which
# fits; the rerun costs {glue:text}`q1_share:.1f`% more matmul FLOPs.
# (d) The forward's matmuls are {glue:text}`q1_fwd_tf:.1f` TFLOP; at their
# {glue:text}`q1_rate:.1f` TFLOP/s, forward + backward (3×) take about {glue:text}`q1_step:.1f` s,
# and the rerun adds {glue:text}`q1_share:.1f`% of that: about {glue:text}`q1_extra:.2f` s.
# ```
#
# ### Q2 (find the error) Compiling slows the step down?
#
# The seed's `torch.compile` table for the 2.7B preset at 128 tokens gives a full step of
# {glue:text}`q2_compiled:.3f` ± {glue:text}`q2_compiled_std:.3f` s compiled and
# {glue:text}`q2_eager:.3f` ± {glue:text}`q2_eager_std:.3f` s eager (mean ± std), and its
# forward + backward of {glue:text}`q2_fb_compiled:.3f` s compiled against
# {glue:text}`q2_fb_eager:.3f` s. Conclusion drawn: "compiling slows the step down by 7%". What is
# wrong, and what should the step have taken?

# %% tags=["hide-cell"]
seed_compile = {(r.mode, r.seq): r for r in third_party.CS336_STUDENT_COMPILE}
q2_step, q2_fb = seed_compile[("step", 128)], seed_compile[("forward+backward", 128)]
q2_optimizer = q2_step.eager_s - q2_fb.eager_s  # the optimizer stays eager in both
q2_expected = q2_fb.compiled_s + q2_optimizer
q2_share, q2_slow = timing_pitfalls.slow_calls(q2_step.compiled_s, q2_step.compiled_std_s,
                                               q2_expected)  # what lifts the mean and the std
q2_one = q2_step.compiled_std_s * 10 / 3  # the one slow call among ten that gives the std
assert q2_one / 10 < (q2_step.compiled_s - q2_expected) / 1.5 and 0.25 < q2_share < 0.35
assert q2_expected < q2_step.eager_s < q2_step.compiled_s  # the mean contradicts its own parts
assert q2_step.compiled_std_s > 40 * q2_step.eager_std_s
for name, value in {"q2_compiled": q2_step.compiled_s, "q2_compiled_std": q2_step.compiled_std_s,
                    "q2_eager": q2_step.eager_s, "q2_eager_std": q2_step.eager_std_s,
                    "q2_fb_compiled": q2_fb.compiled_s, "q2_fb_eager": q2_fb.eager_s,
                    "q2_expected": q2_expected, "q2_optimizer": q2_optimizer,
                    "q2_std_ratio": q2_step.compiled_std_s / q2_step.eager_std_s,
                    "q2_one": q2_one, "q2_share": 100 * q2_share,
                    "q2_slow": q2_slow, "q2_rise": q2_step.compiled_s - q2_expected}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# The compiled step's spread is {glue:text}`q2_std_ratio:.0f` times eager's: its mean is pulled by
# slow calls, most likely compilations inside the timed loop (a first call, recompilations for new
# shapes). The parts say what a step costs: the compiled forward + backward,
# {glue:text}`q2_fb_compiled:.3f` s, plus the eager optimizer, {glue:text}`q2_eager:.3f` −
# {glue:text}`q2_fb_eager:.3f` = {glue:text}`q2_optimizer:.3f` s, is {glue:text}`q2_expected:.3f` s:
# faster than eager, not slower. The mean sits {glue:text}`q2_rise:.3f` s above that. One slow
# call among ten would have to be {glue:text}`q2_one:.2f` s slow to give the standard deviation,
# and would lift the mean by a tenth of that: too little. A share $p$ of calls, each $\delta$ slow,
# lifts the mean by $p\delta$ and gives a deviation of $\delta\sqrt{p(1-p)}$: both fit with
# $p$ = {glue:text}`q2_share:.0f`% (three calls in ten) about {glue:text}`q2_slow:.2f` s slow.
# Report the first calls apart and
# the median with p20–p80, as `compile_step` does, and count the recompilations.
# ```
#
# ### Q3 The first tensor of the backward
#
# The first thing the backward makes is the gradient of the loss with respect to the logits. How
# large is it for the `laptop` preset at 4 × 128 tokens, against the activations saved by then, and
# how does it grow with the vocabulary?

# %% tags=["hide-cell"]
lap = TransformerConfig.preset("laptop")
logits_grad = 4 * 128 * lap.vocab_size * 4  # d(loss)/d(logits), fp32
q3_saved = activations.saved_bytes(lap, 4, 128)
assert logits_grad < q3_saved.total_bytes  # smaller than the saved activations, on top of them
big_vocab_grad = 4 * 128 * 128_256 * 4  # the same batch with a Llama-3-sized vocabulary
assert big_vocab_grad > q3_saved.blocks_bytes  # more than every block saves
for name, value in {"q3_mb": logits_grad / 1e6, "q3_saved_mb": q3_saved.total_bytes / 1e6,
                    "q3_vocab": lap.vocab_size, "q3_big_mb": big_vocab_grad / 1e6,
                    "q3_blocks_mb": q3_saved.blocks_bytes / 1e6}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# Batch × tokens × vocabulary fp32 values: 4 × 128 × {glue:text}`q3_vocab` × 4 bytes =
# {glue:text}`q3_mb:.1f` MB, made while the {glue:text}`q3_saved_mb:.1f` MB the forward saved are
# still alive (the backward frees each saved tensor only once its own gradient is done). It grows
# with the vocabulary, not with the model's width: with a vocabulary of 128,256 it would be
# {glue:text}`q3_big_mb:.0f` MB, more than the {glue:text}`q3_blocks_mb:.0f` MB all the blocks
# save, which is why fused and chunked cross-entropy kernels exist.
# ```
#
# ### Q4 (code) A timer you can trust
#
# Write `time_it`: `warmup` untimed calls of `fn`, then `repeats` calls each timed alone with
# `clock` (the device synchronized before and after each, on a GPU), and the **median** of those
# samples. It is checked on a simulated kernel whose clock is exact
# (`timing_pitfalls.SimulatedKernel`): its first five calls are cold (20 ms), then each call takes
# 1 ms, except one 40 ms outlier. Your answer must equal `bench.benchmark`'s median on the same
# kernel, with 5 warm-up calls and 7 repeats. What would a timer without warm-up report, and one
# that takes the mean?

# %%
def time_it(fn, *, warmup, repeats, device, clock=time.perf_counter):  # <- your code here
    """Median seconds per call of `fn()` after `warmup` untimed calls, over `repeats` calls."""
    raise NotImplementedError("write the timer")


# %% tags=["hide-cell"]
# The book's solution (opened on demand). `solved_by` checks the reader's function once it is
# written, and the book's while it is not.
def time_it_solution(fn, *, warmup, repeats, device, clock=time.perf_counter):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = clock()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        samples.append(clock() - start)
    return statistics.median(samples)


costs = timing_pitfalls.SIMULATED_COSTS_S
kernel = timing_pitfalls.SimulatedKernel(costs)
q4, whose = solved_by(time_it, time_it_solution, kernel, warmup=5, repeats=7, device="cpu",
                      clock=kernel.clock)
kernel = timing_pitfalls.SimulatedKernel(costs)
reference = bench.benchmark(kernel, warmup=5, repeats=7, device="cpu", clock=kernel.clock)
assert q4 == reference.median_s and abs(q4 - 1e-3) < 1e-12, (q4, reference.median_s)
q4_mean = glue("q4_mean_ms", statistics.fmean(reference.samples_s) * 1e3)  # warm, but the mean
kernel = timing_pitfalls.SimulatedKernel(costs)  # a fresh one, timed without warm-up
cold = bench.benchmark(kernel, warmup=0, repeats=7, device="cpu", clock=kernel.clock)
q4_cold = glue("q4_cold_ms", cold.median_s * 1e3)
assert abs(q4_cold - 20) < 1e-9 and q4_mean > 6 * q4 * 1e3
print(f"checked: {whose} timer gives {q4 * 1e3:.3g} ms, as bench.benchmark does")

# %% [markdown]
# ```{dropdown} Answer
# Warm-up first (the cold calls are not the steady state), then time each call on its own,
# synchronizing on a GPU so that the clock sees the kernel and not its launch, and take the median,
# which one outlier cannot move: 1 ms, as `bench.benchmark` says. Without warm-up the first seven
# calls are five cold ones and two warm ones: their median is {glue:text}`q4_cold_ms:.0f` ms. With
# warm-up but the mean, the 40 ms outlier lifts seven samples to {glue:text}`q4_mean_ms:.2f` ms.
# The book's solution is in the hidden cell above; `bench.benchmark` adds CUDA events, a minimum
# total time and a cache flush.
# ```
#
# ### Q5 (find the error) The forward's kernels, read from the whole step
#
# The assignment asks which kernels besides matmuls take non-trivial time *in the forward pass*.
# The seed answers with a copy kernel at 3.6%, two multiply kernels at 2.4% and 1.3% and an add at
# 1.3%. Its forward-only profile lists two GEMM kernels at 43% each. What is wrong with the answer,
# and what does this chapter's profile say, forward only against forward + backward
# (`step_profile.phase_shares`)?

# %% tags=["hide-cell"]
q5_fwd_gemm = sum(step_profile.SEED_FORWARD_SHARES.values())  # the forward-only list
q5_quoted = sum(step_profile.SEED_COMBINED_SHARES.values())
assert round(sum(step_profile.SEED_COMBINED_GEMMS), 3) == 0.861 and 1 - q5_fwd_gemm > q5_quoted
q5_f, q5_fb = (step_profile.phase_shares(profile_rows, ph) for ph in (("forward",),
                                                                       ("forward", "backward")))
q5_class = max((c for c in q5_f if c != "matmul"), key=lambda c: abs(q5_f[c] - q5_fb[c]))
for name, value in {"q5_fwd_other": 100 * (1 - q5_fwd_gemm), "q5_quoted": 100 * q5_quoted,
                    "q5_gemms": 100 * sum(step_profile.SEED_COMBINED_GEMMS), "q5_class": q5_class,
                    "q5_f": 100 * q5_f[q5_class], "q5_fb": 100 * q5_fb[q5_class]}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# The shares come from the forward + backward list (the seed says so itself): its GEMMs add up to
# {glue:text}`q5_gemms:.1f`%, and the four kernels it quotes to {glue:text}`q5_quoted:.1f`%, shares
# of a step whose backward runs kernels of its own. The forward-only list leaves
# {glue:text}`q5_fwd_other:.0f`% for everything
# but its two GEMMs, and names none of it: the answer needs the forward's own range
# (`nsys stats` filtered to the forward's NVTX range, or `step_profile.phase_shares(rows,
# ("forward",))`). In this chapter's profile the class that moves most between the two is
# {glue:text}`q5_class`: {glue:text}`q5_f:.1f`% of the forward's op time, against
# {glue:text}`q5_fb:.1f`% of forward + backward.
# ```
#
# ## Summary
#
# - Warm up, synchronize, take the median and p20–p80 of many samples, and measure the ceilings in
#   the same run; a verdict is withheld when the numbers disagree with each other.
# - Predicted step time: $3F_\text{fwd}/P + 28N/\beta$; the seed's small model's forward took
#   {glue:text}`seed_small_over:.1f` times its time at the fp32 peak at 128 tokens (the overhead
#   regime), and its backward cost less than twice its forward.
# - An fp32 run on an A100 reaches the fp32 CUDA-core peak at best, not TF32's, unless
#   `torch.set_float32_matmul_precision("high")` lets its matmuls run in TF32: say which.
# - A trace shows the overhead regime as gaps between kernels: the host's calls set the pace.
# - Matmuls are almost all the FLOPs; memory-bound ops such as normalization take a share of the
#   time out of proportion to theirs (He; here: {glue:text}`profile_normalization`). One attention
#   matmul has $2d_\text{head}/5$ times the softmax's FLOPs.
# - Saved activations are counted exactly by `saved_bytes`; the peak is 16 B/param plus the
#   activations, less what the backward frees before the gradients are complete.
# - Checkpointing every block keeps a block's input and reruns {glue:text}`ck_overhead_pct:.0f`% of
#   the step's matmul FLOPs, not 33%.
