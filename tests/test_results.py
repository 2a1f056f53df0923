import json

import pytest

from mlsys import results


def _record():
    """A smoke record of this machine."""
    return {
        "experiment": "copy_bandwidth",
        "provenance": {**results.provenance(), "profile": "smoke"},
        "results": [{"n_bytes": 1024, "median_s": 1e-6}],
    }


def _gpu_record():
    """A record as a full-size run on an H100 would write it."""
    record = _record()
    record["provenance"].update(device="NVIDIA H100 80GB HBM3", device_type="cuda", profile="gpu")
    return record


def recorded_file_problems(root):
    """Why files under `root` do not belong in results/: one sentence per bad .json file."""
    problems = []
    for path in sorted(root.rglob("*.json")):
        try:
            results.validate_gpu_record(json.loads(path.read_text()), experiment=path.stem)
        except ValueError as exc:
            problems.append(f"{path.relative_to(root)}: {exc}")
    return problems


def test_every_recorded_file_is_a_valid_full_size_gpu_record():
    assert recorded_file_problems(results.RESULTS_DIR) == []


def test_the_recorded_file_check_refuses_a_smoke_or_cpu_record(tmp_path):
    cases = (("smoke", "cpu"), ("cpu", "cpu"), ("gpu", "cpu"), ("smoke", "cuda"))
    for profile, device_type in cases:
        record = _gpu_record()
        record["provenance"].update(profile=profile, device_type=device_type)
        folder = tmp_path / f"{profile}-{device_type}"
        folder.mkdir()
        (folder / "copy_bandwidth.json").write_text(json.dumps(record))
    (tmp_path / "h100").mkdir()
    (tmp_path / "h100" / "copy_bandwidth.json").write_text(json.dumps(_gpu_record()))
    problems = recorded_file_problems(tmp_path)
    assert len(problems) == 4 and not any(p.startswith("h100") for p in problems)
    assert problems[0].startswith("cpu-cpu/copy_bandwidth.json: record has profile='cpu' and "
                                  "device_type='cpu'; results/ holds only full-size GPU records")


def test_a_complete_record_is_valid():
    results.validate_record(_record(), experiment="copy_bandwidth")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.pop("provenance"), "lacks the key 'provenance'"),
        (lambda r: r.pop("results"), "lacks the key 'results'"),
        (lambda r: r["provenance"].pop("git_commit"), "provenance lacks git_commit"),
        (lambda r: r["provenance"].update(date=""), "provenance lacks date"),
        (lambda r: r["provenance"].pop("profile"), "provenance lacks profile"),
        (lambda r: r["provenance"].update(profile="fast"),
         "provenance\\['profile'\\]='fast' must be one of smoke, cpu, gpu"),
        (lambda r: r.update(results=[]), "non-empty list"),
        (lambda r: r.update(results={"a": 1}), "non-empty list"),
        (lambda r: r.update(results=[{"a": 1}, 3]), "every entry of results must be an object"),
        (lambda r: r.update(experiment="other"), "experiment='other'"),
        (lambda r: r.update(experiment=3), "experiment=3 must be lower-case"),
        (lambda r: r.update(provenance=list(r["provenance"].items())),
         "provenance must be a JSON object, got list"),
        (lambda r: r.update(provenance="NVIDIA H100"), "provenance must be a JSON object, got str"),
        (lambda r: r.update(provenance=None), "provenance must be a JSON object"),
        (lambda r: r["provenance"].update(device=80), r"provenance\['device'\] must be a string"),
        (lambda r: r["provenance"].update(torch_version=None), r"provenance\['torch_version'\]"),
        (lambda r: r["provenance"].update(command=["python", "-m"]), "must be a string, got"),
    ],
)
def test_broken_records_are_rejected(mutate, message):
    record = _record()
    mutate(record)
    with pytest.raises(ValueError, match=message):
        results.validate_record(record, experiment="copy_bandwidth")


