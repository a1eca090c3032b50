"""Decoding the relation of a key-query pair (`latentcode.analysis.token_relations`) from its latent
code, per layer, beside the strongest trivial baselines.

The probe of each layer is a `LogisticProbe` on the H-dimensional code ``a[:, q, k]`` of that layer
(``"all"``: every layer's code concatenated, L x H), its C chosen by balanced accuracy in
cross-validation on the fitting pairs. Scores are balanced accuracies (mean recall over the
relations present), on each test set; the fitting pairs are drawn with as many of each relation as
the sequences have (`sample_pairs`), so the classes are near balance but not exactly.

Baselines, each fitted on the same fitting pairs and scored on the same test pairs:

- ``majority``: the most frequent fitting relation, predicted throughout (1 / relations present);
- ``shuffled_labels``: the same probe (same layer) fitted to the fitting relations permuted;
- ``distance_only``: a `LogisticProbe` on the distance q - k alone, one-hot per distance value seen
  when fitting (a distance never seen there has all-zero features): the best any rule of the
  distance can do, up to regularization. Sink pairs (k = 0) are not positional in q - k, so it
  cannot name them where q varies.

The layer to report is chosen on the fitting pairs only: ``validation`` is the balanced accuracy
of the probe's out-of-fold predictions; ``selected`` marks the layer (of the single layers) with
the best one (ties: the earlier).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from latentcode.analysis.probes import LogisticProbe
from latentcode.analysis.scores import balanced_accuracy
from latentcode.analysis.token_relations import RELATIONS

__all__ = ["decode_relations", "distance_features", "selected_rows"]

BASELINES = ("majority", "shuffled_labels", "distance_only")


def distance_features(distance: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """One-hot ``[N, len(seen)]`` of each distance among the distances `seen` when fitting."""
    return (np.asarray(distance)[:, None] == np.asarray(seen)[None, :]).astype(np.float64)


def _recalls(truth: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    return {f"recall_{name}": float(np.mean(predicted[truth == index] == index)) if np.any(truth == index) else np.nan
            for index, name in enumerate(RELATIONS)}


def decode_relations(fit: Mapping[str, np.ndarray], tests: Mapping[str, Mapping[str, np.ndarray]], seed: int = 0,
                     cv: int = 3) -> pd.DataFrame:
    """One row per (layer, test set): the probe's balanced accuracy on the test set beside the
    baselines of the module docstring.

    fit, and each test set by name: ``{"codes": [N, layer, head], "relation": [N], "distance": [N]}``
    (a `latentcode.relations.RelationCodes` has these). Columns: layer (int, or "all"), test, n_fit,
    n_test, validation, balanced_accuracy, majority, shuffled_labels, distance_only,
    strongest_baseline, strongest_baseline_value, beats_baselines, selected, recall_<relation>."""
    codes, relation, distance = (np.asarray(fit[key]) for key in ("codes", "relation", "distance"))
    n_layers = codes.shape[1]
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(relation)
    majority = np.bincount(relation).argmax()
    probe_options = dict(cv=cv, random_state=seed, selection_score=balanced_accuracy)
    rows = []
    with threadpool_limits(limits=1):
        seen = np.unique(distance)
        by_distance = LogisticProbe(**probe_options).fit(distance_features(distance, seen), relation)
        distance_scores = {name: balanced_accuracy(np.asarray(test["relation"]), by_distance.predict(
            distance_features(np.asarray(test["distance"]), seen))) for name, test in tests.items()}
        for layer in [*range(n_layers), "all"]:
            def inputs(array, layer=layer):
                return array.reshape(len(array), -1) if layer == "all" else array[:, layer]
            probe = LogisticProbe(**probe_options).fit(inputs(codes), relation)
            null = LogisticProbe(**probe_options).fit(inputs(codes), shuffled)
            validation = balanced_accuracy(relation, probe.validation_predictions_)
            for name, test in tests.items():
                truth = np.asarray(test["relation"])
                test_codes = inputs(np.asarray(test["codes"]))
                predicted = probe.predict(test_codes)
                baselines = {"majority": balanced_accuracy(truth, np.full_like(truth, majority)),
                             "shuffled_labels": balanced_accuracy(truth, null.predict(test_codes)),
                             "distance_only": distance_scores[name]}
                strongest = max(BASELINES, key=lambda baseline: baselines[baseline])
                value = balanced_accuracy(truth, predicted)
                rows.append({"layer": layer, "test": name, "n_fit": len(relation), "n_test": len(truth),
                             "validation": validation, "balanced_accuracy": value, **baselines,
                             "strongest_baseline": strongest, "strongest_baseline_value": baselines[strongest],
                             "beats_baselines": value > baselines[strongest], **_recalls(truth, predicted)})
    table = pd.DataFrame(rows)
    single = table[table.layer != "all"]
    best = single.loc[single.validation.astype(float).idxmax(), "layer"]  # idxmax: the first of equal maxima
    table["selected"] = table.layer.apply(lambda layer: layer == best)
    return table


def selected_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the selected layer and of all layers concatenated, one per test set."""
    return table[table.selected | (table.layer == "all")]
