"""The analysis commands: probe, plot, heatmap, samples, report (on synthetic codes files)."""

import json

import pytest

from latentcode.cli import main
from tests.analysis.synthetic import write_codes


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("codes")
    return [write_codes(folder / f"{name}.h5", model_name=name, seed=seed, n_per_split={"train": 240, "ood": 120})
            for seed, name in enumerate(("softmax", "hyla"))]


def test_probe_compares_models_in_one_table_and_figure(two_models, tmp_path, capsys):
    assert main(["probe", *map(str, two_models), "--label", "rule", "--out", str(tmp_path / "rule")]) == 0
    out = capsys.readouterr().out
    assert "softmax" in out and "hyla" in out and "accuracy" in out
    records = json.loads((tmp_path / "rule.json").read_text())
    assert {r["model"] for r in records} == {"softmax", "hyla"} and (tmp_path / "rule.png").stat().st_size > 0
    assert {"layer", "site", "label", "metric", "value", "n_fit", "n_test", "shuffled_labels", "majority",
            "strongest_baseline", "selected"} <= set(records[0])
    assert "chosen on train" in out, "the headline line names the layer chosen on the fit split"


def test_probe_defaults_to_the_tasks_label_and_reports_errors(two_models, capsys):
    assert main(["probe", str(two_models[0]), "--quiet"]) == 0  # SRAVEN file: decodes `rule`
    printed = capsys.readouterr()
    assert "rule" in printed.out and printed.err == "", "--quiet: no progress bar"
    assert main(["probe", str(two_models[0]), "--label", "nope"]) == 2
    assert "no label 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["plot", "--method", "tsne", "--color", "rule", "--max-points", "60"],
                                     ["heatmap", "--label", "rule"], ["samples", "--label", "rule"]])
def test_pictures_are_written(two_models, tmp_path, capsys, command):
    stem = tmp_path / "figure"
    assert main([command[0], str(two_models[1]), *command[1:], "--out", str(stem), "--format", "png",
                 "--format", "svg"]) == 0
    assert stem.with_suffix(".png").stat().st_size > 0 and stem.with_suffix(".svg").stat().st_size > 0


def test_report_from_codes_files_alone(two_models, tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main(["report", "--codes", str(two_models[0]), "--codes", str(two_models[1]), "--out", str(out),
                 "--max-points", "60", "--quiet"]) == 0
    page = out.read_text()
    assert "<script" not in page and page.count("data:image/png;base64,") >= 5
    assert "Decoding the sub-task" in page and "softmax" in page and "hyla" in page
    assert main(["report", "--codes", str(two_models[0]), "--out", str(out)]) == 2, "never overwrites"
    assert "already exists" in capsys.readouterr().err



@pytest.mark.parametrize("command", [["probe", "--label", "rule", "--quiet"], ["heatmap", "--label", "rule"]])
def test_outputs_already_written_are_kept_unless_overwrite(two_models, tmp_path, capsys, command):
    stem = tmp_path / "result"
    arguments = [command[0], str(two_models[0]), *command[1:], "--out", str(stem)]
    assert main(arguments) == 0
    stem.with_suffix(".png").write_bytes(b"an earlier figure")
    assert main(arguments) == 2
    error = capsys.readouterr().err
    assert "already exist" in error and "--overwrite" in error and str(stem.with_suffix(".png")) in error
    assert stem.with_suffix(".png").read_bytes() == b"an earlier figure", "refused before writing anything"
    assert main([*arguments, "--overwrite"]) == 0
    assert stem.with_suffix(".png").read_bytes().startswith(b"\x89PNG")


def test_heatmap_centre_flag_reaches_the_figure(two_models, tmp_path, capsys, monkeypatch):
    import latentcode.analysis as analysis

    seen = []
    original = analysis.plot_similarity
    monkeypatch.setattr(analysis, "plot_similarity", lambda *args, **kwargs: seen.append(kwargs["centre"])
                        or original(*args, **kwargs))
    for choice, expected in (("yes", True), ("no", False), ("auto", None)):
        assert main(["heatmap", str(two_models[0]), "--label", "rule", "--centre", choice,
                     "--out", str(tmp_path / choice)]) == 0
        assert seen[-1] is expected and (tmp_path / f"{choice}.png").stat().st_size > 0
