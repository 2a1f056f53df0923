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
# (sec-cluster)=
# # From a notebook to a cluster
#
# **Question.** Chapters 08 and 09 trained on ranks that a notebook started on one machine. What
# does it take to run the same training on 8 GPUs, or on 64 nodes, where a rank *will* die during
# the run: how are the ranks started, how is the state saved so that a lost rank costs minutes and
# not the run, and how often should it be saved?

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

# %% tags=["hide-input"]
from mlsys import env

print(env.describe())

# %% tags=["hide-input"]
import os
import shutil
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from IPython.display import display

from mlsys import experiments, plotting
from mlsys.accounting import resilience
from mlsys.book import glue
from mlsys.distributed import launch
from mlsys.experiments import cluster_train
from mlsys.train import checkpoint, loop

# %% tags=["parameters"]
GPUS = max(1, torch.cuda.device_count())
RANKS = env.pick(smoke=2, cpu=2, gpu=min(8, GPUS))
FLAGS = [
    "--preset", env.pick(smoke="debug", cpu="laptop", gpu="small"),
    "--steps", env.pick(smoke="8", cpu="40", gpu="200"),
    "--global-batch", "8",
    "--seq-len", env.pick(smoke="32", cpu="128", gpu="1024"),
    "--precision", env.pick(smoke="fp32_adamw", cpu="fp32_adamw",
                            gpu="bf16_mixed_adamw"),
    "--quiet",
]
# Checkpoints and restarts are shown on CPU ranks (gloo) on any machine
CPU_FLAGS = ["--preset", "debug", "--steps", "8", "--global-batch", "8",
             "--seq-len", "32", "--device", "cpu", "--quiet"]
KILL_AT = 5  # the step at which rank 1 SIGKILLs itself (first attempt)
SIZES = env.pick(**cluster_train.SIZES)
WORK = Path(tempfile.mkdtemp(prefix="mlsys-ch10-"))
# Napkin math at scale (nothing measured): a 70B model, Llama 3's failures
N_70B = 70e9
STORAGE_BYTES_PER_S = 100e9  # aggregate write bandwidth, assumed
LLAMA3_GPUS, LLAMA3_FAILURES, LLAMA3_DAYS = 16_384, 419, 54  # unexpected ones
STEP_S, STEP_SPREAD = 10.0, 0.02  # a 10 s step; compute varies 2% by rank

# %% [markdown]
# The strategies of chapter 09 were built by hand so that every byte they move could be counted.
# Production training runs on PyTorch's own engine: **torchrun** (`torch.distributed.elastic`)
# starts one process per GPU on every node and restarts them when one dies; a **DeviceMesh**
# names the parallel axes; **FSDP2** (`fully_shard`), **DTensor** tensor parallelism and
# **`torch.distributed.pipelining`** spread the model; **DCP** (`torch.distributed.checkpoint`)
# saves each rank's shards in parallel and loads them under any other mesh. The book's entry point
# `python -m mlsys.train` composes exactly these, in torchtitan's order {cite}`liang2024torchtitan`
# (pipeline stage, then TP, then FSDP), around the book's model and the chapter-07 precision
# recipes. Every mesh it accepts trains like one process: `tests/train/test_main.py` compares the
# loss, the global gradient norm and the final weights of FSDP, HSDP, TP, TP with sequence
# parallelism, PP and a 2 × 2 mesh on two "nodes" with a single process, to a relative 1e-4.
#
# ## The same run in a notebook cell
#
# The entry point's loop is a function, so the notebook launcher of chapter 08 can run it on
# {glue:text}`ranks` ranks with the same flags the command line takes. (That launcher is the
# book's own: one start serves many calls, and every failing rank's traceback comes back,
# earliest first; `mlsys.distributed.launch_compare` measures it against torch's
# `elastic_launch` on your machine.)

# %%
glue("ranks", RANKS)
rows = launch.run(loop.train_in_launch, RANKS, args=(FLAGS,), timeout_s=600,
                  device="cuda" if env.device() == "cuda" else "cpu")[0]
fig, axes = plotting.subplots(1, 2, width=10, height=3.4)
cluster_train.plot({f"{RANKS} ranks, FSDP": rows}, axes)
plt.show()

# %% [markdown]
# The loss falls from {glue:text}`loss_first:.2f` to {glue:text}`loss_last:.2f` nats per token
# (a byte-level model starts near $\ln 256 = 5.5$ plus the spread of its random logits); the first
# step is slow (allocation, the first all-gathers), then the throughput settles.

