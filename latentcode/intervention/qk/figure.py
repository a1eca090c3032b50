"""The figure of `latentcode qk`: the mean terms of one head as a query-side x key-side heatmap (a
signed colormap, white at 0, one colour scale symmetric about 0), the query-side marginals as bars to its
left and the key-side marginals as bars above it, in the score's units."""

from __future__ import annotations

import numpy as np


def draw(query_names: list[str], key_names: list[str], mean_terms: np.ndarray, title: str, mean_score: float):
    """A matplotlib figure of `mean_terms` `[query component, key component]` (rows `query_names`,
    columns `key_names`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    n_rows, n_columns = mean_terms.shape
    width, height = 3.0 + 0.42 * n_columns, 2.6 + 0.34 * n_rows
    figure = plt.figure(figsize=(max(width, 7.0), max(height, 5.0)))
    grid = figure.add_gridspec(2, 3, width_ratios=[1.3, max(n_columns, 2) * 0.42, 0.18],
                               height_ratios=[1.2, max(n_rows, 2) * 0.34], wspace=0.05, hspace=0.05)
    heat = figure.add_subplot(grid[1, 1])
    limit = float(np.abs(mean_terms).max()) or 1.0
    image = heat.imshow(mean_terms, cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -limit, limit), aspect="auto")
    heat.set_xticks(range(n_columns), key_names, rotation=90, fontsize=8)
    heat.set_yticks([])
    heat.set_xlabel("key-side component")
    colorbar = figure.colorbar(image, cax=figure.add_subplot(grid[1, 2]))
    colorbar.set_label("mean term T_ij (score units)")

    def colours(values):
        return ["#b2182b" if value > 0 else "#2166ac" for value in values]

    query_marginal, key_marginal = mean_terms.sum(1), mean_terms.sum(0)
    left = figure.add_subplot(grid[1, 0], sharey=heat)
    left.barh(range(n_rows), query_marginal, color=colours(query_marginal))
    left.axvline(0, color="black", linewidth=0.6)
    left.invert_xaxis()
    left.set_yticks(range(n_rows), query_names, fontsize=8)
    left.set_ylabel("query-side component")
    left.set_xlabel("query marginal")
    top = figure.add_subplot(grid[0, 1], sharex=heat)
    top.bar(range(n_columns), key_marginal, color=colours(key_marginal))
    top.axhline(0, color="black", linewidth=0.6)
    top.tick_params(labelbottom=False)
    top.set_ylabel("key marginal")
    figure.text(0.02, 0.97, f"mean score {mean_score:.3f} = sum of all terms", fontsize=8, va="top")
    figure.suptitle(title, fontsize=10, x=0.55)
    return figure
