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
import math

import matplotlib.pyplot as plt
from IPython.display import display

from mlsys import experiments, hardware, plotting, third_party
from mlsys.accounting import activations, buckets, flops, memory
from mlsys.accounting import comms as comms_cost
from mlsys.accounting import zero as zero_cost
from mlsys.accounting.params import count_params
from mlsys.book import Table, glue, num
from mlsys.distributed import launch
from mlsys.experiments import allreduce_bench, ddp_step, ddp_step_seed, kit
from mlsys.models.config import TransformerConfig

MIB, GIB = 2**20, 2**30

# %% tags=["parameters"]
# Napkin math (nothing measured): the question's set-up (the seed's DDP run), and the examples
PRESET, WORLD = "xl", 2
XL_BATCH, XL_SEQ = 4, 512  # per GPU
SEED_GPU = hardware.A100_80GB_SXM  # the seed's GPUs are of the Ampere generation
FAST = hardware.H100_SXM  # the same step in bf16 on H100s: where the bucket size matters
LINK_KEYS = ("nvlink3", "nvlink4", "pcie4", "ib-hdr")
BUCKET_CAPS_MIB = (0.25, 1, 4, 16, 25, 64, 256, 1_024, 4_096)
MICRO_BATCHES = (1, 2, 4)
ZERO_RANKS, RECIPE = 8, "bf16_mixed_adamw"
# Checks (run live): the hand-written ring on a few gloo ranks
RING_RANKS, RING_NUMEL = 3, 999_999
# Measurements: sizes per profile live with each experiment (lib/mlsys/experiments/)
ALLREDUCE = env.pick(**allreduce_bench.SIZES)
STEP = env.pick(**ddp_step.SIZES)
print(ALLREDUCE, STEP, sep="\n")

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
# `accounting.comms.collective_cost` tabulates every collective (bytes sent per rank for a message
# of $M$ bytes, as nccl-tests names it):

# %%
coll_rows = []
for name in comms_cost.COLLECTIVES:
    two, eight = comms_cost.collective_cost(name, 1.0, 2), comms_cost.collective_cost(name, 1.0, 8)
    coll_rows.append([name.replace("_", "-"), f"{two.sent_bytes:.3g}", f"{eight.sent_bytes:.3g}",
                      f"{eight.bus_factor:.3g}", eight.steps])
ar8, rs8, ag8 = (comms_cost.collective_cost(c, 1.0, 8) for c in ("all_reduce", "reduce_scatter",
                                                        "all_gather"))
assert ar8.sent_bytes == rs8.sent_bytes + ag8.sent_bytes and ar8.steps == rs8.steps + ag8.steps
Table(["collective", "sent per rank / M (n = 2)", "(n = 8)", "bus factor (n = 8)",
       "ring steps (n = 8)"], coll_rows)

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

# %%
seed_fit = allreduce_bench.third_party_fit()
ar_rows = allreduce_bench.third_party_rows()
for r in ar_rows:  # their "GB/s": the bus bandwidth in GiB/s, to the rounding of their times
    claimed = comms_cost.claimed_effective_gb_per_s(r["message_bytes"], r["mean_s"],
                                                    r["world_size"])
    assert abs(claimed / r["claimed_gb_per_s"] - 1) < 6e-3
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
# {glue:text}`seed_fit_err:.0f`%. The seed's one-pager quotes NVLink as "600 GB/s (bidirectional)":
# {glue:text}`nvlink3_both:.0f` GB/s is both directions together. In a ring each GPU sends to one
# neighbour while it receives from the other, each direction carrying its own traffic, so the spec
# to compare with is the per-direction {glue:text}`nvlink3_gb:.0f` GB/s.
#
# ### Two formulas of the seed, corrected
#
# The one-pager writes the ring's time as $2\frac{N-1}{N}M/\text{BW} + \alpha(N-1)$, and adds "for
# large M, time ≈ 2M/BW". With the α and β just fitted:

