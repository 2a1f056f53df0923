"""Measurements made by others, kept apart from `results/` and always shown with their source.

Only the project's own entry point writes `results/`; figures from elsewhere that the book compares
its predictions with live here, each with what is known of how they were made. They are data, not
claims: chapters read them with the same functions as their own rows, and label them as a third
party's.

`CS336_STUDENT_BENCHMARK`: the "benchmarking_script" table of a student's answers to Stanford
CS336 (2025) assignment 2 (the book's seed document 003): forward and backward times of the
assignment's model presets, mean ± standard deviation in seconds, on an NVIDIA GPU of the Ampere
generation (the kernel names in the same document, `ampere_sgemm_*`, say so; the model is not
named: an A100 is the course's GPU). fp32 throughout (no mixed precision in that part); the batch
size is not stated (the assignment's default is 4); "xl" and "2.7B" at 1,024 tokens ran out of
memory. `CS336_STUDENT_MEMORY`: the same student's activation-memory arithmetic for the 2.7B
preset (claims, which the book checks) and the peaks their memory profiles showed (measurements).
`CS336_STUDENT_COMPILE`: their compiled-vs-eager timings of the 2.7B preset.
Used in: §sec-benchmarking.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ThirdPartyTiming:
    """One row of someone else's timing table (seconds, mean ± std as they reported it)."""

    preset: str
    seq: int
    forward_s: float
    forward_std_s: float
    backward_s: float | None
    backward_std_s: float | None


SOURCE_CS336_STUDENT = (
    "a student's CS336 (2025) assignment 2 answers (the book's seed document 003, "
    "'benchmarking_script'): fp32, an Ampere-generation NVIDIA GPU (kernel names ampere_sgemm_*), "
    "batch size not stated"
)


def _rows(*rows: tuple) -> tuple[ThirdPartyTiming, ...]:
    return tuple(ThirdPartyTiming(*row) for row in rows)


CS336_STUDENT_BENCHMARK: tuple[ThirdPartyTiming, ...] = _rows(
    ("small", 128, 0.024990, 0.003563, 0.038322, 0.002954),
    ("small", 256, 0.025367, 0.004417, 0.049063, 0.002567),
    ("small", 512, 0.045261, 0.000825, 0.090594, 0.001188),
    ("small", 1024, 0.100708, 0.000716, 0.211727, 0.000911),
    ("medium", 128, 0.050908, 0.005962, 0.087088, 0.002770),
    ("medium", 256, 0.069079, 0.001410, 0.133111, 0.003494),
    ("medium", 512, 0.136048, 0.000567, 0.276496, 0.000773),
    ("medium", 1024, 0.304968, 0.004783, 0.633960, 0.001317),
    ("large", 128, 0.076409, 0.002497, 0.165961, 0.002494),
    ("large", 256, 0.142913, 0.001806, 0.295382, 0.001223),
    ("large", 512, 0.286054, 0.000640, 0.608992, 0.001492),
    ("large", 1024, 0.647840, 0.000234, 1.412987, 0.001817),
    ("xl", 128, 0.147299, 0.000618, 0.310275, 0.001511),
    ("xl", 256, 0.290322, 0.000595, 0.614989, 0.001647),
    ("xl", 512, 0.580613, 0.000683, 1.206849, 0.001162),
    ("2.7B", 128, 0.228727, 0.000904, 0.464187, 0.001014),
    ("2.7B", 256, 0.426069, 0.000868, 0.911233, 0.001972),
    ("2.7B", 512, 0.876249, 0.001014, 1.822075, 0.002266),
)
"""The student's table, row for row (xl and 2.7B at 1,024 tokens: out of memory, no row)."""

CS336_STUDENT_OOM: tuple[tuple[str, int], ...] = (("xl", 1024), ("2.7B", 1024))


@dataclass(frozen=True)
class ThirdPartyMemory:
    """One row of someone else's memory table for the 2.7B preset at batch 4 (their units)."""

    seq: int
    claimed_forward_gb: float  # their "forward pass" activations column (GB as they wrote it)
    claimed_training_gb: float  # their "training step" column: 52.0 + the forward column
    measured_training_gb: float | None  # their memory profile's peak of a full step, "about"


SOURCE_CS336_STUDENT_MEMORY = (
    "a student's CS336 (2025) assignment 2 answers (the book's seed document 003, "
    "'memory_profiling' (b) and (d)): the 2.7B preset, fp32, batch 4, an Ampere-generation GPU; "
    "the forward-only peak was 'about 14GB' at every length"
)

CS336_STUDENT_MEMORY: tuple[ThirdPartyMemory, ...] = tuple(ThirdPartyMemory(*row) for row in (
    (128, 3.8, 55.8, 55.0),
    (256, 7.1, 59.1, 55.0),
    (512, 20.4, 72.4, 70.0),
    (1024, 73.7, 125.7, None),
))
"""The student's "Concrete Examples" table for B = 4 with the peaks their memory profiles showed
(no 1,024-token run: it ran out of memory). Their formula for the same column is
B S (5.9375 + 0.0078125 S) MB with MB = 2**20 bytes, 4 bytes per element of
32 (48,640 B S + 64 B S^2) elements; their model states are "52.0 GB" (4 x 3,406,809,600 x 4
bytes, written as 4 x 13.0 GB)."""
CS336_STUDENT_FORWARD_PEAK_GB = 14.0
CS336_STUDENT_MIB_PER_TOKEN = 5.9375  # their linear coefficient, MB (2**20 bytes) per B S
CS336_STUDENT_MIB_PER_TOKEN_SQUARED = 0.0078125  # their quadratic coefficient, MB per B S^2
CS336_STUDENT_STATES_MB = 53_248  # their "Total = 53,248 + ... MB" (52 x 1,024)


@dataclass(frozen=True)
class ThirdPartyCompile:
    """One row of someone else's torch.compile table: mean ± std seconds, compiled and eager."""

    mode: str  # "forward", "forward+backward" or "step" (with AdamW)
    seq: int
    compiled_s: float
    compiled_std_s: float
    eager_s: float
    eager_std_s: float


SOURCE_CS336_STUDENT_COMPILE = (
    "a student's CS336 (2025) assignment 2 answers (the book's seed document 003, "
    "'torch_compile' (b)): the 2.7B preset, fp32, the model compiled and the optimizer eager, an "
    "Ampere-generation GPU; the number of timed calls is not stated"
)

CS336_STUDENT_COMPILE: tuple[ThirdPartyCompile, ...] = tuple(ThirdPartyCompile(*row) for row in (
    ("forward", 128, 0.217226, 0.000796, 0.228216, 0.001284),
    ("forward", 256, 0.413480, 0.001356, 0.432793, 0.001141),
    ("forward", 512, 0.837994, 0.002571, 0.886016, 0.003243),
    ("forward+backward", 128, 0.669945, 0.002657, 0.698588, 0.002538),
    ("forward+backward", 256, 1.315280, 0.015164, 1.370025, 0.011527),
    ("forward+backward", 512, 2.597093, 0.014910, 2.744409, 0.018515),
    ("step", 128, 1.072056, 0.155152, 1.000071, 0.003301),
    ("step", 256, 1.608300, 0.013519, 1.651156, 0.005215),
    ("step", 512, 2.878511, 0.010863, 3.027354, 0.012318),
))
"""The student's compiled and uncompiled 2.7B tables, row for row; they concluded "compiled is
faster but not enough"."""
