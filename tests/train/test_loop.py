"""mlsys.train.loop: the learning-rate schedule warms up linearly, then follows a cosine down to
its floor. (The loop itself runs in every job of test_main.py.)"""

import pytest

from mlsys.train import loop


def test_schedule_warms_up_then_follows_a_cosine():
    lrs = [loop.lr_at(s, peak=1.0, warmup=4, steps=20, min_ratio=0.1) for s in range(20)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lrs[4] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:], strict=False))
