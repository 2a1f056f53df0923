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
import os
import shutil
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from IPython.display import display

from mlsys import experiments, plotting
from mlsys.accounting import memory, resilience
from mlsys.book import glue, num, solved_by
from mlsys.diagrams import cluster
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
KILL_AT, KILL_EVERY = 5, 3  # rank 1 SIGKILLs itself before step index 5; a save every 3 steps
SIZES = env.pick(**cluster_train.SIZES)
WORK = Path(tempfile.mkdtemp(prefix="mlsys-ch10-"))
# Napkin math at scale (nothing measured): a 70B model, Llama 3's failures
N_70B = 70e9
STORAGE_BYTES_PER_S = 100e9  # aggregate write bandwidth, assumed
LLAMA3_GPUS, LLAMA3_FAILURES, LLAMA3_DAYS = 16_384, 419, 54  # unexpected ones
RESTART_S = 600  # assumed: rescheduling, loading the checkpoint, warming up again
DAY_S, SEED = 24 * 3600, 1  # the simulated day, and its failures' seed
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

# %% tags=["remove-cell"]
glue("ranks", RANKS)

# %%
rows = launch.run(loop.train_in_launch, RANKS, args=(FLAGS,), timeout_s=600,
                  device="cuda" if env.device() == "cuda" else "cpu")[0]

# %% tags=["remove-input"]
glue("loss_first", rows[0]["loss"])
glue("loss_last", rows[-1]["loss"])
assert rows[-1]["loss"] < rows[0]["loss"]
fig, axes = plotting.subplots(1, 2, width=10, height=3.4)
cluster_train.plot({f"{RANKS} ranks, FSDP": rows}, axes)
plt.show()

# %% [markdown]
# The loss falls from {glue:text}`loss_first:.2f` to {glue:text}`loss_last:.2f` nats per token
# (a byte-level model starts near $\ln 256 = 5.5$ plus the spread of its random logits); the first
# step is slow (allocation, the first all-gathers), then the throughput settles.
#
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
_, said = launch.run(cluster_train.train_expecting, 1, timeout_s=600,  # ... on 1 rank
                     args=(flags, cluster_train.RNG_NOT_RESTORED))[0]
weights = {name: checkpoint.latest_weights(ckpt)
           for name, ckpt in {"two": two, "one": one}.items()}
gap = max((weights["two"][k] - weights["one"][k]).abs().max().item()
          for k in weights["two"])
print(f"largest difference of any weight, 2 ranks vs 2 -> 1 rank: {gap:.1e}")

# %% tags=["remove-cell"]
glue("reshard_gap", f"{gap:.1e}")
assert len(said) == 1, said  # the loader's one expected warning, caught in the rank
glue("rng_warning", said[0].split(" was ", 1)[1])

# %% [markdown]
# The run resumed on one rank ends {glue:text}`reshard_gap` away from the run that stayed on two
# (largest difference of any weight): only the order of the floating-point sums differs (one rank
# sums its gradient in one piece, two ranks reduce-scatter halves). Loading, the rank warned that
# the checkpoint was {glue:text}`rng_warning`: each rank's random-number state belongs to a rank
# of the old world, and a world of another size has no place for it. The rank caught that warning
# on purpose (`cluster_train.train_expecting`): the book's model has no dropout, and the sampler
# draws each batch from a generator of its own, seeded by the step, so nothing depends on them.
# The sampler's position is saved too, so the resumed run sees the same batches;
# `tests/train/test_checkpoint.py` also reshards FSDP onto tensor parallelism, and refuses a
# checkpoint of another model by naming the keys and shapes that differ.
#
# ## A rank killed mid-run
#
# With `--max-restarts`, torchrun restarts the whole group when a rank dies. Here rank 1 sends
# itself SIGKILL before step {glue:text}`kill_step` (the `--kill-rank-at` flag exists for exactly
# this demonstration); the group restarts and resumes from the last complete checkpoint:

