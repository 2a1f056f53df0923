"""mlsys.third_party: other people's measurements, held to what the module says of them (the rows
each table has and lacks, the arithmetic behind their claims, the models they name)."""

import dataclasses
from pathlib import Path

import pytest
import torch

from mlsys import third_party as tp
from mlsys.models.config import PRESETS, TransformerConfig
from mlsys.models.transformer import Transformer


def _params(preset: str) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in Transformer(TransformerConfig.preset(preset)).parameters())


def test_the_timing_table_has_a_row_for_every_run_but_the_out_of_memory_ones():
    rows = tp.CS336_STUDENT_BENCHMARK
    runs = [(r.preset, r.seq) for r in rows]
    assert len(runs) == len(set(runs)) == 18
    assert {preset for preset, _ in runs} | {p for p, _ in tp.CS336_STUDENT_OOM} <= set(PRESETS)
    assert not set(tp.CS336_STUDENT_OOM) & set(runs)
    wanted = {(p, s) for p in ("small", "medium", "large", "xl", "2.7B")
              for s in (128, 256, 512, 1024)}
    assert set(runs) | set(tp.CS336_STUDENT_OOM) == wanted
    for r in rows:
        assert 0 < r.forward_s < r.backward_s and r.forward_std_s >= 0 and r.backward_std_s >= 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        rows[0].forward_s = 0.0  # the rows are as reported: never edited in place


def test_the_memory_claims_follow_their_own_arithmetic():
    for r in tp.CS336_STUDENT_MEMORY:  # the training column is the states' 52.0 GB + forward
        assert r.claimed_training_gb - r.claimed_forward_gb == pytest.approx(52.0)
    assert [r.seq for r in tp.CS336_STUDENT_MEMORY] == [128, 256, 512, 1024]
    assert tp.CS336_STUDENT_MEMORY[-1].measured_training_gb is None  # 1,024 tokens: no profile
    # B S (5.9375 + 0.0078125 S) MiB: 32 (48,640 B S + 64 B S^2) fp32 elements
    assert tp.CS336_STUDENT_MIB_PER_TOKEN == 32 * 48_640 * 4 / 2**20
    assert tp.CS336_STUDENT_MIB_PER_TOKEN_SQUARED == 32 * 64 * 4 / 2**20
    assert tp.CS336_STUDENT_STATES_MB == 52 * 1024
    assert _params("2.7B") == 3_406_809_600  # the model their "4 x 3,406,809,600 x 4 bytes" is


def test_the_ddp_runs_are_of_the_xl_preset_and_their_phases_fit_in_the_step():
    setup = tp.CS336_STUDENT_DDP_SETUP
    assert setup["preset"] in PRESETS and _params(setup["preset"]) == tp.CS336_STUDENT_DDP_PARAMS
    assert tp.CS336_STUDENT_DDP_CLAIMED_MB == round(tp.CS336_STUDENT_DDP_PARAMS * 4 / 2**20, 2)
    for r in tp.CS336_STUDENT_DDP_XL:
        phases = r.forward_s + r.backward_s + r.communication_s + r.optimizer_s
        assert 0.99 * r.total_s < phases <= r.total_s, r.label
    # the last two ran with --ddp-mode naive, whatever their profiles were called
    assert [r.mode_flag for r in tp.CS336_STUDENT_DDP_XL] == [None, None, "naive", "naive"]


def test_only_the_cut_off_all_reduce_block_lacks_its_header_and_minimum():
    rows = tp.CS336_STUDENT_ALLREDUCE
    assert [r.world_size for r in rows] == [2, 2, 2, 2, 4, 6]
    assert [r.size_stated for r in rows] == [True] * 5 + [False]
    assert [r.min_s is None for r in rows] == [False] * 5 + [True]
    for r in rows:
        assert (r.min_s or 0) <= r.mean_s <= r.max_s and r.std_s >= 0