# %% tags=["remove-cell"]
glue("loss_first", rows[0]["loss"])
glue("loss_last", rows[-1]["loss"])
assert rows[-1]["loss"] < rows[0]["loss"]

# %% [markdown]
# ## From one GPU to many nodes
#
# The same flags go to torchrun, which sets `RANK`, `WORLD_SIZE`, `LOCAL_RANK` and the rendezvous
# address in each process's environment:
#
# ```bash
# # one GPU (or a laptop: gloo on the CPU)
# torchrun --standalone --nproc-per-node=1 -m mlsys.train --preset small \
#     --precision bf16_mixed_adamw
# # one node of 8 GPUs: FSDP over all 8 unless --mesh says otherwise
# torchrun --standalone --nproc-per-node=8 -m mlsys.train --preset xl --mesh dp_shard=8
# # N nodes: one torchrun per node, all pointing at the same rendezvous host
# torchrun --nnodes=4 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=$HEAD:29500 \
#     --max-restarts=3 -m mlsys.train --preset 2.7B --mesh auto --ckpt /checkpoints/run1
# ```
#
# `--mesh auto` asks the planner of chapter 09 for its first choice at this world size, batch and
# length, and prints why it chose it. On a SLURM cluster, `srun` starts one torchrun per node:
#
# ```{literalinclude} ../examples/train.sbatch
# :language: bash
# ```
#
# Three things differ from a notebook. Ranks never meet before the rendezvous, so every flag is
# checked on every rank *before* the process group forms, and a bad one is one clear error instead
# of 63 ranks waiting for the 64th. A rank that raises hands its traceback to torchrun (`@record`),
# which names the first failure. And a collective that waits longer than its timeout fails instead
# of hanging: that is how a dead peer becomes a restart.
#
# ## Checkpoints: sharded, atomic, resharded
#
# Each rank writes its own shards (no gather to rank 0) into a directory per step; DCP writes the
# `.metadata` file last, after every rank has finished, so a directory without it is a save that a
# crash interrupted and is never loaded. Here two ranks save every 4 steps; one rank then resumes
# from step 4, under a different mesh, and finishes the run:

# %%
two, one = WORK / "two_ranks", WORK / "one_rank"
flags = [*CPU_FLAGS, "--ckpt", str(two), "--ckpt-every", "4"]
launch.run(loop.train_in_launch, 2, args=(flags,), timeout_s=600)
step4 = two / "step_00000004"
for path in sorted(step4.iterdir()):
    print(f"{path.name:<16} {path.stat().st_size:>10,} B")
shutil.copytree(step4, one / step4.name)  # resume from step 4 ...
flags = [*CPU_FLAGS, "--ckpt", str(one)]
launch.run(loop.train_in_launch, 1, args=(flags,), timeout_s=600)  # ... on 1 rank
weights = {name: checkpoint.latest_weights(ckpt)
           for name, ckpt in {"two": two, "one": one}.items()}
gap = max((weights["two"][k] - weights["one"][k]).abs().max().item()
          for k in weights["two"])
glue("reshard_gap", f"{gap:.1e}")
print(f"largest difference of any weight, 2 ranks vs 2 -> 1 rank: {gap:.1e}")

# %% [markdown]
# The run resumed on one rank ends {glue:text}`reshard_gap` away from the run that stayed on two
# (largest difference of any weight):
# only the order of the floating-point sums differs (one rank sums its gradient in one piece, two
# ranks reduce-scatter halves). The sampler's position is saved too, so the resumed run sees the
# same batches; `tests/train/test_checkpoint.py` also reshards FSDP onto tensor parallelism, and
# refuses a checkpoint of another model by naming the keys and shapes that differ.
#
# ## A rank killed mid-run
#
# With `--max-restarts`, torchrun restarts the whole group when a rank dies. Here rank 1 sends
# itself SIGKILL at step {glue:text}`kill_at` (the `--kill-rank-at` flag exists for exactly this
# demonstration); the group restarts and resumes from the last complete checkpoint:

# %%
glue("kill_at", KILL_AT)


killed = WORK / "killed"
cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
       "--nproc-per-node=2", "--max-restarts=1",
       "-m", "mlsys.train", *CPU_FLAGS, "--ckpt", str(killed), "--ckpt-every", "3",
       "--kill-rank-at", f"1:{KILL_AT}"]
done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                      env={**os.environ, "OMP_NUM_THREADS": "1"})
assert done.returncode == 0, done.stderr[-2000:]
final = checkpoint.latest_weights(killed)
same = all(torch.equal(final[k], v) for k, v in weights["two"].items())
glue("restart_verdict", "bit for bit equal to" if same else "NOT equal to")
lost = next(line for line in done.stderr.splitlines() if "exitcode: -9" in line)
print("torchrun:", lost[lost.index("failed"):].split(" of binary")[0])
print("steps logged:", [r["step"] for r in loop.read_log(killed / "log.jsonl")])

