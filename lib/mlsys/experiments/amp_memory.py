"""Memory under mixed precision: why a forward-only peak can rise under autocast while the
training peak does not fall by half.

For each preset and run (fp32, bf16 autocast, pure bf16: the policies of `experiments.amp_speed`)
one fresh model takes a warm-up step (AdamW makes its moments), then the allocator is read
(`memory_meter.meter`: the CPU profiler's events or the CUDA allocator) around a forward pass
without gradients (inference) and around the phases of a training step. Beside the readings, the
counts that explain them: model-state bytes from the policy's recipe, the bytes autograd saves
for backward (`counters.SavedTensors`), and the bf16 copies autocast makes of every matmul
weight (2 bytes per weight parameter), which its cache keeps until the autocast region ends,
gradients or not.

What autocast saves is counted by `autocast_saved_bytes`, a closed form built on
`accounting.activations.saved_bytes` and checked to the byte against the counter (tests, and
`verdicts` on every run it reads): it is not the bf16 model's count, since autocast keeps fp32
weights and a residual stream in fp32. `napkin` prices the recipes of the chapter's napkin math,
autocast among them, from those counts; `recipe_table` lists the policies' model states. The
module is a little over 300 lines: the measurement, its closed form and the napkin that uses
both stay together. Used in: §sec-mixed-precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mlsys import checks, env
from mlsys.accounting import activations, memory
from mlsys.accounting.params import config_sizes, count_params
from mlsys.book import Table, num
from mlsys.counters import SavedTensors
from mlsys.dtypes import torch_dtype
from mlsys.experiments import Experiment, kit
from mlsys.experiments.amp_speed import RUNS
from mlsys.experiments.kit import setup
from mlsys.models.config import PRESETS, TransformerConfig
from mlsys.policies import POLICIES
from mlsys.profiling import memory_meter
from mlsys.training import make_policy_step, next_token_loss, policy

PHASES = ("inference forward", "forward", "backward", "optimizer step")


@dataclass(frozen=True)
class Sizes:
    presets: tuple[str, ...]
    batch: int
    seq: int

    def __post_init__(self) -> None:
        for i, p in enumerate(self.presets):
            checks.choice(p, f"presets[{i}]", PRESETS)
        checks.positive_ints(batch=self.batch, seq=self.seq)


SIZES = {
    "smoke": Sizes(("debug",), 1, 8),
    "cpu": Sizes(("debug", "laptop"), 4, 128),
    "gpu": Sizes(("small", "medium", "large", "xl"), 4, 512),
}


def matmul_weight_params(cfg: TransformerConfig) -> int:
    """Entries of every matmul weight (q, k, v, o, w1, w3, w2 per block, and the head): what
    autocast casts and caches, 2 bytes each in bf16 or fp16."""
    n_layers, d, f, v = config_sizes(cfg, "n_layers", "d_model", "d_ff", "vocab_size")
    return n_layers * (4 * d * d + 3 * d * f) + d * v


def autocast_saved_bytes(cfg: TransformerConfig, batch: int, seq: int, *,
                         device_type: str = "cuda", attention: str | None = None) -> int:
    """Bytes autograd saves for backward when an fp32 model runs `next_token_loss` under 16-bit
    autocast, the token ids included (`activations.saved_bytes` counts them; the experiment's
    counter excludes them). Per block, the 16-bit model's count (`saved_bytes(dtype="bf16")`:
    each RMSNorm keeps x, x/rms and 1/rms in fp32 there too, two (N, D) tensors and a column)
    plus what autocast adds, b = 2 bytes, N = batch x seq:
    - every projection casts its own input: q, k and v save three 16-bit copies of the normed x
      where a 16-bit model saves one storage, w1 and w3 two copies of theirs: + 3 N D b;
    - RoPE's fp32 cos and sin tables cast for q and again for k: + 4 seq (d_head / 2) b;
    - on CUDA, softmax is on autocast's fp32 list: naive attention keeps its probabilities in
      fp32 and the 16-bit copy that P @ V reads, 6 bytes an entry where a 16-bit model keeps 2:
      + 4 batch n_heads seq^2 (CPU autocast leaves softmax in the input's dtype);
    and once, the cached 16-bit copy of every matmul weight: + 2 `matmul_weight_params`."""
    checks.choice(device_type, "device_type", ("cpu", "cuda"))
    base = activations.saved_bytes(cfg, batch, seq, dtype="bf16", attention=attention)
    n_layers, d, h = config_sizes(cfg, "n_layers", "d_model", "n_heads")
    block = 3 * batch * seq * d * 2 + 4 * seq * (d // h // 2) * 2
    if device_type == "cuda" and base.attention == "naive":
        block += 4 * batch * h * seq * seq
    return base.total_bytes + n_layers * block + 2 * matmul_weight_params(cfg)


NAPKIN = {"fp32 AdamW": ("fp32_adamw", "fp32"), "bf16 autocast": ("fp32_adamw", "autocast"),
          "bf16 mixed AdamW": ("bf16_mixed_adamw", "bf16"),
          "pure bf16 AdamW": ("bf16_pure_adamw", "bf16")}
"""The napkin's recipes: label -> (the `accounting.memory` recipe of its model states, how its
activations are saved: a model dtype, or "autocast" of an fp32 model). "bf16 autocast" holds
fp32 AdamW's states; "bf16 mixed AdamW" stores bf16 weights beside an fp32 master copy."""


