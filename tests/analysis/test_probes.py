"""Probes recover planted signals, stay at chance without one, report their baselines right, and
choose their layer without looking at the test split."""

import json

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import GridSearchCV, StratifiedKFold, cross_val_predict
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from latentcode.analysis.probes import (
    COLUMNS,
    DEFAULT_CS,
    LogisticProbe,
    ProbeError,
    decode,
    headline_lines,
    headline_rows,
    regress,
    summary_rows,
    write_table,
)
from latentcode.errors import LatentcodeError, UsageError
from latentcode.store import CodeFile, CodeFileError, CodeWriter, Site
from tests.analysis.synthetic import make_labels, write_codes


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    # rule 2 is twice as frequent as the others, so that the majority class stands out
    return write_codes(tmp_path_factory.mktemp("probes") / "hyla.h5", n_per_split={"train": 400, "ood": 400},
                       rule_weights=(1, 1, 2, 1, 1, 1, 1, 1))


def _row(table, **where):
    rows = table
    for column, value in where.items():
        rows = rows[rows[column] == value]
    assert len(rows) == 1, f"expected one row for {where}, found {len(rows)}"
    return rows.iloc[0]


def _logistic_pipeline(C=1.0):
    return Pipeline([("standardize", StandardScaler()),
                     ("logistic", LogisticRegression(C=C, solver="newton-cg", max_iter=1000))])


def test_probe_recovers_a_planted_rule_beside_its_baselines(planted):
    table = decode(planted, "rule", fit_split="train", test_split="ood", progress=False)
    assert list(table.columns) == list(COLUMNS) and len(table) == 6  # 2 layers x 3 metrics
    assert set(table["metric"]) == {"accuracy", "balanced_accuracy", "macro_f1"}
    assert set(table["site"]) == {"all"} and set(table["model"]) == {"hyla"} and set(table["label"]) == {"rule"}
    assert (table["n_fit"] == 400).all() and (table["n_test"] == 400).all()
    assert table["regularization"].isin(DEFAULT_CS).all() and set(table["regularization_param"]) == {"C"}
    assert table["all_present"].isna().all(), "no 'all present' for a categorical label"

    for metric in ("accuracy", "balanced_accuracy", "macro_f1"):
        assert _row(table, layer=1, metric=metric)["value"] > 0.97, "the rule is planted in layer 1"
        assert _row(table, layer=1, metric=metric)["validation"] > 0.97
        assert _row(table, layer=0, metric=metric)["value"] < 0.3, "layer 0 is noise"
        for layer in (0, 1):  # the shuffled-label control is at chance even where the signal is
            assert _row(table, layer=layer, metric=metric)["shuffled_labels"] < 0.3

    # the label-only baselines, computed here independently
    code_file = CodeFile(planted)
    fit, test = code_file.labels("rule", "train"), code_file.labels("rule", "ood")
    majority = np.bincount(fit).argmax()
    share = np.mean(test == majority)
    fit_shares, test_shares = np.bincount(fit, minlength=8) / len(fit), np.bincount(test, minlength=8) / len(test)
    assert majority == 2 and share > 0.17
    for layer in (0, 1):
        accuracy = _row(table, layer=layer, metric="accuracy")
        assert accuracy["majority"] == pytest.approx(share)
        assert accuracy["prevalence_random"] == pytest.approx(np.sum(fit_shares * test_shares))
        # the majority class is the strongest baseline of accuracy: 2/9 of the test split vs ~1/8
        assert accuracy["strongest_baseline"] == "majority" and accuracy["strongest_baseline_value"] == share
        # F1 of the majority class is 2p/(1+p) (precision p, recall 1); every other class scores 0
        expected_macro_f1 = 2 * share / (1 + share) / len(np.unique(test))
        assert _row(table, layer=layer, metric="macro_f1")["majority"] == pytest.approx(expected_macro_f1)
        assert _row(table, layer=layer, metric="balanced_accuracy")["majority"] == pytest.approx(1 / 8)
    assert list(table.loc[table["metric"] == "accuracy", "beats_baselines"]) == [False, True]
    assert list(table["selected"]) == [False] * 3 + [True] * 3, "layer 1, chosen on validation"
    assert headline_rows(table)[["layer", "metric"]].values.tolist() == [[1, "accuracy"]]


