"""The attention_model_step experiment (chapter 06, smoke sizes): the saved bytes per backend."""

from mlsys.experiments import attention_model_step


def test_attention_model_step_matches_saved_bytes():
    rows = attention_model_step.run(attention_model_step.SIZES["smoke"], device="cpu")
    for backend, m in attention_model_step.memory(rows).items():
        assert m["saved_bytes"] == attention_model_step.predicted_saved(rows, backend)
    mem = attention_model_step.memory(rows)
    assert mem["sdpa"]["saved_bytes"] == mem["flash_torch"]["saved_bytes"] < mem["naive"][
        "saved_bytes"]
    assert set(attention_model_step.verdicts(rows)) == {"memory", "time"}
