"""mlsys.tables, the cost models as text: the planner's table and mesh names, where a measured
time sits against its roofline, the ridge table, the napkin's lines, and the pages' tables of the
cost models (chapters 02, 04, 06). (`plan_table` is also checked against `python -m mlsys plan` in
tests/test_main.py.)"""

from dataclasses import replace

import pytest

from mlsys import hardware, roofline, tables
from mlsys.accounting import attention_traffic, calibration, flops, memory, parallel, planner
from mlsys.accounting import bytes as bytes_moved
from mlsys.accounting.napkin import napkin
from mlsys.accounting.op_costs import op_costs
from mlsys.accounting.step_model import StepBreakdown
from mlsys.book import num
from mlsys.models.config import TransformerConfig
from mlsys.roofline import Ceilings
from mlsys.third_party import MEGATRON_TABLE1

# --- the planner ---------------------------------------------------------------------------------


def test_plan_table_is_one_aligned_line_per_plan_under_a_header():
    plans = planner.plan(TransformerConfig.preset("debug"), "dgx-h100", n_devices=4, batch=8,
                         seq=64)
    lines = tables.plan_table(plans, top=3)
    assert len(lines) == 4 and lines[0].split()[:3] == ["#", "dp_rep", "dp_shard"]
    assert len({len(line) for line in lines}) == 1  # every column right-justified to one width
    for i, (line, p) in enumerate(zip(lines[1:], plans, strict=False), 1):
        cells, row = line.split(), p.as_row()
        assert cells[:7] == [str(i), *(str(row[k]) for k in (
            "dp_replicate", "dp_shard", "tp", "pp", "cp", "microbatches"))]
        assert cells[8] == ("yes" if p.fits else "NO") and f"{row['mfu']:.0%}" in cells
        assert line.endswith(row["limit"])
    assert len(tables.plan_table(plans)) == min(10, len(plans)) + 1
    with pytest.raises(ValueError, match="top must be a positive integer"):
        tables.plan_table(plans, top=0)


def test_mesh_text_names_the_degrees_above_one_in_the_planners_order():
    assert tables.mesh_text(parallel.ParallelDims(dp_replicate=2, dp_shard=4)) == "dp 2 fsdp 4"
    assert tables.mesh_text(parallel.ParallelDims(tp=2, dp_shard=4)) == "fsdp 4 tp 2"
    assert tables.mesh_text(parallel.ParallelDims(world_size=1)) == "one device"
    assert tables.mesh_text(parallel.ParallelDims(dp_replicate=2, pp=2),
                            zero1=True) == "dp 2 (ZeRO-1) pp 2"


def test_the_ranking_in_words_marks_ties_zero1_and_what_crosses_nodes():
    h100 = hardware.get_cluster("dgx-h100")
    cfg = TransformerConfig.preset("2.7B", context_length=4096)
    plans = planner.plan(cfg, h100, n_devices=64, batch=256, seq=4096, efficiency=0.5)
    tied = planner.ties(plans)
    header, rows = tables.plan_rows(plans[:len(tied) + 1], tied)
    assert header[3] == "step s" and header[4] == "comms s before overlap"
    assert [r[3].endswith(" =") for r in rows] == [True] * len(tied) + [False]
    assert [r[0] for r in rows] == [tables.plan_text(p) for p in plans[:len(tied) + 1]]
    assert tables.family_text(plans[0]).endswith(" with ZeRO-1") == plans[0].zero1
    hsdp = planner.evaluate(cfg, h100, parallel.ParallelDims(dp_replicate=8, dp_shard=8),
                            batch=256, seq=4096)
    assert tables.family_text(hsdp).startswith("HSDP")
    odd = planner.evaluate(cfg, h100, parallel.ParallelDims(tp=2, pp=2, cp=2), batch=8, seq=4096)
    assert tables.family_text(odd) == "tensor parallelism + a pipeline + context parallelism"
    mesh = parallel.ParallelDims(dp_replicate=2, dp_shard=2, tp=4, pp=2)  # 32 GPUs, 4 nodes
    plan = planner.evaluate(cfg, h100, mesh, batch=16, seq=4096, microbatches=2, zero1=True)
    assert planner.crossing_axes(mesh, h100) == ("pp", "dp_replicate")
    assert tables.placement_text(plan, h100) == \
        "fsdp and tp inside a node, dp (ZeRO-1) and pp across nodes"
    inside = planner.evaluate(cfg, h100, parallel.ParallelDims(tp=8), batch=8, seq=4096)
    assert tables.placement_text(inside, h100) == "tp inside a node"


