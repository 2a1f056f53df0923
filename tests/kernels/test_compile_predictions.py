"""Predictions from compiled tiles (`mlsys.kernels.compile_predictions`): the time of a launch
counts its last, partial wave; a tile that fits no SM cannot launch."""

import pytest
from compile_cases import fake_compiled

from mlsys.kernels import compile_predictions


def test_the_prediction_counts_the_last_wave():
    # 128 registers x 4 warps: 4 blocks per SM by registers; 132 SMs -> 528 slots
    c = fake_compiled()
    assert c.occupancy().blocks_per_sm == 4
    one_wave = compile_predictions.predict(c, 1e12, 1e6, 528)
    a_bit_more = compile_predictions.predict(c, 1e12, 1e6, 529)
    assert one_wave.waves == 1 and one_wave.wave_efficiency == 1.0
    assert a_bit_more.waves == 2 and a_bit_more.wave_efficiency == pytest.approx(529 / 1056)
    assert a_bit_more.time_s == pytest.approx(one_wave.time_s * 1056 / 529)
    with pytest.raises(ValueError, match="cannot launch: no block fits an SM"):
        compile_predictions.predict(fake_compiled(registers=256), 1e12, 1e6, 10)
