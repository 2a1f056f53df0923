"""The experiments' command line (`python -m mlsys.experiments`): what it refuses, `--list`,
`--check`'s exit status, and records replaced only with `--force`."""

import json
import os
import subprocess
import sys

import pytest
from experiment_cases import files_under

from mlsys import env, experiments, results
from mlsys.experiments import __main__ as cli


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


def test_the_command_line_refuses_a_smoke_record_under_results(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(experiments, "run_record", lambda *a: pytest.fail("ran an experiment"))
    with pytest.raises(SystemExit):
        cli.main(["--smoke", "train_step", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert f"profile='smoke' on '{env.device_name()}'" in err and "pass --out DIR" in err
    assert files_under(tmp_path) == set()


def test_an_existing_record_is_replaced_only_with_force(tmp_path, capsys):
    names = ["dot_accumulation", "autocast_dtypes"]
    old = experiments.record_path("autocast_dtypes", env.device_name(), tmp_path)
    old.parent.mkdir(parents=True)
    old.write_text("{}")
    with pytest.raises(SystemExit):  # refused before the first experiment runs
        cli.main(["--smoke", *names, "--out", str(tmp_path)])
    assert f"{old} exists; pass --force to overwrite it" in capsys.readouterr().err
    assert files_under(tmp_path) == {old} and old.read_text() == "{}"
    paths = cli.main(["--smoke", *names, "--out", str(tmp_path), "--force"])
    assert paths == [experiments.record_path(n, env.device_name(), tmp_path) for n in names]
    for path in paths:
        record = json.loads(path.read_text())
        results.validate_record(record, experiment=path.stem)
        assert record["provenance"]["command"] == (
            f"python -m mlsys.experiments --smoke {' '.join(names)} --out {tmp_path} --force")
    with pytest.raises(FileExistsError, match="pass --force"):
        experiments.write(json.loads(paths[0].read_text()), tmp_path)


@pytest.mark.parametrize("where", ["a file", "under a file", "read-only"])
def test_an_out_that_cannot_hold_records_is_refused_before_anything_runs(where, tmp_path,
                                                                         monkeypatch, capsys):
    if where == "read-only" and os.geteuid() == 0:
        pytest.skip("root writes into a read-only directory")
    monkeypatch.setattr(experiments, "run_record", lambda *a: pytest.fail("ran an experiment"))
    blocker = tmp_path / "records"
    if where == "read-only":
        blocker.mkdir(mode=0o500)
        out, why = blocker / "new", "records cannot be written there (Permission denied)"
    else:
        blocker.write_text("not a directory")
        out = blocker if where == "a file" else blocker / "sub"
        why = f"{blocker} is not a directory"
    with pytest.raises(SystemExit):
        cli.main(["--smoke", "dot_accumulation", "--out", str(out)])
    assert f"--out {out}: {why}; pass a directory this process can write" in \
        capsys.readouterr().err
    assert not out.exists() or where == "a file"
