"""`plan_train`: train's checks before torch, and the config it resolves from each kind of source."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from latentcode.rundir import RUN_FORMAT, RunDirectoryError
from latentcode.training import build_train_config
from latentcode.training.plan import plan_train

ROOT = Path(__file__).resolve().parents[2]


def test_a_plan_imports_no_torch(tmp_path):
    script = (
        "import sys\n"
        "from latentcode.training.plan import plan_train\n"
        f"plan = plan_train(preset='fuzzy_logic', scale='tiny', attention='hyla', overrides={{'seed': 3}}, "
        f"out={str(tmp_path / 'run')!r})\n"
        "print(plan.source, plan.out.name, 'torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["preset", "run", "False"]


def test_a_config_object_its_dict_and_its_json_file_plan_the_same_config(tmp_path):
    config = build_train_config("fuzzy_logic", "tiny", "linear", n_layers=1, seed=5)
    (tmp_path / "config.json").write_text(config.to_json())
    for given in (config, config.to_dict(), tmp_path / "config.json", str(tmp_path / "config.json")):
        plan = plan_train(given, tmp_path / "run")
        assert plan.source == "config" and plan.train_config() == config


def test_a_preset_plan_builds_the_presets_config(tmp_path):
    plan = plan_train(preset="sraven", scale="tiny", attention="hyla", overrides={"learning_rate": 0.002})
    assert plan.out is None  # the default directory is named after the built config
    assert plan.train_config() == build_train_config("sraven", "tiny", "hyla", learning_rate=0.002)


def test_a_config_file_with_a_bad_value_is_named_when_the_config_is_built(tmp_path):
    """warmup_steps beyond the run is found by TrainConfig's own validation (it needs the model modules):
    the message names the file, as the check's messages do."""
    config = build_train_config("fuzzy_logic", "tiny", "linear").to_dict()
    (tmp_path / "config.json").write_text(json.dumps({**config, "warmup_steps": 10**6}))
    plan = plan_train(str(tmp_path / "config.json"), tmp_path / "run")
    with pytest.raises(Exception, match=rf"^{tmp_path / 'config.json'}: warmup_steps=1000000 is not less") as raised:
        plan.train_config()
    assert raised.value.parameter == "config"


def test_resuming_a_finished_run_is_refused_by_the_plan(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"format": RUN_FORMAT, "train": {"task": {"name": "fuzzy_logic"},
                                                                              "model": {}}}))
    assert plan_train(resume=run).checkpoints == 0
    (run / "summary.json").write_text("{}")
    with pytest.raises(RunDirectoryError, match="has already finished; nothing to resume") as raised:
        plan_train(resume=run)
    assert raised.value.parameter == "resume"