def test_write_and_load_round_trip(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    record = _gpu_record()
    path = results.write_record("copy_bandwidth", record["results"], record["provenance"])
    assert path == tmp_path / "nvidia-h100-80gb-hbm3" / "copy_bandwidth.json"
    assert results.load_records("copy_bandwidth") == [record]
    with pytest.raises(ValueError, match="lower-case"):
        results.write_record("Copy Bandwidth", record["results"], record["provenance"])


def test_only_full_size_gpu_records_are_written_under_results(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path / "results")
    record = _record()  # this machine, smoke profile
    with pytest.raises(ValueError, match=r"profile='smoke' on '.+' \(device_type='\w+'\) "
                       r"cannot go under .*results: .* pass --out DIR"):
        results.write_record("copy_bandwidth", record["results"], record["provenance"])
    assert not (tmp_path / "results").exists()  # refused before anything is written


def test_a_record_is_overwritten_only_with_force(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    first, second = _gpu_record(), _gpu_record()
    second["results"] = [{"n_bytes": 2048, "median_s": 2e-6}]
    path = results.write_record("copy_bandwidth", first["results"], first["provenance"])
    with pytest.raises(FileExistsError, match=f"{path} exists; pass --force to overwrite it"):
        results.write_record("copy_bandwidth", second["results"], second["provenance"])
    assert json.loads(path.read_text()) == first
    results.write_record("copy_bandwidth", second["results"], second["provenance"], force=True)
    assert json.loads(path.read_text()) == second


def test_loading_skips_records_that_are_not_full_size_gpu_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    for folder, record in (("cpu", _record()), ("h100", _gpu_record())):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "copy_bandwidth.json").write_text(json.dumps(record))
    loaded = results.load_records("copy_bandwidth")
    assert [r["provenance"]["device"] for r in loaded] == ["NVIDIA H100 80GB HBM3"]


def test_provenance_says_what_produced_a_measurement(tmp_path):
    record = results.provenance()
    assert set(results.REQUIRED_PROVENANCE) <= set(record)
    assert all(isinstance(record[k], str) and record[k] for k in results.REQUIRED_PROVENANCE)
    commit = results.git_commit()
    assert commit == "unknown" or len(commit.removesuffix("+dirty")) == 12
    assert results.git_commit(tmp_path) == "unknown"  # not a checkout


def test_device_slug():
    assert results.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    with pytest.raises(ValueError, match="device_name"):
        results.device_slug("  ")


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: results.validate_record([1, 2]), ValueError, "a record must be a JSON object"),
        (lambda: results.validate_record(_record(), experiment="Copy"), ValueError,
         "experiment='Copy' must be lower-case"),
        (lambda: results.device_slug(None), TypeError, "device_name must be a string"),
        (lambda: results.device_slug("  "), ValueError, "has no letters or digits"),
        (lambda: results.write_record(3, [{"a": 1}], results.provenance()), ValueError,
         "experiment=3 must be lower-case"),
        (lambda: results.write_record("x", [{"a": 1}], [("device", "cpu")]), ValueError,
         "provenance must be a JSON object"),
        (lambda: results.load_records("../secrets"), ValueError, "must be lower-case letters"),
        (lambda: results.load_records(None), ValueError, "experiment=None"),
    ],
)
def test_invalid_calls_raise_clear_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


# --- every record is read by a chapter ------------------------------------------------------------

from pathlib import Path  # noqa: E402

from mlsys import experiments  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def reading_problems(names, chapters):
    """Why experiments `names` are not shown by a chapter: `chapters` maps a stem to its source.

    A chapter reads experiment X when it calls `experiments.recorded(...)` (or
    `experiments.show_recorded(...)` or `experiments.show_records(...)`, which call it) and names
    "X" (directly
    or in the tuple it loops over). Returns one sentence per problem; [] when every record is read.
    """
    problems = []
    for name in names:
        if name not in experiments.NAMES:
            problems.append(f"{name}: no experiment of that name in mlsys.experiments")
            continue
        chapter = experiments.get(name).chapter
        source = chapters.get(chapter)
        if source is None:
            problems.append(f"{name}: its chapter {chapter} does not exist")
        elif not any(call in source for call in ("experiments.recorded(",
                                                  "experiments.show_recorded(",
                                                  "experiments.show_records(")) \
                or f'"{name}"' not in source:
            problems.append(f"{name}: chapter {chapter} never shows its recorded runs")
    return problems


def _chapters():
    return {p.stem: p.read_text() for p in NOTEBOOKS.glob("[0-9][0-9]_*.py")}


def test_every_experiment_has_a_chapter_that_shows_its_records():
    assert reading_problems(experiments.NAMES, _chapters()) == []


def test_every_recorded_file_belongs_to_an_experiment_a_chapter_reads():
    stems = sorted({p.stem for p in results.RESULTS_DIR.glob("*/*.json")})
    assert reading_problems(stems, _chapters()) == []


def test_the_reading_check_can_fail():
    chapters = _chapters()
    assert reading_problems(["no_such_experiment"], chapters) == [
        "no_such_experiment: no experiment of that name in mlsys.experiments"]
    name = experiments.NAMES[0]
    chapter = experiments.get(name).chapter
    blind = {**chapters,
             chapter: chapters[chapter].replace("experiments.recorded(", "experiments.x(")
                                       .replace("experiments.show_recorded(", "experiments.x(")
                                       .replace("experiments.show_records(", "experiments.x(")}
    assert reading_problems([name], blind) == [
        f"{name}: chapter {chapter} never shows its recorded runs"]
    assert reading_problems([name], {}) == [f"{name}: its chapter {chapter} does not exist"]
