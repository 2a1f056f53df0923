"""mlsys.accounting.planner: every mesh is valid, the ranking follows the predictions, the
predictions are the accounting's, and impossible meshes are clear errors. (`python -m mlsys
plan`: tests/test_main.py.)"""

from dataclasses import replace

import pytest

from mlsys import hardware, plotting, tables
from mlsys.accounting import parallel, planner
from mlsys.accounting.flops import training_flops_per_token
from mlsys.models.config import TransformerConfig

SMALL = TransformerConfig.preset("small")  # 12 heads, d_ff 3,072
H100 = hardware.get_cluster("dgx-h100")
KW = {"n_devices": 16, "batch": 64, "seq": 1024}


@pytest.fixture(scope="module")
def plans():
    return planner.plan(SMALL, "dgx-h100", **KW)


def test_every_plan_is_a_valid_mesh_ranked_by_step_time(plans):
    assert len(plans) == len({p.dims for p in plans}) > 10
    for p in plans:
        assert p.dims.world_size == 16 and p.dims.tp <= H100.per_node
        parallel.check_model(SMALL, p.dims, batch=64, seq=1024, microbatches=p.microbatches)
    fitting = [p.step_s for p in plans if p.fits]
    assert fitting == sorted(fitting) and plans[0].fits
    assert all(not p.fits for p in plans[len(fitting):])


def test_a_plan_is_the_accountings_prediction(plans):
    for p in plans:
        flops = training_flops_per_token(SMALL, 1024) * 64 * 1024
        peak = H100.accelerator.peak_flop_per_s("bf16")
        assert p.compute_s == pytest.approx(flops / (16 * peak))
        assert p.bubble_s == pytest.approx(p.compute_s * (p.dims.pp - 1) / p.microbatches)
        assert p.mfu == pytest.approx(flops / (p.step_s * 16 * peak))
        assert p.mfu <= 1.0
        if p.dims.tp == 1:
            assert p.exposed_s["tp"] == 0
        memory = parallel.device_memory(SMALL, p.dims,
                                        micro_batch=64 // p.dims.dp // p.microbatches, seq=1024,
                                        microbatches=p.microbatches,
                                        sequence_parallel=p.dims.tp > 1)
        r = p.dims.dp_replicate  # ZeRO-1: the copies shard the fp32 master and the moments
        assert p.zero1 == (r > 1)
        assert p.memory == replace(memory, master=memory.master / r,
                                   optimizer=memory.optimizer / r)
        plain = planner.evaluate(SMALL, H100, p.dims, batch=64, seq=1024,
                                 microbatches=p.microbatches)
        assert plain.memory == memory
        if p.microbatches == 1:  # the same bytes on the wire; more micro-batches: ZeRO-1 once
            assert plain.step_s == p.step_s


def test_fixed_axes_and_micro_batches_are_held():
    held = planner.plan(SMALL, H100, fixed={"tp": 4, "pp": 2}, microbatches=4, **KW)
    assert {(p.dims.tp, p.dims.pp, p.microbatches) for p in held} == {(4, 2, 4)}
    lower = planner.plan(SMALL, H100, efficiency=0.5, fixed={"dp_shard": 16}, **KW)[0]
    assert lower.mfu <= 0.5


def test_a_model_too_big_for_the_devices_does_not_fit():
    # the CS336 XXL
    (alone,) = planner.plan(parallel.XXL, "tpu-v5p", n_devices=1, batch=1, seq=1024)
    assert not alone.fits and alone.memory.total > 3.5e12
    assert "NO" in tables.plan_table([alone])[1]
    pod = planner.plan(parallel.XXL, "tpu-v5p", n_devices=64, batch=64, seq=1024, fixed={"tp": 4})
    assert pod[0].fits and pod[0].dims.fsdp * pod[0].dims.pp >= 16


@pytest.mark.parametrize(("kw", "message"), [
    ({"fixed": {"tp": 3}}, r"tp \(3\) does not divide the devices \(16\)"),
    ({"fixed": {"tp": 16}}, r"tp \(16\) must be <= 8, the accelerators per node"),
    ({"fixed": {"tp": 8, "pp": 4}}, r"= 32 != world_size \(16\)"),
    ({"fixed": {"pp": 16}}, r"no mesh of 16 devices is valid .* pp \(16\) must be <= n_layers"),
    ({"seq": 2048}, r"seq \(2048\) must be <= context_length \(1024\)"),
    ({"fixed": {"ep": 2}}, "axis='ep' is not one of"),
])
def test_impossible_meshes_are_clear_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        planner.plan(SMALL, "dgx-h100", **{**KW, **kw})


