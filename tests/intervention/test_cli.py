"""`latentcode intervene` on a shipped checkpoint: the table's "before" is the task metric of the bare
model computed here through the task API, "after" that of the model with the edit; bad input is one
line on stderr with exit status 2."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from latentcode.cli import main
from latentcode.intervention import Intervention, ZeroAblate
from latentcode.models import load_model
from latentcode.store import CodeWriter, Site
from latentcode.tasks import eval_seed, get_task
from latentcode.training.run import Run

RUN = Path(__file__).resolve().parents[2] / "models" / "fuzzy_logic-hyla"
N = 48


def metrics_by_hand(edit=None):
    task = get_task(**Run(RUN).config.task)
    model = load_model(RUN / "model")
    batch = task.sample(N, "ood", seed=(eval_seed("ood"), 0))
    with torch.no_grad():
        if edit is None:
            output = model(torch.from_numpy(batch.x))
        else:
            with Intervention(model, edit, sites="last-self"):
                output = model(torch.from_numpy(batch.x))
    return task.evaluate(output[:, -task.n_predictions :].numpy(), batch)


@pytest.mark.skipif(not RUN.is_dir(), reason="shipped checkpoint models/fuzzy_logic-hyla is missing")
def test_intervene_writes_a_tidy_table_with_the_metric_before_and_after(tmp_path, capsys):
    stem = tmp_path / "zero"
    assert main(["intervene", str(RUN), "--n", str(N), "--zero-ablate", "0,2", "--out", str(stem), "--quiet"]) == 0
    assert "wrote" in capsys.readouterr().out
    table = pd.read_csv(stem.with_suffix(".csv"))
    assert stem.with_suffix(".json").is_file() and stem.with_suffix(".png").stat().st_size > 0
    assert list(dict.fromkeys(table["scope"])) == ["all sites", "l0_q31_k31", "l1_q31_k31"]
    before, after = metrics_by_hand(), metrics_by_hand(ZeroAblate(heads=[0, 2]))
    everything = table[table["scope"] == "all sites"].set_index("metric")
    for metric in before:
        assert everything.loc[metric, "before"] == pytest.approx(before[metric], rel=1e-6)
        assert everything.loc[metric, "after"] == pytest.approx(after[metric], rel=1e-6)
    assert np.allclose(table["change"], table["after"] - table["before"])
    assert (everything["change"] != 0).any()


@pytest.mark.skipif(not RUN.is_dir(), reason="shipped checkpoint models/fuzzy_logic-hyla is missing")
def test_intervene_refuses_bad_input_in_one_line(tmp_path, capsys):
    codes = tmp_path / "other.h5"
    with CodeWriter(codes, [Site(1, 31, 31)], 8, {"checkpoint_sha256": "ab" * 32}) as writer:
        writer.append(codes={Site(1, 31, 31): np.zeros((2, 8), np.float32)}, split="train")
    cases = [
        (["--mean-ablate", "all", "--codes", str(codes)], "ab" * 32),
        (["--zero-ablate", "all", "--codes", str(codes)], "--codes, --by and --codes-split go with --mean-ablate"),
        (["--set", "1,2"], "SetCode value has width 2 but the latent codes at layer 0 have"),
        (["--zero-ablate", "0", "--sites", "0:40:0"], "position 40 is outside the sequence of 32 tokens"),
        (["--zero-ablate", "x"], "--zero-ablate expects 'all' or head indices"),
    ]
    for arguments, message in cases:
        status = main(["intervene", str(RUN), "--n", "4", "--out", str(tmp_path / "t"), "--quiet", *arguments])
        error = capsys.readouterr().err
        assert status == 2 and message in error and error.count("\n") == 1, (arguments, error)


@pytest.mark.skipif(not RUN.is_dir(), reason="shipped checkpoint models/fuzzy_logic-hyla is missing")
def test_intervene_keeps_an_earlier_table_unless_overwrite(tmp_path, capsys):
    stem = tmp_path / "zero"
    stem.with_suffix(".csv").write_text("an earlier table")
    arguments = ["intervene", str(RUN), "--n", "8", "--zero-ablate", "0", "--out", str(stem), "--quiet"]
    assert main(arguments) == 2
    assert "already exist" in capsys.readouterr().err and stem.with_suffix(".csv").read_text() == "an earlier table"
    assert main([*arguments, "--overwrite"]) == 0
    assert "scope" in stem.with_suffix(".csv").read_text()


@pytest.mark.skipif(not RUN.is_dir(), reason="shipped checkpoint models/fuzzy_logic-hyla is missing")
def test_intervene_says_the_work_then_a_line_per_step_in_a_log_and_nothing_when_quiet(tmp_path, capsys):
    """Two sites: one pass without the edit, one with it at both, one at each alone; 2 batches each."""
    arguments = ["intervene", str(RUN), "--n", "40", "--batch-size", "32", "--zero-ablate", "0"]
    assert main([*arguments, "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "on 40 ood instances" in err and "in 2 batches of up to 32: 4 passes over them" in err
    assert "8 forward passes" in err and "intervene: 1/8 batches" in err and "intervene: 8/8 batches" in err
    assert "\r" not in err
    assert main([*arguments, "--out", str(tmp_path / "b"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""
