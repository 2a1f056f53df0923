"""mlsys.diagrams.step_memory: allocations sorted into parts by their origin, the parts over a
made-up step against its allocator curve, the napkin's step, and the panels drawn."""

import itertools

import matplotlib.pyplot as plt
import pytest

from mlsys.diagrams import step_memory as sm
from mlsys.profiling.events import PhaseSpan
from mlsys.profiling.memory_timeline import Allocation, build_timeline

PHASES = (PhaseSpan("forward", 0, 100), PhaseSpan("backward", 110, 300),
          PhaseSpan("optimizer", 310, 400))
ENDS = {"forward_end_ns": 100, "backward_end_ns": 300}


@pytest.mark.parametrize("phase, start, end, part", [
    ("forward", 10, 200, "activations"),  # saved for the backward, freed in it
    ("forward", 10, 50, "temporaries"),  # freed within the forward
    ("forward", 10, None, "activations"),  # never freed in the recording
    ("backward", 150, 390, "gradients"),  # live after the backward: a parameter's gradient
    ("backward", 150, 250, "temporaries"),  # an intermediate gradient
    ("optimizer", 320, 330, "temporaries"),
])
def test_the_origin_of_an_allocation(phase, start, end, part):
    assert sm.origin(Allocation(64, start, end, phase, "x"), **ENDS) == part


def _timeline():
    # (t, signed bytes, address, label): an activation, a forward scratch, a gradient, and an
    # intermediate gradient, each freed where the step frees it
    events = [(10, 1000, 1, ""), (20, 300, 2, ""), (40, -300, 2, ""), (150, 400, 3, ""),
              (160, 50, 4, ""), (170, -50, 4, ""), (200, -1000, 1, ""), (390, -400, 3, "")]
    return build_timeline("cpu", "made up", events, PHASES)


def test_measured_parts_add_up_to_the_allocator_curve():
    tl = _timeline()
    step = sm.measured(tl, param_bytes=4_000, optimizer_bytes=8_000)
    for t, total in zip(step.times_ns, step.total(), strict=True):
        assert total == 12_000 + tl.live_at(t)
    t_peak, at = step.peak()
    assert t_peak == 160 and at == {"parameters": 4_000, "optimizer state": 8_000,
                                    "gradients": 400, "activations": 1000, "temporaries": 50}
    again = sm.StepMemory.from_record(step.to_record())
    assert again == step
    few = sm.measured(tl, param_bytes=4_000, optimizer_bytes=8_000, max_points=3)
    assert len(few.times_ns) < len(step.times_ns) and max(few.total()) == max(step.total())


def test_measured_needs_a_forward_and_a_backward():
    tl = build_timeline("cpu", "x", [(1, 10, 1, "")], [PhaseSpan("forward", 0, 5)])
    with pytest.raises(ValueError, match="must have a 'backward' phase"):
        sm.measured(tl, param_bytes=0, optimizer_bytes=0)
    with pytest.raises(TypeError, match="Timeline"):
        sm.measured({"times_ns": []}, param_bytes=0, optimizer_bytes=0)


@pytest.mark.parametrize("activation_bytes", [2_000, 9_000])
def test_the_napkin_step_peaks_at_the_larger_of_activations_and_gradients(activation_bytes):
    n = 1_000
    step = sm.predicted(n_params=n, recipe="fp32_adamw", activation_bytes=activation_bytes,
                        phases=PHASES)
    resident = 4 * n + 8 * n
    assert max(step.total()) == resident + max(activation_bytes, 4 * n)
    assert step.total()[0] == step.total()[-1] == resident  # gradients freed by zero_grad
    mixed = sm.predicted(n_params=n, recipe="bf16_mixed_adamw", activation_bytes=0)
    assert mixed.parts["parameters"][0] == 6 * n and max(mixed.parts["gradients"]) == 2 * n
    assert mixed.kind == "predicted" and "nominal" in mixed.xlabel
    with pytest.raises(ValueError, match=r"missing \['optimizer'\]"):
        sm.predicted(n_params=n, recipe="fp32_adamw", activation_bytes=1, phases=PHASES[:2])
    with pytest.raises(ValueError, match="recipe"):
        sm.predicted(n_params=n, recipe="fp64_sgd", activation_bytes=1)


def test_a_step_memory_checks_its_parts():
    with pytest.raises(ValueError, match="parts must have exactly the keys"):
        sm.StepMemory((0,), {"parameters": (1,)}, PHASES, "x")
    with pytest.raises(ValueError, match="one value per time"):
        sm.StepMemory((0, 1), dict.fromkeys(sm.PARTS, (1,)), PHASES, "x")


def test_the_panels_stack_every_part_on_one_scale():
    got = sm.measured(_timeline(), param_bytes=4_000, optimizer_bytes=8_000)
    want = sm.predicted(n_params=1_000, recipe="fp32_adamw", activation_bytes=1_000,
                        phases=PHASES)
    fig = sm.draw_step_memory(got, want, titles=["measured", "predicted"], napkin_bytes=17_000)
    left, right = fig.axes[:2]
    for ax, step in ((left, got), (right, want)):
        assert [c.get_gid() for c in ax.collections] == list(sm.PARTS)
        top = ax.collections[-1].get_paths()[0].vertices[:, 1].max()
        assert top == pytest.approx(max(step.total()) / 1e6)
        napkin = next(ln for ln in ax.lines if ln.get_gid() == "napkin")
        assert napkin.get_ydata()[0] == pytest.approx(0.017)
        assert [t.get_text() for t in ax.texts] == ["forward", "backward", "optimizer"]
    assert left.get_title(loc="left").startswith("measured\npeak 0.0135 MB")
    assert left.get_ylim() == right.get_ylim()
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in left.texts]
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))
    plt.close(fig)
    with pytest.raises(ValueError, match="one title per step"):
        sm.draw_step_memory(got, want, titles=["only one"])
