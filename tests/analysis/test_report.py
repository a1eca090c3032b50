"""The report explains itself: findings in brief, task, variants, sites, splits, where numbers come from."""

import html
import re
from pathlib import Path

import pandas as pd
import pytest

from latentcode.analysis.narrative import context_line, findings_paragraph
from latentcode.analysis.probes import headline_rows
from latentcode.analysis.report import build_report
from latentcode.rundir import RunRecord
from latentcode.store import CodeFile
from latentcode.tasks.sraven import SRaven
from tests.analysis.synthetic import write_codes

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
    assert text.index("Headline") < text.index("In brief") < text.index("What was analysed") < text.index(
        "Decoding the sub-task")
    # The headline: one row per model, its score beside the strongest baseline and the gap, from the table.
    headline = page.split("<h2>Headline</h2>", 1)[1].split("<h2>", 1)[0]
    assert "strongest baseline" in headline and "gap" in headline and "probe scores" in headline
    for _, row in headline_rows(report.probe_table).iterrows():
        assert f"<td>{row['value'] - row['strongest_baseline_value']:.3f}</td>" in headline
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
    # The summary quotes each model's selected layer (the best validation score) from the probe table.
    rows = report.probe_table[(report.probe_table["metric"] == "accuracy") & (report.probe_table["site"] == "all")]
    for model, model_rows in rows.groupby("model"):
        chosen = model_rows.loc[model_rows["validation"].idxmax()]
        assert f"{model} {chosen['value']:.2f} (layer {int(chosen['layer'])}; strongest baseline" in report.summary
    assert "The codes of hyla layer 0 are the same for every example" in report.summary


def test_findings_name_variants_splits_and_the_layer_chosen_on_validation(two_models):
    code_files = [CodeFile(path) for path in two_models]
    runs = [_run("softmax", "unpermuted", {"ood": {"accuracy": 0.971}, "train": {"accuracy": 0.99}}),
            _run("hyla", None, {"ood": {"accuracy": 0.949}})]
    table = pd.DataFrame({
        "model": ["softmax", "softmax", "hyla", "hyla"], "file": ["s.h5", "s.h5", "h.h5", "h.h5"],
        "layer": [0, 1, 0, 1], "site": "all", "label": "rule", "metric": "accuracy",
        "value": [0.9, 0.5, 0.3, 0.6], "selected": [False, True, False, True],
        "strongest_baseline": "shuffled_labels", "strongest_baseline_value": [0.12, 0.13, 0.125, 0.11],
        "beats_baselines": True,
    })
    summary = findings_paragraph(runs, code_files, table, "train", "ood")
    assert "trained and evaluated on the unpermuted variant and the task's default variant" in summary
    assert "on ood (held-out rule multisets, never trained on), softmax 0.97 and hyla 0.95" in summary
    assert "0.99" not in summary, "the training split's metric is not a result"
    # The layer chosen on validation is quoted, not the best test score (softmax layer 0, 0.90).
    assert ("at the layer chosen on train (never on the test split), accuracy is hyla 0.60 (layer 1; strongest "
            "baseline shuffled_labels 0.11) and softmax 0.50 (layer 1; strongest baseline shuffled_labels 0.13)"
            ) in summary
    weak = table.assign(beats_baselines=[True, False, True, True])
    assert "For softmax that is not above the strongest baseline." in findings_paragraph(
        runs, code_files, weak, "train", "ood")
    assert context_line(runs, code_files).startswith("sraven: trained and evaluated on the unpermuted variant")


EVIL = "<script>alert(1)</script>"


@pytest.mark.parametrize("test_split", [EVIL, "ood"], ids=["probed", "no probe: split missing"])
def test_text_from_files_and_arguments_is_escaped(tmp_path, test_split):
    """Split names, --fit-split/--test-split values, model names, titles and notes come from files and
    arguments: a split named <script>... used to land in the page as is (issue 23)."""
    path = write_codes(tmp_path / "evil.h5", model_name=f"hyla{EVIL}", n_per_split={"train": 120, EVIL: 60},
                       planted=("rule",), selector=SELECTOR)
    report = build_report(codes_files=[path], out=tmp_path / "report.html", test_split=test_split, methods=(),
                          title=f"report {EVIL}", notes=[f"note {EVIL}"], progress=False)
    page = report.path.read_text()
    assert "<script" not in page.lower() and "&lt;script&gt;" in page
    assert EVIL in _text(page)
