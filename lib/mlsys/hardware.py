"""Accelerator specifications: the only place in the project where peak numbers live.

Every figure carries its source. Peak FLOP/s are **dense** (no 2:4 structured sparsity): NVIDIA's
spec sheets headline the sparse figure, which is exactly twice the dense one (the H100 SXM's
"1979 TFLOP/s bf16" is sparse; dense is 989.4). A dtype missing from `dense_flop_per_s` is not
supported by the device's matrix units.

Units: FLOP/s, bytes, bytes/s. "GB" on a spec sheet is taken as 1e9 bytes, as the Scaling Book and
CS336 do; that is conservative (an "80 GB" H100 has 80 GiB = 85.9e9 B physically, and
`torch.cuda.mem_get_info` reports about 79 GiB usable). Link bandwidths are stored per direction;
NVIDIA quotes NVLink and PCIe as the sum of both directions.

Sources:
- A100: NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/a100/
  and the A100 architecture whitepaper (L2, SMs, shared memory).
- H100/H200: NVIDIA H100 datasheet https://www.nvidia.com/en-us/data-center/h100/ , H200 product
  page https://www.nvidia.com/en-us/data-center/h200/ , Hopper architecture whitepaper.
- B200: NVIDIA HGX B200 / DGX B200 datasheets (per-GPU = 8-GPU figure / 8),
  https://www.nvidia.com/en-us/data-center/hgx/ .
- TPU v5p: Google Cloud TPU v5p page https://cloud.google.com/tpu/docs/v5p and the table in
  "How to Scale Your Model", part 2 (https://jax-ml.github.io/scaling-book/tpus/).
- Links and clusters (`LINKS`, `CLUSTERS`): the accelerators' own NVLink and PCIe figures; the DGX
  A100 / H100 datasheets for the InfiniBand ports (one per GPU); PCI-SIG for PCIe rates; a ring
  across nodes at the node's egress (`Cluster.ring_link`): "How to Think About GPUs" in the
  Scaling Book (https://jax-ml.github.io/scaling-book/gpus/).
- One SM's resources per architecture (`SM_ARCHITECTURES`: registers, shared memory, resident
  warps and blocks, the units they are allocated in): CUDA C++ Programming Guide, "Compute
  Capabilities", table "Technical Specifications per Compute Capability", and the CUDA Occupancy
  Calculator's allocation units (https://docs.nvidia.com/cuda/cuda-c-programming-guide/ ,
  https://docs.nvidia.com/cuda/cuda-occupancy-calculator/ ).

Longer than the library's ~300 lines per module because it is a data table: each accelerator,
link, cluster and SM architecture is a record with its figures and their sources, and keeping them
in one file keeps one home for every peak number (the point of this module). Pure Python: torch is
imported only to `detect` the running device.
Used in: every chapter that compares a measurement with a peak; book page "Hardware reference".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlsys import checks

TERA = 1e12
GIGA = 1e9
MIB = 2**20
KIB = 2**10


@dataclass(frozen=True)
class SMArchitecture:
    """What one streaming multiprocessor of an NVIDIA architecture holds, and the units it hands
    out: the inputs of an occupancy calculation (`mlsys.accounting.occupancy`)."""

    name: str  # the compiler's target, "sm_80"
    capability: int  # compute capability x 10: 80 for 8.0
    registers_per_sm: int  # 32-bit registers in the register file
    max_registers_per_thread: int
    register_unit: int  # registers are allocated per warp in multiples of this many
    shared_per_sm_bytes: int  # shared memory an SM can give its resident blocks
    shared_per_block_bytes: int  # the most one block may ask for (opt-in)
    shared_reserved_per_block_bytes: int  # kept by the system for every resident block
    shared_unit_bytes: int  # shared memory is allocated per block in multiples of this
    max_warps_per_sm: int
    max_blocks_per_sm: int
    example: str  # a part built on it

    def __post_init__(self) -> None:
        for attr in ("registers_per_sm", "max_registers_per_thread", "register_unit",
                     "shared_per_sm_bytes", "shared_per_block_bytes", "shared_unit_bytes",
                     "max_warps_per_sm", "max_blocks_per_sm", "capability"):
            checks.positive_int(getattr(self, attr), f"{self.name}: {attr}")
        checks.nonnegative_int(self.shared_reserved_per_block_bytes,
                               f"{self.name}: shared_reserved_per_block_bytes")
        if self.shared_per_block_bytes + self.shared_reserved_per_block_bytes \
                > self.shared_per_sm_bytes:
            raise ValueError(f"{self.name}: a block's shared memory ({self.shared_per_block_bytes}"
                             f" + {self.shared_reserved_per_block_bytes} reserved) exceeds the "
                             f"SM's ({self.shared_per_sm_bytes})")


def _sm(name: str, capability: int, shared_kib: int, warps: int, blocks: int,
        example: str) -> SMArchitecture:
    # shared_kib: the SM's shared memory; one block may take 1 KiB less (the reserved 1 KiB)
    return SMArchitecture(name=name, capability=capability, registers_per_sm=65536,
                          max_registers_per_thread=255, register_unit=256,
                          shared_per_sm_bytes=shared_kib * KIB,
                          shared_per_block_bytes=(shared_kib - 1) * KIB,
                          shared_reserved_per_block_bytes=KIB, shared_unit_bytes=128,
                          max_warps_per_sm=warps, max_blocks_per_sm=blocks, example=example)


SM_ARCHITECTURES: dict[str, SMArchitecture] = {
    "sm_80": _sm("sm_80", 80, 164, 64, 32, "A100"),
    "sm_89": _sm("sm_89", 89, 100, 48, 24, "L40S, RTX 4090"),
    "sm_90": _sm("sm_90", 90, 228, 64, 32, "H100, H200"),
}
"""Per-SM resources by compiler target (CUDA C++ Programming Guide, technical specifications per
compute capability; allocation units from the CUDA Occupancy Calculator). The same 64K registers
(at most 255 per thread, allocated 256 per warp) everywhere; shared memory 164 / 100 / 228 KiB per
SM, of which one block may ask for 1 KiB less."""


def sm_architecture(name: str) -> SMArchitecture:
    """The SM resources of a target such as "sm_90" (ValueError naming the known ones)."""
    return SM_ARCHITECTURES[checks.choice(name, "name", tuple(SM_ARCHITECTURES))]


@dataclass(frozen=True)
class Accelerator:
    """Peak capabilities of one accelerator chip (one GPU, one TPU chip)."""

    name: str
    vendor: str
    dense_flop_per_s: dict[str, float]
    """Dense peak FLOP/s of the matrix units per input dtype ("fp64", "fp32", "tf32", "bf16",
    "fp16", "fp8"); fp32 is the non-tensor-core (CUDA-core) rate on GPUs."""
    hbm_bytes: float
    hbm_bytes_per_s: float
    l2_bytes: float | None
    """Last-level on-chip cache (GPU L2). None where the chip has no comparable cache."""
    smem_per_sm_bytes: float | None
    """Shared memory (configurable L1/shared) per SM. None for TPUs."""
    sm_count: int | None
    """Streaming multiprocessors (GPU) or TensorCores (TPU)."""
    interconnect_bytes_per_s: float
    """Chip-to-chip bandwidth per direction: NVLink (all links) on GPUs, ICI per link on TPUs."""
    interconnect_name: str
    pcie_bytes_per_s: float
    """Host link bandwidth per direction."""
    notes: str = ""
    sources: tuple[str, ...] = field(default_factory=tuple)
    sm_arch: str | None = None
    """The compiler target of its SMs ("sm_90"), a key of `SM_ARCHITECTURES`; None if absent."""

    def __post_init__(self) -> None:
        for attr in ("name", "vendor", "interconnect_name"):
            if not isinstance(getattr(self, attr), str) or not getattr(self, attr):
                raise TypeError(f"{attr} must be a non-empty string, got {getattr(self, attr)!r}")
        if not isinstance(self.dense_flop_per_s, dict) or not self.dense_flop_per_s:
            raise TypeError(f"{self.name}: dense_flop_per_s must be a non-empty dict "
                            f"{{dtype: FLOP/s}}, got {self.dense_flop_per_s!r}")
        for dtype, rate in self.dense_flop_per_s.items():
            checks.positive(rate, f"{self.name}: dense_flop_per_s[{dtype!r}]")
        rates = ("hbm_bytes", "hbm_bytes_per_s", "interconnect_bytes_per_s", "pcie_bytes_per_s")
        for attr in rates:
            checks.positive(getattr(self, attr), f"{self.name}: {attr}")
        for attr in ("l2_bytes", "smem_per_sm_bytes"):
            if getattr(self, attr) is not None:
                checks.positive(getattr(self, attr), f"{self.name}: {attr}")
        if self.sm_count is not None:
            checks.positive_int(self.sm_count, f"{self.name}: sm_count")
        if self.sm_arch is not None:
            checks.choice(self.sm_arch, f"{self.name}: sm_arch", tuple(SM_ARCHITECTURES))

    def peak_flop_per_s(self, dtype: str) -> float:
        """Dense peak FLOP/s for `dtype`; ValueError if the device has no matrix rate for it."""
        if not isinstance(dtype, str):
            raise TypeError(f"dtype must be a name such as 'bf16', got {dtype!r}")
        if dtype not in self.dense_flop_per_s:
            known = ", ".join(self.dense_flop_per_s)
            raise ValueError(f"{self.name} has no dense peak for dtype={dtype!r}; known: {known}")
        return self.dense_flop_per_s[dtype]

    def sparse_flop_per_s(self, dtype: str) -> float:
        """The 2:4-sparsity figure the spec sheet headlines: twice the dense peak (GPUs only)."""
        if self.vendor != "NVIDIA":
            raise ValueError(f"{self.name}: 2:4 structured sparsity is an NVIDIA tensor-core "
                             "feature")
        return 2 * self.peak_flop_per_s(dtype)

    def ridge_intensity(self, dtype: str) -> float:
        """FLOP per byte of HBM traffic above which a kernel can be compute-bound: peak / bandwidth.
        """
        return self.peak_flop_per_s(dtype) / self.hbm_bytes_per_s


A100_80GB_SXM = Accelerator(
    name="A100 80GB SXM",
    vendor="NVIDIA",
    dense_flop_per_s={
        "fp64": 19.5 * TERA,  # FP64 tensor core (9.7 TFLOP/s without)
        "fp32": 19.5 * TERA,
        "tf32": 156 * TERA,  # 312 with sparsity
        "bf16": 312 * TERA,  # 624 with sparsity
        "fp16": 312 * TERA,
    },
    hbm_bytes=80 * GIGA,
    hbm_bytes_per_s=2039 * GIGA,  # HBM2e, "2,039 GB/s"
    l2_bytes=40 * MIB,
    smem_per_sm_bytes=164 * KIB,
    sm_count=108,
    interconnect_bytes_per_s=300 * GIGA,  # NVLink 3: 600 GB/s both directions
    interconnect_name="NVLink 3",
    pcie_bytes_per_s=32 * GIGA,  # PCIe Gen4 x16: 64 GB/s both directions
    notes="No fp8 support in the tensor cores.",
    sources=("https://www.nvidia.com/en-us/data-center/a100/",),
    sm_arch="sm_80",
)

H100_SXM = Accelerator(
    name="H100 SXM",
    vendor="NVIDIA",
    dense_flop_per_s={
        "fp64": 67 * TERA,  # FP64 tensor core (34 without)
        "fp32": 67 * TERA,
        "tf32": 494.7 * TERA,  # spec sheet "989 TFLOPS" is with sparsity
        "bf16": 989.4 * TERA,  # spec sheet "1,979 TFLOPS" is with sparsity
        "fp16": 989.4 * TERA,
        "fp8": 1978.9 * TERA,  # spec sheet "3,958 TFLOPS" is with sparsity
    },
    hbm_bytes=80 * GIGA,
    hbm_bytes_per_s=3.35 * TERA,  # HBM3
    l2_bytes=50 * MIB,
    smem_per_sm_bytes=228 * KIB,
    sm_count=132,
    interconnect_bytes_per_s=450 * GIGA,  # NVLink 4: 900 GB/s both directions
    interconnect_name="NVLink 4",
    pcie_bytes_per_s=64 * GIGA,  # PCIe Gen5 x16: 128 GB/s both directions
    sources=("https://www.nvidia.com/en-us/data-center/h100/",),
    sm_arch="sm_90",
)

H200_SXM = Accelerator(
    name="H200 SXM",
    vendor="NVIDIA",
    dense_flop_per_s=dict(H100_SXM.dense_flop_per_s),  # same GH100 compute as the H100 SXM
    hbm_bytes=141 * GIGA,  # HBM3e
    hbm_bytes_per_s=4.8 * TERA,
    l2_bytes=50 * MIB,
    smem_per_sm_bytes=228 * KIB,
    sm_count=132,
    interconnect_bytes_per_s=450 * GIGA,  # NVLink 4: 900 GB/s both directions
    interconnect_name="NVLink 4",
    pcie_bytes_per_s=64 * GIGA,
    notes="Same chip as the H100 SXM with more and faster memory.",
    sources=("https://www.nvidia.com/en-us/data-center/h200/",),
    sm_arch="sm_90",
)

B200 = Accelerator(
    name="B200 (HGX)",
    vendor="NVIDIA",
    dense_flop_per_s={
        "fp64": 37 * TERA,
        "fp32": 75 * TERA,
        "tf32": 1.1e3 * TERA,  # 2.2 PFLOP/s with sparsity
        "bf16": 2.25e3 * TERA,  # 4.5 PFLOP/s with sparsity
        "fp16": 2.25e3 * TERA,
        "fp8": 4.5e3 * TERA,  # 9 PFLOP/s with sparsity
    },
    hbm_bytes=180 * GIGA,  # HBM3e, 1,440 GB per 8-GPU board
    hbm_bytes_per_s=7.7 * TERA,  # 62 TB/s per 8-GPU board
    l2_bytes=126 * MIB,
    smem_per_sm_bytes=228 * KIB,
    sm_count=148,
    interconnect_bytes_per_s=900 * GIGA,  # NVLink 5: 1.8 TB/s both directions
    interconnect_name="NVLink 5",
    pcie_bytes_per_s=64 * GIGA,  # PCIe Gen5 x16 to the host
    notes="Per-GPU figures derived from the 8-GPU HGX B200 datasheet; also fp4 at 9 PFLOP/s dense.",
    sources=("https://www.nvidia.com/en-us/data-center/hgx/",),
)

TPU_V5P = Accelerator(
    name="TPU v5p",
    vendor="Google",
    dense_flop_per_s={"bf16": 459 * TERA},  # int8: 918 TOP/s
    hbm_bytes=95 * GIGA,
    hbm_bytes_per_s=2765 * GIGA,
    l2_bytes=None,
    smem_per_sm_bytes=None,
    sm_count=2,  # two TensorCores per chip, used as one "megacore"
    interconnect_bytes_per_s=90 * GIGA,  # ICI, per link and direction (6 links, 3-D torus)
    interconnect_name="ICI",
    pcie_bytes_per_s=15 * GIGA,  # Scaling Book's approximate host link figure
    notes="Matrix units take bf16 (and int8); fp32 matmuls are emulated with several bf16 passes.",
    sources=(
        "https://cloud.google.com/tpu/docs/v5p",
        "https://jax-ml.github.io/scaling-book/tpus/",
    ),
)

ACCELERATORS: dict[str, Accelerator] = {
    "a100": A100_80GB_SXM,
    "h100": H100_SXM,
    "h200": H200_SXM,
    "b200": B200,
    "tpu-v5p": TPU_V5P,
}


@dataclass(frozen=True)
class Link:
    """One kind of link between accelerators, as one chip sees it."""

    name: str
    bytes_per_s: float
    """Bandwidth per direction available to one chip over this fabric (all its lanes or links
    together); spec sheets quote the sum of both directions for NVLink and PCIe."""
    source: str
    notes: str = ""

    def __post_init__(self) -> None:
        for attr in ("name", "source"):
            if not isinstance(getattr(self, attr), str) or not getattr(self, attr):
                raise TypeError(f"{attr} must be a non-empty string, got {getattr(self, attr)!r}")
        checks.positive(self.bytes_per_s, f"{self.name}: bytes_per_s")


def _link(acc: Accelerator, name: str, notes: str = "") -> Link:
    """The chip-to-chip link of `acc` (its `interconnect_bytes_per_s`), named."""
    return Link(name, acc.interconnect_bytes_per_s, acc.sources[0], notes)


LINKS: dict[str, Link] = {
    "nvlink3": _link(A100_80GB_SXM, "NVLink 3 (A100 SXM, through NVSwitch)",
                     "12 links x 25 GB/s per direction; '600 GB/s' counts both directions"),
    "nvlink4": _link(H100_SXM, "NVLink 4 (H100/H200 SXM, through NVSwitch)",
                     "18 links x 25 GB/s per direction; '900 GB/s' counts both directions"),
    "nvlink5": _link(B200, "NVLink 5 (B200, through NVSwitch)",
                     "18 links x 50 GB/s per direction; '1.8 TB/s' counts both directions"),
    "pcie4": Link("PCIe Gen4 x16", A100_80GB_SXM.pcie_bytes_per_s,
                  "https://pcisig.com/specifications",
                  "16 GT/s x 16 lanes, 128b/130b: 31.5 GB/s per direction ('64 GB/s' both)"),
    "pcie5": Link("PCIe Gen5 x16", H100_SXM.pcie_bytes_per_s, "https://pcisig.com/specifications",
                  "32 GT/s x 16 lanes: 63 GB/s per direction ('128 GB/s' both)"),
    "ib-hdr": Link("InfiniBand HDR, one 200 Gb/s port per GPU", 25 * GIGA,
                   "https://www.nvidia.com/en-us/data-center/dgx-a100/",
                   "DGX A100: 8 ConnectX-6 HDR ports, one per GPU; 200 Gb/s = 25 GB/s per "
                   "direction"),
    "ib-ndr": Link("InfiniBand NDR, one 400 Gb/s port per GPU", 50 * GIGA,
                   "https://www.nvidia.com/en-us/data-center/dgx-h100/",
                   "DGX H100 and DGX B200: 8 ConnectX-7 ports of 400 Gb/s, one per GPU = 50 GB/s "
                   "per direction"),
    "ici-v5p": Link("TPU v5p ICI, one link", TPU_V5P.interconnect_bytes_per_s, TPU_V5P.sources[1],
                    "6 links per chip (3-D torus); a ring along one axis that uses both "
                    "neighbours sends over 2 links: the Scaling Book's 2 x 90 GB/s"),
    "ici-v5p-axis": Link("TPU v5p ICI, one torus axis (a link to each neighbour)",
                         2 * TPU_V5P.interconnect_bytes_per_s,
                         "https://jax-ml.github.io/scaling-book/training/",
                         "the Scaling Book's W_ici = 2 x 9e10 B/s for a collective along one axis "
                         "of the 3-D torus (its training chapter, v5p)"),
}
"""Links between accelerators, per direction, each with its source."""


@dataclass(frozen=True)
class Cluster:
    """Accelerators in nodes: how many per node, and the links inside and between nodes."""

    name: str
    accelerator: Accelerator
    per_node: int
    intra_node: Link
    inter_node: Link | None  # None: a single node (or a pod with no slower tier modelled)

    def __post_init__(self) -> None:
        checks.positive_int(self.per_node, f"{self.name}: per_node")
        if not isinstance(self.intra_node, Link) or not (self.inter_node is None or
                                                         isinstance(self.inter_node, Link)):
            raise TypeError(f"{self.name}: intra_node and inter_node must be Links")

    def ring_link(self, n_ranks: int, *, stride: int = 1) -> Link:
        """The link that bounds a ring collective over `n_ranks` accelerators `stride` ranks apart
        (ranks 0, stride, 2 stride, ...; each node holds `per_node` consecutive ranks, the first
        from rank 0): divide the bytes a rank sends (`accounting.comms`) by its bandwidth.

        Inside one node: the node's own link. Across nodes the rule is per node, not per GPU. A
        ring enters and leaves each node it spans once; NCCL runs one ring per port (its
        channels), each crossing between nodes through another GPU's NIC, so the group's traffic
        leaves a node through as many ports as the group has ranks there, k. Each ring carries
        1/k of the message, so the crossing runs at k x `inter_node`, capped by the node's own
        link: a group of whole DGX H100 nodes crosses at 8 x 50 = 400 GB/s, the node's egress
        that the Scaling Book costs cross-node collectives at ("How to Think About GPUs",
        https://jax-ml.github.io/scaling-book/gpus/ : W_node = 400 GB/s for an H100 node). The
        node holding the fewest ranks of the group sets k: a group with one rank per node (data
        parallelism with tensor parallelism inside each node, `stride` >= `per_node`) crosses on
        one port, 50 GB/s, while the node's other GPUs' groups use the other ports. A
        point-to-point send between nodes (a pipeline stage's) leaves through its sender's own
        port: `send_link`.
        """
        n = checks.positive_int(n_ranks, "n_ranks")
        step = checks.positive_int(stride, "stride")
        return self.group_link(range(0, n * step, step))

    def group_link(self, ranks) -> Link:
        """`ring_link` for the group of these exact `ranks` (global ranks; each node holds
        `per_node` consecutive ones): a group that does not start at a node's first rank may
        straddle two nodes with few ranks in one of them, and that node sets its ports."""
        members = [checks.integer(r, f"ranks[{i}]", minimum=0) for i, r in enumerate(ranks)]
        if not members:
            raise ValueError("ranks must hold at least one rank")
        held: dict[int, int] = {}
        for r in members:
            held[r // self.per_node] = held.get(r // self.per_node, 0) + 1
        if len(held) == 1:
            return self.intra_node
        if self.inter_node is None:
            raise ValueError(f"{self.name} has {self.per_node} accelerators per node and no "
                             f"link between nodes: a group over ranks {members[0]} to "
                             f"{members[-1]} does not fit")
        k = min(held.values())  # the ports out of the node holding the fewest of the group
        if k == 1:
            return self.inter_node
        bandwidth = min(k * self.inter_node.bytes_per_s, self.intra_node.bytes_per_s)
        whole = " (the node's egress)" if k == self.per_node else ""
        return Link(f"{self.inter_node.name}, {k} per node{whole}", bandwidth,
                    "https://jax-ml.github.io/scaling-book/gpus/",
                    f"a ring with {k} ranks in every node it spans: {k} rings, each leaving a "
                    f"node through another GPU's port ({k} x "
                    f"{self.inter_node.bytes_per_s / 1e9:g} GB/s)")

    def send_link(self, span: int) -> Link:
        """The link a point-to-point send crosses between two ranks `span` - 1 apart (a group
        covering `span` consecutive ranks): the node's own link inside a node, the sender's one
        port between nodes (its neighbours' ports carry their own sends)."""
        n = checks.positive_int(span, "span")
        if n <= self.per_node:
            return self.intra_node
        if self.inter_node is None:
            raise ValueError(f"{self.name} has {self.per_node} accelerators per node and no "
                             f"link between nodes: a span of {n} does not fit")
        return self.inter_node


CLUSTERS: dict[str, Cluster] = {
    "dgx-a100": Cluster("DGX A100 nodes", A100_80GB_SXM, 8, LINKS["nvlink3"], LINKS["ib-hdr"]),
    "dgx-h100": Cluster("DGX H100 nodes", H100_SXM, 8, LINKS["nvlink4"], LINKS["ib-ndr"]),
    "dgx-b200": Cluster("DGX B200 nodes", B200, 8, LINKS["nvlink5"], LINKS["ib-ndr"]),
    "tpu-v5p": Cluster("TPU v5p pod (ICI throughout, 8,960 chips)", TPU_V5P, 8_960,
                       LINKS["ici-v5p"], None),
}
"""Named clusters: a node of accelerators and the links within and between nodes."""


def get_cluster(name: str) -> Cluster:
    """Look up a cluster by key ("dgx-a100", "dgx-h100", "dgx-b200", "tpu-v5p")."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a cluster key such as 'dgx-h100', got {name!r}")
    return CLUSTERS[checks.choice(name.strip().lower(), "cluster", CLUSTERS)]


@dataclass(frozen=True)
class StepConstants:
    """What the step model (`mlsys.accounting.step_model`) cannot derive from a spec sheet.

    gemm_fraction: of the dense peak that one full wave of large GEMM tiles reaches (cuBLAS on
    big shapes); hbm_fraction: of the HBM bandwidth that memory-bound kernels reach (GEMMs'
    memory roof too); nccl_fraction: the bus bandwidth NCCL reaches over a link (nccl-tests'
    busbw / the link's per-direction rate); intra_latency_s, inter_latency_s: alpha, the latency
    of one step of a ring inside a node and across nodes."""

    gemm_fraction: float
    hbm_fraction: float
    nccl_fraction: float
    intra_latency_s: float
    inter_latency_s: float
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("gemm_fraction", "hbm_fraction", "nccl_fraction"):
            value = checks.fraction(getattr(self, name), name)
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        checks.nonnegative(self.intra_latency_s, "intra_latency_s")
        checks.nonnegative(self.inter_latency_s, "inter_latency_s")


STEP_CONSTANTS = StepConstants(
    gemm_fraction=0.72, hbm_fraction=0.67, nccl_fraction=0.71,
    intra_latency_s=1.5e-6, inter_latency_s=5e-6,
    source="the three fractions fitted on Megatron-LM's Table 1 (Narayanan et al., SC21) by "
           "`accounting.calibration.fit` and nothing else; the latencies assumed, not fitted "
           "(the table's messages are megabytes: it cannot see them): about 20 us for a small "
           "all-reduce on 8 NVLink GPUs (14 ring steps) and 5 us a hop over InfiniBand, the "
           "order of nccl-tests' small-message times")
"""The step model's constants (`StepConstants`), fitted on the calibration table only."""

GEMM_TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256))
"""Output tiles (b_m, b_n) of the large-GEMM kernels the step model chooses among: cuBLAS's and
CUTLASS's biggest tensor-core tiles on Ampere and Hopper (NVIDIA, "Matrix Multiplication
Background User's Guide", tile quantization: 256 x 128 and 128 x 256 are the most efficient)."""

FLASH_FRACTIONS: dict[str, float] = {"sm_80": 0.60, "sm_90": 0.50}
"""Fraction of the dense bf16 peak FlashAttention reaches, forward and backward together, not
fitted: A100 (sm_80) 0.60, FlashAttention-2 (Dao 2023, arXiv:2307.08691: 50-73% of peak forward,
lower backward); H100 (sm_90) 0.50, between FlashAttention-2 (about 35%) and FlashAttention-3's
bf16 forward (up to 75%, Shah et al. 2024, arXiv:2407.08608). Other chips: 0.50."""


def flash_fraction(acc: Accelerator) -> float:
    """`FLASH_FRACTIONS` of the accelerator's SM architecture (0.50 when it has none listed)."""
    if not isinstance(acc, Accelerator):
        raise TypeError(f"acc must be an Accelerator, got {type(acc).__name__}")
    return FLASH_FRACTIONS.get(acc.sm_arch or "", 0.50)


CUDA_DEVICE_NAMES: dict[str, str] = {
    "NVIDIA H100 80GB HBM3": "h100",  # the H100 SXM5
    "NVIDIA A100-SXM4-80GB": "a100",
    "NVIDIA H200": "h200",  # the H200 SXM (the NVL card reports "NVIDIA H200 NVL")
    "NVIDIA B200": "b200",
}
"""The exact names `torch.cuda.get_device_name()` reports for the parts in `ACCELERATORS` -> key.

Matching is exact (surrounding spaces ignored): a name that merely contains "H200" or "A100" may
be another part with other clocks, memory or links (the H200 NVL, the GH200 superchip, an A100
PCIe or 40 GB card), and borrowing the SXM spec for it would be silently wrong. Such a device gets
no spec; `match_report` says why."""

_OTHER_PARTS = (  # (fragment of a device name, why its name does not pick a spec here)
    ("GH200", "a Grace Hopper superchip has other memory and power limits than the H200 SXM"),
    ("NVL", "an NVL part has other clocks and links than the SXM part"),
    ("PCIE", "a PCIe card has lower clocks, power and bandwidth than the SXM part"),
    ("40GB", "the 40 GB part has less and slower memory than the 80 GB part"),
)


def get(name: str) -> Accelerator:
    """Look up an accelerator by registry key ("a100", "h100", "h200", "b200", "tpu-v5p")."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a registry key such as 'h100', got {name!r}")
    key = name.strip().lower()
    if key not in ACCELERATORS:
        raise ValueError(f"unknown accelerator name={name!r}; known: {', '.join(ACCELERATORS)}")
    return ACCELERATORS[key]


def match_device_name(device_name: str) -> Accelerator | None:
    """The spec of a CUDA device by its exact name (`CUDA_DEVICE_NAMES`), or None for a device
    the table does not hold; `match_report` says which, and why."""
    if not isinstance(device_name, str):
        raise TypeError(f"device_name must be a string such as 'NVIDIA H100 80GB HBM3', "
                        f"got {device_name!r}")
    key = CUDA_DEVICE_NAMES.get(device_name.strip())
    return None if key is None else ACCELERATORS[key]


def match_report(device_name: str) -> str:
    """One sentence: which spec `match_device_name` uses for `device_name`, or why it uses none."""
    acc = match_device_name(device_name)
    name = device_name.strip()
    if acc is not None:
        return f"{name} is the {acc.name} of mlsys.hardware; its spec is used"
    reason = next((why for part, why in _OTHER_PARTS if part in name.upper()), None)
    if reason is None:
        reason = f"the table holds only {', '.join(CUDA_DEVICE_NAMES)}"
    return f"{name} is not in the table: {reason}; no spec is used"


def detect() -> Accelerator | None:
    """The spec of the running CUDA device, or None (CPU, MPS, or a GPU not in the table:
    `match_report(torch.cuda.get_device_name())` says why)."""
    import torch  # heavy and optional: the table is pure Python; only detection needs a device

    if not torch.cuda.is_available():
        return None
    return match_device_name(torch.cuda.get_device_name())


# --- GPUs the book meets only in others' measurements ---------------------------------------------

A100_40GB_HBM_BYTES_PER_S = 1555 * GIGA
"""The A100 40GB SXM's HBM2 bandwidth, "1,555 GB/s" (NVIDIA's A100 datasheet; the 80GB SXM's is
2,039 GB/s, `A100_80GB_SXM`); its fp32 peak is the 80GB's, 19.5 TFLOP/s. Chapter 04 uses it for
He's "about 50 operations" (his essay's GPU)."""

AMPERE_MEMORY_BYTES = {"A100 80GB": 80 * GIGA, "A100 40GB": 40 * GIGA, "A40": 48 * GIGA,
                       "RTX A6000": 48 * GIGA, "A30": 24 * GIGA, "A10": 24 * GIGA,
                       "RTX 3090": 24 * GIGA}
"""NVIDIA's Ampere-generation GPUs (compute capability 8.x, the `ampere_sgemm` kernels) with more
than 16 GB, and their memory, from NVIDIA's product pages: chapter 05 infers the seed's GPU."""
