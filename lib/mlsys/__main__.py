"""`python -m mlsys`: the book's napkin math from the command line.

    python -m mlsys napkin --preset xl --gpu H100 --batch 8 --seq 1024
    python -m mlsys napkin --model llama3-8b --gpu h100 --batch 1 --seq 8192 --devices 8
    python -m mlsys plan --preset 2.7B --cluster dgx-h100 --devices 64 --batch 1024 --seq 1024
    python -m mlsys plan --config config.json --cluster my-cluster.json --devices 512 \
        --batch 1024 --seq 4096 --tp 8 --recompute selective --json

`napkin` prints `mlsys.accounting.napkin.napkin(...)`: parameters, model-state memory against HBM
(replicated and sharded over --devices), FLOPs per token and per step, the main kernels on the
roofline, and the step time at --mfu. `plan` prints `mlsys.accounting.planner.plan(...)`: every
mesh of --devices (data replicate x shard x tensor x pipeline x context) the model allows, ranked
by predicted step time (the calibrated step model, `--step-model first_order` for the book's
first-order one), with memory per device, MFU and the best meshes' time broken down; `--json`
prints one JSON object a line per mesh, best first. The model is a preset (--preset), a named
configuration (--model, `mlsys.models.catalog`) or a Hugging Face config.json (--config); the
cluster a name or a JSON file (`mlsys.cluster_file`). Degrees given (--tp, --pp, --cp, --ep, --dp,
--dp-replicate, --dp-shard, --virtual-stages) are held, the rest searched; --dp is the data-parallel
degree: dp_shard (FSDP) with --zero 3, dp_replicate with --zero 0, 1 or 2, their product without
--zero. --plot FILE also draws every mesh's memory against its step time. Bad arguments (an
unknown model, a bad config or cluster file, degrees the model or the devices do not allow, flags
that disagree) end with a one-line error naming the flag and exit status 2, before any search.
Pure arithmetic: no torch import, no device (matplotlib only for --plot). Recording GPU
measurements is a separate entry point, `python -m mlsys.experiments`. Over 300 lines, one
module: the two commands' flags and the rules that tie them together (a model from one of three
sources, held degrees against the model and the devices, --dp with --zero) are one command line,
best read together.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from mlsys import checks, cluster_file, dtypes, hardware, tables
from mlsys.accounting import memory, parallel, planner
from mlsys.accounting.napkin import napkin
from mlsys.accounting.params import count_params
from mlsys.models import catalog, hf_config
from mlsys.models.config import PRESETS, TransformerConfig


def _checked(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse `type` whose errors read "argument --batch: batch must be ..." (exit 2)."""

    def parse(text: str) -> Any:
        try:
            return convert(text)
        except (TypeError, ValueError) as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    parse.__name__ = convert.__name__
    return parse


def _count(name: str) -> Callable[[str], int]:
    def count(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{name} must be a positive integer, got {text!r}") from None
        return checks.positive_int(value, name)

    return _checked(count)


def _mfu(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"mfu must be a number in (0, 1], got {text!r}") from None
    return checks.fraction(value, "mfu")


def _accelerator(text: str) -> str:
    """The registry key of an accelerator name, case-insensitive ("H100" -> "h100")."""
    hardware.get(text)  # unknown names list the known ones
    return text.strip().lower()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mlsys",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = commands.add_parser(
        "napkin", help="one model on one accelerator: memory, FLOPs, kernels, step time"
    )
    _model_arguments(p)
    p.add_argument(
        "--gpu", required=True, type=_checked(_accelerator), metavar="NAME",
        help=f"accelerator, case-insensitive: {', '.join(hardware.ACCELERATORS)}",
    )  # fmt: skip
    p.add_argument("--batch", required=True, type=_count("batch"), help="sequences per device")
    p.add_argument("--seq", required=True, type=_count("seq"), help="tokens per sequence")
    p.add_argument("--mfu", type=_checked(_mfu), default=0.4, help="assumed MFU (default 0.4)")
    p.add_argument(
        "--recipe", default="bf16_mixed_adamw", choices=list(memory.RECIPES), metavar="NAME",
        help=f"bytes per parameter of the model states: {', '.join(memory.RECIPES)} "
        "(default bf16_mixed_adamw)",
    )  # fmt: skip
    p.add_argument(
        "--devices", type=_count("devices"), default=1, metavar="N",
        help="devices: data parallel, states replicated or sharded over them (default 1)",
    )  # fmt: skip
    p.add_argument(
        "--dtype", type=_checked(dtypes.canonical), default="bf16",
        help="dtype of weights, activations and the peak FLOP/s (default bf16)",
    )  # fmt: skip
    p.set_defaults(run=_napkin, command_parser=p)
    _plan_parser(commands)
    return parser


