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
# (sec-parallelism)=
# # 4D parallelism
#
# **Question.** A model of {glue:text}`xxl_blocks` blocks with $d_\text{model}$ = {glue:text}`xxl_d`
# and $d_\text{ff}$ = {glue:text}`xxl_f` needs {glue:text}`xxl_h100` H100s just to hold its training
# state. How do sharding (FSDP), tensor, pipeline and context parallelism split the memory, the
# compute and the communication, and what is the smallest batch that keeps every device
# compute-bound?
#
# Cheat sheet: {doc}`../book/parallelism_onepager`.

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

# %% tags=["hide-input"]
import math

import matplotlib.pyplot as plt

from mlsys import book, experiments, hardware, plotting, tables
from mlsys.accounting import comms, memory, parallel, parallel_traffic, pipeline, planner
from mlsys.accounting import compute_bound as CB
from mlsys.accounting.flops import transformer_flops
from mlsys.accounting.params import count_params
from mlsys.book import Table, glue
from mlsys.diagrams import parallel as diagrams
from mlsys.distributed import check, cp
from mlsys.experiments import pages, parallel_step
from mlsys.models.config import TransformerConfig

# %% tags=["parameters"]
# Napkin math (nothing measured): the seed's XXL problem on TPU v5p, and H100s for part (a)
XXL, TPU, GPU = parallel.XXL, hardware.TPU_V5P, hardware.H100_SXM
LINK = hardware.LINKS["ici-v5p-axis"]  # W_ici: one mesh axis, both directions
X_FSDP, Y_TP, M_X, M_Y = 16, 4, 2, 1
TORUS = (4, 4, 4)  # the 64 chips of part (c): a 4 x 4 x 4 slice, X along the first axes
SPLITS = ((16, 4, 1), (8, 8, 1), (4, 16, 1), (2, 32, 1), (16, 4, 0.5))  # (X, Y, gathered bytes)
TOKENS_PER_DEVICE = (0, 512, 1_024, 2_048, 4_096, 8_192)  # part (b): the seed gives no batch
PLAN_PRESET, PLAN_CLUSTER, PLAN_DEVICES, PLAN_BATCH, PLAN_SEQ = "2.7B", "dgx-h100", 64, 256, 4_096
PLAN_EFFICIENCY = 0.5  # the planner's examples: assumed share of the peak the kernels reach
MAP_DEVICES = 8  # the decision tree's map: one DGX H100 node, these batches and lengths
MAP_BATCHES = (1, 2, 4, 8, 16, 64, 256)
MAP_SEQS = (1_024, 4_096, 16_384, 65_536, 131_072)
TP_DEGREE, TP_TOKENS, STAGES, MICRO = 4, 2_048, 4, 8  # the diagrams: TP, a pipeline, a mesh
MESH = parallel.ParallelDims(pp=2, dp_shard=4, cp=2, tp=4)  # 64 H100s
TWO_RANKS = {"FSDP": dict(dp_shard=2), "TP": dict(tp=2), "PP": dict(pp=2), "CP": dict(cp=2)}
PARALLEL = env.pick(**parallel_step.SIZES)  # checks on CPU ranks, and the measured experiment

# %% [markdown]
# Data parallelism ({ref}`sec-data-parallel`) copies the model to every device and splits the batch;
# ZeRO shards the optimizer state, gradients and finally the weights. When the model's *state* no
# longer fits even sharded, or the batch cannot grow any more, the model itself must be cut: its
# matrices across devices (tensor parallelism), its layers (pipeline parallelism), its sequence
# (context parallelism). Each moves different bytes at a different moment; this chapter counts them,
# builds each strategy by hand on CPU ranks, checks it against one process, and plans meshes on
# paper. The notation of the compute-bound conditions is the Scaling Book's
# {cite}`austin2025scaling`.
#
# ## Napkin math: the XXL model
#
# The seed's question {cite}`cs336_2025` keeps only the feed-forward blocks, two bias-free linears
# $D \to F \to D$ each, with fp32 master weights, gradients and Adam state, and bf16 activations.
#
# ### (a) The state, and what is saved for backward

# %%
n_xxl = XXL.n_params
states = memory.model_state_bytes(n_xxl, "fp32_adamw")  # fp32 weights, grads, m, v: 16 B/param
shape = parallel.model_shape(XXL, dtype="bf16")
per_token = XXL.n_layers * (shape.act_tp_bytes + shape.act_other_bytes + shape.act_norm_bytes)
assert per_token == XXL.n_layers * 2 * (XXL.d_model + XXL.d_ff)  # each block keeps x and Wx
h100s = math.ceil(states / GPU.hbm_bytes)

# %% tags=["remove-cell"]
for name, value in {"xxl_blocks": XXL.n_layers, "xxl_d": f"{XXL.d_model:,}",
                    "xxl_f": f"{XXL.d_ff:,}", "xxl_params_b": n_xxl / 1e9,
                    "xxl_states_tb": states / 1e12, "xxl_h100": h100s,
                    "xxl_per_token_mb": per_token / 1e6,
                    "xxl_per_1k_gb": per_token * 1_024 / 1e9}.items():
    glue(name, value)

# %% [markdown]
# {glue:text}`xxl_params_b:.1f` billion parameters at 16 bytes each (fp32 weights, gradients, $m$
# and $v$): {glue:text}`xxl_states_tb:.2f` TB, {glue:text}`xxl_h100` H100s' worth before a single
# activation. The question then asks how much is *saved for backward* in bf16: the activations each
# block keeps, its input ($D$ values) for $W_1$'s gradient and $W_1x$ ($F$ values) for $W_2$'s, 2
# bytes each: {glue:text}`xxl_per_token_mb:.1f` MB per token over all blocks,
# {glue:text}`xxl_per_1k_gb:.1f` GB per 1,024 tokens. The seed's answer reads "saved" as "saved by
# using bf16 instead of fp32" and subtracts weight copies; the question is about memory kept for the
# backward pass.
#
# ### (b) Sharding the state and half of the activations
#
# With the state and half of the activations sharded over $N$ devices, a device holding $T$ tokens
# of activations needs
#
# $$ M(N) = \frac{S}{N} + A\,T\left(\frac12 + \frac{1}{2N}\right), $$
#
# $S$ the state, $A$ the bytes per token. A TPU v5p has {glue:text}`tpu_gb:.0f` GB:

# %% tags=["hide-input"]
glue("tpu_gb", TPU.hbm_bytes / 1e9)
fits = parallel_step.fsdp_fit_table(TPU.hbm_bytes, states, per_token, TOKENS_PER_DEVICE)
glue("b_n0", fits.rows[0][1])
glue("b_never", 2 * TPU.hbm_bytes / per_token)  # the unsharded half alone fills the device
fits

