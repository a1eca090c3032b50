"""Linear probes on latent codes: decode a label from the codes of each layer, beside baselines.

`decode` fits per layer (logistic; `regress`: ridge, R²) on the fitting split, chooses the layer on
its out-of-fold ``validation`` score, never on the test split, and scores every layer on the test
split beside trivial baselines; the result is a tidy ``pandas.DataFrame`` with the columns of
`COLUMNS`. The fitting, the layer choice, the metrics, the baselines and the undefined scores are
described in docs/how-to/probe.md.

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
