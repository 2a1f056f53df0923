"""mlsys.distributed.torch_strategies on 2 gloo ranks: PyTorch's FSDP2 (`apply_fully_shard`, over
a process group, a 1-D and a 2-D DeviceMesh) on models it was not written for (fsdp_cases.py: a
stack of Linear layers, a language model with tied weights), cut by wrap policies, in fp32 and
bf16 from a chapter-07 precision policy, trains like one process that computes the same way; bad
arguments are clear errors before any collective. DTensor tensor parallelism and
torch.distributed.pipelining are compared with the hand-written ones in test_tp.py and test_pp.py.

One launch serves every case; the rank function lives in fsdp_cases.py (the ranks import it).
"""

import pytest
from fsdp_cases import CASES, all_cases, assert_close, check_bad_arguments, reference

from mlsys.distributed import launch
from mlsys.distributed.torch_strategies import apply_fully_shard

TORCH_CASES = tuple(c for c, (_, _, impl, _) in CASES.items() if impl != "ours")


@pytest.fixture(scope="module")
def results():
    with launch.start(2, timeout_s=60, collective_timeout_s=30) as job:
        return job.run(all_cases, args=(TORCH_CASES,), timeout_s=120)


@pytest.mark.timeout(200)  # past the launcher's own deadlines (60 s start + 120 s run)
@pytest.mark.parametrize("case", TORCH_CASES)
def test_fsdp_on_any_module_trains_like_one_process(results, case):
    model_name, _, _, precision = CASES[case]
    ref = reference(model_name, precision)
    moved = {n: (ref["params"][n] - ref["start"][n]).abs().max().item() for n in ref["params"]}
    assert min(moved.values()) > 1e-3  # every tensor moves: a missed update cannot pass
    largest = {n: g.abs().max().item() for n, g in ref["grads"].items()}
    for r in results:
        assert_close(r[case]["grads"], ref["grads"], largest, precision, f"{case} grads")
        assert_close(r[case]["params"], ref["params"], moved, precision, f"{case} params")


APPLY = {"apply_fully_shard": (apply_fully_shard, "param_dtype")}
"""The hand-written `apply_fsdp` takes the same arguments: test_fsdp.py."""


@pytest.mark.parametrize("which", list(APPLY))
def test_bad_arguments_are_clear_errors_before_any_collective(which):
    """No process group here: each error must come before the group is even looked at (which
    would be 'torch.distributed is not initialized'), and leave the module as it was."""
    apply, dtype_arg = APPLY[which]
    check_bad_arguments(apply, dtype_arg)
