"""Analysis of a codes file: linear probes, embeddings, similarity heatmaps and figures.

Reads the HDF5 files of `latentcode.store`; numpy, pandas, scikit-learn, umap-learn and
matplotlib only, never torch, so that probing and plotting a file is fast and light. Names load
on first use (see `latentcode.lazy`): importing the package loads none of pandas, scikit-learn
and matplotlib, so a command that only checks its arguments pays for none of them.

>>> from latentcode.analysis import decode, headline_lines, plot_probe_scores, write_table
>>> table = decode(["hyla.h5", "softmax.h5"], "rule", fit_split="train", test_split="ood")
>>> write_table(table, "results/rule_decoding")          # .csv and .json
>>> plot_probe_scores(table, "figures/rule_decoding")    # [Path("figures/rule_decoding.png")]
>>> print("\n".join(headline_lines(table)))    # the layer chosen on the fit split, beside baselines
"""

# `embed` is also the name of its module, and the first import of a submodule sets the package's
# attribute of that name to the module: bound here (embed.py loads numpy and h5py only), the
# function stays `latentcode.analysis.embed` whichever of the two is imported first.
from latentcode.analysis.embed import embed  # noqa: F401
from latentcode.lazy import lazy_exports

# Each public name and the module that defines it; loaded on first use.
_WHERE = {
    "DEFAULT_MAX_POINTS": "latentcode.analysis.embed",
    "Embedding": "latentcode.analysis.embed",
    "embed": "latentcode.analysis.embed",
    "subsample": "latentcode.analysis.embed",
    "available_labels": "latentcode.analysis.labels",
    "parse_label_spec": "latentcode.analysis.labels",
    "select_label": "latentcode.analysis.labels",
    "value_names": "latentcode.analysis.labels",
    "FORMATS": "latentcode.analysis.plots",
    "plot_code_samples": "latentcode.analysis.plots",
    "plot_embedding": "latentcode.analysis.plots",
    "plot_probe_scores": "latentcode.analysis.plots",
    "plot_similarity": "latentcode.analysis.plots",
    "COLUMNS": "latentcode.analysis.probes",
    "decode": "latentcode.analysis.probes",
    "headline_lines": "latentcode.analysis.probes",
    "headline_rows": "latentcode.analysis.probes",
    "regress": "latentcode.analysis.probes",
    "summary_rows": "latentcode.analysis.probes",
    "write_table": "latentcode.analysis.probes",
    "Similarity": "latentcode.analysis.similarity",
    "mean_code_similarity": "latentcode.analysis.similarity",
    "similarity_of_means": "latentcode.analysis.similarity",
    "head_separation": "latentcode.analysis.plots.relations",
    "plot_attribution": "latentcode.analysis.plots.relations",
    "plot_head_separation": "latentcode.analysis.plots.relations",
    "plot_relation_pca": "latentcode.analysis.plots.relations",
    "decode_relations": "latentcode.analysis.relation_decoding",
    "selected_rows": "latentcode.analysis.relation_decoding",
    "RELATIONS": "latentcode.analysis.token_relations",
    "composition_counts": "latentcode.analysis.topography",
    "mean_codes_by_task": "latentcode.analysis.topography",
    "topographic_similarity": "latentcode.analysis.topography",
    "Viewer": "latentcode.analysis.viewer",
    "build_viewer": "latentcode.analysis.viewer",
    "write_viewer": "latentcode.analysis.viewer",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
