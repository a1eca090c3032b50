"""`latentcode patch` (issue 22, item 7): a sweep on a shipped checkpoint writes its table, summary and
map, and its numbers are those of `transfer_sweep` called from Python; bad arguments of `patch` and
`intervene` are refused in one line before torch is imported."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
SRAVEN = REPOSITORY / "models" / "sraven-hyla"
FUZZY = REPOSITORY / "models" / "fuzzy_logic-hyla"
pytestmark = pytest.mark.skipif(not SRAVEN.is_dir() or not FUZZY.is_dir(), reason="shipped checkpoints missing")


def refused_without_torch(arguments):
    """Run the CLI in a fresh interpreter; return (exit status, stderr, whether torch was imported)."""
    code = ("import sys; from latentcode.cli import main; status = main(sys.argv[1:]); "
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH'); sys.exit(status)")
    done = subprocess.run([sys.executable, "-c", code, *arguments], capture_output=True, text=True, cwd=REPOSITORY)
    return done.returncode, done.stderr.strip(), done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("arguments, message", [
    (["patch", str(SRAVEN), "--layers", "7"], "the model has 4 layers"),
    (["patch", str(SRAVEN), "--group", "2:x:1"], "--group: cannot read site '2:x:1'"),
    (["patch", str(SRAVEN), "--split", "nope"], "--split: unknown split 'nope' for task 'sraven'; valid splits"),
    (["patch", str(SRAVEN), "--queries", "30..40"], "reaches past the sequence of 36 tokens"),
    (["patch", str(SRAVEN), "--grid", "rows", "--group", "2:*:*"], "give one of --search, --grid or --group"),
    (["patch", str(SRAVEN), "--search", "--grid", "slot"], "give one of --search, --grid or --group"),
    (["patch", str(SRAVEN), "--grid", "rows", "--key-blocks", "9"],
     "--grid rows makes 1296 groups, more than --max-groups 256"),
    (["patch", str(SRAVEN), "--grid", "slot/nope"], "--grid 'slot/nope': expected a partition name or QUERY/KEY"),
    (["patch", str(SRAVEN), "--search", "--layers", "5"], "the model has 4 layers"),
    (["patch", str(REPOSITORY / "models" / "language-hyla")], "draws no counterfactual pairs"),
    (["patch", str(REPOSITORY / "nowhere")], "not a finished run directory"),
    (["intervene", str(SRAVEN), "--sites", "9:0:0", "--zero-ablate", "all"], "layer 9 is outside the model's 4 layers"),
    (["intervene", str(SRAVEN), "--split", "nope", "--zero-ablate", "all"],
     "--split: unknown split 'nope' for task 'sraven'; valid splits"),
    (["intervene", str(SRAVEN), "--sites", "*:40:*", "--zero-ablate", "all"], "position 40 is outside"),
    (["intervene", str(SRAVEN), "--sites", "2:*:*", "--alone", "sites", "--zero-ablate", "all"], "per_site=False (--no-per-site)"),
    (["extract", str(SRAVEN), "--sites", "*:*:*", "--n", "8"], "selects 5184 sites"),
])
def test_bad_arguments_are_refused_before_torch_is_imported(tmp_path, arguments, message):
    status, error, torch_state = refused_without_torch([*arguments, "--out", str(tmp_path / "out")])
    assert status == 2, error
    assert error.startswith("error: ") and message in error and len(error.splitlines()) == 1
    assert torch_state == "NO-TORCH"


def test_patch_writes_the_numbers_transfer_sweep_gives(tmp_path):
    from latentcode.cli import main
    from latentcode.intervention.patching import SiteGroup
    from latentcode.intervention.transfer import transfer_sweep
    from latentcode.sources.sites import parse_selector
    from latentcode.training.run import Run

    stem = tmp_path / "patch"
    groups = ["0:31:*", "1:*:*"]
    arguments = ["patch", str(FUZZY), "--n", "24", "--quiet", "--out", str(stem)]
    assert main([*arguments, *(item for spec in groups for item in ("--group", spec))]) == 0
    table = pd.read_csv(stem.with_name("patch.csv"))
    summary = json.loads(stem.with_name("patch.json").read_text())
    assert stem.with_name("patch.png").stat().st_size > 0
    assert summary["n"] == 24 and summary["split"] == "ood" and summary["groups"] == 2

    run = Run(FUZZY)
    model, task = run.load_model().eval(), run.task()
    pairs = task.counterfactual_pairs(24, "ood", seed=0, variant=summary["variant"], prediction=-1)
    expected = transfer_sweep(model, task, pairs, [SiteGroup(parse_selector(spec, task)) for spec in groups])
    for column in ("follow (different)", "follow (third)", "transfer", "logit_difference (different)"):
        assert table[column].tolist() == pytest.approx(expected[column].tolist(), abs=1e-6)
    # run again: refused without --overwrite, nothing lost
    assert main([*arguments, "--group", "0:31:*"]) == 2
    assert pd.read_csv(stem.with_name("patch.csv")).shape == table.shape


def test_the_python_entry_runs_the_plan_the_command_line_runs(tmp_path):
    """Issue 33: `patch` (Python) and `latentcode patch` build one plan (`plan_patch`): the same groups, pairs
    and numbers, and a plan that imports without torch."""
    import subprocess

    from latentcode.cli import main
    from latentcode.intervention.patching import PatchPlan, patch, plan_patch

    code = ("import sys; from latentcode.intervention.patching import plan_patch; "
            f"plan_patch({str(FUZZY)!r}, grid='rows', layers='1', queries='31', key_blocks=4); "
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPOSITORY).stdout.strip() == "NO-TORCH"
    plan = plan_patch(FUZZY, layers=[1], queries="31", key_blocks=4, n=16)
    assert isinstance(plan, PatchPlan) and plan.grid == "rows" and plan.layers == (1,)
    assert plan.query_positions == (31,) and plan.cost["groups"] == 4 and plan.out is None
    result = patch(plan)
    assert len(result.table) == 4 and result.summary["n"] == 16 and result.summary["groups"] == 4
    stem = tmp_path / "rows"
    assert main(["patch", str(FUZZY), "--layers", "1", "--queries", "31", "--key-blocks", "4", "--n", "16", "--quiet",
                 "--out", str(stem)]) == 0
    written = pd.read_csv(stem.with_name("rows.csv"))
    assert written["group"].tolist() == result.table["group"].tolist()
    for column in ("follow (different)", "follow (third)", "transfer", "damage"):
        assert written[column].tolist() == pytest.approx(result.table[column].tolist(), abs=1e-12)


def test_the_report_shows_a_patch_sweep_in_an_interventions_section(tmp_path):
    from latentcode.cli import main

    stem = tmp_path / "patch"
    assert main(["patch", str(FUZZY), "--n", "16", "--group", "1:*:*", "--group", "0:31:*", "--quiet",
                 "--out", str(stem)]) == 0
    table = pd.read_csv(stem.with_name("patch.csv"))
    page = tmp_path / "report.html"
    assert main(["report", str(FUZZY), "--patch", str(stem), "--out", str(page), "--quiet"]) == 0
    html = page.read_text()
    assert "Interventions: where patching the codes transfers the sub-task" in html
    assert f"{table['transfer'].max():.3f}" in html  # the best group's transfer is on the page
    assert main(["report", str(FUZZY), "--patch", str(tmp_path / "missing"), "--out", str(tmp_path / "r2.html")]) == 2


def test_patch_says_its_cost_and_progress_off_a_terminal_and_nothing_under_quiet(tmp_path, capsys):
    """Under pytest stderr is not a terminal: progress comes as plain lines (no bar), after the cost;
    --quiet prints nothing at all (no scipy warning either: 2 groups, attribution correlations
    undefined, written as null)."""
    from latentcode.cli import main

    arguments = ["patch", str(FUZZY), "--n", "16", "--group", "1:*:*", "--group", "0:31:*", "--attribution"]
    assert main([*arguments, "--out", str(tmp_path / "loud")]) == 0
    said = capsys.readouterr()
    assert said.out.startswith("cost: at most 2 groups patched")
    progress = said.err.strip().splitlines()
    assert progress and all(line.startswith("patch: ") for line in progress) and "\r" not in said.err
    assert any(" examples, " in line for line in progress)  # "patch: N/M examples, ... left"
    assert main([*arguments, "--quiet", "--out", str(tmp_path / "quiet")]) == 0
    said = capsys.readouterr()
    assert said.out == "" and said.err == ""
    text = (tmp_path / "quiet.json").read_text()
    assert "NaN" not in text and json.loads(text)["attribution_vs_exact"] == {"pearson": None, "spearman": None}
    table = pd.read_csv(tmp_path / "quiet.csv")
    assert {"damage", "damage se", "keep (same)"} <= set(table.columns)


def test_patch_says_when_nothing_transfers(tmp_path, capsys):
    """sraven-softmax's codes carry no rule (0.000 ± 0.000 on 2,048 pairs, analyses/RESULTS.md) and
    sraven-hyla's queried-feature context cells do (0.20 ± 0.013): only the first is called noise."""
    from latentcode.cli import main

    cells = "|".join(str(position) for position in range(3, 32, 4))
    for model, group, noise in ((SRAVEN.with_name("sraven-softmax"), "0:*:*", True),
                                (SRAVEN, f"2:{cells}:{cells}", False)):
        assert main(["patch", str(model), "--n", "96", "--group", group, "--out", str(tmp_path / model.name)]) == 0
        printed = capsys.readouterr().out
        assert "largest transfer" in printed and ("not above 2 s.e. of zero" in printed) == noise, printed
