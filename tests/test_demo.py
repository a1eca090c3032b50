"""The main job end to end, and the report of training runs."""

import json

import numpy as np
import pytest

from latentcode.analysis.report import build_report
from latentcode.demo import fresh_directory, run_demo, shipped_run

SMALL = dict(n_layers=2, d_model=32, d_mlp=32)


# SRAVEN's tiny demo is the quicker one and stays in the default run; the rest are slow.
@pytest.mark.parametrize("task", [pytest.param("fuzzy_logic", marks=pytest.mark.slow), "sraven"])
def test_demo_runs_end_to_end_at_tiny_scale(tmp_path, task, capsys):
    report = run_demo(task, tmp_path / "demo", train=True, scale="tiny", n_codes=160, max_points=80,
                      progress=False, model_overrides=SMALL)
    page = report.path.read_text()
    assert "<script" not in page and "Training" in page and "Decoding the sub-task" in page
    # curves, probes, one heatmap comparing the models, 3 x (tSNE, samples)
    assert page.count("data:image/png;base64,") >= 1 + 1 + 1 + 3 * 2
    assert set(report.probe_table["model"]) == {"softmax", "linear", "hyla"}
    printed = capsys.readouterr().out
    assert "report:" in printed and printed.count("decoding") == 3
    variant = {"sraven": "unpermuted", "fuzzy_logic": "fixed_query"}[task]
    assert f"on the {variant} variant" in printed and f"{variant} variant" in page, "the headline names the variant"
    assert "In brief" in page and "trained by this demo" in page, "says where the training numbers come from"
    for attention in ("softmax", "linear", "hyla"):
        assert (tmp_path / "demo" / "runs" / attention / "codes" / f"{attention}.h5").is_file()
    # Trained the way the shipped checkpoints were (models/recreate.sh).
    trained = json.loads((tmp_path / "demo" / "runs" / "hyla" / "config.json").read_text())["train"]
    expected_variant, expected_task = {"sraven": ("unpermuted", {}), "fuzzy_logic": (None, {"frac_test": 0.7})}[task]
    assert trained["variant"] == expected_variant and expected_task.items() <= trained["task"].items()


def test_demo_help_names_every_demo_task(capsys):
    """`demo --help` named fuzzy_logic and sraven, not language (issue 24)."""
    from latentcode.cli import main
    from latentcode.tasks import task_class, task_names

    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    for name in task_names():
        if task_class(name).training_setup is not None:
            assert name in text


@pytest.mark.slow
def test_language_demo_reads_the_validation_bytes(tmp_path, capsys):
    """Language has no `ood` split: the demo reads and scores its held-out split, `validation`."""
    report = run_demo("language", tmp_path / "demo", train=True, scale="tiny", n_codes=256, max_points=80,
                      progress=False)
    assert set(report.probe_table["model"]) == {"softmax", "linear", "hyla"}
    import latentcode

    code_file = latentcode.CodeFile(tmp_path / "demo" / "runs" / "hyla" / "codes" / "hyla.h5")
    assert set(code_file.splits) == {"train", "validation"}
    assert "(train -> validation)" in capsys.readouterr().out


@pytest.mark.parametrize("attention", ["softmax", "linear", "hyla"])
def test_language_codes_of_short_windows_are_those_of_the_first_positions_of_long_ones(attention):
    """The language demo reads its 512-byte models on 128-byte windows (DEMO_MAX_SEQ_LEN): the codes
    of a 128-byte window's last query must be the model's codes at query 127 of a 512-byte window that
    starts with the same bytes (causal attention, positions counted from the window's start)."""
    import torch

    from latentcode.demo import DEMO_MAX_SEQ_LEN
    from latentcode.extraction import Recorder
    from latentcode.models import load_model
    from latentcode.sources.sites import block
    from latentcode.tasks import get_task

    run = shipped_run("language", attention)
    model = load_model(run / "model").eval()
    short = DEMO_MAX_SEQ_LEN["language"]
    long_windows = get_task("language", seq_len=model.config.n_ctx).sample(3, "validation", seed=1).x
    assert long_windows.shape[1] > short
    sites = block(None, short - 1, range(short))
    codes = []
    for windows in (long_windows, long_windows[:, :short]):
        with Recorder(model, sites) as recorder, torch.no_grad():
            model(torch.from_numpy(windows))
        codes.append(recorder.pop())
    assert codes[0].keys() == codes[1].keys() and len(codes[0]) == model.config.n_layers * short
    for site, long_codes in codes[0].items():
        torch.testing.assert_close(codes[1][site], long_codes, rtol=1e-4, atol=1e-5)
    first, last = sites.resolve(model.config.n_layers, short)[0], sites.resolve(model.config.n_layers, short)[-1]
    assert not np.allclose(codes[0][first], codes[0][last])  # not trivially equal: keys' codes differ


def test_demo_never_overwrites_an_existing_directory(tmp_path):
    (tmp_path / "latentcode-demo").mkdir()
    (tmp_path / "latentcode-demo" / "mine.txt").write_text("keep")
    assert fresh_directory(tmp_path / "latentcode-demo") == tmp_path / "latentcode-demo-1"
    (tmp_path / "latentcode-demo-1").mkdir()
    assert fresh_directory(tmp_path / "latentcode-demo") == tmp_path / "latentcode-demo-2"


# fuzzy_logic's shipped trio is run by tests/test_install.py's installed demo (the default task), not again here.
@pytest.mark.slow
@pytest.mark.parametrize(("task", "checkpoints"), [("sraven", None), ("sraven", "permuted"), ("language", None)])
def test_demo_from_the_shipped_checkpoints(tmp_path, task, checkpoints, capsys):
    for attention in ("softmax", "linear", "hyla"):
        assert (shipped_run(task, attention, checkpoints=checkpoints) / "model").is_dir(), \
            f"the {task} demo needs the shipped {attention} model"
    report = run_demo(task, tmp_path / "demo", n_codes=256, max_points=100, progress=False, checkpoints=checkpoints)
    assert report.path.is_file() and len(report.runs) == 3
    assert all(run.summary for run in report.runs), "shipped runs carry their training metrics"
    import latentcode

    runs = [latentcode.Run(record.path) for record in report.runs]
    trained = {run.config.variant or run.task().variants[0] for run in runs}
    if checkpoints == "permuted":
        # Trained on the permuted task (M = 2), read on unpermuted instances: the title says both.
        assert trained == {"permuted"} and {run.task().n_features for run in runs} == {2}
        assert "codes on the unpermuted variant" in report.path.read_text()


def test_report_of_runs_without_codes(tmp_path):
    import latentcode
    from latentcode.training import build_train_config

    run = latentcode.train(build_train_config("fuzzy_logic", "tiny", "hyla", **SMALL), tmp_path / "run", progress=False)
    report = build_report([run.path], out=tmp_path / "report.html", progress=False)
    page = report.path.read_text()
    assert "training curves" in page and "Final metrics per split" in page and "unseen_terms" in page
    assert report.probe_table is None and len(report.headline()) == 1
