"""The profiler's own cost (`mlsys.profiling.overhead`): the same function timed plain and
profiled, and the Kineto log level left as it was."""

import os

import torch

from mlsys.profiling import overhead


def test_kineto_level_is_restored_and_overhead_is_measured():
    before = os.environ.get("KINETO_LOG_LEVEL")
    x = torch.ones(64, 64)
    cost = overhead.profiler_overhead(lambda: x @ x, device="cpu", warmup=1, repeats=3, rounds=2)
    assert len(cost.plain.samples_s) == len(cost.profiled.samples_s) == 6
    assert cost.ratio == cost.profiled.median_s / cost.plain.median_s > 0
    assert os.environ.get("KINETO_LOG_LEVEL") == before