def test_the_warm_started_grid_search_matches_scikit_learns():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 300)
    codes = 0.3 * rng.normal(size=(4, 20))[labels] + rng.normal(size=(300, 20))  # weak: C matters
    probe = LogisticProbe(DEFAULT_CS[::-1], cv=3, random_state=0).fit(codes, labels)
    folds = StratifiedKFold(n_splits=3, shuffle=True, random_state=0)
    search = GridSearchCV(_logistic_pipeline(), {"logistic__C": list(DEFAULT_CS)}, scoring="accuracy",
                          cv=folds).fit(codes, labels)
    np.testing.assert_allclose(probe.cv_scores_, search.cv_results_["mean_test_score"])
    assert probe.C_ == search.best_params_["logistic__C"] and probe.C_ < max(DEFAULT_CS)
    np.testing.assert_allclose(probe.predict_proba(codes), search.predict_proba(codes), atol=1e-4)
    # the validation predictions: each example predicted by the fold that did not train on it
    out_of_fold = cross_val_predict(_logistic_pipeline(probe.C_), codes, labels, cv=folds, method="predict_proba")
    # (warm-started fits stop within the solver's tolerance of the cold ones)
    np.testing.assert_allclose(probe.validation_probabilities_, out_of_fold, atol=2e-3)
    assert np.mean(probe.validation_predictions_ == out_of_fold.argmax(axis=1)) > 0.99


def test_shuffled_control_is_the_same_probe_fitted_on_permuted_labels(planted):
    table = decode(planted, "rule", layers=[1], seed=3, progress=False)
    code_file = CodeFile(planted)
    codes_fit, codes_test = code_file.layer_codes(1, "train"), code_file.layer_codes(1, "ood")
    fit, test = code_file.labels("rule", "train"), code_file.labels("rule", "ood")
    permuted = fit[np.random.default_rng(3).permutation(len(fit))]
    control = GridSearchCV(_logistic_pipeline(), {"logistic__C": list(DEFAULT_CS)}, scoring="accuracy",
                           cv=StratifiedKFold(n_splits=3, shuffle=True, random_state=3)).fit(codes_fit, permuted)
    assert _row(table, metric="accuracy")["shuffled_labels"] == pytest.approx(np.mean(control.predict(codes_test) == test))
    other_seed = decode(planted, "rule", layers=[1], seed=4, progress=False)
    assert not np.allclose(table["shuffled_labels"], other_seed["shuffled_labels"])


def _write_layers(path, codes_of_split, labels_of_split):
    """A codes file with one site per layer: `codes_of_split[split][layer]` ``[N, H]``."""
    layers = sorted(next(iter(codes_of_split.values())))
    sites = [Site(layer, 3, 1) for layer in layers]
    n_heads = next(iter(codes_of_split.values()))[layers[0]].shape[1]
    metadata = {"model_name": "m", "task_config": {"name": "sraven"}, "model_config": {}}
    with CodeWriter(path, sites, n_heads=n_heads, metadata=metadata) as writer:
        for split, codes in codes_of_split.items():
            writer.append(codes={site: codes[site.layer].astype(np.float32) for site in sites},
                          labels={"rule": labels_of_split[split]}, split=split)
    return path


