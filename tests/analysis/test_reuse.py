"""The code-reuse score on synthetic codes with a planted answer: codes built as a sum of one vector per
constituent (what reuse means) score high on every part; codes drawn at random per composition (no
reuse: a composition's code owes nothing to its constituents) score at their baseline."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from latentcode.analysis.reuse import (
    ReuseError,
    ReusePart,
    combined_score,
    composition_means,
    decodability_part,
    reconstruction_part,
    transplant_part,
)

# More code dimensions than constituents: the constituent vectors are linearly independent, so each
# constituent of a sum is linearly decodable.
N_CONSTITUENTS, WIDTH, PER_COMPOSITION = 10, 16, 12


def split_compositions(seed: int):
    """All pairs of 10 constituents, 60% held out, every constituent kept in training (as the tasks do)."""
    rng = np.random.default_rng(seed)
    pairs = np.array(list(itertools.combinations(range(N_CONSTITUENTS), 2)))
    while True:
        order = rng.permutation(len(pairs))
        train, test = pairs[order[: int(0.4 * len(pairs))]], pairs[order[int(0.4 * len(pairs)):]]
        if len(np.unique(train)) == N_CONSTITUENTS:
            return train, test


def instances(pairs, code_of_pair, rng, noise=0.3):
    multi_hot = np.zeros((len(pairs) * PER_COMPOSITION, N_CONSTITUENTS), dtype=np.int8)
    codes = np.empty((len(multi_hot), WIDTH))
    for index, pair in enumerate(pairs):
        rows = slice(index * PER_COMPOSITION, (index + 1) * PER_COMPOSITION)
        multi_hot[rows, pair] = 1
        codes[rows] = code_of_pair(tuple(pair)) + noise * rng.standard_normal((PER_COMPOSITION, WIDTH))
    return codes, multi_hot


def planted(seed: int, reuse: bool):
    """(codes_fit, constituents_fit, codes_test, constituents_test): reused codes are the sum of the
    constituents' vectors; shuffled codes are a random vector per composition, of the same size."""
    rng = np.random.default_rng([seed, 7])
    vectors = 2 * rng.standard_normal((N_CONSTITUENTS, WIDTH))
    random_codes = {}

    def code_of_pair(pair):
        if reuse:
            return vectors[list(pair)].sum(axis=0)
        return random_codes.setdefault(pair, np.sqrt(2) * 2 * rng.standard_normal(WIDTH))

    train, test = split_compositions(seed)
    return (*instances(train, code_of_pair, rng), *instances(test, code_of_pair, rng))


@pytest.mark.parametrize("seed", [0, 1])
def test_reused_codes_decode_above_their_baseline_and_shuffled_ones_do_not(seed):
    reused = decodability_part(*planted(seed, reuse=True), seed=seed)
    shuffled = decodability_part(*planted(seed, reuse=False), seed=seed)
    # A sum of linearly independent constituent vectors is linearly separable per constituent; with
    # 18 training compositions a probe is not pinned to the constituent's own direction, so it is
    # not perfect on the 27 unseen ones, but far above the 0.5 of a guess.
    assert reused.value > 0.8 and reused.excess > 0.6
    # Random codes per composition: a probe fitted on the training compositions guesses on the
    # unseen ones; 24 unseen compositions leave it some chance variation around 0.5.
    assert abs(shuffled.value - 0.5) < 0.12
    assert shuffled.excess < 0.25
    assert shuffled.baseline >= 0.5


@pytest.mark.parametrize("seed", [0, 1])
def test_reused_codes_are_reconstructed_from_their_constituents_and_shuffled_ones_are_not(seed):
    reused = reconstruction_part(*planted(seed, reuse=True), seed=seed)
    shuffled = reconstruction_part(*planted(seed, reuse=False), seed=seed)
    # Codes that are sums: the additive map fitted on 18 training compositions predicts the 27 unseen
    # ones up to the instance noise averaged over 12 instances (R² near 1).
    assert reused.value > 0.9 and reused.excess > 0.9
    # Its shuffled-constituent control learns nothing that carries over.
    assert reused.baseline < 0.2
    # Random codes: the map predicts nothing about unseen compositions (R² at or below 0, as its baselines).
    assert shuffled.value < 0.15
    assert shuffled.excess < 0.15


def test_reconstruction_baseline_is_the_mean_code_when_shuffling_does_worse():
    part = reconstruction_part(*planted(0, reuse=False), seed=0)
    assert part.baseline_name in ("mean training code", "shuffled constituents")
    assert part.baseline <= 0.1  # neither can predict unseen compositions


def test_transplant_part_reads_follow_against_the_third_donor():
    follows = np.ones(100)
    never = np.zeros(100)
    assert transplant_part(follows, never, 5).excess == 1.0  # the donor's composition always computed
    equal = transplant_part(np.r_[np.ones(30), np.zeros(70)], np.r_[np.zeros(70), np.ones(30)], 5)
    assert equal.value == pytest.approx(0.3) and equal.baseline == pytest.approx(0.3)
    assert equal.excess == 0.0  # a damaged code lands there as often as a third donor's: no transfer
    half = transplant_part(np.r_[np.ones(60), np.zeros(40)], np.r_[np.ones(20), np.zeros(80)], 5)
    assert half.excess == pytest.approx((0.6 - 0.2) / 0.8)


def test_combined_score_is_the_mean_excess_of_the_parts_measured():
    parts = [ReusePart("a", "balanced_accuracy", 0.75, 0.5, "constant guess", 10, 2),
             ReusePart("b", "r2", 0.5, -0.3, "mean training code", 10, 2),  # baseline below 0 counts as 0
             ReusePart("c", "follow", float("nan"), 0.1, "third donor", 0, 2)]
    assert parts[0].excess == pytest.approx(0.5)
    assert parts[1].excess == pytest.approx(0.5)
    assert combined_score(parts) == pytest.approx(0.5)
    assert np.isnan(combined_score(parts[2:]))


def test_composition_means_average_each_distinct_constituent_set():
    codes = np.array([[1.0], [3.0], [10.0]])
    multi_hot = np.array([[1, 1, 0], [1, 1, 0], [0, 1, 1]])
    means, compositions = composition_means(codes, multi_hot)
    assert compositions.tolist() == [[0, 1, 1], [1, 1, 0]]
    assert means[:, 0].tolist() == [10.0, 2.0]


def test_bad_inputs_are_one_line_errors():
    codes_fit, constituents_fit, codes_test, constituents_test = planted(0, reuse=True)
    with pytest.raises(ReuseError, match="same N"):
        reconstruction_part(codes_fit[:-1], constituents_fit, codes_test, constituents_test)
    with pytest.raises(ReuseError, match="0/1 multi-hot"):
        decodability_part(codes_fit, 2 * constituents_fit, codes_test, constituents_test)
    with pytest.raises(ReuseError, match="width"):
        reconstruction_part(codes_fit, constituents_fit, codes_test[:, :3], constituents_test)
    bad = codes_test.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ReuseError, match="NaN"):
        reconstruction_part(codes_fit, constituents_fit, bad, constituents_test)