def _cluster(text: str) -> hardware.Cluster:
    """A cluster by name, case-insensitive ("DGX-H100"), or read from a JSON file (a name that
    ends in .json or names a file: `mlsys.cluster_file.load_cluster`)."""
    if text.strip().lower().endswith(".json") or os.path.isfile(text):
        return cluster_file.load_cluster(text)
    return hardware.get_cluster(text)  # unknown names list the known ones


def _named(text: str) -> tuple[str, TransformerConfig]:
    """--model NAME: a named configuration of `mlsys.models.catalog` (unknown names list them)."""
    return text, catalog.named_config(text)


def _hf_config(text: str) -> tuple[str, TransformerConfig]:
    """--config PATH: a Hugging Face config.json (or its folder) read by
    `mlsys.models.hf_config.from_hf_config`."""
    try:
        cfg = hf_config.from_hf_config(text)
    except OSError as error:  # no such file: a bad argument like the others
        raise ValueError(str(error)) from None
    return os.path.basename(os.path.abspath(text)), cfg


def _model_arguments(p: argparse.ArgumentParser) -> None:
    """--preset, --model or --config: exactly one."""
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--preset", choices=list(PRESETS), help="one of the book's model sizes")
    group.add_argument("--model", type=_checked(_named), metavar="NAME",
                       help="a named configuration (Llama 3, GPT-3, Mixtral, Megatron-LM's "
                       "GPTs: mlsys.models.catalog)")
    group.add_argument("--config", type=_checked(_hf_config), metavar="PATH",
                       help="a Hugging Face config.json (Llama, Mistral, Qwen2, Mixtral, GPT-2, "
                       "OPT; others are refused naming what is not understood)")


def _chosen_model(args: argparse.Namespace) -> tuple[str, TransformerConfig]:
    """(name, config) of --preset, --model or --config."""
    if args.preset is not None:
        return args.preset, TransformerConfig.preset(args.preset)
    return args.model if args.model is not None else args.config


