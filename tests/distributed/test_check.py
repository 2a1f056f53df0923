"""mlsys.distributed.check: a parallel run against one process, with its bytes, on CPU ranks.
(Its harness, the reference and the helpers: test_harness.py; every mesh: test_mesh.py.)"""

from mlsys.distributed import check


def test_fsdp_and_pp_train_like_one_process_and_send_the_accounted_bytes():
    rows = check.against_one_process({"fsdp": (dict(dp_shard=2), False),
                                      "pp": (dict(pp=2), False)}, 2)
    assert [r["case"] for r in rows] == ["fsdp", "pp"]
    for r in rows:
        assert max(r["loss_diff"], r["grad_diff"], r["param_diff"]) < 1e-5
        assert r["sent_bytes"] == r["predicted_bytes"] and all(b > 0 for b in r["sent_bytes"])
