"""Label specs: selection of a label or one of its columns, errors, display names."""

import numpy as np
import pytest

from latentcode.analysis.labels import (
    available_labels,
    display_value,
    is_categorical,
    parse_label_spec,
    select_label,
    value_names,
)
from latentcode.store import CodeFile, CodeFileError
from latentcode.tasks.sraven import RULES
from tests.analysis.synthetic import write_codes


@pytest.fixture(scope="module")
def code_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("labels") / "codes.h5"
    return CodeFile(write_codes(path, n_per_split={"train": 20, "ood": 10}))


def test_parse_label_spec():
    assert parse_label_spec("rule") == ("rule", ())
    assert parse_label_spec(" query_rule[-1] ") == ("query_rule", (-1,))
    assert parse_label_spec("negation_bits[0, 2]") == ("negation_bits", (0, 2))
    with pytest.raises(ValueError, match=r"'rule\[x\]' is not a label spec"):
        parse_label_spec("rule[x]")


def test_select_label_and_columns(code_file):
    rule, name = select_label(code_file, "rule", "ood")
    assert name == "rule" and rule.shape == (10,)
    np.testing.assert_array_equal(rule, code_file.labels("rule", "ood"))
    last, name = select_label(code_file, "query_rule[-1]", "train")
    assert name == "query_rule[-1]"
    np.testing.assert_array_equal(last, code_file.labels("query_rule", "train")[:, 3])
    bit, name = select_label(code_file, "negation_bits[1,2]")
    assert name == "negation_bits[1,2]" and bit.shape == (30,)
    np.testing.assert_array_equal(bit, code_file.labels("negation_bits")[:, 1, 2])
    assert select_label(code_file, "negation_bits[1]")[0].shape == (30, 3)
    # not a label but the file's prediction: found too
    assert select_label(code_file, "prediction[0]", "ood")[0].shape == (10,)


def test_select_label_errors_name_what_exists(code_file):
    assert available_labels(code_file)[:5] == ["negation_bits", "query_rule", "rule", "target", "term_present"]
    with pytest.raises(CodeFileError, match=r"no label 'rules'; the labels it has are \['negation_bits', 'query_rule', 'rule'"):
        select_label(code_file, "rules")
    with pytest.raises(ValueError, match=r"index 4 in 'query_rule\[4\]' is out of range for axis 1 \(size 4\)"):
        select_label(code_file, "query_rule[4]")
    with pytest.raises(ValueError, match=r"label 'rule' has one value per example; 'rule\[0\]' gives 1 indices"):
        select_label(code_file, "rule[0]")
    with pytest.raises(CodeFileError, match=r"no split 'test'"):
        select_label(code_file, "rule", "test")


def test_value_names_and_categories(tmp_path, code_file):
    assert value_names(code_file, "rule") == list(RULES)
    assert value_names(code_file, "query_rule[-1]") == list(RULES)
    assert value_names(code_file, "target") is None
    assert display_value(7, list(RULES)) == "distribute_three" and display_value(9, list(RULES)) == "9"
    fuzzy = CodeFile(write_codes(tmp_path / "fuzzy.h5", n_per_split={"train": 5}, task="fuzzy_logic"))
    assert value_names(fuzzy, "rule") is None, "rule names only for SRAVEN files"
    names = value_names(fuzzy, "term_present")
    assert len(names) == 8 and names[0] == "x0∧x1∧x2" and names[5] == "¬x0∧x1∧¬x2"
    assert value_names(fuzzy, "term_present[5]") is None
    assert is_categorical(np.array([0, 3, 3, 1])) and is_categorical(np.array([1.0, 2.0]))
    assert not is_categorical(np.array([0.5, 1.0])) and not is_categorical(np.arange(100))
