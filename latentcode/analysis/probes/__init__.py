"""Linear probes on latent codes: decode a label from the codes of each layer, beside baselines.

The paper fits a logistic regression on the latent codes of in-distribution tasks and scores it on
tasks of unseen composition. `decode` does that per layer (all sites of a layer concatenated, or
each site alone), for one codes file or several models side by side; `regress` is the ridge
counterpart for continuous labels (R²).

Fitting (`estimators`): a scikit-learn ``Pipeline(StandardScaler, estimator)`` whose regularization
is chosen by cross-validation on the fitting split only: C by accuracy for a categorical label, by
F1 for each column of a multi-hot one; alpha by R². One BLAS thread: at these sizes more only cost.

Choosing the layer, never on the test split. ``validation`` is the score, on the fitting split,
of the probe's out-of-fold predictions at the chosen regularization (every example predicted by
the fold that did not train on it). In each file one layer (with ``per_site``: one layer and site)
is ``selected``: the best ``validation`` of the table's headline metric (the first of
`HEADLINE_METRICS` it has; ties: the earlier layer). ``value`` is the test score, kept for every
layer for plots; the result to report is the ``value`` of the selected layer (`headline_rows`).

Metrics (`latentcode.analysis.scores`): categorical labels ``[N]`` get one multinomial probe,
metrics ``accuracy``, ``balanced_accuracy``, ``macro_f1``; multi-hot 0/1 labels ``[N, C]`` one
binary probe per column, metrics ``f1``, ``balanced_accuracy`` and ``auroc`` per column (label
``term_present[j]``) and their means ``mean_f1``, ``mean_balanced_accuracy``, ``mean_auroc``
(label ``term_present``); F1 alone can sit near zero for every baseline, so it is never the
headline. Ridge: ``r2`` per output, ``mean_r2``.

Baselines beside every score, on the same test split (`latentcode.analysis.baselines`): ``majority``,
``prevalence_random``, ``all_present`` (multi-hot labels; NaN where a baseline does not apply) and
``shuffled_labels`` (a probe fitted exactly as the real one to the fitting labels permuted by whole
rows, ``np.random.default_rng(seed).permutation``). ``strongest_baseline`` names the highest
of them, ``strongest_baseline_value`` is its score and ``beats_baselines`` says whether ``value``
is above it (NA where either is undefined).

Undefined scores are NaN and the ``note`` column says why. Labels whose values are missing from
one split:

- categorical: test classes that never occur in the fitting split cannot be predicted; they count
  as errors and the note names them.
- multi-hot: a column that never (or always) takes the value 1 in the fitting split gets no probe;
  it is predicted as that constant, and the note says so. A column with a single value in the test
  split has no balanced accuracy or AUROC (and no F1 where it is all 0 and none is predicted).
  A mean averages the columns where its metric is defined on the test split (the note says how
  many), and its baselines average the same columns; its ``validation`` averages the columns where
  the metric is defined on the fitting split.

The result is a tidy ``pandas.DataFrame`` with the columns of `COLUMNS`; `write_table` writes it as
CSV and JSON.

One module each: `estimators` (the scikit-learn probes), `inputs` (labels and codes, checked),
`rows` (a probe site's rows), `table` (the table, its summaries and files) and `decoding`
(`decode`, `regress`).
"""

from latentcode.analysis.probes.decoding import decode, regress
from latentcode.analysis.probes.estimators import (
    DEFAULT_ALPHAS,
    DEFAULT_CS,
    LogisticProbe,
    MultiHotProbe,
    ProbeError,
    RidgeProbe,
)
from latentcode.analysis.probes.table import (
    COLUMNS,
    HEADLINE_METRICS,
    headline_lines,
    headline_rows,
    summary_rows,
    write_table,
)

__all__ = ["COLUMNS", "DEFAULT_ALPHAS", "DEFAULT_CS", "HEADLINE_METRICS", "LogisticProbe", "MultiHotProbe",
           "ProbeError", "RidgeProbe", "decode", "headline_lines", "headline_rows", "regress", "summary_rows",
           "write_table"]
