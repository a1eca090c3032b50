"""The key-query relations of hand-built sequences, each expected value worked out by hand from the
definitions (latentcode/analysis/token_relations.py), and the two sequence sources."""

import numpy as np
import pytest

from latentcode.analysis.token_relations import RELATIONS, RelationError, relations_of, sample_pairs
from latentcode.tasks.token_sequences import repeated_random_tokens

A, B, C, X = 10, 11, 12, 13


def names(tokens, pairs):
    queries, keys = np.array(pairs).T
    return relations_of(np.array(tokens), queries, keys).names()


def test_each_relation_alone():
    #          0  1  2  3  4  5
    tokens = [X, A, B, C, A, C]
    # (4, 0): key 0 -> sink. (4, 3): k = q - 1 -> previous. (4, 2): tokens[1] == A == tokens[4] -> induction.
    # (4, 1): tokens[1] == tokens[4], and tokens[0] != A -> duplicate. (5, 2): B, after A; C -> other.
    assert names(tokens, [(4, 0), (4, 3), (4, 2), (4, 1), (5, 2)]) == [
        "sink", "previous", "induction", "duplicate", "other"]


def test_precedence_where_relations_overlap():
    # "a a a": (2, 1) is previous, duplicate (tokens[1] == a) and induction (tokens[0] == a) -> previous
    assert names([A, A, A], [(2, 1)]) == ["previous"]
    # "a a x a": (3, 1) is duplicate and induction (tokens[0] == a) -> induction; (3, 0) duplicate but sink
    assert names([A, A, X, A], [(3, 1), (3, 0)]) == ["induction", "sink"]
    # "x a b a b" : (4, 3) previous and induction (tokens[2] == b) -> previous
    assert names([X, A, B, A, B], [(4, 3)]) == ["previous"]
    # the query itself: other (its own token is no earlier copy), except at position 0: sink
    assert names([A, B, A], [(2, 2), (0, 0)]) == ["other", "sink"]


def test_distance_and_token_ids():
    labels = relations_of(np.array([X, A, B, C]), np.array([3, 2]), np.array([0, 1]))
    assert labels.distance.tolist() == [3, 1]
    assert labels.query_token.tolist() == [C, B]
    assert labels.key_token.tolist() == [X, A]


@pytest.mark.parametrize("pair", [(1, 2), (4, 0), (2, -1)])
def test_non_causal_pairs_are_refused(pair):
    with pytest.raises(RelationError, match=r"expected 0 <= k <= q < 4"):
        relations_of(np.array([X, A, B, C]), np.array([pair[0]]), np.array([pair[1]]))


def test_repeated_random_tokens_have_induction_at_distance_half_minus_one():
    half = 6
    tokens = repeated_random_tokens(3, half, vocab_size=50, seed=1, bos=0, low=5)
    assert tokens.shape == (3, 1 + 2 * half)
    assert (tokens[:, 0] == 0).all()
    assert (tokens[:, 1:1 + half] == tokens[:, 1 + half:]).all()
    assert all(len(set(row[1:1 + half])) == half for row in tokens)  # distinct within a copy
    for row in tokens:
        for query in range(2 + half, 1 + 2 * half):  # second copy, past its first token
            keys = np.arange(query + 1)
            relation = np.array(relations_of(row, np.full(len(keys), query), keys).names())
            expected = np.full(len(keys), "other", dtype=object)
            expected[0], expected[query - 1] = "sink", "previous"
            expected[query - half + 1], expected[query - half] = "induction", "duplicate"
            assert relation.tolist() == expected.tolist(), query


def test_sample_pairs_draws_each_relation_and_only_causal_pairs():
    tokens = repeated_random_tokens(1, 8, vocab_size=100, seed=0, low=5)[0]
    queries = np.arange(10, 17)
    rng = np.random.default_rng(0)
    q, k = sample_pairs(tokens, queries, per_relation=4, rng=rng)
    assert np.isin(q, queries).all() and (k < q).all()
    counts = np.bincount(relations_of(tokens, q, k).relation, minlength=len(RELATIONS))
    assert counts.tolist() == [4, 4, 4, 4, 4]
    assert len(set(zip(q.tolist(), k.tolist(), strict=True))) == len(q)  # no pair twice