# --- the roofline ---------------------------------------------------------------------------------


def test_position_words_follow_the_ratio():
    est = roofline.estimate(0.0, 1e10, Ceilings(1e12, 1e10, "toy"))  # 1 s, memory-bound
    assert tables.roofline_position(1.1, est) == "at the memory roof (1.10x the predicted time)"
    assert tables.roofline_position(3.2, est) == "3.2x slower than the memory roof predicts"
    assert tables.roofline_position(0.5, est) == "2.00x faster than the memory roof allows"


def test_the_ridge_table_is_peak_over_bandwidth_for_every_device_and_dtype():
    accs = list(hardware.ACCELERATORS.values())
    header, rows = tables.ridge_table(accs, ("fp32", "bf16", "fp8"))
    assert header == ["device", "HBM TB/s", "ridge fp32 (FLOP/B)", "ridge bf16 (FLOP/B)",
                      "ridge fp8 (FLOP/B)"]
    for acc, row in zip(accs, rows, strict=True):
        assert row[0] == acc.name and len(row) == len(header)
        for dt, cell in zip(("fp32", "bf16", "fp8"), row[2:], strict=True):
            if dt in acc.dense_flop_per_s:
                ridge = acc.peak_flop_per_s(dt) / acc.hbm_bytes_per_s
                assert cell == f"{ridge:,.0f}"
            else:
                assert cell == "-"
    assert any("-" in row for row in rows)  # a device without fp8 (the A100)
    header, rows = tables.ridge_table(accs[:1], ("bf16",), peaks=True)
    assert header[2:] == ["bf16 TFLOP/s", "ridge bf16"] and len(rows[0]) == 4


# --- the napkin -----------------------------------------------------------------------------------


BATCH, SEQ, DEVICES, MFU = 8, 1_024, 8, 0.4


@pytest.fixture(scope="module")
def xl():
    xl = TransformerConfig.preset("xl")
    return napkin(xl, "H100", batch=BATCH, seq=SEQ, n_devices=DEVICES, mfu=MFU, name="xl")


def test_lines_show_the_key_numbers(xl):
    text = "\n".join(tables.napkin_lines(xl))
    needles = ("N = 1,998,235,200", "32 GB", "sharded over 8: 4 GB", "12.8 GFLOP", "compute-bound",
               "memory-bound", "0.266 s", "40% MFU")  # fmt: skip
    for needle in needles:
        assert needle in text, needle
    assert all(len(line) <= 100 for line in tables.napkin_lines(xl))


# --- the pages' tables ----------------------------------------------------------------------------


def test_max_params_table_is_memory_over_bytes_per_parameter():
    hbm = hardware.H100_SXM.hbm_bytes
    header, rows = tables.max_params_table(8, hbm)
    assert header[-2:] == ["max params (billions), 8 GPUs sharded", "replicated"]
    assert [row[0] for row in rows] == [f"`{name}`" for name in memory.RECIPES]
    for row, r in zip(rows, memory.RECIPES.values(), strict=True):
        assert sum(row[1:5]) == row[5] == r.bytes_per_param  # the parts add up
        assert row[6] == f"{8 * int(hbm) // r.bytes_per_param / 1e9:.1f}"  # n * memory // bytes
        assert row[7] == f"{int(hbm) // r.bytes_per_param / 1e9:.2f}"
    assert rows[0][6:] == ["40.0", "5.00"]  # fp32 AdamW, 16 B/param, on 8 x 80 GB


