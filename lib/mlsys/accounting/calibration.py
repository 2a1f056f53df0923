"""The step model against Megatron-LM's Table 1: the fit of its constants, each row's residual,
and leave-one-out.

Each row of `third_party.MEGATRON_TABLE1` is a GPT (LayerNorm, GeLU MLP d_ff = 4 h, biases,
learned positions, tied embeddings, vocabulary 51,200, sequence 2,048) on DGX A100 nodes with
the published TP, PP, batch and GPUs, and the authors' script's micro-batch, interleaving and
DDP; fp16, full recomputation, no sequence parallelism (2021), materialized attention with
dropout (`step_model.MEGATRON_2021`; FlashAttention came in 2022). Predicted TFLOP/s per GPU =
Eq. 3's FLOPs (`step_model.megatron_flops`) / (predicted step x GPUs).

The fit (`fit`): the three fractions of `hardware.StepConstants` (GEMM, HBM, NCCL), each on a
grid of 0.01 from 0.50 to 0.99, minimizing the mean absolute relative error (ties: the smaller
worst row, then the smaller tuple); a coarse pass at 0.05 picks the start of a coordinate search
at 0.01 that sweeps one fraction at a time, then tries the 26 neighbours at +-0.01 (moves along
a ridge where the fractions trade against each other), until nothing improves. Deterministic,
pure Python.
`leave_one_out` refits without each row and predicts it.
Used in: chapter 09's page on published runs, `hardware.STEP_CONSTANTS` (its stored values are
this fit's, checked by a test).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from mlsys import checks, hardware, third_party
from mlsys.accounting import step_model
from mlsys.accounting.parallel import ParallelDims

FITTED = ("gemm_fraction", "hbm_fraction", "nccl_fraction")
GRID = tuple(round(0.50 + 0.01 * i, 2) for i in range(50))  # 0.50 ... 0.99
COARSE = tuple(x for x in GRID if round(x * 100) % 5 == 0)  # 0.50, 0.55, ..., 0.95


@dataclass(frozen=True)
class ModelSizes:
    """A model's sizes under the field names of `mlsys.models.config.TransformerConfig` (a
    floor above this one): `TransformerConfig(**dataclasses.asdict(sizes))` is the same model."""

    vocab_size: int
    context_length: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    n_kv_heads: int | None = None
    mlp: str = "swiglu"
    norm: str = "rmsnorm"
    positions: str = "rope"
    tie_embeddings: bool = False
    bias: bool = False
    n_experts: int = 0
    experts_per_token: int = 0
    d_ff_expert: int | None = None
    n_shared_experts: int = 0

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def expert_d_ff(self) -> int:
        return self.d_ff if self.d_ff_expert is None else self.d_ff_expert


def megatron_config(row: third_party.PublishedRun) -> ModelSizes:
    """The GPT of a Table 1 row."""
    return ModelSizes(vocab_size=third_party.MEGATRON_VOCAB,
                             context_length=third_party.MEGATRON_SEQ, d_model=row.hidden,
                             n_layers=row.layers, n_heads=row.heads, d_ff=4 * row.hidden,
                             mlp="gelu", norm="layernorm", positions="learned",
                             tie_embeddings=True, bias=True)


def megatron_dims(row: third_party.PublishedRun) -> ParallelDims:
    """The row's mesh: plain data parallelism (no ZeRO in 2021) x PP x TP."""
    return ParallelDims(dp_replicate=row.dp, tp=row.tp, pp=row.pp, world_size=row.gpus)


def predict(row: third_party.PublishedRun,
            constants: hardware.StepConstants | None = None) -> step_model.StepBreakdown:
    """The step model's breakdown of one Table 1 row (module docstring)."""
    if not isinstance(row, third_party.PublishedRun):
        raise TypeError(f"row must be a third_party.PublishedRun, got {type(row).__name__}")
    software = replace(step_model.MEGATRON_2021, overlap_grad_reduce=row.ddp == "torch")
    return step_model.step_time(
        megatron_config(row), hardware.get_cluster("dgx-a100"), megatron_dims(row),
        batch=row.batch, seq=third_party.MEGATRON_SEQ, micro_batch=row.micro_batch,
        virtual_stages=row.virtual_stages, recompute="full", sequence_parallel=False,
        dtype="fp16", software=software, constants=constants)


def predicted_tflops(row: third_party.PublishedRun,
                     constants: hardware.StepConstants | None = None) -> float:
    """Eq. 3's FLOPs of the step / (predicted step time x GPUs), in TFLOP/s per GPU."""
    flops = step_model.megatron_flops(megatron_config(row), batch=row.batch,
                                      seq=third_party.MEGATRON_SEQ)
    return flops / (predict(row, constants).step_s * row.gpus) / 1e12


@dataclass(frozen=True)
class Residual:
    """One row: published and predicted TFLOP/s per GPU, and (predicted - published) /
    published."""

    params_b: float
    published: float
    predicted: float

    @property
    def error(self) -> float:
        return (self.predicted - self.published) / self.published


