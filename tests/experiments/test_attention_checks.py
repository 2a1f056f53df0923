"""Chapter 06's live checks (`mlsys.experiments.attention_checks`): FlashAttention-2 in PyTorch and
in Triton against the float64 reference, causal and not; the napkin numbers; the allocation
probe and its verdict."""

import pytest
import torch
from kernel_cases import needs_triton

from mlsys.experiments import attention_checks

SHAPES = ((1, 1, 16), (29, 61, 16), (61, 29, 16))  # n_q != n_k both ways


def test_flash_torch_rows_per_dtype_and_mask():
    table = attention_checks.flash_torch_table(SHAPES, torch.Generator().manual_seed(0))
    assert table.header == attention_checks.HEADER
    assert [row[:3] for row in table.rows] == [["flash_torch", dt, causal]
                                               for dt in ("float64", "float32")
                                               for causal in ("False", "True")]
    errors = [float(row[3]) for row in table.rows]
    assert max(errors[:2]) < 1e-10 and max(errors[2:]) < 1e-4


def test_an_error_above_its_bound_stops_the_page():
    def wrong(q, k, v, causal):
        return attention_checks.FlashAttentionTorch.apply(q, k, v, causal) + 1e-3

    with pytest.raises(AssertionError, match="wrong torch.float32 causal=False"):
        attention_checks._rows("wrong", wrong, SHAPES, torch.float32, 1e-4,
                               torch.Generator().manual_seed(0))


@needs_triton
def test_flash_triton_rows_show_the_tests_tolerance():
    table = attention_checks.flash_triton_table(SHAPES[:2], (torch.float32,),
                                                torch.Generator().manual_seed(0), "cpu")
    assert table.header == [*attention_checks.HEADER, "tests' tolerance"]
    assert [row[:3] for row in table.rows] == [["flash_triton", "float32", "False"],
                                               ["flash_triton", "float32", "True"]]
    assert all(row[4].endswith("·|ref|") for row in table.rows)


# --- the napkin numbers ---------------------------------------------------------------------------


def test_causal_work_fa2_backward_does_fewer_flops_than_naive_with_a_mask():
    """Dao 2023 (FlashAttention-2), Algorithm 2: 5 matmuls per computed tile pair, against naive
    autograd's 4 on every pair. Square tiles of 128, t = 16,384 / 128 = 128 tile rows: a causal
    kernel computes t(t + 1)/2 of t^2 tiles, 129/256 of the pairs."""
    work = attention_checks.causal_work(16_384, 128, 128)
    assert work["tiled_share"] == 100 * 129 / 256
    assert work["fa2_fewer"] == pytest.approx(100 * (1 - 5 / 4 * 129 / 256))  # 37.0
    assert work["book_fewer"] == pytest.approx(100 * (1 - 7 / 4 * 129 / 256))  # 11.8
    assert (work["bwd_stored_p"], work["bwd_atomic_dq"], work["bwd_separate_dq"]) == (2, 2.5, 3.5)
    assert work["exact_share"] < work["tiled_share"] and work["p_mb"] == 16_384**2 * 2 / 1e6


