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
`CS336_STUDENT_ATTENTION`: their naive-attention sweep (time and memory by head dim and length).
`CS336_STUDENT_ALLREDUCE` and `CS336_STUDENT_DDP_XL`: their NCCL all-reduce table and DDP step
breakdowns of the xl preset on 2 GPUs (chapter 08). `PUBLISHED_MFU`: the utilizations large
training runs reported (PaLM, Megatron-LM, Llama 3), each with its paper (chapter 03).
`MEGATRON_TABLE1`: Megatron-LM's weak-scaling table (GPT 1.7B to 1T on up to 3,072 A100s), the
calibration of `accounting.step_model`, with the micro-batch and interleaving of the authors'
script. `LLAMA3_405B_RUN`: Llama 3 405B's pre-training mesh and throughput, the step model's test.
A little over 300 lines: it is a data table, each measurement with its source, not logic.
Used in: §sec-flops, §sec-benchmarking, §sec-data-parallel.
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


# --- chapter 08: the seed's all-reduce and DDP tables --------------------------------------------


@dataclass(frozen=True)
class ThirdPartyAllReduce:
    """One all-reduce block of someone else's NCCL benchmark (seconds; their statistics)."""

    world_size: int
    message_bytes: int  # their "MB" are 2**20 bytes: "1 MB (262144 float32 elements)"
    mean_s: float  # their "Overall average time" (for 6 ranks: the mean of the per-rank averages)
    min_s: float | None  # None where the block is cut off
    max_s: float
    std_s: float
    claimed_gb_per_s: float  # their "Effective bandwidth ... GB/s"
    size_stated: bool  # False: the block's header is lost, the size inferred (see the note)


SOURCE_CS336_STUDENT_ALLREDUCE = (
    "a student's CS336 (2025) assignment 2 answers (the book's seed document 003, 'Section 2: "
    "DDP', all-reduce benchmark): NCCL, float32 tensors, 20 timed iterations, GPUs of the Ampere "
    "generation (model not stated; one node assumed)"
)

CS336_STUDENT_ALLREDUCE: tuple[ThirdPartyAllReduce, ...] = tuple(
    ThirdPartyAllReduce(*row) for row in (
        (2, 2**20, 0.047e-3, 0.040e-3, 0.088e-3, 0.010e-3, 20.70, True),
        (2, 10 * 2**20, 0.115e-3, 0.102e-3, 0.167e-3, 0.012e-3, 84.68, True),
        (2, 100 * 2**20, 0.739e-3, 0.722e-3, 0.756e-3, 0.010e-3, 132.17, True),
        (2, 2**30, 6.745e-3, 6.618e-3, 6.902e-3, 0.089e-3, 148.26, True),
        (4, 2**30, 9.878e-3, 9.820e-3, 9.938e-3, 0.029e-3, 151.85, True),
        (6, 2**30, 9.19117e-3, None, 9.397e-3, 0.041e-3, 181.34, False),
    ))
"""The student's all-reduce blocks, in their order. The 6-rank block is cut off above its maximum
time: its world size comes from its six per-rank averages (9.190, 9.190, 9.195, 9.187, 9.194,
9.191 ms), its size of 1,024 MiB from its bandwidth, which that size reproduces. Their "Effective
bandwidth" is the bus bandwidth (algorithm bandwidth x 2 (n-1)/n) in GiB/s, printed as "GB/s":
`accounting.comms.claimed_effective_gb_per_s` reproduces every one to the rounding of the printed
times (three decimals of a millisecond)."""


@dataclass(frozen=True)
class ThirdPartyDDPStep:
    """One run of someone else's DDP training benchmark: mean seconds per step and per phase."""

    label: str
    mode_flag: str | None  # the --ddp-mode its command line passed (None: no command shown)
    iterations: int
    total_s: float
    total_std_s: float
    forward_s: float
    backward_s: float
    communication_s: float
    optimizer_s: float