def test_the_attention_sweep_is_complete_eager_and_compiled_at_its_longest():
    eager = {(r.d_head, r.seq) for r in tp.CS336_STUDENT_ATTENTION if r.variant == "eager"}
    compiled = {(r.d_head, r.seq) for r in tp.CS336_STUDENT_ATTENTION if r.variant == "compiled"}
    heads = (16, 32, 64, 128)
    assert eager == {(d, s) for d in heads for s in (256, 1024, 4096, 8192, 16384)}
    assert compiled == {(d, 16384) for d in heads}
    assert len(tp.CS336_STUDENT_ATTENTION) == len(eager) + len(compiled)
    for r in tp.CS336_STUDENT_ATTENTION:
        assert r.peak_mb >= r.before_backward_mb > 0


def test_mixed_precision_and_compile_tables():
    for r in tp.CS336_STUDENT_AMP:  # the training-step table has bf16 runs only
        assert r.precision in ("bf16", "fp32") and r.preset in PRESETS
        assert (r.step_s is None) == (r.step_std_s is None) == (r.precision == "fp32")
    runs = [(r.mode, r.seq) for r in tp.CS336_STUDENT_COMPILE]
    assert sorted(runs) == sorted((m, s) for m in ("forward", "forward+backward", "step")
                                  for s in (128, 256, 512))


def test_every_table_says_where_it_comes_from():
    sources = {k: v for k, v in vars(tp).items() if k.startswith("SOURCE_")}
    published = {"SOURCE_MEGATRON_TABLE1": "arXiv:2104.04473", "SOURCE_LLAMA3": "arXiv:2407.21783"}
    assert len(sources) == 7 + len(published)
    for name, text in sources.items():
        if name in published:
            assert published[name] in text and "Table" in text, name
        else:
            assert "CS336 (2025) assignment 2" in text and "seed document 003" in text, name


def test_published_utilizations_are_fractions_with_a_cited_source():
    bib = (Path(__file__).resolve().parents[1] / "book" / "references.bib").read_text("utf-8")
    for r in tp.PUBLISHED_MFU:
        assert r.mfu is not None or r.hfu is not None, r.run
        for u in (r.mfu, r.hfu):
            assert u is None or 0.1 < u < 0.7, r.run
        if r.mfu is not None and r.hfu is not None:
            assert r.hfu > r.mfu  # recomputation only adds executed FLOPs
        key = r.source.split(",")[0]
        assert f"{{{key}," in bib, key  # every row cites a paper of the bibliography
    palm = next(r for r in tp.PUBLISHED_MFU if r.run == "PaLM 540B")
    assert (palm.chips, palm.mfu, palm.hfu) == (6144, 0.462, 0.578)  # Chowdhery et al., Table 3
    llama = [r.mfu for r in tp.PUBLISHED_MFU if r.run.startswith("Llama 3")]
    assert llama == [0.43, 0.41, 0.38]  # Dubey et al. 2024, Table 4: 38-43%


def test_megatrons_table_is_consistent_with_its_script_and_its_parameter_formula():
    rows = tp.MEGATRON_TABLE1
    assert len(rows) == 10 and tp.MEGATRON_SEQ == 2048 and tp.MEGATRON_VOCAB == 51_200
    for r in rows:
        assert r.gpus == r.tp * r.pp * r.dp
        assert r.batch % (r.dp * r.micro_batch) == 0 and r.layers % (r.pp * r.virtual_stages) == 0
        assert r.hidden % r.heads == 0 and r.ddp == ("torch" if r.pp == 1 else "local")
        # the paper's Eq. 2: P = 12 l h^2 (1 + 13 / (12 h) + (V + s) / (12 l h))
        h, L = r.hidden, r.layers
        params = 12 * L * h * h * (1 + 13 / (12 * h) + (51_200 + 2048) / (12 * L * h))
        assert round(params / 1e9, 1) == pytest.approx(r.params_b, abs=0.051), r.params_b
    assert [r.tflops_per_gpu for r in rows][-2:] == [163, 163]
    assert "run_table_1.sh" in tp.MEGATRON_TABLE1_SCRIPT and "Table 1" in tp.SOURCE_MEGATRON_TABLE1


def test_llama3_rows_are_16m_tokens_on_their_gpus():
    for r in tp.LLAMA3_405B_RUN:
        assert r.gpus == r.tp * r.cp * r.pp * r.dp
        assert r.batch * r.seq == 16 * 2**20
        assert r.mfu == pytest.approx(r.tflops_per_gpu / 989.4, abs=0.006)
    assert "Table 4" in tp.SOURCE_LLAMA3
