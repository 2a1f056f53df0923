"""The cost models as text, for the pages and the command line: tables, summaries, short phrases.

The cost models (`mlsys.accounting`, `mlsys.roofline`) return numbers; this is the one place that
turns them into words. `plan_table` and `napkin_lines` are what `python -m mlsys plan` and
`python -m mlsys napkin` print (aligned text lines); `ridge_table` is a header and rows for
`book.Table` or `book.markdown_table`; `mesh_text` names a mesh by its degrees ("fsdp 4 tp 2"),
`plan_text` a plan (ZeRO-1 marked), `plan_rows` a ranking with its ties, `family_text` and
`placement_text` its strategies and which of them cross the network;
`roofline_position` says where a measured time sits against its roofline estimate. The pages'
tables of the cost models are here too, each a (header, rows) pair: the largest trainable model per
recipe (`max_params_table`, chapter 02), operations' intensities (`op_intensity_table`), two
claims against the byte counts (`byte_claims_table`) and the bytes attention moves
(`attention_traffic_table`, chapter 04), attention's block by length (`attention_block_table`,
chapter 06); `ridge_path` and `ridge_gap_text` put ridge points into words. A step of the
calibrated step model broken down: `step_parts` (seconds by part), `step_breakdown_table` (their
shares) and `step_difference_text` (the part two steps differ in most). Nothing is computed here
that a cost model does not return. Over 300 lines: the one place where numbers become words.
Used in: chapters 02, 04, 06 and 09, the one-pagers, the page on published runs,
`python -m mlsys`, `mlsys.train`, the experiments.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mlsys import checks
from mlsys.accounting import attention_traffic, flops, memory
from mlsys.accounting import bytes as bytes_moved
from mlsys.accounting.napkin import Napkin
from mlsys.accounting.op_costs import OpCost
from mlsys.accounting.parallel import ParallelDims
from mlsys.accounting.planner import FAMILY_AXES, Plan, crossing_axes, family
from mlsys.accounting.step_model import StepBreakdown
from mlsys.book import num
from mlsys.hardware import Accelerator, Cluster
from mlsys.roofline import Ceilings, Estimate

Columns = tuple[list[str], list[list[object]]]
"""A table as (header, rows), for `book.Table` or `book.markdown_table`."""

# --- the planner ------------------------------------------------------------------------------


def plan_table(plans: list[Plan], *, top: int = 10) -> list[str]:
    """The first `top` plans of `planner.plan` as aligned text lines (what `python -m mlsys plan`
    prints): degrees, micro-batches, memory per device (GB), fits, step time (s), MFU, limit."""
    checks.positive_int(top, "top")
    header = ("#", "dp_rep", "dp_shard", "tp", "pp", "cp", "m", "mem GB", "fits", "step s",
              "MFU", "limited by")
    rows = [header]
    for i, p in enumerate(plans[:top], 1):
        r = p.as_row()
        rows.append((str(i), *(str(r[k]) for k in ("dp_replicate", "dp_shard", "tp", "pp", "cp",
                                                   "microbatches")),
                     num(r["memory_gb"]), "yes" if r["fits"] else "NO", num(r["step_s"]),
                     f"{r['mfu']:.0%}", r["limit"]))
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    return ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True))
            for row in rows]


def mesh_text(dims: ParallelDims, *, zero1: bool = False, zero: int = 1) -> str:
    """The degrees above 1, short, in `planner.FAMILY_AXES` order: "fsdp 4 tp 2"; with `zero1`,
    the copies' axis says that they shard their optimizer (ZeRO stage `zero`, 1 or 2):
    "dp 8 (ZeRO-1) pp 8"."""
    return " ".join(f"{name} {getattr(dims, axis)}"
                    + (f" (ZeRO-{zero})" if zero1 and axis == "dp_replicate" else "")
                    for axis, name in FAMILY_AXES.items()
                    if getattr(dims, axis) > 1) or "one device"


def plan_rows(plans: Sequence[Plan], tied: Sequence[Plan] = ()) -> Columns:
    """The chapter's table of a ranking: mesh, micro-batches, memory per device, step time ("="
    where the plan ties with the first, `planner.ties`), communication before overlap (the first
    tie-break), MFU and what limits it."""
    ties = {id(p) for p in tied}
    return (["mesh", "m", "GB per device", "step s", "comms s before overlap", "MFU",
             "limited by"],
            [[plan_text(p), p.microbatches, num(p.memory.total / 1e9),
              num(p.step_s) + (" =" if id(p) in ties else ""), num(p.traffic_s), f"{p.mfu:.0%}",
              p.limit] for p in plans])


FAMILY_WORDS = {"dp": "data parallelism", "fsdp": "FSDP", "dp+fsdp": "HSDP (FSDP in groups, "
                "copies of the groups)", "tp": "tensor parallelism", "pp": "a pipeline",
                "cp": "context parallelism"}


def family_text(p: Plan) -> str:
    """A plan's strategies in words ("HSDP (FSDP in groups, copies of the groups) with ZeRO-1":
    the copies shard their optimizer); unnamed combinations by their axes."""
    name = family(p.dims)
    words = FAMILY_WORDS.get(name, " + ".join(FAMILY_WORDS.get(a, a) for a in name.split("+")))
    return words + (f" with ZeRO-{p.zero}" if p.zero1 else "")


def placement_text(p: Plan, cluster: Cluster) -> str:
    """Which of a plan's axes stay inside a node and which cross the network
    (`planner.crossing_axes`): "tp, cp and fsdp inside a node, pp and dp (ZeRO-1) across
    nodes"."""
    across = crossing_axes(p.dims, cluster)
    used = [a for a in FAMILY_AXES if getattr(p.dims, a) > 1]

    def names(axes) -> str:
        words = [FAMILY_AXES[a] + (f" (ZeRO-{p.zero})" if a == "dp_replicate" and p.zero1 else "")
                 for a in axes]
        return " and ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)

    inside = [a for a in used if a not in across]
    parts = ([f"{names(inside)} inside a node"] if inside else []) + (
        [f"{names([a for a in used if a in across])} across nodes"] if across else [])
    return ", ".join(parts) or "one device"


