"""One training entry point for a laptop, one GPU, one node or many: `python -m mlsys.train`.

    torchrun --standalone --nproc-per-node=2 -m mlsys.train --preset debug --steps 20
    torchrun --nnodes=4 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 --nproc-per-node=8 \
        -m mlsys.train --preset 2.7B --mesh auto --precision bf16_mixed_adamw --ckpt /ckpt

It runs on PyTorch's own engine: torchrun and torch.distributed.elastic start and restart the
ranks, a DeviceMesh holds the parallel axes, FSDP2 (`fully_shard`), DTensor tensor parallelism
and `torch.distributed.pipelining` spread the model, and torch.distributed.checkpoint (DCP) saves
and reshards its state. The hand-written strategies of `mlsys.distributed` teach what these do.

- `data`: a byte-level corpus every machine has (the Python standard library's source) in a
  memory-mapped token file, a user's own token file, and a deterministic sampler sharded by
  data-parallel rank whose position is saved with the checkpoint.
- `checkpoint`: DCP checkpoints, saved sharded, loaded under any mesh, exported to one file;
  `checkpoint_layout`: one directory per step with `.metadata` as the commit marker, the latest
  complete step, and the refusal of another model config's checkpoint.
- `options`: the run's flags and every check made before any process-group work.
- `parallelize`: the DeviceMesh and the order in which torch's strategies are applied.
- `loop`: AdamW, warm-up and cosine schedule, clipping on the global norm, accumulation,
  per-step logging (loss, tokens/s, MFU, peak memory) to the console and a JSON-lines file.
Used in: chapter 10 (§sec-cluster).
"""
