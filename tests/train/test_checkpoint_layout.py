"""mlsys.train.checkpoint_layout: one directory per step with `.metadata` as the commit marker, so
a save killed half-way is never chosen nor loaded; and the refusal, by name, of a checkpoint of
another model config.
"""

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from checkpoint_cases import CFG, adamw, assert_same, build, trained, weights_and_moments

from mlsys.models.transformer import Transformer
from mlsys.train import checkpoint
from mlsys.train.checkpoint_layout import (
    CheckpointError,
    check_compatible,
    is_complete,
    latest,
    model_shapes,
)

ROOT = Path(__file__).resolve().parents[2]


_BIG_SAVE = textwrap.dedent("""
    import sys, torch
    from mlsys.train import checkpoint
    params = [torch.nn.Parameter(torch.ones(2**23)) for _ in range(4)]  # 4 x 32 MiB
    model = torch.nn.ParameterList(params)
    checkpoint.save(sys.argv[1], 2, model, torch.optim.SGD(params, lr=0.1), extra={})
""")


@pytest.mark.timeout(60)
def test_a_save_killed_half_way_is_never_chosen_nor_loaded(tmp_path):
    model, optimizer, _ = trained()
    first = checkpoint.save(tmp_path, 1, model, optimizer, extra={"step": 1})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", _BIG_SAVE, str(tmp_path)], cwd=ROOT, env=env)
    half = tmp_path / "step_00000002"
    shard = half / "__0_0.distcp"
    try:
        deadline = time.monotonic() + 45
        while not (shard.is_file() and shard.stat().st_size > 0):
            assert proc.poll() is None and time.monotonic() < deadline, "the save never began"
            time.sleep(0.005)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not is_complete(half), "the save finished before it was killed"
    assert shard.stat().st_size < 4 * 2**25  # partial data, written in place
    assert latest(tmp_path) == first
    model2, optimizer2 = build(1), None
    optimizer2 = adamw(model2)
    assert checkpoint.load(first, model2, optimizer2) == {"step": 1}
    assert_same(weights_and_moments(model2, optimizer2), weights_and_moments(model, optimizer))
    for call in (lambda: checkpoint.load(half, model2, optimizer2),
                 lambda: check_compatible(half, None, {}),
                 lambda: checkpoint.export(half, tmp_path / "out.pt")):
        with pytest.raises(CheckpointError, match="is not a complete checkpoint"):
            call()
    again = checkpoint.save(tmp_path, 2, model, optimizer, extra={"step": 2})  # the step re-done
    assert latest(tmp_path) == again == half
    assert sorted(p.name for p in half.iterdir()) == [".metadata", "__0_0.distcp",
                                                      "checkpoint.json"]
    assert shard.stat().st_size == (first / "__0_0.distcp").stat().st_size  # the same state


def test_a_checkpoint_of_another_model_is_refused_by_name(tmp_path):
    model, optimizer, _ = trained(steps=1)
    path = checkpoint.save(tmp_path, 1, model, optimizer, extra={})
    same = dataclasses.replace(CFG, attention="sdpa")  # another kernel, the same weights
    check_compatible(path, dataclasses.asdict(same), model_shapes(same))
    deeper = dataclasses.replace(CFG, n_layers=3)
    with pytest.raises(CheckpointError, match=r"(?s)n_layers: checkpoint 2, this run "
                                              r"3.*missing keys.*blocks\.2\.attn"):
        check_compatible(path, dataclasses.asdict(deeper), model_shapes(deeper))
    wider = dataclasses.replace(CFG, d_model=128, d_ff=352)
    with pytest.raises(CheckpointError, match=r"(?s)d_ff: checkpoint 176, this run "
                       r"352; d_model: checkpoint 64, this run 128.*different shapes: "
                       r"blocks.0.attn.k_proj.weight: checkpoint \(64, 64\), model \(128, 128\)"
                       r".* and 13 more"):
        check_compatible(path, dataclasses.asdict(wider), model_shapes(wider))
    shallow = {k: v for k, v in model_shapes(model).items() if "blocks.1." not in k}
    with pytest.raises(CheckpointError, match=r"unexpected keys .*blocks\.1\."):
        check_compatible(path, None, shallow)
    small = Transformer(deeper)
    with pytest.raises(CheckpointError, match="does not fit this model"):
        checkpoint.load(path, small, adamw(small))
