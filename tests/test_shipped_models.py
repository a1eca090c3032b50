"""The checkpoints shipped in models/ still load and score what their model cards say.

The cards' metrics were computed by models/ship.py when the weights were stored; evaluating the
stored weights again with today's code must give the same numbers, so a change to the models, the
tasks or the evaluation sets that silently breaks the shipped checkpoints fails here.
"""

import hashlib
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

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


def headline_by_hand(model, task, x, y, headline: str, batch_size: int) -> float:
    """The card's headline metric of `model` on inputs `x` with targets `y`, computed here from the
    model's raw outputs (the last n_predictions positions), not by the task's evaluate: R^2 per
    sequence 1 - (prediction - target)^2 / var(the sequence's N targets) averaged over sequences
    (the paper's); all M answers of a SRAVEN instance right; cross-entropy in bits per byte."""
    with torch.no_grad():
        outputs = torch.cat([model(torch.from_numpy(x[start:start + batch_size]))[:, -task.n_predictions:].double()
                             for start in range(0, len(x), batch_size)])
    if headline == "r2":
        targets = np.concatenate([x[:, :-1, -1], y], axis=1).astype(np.float64)
        return float(np.mean(1 - (outputs[:, 0, 0].numpy() - y[:, 0]) ** 2 / targets.var(axis=1)))
    if headline == "accuracy":
        return float((outputs.argmax(dim=-1).numpy() == y).all(axis=1).mean())
    if headline == "bits_per_byte":
        nats = F.cross_entropy(outputs.flatten(0, 1), torch.from_numpy(y).flatten(), reduction="mean")
        return nats.item() / math.log(2)
    raise AssertionError(f"no formula here for the headline metric {headline!r}: write one")


# The unpermuted SRAVEN trio (M = 4 features, 4 layers of width 128) takes 4-6 s a model on the whole
# held-out set of 4,096 instances, as long as the other nine together; the fast run scores the first
# 1,024 of those instances and the slow test below the whole set.
SUBSET = {f"sraven-{attention}": 1024 for attention in ("softmax", "linear", "hyla")}


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_model_scores_its_cards_held_out_figure_on_the_same_instances(name):
    """The fast check: the card's weights load into today's model and score the card's held-out
    headline figure on the instances it was computed on (models/ship.py evaluated the same weights
    on the run's whole evaluation set of that split, eval_set(split, eval_instances)), the metric
    computed here from the raw outputs. The same weights on the same instances differ only by float
    rounding (another batching, another BLAS): R^2 and bits per byte to 1e-6 (5e-9 seen); an accuracy moves only
    where rounding flips an argmax, 1/n each, and one flip is allowed. Untrained models score an
    accuracy near 0, a negative R^2 and 8 bits per byte.

    A model of SUBSET is scored on the first n of those instances: its accuracy there is a mean of n
    of the N right-or-wrong instances of the figure, which differs from the figure by a standard error
    of sqrt(p (1 - p) / n * (1 - n / N)) (drawn without replacement; p the figure, 0.95 to 0.97 here:
    0.006 at n = 1,024, p = 0.95), and four of those are allowed (a change of 0.025 fails)."""
    directory = MODELS / name
    weights = (directory / "model" / "model.safetensors").read_bytes()
    assert hashlib.sha256(weights).hexdigest() in (directory / "README.md").read_text()
    run = latentcode.Run(directory)
    task = run.task()
    headline, held_out = task.analysis.headline_metric, task.analysis.held_out_split  # e.g. r2 on ood
    expected = json.loads((directory / "summary.json").read_text())["shipped_metrics"][held_out][headline]
    everything = task.eval_set(held_out, run.config.eval_instances, variant=run.config.variant)
    n = SUBSET.get(name, len(everything))
    measured = headline_by_hand(run.load_model().eval(), task, everything.x[:n], everything.y[:n], headline,
                                run.config.eval_batch_size)  # a language model: 16 windows of 512 bytes at once
    if n < len(everything):
        assert headline == "accuracy"
        tolerance = 4 * math.sqrt(expected * (1 - expected) / n * (1 - n / len(everything)))
    else:
        tolerance = 1.5 / n if headline == "accuracy" else 1e-6
    assert measured == pytest.approx(expected, abs=tolerance), f"{held_out} {headline} on {n} instances"


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