SOURCE_CS336_STUDENT_DDP = (
    "a student's CS336 (2025) assignment 2 answers (the book's seed document 003, 'Benchmark "
    "DDP'): the 'xl' preset (1,998,235,200 parameters, fp32), 2 GPUs of the Ampere generation, "
    "batch 4, 512 tokens, NCCL"
)

CS336_STUDENT_DDP_XL: tuple[ThirdPartyDDPStep, ...] = tuple(ThirdPartyDDPStep(*row) for row in (
    ("first run (mode not printed)", None, 20, 0.895226, 0.001273, 0.251488, 0.529557, 0.007419,
     0.106143),
    ("second run (mode not printed)", None, 20, 0.892449, 0.001139, 0.250523, 0.529228,
     0.007083, 0.104998),
    ("naive (profile 'naive_ddp')", "naive", 5, 0.936877, 0.001199, 0.253241, 0.506919,
     0.070061, 0.106407),
    ("'flat' (profile 'naive_flatten_ddp')", "naive", 5, 0.935486, 0.000801, 0.253286, 0.505358,
     0.070098, 0.106583),
))
"""The student's four DDP runs of the xl preset on 2 GPUs. The last was saved as a "flatten"
profile, but its command line passed `--ddp-mode naive` and its banner says "Naive Sync, No
Overlap": it was the naive run again, as its times (within 0.1% of the naive run's) confirm."""
CS336_STUDENT_DDP_PARAMS = 1_998_235_200
CS336_STUDENT_DDP_CLAIMED_MB = 7622.66  # "(7622.66 MB)": the fp32 bytes in MiB (2**20)
CS336_STUDENT_DDP_SETUP = {"preset": "xl", "world_size": 2, "batch": 4, "seq": 512}


@dataclass(frozen=True)
class ThirdPartyAttention:
    """One row of someone else's attention sweep (batch 8, one head, fp32): ms mean ± std, MB."""

    variant: str  # "eager" or "compiled"
    d_head: int
    seq: int
    forward_ms: float
    forward_std_ms: float
    backward_ms: float
    backward_std_ms: float
    before_backward_mb: float  # "Mem Before" (before the backward), MB as they printed it
    peak_mb: float  # "Peak Mem"


SOURCE_CS336_STUDENT_ATTENTION = (
    "a student's CS336 (2025) assignment 2 answers (the book's seed document 003, "
    "'pytorch_attention' (a) and 'torch_compile' (a)): batch 8, one head, fp32, non-causal, an "
    "Ampere-generation GPU; memory read with torch.cuda memory statistics, MB as printed"
)