def napkin(cfg: TransformerConfig, batch: int, seq: int, *,
           device_type: str = "cuda") -> dict[str, dict[str, Any]]:
    """Per recipe of `NAPKIN`: its model states (bytes per parameter times the parameters), the
    bytes saved for backward (`activations.saved_bytes` in the model's dtype, or
    `autocast_saved_bytes` on `device_type`), their sum, and the dtype its matmuls run in."""
    n = count_params(cfg)
    out = {}
    for label, (states, acts) in NAPKIN.items():
        saved = (autocast_saved_bytes(cfg, batch, seq, device_type=device_type)
                 if acts == "autocast" else
                 activations.saved_bytes(cfg, batch, seq, dtype=acts).total_bytes)
        out[label] = {"recipe": states, "states_bytes": memory.model_state_bytes(n, states),
                      "saved_bytes": saved, "matmul_dtype": "fp32" if acts == "fp32" else "bf16"}
        out[label]["total_bytes"] = out[label]["states_bytes"] + saved
    return out


def napkin_table(recipes: dict[str, dict[str, Any]]) -> Table:
    """`napkin`'s recipes: states (as which recipe), saved activations and their sum (GB), each
    against the first recipe's (fp32)."""
    ref = next(iter(recipes.values()))
    return Table(["recipe", "states as", "model states (GB)", "saved activations (GB)",
                  "vs fp32", "sum (GB)", "vs fp32"],
                 [[label, f"`{r['recipe']}`", num(r["states_bytes"] / 1e9),
                   num(r["saved_bytes"] / 1e9), f"{r['saved_bytes'] / ref['saved_bytes']:.2f}x",
                   num(r["total_bytes"] / 1e9), f"{r['total_bytes'] / ref['total_bytes']:.2f}x"]
                  for label, r in recipes.items()])


def napkin_facts(cfg: TransformerConfig, batch: int, seq: int, *,
                 device_type: str = "cuda") -> dict[str, float]:
    """The ratios the napkin's prose quotes: each 16-bit recipe's saved activations ("_act") and
    step total ("_over_fp32") against fp32's, for bf16 weights ("mixed") and autocast ("amp");
    autocast's activations against fp32's with SDPA attention ("amp_sdpa"); and the GB that the
    RMSNorms keep in fp32 in the bf16 model (x, x/rms and 1/rms of every norm of the blocks)."""
    n = napkin(cfg, batch, seq, device_type=device_type)
    ref = n["fp32 AdamW"]
    bf16 = activations.saved_bytes(cfg, batch, seq, dtype="bf16")
    sdpa = activations.saved_bytes(cfg, batch, seq, attention="sdpa").total_bytes
    out = {}
    for key, label in (("mixed", "bf16 mixed AdamW"), ("amp", "bf16 autocast")):
        out[f"{key}_act"] = n[label]["saved_bytes"] / ref["saved_bytes"]
        out[f"{key}_over_fp32"] = n[label]["total_bytes"] / ref["total_bytes"]
    out["amp_sdpa"] = autocast_saved_bytes(cfg, batch, seq, device_type=device_type,
                                           attention="sdpa") / sdpa
    out["norms_gb"] = bf16.n_layers * sum(v for k, v in bf16.components().items()
                                          if k.endswith("norm")) / 1e9
    return out


def recipe_table(cfg: TransformerConfig) -> Table:
    """Every policy of `mlsys.policies` (one name with its `accounting.memory` recipe): its
    dtypes, optimizer, bytes per parameter and `cfg`'s model states in GB."""
    n = count_params(cfg)
    return Table(["policy = recipe", "weights", "gradients", "master", "optimizer", "B/param",
                  "states (GB)"],
                 [[f"`{name}`", pol.param_dtype, pol.grad_dtype, pol.master_dtype or "-",
                   pol.optimizer, memory.recipe(name).bytes_per_param,
                   num(memory.model_state_bytes(n, name) / 1e9)]
                  for name, pol in POLICIES.items()])


