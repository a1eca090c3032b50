"""How fast `LogisticProbe` chooses C, against scikit-learn's own search doing the same.

`LogisticProbe` walks its grid of C by hand: each fold standardizes once and warm-starts each fit
from the previous C's solution, and keeps the out-of-fold predictions at the chosen C. The
scikit-learn equivalent is `GridSearchCV` over ``Pipeline(StandardScaler, LogisticRegression)`` on
the same stratified folds, then `cross_val_predict` at the chosen C for the out-of-fold
predictions. This times both (one BLAS thread, as `decode` fits; interleaved, median of repeats)
on Gaussian codes with a weak planted class signal, and says whether they chose the same C and
how far apart their cross-validation scores and out-of-fold probabilities are.

    PYTHONPATH=. python benchmarks/bench_probes.py [--n 4096] [--features 16] [--classes 10] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, StratifiedKFold, cross_val_predict
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from latentcode.analysis.probes import DEFAULT_CS, LogisticProbe


def planted_codes(n: int, n_features: int, n_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes ``[n, n_features]``: a class mean of scale 0.5 plus unit noise (accuracy well below 1,
    so that C matters); labels ``[n]`` uniform over the classes."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, n)
    return 0.5 * rng.normal(size=(n_classes, n_features))[labels] + rng.normal(size=(n, n_features)), labels


def _pipeline(C: float = 1.0) -> Pipeline:
    return Pipeline([("standardize", StandardScaler()),
                     ("logistic", LogisticRegression(C=C, solver="newton-cg", max_iter=1000))])


def scikit_learn_search(codes: np.ndarray, labels: np.ndarray, cv: int, seed: int):
    """`GridSearchCV` for C, then the out-of-fold probabilities at it: what `LogisticProbe.fit` computes."""
    folds = StratifiedKFold(n_splits=cv, shuffle=True, random_state=seed)
    search = GridSearchCV(_pipeline(), {"logistic__C": list(DEFAULT_CS)}, scoring="accuracy", cv=folds, n_jobs=1)
    search.fit(codes, labels)
    out_of_fold = cross_val_predict(_pipeline(search.best_params_["logistic__C"]), codes, labels, cv=folds,
                                    method="predict_proba")
    return search, out_of_fold


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--cv", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()

    codes, labels = planted_codes(arguments.n, arguments.features, arguments.classes, arguments.seed)
    print(f"python {platform.python_version()}, {os.cpu_count()} CPU cores, load average "
          f"{os.getloadavg()[0]:.1f}; codes {arguments.n} x {arguments.features}, {arguments.classes} classes, "
          f"{arguments.cv} folds, C grid {list(DEFAULT_CS)}")
    seconds = {"LogisticProbe": [], "GridSearchCV + cross_val_predict": []}
    with threadpool_limits(limits=1):
        for _ in range(arguments.repeats):
            start = time.perf_counter()
            probe = LogisticProbe(cv=arguments.cv, random_state=arguments.seed).fit(codes, labels)
            seconds["LogisticProbe"].append(time.perf_counter() - start)
            start = time.perf_counter()
            search, out_of_fold = scikit_learn_search(codes, labels, arguments.cv, arguments.seed)
            seconds["GridSearchCV + cross_val_predict"].append(time.perf_counter() - start)
    for name, times in seconds.items():
        print(f"  {name:<34} {statistics.median(times):6.2f} s  (median of {arguments.repeats}; "
              f"min {min(times):.2f}, max {max(times):.2f})")
    ratio = statistics.median(seconds["GridSearchCV + cross_val_predict"]) / statistics.median(seconds["LogisticProbe"])
    print(f"  scikit-learn's search takes {ratio:.1f} x as long")
    print(f"  chosen C: LogisticProbe {probe.C_}, GridSearchCV {search.best_params_['logistic__C']}")
    score_gap = np.abs(probe.cv_scores_ - search.cv_results_["mean_test_score"]).max()
    print(f"  largest difference of mean validation accuracy over the grid: {score_gap:.2e}")
    print(f"  out-of-fold probabilities: largest difference {np.abs(probe.validation_probabilities_ - out_of_fold).max():.2e}, "
          f"same predicted class for {np.mean(probe.validation_predictions_ == search.classes_[out_of_fold.argmax(1)]):.4f}"
          " of examples (warm-started fits stop within the solver's tolerance of the cold ones)")


if __name__ == "__main__":
    main()