# %% [markdown]
# The killed run's final weights are **{glue:text}`restart_verdict`** those of the two-rank run
# of the previous section, which was never interrupted (the notebook launcher there, torchrun
# here: the same loop on the same mesh). The steps after the last checkpoint ran twice, from the
# same weights,
# optimizer state and batches. That is the contract that makes a restart safe: the data are a
# pure function of the step and the rank, and everything else comes back from the checkpoint.

# %% [markdown]
# ## Measurement
#
# `cluster_train` runs the entry point under torchrun on one rank and on {glue:text}`sizes_ranks`,
# and compares the measured MFU with the planner's prediction for the same mesh. The planner
# needs a peak: on a GPU of the hardware table, its spec; on a CPU, which has none, the matmul
# ceiling the run measured and the copy bandwidth in place of the link, **labelled as such**.

# %%
glue("sizes_ranks", max(SIZES.world_sizes))
live = cluster_train.run(SIZES)
widest = max(cluster_train.runs(live), key=lambda r: r["world_size"])
glue("mfu_verdict", cluster_train.mfu_verdict(widest))
glue("scaling_verdict", cluster_train.scaling_verdict(live))
display(cluster_train.table(live))

# %% [markdown]
# {glue:text}`mfu_verdict` {glue:text}`scaling_verdict`

# %% [markdown]
# ### Recorded GPU results
#
# A record of `python -m mlsys.experiments cluster_train` holds a 1-GPU run and an 8-GPU run of
# the `xl` preset in bf16 (the 8-GPU one where the machine has 8 GPUs; a skipped row says so):

# %% tags=["hide-input"]
experiments.show_recorded("cluster_train")

# %% [markdown]
# ## What changes at scale
#
# **Writing the state.** A checkpoint holds what training cannot rebuild: the fp32 master weights
# and Adam's two moments, 12 bytes per parameter under mixed precision (the bf16 weights are the
# master's rounding, the gradients are recomputed). For a 70B model that is
# {glue:text}`ckpt_tb:.2f` TB; at an aggregate {glue:text}`storage_gbs:.0f` GB/s it takes
# {glue:text}`ckpt_s:.1f` s to write, with every rank writing its own shard in parallel.
#
# **How often.** Llama 3's pre-training saw {glue:text}`llama_failures` unexpected interruptions
# in {glue:text}`llama_days` days on up to {glue:text}`llama_gpus` GPUs
# {cite}`dubey2024llama3`: {glue:text}`rate_per_gpu_hour` failures per GPU-hour, a failure every
# {glue:text}`mtbf_h:.1f` hours for the whole job. Checkpointing every $\tau$ seconds costs
# $\delta/\tau$ of the time for the saves and, on average, $\tau/(2M)$ for the work redone after a
# failure; their sum is smallest at Young's $\tau = \sqrt{2\delta M}$ {cite}`young1974checkpoint`,
# {glue:text}`young_min:.1f` minutes here (Daly's higher-order estimate
# {cite}`daly2006checkpoint`: {glue:text}`daly_min:.1f`), losing {glue:text}`lost_pct:.1f`% of the
# run, against {glue:text}`hourly_pct:.1f`% when saving once an hour.

# %%
ckpt_s = resilience.checkpoint_seconds(N_70B, "bf16_mixed_adamw", STORAGE_BYTES_PER_S)
rate = LLAMA3_FAILURES / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)
mtbf = resilience.job_mtbf_s(LLAMA3_GPUS, rate)
young = resilience.young_interval_s(ckpt_s, mtbf)
for name, value in {
        "ckpt_tb": N_70B * resilience.checkpoint_bytes_per_param("bf16_mixed_adamw") / 1e12,
        "storage_gbs": STORAGE_BYTES_PER_S / 1e9, "ckpt_s": ckpt_s,
        "llama_failures": LLAMA3_FAILURES, "llama_days": LLAMA3_DAYS,
        "llama_gpus": f"{LLAMA3_GPUS:,}", "rate_per_gpu_hour": f"{rate:.1e}",
        "mtbf_h": mtbf / 3600, "young_min": young / 60,
        "daly_min": resilience.daly_interval_s(ckpt_s, mtbf) / 60,
        "lost_pct": 100 * resilience.lost_fraction(young, ckpt_s, mtbf),
        "hourly_pct": 100 * resilience.lost_fraction(3600, ckpt_s, mtbf)}.items():
    glue(name, value)
