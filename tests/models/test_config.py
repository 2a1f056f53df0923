"""The transformer's config (`mlsys.models.config`): the presets, the backends' names, and the
values and presets it refuses."""

import pytest

from mlsys.models import attention
from mlsys.models import transformer as tm
from mlsys.models.config import ATTENTION_BACKENDS, PRESETS, TransformerConfig


def test_defaults_are_the_debug_preset_and_presets_build():
    assert TransformerConfig() == TransformerConfig.preset("debug")
    assert set(PRESETS) == {"debug", "laptop", "small", "medium", "large", "xl", "2.7B"}
    small = TransformerConfig.preset("small", attention="sdpa")
    sizes = (small.d_model, small.d_ff, small.n_layers, small.n_heads, small.d_head)
    assert sizes == (768, 3072, 12, 12, 64)
    assert (small.vocab_size, small.context_length, small.attention) == (10_000, 1_024, "sdpa")
    assert tm.TransformerConfig is TransformerConfig  # re-exported
    assert set(attention.BACKENDS) == set(ATTENTION_BACKENDS)  # the names and their functions
    for name in ATTENTION_BACKENDS:  # every name resolves to a function
        assert callable(attention.backend(name)), name
    with pytest.raises(ValueError, match="attention='flash' is not a known backend"):
        attention.backend("flash")


@pytest.mark.parametrize(
    ("kwargs", "error", "fragments"),
    [
        (dict(d_model=1000, n_heads=16), ValueError,
         ["d_model (1000)", "n_heads (16)", "not divisible"]),
        (dict(d_model=0), ValueError, ["d_model must be a positive integer, got 0"]),
        (dict(n_layers=-2), ValueError, ["n_layers", "-2"]),
        (dict(vocab_size=64.0), TypeError, ["vocab_size", "64.0"]),
        (dict(d_model=60, n_heads=4), ValueError, ["d_head", "15", "even"]),  # 60 / 4 = 15 is odd
        (dict(attention="flash"), ValueError, ["flash", "naive", "sdpa"]),
        (dict(attention=None), ValueError, ["attention=None", "naive"]),
        (dict(norm_eps=0.0), ValueError, ["norm_eps"]),
        (dict(norm_eps=-1e-5), ValueError, ["norm_eps must be > 0"]),
        (dict(norm_eps=True), TypeError, ["norm_eps must be a real number, got True"]),
        (dict(rope_theta=float("nan")), ValueError, ["rope_theta must be finite"]),
        (dict(rope_theta="1e4"), TypeError, ["rope_theta must be a real number"]),
        (dict(vocab_size=True), TypeError, ["vocab_size must be an integer, got True"]),
        (dict(context_length=0), ValueError, ["context_length must be a positive integer"]),
        (dict(d_ff=176.0), TypeError, ["d_ff must be an integer"]),
        (dict(n_heads=None), TypeError, ["n_heads must be an integer"]),
    ],
)
def test_config_rejects_bad_values(kwargs, error, fragments):
    with pytest.raises(error) as info:
        TransformerConfig(**kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_unknown_preset_and_field():
    with pytest.raises(ValueError,
                       match="preset='huge' is not one of 'debug', 'laptop', 'small', 'medium'"):
        TransformerConfig.preset("huge")
    with pytest.raises(ValueError, match="preset=None is not one of"):
        TransformerConfig.preset(None)
    with pytest.raises(ValueError, match="preset=.* is not one of"):
        TransformerConfig.preset(["small"])
    with pytest.raises(ValueError, match="d_modle"):
        TransformerConfig.preset("small", d_modle=512)
