"""Where the shipped checkpoints are looked for, and what is said when they are not there."""

import shutil
from pathlib import Path

import pytest

from latentcode.demo import run_demo
from latentcode.shipped import (
    INSTALLED_MODELS,
    MODELS_ENV,
    SOURCE_TREE_MODELS,
    ShippedModelsNotFound,
    find_models_directory,
    missing_checkpoints,
    shipped_run,
)

MODELS = Path(__file__).resolve().parents[1] / "models"


def test_a_source_checkout_reads_models_in_place(monkeypatch):
    monkeypatch.delenv(MODELS_ENV, raising=False)
    assert SOURCE_TREE_MODELS == MODELS and find_models_directory() == MODELS
    assert shipped_run("sraven", "hyla") == MODELS / "sraven-hyla"
    assert INSTALLED_MODELS.name == "shipped_models" and INSTALLED_MODELS.parent.name == "latentcode"


def test_an_explicit_directory_wins_and_the_environment_comes_next(tmp_path, monkeypatch):
    shutil.copytree(MODELS / "fuzzy_logic-hyla", tmp_path / "mine" / "fuzzy_logic-hyla")
    monkeypatch.setenv(MODELS_ENV, str(tmp_path / "mine"))
    assert find_models_directory() == tmp_path / "mine"
    assert shipped_run("fuzzy_logic", "hyla") == tmp_path / "mine" / "fuzzy_logic-hyla"
    assert find_models_directory(MODELS) == MODELS
    assert missing_checkpoints(tmp_path / "mine", "fuzzy_logic", ("softmax", "hyla")) == ["fuzzy_logic-softmax"]
    with pytest.raises(ShippedModelsNotFound, match=r"holds no shipped checkpoint fuzzy_logic-softmax .*models_dir="):
        shipped_run("fuzzy_logic", "softmax")


def test_nothing_found_says_where_it_looked(monkeypatch):
    import latentcode.shipped as shipped

    monkeypatch.delenv(MODELS_ENV, raising=False)
    monkeypatch.setattr(shipped, "SOURCE_TREE_MODELS", Path("/nonexistent/models"))
    monkeypatch.setattr(shipped, "INSTALLED_MODELS", Path("/nonexistent/shipped_models"))
    assert find_models_directory() is None
    with pytest.raises(ShippedModelsNotFound, match="not installed .*/nonexistent/models.*pass models_dir="):
        shipped_run("sraven", "hyla")


def test_the_demo_refuses_missing_checkpoints_before_writing_or_training(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ShippedModelsNotFound, match="holds no shipped checkpoint fuzzy_logic-softmax"):
        run_demo("fuzzy_logic", tmp_path / "demo", models_dir=tmp_path / "empty", progress=False)
    assert not (tmp_path / "demo").exists()
