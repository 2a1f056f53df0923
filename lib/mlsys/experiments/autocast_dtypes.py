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

Op by op, `op_lists` asks torch itself which of autocast's lists an op is on, for a device type:
the dtype its output gets from fp32 inputs (16-bit: the lower-precision list) and from 16-bit
inputs (fp32: the fp32 list), and, for the rest, whether the dispatcher holds an autocast kernel
for it (a "promote" op casts its inputs to the widest; an op on no list runs in its inputs' dtype,
mixed inputs following ordinary type promotion). CUDA's lists are read on any machine: without a
GPU the ops run on fake CUDA tensors (`torch._subclasses.FakeTensorMode`: shapes and dtypes, no
data), through the same autocast dispatch; `op_record_agreement` checks them against a record's
module dtypes. `SEED_LISTS` is a seed's three lists (CS336 assignment 2, 003-4(a));
`seed_list_errors` names each op that this torch puts on another list. It is longer than 300
lines because the module dtypes and the op lists that explain them are read together.
Used in: §sec-mixed-precision.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
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
        rows += op_lists(dtype, device_type=torch.device(device).type)
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


def seed_table(rows: list[dict[str, Any]]) -> Table:
    """`seed_check` of `rows` as a table: item, measured against the seed's answer."""
    return Table(["item (fp16 autocast)", "measured here, against the seed's answer"],
                 [[k, v] for k, v in seed_check(rows).items()])


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


# --- autocast's op lists, asked of torch op by op -------------------------------------------------

OPS: dict[str, tuple[str, Callable[..., torch.Tensor]]] = {
    "linear": ("aten::linear", lambda a, b: F.linear(a, b)),
    "matmul": ("aten::matmul", lambda a, b: a @ b),
    "layer_norm": ("aten::layer_norm", lambda a, b: F.layer_norm(a, a.shape[-1:])),
    "batch_norm": ("aten::batch_norm", lambda a, b: F.batch_norm(a, None, None, training=True)),
    "softmax": ("aten::softmax.int", lambda a, b: torch.softmax(a, -1)),
    "cross_entropy": ("aten::cross_entropy_loss", lambda a, b: F.cross_entropy(
        a, torch.zeros(a.shape[0], dtype=torch.long, device=a.device))),
    "sum": ("aten::sum", lambda a, b: a.sum()),
    "mean": ("aten::mean.dim", lambda a, b: a.mean(-1)),
    "exp": ("aten::exp", lambda a, b: a.exp()),
    "log": ("aten::log", lambda a, b: a.log()),
    "add": ("aten::add.Tensor", lambda a, b: a + b),
    "mul": ("aten::mul.Tensor", lambda a, b: a * b),
    "relu": ("aten::relu", lambda a, b: torch.relu(a)),
    "gelu": ("aten::gelu", lambda a, b: F.gelu(a)),
    "addcmul": ("aten::addcmul", lambda a, b: torch.addcmul(a, a, b)),
    "cat": ("aten::cat", lambda a, b: torch.cat([a, b])),
}
"""Op -> (the aten operator autocast would intercept, a call on two (8, 8) tensors a, b)."""
LISTS = ("lower precision", "fp32", "promote", "none")
"""Autocast's lists, and "none": on no list, the op runs in its inputs' dtype."""
SEED_LISTS = {"lower precision": ("linear", "matmul"),
              "fp32": ("layer_norm", "batch_norm", "softmax", "cross_entropy", "sum", "mean",
                       "exp", "log"),
              "promote": ("add", "mul", "relu", "gelu")}
"""The seed's three lists (its answer to CS336 assignment 2, 003-4(a)), op by op."""


@contextlib.contextmanager
def _autocast_on(device_type: str, dtype: torch.dtype) -> Iterator[None]:
    """Autocast switched on for `device_type` directly (`torch.autocast` refuses "cuda" where
    no GPU is), restored on exit."""
    before = torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    torch.set_autocast_enabled(device_type, True)
    torch.set_autocast_dtype(device_type, dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled(device_type, before[0])
        torch.set_autocast_dtype(device_type, before[1])


def _tensors_on(device_type: str) -> contextlib.AbstractContextManager:
    """Where the ops run: real tensors on a CPU or a present GPU, fake CUDA tensors otherwise."""
    if device_type == "cpu" or torch.cuda.is_available():
        return contextlib.nullcontext()
    from torch._subclasses.fake_tensor import FakeTensorMode  # torch-internal, no public twin

    return FakeTensorMode(allow_non_fake_inputs=True)


def _has_autocast_kernel(op: str, device_type: str) -> bool:
    key = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}[device_type]
    return torch._C._dispatch_has_kernel_for_dispatch_key(op, key)


