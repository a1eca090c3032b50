"""Probes recover planted signals, stay at chance without one, and report chance levels right."""

import json

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, StratifiedKFold
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from latentcode.analysis.probes import (
    COLUMNS,
    DEFAULT_CS,
    _accuracy,
    _fit_logistic,
    decode,
    regress,
    write_table,
)
from latentcode.store import CodeFile, CodeFileError
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


def test_probe_recovers_a_planted_rule_and_stays_at_chance_without_one(planted):
    table = decode(planted, "rule", fit_split="train", test_split="ood")
    assert list(table.columns) == list(COLUMNS) and len(table) == 4  # 2 layers x (accuracy, macro_f1)
    assert set(table["site"]) == {"all"} and set(table["model"]) == {"hyla"} and set(table["label"]) == {"rule"}
    assert (table["n_fit"] == 400).all() and (table["n_test"] == 400).all()
    assert table["regularization"].isin(DEFAULT_CS).all() and set(table["regularization_param"]) == {"C"}

    for metric in ("accuracy", "macro_f1"):
        assert _row(table, layer=1, metric=metric)["value"] > 0.97, "the rule is planted in layer 1"
        assert _row(table, layer=0, metric=metric)["value"] < 0.3, "layer 0 is noise"
        for layer in (0, 1):  # the shuffled-label control is at chance even where the signal is
            assert _row(table, layer=layer, metric=metric)["chance"] < 0.3

    # the majority-class predictor, computed here independently
    code_file = CodeFile(planted)
    fit, test = code_file.labels("rule", "train"), code_file.labels("rule", "ood")
    majority = np.bincount(fit).argmax()
    share = np.mean(test == majority)
    assert majority == 2 and share > 0.17
    for layer in (0, 1):
        assert _row(table, layer=layer, metric="accuracy")["chance_majority"] == pytest.approx(share)
        # F1 of the majority class is 2p/(1+p) (precision p, recall 1); every other class scores 0
        expected_macro_f1 = 2 * share / (1 + share) / len(np.unique(test))
        assert _row(table, layer=layer, metric="macro_f1")["chance_majority"] == pytest.approx(expected_macro_f1)


def test_the_warm_started_grid_search_matches_scikit_learns():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 300)
    codes = 0.3 * rng.normal(size=(4, 20))[labels] + rng.normal(size=(300, 20))  # weak: C matters
    probe, C, scores = _fit_logistic(codes, labels, DEFAULT_CS[::-1], 3, 0, _accuracy)
    pipeline = Pipeline([("standardize", StandardScaler()),
                         ("logistic", LogisticRegression(solver="newton-cg", max_iter=1000))])
    search = GridSearchCV(pipeline, {"logistic__C": list(DEFAULT_CS)}, scoring="accuracy",
                          cv=StratifiedKFold(n_splits=3, shuffle=True, random_state=0)).fit(codes, labels)
    np.testing.assert_allclose(scores, search.cv_results_["mean_test_score"])
    assert C == search.best_params_["logistic__C"] and C < max(DEFAULT_CS)
    np.testing.assert_allclose(probe.predict_proba(codes), search.predict_proba(codes), atol=1e-4)


def test_shuffled_control_is_the_same_probe_fitted_on_permuted_labels(planted):
    table = decode(planted, "rule", layers=[1], seed=3)
    code_file = CodeFile(planted)
    codes_fit, codes_test = code_file.layer_codes(1, "train"), code_file.layer_codes(1, "ood")
    fit, test = code_file.labels("rule", "train"), code_file.labels("rule", "ood")
    permuted = fit[np.random.default_rng(3).permutation(len(fit))]
    pipeline = Pipeline([("standardize", StandardScaler()),
                         ("logistic", LogisticRegression(solver="newton-cg", max_iter=1000))])
    control = GridSearchCV(pipeline, {"logistic__C": list(DEFAULT_CS)}, scoring="accuracy",
                           cv=StratifiedKFold(n_splits=3, shuffle=True, random_state=3)).fit(codes_fit, permuted)
    assert _row(table, metric="accuracy")["chance"] == pytest.approx(np.mean(control.predict(codes_test) == test))
    assert not np.allclose(table["chance"], decode(planted, "rule", layers=[1], seed=4)["chance"])