def test_every_plan_says_what_it_would_cost_with_no_overlap(plans):
    for p in plans:
        assert set(p.communication_s) == set(p.exposed_s)
        assert all(p.communication_s[k] >= p.exposed_s[k] - 1e-15 for k in p.exposed_s)
        assert p.serial_step_s == pytest.approx(p.compute_s + p.bubble_s
                                                + sum(p.communication_s.values()))
        assert p.serial_step_s >= p.step_s
    fsdp = next(p for p in plans if p.dims.dp_shard == 16)
    assert fsdp.communication_s["fsdp"] > 0 and fsdp.exposed_s["fsdp"] < \
        fsdp.communication_s["fsdp"]  # at 4,096 tokens per GPU FSDP hides behind compute


def test_ties_go_to_less_traffic_then_to_fewer_axes():
    """Every mesh that hides all its communication has the same step: the compute. The ranking
    then prefers the least communication before overlap, then the fewest axes."""
    cfg = TransformerConfig.preset("2.7B", context_length=4096)
    plans = planner.plan(cfg, H100, n_devices=64, batch=256, seq=4096, efficiency=0.5)
    tied = planner.ties(plans)
    assert len(tied) > 1 and tied[0] is plans[0]
    assert all(p.step_s == pytest.approx(plans[0].step_s, rel=1e-9) for p in tied)
    assert [(round(p.traffic_s, 9), p.n_axes) for p in tied] == sorted(
        (round(p.traffic_s, 9), p.n_axes) for p in tied)
    assert plans[len(tied)].step_s > plans[0].step_s * (1 + 1e-9)
    assert planner.ties([]) == [] and planner.ties(
        planner.plan(parallel.XXL, "tpu-v5p", n_devices=1, batch=1, seq=1024)) == []


def test_zero1_with_a_pipeline_beats_zero3_with_a_pipeline():
    """ZeRO-3 under a pipeline gathers the weights again for every micro-batch; the distributed
    optimizer (ZeRO-1, Megatron-LM's) sends its gradients' bytes once a step."""
    big = TransformerConfig(vocab_size=32_000, context_length=2048, d_model=4096, n_layers=32,
                            n_heads=32, d_ff=11_008)
    kw = {"n_devices": 16, "batch": 64, "seq": 2048, "microbatches": 16}
    zero3 = planner.plan(big, H100, fixed={"dp_shard": 2, "pp": 2, "tp": 4, "cp": 1}, **kw)[0]
    zero1 = planner.plan(big, H100, fixed={"dp_replicate": 2, "pp": 2, "tp": 4, "cp": 1}, **kw)[0]
    assert zero1.zero1 and not zero3.zero1
    assert zero3.communication_s["fsdp"] > 4 * zero1.communication_s["fsdp"]
    assert _rank_of(zero1) < _rank_of(zero3) or zero1.step_s < zero3.step_s
    assert tables.plan_text(zero1) == "dp 2 (ZeRO-1) tp 4 pp 2"
    assert planner.crossing_axes(zero1.dims, H100) == ("pp",)
    assert planner.crossing_axes(parallel.ParallelDims(dp_shard=16), H100) == ("dp_shard",)
    with pytest.raises(TypeError, match="zero1 must be True or False"):
        planner.evaluate(big, H100, zero1.dims, batch=64, seq=2048, zero1="yes")


def test_the_map_facts_read_the_first_choices():
    batches, seqs = (1, 64), (256, 1024)
    choices = planner.first_choices(SMALL, H100, n_devices=8, batches=batches, seqs=seqs)
    facts = planner.map_facts({**choices, (1, 2048): None, (64, 2048): None})
    assert facts["short"] == 256 and facts["long"] == 1024 and facts["none"] == 2048
    assert facts["dp_from"] == 64 and facts["cut_below"]  # one sequence: TP in the mesh
    assert facts["cp_from"] is None and not facts["cp_at_long"]
    with pytest.raises(ValueError, match="choices must map at least one"):
        planner.map_facts({})


def test_the_large_example_is_llama3_70b_sizes_without_gqa():
    cfg = TransformerConfig(**planner.LARGE_SIZES)
    assert cfg.d_model == 8192 and cfg.n_layers == 80 and cfg.d_ff == 28_672
    assert planner.LARGE_RUN == {"n_devices": 64, "batch": 512, "seq": 4096}


