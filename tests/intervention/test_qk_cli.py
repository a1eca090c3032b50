"""`latentcode qk` and `qk_attribution` (issue 48): the table's terms add up to the score the model's own
hook computes at the selected pairs; bad arguments are refused in one line before torch is imported;
the pair selectors name the pairs a brute-force loop finds."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from latentcode.errors import UsageError
from latentcode.intervention.qk.pairs import select_pairs

REPOSITORY = Path(__file__).resolve().parents[2]
SRAVEN = REPOSITORY / "models" / "sraven-hyla"
needs_sraven = pytest.mark.skipif(not SRAVEN.is_dir(), reason="shipped checkpoint missing")


def refused_without_torch(arguments):
    code = ("import sys; from latentcode.cli import main; status = main(sys.argv[1:]); "
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH'); sys.exit(status)")
    done = subprocess.run([sys.executable, "-c", code, *arguments], capture_output=True, text=True, cwd=REPOSITORY)
    return done.returncode, done.stderr.strip(), done.stdout.strip().splitlines()[-1]


@needs_sraven
@pytest.mark.parametrize("arguments, message", [
    (["--layer", "4", "--head", "0", "--pairs", "previous"], "--layer 4 is outside the model's 4 layers"),
    (["--layer", "2", "--head", "16", "--pairs", "previous"], "--head 16 is outside the model's 16 heads"),
    (["--layer", "2", "--head", "0", "--pairs", "successor"], "--pairs: unknown pair selector 'successor'"),
    (["--layer", "2", "--head", "0", "--pairs", "3:x"], "--pairs: unknown pair selector '3:x'"),
    (["--layer", "2", "--head", "0", "--pairs", "previous", "--repeat"], "--seq-len and --repeat are for a language"),
])
def test_bad_arguments_are_refused_in_one_line_before_torch(tmp_path, arguments, message):
    status, error, torch_state = refused_without_torch(["qk", str(SRAVEN), *arguments, "--out", str(tmp_path / "o")])
    assert status == 2 and message in error and len(error.splitlines()) == 1, error
    assert torch_state == "NO-TORCH"


@needs_sraven
def test_the_tables_terms_add_up_to_the_models_own_score(tmp_path):
    from latentcode.cli import main
    from latentcode.models import load_model
    from latentcode.rundir import locate_model
    from latentcode.tasks import get_task

    assert main(["qk", str(SRAVEN), "--layer", "2", "--head", "3", "--pairs", "35:*", "--top", "5",
                 "--out", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "qk.csv")
    source = locate_model(SRAVEN)
    task = get_task(**source.task_config)
    tokens = torch.as_tensor(task.sample(1, task.analysis.held_out_split, seed=0).x[:1])
    _, cache = load_model(source.model_path).run_with_cache(tokens)
    reference = float(cache["blocks.2.attn.hook_attn_scores"][0, 3, 35].double().mean())
    terms = table[table["kind"] == "term"]
    assert len(terms) == 36 and set(terms["query_component"]) >= {"other"}  # 5 + other per side
    assert abs(terms["mean"].sum() - reference) < 1e-5 * abs(reference) + 1e-6
    assert abs(float(table.loc[table["kind"] == "score", "mean"].iloc[0]) - reference) < 1e-5
    for side in ("query marginal", "key marginal"):
        assert abs(table.loc[table["kind"] == side, "mean"].sum() - reference) < 1e-5
    assert (tmp_path / "qk.png").stat().st_size > 10_000
    status, error, _ = refused_without_torch(["qk", str(SRAVEN), "--layer", "2", "--head", "3", "--pairs", "35:*",
                                              "--out", str(tmp_path)])
    assert status == 2 and "already exist" in error


def test_pair_selectors_name_what_a_loop_finds():
    tokens = np.array([5, 7, 9, 5, 7, 2, 9, 5])
    induction = {(q, k) for q in range(8) for k in range(1, q + 1) if tokens[k - 1] == tokens[q]}
    assert set(map(tuple, select_pairs("induction", tokens).tolist())) == induction
    assert select_pairs("previous", tokens).tolist() == [[q, q - 1] for q in range(1, 8)]
    assert select_pairs("3:1..2,5:*", tokens).tolist() == [[3, 1], [3, 2], [5, 0], [5, 1], [5, 2], [5, 3], [5, 4], [5, 5]]
    assert len(select_pairs("3:*", tokens, causal=False)) == 8
    with pytest.raises(UsageError, match="past the sequence"):
        select_pairs("9:0", tokens)
    with pytest.raises(UsageError, match="names no causal pair"):
        select_pairs("2:5", tokens)
    with pytest.raises(UsageError, match="needs integer tokens"):
        select_pairs("induction", np.zeros((4, 3)))