def _zero(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value not in (0, 1, 2, 3):
        raise ValueError(f"zero must be 0, 1, 2 or 3, got {text!r}")
    return value


def _plan_dtype(text: str) -> str:
    """A dtype of the compute: "fp8" (any fp8 spelling) or a 16/32-bit one."""
    name = dtypes.canonical(text)
    return "fp8" if name.startswith("fp8") else name


def _plan_parser(commands) -> None:
    p = commands.add_parser(
        "plan", help="every mesh for one model on a cluster: memory, step time, MFU, ranked"
    )
    _model_arguments(p)
    p.add_argument(
        "--cluster", required=True, type=_checked(_cluster), metavar="NAME|PATH",
        help=f"cluster: a name, case-insensitive ({', '.join(hardware.CLUSTERS)}), or a JSON "
        "file (mlsys.cluster_file; examples/clusters/)",
    )  # fmt: skip
    p.add_argument("--devices", required=True, type=_count("devices"), help="accelerators")
    p.add_argument("--batch", required=True, type=_count("batch"),
                   help="global batch, in sequences")
    p.add_argument("--seq", required=True, type=_count("seq"), help="tokens per sequence")
    for axis in ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "dp"):
        p.add_argument(f"--{axis.replace('_', '-')}", dest=axis, type=_count(axis), metavar="N",
                       help=f"hold the {axis} degree at N" + (
                           " (the data-parallel degree: dp_shard with --zero 3, dp_replicate "
                           "with --zero 0-2, their product without --zero)" if axis == "dp"
                           else " (experts over N ranks of dp x cp)" if axis == "ep" else ""))
    p.add_argument("--zero", type=_checked(_zero), metavar="0|1|2|3",
                   help="data-parallel sharding: 0-2 the ZeRO stage of the copies (no FSDP), 3 "
                   "FSDP (default: copies and shards searched, and the copies' stage)")
    p.add_argument("--virtual-stages", type=_count("virtual_stages"), metavar="V",
                   help="interleaved 1F1B with V model chunks per stage (default: searched)")
    p.add_argument("--micro-batch", type=_count("micro_batch"), metavar="B",
                   help="sequences per micro-batch (default: searched)")
    p.add_argument("--microbatches", type=_count("microbatches"), metavar="M",
                   help="micro-batches per step (default: the best for each mesh)")
    p.add_argument("--recompute", choices=list(parallel.RECOMPUTE),
                   help="activation recomputation (default: the cheapest that fits, searched)")
    p.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                   help="sequence parallelism with TP (default: on when tp > 1)")
    p.add_argument(
        "--recipe", default="bf16_mixed_adamw", choices=list(memory.RECIPES), metavar="NAME",
        help=f"bytes per parameter of the model states: {', '.join(memory.RECIPES)} "
        "(default bf16_mixed_adamw)",
    )  # fmt: skip
    p.add_argument("--dtype", type=_checked(_plan_dtype), default="bf16",
                   help="compute dtype: bf16, or fp8 for the linear layers' matmuls (default "
                   "bf16)")
    p.add_argument("--step-model", choices=("calibrated", "first_order"), default="calibrated",
                   help="the step-time model: calibrated (GEMMs, collectives, overlap; the "
                   "default) or the book's first-order one")
    p.add_argument("--efficiency", type=_checked(_fraction("efficiency")), default=1.0,
                   help="first-order model: share of peak the kernels reach (default 1)")
    p.add_argument("--top", type=_count("top"), default=10, help="rows to print (default 10)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per line per mesh, best first, instead of the table")
    p.add_argument("--plot", type=_checked(_figure_path), metavar="FILE",
                   help="also draw memory per device against step time, every mesh, to FILE "
                   f"({', '.join(FIGURE_SUFFIXES)})")
    p.set_defaults(run=_plan, command_parser=p)


FIGURE_SUFFIXES = (".png", ".svg", ".pdf")


def _figure_path(text: str) -> str:
    """A file name matplotlib can write: a known suffix, in a folder that exists."""
    suffix = os.path.splitext(text)[1].lower()
    if suffix not in FIGURE_SUFFIXES:
        raise ValueError(f"plot must end in {', '.join(FIGURE_SUFFIXES)}, got {text!r}")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise ValueError(f"plot's folder {folder!r} does not exist")
    return text