def test_the_layer_is_chosen_on_the_fit_split_never_on_the_test_split(tmp_path):
    rng = np.random.default_rng(0)
    n, classes = 300, 4
    rule = {"train": rng.integers(0, classes, n), "ood": rng.integers(0, classes, n)}

    def planted_codes(labels, strength, noise):
        return strength * np.eye(classes)[labels] + noise * rng.normal(size=(len(labels), classes))

    # Layer 0: a weak signal, the same in both splits. Layer 1: a strong one in the fit split whose
    # code-to-rule mapping is rotated in the test split, so it is worse than layer 0 there.
    fit_codes = {0: planted_codes(rule["train"], 1.0, 1.0), 1: planted_codes(rule["train"], 5.0, 0.5)}
    favours_layer_0 = _write_layers(tmp_path / "a.h5", {
        "train": fit_codes,
        "ood": {0: planted_codes(rule["ood"], 1.0, 1.0), 1: planted_codes((rule["ood"] + 1) % classes, 5.0, 0.5)},
    }, rule)
    # The same fit split; a test split where layer 1 is the better one.
    favours_layer_1 = _write_layers(tmp_path / "b.h5", {
        "train": fit_codes,
        "ood": {0: planted_codes((rule["ood"] + 1) % classes, 1.0, 1.0), 1: planted_codes(rule["ood"], 5.0, 0.5)},
    }, rule)
    for path, better_on_test in ((favours_layer_0, 0), (favours_layer_1, 1)):
        table = decode(path, "rule", progress=False)
        accuracy = table[table["metric"] == "accuracy"].set_index("layer")
        assert accuracy["value"].idxmax() == better_on_test
        assert accuracy.loc[1, "validation"] > 0.95 > accuracy.loc[0, "validation"] > 0.4
        assert set(table.loc[table["selected"], "layer"]) == {1}, "validation chooses layer 1 either way"
        (chosen,) = headline_rows(table).itertuples()
        assert (chosen.layer, chosen.value) == (1, accuracy.loc[1, "value"])  # its test score is what is reported
    assert accuracy.loc[0, "value"] < 0.2 and _row(decode(favours_layer_0, "rule", layers=[1], progress=False),
                                                   metric="accuracy")["value"] < 0.2


def test_one_column_per_site_and_several_models(tmp_path, planted):
    softmax = write_codes(tmp_path / "softmax.h5", n_per_split={"train": 300, "ood": 300}, sites_per_layer=2,
                          model_name="softmax", seed=1)
    table = decode([planted, softmax], "query_rule[-1]", layers=[1], per_site=True, progress=False)
    accuracy = table[table["metric"] == "accuracy"]
    assert sorted(zip(accuracy["model"], accuracy["site"], strict=True)) == [
        ("hyla", "l1_q10_k5"), ("softmax", "l1_q10_k5"), ("softmax", "l1_q11_k5"),
    ]
    assert set(table["label"]) == {"query_rule[-1]"} and set(table["file"]) == {str(planted), str(softmax)}
    assert (accuracy["value"] > 0.95).all()
    # one site of one layer is selected per file
    assert table[table["selected"]].groupby("file")["site"].nunique().tolist() == [1, 1]


