"""mlsys.accounting.parallel_traffic: the bytes each rank sends for tensor, context, pipeline and
FSDP parallelism (against `accounting.comms`), and the time over the slowest link each group
crosses. Pure: no ranks."""

import pytest
from parallel_cases import SETUP

from mlsys import hardware
from mlsys.accounting import parallel, parallel_traffic
from mlsys.accounting.comms import collective_cost
from mlsys.models.config import TransformerConfig

CFG = SETUP.cfg  # the parallelism tests' model: 4 blocks, 4 heads, d_ff 24


def test_traffic_formulas():
    ar = collective_cost("all_reduce", 32 * 16 * 4, 2).sent_bytes
    assert parallel_traffic.tp_sent_bytes(16, 2, tokens=32, n_blocks=3) == 3 * 4 * ar
    ag = collective_cost("all_gather", 32 * 16 * 4, 2).sent_bytes
    gains = collective_cost("all_reduce", 16 * 4, 2).sent_bytes
    assert parallel_traffic.tp_sent_bytes(16, 2, tokens=32, n_blocks=3, sequence_parallel=True) == \
        3 * (4 * ar + 2 * gains) + 2 * ag
    assert parallel_traffic.tp_sent_bytes(16, 1, tokens=32, n_blocks=3) == 0
    kv = 32 * 16 * 4
    assert parallel_traffic.cp_sent_bytes(16, 4, tokens=32, n_blocks=1) == \
        2 * 3 * 2 * kv + 4 * 2 * kv
    assert [parallel_traffic.pp_sent_bytes(s, 3, activation_bytes=10, microbatches=4)
            for s in range(3)] == [40, 80, 40]
    assert parallel_traffic.padded(10, 4) == 12
    units = parallel_traffic.fsdp_units(CFG, parallel.ParallelDims(pp=2, tp=2), 1)
    assert len(units) == 1 + 2  # last stage: root (final norm, head) and two blocks


def test_communication_time_takes_the_slowest_link_each_group_crosses():
    cluster = hardware.get_cluster("dgx-h100")  # 8 GPUs per node: NVLink inside, IB between
    small = TransformerConfig.preset("small")
    dims = parallel.ParallelDims(dp_shard=2, tp=4)  # 8 ranks: one node
    kw = {"batch": 8, "seq": 1024, "act_dtype": "bf16", "param_dtype": "bf16"}
    sent = parallel_traffic.sent_bytes(small, dims, 0, **kw)
    times = parallel_traffic.comm_time_s(small, dims, cluster, 0, **kw)
    nvlink, ib = hardware.LINKS["nvlink4"].bytes_per_s, hardware.LINKS["ib-ndr"].bytes_per_s
    assert times["tp"] == pytest.approx(sent["tp"] / nvlink)
    assert times["all_gather"] == pytest.approx(sent["all_gather"] / nvlink)
    wide = parallel.ParallelDims(dp_shard=4, tp=4)  # 16 ranks: the FSDP group spans two nodes
    times = parallel_traffic.comm_time_s(small, wide, cluster, 0, **kw)
    assert times["all_gather"] == pytest.approx(  # 2 of its ranks per node: 2 ports (tp = 4)
        parallel_traffic.sent_bytes(small, wide, 0, **kw)["all_gather"] / (2 * ib))
    whole, kw16 = parallel.ParallelDims(dp_shard=16), {**kw, "batch": 16}  # two whole nodes
    assert parallel_traffic.comm_time_s(small, whole, cluster, 0, **kw16)["all_gather"] == \
        pytest.approx(parallel_traffic.sent_bytes(small, whole, 0, **kw16)["all_gather"]
                      / (8 * ib))  # the node's egress: the Scaling Book's 8 x 400 Gb/s
    spread = parallel.ParallelDims(dp_replicate=2, dp_shard=2, tp=4)  # copies 8 ranks apart
    assert parallel_traffic.comm_time_s(small, spread, cluster, 0, **kw)[
        "replicate_all_reduce"] == pytest.approx(parallel_traffic.sent_bytes(
            small, spread, 0, **kw)["replicate_all_reduce"] / ib)  # one rank per node: one port
    assert times["cp"] == times["pp"] == 0.0
    with pytest.raises(TypeError, match="cluster must be a hardware.Cluster"):
        parallel_traffic.comm_time_s(small, dims, "dgx-h100", 0, **kw)


def test_a_stage_outside_the_pipeline_is_a_clear_error():
    with pytest.raises(ValueError, match=r"^stage \(3\) must be < n_stages \(3\): stages are "
                                         "numbered from 0$"):
        parallel_traffic.pp_sent_bytes(3, 3, activation_bytes=10)
    with pytest.raises(ValueError, match="stage must be an integer >= 0, got -1"):
        parallel_traffic.pp_sent_bytes(-1, 3, activation_bytes=10)
    assert parallel_traffic.pp_sent_bytes(2, 3, activation_bytes=10) == 10  # the last: back only