def _fraction(name: str) -> Callable[[str], float]:
    def fraction(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{name} must be a number in (0, 1], got {text!r}") from None
        return checks.fraction(value, name)

    fraction.__name__ = name
    return fraction


def _data_degrees(args: argparse.Namespace) -> tuple[dict[str, int], int | None]:
    """The held dp_replicate / dp_shard degrees from --dp, --dp-replicate, --dp-shard and
    --zero, and the data-parallel product to hold (--dp without --zero); ValueError when the
    flags disagree."""
    fixed = {a: getattr(args, a) for a in ("dp_replicate", "dp_shard")
             if getattr(args, a) is not None}
    zero, dp = args.zero, args.dp
    if zero == 3 and fixed.get("dp_replicate", 1) != 1:
        raise ValueError(f"--zero 3 shards every data-parallel rank (FSDP): --dp-replicate "
                         f"({fixed['dp_replicate']}) must be 1 or left out")
    if zero is not None and zero < 3 and fixed.get("dp_shard", 1) != 1:
        raise ValueError(f"--zero {zero} keeps whole copies (no FSDP): --dp-shard "
                         f"({fixed['dp_shard']}) must be 1 or left out")
    if zero is not None:
        fixed.setdefault("dp_replicate" if zero == 3 else "dp_shard", 1)
    product = None
    if dp is not None:
        if zero is not None:
            axis = "dp_shard" if zero == 3 else "dp_replicate"
            if fixed.get(axis, dp) != dp:
                raise ValueError(f"--dp ({dp}) and --{axis.replace('_', '-')} ({fixed[axis]}) "
                                 f"disagree: with --zero {zero}, --dp is the {axis} degree")
            fixed[axis] = dp
        elif len(fixed) == 2 and fixed["dp_replicate"] * fixed["dp_shard"] != dp:
            raise ValueError(f"--dp ({dp}) != --dp-replicate x --dp-shard = "
                             f"{fixed['dp_replicate']} x {fixed['dp_shard']}")
        elif len(fixed) == 1:
            (axis, degree), = fixed.items()
            if dp % degree:
                raise ValueError(f"--{axis.replace('_', '-')} ({degree}) does not divide --dp "
                                 f"({dp})")
            other = "dp_shard" if axis == "dp_replicate" else "dp_replicate"
            fixed[other] = dp // degree
        else:
            product = dp
    return fixed, product


def _check_degrees(args: argparse.Namespace, cfg, fixed: dict[str, int]) -> None:
    """Every degree given against the devices and the model, before any search; the error
    names the flags: "--tp 6: n_kv_heads (4) and tp (6) must divide one another ..."."""
    held = {**fixed, "ep": args.ep, "dp": args.dp}
    flags = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in
                     {**held, "virtual_stages": args.virtual_stages}.items()
                     if value is not None and (value > 1 or name in ("tp", "pp", "cp", "ep")))
    try:
        for name, degree in held.items():
            if degree is not None and args.devices % degree:
                raise ValueError(f"{name} ({degree}) does not divide the devices "
                                 f"({args.devices})")
        if args.devices % math.prod(fixed.values()) or len(fixed) == len(parallel.MESH_AXES):
            parallel.ParallelDims(**fixed, world_size=args.devices)  # says why, with the product
        # with pp searched, the planner keeps the pp that v chunks per stage allow
        v = args.virtual_stages if args.virtual_stages and "pp" in fixed else 1
        parallel.check_degrees(cfg, tp=fixed.get("tp", 1), pp=fixed.get("pp", 1),
                               virtual_stages=v, ep=args.ep or 1)
    except ValueError as error:
        raise ValueError(f"{flags}: {error}" if flags else str(error)) from None
    if args.micro_batch is not None and args.batch % args.micro_batch:
        raise ValueError(f"--micro-batch ({args.micro_batch}) does not divide --batch "
                         f"({args.batch})")


def _planned(args: argparse.Namespace, cfg) -> list[planner.Plan]:
    """The planner's ranking for the arguments (held degrees, knobs), best first."""
    fixed = {a: getattr(args, a) for a in ("tp", "pp", "cp") if getattr(args, a) is not None}
    data, product = _data_degrees(args)
    fixed.update(data)
    _check_degrees(args, cfg, fixed)
    knobs: dict[str, Any] = {"model": args.step_model}
    optional = {"micro_batch": args.micro_batch, "sequence_parallel": args.sequence_parallel,
                "recompute": args.recompute, "virtual_stages": args.virtual_stages,
                "ep": args.ep, "zero": args.zero if args.zero != 3 else None}
    knobs.update({k: v for k, v in optional.items() if v is not None})
    plans = planner.plan(cfg, args.cluster, n_devices=args.devices, batch=args.batch,
                         seq=args.seq, recipe=args.recipe, dtype=args.dtype,
                         efficiency=args.efficiency, fixed=fixed,
                         microbatches=args.microbatches, **knobs)
    if product is not None:  # --dp without --zero: the split between copies and shards searched
        plans = [p for p in plans if p.dims.dp == product]
        if not plans:
            raise ValueError(f"no mesh with dp_replicate x dp_shard = --dp ({product}) is valid")
    return plans