assert resilience.lost_fraction(young, ckpt_s, mtbf) < resilience.lost_fraction(3600, ckpt_s, mtbf)

# %% [markdown]
# **Stragglers.** A synchronous step ends when its slowest rank does. If each rank's compute
# varies by {glue:text}`spread_pct:.0f`% around {glue:text}`step_s:.0f` s, a step on 8 ranks takes
# {glue:text}`strag_8:.2f` s on average and on {glue:text}`llama_gpus` ranks
# {glue:text}`strag_big:.2f` s: the expected maximum of $n$ draws grows like $\sqrt{2\ln n}$, so a
# large job pays for its worst GPU on every step. One slow GPU (a throttled clock, a bad link) is
# worse still: every rank waits for it. **NCCL timeouts** are the same problem at its extreme: a
# rank that never arrives leaves the others blocked in a collective until its timeout (10 minutes
# by default for NCCL); a short timeout turns a hang into a restart, and a long one wastes
# thousands of GPU-minutes per incident.

# %% tags=["remove-cell"]
glue("spread_pct", 100 * STEP_SPREAD)
glue("step_s", STEP_S)
glue("strag_8", resilience.straggler_step_s(STEP_S, STEP_SPREAD * STEP_S, 8))
glue("strag_big", resilience.straggler_step_s(STEP_S, STEP_SPREAD * STEP_S, LLAMA3_GPUS))

# %% [markdown]
# ```{admonition} Takeaway
# :class: tip
# One entry point runs on a laptop, a GPU, a node and many nodes because torchrun, the DeviceMesh,
# FSDP2, DTensor, pipelining and DCP do the distributing; every mesh trains like one process. A
# checkpoint is a directory per step committed by its `.metadata`, reloadable under any mesh, and a
# restarted run is bit for bit the run that never failed. At scale, save every $\sqrt{2\delta M}$.
# ```
#
# ## Exercises
#
# ### Q1 [Checkpoint interval]
#
# A 405B model on 16,384 GPUs, the same failure rate, storage at 1 TB/s. How long is a save, what
# is Young's interval, and what share of the run is lost at it?

# %% tags=["hide-cell"]
q1_s = resilience.checkpoint_seconds(405e9, "bf16_mixed_adamw", 1e12)
q1_tau = resilience.young_interval_s(q1_s, mtbf)
glue("q1_s", q1_s)
glue("q1_min", q1_tau / 60)
glue("q1_pct", 100 * resilience.lost_fraction(q1_tau, q1_s, mtbf))

# %% [markdown]
# ```{dropdown} Answer
# {glue:text}`q1_s:.1f` s per save; $\tau$ = {glue:text}`q1_min:.1f` minutes; about
# {glue:text}`q1_pct:.1f`% of the run is lost to saving and redoing work.
# ```
#
# ### Q2 [Write the resume check]
#
# List the names of the tensors that differ between the final weights of `WORK / "killed"` and
# `WORK / "two_ranks"` (`checkpoint.latest_weights` reads a run's final weights). What should the
# list hold, and why?

# %% tags=["hide-cell"]
a, b = (checkpoint.latest_weights(WORK / name) for name in ("killed", "two_ranks"))
print([name for name, tensor in a.items() if not torch.equal(tensor, b[name])])

# %% [markdown]
# ```{dropdown} Answer
# An empty list: the restarted run repeats the steps after its last checkpoint from the same state
# and the same batches, so every tensor is bit for bit equal.
# ```
#
# ### Q3 [Find the error]
#
# "Saving a checkpoint into the same directory every time keeps the disk tidy." What happens when a
# rank dies during the save?

# %% [markdown]
# ```{dropdown} Answer
# The data files are rewritten in place while the old `.metadata` stays: a crash mid-save leaves a
# directory that claims to be complete and holds truncated shards, and the only good checkpoint is
# gone. One directory per step, `.metadata` written last, and the previous step kept until the
# next is complete.
# ```
#
# ## Summary
#
# - `torchrun -m mlsys.train` runs the book's model on torch's engine from one CPU to many nodes;
#   flags are checked before the process group forms.
# - DCP saves shards in parallel, commits with `.metadata`, and reloads under another mesh.
# - A killed rank costs the steps since the last checkpoint: torchrun restarts, the run resumes
#   bit for bit.
# - Checkpoint every $\sqrt{2\delta M}$; at scale, stragglers and timeouts cost every step.

# %% tags=["remove-cell"]
shutil.rmtree(WORK, ignore_errors=True)
