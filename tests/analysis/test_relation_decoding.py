"""Decoding relations from codes beside the distance-only baseline, on synthetic codes where the
answer is known by construction."""

import numpy as np

from latentcode.analysis.relation_decoding import decode_relations, distance_features, selected_rows


def synthetic(n: int, seed: int, distance_tells: bool):
    """Layer 0: noise. Layer 1: head r is large for relation r (5 relations, 5 heads). The distance
    equals the relation (distance_tells) or is random."""
    rng = np.random.default_rng(seed)
    relation = np.repeat(np.arange(5), n // 5)
    codes = rng.normal(size=(len(relation), 2, 5))
    codes[np.arange(len(relation)), 1, relation] += 4.0
    distance = relation + 1 if distance_tells else rng.integers(1, 6, size=len(relation))
    return {"codes": codes, "relation": relation, "distance": distance}


def test_the_informative_layer_is_selected_and_beats_every_baseline():
    fit = synthetic(100, 0, distance_tells=False)
    table = decode_relations(fit, {"held out": synthetic(60, 1, distance_tells=False)})
    chosen = selected_rows(table)
    single = chosen[chosen.layer != "all"].iloc[0]
    assert single.layer == 1
    assert single.balanced_accuracy > 0.9 and single.beats_baselines
    noise = table[table.layer == 0].iloc[0]
    assert noise.balanced_accuracy < 0.45  # chance is 0.2
    assert single.majority == 0.2  # one class predicted: recall 1 for it, 0 for four others
    assert single.distance_only < 0.45 and single.shuffled_labels < 0.45


def test_distance_only_baseline_reads_the_distance_and_not_beyond_it():
    fit = synthetic(100, 0, distance_tells=True)
    table = decode_relations(fit, {"same rule": synthetic(60, 1, distance_tells=True),
                                   "rule broken": synthetic(60, 2, distance_tells=False)})
    same = table[(table.test == "same rule") & (table.layer == 0)].iloc[0]
    broken = table[(table.test == "rule broken") & (table.layer == 1)].iloc[0]
    assert same.distance_only == 1.0 and same.strongest_baseline == "distance_only"
    assert broken.distance_only < 0.45 and broken.balanced_accuracy > 0.9


def test_unseen_distances_have_no_features():
    assert distance_features(np.array([1, 3, 9]), np.array([1, 2, 3])).tolist() == [[1, 0, 0], [0, 0, 1], [0, 0, 0]]


def test_head_separation_is_the_auroc_of_each_relation_against_other_pairs():
    from latentcode.analysis.plots.relations import SEPARATED, head_separation

    relation = np.array([0, 1, 2, 3, 4, 4, 2, 4])  # sink, previous, induction, duplicate, other x3, induction
    codes = np.zeros((8, 1, 2))
    codes[:, 0, 0] = [9, 0, 5, 0, 1, 2, 6, 3]   # head 0: both induction pairs above every other pair
    codes[:, 0, 1] = [0, 0, 0, 0, 1, 2, 3, 3]   # head 1: induction pairs (0, 3) below or tied with others (1, 2, 3)
    separation = head_separation(codes, relation)
    assert separation.shape == (len(SEPARATED), 1, 2)
    induction = SEPARATED.index("induction")
    assert separation[induction, 0, 0] == 1.0
    # pairs (induction, other): 0 vs 1, 2, 3 -> 0 wins; 3 vs 1, 2 wins, vs 3 ties (half): (0 + 2.5) / 6
    assert separation[induction, 0, 1] == 2.5 / 6
    assert separation[SEPARATED.index("sink"), 0, 0] == 1.0   # 9 above 1, 2, 3
