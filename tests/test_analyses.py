"""Every script under analyses/ runs end to end at a tiny scale and writes its table and figure.

The end-to-end runs train their own tiny models and run each script in a fresh interpreter: they
are `slow` (`python -m pytest -m slow`). The default run checks every script's command line, the
scripts' own computations (rule and term swaps, variance explained) against independent formulas,
and runs the scripts that read finished runs on the shipped HYLA checkpoints, in this process.
"""

import json
import math
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

import latentcode
from latentcode.training import build_train_config

ANALYSES = Path(__file__).resolve().parents[1] / "analyses"
MODELS = Path(__file__).resolve().parents[1] / "models"
# The scripts of one paper result each (reproduce.py orchestrates the results page: tested below).
SCRIPTS = sorted(path.name for path in ANALYSES.glob("*.py") if path.name not in ("common.py", "reproduce.py"))
SMALL = ["--set", "n_layers=2", "--set", "d_model=32", "--set", "d_mlp=32"]


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """Finished tiny runs DIR/<task>-<attention>, the layout --runs-from reads."""
    folder = tmp_path_factory.mktemp("runs")
    for task in ("fuzzy_logic", "sraven"):
        for attention in ("softmax", "linear", "hyla"):
            config = build_train_config(task, "tiny", attention, n_layers=2, d_model=32, d_mlp=32)
            latentcode.train(config, folder / f"{task}-{attention}", progress=False)
    return folder


@pytest.fixture(scope="module")
def language_runs(tmp_path_factory):
    """Finished tiny language runs DIR/language-<attention> on windows of 512 bytes."""
    folder = tmp_path_factory.mktemp("language-runs")
    for attention in ("softmax", "linear", "hyla"):
        config = build_train_config("language", "tiny", attention, seq_len=512)
        latentcode.train(config, folder / f"language-{attention}", progress=False)
    return folder


