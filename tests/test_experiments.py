"""The experiments entry point and the ch03/ch04 experiments: the preflight, records, reading
functions.

`python -m mlsys.experiments --check` runs once for the module (every kernel against its reference,
every experiment at smoke sizes, nothing written); the tests read the records it built as a chapter
reads a recorded GPU run.
"""

import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys

import pytest

from mlsys import bench, env, experiments, results
from mlsys.accounting import bytes as B
from mlsys.accounting import flops
from mlsys.experiments import __main__ as cli
from mlsys.experiments import elementwise_fusion, op_overhead, preflight, roofline_ops, train_step
from mlsys.kernels._triton import HAS_TRITON

MINE = ("roofline_ops", "elementwise_fusion", "op_overhead", "train_step", "fused_kernels")


def _files(root):
    return {p for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def checked():
    """`--check` run once, as on a GPU machine before the real run: its rows, what it printed, and
    the files it left under results/."""
    before = _files(results.RESULTS_DIR)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rows = cli.main(["--check"])
    return {"rows": rows, "printed": printed.getvalue(),
            "new_files": _files(results.RESULTS_DIR) - before}


@pytest.fixture(scope="module")
def records(checked):
    """Every experiment's smoke record, built (not written) by `--check`, as JSON gives it back."""
    return {r["check"]: json.loads(json.dumps(r["record"]))
            for r in checked["rows"] if r["kind"] == "experiment"}


# --- the preflight, --check -----------------------------------------------------------------------


def test_check_runs_every_kernel_and_experiment_and_all_pass(checked):
    rows = checked["rows"]
    assert all(set(r) >= {"check", "kind", "ok", "seconds", "error"} for r in rows)
    assert [r["check"] for r in rows if r["kind"] == "experiment"] == list(experiments.NAMES)
    dtypes = ("bfloat16" if env.device() == "cuda" else "float16", "float32")
    kernels = [f"{op} {d}" for op in ("softmax", "rmsnorm", "repeat_unary fma", "repeat_unary cos",
                                      "flash_attention causal", "flash_attention full")
               for d in dtypes]
    assert [r["check"] for r in rows if r["kind"] == "kernel"] == kernels
    for r in rows:
        if r["kind"] == "kernel" and not HAS_TRITON:  # macOS, Windows: kernels cannot run
            assert not r["ok"] and "Triton is not installed" in r["error"]
        else:
            assert r["ok"] and r["error"] == "", r
        assert r["seconds"] >= 0
    assert cli.exit_status(rows) == int(not HAS_TRITON)


def test_check_prints_a_line_per_check_and_a_count(checked):
    lines = checked["printed"].splitlines()
    assert lines[0] == preflight.HEADER
    assert lines[1:-1] == [preflight.row_line(r) for r in checked["rows"]]
    passed = sum(r["ok"] for r in checked["rows"])
    assert lines[-1].startswith(f"{passed} of {len(checked['rows'])} checks passed, "
                                f"{len(checked['rows']) - passed} failed (")


def test_check_writes_nothing_under_results(checked):
    assert checked["new_files"] == set()


def test_a_failing_check_is_a_row_and_the_others_still_run(monkeypatch):
    """A kernel that computes wrongly, one that raises, an experiment that raises: each is a FAIL
    row with a one-line error, and every other check still runs and passes."""
    from mlsys.experiments import dot_accumulation
    from mlsys.kernels import rmsnorm, softmax

    def boom(*args, **kwargs):
        raise RuntimeError("out of memory\n" + "details " * 50)

    monkeypatch.setattr(softmax, "softmax", lambda x: x * 1.0)
    monkeypatch.setattr(rmsnorm, "rmsnorm", boom)
    monkeypatch.setattr(dot_accumulation, "EXPERIMENT",
                        dataclasses.replace(dot_accumulation.EXPERIMENT, run=boom))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rows = cli.main(["--check", "dot_accumulation", "autocast_dtypes"])
    failed = {r["check"]: r["error"] for r in rows if not r["ok"]}
    assert set(failed) == {"softmax float16", "softmax float32", "rmsnorm float16",
                           "rmsnorm float32", "dot_accumulation"} or not HAS_TRITON
    assert failed["softmax float32"].startswith(
        "AssertionError: softmax y differs from float64: Tensor-likes are not close!")
    assert failed["dot_accumulation"] == "RuntimeError: out of memory"
    assert [r["check"] for r in rows if r["kind"] == "experiment"] == ["dot_accumulation",
                                                                        "autocast_dtypes"]
    assert rows[-1]["ok"] and rows[-2]["record"] is None
    assert all(len(e) <= preflight.ERROR_CHARS and "\n" not in e for e in failed.values())
    assert cli.exit_status(rows) == 1
    assert "FAIL" in printed.getvalue() and f"{len(failed)} failed" in printed.getvalue()


def test_error_line_is_one_short_line():
    assert preflight.error_line(ValueError("x is wrong\nmore")) == "ValueError: x is wrong"
    assert preflight.error_line(KeyError()) == "KeyError"
    long = preflight.error_line(RuntimeError("y" * 500))
    assert len(long) == preflight.ERROR_CHARS and long.endswith("...")


@pytest.mark.skipif(env.device() == "cuda", reason="compiled Triton runs on this GPU")
def test_the_check_exits_with_status_1_when_a_check_fails():
    """Triton in compiled mode on a machine without a GPU: every kernel check fails."""
    done = subprocess.run([sys.executable, "-m", "mlsys.experiments", "--check", "autocast_dtypes"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRITON_INTERPRET": "0"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "softmax float32                  kernel     FAIL" in done.stdout
    assert "autocast_dtypes                  experiment pass" in done.stdout
    assert " 12 failed (" in done.stdout.splitlines()[-1]


def test_check_takes_no_out_or_force(capsys):
    for extra in (["--out", "somewhere"], ["--force"]):
        with pytest.raises(SystemExit):
            cli.main(["--check", *extra])
        assert "--check writes no record: --out and --force do not apply" in \
            capsys.readouterr().err


def test_every_experiment_is_registered_with_sizes_for_every_profile():
    for name in experiments.NAMES:
        e = experiments.get(name)
        assert e.name == name and set(e.sizes) == {"smoke", "cpu", "gpu"}
        assert 0 < e.gpu_seconds <= experiments.CHUNK_S, name  # each fits in one chunk
    with pytest.raises(ValueError, match="name='nope' is not one of"):
        experiments.get("nope")


def test_the_gpu_run_comes_in_chunks_of_at_most_8_minutes():
    groups = experiments.chunks()
    assert [n for g in groups for n in g] == list(experiments.NAMES)
    for group in groups:  # one `--chunk` per device call (10 minutes at most)
        assert sum(experiments.get(n).gpu_seconds for n in group) <= experiments.CHUNK_S
    assert all(experiments.get(n).gpu_seconds <= experiments.CHUNK_S for n in experiments.NAMES)


def test_smoke_records_are_valid_and_say_what_produced_them(records):
    for name, record in records.items():
        results.validate_record(record, experiment=name)
        prov = record["provenance"]
        assert prov["profile"] == "smoke"
        assert (prov["device"], prov["device_type"]) == (env.device_name(), env.device())
        assert prov["command"] == "python -m mlsys.experiments --check"
        sizes = dataclasses.asdict(experiments.get(name).sizes_for("smoke"))
        assert prov["sizes"] == json.loads(json.dumps(sizes))
        with pytest.raises(ValueError, match="holds only full-size GPU records"):
            results.validate_gpu_record(record, experiment=name)


def test_the_command_line_refuses_what_cannot_be_trusted(capsys):
    with pytest.raises(SystemExit):
        cli.main(["nope"])
    assert "unknown experiment 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main([])
    assert "name at least one experiment" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--chunk", "99"])
    assert "--chunk must be between 1" in capsys.readouterr().err
    if experiments.env.device() != "cuda":
        with pytest.raises(SystemExit):
            cli.main(["roofline_ops"])
        assert "GPU sizes need a CUDA GPU" in capsys.readouterr().err


def test_list_names_every_experiment_and_its_chunk():
    done = subprocess.run([sys.executable, "-m", "mlsys.experiments", "--list"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for name in experiments.NAMES:
        assert name in done.stdout
    assert "chunk 1" in done.stdout


def test_write_and_read_back(tmp_path, records):
    record = records["train_step"]
    path = experiments.write(record, tmp_path)
    device_dir = tmp_path / results.device_slug(record["provenance"]["device"])
    assert path == device_dir / "train_step.json"
    assert json.loads(path.read_text()) == record


def _gpu(record):
    """`record` as if measured at GPU sizes on an H100."""
    provenance = {**record["provenance"], "device": "NVIDIA H100 80GB HBM3",
                  "device_type": "cuda", "profile": "gpu"}
    return {**record, "provenance": provenance}


def test_only_gpu_records_go_under_results_and_are_read_back(tmp_path, monkeypatch, records):
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path / "results")
    smoke = records["train_step"]
    for out in (None, tmp_path / "results", tmp_path / "results" / "sub" / ".."):
        with pytest.raises(ValueError, match="profile='smoke' .* pass --out DIR"):
            experiments.write(smoke, out)
    cpu = {**smoke, "provenance": {**smoke["provenance"], "profile": "cpu"}}
    with pytest.raises(ValueError, match="profile='cpu' on"):
        experiments.write(cpu)
    assert not (tmp_path / "results").exists()  # refused before anything was written
    assert experiments.recorded("train_step") == []
    path = experiments.write(_gpu(smoke))
    assert path == tmp_path / "results" / "nvidia-h100-80gb-hbm3" / "train_step.json"
    # a smoke record put there by hand is not shown as a GPU measurement
    by_hand = tmp_path / "results" / "cpu" / "train_step.json"
    by_hand.parent.mkdir()
    by_hand.write_text(json.dumps(smoke))
    assert experiments.recorded("train_step") == [_gpu(smoke)]


def test_the_command_line_refuses_a_smoke_record_under_results(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(experiments, "run_record", lambda *a: pytest.fail("ran an experiment"))
    with pytest.raises(SystemExit):
        cli.main(["--smoke", "train_step", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert f"profile='smoke' on '{env.device_name()}'" in err and "pass --out DIR" in err
    assert _files(tmp_path) == set()


def test_an_existing_record_is_replaced_only_with_force(tmp_path, capsys):
    names = ["dot_accumulation", "autocast_dtypes"]
    old = experiments.record_path("autocast_dtypes", env.device_name(), tmp_path)
    old.parent.mkdir(parents=True)
    old.write_text("{}")
    with pytest.raises(SystemExit):  # refused before the first experiment runs
        cli.main(["--smoke", *names, "--out", str(tmp_path)])
    assert f"{old} exists; pass --force to overwrite it" in capsys.readouterr().err
    assert _files(tmp_path) == {old} and old.read_text() == "{}"
    paths = cli.main(["--smoke", *names, "--out", str(tmp_path), "--force"])
    assert paths == [experiments.record_path(n, env.device_name(), tmp_path) for n in names]
    for path in paths:
        record = json.loads(path.read_text())
        results.validate_record(record, experiment=path.stem)
        assert record["provenance"]["command"] == (
            f"python -m mlsys.experiments --smoke {' '.join(names)} --out {tmp_path} --force")
    with pytest.raises(FileExistsError, match="pass --force"):
        experiments.write(json.loads(paths[0].read_text()), tmp_path)


# --- roofline_ops ---------------------------------------------------------------------------------


def test_roofline_ops_rows_carry_the_accounting(records):
    rows = records["roofline_ops"]["results"]
    s = roofline_ops.SIZES["smoke"]
    ops = {r["name"]: r for r in rows if r["kind"] == "op"}
    xy = ops["x + y"]
    assert (xy["read_bytes"], xy["write_bytes"]) == (2 * 4 * s.numel, 4 * s.numel)
    n = s.matmul_sizes[0]
    assert ops[f"matmul {n}"]["flops"] == flops.matmul_flops(n, n, n)
    batch, heads, seq, d = s.attention
    naive = ops[f"naive attention, seq {seq}"]
    traffic = B.naive_attention_traffic(batch, heads, seq, d, "fp32")
    assert naive["read_bytes"] + naive["write_bytes"] == traffic.total_bytes
    assert {r["name"] for r in rows if r["kind"] == "allocation"} == {
        "fresh output", "existing output", "fresh output, freed memory kept"}
    table = roofline_ops.table(rows)
    assert len(table.rows) == len(ops)


def _synthetic_roofline_rows(op_seconds, problems=()):
    """Rows as `roofline_ops.run` writes them: a 10 GB/s copy, a 100 GFLOP/s matmul, and the ops."""
    def timing(seconds):
        return {"median_s": seconds, "p20_s": seconds, "p80_s": seconds, "samples_s": [seconds] * 4}

    rows = [{"kind": "probe", "name": "copy", "unit": "bytes", "work": 1e10, **timing(1.0)},
            {"kind": "probe", "name": "matmul", "unit": "flop", "work": 1e11, **timing(1.0)}]
    ops = {"x * 2": ("elementwise", 1e9, 1e10), "softmax": ("row-wise", 5e9, 1e10),
           "matmul 64": ("matmul", 1e10, 1e7), "naive attention, seq 8": ("attention", 1e9, 1e9),
           "SDPA (fused attention), seq 8": ("attention", 1e9, 1e7)}
    for name, (group, f, n_bytes) in ops.items():
        rows.append({"kind": "op", "name": name, "group": group, "flops": f, "read_bytes": n_bytes,
                     "write_bytes": 0, **timing(op_seconds[name])})
    rows.append({"kind": "consistency", "problems": list(problems), "attempts": 1, "dtype": "fp32"})
    return rows


def test_roofline_verdicts_follow_the_numbers():
    seconds = {"x * 2": 1.1, "softmax": 3.0, "matmul 64": 0.12, "naive attention, seq 8": 0.2,
               "SDPA (fused attention), seq 8": 0.05}
    v = roofline_ops.verdicts(_synthetic_roofline_rows(seconds))
    assert "x * 2 is at the memory roof (1.10x the predicted time)" in v["memory"]
    assert "softmax is 3.0x slower than the memory roof predicts" in v["memory"]
    assert ("matmul 64 reaches 83 GFLOP/s, at the compute roof (1.20x the predicted time)"
            == v["matmul"])
    assert v["attention"].startswith("SDPA is 4.00x faster than naive attention "
                                     "while moving 100x fewer bytes")
    problems = ["x * 2 ran 2.00x faster than ..."]
    withheld = roofline_ops.verdicts(_synthetic_roofline_rows(seconds, problems))
    assert all(text.startswith("no verdict") for text in withheld.values())


# --- elementwise_fusion, op_overhead, train_step --------------------------------------------------


def test_fusion_rows_and_verdicts(records):
    rows = records["elementwise_fusion"]["results"]
    s = elementwise_fusion.SIZES["smoke"]
    eager = elementwise_fusion.sweep(rows, "eager")
    assert [r["k"] for r in eager] == list(s.ks)
    for r in eager:  # k round trips of the tensor, 2k FLOPs per element
        assert r["bytes"] == r["k"] * 2 * 4 * s.numel and r["flops"] == 2 * r["k"] * s.numel
    if not s.fuse:  # the smoke profile times no fused version, and says so
        assert elementwise_fusion.ceilings(rows) is None
        text = elementwise_fusion.sweep_verdict(rows)
        assert text.startswith("no verdict") or "no fused version was timed" in text
        assert text.startswith("no verdict") or "the eager chain's time grew" in text
    assert "eager pair" in elementwise_fusion.cos_verdict(rows)


def test_cos_verdict_explains_a_fused_kernel_slower_than_eager():
    def row(name, impl, seconds):
        return {"kind": "cos", "name": name, "impl": impl, "numel": 1000, "median_s": seconds,
                "p20_s": seconds, "p80_s": seconds, "samples_s": [seconds] * 4}

    base = [{"kind": "probe", "name": "copy", "unit": "bytes", "work": 1e6, "median_s": 1e-4,
             "p20_s": 1e-4, "p80_s": 1e-4, "samples_s": [1e-4] * 4},
            {"kind": "consistency", "problems": [], "attempts": 1, "fused_impl": "torch.compile"}]
    slower = base + [row("eager x.cos().cos() (2 ops)", "eager", 1.0),
                     row("compiled", "fused", 1.0 / 0.88)]
    assert "compiled is 1.14x slower than the eager pair: the fused kernel is slower" in \
        elementwise_fusion.cos_verdict(slower)
    twice = base + [row("eager x.cos().cos() (2 ops)", "eager", 1.0), row("compiled", "fused", 0.5)]
    assert "close to the byte ratio of 2" in elementwise_fusion.cos_verdict(twice)


def test_overhead_model_and_verdicts(records):
    rows = records["op_overhead"]["results"]
    s = op_overhead.SIZES["smoke"]
    assert set(op_overhead.doubling(rows)) == set(s.sizes)
    m = op_overhead.model(rows)
    assert m.overhead_s > 0 and m.flat_n == pytest.approx(m.overhead_s * m.bytes_per_s / 8)
    text = op_overhead.verdicts(rows)["doubling"]
    assert text.startswith("no verdict") or f"{m.overhead_s * 1e6:.2f} µs" in text
    assert len(op_overhead.remedy_table(rows).rows) == 4


def test_train_step_mfu_follows_from_the_rows(records):
    rows = records["train_step"]["results"]
    s = train_step.SIZES["smoke"]
    steps = train_step.steps(rows)
    assert [r["seq"] for r in steps] == list(s.seqs)
    ceiling = train_step.ceiling(rows)
    for r in steps:
        forward = flops.transformer_flops(s.config, s.batch, r["seq"]).forward_matmul_flops
        assert r["flops"] == 3 * forward
        mfu = r["flops"] / r["median_s"] / ceiling
        assert train_step.mfus(rows)[r["seq"]] == pytest.approx(mfu)
    text = train_step.mfu_verdict(rows)
    assert text.startswith("no verdict") or "of the matmul ceiling" in text


def test_fused_kernels_rows_use_the_cost_models(records):
    from mlsys.kernels.softmax import softmax_bytes

    rows = records["fused_kernels"]["results"]
    for r in rows:
        assert r["p20_s"] <= r["median_s"] <= r["p80_s"]
        assert r["bytes_per_s"] == pytest.approx(r["model_bytes"] / r["median_s"])
        if r["kernel"] == "softmax":
            assert r["model_bytes"] == softmax_bytes(tuple(r["shape"]), r["dtype"])
    assert {r["kernel"] for r in rows} == {"repeat_unary_fma", "cos_cos", "softmax", "rmsnorm"}


def test_timings_round_trip_through_rows():
    t = bench.Timing((3.0, 1.0, 2.0, 5.0), 0, "cpu")
    again = experiments.timing_of(experiments.timing_fields(t))
    assert again.samples_s == t.samples_s and again.median_s == t.median_s
    assert again.drift == t.drift


def test_missing_lists_what_has_no_record_for_the_device(tmp_path):
    assert experiments.missing("NVIDIA H200", tmp_path) == list(experiments.NAMES)
    done = experiments.record_path("train_step", "NVIDIA H200", tmp_path)
    done.parent.mkdir(parents=True)
    done.write_text("{}")
    left = experiments.missing("NVIDIA H200", tmp_path)
    assert "train_step" not in left and len(left) == len(experiments.NAMES) - 1
    assert experiments.missing("NVIDIA H100 80GB HBM3", tmp_path) == list(experiments.NAMES)
