"""The seed's attention sweep read against the count (`mlsys.experiments.attention_sweep_seed`)."""


def test_the_seeds_sweep_against_the_count():
    from mlsys import hardware
    from mlsys.experiments import attention_sweep_seed

    seed = attention_sweep_seed.seed_numbers(8)
    assert seed["per_pair"] == 32 and abs(seed["bytes_per_pair"] - 32) < 1  # P: 8 x fp32
    assert round(seed["their_extra"]) == 3 and seed["their_comp_extra"] < seed["their_extra"]
    assert seed["seed_peak_2x_gb"] == (3 + 1) * 8 * 32_768**2 * 4 / 1e9
    table = attention_sweep_seed.seed_table(8)
    assert len(table.rows) == sum(r.variant == "eager"
                                  for r in attention_sweep_seed.third_party.CS336_STUDENT_ATTENTION)
    fits = attention_sweep_seed.fits_table(8)
    assert [r[0] for r in fits.rows] == [a.name for a in hardware.ACCELERATORS.values()]