def test_one_column_per_site_and_several_models(tmp_path, planted):
    softmax = write_codes(tmp_path / "softmax.h5", n_per_split={"train": 300, "ood": 300}, sites_per_layer=2,
                          model_name="softmax", seed=1)
    table = decode([planted, softmax], "query_rule[-1]", layers=[1], per_site=True)
    accuracy = table[table["metric"] == "accuracy"]
    assert sorted(zip(accuracy["model"], accuracy["site"], strict=True)) == [
        ("hyla", "l1_q10_k5"), ("softmax", "l1_q10_k5"), ("softmax", "l1_q11_k5"),
    ]
    assert set(table["label"]) == {"query_rule[-1]"} and set(table["file"]) == {str(planted), str(softmax)}
    assert (accuracy["value"] > 0.95).all()


def test_multi_hot_label_per_column_f1_and_a_column_never_seen_in_fitting(tmp_path):
    path = write_codes(tmp_path / "terms.h5", n_per_split={"train": 300, "ood": 300},
                       absent_terms_in={"train": (7,)})
    table = decode(path, "term_present")
    code_file = CodeFile(path)
    fit, test = code_file.labels("term_present", "train"), code_file.labels("term_present", "ood")
    assert fit[:, 7].sum() == 0 and test[:, 7].sum() > 0
    per_column = table[table["metric"] == "f1"]
    assert len(per_column) == 2 * 8 and set(per_column["label"]) == {f"term_present[{j}]" for j in range(8)}
    for column in range(7):
        assert _row(table, layer=1, label=f"term_present[{column}]")["value"] > 0.95
        assert _row(table, layer=0, label=f"term_present[{column}]")["value"] < 0.5
        for layer in (0, 1):
            row = _row(table, layer=layer, label=f"term_present[{column}]")
            assert row["chance"] < 0.45
            # the majority class of the fitting column is 0: never predicts a positive, F1 0
            assert (np.bincount(fit[:, column]).argmax(), row["chance_majority"]) == (0, 0.0)
    never_seen = _row(table, layer=1, label="term_present[7]")
    assert never_seen["value"] == 0.0 and np.isnan(never_seen["regularization"])
    assert "never occurs in the fit split" in never_seen["note"]

    for layer in (0, 1):
        mean = _row(table, layer=layer, metric="mean_f1")
        columns = per_column[per_column["layer"] == layer]
        assert mean["label"] == "term_present"
        assert mean["value"] == pytest.approx(columns["value"].mean())  # all 8 columns have test positives
        assert mean["chance"] == pytest.approx(columns["chance"].mean())
    assert _row(table, layer=1, metric="mean_f1")["value"] > 7 * 0.95 / 8


def test_ridge_r2_of_planted_bits_and_of_an_unrelated_target(planted):
    table = regress(planted, "negation_bits")
    code_file = CodeFile(planted)
    fit = code_file.labels("negation_bits", "train").reshape(400, -1).astype(float)
    test = code_file.labels("negation_bits", "ood").reshape(400, -1).astype(float)
    # R² of predicting the fitting split's mean, computed here independently
    constant_r2 = 1 - ((test - fit.mean(0)) ** 2).sum(0) / ((test - test.mean(0)) ** 2).sum(0)
    outputs = [f"negation_bits[{k},{bit}]" for k in range(2) for bit in range(3)]
    for index, output in enumerate(outputs):
        assert _row(table, layer=1, label=output)["value"] > 0.9
        assert _row(table, layer=0, label=output)["value"] < 0.05
        for layer in (0, 1):
            row = _row(table, layer=layer, label=output)
            assert row["metric"] == "r2" and row["regularization_param"] == "alpha"
            # a probe fitted to shuffled targets is a random direction: near 0, a little above by luck
            # where the codes do carry the bits (layer 1)
            assert row["chance"] < 0.15
            assert row["chance_majority"] == pytest.approx(constant_r2[index])
    assert _row(table, layer=1, metric="mean_r2")["value"] > 0.9
    assert (table.loc[table["metric"] == "mean_r2", "chance"] < 0.05).all()

    target = regress(planted, "target", layers=[1])
    assert list(target["metric"]) == ["r2"] and target["value"].iloc[0] < 0.05


