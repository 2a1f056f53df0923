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
# (sec-data-parallel)=
# # Collectives, data parallelism and ZeRO
#
# **Question.** Two GPUs train the `xl` preset ({glue:text}`q_params_b:.2f` billion parameters)
# with data parallelism: after every backward pass each GPU must add the other's
# {glue:text}`q_grad_gb:.2f` GB of fp32 gradients to its own, at least {glue:text}`q_link_ms:.1f` ms
# over NVLink 3 at its full per-direction bandwidth. How much of each step is spent moving
# gradients, how much of that can hide behind the backward pass, and how much memory does sharding
# the optimizer state give back, all predicted from the bytes and the links before anything runs?
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

# %% tags=["hide-cell"]
import math

import matplotlib.pyplot as plt
import torch
from IPython.display import display

from mlsys import experiments, hardware, plotting, third_party
from mlsys.accounting import activations, buckets, memory
from mlsys.accounting import comms as comms_cost
from mlsys.accounting import zero as zero_cost
from mlsys.accounting.params import count_params
from mlsys.book import Table, glue, num, solved_by
from mlsys.diagrams import collectives
from mlsys.distributed import launch
from mlsys.experiments import allreduce_bench, ddp_step, ddp_step_seed, kit
from mlsys.models.config import TransformerConfig

MIB, GIB = 2**20, 2**30

# %% tags=["parameters"]
# Napkin math (nothing measured): the question's set-up (the seed's DDP run), and the examples
PRESET, WORLD = "xl", 2
XL_BATCH, XL_SEQ = 4, 512  # per GPU
SEED_GPU = hardware.A100_80GB_SXM  # inferred: the seed says "Ampere" (ddp_step_seed.seed_gpu)
CLUSTER, CROSS_NODES = hardware.get_cluster("dgx-h100"), 16  # the step across nodes
FAST = hardware.H100_SXM  # the same step in bf16 on H100s: where the bucket size matters
LINK_KEYS = ("nvlink3", "nvlink4", "pcie4", "ib-hdr")
BUCKET_CAPS_MIB = (0.25, 1, 4, 16, 25, 64, 256, 1_024, 4_096)
MICRO_BATCHES = (1, 2, 4)
ZERO_RANKS, RECIPE = 8, "bf16_mixed_adamw"
# Checks (run live): the ring drawn chunk by chunk, the hand-written ring on a few gloo ranks
DIAGRAM_RANKS = 4
RING_RANKS, RING_NUMEL = 3, 999_999
# Measurements: sizes per profile live with each experiment (lib/mlsys/experiments/)
ALLREDUCE = env.pick(**allreduce_bench.SIZES)
STEP = env.pick(**ddp_step.SIZES)
# Exercises: the reader's ring, on unequal chunks of integers
Q3_RANKS, Q3_NUMEL = 5, 23

# %% [markdown]
# In data parallelism every rank holds the whole model and runs its own slice of the batch; after
# the backward pass the gradients are averaged over the ranks, so that every optimizer step is the
# same everywhere. What that costs is set by one collective, the all-reduce, and by when it runs.
# This chapter counts its bytes, fits its time, takes a data-parallel step apart, and then shards
# what data parallelism replicates: ZeRO {cite}`rajbhandari2020zero`. One student's answers to the
# distributed part of CS336's second assignment {cite}`cs336_2025` (the book's seed) are checked
# throughout: their tables are a third party's measurements and are labelled so.
#
# ## Napkin math
#
# ### What each collective moves
#
# An **all-reduce** leaves on every rank the sum of every rank's buffer of $M$ bytes. The ring
# algorithm {cite}`patarasuk2009bandwidth,thakur2005collective` cuts the buffer into $n$ chunks and
# does it in two halves. A **reduce-scatter**: in each of $n-1$ steps every rank sends one chunk of
# $M/n$ to its right-hand neighbour and adds the chunk arriving from its left, until each rank holds
# the full sum of one chunk. An **all-gather**: in $n-1$ more steps the summed chunks travel once
# around the ring. Each rank sends $2(n-1)$ chunks, $2\frac{n-1}{n}M$ bytes in $2(n-1)$ steps,
# which Patarasuk and Yuan prove is the least any all-reduce can send per rank. With a latency
# $\alpha$ per step and a bandwidth $\beta$ per direction:
#
# $$ T_\text{all-reduce} = 2(n-1)\,\alpha + 2\frac{n-1}{n}\frac{M}{\beta}. $$
#
# Here is the ring on {glue:text}`ring_n` ranks, run chunk by chunk on tensors in one process
# (`diagrams.collectives.simulate_ring_all_reduce`, each rank's result checked against the sum):

# %% tags=["hide-input"]
collectives.draw_ring_all_reduce(DIAGRAM_RANKS)
plt.show()
per_byte = comms_cost.collective_cost("all_reduce", 1.0, DIAGRAM_RANKS)
for name, value in {"ring_n": DIAGRAM_RANKS, "ring_half": DIAGRAM_RANKS - 1,
                    "ring_ranks": RING_RANKS, "ring_steps": per_byte.steps,
                    "ring_share": per_byte.sent_bytes}.items():
    glue(name, value)

# %% [markdown]
# A row is a rank; a column is what it holds before a step; a box is one chunk, with the number of
# ranks whose parts it sums. In the reduce-scatter, each rank sends its outlined chunk to its
# right-hand neighbour, which adds it to its own: the counts climb by one a step along a diagonal,
# and after {glue:text}`ring_half` steps rank $r$ holds chunk $r+1$ summed over every rank
# (green). The all-gather passes the green chunks on round the ring, each one replacing a partial
# sum, until every rank holds all of them. In {glue:text}`ring_steps` steps each rank sent one
# chunk of $M/n$ per step, {glue:text}`ring_share:.2f` $M$ in all: $2\frac{n-1}{n}M$.
#
# `accounting.comms.collective_cost` tabulates every collective (bytes sent per rank for a message
# of $M$ bytes, as nccl-tests names it):

# %% tags=["hide-input"]
allreduce_bench.collectives_table(ranks=(2, 8))

# %% [markdown]
# A measured time gives two bandwidths. The **algorithm bandwidth** $M/T$ falls as $n$ grows,
# since each rank sends more of $M$; the **bus bandwidth**, algorithm bandwidth × $2(n-1)/n$,
# approaches $\beta$ for large messages whatever $n$ is, and is the figure to compare with a link's
# spec (nccl-tests' definitions).
#
# ### The seed's all-reduce table, fitted
#
# Source: {glue:text}`ar_source`. Their table, the two bandwidths of each row, and the α-β model
# fitted to their four 2-rank rows (`accounting.comms.fit_alpha_beta`, least squares on relative
# errors):

