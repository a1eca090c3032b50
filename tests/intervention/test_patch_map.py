"""The patching map of `latentcode patch`: 0 is white (not the light grey in the middle of RdBu_r),
a cell with no group is a grey the colour bar's label explains, and the title fits the figure."""

import argparse

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba

from latentcode.cli.patch import UNMEASURED, _draw, transfer_colormap


def test_zero_transfer_is_white_and_no_group_is_a_distinct_grey():
    colormap = transfer_colormap()
    assert colormap(0.5) == (1.0, 1.0, 1.0, 1.0)  # vmin = -limit, vmax = limit: 0 sits at 0.5
    assert colormap(np.nan) == to_rgba(UNMEASURED)
    ends = np.array([colormap(0.0)[:3], colormap(1.0)[:3]])
    assert ends[0, 2] > ends[0, 0] and ends[1, 0] > ends[1, 2]  # negative blue, positive red
    grey = np.array(to_rgba(UNMEASURED)[:3])
    assert np.all(np.abs(grey - 1.0) > 0.3)  # far from 0's white


def _heads_map(run_name):
    # layer 0 has heads 0 and 2 measured (head 1 missing: NaN), layer 1 all three at transfer 0
    table = pd.DataFrame({"layer": [0, 0, 1, 1, 1], "head": [0, 2, 0, 1, 2],
                          "transfer": [0.0, 0.3, 0.0, 0.0, -0.1]})
    args = argparse.Namespace(run=f"runs/{run_name}", split="ood", variant="unpermuted", grid="heads",
                              partition_grid=None, per_head=False)
    figure = _draw(table, args, summary={"n": 32, "prediction": 3})
    FigureCanvasAgg(figure).draw()
    return figure


def test_the_map_draws_zero_white_and_missing_cells_grey_and_says_so():
    figure = _heads_map("sraven-hyla")
    axis, bar = figure.axes
    image = axis.get_images()[0]
    rgba = image.cmap(image.norm(image.get_array()))
    assert tuple(rgba[1, 0]) == (1.0, 1.0, 1.0, 1.0)  # layer 1, head 0: transfer 0
    assert tuple(rgba[0, 1]) == to_rgba(UNMEASURED)  # layer 0, head 1: no group
    assert "grey: no group measured" in bar.get_ylabel()


def test_a_long_title_is_wrapped_inside_the_figure():
    figure = _heads_map("a-run-with-a-rather-long-name-" * 3)
    renderer = figure.canvas.get_renderer()
    extent = figure._suptitle.get_window_extent(renderer)
    width = figure.get_figwidth() * figure.dpi
    assert extent.x0 >= 0 and extent.x1 <= width, (extent, width)
    assert figure._suptitle.get_text().count("\n") >= 2