def run_script(name, *args):
    result = subprocess.run([sys.executable, str(ANALYSES / name), "--quiet", "--n-codes", "160", *args],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_fuzzy_ood_r2_grid(tmp_path):
    out = run_script("fuzzy_ood_r2_grid.py", "--scale", "tiny", *SMALL, "--seq-lens", "16", "--fracs", "0.3", "0.5",
                     "--attention", "softmax", "hyla", "--out", str(tmp_path))
    rows = json.loads((tmp_path / "ood_r2.json").read_text())
    assert {(r["attention"], r["frac_test"]) for r in rows} == {(a, f) for a in ("softmax", "hyla") for f in (0.3, 0.5)}
    assert all(r["status"] == "finished" and r["ood.r2"] is not None for r in rows)
    assert (tmp_path / "ood_r2.png").stat().st_size > 0 and "wrote" in out


def fuzzy_r2_by_hand(run: Path, split: str) -> float:
    """The mean per-sequence R^2 of a fuzzy-logic run's stored model on the run's evaluation set of
    `split`, computed here from the model's outputs: 1 - (prediction - target)^2 / var(the sequence's
    N targets), the context targets being the last input column (the paper's definition)."""
    import numpy as np
    import torch

    run = latentcode.Run(run)
    task = run.task()
    batch = task.eval_set(split, run.config.eval_instances, variant=run.config.variant)
    with torch.no_grad():
        predicted = run.load_model().eval()(torch.from_numpy(batch.x))[:, -1, 0].double().numpy()
    targets = np.concatenate([batch.x[:, :-1, -1], batch.y], axis=1).astype(np.float64)
    return float(np.mean(1 - (predicted - batch.y[:, 0]) ** 2 / targets.var(axis=1)))


@pytest.mark.slow
def test_heads_ablation_writes_each_runs_scores_for_its_head_count(tmp_path):
    """One row per head count, each the OOD and test R^2 of the run trained with that many heads (its
    stored model evaluated here, its config read), kqv_dim the same for both: one head is one wide head."""
    run_script("heads_ablation.py", "--task", "fuzzy_logic", "--scale", "tiny", *SMALL, "--heads", "1", "8",
               "--attention", "hyla", "--out", str(tmp_path))
    rows = json.loads((tmp_path / "heads_ablation.json").read_text())
    assert sorted(r["n_heads"] for r in rows) == [1, 8] and (tmp_path / "heads_ablation.png").stat().st_size > 0
    runs = {latentcode.Run(path).load_model().config.n_heads: path
            for path in (tmp_path / "runs").iterdir() if (path / "summary.json").is_file()}
    assert sorted(runs) == [1, 8]
    assert len({latentcode.Run(path).load_model().config.kqv_dim for path in runs.values()}) == 1
    for row in rows:
        assert row["attention"] == "hyla" and row["status"] == "finished"
        for split in ("ood", "test"):
            assert row[f"{split}.r2"] == pytest.approx(fuzzy_r2_by_hand(runs[row["n_heads"]], split), abs=1e-5), \
                (row["n_heads"], split)
    assert len({row["ood.r2"] for row in rows}) == 2, "both head counts scored the same"


@pytest.mark.slow
def test_fuzzy_term_decoding(tiny_runs, tmp_path):
    run_script("fuzzy_term_decoding.py", "--runs-from", str(tiny_runs), "--out", str(tmp_path))
    rows = json.loads((tmp_path / "term_decoding.json").read_text())
    assert {r["model"] for r in rows} == {"softmax", "linear", "hyla"}
    assert any(r["metric"] == "mean_f1" for r in rows) and (tmp_path / "term_decoding.png").is_file()
    assert (tmp_path / "negation_bits_r2.csv").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("script", ["sraven_rule_decoding.py", "sraven_rule_heatmap.py", "latent_tsne.py"])
def test_sraven_scripts(tiny_runs, tmp_path, script):
    extra = ["--max-points", "80"] if script == "latent_tsne.py" else []
    runs_before = sorted(tiny_runs.rglob("*"))
    run_script(script, "--runs-from", str(tiny_runs), "--out", str(tmp_path), *extra)
    assert sorted(tiny_runs.rglob("*")) == runs_before, "the runs read (e.g. shipped models/) gained files"
    written = {path.name for path in tmp_path.iterdir()}
    expected = {"sraven_rule_decoding.py": {"rule_decoding.csv", "rule_decoding.png"},
                "sraven_rule_heatmap.py": {"hyla_rule_similarity.png", "hyla_rule_similarity.json",
                                           "rule_similarity.png", "rule_similarity_centred.png"},
                "latent_tsne.py": {"softmax_tsne.png", "linear_tsne.png", "hyla_tsne.png"}}[script]
    assert expected <= written


def run_in_process(monkeypatch, name, *args):
    """Run analyses/<name> as `python analyses/<name> --quiet ARGS` would, in this process."""
    monkeypatch.syspath_prepend(str(ANALYSES))  # where the scripts find `common`
    monkeypatch.setattr(sys, "argv", [name, "--quiet", *args])
    try:
        runpy.run_path(str(ANALYSES / name), run_name="__main__")
    finally:
        sys.modules.pop("common", None)


# Scripts of a pretrained model (no runs to train or reuse): their option is the model, not --runs-from.
PRETRAINED_MODEL_SCRIPTS = {"smollm2_relations.py", "qk_findings.py"}


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_has_a_command_line(monkeypatch, capsys, script):
    with pytest.raises(SystemExit) as exited:
        run_in_process(monkeypatch, script, "--help")
    help_text = capsys.readouterr().out
    assert exited.value.code == 0
    assert ("--out" in help_text) if script in PRETRAINED_MODEL_SCRIPTS else ("--runs-from" in help_text)


@pytest.mark.parametrize("script, expected", [
    ("sraven_rule_decoding.py", {"rule_decoding.csv", "rule_decoding.png"}),
    ("sraven_rule_heatmap.py", {"hyla_rule_similarity.png", "hyla_rule_similarity.json"}),
    ("latent_tsne.py", {"hyla_tsne.png"}),
    ("fuzzy_term_decoding.py", {"term_decoding.json", "term_decoding.png", "negation_bits_r2.csv"}),
])
def test_scripts_read_the_shipped_checkpoints(tmp_path, monkeypatch, script, expected):
    shipped_before = sorted(MODELS.rglob("*"))
    extra = ["--max-points", "60"] if script == "latent_tsne.py" else []
    run_in_process(monkeypatch, script, "--runs-from", str(MODELS), "--attention", "hyla", "--n-codes", "96",
                   "--out", str(tmp_path), *extra)
    assert sorted(MODELS.rglob("*")) == shipped_before, "the shipped models/ gained or lost files"
    assert expected <= {path.name for path in tmp_path.iterdir()}
    if script == "fuzzy_term_decoding.py":
        rows = json.loads((tmp_path / "term_decoding.json").read_text())
        assert {row["model"] for row in rows} == {"hyla"}


def test_runs_from_a_directory_without_runs_says_so(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="no finished run at"):
        run_in_process(monkeypatch, "sraven_rule_decoding.py", "--runs-from", str(tmp_path))


def test_a_script_writes_its_outputs_as_one_set_never_through_a_link(tmp_path, monkeypatch, analyses_modules):
    """heads_ablation.py with its training faked: a symbolic link planted where its figure goes is
    refused, not followed, and then none of its files is written; without it all of them are."""
    from latentcode.files import UnsafePath

    rows = [{"attention": "hyla", "n_heads": heads, "seed": 0, "status": "finished", "ood.r2": 0.5 / heads,
             "test.r2": 0.75} for heads in (1, 8)]

    def run_heads_ablation():
        monkeypatch.setattr(analyses_modules("common"), "train_grid", lambda args, preset, grid: rows)
        run_in_process(monkeypatch, "heads_ablation.py", "--task", "fuzzy_logic", "--heads", "1", "8",
                       "--attention", "hyla", "--out", str(out))

    out, victim = tmp_path / "out", tmp_path / "someone_elses.png"
    out.mkdir()
    victim.write_text("not ours")
    (out / "heads_ablation.png").symlink_to(victim)
    with pytest.raises(UnsafePath, match="heads_ablation.png is a symbolic link"):
        run_heads_ablation()
    assert victim.read_text() == "not ours"
    assert [path.name for path in out.iterdir()] == ["heads_ablation.png"]  # no table, temporary or lock left

    (out / "heads_ablation.png").unlink()
    run_heads_ablation()
    assert sorted(path.name for path in out.iterdir()) == ["heads_ablation.csv", "heads_ablation.json",
                                                            "heads_ablation.png"]
    assert json.loads((out / "heads_ablation.json").read_text()) == rows


def test_the_results_page_is_regenerated_from_the_recorded_runs(tmp_path, monkeypatch, capsys):
    """RESULTS.md's Table A1 quotes the recorded runs: the seed-0 rows are the shipped fuzzy-logic models."""
    monkeypatch.syspath_prepend(str(ANALYSES))
    monkeypatch.setattr(sys, "argv", ["reproduce.py", "page", "--page", str(tmp_path / "RESULTS.md")])
    runpy.run_path(str(ANALYSES / "reproduce.py"), run_name="__main__")
    capsys.readouterr()
    page = (tmp_path / "RESULTS.md").read_text()
    assert (tmp_path / "results" / "figures" / "fig2c_ood_r2_vs_held_out.png").is_file()
    for attention in ("softmax", "linear", "hyla"):
        shipped = json.loads((MODELS / f"fuzzy_logic-{attention}" / "summary.json").read_text())
        assert f"{100 * shipped['final_metrics']['ood']['r2']:.2f}" in page
    # Fig. 2B/5F: each model's layer chosen on train is shown in bold with its recorded OOD score.
    import pandas as pd

    for task, metric in (("fuzzy_logic_term_decoding", "mean_balanced_accuracy"), ("sraven_rule_decoding", "accuracy")):
        table = pd.read_csv(ANALYSES / "results" / "decoding" / f"{task}.csv")
        chosen = table[(table["metric"] == metric) & table["selected"]]
        assert len(chosen) == 3
        for value in chosen["value"]:
            assert f"**{value:.3f}**" in page
    # Issue 48's section quotes the recorded query-key tables (analyses/qk_findings.py) and shows their figures.
    qk = ANALYSES / "results" / "qk_findings"
    marginals = pd.read_csv(qk / "smollm2_marginals.csv", dtype={"head": str})
    induction = marginals[(marginals["head"] == "18.6") & (marginals["pairs"] == "induction")]
    strongest = induction.loc[induction["key_marginal"].abs().idxmax()]
    assert f"{strongest.component} {strongest.key_marginal:+.2f} ± {strongest.key_marginal_se:.2f}" in page
    patches = pd.read_csv(qk / "sraven_patches.csv")
    left = patches[(patches["scale"] == "frozen") & patches["removal"].str.startswith("top")]["rule_variance_left"]
    assert all(f"{value:.2f}" in page for value in left)
    assert "](results/qk_findings/smollm2_qk_terms.png)" in page and "](results/qk_findings/sraven_qk_terms.png)" in page
    monkeypatch.setattr(sys, "argv", ["reproduce.py", "plan"])
    runpy.run_path(str(ANALYSES / "reproduce.py"), run_name="__main__")
    commands = capsys.readouterr().out.splitlines()
    fuzzy = [line for line in commands if line.startswith("latentcode train --preset fuzzy_logic")]
    sraven = [line for line in commands if line.startswith("latentcode train --preset sraven")]
    language = [line for line in commands if line.startswith("latentcode train --preset language")]
    assert len(fuzzy) == 9 + 6 + 8 and len(sraven) == 9 + 2 + 9 + 15 and len(language) == 3 + 3 + 6
    assert len(commands) == len(fuzzy) + len(sraven) + len(language)
    assert all("--set n_features=2 --set n_layers=2" in line for line in sraven)
    assert sum("--set n_heads=1" in line for line in sraven) == 2
    assert sum("--set hold_out=stratified --out analyses/output/runs/sraven-M2-" in line for line in sraven) == 9
    # Issue 50: the one-initialisation trio, five seeds each, every seed with its own task seed.
    one_init = [line for line in sraven if "-corrected-s" in line]
    assert sorted((line.split("--attention ")[1].split()[0], line.split("--seed ")[1].split()[0]) for line in one_init) \
        == sorted((attention, str(seed)) for attention in ("softmax", "linear", "hyla") for seed in range(5))
    assert all(f"--seed {seed} --set task_seed={seed} " in line for line in one_init for seed in [line.split("--seed ")[1].split()[0]])


def test_the_language_baselines_are_n_gram_models_counted_on_the_training_bytes(analyses_modules, monkeypatch):
    """On a two-letter corpus the add-one unigram and bigram costs are known by hand."""
    import numpy as np

    import latentcode.tasks.corpus as corpus

    language = analyses_modules("reproduction.language")
    splits = {"train": np.array([0, 1, 0, 1], np.uint8), "validation": np.array([0, 1], np.uint8)}
    import latentcode.tasks

    monkeypatch.setattr(corpus, "corpus_split", splits.__getitem__)
    monkeypatch.setattr(latentcode.tasks, "corpus_split", splits.__getitem__, raising=False)  # the public name
    language.language_baselines.cache_clear()  # cached per process: the page computes them on the real corpus
    try:
        baselines = language.language_baselines()
    finally:
        language.language_baselines.cache_clear()
    # unigram: bytes 0 and 1 counted twice, plus one for each of 256 bytes: 3 / 260 each
    assert baselines["unigram (no context)"] == pytest.approx(np.log2(260 / 3))
    # bigram: after a 0 the training bytes show 1 twice, plus one for each of 256: 3 / 258
    assert baselines["bigram (the previous byte)"] == pytest.approx(np.log2(258 / 3))


def test_train_decides_each_run_when_a_process_slot_frees(analyses_modules, tmp_path, monkeypatch):
    """reproduce.py train: a run trained but not recorded is recorded without a process, one with a
    checkpoint resumes, one started but never checkpointed starts again from scratch, a recorded one
    is not in the plan's to-do list; each goes through the sweeps scheduler as drawn."""
    import argparse

    import latentcode.training.sweeps as sweeps

    plan = analyses_modules("reproduction.plan")
    recorded, runs = tmp_path / "recorded", tmp_path / "runs"
    monkeypatch.setattr(plan, "RECORDED", recorded)
    planned = [plan.fuzzy("table_a1", attention, 0, 0.7) for attention in ("softmax", "linear", "hyla", "linear_rmshead")]
    monkeypatch.setattr(plan, "plan", lambda: planned)
    softmax, linear, hyla, ablation = (runs / run.name for run in planned)
    for name in ("config.json", "metrics.jsonl", "summary.json"):  # trained, not recorded
        (softmax / name).parent.mkdir(parents=True, exist_ok=True)
        (softmax / name).write_text(f"{name} of softmax\n")
    (linear / "checkpoints" / "step_00000100").mkdir(parents=True)  # checkpointed: resumes
    (hyla / "config.json").parent.mkdir(parents=True)  # started, never checkpointed: starts again
    (hyla / "config.json").write_text("{}")
    (recorded / planned[3].name).mkdir(parents=True)  # recorded already: not in the to-do list
    (recorded / planned[3].name / "summary.json").write_text("{}")
    drawn = []

    def fake_run_jobs(jobs, parallel, environment, on_start, on_finish, poll_seconds):
        assert parallel == 2 and environment["OMP_NUM_THREADS"] == "1"
        for job in jobs:
            drawn.append(job)
            on_start(job)
            on_finish(job, 1)

    monkeypatch.setattr(sweeps, "run_jobs", fake_run_jobs)
    plan.train(argparse.Namespace(only=["table_a1"], runs=str(runs), jobs=2))
    assert [(recorded / planned[0].name / name).read_text() for name in ("config.json", "metrics.jsonl", "summary.json")] \
        == [f"{name} of softmax\n" for name in ("config.json", "metrics.jsonl", "summary.json")]
    assert [job.command for job in drawn] == [["latentcode", "train", "--resume", str(linear), "--quiet"],
                                              planned[2].command(hyla)]
    assert not hyla.exists() and (linear / "checkpoints").is_dir()
    assert sorted(path.name for path in recorded.iterdir()) == sorted([planned[0].name, planned[3].name])


# --- the intervention experiments (rule_swap, term_swap, head_ablation, topographic_similarity) ---

@pytest.fixture
def analyses_modules(monkeypatch):
    """The analyses/ scripts as importable modules (they import their sibling `common`)."""
    import importlib

    monkeypatch.syspath_prepend(str(ANALYSES))
    return lambda name: importlib.import_module(name)


def test_rule_swap_chooses_a_different_rule_whose_answer_differs(analyses_modules):
    import numpy as np

    rule_swap = analyses_modules("rule_swap")
    task = latentcode.get_task("sraven")
    batch = task.sample(300, "ood", seed=(3,), variant="unpermuted")
    rule, truth = batch.labels["query_rule"][:, -1], batch.y[:, -1]
    answers, defined = rule_swap.counterfactuals(task, batch, np.full(300, task.n_features - 1))
    other, eligible = rule_swap.choose_other_rules(rule, truth, answers, defined, np.random.default_rng(0))
    assert eligible.mean() > 0.9
    assert (other != rule)[eligible].all()
    for candidate in range(8):
        chosen = eligible & (other == candidate)
        answer, is_defined = task.counterfactual_answer(batch, task.n_features - 1, candidate)
        assert is_defined[chosen].all() and (answer != truth)[chosen].all()
    # the own rule's answer is the truth wherever it is defined (what "keep" is measured against)
    own = answers[np.arange(300), rule]
    assert (own == truth)[defined[np.arange(300), rule]].all()


def test_term_swap_r2_and_shift_match_independent_formulas(analyses_modules):
    import numpy as np
    from sklearn.metrics import r2_score

    term_swap = analyses_modules("term_swap")
    rng = np.random.default_rng(0)
    original, counterfactual = rng.random(200), rng.random(200)
    prediction = original + 0.3 * (counterfactual - original) + 0.01 * rng.standard_normal(200)
    assert term_swap.r2(prediction, counterfactual) == pytest.approx(r2_score(counterfactual, prediction))
    slope = np.linalg.lstsq((counterfactual - original)[:, None], prediction - original, rcond=None)[0][0]
    assert term_swap.shift(prediction, original, counterfactual) == pytest.approx(slope)
    assert term_swap.shift(prediction, original, counterfactual) == pytest.approx(0.3, abs=0.02)


@pytest.mark.slow
def test_rule_swap_script(tiny_runs, tmp_path, analyses_modules):
    import numpy as np

    common = analyses_modules("common")

    run_script("rule_swap.py", "--runs-from", str(tiny_runs), "--attention", "hyla", "--variant", "permuted",
               "--n", "64", "--n-codes", "128", "--out", str(tmp_path))
    rows = json.loads((tmp_path / "rule_swap.json").read_text())
    assert {r["condition"] for r in rows} == {"unpatched", "swap: mean code of r'", "control: own-rule mean",
                                              "baseline: all-rules mean", "control: random instance"}
    assert {(r["site_set"], r["scope"]) for r in rows} == {
        (s, scope) for s in ("sraven-rule", "query-row") for scope in ("layer 0", "layer 1", "all layers")}
    assert all(abs(r["follow"] + r["keep"] + r["other"] - 1) < 1e-9 and 0 < r["n"] <= 64 for r in rows)
    # the unpatched accuracy at the last query position, computed here by the task's own metric
    model, task, _ = common.load_run(tiny_runs / "sraven-hyla")
    batch = common.sample(task, 64, "ood", "permuted")
    logits = common.predict(model, batch.x, task.n_predictions)
    expected = task.evaluate(logits, batch)[f"feature_accuracy_{task.n_features - 1}"]
    assert rows[0]["accuracy_unpatched"] == pytest.approx(expected)
    assert (tmp_path / "rule_swap_query-row.png").is_file() and (tmp_path / "rule_swap.html").is_file()
    assert np.isfinite([r["follow"] for r in rows]).all()


@pytest.mark.slow
def test_term_swap_script(tiny_runs, tmp_path):
    run_script("term_swap.py", "--runs-from", str(tiny_runs), "--attention", "softmax", "--n", "96",
               "--n-codes", "640", "--out", str(tmp_path))
    rows = json.loads((tmp_path / "term_swap.json").read_text())
    reference = [r for r in rows if r["condition"] == "reference: counterfactual function"]
    assert reference and all(r["r2_counterfactual"] == pytest.approx(1) and r["shift"] == pytest.approx(1)
                             for r in reference)
    swaps = [r for r in rows if r["condition"].startswith("swap")]
    assert len(swaps) == 6 and all(r["n"] > 0 for r in swaps)  # 2 site sets x (2 layers + all layers)
    assert (tmp_path / "term_swap_last-row.png").is_file()


@pytest.mark.slow
def test_head_ablation_script(tiny_runs, tmp_path):
    run_script("head_ablation.py", "--runs-from", str(tiny_runs), "--task", "fuzzy_logic", "--attention", "linear",
               "--n", "64", "--n-single", "32", "--n-order", "32", "--n-means", "32", "--out", str(tmp_path))
    rows = json.loads((tmp_path / "head_ablation.json").read_text())
    singles = [r for r in rows if r["experiment"] == "single head"]
    assert len(singles) == 2 * 2 * 8  # zero and mean, 2 layers x 8 heads
    cumulative = [r for r in rows if r["experiment"] == "cumulative"]
    for kind in ("zero", "mean"):
        # every head ablated: the order no longer matters, and it changes the output
        everything = {r["order"]: r["value"] for r in cumulative if r["kind"] == kind and r["k"] == 8}
        assert len(everything) == 2 and len(set(everything.values())) == 1
    unpatched = next(r for r in rows if r["experiment"] == "unpatched")["value"]
    assert next(r for r in cumulative if r["kind"] == "zero" and r["k"] == 8)["value"] != unpatched
    assert (tmp_path / "head_ablation_cumulative_fuzzy_logic.png").is_file()


@pytest.mark.slow
def test_topographic_similarity_script(tiny_runs, tmp_path):
    import numpy as np
    from scipy.spatial.distance import pdist
    from scipy.stats import spearmanr

    run_script("topographic_similarity.py", "--runs-from", str(tiny_runs), "--task", "fuzzy_logic",
               "--attention", "softmax", "--n-codes", "400", "--permutations", "50", "--out", str(tmp_path))
    rows = json.loads((tmp_path / "topographic_similarity.json").read_text())
    row = next(r for r in rows if r["model"] == "softmax" and r["split"] == "train" and r["layer"] == "layer 1")
    # rho recomputed here from the extracted codes with scipy
    codes_file = latentcode.CodeFile(next((tmp_path / "codes" / "fuzzy_logic-softmax").glob("*.h5")))
    codes, task_index = codes_file.layer_codes(1, "train"), codes_file.labels("task_index", "train")
    tasks = np.unique(task_index)
    means = np.stack([codes[task_index == t].mean(0) for t in tasks])
    combinations = latentcode.Run(tiny_runs / "fuzzy_logic-softmax").task().all_combinations[tasks]
    multi_hot = np.zeros((len(tasks), 16))
    np.put_along_axis(multi_hot, combinations, 1, axis=1)
    expected = spearmanr(pdist(multi_hot, "hamming"), pdist(means, "cosine")).statistic
    assert row["rho"] == pytest.approx(expected, abs=1e-9) and row["n_tasks"] == len(tasks)
    assert any(r["model"] == "raw inputs (no model)" for r in rows)


def test_variance_explained_is_the_r2_of_regressing_codes_on_the_label(analyses_modules):
    import numpy as np

    common = analyses_modules("common")
    rng = np.random.default_rng(1)
    labels = rng.integers(5, size=300)
    codes = rng.standard_normal((300, 3)) + np.array([0.0, 1.0, -2.0])[None] * labels[:, None] / 4
    one_hot = np.eye(5)[labels]
    residual = codes - one_hot @ np.linalg.lstsq(one_hot, codes, rcond=None)[0]
    expected = 1 - (residual**2).sum() / ((codes - codes.mean(0)) ** 2).sum()
    assert common.variance_explained(codes, labels) == pytest.approx(expected)
    assert common.variance_explained(codes, np.zeros(300, dtype=int)) == pytest.approx(0)


@pytest.mark.slow
def test_language_scripts(language_runs, tmp_path):
    """The codes of tiny language models read at T=512: token-class probes and the curves."""
    runs_before = sorted(language_runs.rglob("*"))
    out = run_script("language_codes.py", "--runs-from", str(language_runs), "--out", str(tmp_path), "--n-codes", "320")
    assert sorted(language_runs.rglob("*")) == runs_before, "the runs read gained files"
    probes = json.loads((tmp_path / "key_class_probe.json").read_text())
    assert {(row["model"], row["key_class"]) for row in probes} == {
        (model, key) for model in ("softmax", "linear", "hyla")
        for key in ("previous_occurrence", "previous_space", "previous_newline")}
    assert all(row["n_fit"] > 100 and 0 <= row["accuracy"] <= 1 for row in probes)
    decoded = json.loads((tmp_path / "query_class.json").read_text())
    assert {row["model"] for row in decoded} == {"softmax", "linear", "hyla"}
    codes = latentcode.CodeFile(next((tmp_path / "codes" / "language-hyla").glob("*.h5")))
    assert {site.query for site in codes.sites} == {511} and len(codes.sites) == 128
    assert (tmp_path / "language_codes.png").stat().st_size > 0 and "wrote" in out

    run_script("language_modelling.py", "--runs-from", str(language_runs), "--out", str(tmp_path))
    final = json.loads((tmp_path / "language_modelling.json").read_text())
    assert [row["model"] for row in final] == ["softmax", "linear", "hyla"]
    for row in final:
        assert row["validation.bits_per_byte"] == pytest.approx(row["validation.loss"] / math.log(2))
    assert (tmp_path / "language_modelling.png").stat().st_size > 0


def test_a_recorded_run_keeps_its_weights_in_float16_and_loads_as_float32(analyses_modules, tmp_path):
    """recording.record_run: the run's JSON files as they are, its final model in half precision (what
    the page says), read back by latentcode.Run as a float32 model with those values; a run without a
    final model is recorded without weights."""
    import shutil

    import torch
    from safetensors import safe_open

    recording = analyses_modules("reproduction.recording")
    run = tmp_path / "run"
    shutil.copytree(MODELS / "fuzzy_logic-hyla", run, ignore=shutil.ignore_patterns("*.md"))
    source = latentcode.load_model(run / "model")
    with torch.no_grad():  # float32 values that float16 cannot hold exactly: the recording rounds them
        for parameter in source.parameters():
            parameter.add_(1e-4)
    source.save(run / "model", overwrite=True)
    recording.record_run(run, tmp_path / "recorded")
    for name in ("config.json", "metrics.jsonl", "summary.json"):
        assert (tmp_path / "recorded" / name).read_bytes() == (run / name).read_bytes()
    with safe_open(tmp_path / "recorded" / "model" / "model.safetensors", "pt") as weights:
        assert {weights.get_tensor(key).dtype for key in weights.keys()} == {torch.float16}
    recorded = latentcode.Run(tmp_path / "recorded").load_model()
    for (name, ours), (_, theirs) in zip(recorded.state_dict().items(), source.state_dict().items(), strict=True):
        assert ours.dtype == torch.float32, name
        torch.testing.assert_close(ours, theirs.half().float(), rtol=0, atol=0)

    shutil.rmtree(run / "model")
    recording.record_run(run, tmp_path / "without")
    assert (tmp_path / "without" / "summary.json").is_file() and not (tmp_path / "without" / "model").exists()


def test_hyla_seed_reruns_are_read_from_their_configs_and_the_plateau_exit_is_the_first_step_above_it(
        analyses_modules, monkeypatch, tmp_path):
    """Issue 36's comparison: each kept rerun's seed, learning rate and warm-up come from its own
    config.json (not its directory name), and a run leaves the plateau at its first evaluation whose
    training accuracy exceeds 25%."""
    hyla_seed = analyses_modules("reproduction.hyla_seed")

    def evaluation(step, train):
        return {"event": "eval", "step": step, "splits": {split: {"accuracy": train} for split in ("train", "ood")}}

    for name, seed, rate, warmup, curve in (("b", 2, 3e-4, 800, [0.1, 0.2, 0.25]), ("a", 2, 1e-3, 800, [0.1, 0.3, 0.4])):
        run = tmp_path / name
        run.mkdir()
        (run / "config.json").write_text(json.dumps({"train": {"seed": seed, "learning_rate": rate, "warmup_steps": warmup}}))
        (run / "metrics.jsonl").write_text("".join(json.dumps(evaluation(800 * (i + 1), accuracy)) + "\n"
                                                   for i, accuracy in enumerate(curve)))
        (run / "summary.json").write_text(json.dumps({"final_metrics": {}, "wall_seconds": 60}))
    (tmp_path / "unfinished").mkdir()  # no summary.json: not a rerun
    monkeypatch.setattr(hyla_seed, "HYLA_SEED", tmp_path)
    monkeypatch.setattr(hyla_seed, "summary_of", lambda name: None)  # no recorded old-init runs here
    runs = hyla_seed.runs()
    assert [(run["name"], run["learning_rate"]) for run in runs] == [("a", 1e-3), ("b", 3e-4)]  # larger lr first
    assert [hyla_seed.plateau_exit(run) for run in runs] == [1600, None]  # 0.25 itself is not above the plateau
    assert hyla_seed.label(runs[1]) == "seed 2, corrected init, lr 0.0003, warm-up 800"
