"""Where the viewer opens: on the layer whose codes vary most over the shown instances (or where the
probe table given decodes best), at that layer's most varying (query, key) pair; and which layers have
the same code for every instance, which the page names. The codes are made here, so which layer varies
most is known without the viewer."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from latentcode.analysis.viewer import build_viewer, viewer_data
from latentcode.store import CodeWriter, Site

N, HEADS, QUERY = 40, 3, 4
# Standard deviation of each layer's codes over the instances: layer 0 constant, layer 2 the most.
SCALE = {0: 0.0, 1: 0.05, 2: 0.5}


def write_codes(path):
    rng = np.random.default_rng(0)
    sites = [Site(layer, QUERY, key) for layer in SCALE for key in (0, 4)]
    codes = {}
    for site in sites:
        base = np.full((N, HEADS), 0.25, dtype=np.float32)
        # In layer 2 only key 0 varies: the page should open at the pair 4:0.
        scale = SCALE[site.layer] if (site.layer != 2 or site.key == 0) else 0.0
        codes[site] = (base + scale * rng.standard_normal((N, HEADS))).astype(np.float32)
    metadata = {"model_name": "toy", "model_config": {"attention": "toy"}, "task_config": {"name": "toy"}}
    with CodeWriter(path, sites, n_heads=HEADS, metadata=metadata) as writer:
        writer.append(codes=codes, labels={"colour": np.arange(N) % 3}, split="train")
    return codes


def test_the_viewer_opens_on_the_layer_and_pair_that_vary_most_and_names_constant_layers(tmp_path):
    codes = write_codes(tmp_path / "codes.h5")
    expected_spread = {layer: np.mean([codes[site].std(axis=0) for site in codes if site.layer == layer])
                       for layer in SCALE}
    data = viewer_data(tmp_path / "codes.h5")
    assert data["default_layer"] == max(expected_spread, key=expected_spread.get) == 2
    assert data["default_site"] == f"{QUERY}:0"
    assert data["constant_layers"] == [0]
    for layer, value in expected_spread.items():
        assert abs(data["layer_spread"][str(layer)] - value) < 1e-4


def test_with_a_probe_table_the_viewer_opens_where_the_probe_decodes_best(tmp_path):
    write_codes(tmp_path / "codes.h5")
    table = pd.DataFrame({"layer": [0, 1, 2], "metric": ["accuracy"] * 3, "value": [0.3, 0.9, 0.6]})
    page = build_viewer(tmp_path / "codes.h5", probe_tables={"colour probe": table}).html
    data = json.loads(re.search(r'<script type="application/json" id="viewer-data">(.*?)</script>', page, re.S)
                      .group(1).replace("<\\/", "</"))
    assert data["default_layer"] == 1
    assert "colour probe" in data["default_layer_reason"] and "0.900" in data["default_layer_reason"]
    assert 'id="layer-note"' in page
