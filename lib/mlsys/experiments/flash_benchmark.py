"""The book's FlashAttention-2 kernel against naive, compiled and every SDPA backend.

For each configuration (dtype, causal or not, head dim, sequence length; 16 heads; the batch
shrinks as the sequence grows, `tokens` per batch at most) every implementation is first run
once, forward and backward: one that runs out of memory, or that this device does not offer
(an SDPA backend PyTorch refuses here), gets a row saying so. The survivors are then timed
round-robin, forward and forward + backward (backward = the difference). Achieved TFLOP/s use the
useful work (`accounting.attention`, convention "exact": the pairs attended; the backward counted
as the four matmuls that need, 2x the forward), so a kernel that recomputes is not credited for it.
`targets` reads the book's goals for one H100 from the record: at bf16, causal, head dim 128 and
16,384 tokens, the Triton forward at least as fast as the best SDPA backend and at least 50% of
the dense peak; forward + backward at least 0.9x the best SDPA backend's speed.
On a CPU the Triton kernel runs in the interpreter: checked elsewhere, never timed here.
Used in: §sec-attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from mlsys import bench, env, hardware
from mlsys.accounting import attention as attention_cost
from mlsys.book import Table, num, verdict
from mlsys.dtypes import torch_dtype
from mlsys.experiments import Experiment, kit, recorded, timing_fields
from mlsys.experiments.kit import setup
from mlsys.ops.attention import naive_attention
from mlsys.ops.flash_attention import FlashAttentionTorch

IMPLEMENTATIONS = ("flash_triton", "flash_torch", "naive", "compiled", "sdpa_math",
                   "sdpa_efficient", "sdpa_flash", "sdpa_cudnn")
SDPA = {"sdpa_math": "MATH", "sdpa_efficient": "EFFICIENT_ATTENTION",
        "sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION"}
MODES = ("forward", "backward", "forward+backward")  # backward = forward+backward - forward
TARGET = {"dtype": "bf16", "causal": True, "d_head": 128, "seq": 16_384}
"""The configuration the book sets its kernel's targets for (one H100)."""


@dataclass(frozen=True)
class Sizes:
    combos: tuple[tuple[str, bool, int], ...]  # (dtype, causal, d_head)
    seqs: tuple[int, ...]
    heads: int
    tokens: int  # batch = clamp(tokens // seq, 1, max_batch)
    max_batch: int
    implementations: tuple[str, ...]
    compiled_combos: int  # compile only for the first this many combos (a compile per shape)
    warmup: int
    repeats: int


SIZES = {
    "smoke": Sizes((("fp32", True, 16),), (32, 64), 2, 128, 2,
                   ("flash_torch", "naive", "sdpa_math", "sdpa_flash"), 0, 1, 3),
    "cpu": Sizes((("fp32", True, 64),), (128, 256, 512), 4, 1_024, 8,
                 ("flash_torch", "naive", "compiled", "sdpa_math", "sdpa_flash"), 1, 1, 5),
    "gpu": Sizes((("bf16", True, 128), ("bf16", False, 128), ("fp32", True, 64)),
                 (512, 2_048, 8_192, 16_384, 32_768), 16, 16_384, 8,
                 ("flash_triton", "naive", "compiled", *SDPA), 1, 2, 10),
}


