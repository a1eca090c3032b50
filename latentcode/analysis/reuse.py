"""The code-reuse score: are the latent codes of unseen compositions built from the codes their
constituents have in the training compositions?

A task with held-out compositions (fuzzy logic: a function is a set of K terms, the `ood` split holds
unseen sets of seen terms) gives, per instance, a code vector ``codes [N, D]`` (the codes of every
recorded site and layer side by side) and its constituents as a multi-hot row ``constituents [N, C]``.
Three parts, each beside its strongest trivial baseline, fitted on the training compositions and
scored on the unseen ones:

(a) decodability   a `MultiHotProbe` (one logistic probe per constituent, the toolkit's probe)
                   fitted on training codes; mean balanced accuracy over the constituents that
                   vary on the unseen split. Baselines: 0.5 (a constant guess) and the same probe
                   fitted to shuffled labels.
(b) reconstruction the mean code of each composition ``c_s [D]`` (standardized by the training
                   compositions) predicted as ``W m_s + b`` from its multi-hot ``m_s`` (ridge, its
                   penalty by leave-one-out on the training compositions), i.e. as a sum of one code
                   per constituent; pooled R² over the unseen compositions. Baselines: the mean
                   training code (R² <= 0) and the same map fitted with the constituents of the
                   training compositions shuffled among them (mean over `n_shuffles`).
(c) transplant     codes of a training composition that shares all constituents but one with an
                   unseen one, patched into it, make the model compute the training composition's
                   function: follow (different donor) beside follow (third donor), the transfer
                   metric of `latentcode.intervention.transfer` (measured there, with a model;
                   `transplant_part` turns its numbers into a part).

Each part's *excess* over its baseline is ``clip((value - baseline) / (1 - baseline), 0, 1)``, the
share of the way from the baseline to a perfect score (1 for all three), where an R² baseline below 0
counts as 0 (a constant code that is the unseen compositions' own mean scores 0). The combined
score is the mean excess over the parts measured: 0 where no part beats its baseline, 1 where the
codes of unseen compositions are decoded, reconstructed and transplanted perfectly.

    from latentcode.analysis.reuse import decodability_part, reconstruction_part, combined_score
    parts = [decodability_part(codes_fit, terms_fit, codes_test, terms_test),
             reconstruction_part(codes_fit, terms_fit, codes_test, terms_test)]
    score = combined_score(parts)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from latentcode.analysis.topography import mean_codes_by_task
from latentcode.errors import LatentcodeError

__all__ = ["ReusePart", "ReuseError", "combined_score", "composition_means", "decodability_part",
           "reconstruction_part", "transplant_part"]

RIDGE_ALPHAS = (1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0, 1000.0)


class ReuseError(LatentcodeError, ValueError):
    """Codes or constituents the reuse score cannot be computed from; says which and why."""


@dataclass(frozen=True)
class ReusePart:
    """One part of the score: its value, its strongest baseline (and that baseline's name), the
    excess (module docstring) and how many instances / compositions it was measured on."""

    part: str
    metric: str
    value: float
    baseline: float
    baseline_name: str
    n_test: int
    n_test_compositions: int
    note: str = ""

    @property
    def excess(self) -> float:
        floor = max(self.baseline, 0.0) if self.metric == "r2" else self.baseline
        if not np.isfinite(self.value) or not np.isfinite(floor) or floor >= 1:
            return float("nan")
        return float(np.clip((self.value - floor) / (1.0 - floor), 0.0, 1.0))

    def row(self) -> dict:
        return {**asdict(self), "excess": self.excess}


def _check(codes: np.ndarray, constituents: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    codes, constituents = np.asarray(codes, dtype=np.float64), np.asarray(constituents)
    if codes.ndim != 2 or constituents.ndim != 2 or len(codes) != len(constituents) or len(codes) == 0:
        raise ReuseError(f"{name}: codes {list(codes.shape)} and constituents {list(constituents.shape)} must be "
                         "[N, D] and [N, C] with the same N >= 1")
    if not np.isin(constituents, (0, 1)).all():
        raise ReuseError(f"{name}: constituents must be a 0/1 multi-hot [N, C]; got values "
                         f"{np.unique(constituents)[:5].tolist()}")
    if not np.isfinite(codes).all():
        raise ReuseError(f"{name}: codes contain NaN or inf in {int((~np.isfinite(codes)).any(1).sum())} rows")
    return codes, constituents.astype(np.int64)


def _check_pair(codes_fit, constituents_fit, codes_test, constituents_test):
    codes_fit, constituents_fit = _check(codes_fit, constituents_fit, "fit")
    codes_test, constituents_test = _check(codes_test, constituents_test, "test")
    if codes_fit.shape[1] != codes_test.shape[1] or constituents_fit.shape[1] != constituents_test.shape[1]:
        raise ReuseError(f"fit and test differ in width: codes {codes_fit.shape[1]} vs {codes_test.shape[1]}, "
                         f"constituents {constituents_fit.shape[1]} vs {constituents_test.shape[1]}")
    return codes_fit, constituents_fit, codes_test, constituents_test


def composition_means(codes: np.ndarray, constituents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(mean code per composition [S, D], its multi-hot [S, C])``, compositions being the distinct
    rows of ``constituents`` (in sorted order)."""
    codes, constituents = _check(codes, constituents, "codes")
    compositions, which = np.unique(constituents, axis=0, return_inverse=True)
    return mean_codes_by_task(codes, np.asarray(which).reshape(-1))[1], compositions


def decodability_part(codes_fit, constituents_fit, codes_test, constituents_test, *, seed: int = 0,
                      cv: int = 3) -> ReusePart:
    """Part (a): a probe per constituent fitted on the training compositions, scored on the unseen
    ones (module docstring)."""
    from sklearn.metrics import balanced_accuracy_score

    from latentcode.analysis.probes.estimators import MultiHotProbe

    codes_fit, constituents_fit, codes_test, constituents_test = _check_pair(
        codes_fit, constituents_fit, codes_test, constituents_test)
    varying = (constituents_test.min(axis=0) == 0) & (constituents_test.max(axis=0) == 1)
    n_compositions = len(np.unique(constituents_test, axis=0))
    if not varying.any():
        return ReusePart("decodability", "balanced_accuracy", float("nan"), 0.5, "constant guess", len(codes_test),
                         n_compositions, "no constituent varies on the test split")

    def score(labels_fit: np.ndarray) -> float:
        probe = MultiHotProbe(cv=cv, random_state=seed).fit(codes_fit, labels_fit)
        predicted = probe.predict(codes_test)
        return float(np.mean([balanced_accuracy_score(constituents_test[:, column], predicted[:, column])
                              for column in np.flatnonzero(varying)]))

    value = score(constituents_fit)
    shuffled = score(constituents_fit[np.random.default_rng([seed, 1]).permutation(len(constituents_fit))])
    baseline, name = (shuffled, "shuffled labels") if shuffled > 0.5 else (0.5, "constant guess")
    return ReusePart("decodability", "balanced_accuracy", value, baseline, name, len(codes_test), n_compositions,
                     f"{int(varying.sum())} constituents vary on the test split; shuffled-label probe {shuffled:.3f}")


def _pooled_r2(truth: np.ndarray, predicted: np.ndarray) -> float:
    total = ((truth - truth.mean(axis=0)) ** 2).sum()
    return float(1.0 - ((truth - predicted) ** 2).sum() / total) if total > 0 else float("nan")


def reconstruction_part(codes_fit, constituents_fit, codes_test, constituents_test, *, seed: int = 0,
                        n_shuffles: int = 20) -> ReusePart:
    """Part (b): the mean codes of the unseen compositions predicted linearly from their constituents,
    the map fitted on the training compositions (module docstring)."""
    from sklearn.linear_model import RidgeCV

    codes_fit, constituents_fit, codes_test, constituents_test = _check_pair(
        codes_fit, constituents_fit, codes_test, constituents_test)
    means_fit, compositions_fit = composition_means(codes_fit, constituents_fit)
    means_test, compositions_test = composition_means(codes_test, constituents_test)
    n_test = len(compositions_test)
    scale = means_fit.std(axis=0)
    varying = scale > 1e-12 * max(1.0, float(np.abs(means_fit).max()))
    if len(compositions_fit) < 3 or n_test < 2 or not varying.any():
        why = (f"{len(compositions_fit)} training and {n_test} test compositions (needs 3 and 2)"
               if varying.any() else "the mean codes are the same for every training composition")
        return ReusePart("reconstruction", "r2", float("nan"), float("nan"), "-", len(codes_test), n_test, why)
    center = means_fit.mean(axis=0)
    fit = (means_fit[:, varying] - center[varying]) / scale[varying]
    test = (means_test[:, varying] - center[varying]) / scale[varying]

    def r2_with(constituents: np.ndarray) -> float:
        ridge = RidgeCV(alphas=RIDGE_ALPHAS).fit(constituents, fit)
        return _pooled_r2(test, ridge.predict(compositions_test))

    value = r2_with(compositions_fit)
    rng = np.random.default_rng([seed, 2])
    shuffled = float(np.mean([r2_with(compositions_fit[rng.permutation(len(compositions_fit))])
                              for _ in range(n_shuffles)]))
    mean_code = _pooled_r2(test, np.zeros_like(test))  # the training compositions' mean code
    baseline, name = (shuffled, "shuffled constituents") if shuffled > mean_code else (mean_code, "mean training code")
    return ReusePart("reconstruction", "r2", value, baseline, name, len(codes_test), n_test,
                     f"{len(compositions_fit)} training compositions, {int(varying.sum())} code dimensions; "
                     f"shuffled constituents {shuffled:.3f}, mean training code {mean_code:.3f}")


def transplant_part(follow_different: np.ndarray, follow_third: np.ndarray, n_test_compositions: int,
                    note: str = "") -> ReusePart:
    """Part (c) from the per-pair follow indicators ``[n]`` of a `transfer_sweep` group (the donor
    composition's answer followed, 0/1) under the different donor and under the third donor."""
    follow_different = np.asarray(follow_different, dtype=np.float64)
    follow_third = np.asarray(follow_third, dtype=np.float64)
    if follow_different.shape != follow_third.shape or follow_different.ndim != 1:
        raise ReuseError(f"follow_different {list(follow_different.shape)} and follow_third "
                         f"{list(follow_third.shape)} must be the same [n]")
    if len(follow_different) == 0:
        return ReusePart("transplant", "follow", float("nan"), float("nan"), "third donor", 0, n_test_compositions,
                         note or "no pairs")
    return ReusePart("transplant", "follow", float(follow_different.mean()), float(follow_third.mean()),
                     "third donor", len(follow_different), n_test_compositions, note)


def combined_score(parts: Sequence[ReusePart]) -> float:
    """The mean excess of the parts over their baselines (NaN parts left out; NaN if none is left)."""
    excesses = [part.excess for part in parts if np.isfinite(part.excess)]
    return float(np.mean(excesses)) if excesses else float("nan")
