"""mlsys.accounting.planner and `python -m mlsys plan`: every mesh is valid, the ranking follows
the predictions, the predictions are the accounting's, and impossible meshes are clear errors."""

import subprocess
import sys

import pytest

from mlsys import hardware
from mlsys.accounting import parallel as P
from mlsys.accounting import planner
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
        P.check_model(SMALL, p.dims, batch=64, seq=1024, microbatches=p.microbatches)
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
        memory = P.device_memory(SMALL, p.dims, micro_batch=64 // p.dims.dp // p.microbatches,
                                 seq=1024, microbatches=p.microbatches,
                                 sequence_parallel=p.dims.tp > 1)
        assert p.memory == memory


def test_fixed_axes_and_micro_batches_are_held():
    held = planner.plan(SMALL, H100, fixed={"tp": 4, "pp": 2}, microbatches=4, **KW)
    assert {(p.dims.tp, p.dims.pp, p.microbatches) for p in held} == {(4, 2, 4)}
    lower = planner.plan(SMALL, H100, efficiency=0.5, fixed={"dp_shard": 16}, **KW)[0]
    assert lower.mfu <= 0.5


def test_a_model_too_big_for_the_devices_does_not_fit():
    (alone,) = planner.plan(P.XXL, "tpu-v5p", n_devices=1, batch=1, seq=1024)  # the CS336 XXL
    assert not alone.fits and alone.memory.total > 3.5e12
    assert "NO" in planner.table([alone])[1]
    pod = planner.plan(P.XXL, "tpu-v5p", n_devices=64, batch=64, seq=1024, fixed={"tp": 4})
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


def test_table_and_figures(plans):
    lines = planner.table(plans, top=3)
    assert len(lines) == 4 and "limited by" in lines[0]
    ax = planner.plot_plans(plans)
    assert ax.collections and ax.get_xlabel() == "predicted step time (s)"
    ax = planner.plot_compute_bound(P.XXL.d_model, P.XXL.d_ff, 64,
                                    flop_per_s=hardware.TPU_V5P.peak_flop_per_s("bf16"),
                                    link_bytes_per_s=hardware.LINKS["ici-v5p-axis"].bytes_per_s,
                                    m_x=2, fixed_xy=(16, 4))
    assert len(ax.lines) == 5  # FSDP, TP, optimal mix, X = 16 x Y = 4, and the line at 1


def _run(*args):
    return subprocess.run([sys.executable, "-m", "mlsys", "plan", *args], capture_output=True,
                          text=True, timeout=60)


ARGS = ["--preset", "small", "--cluster", "DGX-H100", "--devices", "16", "--batch", "64",
        "--seq", "1024"]


def test_the_command_prints_the_planners_table(plans):
    done = _run(*ARGS, "--top", "5")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("plan: small (") and "16 x H100 SXM" in lines[0]
    assert f"{len(plans)} valid meshes" in lines[1]
    assert lines[2:] == planner.table(plans, top=5)


@pytest.mark.parametrize(("extra", "fragment"), [
    (["--tp", "3"], "tp (3) does not divide the devices (16)"),
    (["--tp", "8", "--pp", "4"], "= 32 != world_size (16)"),
    (["--cluster", "dgx-v100"], "cluster='dgx-v100' is not one of"),
    (["--efficiency", "0"], "efficiency must be > 0"),
])
def test_the_command_rejects_impossible_meshes_in_one_line(extra, fragment):
    done = _run(*ARGS, *extra)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and fragment in errors[0], done.stderr