def test_op_intensity_table_reads_each_op_against_the_roof():
    ops32, ops16 = op_costs("fp32"), op_costs("bf16")
    roof = roofline.Ceilings.from_spec(hardware.H100_SXM, "bf16")
    header, rows = tables.op_intensity_table(ops32, ops16, roof, "H100 SXM")
    assert header[4] == "H100 SXM: bound" and len(rows) == len(ops16)
    square, unary = rows[0], next(r for r in rows if r[0].startswith("elementwise unary"))
    assert square[1:] == ["$2N/(3b)$", "683", "1.37e+03", "compute-bound", "100"]  # 2N/(3b)
    assert unary[2:4] == ["0.125", "0.25"] and unary[4] == "memory-bound"
    assert float(unary[5]) == pytest.approx(100 * 0.25 / roof.ridge_intensity, rel=1e-3)
    with pytest.raises(ValueError):
        tables.op_intensity_table(ops32[:2], ops16, roof, "H100 SXM")


def test_attention_traffic_table_naive_against_tiled():
    batch, heads, d_head, dtype = 1, 32, 128, "bf16"
    header, rows = tables.attention_traffic_table(batch, heads, d_head, (256, 4096, 65536), dtype)
    assert header[3] == "tiled GB (block_q 128)" and [r[0] for r in rows] == ["256", "4,096",
                                                                              "65,536"]
    for seq, row in zip((256, 4096, 65536), rows, strict=True):
        naive = bytes_moved.naive_attention_traffic(batch, heads, seq, d_head, dtype)
        tiled = bytes_moved.tiled_attention_traffic(batch, heads, seq, d_head, dtype)
        assert naive.total_bytes - tiled.total_bytes == batch * heads * 4 * seq * seq * 2  # 4 T^2
        assert row[4] == f"{naive.total_bytes / tiled.total_bytes:,.0f}"
        assert float(row[5]) < (d_head + 1.5) / 2  # the naive kernel's ceiling, (d + 3/2) / b
    assert rows[1][1:] == ["4.43", "0.134", "2.21", "33", "62.8", "2,072"]


def test_byte_claims_table_counts_two_reads_of_w_and_2b_bytes_per_element():
    header, rows = tables.byte_claims_table(4096, 4096, "bf16")
    assert header == ["quantity", "the one-pager", "correct", "why"]
    lin = bytes_moved.linear_traffic(4096, 4096, 4096, "bf16")
    assert lin.grad_weight.write_bytes == 4096 * 4096 * 2  # the third access writes dW
    assert rows[0][2] == "2 (forward, dX)"
    assert rows[1][2] == "fp32 0.125, bf16 0.25 FLOP/byte"  # 1 / (2b)
    assert rows[2][2] == "fp32 0.08333, bf16 0.1667 FLOP/byte"  # 1 / (3b)


def test_ridge_path_and_gaps_follow_the_ridge_points():
    gpus = [hardware.get(k) for k in ("a100", "h100", "h200", "b200")]
    assert tables.ridge_path(gpus, "bf16") == (
        "153 (A100 80GB SXM), then rises to 295 (H100 SXM), falls to 206 (H200 SXM), rises to 292 "
        "(B200 (HGX))")
    text = tables.ridge_gap_text(op_costs("bf16"), hardware.H100_SXM, "bf16")
    assert text.startswith("On the H100 SXM (bf16 ridge 295 FLOP/byte), below the ridge by a "
                           "factor of: batched matmul, one W per item")
    assert "elementwise binary add 1,772.1x" in text and "square matmul N = 4096" not in text
    factors = [float(part.rsplit(" ", 1)[1][:-1].replace(",", "")) for part in text.split("; ")]
    assert factors == sorted(factors)  # smallest gap first