def test_multi_hot_label_per_column_scores_and_their_baselines(tmp_path):
    path = write_codes(tmp_path / "terms.h5", n_per_split={"train": 300, "ood": 300},
                       absent_terms_in={"train": (7,)})
    table = decode(path, "term_present", progress=False)
    code_file = CodeFile(path)
    fit, test = code_file.labels("term_present", "train"), code_file.labels("term_present", "ood")
    assert fit[:, 7].sum() == 0 and test[:, 7].sum() > 0
    per_column = table[table["label"] != "term_present"]
    assert len(per_column) == 2 * 8 * 3 and set(per_column["label"]) == {f"term_present[{j}]" for j in range(8)}
    assert set(per_column["metric"]) == {"f1", "balanced_accuracy", "auroc"}
    test_prevalence = test.mean(axis=0)
    for column in range(7):
        label = f"term_present[{column}]"
        assert _row(table, layer=1, label=label, metric="f1")["value"] > 0.95
        assert _row(table, layer=1, label=label, metric="auroc")["value"] > 0.99
        assert _row(table, layer=0, label=label, metric="f1")["value"] < 0.5
        for layer in (0, 1):
            f1 = _row(table, layer=layer, label=label, metric="f1")
            assert f1["shuffled_labels"] < 0.45
            # the column's fit prevalence is about 2/7 < 0.5: 'majority' never predicts a 1, F1 0
            assert f1["majority"] == 0.0
            assert f1["all_present"] == pytest.approx(2 * test_prevalence[column] / (1 + test_prevalence[column]))
            for metric in ("balanced_accuracy", "auroc"):
                row = _row(table, layer=layer, label=label, metric=metric)
                assert row["majority"] == row["all_present"] == row["prevalence_random"] == 0.5
    never_seen = _row(table, layer=1, label="term_present[7]", metric="f1")
    assert never_seen["value"] == 0.0 and np.isnan(never_seen["regularization"])
    assert "no probe: value 1 never occurs in the fit split, predicted 0 throughout" in never_seen["note"]
    assert _row(table, layer=1, label="term_present[7]", metric="auroc")["value"] == 0.5

    for layer in (0, 1):
        for metric in ("f1", "balanced_accuracy", "auroc"):
            mean = _row(table, layer=layer, metric=f"mean_{metric}")
            columns = per_column[(per_column["layer"] == layer) & (per_column["metric"] == metric)]
            assert mean["label"] == "term_present"
            for field in ("value", "shuffled_labels", "majority", "all_present"):  # all 8 columns have both values
                assert mean[field] == pytest.approx(columns[field].mean())
    mean_f1_noise = _row(table, layer=0, metric="mean_f1")
    all_present = np.mean(2 * test_prevalence / (1 + test_prevalence))
    assert mean_f1_noise["all_present"] == pytest.approx(all_present) and all_present > 0.3
    assert (mean_f1_noise["strongest_baseline"], mean_f1_noise["beats_baselines"]) == ("all_present", False)
    assert _row(table, layer=1, metric="mean_f1")["value"] > 7 * 0.95 / 8
    assert _row(table, layer=1, metric="mean_balanced_accuracy")["beats_baselines"]
    assert set(table.loc[table["selected"], "layer"]) == {1}
    assert headline_rows(table)["metric"].tolist() == ["mean_balanced_accuracy"]
    (line,) = headline_lines(table)
    assert line.startswith("hyla         decoding term_present (train -> ood), layer 1 chosen on train: "
                           "mean_balanced_accuracy 0.9")
    assert "mean_auroc" in line and "mean_f1" in line and " beats " in line
    assert set(summary_rows(table)["metric"]) == {"mean_f1", "mean_balanced_accuracy", "mean_auroc"}


def test_a_one_class_column_is_reported_undefined_never_silently_nan(tmp_path):
    # term 6 never occurs in the test split, term 7 never in the fit split
    path = write_codes(tmp_path / "terms.h5", n_per_split={"train": 300, "ood": 300},
                       absent_terms_in={"train": (7,), "ood": (6,)})
    table = decode(path, "term_present", layers=[1], progress=False)
    for metric in ("balanced_accuracy", "auroc"):
        row = _row(table, label="term_present[6]", metric=metric)
        assert np.isnan(row["value"]) and np.isnan(row["majority"]) and np.isnan(row["shuffled_labels"])
        assert f"{metric} undefined: the column is 0 throughout split 'ood' (it needs both values)" in row["note"]
        assert pd.isna(row["beats_baselines"]) and row["strongest_baseline"] == ""
        mean = _row(table, metric=f"mean_{metric}")
        assert mean["note"] == "mean over the 7 of 8 columns with both values in split 'ood'"
        defined = table[(table["metric"] == metric) & (table["label"] != "term_present[6]")]
        assert mean["value"] == pytest.approx(defined["value"].mean()) and np.isfinite(mean["value"])
        # the validation mean is over the 7 columns with both values in the fit split: 0-6
        fitted = table[(table["metric"] == metric) & (table["label"] != "term_present[7]")]
        assert mean["validation"] == pytest.approx(fitted["validation"].mean())
    assert _row(table, metric="mean_f1")["note"] == "mean over the 7 of 8 columns with a 1 in split 'ood'"
    nan_values = table[table["value"].isna()]
    assert len(nan_values) and nan_values["note"].str.contains("undefined").all()

    # A column with a 1 everywhere in the test split: its AUROC is undefined too.
    fit = make_labels(np.random.default_rng(1), 200)
    test = make_labels(np.random.default_rng(2), 200)
    test["term_present"][:, 0] = 1
    everywhere = write_codes(tmp_path / "everywhere.h5", labels_of_split={"train": fit, "ood": test},
                             n_per_split={"train": 200, "ood": 200})
    row = _row(decode(everywhere, "term_present", layers=[1], progress=False), label="term_present[0]", metric="auroc")
    assert np.isnan(row["value"]) and "the column is 1 throughout split 'ood'" in row["note"]


