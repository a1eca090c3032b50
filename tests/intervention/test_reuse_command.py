"""`latentcode reuse` end to end on the shipped fuzzy-logic HYLA model, at a small size: three parts,
each beside its baseline, the table written as one set, the codes reused on a second call and refused
when they belong to another model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from latentcode.cli import main

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.mark.slow  # about 15 s of CPU: extraction, probes and patching, twice
def test_reuse_writes_three_parts_beside_their_baselines(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(MODELS / "fuzzy_logic-hyla", run, ignore=shutil.ignore_patterns("*.md"))
    out = tmp_path / "reuse"
    argv = ["reuse", str(run), "--n-codes", "256", "--n-pairs", "24", "--out", str(out), "--quiet"]
    assert main(argv) in (0, None)
    rows = json.loads(out.with_suffix(".json").read_text())
    assert [row["part"] for row in rows] == ["decodability", "reconstruction", "transplant"]
    assert all(row["baseline_name"] for row in rows)
    decodability, reconstruction, transplant = rows
    assert decodability["baseline"] >= 0.5 and decodability["n_test"] == 256
    assert reconstruction["baseline"] <= 0.1  # nothing trivial predicts the codes of unseen compositions
    assert transplant["n_test"] == 24
    assert all(0 <= row["excess"] <= 1 for row in rows)
    codes = Path(f"{out}-codes.h5")
    assert codes.is_file()

    # Again: the table is not replaced without --overwrite; with it, the codes are read, not extracted again.
    assert main(argv) == 2
    assert "already exist" in capsys.readouterr().err
    before = codes.stat().st_mtime_ns
    assert main([*argv, "--overwrite"]) in (0, None)
    assert codes.stat().st_mtime_ns == before
    assert json.loads(out.with_suffix(".json").read_text()) == rows

    other = tmp_path / "other"
    shutil.copytree(MODELS / "fuzzy_logic-softmax", other, ignore=shutil.ignore_patterns("*.md"))
    assert main(["reuse", str(other), "--n-codes", "256", "--n-pairs", "24", "--out", str(out), "--overwrite",
                 "--quiet"]) == 2
    assert "not the model of any run given" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0])
def test_code_reuse_scores_the_shipped_hyla_model_above_its_baselines(tmp_path, seed):
    """The shipped HYLA model decodes its terms on unseen compositions (Fig. 2B on the page) and its
    codes there are partly sums of training codes: both parts above their baselines."""
    from latentcode.reuse import code_reuse

    table = code_reuse(MODELS / "fuzzy_logic-hyla", codes=tmp_path / "codes.h5", n_codes=512, n_pairs=24, seed=seed)
    parts = table.set_index("part")
    assert parts.loc["decodability", "value"] > parts.loc["decodability", "baseline"]
    assert parts.loc["reconstruction", "value"] > parts.loc["reconstruction", "baseline"] + 0.2
    assert 0 <= table.attrs["score"] <= 1
