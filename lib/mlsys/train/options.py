"""The flags of `python -m mlsys.train`, and every check made before any process-group work.

`parse(argv)` turns the command line into `Options`; `resolve(options, world_size)` checks them
against the world torchrun started (mesh product, model and batch divisibility, precision,
memory, data file, checkpoint directory, a checkpoint of another model) and returns the `Run`
that every rank executes. The model is a preset (`--preset`) or a Hugging Face config.json
(`--config`), and the architecture flags (`--n-kv-heads`, `--mlp`, `--norm`, `--positions`,
`--tie-embeddings`, `--bias`) reshape either: a Llama-shaped model (RMSNorm, RoPE, SwiGLU,
grouped-query attention) or a GPT-shaped one (LayerNorm, learned positions, GeLU, biases, a tied
head) at any size (`model_config`). A bad flag is a clear error naming it and the rule, raised on
every rank before `init_process_group`, so nothing hangs and nothing is half-written. One module
though over 300 lines: every flag and every check made before the process group in one place, so
that no rank starts with a flag left unchecked.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mlsys import checks, env, hardware
from mlsys.accounting import parallel, planner
from mlsys.models.config import MLP_KINDS, NORM_KINDS, POSITION_KINDS, PRESETS, TransformerConfig
from mlsys.models.hf_config import from_hf_config
from mlsys.policies import POLICIES, PrecisionPolicy, policy
from mlsys.tables import mesh_text
from mlsys.train import checkpoint_layout, data

TRAINABLE = tuple(name for name, p in POLICIES.items() if p.optimizer == "adamw")
"""The chapter-07 recipes this entry point trains with (it runs AdamW)."""
AXES = ("dp_replicate", "dp_shard", "tp", "pp", "cp")
SMOKE_STEPS = 8
"""Steps of a run with no --steps in the smoke profile (a few seconds on a CPU)."""
ARCHITECTURE_FLAGS = {"n_kv_heads": "--n-kv-heads", "mlp": "--mlp", "norm": "--norm",
                      "positions": "--positions", "tie_embeddings": "--tie-embeddings",
                      "bias": "--bias", "d_ff": "--d-ff"}
"""`TransformerConfig` field -> the flag that overrides it (None: the preset's or config's)."""


@dataclass(frozen=True)
class Options:
    """The command line, as given (None: choose from the world and the profile)."""

    preset: str | None = None  # None: "debug", or the model of --config
    config: str | None = None  # a Hugging Face config.json (instead of --preset)
    n_kv_heads: int | None = None  # the architecture flags: None keeps the model's own
    mlp: str | None = None
    norm: str | None = None
    positions: str | None = None
    tie_embeddings: bool | None = None
    bias: bool | None = None
    d_ff: int | None = None
    mesh: str | None = None  # "dp_shard=2,tp=2", "auto", or None: FSDP over every rank
    precision: str = "fp32_adamw"
    steps: int | None = None
    global_batch: int = 8
    micro_batch: int | None = None  # None: global_batch / dp (no accumulation)
    seq_len: int = 64
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int | None = None  # None: a tenth of the steps
    weight_decay: float = 0.1
    clip: float = 1.0
    seed: int = 0
    data: str | None = None
    data_dtype: str = "uint16"
    ckpt: str | None = None
    ckpt_every: int = 0  # 0: only at the end (when --ckpt is given)
    log: str | None = None  # JSON-lines file; default <ckpt>/log.jsonl when --ckpt is given
    device: str = "auto"
    sequence_parallel: bool = False
    kill_rank_at: tuple[int, int] | None = None  # (rank, step): fault injection, first attempt
    quiet: bool = False


@dataclass(frozen=True)
class Run:
    """What every rank executes: checked options, model config, mesh and policy."""

    options: Options
    config: TransformerConfig
    dims: parallel.ParallelDims
    policy: PrecisionPolicy
    steps: int
    warmup: int
    micro_batch: int
    accumulation: int  # micro-batches per rank per step (pipeline: the micro-batches in flight)
    device: str  # "cpu" or "cuda"
    why_mesh: str = ""  # what --mesh auto chose, and why
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the run's config as saved with every checkpoint."""
        return {"options": {k: (list(v) if isinstance(v, tuple) else v)
                            for k, v in dataclasses.asdict(self.options).items()},
                "model": dataclasses.asdict(self.config),
                "mesh": {a: getattr(self.dims, a) for a in AXES},
                "precision": self.policy.name, "steps": self.steps, "warmup": self.warmup,
                "micro_batch": self.micro_batch, "accumulation": self.accumulation}