# %%
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

# %%
cfg = TransformerConfig.preset(PRESET)
n_params = count_params(cfg)
xl_sizes = ddp_step_seed.grad_bytes(PRESET)  # fp32 gradients, from the model on the meta device
grad_bytes = sum(xl_sizes)
assert n_params == third_party.CS336_STUDENT_DDP_PARAMS and grad_bytes == 4 * n_params
assert abs(grad_bytes / MIB - third_party.CS336_STUDENT_DDP_CLAIMED_MB) < 0.01  # "MB" = MiB
glue("q_params_b", n_params / 1e9)
glue("q_grad_gb", grad_bytes / 1e9)
glue("q_link_ms", comms_cost.collective_cost("all_reduce", grad_bytes, WORLD).bus_bytes
     / nvlink3.bytes_per_s * 1e3)
glue("xl_tensors", len(xl_sizes))
ddp_step_seed.link_table(xl_sizes, LINK_KEYS, alpha_s=seed_fit.alpha_s, world=WORLD)

# %% [markdown]
# The seed's four DDP runs of this step, a third party's measurement ({glue:text}`ddp_source`),
# beside what their own all-reduce table predicts (`ddp_step_seed.third_party_rows`): naive, flat,
# and the communication left after the backward when each 25 MiB bucket is all-reduced as soon as it
# is ready (`accounting.buckets.overlap_exposed_s`, gradients arriving at a steady rate over their
# backward):

# %%
xl_rows = ddp_step_seed.third_party_rows()
overlap_run = xl_rows[0]  # a run whose mode was not printed: overlapped
glue("ddp_source", third_party.SOURCE_CS336_STUDENT_DDP)
for name, value in ddp_step_seed.third_party_numbers(xl_rows).items():  # each checked there
    glue(name, value)
ddp_step_seed.third_party_table(xl_rows)

# %% [markdown]
# Their naive run spent {glue:text}`xl_naive_ms:.1f` ms communicating,
# {glue:text}`xl_naive_share:.1f`% of the step; the bytes and their own α-β fit predict
# {glue:text}`xl_pred_naive_ms:.1f` ms. Their "flat" run was not one: its command line passed
# `--ddp-mode naive`, its banner says "Naive Sync", and it communicated for
# {glue:text}`xl_flat_ms:.1f` ms, the naive run's time to 0.1%, where one all-reduce would have
# taken {glue:text}`xl_pred_flat_ms:.1f` ms. The two runs whose mode was not printed are overlapped
# ones: {glue:text}`xl_overlap_ms:.1f` ms left after the backward, so
# {glue:text}`xl_hidden_ms:.0f` ms were hidden. The model leaves only the last bucket's all-reduce,
# {glue:text}`xl_tail_ms:.2f` ms (the embedding's gradient, ready last); it does not know that NCCL
# runs its reductions on the same SMs as the backward, whose time grew by
# {glue:text}`xl_slower_bwd_ms:.1f` ms. The step still got {glue:text}`xl_saved_ms:.0f` ms shorter.
#
# ### How large should a bucket be?
#
# Bucketing trades two costs (`accounting.buckets.exposed_bounds_s`). The **tail**: the last
# bucket's all-reduce cannot start before the backward ends, and it is longer for a larger bucket.
# The **queue**: the all-reduces run one after another from the moment the first bucket is full, so
# they end no earlier than first-ready + their total time, and small buckets pay α many times. The
# exposed time is at least the larger of the two (equal to it for equal buckets). On the seed's
# A100s their backward of {glue:text}`xl_bwd_ms:.0f` ms hides everything but the tail. The same step
# in bf16 on two H100s (NVLink 4, a backward at the bf16 peak, the seed's α) is another matter:

