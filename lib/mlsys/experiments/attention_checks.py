"""Chapter 06's live checks (not recorded experiments): FlashAttention-2, tiled in PyTorch and in
Triton, against the float64 reference attention, forward and backward, on irregular shapes; and
the napkin numbers its prose reads, each law asserted where it is computed.

- `flash_torch_table`: `FlashAttentionTorch` in float64 and float32, causal and not;
- `flash_triton_table`: `FlashAttentionTriton` in the page's dtypes, beside the tests' tolerance
  (no rows without Triton: the kernels then do not run).
Each row is the largest |error| of O, dQ, dK and dV (`ops.attention.max_error`), asserted within
its bound: a kernel that disagrees stops the page.
- `block_numbers`: the attention block's FLOPs (the two n x n matmuls against the projections);
- `causal_work`: what causal tile skipping saves, forward and backward, against naive autograd;
- `io_numbers`: the IO-complexity argument (Dao et al. 2022, Theorem 2) in numbers, the bytes
  counted by `accounting.attention_traffic`: the naive/tiled ratio saturates at 8 b_q / d;
- `fa2_changes`: the numbers behind FlashAttention-2's changes to FlashAttention (Dao 2023, §3):
  matmul against non-matmul FLOP rates, and programs launched with and without parallelism over
  the sequence;
- `allocation_probe`, `jump_verdict`: why the eager forward can grow far beyond n^2 on a CPU at
  `attention_sweep`'s last cpu doubling: the forward timed with PyTorch's CPU allocator as it is
  and with freed memory kept mapped (`bench.kept_cpu_memory`), and the page faults of one
  forward; the verdict names the cause only where those numbers show it.
Used in: §sec-attention.
"""

from __future__ import annotations

import contextlib
import resource
import statistics
from collections.abc import Callable, Iterable
from typing import Any

import torch

from mlsys import bench, hardware
from mlsys.accounting import attention as attention_cost
from mlsys.accounting import attention_traffic, flops
from mlsys.accounting.params import param_counts
from mlsys.book import Table, num, verdict
from mlsys.dtypes import bytes_per_element
from mlsys.experiments import timing_fields
from mlsys.models.config import TransformerConfig
from mlsys.ops.attention import max_error, naive_attention
from mlsys.ops.flash_attention import FlashAttentionTorch

Shapes = tuple[tuple[int, int, int], ...]  # (n_q, n_k, d_head) of each input
HEADER = ["implementation", "dtype", "causal", "max |error| (O, dQ, dK, dV)"]


def _rows(name: str, fn: Callable, shapes: Shapes, dtype: torch.dtype, bound: float,
          generator: torch.Generator, device: str = "cpu") -> list[list[object]]:
    """[name, dtype, causal, error] without and with the causal mask, each error below `bound`."""
    rows = []
    for causal in (False, True):
        err = max_error(fn, shapes, dtype=dtype, causal=causal, generator=generator, device=device)
        assert err < bound, f"{name} {dtype} causal={causal}: error {err:.2e} >= {bound:.0e}"
        rows.append([name, str(dtype).removeprefix("torch."), causal, f"{err:.1e}"])
    return rows


def flash_torch_table(shapes: Shapes, generator: torch.Generator) -> Table:
    """`FlashAttentionTorch` in float64 (error below 1e-10) and float32 (below 1e-4), causal and
    not, on inputs of `shapes` drawn from `generator`."""
    rows = [row for dt, bound in ((torch.float64, 1e-10), (torch.float32, 1e-4))
            for row in _rows("flash_torch", FlashAttentionTorch.apply, shapes, dt, bound,
                             generator)]
    return Table(HEADER, rows)


def flash_triton_table(shapes: Shapes, dtypes: Iterable[torch.dtype], generator: torch.Generator,
                       device: str) -> Table:
    """The Triton `FlashAttentionTriton` in each of `dtypes` on `device`, causal and not, its error
    below 10x the tests' gradient tolerance (inputs and outputs of order 1), which a last column
    shows. No rows without Triton."""
    from mlsys.kernels import _triton  # Triton (may be absent): only when the check runs

    rows = []
    if _triton.HAS_TRITON:
        from mlsys.kernels.flash_attention import FlashAttentionTriton  # (the same)

        for dt in dtypes:
            tol = _triton.ATTENTION_TOLERANCES[dt]["grad"]  # the tests' tolerance
            rows += [[*row, f"{tol['atol']:.0e} + {tol['rtol']:.0e}·|ref|"]
                     for row in _rows("flash_triton", FlashAttentionTriton.apply, shapes, dt,
                                      10 * (tol["atol"] + tol["rtol"]), generator, device)]
    return Table([*HEADER, "tests' tolerance"], rows)


