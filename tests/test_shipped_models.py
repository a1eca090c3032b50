"""The checkpoints shipped in models/ still load and score what their model cards say.

The cards' metrics were computed by models/ship.py when the weights were stored; evaluating the
stored weights again with today's code must give the same numbers, so a change to the models, the
tasks or the evaluation sets that silently breaks the shipped checkpoints fails here.
"""

import hashlib
import json
import re
from pathlib import Path

import pytest

import latentcode
from latentcode.training.evaluate import eval_sets_of, evaluate

MODELS = Path(__file__).resolve().parents[1] / "models"
SHIPPED = sorted(path.name for path in MODELS.iterdir() if (path / "model" / "model.safetensors").is_file())


def test_the_models_of_both_demos_are_shipped():
    # sraven-permuted: `latentcode demo --checkpoints permuted`; language: `latentcode demo --task language`
    trios = ("fuzzy_logic", "sraven", "sraven-permuted", "language")
    expected = {f"{trio}-{attention}" for trio in trios for attention in ("softmax", "linear", "hyla")}
    assert expected <= set(SHIPPED)


def test_the_permuted_sraven_trio_was_trained_on_the_permuted_task():
    """The paper's task (column permutations: the task's default variant), at M = 2 features."""
    for attention in ("softmax", "linear", "hyla"):
        run = latentcode.Run(MODELS / f"sraven-permuted-{attention}")
        assert (run.config.variant or run.task().variants[0]) == "permuted"
        assert run.task().n_features == 2 and run.load_model().config.attention == attention


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_model_loads_and_solves_its_task(name):
    """The fast check: the card's weights load into today's model and, on 256 OOD instances, score
    within 0.05 of the card's OOD headline metric (untrained models score an accuracy near 0 and a
    negative R^2 there). The exact comparison on the full evaluation sets is the slow test below."""
    directory = MODELS / name
    weights = (directory / "model" / "model.safetensors").read_bytes()
    assert hashlib.sha256(weights).hexdigest() in (directory / "README.md").read_text()
    run = latentcode.Run(directory)
    task = run.task()
    headline, held_out = task.analysis.headline_metric, task.analysis.held_out_split  # e.g. r2 on ood
    expected = json.loads((directory / "summary.json").read_text())["shipped_metrics"][held_out][headline]
    instances = {held_out: task.eval_set(held_out, 256, variant=run.config.variant)}
    # in the run's evaluation batches: a language model's 256 windows of 512 bytes at once run slower
    measured = evaluate(run.load_model(), task, instances, run.config.eval_batch_size)[held_out][headline]
    assert measured == pytest.approx(expected, abs=0.05), f"{held_out} {headline}"


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_model_matches_its_model_card(name):
    directory = MODELS / name
    card = (directory / "README.md").read_text()
    weights = (directory / "model" / "model.safetensors").read_bytes()
    assert hashlib.sha256(weights).hexdigest() in card, "the card's SHA-256 is not that of the shipped weights"
    assert len(weights) < 3e6, f"{name} weighs {len(weights) / 1e6:.1f} MB; shipped models must stay small"

    run = latentcode.Run(directory)
    model = run.load_model()
    assert model.config.attention == name.rsplit("-", 1)[1]
    task = run.task()
    expected = json.loads((directory / "summary.json").read_text())["shipped_metrics"]
    measured = evaluate(model, task, eval_sets_of(task, run.config.eval_instances, run.config.variant),
                        run.config.eval_batch_size)
    assert set(measured) == set(expected)
    for split, metrics in expected.items():
        for metric, value in metrics.items():
            assert measured[split][metric] == pytest.approx(value, abs=1e-4), (split, metric)
    # The card's table shows the same numbers, to four decimals.
    header = re.search(r"^\| split \| (.+) \|$", card, re.MULTILINE).group(1).split(" | ")
    held_out = task.analysis.held_out_split
    row = re.search(rf"^\| {held_out} \| (.+) \|$", card, re.MULTILINE).group(1).split(" | ")
    for metric, shown in zip(header, row, strict=True):
        assert float(shown) == pytest.approx(expected[held_out][metric], abs=1e-4), metric
