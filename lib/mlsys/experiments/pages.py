"""What a page shows of a GPU record beyond its tables: the callbacks `experiments.show_recorded`
takes as `show=`, one per experiment that has more to show.

Each takes a record (`{"provenance": ..., "results": rows}`), draws its figure (`kit.draw`, shown
at once) and returns what the page prints or displays after it: a sentence, a table, or a list of
them. They read the record through the experiment's own functions, so a recorded GPU run and the
page's live run say the same things. Used in: chapters 01 to 06 and 09.
"""

from __future__ import annotations

from typing import Any

from mlsys import hardware
from mlsys.experiments import (
    dot_accumulation,
    flash_benchmark,
    gemm_shapes,
    kit,
    roofline_ops,
    train_step,
    training_memory,
)


def _accelerator(record: dict[str, Any]) -> hardware.Accelerator | None:
    """The `mlsys.hardware` entry of the GPU that made `record`, if the table knows it."""
    return hardware.match_device_name(record["provenance"]["device"])


def show_dot_accumulation(record: dict[str, Any]) -> str:
    """Its figure of errors against K, and what its device matmuls' errors say."""
    rows = record["results"]
    kit.draw(dot_accumulation.plot, rows, width=9.0, height=4.0,
             title=f"Recorded: {dot_accumulation.describe(rows)}")
    return dot_accumulation.device_verdicts(rows) + "."


def show_training_memory(record: dict[str, Any]) -> str:
    """Its allocator figure, and its verdicts as sentences."""
    rows = record["results"]
    kit.draw(training_memory.plot, rows, width=8.5, height=4.2,
             title=f"Recorded on {record['provenance']['device']}")
    return " ".join(f"{v[0].upper()}{v[1:]}." for v in training_memory.verdicts(rows).values())


def show_train_step(record: dict[str, Any]) -> list[Any]:
    """Its table with the MFU against its own GPU's spec, and its verdict."""
    rows = record["results"]
    return [train_step.table(rows, _accelerator(record)), train_step.mfu_verdict(rows)]


def show_roofline_ops(record: dict[str, Any]) -> None:
    """Its roofline, with its GPU's spec roof."""
    kit.draw(roofline_ops.plot, record["results"], width=9.5, height=4.6,
             title=f"Recorded: {record['provenance']['device']}", accelerator=_accelerator(record))


def show_flash_benchmark(record: dict[str, Any]) -> str:
    """The TFLOP/s of every implementation at the targets' combo (`TARGET`), and the targets."""
    rows, target = record["results"], flash_benchmark.TARGET
    kit.draw(flash_benchmark.plot, rows, width=8.0, height=4.0,
             **{k: target[k] for k in ("dtype", "causal", "d_head")})
    return f"targets: {flash_benchmark.targets(rows, _accelerator(record))}"


def show_gemm_shapes(record: dict[str, Any]) -> str:
    """Its wave sweep (measured and predicted TFLOP/s against M), and its verdict."""
    rows = record["results"]
    kit.draw(gemm_shapes.plot, rows, width=8.0, height=4.0)
    words = gemm_shapes.model_verdict(rows)
    return words[0].upper() + words[1:] + "."