def test_ridge_r2_of_planted_bits_and_of_an_unrelated_target(planted):
    table = regress(planted, "negation_bits", progress=False)
    code_file = CodeFile(planted)
    fit = code_file.labels("negation_bits", "train").reshape(400, -1).astype(float)
    test = code_file.labels("negation_bits", "ood").reshape(400, -1).astype(float)
    # R² of predicting the fitting split's mean, computed here independently
    constant_r2 = 1 - ((test - fit.mean(0)) ** 2).sum(0) / ((test - test.mean(0)) ** 2).sum(0)
    outputs = [f"negation_bits[{k},{bit}]" for k in range(2) for bit in range(3)]
    for index, output in enumerate(outputs):
        assert _row(table, layer=1, label=output)["value"] > 0.9
        assert _row(table, layer=1, label=output)["validation"] > 0.9
        assert _row(table, layer=0, label=output)["value"] < 0.05
        for layer in (0, 1):
            row = _row(table, layer=layer, label=output)
            assert row["metric"] == "r2" and row["regularization_param"] == "alpha"
            # a probe fitted to shuffled targets is a random direction: near 0, a little above by luck
            # where the codes do carry the bits (layer 1)
            assert row["shuffled_labels"] < 0.15
            assert row["majority"] == pytest.approx(constant_r2[index])
    assert _row(table, layer=1, metric="mean_r2")["value"] > 0.9
    assert (table.loc[table["metric"] == "mean_r2", "shuffled_labels"] < 0.05).all()
    assert set(table.loc[table["selected"], "layer"]) == {1}

    target = regress(planted, "target", layers=[1], progress=False)
    assert list(target["metric"]) == ["r2"] and target["value"].iloc[0] < 0.05


def test_write_table_csv_and_json(tmp_path, planted):
    table = decode(planted, "rule", layers=[1], progress=False)
    csv_path, json_path = write_table(table, tmp_path / "out" / "rule_decoding")
    assert (csv_path.name, json_path.name) == ("rule_decoding.csv", "rule_decoding.json")
    from_csv = pd.read_csv(csv_path, keep_default_na=False, na_values=[""])
    assert list(from_csv.columns) == list(COLUMNS)
    np.testing.assert_allclose(from_csv["value"], table["value"])
    assert headline_lines(from_csv) == headline_lines(table)
    records = json.loads(json_path.read_text())
    assert len(records) == 3 and records[0]["metric"] == "accuracy" and set(records[0]) == set(COLUMNS)
    assert records[0]["selected"] is True and records[0]["beats_baselines"] is True


def test_classes_of_the_test_split_missing_from_fitting_are_noted(tmp_path):
    rng = np.random.default_rng(5)
    train = make_labels(rng, 200)
    train["rule"] = np.where(train["rule"] == 7, 0, train["rule"])
    path = write_codes(tmp_path / "c.h5", labels_of_split={"train": train, "ood": make_labels(rng, 200)},
                       n_per_split={"train": 200, "ood": 200})
    table = decode(path, "rule", layers=[1], progress=False)
    accuracy = _row(table, metric="accuracy")
    assert "test classes [7] never occur in the fit split" in accuracy["note"]
    share_of_seven = np.mean(CodeFile(path).labels("rule", "ood") == 7)
    assert 0.98 * (1 - share_of_seven) < accuracy["value"] <= 1 - share_of_seven
    assert _row(table, metric="balanced_accuracy")["value"] == pytest.approx(7 / 8, abs=0.01)


def test_progress_bar_on_stderr_unless_turned_off(planted, capsys):
    decode(planted, "rule", layers=[1], cv=2, Cs=[1.0], progress=False)
    assert capsys.readouterr().err == ""
    decode(planted, "rule", cv=2, Cs=[1.0])
    assert "decode rule" in capsys.readouterr().err


