"""The kernel benchmark entry point: a smoke run writes a valid record whose rates follow from its timings."""

import json

import pytest
from test_kernels_common import needs_gpu

from mlsys import env, results
from mlsys.kernels import benchmark
from mlsys.kernels.elementwise import repeat_unary_bytes
from mlsys.kernels.softmax import softmax_bytes


@pytest.fixture(scope="module")
def smoke_record(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    path = benchmark.main(["--smoke", "--no-compile", "--out", str(out)])
    assert path.parent.parent == out
    return json.loads(path.read_text())


def test_smoke_record_is_valid_and_complete(smoke_record):
    results.validate_record(smoke_record, experiment=benchmark.EXPERIMENT)
    prov = smoke_record["provenance"]
    assert prov["command"].startswith("python -m mlsys.kernels.benchmark --smoke --no-compile --out ")
    assert prov["triton_interpreted"] == env.triton_interpreted()
    seen = {(r["kernel"], r["impl"]) for r in smoke_record["results"]}
    assert seen == {
        ("copy", "torch"),
        ("repeat_unary_fma", "triton"),
        ("cos_cos", "triton"),
        ("cos_cos", "eager"),
        ("softmax", "triton"),
        ("softmax", "torch"),
        ("softmax", "naive"),
        ("rmsnorm", "triton"),
        ("rmsnorm", "eager"),
    }
    ks = [r["k"] for r in smoke_record["results"] if r["kernel"] == "repeat_unary_fma"]
    assert ks == benchmark.SMOKE["ks"]
    shapes = {tuple(r["shape"]) for r in smoke_record["results"] if r["kernel"] == "softmax"}
    assert shapes == {(benchmark.SMOKE["numel"] // c, c) for c in benchmark.SMOKE["sizes"]}


def test_rates_follow_from_the_cost_models_and_timings(smoke_record):
    rows = smoke_record["results"]
    copy = rows[0]
    assert copy["kernel"] == "copy" and copy["model_bytes"] == 2 * 4 * benchmark.SMOKE["copy_numel"]
    for r in rows:
        assert r["p20_s"] <= r["median_s"] <= r["p80_s"]
        assert len(r["samples_s"]) == benchmark.SMOKE["repeats"]
        assert r["bytes_per_s"] == pytest.approx(r["model_bytes"] / r["median_s"], rel=1e-12)
        if r is not copy:
            assert r["fraction_of_copy_bandwidth"] == pytest.approx(r["bytes_per_s"] / copy["bytes_per_s"])
        if r["kernel"] == "softmax":
            assert r["model_bytes"] == softmax_bytes(tuple(r["shape"]), r["dtype"])
        if r["kernel"] == "repeat_unary_fma":
            assert r["model_bytes"] == repeat_unary_bytes(r["shape"][0], r["dtype"])
            assert r["model_flops"] == 2 * r["k"] * r["shape"][0]


def test_table_lists_every_row(smoke_record):
    text = benchmark.table(smoke_record["results"])
    assert len(text.splitlines()) == 1 + len(smoke_record["results"])


@pytest.mark.skipif(env.device() == "cuda", reason="on a GPU, writing under results/ is allowed")
def test_refuses_to_write_results_without_a_gpu():
    with pytest.raises(SystemExit, match="refusing to write under results/ without a CUDA device"):
        benchmark.main(["--no-compile"])
    with pytest.raises(SystemExit, match="pass --smoke"):
        benchmark.main(["--out", "/nonexistent"])


def test_smoke_sizes_never_land_in_results(monkeypatch):
    monkeypatch.setattr(env, "device", lambda: "cuda")  # even on a GPU
    with pytest.raises(SystemExit, match="--smoke sizes are not recorded under results/"):
        benchmark.main(["--smoke"])


def test_bad_sizes_are_refused():
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--smoke", "--sizes", "0"])


@pytest.mark.gpu
@needs_gpu
def test_gpu_smoke_with_compile(tmp_path):
    path = benchmark.main(["--smoke", "--out", str(tmp_path), "--dtypes", "fp32", "bf16"])
    record = json.loads(path.read_text())
    results.validate_record(record, experiment=benchmark.EXPERIMENT)
    impls = {r["impl"] for r in record["results"] if r["kernel"] == "softmax"}
    assert impls == {"triton", "torch", "naive", "compiled"}


def test_module_specs_match_what_is_measured():
    from mlsys.kernels import rmsnorm, softmax

    for module in (softmax, rmsnorm):
        spec = module.BENCHMARKS[0]
        assert set(benchmark.IMPLEMENTATIONS[spec["name"]]) == {"triton", *spec["against"]}
        assert spec["n_cols"] == benchmark.FULL["sizes"] and spec["dtype"] == benchmark.FULL["dtypes"]
