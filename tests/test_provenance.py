"""Codes shown beside a run must come from that run's checkpoint and task (issue 11): the case of the
issue, a fuzzy-logic HYLA run reported with the codes of the SRAVEN HYLA model, both named 'hyla'."""

import shutil
from pathlib import Path

import pytest

import latentcode
from latentcode.analysis.report import build_report
from latentcode.cli import main
from latentcode.provenance import MismatchError, check_codes_from_runs, check_one_task
from latentcode.rundir import RunRecord
from latentcode.store import CodeFile

MODELS = Path(__file__).resolve().parents[1] / "models"


@pytest.fixture(scope="module")
def runs_and_codes(tmp_path_factory):
    """Copies of two shipped HYLA runs (fuzzy logic, SRAVEN), each with 16+16 codes extracted from it."""
    root = tmp_path_factory.mktemp("provenance")
    codes = {}
    for task in ("fuzzy_logic", "sraven"):
        run = root / task
        shutil.copytree(MODELS / f"{task}-hyla", run, ignore=shutil.ignore_patterns("*.md"))
        codes[task] = root / f"{task}-codes.h5"
        for index, split in enumerate(("train", "ood")):
            latentcode.extract(run, split=split, n=16, out=codes[task], append=index > 0, progress=False)
    return root, codes


def test_the_issues_mix_is_refused_in_one_line_and_writes_nothing(runs_and_codes, tmp_path, capsys):
    root, codes = runs_and_codes
    out = tmp_path / "report.html"
    assert CodeFile(codes["sraven"]).model_name == RunRecord.read(root / "fuzzy_logic").name == "hyla"
    assert main(["report", str(root / "fuzzy_logic"), "--codes", str(codes["sraven"]), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("error: ")
    assert f"run {root / 'fuzzy_logic'} (hyla on task 'fuzzy_logic')" in error
    assert f"codes file {codes['sraven']} (hyla on task 'sraven')" in error and "different tasks" in error
    assert not out.exists() and not (tmp_path / "report_files").exists()
    # The same from Python, before anything is written.
    with pytest.raises(MismatchError, match="come from different tasks"):
        build_report([root / "fuzzy_logic"], [codes["sraven"]], out=out, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_codes_of_another_checkpoint_of_the_same_task_are_refused(runs_and_codes, tmp_path):
    root, codes = runs_and_codes
    other = tmp_path / "softmax"
    shutil.copytree(MODELS / "fuzzy_logic-softmax", other, ignore=shutil.ignore_patterns("*.md"))
    runs = [RunRecord.read(other)]
    with pytest.raises(MismatchError) as refused:
        check_codes_from_runs(runs, [CodeFile(codes["fuzzy_logic"])])
    message = str(refused.value)
    # It names the codes' checkpoint (the hyla run's weights) and the run's, independently hashed.
    import hashlib

    hyla = hashlib.sha256((root / "fuzzy_logic" / "model" / "model.safetensors").read_bytes()).hexdigest()
    softmax = hashlib.sha256((other / "model" / "model.safetensors").read_bytes()).hexdigest()
    assert f"checkpoint {hyla[:12]}" in message and f"checkpoint {softmax[:12]}" in message
    assert str(codes["fuzzy_logic"]) in message and str(other) in message


def test_codes_are_matched_to_the_run_they_came_from(runs_and_codes):
    root, codes = runs_and_codes
    runs = [RunRecord.read(root / task) for task in ("fuzzy_logic", "sraven")]
    fuzzy, sraven = CodeFile(codes["fuzzy_logic"]), CodeFile(codes["sraven"])
    assert check_one_task([fuzzy], runs[:1]) == "fuzzy_logic"
    assert check_codes_from_runs(runs, [fuzzy, sraven]) == {fuzzy.path: runs[0], sraven.path: runs[1]}
    assert check_codes_from_runs([], [fuzzy]) == {}  # codes alone: nothing to match


def test_a_task_reading_parameter_may_differ_between_run_and_codes_and_nothing_else():
    """Language's window length only chooses how its text is read (Task.reading_parameters): codes of
    128-byte windows belong to a run trained on 512 (the language demo reads them so); another seed,
    or another SRAVEN size, is another task."""
    from latentcode.provenance import task_differences

    run = {"name": "language", "seq_len": 512, "seed": 0}
    assert task_differences(run, {**run, "seq_len": 128}) == []
    assert task_differences(run, {**run, "seed": 1}) == ["seed=1 in the codes, 0 in the run"]
    sraven = {"name": "sraven", "n_features": 4, "n_values": 8, "frac_ood": 0.25, "seed": 0}
    assert task_differences(sraven, {**sraven, "n_features": 2}) == ["n_features=2 in the codes, 4 in the run"]