# %%
killed = WORK / "killed"
cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
       "--nproc-per-node=2", "--max-restarts=1",
       "-m", "mlsys.train", *CPU_FLAGS, "--ckpt", str(killed), "--ckpt-every", str(KILL_EVERY),
       "--kill-rank-at", f"1:{KILL_AT}"]
done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                      env={**os.environ, "OMP_NUM_THREADS": "1"})
assert done.returncode == 0, done.stderr[-2000:]
lost = next(line for line in done.stderr.splitlines() if "failed (exitcode:" in line)
logged = [r["step"] for r in loop.read_log(killed / "log.jsonl")]
print("torchrun:", lost[lost.index("failed"):].split(" of binary")[0])
print("steps logged:", logged)

# %% [markdown]
# torchrun names the first worker it saw fail: usually rank 1, killed by its signal (exit code
# −9); on a loaded machine sometimes rank 0 (exit code 1), whose collective broke when its peer
# vanished, a moment before the agent noticed the kill. Either way it stops the other worker and
# restarts the group.
#
# The log holds the steps in the order they ran, and a checkpointing run is simple enough to
# predict it. `cluster.simulate_run` plays a run forward in time: work until a save is due, save,
# and at a failure throw away everything since the last completed save, restart, resume from it.
# In units of steps (a step takes 1, a save 0), with the failure after {glue:text}`kill_at` steps
# and a save every {glue:text}`kill_every`, it runs exactly the steps the log holds; the steps after
# the last checkpoint run twice:

# %% tags=["remove-input"]
glue("kill_at", KILL_AT)
glue("kill_step", KILL_AT + 1)
glue("kill_every", KILL_EVERY)
steps = int(CPU_FLAGS[CPU_FLAGS.index("--steps") + 1])
replay = cluster.simulate_run(steps + KILL_AT % KILL_EVERY, interval_s=KILL_EVERY,
                              checkpoint_s=0, failures_s=[KILL_AT])
assert cluster.executed_steps(replay) == logged, (cluster.executed_steps(replay), logged)
cluster.draw_run({"the killed run, step by step": replay}, unit_s=1, unit="steps run",
                 label_steps=True)
plt.show()

# %% tags=["remove-cell"]
final = checkpoint.latest_weights(killed)
same = all(torch.equal(final[k], v) for k, v in weights["two"].items())
glue("restart_verdict", "bit for bit equal to" if same else "NOT equal to")

# %% [markdown]
# The killed run's final weights are **{glue:text}`restart_verdict`** those of the two-rank run
# of the previous section, which was never interrupted (the notebook launcher there, torchrun
# here: the same loop on the same mesh). The steps after the last checkpoint ran twice, from the
# same weights, optimizer state and batches. That is the contract that makes a restart safe: the
# data are a pure function of the step and the rank, and everything else comes back from the
# checkpoint.
#
# ## Measurement
#
# `cluster_train` runs the entry point under torchrun on one rank and on {glue:text}`sizes_ranks`,
# and compares the measured MFU with the planner's prediction for the same mesh. The planner
# needs a peak: on a GPU of the hardware table, its spec; on a CPU, which has none, the matmul
# ceiling the run measured and the copy bandwidth in place of the link, **labelled as such**.

# %%
live = cluster_train.run(SIZES)
display(cluster_train.table(live))

# %% tags=["remove-cell"]
glue("sizes_ranks", max(SIZES.world_sizes))
widest = max(cluster_train.runs(live), key=lambda r: r["world_size"])
glue("mfu_verdict", cluster_train.mfu_verdict(widest))
glue("scaling_verdict", cluster_train.scaling_verdict(live))

# %% [markdown]
# {glue:text}`mfu_verdict` {glue:text}`scaling_verdict`
#
# ### Recorded GPU results
#
# A record of `python -m mlsys.experiments cluster_train` holds a 1-GPU run and an 8-GPU run of
# the `xl` preset in bf16 (the 8-GPU one where the machine has 8 GPUs; a skipped row says so).
# {glue:text}`cluster_record`

