"""What autocast really does to dtypes, recorded on this device rather than read in a document.

`dtype_recorder.DtypeRecorder` watches one forward and backward under `torch.autocast` (bf16 and
fp16) of two models: the seed's toy model (fc1 -> ReLU -> LayerNorm -> fc2, fp32 parameters) and the
book's Transformer. Per module it records the parameters' dtype, the dtype its matmuls read, its
input and output, the gradient flowing back into it, and its parameters' gradients (stored dtype
and the narrowest format that holds their values); the loss's dtype too. CPU and CUDA autocast
keep different op lists (on a CPU, LayerNorm after a bf16 matmul runs in bf16; CUDA's list runs
layer_norm in fp32), so the same function gives each device's own table; `seed_check` compares
it with the seed's answer for fp16 on a GPU; `dtype_map` and `map_panels` shape the rows of a few
modules for `mlsys.diagrams.precision.draw_autocast_map`, the live run beside the GPU record.
Used in: §sec-mixed-precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mlsys import checks, env
from mlsys.book import Table
from mlsys.dtypes import torch_dtype
from mlsys.experiments import Experiment, kit
from mlsys.models.config import PRESETS, TransformerConfig
from mlsys.numerics.dtype_recorder import DtypeRecorder
from mlsys.training import next_token_loss

DTYPES = ("bf16", "fp16")
SEED_FP16_ANSWER = {"parameters": "fp32", "fc1 output": "fp16", "ln output": "fp32",
                    "logits": "fp16", "loss": "fp32", "gradients": "fp32"}
"""The seed's answer for fp16 autocast on a GPU (its part (a)), item by item."""


class ToyModel(nn.Module):
    """The seed's toy model: fc1 (no bias) -> ReLU -> LayerNorm(10) -> fc2 (no bias)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        checks.positive_ints(in_features=in_features, out_features=out_features)
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.ln(self.relu(self.fc1(x))))


@dataclass(frozen=True)
class Sizes:
    toy_in: int
    toy_out: int
    toy_batch: int
    preset: str
    batch: int
    seq: int

    def __post_init__(self) -> None:
        checks.positive_ints(toy_in=self.toy_in, toy_out=self.toy_out, toy_batch=self.toy_batch,
                             batch=self.batch, seq=self.seq)
        checks.choice(self.preset, "preset", PRESETS)


SIZES = {
    "smoke": Sizes(8, 4, 16, "debug", 2, 8),
    "cpu": Sizes(64, 16, 256, "debug", 4, 64),
    "gpu": Sizes(64, 16, 256, "small", 4, 128),
}


def record(model: nn.Module, loss_fn, dtype: str, device: str) -> DtypeRecorder:
    """`loss_fn(model)` under autocast to `dtype` on `device`, then its backward, recorded."""
    checks.choice(dtype, "dtype", DTYPES)
    model.zero_grad(set_to_none=True)
    with DtypeRecorder(model) as rec:
        with torch.autocast(device, dtype=torch_dtype(dtype)):
            loss = rec.note("loss", loss_fn(model))
        loss.backward()
    return rec


def _rows(rec: DtypeRecorder, model_name: str, dtype: str) -> list[dict[str, Any]]:
    header = rec.table().header
    out = [{"kind": "module", "model": model_name, "autocast": dtype,
            **dict(zip(header, row, strict=True))} for row in rec.table().rows]
    out.append({"kind": "loss", "model": model_name, "autocast": dtype,
                "dtype": rec.notes["loss"]})
    return out


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """The recorder's rows for both models under each autocast dtype."""
    device = device or env.device()
    gen = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = [{"kind": "setup", "device": env.device_name(),
                                   "device_type": device}]
    x = torch.randn(s.toy_batch, s.toy_in, generator=gen).to(device)
    y = torch.randint(s.toy_out, (s.toy_batch,), generator=gen).to(device)
    cfg = TransformerConfig.preset(s.preset)
    tokens = torch.randint(cfg.vocab_size, (s.batch, s.seq + 1), generator=gen).to(device)
    torch.manual_seed(0)
    toy = ToyModel(s.toy_in, s.toy_out).to(device)
    book = kit.fresh_model(cfg, device)
    for dtype in DTYPES:
        rows += _rows(record(toy, lambda m: F.cross_entropy(m(x), y), dtype, device), "toy",
                      dtype)
        rows += _rows(record(book, lambda m: next_token_loss(m, tokens), dtype, device),
                      "transformer", dtype)
    return rows


# --- reading the rows (live or recorded) ----------------------------------------------------------


def module(rows: list[dict[str, Any]], model: str, dtype: str, path: str) -> dict[str, Any]:
    return next(r for r in rows if r["kind"] == "module" and
                (r["model"], r["autocast"], r["module"]) == (model, dtype, path))