def _rank_of(p):
    return (round(p.step_s, 9), round(p.traffic_s, 9), p.n_axes)


def test_mesh_names():
    assert planner.family(parallel.ParallelDims(dp_shard=4, tp=2)) == "fsdp+tp"
    assert planner.family(parallel.ParallelDims(dp_replicate=2, dp_shard=4)) == "dp+fsdp"
    assert planner.family(parallel.ParallelDims(world_size=1)) == "one device"
    assert tables.mesh_text(parallel.ParallelDims(pp=2, cp=2, tp=2)) == "tp 2 pp 2 cp 2"


def test_the_decision_map_is_the_planners_first_choice():
    batches, seqs = (1, 64), (256, 1024)
    choices = planner.first_choices(SMALL, H100, n_devices=8, batches=batches, seqs=seqs)
    assert set(choices) == {(b, s) for b in batches for s in seqs}
    for (b, s), choice in choices.items():
        first = planner.plan(SMALL, H100, n_devices=8, batch=b, seq=s)[0]
        assert choice is not None and first.fits
        assert (choice.dims, choice.microbatches, choice.step_s) == (
            first.dims, first.microbatches, first.step_s)
    assert "tp" in planner.family(choices[(1, 1024)].dims)  # one sequence: cut the model
    assert planner.family(choices[(64, 1024)].dims) == "dp"  # 8 sequences per GPU: ZeRO-1
    assert choices[(64, 1024)].zero1
    nothing = planner.first_choices(parallel.XXL, "tpu-v5p", n_devices=1, batches=(1,),
                                    seqs=(1024,))
    assert nothing == {(1, 1024): None}  # a mesh, but it does not fit
    with pytest.raises(planner.NoValidMesh, match="n_heads"):
        planner.plan(SMALL, H100, n_devices=8, batch=1, seq=1024, fixed={"tp": 8})
    invalid = planner.first_choices(SMALL, H100, n_devices=8, batches=(1,), seqs=(1024,),
                                    fixed={"tp": 8})
    assert invalid == {(1, 1024): None}  # 12 heads do not split 8 ways
    ax = plotting.plot_first_choices({**choices, (64, 2048): None})
    texts = [t.get_text() for t in ax.texts]
    assert len(texts) == 5 and "nothing fits" in texts
    assert ax.get_xlabel() == "global batch (sequences)"
    with pytest.raises(ValueError, match=r"seq \(4096\) must be <= context_length"):
        planner.first_choices(SMALL, H100, n_devices=8, batches=(8,), seqs=(4096,))


def test_a_measured_cluster_is_what_the_planner_divides_by():
    cl = planner.measured_cluster("two CPU ranks", flop_per_s=5e10, dtype="fp32",
                                  link_bytes_per_s=2e9, per_node=2, memory_bytes=16e9)
    assert cl.accelerator.peak_flop_per_s("fp32") == 5e10
    assert cl.ring_link(2).bytes_per_s == 2e9 and cl.per_node == 2
    with pytest.raises(ValueError, match="no link between nodes"):
        cl.ring_link(4)
    laptop = TransformerConfig.preset("laptop")
    p = planner.evaluate(laptop, cl, parallel.ParallelDims(dp_shard=2), batch=8, seq=64,
                         recipe="fp32_adamw", dtype="fp32")
    flops = training_flops_per_token(laptop, 64) * 8 * 64
    assert p.compute_s == pytest.approx(flops / (2 * 5e10))
    for kw, message in (({"flop_per_s": 0}, "flop_per_s must be > 0"),
                        ({"link_bytes_per_s": -1}, "link_bytes_per_s must be > 0"),
                        ({"per_node": 0}, "per_node must be")):
        args = {"flop_per_s": 5e10, "dtype": "fp32", "link_bytes_per_s": 2e9, "per_node": 2,
                "memory_bytes": 16e9, **kw}
        with pytest.raises(ValueError, match=message):
            planner.measured_cluster("x", **args)


# --- the calibrated step model and the new knobs --------------------------------------------------

LLAMA_LIKE = TransformerConfig(vocab_size=32_000, context_length=4096, d_model=4096, n_layers=32,
                               n_heads=32, n_kv_heads=8, d_ff=14_336)


@pytest.fixture(scope="module")
def calibrated():
    return planner.plan(LLAMA_LIKE, H100, n_devices=16, batch=64, seq=4096, model="calibrated")