def residuals(constants: hardware.StepConstants | None = None,
              rows=third_party.MEGATRON_TABLE1) -> tuple[Residual, ...]:
    """Every row's `Residual` under `constants` (default: the stored ones)."""
    return tuple(Residual(r.params_b, r.tflops_per_gpu, predicted_tflops(r, constants))
                 for r in rows)


def mean_abs_error(res) -> float:
    """Mean of |error| over the rows."""
    res = tuple(res)
    if not res:
        raise ValueError("residuals must hold at least one row")
    return sum(abs(r.error) for r in res) / len(res)


def _with(values: tuple[float, ...], base: hardware.StepConstants) -> hardware.StepConstants:
    return replace(base, **dict(zip(FITTED, values, strict=True)))


def _score(values, rows, base) -> tuple[float, float, tuple[float, ...]]:
    res = residuals(_with(values, base), rows)
    return (round(mean_abs_error(res), 12), round(max(abs(r.error) for r in res), 12), values)


def fit(rows=third_party.MEGATRON_TABLE1,
        base: hardware.StepConstants | None = None) -> hardware.StepConstants:
    """The fractions of `FITTED` that best predict `rows` (module docstring); the latencies and
    the source are kept from `base` (default: the stored constants)."""
    rows = tuple(rows)
    if not rows:
        raise ValueError("rows must hold at least one PublishedRun")
    base = base or hardware.STEP_CONSTANTS
    best = min(_score(v, rows, base) for v in itertools.product(COARSE, repeat=len(FITTED)))
    improved = True
    while improved:
        improved = False
        for i in range(len(FITTED)):  # one fraction at a time, along its whole grid
            for x in GRID:
                values = best[2][:i] + (x,) + best[2][i + 1:]
                score = _score(values, rows, base)
                if score < best:
                    best, improved = score, True
        for step in itertools.product((-0.01, 0.0, 0.01), repeat=len(FITTED)):  # and along
            values = tuple(round(x + d, 2) for x, d in zip(best[2], step, strict=True))  # ridges
            if all(GRID[0] <= x <= GRID[-1] for x in values):
                score = _score(values, rows, base)
                if score < best:
                    best, improved = score, True
    return _with(best[2], base)


@dataclass(frozen=True)
class LeaveOneOut:
    """One row predicted by constants fitted on the other rows."""

    params_b: float
    constants: hardware.StepConstants
    residual: Residual


def leave_one_out(rows=third_party.MEGATRON_TABLE1) -> tuple[LeaveOneOut, ...]:
    """For each row: refit on the others, predict it."""
    rows = tuple(rows)
    if len(rows) < 2:
        raise ValueError("leave_one_out needs at least two rows")
    out = []
    for i, row in enumerate(rows):
        fitted = fit(rows[:i] + rows[i + 1:])
        out.append(LeaveOneOut(row.params_b, fitted, residuals(fitted, (row,))[0]))
    return tuple(out)


def null_model(rows=third_party.MEGATRON_TABLE1) -> tuple[Residual, ...]:
    """The rows predicted by their own mean throughput: the error a model must beat to have
    learned anything from the shapes."""
    rows = tuple(rows)
    checks.positive_int(len(rows), "len(rows)")
    mean = sum(r.tflops_per_gpu for r in rows) / len(rows)
    return tuple(Residual(r.params_b, r.tflops_per_gpu, mean) for r in rows)


LLAMA3_CHOICES = {"micro_batch": 1, "virtual_stages": 2, "recompute": "none", "zero": 1}
"""What the Llama 3 paper does not publish, as chosen for the test: one sequence a micro-batch
(16 to 32 micro-batches for 16 stages), two model chunks a stage (its interleaved schedule; the
126 blocks give 8 a stage, 4 a chunk), no recomputation, optimizer state sharded over the
copies. The bubble moves the prediction most: `llama3_prediction` takes other values."""


def llama3_config() -> ModelSizes:
    """Llama 3 405B (`third_party.LLAMA3_405B_SIZES`)."""
    return ModelSizes(context_length=8_192, **third_party.LLAMA3_405B_SIZES)


def llama3_prediction(row: third_party.Llama3Run, constants=None,
                      **choices) -> step_model.StepBreakdown:
    """The step model's breakdown of a Llama 3 405B row on DGX H100 nodes (a modern stack:
    FlashAttention, sequence parallelism, bf16), with `LLAMA3_CHOICES` unless overridden. The
    constants are the A100 fit: their transfer to the H100 is what this tests."""
    if not isinstance(row, third_party.Llama3Run):
        raise TypeError(f"row must be a third_party.Llama3Run, got {type(row).__name__}")
    knobs = {**LLAMA3_CHOICES, **choices}
    dims = ParallelDims(dp_replicate=row.dp, tp=row.tp, pp=row.pp, cp=row.cp,
                        world_size=row.gpus)
    return step_model.step_time(llama3_config(), hardware.get_cluster("dgx-h100"), dims,
                                batch=row.batch, seq=row.seq, constants=constants, **knobs)