def loss_dtype(rows: list[dict[str, Any]], model: str, dtype: str) -> str:
    return next(r["dtype"] for r in rows if r["kind"] == "loss" and
                (r["model"], r["autocast"]) == (model, dtype))


def table(rows: list[dict[str, Any]], *, model: str = "toy") -> Table:
    """The recorder's module rows of `model` ("toy" or "transformer"), both autocast dtypes, the
    loss's dtype as a last row per dtype."""
    checks.choice(model, "model", ("toy", "transformer"))
    mine = [r for r in rows if r["kind"] == "module" and r["model"] == model]
    header = [k for k in mine[0] if k not in ("kind", "model")]
    body = [[r[k] for k in header] for r in mine]
    for dtype in DTYPES:
        body.append([dtype, "(loss)", "", "", "", "", loss_dtype(rows, model, dtype), "", ""])
    return Table(header, body)


def seed_check(rows: list[dict[str, Any]]) -> dict[str, str]:
    """The seed's fp16 answer item by item against this device's fp16 record of the toy model:
    item -> "measured X (the seed: Y)"."""
    fc1, ln, fc2 = (module(rows, "toy", "fp16", p) for p in ("fc1", "ln", "fc2"))
    grads = {g.split("/")[0] for r in (fc1, ln, fc2) for g in
             r["parameter grads (stored/exact in)"].split(", ")}
    measured = {"parameters": ", ".join(sorted({fc1["parameters"], ln["parameters"]})),
                "fc1 output": fc1["output"], "ln output": ln["output"], "logits": fc2["output"],
                "loss": loss_dtype(rows, "toy", "fp16"), "gradients": ", ".join(sorted(grads))}
    return {item: (f"measured {measured[item]} (the seed: {claim})" if measured[item] != claim
                   else f"measured {measured[item]}, as the seed says")
            for item, claim in SEED_FP16_ANSWER.items()}


MAP_MODULES = {"toy": ("fc1", "relu", "ln", "fc2"),
               "transformer": ("blocks.0.attn_norm", "blocks.0.attn.q_proj", "blocks.0.attn.o_proj",
                               "blocks.0.ffn_norm", "blocks.0.ffn.w1", "blocks.0.ffn.w2",
                               "lm_head")}
"""The modules the autocast map shows: the seed's toy model, and one block and the head of the
book's model (the other blocks repeat it)."""
MAP_COLUMNS = {"weights": "parameters", "matmul reads": "matmul reads", "output": "output",
               "weight grads stored/values": "parameter grads (stored/exact in)"}
"""The map's columns: its label -> the recorder's column."""
MAP_PREFIX = {"toy": "toy", "transformer": "LM"}


def dtype_map(rows: list[dict[str, Any]], *, dtype: str = "fp16") -> dict[str, dict[str, str]]:
    """Row label -> map column -> dtype for the modules of `MAP_MODULES` and each model's loss,
    from `run`'s rows (live or recorded) under autocast to `dtype`; repeated entries of a cell
    ("fp32/fp32, fp32/fp32") are given once."""
    checks.choice(dtype, "dtype", DTYPES)
    out: dict[str, dict[str, str]] = {}
    for model, paths in MAP_MODULES.items():
        for path in paths:
            r = module(rows, model, dtype, path)
            label = f"{MAP_PREFIX[model]} {path.rsplit('.', 1)[-1]} ({r['type']})"
            out[label] = {col: ", ".join(dict.fromkeys(r[key].split(", ")))
                          for col, key in MAP_COLUMNS.items()}
        out[f"{MAP_PREFIX[model]} loss"] = {col: "-" for col in MAP_COLUMNS} | {
            "output": loss_dtype(rows, model, dtype)}
    return out


def map_panels(live: list[dict[str, Any]], recorded: list[dict[str, Any]] | None = None, *,
               dtype: str = "fp16") -> dict[str, dict[str, dict[str, str]]]:
    """Panel title -> `dtype_map`: the live rows of this device, then those of each record
    (`mlsys.experiments.recorded("autocast_dtypes")`: dicts with "provenance" and "results")."""
    panels = {f"{live[0]['device_type']} (live, {dtype} autocast)": dtype_map(live, dtype=dtype)}
    for record in recorded or []:
        title = f"{record['provenance']['device']} (recorded)"
        panels[title] = dtype_map(record["results"], dtype=dtype)
    return panels


EXPERIMENT = Experiment(
    name="autocast_dtypes",
    chapter="07_mixed_precision",
    description="dtype of every parameter, activation, loss and gradient under autocast, recorded",
    gpu_seconds=15,
    sizes=SIZES,
    run=run,
)
