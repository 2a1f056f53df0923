"""mlsys.diagrams.trace: the gaps of a hand-made trace, the lanes read from a real CPU profile,
and the bars and labels drawn against the trace."""

import itertools

import matplotlib.pyplot as plt
import pytest
import torch

from mlsys.diagrams.trace import Span, Trace, draw_trace
from mlsys.profiling.profiler import Profile

HAND = Trace(host=(Span("aten::linear", 0, 10), Span("aten::softmax", 20, 30)),
             device=(Span("mm", 2, 8), Span("add", 5, 9), Span("softmax", 22, 28)),
             source="made by hand")


def test_gaps_are_the_window_less_the_merged_device_spans():
    assert HAND.window == (0, 30)
    assert HAND.busy() == [(2, 9), (22, 28)]
    assert HAND.gaps() == [(0, 2), (9, 22), (28, 30)]
    assert HAND.idle_fraction() == pytest.approx(17 / 30)


def test_a_trace_refuses_bad_spans():
    with pytest.raises(ValueError, match="device lane is empty"):
        Trace(host=(Span("a", 0, 1),), device=(), source="x")
    with pytest.raises(ValueError, match="'b' must end at or after its start"):
        Trace(host=(Span("a", 0, 1),), device=(Span("b", 5, 4),), source="x")


@pytest.fixture(scope="module")
def profile():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    x = torch.randn(16, 32)
    with Profile(device="cpu", model=model) as prof:
        with prof.phase("forward"):
            loss = model(x).square().mean()
        with prof.phase("backward"):
            loss.backward()
    return prof


def test_lanes_read_from_a_cpu_profile(profile):
    trace = Trace.from_profile(profile, phase="forward", source="cpu")
    names = [s.name for s in trace.host]
    assert names[:3] == ["aten::linear", "aten::gelu", "aten::linear"]
    # on a CPU the ops' own bodies run inside the top-level ops, so each lies in a host span
    for d in trace.device:
        assert any(h.start_us <= d.start_us and d.end_us <= h.end_us for h in trace.host), d
    device_ops = {s.name for s in trace.device}
    assert {"aten::addmm", "aten::gelu"} <= device_ops  # kernels of their own
    assert not device_ops & {"aten::linear", "aten::square"}  # wrappers of other ops
    # addmm's own body excludes the copy of the bias it calls: the two never overlap
    addmm = [s for s in trace.device if s.name == "aten::addmm"]
    copies = [s for s in trace.device if s.name == "aten::copy_"]
    assert not any(a.start_us < c.end_us and c.start_us < a.end_us for a in addmm for c in copies)
    assert 0 < trace.idle_fraction() < 1
    first = Trace.from_profile(profile, phase="forward", first_ops=2)
    assert [s.name for s in first.host] == names[:2]
    assert first.window[1] <= trace.host[1].end_us + 1e-6
    backward = Trace.from_profile(profile, phase="backward")
    assert any("Backward" in s.name for s in backward.host)
    with pytest.raises(ValueError, match=r"phase='optimizer' is not a phase of this profile"):
        Trace.from_profile(profile, phase="optimizer")
    with pytest.raises(TypeError, match="Profile"):
        Trace.from_profile("not a profile")


def test_the_drawing_has_a_bar_per_span_and_labels_the_longest_gaps():
    fig = draw_trace(HAND, label_gaps=2)
    ax = fig.axes[0]
    gids = [p.get_gid() or "" for p in ax.patches]
    for lane, n in (("host", 2), ("device", 3), ("gap", 3)):
        assert sum(g.startswith(f"{lane} ") for g in gids) == n
    gap_widths = sorted(p.get_width() for p in ax.patches if p.get_gid().startswith("gap "))
    assert gap_widths == pytest.approx(sorted((b - a) / 1e3 for a, b in HAND.gaps()))
    labels = [t.get_text() for t in ax.texts]
    assert labels == ["2 µs", "13 µs"]  # the two longest, in time order
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[-1] == "gap: idle 57% of the window"
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.texts]
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))
    plt.close(fig)
    with pytest.raises(TypeError, match="Trace"):
        draw_trace([HAND])