# %% tags=["hide-input"]
seed_fit = allreduce_bench.third_party_fit()
ar_rows = allreduce_bench.third_party_rows()  # asserts: their "GB/s" are busbw in GiB/s
nvlink3 = hardware.LINKS["nvlink3"]
assert nvlink3.bytes_per_s == SEED_GPU.interconnect_bytes_per_s
glue("ar_source", third_party.SOURCE_CS336_STUDENT_ALLREDUCE)
glue("ar_verdict", allreduce_bench.third_party_verdict(SEED_GPU))
glue("seed_fit_err", 100 * max(abs(e) for e in seed_fit.relative_errors))
glue("nvlink3_gb", nvlink3.bytes_per_s / 1e9)
glue("nvlink3_both", 2 * nvlink3.bytes_per_s / 1e9)
allreduce_bench.third_party_table(ar_rows)

# %% [markdown]
# (*: the 6-rank block lost its header; its size is the one that reproduces its bandwidth.) Read
# with the model: {glue:text}`ar_verdict`. The fit follows their four sizes within
# {glue:text}`seed_fit_err:.0f`%. The seed names only the Ampere generation; that their GPUs
# are A100 80 GB SXMs is this book's inference: their bus bandwidth of
# {glue:text}`seed_busbw_gb:.0f` GB/s is far above PCIe Gen4's {glue:text}`pcie4_gb:.0f` GB/s per
# direction, so NVLink (an SXM part), and their `xl` step's fp32 AdamW states and fp32
# activations need {glue:text}`seed_need_gb:.1f` GB, more than the 40 GB part holds. The seed's
# one-pager quotes NVLink as "600 GB/s (bidirectional)":
# {glue:text}`nvlink3_both:.0f` GB/s is both directions together. In a ring each GPU sends to one
# neighbour while it receives from the other, each direction carrying its own traffic, so the spec
# to compare with is the per-direction {glue:text}`nvlink3_gb:.0f` GB/s.
#
# ### Two formulas of the seed, corrected
#
# The one-pager writes the ring's time as $2\frac{N-1}{N}M/\text{BW} + \alpha(N-1)$, and adds "for
# large M, time ≈ 2M/BW". With the α and β just fitted:

# %% tags=["hide-input"]
ab = {"alpha_s": seed_fit.alpha_s, "bytes_per_s": seed_fit.bytes_per_s}
two_gib = comms_cost.collective_time_s("all_reduce", GIB, 2, **ab)
large_2gib = comms_cost.claimed_large_message_all_reduce_s(GIB, seed_fit.bytes_per_s)
assert abs(large_2gib / two_gib - 2) < 0.02
glue("small_64_ratio", comms_cost.claimed_ring_all_reduce_s(MIB, 64, **ab)
     / comms_cost.collective_time_s("all_reduce", MIB, 64, **ab))
allreduce_bench.third_party_formulas(seed_fit, ranks=(2, 8, 64), sizes=(MIB, GIB))

# %% [markdown]
# The ring takes $2(n-1)$ latency steps, $n-1$ for each half, not $n-1$: for a 1 MiB message over
# 64 ranks the seed's formula gives {glue:text}`small_64_ratio:.2f` of the time. And $2M/\beta$ is
# the limit of many ranks, not of a large message: at $n = 2$ the factor $2(n-1)/n$ is 1, and the
# formula is twice too slow however large $M$ is.
#
# ### The xl step on two GPUs
#
# The `xl` preset's gradients, in fp32, are {glue:text}`xl_tensors` tensors. Naive DDP all-reduces
# them one by one after the backward (a latency term per tensor); flat DDP copies them into one
# buffer and all-reduces it once. Predicted with the seed's fitted α and each link's spec:

# %% tags=["hide-input"]
cfg = TransformerConfig.preset(PRESET)
n_params = count_params(cfg)
xl_sizes = ddp_step_seed.grad_bytes(PRESET)  # fp32 gradients, from the model on the meta device
grad_bytes = sum(xl_sizes)
assert n_params == third_party.CS336_STUDENT_DDP_PARAMS and grad_bytes == 4 * n_params
assert abs(grad_bytes / MIB - third_party.CS336_STUDENT_DDP_CLAIMED_MB) < 0.01  # "MB" = MiB
for name, value in {"q_params_b": n_params / 1e9, "q_grad_gb": grad_bytes / 1e9, "q_link_ms": 1e3
                    * comms_cost.collective_cost("all_reduce", grad_bytes, WORLD).bus_bytes
                    / nvlink3.bytes_per_s, "xl_tensors": len(xl_sizes)}.items():
    glue(name, value)
ddp_step_seed.link_table(xl_sizes, LINK_KEYS, alpha_s=seed_fit.alpha_s, world=WORLD)

# %% [markdown]
# The seed's four DDP runs of this step, a third party's measurement ({glue:text}`ddp_source`),
# beside what their own all-reduce table predicts (`ddp_step_seed.third_party_rows`): naive, flat,
# and the communication left after the backward when each 25 MiB bucket is all-reduced as soon as it
# is ready (`accounting.buckets.overlap_exposed_s`, gradients arriving at a steady rate over their
# backward):

# %% tags=["hide-input"]
xl_rows = ddp_step_seed.third_party_rows()
overlap_run = xl_rows[0]  # a run whose mode was not printed: overlapped
for name, value in {**ddp_step_seed.third_party_numbers(xl_rows), **ddp_step_seed.seed_gpu(),
                    "ddp_source": third_party.SOURCE_CS336_STUDENT_DDP}.items():  # checked there
    glue(name, value)
ddp_step_seed.third_party_table(xl_rows)