def test_errors_say_what_is_wrong(tmp_path, planted):
    assert issubclass(ProbeError, LatentcodeError) and issubclass(ProbeError, ValueError)
    # the message `latentcode probe` prints after --label (issue 33: one check, plan_probe, for both)
    with pytest.raises(UsageError, match=r"^rules: .* has no label 'rules'; its labels are \['negation_bits', 'query_rule'"):
        decode(planted, "rules")
    with pytest.raises(ProbeError, match=r"label 'target' holds continuous values.*Use regress\(\)"):
        decode(planted, "target")
    with pytest.raises(ProbeError, match=r"label 'query_rule' has shape \[N, 4\] and is not multi-hot.*'query_rule\[-1\]'"):
        decode(planted, "query_rule")

    rng = np.random.default_rng(0)
    train = make_labels(rng, 60)
    train["rule"] = np.arange(60) % 7  # classes 0-6 have 8 or 9 examples
    train["rule"][:2] = 7
    few = write_codes(tmp_path / "few.h5", labels_of_split={"train": train, "ood": make_labels(rng, 20)})
    with pytest.raises(ProbeError, match=r"too few examples of label 'rule' to fit with 3-fold cross-validation: "
                                         r"class 7 has 2; every class needs at least 3 examples"):
        decode(few, "rule")
    assert len(decode(few, "rule", cv=2, layers=[1], progress=False)) == 3, "2 examples suffice for 2 folds"

    constant = write_codes(tmp_path / "constant.h5", n_per_split={"train": 160, "ood": 20}, constant_layers=(0,))
    with pytest.raises(ProbeError, match=r"the codes of layer 0 at site all \(1 site: l0_q10_k5\) are constant "
                                         r"in split 'train'"):
        decode(constant, "rule", layers=[0], progress=False)
    with pytest.raises(ProbeError, match=r"the codes of layer 0 at site l0_q10_k5 are constant"):
        regress(constant, "target", per_site=True, layers=[0], progress=False)
    # One constant layer among informative ones is a finding, not an error: it is noted, and its
    # probe can do no better than the class prior.
    table = decode(constant, "rule", progress=False)
    layer_0 = _row(table, metric="accuracy", layer=0)
    assert "codes constant in split 'train'" in layer_0["note"]
    fit, test = CodeFile(constant).labels("rule", "train"), CodeFile(constant).labels("rule", "ood")
    counts = np.bincount(fit)
    most_frequent = np.flatnonzero(counts == counts.max())
    assert any(layer_0["value"] == pytest.approx(np.mean(test == c)) for c in most_frequent)
    assert _row(table, metric="accuracy", layer=1)["note"] == ""
    with pytest.raises(CodeFileError, match=r"no sites in layer 5; its layers are \[0, 1\]"):
        decode(planted, "rule", layers=[5])
    with pytest.raises(UsageError, match=r"^test: .* has no split 'test'; its splits are \['train', 'ood'\]"):
        decode(planted, "rule", test_split="test")


def test_auroc_of_a_column_is_scikit_learns_on_the_probabilities_of_its_probe(planted):
    table = decode(planted, "term_present", layers=[1], progress=False)
    code_file = CodeFile(planted)
    codes_fit, codes_test = code_file.layer_codes(1, "train"), code_file.layer_codes(1, "ood")
    fit, test = code_file.labels("term_present", "train")[:, 3], code_file.labels("term_present", "ood")[:, 3]
    # the probe of a column: C chosen by F1 on the same folds
    search = GridSearchCV(_logistic_pipeline(), {"logistic__C": list(DEFAULT_CS)}, scoring="f1",
                          cv=StratifiedKFold(n_splits=3, shuffle=True, random_state=0)).fit(codes_fit, fit)
    row = _row(table, label="term_present[3]", metric="auroc")
    assert row["regularization"] == search.best_params_["logistic__C"]
    assert row["value"] == pytest.approx(roc_auc_score(test, search.predict_proba(codes_test)[:, 1]), abs=1e-3)
