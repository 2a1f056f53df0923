"""The FlashAttention-2 kernels' tiles (`mlsys.kernels.flash_tiles`): the shared memory of a
tile, the configs of each kernel, and their pruning by shared memory and by the compile report."""

import pytest
import torch

from mlsys.kernels import flash_attention as FA
from mlsys.kernels import flash_tiles, tile_space
from mlsys.kernels._triton import HAS_TRITON, INTERPRETED
from mlsys.kernels.flash_tiles import keep_tiles, tile_configs, tile_smem_bytes


@pytest.mark.skipif(not HAS_TRITON, reason="triton.Config needs Triton")
def test_tile_pruning_by_shared_memory_and_the_compile_report(monkeypatch):
    # forward, d = 128, fp16, 3 stages on sm_90: Q tile held, K and V streamed 3 deep
    assert tile_smem_bytes("fwd", 128, 64, 128, 2, 3) == (128 + 3 * 2 * 64) * 128 * 2
    # sm_80 keeps one copy fewer of each streamed tile (mlsys.accounting.tiles)
    assert tile_smem_bytes("fwd", 128, 64, 128, 2, 3, "sm_80") == (128 + 2 * 2 * 64) * 128 * 2
    # dK/dV also streams L and D, one fp32 per query row, (stages - 1) deep
    assert tile_smem_bytes("dkdv", 64, 128, 64, 2, 2) == (
        (2 * 128 + 2 * 2 * 64) * 64 * 2 + 1 * 2 * 64 * 4)
    for kernel in ("fwd", "dkdv", "dq"):
        configs = tile_configs(kernel)
        assert len(configs) == 16 and len(tile_configs(kernel, "fp32")) == 10
        every = keep_tiles(configs, kernel, 64, "bf16", "sm_90", 10**9)
        report = tile_space.removed(f"flash_attention.{kernel}", "bf16", "sm_90", head_dim=64)
        assert len(every) == len(configs) - len(report)
        h100 = keep_tiles(configs, kernel, 128, "bf16", "sm_90", 100_000)  # half an H100
        assert 0 < len(h100) < len(configs)
        assert all(tile_smem_bytes(kernel, c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], 128, 2,
                                   c.num_stages) <= 100_000 for c in h100)
        tiny = keep_tiles(configs, kernel, 128, "bf16", "sm_90", 1024)  # none fits: smallest
        assert len(tiny) == 1 and tiny[0].num_stages == 2
    # another dtype's space is never timed: fp32's 16 x 32 tile is not a bf16 tile
    with pytest.raises(ValueError, match="none of the configs is in the bf16 space of the fwd"):
        keep_tiles(tile_configs("fwd", "fp32")[:1], "fwd", 64, "bf16", "sm_90")
    # the autotuner's hook reads the head dim, the dtype, the device's target and shared memory
    monkeypatch.setattr(flash_tiles, "_device_smem_bytes", lambda index: 232_448)
    monkeypatch.setattr(tile_space, "device_target", lambda device: "sm_90")
    q = torch.ones(1, 1, 1, 128, dtype=torch.float16)
    pruned = flash_tiles._prune(tile_configs("fwd"), {"q_ptr": q}, kernel="fwd", HEAD_DIM=128)
    assert pruned == keep_tiles(tile_configs("fwd"), "fwd", 128, "fp16", "sm_90", 232_448)
    if INTERPRETED:  # the autotuner cannot run in the interpreter: fixed tiles instead
        assert FA._flash_fwd_kernel.tuned is None and FA._flash_bwd_dq_kernel.tuned is None


def test_an_unknown_kernel_or_a_negative_tile_is_refused():
    with pytest.raises(ValueError, match="kernel='bogus' is not one of 'fwd', 'dkdv', 'dq'"):
        tile_smem_bytes("bogus", 64, 64, 64, 2, 2)
    with pytest.raises(ValueError, match="block_m must be a positive integer, got -64"):
        tile_smem_bytes("fwd", -64, 64, 64, 2, 2)