def op_lists(dtype: str = "fp16", *, device_type: str = "cuda",
             ops: tuple[str, ...] = tuple(OPS)) -> list[dict[str, Any]]:
    """One row per op of `ops` (names of `OPS`) under `device_type`'s autocast to `dtype`: the
    output's dtype from fp32 inputs, from `dtype` inputs and from one of each, whether the
    dispatcher holds an autocast kernel for it, and the list that follows (`LISTS`): a 16-bit
    output from fp32 inputs, the lower-precision list; an fp32 output from 16-bit inputs, the
    fp32 list; else "promote" where autocast intercepts the op, "none" where it does not. How
    the tensors were made: "real", or "fake" (CUDA without a GPU: `_tensors_on`)."""
    checks.choice(dtype, "dtype", DTYPES)
    checks.choice(device_type, "device_type", ("cpu", "cuda"))
    for i, op in enumerate(ops):
        checks.choice(op, f"ops[{i}]", OPS)
    low, names = torch_dtype(dtype), {torch.float32: "fp32", torch_dtype(dtype): dtype}
    rows = []
    with _tensors_on(device_type) as fake, _autocast_on(device_type, low):
        a32, b32 = (torch.full((8, 8), v, device=device_type) for v in (1.5, 0.75))
        for op in ops:
            aten, call = OPS[op]
            out = {k: names.get(call(a, b).dtype, str(call(a, b).dtype)) for k, (a, b) in {
                "from fp32": (a32, b32), f"from {dtype}": (a32.to(low), b32.to(low)),
                "from both": (a32.to(low), b32)}.items()}
            kernel = _has_autocast_kernel(aten, device_type)
            listed = ("lower precision" if out["from fp32"] == dtype else
                      "fp32" if out[f"from {dtype}"] == "fp32" else
                      "promote" if kernel else "none")
            rows.append({"kind": "op", "device_type": device_type, "autocast": dtype, "op": op,
                         "aten": aten, **{f"output {k}": v for k, v in out.items()},
                         "autocast_kernel": kernel, "list": listed,
                         "tensors": "real" if fake is None else "fake"})
    return rows


def op_table(rows: list[dict[str, Any]]) -> Table:
    """Op by op, each device type's list (and the output dtype from 16-bit inputs), from the rows
    of `op_lists` for several device types, with the seed's list beside them."""
    devices = list(dict.fromkeys(r["device_type"] for r in rows))
    by = {(r["device_type"], r["op"]): r for r in rows}
    seed = {op: name for name, ops in SEED_LISTS.items() for op in ops}
    body = []
    for op in dict.fromkeys(r["op"] for r in rows):
        cells = [f"`{op}`", seed.get(op, "-")]
        for d in devices:
            r = by.get((d, op))
            cells.append("-" if r is None else
                         f"{r['list']} (→ {r['output from ' + r['autocast']]})")
        body.append(cells)
    return Table(["op", "the seed's list", *(f"{d} list (16-bit in →)" for d in devices)], body)


def members(rows: list[dict[str, Any]], device_type: str, listed: str) -> str:
    """The ops of `op_lists`'s rows that `device_type` puts on list `listed`, as prose ("`a`,
    `b`"; "none of them" if empty)."""
    checks.choice(listed, "listed", LISTS)
    ops = [f"`{r['op']}`" for r in rows if (r["device_type"], r["list"]) == (device_type, listed)]
    return ", ".join(ops) or "none of them"


def seed_list_errors(rows: list[dict[str, Any]], *,
                     device_type: str = "cuda") -> dict[str, tuple[str, str]]:
    """op -> (the seed's list, torch's list on `device_type`) for every op of `SEED_LISTS` that
    `op_lists`'s rows put on another list."""
    mine = {r["op"]: r["list"] for r in rows if r["device_type"] == device_type}
    return {op: (name, mine[op]) for name, ops in SEED_LISTS.items() for op in ops
            if op in mine and mine[op] != name}


def seed_list_right(rows: list[dict[str, Any]], *, device_type: str = "cuda") -> str:
    """The ops of `SEED_LISTS` that `op_lists`'s rows put on the seed's list, as prose."""
    wrong = seed_list_errors(rows, device_type=device_type)
    return ", ".join(f"`{op}`" for ops in SEED_LISTS.values() for op in ops if op not in wrong)


RECORD_CHECKS = {("toy", "fc1"): "linear", ("toy", "relu"): "relu", ("toy", "ln"): "layer_norm"}
"""A recorded module and the op whose list sets its output's dtype."""


def op_record_agreement(op_rows: list[dict[str, Any]],
                        recorded: list[dict[str, Any]]) -> list[str]:
    """The recorded modules of `RECORD_CHECKS` whose output dtype contradicts the lists of
    `op_lists` for the record's device type and each autocast dtype: [] where all agree."""
    device_type = recorded[0]["device_type"]
    wrong = []
    for (model, path), op in RECORD_CHECKS.items():
        for r in (r for r in op_rows if (r["device_type"], r["op"]) == (device_type, op)):
            got = module(recorded, model, r["autocast"], path)
            expected = {"lower precision": r["autocast"], "fp32": "fp32"}.get(r["list"],
                                                                            got["input"])
            if got["output"] != expected:
                wrong.append(f"{model} {path} under {r['autocast']}: recorded {got['output']}, "
                             f"the {r['list']} list gives {expected}")
    return wrong


EXPERIMENT = Experiment(
    name="autocast_dtypes",
    chapter="07_mixed_precision",
    description="dtype of every parameter, activation, loss and gradient under autocast, recorded",
    gpu_seconds=15,
    sizes=SIZES,
    run=run,
)
