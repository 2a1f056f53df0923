import pytest

from mlsys import env


def test_profile_from_variable(monkeypatch):
    for name in env.PROFILES:
        monkeypatch.setenv("MLSYS_PROFILE", name)
        assert env.profile() == name


def test_profile_from_hardware_when_unset(monkeypatch):
    monkeypatch.delenv("MLSYS_PROFILE", raising=False)
    monkeypatch.setenv("CI", "true")  # CI must not change the profile
    assert env.profile() == ("gpu" if env.device() == "cuda" else "cpu")


def test_unknown_profile_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("MLSYS_PROFILE", "huge")
    with pytest.raises(ValueError, match="'huge'.*smoke, cpu, gpu"):
        env.profile()


def test_pick_follows_profile(monkeypatch):
    monkeypatch.setenv("MLSYS_PROFILE", "smoke")
    assert env.pick(smoke=1, cpu=2, gpu=3) == 1
    monkeypatch.setenv("MLSYS_PROFILE", "cpu")
    assert env.pick(smoke=1, cpu=2, gpu=3) == 2
    assert env.pick(smoke=1, cpu=2, gpu=3, profile_name="gpu") == 3
    with pytest.raises(ValueError, match="profile_name='tpu'"):
        env.pick(smoke=1, cpu=2, gpu=3, profile_name="tpu")


def test_pick_needs_every_profile():
    with pytest.raises(TypeError):
        env.pick(smoke=1, cpu=2)  # type: ignore[call-arg]


def test_describe_is_two_short_lines_with_device_profile_and_versions(monkeypatch):
    monkeypatch.setenv("MLSYS_PROFILE", "smoke")
    stamp = env.describe()
    assert len(stamp.splitlines()) == 2
    assert all(len(line) <= 100 for line in stamp.splitlines()), stamp
    import torch

    assert "profile: smoke" in stamp and f"torch {torch.__version__}" in stamp
    assert env.device_name() in stamp


def test_device_is_known():
    assert env.device() in ("cuda", "mps", "cpu")


def test_cuda_capability_is_read_from_the_device_or_refused():
    if env.device() == "cuda":
        major, minor = env.cuda_capability().split(".")
        assert int(major) >= 7 and minor.isdigit()
    else:
        with pytest.raises(ValueError, match="no CUDA device"):
            env.cuda_capability()


@pytest.mark.skipif(not env.has_triton(), reason="triton is not installed (it is Linux-only)")
def test_setup_triton_switches_on_the_interpreter_without_gpu(monkeypatch):
    if env.device() == "cuda":
        pytest.skip("a GPU is present: Triton compiles for it")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert env.setup_triton() is True
    assert env.triton_interpreted()


def test_setup_triton_respects_an_explicit_choice(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    env.setup_triton()
    assert not env.triton_interpreted()


@pytest.mark.skipif(not env.has_triton(), reason="triton is not installed (it is Linux-only)")
def test_the_interpreter_fix_is_for_triton_before_3_7_and_applied_once():
    from importlib.metadata import version

    from triton.runtime import interpreter

    env.fix_triton_interpreter()  # setup_triton may have applied it already
    patched = getattr(interpreter._patch_lang_tensor, "squeezes_scalars", False)
    assert patched == (tuple(int(p) for p in version("triton").split(".")[:2]) < (3, 7))
    assert env.fix_triton_interpreter() is False  # idempotent


@pytest.mark.parametrize(
    "value", ["1", "true", "TRUE", "on", "yes", "y", "0", "false", "off", "no", "2", ""])
def test_interpreter_flag_is_read_as_triton_reads_it(monkeypatch, value):
    monkeypatch.setenv("TRITON_INTERPRET", value)
    expected = value.lower() in ("1", "true", "on", "yes", "y")
    assert env.triton_interpreted() is expected
    if env.has_triton():  # Triton's own reading of the variable agrees
        from triton._C.libtriton import getenv_bool

        assert getenv_bool("TRITON_INTERPRET", False) is expected