def parse_mesh(text: str) -> dict[str, int]:
    """"dp_shard=2,tp=2" -> {"dp_shard": 2, "tp": 2}; unknown axes and bad degrees refused."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        axis, eq, value = part.partition("=")
        if not eq or axis.strip() not in AXES:
            raise ValueError(f"--mesh: {part!r} is not AXIS=N with AXIS one of {', '.join(AXES)}")
        if not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"--mesh: {axis.strip()} must be a positive integer, got {value!r}")
        if axis.strip() in out:
            raise ValueError(f"--mesh: {axis.strip()} is given twice")
        out[axis.strip()] = int(value)
    if not out:
        raise ValueError("--mesh is empty: give AXIS=N pairs such as dp_shard=2,tp=2, or auto")
    return out


def _kill(text: str) -> tuple[int, int]:
    rank, sep, step = text.partition(":")
    if not sep or not rank.isdigit() or not step.isdigit() or int(step) < 1:
        raise argparse.ArgumentTypeError(f"must be RANK:STEP (STEP >= 1), got {text!r}")
    return int(rank), int(step)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mlsys.train",
                                description="Train a book model on torchrun's ranks.")
    d = Options()
    model = p.add_mutually_exclusive_group()
    model.add_argument("--preset", default=None, choices=list(PRESETS),
                       help="a book model size (default: debug)")
    model.add_argument("--config", default=None, metavar="PATH",
                       help="a Hugging Face config.json (Llama, Mistral, Qwen2, GPT-2, OPT, ...)")
    p.add_argument("--n-kv-heads", type=int, default=None,
                   help="key/value heads: grouped-query attention (1: multi-query)")
    p.add_argument("--mlp", default=None, choices=list(MLP_KINDS),
                   help="feed-forward: swiglu (Llama) or gelu / relu (GPT-2, OPT)")
    p.add_argument("--d-ff", type=int, default=None, help="the feed-forward's hidden width")
    p.add_argument("--norm", default=None, choices=list(NORM_KINDS))
    p.add_argument("--positions", default=None, choices=list(POSITION_KINDS),
                   help="rope, or a learned context_length x d_model table (GPT)")
    p.add_argument("--tie-embeddings", action=argparse.BooleanOptionalAction, default=None,
                   help="the head's weight is the embedding")
    p.add_argument("--bias", action=argparse.BooleanOptionalAction, default=None,
                   help="a bias on every linear layer but the head (GPT-2)")
    p.add_argument("--mesh", default=None,
                   help="dp_replicate=..,dp_shard=..,tp=..,pp=..,cp=.. (product = world size), "
                        "or auto: the planner's first choice; default: FSDP over every rank")
    p.add_argument("--precision", default=d.precision, choices=list(TRAINABLE),
                   help="a chapter-07 recipe (mlsys.policies)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"optimizer steps (default {SMOKE_STEPS} in the smoke profile, else 200)")
    p.add_argument("--global-batch", type=int, default=d.global_batch, help="sequences per step")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="sequences per forward (default: global batch / dp, no accumulation)")
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate")
    p.add_argument("--min-lr-ratio", type=float, default=d.min_lr_ratio,
                   help="the cosine ends at this fraction of --lr")
    p.add_argument("--warmup", type=int, default=None, help="linear warm-up steps (default: 10%%)")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--clip", type=float, default=d.clip,
                   help="clip the global gradient norm to this (0: no clipping)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--data", default=None,
                   help="a token file (numpy memmap); default: the stdlib byte corpus")
    p.add_argument("--data-dtype", default=d.data_dtype, choices=["uint16", "uint32"])
    p.add_argument("--ckpt", default=None, help="checkpoint directory (resumes from its latest)")
    p.add_argument("--ckpt-every", type=int, default=d.ckpt_every,
                   help="save every K steps (0: only at the end)")
    p.add_argument("--log-file", dest="log", default=None,
                   help="JSON-lines log (default <ckpt>/log.jsonl)")
    p.add_argument("--device", default=d.device, choices=["auto", "cpu", "cuda"])
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--kill-rank-at", type=_kill, default=None, metavar="RANK:STEP",
                   help="fault injection: that rank SIGKILLs itself at STEP on the first attempt")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def parse(argv: list[str] | None = None) -> Options:
    """The command line as `Options` (argparse's own errors for malformed flags)."""
    args = parser().parse_args(argv)
    return Options(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Options)})


