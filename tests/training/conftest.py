import pytest

from latentcode.training import build_train_config

SMALL_MODEL = dict(n_layers=1, d_model=32, d_mlp=64, n_heads=4, kqv_dim=8)


@pytest.fixture
def small_config():
    """A tiny-scale fuzzy-logic config with a small model: a run takes a few seconds."""

    def make(preset="fuzzy_logic", attention="hyla", **overrides):
        return build_train_config(preset, "tiny", attention, **{**SMALL_MODEL, **overrides})

    return make
