"""One model on the napkin: parameters, memory, FLOPs, bytes and step time, traced in one call.

`napkin(TransformerConfig.preset("xl"), "h100", batch=8, seq=1024, n_devices=8, name="xl")` follows
one configuration through the other accounting modules, in the order a reader would do it by hand:

1. parameters N (`params`);
2. model-state bytes under a training recipe (`memory`: 16 B/param for mixed-precision AdamW),
   per device when every device holds a replica (data parallelism) and when the states are
   sharded over the devices (ZeRO-3 / FSDP), against the device's HBM;
3. training FLOPs per token and per step (`flops`: forward + backward = 3x forward);
4. FLOPs, bytes, intensity and roofline bound of the step's main kernels at this batch and
   sequence (`bytes`, `flops`, `roofline`), against the accelerator's ridge point;
5. the step time at a stated MFU (`utilization.training_time_s`) and the tokens per second.

`batch` is per device (as on the notation page); every device runs the same kernels on its own
batch. Not counted: activations and temporary buffers (memory), communication (time).
Pure: no torch, no printing; `mlsys.tables.napkin_lines` renders a trace as text.
Used in: book page "One model on the napkin", `python -m mlsys napkin`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlsys import checks, dtypes, hardware
from mlsys.accounting import memory, params
from mlsys.accounting.bytes import (
    Traffic,
    batched_matmul_traffic,
    elementwise_traffic,
    intensity,
    matmul_traffic,
    norm_traffic,
    softmax_traffic,
)
from mlsys.accounting.flops import (
    layernorm_flops,
    linear_flops,
    matmul_flops,
    rmsnorm_flops,
    six_n_flops_per_token,
    softmax_flops,
    training_flops_per_token,
    transformer_flops,
)
from mlsys.accounting.utilization import training_time_s
from mlsys.roofline import Ceilings, estimate


@dataclass(frozen=True)
class KernelCost:
    """One kernel of a training step (forward), per device, with its place on the roofline."""

    name: str  # what it computes, e.g. "SwiGLU up-projection w1"
    shapes: str  # operand shapes, e.g. "[8192, 1600] @ [1600, 6400]"
    flops: int
    read_bytes: int
    write_bytes: int
    intensity_flop_per_byte: float
    bound: str  # "compute-bound" or "memory-bound" against the ridge point
    roofline_s: float  # max(flops / peak, bytes / bandwidth): the fastest it can run

    @property
    def total_bytes(self) -> int:
        return self.read_bytes + self.write_bytes


@dataclass(frozen=True)
class Napkin:
    """Every number of one model's napkin trace; see the module docstring for the steps."""

    model_name: str  # the name the caller gave it (a preset's name), or "custom"
    config: Any  # a TransformerConfig, or anything with the same size attributes
    accelerator_name: str
    dtype: str  # of weights, activations and the matmul peak
    recipe: str  # training recipe of `memory.RECIPES`
    batch: int  # sequences per device per step
    seq: int  # tokens per sequence
    n_devices: int
    mfu: float  # assumed model FLOPs utilization, in (0, 1]
    # 1. parameters
    n_params: int
    n_params_matmul: int  # the N of a detailed 6N count: every linear weight
    # 2. model states
    bytes_per_param: int
    model_state_bytes: int  # all of them, for the whole model
    replicated_bytes_per_device: int  # every device holds every state (data parallel)
    sharded_bytes_per_device: int  # states split over n_devices (ZeRO-3 / FSDP), largest shard
    hbm_bytes: float  # per device, from the spec sheet
    # 3. FLOPs
    tokens_per_device: int  # batch * seq
    forward_flops_per_token: float  # matmuls only, as MFU counts them
    training_flops_per_token: float  # 3x forward
    six_n_flops_per_token: int  # the rule of thumb, for comparison
    step_flops_per_device: int  # training FLOPs of one step on one device
    # 4. kernels and the roofline
    peak_flop_per_s: float  # dense peak of one device in `dtype`
    hbm_bytes_per_s: float
    ridge_flop_per_byte: float
    kernels: tuple[KernelCost, ...]
    # 5. time
    step_s: float
    tokens_per_s: float  # all devices together

    @property
    def step_flops(self) -> int:
        """Training FLOPs of one step on all devices."""
        return self.n_devices * self.step_flops_per_device

    @property
    def replicated_fits(self) -> bool:
        return self.replicated_bytes_per_device <= self.hbm_bytes

    @property
    def sharded_fits(self) -> bool:
        return self.sharded_bytes_per_device <= self.hbm_bytes