def plan_text(p: Plan) -> str:
    """A plan's mesh as `mesh_text` names it, the ZeRO stage marked where its copies shard the
    optimizer (and, at stage 2, the gradients)."""
    return mesh_text(p.dims, zero1=p.zero1, zero=p.zero)


# --- one model on the napkin -------------------------------------------------------------------


def _gb(n_bytes: float) -> str:
    return f"{num(n_bytes / 1e9)} GB"


def _share(n_bytes: int, hbm_bytes: float) -> str:
    fits = "fits" if n_bytes <= hbm_bytes else "does not fit"
    return f"{_gb(n_bytes)} per device ({n_bytes / hbm_bytes:.0%} of HBM, {fits})"


def napkin_lines(n: Napkin) -> list[str]:
    """A `napkin.napkin` trace as short text lines, its five steps in order (what
    `python -m mlsys napkin` prints)."""
    pad = " " * 17
    width = max(len(k.name) for k in n.kernels)
    head = f"{pad}{'kernel':<{width}}  {'GFLOP':>7}  {'MB':>7}  {'FLOP/B':>7}  {'bound':<13}  µs"
    kernels = [
        f"{pad}{k.name:<{width}}  {num(k.flops / 1e9):>7}  {num(k.total_bytes / 1e6):>7}  "
        f"{num(k.intensity_flop_per_byte):>7}  {k.bound:<13}  {num(k.roofline_s * 1e6)}"
        for k in n.kernels
    ]
    return [
        f"{n.model_name} on {n.n_devices} x {n.accelerator_name}, {n.dtype}, batch {n.batch} x "
        f"seq {n.seq:,} per device, {n.recipe}, MFU {n.mfu:.0%}",
        f"1 parameters     N = {n.n_params:,} ({n.n_params_matmul:,} in matmuls)",
        f"2 model states   {n.bytes_per_param} B/param x N = {_gb(n.model_state_bytes)}; "
        f"HBM {_gb(n.hbm_bytes)} per device (activations not counted)",
        f"{pad}replicated: {_share(n.replicated_bytes_per_device, n.hbm_bytes)}",
        f"{pad}sharded over {n.n_devices}: {_share(n.sharded_bytes_per_device, n.hbm_bytes)}",
        f"3 FLOPs          per token: forward {num(n.forward_flops_per_token / 1e9)} GFLOP, "
        f"training 3x = {num(n.training_flops_per_token / 1e9)} GFLOP "
        f"(6N = {num(n.six_n_flops_per_token / 1e9)})",
        f"{pad}per step: {num(n.step_flops_per_device / 1e12)} TFLOP per device "
        f"({n.tokens_per_device:,} tokens), {num(n.step_flops / 1e12)} TFLOP on {n.n_devices}",
        f"4 kernels        forward, per device; ridge point {num(n.ridge_flop_per_byte)} FLOP/B "
        f"= {num(n.peak_flop_per_s / 1e12)} TFLOP/s / {num(n.hbm_bytes_per_s / 1e12)} TB/s",
        head,
        *kernels,
        f"5 step time      {num(n.step_s)} s at {n.mfu:.0%} MFU: {num(n.tokens_per_s)} tokens/s "
        f"on {n.n_devices} ({num(n.tokens_per_s / n.n_devices)} per device)",
        f"{pad}(compute only: communication and overlap not counted)",
    ]