def test_io_numbers_saturate_at_eight_query_rows_per_head_dim():
    """Dao et al. 2022, Theorem 2 and Algorithm 1: B_c = ceil(M / 4d), B_r = min(B_c, d); the
    causal naive forward moves 8 n x n matrices per head, the tiled one about n^2 d / b_q."""
    from mlsys import hardware

    io = attention_checks.io_numbers(hardware.H100_SXM, 65_536, heads=12, d_head=64, block_q=128)
    m = 228 * 1024 // 2
    assert (io["io_m"], io["io_block_c"], io["io_block_r"]) == (m, -(-m // 256), 64)
    assert io["io_limit"] == 8 * 128 / 64 and io["io_d2"] == 64**2 < m
    assert io["io_ratio"] == pytest.approx(16 * (1 + 1 / 48), rel=0.03)
    with pytest.raises(AssertionError):  # at 1,024 tokens the ratio is far from its limit
        attention_checks.io_numbers(hardware.H100_SXM, 1_024, heads=12, d_head=64, block_q=128)


def test_fa2_changes_rates_and_grid():
    """Dao 2023, section 3.1: the A100's 312 TFLOP/s of bf16 matmul against 19.5 TFLOP/s of fp32
    non-matmul work, 16x; section 3.2: a grid of (batch x heads) blocks against query tiles too."""
    from mlsys import hardware

    fa2 = attention_checks.fa2_changes(hardware.H100_SXM, hardware.A100_80GB_SXM, heads=16,
                                       seq=16_384, block_q=128)
    assert fa2["fa2_rate_old"] == 16 and fa2["fa2_rate_new"] == pytest.approx(989.4 / 67)
    assert (fa2["fa2_fa1_blocks"], fa2["fa2_programs"], fa2["fa2_sms"]) == (16, 16 * 128, 132)
    assert fa2["fa2_fa1_busy"] == pytest.approx(100 * 16 / 132)
    assert fa2["fa2_waves"] == pytest.approx(2048 / 132)


def test_block_numbers_of_small():
    from mlsys.models.config import TransformerConfig

    cfg = TransformerConfig.preset("small")
    blk = attention_checks.block_numbers(cfg, 4, 1_024)
    assert blk["core_cross"] == f"{2 * cfg.d_model:,}" and blk["blk_batch"] == 4
    # at n = 1,024 < 2 D = 1,536 the n x n matmuls are 4 n^2 D / (4 n^2 D + 8 n D^2) of the FLOPs
    n, d = 1_024, cfg.d_model
    assert blk["blk_core_share"] == pytest.approx(100 * 4 * n * n * d / (4 * n * n * d
                                                                       + 8 * n * d * d))


# --- the eager forward's jump: page faults named only when the numbers show them ------------------


def _probe_rows(default: tuple[float, float], kept: tuple[float, float] | None,
                faults: tuple[int, int] = (0, 24_579), problems: tuple[str, ...] = ()):
    """Rows as `allocation_probe` writes them: (512, 1,024) tokens, batch 8, d = 16, forward
    medians in seconds, page faults of one default forward (4 KiB pages)."""
    def row(memory, seq, seconds, n_faults):
        return {"memory": memory, "seq": seq, "batch": 8, "d_head": 16, "faults": n_faults,
                "forward": {"median_s": seconds, "p20_s": seconds, "p80_s": seconds,
                            "samples_s": [seconds]}, "problems": list(problems)}

    rows = [row("default", n, t, f) for n, t, f in zip((512, 1_024), default, faults, strict=True)]
    if kept is not None:
        rows += [row("kept", n, t, 0) for n, t in zip((512, 1_024), kept, strict=True)]
    return rows


def test_jump_verdict_names_page_faults_when_kept_memory_removes_the_jump():
    text = attention_checks.jump_verdict(_probe_rows((0.012, 0.204), (0.010, 0.042)),
                                         page_bytes=4096)
    assert text.startswith("the eager forward took 17.0x as long at 1,024 tokens as at 512, "
                           "where n² predicts 4x")
    assert "24,579 page faults, 3.0 fresh n x n matrices of 32 MiB" in text
    assert "fell to 4.2x: the jump is page faults" in text


def test_jump_verdict_finds_no_jump_in_a_growth_near_n_squared_or_below():
    for default in ((0.010, 0.018), (0.010, 0.010), (0.010, 0.075)):  # 1.8x, a tie, 7.5x
        text = attention_checks.jump_verdict(_probe_rows(default, (0.010, 0.040)),
                                             page_bytes=4096)
        assert text.endswith("no jump beyond n² to explain on this machine")
        assert "page faults" not in text


def test_jump_verdict_withholds_the_cause_the_numbers_do_not_show():
    cases = {  # kept memory does not remove the 17x; no fresh matrix mapped; no kept rows
        "kept": _probe_rows((0.012, 0.204), (0.010, 0.160)),
        "faults": _probe_rows((0.012, 0.204), (0.010, 0.042), faults=(0, 100)),
        "none": _probe_rows((0.012, 0.204), None),
    }
    for name, rows in cases.items():
        text = attention_checks.jump_verdict(rows, page_bytes=4096)
        assert "these numbers do not settle which" in text, name
        assert "the jump is page faults" not in text, name
    assert "not tried here" in attention_checks.jump_verdict(cases["none"], page_bytes=4096)


def test_jump_verdict_on_noisy_timings_withholds_everything():
    rows = _probe_rows((0.012, 0.204), (0.010, 0.042),
                       problems=("default, 1,024 tokens: p80 / p20 = 2.40 (more than 1.5)",))
    text = attention_checks.jump_verdict(rows, page_bytes=4096)
    assert text.startswith("no verdict: the machine was too noisy") and "page faults" not in text


def test_allocation_probe_rows_and_table():
    rows = attention_checks.allocation_probe((64, 128), batch=2, repeats=3)
    assert [(r["memory"], r["seq"]) for r in rows][:2] == [("default", 64), ("default", 128)]
    assert {r["memory"] for r in rows} <= {"default", "kept"} and len(rows) in (2, 4)
    for r in rows:
        assert r["faults"] >= 0 and r["forward"]["p20_s"] <= r["forward"]["p80_s"]
    assert len(attention_checks.probe_table(rows).rows) == len(rows)
    assert isinstance(attention_checks.jump_verdict(rows), str)
