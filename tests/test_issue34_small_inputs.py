"""Issue 34: the last tracebacks of the Python API and the command line, and what was accepted
silently: one line each, or a note that says what happens."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from latentcode.cli import build_parser, main, one_line
from latentcode.store import CodeFileError, CodeWriter, Site

MODELS = Path(__file__).resolve().parents[1] / "models"
SITE = Site(0, 1, 1)


@pytest.mark.parametrize("heads", [0, -2, {SITE: 0}])
def test_code_writer_refuses_no_heads(tmp_path, heads):
    with pytest.raises(CodeFileError, match="n_heads must be a positive number of heads per site"):
        CodeWriter(tmp_path / "c.h5", [SITE], heads, {})
    assert list(tmp_path.iterdir()) == []


def test_code_writer_refuses_integer_split_names_and_appends_after_close(tmp_path):
    writer = CodeWriter(tmp_path / "c.h5", [SITE], 2, {})
    for split in (3, [1, 2], [None, "train"]):
        with pytest.raises(CodeFileError, match="split names are text, got"):
            writer.append(codes={SITE: np.zeros((2, 2))}, split=split)
    writer.append(codes={SITE: np.zeros((2, 2))}, split=["train", "ood"])
    writer.close()
    with pytest.raises(CodeFileError, match="the CodeWriter of .*c.h5 is closed; open a new one with append=True"):
        writer.append(codes={SITE: np.zeros((2, 2))}, split="train")


def test_build_report_refuses_a_title_that_is_not_text(tmp_path):
    from latentcode.analysis.report import ReportError, build_report

    with pytest.raises(ReportError, match="title=None; expected the page's title as text"):
        build_report(codes_files=[tmp_path / "c.h5"], out=tmp_path / "r.html", title=None)
    assert list(tmp_path.iterdir()) == []


def test_a_newline_inside_an_argument_stays_on_the_error_line(tmp_path, capsys):
    assert one_line("a\nb\rc") == "a\\nb\\rc"
    assert main(["probe", str(tmp_path / "a\nb.h5")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "a\\nb.h5 does not exist" in error
    with pytest.raises(SystemExit):
        main(["probe", "--cv", "x\ny", "c.h5"])
    assert capsys.readouterr().err.count("\n") == 1


def test_demos_started_together_get_a_directory_each(tmp_path):
    from latentcode.demo import make_fresh_directory

    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "kept.txt").write_text("an earlier demo")
    made, barrier = [], threading.Barrier(8)

    def claim():
        barrier.wait()
        made.append(make_fresh_directory(tmp_path / "demo"))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(path.name for path in made) == sorted(f"demo-{index}" for index in range(1, 9))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert make_fresh_directory(empty) == empty


def test_resume_without_a_checkpoint_says_it_starts_again(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(MODELS / "fuzzy_logic-hyla" / "config.json", run / "config.json")
    parser = build_parser()
    args = parser.parse_args(["train", "--resume", str(run)])
    parser.commands["train"].check(args)
    assert f"note: {run} has no checkpoint yet; --resume trains it again from step 0" in capsys.readouterr().out


@pytest.mark.parametrize("same", [True, False])
def test_probe_says_when_its_test_score_is_in_sample(tmp_path, capsys, same):
    from tests.analysis.synthetic import write_codes

    path = write_codes(tmp_path / "c.h5", n_per_split={"train": 60, "ood": 30})
    parser = build_parser()
    args = parser.parse_args(["probe", str(path), "--label", "rule", "--fit-split", "train",
                              "--test-split", "train" if same else "ood"])
    parser.commands["probe"].check(args)
    out = capsys.readouterr().out
    assert ("the test score is in-sample" in out) == same


def test_the_cap_is_said_and_applies_to_what_probe_reads(tmp_path, capsys):
    from tests.analysis.synthetic import write_codes

    path = write_codes(tmp_path / "c.h5", n_per_split={"train": 90, "ood": 30})
    parser = build_parser()
    args = parser.parse_args(["probe", str(path), "--label", "rule", "--max-rows", "40", "--seed", "5"])
    parser.commands["probe"].check(args)
    out = capsys.readouterr().out
    assert f"note: {path}: split 'train' has 90 examples; probe reads a random 40 of them (seed 5" in out
    assert "'ood'" not in out  # 30 examples: read whole, no note
    assert [len(view) for view in args.code_files] == [70]


def test_numbered_demo_directories_are_ignored_by_git():
    ignored = (Path(__file__).resolve().parents[1] / ".gitignore").read_text().splitlines()
    assert "latentcode-demo-*/" in ignored and "latentcode-demo/" in ignored


def test_a_model_directory_config_is_checked_like_a_runs(tmp_path):
    from latentcode.models.config import ConfigError, ModelConfig, check_model_config

    config = json.loads((MODELS / "fuzzy_logic-hyla" / "model" / "config.json").read_text())
    check_model_config(config)
    ModelConfig.from_dict(config)  # the same config builds
    for change, message in (({"attn_dropout": "0.1"}, "attn_dropout must be in"), ({"n_heads": 0}, "n_heads must be"),
                            ({"attention": "magic"}, "unknown attention 'magic'"), ({"size": 1}, "unknown ModelConfig")):
        with pytest.raises(ConfigError, match=message):
            check_model_config({**config, **change})
        if "attention" not in change:  # the torch-free check and ModelConfig refuse the same configs
            with pytest.raises(ConfigError, match=message):
                ModelConfig.from_dict({**config, **change})
    with pytest.raises(ConfigError, match="holds a JSON list"):
        check_model_config([1, 2])
