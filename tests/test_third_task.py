"""A third task, written as one class in this file, trains, extracts, probes and reports through the
public API with no change outside `latentcode/tasks/`: the design's test that a task owns what is
known about it."""

from __future__ import annotations

import json

import numpy as np
import pytest

import latentcode
from latentcode.analysis import decode
from latentcode.analysis.report import build_report
from latentcode.store import CodeFile
from latentcode.tasks import AnalysisDefaults, Batch, Task, TrainingSetup, register_task, task_names
from latentcode.tasks.registry import _TASK_CLASSES
from latentcode.training import build_train_config

SELECTED = ("first", "second", "third")


class PickAFeature(Task):
    """In-context regression: every token is (x, y) with y = x[r] for the instance's hidden feature r;
    the last token's y is to be predicted. The code of the last token should tell r."""

    name = "pick_a_feature"
    splits = ("train", "test")
    variants = ("plain",)
    label_names = ("feature", "task_index")
    objective = "regression"
    analysis = AnalysisDefaults(selector="query-to-first", variant="plain", probe_label="feature",
                                picture_label="feature", headline_metric="mse_skill")
    training_setup = TrainingSetup(
        description="toy: pick one of three features in context",
        task={"name": "pick_a_feature", "seq_len": 8, "seed": 0},
        model={"n_layers": 1, "d_model": 16, "n_heads": 2, "kqv_dim": 8, "d_mlp": 16, "positions": "relative",
               "causal": False, "attn_dropout": 0.0},
        optimizer={"batch_size": 32, "learning_rate": 3e-3, "weight_decay": 0.0, "warmup_steps": 2},
        train_instances={"tiny": 20 * 32, "demo": 20 * 32, "cpu": 20 * 32, "paper": 20 * 32},
        eval_instances={"tiny": 64, "demo": 64, "cpu": 64, "paper": 64},
        paper_grid={"learning_rate": [3e-3]},
    )

    def __init__(self, *, seq_len: int = 8, seed: int = 0) -> None:
        self.seq_len, self.seed = seq_len, seed
        self.d_in, self.d_out, self.n_predictions = 4, 1, 1
        self.all_combinations = np.arange(3)[:, None]
        self._split_pools = {"train": np.arange(3), "test": np.arange(3)}

    def selectors(self):
        return {"query-to-first": ((None, -1, 0),)}

    def value_names(self):
        return {"feature": list(SELECTED)}

    def _generate(self, n, split, variant, rng):
        feature = self._draw_task_indices(rng, n, split)
        inputs = rng.random((n, self.seq_len, 3), dtype=np.float32)
        targets = inputs[np.arange(n), :, feature]  # [n, seq_len]
        x = np.concatenate([inputs, targets[..., None]], axis=-1)
        x[:, -1, -1] = 0.0
        return Batch(x=x, y=targets[:, -1:].copy(), labels={"feature": feature, "task_index": feature},
                     split=split, variant=variant)

    def evaluate(self, prediction, batch):
        error = (self._check_prediction(prediction, batch)[:, 0, 0] - batch.y[:, 0]) ** 2
        return {"mse": float(error.mean()), "mse_skill": float(1 - error.mean() / batch.y.var())}


@pytest.fixture
def third_task():
    register_task(PickAFeature)
    yield PickAFeature
    del _TASK_CLASSES[PickAFeature.name]


def test_a_task_without_analysis_defaults_is_refused():
    class Incomplete(PickAFeature):
        name = "incomplete"
        analysis = None

    with pytest.raises(TypeError, match="must set `analysis"):
        register_task(Incomplete)
    assert "incomplete" not in task_names()


def test_a_third_task_trains_extracts_probes_and_reports(third_task, tmp_path):
    config = build_train_config("pick_a_feature", "tiny", "hyla")
    assert config.task["name"] == "pick_a_feature" and config.model["d_in"] == 4
    run = latentcode.train(config, tmp_path / "run", progress=False)
    stored = json.loads((run.path / "config.json").read_text())
    assert stored["task_analysis"]["headline_metric"] == "mse_skill"

    codes = tmp_path / "codes.h5"
    for index, split in enumerate(("train", "test")):
        latentcode.extract(run.path, sites="query-to-first", split=split, n=96, out=codes, append=index > 0,
                           progress=False)
    code_file = CodeFile(codes)
    assert [(site.layer, site.query, site.key) for site in code_file.sites] == [(0, 7, 0)]
    assert code_file.task_analysis["probe_label"] == "feature"
    assert code_file.value_names["feature"] == list(SELECTED)
    np.testing.assert_array_equal(np.unique(code_file.labels("feature")), [0, 1, 2])

    table = decode(codes, "feature", fit_split="train", test_split="test")
    assert set(table["label"]) == {"feature"} and len(table)

    report = build_report([run.path], codes_files=[codes], out=tmp_path / "report.html", fit_split="train",
                          test_split="test", max_points=100, progress=False)
    page = report.path.read_text()
    assert "mse_skill" in page and "feature" in page