def predicted_saved_bytes(preset: str, run: str, batch: int, seq: int, device_type: str) -> int:
    """What the counter of `run` should read for `preset`: `autocast_saved_bytes` or
    `activations.saved_bytes` in the policy's weight dtype, less the token ids (excluded)."""
    cfg = TransformerConfig.preset(preset)
    name, autocast = RUNS[run]
    total = (autocast_saved_bytes(cfg, batch, seq, device_type=device_type) if autocast else
             activations.saved_bytes(cfg, batch, seq,
                                     dtype=policy(name).param_dtype).total_bytes)
    return total - batch * (seq + 1) * 8


def _measure(meter, preset: str, label: str, s: Sizes, device: str) -> dict[str, Any]:
    name, autocast = RUNS[label]
    cfg = TransformerConfig.preset(preset)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(cfg.vocab_size, (s.batch, s.seq + 1), generator=gen).to(device)
    model = kit.fresh_model(cfg, device)
    step = make_policy_step(model, tokens, policy(name, autocast=autocast))
    step()  # the moments exist from here on
    model.zero_grad(set_to_none=True)
    chosen, low = step.policy, torch_dtype(step.policy.compute_dtype)
    counter = SavedTensors(model, exclude=[tokens])
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    labels = {"kind": "phase", "preset": preset, "run": label}
    with meter.recording():
        with meter.phase("inference forward", **labels), torch.no_grad():
            with torch.autocast(device, dtype=low, enabled=chosen.autocast):
                model(tokens[:, :-1])
        with meter.phase("forward", **labels), counter:
            with torch.autocast(device, dtype=low, enabled=chosen.autocast):
                loss = next_token_loss(model, tokens)
        with meter.phase("backward", **labels):
            loss.backward()
            del loss
        with meter.phase("optimizer step", **labels):
            step.optimizer.step()
    n = count_params(cfg)
    row = {"kind": "run", "preset": preset, "run": label, "policy": name, "n_params": n,
           "states_bytes": n * sum(chosen.breakdown().values()),
           "resident_bytes": n * (sum(chosen.breakdown().values()) - chosen.breakdown()["grads"]),
           "cast_cache_bytes": 2 * linear if chosen.autocast else 0,
           "saved_bytes": counter.activation_bytes, "status": "ok"}
    del model, step, counter
    return row


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """Every preset x run: its counts (a "run" row) and its phases (the meter's rows)."""
    device = device or env.device()
    meter = memory_meter.meter(device)
    rows: list[dict[str, Any]] = [{"kind": "setup", "device": env.device_name(),
                                   "device_type": device, "method": meter.method,
                                   "batch": s.batch, "seq": s.seq}]
    for preset in s.presets:
        for label in RUNS:
            with kit.OutOfMemory() as oom:
                rows.append(_measure(meter, preset, label, s, device))
            if oom.happened:
                rows.append({"kind": "run", "preset": preset, "run": label,
                             "status": kit.OUT_OF_MEMORY})
            kit.free(device)
    return rows + meter.rows


# --- reading the rows (live or recorded) ----------------------------------------------------------