CS336_STUDENT_ATTENTION: tuple[ThirdPartyAttention, ...] = tuple(
    ThirdPartyAttention(*row) for row in (
        ("eager", 16, 256, 0.13, 0.00, 0.37, 0.71, 10.62, 25.25),
        ("eager", 16, 1024, 0.35, 0.01, 1.10, 1.30, 50.25, 148.25),
        ("eager", 16, 4096, 4.15, 0.12, 10.17, 0.52, 536.25, 2080.25),
        ("eager", 16, 8192, 14.42, 0.14, 35.16, 1.19, 2080.25, 8240.25),
        ("eager", 16, 16384, 58.65, 0.41, 142.65, 0.26, 8240.25, 32848.25),
        ("eager", 32, 256, 0.14, 0.03, 0.29, 0.10, 19.25, 26.25),
        ("eager", 32, 1024, 0.38, 0.04, 1.24, 1.62, 52.25, 152.25),
        ("eager", 32, 4096, 4.40, 0.13, 10.35, 0.41, 544.25, 2096.25),
        ("eager", 32, 8192, 15.46, 0.14, 35.81, 0.15, 2096.25, 8272.25),
        ("eager", 32, 16384, 62.82, 0.48, 147.48, 0.41, 8272.25, 32912.25),
        ("eager", 64, 256, 0.13, 0.00, 0.40, 0.81, 20.25, 28.25),
        ("eager", 64, 1024, 0.41, 0.02, 1.13, 1.65, 56.25, 160.25),
        ("eager", 64, 4096, 4.90, 0.13, 10.84, 0.39, 560.25, 2128.25),
        ("eager", 64, 8192, 17.51, 0.16, 38.07, 0.20, 2128.25, 8336.25),
        ("eager", 64, 16384, 71.19, 0.35, 155.57, 0.44, 8336.25, 33040.25),
        ("eager", 128, 256, 0.13, 0.00, 0.37, 0.12, 22.25, 32.25),
        ("eager", 128, 1024, 0.46, 0.02, 1.04, 0.07, 64.25, 176.25),
        ("eager", 128, 4096, 5.86, 0.14, 11.87, 0.39, 592.25, 2192.25),
        ("eager", 128, 8192, 21.35, 0.16, 42.39, 0.20, 2192.25, 8464.25),
        ("eager", 128, 16384, 86.41, 0.51, 172.25, 0.40, 8464.25, 33296.25),
        ("compiled", 16, 16384, 59.87, 1.52, 126.94, 1.84, 8256.25, 16720.25),
        ("compiled", 32, 16384, 64.30, 1.42, 130.31, 1.62, 8272.25, 16752.25),
        ("compiled", 64, 16384, 72.06, 1.40, 138.61, 1.80, 8336.25, 16688.25),
        ("compiled", 128, 16384, 87.84, 1.23, 156.10, 1.65, 8464.25, 16976.25),
    ))
"""The student's eager sweep row for row, and their compiled rows at 16,384 tokens (the length
where the difference shows). They wrote: "I don't know how to eliminate the memory cost"."""


@dataclass(frozen=True)
class ThirdPartyAmp:
    """One row of someone else's mixed-precision timing tables (seconds, mean ± std)."""

    preset: str
    seq: int
    precision: str  # "bf16" (autocast) or "fp32"
    forward_s: float
    forward_std_s: float
    backward_s: float
    backward_std_s: float
    step_s: float | None  # their "training step with AdamW" table (bf16 runs only)
    step_std_s: float | None


SOURCE_CS336_STUDENT_AMP = (
    "a student's CS336 (2025) assignment 2 answers (the book's seed document 003, "
    "'benchmarking_mixed_precision' (c)): bf16 autocast and fp32 tables of the large and 2.7B "
    "presets, an Ampere-generation GPU, batch size not stated; their fp32 rows of this section "
    "differ from their earlier 'benchmarking_script' table (large at 128 tokens: 0.142 s here, "
    "0.076 s there): another session"
)

CS336_STUDENT_AMP: tuple[ThirdPartyAmp, ...] = tuple(ThirdPartyAmp(*row) for row in (
    ("large", 128, "bf16", 0.156829, 0.007042, 0.284106, 0.011902, 0.563264, 0.016795),
    ("large", 256, "bf16", 0.150492, 0.005433, 0.315056, 0.054031, 0.545883, 0.012066),
    ("large", 512, "bf16", 0.154221, 0.005847, 0.287746, 0.013350, 0.557914, 0.016264),
    ("large", 1024, "bf16", 0.211741, 0.002352, 0.397588, 0.003027, 0.701886, 0.003029),
    ("large", 128, "fp32", 0.141830, 0.006545, 0.236700, 0.011678, None, None),
    ("large", 256, "fp32", 0.148082, 0.003076, 0.308736, 0.006818, None, None),
    ("large", 512, "fp32", 0.286982, 0.001062, 0.605574, 0.001021, None, None),
    ("large", 1024, "fp32", 0.644561, 0.000561, 1.411845, 0.004699, None, None),
    ("2.7B", 128, "bf16", 0.142008, 0.003554, 0.260662, 0.009773, 0.698575, 0.015821),
    ("2.7B", 256, "bf16", 0.147835, 0.009032, 0.267800, 0.009860, 0.718001, 0.006092),
    ("2.7B", 512, "bf16", 0.163224, 0.004245, 0.345682, 0.007230, 0.812760, 0.006099),
    ("2.7B", 128, "fp32", 0.228101, 0.001074, 0.458868, 0.001429, None, None),
    ("2.7B", 256, "fp32", 0.425166, 0.001178, 0.904626, 0.003022, None, None),
    ("2.7B", 512, "fp32", 0.872745, 0.001991, 1.823213, 0.003807, None, None),
))
"""Their tables row for row; their reading of them: "the autocast to the BF16 costs a fixed
time", which `experiments.autocast_overhead.seed_verdict` checks against their own numbers."""