# %% tags=["remove-input"]
cluster_record = glue("cluster_record", experiments.show_records(("cluster_train",)))

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
# run, against {glue:text}`hourly_pct:.1f`% when saving once an hour:

# %%
ckpt_s = resilience.checkpoint_seconds(N_70B, "bf16_mixed_adamw", STORAGE_BYTES_PER_S)
rate = LLAMA3_FAILURES / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)
mtbf = resilience.job_mtbf_s(LLAMA3_GPUS, rate)
young = resilience.young_interval_s(ckpt_s, mtbf)
assert resilience.lost_fraction(young, ckpt_s, mtbf) < resilience.lost_fraction(3600, ckpt_s, mtbf)

# %% tags=["remove-input"]
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
cluster.draw_interval_tradeoff(ckpt_s, mtbf, seed=SEED)
plt.show()

# %% [markdown]
# The dots are the same model played forward over hundreds of random failures
# (`cluster.simulate_run`): the first-order formula holds where both costs are small. One day of
# that job, with the failures drawn at random at its rate, saving once an hour and at Young's
# interval, and a restart taking {glue:text}`restart_min:.0f` minutes (assumed) after each
# failure:

# %% tags=["remove-input"]
glue("restart_min", RESTART_S / 60)
fails = cluster.failure_times(mtbf, DAY_S, seed=SEED)
day = {f"every {num(t / 60)} min{name}": cluster.simulate_run(
    DAY_S, interval_s=t, checkpoint_s=ckpt_s, failures_s=fails, restart_s=RESTART_S)
    for name, t in (("", 3600.0), (" (Young)", young))}
hourly, best = day.values()
glue("day_hourly_pct", 100 * hourly.share("lost"))
glue("day_young_pct", 100 * best.share("lost"))
glue("day_restart_pct", 100 * best.share("restart"))
cluster.draw_run(day, title=f"{len(fails)} failures in a day of {LLAMA3_GPUS:,} GPUs")
plt.show()

# %% [markdown]
# On that day, saving hourly redid {glue:text}`day_hourly_pct:.1f`% of the time's work and saving
# at Young's interval {glue:text}`day_young_pct:.1f`%; the restarts cost
# {glue:text}`day_restart_pct:.1f`% under either policy, which no interval can shorten: only faster
# restarts (checkpoints kept in the memory of other nodes, spare nodes waiting) can.
#
# **Stragglers.** A synchronous step ends when its slowest rank does. If each rank's compute
# varies by {glue:text}`spread_pct:.0f`% around {glue:text}`step_s:.0f` s, a step on 8 ranks takes
# {glue:text}`strag_8:.2f` s on average and on {glue:text}`llama_gpus` ranks
# {glue:text}`strag_big:.2f` s: the expected maximum of $n$ draws grows like $\sqrt{2\ln n}$, so a
# large job pays for its worst GPU on every step:

# %% tags=["remove-input"]
glue("spread_pct", 100 * STEP_SPREAD)
glue("step_s", STEP_S)
glue("strag_8", resilience.straggler_step_s(STEP_S, STEP_SPREAD * STEP_S, 8))
glue("strag_big", resilience.straggler_step_s(STEP_S, STEP_SPREAD * STEP_S, LLAMA3_GPUS))
ranks = [2**k for k in range(15)] + [LLAMA3_GPUS]
fig, ax = plotting.subplots(width=6.4, height=3.2)
ax.plot(ranks, [resilience.straggler_step_s(STEP_S, STEP_SPREAD * STEP_S, n) for n in ranks],
        "o-", label="expected step: the slowest rank's")
ax.axhline(STEP_S, color=plotting.COLORS["muted"], ls=":", label="each rank's mean")
plotting.finish(ax, xlabel="ranks", ylabel="expected step (s)", logx=2,
                title=f"the slowest of n ranks, each {STEP_S:.0f} s ± {100 * STEP_SPREAD:.0f}%")
plt.show()