# --- napkin numbers ------------------------------------------------------------------------------


def block_numbers(cfg: TransformerConfig, batch: int, seq: int) -> dict[str, object]:
    """One attention block of `cfg` at `batch` x `seq` tokens: the share of its forward FLOPs in
    the two n x n matmuls (%, "blk_core_share"), and the length where those equal the four
    projections, n = 2 D ("core_cross": 4 n^2 D = 8 n D^2). Asserted on the way: 4 D^2
    parameters (no biases), and the matmuls' FLOPs as `accounting.attention` counts them."""
    def split(b: int, n: int) -> tuple[int, int]:
        layer = flops.transformer_flops(cfg, b, n).layer
        return (layer.attention_scores + layer.attention_values,
                layer.q_proj + layer.k_proj + layer.v_proj + layer.o_proj)

    assert param_counts(cfg).attention_per_layer == 4 * cfg.d_model**2
    core, projections = split(batch, seq)
    assert core == attention_cost.attention_forward_flops(batch, cfg.n_heads, seq, seq,
                                                          cfg.d_head)  # dense
    cross = 2 * cfg.d_model
    assert len(set(split(1, cross))) == 1  # equal at n = 2 D
    return {"blk_tokens": f"{seq:,}", "blk_batch": batch, "core_cross": f"{cross:,}",
            "blk_core_share": 100 * core / (core + projections)}


def causal_work(seq: int, d_head: int, tile: int) -> dict[str, float]:
    """One head, `seq` tokens, square tiles of `tile`, causal: the pairs a tiled kernel computes
    against the dense and the exact ones (% of dense, "tiled_share", "exact_share"); P in bf16
    (MB, "p_mb"); each backward strategy's FLOPs per forward FLOP ("bwd_<strategy>"); and the
    tiled backward's FLOPs against naive autograd's, which computes every pair and masks after:
    % fewer with FlashAttention-2's atomics ("fa2_fewer") and the book's dQ kernel ("book_fewer").
    """
    dense, exact = (attention_cost.score_pairs(seq, seq, causal=c) for c in (False, True))
    tiled = attention_cost.tiled_score_pairs(seq, seq, block_q=tile, block_k=tile, causal=True)
    assert exact < tiled < 0.51 * dense  # the diagonal tiles are the only excess
    shape = (1, 1, seq, seq, d_head)
    fwd = attention_cost.attention_forward_flops(*shape, causal=True)
    naive = attention_cost.attention_backward_flops(*shape, causal=True, convention="dense",
                                                    strategy="stored_p")  # all pairs, 4 matmuls
    tiled_bwd = {s_: attention_cost.tiled_attention_backward_flops(
        *shape, block_q=tile, block_k=tile, causal=True, strategy=s_) / naive
        for s_ in ("atomic_dq", "separate_dq")}
    assert tiled_bwd["atomic_dq"] < tiled_bwd["separate_dq"] < 1  # causal: fewer than naive
    out = {"tiled_share": 100 * tiled / dense, "exact_share": 100 * exact / dense,
           "p_mb": attention_cost.naive_memory(1, 1, seq, seq, d_head, "bf16").matrix_bytes / 1e6,
           "fa2_fewer": 100 * (1 - tiled_bwd["atomic_dq"]),
           "book_fewer": 100 * (1 - tiled_bwd["separate_dq"])}
    for s_ in attention_cost.BACKWARD_MATMULS:
        out[f"bwd_{s_}"] = attention_cost.attention_backward_flops(
            *shape, causal=True, strategy=s_) / fwd
    return out


