"""`python -m mlsys`: the book's napkin math from the command line.

    python -m mlsys napkin --preset xl --gpu H100 --batch 8 --seq 1024
    python -m mlsys napkin --preset 2.7B --gpu a100 --batch 4 --seq 1024 --devices 8 --mfu 0.5
    python -m mlsys plan --preset 2.7B --cluster dgx-h100 --devices 64 --batch 1024 --seq 1024
    python -m mlsys plan --preset xl --cluster dgx-h100 --devices 64 --batch 512 --seq 1024 --pp 4

`napkin` prints `mlsys.accounting.napkin.napkin(...)`: parameters, model-state memory against HBM
(replicated and sharded over --devices), FLOPs per token and per step, the main kernels on the
roofline, and the step time at --mfu. `plan` prints `mlsys.accounting.planner.plan(...)`: every
mesh of --devices (data replicate x shard x tensor x pipeline x context) the model allows, ranked
by predicted step time, with memory per device and MFU; --dp-replicate, --dp-shard, --tp, --pp
and --cp hold an axis; --plot FILE also draws every mesh's memory against its step time. Bad
arguments, and a mesh that cannot be built, end with a one-line error and exit status 2. Pure
arithmetic: no torch import, no device (matplotlib only for --plot). Recording GPU measurements is
a separate entry point, `python -m mlsys.experiments`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from mlsys import checks, dtypes, hardware, tables
from mlsys.accounting import memory, planner
from mlsys.accounting.napkin import napkin
from mlsys.accounting.params import count_params
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
    p.add_argument("--preset", required=True, choices=list(PRESETS), help="model size")
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


def _cluster(text: str) -> str:
    """The registry key of a cluster name, case-insensitive ("DGX-H100" -> "dgx-h100")."""
    hardware.get_cluster(text)  # unknown names list the known ones
    return text.strip().lower()


def _plan_parser(commands) -> None:
    p = commands.add_parser(
        "plan", help="every mesh for one model on a cluster: memory, step time, MFU, ranked"
    )
    p.add_argument("--preset", required=True, choices=list(PRESETS), help="model size")
    p.add_argument(
        "--cluster", required=True, type=_checked(_cluster), metavar="NAME",
        help=f"cluster, case-insensitive: {', '.join(hardware.CLUSTERS)}",
    )  # fmt: skip
    p.add_argument("--devices", required=True, type=_count("devices"), help="accelerators")
    p.add_argument("--batch", required=True, type=_count("batch"),
                   help="global batch, in sequences")
    p.add_argument("--seq", required=True, type=_count("seq"), help="tokens per sequence")
    for axis in ("dp_replicate", "dp_shard", "tp", "pp", "cp"):
        p.add_argument(f"--{axis.replace('_', '-')}", dest=axis, type=_count(axis), metavar="N",
                       help=f"hold the {axis} degree at N")
    p.add_argument("--microbatches", type=_count("microbatches"), metavar="M",
                   help="micro-batches per step (default: the best for each mesh)")
    p.add_argument(
        "--recipe", default="bf16_mixed_adamw", choices=list(memory.RECIPES), metavar="NAME",
        help=f"bytes per parameter of the model states: {', '.join(memory.RECIPES)} "
        "(default bf16_mixed_adamw)",
    )  # fmt: skip
    p.add_argument("--dtype", type=_checked(dtypes.canonical), default="bf16",
                   help="dtype of the compute, activations and peak FLOP/s (default bf16)")
    p.add_argument("--efficiency", type=_checked(_fraction("efficiency")), default=1.0,
                   help="share of peak the kernels reach when nothing waits (default 1)")
    p.add_argument("--top", type=_count("top"), default=10, help="rows to print (default 10)")
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


def _plan(args: argparse.Namespace) -> list[str]:
    cfg = TransformerConfig.preset(args.preset)
    longer = args.seq > cfg.context_length  # only the RoPE tables depend on it: no parameter
    if longer:
        cfg = TransformerConfig.preset(args.preset, context_length=args.seq)
    cluster = hardware.get_cluster(args.cluster)
    fixed = {axis: getattr(args, axis) for axis in ("dp_replicate", "dp_shard", "tp", "pp", "cp")
             if getattr(args, axis) is not None}
    plans = planner.plan(cfg, cluster, n_devices=args.devices, batch=args.batch, seq=args.seq,
                         recipe=args.recipe, dtype=args.dtype, efficiency=args.efficiency,
                         fixed=fixed, microbatches=args.microbatches)
    acc = cluster.accelerator
    fit = sum(p.fits for p in plans)
    drawn = []
    if args.plot:
        _draw_plans(plans, args.plot, f"{args.preset} on {args.devices} x {acc.name}, batch "
                    f"{args.batch} x {args.seq}")
        drawn = [f"figure: {args.plot}"]
    return [
        f"plan: {args.preset} ({count_params(cfg):,} parameters) on {args.devices} x {acc.name} "
        f"({cluster.name}); batch {args.batch} x {args.seq} tokens; {args.recipe}"
        + (f" (context length raised to {args.seq}: no parameter depends on it)" if longer
           else ""),
        f"{len(plans)} valid meshes, {fit} fit in {acc.hbm_bytes / 1e9:g} GB; compute at "
        f"{args.efficiency:.0%} of the {args.dtype} peak, communication by bandwidth only: "
        "times are lower bounds",
        *tables.plan_table(plans, top=args.top),
        *drawn,
    ]


def _draw_plans(plans: list[planner.Plan], path: str, title: str) -> None:
    import matplotlib  # heavy and optional: only --plot draws, the other commands import no plots

    matplotlib.use("Agg")  # a file, never a window
    from mlsys import plotting  # after choosing the backend: plotting imports pyplot

    fig, ax = plotting.subplots(width=7.0, height=4.5)
    plotting.plot_plans(plans, ax)
    ax.set_title(title, fontsize=9)
    fig.savefig(path, bbox_inches="tight")


def _napkin(args: argparse.Namespace) -> list[str]:
    summary = napkin(
        TransformerConfig.preset(args.preset), args.gpu, batch=args.batch, seq=args.seq,
        mfu=args.mfu, recipe=args.recipe, n_devices=args.devices, dtype=args.dtype,
        name=args.preset,
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
