"""mlsys.profiling.memory_meter: live and peak bytes of each phase of a tiny training step on CPU,
the CUDA meter with its allocation history, and argument checks."""

import pytest
import torch
from memory_cases import BATCH, SEQ, hand_made_events, metered_step

from mlsys.models.config import TransformerConfig
from mlsys.models.transformer import Transformer
from mlsys.profiling import memory_meter, memory_timeline
from mlsys.profiling.profiler import Profile
from mlsys.training import next_token_loss


@pytest.fixture(scope="module")
def step():
    return metered_step()


def test_rows_carry_labels_live_and_peak(step):
    _, meter = step
    assert meter.method.startswith("torch.profiler")
    assert [(r["step"], r["phase"]) for r in meter.rows] == [
        (s, p) for s in (1, 2) for p in ("forward", "backward", "optimizer")]
    assert list(meter.rows[0]) == ["step", "phase", "live_bytes", "peak_bytes"]
    for r in meter.rows:
        assert r["peak_bytes"] >= r["live_bytes"]


def test_arguments_are_checked():
    meter = memory_meter.meter("cpu")
    with pytest.raises(TypeError, match="model must be"):
        memory_meter.meter("cpu", model="gpt")
    with pytest.raises(ValueError, match="device"):
        memory_meter.meter("tpu")
    with pytest.raises(RuntimeError, match="inside meter.recording"):
        with meter.phase("forward"):
            pass
    with meter.recording(), pytest.raises(RuntimeError, match="do not nest"):
        with meter.recording():
            pass
    assert len(meter.timelines) == 1 and meter.rows == []  # the outer recording, no phases
    with pytest.raises(TypeError, match="Profile"):
        memory_timeline.from_profile(meter.timelines[0])
    with Profile(device="cpu") as prof:
        pass
    with pytest.raises(ValueError, match="record_memory=True"):
        memory_timeline.from_profile(prof)
    with pytest.raises(TypeError, match="Timeline"):
        memory_timeline.plot(prof, None)
    with pytest.raises(ValueError, match="n must be"):
        memory_timeline.build_timeline("cpu", "", hand_made_events(), []).largest(0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            memory_meter.meter("cuda")


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_gpu
def test_cuda_meter_with_history():
    cfg = TransformerConfig.preset("debug")
    model = Transformer(cfg).cuda()
    tokens = torch.randint(cfg.vocab_size, (BATCH, SEQ + 1), device="cuda")
    meter = memory_meter.meter("cuda", history=True)
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
