"""`latentcode intervene` on a shipped checkpoint: the table's "before" is the task metric of the bare
model computed here through the task API, "after" that of the model with the edit; bad input is one
line on stderr with exit status 2."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from latentcode.cli import main
from latentcode.errors import UsageError
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
    edits = table[table["role"] == "edit"]
    assert list(dict.fromkeys(edits["scope"])) == ["all sites", "l0_q31_k31", "l1_q31_k31"]
    before, after = metrics_by_hand(), metrics_by_hand(ZeroAblate(heads=[0, 2]))
    # beside each scope its control: the same edit at as many other heads of the same layers, read by hand too
    controls = table[table["role"] == "control"]
    assert len(set(controls["scope"])) == 3
    control = controls["scope"].iloc[0]  # "control for all sites: l0.hA,l0.hB,l1.hC,l1.hD"
    drawn = [unit.split(".h") for unit in control.split(": ")[1].split(",")]
    assert control.startswith("control for all sites") and len(drawn) == 4
    assert all(int(head) not in (0, 2) for _, head in drawn)
    by_layer = {layer: sorted(int(head) for unit_layer, head in drawn if unit_layer == layer) for layer in ("l0", "l1")}
    assert all(len(heads) == 2 for heads in by_layer.values())
    control_by_hand = metrics_by_hand([ZeroAblate(heads=heads, sites=[(int(layer[1:]), 31, 31)])
                                       for layer, heads in by_layer.items()])
    control_rows = controls[controls["scope"] == control].set_index("metric")
    for metric in before:
        assert control_rows.loc[metric, "after"] == pytest.approx(control_by_hand[metric], rel=1e-6)
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
    """Two sites: one pass without the edit, one with it at both, one at each alone; 2 batches each;
    with controls, one more pass beside each of the 3 scopes."""
    arguments = ["intervene", str(RUN), "--n", "40", "--batch-size", "32", "--zero-ablate", "0"]
    assert main([*arguments, "--out", str(tmp_path / "a"), "--no-control"]) == 0
    err = capsys.readouterr().err
    assert "on 40 ood instances" in err and "in 2 passes of up to 32: without the edit, then 3 scopes (0 controls)" in err
    assert "8 forward passes" in err and "intervene: 1/8 batches" in err and "intervene: 8/8 batches" in err
    assert main([*arguments, "--out", str(tmp_path / "c")]) == 0
    err = capsys.readouterr().err
    assert "then 6 scopes (3 controls), 14 forward passes" in err and "intervene: 14/14 batches" in err
    assert "\r" not in err
    assert main([*arguments, "--out", str(tmp_path / "b"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(not RUN.is_dir(), reason="shipped checkpoint models/fuzzy_logic-hyla is missing")
def test_each_layer_and_head_alone_on_a_trained_model_is_that_heads_edit_by_hand():
    """alone="heads" (the unit a causal LM's edits are measured in) on a trained run: scope l1.h2 is
    the edit of head 2 at layer 1's sites alone, computed here without latentcode's scopes."""
    from latentcode.intervention import intervention_effects

    table = intervention_effects(RUN, ZeroAblate(heads=[0, 2]), n=N, alone="heads", control=False)
    assert list(dict.fromkeys(table["scope"])) == ["all sites", "l0.h0", "l0.h2", "l1.h0", "l1.h2"]
    alone = table[table["scope"] == "l1.h2"].set_index("metric")
    by_hand = metrics_by_hand(ZeroAblate(heads=[2], sites=[(1, 31, 31)]))
    for metric, value in by_hand.items():
        assert alone.loc[metric, "after"] == pytest.approx(value, rel=1e-6)
    with pytest.raises(UsageError, match="alone='rows'; expected one of sites, heads"):
        intervention_effects(RUN, ZeroAblate(heads=[0]), n=N, alone="rows")
