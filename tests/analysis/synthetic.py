"""Synthetic codes files with planted signals, shared by the analysis tests.

Codes at the layers in `signal_layers` carry each label in its own heads, times `strength`, plus
Gaussian noise: heads 0-7 the one-hot rule, heads 8-15 ``term_present``, heads 16-21 the
flattened ``negation_bits``; the other heads, and every head of the other layers, are pure noise.
test_synthetic.py checks this layout.
"""

from __future__ import annotations

import numpy as np

from latentcode.store import CodeWriter, Site
from latentcode.tasks import get_task, task_names

N_RULES = 8
N_TERMS = 8
NEGATION_SHAPE = (2, 3)


def make_labels(rng: np.random.Generator, n: int, absent_terms=(), rule_weights=None) -> dict[str, np.ndarray]:
    weights = None if rule_weights is None else np.asarray(rule_weights, dtype=float) / np.sum(rule_weights)
    rule = rng.choice(N_RULES, size=n, p=weights)
    query_rule = rng.integers(0, N_RULES, (n, 4))
    query_rule[:, -1] = rule
    allowed = np.setdiff1d(np.arange(N_TERMS), absent_terms)
    term_present = np.zeros((n, N_TERMS), dtype=np.int8)
    for row in range(n):
        term_present[row, rng.choice(allowed, size=2, replace=False)] = 1
    return {
        "rule": rule,
        "query_rule": query_rule,
        "term_present": term_present,
        "negation_bits": rng.integers(0, 2, (n, *NEGATION_SHAPE)).astype(np.int8),
        "target": rng.random(n).astype(np.float32),
    }


def write_codes(
    path,
    *,
    n_per_split: dict[str, int] | None = None,
    layers=(0, 1),
    sites_per_layer: int = 1,
    n_heads: int = 24,
    signal_layers=(1,),
    strength: float = 5.0,
    noise: float = 0.5,
    seed: int = 0,
    task: str = "sraven",
    model_name: str = "hyla",
    absent_terms_in: dict[str, tuple[int, ...]] | None = None,
    labels_of_split: dict[str, dict[str, np.ndarray]] | None = None,
    constant_layers=(),
    planted=("rule", "term_present", "negation_bits"),
    rule_weights=None,
    selector: dict | None = None,
):
    """Write a codes file; returns its path. Keyword arguments shape the planted signal; `selector`
    (name, variant) is recorded as extraction records it."""
    n_per_split = n_per_split or {"train": 400, "ood": 400}
    rng = np.random.default_rng(seed)
    sites = [Site(layer, 10 + query, 5) for layer in layers for query in range(sites_per_layer)]
    n_negation_bits = int(np.prod(NEGATION_SHAPE))
    assert n_heads >= N_RULES + N_TERMS + n_negation_bits, "too few heads for the planted layout"
    task_config = {"name": task, "n_variables": 3} if task == "fuzzy_logic" else {"name": task}
    metadata = {"model_name": model_name, "task_config": task_config, "model_config": {"attention": model_name}}
    if task in task_names():  # what extraction records about the task
        described = get_task(**task_config)
        metadata |= {"task_analysis": described.analysis.to_dict(), "value_names": described.value_names(),
                     "column_names": described.column_names(),
                     "split_descriptions": getattr(described, "split_descriptions", {})}
    if selector is not None:
        metadata["selector"] = {**selector, "sites": [[s.layer, s.query, s.key] for s in sites]}
    with CodeWriter(path, sites, n_heads=n_heads, metadata=metadata) as writer:
        for split, n in n_per_split.items():
            if labels_of_split and split in labels_of_split:
                labels = labels_of_split[split]
            else:
                labels = make_labels(rng, n, (absent_terms_in or {}).get(split, ()), rule_weights)
            n = len(labels["rule"])
            codes = {}
            for site in sites:
                values = noise * rng.normal(size=(n, n_heads))
                if site.layer in signal_layers:
                    if "rule" in planted:
                        values[np.arange(n), labels["rule"]] += strength
                    if "term_present" in planted:
                        values[:, N_RULES:N_RULES + N_TERMS] += strength * labels["term_present"]
                    if "negation_bits" in planted:
                        values[:, N_RULES + N_TERMS:N_RULES + N_TERMS + n_negation_bits] += (
                            strength * labels["negation_bits"].reshape(n, -1)
                        )
                if site.layer in constant_layers:
                    values = np.full((n, n_heads), 0.125)
                codes[site] = values.astype(np.float32)
            writer.append(codes=codes, labels=labels, split=split, prediction=rng.random((n, 2)),
                          target=labels["target"])
    return path
