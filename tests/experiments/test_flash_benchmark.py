"""The flash_benchmark experiment (chapter 06): smoke rows and targets, and the forward times read
from a named GPU's records only."""

from mlsys.experiments import flash_benchmark


def test_flash_benchmark_rows_and_targets():
    rows = flash_benchmark.run(flash_benchmark.SIZES["smoke"], device="cpu")
    names = {r["implementation"] for r in flash_benchmark.measured(rows)}
    assert {"naive", "flash_torch", "sdpa_math"} <= names
    r = flash_benchmark.measured(rows)[0]
    assert flash_benchmark.flops(rows, r, "backward") == 2 * flash_benchmark.flops(rows, r,
                                                                                   "forward")
    assert "targets are read from a GPU record" in flash_benchmark.targets(rows)
    assert set(flash_benchmark.verdicts(rows)) == {"speed", "memory"}
    fake = [dict(x) for x in rows]  # a GPU-like record at the target configuration
    base = {"kind": "row", "status": "ok", "problems": [], "batch": 1,
            **flash_benchmark.TARGET}
    fast = {"median_s": 1e-3, "p20_s": 1e-3, "p80_s": 1e-3, "samples_s": [1e-3] * 4}
    slow = {**fast, "median_s": 2e-3, "p20_s": 2e-3, "p80_s": 2e-3}
    fake += [{**base, "implementation": "flash_triton", "forward": fast,
              "forward+backward": slow},
             {**base, "implementation": "sdpa_flash", "forward": slow, "forward+backward": fast}]
    text = flash_benchmark.targets(fake)
    assert "forward 2.00x the speed of the best SDPA backend (sdpa_flash; target >= 1): met" in text
    assert "forward + backward 0.50x" in text and "missed" in text


def test_recorded_forward_seconds_reads_only_the_named_gpus_records(tmp_path, monkeypatch):
    from mlsys import hardware, results
    from mlsys.experiments import flash_benchmark

    rows = [{"kind": "row", "status": "ok", "implementation": "flash_triton", "dtype": "bf16",
             "causal": True, "d_head": 128, "seq": 512, "batch": 8, "problems": [],
             "forward": {"median_s": 2e-3, "p20_s": 2e-3, "p80_s": 2e-3, "samples_s": [2e-3]}}]
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"):
        folder = tmp_path / results.device_slug(name)
        folder.mkdir()
        record = {"experiment": "flash_benchmark", "results": rows, "provenance": {
            "device": name, "device_type": "cuda", "profile": "gpu", "torch_version": "2.13",
            "triton_version": "3.7.1", "cuda_version": "12.8", "date": "2026-11-25",
            "git_commit": "x", "command": "python -m mlsys.experiments flash_benchmark"}}
        (folder / "flash_benchmark.json").write_text(__import__("json").dumps(record))
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    assert flash_benchmark.recorded_forward_seconds(hardware.H100_SXM) == {(8, 512): 2e-3}
    assert flash_benchmark.recorded_forward_seconds(hardware.H200_SXM) == {}


def test_plot_of_rows_without_the_combo_draws_no_legend_and_warns_nothing():
    import warnings

    import matplotlib.pyplot as plt

    from mlsys.plotting import subplots

    fig, ax = subplots()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "No artists with labels found to put in legend"
        flash_benchmark.plot([], ax, dtype="bf16", causal=True, d_head=128)
    assert ax.get_legend() is None and not ax.lines
    row = {"kind": "row", "status": "ok", "implementation": "naive", "dtype": "bf16",
           "causal": True, "d_head": 128, "seq": 512, "batch": 1, "problems": [],
           "forward+backward": {"median_s": 1e-3, "p20_s": 1e-3, "p80_s": 1e-3,
                                "samples_s": [1e-3]}}
    flash_benchmark.plot([{"kind": "setup", "heads": 16}, row], ax, dtype="bf16", causal=True,
                         d_head=128)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["naive"]
    plt.close(fig)