def runs(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(preset, run) -> its run row, measured ones only."""
    return {(r["preset"], r["run"]): r for r in rows if r["kind"] == "run" and r["status"] == "ok"}


def peak(rows: list[dict[str, Any]], preset: str, run: str, phase: str) -> int:
    """Peak bytes during `phase` above what was allocated when the recording began: the
    resident weights, master copy, optimizer moments, buffers and batch (no gradients yet)."""
    return next(r["peak_bytes"] for r in rows if r["kind"] == "phase" and
                (r["preset"], r["run"], r["phase"]) == (preset, run, phase))


def table(rows: list[dict[str, Any]]) -> Table:
    """Per preset and run: model states, saved activations, cast cache (counted) and the peaks
    above the resident state during the inference forward and the training step (MB)."""
    body = []
    for (preset, run), r in runs(rows).items():
        step_peak = max(peak(rows, preset, run, ph) for ph in PHASES[1:])
        body.append([preset, run, num(r["states_bytes"] / 1e6), num(r["saved_bytes"] / 1e6),
                     num(r["cast_cache_bytes"] / 1e6),
                     num(peak(rows, preset, run, "inference forward") / 1e6),
                     num(step_peak / 1e6), f"{r['saved_bytes'] / r['states_bytes']:.2f}"])
    return Table(["preset", "run", "model states MB", "saved for backward MB",
                  "autocast weight copies MB", "inference forward peak MB",
                  "training step peak MB", "activations / states"], body)


def inference_verdict(rows: list[dict[str, Any]]) -> str:
    """Every preset's no-grad forward under autocast against fp32: the peaks above the resident
    state, and where autocast's peak rose, how much of the rise its cached weight copies are;
    where it did not, that the halved activations outweighed them."""
    rs = runs(rows)
    parts, rose = [], []
    for preset in dict.fromkeys(p for p, _ in rs):
        if (preset, "fp32") not in rs or (preset, "bf16 autocast") not in rs:
            continue
        p32, pamp = (peak(rows, preset, run, "inference forward") for run in ("fp32",
                                                                             "bf16 autocast"))
        copies = rs[(preset, "bf16 autocast")]["cast_cache_bytes"]
        text = (f"{preset} peaked {num(pamp / 1e6)} MB above its resident state under bf16 "
                f"autocast against {num(p32 / 1e6)} MB in fp32 ({pamp / p32:.2f}x), its cached "
                f"bf16 weight copies {num(copies / 1e6)} MB")
        if pamp > p32:
            rose.append(preset)
            text += f", {copies / (pamp - p32):.2f}x the rise of {num((pamp - p32) / 1e6)} MB"
        else:
            text += ": no rise, the halved activations outweigh the copies"
        parts.append(text)
    where = (f"autocast's forward needs more memory than fp32's for {', '.join(rose)}, where "
             "the weight copies outweigh the activations it halves" if rose else
             "no preset's forward rose under autocast here: the activations outweigh the weight "
             "copies")
    return "; ".join(parts) + f". So {where}"


def saved_verdict(rows: list[dict[str, Any]]) -> str:
    """The bytes saved for backward per preset, autocast and pure bf16 against fp32, and whether
    every count equals its closed form (`predicted_saved_bytes`)."""
    rs, s = runs(rows), setup(rows)
    ratios, misses = [], []
    for preset in dict.fromkeys(p for p, _ in rs):
        f32 = rs.get((preset, "fp32"))
        mine = {run: rs[(preset, run)] for run in RUNS if (preset, run) in rs}
        for run, r in mine.items():
            want = predicted_saved_bytes(preset, run, s["batch"], s["seq"], s["device_type"])
            if r["saved_bytes"] != want:
                misses.append(f"{preset} {run} {r['saved_bytes'] / want:.3f}x")
        if f32 is not None:
            ratios.append(f"{preset} " + ", ".join(
                f"{run} {mine[run]['saved_bytes'] / f32['saved_bytes']:.2f}x"
                for run in mine if run != "fp32"))
    check = ("every count equals `autocast_saved_bytes` or `activations.saved_bytes` to the byte"
             if not misses else "counted against the closed forms: " + ", ".join(misses))
    return f"saved for backward, against fp32: {'; '.join(ratios)} ({check})"


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """"inference": `inference_verdict`; "training": the largest preset's step peak with the
    model states counted in, and why it does not halve; "saved": `saved_verdict`; "split":
    activations against states by preset."""
    rs = runs(rows)
    preset = max((p for p, run in rs if run == "fp32"), key=lambda p: rs[(p, "fp32")][
        "saved_bytes"])
    f32, amp, pure = (rs.get((preset, run)) for run in RUNS)

    def total(r: dict[str, Any], run: str) -> int:  # resident states + the step's peak above them
        return r["resident_bytes"] + max(peak(rows, preset, run, ph) for ph in PHASES[1:])

    t32, tamp = total(f32, "fp32"), total(amp, "bf16 autocast")
    training = (f"{preset}'s training step, the resident states counted in, peaks at "
                f"{num(tamp / 1e6)} MB under autocast against {num(t32 / 1e6)} MB in fp32 "
                f"({tamp / t32:.2f}x): the states stay {num(amp['states_bytes'] / 1e6)} MB (fp32 "
                f"weights, gradients and moments), and the bytes saved for backward go from "
                f"{num(f32['saved_bytes'] / 1e6)} to {num(amp['saved_bytes'] / 1e6)} MB "
                f"({amp['saved_bytes'] / f32['saved_bytes']:.2f}x, the cast weights included)")
    if pure is not None:
        training += (f"; pure bf16 peaks at {num(total(pure, 'pure bf16') / 1e6)} MB "
                     f"({total(pure, 'pure bf16') / t32:.2f}x)")
    split = ", ".join(f"{p}: {r['saved_bytes'] / r['states_bytes']:.2f}x" for (p, run), r in
                      rs.items() if run == "fp32")
    return {"inference": inference_verdict(rows), "training": training,
            "saved": saved_verdict(rows),
            "split": f"fp32 activations saved for backward / model states: {split}"}


def show(record: dict[str, Any]) -> str:
    """A record's verdicts, for the page's recorded results (`experiments.show_records`)."""
    text = verdicts(record["results"])
    return f"Inference: {text['inference']}. {text['saved'][0].upper()}{text['saved'][1:]}."


EXPERIMENT = Experiment(
    name="amp_memory",
    chapter="07_mixed_precision",
    description="inference and training peaks under fp32, bf16 autocast, pure bf16; cast cache",
    gpu_seconds=30,
    sizes=SIZES,
    run=run,
)