def test_a_calibrated_plan_is_the_step_models_prediction(calibrated):
    from mlsys.accounting import step_model

    assert calibrated[0].fits and calibrated[0].model == "calibrated"
    for p in calibrated[:5]:
        b = step_model.step_time(LLAMA_LIKE, H100, p.dims, batch=64, seq=4096,
                                 micro_batch=p.micro_batch, virtual_stages=p.virtual_stages,
                                 recompute=p.recompute, sequence_parallel=p.sequence_parallel,
                                 zero=p.zero, ep=p.ep)
        assert p.step_s == pytest.approx(b.step_s)
        assert p.mfu == pytest.approx(b.mfu) and p.hfu >= p.mfu
        assert p.tokens_per_s == pytest.approx(64 * 4096 / p.step_s)
        assert p.model_tflops_per_device == pytest.approx(b.model_flops / p.step_s / 16 / 1e12)
        memory = parallel.device_memory(LLAMA_LIKE, p.dims, micro_batch=p.micro_batch, seq=4096,
                                        microbatches=p.microbatches,
                                        sequence_parallel=p.sequence_parallel,
                                        recompute=p.recompute,
                                        virtual_stages=p.virtual_stages, zero=p.zero, ep=p.ep)
        assert p.memory_bytes_per_device == memory.total


def test_as_json_has_the_mesh_and_the_predictions(calibrated):
    j = calibrated[0].as_json()
    assert set(j["mesh"]) == {"dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "v"}
    for key in ("step_s", "tokens_per_s", "model_tflops_per_device",
                "hardware_tflops_per_device", "mfu", "hfu", "memory_bytes_per_device", "fits"):
        assert key in j
    b = j["breakdown"]
    assert b["compute_s"] + b["bubble_s"] + b["optimizer_s"] + sum(b["exposed_s"].values()) \
        == pytest.approx(j["step_s"])
    import json

    assert json.loads(json.dumps(j)) == j


def test_held_knobs_are_held():
    plans = planner.plan(LLAMA_LIKE, H100, n_devices=16, batch=64, seq=4096, model="calibrated",
                         fixed={"pp": 2, "tp": 4}, micro_batch=2, virtual_stages=2,
                         recompute="full", zero=1, sequence_parallel=False)
    assert {(p.micro_batch, p.virtual_stages, p.recompute, p.zero, p.sequence_parallel)
            for p in plans} == {(2, 2, "full", 1, False)}
    assert all(p.recompute_s > 0 for p in plans)


def test_first_order_counts_recomputation_and_interleaving():
    dims = parallel.ParallelDims(dp_shard=4, pp=4)
    kw = {"batch": 64, "seq": 1024, "microbatches": 4}
    base = planner.evaluate(SMALL, H100, dims, **kw)
    full = planner.evaluate(SMALL, H100, dims, recompute="full", **kw)
    inter = planner.evaluate(SMALL, H100, dims, virtual_stages=3, **kw)
    assert base.recompute_s == 0 and base.hfu == pytest.approx(base.mfu)
    assert full.compute_s == pytest.approx(base.compute_s + full.recompute_s)
    assert full.memory.activations < base.memory.activations
    assert inter.bubble_s == pytest.approx(base.bubble_s / 3)


@pytest.mark.parametrize(("kw", "message"), [
    ({"model": "exact"}, "model"),
    ({"zero": 3}, "zero must be 0, 1 or 2"),
    ({"recompute": "most"}, "recompute"),
    ({"micro_batch": 0}, "micro_batch"),
])
def test_bad_knobs_are_clear_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        planner.plan(SMALL, "dgx-h100", **{**KW, **kw})


def test_the_calibrated_model_needs_a_transformer():
    with pytest.raises(ValueError, match="calibrated"):
        planner.plan(parallel.XXL, "tpu-v5p", n_devices=64, batch=64, seq=1024,
                     model="calibrated", fixed={"tp": 4})


def test_every_axis_held_gives_that_one_mesh():
    """All five degrees given: the search has nothing left to choose (it once recursed forever)."""
    cfg = TransformerConfig.preset("2.7B")
    held = dict(dp_replicate=2, dp_shard=2, tp=2, pp=2, cp=1)
    plans = planner.plan(cfg, "dgx-h100", n_devices=16, batch=64, seq=1024, fixed=held)
    assert [{a: getattr(p.dims, a) for a in held} for p in plans] == [held]
