"""The experiments package (`mlsys.experiments`): the registry and its chunks, records written and
read back (only full-size GPU records under results/), timings as rows, and the pages' recorded
results (`show_recorded`). The smoke records are those `--check` builds (tests/experiment_cases.py),
read as a chapter reads a recorded GPU run."""

import dataclasses
import importlib
import json

import experiment_cases
import pytest

from mlsys import bench, env, experiments, results
from mlsys.book import Table
from mlsys.experiments import amp_speed

CH07 = ("amp_speed", "autocast_overhead", "amp_memory", "autocast_dtypes")
"""The chapter 07 experiments."""


@pytest.fixture(scope="module")
def records():
    """Every experiment's smoke record, built (not written) by `--check` once per session."""
    return experiment_cases.smoke_records()


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


def test_each_belongs_to_the_chapter_with_a_gpu_budget():
    for name in CH07:
        e = importlib.import_module(f"mlsys.experiments.{name}").EXPERIMENT
        assert e.chapter == "07_mixed_precision" and set(e.sizes) == {"smoke", "cpu", "gpu"}
        assert 0 < e.gpu_seconds <= experiments.CHUNK_S
    assert amp_speed.EXPERIMENT.sizes["gpu"].presets[-1] == "2.7B"


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


# --- the recorded GPU results on a page -----------------------------------------------------------


def test_show_recorded_says_what_a_gpu_run_would_show_without_a_record(capsys, monkeypatch):
    monkeypatch.setattr(results, "load_records", lambda name: [])
    assert experiments.show_recorded("train_step", would_show="It adds the spec's MFU.") is None
    printed = capsys.readouterr().out
    assert printed == experiments.no_record_text("train_step") + " It adds the spec's MFU.\n"


def test_show_recorded_shows_every_record_through_the_module(capsys, monkeypatch):
    record = {"experiment": "timing_pitfalls",
              "provenance": {"device": "NVIDIA H200", "torch_version": "2.13", "date": "2026-01-02",
                             "triton_version": "3.7", "cuda_version": "13.0",
                             "git_commit": "abc", "command": "python -m mlsys.experiments"},
              "results": [{"kind": "setup", "device": "cuda"}]}
    monkeypatch.setattr(results, "load_records", lambda name: [record, record])
    seen = []

    def show(r):
        seen.append(r)
        return ["a sentence", Table(["a"], [["b"]])]

    experiments.show_recorded("timing_pitfalls", tables=[lambda rows: len(rows)], show=show)
    assert seen == [record, record]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "timing_pitfalls: 2 record(s)"
    assert lines[1:7] == [*experiments.provenance_line(record).splitlines(), "1", "a sentence",
                          "a", "b"]
    assert len(lines) == 13


def test_show_records_shows_what_exists_and_names_what_is_missing(monkeypatch):
    shown = []
    monkeypatch.setattr(experiments, "recorded", lambda name: [] if name == "compile_step"
                        else [{"results": []}])
    monkeypatch.setattr(experiments, "show_recorded",
                        lambda name, **kwargs: shown.append((name, kwargs)))
    draw = lambda record: None  # noqa: E731 (a stand-in for a page's drawing)
    sentence = experiments.show_records(["step_profile", "compile_step", "step_memory"],
                                        shows={"step_profile": draw})
    assert [name for name, _ in shown] == ["step_profile", "step_memory"]
    assert dict(shown)["step_profile"] == {"tables": None, "show": draw}
    assert sentence == ("Not recorded yet: compile_step (`python -m mlsys.experiments "
                        "compile_step` on a CUDA GPU records it).")
    monkeypatch.setattr(experiments, "recorded", lambda name: [])
    assert experiments.show_records(["ddp_step", "allreduce_bench"]).endswith(
        "ddp_step allreduce_bench` on a CUDA GPU records them).")
    monkeypatch.setattr(experiments, "recorded", lambda name: [{"results": []}])
    assert experiments.show_records(["ddp_step"]) == ""
    with pytest.raises(ValueError, match="names"):
        experiments.show_records(["no_such_experiment"])
