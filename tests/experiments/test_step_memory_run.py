"""What step_memory runs (`mlsys.experiments.step_memory_run`): its sizes checked, and a length
that runs out of memory kept as such while the others run."""

import pytest

from mlsys.experiments import step_memory, step_memory_run


def test_sizes_are_checked():
    with pytest.raises(ValueError, match=r"timeline_seq \(128\) must be one of seqs \(32, 64\)"):
        step_memory_run.Sizes("debug", 2, (32, 64), 128, (1,), 3)
    with pytest.raises(ValueError, match="preset='nope' is not one of"):
        step_memory_run.Sizes("nope", 2, (32, 64), 64, (1,), 3)
    with pytest.raises(ValueError, match="repeats"):
        step_memory_run.Sizes("debug", 2, (32, 64), 64, (1,), 0)
    assert step_memory_run.SIZES["smoke"].timeline_seq in step_memory_run.SIZES["smoke"].seqs


def test_step_memory_keeps_an_out_of_memory_length(monkeypatch):
    real = step_memory_run._measure

    def failing(model, optimizer, tokens, seq, *args, **kwargs):
        if seq == 32:
            raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate "
                               "... out of memory")
        return real(model, optimizer, tokens, seq, *args, **kwargs)

    monkeypatch.setattr(step_memory_run, "_measure", failing)
    rows = step_memory.run(step_memory.SIZES["smoke"], device="cpu")
    status = {r["seq"]: r["status"] for r in rows if r["kind"] == "step" and r["segment"] is None}
    assert status == {32: "out of memory", 64: "ok"}
    assert "out of memory" in repr(step_memory.peak_table(rows))
