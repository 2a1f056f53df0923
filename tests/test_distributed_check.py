"""mlsys.distributed.check: a parallel run against one process, with its bytes, on CPU ranks."""

import pytest

from mlsys.distributed import check


def test_fsdp_and_pp_train_like_one_process_and_send_the_accounted_bytes():
    rows = check.against_one_process({"fsdp": (dict(dp_shard=2), False),
                                      "pp": (dict(pp=2), False)}, 2)
    assert [r["case"] for r in rows] == ["fsdp", "pp"]
    for r in rows:
        assert max(r["loss_diff"], r["grad_diff"], r["param_diff"]) < 1e-5
        assert r["sent_bytes"] == r["predicted_bytes"] and all(b > 0 for b in r["sent_bytes"])


def test_the_reference_learns_and_bad_meshes_fail_before_any_launch():
    ref = check.one_process(check.Setup(steps=3))
    assert len(ref["losses"]) == 3 and ref["losses"][-1] < ref["losses"][0]
    with pytest.raises(ValueError, match="world_size"):
        check.against_one_process({"bad": (dict(tp=3), False)}, 2)
    with pytest.raises(ValueError, match="lr"):
        check.Setup(lr=0)