# %%
ready = xl_sizes[::-1]  # the backward meets the last layers first
fast_sizes = [b // 2 for b in ready]  # bf16
bwd_fast = 2 * flops.transformer_flops(cfg, XL_BATCH, XL_SEQ).forward_matmul_flops / \
    FAST.peak_flop_per_s("bf16")
caps = [c * MIB for c in BUCKET_CAPS_MIB]
fast_model, pcie = ({"alpha_s": seed_fit.alpha_s, "bytes_per_s": hardware.LINKS[k].bytes_per_s}
                    for k in ("nvlink4", "pcie5"))
sweep = {"seed: 2 A100s, fp32, their backward": buckets.bucket_sweep(
             ready, overlap_run["backward_s"], WORLD, caps_bytes=caps, **ab),
         "2 H100s, bf16, backward at peak": buckets.bucket_sweep(
             fast_sizes, bwd_fast, WORLD, caps_bytes=caps, **fast_model)}
assert all(p.exposed_s >= max(p.tail_s, p.queue_s) * (1 - 1e-9) for s in sweep.values() for p in s)
fast_sweep = sweep["2 H100s, bf16, backward at peak"]
best_s = min(p.exposed_s for p in fast_sweep)
assert best_s < min(fast_sweep[0].exposed_s, fast_sweep[-1].exposed_s)  # neither extreme is best
valley = [p.cap_bytes / MIB for p in fast_sweep if p.exposed_s <= 1.01 * best_s]
assert 25 in valley and math.isclose(best_s, comms_cost.collective_time_s(  # the tail: the
    "all_reduce", fast_sizes[-1], WORLD, **fast_model))  # embedding's gradient
_, pcie_s = buckets.best_bucket_cap(fast_sizes, bwd_fast, WORLD, caps_bytes=caps, **pcie)
assert pcie_s > comms_cost.all_reduces_s([sum(fast_sizes)], WORLD, **pcie) - bwd_fast  # queue
fast_comm = comms_cost.all_reduces_s([sum(fast_sizes)], WORLD, **fast_model)
for name, value in {"bwd_fast_ms": bwd_fast * 1e3, "pcie_best_ms": pcie_s * 1e3,
                    "fast_comm_ms": fast_comm * 1e3,
                    "valley": " to ".join(dict.fromkeys(num(c) for c in (valley[0], valley[-1]))),
                    "best_ms": best_s * 1e3}.items():
    glue(name, value)
Table(["cap MiB", "buckets", "tail ms", "queue ms", "exposed ms (H100s, bf16)"],
      [[num(p.cap_bytes / MIB), p.buckets, num(p.tail_s * 1e3), num(p.queue_s * 1e3),
        num(p.exposed_s * 1e3)] for p in fast_sweep])

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
# ### Gradient accumulation
#
# $K$ micro-batches per optimizer step, their gradients summed in `.grad`: with the all-reduce
# skipped on all but the last (`no_sync`), the communication per optimizer step is one all-reduce
# whatever $K$ is. The seed's one-pager lists "higher memory (store accumulated grads)" as its
# price. The `.grad` buffers exist with or without accumulation; what changes is the activations,
# saved for one micro-batch at a time (`xl`, {glue:text}`acc_batch` sequences per GPU):

# %%
saved_k = {k: activations.saved_bytes(cfg, XL_BATCH // k, XL_SEQ).total_bytes
           for k in MICRO_BATCHES}
sent_k = {(k, s): comms_cost.accumulation_sent_bytes(grad_bytes, WORLD, k, sync_each_micro_batch=s)
          for k in MICRO_BATCHES for s in (False, True)}
assert len({sent_k[k, False] for k in MICRO_BATCHES}) == 1  # one all-reduce whatever K is
assert saved_k[1] > 0.99 * MICRO_BATCHES[-1] * saved_k[MICRO_BATCHES[-1]]
glue("acc_batch", XL_BATCH)
Table(["micro-batches K", "sent per optimizer step, no_sync (GB)", "syncing each (GB)",
       "gradient buffers (GB)", "saved activations (GB)"],
      [[k, num(sent_k[k, False] / 1e9), num(sent_k[k, True] / 1e9), num(grad_bytes / 1e9),
        num(saved_k[k] / 1e9)] for k in MICRO_BATCHES])

# %% [markdown]
# ### ZeRO: what each rank holds and sends
#
# Data parallelism replicates weights, gradients and optimizer state on every rank. ZeRO stage 1
# shards the optimizer state (and fp32 master weights) over the $n$ ranks, stage 2 the gradients
# too, stage 3 the weights too (`accounting.zero`). For the seed's run (fp32 AdamW, 16 bytes per
# parameter, 2 GPUs) and for the `xl` preset on {glue:text}`zero_ranks` GPUs with mixed-precision
# AdamW, per GPU, with the bf16 activations of {glue:text}`acc_batch` × {glue:text}`xl_seq` tokens
# (SDPA attention), which no stage shards:

# %%
seed_states = {s: zero_cost.zero_memory_bytes(n_params, WORLD, s, "fp32_adamw")
               for s in zero_cost.STAGES}
assert seed_states[0] - seed_states[1] == 4 * n_params  # half of AdamW's 8 B/param, per GPU
glue("q_given_back_gb", (seed_states[0] - seed_states[1]) / 1e9)
glue("seed_stage0_gb", seed_states[0] / 1e9)
glue("zero_ranks", ZERO_RANKS)
glue("xl_seq", XL_SEQ)
acts = activations.saved_bytes(cfg, XL_BATCH, XL_SEQ, dtype="bf16", attention="sdpa")
where = {s: zero_cost.zero_memory_breakdown(n_params, ZERO_RANKS, s, RECIPE)
         for s in zero_cost.STAGES}
assert math.isclose(sum(where[3].values()), 16 * n_params / ZERO_RANKS)
for s in (0, 3):
    glue(f"zero8_s{s}_gb", (sum(where[s].values()) + acts.total_bytes) / 1e9)
glue("acts_gb", acts.total_bytes / 1e9)
Table(["stage", "2 GPUs, fp32 AdamW (GB)", *(f"{ZERO_RANKS} GPUs: {k} (GB)" for k in where[0]),
       "activations (GB)", f"{ZERO_RANKS} GPUs: total (GB)"],
      [[s, num(seed_states[s] / 1e9), *(num(v / 1e9) for v in where[s].values()),
        num(acts.total_bytes / 1e9), num((sum(where[s].values()) + acts.total_bytes) / 1e9)]
       for s in zero_cost.STAGES])

# %% tags=["remove-input"]
fig, ax = plotting.subplots(width=7.0, height=3.6)
plotting.stacked_bars(ax, [f"stage {s}" for s in zero_cost.STAGES],
                      {**{k: [where[s][k] / 1e9 for s in zero_cost.STAGES] for k in where[0]},
                       "activations": [acts.total_bytes / 1e9] * len(zero_cost.STAGES)},
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

# %%
model_bytes, optimizer_bytes = 4 * n_params, 8 * n_params  # fp32 gradients and AdamW moments
right = {s: sum(zero_cost.zero_sent_bytes(n_params, ZERO_RANKS, s).values())
         for s in zero_cost.STAGES}
claim = {s: zero_cost.claimed_zero_sent_bytes(s, model_bytes, ZERO_RANKS, n_layers=cfg.n_layers,
                                              optimizer_bytes=optimizer_bytes)
         for s in zero_cost.STAGES}
assert right[1] == right[2] == right[0] and math.isclose(right[3], 1.5 * right[0])
assert claim[1] > 2 * right[0] and claim[2] < right[0] and claim[3] > 2 * right[3]
glue("claim_s1", claim[1] / right[0])
glue("claim_s2", claim[2] / right[0])
glue("claim_s3", claim[3] / right[0])
Table(["stage", "sent per GPU per step (GB)", "× data parallelism", "seed's formula (GB)",
       "seed / right"],
      [[s, num(right[s] / 1e9), f"{right[s] / right[0]:.2f}", num(claim[s] / 1e9),
        f"{claim[s] / right[s]:.2f}"] for s in zero_cost.STAGES])

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
ring_pred = comms_cost.collective_cost("all_reduce", 4 * RING_NUMEL, RING_RANKS).sent_bytes
for out in ring:
    assert out["max_abs_diff"] < 1e-5 and out["ring_sent_bytes"] == ring_pred
    assert out["ring_calls"] == {"isend": 2 * (RING_RANKS - 1), "recv": 2 * (RING_RANKS - 1)}
glue("ring_ranks", RING_RANKS)
Table(["rank", "max |ring - all_reduce|", "ring sent (MB)", "2(n-1)/n M (MB)", "calls"],
      [[r, f"{o['max_abs_diff']:.1e}", num(o["ring_sent_bytes"] / 1e6), num(ring_pred / 1e6),
        ", ".join(f"{k} × {v}" for k, v in o["ring_calls"].items())]
       for r, o in enumerate(ring)])

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
for name, text in ddp_step.verdicts(step_rows).items():
    glue(f"step_{name}", text)
glue("step_torch_target", ddp_step.torch_target(step_rows))
for key in ("world_size", "preset", "batch", "seq"):
    glue(f"step_{key.removesuffix('_size')}", ddp_step.setup(step_rows)[key])
ddp_step.table(step_rows)

# %% tags=["remove-input"]
kit.draw(ddp_step.plot, step_rows, width=8.0, height=3.8)

# %% [markdown]
# The breakdown: {glue:text}`step_breakdown`. Flat against naive: {glue:text}`step_flat`. With
# overlap: {glue:text}`step_overlap`. On a CPU the overlap is limited: gloo's reductions run on the
# same few cores as the backward.
#
# ### Buckets, PyTorch's DDP, accumulation and ZeRO, measured
#
# The same launch sweeps the bucket cap (the exposed communication measured, and modelled with this
# run's α and β), runs our bucketed DDP and `torch.nn.parallel.DistributedDataParallel`
# alternately step by step (the same 25 MiB buckets and weights), accumulates gradients over
# micro-batches, and takes a step of ZeRO stages 0–2, reading what each rank holds from its
# tensors:

# %%
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
# why: those measure the step's phases and the memory, not the link. Every record present, through
# the same functions:

# %%
gpu_ar, gpu_step = allreduce_bench.SIZES["gpu"], ddp_step.SIZES["gpu"]
glue("gpu_sizes", " to ".join(num(m / MIB) for m in (gpu_ar.message_bytes[0],
                                                       gpu_ar.message_bytes[-1])))
glue("gpu_ranks", ", ".join(str(w) for w in gpu_ar.world_sizes))
glue("gpu_preset", gpu_step.preset)
glue("gpu_world", gpu_step.world_size)
experiments.show_recorded("allreduce_bench",
                          show=lambda record: allreduce_bench.verdicts(record["results"]))
experiments.show_recorded("ddp_step", tables=[ddp_step.table, ddp_step.bucket_table,
                                              ddp_step.accumulation_table, ddp_step.zero_table],
                          show=lambda record: ddp_step.verdicts(record["results"]))

# %% [markdown]
# ```{admonition} Takeaway
# :class: tip
# A ring all-reduce sends $2\frac{n-1}{n}M$ per rank in $2(n-1)$ steps of latency α. The `xl`
# gradients' {glue:text}`xl_tensors` all-reduces on the seed's two A100s: predicted
# {glue:text}`xl_pred_naive_ms:.1f` ms from the bytes and their α-β fit, measured
# {glue:text}`xl_naive_ms:.1f` ms ({glue:text}`xl_naive_share:.1f`% of the step); bucketed, all
# but the last bucket can hide behind their backward. Sharding the optimizer state
# (ZeRO-1) gives back {glue:text}`q_given_back_gb:.1f` GB per GPU for the same traffic.
# ```
#
# ## Exercises
#
# ### Q1 [xl on 8 and 16 H100s]
#
# The `xl` preset, mixed-precision AdamW, bf16 gradients and weights on the wire. (a) What does
# each GPU hold in model states at stages 0–3 on 8 GPUs? (b) How many bytes does each GPU send per
# step at each stage? (c) How long does the stage-0 all-reduce take, bandwidth term only, in one
# DGX H100 node (8 GPUs) and across two (16)? (d) On 8 H100s, what is the largest model whose
# model states fit at each stage (activations aside)?

# %% tags=["hide-cell"]
dgx, n8 = hardware.get_cluster("dgx-h100"), ZERO_RANKS
q1_mem = {s: zero_cost.zero_memory_bytes(n_params, n8, s, RECIPE) for s in zero_cost.STAGES}
q1_sent = {s: sum(zero_cost.zero_sent_bytes(n_params, n8, s, grad_dtype="bf16",
                                    param_dtype="bf16").values()) for s in zero_cost.STAGES}
q1_t = {n: comms_cost.collective_cost("all_reduce", 2 * n_params, n).bus_bytes  # bf16 gradients
        / dgx.ring_link(n).bytes_per_s for n in (dgx.per_node, 2 * dgx.per_node)}
q1_max = {s: math.floor(FAST.hbm_bytes / zero_cost.zero_memory_bytes(1, n8, s, RECIPE))
          for s in zero_cost.STAGES}
assert q1_max[3] == memory.max_trainable_params(n8, FAST.hbm_bytes, RECIPE)  # 16 B/param / n
assert q1_t[16] > 8 * q1_t[8] and q1_sent[3] == 1.5 * q1_sent[0]
for s in zero_cost.STAGES:
    glue(f"q1_mem_{s}", q1_mem[s] / 1e9)
    glue(f"q1_sent_{s}", q1_sent[s] / 1e9)
    glue(f"q1_max_{s}", q1_max[s] / 1e9)
glue("q1_t8", q1_t[8] * 1e3)
glue("q1_t16", q1_t[16] * 1e3)
glue("q1_ib", dgx.ring_link(16).name)

# %% [markdown]
# ```{dropdown} Answer
# (a) {glue:text}`q1_mem_0:.1f`, {glue:text}`q1_mem_1:.1f`, {glue:text}`q1_mem_2:.1f` and
# {glue:text}`q1_mem_3:.1f` GB for $\Psi$ parameters: $16\Psi$, $4\Psi + 12\Psi/8$,
# $2\Psi + 14\Psi/8$ and $16\Psi/8$.
# (b) {glue:text}`q1_sent_0:.2f` GB at stages 0, 1 and 2 ({glue:text}`q1_sent_1:.2f` and
# {glue:text}`q1_sent_2:.2f`), {glue:text}`q1_sent_3:.2f` GB at stage 3. (c)
# {glue:text}`q1_t8:.1f` ms over NVLink 4; across two nodes the ring crosses the slowest link,
# {glue:text}`q1_ib`: {glue:text}`q1_t16:.0f` ms. (d) {glue:text}`q1_max_0:.1f`,
# {glue:text}`q1_max_1:.1f`, {glue:text}`q1_max_2:.1f` and {glue:text}`q1_max_3:.1f` billion
# parameters: only stage 3 grows with the number of GPUs without bound.
# ```
#
# ### Q2 [Find the error]
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
# - Accumulation with `no_sync` sends one all-reduce per optimizer step and cuts activations, not
#   gradient memory.
# - ZeRO stages 1 and 2 send what data parallelism sends and hold less; stage 3 sends 1.5×.