def model_name(options: Options) -> str:
    """The flag that names the run's model: "--preset debug" or "--config PATH"."""
    if options.config is not None:
        return f"--config {options.config}"
    return f"--preset {options.preset or 'debug'}"


def model_config(options: Options) -> TransformerConfig:
    """The model of `options`: the preset (or --config's) with the architecture flags applied;
    a ValueError naming the flags for a model the config refuses, or that the runnable model does
    not build (a mixture of experts)."""
    o = options
    if o.config is not None and o.preset is not None:
        raise ValueError("--preset and --config both name the model: give one")
    overrides = {field: getattr(o, field) for field in ARCHITECTURE_FLAGS
                 if getattr(o, field) is not None}
    try:
        if o.config is None:
            cfg = TransformerConfig.preset(o.preset or "debug", **overrides)
        else:
            cfg = dataclasses.replace(from_hf_config(Path(o.config)), **overrides)
    except (TypeError, ValueError) as error:
        given = "".join(f" {ARCHITECTURE_FLAGS[k]} {v}" for k, v in overrides.items())
        raise ValueError(f"{model_name(o)}{given}: {error}") from error
    if cfg.n_experts:
        raise ValueError(f"{model_name(o)} is a mixture of {cfg.n_experts} experts: experts are "
                         "costed by the planner, not built (python -m mlsys plan costs it); "
                         "this entry point trains dense models")
    return cfg


def check_architecture(cfg: TransformerConfig, dims: parallel.ParallelDims,
                       sequence_parallel: bool) -> None:
    """What `mlsys.train.parallelize` cannot split: KV heads tp does not divide (it splits them,
    as torchtitan does, never replicates), a tied head across pipeline stages (the embedding's and
    the head's gradients would need a sum between the first and last stage, as Megatron-LM does)
    or under sequence parallelism (the embedding and the head are split two ways), and learned
    positions under sequence parallelism (the split embedding would split the table too)."""
    if cfg.kv_heads % dims.tp:
        raise ValueError(f"--mesh tp={dims.tp} must divide the {cfg.kv_heads} key/value heads "
                         "(--n-kv-heads): this entry point splits them over tp, it does not "
                         "replicate them")
    if cfg.tie_embeddings and dims.pp > 1:
        raise ValueError("--tie-embeddings with pp > 1: the first stage's embedding and the "
                         "last stage's head would be two copies; use pp=1 or --no-tie-embeddings")
    if sequence_parallel and (cfg.tie_embeddings or cfg.positions == "learned"):
        raise ValueError("--sequence-parallel splits the embedding by rows and the head by "
                         "columns: not with --tie-embeddings or --positions learned")


def memory_limit_bytes(device: str) -> tuple[float, str]:
    """What one rank may hold: the GPU's memory, or this machine's RAM shared by its ranks."""
    if device == "cuda":
        return float(torch.cuda.get_device_properties(0).total_memory), "GPU memory"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return ram / local, f"RAM / {local} local ranks"