# %% [markdown]
# Their naive run spent {glue:text}`xl_naive_ms:.1f` ms communicating,
# {glue:text}`xl_naive_share:.1f`% of the step; the bytes and their own α-β fit predict
# {glue:text}`xl_pred_naive_ms:.1f` ms. Their "flat" run was not one: its command line passed
# `--ddp-mode naive`, its banner says "Naive Sync", and it communicated for
# {glue:text}`xl_flat_ms:.1f` ms, the naive run's time to 0.1%, where one all-reduce would have
# taken {glue:text}`xl_pred_flat_ms:.1f` ms. The two runs whose mode was not printed are overlapped
# ones: {glue:text}`xl_overlap_ms:.1f` and {glue:text}`xl_overlap_lo_ms:.1f` ms left after the
# backward, so {glue:text}`xl_hidden_ms:.0f` ms ({glue:text}`xl_hidden_pct:.0f`%) were hidden.
# The model leaves only the last bucket's all-reduce, {glue:text}`xl_tail_ms:.2f` ms (the
# embedding's gradient, ready last): the runs left {glue:text}`xl_overlap_x:.0f`× that, a miss the
# model does not explain. Not by the bucket size: with 1,000 MB buckets, the largest size the
# assignment tries, the model leaves {glue:text}`xl_gb_cap_ms:.2f` ms, and
# {glue:text}`xl_overlap_ms:.1f` ms is the time of one all-reduce of
# {glue:text}`xl_alone_mib:,.0f` MiB alone. The likely cause is what the model leaves out: NCCL
# runs its reductions on the same SMs as the backward, whose time grew by
# {glue:text}`xl_slower_bwd_ms:.1f` ms, so the all-reduces that share the GPU with it run slower
# than the fit measured them alone; the seed's timings cannot say more. The step still got
# {glue:text}`xl_saved_ms:.0f` ms shorter.
#
# ### How large should a bucket be?
#
# Bucketing trades two costs (`accounting.buckets.exposed_bounds_s`). The **tail**: the last
# bucket's all-reduce cannot start before the backward ends, and it is longer for a larger bucket.
# The **queue**: the all-reduces run one after another from the moment the first bucket is full, so
# they end no earlier than first-ready + their total time, and small buckets pay α many times. The
# exposed time is at least the larger of the two (equal to it for equal buckets). In the model,
# the seed's backward of {glue:text}`xl_bwd_ms:.0f` ms would hide everything but the tail; their
# runs hid {glue:text}`xl_hidden_pct:.0f`% (above). The same step
# in bf16 on two H100s (NVLink 4, a backward at the bf16 peak, the seed's α) is another matter.
# Here is its schedule for three choices: the schedule behind `buckets.overlap_exposed_s`, written
# out bucket by bucket (`buckets.overlap_schedule`):

# %% tags=["hide-input"]
fast = ddp_step_seed.bf16_case(FAST, XL_BATCH, XL_SEQ)  # gradients, backward, links
sizes, bwd, nvlink4 = fast["sizes"], fast["backward_s"], fast["links"]["nvlink4"]
shown = {"NVLink 4, 1 GiB buckets": (GIB, nvlink4), "NVLink 4, 25 MiB buckets": (25 * MIB, nvlink4),
         "PCIe Gen5, 25 MiB buckets": (25 * MIB, fast["links"]["pcie5"])}
fig, axes = plotting.subplots(len(shown), 1, width=8.0, height=6.6)
for i, (ax, (name, (cap, link))) in enumerate(zip(axes, shown.items(), strict=True)):
    collectives.draw_ddp_overlap(sizes, cap, bwd, WORLD, **link, ax=ax,
                                 title=f"xl on 2 H100s, bf16: {name}")
    glue(f"overlap_{i}_ms", 1e3 * buckets.overlap_exposed_s(buckets.bucket_bytes(sizes, cap),
                                                            bwd, WORLD, **link))
plt.show()
last_gib = comms_cost.collective_time_s("all_reduce", buckets.bucket_bytes(sizes, GIB)[-1],
                                        WORLD, **nvlink4)
assert math.isclose(buckets.overlap_exposed_s(buckets.bucket_bytes(sizes, GIB), bwd, WORLD,
                                              **nvlink4), last_gib)  # the whole last bucket

# %% [markdown]
# The backward's lane is coloured by the bucket that each stretch of it fills; below it, each
# bucket's all-reduce starts once the bucket is full and the one before it is done. With 1 GiB
# buckets the all-reduces start late, and the whole last one, {glue:text}`overlap_0_ms:.2f` ms, is
# left after the backward. With 25 MiB buckets they keep pace with the backward and leave
# {glue:text}`overlap_1_ms:.2f` ms, the last small bucket's. Over PCIe Gen5 the link cannot keep up
# with the same buckets: they queue, and {glue:text}`overlap_2_ms:.1f` ms are left. Over a sweep
# of caps:

# %% tags=["hide-input"]
sweep, sweep_numbers = ddp_step_seed.bucket_sweeps([c * MIB for c in BUCKET_CAPS_MIB], fast,
                                                   overlap_run["backward_s"])  # asserts the text
for name, value in sweep_numbers.items():
    glue(name, value)
ddp_step_seed.sweep_table(sweep["2 H100s, bf16, backward at peak"])

# %% tags=["remove-input"]
fig, ax = plotting.subplots(width=8.0, height=3.8)
plotting.plot_bucket_sweeps(sweep, ax)
plt.show()

# %% [markdown]
# There the backward takes {glue:text}`bwd_fast_ms:.1f` ms and one all-reduce of all the bf16
# gradients {glue:text}`fast_comm_ms:.1f` ms. Small caps queue behind their latencies, one huge
# bucket waits for the whole backward; caps of {glue:text}`valley` MiB, PyTorch's default of 25
# among them, leave {glue:text}`best_ms:.2f` ms: only the tail, the embedding's gradient (ready
# last) in a bucket of its own. Joined by PCIe Gen5 instead, the all-reduces take longer than the
# backward, the queue rules, and no cap leaves less than {glue:text}`pcie_best_ms:.0f` ms: on a slow
# link, send fewer bytes (accumulation) or shard.
#
# ### The data-parallel roofline
#
# Whether the backward can hide the all-reduce at all is set before any bucket is chosen. Per
# token the backward does {glue:text}`roof_per_token_n:.2f`$N$ FLOPs (twice the forward's
# matmuls), and each rank sends $2\frac{n-1}{n} \cdot 2N$ bytes of bf16 gradients per step
# whatever the batch. The backward hides them when its FLOPs per byte sent reach $C/W$, the GPU's
# FLOP/s over the link's bytes/s: when the tokens per GPU reach about $\frac{n-1}{n}\,C/W$, the
# Scaling Book's condition for pure data parallelism, $B/X > C/W$ {cite}`austin2025scaling`. For
# the step above (`ddp_step_seed.dp_roofline`, which asserts that its verdict on two GPUs is the
# bucket sweep's queue bound):

# %% tags=["hide-input"]
roof, roof_table = ddp_step_seed.dp_roofline(fast, FAST, XL_BATCH, XL_SEQ, CLUSTER)
cross, cross_table = ddp_step_seed.cross_node(sum(sizes), CLUSTER, CROSS_NODES,
                                              alpha_s=seed_fit.alpha_s)  # the next section's