# %% [markdown]
# One slow GPU (a throttled clock, a bad link) is worse still: every rank waits for it. **NCCL
# timeouts** are the same problem at its extreme: a rank that never arrives leaves the others
# blocked in a collective until its timeout (10 minutes by default for NCCL); a short timeout
# turns a hang into a restart, and a long one wastes thousands of GPU-minutes per incident.
#
# ```{admonition} Takeaway
# :class: tip
# One entry point runs on a laptop, a GPU, a node and many nodes because torchrun, the DeviceMesh,
# FSDP2, DTensor, pipelining and DCP do the distributing; every mesh trains like one process. A
# checkpoint is a directory per step committed by its `.metadata`, reloadable under any mesh, and a
# restarted run is bit for bit the run that never failed. At scale, save every $\sqrt{2\delta M}$:
# {glue:text}`young_min:.1f` minutes and {glue:text}`lost_pct:.1f`% lost for a 70B model on
# {glue:text}`llama_gpus` GPUs.
# ```
#
# ## Exercises
#
# ### Q1 (multi-step) How often to save a 405B model
#
# A 405B model on 16,384 GPUs, mixed-precision AdamW, the same failure rate, storage at 1 TB/s.
# (a) How many bytes does a checkpoint hold, and how long is a save? (b) What is the job's mean
# time between failures? (c) With (a) and (b), what is Young's interval? (d) What share of the run
# is lost at it, and what when saving once an hour?

# %% tags=["hide-cell"]
q1_bytes = 405e9 * resilience.checkpoint_bytes_per_param("bf16_mixed_adamw")
q1_s = resilience.checkpoint_seconds(405e9, "bf16_mixed_adamw", 1e12)
q1_mtbf = resilience.job_mtbf_s(16_384, rate)
q1_tau = resilience.young_interval_s(q1_s, q1_mtbf)
q1_pct = 100 * resilience.lost_fraction(q1_tau, q1_s, q1_mtbf)
q1_hourly = 100 * resilience.lost_fraction(3600, q1_s, q1_mtbf)
assert q1_s == q1_bytes / 1e12 and abs(q1_tau - (2 * q1_s * q1_mtbf) ** 0.5) < 1e-9
assert q1_pct < q1_hourly
for name, value in {"q1_tb": q1_bytes / 1e12, "q1_s": q1_s, "q1_mtbf_h": q1_mtbf / 3600,
                    "q1_min": q1_tau / 60, "q1_save_pct": 100 * q1_s / q1_tau,
                    "q1_redo_pct": 100 * q1_tau / (2 * q1_mtbf), "q1_pct": q1_pct,
                    "q1_hourly": q1_hourly}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# (a) 12 bytes per parameter (fp32 master weights and two moments): {glue:text}`q1_tb:.2f` TB,
# written in {glue:text}`q1_s:.2f` s at 1 TB/s.
# (b) $M = 1/(n r)$ = {glue:text}`q1_mtbf_h:.2f` hours (the job is the same size, so the same as
# the 70B job's).
# (c) $\tau = \sqrt{2\delta M}$ = {glue:text}`q1_min:.1f` minutes.
# (d) $\delta/\tau + \tau/(2M)$ = {glue:text}`q1_save_pct:.2f`% + {glue:text}`q1_redo_pct:.2f`% =
# {glue:text}`q1_pct:.1f`% of the run (at the optimum the two terms are equal); saving hourly
# loses {glue:text}`q1_hourly:.1f`%.
# ```
#
# ### Q2 (code) Write the resume check
#
# Write `differing(a, b)`: the names of the tensors that differ between two state dicts with the
# same keys (in values, shape or dtype), in the order of `a`. Apply it to the final weights of the
# killed run and of the two-rank run that was never interrupted (`checkpoint.latest_weights`
# reads a run's final weights). What should the list hold, and why?

# %%
def differing(a, b):  # <- your code here
    """Names of the tensors of `a` that differ from those of `b` (values, shape or dtype)."""
    raise NotImplementedError("write the resume check")