def _plan(args: argparse.Namespace) -> list[str]:
    name, cfg = _chosen_model(args)
    longer = args.seq > cfg.context_length and getattr(cfg, "positions", "rope") == "rope"
    if longer:  # only the RoPE tables depend on it: no parameter
        cfg = dataclasses.replace(cfg, context_length=args.seq)
    cluster = args.cluster
    plans = _planned(args, cfg)
    if args.json:
        return [json.dumps(p.as_json()) for p in plans]
    acc = cluster.accelerator
    fit = sum(p.fits for p in plans)
    drawn = []
    if args.plot:
        _draw_plans(plans, args.plot, f"{name} on {args.devices} x {acc.name}, batch "
                    f"{args.batch} x {args.seq}")
        drawn = [f"figure: {args.plot}"]
    how = ("calibrated step model: GEMMs by shape, collectives with latency, overlap by axis"
           if args.step_model == "calibrated" else
           f"compute at {args.efficiency:.0%} of the {args.dtype} peak, communication by "
           "bandwidth only: times are lower bounds")
    return [
        f"plan: {name} ({count_params(cfg):,} parameters) on {args.devices} x {acc.name} "
        f"({cluster.name}); batch {args.batch} x {args.seq} tokens; {args.recipe}; "
        f"recompute {args.recompute or 'searched'}; {args.dtype}"
        + (f" (context length raised to {args.seq}: no parameter depends on it)" if longer
           else ""),
        f"{len(plans)} valid meshes, {fit} fit in {acc.hbm_bytes / 1e9:g} GB; {how}",
        *tables.plan_table(plans, top=args.top),
        *_breakdown_lines(plans[:min(3, args.top)]),
        *drawn,
    ]


def _breakdown_lines(plans: Sequence[planner.Plan]) -> list[str]:
    """Where each of the best meshes' step goes: compute, recomputation, bubble, the exposed
    communication of each axis and the optimizer, with the knobs the mesh runs with."""
    out = [""]
    for i, p in enumerate(plans, 1):
        unit, scale = ("s", 1.0) if p.step_s >= 1 else ("ms", 1e3)
        recompute = getattr(p, "recompute_s", 0.0)
        compute = p.compute_s - recompute if getattr(p, "compute_includes_recompute",
                                                     False) else p.compute_s
        parts = {"compute": compute, "recompute": recompute, "bubble": p.bubble_s}
        parts.update({k: v for k, v in p.exposed_s.items() if v > 0})
        parts.update({k: v for k, v in (getattr(p, "other_s", None) or {}).items() if v > 0})
        knobs = [f"micro-batch {getattr(p, 'micro_batch', '?')} x {p.microbatches}",
                 f"v {getattr(p, 'virtual_stages', 1)}",
                 f"recompute {getattr(p, 'recompute', 'none')}",
                 f"ZeRO-{getattr(p, 'zero', 0)}" if p.dims.dp_replicate > 1 else ""]
        out.append(f"#{i} {tables.mesh_text(p.dims)} ({', '.join(k for k in knobs if k)}): "
                   f"step {p.step_s * scale:.4g} {unit} = "
                   + " + ".join(f"{name} {t * scale:.4g}" for name, t in parts.items()))
    return out


def _draw_plans(plans: list[planner.Plan], path: str, title: str) -> None:
    import matplotlib  # heavy and optional: only --plot draws, the other commands import no plots

    matplotlib.use("Agg")  # a file, never a window
    from mlsys import plotting  # after choosing the backend: plotting imports pyplot

    fig, ax = plotting.subplots(width=7.0, height=4.5)
    plotting.plot_plans(plans, ax)
    ax.set_title(title, fontsize=9)
    fig.savefig(path, bbox_inches="tight")


def _napkin(args: argparse.Namespace) -> list[str]:
    name, cfg = _chosen_model(args)
    summary = napkin(
        cfg, args.gpu, batch=args.batch, seq=args.seq, mfu=args.mfu, recipe=args.recipe,
        n_devices=args.devices, dtype=args.dtype, name=name,
    )  # fmt: skip
    return tables.napkin_lines(summary)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv`, run the command and print its lines; bad input exits 2 via `parser.error`."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        lines = args.run(args)
    except (TypeError, ValueError) as error:  # rules that involve several arguments
        args.command_parser.error(str(error))
    try:
        print("\n".join(lines), flush=True)
    except BrokenPipeError:  # the reader stopped early (`| head`): not an error, no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # as the Python docs advise
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