def io_numbers(spec: hardware.Accelerator, seq: int, *, heads: int, d_head: int, block_q: int,
               dtype: str = "bf16") -> dict[str, float]:
    """The IO bound's numbers on `spec` (Dao et al. 2022, Theorem 2 and Algorithm 1): M, the
    elements of `dtype` one SM's shared memory holds; the paper's tiles B_r x B_c; d^2 against M;
    and the naive/tiled ratio of a causal forward's bytes (one sequence of `heads` heads, square
    tiles of `block_q`) at `seq` tokens, against its limit 8 b_q / d. The naive ops move 8 n x n
    matrices per head (and the shared bool mask's n^2 bytes 4 times), the tiled kernel reads K
    and V up to each query tile's diagonal, about n^2 d / b_q elements per head: both quadratic,
    so the ratio tends to 8 b_q / d (1 + 1 / (2 heads b)), the last factor the mask's."""
    b = bytes_per_element(dtype)
    naive = attention_traffic.naive_attention_forward_traffic(1, heads, seq, seq, d_head, dtype,
                                                              causal=True).total_bytes
    tiled = attention_traffic.flash_forward_traffic(1, heads, seq, seq, d_head, dtype,
                                                    block_q=block_q, block_k=block_q,
                                                    causal=True).total_bytes
    limit, ratio = 8 * block_q / d_head, naive / tiled
    assert abs(ratio / (limit * (1 + 1 / (2 * heads * b))) - 1) < 0.03  # saturated by `seq`
    sram = int(spec.smem_per_sm_bytes)
    block_r, block_c = attention_traffic.paper_block_sizes(sram, d_head, dtype)
    assert d_head**2 < sram // b  # the bound below N^2: d^2 < M
    return {"io_limit": limit, "io_ratio": ratio, "io_seq": f"{seq:,}", "io_m": sram // b,
            "io_smem_kib": sram / 1024, "io_block_r": block_r, "io_block_c": block_c,
            "io_d2": d_head**2, "io_d": d_head}