for name, value in {**roof, **cross}.items():
    glue(name, value)
roof_table

# %% [markdown]
# Over NVLink 4 ($C/W$ = {glue:text}`roof_ridge_0:,.0f` FLOP per byte) the
# {glue:text}`roof_tokens:,` tokens per GPU pass the {glue:text}`roof_critical_0:,.0f` needed: the
# buckets only have to keep pace, and the tail is all that is left. Over PCIe Gen5 ($C/W$ =
# {glue:text}`roof_ridge_1:,.0f`) {glue:text}`roof_critical_1:,.0f` are needed: no bucket size
# helps, and the queue bound is the roofline's gap. Across two whole nodes it takes
# {glue:text}`roof_critical_2:,.0f`, just more than this batch; with one GPU per node,
# {glue:text}`roof_critical_3:,.0f`. More tokens per GPU per optimizer step (a larger batch, or
# accumulation, below) raise the FLOPs per byte; sharding does not lower the bytes (ZeRO, below).
#
# ### Across nodes: a ring per port, two levels, and the switch
#
# A ring that leaves a node does not squeeze through one GPU's port. NCCL builds one ring per
# port, each carrying a share of the message and leaving the node through another GPU's NIC, so a
# group of whole DGX H100 nodes crosses at the node's egress, 8 × 50 = 400 GB/s, close to
# NVLink's 450; the Scaling Book costs cross-node collectives this way {cite}`austin2025scaling`.
# Only a group with one GPU per node (data parallelism across nodes, tensor parallelism inside)
# gets a single port (`hardware.Cluster.ring_link`). Two refinements go further. A
# **hierarchical** all-reduce reduce-scatters inside each node over NVLink, all-reduces each GPU's
# eighth across the nodes on its own port, and all-gathers inside the node: pipelined chunk by
# chunk, it moves bytes at the rings' rate in far fewer latency steps. **In-network reduction**
# (NVIDIA's SHARP switches {cite}`graham2016sharp`) adds the shards in the switches: each GPU
# sends its eighth once and receives the sum once, instead of $2\frac{N-1}{N}$ times. The `xl`
# bf16 gradients ({glue:text}`cn_gb:.1f` GB) over {glue:text}`cn_nodes` nodes
# ({glue:text}`cn_gpus` H100s), with the seed's α per step
# (`accounting.comms.hierarchical_all_reduce_s`):

# %% tags=["hide-input"]
cross_table

# %% [markdown]
# Costed at one port per GPU, as if the ring squeezed through one NIC, the all-reduce would take
# {glue:text}`cn_port_ms:.0f` ms; one ring per port takes {glue:text}`cn_egress_ms:.1f` ms, of
# {glue:text}`cn_steps_flat` latency steps. The two levels take {glue:text}`cn_two_ms:.1f` ms in
# {glue:text}`cn_steps_two` steps with their phases pipelined ({glue:text}`cn_two_sum_ms:.0f` ms
# one after another), and with the switches summing, {glue:text}`cn_sharp_ms:.1f` ms: NVLink's
# phases are then the slowest.
#
# ### Gradient accumulation
#
# $K$ micro-batches per optimizer step, their gradients summed in `.grad`: with the all-reduce
# skipped on all but the last (`no_sync`), the communication per optimizer step is one all-reduce
# whatever $K$ is. The seed's one-pager lists "higher memory (store accumulated grads)" as its
# price. With replicated gradients (DDP, ZeRO-1) the `.grad` buffers exist with or without
# accumulation; what changes is the activations, saved for one micro-batch at a time (`xl`,
# {glue:text}`acc_batch` sequences per GPU, in fp32 with naive attention, as the seed ran it):

