"""The experiments' shared kit (`mlsys.experiments.kit`): rows of a kind, out-of-memory handling,
fresh seeded models and metered steps, timing helpers and figures."""

import weakref

import matplotlib
import pytest
import torch

from mlsys import bench
from mlsys.accounting import comms as comms_cost
from mlsys.experiments import kit
from mlsys.models.config import TransformerConfig
from mlsys.profiling import memory_meter

matplotlib.use("Agg")

ROWS = [{"kind": "row", "x": 1}, {"kind": "setup", "device": "here"}, {"kind": "row", "x": 2}]


def test_rows_of_a_kind():
    assert kit.first(ROWS, "row") == {"kind": "row", "x": 1}
    assert kit.setup(ROWS) == {"kind": "setup", "device": "here"}
    with pytest.raises(StopIteration):
        kit.first(ROWS, "nothing")


@pytest.mark.parametrize("error, oom", [
    (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (RuntimeError("CUDA error: out of memory"), True),
    (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB"), True),
    (RuntimeError("shape mismatch"), False),
    (ValueError("out of memory"), False),  # not an allocation: a ValueError is a bug
])
def test_is_oom_knows_an_allocation_that_failed(error, oom):
    assert kit.is_oom(error) is oom


def test_out_of_memory_swallows_only_out_of_memory():
    with kit.OutOfMemory() as oom:
        pass
    assert not oom.happened
    with kit.OutOfMemory() as oom:
        raise RuntimeError("CUDA out of memory")
    assert oom.happened
    with pytest.raises(RuntimeError, match="shape"), kit.OutOfMemory():
        raise RuntimeError("shape mismatch")


def test_out_of_memory_keeps_no_reference_to_the_failed_step():
    """The error's traceback would hold the failed step's tensors: nothing may keep it."""
    class Big:
        pass

    held = []

    def step():
        big = Big()  # held by this frame, so by the error's traceback
        held.append(weakref.ref(big))
        raise RuntimeError("out of memory")

    with kit.OutOfMemory() as oom:
        step()
    assert oom.happened and held[0]() is None  # gone at once: no cycle, no collection needed


def test_free_and_compile_fresh_run_here():
    kit.free("cpu")
    compiled = kit.compile_fresh(lambda t: t * 2 + 1, backend="eager")
    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 3.0))


def test_calls_per_sample_fills_a_sample_and_is_capped():
    assert kit.calls_per_sample(kit.SAMPLE_BYTES) == 1
    assert kit.calls_per_sample(2 * kit.SAMPLE_BYTES) == 1
    assert kit.calls_per_sample(kit.SAMPLE_BYTES // 4) == 4
    assert kit.calls_per_sample(1) == kit.MAX_CALLS


def test_slowest_takes_the_last_rank_sample_by_sample():
    timing = kit.slowest([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]])
    assert isinstance(timing, bench.Timing)
    assert timing.samples_s == (3.0, 5.0, 2.5) and timing.device == "ranks"
    with pytest.raises(ValueError):
        kit.slowest([[1.0, 2.0], [1.0]])


def test_fit_row_is_the_alpha_beta_fit_or_why_not():
    sizes = [2**20, 2**24, 2**28]
    times = [comms_cost.collective_time_s("all_reduce", m, 2, alpha_s=1e-5, bytes_per_s=1e10)
             for m in sizes]
    row = kit.fit_row(sizes, times, 2)
    assert row["kind"] == "fit"
    assert row["alpha_s"] == pytest.approx(1e-5, rel=1e-6)
    assert row["bytes_per_s"] == pytest.approx(1e10, rel=1e-6)
    flat = kit.fit_row(sizes, [1e-3] * 3, 2)  # times that do not grow with the size
    assert set(flat) == {"kind", "error"}


def test_a_fresh_model_is_seeded_and_a_metered_step_reads_its_phases():
    cfg = TransformerConfig.preset("debug")
    a, b = kit.fresh_model(cfg, "cpu"), kit.fresh_model(cfg, "cpu")
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    tokens = torch.randint(cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(a.parameters())
    meter = memory_meter.meter("cpu")
    counter = kit.metered_step(meter, a, optimizer, tokens, autocast=True)
    assert [r["phase"] for r in meter.rows] == ["forward", "backward", "optimizer"]
    assert counter.activation_bytes > 0 and all(p.grad is None for p in a.parameters())
    assert not any(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_draw_puts_a_plot_in_a_figure_of_its_own(monkeypatch):
    seen = []
    kit.draw(lambda rows, axes, **kw: seen.append((rows, len(axes), kw)), ROWS, ncols=2,
             width=4.0, height=2.0, title="t")
    assert seen == [(ROWS, 2, {"title": "t"})]
