"""mlsys.memory_timeline: a tiny training step's allocations on CPU (timeline, phases, largest
allocations, plot), the arithmetic of a timeline, the GPU snapshot parser on a hand-made
snapshot, and argument checks."""

import matplotlib
import pytest
import torch

from mlsys import memory_timeline as M
from mlsys import plotting
from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.profiling import PhaseSpan, Profile
from mlsys.training import next_token_loss

matplotlib.use("Agg")
BATCH, SEQ = 4, 64  # the logits (1 MB) outweigh the gradients (0.9 MB)


@pytest.fixture(scope="module")
def step():
    """The debug model's second training step (AdamW's state exists), metered phase by phase."""
    cfg = TransformerConfig.preset("debug")
    model = Transformer(cfg)
    model.init_weights(seed=0)
    optimizer = torch.optim.AdamW(model.parameters())
    tokens = torch.randint(cfg.vocab_size, (BATCH, SEQ + 1),
                           generator=torch.Generator().manual_seed(0))
    meter = M.meter("cpu", model=model)
    for step in (1, 2):
        with meter.recording():
            with meter.phase("forward", step=step):
                loss = next_token_loss(model, tokens)
            with meter.phase("backward", step=step):
                loss.backward()
                del loss
            with meter.phase("optimizer", step=step):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    return cfg, meter


def test_rows_carry_labels_live_and_peak(step):
    _, meter = step
    assert meter.method.startswith("torch.profiler")
    assert [(r["step"], r["phase"]) for r in meter.rows] == [
        (s, p) for s in (1, 2) for p in ("forward", "backward", "optimizer")]
    assert list(meter.rows[0]) == ["step", "phase", "live_bytes", "peak_bytes"]
    for r in meter.rows:
        assert r["peak_bytes"] >= r["live_bytes"]


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
    assert M._phase_of(tl.phases, tl.times_ns[tl.allocated_bytes.index(peak)]) in ("forward",
                                                                                 "backward")
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
    M.plot(meter.timelines[1], ax, top=3, title="one step")
    labels = ax.get_legend_handles_labels()[1]
    assert labels[0].startswith("peak: ") and len(labels) == 1 + 3
    assert labels[1] == "1: 1.02 MB, aten::mm in lm_head"
    assert len(ax.patches) == 3  # the shaded phases
    fig.clf()


def _events():
    """(t_ns, bytes, address, label): a 100-byte block freed, a 50-byte one kept, and the free of
    a block older than the recording."""
    return [(10, 100, 0xA, "x"), (20, 50, 0xB, "y"), (30, -100, 0xA, ""), (40, -8, 0xC, "")]


def test_timeline_arithmetic():
    phases = [PhaseSpan("p", 15, 35)]
    tl = M._timeline("cpu", "hand-made", _events(), phases)
    assert tl.allocated_bytes == (100, 150, 50, 42)
    assert (tl.live_at(0), tl.live_at(10), tl.live_at(29), tl.live_at(1000)) == (0, 100, 150, 42)
    assert tl.peak_between(15, 35) == 150 and tl.peak_between(31, 39) == 50
    assert tl.phase_rows() == [{"phase": "p", "live_bytes": 50, "peak_bytes": 150}]
    a, b = tl.allocations
    assert (a.nbytes, a.start_ns, a.end_ns, a.phase, a.label) == (100, 10, 30, M.NO_PHASE, "x")
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
    tl = M.from_snapshot(snapshot, [PhaseSpan("forward", 0, 3_500)], start_us=start,
                         device_index=1, baseline_bytes=4096)
    assert tl.device == "cuda" and tl.baseline_bytes == 4096
    assert tl.times_ns == (2_000, 3_000, 5_000) and tl.allocated_bytes == (1024, 1536, 512)
    big, small = tl.largest(2)
    assert (big.nbytes, big.end_ns, big.phase, big.label) == (1024, 5_000, "forward",
                                                              "transformer.py:93 forward")
    assert (small.end_ns, small.label) == (None, "no user frame")
    with pytest.raises(TypeError, match="snapshot"):
        M.from_snapshot([], [], start_us=0)


def test_arguments_are_checked():
    meter = M.meter("cpu")
    with pytest.raises(TypeError, match="model must be"):
        M.meter("cpu", model="gpt")
    with pytest.raises(ValueError, match="device"):
        M.meter("tpu")
    with pytest.raises(RuntimeError, match="inside meter.recording"):
        with meter.phase("forward"):
            pass
    with meter.recording(), pytest.raises(RuntimeError, match="do not nest"):
        with meter.recording():
            pass
    assert len(meter.timelines) == 1 and meter.rows == []  # the outer recording, no phases
    with pytest.raises(TypeError, match="Profile"):
        M.from_profile(meter.timelines[0])
    with Profile(device="cpu") as prof:
        pass
    with pytest.raises(ValueError, match="record_memory=True"):
        M.from_profile(prof)
    with pytest.raises(TypeError, match="Timeline"):
        M.plot(prof, None)
    with pytest.raises(ValueError, match="n must be"):
        M._timeline("cpu", "", _events(), []).largest(0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            M.meter("cuda")


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_gpu
def test_cuda_meter_with_history():
    cfg = TransformerConfig.preset("debug")
    model = Transformer(cfg).cuda()
    tokens = torch.randint(cfg.vocab_size, (BATCH, SEQ + 1), device="cuda")
    meter = M.meter("cuda", history=True)
    with meter.recording():
        with meter.phase("forward"):
            loss = next_token_loss(model, tokens)
        with meter.phase("backward"):
            loss.backward()
            del loss
    forward, backward = meter.rows
    assert forward["live_bytes"] > 0 and backward["peak_bytes"] >= forward["live_bytes"]
    tl = meter.timelines[0]
    assert [r["live_bytes"] for r in tl.phase_rows()] == [forward["live_bytes"],
                                                          backward["live_bytes"]]
    assert tl.largest(1)[0].label != "no user frame"