# %% tags=["hide-cell"]
# The book's solution (opened on demand). `solved_by` checks the reader's function once it is
# written, and the book's while it is not.
def differing_solution(a, b):
    return [name for name, tensor in a.items()
            if tensor.dtype != b[name].dtype or not torch.equal(tensor, b[name])]


runs = {name: checkpoint.latest_weights(WORK / name) for name in ("killed", "two_ranks")}
q2, whose = solved_by(differing, differing_solution, runs["killed"], runs["two_ranks"])
assert q2 == [], q2  # the restarted run is the uninterrupted run, bit for bit
name = next(iter(runs["killed"]))  # and the check does find a difference when there is one:
tensor = runs["two_ranks"][name]
nudged = {**runs["two_ranks"], name: torch.nextafter(tensor, tensor + 1)}  # the last bit
assert solved_by(differing, differing_solution, runs["killed"], nudged)[0] == [name]
print(f"checked: {whose} resume check finds {len(q2)} of {len(runs['killed'])} tensors differ")

# %% [markdown]
# ```{dropdown} Answer
# An empty list: the restarted run repeats the steps after its last checkpoint from the same
# weights, optimizer state and batches, so every tensor is bit for bit equal. `torch.equal` (not
# `allclose`) is the test: any difference, even in the last bit, means the resume did not restore
# something (a sampler position, a learning-rate step, an RNG state the model draws from). The
# hidden cell also checks that the function finds a tensor changed in its last bit.
# ```
#
# ### Q3 (find the error) A checkpoint of 16 bytes per parameter
#
# "Mixed-precision AdamW holds 16 bytes per parameter, so a 70B checkpoint is 1.12 TB and takes
# 11.2 s at 100 GB/s." What is wrong, and what are the right size, save time and Young's
# interval?

# %% tags=["hide-cell"]
recipe = memory.recipe("bf16_mixed_adamw")
claimed = N_70B * recipe.bytes_per_param  # every model state, as the claim counts
right = N_70B * resilience.checkpoint_bytes_per_param("bf16_mixed_adamw")
assert recipe.bytes_per_param == 16 and right == 0.75 * claimed
assert right == N_70B * (recipe.master_bytes + recipe.optimizer_bytes)  # no grads, no bf16 copy
for name, value in {"q3_claim_tb": claimed / 1e12, "q3_tb": right / 1e12,
                    "q3_claim_s": claimed / STORAGE_BYTES_PER_S,
                    "q3_s": right / STORAGE_BYTES_PER_S,
                    "q3_claim_min": resilience.young_interval_s(claimed / STORAGE_BYTES_PER_S,
                                                                mtbf) / 60,
                    "q3_min": young / 60}.items():
    glue(name, value)

# %% [markdown]
# ```{dropdown} Answer
# 16 bytes per parameter are the model states *in memory* (bf16 weights 2, bf16 gradients 2, fp32
# master 4, two fp32 moments 8). A checkpoint needs only what training cannot rebuild: the
# gradients are recomputed by the next step, and the bf16 weights are the master's rounding, so
# 4 + 8 = 12 bytes (`resilience.checkpoint_bytes_per_param`): {glue:text}`q3_tb:.2f` TB, not
# {glue:text}`q3_claim_tb:.2f`; {glue:text}`q3_s:.1f` s per save, not
# {glue:text}`q3_claim_s:.1f`; and Young's interval {glue:text}`q3_min:.1f` minutes rather than
# {glue:text}`q3_claim_min:.1f` (it scales with $\sqrt{\delta}$).
# ```
#
# ### Q4 One directory for every save
#
# "Saving a checkpoint into the same directory every time keeps the disk tidy." What happens when a
# rank dies during the save?
#
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
#   bit for bit, and the steps it runs are the ones a simulation of the run predicts.
# - Checkpoint every $\sqrt{2\delta M}$; at scale, stragglers and timeouts cost every step.

# %% tags=["remove-cell"]
shutil.rmtree(WORK, ignore_errors=True)