def _auto_mesh(cfg: TransformerConfig, world: int, batch: int, seq: int, recipe: str,
               device: str) -> tuple[parallel.ParallelDims, str]:
    key = None
    if device == "cuda":
        key = hardware.CUDA_DEVICE_NAMES.get(torch.cuda.get_device_name().strip())
    cluster = {"a100": "dgx-a100", "b200": "dgx-b200"}.get(key or "", "dgx-h100")
    plans = planner.plan(cfg, cluster, n_devices=world, batch=batch, seq=seq, recipe=recipe,
                         fixed={"cp": 1})
    best = plans[0]
    why = (f"--mesh auto: the planner's first of {len(plans)} meshes for {world} ranks on "
           f"{cluster} ({mesh_text(best.dims)}, {best.microbatches} micro-batches): "
           f"predicted {best.step_s * 1e3:.3g} ms/step, {best.memory.total / 1e9:.3g} GB/device, "
           f"limited by {best.limit}")
    return best.dims, why


def resolve(options: Options, world_size: int) -> Run:
    """Check `options` against a world of `world_size` ranks; the `Run`, or a clear error."""
    o = options
    world = checks.positive_int(world_size, "world_size")
    for name in ("global_batch", "seq_len"):
        checks.positive_int(getattr(o, name), f"--{name.replace('_', '-')}")
    checks.positive(o.lr, "--lr")
    checks.fraction(o.min_lr_ratio, "--min-lr-ratio")
    checks.integer(o.ckpt_every, "--ckpt-every", minimum=0)
    if o.weight_decay < 0 or o.clip < 0:
        raise ValueError("--weight-decay and --clip must be >= 0")
    device = env.device() if o.device == "auto" else o.device
    if device not in ("cpu", "cuda"):
        device = "cpu"
    cfg = model_config(o)
    if o.seq_len > cfg.context_length:
        raise ValueError(f"--seq-len ({o.seq_len}) must be <= the context_length of "
                         f"{model_name(o)} ({cfg.context_length})")
    chosen = policy(o.precision)
    if chosen.optimizer != "adamw":
        raise ValueError(f"--precision {o.precision!r} is an {chosen.optimizer} recipe; this "
                         f"entry point trains with AdamW: one of {', '.join(TRAINABLE)}")
    why = ""
    if o.mesh is None:
        dims = parallel.ParallelDims(dp_shard=world)
    elif o.mesh.strip() == "auto":
        dims, why = _auto_mesh(cfg, world, o.global_batch, o.seq_len, chosen.name, device)
    else:
        degrees = parse_mesh(o.mesh)
        product = 1
        for v in degrees.values():
            product *= v
        if product != world:
            given = " * ".join(f"{a} ({v})" for a, v in degrees.items())
            raise ValueError(f"--mesh {o.mesh}: {given} = {product}, but torchrun started "
                             f"{world} ranks; the product must equal the world size")
        dims = parallel.ParallelDims(**degrees)
    if dims.cp > 1:
        raise ValueError("--mesh cp > 1: torch's context parallelism "
                         "(torch.distributed.tensor.experimental.context_parallel) swaps in "
                         "ring attention for SDPA's CUDA kernels and is not wired into this "
                         "entry point; use cp=1 here, and chapter 09's mlsys.distributed.cp to "
                         "see ring attention run")
    if o.sequence_parallel and dims.tp == 1:
        raise ValueError("--sequence-parallel needs tp > 1 in --mesh")
    micro = o.micro_batch if o.micro_batch is not None else o.global_batch // dims.dp
    checks.positive_int(micro, "--micro-batch")
    if o.global_batch % (dims.dp * micro):
        raise ValueError(f"--global-batch ({o.global_batch}) must be divisible by dp "
                         f"({dims.dp}) * --micro-batch ({micro}) = {dims.dp * micro}")
    accumulation = o.global_batch // (dims.dp * micro)
    parallel.check_model(cfg, dims, batch=o.global_batch, seq=o.seq_len, microbatches=accumulation)
    check_architecture(cfg, dims, o.sequence_parallel)
    if dims.pp > 1 and accumulation < dims.pp:
        raise ValueError(f"pp ({dims.pp}) needs at least pp micro-batches per step to fill the "
                         f"pipeline, got {accumulation}: lower --micro-batch")
    steps = o.steps if o.steps is not None else (SMOKE_STEPS if env.profile() == "smoke"
                                                 else 200)
    checks.positive_int(steps, "--steps")
    warmup = o.warmup if o.warmup is not None else steps // 10
    checks.integer(warmup, "--warmup", minimum=0)
    if warmup >= steps:
        raise ValueError(f"--warmup ({warmup}) must be < --steps ({steps})")
    if o.kill_rank_at is not None and o.kill_rank_at[0] >= world:
        raise ValueError(f"--kill-rank-at {o.kill_rank_at[0]}:{o.kill_rank_at[1]}: rank "
                         f"must be < the world size ({world})")
    check_memory(cfg, dims, chosen, micro, o.seq_len, accumulation, device, model_name(o))
    return Run(o, cfg, dims, chosen, steps, warmup, micro, accumulation, device, why)