@dataclass(frozen=True)
class PublishedMFU:
    """One training run's utilization as its authors (or, where marked, PaLM's authors) reported
    it: a fraction of the accelerators' dense peak; None where not reported."""

    run: str
    accelerator: str
    chips: int | None  # None: not stated for the figure
    mfu: float | None  # model FLOPs utilization: the model's FLOPs only
    hfu: float | None  # hardware FLOPs utilization: recomputed forwards counted too
    note: str
    source: str  # the bibliography key of book/references.bib, and where in it


PUBLISHED_MFU: tuple[PublishedMFU, ...] = (
    PublishedMFU("GPT-3 175B", "V100", None, 0.213, None,
                 "as PaLM's authors estimate it", "chowdhery2022palm, Table 3"),
    PublishedMFU("Gopher 280B", "TPU v3", 4096, 0.325, None,
                 "as PaLM's authors estimate it", "chowdhery2022palm, Table 3"),
    PublishedMFU("Megatron-Turing NLG 530B", "A100", 2240, 0.302, None,
                 "as PaLM's authors estimate it", "chowdhery2022palm, Table 3"),
    PublishedMFU("PaLM 540B", "TPU v4", 6144, 0.462, 0.578,
                 "2,048-token sequences; HFU counts the rematerialized forward",
                 "chowdhery2022palm, Table 3 and Section 4"),
    PublishedMFU("Megatron-LM GPT 1T", "A100", 3072, None, 0.52,
                 "163 TFLOP/s per GPU, full recomputation counted",
                 "narayanan2021efficient, abstract and Table 1"),
    PublishedMFU("Megatron-LM GPT 530B", "A100", 2240, 0.421, None,
                 "full activation recomputation", "korthikanti2022reducing, abstract"),
    PublishedMFU("Megatron-LM GPT 530B", "A100", 2240, 0.542, None,
                 "sequence parallelism and selective recomputation",
                 "korthikanti2022reducing, abstract"),
    PublishedMFU("Llama 3 405B", "H100", 8192, 0.43, None,
                 "8,192-token sequences, 430 TFLOP/s per GPU", "dubey2024llama3, Table 4"),
    PublishedMFU("Llama 3 405B", "H100", 16384, 0.41, None,
                 "8,192-token sequences, 400 TFLOP/s per GPU", "dubey2024llama3, Table 4"),
    PublishedMFU("Llama 3 405B", "H100", 16384, 0.38, None,
                 "131,072-token sequences (context parallel), 380 TFLOP/s per GPU",
                 "dubey2024llama3, Table 4"),
)
"""Published utilizations of large training runs, bf16 (or fp16) against the dense peak. Their
FLOP counts differ in detail: PaLM and Megatron-LM count the attention matmuls over the full
T x T matrix (12 L T D per token, the book's dense convention, `accounting.flops`); Megatron-LM's
2021 figure counts the recomputed forward (an HFU); Llama 3's paper does not give its formula."""


@dataclass(frozen=True)
class PublishedRun:
    """One row of Megatron-LM's weak-scaling table: a GPT model, its mesh and batch, and the
    throughput measured (TFLOP/s per GPU in the paper's convention, Eq. 3: full recomputation
    counted). The micro-batch size, virtual stages and DDP kind are not in the paper: they are
    from the authors' script that reproduces the table (`MEGATRON_TABLE1_SCRIPT`)."""

    params_b: float  # the paper's parameter count, billions
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int  # global batch, sequences of MEGATRON_SEQ tokens
    tflops_per_gpu: float  # measured, Eq. 3's FLOPs a second per GPU
    micro_batch: int  # from the script (MBS)
    virtual_stages: int  # from the script: layers per stage / --num-layers-per-virtual-...
    ddp: str  # the script's DDP: "torch" (overlaps the backward) or "local" (after it)

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)


