"""mlsys.accounting.zero: per-rank memory of ZeRO stages 0-3, traffic per stage (1 and 2 equal to
data parallelism's, 3 at 1.5x), owners, and the seed's figures beside the right ones."""

import pytest

from mlsys.accounting import comms as comms_cost
from mlsys.accounting import zero as zero_cost
from mlsys.accounting.memory import model_state_bytes

PSI = 7_500_000_000  # the ZeRO paper's example: 7.5B parameters, mixed-precision Adam, 64 GPUs


def test_the_zero_papers_figure_one():
    gb = [zero_cost.zero_memory_bytes(PSI, 64, s, "bf16_mixed_adamw") / 1e9
          for s in zero_cost.STAGES]
    assert gb == pytest.approx([120, 31.4, 16.6, 1.875], abs=0.05)  # as the paper rounds
    assert zero_cost.zero_memory_bytes(PSI, 1, 3, "bf16_mixed_adamw") == model_state_bytes(
        PSI, "bf16_mixed_adamw")


def test_what_each_stage_shards():
    n, ranks = 1_000, 4
    per = {s: zero_cost.zero_memory_breakdown(n, ranks, s, "fp32_adamw") for s in zero_cost.STAGES}
    assert per[0] == {"weights": 4000, "grads": 4000, "master": 0, "optimizer": 8000}
    assert per[1] == {"weights": 4000, "grads": 4000, "master": 0, "optimizer": 2000}
    assert per[2] == {"weights": 4000, "grads": 1000, "master": 0, "optimizer": 2000}
    assert per[3] == {"weights": 1000, "grads": 1000, "master": 0, "optimizer": 2000}
    real = zero_cost.zero_memory_breakdown(n, ranks, 2, "fp32_adamw", shard_params=300)
    assert real["grads"] == 1200 and real["weights"] == 4000


@pytest.mark.parametrize("n", [2, 4, 8, 64])
def test_stages_one_and_two_send_what_data_parallelism_sends_and_stage_three_half_more(n):
    sent = {s: sum(zero_cost.zero_sent_bytes(PSI, n, s).values()) for s in zero_cost.STAGES}
    assert sent[0] == comms_cost.collective_cost("all_reduce", 4 * PSI, n).sent_bytes
    assert sent[1] == sent[2] == pytest.approx(sent[0])
    assert sent[3] == pytest.approx(1.5 * sent[0])
    mixed = zero_cost.zero_sent_bytes(PSI, n, 3, grad_dtype="bf16", param_dtype="bf16")
    assert mixed == {"gradients": (n - 1) / n * 2 * PSI, "parameters": 2 * (n - 1) / n * 2 * PSI}


def test_the_seeds_zero_traffic_beside_the_right_one():
    m, n, layers = 4 * PSI, 8, 32  # fp32 gradients, 8 ranks
    claimed = {s: zero_cost.claimed_zero_sent_bytes(s, m, n, n_layers=layers, optimizer_bytes=2 * m)
               for s in zero_cost.STAGES}
    right = {s: sum(zero_cost.zero_sent_bytes(PSI, n, s).values()) for s in zero_cost.STAGES}
    assert claimed[0] == pytest.approx(right[0])  # its data-parallel figure is right
    assert claimed[1] / right[1] == pytest.approx((2 + 7 / 8 * 2) / (2 * 7 / 8))  # 2.14x
    assert claimed[2] / right[2] == pytest.approx(1 / (2 * 7 / 8))  # 0.57x: misses the gather
    assert claimed[3] / right[3] == pytest.approx((32 / 8 + 1) / (3 * 7 / 8))  # grows with L


def test_owners_balance_the_elements_and_agree_everywhere():
    sizes = [100, 10, 10, 80, 5, 5]
    owners = zero_cost.assign_owners(sizes, 2)
    assert owners == (0, 1, 1, 1, 0, 1)  # the fifth: a tie at 100, the lower rank
    assert zero_cost.shard_numels(sizes, 2) == (105, 105)
    assert zero_cost.assign_owners([5], 2, held=[10, 0]) == (1,)
    assert zero_cost.shard_numels([7] * 3, 4) == (7, 7, 7, 0)


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: zero_cost.zero_memory_bytes(10, 2, 4), ValueError, "stage=4 is not one of"),
    (lambda: zero_cost.zero_memory_bytes(10, 2, 1.0), TypeError, "stage must be an integer"),
    (lambda: zero_cost.zero_memory_bytes(10, 0, 1), ValueError,
     "n_ranks must be a positive integer"),
    (lambda: zero_cost.zero_memory_bytes(10, 2, 1, "adam"), ValueError, "recipe='adam'"),
    (lambda: zero_cost.zero_sent_bytes(10, 2, 1, grad_dtype="fp7"), ValueError, "fp7"),
    (lambda: zero_cost.assign_owners([1], 2, held=[0]), ValueError, "one count per rank"),
    (lambda: zero_cost.claimed_zero_sent_bytes(1, 1.0, 2, n_layers=0, optimizer_bytes=0),
     ValueError, "n_layers must be a positive integer"),
])
def test_bad_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()
