"""Triton kernels, one op per module, each with its reference, cost model, launcher and tests.

- `elementwise`: `repeat_unary` (a unary op applied k times in one fused kernel),
  `eager_chain_bytes`.
- `softmax`: fused row-wise `softmax` (forward and backward), `naive_softmax`, `softmax_bytes`.
- `rmsnorm`: fused `rmsnorm` (forward; backward gives dx and dweight), `rmsnorm_bytes`.
- `flash_attention`: FlashAttention-2 forward and backward (`flash_attention`,
  `FlashAttentionTriton`), the model's "flash_triton" backend; costs from
  `mlsys.accounting.attention`; tested against `mlsys.ops.attention`.
- `row_tiles`, `flash_tiles`: the tiles the row kernels and the flash kernels may launch with
  (autotune spaces, pruning, the interpreter's fixed choice).
- They are timed by the `fused_kernels` experiment of `mlsys.experiments`
  (`python -m mlsys.experiments fused_kernels`).
- `aot`: compile any of them ahead of time for sm_80/sm_89/sm_90 with no GPU, in worker processes,
  and read registers, spills, shared memory, SASS, tensor-core instructions and occupancy.
- `compile_report`: every kernel and candidate tile compiled for sm_80 and sm_90, judged (spills,
  shared memory, tensor cores), written to `compile_report.json` (`make compile-report`);
  `tile_space`: the autotuners' view of it (the tiles it removed); `compile_tables`: the report
  read for chapters 04 and 06 (tables, the formulas of `mlsys.accounting.tiles` checked,
  "why this tile", predicted GPU times).
- `_triton`: the only place Triton is imported (it sets `TRITON_INTERPRET=1` first when there is no
  GPU), input checks and the per-dtype test tolerances.

Import the modules explicitly (`from mlsys.kernels.softmax import softmax`): this package imports
nothing, so `import mlsys.kernels` neither touches Triton nor shadows a module with its function.
Used in: §sec-bytes, §sec-attention.
"""
