"""The report explains itself: findings in brief, task, variants, sites, splits, where numbers come from."""

import html
import re
from pathlib import Path

import pandas as pd
import pytest

from latentcode.analysis.narrative import context_line, findings_paragraph
from latentcode.analysis.report import build_report
from latentcode.rundir import RunRecord
from latentcode.store import CodeFile
from latentcode.tasks.sraven import SRaven
from tests.analysis.test_synthetic import write_codes

SELECTOR = {"name": "sraven-rule", "variant": "unpermuted"}


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("codes")
    return [write_codes(folder / f"{name}.h5", model_name=name, seed=seed, n_per_split={"train": 240, "ood": 120},
                        constant_layers=(0,) if name == "hyla" else (), planted=("rule",), selector=SELECTOR)
            for seed, name in enumerate(("softmax", "hyla"))]


def _run(name, variant, final_metrics):
    """A run as `RunRecord.read` returns it, without training one."""
    config = {"train": {"variant": variant, "task": {"name": "sraven"}}}
    return RunRecord(Path(f"runs/{name}"), name, {"name": "sraven"}, {"headline_metric": "accuracy"}, config, [],
                     {"final_metrics": final_metrics})


def _text(page):
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", re.sub(r"<img[^>]*>", "", page))))


def test_report_of_codes_files_explains_itself(two_models, tmp_path):
    report = build_report(codes_files=two_models, out=tmp_path / "report.html", max_points=60, progress=False,
                          notes=["These models came from somewhere else."])
    page = report.path.read_text()
    text = _text(page)
    assert text.index("In brief") < text.index("What was analysed") < text.index("Decoding the sub-task")
    assert report.summary in text and "sraven-rule sites (query 10 → key 5, every layer)" in report.context
    assert "unpermuted variant" in report.context
    for split, description in SRaven.split_descriptions.items():
        if split in ("train", "ood"):
            assert description in text
    assert "train in-distribution rule multisets 240 probes fitted" in text, "split, meaning, codes, use"
    assert "ood held-out rule multisets, never trained on 120 probes scored, figures of codes" in text
    assert "These models came from somewhere else." in text and "Where the numbers come from" in text
    # One similarity heatmap for both models, and per model a tSNE and a samples grid.
    assert page.count("data:image/png;base64,") == 1 + 1 + 2 * 2
    assert page.count('class="caption"') >= 1 + 2 * 2
    # The summary quotes each model's best layer from the probe table.
    rows = report.probe_table[(report.probe_table["metric"] == "accuracy") & (report.probe_table["site"] == "all")]
    for model, model_rows in rows.groupby("model"):
        best = model_rows.loc[model_rows["value"].idxmax()]
        assert f"{model} {best['value']:.2f} (layer {int(best['layer'])}" in report.summary
    assert "The codes of hyla layer 0 are the same for every example" in report.summary


def test_findings_name_variants_and_splits_and_read_either_probe_table(two_models):
    code_files = [CodeFile(path) for path in two_models]
    runs = [_run("softmax", "unpermuted", {"ood": {"accuracy": 0.971}, "train": {"accuracy": 0.99}}),
            _run("hyla", None, {"ood": {"accuracy": 0.949}})]
    table = pd.DataFrame({
        "model": ["softmax", "softmax", "hyla", "hyla"], "layer": [0, 1, 0, 1], "site": "all", "label": "rule",
        "metric": "accuracy", "value": [0.9, 0.5, 0.3, 0.6], "shuffled_labels": [0.12, 0.13, 0.125, 0.11],
        "selected": [False, True, False, True],
    })
    summary = findings_paragraph(runs, code_files, table, "train", "ood")
    assert "trained and evaluated on the unpermuted variant and the task's default variant" in summary
    assert "on ood (held-out rule multisets, never trained on), softmax 0.97 and hyla 0.95" in summary
    assert "0.99" not in summary, "the training split's metric is not a result"
    # The layer chosen on validation is quoted, not the best test score (softmax layer 0, 0.90).
    assert "accuracy at the layer chosen on validation is hyla 0.60 (layer 1; shuffled-label control 0.11)" in summary
    assert "softmax 0.50 (layer 1; shuffled-label control 0.13)" in summary
    older = table.drop(columns="selected").rename(columns={"shuffled_labels": "chance"})
    assert "at the best layer is softmax 0.90 (layer 0; shuffled-label control 0.12)" in findings_paragraph(
        runs, code_files, older, "train", "ood")
    weak = table.assign(value=[0.1, 0.12, 0.1, 0.1])
    assert "For softmax and hyla that is no better than the control." in findings_paragraph(
        runs, code_files, weak, "train", "ood")
    assert context_line(runs, code_files).startswith("sraven: trained and evaluated on the unpermuted variant")
