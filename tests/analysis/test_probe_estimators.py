"""The probes are scikit-learn estimators: `check_estimator` passes for each (for the multi-label
probe, all but the checks that assume one output, each failing for its stated reason), and their
own argument checks say what is wrong."""

import re
import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.utils.estimator_checks import check_estimator

from latentcode.analysis.probes import LogisticProbe, MultiHotProbe, ProbeError, RidgeProbe
from latentcode.errors import LatentcodeError

# scikit-learn's classifier checks draw single-output labels (1-D, class names, or a column of two
# classes offset from 0) and expect predictions [N]; a multi-hot probe takes 0/1 labels [N, C] and
# predicts [N, C]. Each check, why it cannot pass, and what its failure says (tested below).
_LABELS_ONE_TWO = ("the check's labels y [N, 1] take the values {1, 2}; a multi-hot label is 0/1",
                   r"needs 0/1 labels y \[N, C\].*with values \[1, 2\]")
MULTI_HOT_EXPECTED_FAILURES = {
    "check_estimators_dtypes": _LABELS_ONE_TWO,
    "check_classifier_data_not_an_array": _LABELS_ONE_TWO,
    "check_fit2d_1feature": _LABELS_ONE_TWO,
    "check_classifiers_classes": ("the check's labels are class names [N] ('one', 'two'); a multi-hot label is "
                                  "a 0/1 matrix [N, C]", r"needs 0/1 labels y \[N, C\].*got shape \[20\]"),
    "check_classifiers_train": ("the check asserts predictions of shape [N]; a multi-hot probe predicts [N, C] "
                                "(here [N, 1])", None),  # a bare `assert y_pred.shape == (n_samples,)`
}


def _check(estimator, expected_failures=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings of the checks' tiny problems
        return check_estimator(estimator, expected_failed_checks=expected_failures, on_fail=None, on_skip=None)


# Two-value grids: the search is exercised in half the time (the checks fit the probe many times).
@pytest.mark.parametrize("probe", [LogisticProbe(Cs=(0.1, 10.0)), RidgeProbe(alphas=(0.1, 10.0))], ids=type)
def test_logistic_and_ridge_probes_pass_every_check_of_scikit_learn(probe):
    results = _check(probe)
    failed = {result["check_name"]: repr(result["exception"]) for result in results if result["status"] == "failed"}
    assert failed == {}
    assert len([result for result in results if result["status"] == "passed"]) >= 50


def test_the_multi_hot_probe_fails_only_the_single_output_checks_each_for_its_reason():
    reasons = {name: reason for name, (reason, _) in MULTI_HOT_EXPECTED_FAILURES.items()}
    results = _check(MultiHotProbe(Cs=(0.1, 10.0)), reasons)
    failed = {result["check_name"]: repr(result["exception"]) for result in results if result["status"] == "failed"}
    assert failed == {}
    expected_to_fail = [result for result in results if result["expected_to_fail"]]
    # every listed check runs and fails (none is listed in vain) ...
    assert {result["check_name"] for result in expected_to_fail} == set(MULTI_HOT_EXPECTED_FAILURES)
    assert {result["status"] for result in expected_to_fail} == {"xfail"}
    # ... for the reason given
    for result in expected_to_fail:
        _, message = MULTI_HOT_EXPECTED_FAILURES[result["check_name"]]
        if message is None:
            assert type(result["exception"]) is AssertionError and not str(result["exception"])
        else:
            assert re.search(message, str(result["exception"])), result["exception"]  # ours, or quoted by the check
    assert len([result for result in results if result["status"] == "passed"]) >= 45


def test_the_multi_hot_probe_predicts_every_column_as_its_own_probe():
    rng = np.random.default_rng(0)
    codes = rng.normal(size=(120, 5))
    labels = np.stack([codes[:, 0] > 0, codes[:, 1] > 0.5, np.zeros(120, bool)], axis=1).astype(np.int64)
    probe = MultiHotProbe(random_state=1).fit(codes, labels)
    assert probe.n_features_in_ == 5 and probe.classes_.tolist() == [0, 1, 2]
    assert probe.probes_[2] is None and probe.constant_.tolist() == [-1, -1, 0] and np.isnan(probe.C_[2])
    for column in (0, 1):
        alone = LogisticProbe(random_state=1, selection_score=probe.probes_[column].selection_score)
        alone.fit(codes, labels[:, column])
        np.testing.assert_array_equal(probe.predict(codes)[:, column], alone.predict(codes))
        np.testing.assert_allclose(probe.predict_proba(codes)[:, column], alone.predict_proba(codes)[:, 1])
        assert probe.C_[column] == alone.C_
    assert (probe.predict(codes)[:, 2] == 0).all() and (probe.predict_proba(codes)[:, 2] == 0).all()


def test_parameters_are_stored_as_given_and_random_state_seeds_the_folds():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 150)
    codes = 0.4 * rng.normal(size=(3, 6))[labels] + rng.normal(size=(150, 6))
    probe = LogisticProbe(Cs=[0.1, 1.0], cv=4, random_state=5)
    assert probe.get_params() == {"Cs": [0.1, 1.0], "cv": 4, "random_state": 5,
                                  "selection_score": probe.selection_score}
    fitted = clone(probe).fit(codes, labels)
    again = clone(probe).set_params(random_state=5).fit(codes, labels)
    other = clone(probe).set_params(random_state=6).fit(codes, labels)
    np.testing.assert_array_equal(fitted.cv_scores_, again.cv_scores_)
    assert not np.array_equal(fitted.validation_predictions_, other.validation_predictions_)
    with pytest.raises(NotFittedError):
        LogisticProbe().predict(codes)


def test_probe_errors_name_the_argument_the_value_and_what_is_expected():
    rng = np.random.default_rng(0)
    codes, labels = rng.normal(size=(30, 4)), np.arange(30) % 3
    assert issubclass(ProbeError, LatentcodeError) and issubclass(ProbeError, ValueError)
    with pytest.raises(ProbeError, match=r"LogisticProbe\(cv=1\): cross-validation needs an integer number of "
                                         r"folds >= 2"):
        LogisticProbe(cv=1).fit(codes, labels)
    with pytest.raises(ProbeError, match=r"RidgeProbe\(alphas=\[\]\): needs a non-empty list of positive numbers"):
        RidgeProbe(alphas=[]).fit(codes, labels.astype(float))
    with pytest.raises(ProbeError, match=r"LogisticProbe\(Cs=\(1.0, -1.0\)\)"):
        LogisticProbe(Cs=(1.0, -1.0)).fit(codes, labels)
    few = labels.copy()
    few[:28] = np.arange(28) % 2
    with pytest.raises(ProbeError, match=r"too few examples to fit with 3-fold stratified cross-validation: "
                                         r"class 2 has 1; every class needs at least 3 examples"):
        LogisticProbe().fit(codes, few)
    with pytest.raises(ProbeError, match=r"at least 2 classes in y; got one class"):
        LogisticProbe().fit(codes, np.ones(30, int))
    with pytest.raises(ProbeError, match=r"MultiHotProbe needs 0/1 labels y \[N, C\], one column per class; "
                                         r"got shape \[30, 2\] with values \[0, 1, 2\]"):
        MultiHotProbe().fit(codes, np.stack([labels, labels], axis=1))
