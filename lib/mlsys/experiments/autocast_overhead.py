"""What sets the flat floor of a bf16 autocast step: the weight casts, the extra ops, or neither.

A seed's bf16 table stays flat from 128 to 512 tokens, and its author guessed that "autocast
costs a fixed time". Autocast does add work that does not grow with the tokens: every forward
casts each matmul weight from fp32 to bf16 (read 4 bytes, write 2, per parameter: cached for the
rest of the autocast region and freed after the backward), and every cast is one more op to
launch. This experiment measures both, per preset, on one fp32 model with AdamW:
- op counts per phase (forward, backward, optimizer) with and without autocast, and the casts
  among them with their bytes (`counters.ByteCounter`: every aten op that is not a view; on a GPU
  about one kernel each, the optimizer's fused `_foreach_` ops excepted);
- the forward and the step timed with and without autocast at each length, round-robin with the
  weight casts alone (`w.to(bf16)` for every matmul weight), a copy (the bandwidth those bytes
  move at), a stream of tiny ops (the cost of one op: launch and dispatch) and the model's w1
  matmul at the shortest length in fp32 and in bf16 (how fast this device's bf16 matmuls are);
- how the step follows the tokens: "flat" only when the longest length took less than `FLAT`
  times the shortest's time; between that and the tokens' own ratio, a fixed part plus work,
  the fixed part read off the straight line through the two lengths;
- per preset, sentences built from those numbers (`verdicts`), and `seed_verdict`, which reads the
  seed's own tables (`third_party.CS336_STUDENT_AMP`). Used in: §sec-mixed-precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mlsys import bench, checks, env, third_party
from mlsys.accounting.params import count_params
from mlsys.book import Table, num, verdict
from mlsys.counters import ByteCounter
from mlsys.experiments import Experiment, kit, timing_fields, timing_of
from mlsys.experiments.kit import setup
from mlsys.models.config import PRESETS, TransformerConfig
from mlsys.probes import copy_probe, gemm_probe, op_overhead_probe
from mlsys.training import make_train_step, next_token_loss

RUNS = ("fp32", "bf16 autocast")
FLAT = 1.25
"""A step "flat in the tokens" took less than this many times as long at the longest length."""
PHASES = ("forward", "backward", "optimizer")
OPS_PER_PROBE = 100


@dataclass(frozen=True)
class Sizes:
    presets: tuple[str, ...]
    seqs: tuple[int, ...]  # the first is the floor's length
    batch: int
    copy_bytes: int
    warmup: int
    repeats: int

    def __post_init__(self) -> None:
        for i, p in enumerate(self.presets):
            checks.choice(p, f"presets[{i}]", PRESETS)
        checks.int_sequence(self.seqs, "seqs", minimum=1)
        checks.positive_ints(batch=self.batch, copy_bytes=self.copy_bytes, repeats=self.repeats)
        checks.nonnegative_int(self.warmup, "warmup")


SIZES = {
    "smoke": Sizes(("debug",), (8, 32), 1, 2**22, 1, 3),
    "cpu": Sizes(("debug", "laptop"), (16, 128), 2, 2**26, 1, 5),
    "gpu": Sizes(("small", "large", "xl"), (64, 128, 512), 4, 2**30, 2, 10),
}


def _casts(counter: ByteCounter) -> tuple[int, int]:
    ops = [o for o in counter.ops if o.op == "_to_copy"]
    return len(ops), sum(o.read_bytes + o.write_bytes for o in ops)


def _count(model, optimizer, tokens: torch.Tensor, autocast: bool) -> list[dict[str, Any]]:
    """One step with a `ByteCounter` per phase: ops, casts and their bytes."""
    counters = {phase: ByteCounter() for phase in PHASES}
    with counters["forward"]:
        with torch.autocast(tokens.device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = next_token_loss(model, tokens)
    with counters["backward"]:
        loss.backward()
    with counters["optimizer"]:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    out = []
    for phase, c in counters.items():
        n_casts, cast_bytes = _casts(c)
        out.append({"phase": phase, "ops": len(c.ops), "cast_ops": n_casts,
                    "cast_bytes": cast_bytes})
    return out


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """Per preset: op counts per phase and run, then every timing round-robin."""
    device = device or env.device()
    gen = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = [{"kind": "setup", "device": env.device_name(),
                                   "device_type": device, "batch": s.batch}]
    copy = copy_probe(s.copy_bytes, device=device)
    tiny = op_overhead_probe(1, ops_per_call=OPS_PER_PROBE, device=device)
    for preset in bench.progress(s.presets, desc="presets"):
        cfg = TransformerConfig.preset(preset)
        model = kit.fresh_model(cfg, device)
        optimizer = torch.optim.AdamW(model.parameters())
        weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
        weight_params = sum(w.numel() for w in weights)
        first = torch.randint(cfg.vocab_size, (s.batch, s.seqs[0] + 1), generator=gen)
        make_train_step(model, optimizer, first.to(device))()  # AdamW's moments exist from here
        fns = {"weight casts": lambda weights=weights: [w.to(torch.bfloat16) for w in weights],
               "copy": copy.fn, "tiny ops": tiny.fn}
        for dt in ("fp32", "bf16"):  # the model's w1 matmul at the shortest length
            fns[f"matmul {dt}"] = gemm_probe(s.batch * s.seqs[0], cfg.d_model, cfg.d_ff,
                                             dtype=dt, device=device).fn
        for seq in (q for q in s.seqs if q <= cfg.context_length):
            tokens = torch.randint(cfg.vocab_size, (s.batch, seq + 1), generator=gen).to(device)
            for run_name in RUNS:
                autocast = run_name != "fp32"
                for c in _count(model, optimizer, tokens, autocast):
                    rows.append({"kind": "count", "preset": preset, "seq": seq, "run": run_name,
                                 **c})

                def forward(tokens=tokens, autocast=autocast, model=model) -> None:
                    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
                        model(tokens[:, :-1])

                fns[f"{run_name} forward {seq}"] = forward
                fns[f"{run_name} step {seq}"] = make_train_step(
                    model, optimizer, tokens, autocast_dtype="bf16" if autocast else None)
        timings = bench.benchmark_interleaved(fns, warmup=s.warmup, repeats=s.repeats,
                                              device=device)
        rows.append({"kind": "preset", "preset": preset, "n_layers": cfg.n_layers,
                     "matmul_weights": len(weights), "matmul_weight_params": weight_params,
                     "weight_cast_bytes": 6 * weight_params,  # read fp32, write bf16
                     "copy_bytes_moved": copy.work, "ops_per_probe": OPS_PER_PROBE,
                     "problems": bench.noise_problems(timings),
                     "timings": {name: timing_fields(t) for name, t in timings.items()}})
        del model, optimizer, weights, fns
        kit.free(device)
    return rows


# --- reading the rows (live or recorded) ----------------------------------------------------------


def presets(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["preset"]: r for r in rows if r["kind"] == "preset"}


def counts(rows: list[dict[str, Any]], preset: str, seq: int, run: str) -> dict[str, dict]:
    """Phase -> its count row."""
    return {r["phase"]: r for r in rows if r["kind"] == "count"
            and (r["preset"], r["seq"], r["run"]) == (preset, seq, run)}


def seconds(p: dict[str, Any], name: str) -> float:
    return timing_of(p["timings"][name]).median_s


def costs(p: dict[str, Any]) -> dict[str, float]:
    """The measured unit costs of a preset's run: copy bandwidth (bytes/s, read + write), seconds
    per tiny op, the weight casts' seconds and their prediction from the bandwidth."""
    bandwidth = p["copy_bytes_moved"] / seconds(p, "copy")
    return {"bytes_per_s": bandwidth, "op_s": seconds(p, "tiny ops") / p["ops_per_probe"],
            "casts_s": seconds(p, "weight casts"),
            "casts_predicted_s": p["weight_cast_bytes"] / bandwidth}