def test_write_table_csv_and_json(tmp_path, planted):
    table = decode(planted, "rule", layers=[1])
    csv_path, json_path = write_table(table, tmp_path / "out" / "rule_decoding")
    assert (csv_path.name, json_path.name) == ("rule_decoding.csv", "rule_decoding.json")
    from_csv = pd.read_csv(csv_path, keep_default_na=False, na_values=[""])
    assert list(from_csv.columns) == list(COLUMNS)
    np.testing.assert_allclose(from_csv["value"], table["value"])
    records = json.loads(json_path.read_text())
    assert len(records) == 2 and records[0]["metric"] == "accuracy" and set(records[0]) == set(COLUMNS)


def test_classes_of_the_test_split_missing_from_fitting_are_noted(tmp_path):
    rng = np.random.default_rng(5)
    train = make_labels(rng, 200)
    train["rule"] = np.where(train["rule"] == 7, 0, train["rule"])
    path = write_codes(tmp_path / "c.h5", labels_of_split={"train": train, "ood": make_labels(rng, 200)},
                       n_per_split={"train": 200, "ood": 200})
    table = decode(path, "rule", layers=[1])
    accuracy = _row(table, metric="accuracy")
    assert "test classes [7] never occur in the fit split" in accuracy["note"]
    share_of_seven = np.mean(CodeFile(path).labels("rule", "ood") == 7)
    assert 0.98 * (1 - share_of_seven) < accuracy["value"] <= 1 - share_of_seven


def test_errors_say_what_is_wrong(tmp_path, planted):
    with pytest.raises(CodeFileError, match=r"no label 'rules'; the labels it has are \['negation_bits', 'query_rule'"):
        decode(planted, "rules")
    with pytest.raises(ValueError, match=r"label 'target' holds continuous values.*Use regress\(\)"):
        decode(planted, "target")
    with pytest.raises(ValueError, match=r"label 'query_rule' has shape \[N, 4\] and is not multi-hot.*'query_rule\[-1\]'"):
        decode(planted, "query_rule")

    rng = np.random.default_rng(0)
    train = make_labels(rng, 60)
    train["rule"] = np.arange(60) % 7  # classes 0-6 have 8 or 9 examples
    train["rule"][:2] = 7
    few = write_codes(tmp_path / "few.h5", labels_of_split={"train": train, "ood": make_labels(rng, 20)})
    with pytest.raises(ValueError, match=r"too few examples of label 'rule' to fit with 3-fold cross-validation: "
                                         r"class 7 has 2; every class needs at least 3 examples"):
        decode(few, "rule")
    assert len(decode(few, "rule", cv=2, layers=[1])) == 2, "2 examples suffice for 2 folds"

    constant = write_codes(tmp_path / "constant.h5", n_per_split={"train": 160, "ood": 20}, constant_layers=(0,))
    with pytest.raises(ValueError, match=r"the codes of layer 0 at site all \(1 site: l0_q10_k5\) are constant "
                                         r"in split 'train'"):
        decode(constant, "rule", layers=[0])
    with pytest.raises(ValueError, match=r"the codes of layer 0 at site l0_q10_k5 are constant"):
        regress(constant, "target", per_site=True, layers=[0])
    # One constant layer among informative ones is a finding, not an error: it is noted, and its
    # probe can do no better than the class prior.
    table = decode(constant, "rule")
    layer_0 = _row(table, metric="accuracy", layer=0)
    assert "codes constant in split 'train'" in layer_0["note"]
    fit, test = CodeFile(constant).labels("rule", "train"), CodeFile(constant).labels("rule", "ood")
    counts = np.bincount(fit)
    most_frequent = np.flatnonzero(counts == counts.max())
    assert any(layer_0["value"] == pytest.approx(np.mean(test == c)) for c in most_frequent)
    assert _row(table, metric="accuracy", layer=1)["note"] == ""
    with pytest.raises(CodeFileError, match=r"no sites in layer 5; its layers are \[0, 1\]"):
        decode(planted, "rule", layers=[5])
    with pytest.raises(CodeFileError, match=r"no split 'test'"):
        decode(planted, "rule", test_split="test")