MEGATRON_SEQ = 2_048
MEGATRON_VOCAB = 51_200
SOURCE_MEGATRON_TABLE1 = (
    "Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU Clusters Using "
    "Megatron-LM', SC21 (arXiv:2104.04473), Table 1: GPT models, vocabulary 51,200, sequence "
    "2,048, DGX A100 80 GB nodes (8 GPUs, NVLink 3, 8 x 200 Gb/s HDR InfiniBand), mixed "
    "precision (fp16), full activation recomputation, the interleaved schedule with the "
    "scatter/gather optimization (section 5.1)")
MEGATRON_TABLE1_SCRIPT = (
    "NVIDIA/Megatron-LM, examples/sc21/run_table_1.sh (the authors' script reproducing Table 1): "
    "MBS, --num-layers-per-virtual-pipeline-stage, DDP=torch|local and --recompute-method "
    "uniform per model size")

MEGATRON_TABLE1: tuple[PublishedRun, ...] = tuple(PublishedRun(*row) for row in (
    # params heads hidden layers tp pp gpus batch TFLOP/s | MBS v DDP (the script)
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 16, 1, "torch"),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 16, 1, "torch"),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 16, 1, "torch"),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 8, 1, "torch"),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 4, 1, "local"),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 2, 3, "local"),  # 15 layers a stage, 5 a chunk
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 2, 2, "local"),  # 10 a stage, 5 a chunk
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 1, 2, "local"),  # 6 a stage, 3 a chunk
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 1, 3, "local"),  # 3 a stage, 1 a chunk
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 1, 1, "local"),
))
"""The calibration table of the step model (`accounting.calibration`): the paper's rows
(`SOURCE_MEGATRON_TABLE1`) with the script's micro-batch, virtual stages and DDP
(`MEGATRON_TABLE1_SCRIPT`)."""


@dataclass(frozen=True)
class Llama3Run:
    """One row of Llama 3's pre-training table: Llama 3 405B (126 layers, d_model 16,384, 128
    heads, 8 KV heads, d_ff 53,248, vocabulary 128,256) on H100 80 GB nodes with its mesh, and
    the throughput measured (the paper does not give its FLOP formula; 43% BF16 MFU is
    430 / 989 TFLOP/s, so the count is near the model's, without recomputation)."""

    gpus: int
    tp: int
    cp: int
    pp: int
    dp: int
    seq: int
    batch_per_dp: int  # sequences per data-parallel rank per step
    tflops_per_gpu: float
    mfu: float

    @property
    def batch(self) -> int:
        return self.dp * self.batch_per_dp


SOURCE_LLAMA3 = ("Dubey et al., 'The Llama 3 Herd of Models' (2024, arXiv:2407.21783), Table 4: "
                 "scaling configurations of Llama 3 405B pre-training; micro-batch size and "
                 "virtual stages not published")
LLAMA3_405B_SIZES = dict(vocab_size=128_256, d_model=16_384, n_layers=126, n_heads=128,
                         n_kv_heads=8, d_ff=53_248)
"""Llama 3 405B's sizes (Dubey et al. 2024, Table 3), as `TransformerConfig` keywords."""
LLAMA3_405B_RUN: tuple[Llama3Run, ...] = (
    Llama3Run(8_192, 8, 1, 16, 64, 8_192, 32, 430, 0.43),
    Llama3Run(16_384, 8, 1, 16, 128, 8_192, 16, 400, 0.41),
)
"""The 8,192-token rows of Table 4 (`SOURCE_LLAMA3`): the step model's test, not its fit."""