def check_memory(cfg: TransformerConfig, dims: parallel.ParallelDims, chosen: PrecisionPolicy,
                 micro: int, seq: int, accumulation: int, device: str, model: str) -> None:
    """ValueError when the planner's memory for this mesh exceeds what one rank may hold."""
    need = parallel.device_memory(cfg, dims, micro_batch=micro, seq=seq, microbatches=accumulation,
                           recipe=chosen.name, act_dtype=chosen.compute_dtype,
                           sequence_parallel=dims.tp > 1)
    limit, what = memory_limit_bytes(device)
    if need.total > limit:
        parts = ", ".join(f"{k} {v / 1e9:.3g}" for k, v in dataclasses.asdict(need).items()
                          if isinstance(v, float) and v)
        raise ValueError(f"{model} does not fit: the planner puts {need.total / 1e9:.3g}"
                         f" GB on each rank ({parts} GB) and this machine has "
                         f"{limit / 1e9:.3g} GB ({what}); add ranks to dp_shard, or lower "
                         "--micro-batch or --seq-len")


def check_paths(run: Run) -> None:
    """The data file and the checkpoint directory, before any process-group work."""
    o = run.options
    if o.data is not None:
        tokens = data.TokenData(Path(o.data), dtype=o.data_dtype)
        tokens.check_vocab(run.config.vocab_size)
    if o.ckpt is not None:
        checkpoint_layout.check_writable(Path(o.ckpt))
        last = checkpoint_layout.latest(Path(o.ckpt))
        if last is not None:
            checkpoint_layout.check_compatible(last, dataclasses.asdict(run.config),
                                               checkpoint_layout.model_shapes(run.config))


def describe(run: Run) -> str:
    """One paragraph: what this run trains, on which mesh and recipe, and why that mesh."""
    d, o = run.dims, run.options
    mesh = mesh_text(d) if d.world_size > 1 else "one rank"
    c = run.config
    shape = (f"{c.n_layers} layers, d_model {c.d_model}, {c.n_heads} heads"
             f"{f' ({c.kv_heads} key/value)' if c.kv_heads != c.n_heads else ''}, {c.mlp}, "
             f"{c.norm}, {c.positions} positions{', tied head' if c.tie_embeddings else ''}"
             f"{', biases' if c.bias else ''}")
    lines = [f"train {o.config or o.preset or 'debug'} ({shape}) on "
             f"{d.world_size} {run.device} rank(s): {mesh}; {run.policy.name}; {run.steps} steps "
             f"of {o.global_batch} x {o.seq_len} tokens ({run.accumulation} micro-batches of "
             f"{run.micro_batch} per data-parallel rank); data: {o.data or 'stdlib bytes'}"]
    if run.why_mesh:
        lines.append(run.why_mesh)
    return "\n".join(lines)
