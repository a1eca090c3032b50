"""The analysis commands: probe, plot, heatmap, samples, report (on synthetic codes files)."""

import json
import sys
from pathlib import Path

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


def test_progress_bars_only_where_stderr_is_a_terminal(two_models, capsys, monkeypatch):
    """Piped, a tqdm bar filled logs with carriage returns and escape codes (issue 24)."""
    assert main(["probe", str(two_models[0]), "--label", "rule"]) == 0
    assert capsys.readouterr().err == "", "stderr is captured here, not a terminal: no bar"
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["probe", str(two_models[0]), "--label", "rule"]) == 0
    assert "decode rule" in capsys.readouterr().err, "on a terminal, the bar"


def test_plot_says_how_far_it_is_unless_quiet(two_models, tmp_path, capsys):
    """tSNE printed nothing for minutes under load (issue 24): off a terminal, a line per layer."""
    arguments = ["plot", str(two_models[1]), "--method", "tsne", "--color", "rule", "--max-points", "40"]
    assert main([*arguments, "--out", str(tmp_path / "talking")]) == 0
    assert "done in" in capsys.readouterr().err
    assert main([*arguments, "--out", str(tmp_path / "quiet"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_report_out_without_a_suffix_writes_an_html_page(two_models, tmp_path, capsys):
    """`--out NAME` wrote an HTML page named NAME, which a browser does not open as one (issue 24)."""
    assert main(["report", "--codes", str(two_models[0]), "--out", str(tmp_path / "mine"), "--max-points", "40",
                 "--quiet"]) == 0
    assert (tmp_path / "mine.html").read_text().startswith("<!DOCTYPE html>") and not (tmp_path / "mine").exists()
    assert (tmp_path / "mine.html").resolve().as_posix() in capsys.readouterr().out
    assert main(["report", "--codes", str(two_models[0]), "--out", str(tmp_path / "mine")]) == 2
    assert "mine.html already exists" in capsys.readouterr().err, "checked under the name it writes"



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


def test_probe_writes_its_table_and_plot_as_one_set(two_models, tmp_path, capsys, monkeypatch):
    """A failure while drawing leaves no new table and the older one untouched (the table was
    renamed into place before the plot was drawn; issue 23)."""
    import errno

    import latentcode.analysis as analysis
    from latentcode.files import AtomicOutputs

    stem = tmp_path / "result"
    for suffix in (".csv", ".json", ".png"):
        stem.with_suffix(suffix).write_text(f"an earlier {suffix}")

    def plot_fails(table, path_stem, formats=("png",), **options):
        with AtomicOutputs(lock=path_stem) as outputs:
            outputs.write_bytes(Path(str(path_stem) + ".png"), b"half a figure")
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(analysis, "plot_probe_scores", plot_fails)
    arguments = ["probe", str(two_models[0]), "--label", "rule", "--quiet", "--out", str(stem), "--overwrite"]
    assert main(arguments) == 2
    assert "No space left on device" in capsys.readouterr().err
    for suffix in (".csv", ".json", ".png"):
        assert stem.with_suffix(suffix).read_text() == f"an earlier {suffix}"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["result.csv", "result.json", "result.png"], \
        "no temporaries or lock left behind"


def test_a_second_command_to_the_same_out_finds_the_first_ones_files_under_the_lock(two_models, tmp_path, capsys,
                                                                                        monkeypatch):
    """Both passed the check before their work; the second to take the lock must not replace the
    first one's results (both exited 0 and one result was lost; issue 23)."""
    import latentcode.analysis as analysis

    stem = tmp_path / "result"
    decode = analysis.decode

    def decode_while_another_command_finishes(*args, **kwargs):
        table = decode(*args, **kwargs)
        stem.with_suffix(".csv").write_text("the other command's table")
        return table

    monkeypatch.setattr(analysis, "decode", decode_while_another_command_finishes)
    assert main(["probe", str(two_models[0]), "--label", "rule", "--quiet", "--out", str(stem)]) == 2
    assert "already exist" in capsys.readouterr().err
    assert stem.with_suffix(".csv").read_text() == "the other command's table"
    assert not stem.with_suffix(".json").exists() and not stem.with_suffix(".png").exists()


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