# --- training memory ---------------------------------------------------------------------------


def max_params_table(n_devices: int, hbm_bytes: float) -> Columns:
    """Each recipe of `memory.RECIPES`: bytes per parameter by kind of state and in all, and the
    most parameters (billions) whose model states fit in `hbm_bytes` per device, sharded over
    `n_devices` and replicated (`memory.max_trainable_params`)."""
    header = ["recipe", "weights", "grads", "master", "optimizer", "bytes/param",
              f"max params (billions), {n_devices} GPUs sharded", "replicated"]
    rows = [[f"`{r.name}`", *r.breakdown().values(), r.bytes_per_param,
             f"{memory.max_trainable_params(n_devices, hbm_bytes, r) / 1e9:.1f}",
             f"{memory.max_trainable_params(1, hbm_bytes, r) / 1e9:.2f}"]
            for r in memory.RECIPES.values()]
    return header, rows


# --- the roofline ------------------------------------------------------------------------------


def ridge_table(accelerators: Iterable[Accelerator], dtypes: Iterable[str], *,
                peaks: bool = False) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of each accelerator's HBM bandwidth (TB/s) and ridge point peak / bandwidth
    (FLOP/byte) for each dtype, "-" where it has no dense peak for one; with `peaks`, each dense
    peak (TFLOP/s) before its ridge. For `book.Table` or `book.markdown_table`."""
    kinds = list(dtypes)
    header = ["device", "HBM TB/s"]
    for dt in kinds:
        header += [f"{dt} TFLOP/s", f"ridge {dt}"] if peaks else [f"ridge {dt} (FLOP/B)"]
    rows = []
    for acc in accelerators:
        cells = [acc.name, num(acc.hbm_bytes_per_s / 1e12)]
        for dt in kinds:
            known = dt in acc.dense_flop_per_s
            if peaks:
                cells.append(num(acc.peak_flop_per_s(dt) / 1e12, 4) if known else "-")
            cells.append(f"{acc.ridge_intensity(dt):,.0f}" if known else "-")
        rows.append(cells)
    return header, rows


def op_intensity_table(ops_fp32: Sequence[OpCost], ops: Sequence[OpCost], ceilings: Ceilings,
                       device: str) -> Columns:
    """The same operations (`op_costs.op_costs`) in fp32 and in the dtype of `ceilings` (bf16 in
    the book): the intensity's formula and value (FLOP/byte) in each, and in the second which roof
    of `ceilings` bounds it and the largest share of the peak it can reach (%)."""
    header = ["operation", "intensity", "I fp32 (FLOP/B)", "I bf16 (FLOP/B)", f"{device}: bound",
              "at most % of peak"]
    rows = [[op32.name, f"${op32.formula}$", f"{op32.intensity:.3g}", f"{op.intensity:.3g}",
             ceilings.bound(op.intensity),
             f"{100 * ceilings.attainable_flop_per_s(op.intensity) / ceilings.flop_per_s:.3g}"]
            for op32, op in zip(ops_fp32, ops, strict=True)]
    return header, rows


def ridge_gap_text(ops: Sequence[OpCost], accelerator: Accelerator, dtype: str) -> str:
    """The operations below the ridge point of `accelerator` in `dtype`, each with the factor by
    which its intensity falls short of the ridge, smallest first, in one sentence."""
    ridge = accelerator.ridge_intensity(dtype)
    below = sorted(((op.name, ridge / op.intensity) for op in ops if op.intensity < ridge),
                   key=lambda item: item[1])
    return (f"On the {accelerator.name} ({dtype} ridge {ridge:.0f} FLOP/byte), below the ridge by "
            "a factor of: " + "; ".join(f"{name} {factor:,.1f}x" for name, factor in below))


def attention_traffic_table(batch: int, heads: int, d_head: int, seqs: Iterable[int],
                            dtype: str = "bf16", *, block_q: int = 128) -> Columns:
    """Attention's forward at each length T of `seqs` (`bytes.naive_attention_traffic`,
    `tiled_attention_traffic`): GB moved by the naive kernels, the ideal tiled kernel and one
    with query blocks of `block_q`, their ratio, and the intensities (FLOP/byte) of naive and
    ideal tiled with the FLOPs of `flops.scaled_dot_product_flops`."""
    header = ["T", "naive GB", "tiled GB (ideal)", f"tiled GB (block_q {block_q})", "naive / tiled",
              "I naive", "I tiled"]
    rows = []
    for seq in seqs:
        attn_flops = flops.scaled_dot_product_flops(batch, heads, seq, d_head)
        naive = bytes_moved.naive_attention_traffic(batch, heads, seq, d_head, dtype)
        tiled = bytes_moved.tiled_attention_traffic(batch, heads, seq, d_head, dtype)
        blocked = bytes_moved.tiled_attention_traffic(batch, heads, seq, d_head, dtype,
                                                      block_q=block_q)
        rows.append([f"{seq:,}", *(num(t.total_bytes / 1e9) for t in (naive, tiled, blocked)),
                     f"{naive.total_bytes / tiled.total_bytes:,.0f}",
                     f"{bytes_moved.intensity(attn_flops, naive):,.1f}",
                     f"{bytes_moved.intensity(attn_flops, tiled):,.0f}"])
    return header, rows


def byte_claims_table(tokens: int, d_model: int, dtype: str = "bf16") -> Columns:
    """Two claims of a widely shared one-pager against the byte counts: the reads of W in a
    `tokens` x `d_model` x `d_model` linear layer's forward and backward (`bytes.linear_traffic`),
    and the intensity (FLOP/byte) of a unary elementwise op and of an add, in fp32 and bf16
    (`bytes.elementwise_intensity`): the claim, the count, and why they differ."""
    lin = bytes_moved.linear_traffic(tokens, d_model, d_model, dtype)
    unary, add = ({dt: bytes_moved.elementwise_intensity(1, dt, n_inputs=n)
                   for dt in ("fp32", "bf16")} for n in (1, 2))
    rows = [["reads of W, forward + backward", "3", f"{lin.weight_reads} (forward, dX)",
             "the third weight-sized access is the write of dW"],
            ["intensity of a unary elementwise op", "1 FLOP/byte",
             f"fp32 {unary['fp32']}, bf16 {unary['bf16']} FLOP/byte",
             "1 FLOP per element, and each element moves 2b bytes"],
            ["intensity of an elementwise add", "1 FLOP/byte",
             f"fp32 {add['fp32']:.4g}, bf16 {add['bf16']:.4g} FLOP/byte", "two inputs, one output"]]
    return ["quantity", "the one-pager", "correct", "why"], rows


def ridge_path(accelerators: Sequence[Accelerator], dtype: str) -> str:
    """How the ridge point (FLOP/byte) of `dtype` moves from one accelerator to the next, in
    words: "156 (A100), then rises to 295 (H100), falls to ..."."""
    ridges = [acc.ridge_intensity(dtype) for acc in accelerators]
    steps = [f"{'rises' if b > a else 'falls'} to {b:.0f} ({acc.name})"
             for a, b, acc in zip(ridges, ridges[1:], accelerators[1:], strict=False)]
    return f"{ridges[0]:.0f} ({accelerators[0].name}), then " + ", ".join(steps)


def roofline_position(measured_s: float, predicted: Estimate, *, near: float = 1.5) -> str:
    """Where a measured time sits against its roofline estimate, in words computed from the ratio.

    "at the memory roof (1.10x the predicted time)" within `near` of the estimate, otherwise "3.2x
    slower than the compute roof predicts"; faster than the estimate says so (a contradiction the
    caller should have caught with `roofline.roof_problems`).
    """
    checks.positive(measured_s, "measured_s")
    checks.number(near, "near", minimum=1.0)
    ratio = measured_s / predicted.time_s
    roof = "memory roof" if predicted.bound == "memory-bound" else "compute roof"
    if ratio < 1 / near:
        return f"{1 / ratio:.2f}x faster than the {roof} allows"
    if ratio <= near:
        return f"at the {roof} ({ratio:.2f}x the predicted time)"
    return f"{ratio:.1f}x slower than the {roof} predicts"


# --- attention ---------------------------------------------------------------------------------


def attention_block_table(cfg, seqs: Iterable[int], *, tile: int, dtype: str = "bf16") -> Columns:
    """One sequence through one attention block of `cfg` (a `TransformerConfig` whose context holds
    the longest of `seqs`) at each length: the projections' and the two n x n matmuls' forward
    GFLOP (dense, `flops.transformer_flops`), and the MB a causal forward moves, as naive eager
    ops and tiled with `tile` x `tile` tiles (`attention_traffic`), with their ratio."""
    header = ["tokens", "projections GFLOP", "QKᵀ and PV GFLOP (dense)",
              f"naive bytes (MB, {dtype})", "tiled bytes (MB)", "naive / tiled"]
    rows = []
    for seq in seqs:
        lf = flops.transformer_flops(cfg, 1, seq).layer
        proj = lf.q_proj + lf.k_proj + lf.v_proj + lf.o_proj
        naive = attention_traffic.naive_attention_forward_traffic(1, cfg.n_heads, seq, seq,
                                                                  cfg.d_head, dtype, causal=True)
        tiled = attention_traffic.flash_forward_traffic(1, cfg.n_heads, seq, seq, cfg.d_head,
                                                        dtype, block_q=tile, block_k=tile,
                                                        causal=True)
        rows.append([f"{seq:,}", num(proj / 1e9),
                     num((lf.attention_scores + lf.attention_values) / 1e9),
                     num(naive.total_bytes / 1e6), num(tiled.total_bytes / 1e6),
                     f"{naive.total_bytes / tiled.total_bytes:.0f}"])
    return header, rows


# --- a step broken down (the calibrated step model) ----------------------------------------------

STEP_PARTS = {"compute": "compute", "recompute": "recomputation", "bubble": "bubble",
              "tp": "exposed TP", "cp": "exposed CP", "ep": "exposed EP", "pp": "exposed PP",
              "dp": "exposed DP", "fsdp": "exposed FSDP", "optimizer": "optimizer"}
"""The parts of a step (`step_parts`), in their order, and their names on the pages."""


def step_parts(b: StepBreakdown | Plan) -> dict[str, float]:
    """Where one step of the busiest device goes, in seconds, keyed as `STEP_PARTS`: compute
    without the recomputation, the recomputation, the pipeline bubble, each axis' communication
    left exposed after overlap, the optimizer step. The parts add up to the step time. `b`: a
    `step_model.StepBreakdown` or a `planner.Plan` (either time model)."""
    if isinstance(b, StepBreakdown):
        optimizer = b.optimizer_s
    elif isinstance(b, Plan):
        unknown = sorted(set(b.other_s) - {"optimizer"})
        if unknown:
            raise ValueError(f"plan's other_s has parts {unknown} that STEP_PARTS does not name")
        optimizer = b.other_s.get("optimizer", 0.0)
    else:
        raise TypeError(f"b must be a step_model.StepBreakdown or a planner.Plan, got "
                        f"{type(b).__name__}")
    unknown = sorted(set(b.exposed_s) - set(STEP_PARTS))
    if unknown:
        raise ValueError(f"exposed_s has axes {unknown} that STEP_PARTS does not name")
    axes = {k: b.exposed_s.get(k, 0.0) for k in STEP_PARTS if k in ("tp", "cp", "ep", "pp", "dp",
                                                                    "fsdp")}
    return {"compute": b.compute_s - b.recompute_s, "recompute": b.recompute_s,
            "bubble": b.bubble_s, **axes, "optimizer": optimizer}


def step_breakdown_table(steps: dict[str, StepBreakdown | Plan], *, label: str = "run") -> Columns:
    """One row per step of `steps` (its label: its breakdown): the step time (s) and each part's
    share of it (`step_parts`): compute, recomputation, bubble, all exposed communication, the
    axis that exposes the most (with its share; "none" when nothing is exposed), the optimizer."""
    if not steps:
        raise ValueError("steps must hold at least one breakdown")
    axes = ("tp", "cp", "ep", "pp", "dp", "fsdp")
    rows = []
    for name, b in steps.items():
        parts = step_parts(b)
        step = sum(parts.values())
        worst = max(axes, key=parts.get)
        most = (f"{STEP_PARTS[worst].removeprefix('exposed ')} {parts[worst] / step:.1%}"
                if parts[worst] > 0 else "none")
        rows.append([name, num(step), *(f"{parts[k] / step:.1%}" for k in ("compute", "recompute",
                                                                             "bubble")),
                     f"{sum(parts[a] for a in axes) / step:.1%}", most,
                     f"{parts['optimizer'] / step:.1%}"])
    return ([label, "step (s)", "compute", "recompute", "bubble", "exposed comms", "most exposed",
             "optimizer"], rows)


def step_difference_text(a: StepBreakdown | Plan, b: StepBreakdown | Plan) -> str:
    """The part of the step (`step_parts`) whose time differs most between `a` and `b`, with both
    times: "exposed TP, 1.23 s against 0.105 s"."""
    pa, pb = step_parts(a), step_parts(b)
    part = max(STEP_PARTS, key=lambda k: abs(pa[k] - pb[k]))
    return f"{STEP_PARTS[part]}, {num(pa[part])} s against {num(pb[part])} s"