def napkin(
    model: Any,
    accelerator: str | hardware.Accelerator,
    *,
    batch: int,
    seq: int,
    mfu: float = 0.4,
    recipe: str = "bf16_mixed_adamw",
    n_devices: int = 1,
    dtype: str = "bf16",
    name: str = "custom",
) -> Napkin:
    """Trace `model` (a `TransformerConfig`, called `name`) on `n_devices` of `accelerator`.

    Checks every argument before any arithmetic: unknown names list the known ones; batch, seq and
    n_devices are positive integers, seq <= the model's context_length, mfu in (0, 1], and the
    accelerator has a dense peak for `dtype`.
    """
    cfg, model_name = _model(model, name)
    if isinstance(accelerator, hardware.Accelerator):
        acc = accelerator
    elif isinstance(accelerator, str):
        acc = hardware.get(accelerator)
    else:
        raise TypeError(f"accelerator must be a name such as 'h100', got {accelerator!r}")
    state = memory.recipe(recipe)
    batch, seq = checks.positive_int(batch, "batch"), checks.positive_int(seq, "seq")
    n_devices = checks.positive_int(n_devices, "n_devices")
    mfu = checks.fraction(mfu, "mfu")
    if seq > cfg.context_length:
        raise ValueError(
            f"seq ({seq}) must be <= context_length ({cfg.context_length}) of model {model_name!r}"
        )
    dtype = dtypes.canonical(dtype)
    peak = acc.peak_flop_per_s(_peak_key(dtype))

    n_params = params.count_params(cfg)
    state_bytes = memory.model_state_bytes(n_params, state)
    tokens = batch * seq
    step = transformer_flops(cfg, batch, seq)
    step_s = training_time_s(step.training_matmul_flops, 1, peak, mfu)
    return Napkin(
        model_name=model_name,
        config=cfg,
        accelerator_name=acc.name,
        dtype=dtype,
        recipe=state.name,
        batch=batch,
        seq=seq,
        n_devices=n_devices,
        mfu=mfu,
        n_params=n_params,
        n_params_matmul=params.param_counts(cfg).matmul,
        bytes_per_param=state.bytes_per_param,
        model_state_bytes=state_bytes,
        replicated_bytes_per_device=state_bytes,
        sharded_bytes_per_device=-(-state_bytes // n_devices),
        hbm_bytes=acc.hbm_bytes,
        tokens_per_device=tokens,
        forward_flops_per_token=step.forward_matmul_flops / tokens,
        training_flops_per_token=training_flops_per_token(cfg, seq),
        six_n_flops_per_token=six_n_flops_per_token(params.param_counts(cfg).active),
        step_flops_per_device=step.training_matmul_flops,
        peak_flop_per_s=peak,
        hbm_bytes_per_s=acc.hbm_bytes_per_s,
        ridge_flop_per_byte=peak / acc.hbm_bytes_per_s,
        kernels=kernel_costs(cfg, batch, seq, Ceilings(peak, acc.hbm_bytes_per_s, acc.name), dtype),
        step_s=step_s,
        tokens_per_s=n_devices * tokens / step_s,
    )


MLP_UP_NAMES = {"swiglu": "SwiGLU up-projection w1", "gelu": "GeLU MLP up-projection w1",
                "relu": "ReLU MLP up-projection w1"}
"""The name of `kernel_costs`' feed-forward row, by the config's MLP kind."""


def kernel_costs(
    cfg: Any, batch: int, seq: int, ceilings: Ceilings, dtype: str = "bf16"
) -> tuple[KernelCost, ...]:
    """The main forward kernels of one block (and the head) at (batch, seq), on one device.

    Matmul traffic is the minimum (each operand read once, the output written once); the
    attention scores are naive attention's: all batch * heads * seq^2 of them written to HBM,
    then read back by the softmax. Norm and elementwise FLOPs are the estimates of `flops`. The
    feed-forward row is named by the config's MLP kind; a mixture of experts' runs the tokens'
    top-k rows through the experts' width and reads every expert's weights.
    """
    checks.positive_ints(batch=batch, seq=seq)
    tok, d, f, v = batch * seq, cfg.d_model, cfg.d_ff, cfg.vocab_size
    bh, dh = batch * cfg.n_heads, cfg.d_head
    up_name = MLP_UP_NAMES[getattr(cfg, "mlp", "swiglu")]
    up_rows, up = tok, matmul_traffic(tok, f, d, dtype)
    if getattr(cfg, "is_moe", False):
        up_rows, f = tok * cfg.experts_per_token, cfg.expert_d_ff
        up_name += f" (top-{cfg.experts_per_token} of {cfg.n_experts} experts)"
        weights = (cfg.n_experts - 1) * d * f * dtypes.bytes_per_element(dtype)
        up = matmul_traffic(up_rows, f, d, dtype)
        up = Traffic(up.read_bytes + weights, up.write_bytes)
    layernorm = getattr(cfg, "norm", "rmsnorm") == "layernorm"
    specs = (  # (name, shapes, FLOPs, Traffic)
        ("attention projection q", f"[{tok}, {d}] @ [{d}, {d}]",
         linear_flops(tok, d, d), matmul_traffic(tok, d, d, dtype)),
        (up_name, f"[{up_rows}, {d}] @ [{d}, {f}]", linear_flops(up_rows, d, f), up),
        ("output head", f"[{tok}, {d}] @ [{d}, {v}]",
         linear_flops(tok, d, v), matmul_traffic(tok, v, d, dtype)),
        ("attention scores QK^T (naive)", f"{bh} x [{seq}, {dh}] @ [{dh}, {seq}]",
         bh * matmul_flops(seq, seq, dh),
         batched_matmul_traffic(bh, seq, seq, dh, dtype, shared_b=False)),
        ("softmax of the scores", f"[{bh * seq}, {seq}]",
         softmax_flops(bh * seq, seq), softmax_traffic(bh * seq, seq, dtype)),
        ("LayerNorm" if layernorm else "RMSNorm", f"[{tok}, {d}]",
         (layernorm_flops if layernorm else rmsnorm_flops)(tok, d),
         norm_traffic(tok, d, dtype, has_bias=layernorm)),
        ("residual add", f"[{tok}, {d}] + [{tok}, {d}]",
         tok * d, elementwise_traffic(tok * d, dtype, n_inputs=2)),
    )  # fmt: skip
    out = []
    for name, shapes, n_flops, traffic in specs:
        flop_per_byte = intensity(n_flops, traffic)
        out.append(KernelCost(
            name=name,
            shapes=shapes,
            flops=n_flops,
            read_bytes=traffic.read_bytes,
            write_bytes=traffic.write_bytes,
            intensity_flop_per_byte=flop_per_byte,
            bound=ceilings.bound(flop_per_byte),
            roofline_s=estimate(n_flops, traffic.total_bytes, ceilings).time_s,
        ))  # fmt: skip
    return tuple(out)


def _model(model: Any, name: str) -> tuple[Any, str]:
    """(config, name), after checking the config has every size the accounting reads."""
    sizes = ("vocab_size", "context_length", "d_model", "n_layers", "n_heads", "d_ff")
    checks.attributes(model, "model", sizes, example="a TransformerConfig")
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    return model, name


def _peak_key(dtype: str) -> str:
    """The key of `Accelerator.dense_flop_per_s` for a canonical dtype ("fp8" for both fp8s)."""
    return "fp8" if dtype.startswith("fp8") else dtype
