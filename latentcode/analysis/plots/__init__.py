"""Figures of latent codes: embeddings, similarity heatmaps, raw code samples, probe scores.

Every function takes an output path stem (``figures/hyla_tsne`` -> ``figures/hyla_tsne.png``)
and ``formats`` (any of `FORMATS`), and returns the paths it wrote. Figures are titled with the
model, layer, split and label, and have labelled axes. Integer labels are drawn as categories
(a palette and a legend), others with a colour bar; SRAVEN rule labels are named by their rules.

One module per figure (`embedding`, `heatmap`, `samples`, `probe_scores`), with what they share
in `figure` (making and saving a figure without pyplot) and `colours`.
"""

from latentcode.analysis.plots.embedding import plot_embedding
from latentcode.analysis.plots.figure import FORMATS
from latentcode.analysis.plots.heatmap import plot_similarity
from latentcode.analysis.plots.probe_scores import plot_probe_scores
from latentcode.analysis.plots.samples import plot_code_samples

__all__ = ["FORMATS", "plot_code_samples", "plot_embedding", "plot_probe_scores", "plot_similarity"]