# %% [markdown]
# Without activations $N_\text{FSDP} \ge$ {glue:text}`b_n0`; every token added raises it, and from
# {glue:text}`b_never:,.0f` tokens per device the unsharded half of the activations alone fills the
# device: no $N$ is enough. The activations, not the state, decide.
#
# ### (c) When is the forward compute-bound?
#
# Per layer, with $B$ tokens in all, $X$-way FSDP and $Y$-way TP on $N = XY$ chips of $C$ FLOP/s
# linked at $W$ bytes/s per mesh axis (bf16):
#
# $$ T_\text{math} = \frac{4BDF}{NC}, \qquad T_\text{FSDP} = \frac{4DF}{Y W M_X}, \qquad
#    T_\text{TP} = \frac{4BD}{X W M_Y}. $$
#
# The Scaling Book (its Training section, "Mixed FSDP and Tensor Parallelism") overlaps compute
# with the communication and *adds* the two communications: the layer is compute-bound when
# $T_\text{FSDP} + T_\text{TP} < T_\text{math}$. With $\alpha = C/W$, for a given $X$ and $Y$:
#
# $$ \frac{B}{N} > \frac{\alpha}{Y M_X} \cdot \frac{1}{1 - Y\alpha/(F M_Y)}, \qquad
#    F M_Y > Y\alpha . $$
#
# If the two also overlapped each other (each on its own links), only the larger would count,
# $\max(T_\text{FSDP}, T_\text{TP}) < T_\text{math}$, and the first factor alone remains. The
# answer uses the Book's sum, and shows the other beside it:

# %%
C, W = TPU.peak_flop_per_s("bf16"), LINK.bytes_per_s
alpha = CB.ici_intensity(C, W)
cw = dict(flop_per_s=C, link_bytes_per_s=W, m_x=M_X, m_y=M_Y)
kw = dict(x=X_FSDP, y=Y_TP, **cw)
per_device = CB.compute_bound_batch(XXL.d_ff, **kw)  # the Book's sum
overlapped = CB.compute_bound_batch(XXL.d_ff, model="max", **kw)
global_batch = per_device * X_FSDP * Y_TP
at = CB.layer_times(global_batch, XXL.d_model, XXL.d_ff, **kw)
assert math.isclose(at.math_s, at.fsdp_s + at.tp_s) and overlapped < per_device  # the boundary
assert CB.torus_axes(X_FSDP, Y_TP, TORUS) == (M_X, M_Y)  # the question's M: the axes spanned

# %% tags=["remove-cell"]
closed = {m: CB.optimal_compute_bound_batch(XXL.d_ff, **cw, model=m) for m in CB.COMMS_MODELS}
rounded = CB.compute_bound_batch(XXL.d_ff, **kw | {"flop_per_s": float(f"{C:.2g}")})  # 4.6e14
x_opt = CB.optimal_fsdp_degree(global_batch, XXL.d_ff, X_FSDP * Y_TP, m_x=M_X, m_y=M_Y)
for name, value in {"c_tflops": C / 1e12, "w_gbps": W / 1e9, "alpha": alpha, "c_max": overlapped,
                    "c_per_device": per_device, "c_global": global_batch, "c_rounded": rounded,
                    "c_tp_share": at.tp_s / at.math_s, "c_closed": closed["sum"],
                    "c_closed_max": closed["max"], "x_opt": x_opt}.items():
    glue(name, value)

# %% [markdown]
# $C$ = {glue:text}`c_tflops:.0f` TFLOP/s and $W$ = {glue:text}`w_gbps:.0f` GB/s give $\alpha$ =
# {glue:text}`alpha:.0f`. TP's all-reduces take {glue:text}`c_tp_share:.0%` of the math whatever
# the batch, and FSDP's gathers must fit in the rest: **{glue:text}`c_per_device:.0f` tokens per
# device** ({glue:text}`c_rounded:.0f` with the question's rounded $C$), an overall batch of
# **{glue:text}`c_global:,.0f` tokens**. Had the two overlapped each other, $\alpha/(Y M_X)$ =
# {glue:text}`c_max:.0f` would do. The Book's closed form, $B/N > 4\alpha^2/(F M_X M_Y)$ =
# {glue:text}`c_closed:.0f` ($2\alpha^2/F$ with $M_X$ = 2, $M_Y$ = 1, its takeaway), is smaller
# because it holds only at the best split, $X_\text{opt}$ = {glue:text}`x_opt:.1f` at that batch,
# not $X$ = 16 (with the max instead of the sum it would be a quarter of that,
# {glue:text}`c_closed_max:.0f`).
#
# ### (d) A smaller batch at full throughput
#
# Every lever moves one term of the inequalities. Gradient accumulation is not among them: it splits
# the batch in time, and each micro-batch still all-gathers the weights, so the global batch per
# optimizer step stays the same. Each split of the {glue:text}`c_n` chips, with $M_X$ and $M_Y$
# the axes of the 4 × 4 × 4 torus each group really spans (a 4-ring split 2 × 2 counts half to
# each, `compute_bound.torus_axes`), and fp8 weight gathers, computed:

# %% tags=["hide-input"]
splits = CB.split_thresholds(XXL.d_ff, SPLITS, flop_per_s=C, link_bytes_per_s=W, torus=TORUS)
plain = [r for r in splits if r["gather"] == 1]
best_split = min(plain, key=lambda r: r["sum"])
assert plain[0]["sum"] == per_device and best_split["sum"] < per_device < plain[-1]["sum"]
for name, value in {"d_best": f"X = {best_split['x']}, Y = {best_split['y']}",
                    "d_best_tokens": best_split["sum"], "d_turn_share": plain[-1]["tp_share"],
                    "d_fp8": splits[-1]["sum"],
                    "bubble_example": pipeline.bubble_fraction(8, 32)}.items():
    glue(name, value)
parallel_step.split_table(XXL.d_ff, SPLITS, flop_per_s=C, link_bytes_per_s=W, torus=TORUS)