# %% tags=["hide-input"]
saved_k = {k: activations.saved_bytes(cfg, XL_BATCH // k, XL_SEQ).total_bytes
           for k in MICRO_BATCHES}
sent_k = {(k, s): comms_cost.accumulation_sent_bytes(grad_bytes, WORLD, k, sync_each_micro_batch=s)
          for k in MICRO_BATCHES for s in (False, True)}
assert len({sent_k[k, False] for k in MICRO_BATCHES}) == 1  # one all-reduce whatever K is
assert saved_k[1] > 0.99 * MICRO_BATCHES[-1] * saved_k[MICRO_BATCHES[-1]]
Table(["micro-batches K", "sent per optimizer step, no_sync (GB)", "syncing each (GB)",
       "gradient buffers, fp32 (GB)", "saved activations, fp32 (GB)"],
      [[k, num(sent_k[k, False] / 1e9), num(sent_k[k, True] / 1e9), num(grad_bytes / 1e9),
        num(saved_k[k] / 1e9)] for k in MICRO_BATCHES])

# %% [markdown]
# With sharded gradients the seed is right. ZeRO-2 and FSDP hold $1/n$ of the gradients only
# because every backward reduce-scatters them; under `no_sync` each rank keeps the whole gradient
# until the last micro-batch ($4\Psi$ in fp32, not $4\Psi/n$): for `xl` in bf16 on
# {glue:text}`zero_ranks` GPUs, {glue:text}`z0_grads_gb:.1f` GB per GPU instead of ZeRO-2's
# {glue:text}`z2_grads_gb:.2f` GB (PyTorch's FSDP documents the same of its `no_sync`). The
# alternative is a reduce-scatter per micro-batch: $K$ times the gradient traffic.
#
# ### ZeRO: what each rank holds and sends
#
# Data parallelism replicates weights, gradients and optimizer state on every rank. ZeRO stage 1
# shards the optimizer state (and fp32 master weights) over the $n$ ranks, stage 2 the gradients
# too, stage 3 the weights too (`accounting.zero`). For the seed's run (fp32 AdamW, 16 bytes per
# parameter, 2 GPUs) and for the `xl` preset on {glue:text}`zero_ranks` GPUs with mixed-precision
# AdamW, per GPU, with the bf16 activations of {glue:text}`acc_batch` × {glue:text}`xl_seq` tokens
# (SDPA attention), which no stage shards (the same tokens in fp32 with naive attention saved
# {glue:text}`acc_fp32_gb:.1f` GB, above):

# %% tags=["hide-input"]
seed_states = {s: zero_cost.zero_memory_bytes(n_params, WORLD, s, "fp32_adamw")
               for s in zero_cost.STAGES}
assert seed_states[0] - seed_states[1] == 4 * n_params  # half of AdamW's 8 B/param, per GPU
acts = activations.saved_bytes(cfg, XL_BATCH, XL_SEQ, dtype="bf16", attention="sdpa").total_bytes
where = {s: zero_cost.zero_memory_breakdown(n_params, ZERO_RANKS, s, RECIPE)
         for s in zero_cost.STAGES}
states = {s: sum(where[s].values()) for s in zero_cost.STAGES}
assert math.isclose(states[3], 16 * n_params / ZERO_RANKS)
for name, value in {"q_given_back_gb": (seed_states[0] - seed_states[1]) / 1e9,
                    "seed_stage0_gb": seed_states[0] / 1e9, "zero_ranks": ZERO_RANKS,
                    "xl_seq": XL_SEQ, "acc_batch": XL_BATCH, "acts_gb": acts / 1e9,
                    "zero8_s0_gb": (states[0] + acts) / 1e9, "acc_fp32_gb": saved_k[1] / 1e9,
                    "zero8_s3_gb": (states[3] + acts) / 1e9,
                    **{f"z{s}_grads_gb": where[s]["grads"] / 1e9 for s in (0, 2)}}.items():
    glue(name, value)
Table(["stage", "2 GPUs, fp32 AdamW (GB)", f"{ZERO_RANKS} GPUs: model states (GB)",
       "+ activations (GB)"], [[s, num(seed_states[s] / 1e9), num(states[s] / 1e9),
                                num((states[s] + acts) / 1e9)] for s in zero_cost.STAGES])

# %% tags=["remove-input"]
fig, ax = plotting.subplots(width=7.0, height=3.6)
plotting.stacked_bars(ax, [f"stage {s}" for s in zero_cost.STAGES],
                      {**{k: [where[s][k] / 1e9 for s in zero_cost.STAGES] for k in where[0]},
                       "activations": [acts / 1e9] * len(zero_cost.STAGES)},
                      ylabel="GB per GPU")
plotting.finish(ax, title=f"xl on {ZERO_RANKS} GPUs, {RECIPE}, where the memory goes")
plt.show()

# %% [markdown]
# Sharding the optimizer state gives back {glue:text}`q_given_back_gb:.1f` GB of the seed's
# {glue:text}`seed_stage0_gb:.1f` GB per GPU. On {glue:text}`zero_ranks` GPUs a rank goes from
# {glue:text}`zero8_s0_gb:.1f` GB at stage 0 to {glue:text}`zero8_s3_gb:.1f` GB at stage 3, of which
# {glue:text}`acts_gb:.1f` GB are activations. What does it cost in traffic? Stages 1 and 2
# reduce-scatter the gradients (each rank needs only its shard's sum) and all-gather the updated
# weights: $\frac{n-1}{n}M$ each, data parallelism's $2\frac{n-1}{n}M$ in total. Stage 3 gathers
# the weights twice (forward and backward): 1.5×. The seed's one-pager gives other figures:

# %% tags=["hide-input"]
zero_numbers, zero_table = ddp_step_seed.zero_traffic(n_params, ZERO_RANKS, cfg.n_layers)
for name, value in zero_numbers.items():
    glue(name, value)
zero_table

# %% [markdown]
# The seed's stage 1 all-reduces the gradients *and* gathers the optimizer state
# ({glue:text}`claim_s1:.1f`× data parallelism): the optimizer state never travels, only the
# updated weights do. Its stage 2 counts a reduce-scatter as $M$ and forgets the all-gather of the
# updated weights ({glue:text}`claim_s2:.2f`×). Its stage 3 gathers $M/N$ per layer $L$ times and
# grows with the depth ({glue:text}`claim_s3:.1f`× here); the weights are gathered once per pass,
# $\frac{n-1}{n}M$ each time.
#
# ## The code
#
# The ring, written out from sends and receives (`distributed.comms`):
#
# ```{literalinclude} ../lib/mlsys/distributed/comms.py
# :pyobject: ring_all_reduce
# ```
#
# On {glue:text}`ring_ranks` gloo ranks, against `torch.distributed.all_reduce` of the same
# tensor, with every call counted by `comms.count_bytes`:

# %%
ring = launch.run(allreduce_bench.ring_check, RING_RANKS, args=(RING_NUMEL,), timeout_s=120)
allreduce_bench.ring_table(ring, RING_NUMEL)  # asserts each rank's sum, bytes and calls first

# %% [markdown]
# Equal to rounding (the additions happen in another order), and exactly the bytes of the
# accounting. `distributed.ddp` wraps an unmodified model four ways, from naive (one all-reduce
# per parameter after the backward) and flat (one for all) to overlapped (one per parameter, from a
# hook, as soon as its gradient is ready) and bucketed, the scheme of PyTorch's DDP
# {cite}`li2020pytorch`:
#
# ```{literalinclude} ../lib/mlsys/distributed/ddp.py
# :pyobject: BucketedDDP
# ```
#
# ZeRO stages 1 and 2 (`distributed.zero.ShardedOptimizer`) give each parameter an owner; each
# gradient is reduced to its owner, the owner steps, and broadcasts the result:
#
# ```{literalinclude} ../lib/mlsys/distributed/zero.py
# :pyobject: ShardedOptimizer.step
# ```
#
# ## Measurement
#
# ### The all-reduce against size and ranks
#
# One launch per rank count; a sample is the slowest rank's time per call (a collective is done
# when its last rank is), over back-to-back calls. On a CPU the ranks are gloo processes sharing
# this machine's cores and memory, so there is no link spec to compare with; on GPUs they are
# NCCL ranks, one per GPU:

# %%
ar_live = allreduce_bench.run(ALLREDUCE)

# %% tags=["hide-input"]
for name, text in allreduce_bench.verdicts(ar_live).items():
    glue(f"ar_live_{name}", text)
allreduce_bench.table(ar_live)

# %% tags=["remove-input"]
kit.draw(allreduce_bench.plot, ar_live, ncols=2, width=11.0, height=4.0)

# %% [markdown]
# On this machine: {glue:text}`ar_live_fit`. Across rank counts: {glue:text}`ar_live_bandwidths`.
#
# ### A data-parallel step taken apart
#
# One launch of {glue:text}`step_world` ranks trains the {glue:text}`step_preset` preset
# (batch {glue:text}`step_batch` × {glue:text}`step_seq` tokens per rank, AdamW): first a few
# all-reduce probes, fitted to α and β, so that the communication of each DDP variant is predicted
# from its bytes on this very run; then each variant's step in phases, with its all-reduce launches
# counted:

# %%
step_rows = ddp_step.run(STEP)

# %% tags=["hide-input"]
for name, text in ddp_step.verdicts(step_rows).items():
    glue(f"step_{name}", text)
glue("step_torch_target", ddp_step.torch_target(step_rows))
for key in ("world_size", "preset", "batch", "seq", "bucket_mb"):
    glue(f"step_{key.removesuffix('_size')}", ddp_step.setup(step_rows).get(key, 25.0))
ddp_step.table(step_rows)

# %% tags=["remove-input"]
kit.draw(ddp_step.plot, step_rows, width=8.0, height=3.8)

# %% [markdown]
# The breakdown: {glue:text}`step_breakdown`. Against the model: {glue:text}`step_miss`. Flat
# against naive: {glue:text}`step_flat`. With overlap: {glue:text}`step_overlap`. On a CPU the
# overlap is limited: gloo's reductions run on the same few cores as the backward.
#
# ### Buckets, PyTorch's DDP, accumulation and ZeRO, measured
#
# The same launch sweeps the bucket cap (the exposed communication measured, and modelled with this
# run's α and β), runs our bucketed DDP and `torch.nn.parallel.DistributedDataParallel`
# alternately step by step (the same {glue:text}`step_bucket_mb` MiB buckets, chosen to make
# several, and the same weights), accumulates gradients over
# micro-batches, and takes a step of ZeRO stages 0–2, reading what each rank holds from its
# tensors:

# %% tags=["hide-input"]
display(ddp_step.bucket_table(step_rows), ddp_step.accumulation_table(step_rows))
ddp_step.zero_table(step_rows)

# %% [markdown]
# Buckets: {glue:text}`step_buckets`. Against PyTorch's DDP: {glue:text}`step_torch`; the book's
# target for our step against theirs: {glue:text}`step_torch_target`. Accumulation:
# {glue:text}`step_accumulation`. ZeRO: {glue:text}`step_zero` (a rank's share differs from $1/n$
# because whole tensors go to owners). Stage 3 is FSDP, measured in chapter 09.
#
# ### Recorded GPU results
#
# `python -m mlsys.experiments allreduce_bench ddp_step` runs both experiments in GPU sizes: NCCL
# all-reduces of {glue:text}`gpu_sizes` MiB on {glue:text}`gpu_ranks` GPUs where the machine has
# them, and the {glue:text}`gpu_preset` preset's DDP step on {glue:text}`gpu_world` GPUs. A machine
# with one GPU records one-rank rows (an all-reduce over one rank crosses no link) and a row saying
# why: those measure the step's phases and the memory, not the link. Every record present is shown
# below through the same functions as the live run. {glue:text}`missing_records`

# %% tags=["hide-input"]
gpu_ar, gpu_step = allreduce_bench.SIZES["gpu"], ddp_step.SIZES["gpu"]
for name, value in {"gpu_sizes": f"{num(gpu_ar.message_bytes[0] / MIB)} to "
                                 f"{num(gpu_ar.message_bytes[-1] / MIB)}",
                    "gpu_ranks": ", ".join(map(str, gpu_ar.world_sizes)),
                    "gpu_preset": gpu_step.preset, "gpu_world": gpu_step.world_size}.items():
    glue(name, value)
missing = glue("missing_records", experiments.show_records(("allreduce_bench", "ddp_step"),
                                                          **ddp_step.record_views()))

# %% [markdown]
# ```{admonition} Takeaway
# :class: tip
# A ring all-reduce sends $2\frac{n-1}{n}M$ per rank in $2(n-1)$ steps of latency α. The `xl`
# gradients' {glue:text}`xl_tensors` all-reduces on the seed's two Ampere GPUs (A100s, by
# inference): predicted {glue:text}`xl_pred_naive_ms:.1f` ms from the bytes and their α-β fit,
# measured {glue:text}`xl_naive_ms:.1f` ms ({glue:text}`xl_naive_share:.1f`% of the step).
# Overlapped, the model hides all but the last bucket; their runs hid
# {glue:text}`xl_hidden_pct:.0f`%. The backward hides the all-reduce only above about $C/W$ tokens
# per GPU; across whole nodes the rings run at the node's egress. Sharding the optimizer state
# (ZeRO-1) gives back {glue:text}`q_given_back_gb:.1f` GB per GPU for the same traffic.
# ```
#
# ## Exercises
#
# ### Q1 (multi-step) xl on 8 and 16 H100s
#
# The `xl` preset, mixed-precision AdamW, bf16 gradients and weights on the wire. (a) What does
# each GPU hold in model states at stages 0–3 on 8 GPUs? (b) How many bytes does each GPU send per
# step at each stage? (c) With (b)'s stage-0 bytes, how long does the all-reduce take, bandwidth
# term only, in one DGX H100 node (8 GPUs), across two whole nodes (16), and over 16 GPUs in 16
# nodes, one GPU in each? (d) With (a)'s bytes per
# parameter, what is the largest model whose model states fit in 8 H100s at each stage
# (activations aside)?

# %% tags=["hide-cell"]
dgx, n8 = CLUSTER, ZERO_RANKS
q1_mem = {s: zero_cost.zero_memory_bytes(n_params, n8, s, RECIPE) for s in zero_cost.STAGES}
q1_sent = {s: sum(zero_cost.zero_sent_bytes(n_params, n8, s, grad_dtype="bf16",
                                    param_dtype="bf16").values()) for s in zero_cost.STAGES}
q1_link = {"t8": (8, dgx.ring_link(8)), "t16": (16, dgx.ring_link(16)),  # whole nodes
           "t1": (16, dgx.ring_link(16, stride=dgx.per_node))}  # one GPU in each of 16 nodes
q1_t = {k: comms_cost.collective_cost("all_reduce", 2 * n_params, n).bus_bytes  # bf16 gradients
        / link.bytes_per_s for k, (n, link) in q1_link.items()}
q1_max = {s: math.floor(FAST.hbm_bytes / zero_cost.zero_memory_bytes(1, n8, s, RECIPE))
          for s in zero_cost.STAGES}
assert q1_max[3] == memory.max_trainable_params(n8, FAST.hbm_bytes, RECIPE)  # 16 B/param / n
assert q1_t["t8"] < q1_t["t16"] < 1.3 * q1_t["t8"] and math.isclose(q1_t["t1"], 8 * q1_t["t16"])
assert q1_sent[3] == 1.5 * q1_sent[0]
assert math.isclose(q1_sent[0], q1_t["t8"] * dgx.intra_node.bytes_per_s)  # (c) from (b)
for k, (_, link) in q1_link.items():
    glue(f"q1_{k}", q1_t[k] * 1e3)
    glue(f"q1_{k}_gb", link.bytes_per_s / 1e9)
for s in zero_cost.STAGES:
    glue(f"q1_mem_{s}", q1_mem[s] / 1e9)
    glue(f"q1_sent_{s}", q1_sent[s] / 1e9)
    glue(f"q1_max_{s}", q1_max[s] / 1e9)

# %% [markdown]
# ```{dropdown} Answer
# (a) For $\Psi$ parameters: $16\Psi$ at stage 0, $4\Psi + 12\Psi/8$ at stage 1 (bf16 weights
# and gradients whole, the fp32 master weights and moments sharded), $2\Psi + 14\Psi/8$ at stage 2
# and $16\Psi/8$ at stage 3: {glue:text}`q1_mem_0:.1f`, {glue:text}`q1_mem_1:.1f`,
# {glue:text}`q1_mem_2:.1f` and {glue:text}`q1_mem_3:.1f` GB.
# (b) Stages 0–2 move the bf16 gradients' $2\frac{n-1}{n}M$ with $M = 2\Psi$:
# {glue:text}`q1_sent_0:.2f` GB ({glue:text}`q1_sent_1:.2f` and {glue:text}`q1_sent_2:.2f` GB at
# stages 1 and 2); stage 3 gathers the weights twice and reduce-scatters once,
# {glue:text}`q1_sent_3:.2f` GB.
# (c) (b)'s {glue:text}`q1_sent_0:.2f` GB at NVLink 4's {glue:text}`q1_t8_gb:.0f` GB/s per
# direction: {glue:text}`q1_t8:.1f` ms. Across two whole nodes a rank sends $2\cdot\frac{15}{16}M$,
# and the rings leave each node through all 8 ports, one ring per port: the node's egress,
# {glue:text}`q1_t16_gb:.0f` GB/s, {glue:text}`q1_t16:.1f` ms, hardly more than inside one node.
# With one GPU in each of 16 nodes every ring hop crosses on that GPU's one port,
# {glue:text}`q1_t1_gb:.0f` GB/s: {glue:text}`q1_t1:.0f` ms, 8× longer. That is also what
# costing two whole nodes at a single port would wrongly give.
# (d) 8 × 80 GB divided by (a)'s bytes per parameter: {glue:text}`q1_max_0:.1f`,
# {glue:text}`q1_max_1:.1f`, {glue:text}`q1_max_2:.1f` and {glue:text}`q1_max_3:.1f` billion
# parameters. Only stage 3 grows with the number of GPUs without bound.
# ```
#
# ### Q2 (find the error) More GPUs, more GB/s
#
# "The seed's all-reduce of 1,024 MiB reached {glue:text}`q2_claim_2` GB/s on 2 GPUs and
# {glue:text}`q2_claim_6` GB/s on 6: more GPUs use the links better, so the 6-GPU all-reduce
# finishes sooner." What is wrong?

# %% tags=["hide-cell"]
at_gib = {r["world_size"]: r for r in ar_rows if r["message_bytes"] == GIB}
assert at_gib[6]["claimed_gb_per_s"] > at_gib[2]["claimed_gb_per_s"]
assert at_gib[6]["mean_s"] > at_gib[2]["mean_s"]  # and yet slower
assert at_gib[6]["algbw_bytes_per_s"] < at_gib[2]["algbw_bytes_per_s"]
for n in (2, 6):
    glue(f"q2_claim_{n}", at_gib[n]["claimed_gb_per_s"])
    glue(f"q2_ms_{n}", at_gib[n]["mean_s"] * 1e3)
    glue(f"q2_algbw_{n}", at_gib[n]["algbw_bytes_per_s"] / 1e9)
    glue(f"q2_factor_{n}", comms_cost.bus_factor("all_reduce", n))

# %% [markdown]
# ```{dropdown} Answer
# The printed figure is the bus bandwidth, in GiB/s: the algorithm bandwidth times $2(n-1)/n$,
# {glue:text}`q2_factor_2:.2f` at 2 ranks and {glue:text}`q2_factor_6:.2f` at 6. It measures how
# busy each link was, not how soon the sum arrived. The times say it: {glue:text}`q2_ms_2:.2f` ms
# on 2 GPUs, {glue:text}`q2_ms_6:.2f` ms on 6; the algorithm bandwidths are
# {glue:text}`q2_algbw_2:.0f` and {glue:text}`q2_algbw_6:.0f` GB/s. Each rank sends
# $2\frac{n-1}{n}M$, which grows with $n$.
# ```
#
# ### Q3 (code) Write the ring all-reduce
#
# Write `ring_all_reduce(buffers)`: `buffers` holds one 1-D tensor per rank, and the function
# returns what each rank holds after an all-reduce, as `torch.distributed.all_reduce` leaves it
# (the sum on every rank), without changing the inputs. Build it from the two halves of the
# figure above: cut each buffer into $n$ chunks (`tensor_split`); in each of $n-1$
# reduce-scatter steps, every rank sends one chunk to its right-hand neighbour, which adds it to
# its own; in each of $n-1$ all-gather steps, every rank sends a finished chunk on, which the
# neighbour copies. The ranks send at the same time, so take all of a step's messages before
# anyone adds. Which chunk does rank $r$ send at step $s$ of each half? The check uses
# {glue:text}`q3_n` ranks of {glue:text}`q3_numel` integers: the chunks are unequal, and the sum is
# exact.

# %%
def ring_all_reduce(buffers):  # <- your code here
    """Each rank's tensor after a ring all-reduce of `buffers` (one 1-D tensor per rank)."""
    raise NotImplementedError("write the reduce-scatter, then the all-gather")


# %% tags=["hide-cell"]
# The book's solution (opened on demand). `solved_by` checks the reader's function once it is
# written, and the book's while it is not, against the sum, on every rank.
def ring_all_reduce_solution(buffers):
    n = len(buffers)
    chunks = [list(b.clone().tensor_split(n)) for b in buffers]  # views of each rank's copy
    for s in range(n - 1):  # reduce-scatter: rank r passes chunk r - s on, its neighbour adds it
        sent = [chunks[r][(r - s) % n].clone() for r in range(n)]
        for r in range(n):
            chunks[r][(r - 1 - s) % n].add_(sent[r - 1])
    for s in range(n - 1):  # all-gather: rank r passes its finished chunk r + 1 - s on
        sent = [chunks[r][(r + 1 - s) % n].clone() for r in range(n)]
        for r in range(n):
            chunks[r][(r - s) % n].copy_(sent[r - 1])
    return [torch.cat(c) for c in chunks]


gen = torch.Generator().manual_seed(0)
q3_in = [torch.randint(-999, 1000, (Q3_NUMEL,), generator=gen) for _ in range(Q3_RANKS)]
q3_copies = [b.clone() for b in q3_in]
q3_out, whose = solved_by(ring_all_reduce, ring_all_reduce_solution, q3_in)
assert len(q3_out) == Q3_RANKS and all(torch.equal(x, sum(q3_copies)) for x in q3_out)
assert all(torch.equal(b, c) for b, c in zip(q3_in, q3_copies, strict=True))  # inputs unchanged
q3_trace = collectives.simulate_ring_all_reduce(q3_in)  # the library's ring counts the bytes
assert sum(q3_trace.sent_bytes) == 2 * (Q3_RANKS - 1) * q3_in[0].nbytes  # each chunk 2(n-1) times
for name, value in {"q3_n": Q3_RANKS, "q3_numel": Q3_NUMEL,
                    "q3_chunks": ", ".join(str(len(c)) for c in q3_in[0].tensor_split(Q3_RANKS)),
                    "q3_sent": ", ".join(str(b // 8) for b in q3_trace.sent_bytes)}.items():
    glue(name, value)
print(f"checked: {whose} solution, every rank holds the sum, the inputs are unchanged")

# %% [markdown]
# ```{dropdown} Answer
# Number the steps of each half $s = 0 \ldots n-2$. In the reduce-scatter, rank $r$ sends chunk
# $(r-s) \bmod n$ and adds the chunk $(r-s-1) \bmod n$ arriving from its left, which has then
# passed through $s+2$ ranks; after $n-1$ steps rank $r$ holds chunk $(r+1) \bmod n$ complete. In
# the all-gather, rank $r$ sends chunk $(r+1-s) \bmod n$, finished or just received, and its
# neighbour copies it over its partial sum. With {glue:text}`q3_n` ranks and
# {glue:text}`q3_numel` elements the chunks have {glue:text}`q3_chunks` elements, so the ranks
# send {glue:text}`q3_sent` elements each: every chunk crosses $2(n-1)$ links, and with equal
# chunks each rank sends $2\frac{n-1}{n}M$. `distributed.comms.ring_all_reduce` (above) is the
# same two loops with `isend` and `recv` between processes.
# ```
#
# ### Q4 Reading the ring
#
# In the figure of the ring on {glue:text}`ring_n` ranks: (a) which chunk does rank 2 hold
# complete after the reduce-scatter, and which rank holds chunk 0 complete? (b) A 1 GiB fp32
# gradient on 8 ranks: how many bytes does each rank send in the reduce-scatter, and in the whole
# all-reduce? (c) How many steps does it take, and how much of its time is latency at the seed's
# fitted α?

# %% tags=["hide-cell"]
q4_trace = collectives.simulate_ring_all_reduce([torch.ones(DIAGRAM_RANKS)] * DIAGRAM_RANKS)
q4_holds = q4_trace.steps[DIAGRAM_RANKS - 1].holds  # before the first all-gather step
q4_done = {r: c for r in range(DIAGRAM_RANKS) for c in range(DIAGRAM_RANKS)
           if len(q4_holds[r][c]) == DIAGRAM_RANKS}
q4_rs, q4_ar = (comms_cost.collective_cost(c, GIB, 8) for c in ("reduce_scatter", "all_reduce"))
for name, value in {"q4_rank2": q4_done[2], "q4_chunk0": q4_done[DIAGRAM_RANKS - 1],
                    "q4_rs_mib": q4_rs.sent_bytes / MIB, "q4_ar_mib": q4_ar.sent_bytes / MIB,
                    "q4_steps": q4_ar.steps, "q4_latency_us": q4_ar.steps * seed_fit.alpha_s * 1e6,
                    "q4_latency_share": 100 * q4_ar.steps * seed_fit.alpha_s
                    / comms_cost.time_s(q4_ar, **ab)}.items():
    glue(name, value)
assert q4_done[2] == 3 and q4_done[DIAGRAM_RANKS - 1] == 0  # chunk r + 1 on rank r
assert q4_ar.sent_bytes == 2 * q4_rs.sent_bytes == 2 * 7 / 8 * GIB and q4_ar.steps == 14

# %% [markdown]
# ```{dropdown} Answer
# (a) Rank $r$ finishes chunk $(r+1) \bmod n$: rank 2 holds chunk {glue:text}`q4_rank2`, and
# chunk 0 is finished on rank {glue:text}`q4_chunk0`, the last. (b) The reduce-scatter sends
# $n-1$ chunks of $M/n$: {glue:text}`q4_rs_mib:.0f` MiB; the all-gather as many again,
# {glue:text}`q4_ar_mib:.0f` MiB in all. (c) {glue:text}`q4_steps` steps, each paying α:
# {glue:text}`q4_latency_us:.0f` µs, {glue:text}`q4_latency_share:.1f`% of the time of 1 GiB at
# the seed's fitted β; for a message of a few kilobytes, almost all of it.
# ```
#
# ## Summary
#
# - A ring all-reduce is a reduce-scatter and an all-gather: $2\frac{n-1}{n}M$ sent per rank in
#   $2(n-1)$ steps; time $2(n-1)\alpha + 2\frac{n-1}{n}M/\beta$, not $(n-1)\alpha$ of latency,
#   and not $2M/\beta$ at two ranks.
# - Bus bandwidth (algorithm bandwidth × $2(n-1)/n$) is the figure to set beside a link's
#   per-direction spec; the seed's "GB/s" were bus bandwidths in GiB/s.
# - Naive DDP pays a latency per tensor, flat DDP one; the seed's naive `xl` run is predicted from
#   its own all-reduce table ({glue:text}`xl_pred_naive_ms:.1f` ms for
#   {glue:text}`xl_naive_ms:.1f` ms measured), and its "flat" run was the naive one.
# - Bucketed overlap leaves at least the larger of the tail (the last bucket) and the queue
#   (latencies and bytes beyond the backward); the best bucket size balances them.
# - Accumulation with `no_sync` sends one all-reduce per optimizer step and cuts activations; with
#   replicated gradients it costs no gradient memory, while ZeRO-2 and FSDP keep whole gradients
#   under `no_sync`.
# - The backward hides data parallelism's all-reduce only above about $C/W$ tokens per GPU; rings
#   across whole nodes run at the node's egress, hierarchy saves latency steps, and in-network
#   reduction nearly halves the bytes that cross.
# - ZeRO stages 1 and 2 send what data parallelism sends and hold less; stage 3 sends 1.5×.