def fa2_changes(spec: hardware.Accelerator, older: hardware.Accelerator, *, heads: int,
                seq: int, block_q: int) -> dict[str, float]:
    """FlashAttention-2's reasons in numbers: how many times faster a matmul FLOP (bf16 tensor
    cores) is than an fp32 FLOP off them, on `older` (the paper's A100) and `spec`; and, for one
    sequence of `heads` heads and `seq` tokens on `spec`, the blocks FlashAttention launches (one
    per (batch, head)) against FlashAttention-2's programs (one per query tile of `block_q` rows
    and head), each against the SM count."""
    rate = {f"fa2_rate_{key}": acc.peak_flop_per_s("bf16") / acc.peak_flop_per_s("fp32")
            for key, acc in (("old", older), ("new", spec))}
    fa1, fa2 = heads, heads * -(-seq // block_q)
    return {**rate, "fa2_heads": heads, "fa2_fa1_blocks": fa1, "fa2_programs": fa2,
            "fa2_sms": spec.sm_count, "fa2_fa1_busy": 100 * min(fa1, spec.sm_count) / spec.sm_count,
            "fa2_waves": fa2 / spec.sm_count}


# --- the eager forward's jump on a CPU: page faults or not --------------------------------------

JUMP_SEQS = (512, 1_024)
"""`allocation_probe`'s lengths: the last doubling of `attention_sweep`'s cpu profile."""
PAGE_BYTES = resource.getpagesize()
MIB = 2**20


def _faults_per_call(fn, calls: int = 3) -> float:
    """Minor page faults of this process per call of `fn` (median of `calls`): pages the OS had to
    map, and zero, when they were first written."""
    counts = []
    for _ in range(calls):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        fn()
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return statistics.median(counts)


def allocation_probe(seqs: tuple[int, ...] = JUMP_SEQS, *, batch: int = 8, d_head: int = 16,
                     warmup: int = 1, repeats: int = 5) -> list[dict[str, Any]]:
    """`naive_attention`'s forward on the CPU (fp32, `batch` sequences, one head, inputs that
    require grad, as `attention_sweep` times it) at each of `seqs`, timed round-robin with the CPU
    allocator as it is ("default"), then with freed memory kept mapped ("kept",
    `bench.kept_cpu_memory`; no "kept" rows where that does not apply): per row the timing, its
    noise problems and the page faults of one forward."""
    gen = torch.Generator().manual_seed(0)
    inputs = {n: [torch.randn(batch, 1, n, d_head, generator=gen).requires_grad_()
                  for _ in range(3)] for n in seqs}
    calls = {n: (lambda x=inputs[n]: naive_attention(*x)) for n in seqs}
    rows: list[dict[str, Any]] = []
    for memory in ("default", "kept"):
        with contextlib.ExitStack() as stack:
            if memory == "kept" and not stack.enter_context(bench.kept_cpu_memory()):
                break
            timings = bench.benchmark_interleaved({str(n): fn for n, fn in calls.items()},
                                                  warmup=warmup, repeats=repeats, device="cpu")
            rows += [{"memory": memory, "seq": n, "batch": batch, "d_head": d_head,
                      "forward": timing_fields(timings[str(n)]),
                      "faults": _faults_per_call(calls[n]),
                      "problems": bench.noise_problems({f"{memory}, {n:,} tokens":
                                                        timings[str(n)]})}
                     for n in seqs]
    return rows


def probe_table(rows: list[dict[str, Any]]) -> Table:
    """`allocation_probe`'s rows: forward time and the page faults of one forward (and the MiB
    they map)."""
    return Table(["freed memory", "seq", "forward ms (p20–p80)", "page faults per forward",
                  "MiB mapped"],
                 [[r["memory"], f"{r['seq']:,}",
                   f"{num(r['forward']['median_s'] * 1e3)} ({num(r['forward']['p20_s'] * 1e3)}"
                   f"–{num(r['forward']['p80_s'] * 1e3)})", f"{r['faults']:,.0f}",
                   num(r["faults"] * PAGE_BYTES / MIB)] for r in rows])


def jump_verdict(rows: list[dict[str, Any]], *, page_bytes: int = PAGE_BYTES) -> str:
    """Why the eager forward grew as it did between the probe's two lengths, from the rows alone.

    n^2 predicts (long / short)^2. Within 2x of that there is no jump to explain. Beyond it, the
    cause is named only when the numbers show it: the default forward at the longer length
    faults in at least one fresh n x n matrix (fp32, batch x n^2 x 4 bytes) per call, and with
    freed memory kept mapped the growth falls back within 2x of n^2 and to at most half the
    default's. Otherwise the sentence says what the growth is consistent with and withholds the
    cause. Noisy timings withhold everything (`book.verdict`)."""
    by = {(r["memory"], r["seq"]): r for r in rows}
    short, long = min(r["seq"] for r in rows), max(r["seq"] for r in rows)
    law = (long / short) ** 2

    def grew(memory: str) -> float:
        return (by[(memory, long)]["forward"]["median_s"]
                / by[(memory, short)]["forward"]["median_s"])

    problems = [p for r in rows for p in r["problems"]]
    text = (f"the eager forward took {grew('default'):.1f}x as long at {long:,} tokens as at "
            f"{short:,}, where n² predicts {law:.0f}x")
    if grew("default") <= 2 * law:
        return verdict(text + ": no jump beyond n² to explain on this machine", problems)
    r0 = by[("default", long)]
    matrix = r0["batch"] * long**2 * 4  # one fp32 n x n matrix of the batch
    fresh, fresh_short = (by[("default", n)]["faults"] * page_bytes / matrix
                          for n in (long, short))
    kept = grew("kept") if ("kept", long) in by else None
    if kept is not None and fresh >= 1 and kept <= min(2 * law, grew("default") / 2):
        return verdict(
            text + f". Each forward at {long:,} tokens took {r0['faults']:,.0f} page faults, "
            f"{fresh:.1f} fresh n x n matrices of {matrix / MIB:.0f} MiB that the OS mapped and "
            f"zeroed on first write, against {fresh_short:.2f} at {short:,}; with freed memory "
            f"kept mapped the growth fell to {kept:.1f}x: the jump is page faults, the CPU "
            "allocator handing each freed matrix back to the OS", problems)
    kept_text = "not tried here" if kept is None else f"{kept:.1f}x with freed memory kept"
    return verdict(
        text + f" ({kept_text}; {fresh:.1f} fresh n x n matrices mapped per forward): consistent "
        "with page faults or with the n x n matrices outgrowing the caches, and these numbers do "
        "not settle which", problems)