def matmul_speedup(p: dict[str, Any]) -> float | None:
    """fp32 time / bf16 time of a preset's w1 matmul probe (None in records without it)."""
    if not {"matmul fp32", "matmul bf16"} <= set(p["timings"]):
        return None
    return seconds(p, "matmul fp32") / seconds(p, "matmul bf16")


def table(rows: list[dict[str, Any]]) -> Table:
    """Per preset, length and run: ops per phase (casts among them), forward and step ms."""
    body = []
    for name, p in presets(rows).items():
        seqs = sorted({r["seq"] for r in rows if r["kind"] == "count" and r["preset"] == name})
        for seq in seqs:
            for run in RUNS:
                c = counts(rows, name, seq, run)
                ops = " / ".join(str(c[ph]["ops"]) for ph in PHASES)
                casts = " / ".join(str(c[ph]["cast_ops"]) for ph in PHASES)
                body.append([name, seq, run, ops, casts,
                             num(sum(c[ph]["cast_bytes"] for ph in PHASES) / 1e6),
                             num(seconds(p, f"{run} forward {seq}") * 1e3),
                             num(seconds(p, f"{run} step {seq}") * 1e3)])
    return Table(["preset", "seq", "run", "ops fwd / bwd / opt", "casts fwd / bwd / opt",
                  "cast MB", "forward ms", "step ms"], body)


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Per preset, at its shortest length: autocast's extra ops and cast bytes, what they cost at
    the measured unit costs; then how the step grew to the longest length: "follows its work"
    from 0.8x the tokens' ratio up, "not flat" with the fixed part of the line through both
    lengths from `FLAT` up, and below `FLAT` "flat", with the part that sets the floor (the
    weight casts or bare launches where either is half the step). Withheld when noisy."""
    out = {}
    cpu = setup(rows)["device_type"] == "cpu"
    for name, p in presets(rows).items():
        seqs = sorted({r["seq"] for r in rows if r["kind"] == "count" and r["preset"] == name})
        seq = seqs[0]
        f32, amp = counts(rows, name, seq, "fp32"), counts(rows, name, seq, "bf16 autocast")
        ops32 = sum(c["ops"] for c in f32.values())
        ops16 = sum(c["ops"] for c in amp.values())
        cast_bytes = sum(c["cast_bytes"] for c in amp.values())
        k = costs(p)
        t32, t16 = (seconds(p, f"{run} step {seq}") for run in RUNS)
        launch_share, casts_share = ops16 * k["op_s"] / t16, k["casts_s"] / t16
        text = (f"{name} at {seq} tokens: a bf16 autocast step runs {ops16} ops against fp32's "
                f"{ops32} (+{ops16 - ops32}, {ops16 / ops32 - 1:.0%}), {amp['forward']['cast_ops']}"
                f" of them casts in the forward, moving {num(cast_bytes / 1e6)} MB in all. The "
                f"weight casts alone take {num(k['casts_s'] * 1e3)} ms "
                f"({num(k['casts_predicted_s'] * 1e3)} ms at the measured copy bandwidth); at the "
                f"measured {num(k['op_s'] * 1e6)} µs per bare op, the {ops16} ops cost "
                f"{num(ops16 * k['op_s'] * 1e3)} ms, autocast's extra ones "
                f"{num((ops16 - ops32) * k['op_s'] * 1e3)} ms. The step took {num(t16 * 1e3)} ms "
                f"(fp32: {num(t32 * 1e3)} ms): bare op launches are {launch_share:.0%} of it, "
                f"the weight casts {casts_share:.0%}")
        grew = seconds(p, f"bf16 autocast step {seqs[-1]}") / t16 if len(seqs) > 1 else None
        tokens = seqs[-1] / seq
        if grew is not None:
            text += f"; at {seqs[-1]} tokens ({tokens:.0f}x) it took {grew:.2f}x as long"
        if grew is None:
            text += ": one length only, so nothing is said about a floor"
        elif grew >= 0.8 * tokens:
            text += ": the step follows its work"
        elif grew >= FLAT:
            fixed = t16 - (grew - 1) * t16 / (tokens - 1)  # the line through both lengths, at 0
            text += (f": not flat (that needs under {FLAT}x), and less than the {tokens:.0f}x of "
                     f"the tokens: a fixed part of about {num(fixed * 1e3)} ms (the line through "
                     "both lengths, at zero tokens) plus work that grows with them")
        elif casts_share >= 0.5:
            text += ": flat, and the floor is the weight casts"
        elif launch_share >= 0.5:
            text += ": flat, and the floor is launching ops"
        else:
            text += (f": flat in the tokens (under {FLAT}x), yet neither the casts nor bare "
                     f"launches fill it; the rest is the framework's cost per op (Python, "
                     f"autograd, dispatch: {num(t16 / ops16 * 1e6)} µs per op at this floor; "
                     f"fp32's step {num(t32 / ops32 * 1e6)} µs)")
        speedup = matmul_speedup(p)
        if cpu and speedup is not None:
            text += (f" (a CPU, where the model's w1 matmul ran {speedup:.2f}x as fast in bf16 "
                     "as in fp32 in the same rounds)")
        out[name] = verdict(text, p["problems"])
    return out


def seed_verdict() -> str:
    """What the seed's own tables say about "a fixed cost of autocast": the floor's height in
    fp32 and bf16 of the same session, and how it compares across presets."""
    rows = {(r.preset, r.seq, r.precision): r for r in third_party.CS336_STUDENT_AMP}
    large_bf16, large_fp32 = rows[("large", 128, "bf16")], rows[("large", 128, "fp32")]
    big = rows[("2.7B", 128, "bf16")]
    layers = TransformerConfig.preset("2.7B").n_layers / TransformerConfig.preset("large").n_layers
    params = count_params(TransformerConfig.preset("2.7B")) / count_params(
        TransformerConfig.preset("large"))
    flat = rows[("large", 512, "bf16")].forward_s / large_bf16.forward_s
    return (f"in the seed's own session the large preset's forward took "
            f"{large_fp32.forward_s * 1e3:.0f} ms in fp32 and {large_bf16.forward_s * 1e3:.0f} ms"
            f" in bf16 at 128 tokens: the floor is there without autocast too. Its bf16 forward "
            f"took {flat:.2f}x as long at 512 tokens as at 128, and the 2.7B preset "
            f"({params:.1f}x the parameters to cast, {layers:.2f}x the layers) took "
            f"{big.forward_s / large_bf16.forward_s:.2f}x the large preset's time: the floor "
            f"follows the number of layers (ops), not the bytes of weights to cast")


EXPERIMENT = Experiment(
    name="autocast_overhead",
    chapter="07_mixed_precision",
    description="op counts, weight-cast bytes and per-op cost of autocast: what sets bf16's floor",
    gpu_seconds=100,
    sizes=SIZES,
    run=run,
)