def test_attention_block_table_crosses_at_twice_d_model():
    cfg = TransformerConfig.preset("small", context_length=65_536)
    header, rows = tables.attention_block_table(cfg, (256, 2 * cfg.d_model, 4096), tile=128)
    assert header == ["tokens", "projections GFLOP", "QKᵀ and PV GFLOP (dense)",
                      "naive bytes (MB, bf16)", "tiled bytes (MB)", "naive / tiled"]
    assert rows[1][1] == rows[1][2] == "7.25"  # 8 n D^2 = 4 n^2 D at n = 2D
    lf = flops.transformer_flops(cfg, 1, 4096).layer
    assert float(rows[2][2]) > float(rows[2][1])  # past 2D the n^2 matmuls dominate
    assert rows[2][2] == num((lf.attention_scores + lf.attention_values) / 1e9)
    naive = attention_traffic.naive_attention_forward_traffic(1, cfg.n_heads, 4096, 4096,
                                                              cfg.d_head, "bf16", causal=True)
    assert rows[2][3] == num(naive.total_bytes / 1e6)


# --- a step broken down -----------------------------------------------------------------------


def _step(**exposed):
    return StepBreakdown(compute_s=2.0, recompute_s=0.5, bubble_s=0.25, optimizer_s=0.05,
                         exposed_s={"tp": 0.2, "dp": 0.0, **exposed})


def test_step_parts_add_up_to_the_step_of_either_time_model():
    b = calibration.predict(MEGATRON_TABLE1[-1])  # full recomputation, TP, PP, DP
    parts = tables.step_parts(b)
    assert list(parts) == list(tables.STEP_PARTS)
    assert sum(parts.values()) == pytest.approx(b.step_s)
    assert parts["recompute"] == b.recompute_s > 0 and parts["compute"] == pytest.approx(
        b.compute_s - b.recompute_s)
    assert parts["tp"] == b.exposed_s["tp"] and parts["optimizer"] == b.optimizer_s
    cfg = TransformerConfig.preset("small")
    for model in planner.MODELS:
        p = planner.plan(cfg, "dgx-h100", n_devices=16, batch=64, seq=1024, model=model,
                         recompute="selective")[0]
        parts = tables.step_parts(p)
        assert sum(parts.values()) == pytest.approx(p.step_s)
        assert parts["recompute"] == p.recompute_s > 0
    with pytest.raises(TypeError, match="StepBreakdown or a planner.Plan"):
        tables.step_parts({"compute_s": 1.0})
    with pytest.raises(ValueError, match="exposed_s has axes \\['ring'\\]"):
        tables.step_parts(_step(ring=1.0))


def test_step_breakdown_table_gives_each_parts_share_of_the_step():
    header, rows = tables.step_breakdown_table({"a": _step(), "b": _step(tp=0.0)}, label="row")
    assert len(header) == 8 and header[0] == "row" and [r[0] for r in rows] == ["a", "b"]
    step = 2.0 + 0.25 + 0.05 + 0.2  # compute (recomputation within) + bubble + optimizer + TP
    assert rows[0][1:] == [num(step), f"{1.5 / step:.1%}", f"{0.5 / step:.1%}",
                           f"{0.25 / step:.1%}", f"{0.2 / step:.1%}", f"TP {0.2 / step:.1%}",
                           f"{0.05 / step:.1%}"]
    assert rows[1][5:7] == ["0.0%", "none"]
    with pytest.raises(ValueError, match="at least one"):
        tables.step_breakdown_table({})


def test_step_difference_names_the_part_that_differs_most():
    slow_tp = _step(tp=1.0)  # TP differs by 0.8 s, the bubble by 0.25 s
    flat = replace(_step(), bubble_s=0.0)
    assert tables.step_difference_text(slow_tp, flat) == "exposed TP, 1 s against 0.2 s"
    assert tables.step_difference_text(_step(), flat).startswith("bubble, 0.25 s")
