"""`latentcode intervene`'s table carries bootstrap standard errors, and its bar chart shows them as
error bars with a legend naming its two bar colours and the dashed line."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from latentcode.intervention import ZeroAblate
from latentcode.intervention.effects import draw_effects, intervention_effects

RUN = Path(__file__).resolve().parents[2] / "models" / "fuzzy_logic-hyla"


def _table():
    rows = []
    for scope, after, after_se in [("all sites", 0.2, 0.03), ("l0_q1_k1", 0.7, 0.02), ("l1_q1_k1", 0.9, 0.01)]:
        for metric in ("accuracy", "loss"):
            rows.append({"model": "m", "task": "t", "split": "ood", "variant": "v", "n": 100, "edit": "ZeroAblate",
                         "scope": scope, "metric": metric, "before": 0.95, "after": after, "change": after - 0.95,
                         "before se": 0.02, "after se": after_se, "change se": 0.03})
    return pd.DataFrame(rows)


def test_each_panel_has_error_bars_of_the_tables_se_and_the_figure_a_legend_of_its_colours():
    figure = draw_effects(_table())
    for axis in figure.axes:
        bars = [container for container in axis.containers if hasattr(container, "errorbar")]
        assert len(bars) == 2  # all sites together (red), each site alone (orange)
        heights, half_widths = [], []
        for container in bars:
            caps_and_lines = container.errorbar.lines[2][0]  # the vertical error-bar segments
            for segment in caps_and_lines.get_segments():
                half_widths.append((segment[1, 1] - segment[0, 1]) / 2)
            heights += [patch.get_height() for patch in container.patches]
        assert heights == pytest.approx([0.2, 0.7, 0.9])
        assert half_widths == pytest.approx([0.03, 0.02, 0.01])
        assert [to_rgba(c.patches[0].get_facecolor()) for c in bars] == [to_rgba("tab:red"), to_rgba("tab:orange")]
        assert axis.get_legend() is None  # one legend for the figure, covering no bar
    (legend,) = figure.legends
    texts = [text.get_text() for text in legend.get_texts()]
    assert texts == ["without the edit (band: ± s.e.)", "with the edit, all sites together",
                     "with the edit, each site alone"]


@pytest.mark.skipif(not RUN.is_dir(), reason="shipped checkpoint models/fuzzy_logic-hyla is missing")
def test_the_bootstrap_se_of_an_accuracy_is_near_the_binomial_one():
    n = 200
    table = intervention_effects(RUN, ZeroAblate(heads=[0, 2]), n=n, batch_size=100)
    rows = table[table["metric"] == "accuracy"]
    for column in ("before", "after"):
        p = rows[column].to_numpy()
        binomial = np.sqrt(p * (1 - p) / n)  # independent: the s.e. of a fraction of n instances
        assert rows[f"{column} se"].to_numpy() == pytest.approx(binomial, rel=0.25, abs=0.004)