def batch_for(s: Sizes, seq: int) -> int:
    return max(1, min(s.max_batch, s.tokens // seq))


def _function(name: str, causal: bool):
    """The implementation as f(q, k, v) -> O, for (batch, heads, seq, d) inputs."""
    if name == "flash_triton":
        from mlsys.kernels.flash_attention import flash_attention  # Triton: only on a CUDA GPU

        return lambda q, k, v: flash_attention(q, k, v, causal)
    if name == "flash_torch":
        return lambda q, k, v: FlashAttentionTorch.apply(q, k, v, causal)
    if name in ("naive", "compiled"):
        return lambda q, k, v: naive_attention(q, k, v, is_causal=causal)
    backend = getattr(SDPBackend, SDPA[name])

    def sdpa(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return sdpa


def _status(error: BaseException) -> str | None:
    """A row's status for an expected failure (memory, an unavailable backend), else None."""
    if kit.is_oom(error):
        return kit.OUT_OF_MEMORY
    text = str(error).lower()
    if "no viable backend" in text or "no available kernel" in text:
        return "not available here"
    return None


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """Every combo x length x implementation: a timing row, or why there is none."""
    device = device or env.device()
    names = [n for n in s.implementations if n != "flash_triton" or device == "cuda"]
    gen = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = [{"kind": "setup", "device": env.device_name(),
                                   "device_type": device, "heads": s.heads}]
    if "flash_triton" in s.implementations and device != "cuda":
        rows.append({"kind": "note", "text": "flash_triton runs in Triton's interpreter on this "
                     "device: correct, but not timed"})
    for index, (dtype, causal, d) in enumerate(s.combos):
        fns = {n: _function(n, causal) for n in names
               if n != "compiled" or index < s.compiled_combos}
        if "compiled" in fns:
            fns["compiled"] = kit.compile_fresh(fns["compiled"], dynamic=False)
        for seq in bench.progress(s.seqs, desc=f"{dtype}, causal={causal}, d={d}"):
            batch = batch_for(s, seq)
            base = {"kind": "row", "dtype": dtype, "causal": causal, "d_head": d, "seq": seq,
                    "batch": batch}
            shape = (batch, s.heads, seq, d)
            q, k, v = (torch.randn(shape, generator=gen).to(device, torch_dtype(dtype))
                       .requires_grad_() for _ in range(3))
            grad = torch.randn(shape, generator=gen).to(device, torch_dtype(dtype))
            alive = {}
            for name, fn in fns.items():
                try:
                    fn(q, k, v).backward(grad)  # runs, and compiles or autotunes, once
                    alive[name] = fn
                except (RuntimeError, torch.cuda.OutOfMemoryError) as error:
                    status = _status(error)
                    if status is None:
                        raise
                    rows.append({**base, "implementation": name, "status": status})
                kit.free(device)
            calls, inputs = {}, (q, k, v)
            for name, fn in alive.items():
                calls[f"{name}|forward"] = lambda fn=fn, x=inputs: fn(*x)
                calls[f"{name}|forward+backward"] = lambda fn=fn, x=inputs, g=grad: \
                    fn(*x).backward(g)
            timings = bench.benchmark_interleaved(calls, warmup=s.warmup, repeats=s.repeats,
                                                  device=device) if calls else {}
            for name in alive:
                mine = {m: timings[f"{name}|{m}"] for m in ("forward", "forward+backward")}
                rows.append({**base, "implementation": name, "status": "ok",
                             "problems": bench.noise_problems(mine),
                             **{m: timing_fields(t) for m, t in mine.items()}})
            del q, k, v, grad, calls
            kit.free(device)
    return rows


# --- reading the rows (live or recorded) ----------------------------------------------------------


def measured(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["kind"] == "row" and r["status"] == "ok"]


def flops(rows: list[dict[str, Any]], r: dict[str, Any], mode: str) -> int:
    """Useful matmul FLOPs of a row's mode (convention "exact"; backward = 2x forward)."""
    args = (r["batch"], setup(rows)["heads"], r["seq"], r["seq"], r["d_head"])
    fwd = attention_cost.attention_forward_flops(*args, causal=r["causal"], convention="exact")
    bwd = attention_cost.attention_backward_flops(*args, causal=r["causal"], convention="exact",
                                                  strategy="stored_p")
    return {"forward": fwd, "backward": bwd, "forward+backward": fwd + bwd}[mode]


def seconds(r: dict[str, Any], mode: str) -> float:
    if mode == "backward":
        return r["forward+backward"]["median_s"] - r["forward"]["median_s"]
    return r[mode]["median_s"]


def tflops(rows: list[dict[str, Any]], r: dict[str, Any], mode: str) -> float:
    return flops(rows, r, mode) / seconds(r, mode) / 1e12


def table(rows: list[dict[str, Any]]) -> Table:
    """Every row: time (ms) and achieved TFLOP/s per mode, or why there is no time."""
    body = []
    for r in (r for r in rows if r["kind"] == "row"):
        cells = [r["dtype"], "yes" if r["causal"] else "no", r["d_head"], f"{r['seq']:,}",
                 r["batch"], r["implementation"]]
        if r["status"] != "ok":
            body.append(cells + [r["status"], "", "", ""])
            continue
        times = [f"{num(seconds(r, m) * 1e3)} ({tflops(rows, r, m):.3g})"
                 if seconds(r, m) > 0 else "below the noise" for m in MODES]
        body.append(cells + times + ["; ".join(r["problems"])[:60]])
    return Table(["dtype", "causal", "d", "seq", "batch", "implementation",
                  "forward ms (TFLOP/s)", "backward", "forward + backward", "note"], body)


def best(rows: list[dict[str, Any]], where: dict[str, Any], mode: str, *,
         prefix: str = "") -> dict[str, Any] | None:
    """The fastest measured row in `mode` among those matching `where` whose implementation
    starts with `prefix`."""
    mine = [r for r in measured(rows) if all(r[k] == v for k, v in where.items())
            and r["implementation"].startswith(prefix)]
    return min(mine, key=lambda r: seconds(r, mode), default=None)


def forward_seconds(rows: list[dict[str, Any]], *, implementation: str = "flash_triton",
                    dtype: str = "bf16", causal: bool = True,
                    d_head: int = 128) -> dict[tuple[int, int], float]:
    """(batch, seq) -> median forward seconds of one implementation and combo, from the rows."""
    return {(r["batch"], r["seq"]): seconds(r, "forward") for r in measured(rows)
            if (r["implementation"], r["dtype"], r["causal"], r["d_head"])
            == (implementation, dtype, causal, d_head)}


def recorded_forward_seconds(accelerator: hardware.Accelerator,
                             **combo: Any) -> dict[tuple[int, int], float]:
    """`forward_seconds` of every GPU record made on `accelerator` (its exact device names)."""
    return {k: v for record in recorded("flash_benchmark")
            if hardware.match_device_name(record["provenance"]["device"]) is accelerator
            for k, v in forward_seconds(record["results"], **combo).items()}


def targets(rows: list[dict[str, Any]], accelerator: hardware.Accelerator | None = None) -> str:
    """The three targets at `TARGET`, read from the rows (needs a GPU record)."""
    ours = next((r for r in measured(rows) if r["implementation"] == "flash_triton"
                 and all(r[k] == v for k, v in TARGET.items())), None)
    if ours is None:
        return (f"no flash_triton row at {TARGET}: the targets are read from a GPU record")
    sdpa_f = best(rows, TARGET, "forward", prefix="sdpa")
    sdpa_fb = best(rows, TARGET, "forward+backward", prefix="sdpa")
    parts = []
    if sdpa_f is not None:
        ratio = seconds(sdpa_f, "forward") / seconds(ours, "forward")
        parts.append(f"forward {ratio:.2f}x the speed of the best SDPA backend "
                     f"({sdpa_f['implementation']}; target >= 1): "
                     f"{'met' if ratio >= 1 else 'missed'}")
    if accelerator is not None:
        peak = accelerator.peak_flop_per_s(TARGET["dtype"])
        share = tflops(rows, ours, "forward") * 1e12 / peak
        parts.append(f"forward at {share:.0%} of the {accelerator.name}'s dense "
                     f"{TARGET['dtype']} peak (target >= 50%): "
                     f"{'met' if share >= 0.5 else 'missed'}")
    if sdpa_fb is not None:
        ratio = seconds(sdpa_fb, "forward+backward") / seconds(ours, "forward+backward")
        parts.append(f"forward + backward {ratio:.2f}x the speed of the best SDPA backend "
                     f"({sdpa_fb['implementation']}; target >= 0.9): "
                     f"{'met' if ratio >= 0.9 else 'missed'}")
    problems = [p for r in (ours, sdpa_f, sdpa_fb) if r for p in r["problems"]]
    return verdict("; ".join(parts), problems)


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Fastest implementation per mode at the longest length of each combo, and where the
    memory ran out."""
    out = []
    combos = dict.fromkeys((r["dtype"], r["causal"], r["d_head"]) for r in measured(rows))
    for dtype, causal, d in combos:
        where = {"dtype": dtype, "causal": causal, "d_head": d}
        seq = max(r["seq"] for r in measured(rows) if all(r[k] == v for k, v in where.items()))
        where["seq"] = seq
        fast = best(rows, where, "forward+backward")
        slow = max((r for r in measured(rows) if all(r[k] == v for k, v in where.items())),
                   key=lambda r: seconds(r, "forward+backward"))
        text = (f"{dtype}, {'causal' if causal else 'not causal'}, d = {d}, {seq:,} tokens: "
                f"{fast['implementation']} fastest ({tflops(rows, fast, 'forward+backward'):.3g} "
                f"TFLOP/s forward + backward), {slow['implementation']} slowest, "
                f"{seconds(slow, 'forward+backward') / seconds(fast, 'forward+backward'):.1f}x "
                "longer")
        out.append(verdict(text, [p for r in (fast, slow) for p in r["problems"]]))
    oom = sorted({(r["implementation"], r["seq"]) for r in rows
                  if r["kind"] == "row" and r["status"] == kit.OUT_OF_MEMORY})
    first: dict[str, int] = {}
    for name, seq in oom:
        first.setdefault(name, seq)
    memory = ("; ".join(f"{n} ran out of memory from {q:,} tokens" for n, q in first.items())
              if first else "nothing ran out of memory")
    return {"speed": "; ".join(out), "memory": memory}


def plot(rows: list[dict[str, Any]], ax, *, dtype: str, causal: bool, d_head: int,
         mode: str = "forward+backward") -> None:
    """Achieved TFLOP/s against length, one line per implementation, for one combo."""
    from mlsys.plotting import CYCLE, MARKERS, finish  # matplotlib: only when a page draws

    mine = [r for r in measured(rows) if (r["dtype"], r["causal"], r["d_head"])
            == (dtype, causal, d_head)]
    for color, marker, name in zip(CYCLE, MARKERS, IMPLEMENTATIONS, strict=False):
        these = [r for r in mine if r["implementation"] == name]
        if these:
            ax.plot([r["seq"] for r in these], [tflops(rows, r, mode) for r in these],
                    marker + "-", color=color, label=name)
    finish(ax, title=f"{mode}: {dtype}, {'causal' if causal else 'not causal'}, d={d_head}",
           xlabel="sequence length", ylabel="TFLOP/s (useful work)", logx=2, logy=True)


EXPERIMENT = Experiment(
    name="flash_benchmark",
    chapter="06_attention",
    description="Triton FlashAttention-2 vs naive, compiled and SDPA backends: time and TFLOP/s",
    gpu_seconds=450,  # 7 lengths ran past 527 s on the H200; 5 now
    sizes=SIZES,
    run=run,
)
