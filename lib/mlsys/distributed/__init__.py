"""Distributed training on one machine: launching ranks, collectives, data parallelism and ZeRO.

- `launch`: start N ranks (gloo on the CPU, NCCL on GPUs), run a function on each, get the values
  back; free ports, timeouts, tracebacks of failing ranks, no orphan processes (not even when
  the launching process is killed). Its parts: `launch_job` (the launching process's side),
  `launch_rank` (what each rank runs), `launch_lifeline` (ranks die with their launcher).
- `launch_compare`: the start time of a small job under `launch` and under PyTorch's own
  launchers (`elastic_launch`, `torch.multiprocessing`), re-measured.
- `comms`: a ring all-reduce written from sends and receives, and `count_bytes`, which wraps the
  `torch.distributed` calls and counts what each rank sends and receives (`accounting.comms`).
- `ddp`: data parallelism as wrappers of an unmodified module: naive (one all-reduce per
  parameter), flat (one for all), overlapped (per parameter, from backward hooks) and bucketed.
- `zero`: ZeRO stages 1 and 2, `ShardedOptimizer`, and what each rank holds.
- `fsdp`, `tp`, `pp`, `cp`: FSDP (ZeRO-3) per block, Megatron tensor (and sequence) parallelism,
  GPipe and 1F1B pipelines, ring attention; each an `apply_*` on the unmodified book model. FSDP
  cuts any module into units by a wrap policy (`fsdp_units`) and takes its dtypes from a
  chapter-07 precision policy (`fsdp_precision`).
- `torch_strategies`: PyTorch's own (FSDP2, DTensor, torch.distributed.pipelining) on the same
  units, blocks and stages, to compare, where they run on the CPU.
- `mesh`: process groups for every mesh axis, and `parallelize`, which composes them in one order
  (PP, TP, CP, FSDP).
- `groups`: the argument checks every strategy shares: an explicit, initialized process group,
  and a module with its blocks in `.blocks`.
- `harness`, `check`: a tiny model, its data, one process's training and the loop every rank
  runs (the tests use the same), and the live check of a parallel run against one process.

The cost models (bytes per collective, the alpha-beta time, ZeRO's memory and traffic per stage)
are torch-free, in `mlsys.accounting.comms`, `mlsys.accounting.zero` and
`mlsys.accounting.parallel`. Process groups are always passed explicitly (`Rank.group` from the
launcher, or a `mesh.Mesh`). Used in: §sec-data-parallel (chapter 08), chapter 09.
"""