# %% [markdown]
# More TP shrinks FSDP's gathers ($T_\text{FSDP} \propto 1/Y$) and, on more torus axes, makes its
# own all-reduces cheaper: {glue:text}`d_best` needs the fewest tokens,
# {glue:text}`d_best_tokens:.0f` per device. Past it TP's share of the math grows
# ({glue:text}`d_turn_share:.0%` at $Y$ = 32) and the threshold rises again. fp8 gathers halve
# $T_\text{FSDP}$ ({glue:text}`d_fp8:.0f` tokens at $X$ = 16). Pipeline
# parallelism moves activations instead of weights but pays a bubble, $(p-1)/(m+p-1)$:
# {glue:text}`bubble_example:.1%` for $p$ = 8 stages and $m$ = 32 micro-batches. Keeping the
# gathered weights across micro-batches (ZeRO-1/2 instead of ZeRO-3) divides FSDP's traffic by the
# number of micro-batches, at the cost of holding them. Context parallelism does not help a
# feed-forward layer: to it, tokens are tokens.
#
# ## The strategies
#
# What each strategy splits and sends, per device and step, for the book's `2.7B` preset ($N$ =
# {glue:text}`n27_b:.2f` billion parameters, counted) at 4,096 tokens on 8 devices, everything in
# bf16 (`accounting.parallel_traffic.sent_bytes`, what `mlsys.distributed` does, call for call):

# %% tags=["hide-input"]
cfg27 = TransformerConfig.preset(PLAN_PRESET, context_length=PLAN_SEQ)
glue("n27_b", count_params(cfg27) / 1e9)
strategies = parallel_step.strategy_table(cfg27, {"DP (ZeRO-3 / FSDP)": (dict(dp_shard=8), 1),
    "TP": (dict(tp=8), 1), "TP + SP": (dict(tp=8), 1, True), "CP": (dict(cp=8), 1),
    "PP (8 micro-batches)": (dict(pp=8), 8), "FSDP 2 x TP 4": (dict(dp_shard=2, tp=4), 1)},
    world_size=8, batch=8, seq=PLAN_SEQ)
glue("tp_act_gb", strategies.rows[1][2]), glue("sp_act_gb", strategies.rows[2][2])
strategies

# %% [markdown]
# Tensor parallelism splits each matrix: column-parallel first ($W_1$, $W_q$, $W_k$, $W_v$, by
# heads), row-parallel second ($W_2$, $W_o$), so each sub-layer (attention, then the MLP) needs one
# all-reduce forward and one backward: four per transformer block. The two autograd functions that
# do it are each other's transpose {cite}`shoeybi2019megatron`:
#
# ```{literalinclude} ../lib/mlsys/distributed/tp.py
# :pyobject: _ReduceFromTP
# ```
#
# Drawn for one XXL feed-forward block on {glue:text}`tp_degree` ranks, with the shard shapes
# computed from the model's shape (`diagrams.tp_shard_shapes`):

# %% tags=["remove-input"]
shards = diagrams.tp_shard_shapes(parallel.XXL, TP_DEGREE)
for name, value in {"tp_A": "{:,} × {:,}".format(*shards["A_i"]), "tp_degree": TP_DEGREE,
                    "tp_B": "{:,} × {:,}".format(*shards["B_i"]), "tp_tokens": TP_TOKENS,
                    "tp_mb": TP_TOKENS * XXL.d_model * 2 / 1e6, "vocab": cfg27.vocab_size}.items():
    glue(name, value)
fig = diagrams.draw_tensor_parallel(parallel.XXL, TP_DEGREE, tokens=TP_TOKENS)
plt.show()

# %% [markdown]
# Rank $i$ holds a {glue:text}`tp_A` column stripe of $A$ and the matching {glue:text}`tp_B` row
# stripe of $B$. The column split needs no communication before the nonlinearity, since $\phi$ acts
# on each column of $XA$ alone (XXL has none; the book's SwiGLU splits $W_1$ and $W_3$ as $A$).
# The row split leaves each rank with a partial sum of the full output, and $g$ adds them: one
# all-reduce of {glue:text}`tp_mb:.0f` MB (the bf16 output of {glue:text}`tp_tokens:,` tokens)
# forward, and its mirror $f$ on the input's gradient backward.
#
# Between the TP regions the norms and residual adds run whole on every rank, on the same tokens.
# *Sequence parallelism* {cite}`korthikanti2022reducing` splits them along the sequence instead:
# each all-reduce becomes a reduce-scatter (into the sequence shards) and an all-gather (out of
# them), the same bytes, and the norms' saved activations are divided by the TP degree:
# {glue:text}`sp_act_gb` GB instead of {glue:text}`tp_act_gb` GB of activations per GPU in the
# table above (TP + SP). The output head is the
# largest matrix, $V \times D$; a *vocabulary-parallel* head splits it by rows of the vocabulary,
# each rank computing the logits of its share of the words, and the cross-entropy
# needs only two all-reduces of one number per token (the maximum and the sum of the
# exponentials), not the {glue:text}`vocab:,` logits. Our TP keeps the head whole on every
# rank, which costs it in the planner's check below.
#
# Pipeline parallelism runs micro-batches through stages in a schedule: GPipe runs all forwards,
# then all backwards; 1F1B runs a few warm-up forwards, then one forward and one backward in turn.
# Both drawn by `accounting.pipeline.pipeline_timeline` for {glue:text}`pp_stages` stages and
# {glue:text}`pp_micro` micro-batches, a backward taking twice a forward, the idle time hatched:

# %% tags=["remove-input"]
bubbles = {s: pipeline.simulated_bubble_fraction(STAGES, MICRO, s) for s in pipeline.SCHEDULES}
held = {s: pipeline.in_flight(0, STAGES, MICRO, s) for s in pipeline.SCHEDULES}
assert all(math.isclose(b, pipeline.bubble_fraction(STAGES, MICRO)) for b in bubbles.values())
for name, value in {"pp_stages": STAGES, "pp_micro": MICRO, "pp_bubble": bubbles["1f1b"],
                    "pp_held_gpipe": held["gpipe"], "pp_held_1f1b": held["1f1b"],
                    "pp_interleaved": pipeline.interleaved_bubble_fraction(STAGES, MICRO, 2),
                    "pp_zb": pipeline.zero_bubble_fraction(STAGES, MICRO)}.items():
    glue(name, value)
fig = diagrams.draw_pipeline_schedules(STAGES, MICRO)
plt.show()

