import json

import pytest

from mlsys import bench, results


def _record():
    return {
        "experiment": "copy_bandwidth",
        "provenance": bench.provenance(),
        "results": [{"n_bytes": 1024, "median_s": 1e-6}],
    }


def test_every_recorded_file_follows_the_schema():
    for path in results.RESULTS_DIR.glob("*/*.json"):
        results.validate_record(json.loads(path.read_text()), experiment=path.stem)


def test_a_complete_record_is_valid():
    results.validate_record(_record(), experiment="copy_bandwidth")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.pop("provenance"), "lacks the key 'provenance'"),
        (lambda r: r["provenance"].pop("git_commit"), "provenance lacks git_commit"),
        (lambda r: r.update(results=[]), "non-empty list"),
        (lambda r: r.update(experiment="other"), "experiment='other'"),
    ],
)
def test_broken_records_are_rejected(mutate, message):
    record = _record()
    mutate(record)
    with pytest.raises(ValueError, match=message):
        results.validate_record(record, experiment="copy_bandwidth")


def test_write_and_load_round_trip(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    record = _record()
    path = results.write_record("copy_bandwidth", record["results"], record["provenance"])
    assert path.parent.name == results.device_slug(record["provenance"]["device"])
    assert results.load_records("copy_bandwidth")[0]["results"] == record["results"]
    with pytest.raises(ValueError, match="lower-case"):
        results.write_record("Copy Bandwidth", record["results"], record["provenance"])


def test_device_slug():
    assert results.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    with pytest.raises(ValueError, match="device_name"):
        results.device_slug("  ")
