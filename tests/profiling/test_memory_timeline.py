"""mlsys.profiling.memory_timeline: a tiny training step's allocations on CPU (timeline, phases,
largest allocations, plot), the arithmetic of a timeline, and the GPU snapshot parser on a
hand-made snapshot."""

import matplotlib
import pytest
import torch
from memory_cases import BATCH, SEQ, hand_made_events, metered_step

from mlsys import plotting
from mlsys.models.transformer import Transformer
from mlsys.profiling import memory_timeline
from mlsys.profiling.events import PhaseSpan

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def step():
    return metered_step()


def test_timeline_starts_at_the_baseline_and_rises_in_forward(step):
    cfg, meter = step
    assert len(meter.timelines) == 2
    tl = meter.timelines[1]
    forward, backward, optimizer = tl.phases
    assert (forward.name, backward.name, optimizer.name) == ("forward", "backward", "optimizer")
    assert tl.live_at(0) == 0 == tl.baseline_bytes  # counted from the start of the recording
    assert tl.live_at(forward.end_ns) > 0  # the activations saved for backward
    param_bytes = 4 * sum(p.numel() for p in Transformer(cfg).parameters())
    assert tl.live_at(backward.end_ns) == param_bytes  # activations freed, gradients made
    assert tl.live_at(optimizer.end_ns) == 0  # zero_grad(set_to_none): the moments existed
    peak = tl.peak_between(0, tl.times_ns[-1])
    assert peak == max(tl.allocated_bytes) > param_bytes
    at_peak = tl.times_ns[tl.allocated_bytes.index(peak)]
    assert memory_timeline._phase_of(tl.phases, at_peak) in ("forward", "backward")
    assert [r["live_bytes"] for r in tl.phase_rows()] == [r["live_bytes"] for r in meter.rows[3:]]
    assert tl.times_ns == tuple(sorted(tl.times_ns))


def test_largest_allocations_are_the_logits_and_have_labels(step):
    cfg, meter = step
    tl = meter.timelines[1]
    largest = tl.largest(4)
    logits = BATCH * SEQ * cfg.vocab_size * 4  # fp32 (batch, seq, vocab)
    assert [a.nbytes for a in largest] == [logits] * 4  # logits, log-probs and their grads
    assert largest[0].label == "aten::mm in lm_head" and largest[0].phase == "forward"
    assert {a.label for a in largest[1:]} >= {"NllLossBackward0", "LogSoftmaxBackward0"}
    for a in tl.allocations:
        assert a.label and (a.end_ns is None or a.end_ns >= a.start_ns)
    assert any("in blocks.0." in a.label for a in tl.allocations)  # a module found in forward
    assert any(a.label.endswith(" in optimizer") for a in tl.allocations)


def test_plot_draws_the_curve_phases_and_largest(step):
    _, meter = step
    fig, ax = plotting.subplots()
    memory_timeline.plot(meter.timelines[1], ax, top=3, title="one step")
    labels = ax.get_legend_handles_labels()[1]
    assert labels[0].startswith("peak: ") and len(labels) == 1 + 3
    assert labels[1] == "1: 1.02 MB, aten::mm in lm_head"
    assert len(ax.patches) == 3  # the shaded phases
    fig.clf()


def test_timeline_arithmetic():
    phases = [PhaseSpan("p", 15, 35)]
    tl = memory_timeline.build_timeline("cpu", "hand-made", hand_made_events(), phases)
    assert tl.allocated_bytes == (100, 150, 50, 42)
    assert (tl.live_at(0), tl.live_at(10), tl.live_at(29), tl.live_at(1000)) == (0, 100, 150, 42)
    assert tl.peak_between(15, 35) == 150 and tl.peak_between(31, 39) == 50
    assert tl.phase_rows() == [{"phase": "p", "live_bytes": 50, "peak_bytes": 150}]
    a, b = tl.allocations
    assert (a.nbytes, a.start_ns, a.end_ns, a.phase, a.label) == (
        100, 10, 30, memory_timeline.NO_PHASE, "x")
    assert (b.nbytes, b.end_ns, b.phase) == (50, None, "p")
    assert tl.largest(1) == [a]


def test_snapshot_parser_on_a_hand_made_snapshot():
    torch_file = torch.__file__.replace("__init__.py", "nn/modules/linear.py")
    frames = [{"filename": torch_file, "line": 125, "name": "forward"},
              {"filename": "/book/lib/mlsys/models/transformer.py", "line": 93, "name": "forward"}]
    start = 1_700_000_000_000_000  # epoch microseconds, the allocator's clock
    trace = [
        {"action": "alloc", "addr": 1, "size": 512, "time_us": start - 5, "frames": []},  # before
        {"action": "segment_alloc", "addr": 0, "size": 2 << 20, "time_us": start + 1},
        {"action": "alloc", "addr": 2, "size": 1024, "time_us": start + 2, "frames": frames},
        {"action": "alloc", "addr": 3, "size": 512, "time_us": start + 3, "frames": []},
        {"action": "free_requested", "addr": 2, "size": 1024, "time_us": start + 4},
        {"action": "free_completed", "addr": 2, "size": 1024, "time_us": start + 5},
    ]
    snapshot = {"segments": [], "device_traces": [[], trace]}
    tl = memory_timeline.from_snapshot(snapshot, [PhaseSpan("forward", 0, 3_500)], start_us=start,
                                       device_index=1, baseline_bytes=4096)
    assert tl.device == "cuda" and tl.baseline_bytes == 4096
    assert tl.times_ns == (2_000, 3_000, 5_000) and tl.allocated_bytes == (1024, 1536, 512)
    big, small = tl.largest(2)
    assert (big.nbytes, big.end_ns, big.phase, big.label) == (1024, 5_000, "forward",
                                                              "transformer.py:93 forward")
    assert (small.end_ns, small.label) == (None, "no user frame")
    with pytest.raises(TypeError, match="snapshot"):
        memory_timeline.from_snapshot([], [], start_us=0)


def test_timeline_record_round_trip_keeps_the_peak():
    events = [(i * 10, 100 if i % 3 else -50, i, "x") for i in range(1, 400)]
    tl = memory_timeline.build_timeline("cpu", "hand-made", events, [])
    back = memory_timeline.Timeline.from_record(tl.to_record(max_points=20, top=3))
    assert len(back.times_ns) <= 40 and back.peak()[1] == tl.peak()[1]
    assert back.allocated_bytes[-1] == tl.allocated_bytes[-1] and len(back.allocations) == 3
