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


def test_the_seeds_fixed_offset_is_memory_held_before_not_q_k_v():
    from mlsys.experiments import attention_sweep_seed

    seed = attention_sweep_seed.seed_numbers(8)
    # their first reading (10.62 MiB at 256 tokens, d = 16) is 8.12 MiB above P, O, q, k, v;
    # every later one 16.25 MiB above: more than 20x q, k, v (3 x 8 x 256 x 16 x 4 bytes)
    assert seed["qkv_short_mib"] == 3 * 8 * 256 * 16 * 4 / 2**20 == 0.375
    assert abs(seed["offset_lo_mib"] - 8.12) < 0.01 and abs(seed["offset_hi_mib"] - 16.25) < 0.01
    table = attention_sweep_seed.seed_table(8)
    column = table.header.index("theirs − predicted (MiB)")
    assert {row[column] for row in table.rows} == {"8.1", "16.2"}


def test_the_seeds_memory_per_seq2_column_mixes_mib_with_ten_to_the_six():
    """Seed 003, 'pytorch_attention' (a), memory scaling analysis: "Memory/seq^2" is their MiB
    reading x 10^6 / seq^2; in bytes it is MiB x 2^20 / seq^2, 1.048576x larger."""
    from mlsys.experiments import attention_sweep_seed

    printed = attention_sweep_seed.printed_per_seq2()
    assert set(printed) == set(attention_sweep_seed.SEED_PRINTED)
    for (_, seq), (mib, shown) in printed.items():
        assert abs(mib * 1e6 / seq**2 / shown - 1) < 1e-3  # reproduced (readings rounded)
        assert abs(mib * 2**20 / seq**2 / shown - 1.048576) < 1e-3
    long = [(shown, mib * 2**20 / seq**2) for (_, seq), (mib, shown) in printed.items()
            if seq == attention_sweep_seed.SEED_SEQ]
    assert len(long) == 4 and all(shown < 32 < in_bytes for shown, in_bytes in long)