# %% [markdown]
# The hatched share is the same in both, {glue:text}`pp_bubble:.1%` = $(p-1)/(m+p-1)$: the
# pipeline fills and drains once per step whatever the order. What 1F1B changes is memory: stage 0
# holds the activations of {glue:text}`pp_held_1f1b` micro-batches at once instead of
# {glue:text}`pp_held_gpipe`, because each backward frees one forward's activations as soon as it
# can.
#
# Two schedules shrink the bubble itself. *Interleaved* 1F1B {cite}`narayanan2021efficient` gives
# each device $v$ chunks of layers that are not consecutive (with $v$ = 2 and 4 stages, device 0
# holds the first and the fifth eighth of the model), so the pipeline fills and drains in $(p-1)/v$
# of a micro-batch's time: $(p-1)/(vm+p-1)$, {glue:text}`pp_interleaved:.1%` here, for $v$ times
# the sends. *Zero-bubble* schedules {cite}`qi2024zero` split the backward into the input's
# gradient $B$, which the previous stage waits for, and the weights' gradient $W$, which nobody
# waits for, and run the $W$s in the drain: ZB-H1 idles $(p-1)(t_F + t_B - t_W)$ a stage,
# {glue:text}`pp_zb:.1%` here with $t_B = t_W = t_F$, at 1F1B's memory
# (`accounting.pipeline`).
#
# Ring attention passes $K, V$ blocks around the context ranks and merges partial results through
# their log-sum-exp, the online softmax of {ref}`sec-attention`. The forward of our
# `_RingAttention`: at step $t$ rank $r$ holds the block of rank $r - t$, attends its queries to
# it (masked where the keys lie in their future, skipped where all of them do) and merges:
#
# ```{literalinclude} ../lib/mlsys/distributed/cp.py
# :pyobject: _RingAttention.forward
# ```
#
# With a causal mask, contiguous shards are unfair: rank $r$'s queries see $r + 1$ of the $n$
# key blocks, so over {glue:text}`cp_n` ranks the last computes {glue:text}`cp_contiguous:.1f`× the
# scores of the first ($(2n-1)$×, and the step waits for it). The zig-zag layout gives rank $r$
# the chunks $r$ and $2n - 1 - r$ of $2n$, one early and one late, and every rank the same work
# ({glue:text}`cp_zigzag:.2f`× the first's; `cp.causal_work`). *Ulysses* {cite}`jacobs2023ulysses`
# splits the sequence too, but an all-to-all before attention turns sequence shards into head
# shards (every rank attends the whole sequence for $H/n$ heads) and another turns them back: less
# traffic than the ring at large $n$, but no more ranks than heads.
#
# `mesh.parallelize` composes them in one order, PP → TP → CP → FSDP: FSDP last, so that it
# shards the parameters the others have already cut. On a cluster the mesh's order decides which
# groups share a node: the rank is the row-major index of its coordinates, tp varying fastest, so
# the innermost axes get consecutive ranks. A mesh of {glue:text}`mesh_world` H100s
# ({glue:text}`mesh_text`) on DGX nodes of {glue:text}`mesh_per_node`:

# %% tags=["remove-input"]
links = diagrams.axis_links(MESH, PLAN_CLUSTER)
work = {f"cp_{lay}": cp.causal_work(PLAN_SEQ, 4, lay) for lay in cp.LAYOUTS}  # scores per rank
node = hardware.get_cluster(PLAN_CLUSTER)
for name, value in {"mesh_ratio": node.intra_node.bytes_per_s / node.inter_node.bytes_per_s,
                    "mesh_world": MESH.world_size, "mesh_text": tables.mesh_text(MESH),
                    "mesh_per_node": node.per_node,
                    "mesh_inside": " and ".join(a for a, (i, _) in links.items() if i),
                    "cp_n": 4, **{k: max(w) / min(w) for k, w in work.items()},
                    "mesh_across": " and ".join(a for a, (i, _) in links.items() if not i)}.items():
    glue(name, value)
fig = diagrams.draw_mesh(MESH, PLAN_CLUSTER)
plt.show()

# %% [markdown]
# The {glue:text}`mesh_inside` groups stay inside a node, on NVLink; the {glue:text}`mesh_across`
# groups cross the network, {glue:text}`mesh_ratio:.0f`× slower per GPU. That is the order's
# purpose: TP's all-reduces sit on the critical path of every layer and get the fastest link,
# while FSDP's gathers can be prefetched and the pipeline sends only activations at stage
# boundaries.
#
# FSDP itself works unit by unit, a unit being a block {cite}`zhao2023fsdp`: it all-gathers the
# unit's shards into whole weights before the forward, gathering the next unit's while this one
# computes (*prefetch*), frees them after it (*reshard*), gathers them again for the backward and
# reduce-scatters the gradients, so a device holds its shards and about two whole blocks. Keeping
# a unit whole after its forward (FSDP2's `reshard_after_forward=False`) saves one gather per step
# at one block's memory. *HSDP* shards inside a group and replicates across groups, all-reducing
# the gradient shards between the copies: the gathers stay inside a node, and only the gradients
# cross the network. For `2.7B` on 64 H100s (the planner's example below), HSDP with 8-way shards
# inside each node and 8 copies across communicates {glue:text}`plan_hsdp_comm:.3f` s a step
# before overlap, FSDP over all 64 GPUs {glue:text}`plan_fsdp_comm:.3f` s.
#
# ## Measurement
#
# ### Each strategy against one process
#
# A tiny copy of the book's model trains two AdamW steps on CPU ranks (gloo) under each strategy,
# and the same steps run in one process on the whole batch. Every rank's collectives are counted by
# wrapping them, each call's message size and group recorded:

# %%
checks_rows = check.against_one_process({k: (v, False) for k, v in TWO_RANKS.items()}, 2)
checks_rows += check.against_one_process({"FSDP 2 x TP 2": (dict(dp_shard=2, tp=2), False),
    "FSDP 2 x TP 2 + SP": (dict(dp_shard=2, tp=2), True)}, 4)
checks_rows += check.against_one_process({"PP 2 x CP 2 x TP 2": (dict(pp=2, cp=2, tp=2),
                                                                  False)}, 8)
worst = max(max(r["grad_diff"], r["param_diff"]) for r in checks_rows)
bytes_equal = all(r["sent_bytes"] == r["predicted_bytes"] for r in checks_rows)
assert worst < 1e-5 and bytes_equal

# %% tags=["hide-input"]
glue("check_worst", worst)
glue("check_cases", len(checks_rows))
Table(["strategy", "ranks", "max |Δ loss|", "max |Δ grad|", "max |Δ weight|",
       "bytes sent by rank 0 (= predicted)"],
      [[r["case"], r["world_size"], f"{r['loss_diff']:.1e}", f"{r['grad_diff']:.1e}",
        f"{r['param_diff']:.1e}", f"{r['sent_bytes'][0]:,.0f}"] for r in checks_rows])

# %% [markdown]
# All {glue:text}`check_cases` cases train like one process to {glue:text}`check_worst:.1e` (the
# order of fp32 sums differs), and on every rank the calls and their message sizes give exactly the
# bytes `accounting.parallel` predicts. A call's bytes come from the same ring formula on both
# sides, so what this checks is every call and message size, not the bytes a network card counts.
#
# ### The bubble, and ours against PyTorch's
#
# Pipelines over the ranks with each micro-batch count, the idle share of the step measured on every
# rank against $(p-1)/(m+p-1)$; our FSDP and TP timed beside PyTorch's `fully_shard` and DTensor's
# `parallelize_module`:

# %%
par_rows = parallel_step.run(PARALLEL)

# %% tags=["hide-input"]
for name, text in parallel_step.verdicts(par_rows).items():
    glue(f"par_{name.replace(' ', '_')}", text)
parallel_step.table(par_rows)

# %% [markdown]
# 1F1B: {glue:text}`par_bubble_1f1b`. GPipe: {glue:text}`par_bubble_gpipe`. FSDP:
# {glue:text}`par_fsdp`. TP: {glue:text}`par_tp`. And {glue:text}`par_bytes`.
#
# ### Planning a mesh
#
# `accounting.planner` enumerates every mesh of a cluster for a model and a global batch, predicts
# memory per device, step time and MFU from the formulas above (bandwidth only, overlap where the
# strategy allows it), and ranks them. `2.7B` on {glue:text}`plan_devices` H100s, batch
# {glue:text}`plan_batch` × {glue:text}`plan_seq:,` tokens:

# %%
plans = planner.plan(cfg27, PLAN_CLUSTER, n_devices=PLAN_DEVICES, batch=PLAN_BATCH, seq=PLAN_SEQ,
                     efficiency=PLAN_EFFICIENCY)
assert all(p.mfu <= PLAN_EFFICIENCY + 1e-12 for p in plans)

# %% tags=["hide-input"]
best, tied, large_cfg = plans[0], planner.ties(plans), TransformerConfig(**planner.LARGE_SIZES)
fsdp_all, hsdp = (next(p for p in plans if (p.dims.dp_replicate, p.dims.dp_shard) == k)
                  for k in ((1, PLAN_DEVICES), (8, PLAN_DEVICES // 8)))
assert fsdp_all in tied and best.traffic_s < fsdp_all.traffic_s  # a tie broken by traffic
large = planner.plan(large_cfg, PLAN_CLUSTER, **planner.LARGE_RUN)[0]
for name, value in {"plan_eff": 100 * PLAN_EFFICIENCY, "plan_devices": PLAN_DEVICES,
                    "plan_batch": PLAN_BATCH, "plan_seq": PLAN_SEQ, "plan_valid": len(plans),
                    "plan_best": tables.plan_text(best), "plan_m": best.microbatches,
                    "plan_mfu": 100 * best.mfu, "plan_ties": len(tied), "plan_comm": best.traffic_s,
                    "plan_fsdp_comm": fsdp_all.traffic_s, "plan_hsdp_comm": hsdp.traffic_s,
                    "large_text": tables.placement_text(large, node),
                    "large_b": count_params(large_cfg) / 1e9}.items():
    glue(name, value)
Table(*tables.plan_rows(plans[:8], tied))

# %% tags=["remove-input"]
ax = plotting.plot_plans(plans, plotting.subplots(width=7.0, height=4.0)[1])
ax.set_title(f"{PLAN_PRESET}: every mesh of {PLAN_DEVICES} H100s", fontsize=9)
plt.show()

# %% [markdown]
# Of {glue:text}`plan_valid` valid meshes, {glue:text}`plan_ties` tie for the first place at a
# predicted {glue:text}`plan_mfu:.0f`% MFU, given kernels that reach {glue:text}`plan_eff:.0f`% of
# the peak (a first-order model: no latency, overlap wherever the strategy allows it): each hides
# all of its communication behind the compute, so each step is the compute alone (the "=" rows).
# The ranking breaks such ties by the communication before overlap (its bytes over the links they
# cross), then by fewer axes. First comes {glue:text}`plan_best` with {glue:text}`plan_m`
# micro-batches ("ZeRO-1" marks data-parallel copies that shard their optimizer state, as
# Megatron's distributed optimizer does): {glue:text}`plan_comm:.2f` s of communication a step
# against {glue:text}`plan_fsdp_comm:.2f` s for FSDP over all {glue:text}`plan_devices` GPUs,
# whose gathers cross the network. The figure labels the first three. The rules of thumb behind
# such rankings: when the state fits a node, data parallelism with ZeRO; when it does not (the
# {glue:text}`large_b:.0f`B model of {doc}`the one-pager <../book/parallelism_onepager>` on 64
# H100s), the planner puts {glue:text}`large_text`; TP always inside a node (its all-reduces
# sit on the critical path, so they need NVLink); when the batch is too small for data
# parallelism to hide its traffic, more TP or PP; when one sequence's activations do not fit, CP.
# The same query from a shell: `python -m mlsys plan --preset 2.7B --cluster dgx-h100 --devices
# 64 --batch 256 --seq 4096` (add `--plot plans.png` for the figure).
#
# The conditions of (c) behind such rankings, drawn for the XXL layer on {glue:text}`c_n` TPU v5p
# chips: the time of the math over the time of the communication, against tokens per device (above
# 1, compute hides the communication). TP alone over all {glue:text}`c_n` chips never gets there
# ($F M_Y < Y\alpha$); FSDP alone needs the most tokens per device; the best mix of the two crosses
# first, at the closed form's {glue:text}`c_closed:.0f` tokens per device:

# %% tags=["remove-input"]
glue("c_n", X_FSDP * Y_TP)
assert XXL.d_ff * M_Y < X_FSDP * Y_TP * alpha  # TP over all the chips never hides its all-reduces
ax = plotting.plot_compute_bound(XXL.d_model, XXL.d_ff, X_FSDP * Y_TP, flop_per_s=C,
                                 link_bytes_per_s=W, m_x=M_X, m_y=M_Y, fixed_xy=(X_FSDP, Y_TP),
                                 ax=plotting.subplots(width=7.0, height=4.0)[1])
ax.set_title("XXL on TPU v5p: compute / communication", fontsize=9)
plt.show()

# %% [markdown]
# ### The decision tree, drawn by the planner
#
# The same ranking over a grid of global batches and sequence lengths, `2.7B` on one node of
# {glue:text}`map_devices` H100s; each cell shows the planner's first choice and its predicted MFU:

# %%
map_cfg = TransformerConfig.preset(PLAN_PRESET, context_length=max(MAP_SEQS))
choices = planner.first_choices(map_cfg, PLAN_CLUSTER, n_devices=MAP_DEVICES,
                                batches=MAP_BATCHES, seqs=MAP_SEQS, efficiency=PLAN_EFFICIENCY)

# %% tags=["remove-cell"]
facts = planner.map_facts(choices)
assert facts["dp_from"] == MAP_DEVICES and facts["cut_below"]  # below a sequence a GPU: cut
assert facts["short"] < facts["cp_from"] and facts["cp_at_long"] and facts["none"] > facts["long"]
big, short, long = max(MAP_BATCHES), facts["short"], facts["long"]
for name, value in {"map_devices": MAP_DEVICES, "map_short": short, "map_big": big,
                    "map_dp_from": facts["dp_from"], "map_cp_from": facts["cp_from"],
                    "map_one": tables.plan_text(choices[(min(MAP_BATCHES), short)]),
                    "map_long_mesh": tables.plan_text(choices[(big, long)]),
                    "map_dp": tables.family_text(choices[(big, short)]),
                    "map_long": long, "map_none": facts["none"]}.items():
    glue(name, value)

# %% tags=["remove-input"]
fig, ax = plotting.subplots(width=10.0, height=4.0)
plotting.plot_first_choices(choices, ax)
ax.set_title(f"{PLAN_PRESET} on {MAP_DEVICES} H100s: the planner's first choice", fontsize=9)
plt.show()

# %% [markdown]
# Along the bottom row ({glue:text}`map_short:,` tokens): one sequence cannot be split by data
# parallelism over {glue:text}`map_devices` GPUs, so the model itself is cut ({glue:text}`map_one`);
# TP stays in the mesh while there is less than a sequence per GPU; from {glue:text}`map_dp_from`
# sequences on, {glue:text}`map_dp` alone. Up the columns, longer sequences bring in context
# parallelism, from {glue:text}`map_cp_from:,` tokens at {glue:text}`map_big` sequences, up to
# {glue:text}`map_long_mesh` at {glue:text}`map_long:,` tokens; at {glue:text}`map_none:,` tokens
# nothing fits one node (without activation checkpointing). The one-pager on parallelism turns
# this map into its decision tree, branch by branch.
#
# ### Does the planner predict the runs?
#
# The planner has no anchor of its own; the runs above give it one. Calibrated on two numbers
# measured in the same launch as the steps (the FLOP/s one rank reaches stepping the whole batch
# alone, and an α-β fit of all-reduces between the ranks), it predicts the step of every mesh that
# ran: data parallelism (chapter 08's bucketed DDP, {ref}`sec-data-parallel`), FSDP, TP and the 1F1B
# pipeline at each micro-batch count, with its prediction if nothing overlapped beside:

# %% tags=["hide-input"]
mf = transformer_flops(TransformerConfig.preset(PARALLEL.preset), 1, PARALLEL.seq)
head_share, world = mf.lm_head / mf.forward_matmul_flops, PARALLEL.world_size
for name, value in {"head_share": 100 * head_share, "tp_even": 1 / world,
                    "tp_floor": (1 - head_share) / world + head_share}.items():
    glue(name, value)
parallel_step.planner_table(par_rows)

# %% [markdown]
# {glue:text}`par_planner`. What the first-order model leaves out shows in such a check. It divides
# every FLOP evenly among the ranks, but our TP keeps the output head ({glue:text}`head_share:.0f`%
# of this model's matmul FLOPs) whole on every rank, so a TP rank computes {glue:text}`tp_floor:.2f`
# of the step, not {glue:text}`tp_even:.2f`, and the pipeline's last stage carries the head on top
# of its blocks. It hides FSDP's and DDP's traffic under compute, while on a CPU the collectives run
# on the cores the compute needs. And where a measured step lies above even the no-overlap column,
# what costs the time is neither FLOPs nor bytes: the per-call and per-micro-batch overheads, and
# the smaller matrices each rank multiplies, which reach a lower FLOP/s than the calibration's whole
# batch. A record of `python -m mlsys.experiments parallel_step` carries the same check for its own
# machine (below).
# The planner's second time model, which prices each GEMM by its shape, each collective with its
# latency and the interleaved pipeline, is checked against runs others measured on thousands of GPUs
# in {ref}`sec-planner-published`.
#
# ### Recorded GPU results
#
# `python -m mlsys.experiments parallel_step` needs several ranks; a lent machine has one GPU, so
# its record runs the ranks on that machine's CPU cores and says so in every row:

# %% tags=["remove-input"]
experiments.show_recorded("parallel_step")

# %% [markdown]
# The calibrated step model of {ref}`sec-planner-published` starts from each GEMM's time by its
# shape: tiles in waves on the SMs, at a share of the peak fitted on Megatron-LM's published runs.
# One GPU checks that first piece directly: the forward GEMMs of Llama 3 8B and of Megatron's 1.7B
# GPT at TP 1 and 8, and a sweep of $M$ across the model's wave boundaries, where TFLOP/s should
# fall in a saw-tooth:

# %% tags=["remove-input"]
experiments.show_recorded("gemm_shapes", show=pages.show_gemm_shapes)

# %% [markdown]
# ```{admonition} Takeaway
# :class: tip
# FSDP shards the state and moves the weights (the per-device batch must exceed $\alpha/(Y M_X)$ to
# hide it: {glue:text}`c_per_device:.0f` tokens for XXL on a v5p mesh with $X$ = 16, $Y$ = 4); TP
# shards the matrices and moves activations on the critical path (it needs $F M_Y > Y\alpha$); PP
# moves activations between stages and pays a bubble; CP moves $K$ and $V$ around a ring. Each was
# checked against one process here, and every call and message size against its formula.
# ```
#
# ## Exercises
#
# ### Q1 (multi-step) XXL on H100 nodes
#
# The XXL model on DGX H100 nodes, state as in (a). (a) What is the smallest pure-FSDP degree that
# holds the state alone? (b) With 2,048 tokens per device of activations, half of them sharded,
# what degree then? (c) How long does the FSDP all-gather of one block's bf16 weights take in an
# 8-way group inside a node, and in a group of (b)'s degree across nodes (`accounting.comms`,
# `hardware.Cluster.ring_link`)?

# %% tags=["hide-cell"]
q1_a = parallel.min_shards_to_fit(GPU.hbm_bytes, states)
q1_b = parallel.min_shards_to_fit(GPU.hbm_bytes, states, per_token * 2_048,
                                  activation_shard_fraction=0.5)
block_bytes = 2 * XXL.d_model * XXL.d_ff * 2  # one block's weights in bf16
sent = {n: comms.collective_cost("all_gather", block_bytes, n).sent_bytes  # (n - 1) / n of it
        for n in (node.per_node, q1_b)}
ms = {n: b / node.ring_link(n).bytes_per_s * 1e3 for n, b in sent.items()}
half = per_token * 1_024  # the unsharded half of 2,048 tokens' activations
assert q1_a == math.ceil(states / GPU.hbm_bytes) > node.per_node and ms[q1_b] > ms[node.per_node]
assert q1_b == math.ceil((states + half) / (GPU.hbm_bytes - half))
for name, value in {"q1_a": q1_a, "q1_b": q1_b, "q1_hbm": GPU.hbm_bytes / 1e9, "q1_ib_ms": ms[q1_b],
                    "q1_nv_ms": ms[node.per_node], "q1_last": q1_b % node.per_node or node.per_node,
                    "q1_link_gb": node.ring_link(q1_b).bytes_per_s / 1e9, "q1_half_gb": half / 1e9,
                    "q1_act_gb": per_token * 2_048 / 1e9, "q1_block_gb": block_bytes / 1e9,
                    "q1_sent8_gb": sent[node.per_node] / 1e9,
                    "q1_sent_gb": sent[q1_b] / 1e9}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# (a) The state alone: $N \ge S / M$ = {glue:text}`xxl_states_tb:.2f` TB / {glue:text}`q1_hbm:.0f`
# GB, so **{glue:text}`q1_a`** H100s. (b) 2,048 tokens hold $A$ = {glue:text}`q1_act_gb:.1f` GB
# of activations. The unsharded half takes {glue:text}`q1_half_gb:.1f` GB of every device, and the
# rest must hold $S/N + A/(2N)$: $N \ge (S + A/2)/(M - A/2)$ gives **{glue:text}`q1_b`**. (c)
# One block's bf16 weights are {glue:text}`q1_block_gb:.2f` GB; in an all-gather over $n$ devices
# each sends $(n-1)/n$ of them. 8-way inside a node, {glue:text}`q1_sent8_gb:.2f` GB over NVLink:
# **{glue:text}`q1_nv_ms:.1f` ms**. {glue:text}`q1_b`-way, which cannot fit one node,
# {glue:text}`q1_sent_gb:.2f` GB at {glue:text}`q1_link_gb:.0f` GB/s a GPU: a ring leaves each node
# through as many network ports as the group has ranks there, and its last node holds
# {glue:text}`q1_last` (`Cluster.ring_link`): **{glue:text}`q1_ib_ms:.1f` ms**, so FSDP across
# nodes needs a larger batch per device to hide its gathers.
# ```
#
# ### Q2 (find the error) Gradient accumulation shrinks the batch
#
# "To shrink the global batch at the same throughput, use gradient accumulation: 8 micro-batches of
# 1/8 the size each." Why does this not shrink what matters?

# %% tags=["hide-cell"]
fsdp8 = parallel.ParallelDims(dp_shard=8, world_size=8)
gathers = {m: parallel_traffic.sent_bytes(cfg27, fsdp8, 0, batch=64, seq=PLAN_SEQ,
                                          microbatches=m)["all_gather"] for m in (1, 8)}
assert gathers[8] > 4 * gathers[1]  # ZeRO-3 gathers the weights again for every micro-batch
q2_ratio = glue("q2_gather_ratio", gathers[8] / gathers[1])

# %% [markdown]
# ```{dropdown} Answer
# The optimizer still steps once per 8 micro-batches: the batch per update, the quantity that limits
# convergence, is unchanged. Worse for FSDP, each micro-batch all-gathers the weights again
# ({glue:text}`q2_gather_ratio:.0f`× the all-gather bytes per step for `2.7B` on 8 GPUs), and a
# micro-batch of $B/8$ tokens per device is further below $\alpha/(Y M_X)$. Shrinking the batch
# needs the levers of (d): more TP, more mesh axes, fewer bytes per gather, or pipelining.
# ```
#
# ### Q3 The bubble
#
# How many micro-batches keep the bubble of an 8-stage pipeline under 5%?

# %% tags=["hide-cell"]
q3 = glue("q3_m", next(m for m in range(1, 10_000) if pipeline.bubble_fraction(8, m) < 0.05))
assert q3 == math.ceil(7 / 0.05 - 7 + 1e-9) and pipeline.bubble_fraction(8, q3 - 1) >= 0.05

# %% [markdown]
# ```{dropdown} Answer
# $(p-1)/(m+p-1) < 0.05$ means $m + p - 1 > 20(p-1)$, so $m > 19(p-1) = 133$:
# **{glue:text}`q3_m`** micro-batches, each of which must still be large enough to keep its stage
# compute-bound. The global batch is then at least {glue:text}`q3_m` micro-batches per data-parallel
# copy: deep pipelines want large batches.
# ```
#
# ### Q4 (code) The 1F1B order of one stage
#
# Write the order in which stage `stage` of an `n_stages`-stage pipeline runs its forwards
# `("F", i)` and backwards `("B", i)` under 1F1B: as many warm-up forwards as there are stages
# after it (never more than the micro-batches), then one forward and one backward in turn, then the
# backwards that remain. The check compares every stage with `accounting.pipeline`, and counts the
# micro-batches each stage holds at once.

# %%
def one_f_one_b(stage, n_stages, microbatches):  # <- your code here
    """1F1B's order of ("F", i) and ("B", i) on `stage` of `n_stages`, for `microbatches`."""
    raise NotImplementedError("write the 1F1B order of one stage")


# %% tags=["hide-cell"]
# The book's solution (opened on demand). `solved_by` checks the reader's function once it is
# written, and the book's while it is not.
def one_f_one_b_solution(stage, n_stages, microbatches):
    warm = min(n_stages - 1 - stage, microbatches)
    order = [("F", i) for i in range(warm)]
    for i in range(microbatches - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", i) for i in range(microbatches - warm, microbatches)]


for s in range(STAGES):
    order, whose = book.solved_by(one_f_one_b, one_f_one_b_solution, s, STAGES, MICRO)
    assert tuple(order) == pipeline.pipeline_schedule(s, STAGES, MICRO, "1f1b")
    assert diagrams.held_microbatches(order) == pipeline.in_flight(s, STAGES, MICRO, "1f1b")
print(f"checked: {whose} 1F1B order matches accounting.pipeline on all {STAGES} stages")

# %% [markdown]
# ```{dropdown} Answer
# Stage $s$ of $p$ runs $p - 1 - s$ warm-up forwards, one for each stage after it: the last stage
# none, stage 0 enough to keep every later stage busy until the first backward comes back. Then
# each forward is followed by the oldest backward, which frees that micro-batch's activations, so
# the count held stays at its peak of $p - s$ (the warm-up ones plus one): {glue:text}`pp_held_1f1b`
# on stage 0 in the figure above, instead of all $m$ under GPipe. The drain runs the backwards of
# the last $p - 1 - s$ micro-batches.
# ```
#
# ### Q5 (find the error) 1F1B shrinks the bubble
#
# "1F1B beats GPipe because it removes most of the pipeline bubble." Check the claim for the
# pipeline of the figure, and for backwards that cost one, two and three forwards.

# %% tags=["hide-cell"]
q5 = {(s, tb): pipeline.simulated_bubble_fraction(STAGES, MICRO, s, backward_s=tb)
      for s in pipeline.SCHEDULES for tb in (1.0, 2.0, 3.0)}
assert all(math.isclose(b, pipeline.bubble_fraction(STAGES, MICRO)) for b in q5.values())
q5_ratio = glue("q5_ratio", held["gpipe"] / held["1f1b"])

# %% [markdown]
# ```{dropdown} Answer
# The claim is wrong. Played out by `pipeline_timeline`, both schedules idle
# {glue:text}`pp_bubble:.1%` of the step, $(p-1)/(m+p-1)$, for every ratio of backward to forward
# time: each stage waits $p - 1$ forwards for the pipeline to fill and $p - 1$ backwards for it to
# drain, in either order. 1F1B's gain is memory: stage 0 holds {glue:text}`pp_held_1f1b`
# micro-batches of activations instead of {glue:text}`pp_held_gpipe`
# ({glue:text}`q5_ratio:.0f`× fewer), and that memory buys more micro-batches, which is what
# shrinks the bubble. Only interleaved stages (several model chunks per device) or zero-bubble
# schedules make the bubble itself smaller.
# ```
#
# ### Q6 (multi-step) A mesh for an 80B model on 1,024 H100s
#
# The one-pager's {glue:text}`large_b:.0f`B model (Llama 3 70B's sizes, every head with its own
# keys and values) trains on {glue:text}`q6_gpus:,` H100s in DGX nodes, {glue:text}`q6_batch:,`
# sequences of {glue:text}`q6_seq:,` tokens a step, bf16 with fp32 master weights and AdamW.
# (a) How many GPUs would its states alone fill? (b) With ZeRO-1 over the data-parallel copies,
# how many ways must the weights be cut (TP × PP) for the bf16 weights and gradients plus the
# sharded rest to fit in half of a GPU (half for activations)? (c) How far can TP go on NVLink
# ($F$ against $C/W$)? (d) How many tokens does each GPU get, and how many would data parallelism
# need to hide its traffic across nodes? (e) What does the planner choose, with kernels at
# {glue:text}`plan_eff:.0f`% of the peak, and what is its bubble?

# %% tags=["hide-cell"]
q6 = planner.plan(large_cfg, node, n_devices=1_024, batch=1_024, seq=4_096,
                  efficiency=PLAN_EFFICIENCY)[0]
n_big, peak = count_params(large_cfg), GPU.peak_flop_per_s("bf16")
q6_states = memory.model_state_bytes(n_big, "bf16_mixed_adamw")  # 16 bytes per parameter
q6_cut = next(k for k in range(1, 1_025)  # bf16 weights and grads whole, the rest over 1,024
              if 4 * n_big / k + 12 * n_big / 1_024 <= GPU.hbm_bytes / 2)
q6_tp = large_cfg.d_ff / CB.ici_intensity(peak, node.intra_node.bytes_per_s)
q6_cw = CB.ici_intensity(peak, node.ring_link(1_024).bytes_per_s)  # C / W across nodes
assert q6.fits and q6.dims.tp <= node.per_node <= q6_tp  # TP may fill a node
for name, value in {"q6_gpus": 1_024, "q6_batch": 1_024, "q6_seq": 4_096, "q6_tokens": 4_096,
                    "q6_states_tb": q6_states / 1e12, "q6_cut": q6_cut, "q6_tp": q6_tp,
                    "q6_hold": math.ceil(q6_states / GPU.hbm_bytes), "q6_cw": q6_cw,
                    "q6_dp": "enough" if 4_096 > q6_cw else "not enough", "q6_m": q6.microbatches,
                    "q6_mesh": tables.plan_text(q6), "q6_bubble": q6.bubble_s / q6.step_s,
                    "q6_ways": q6.dims.tp * q6.dims.pp * q6.dims.fsdp, "q6_mfu": 100 * q6.mfu,
                    "q6_place": tables.placement_text(q6, node)}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# (a) 16 bytes a parameter: {glue:text}`q6_states_tb:.2f` TB, {glue:text}`q6_hold` GPUs' worth.
# (b) ZeRO-1 leaves the bf16 weights and gradients (4 bytes a parameter) whole on every copy and
# shards the other 12 over the copies: $4N/k + 12N/1024 \le 40$ GB needs $k \ge$
# **{glue:text}`q6_cut`**. (c) $F/(C/W)$ on NVLink allows TP up to {glue:text}`q6_tp:.1f` ways:
# the whole node. (d) {glue:text}`q6_tokens:,` tokens a GPU; data parallelism hides its bytes
# across nodes from about $C/W$ = {glue:text}`q6_cw:,.0f` tokens a GPU on that link, so the batch
# alone is {glue:text}`q6_dp` to hide a plain all-reduce of the gradients. (e) The planner ranks
# first **{glue:text}`q6_mesh`** with {glue:text}`q6_m` micro-batches, {glue:text}`q6_place`, at a
# predicted {glue:text}`q6_mfu:.0f`% MFU: it cuts the weights {glue:text}`q6_ways` ways (TP × PP ×
# the FSDP axes, CP's ranks sharing shards), and its bubble is {glue:text}`q6_bubble:.1%` of the
# step.
# ```
#
# ## Summary
#
# - XXL's fp32 training state is {glue:text}`xxl_states_tb:.2f` TB ({glue:text}`xxl_h100` H100s);
#   its activations, {glue:text}`xxl_per_token_mb:.1f` MB per token in bf16, decide how far FSDP
#   must shard.
# - Compute-bound FSDP × TP (the Scaling Book: $T_\text{FSDP} + T_\text{TP} < T_\text{math}$)
#   needs $F M_Y > Y\alpha$ and $B/N > \alpha/(Y M_X)/(1 - Y\alpha/(F M_Y))$; its
#   $4\alpha^2/(F M_X M_Y)$ holds only at the optimal split.
# - Gradient accumulation does not shrink the batch per update; more TP, more axes, fp8 gathers and
#   pipelining do.
# - TP splits $A$ by columns and $B$ by rows: one all-reduce forward ($g$) and one backward ($f$)
#   per sub-layer, four per transformer block, on the critical path, so its groups belong inside
#   a node.
# - GPipe and 1F1B idle the same {glue:text}`pp_bubble:.1%` ($p$ = {glue:text}`pp_stages`,
#   $m$ = {glue:text}`pp_micro`); 1F1B holds {glue:text}`pp_held_1f1b` micro-batches of
#   activations on its first stage instead of {glue:text}`pp_held_gpipe`.
# - Interleaving ({glue:text}`pp_interleaved:.1%` with $v$ = 2) and zero-bubble schedules
#   ({glue:text}`pp_zb:.1%`) shrink the bubble itself.
# - The planner's ties are broken by traffic, then by fewer axes.
# - Every strategy here equals one process, with every call and message size of its formula.
