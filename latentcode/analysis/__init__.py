"""Analysis of a codes file: linear probes, embeddings, similarity heatmaps and figures.

Reads the HDF5 files of `latentcode.store`; numpy, pandas, scikit-learn, umap-learn and
matplotlib only, never torch, so that probing and plotting a file is fast and light.

>>> from latentcode.analysis import decode, headline_lines, plot_probe_scores, write_table
>>> table = decode(["hyla.h5", "softmax.h5"], "rule", fit_split="train", test_split="ood")
>>> write_table(table, "results/rule_decoding")          # .csv and .json
>>> plot_probe_scores(table, "figures/rule_decoding")    # [Path("figures/rule_decoding.png")]
>>> print("\n".join(headline_lines(table)))    # the layer chosen on the fit split, beside baselines
"""

from latentcode.analysis.embed import DEFAULT_MAX_POINTS, Embedding, embed, subsample
from latentcode.analysis.labels import available_labels, parse_label_spec, select_label, value_names
from latentcode.analysis.plots import (
    FORMATS,
    plot_code_samples,
    plot_embedding,
    plot_probe_scores,
    plot_similarity,
)
from latentcode.analysis.probes import (
    COLUMNS,
    decode,
    headline_lines,
    headline_rows,
    regress,
    summary_rows,
    write_table,
)
from latentcode.analysis.similarity import Similarity, mean_code_similarity, similarity_of_means

__all__ = [
    "COLUMNS",
    "DEFAULT_MAX_POINTS",
    "FORMATS",
    "Embedding",
    "Similarity",
    "available_labels",
    "decode",
    "embed",
    "headline_lines",
    "headline_rows",
    "mean_code_similarity",
    "parse_label_spec",
    "plot_code_samples",
    "plot_embedding",
    "plot_probe_scores",
    "plot_similarity",
    "regress",
    "select_label",
    "similarity_of_means",
    "subsample",
    "summary_rows",
    "value_names",
    "write_table",
]
