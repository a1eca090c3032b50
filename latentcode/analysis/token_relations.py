"""Which known operation a key-query pair of a token sequence is: the relation of key k to query q.

Interpretability already names a few operations of language models without looking at attention;
each is a fact about the token ids alone, so the latent code ``a[:, q, k]`` can be probed for it:

- ``sink``: the key is the first position (k = 0), where heads park attention they do not use;
- ``previous``: the key is the token just before the query (k = q - 1);
- ``induction``: the key follows an earlier copy of the query's token
  (``tokens[k - 1] == tokens[q]`` with 1 <= k <= q): attending there reads what came next last time;
- ``duplicate``: the key is an earlier copy of the query's token (``tokens[k] == tokens[q]``, k < q);
- ``other``: none of these (the query itself, k = q, is ``other`` unless q = 0).

Precedence, where several apply: sink > previous > induction > duplicate > other. The positional
relations (sink, previous) hold for every query whatever the tokens, so a pair they explain is
named by them (in ``"a a a"`` the pair (2, 1) is previous, though also duplicate and induction);
of the content relations, induction (the more specific: it needs the copy one step back) comes
before duplicate (in ``"a a x a"`` the pair (3, 1) is induction, though also duplicate).
tests/analysis/test_token_relations.py checks each overlap.

Numpy only. `relations_of` labels given pairs; `sample_pairs` draws pairs of a sequence with
every relation represented (the samplers never draw k = q or k > q).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latentcode.errors import LatentcodeError

__all__ = ["RELATIONS", "PairLabels", "RelationError", "relations_of", "sample_pairs"]

RELATIONS = ("sink", "previous", "induction", "duplicate", "other")
SINK, PREVIOUS, INDUCTION, DUPLICATE, OTHER = range(len(RELATIONS))


class RelationError(LatentcodeError, ValueError):
    """Pairs that cannot be labelled (a key after its query, a position outside the sequence)."""


@dataclass(frozen=True)
class PairLabels:
    """The labels of pairs ``[N]``: ``relation`` (index into `RELATIONS`), ``distance`` (q - k),
    ``query_token`` and ``key_token`` (token ids at q and k)."""

    relation: np.ndarray
    distance: np.ndarray
    query_token: np.ndarray
    key_token: np.ndarray

    def names(self) -> list[str]:
        return [RELATIONS[index] for index in self.relation]


def relations_of(tokens: np.ndarray, queries: np.ndarray, keys: np.ndarray) -> PairLabels:
    """The relation (see the module docstring), distance and token ids of pairs (queries[i], keys[i]).

    tokens: token ids ``[T]``; queries, keys: positions ``[N]`` with 0 <= k <= q < T."""
    tokens = np.asarray(tokens)
    queries, keys = np.asarray(queries, dtype=np.int64), np.asarray(keys, dtype=np.int64)
    if tokens.ndim != 1:
        raise RelationError(f"tokens must be one sequence of ids [T]; got shape {list(tokens.shape)}")
    if queries.shape != keys.shape or queries.ndim != 1:
        raise RelationError(f"queries and keys must be positions of the same shape [N]; got {list(queries.shape)} "
                            f"and {list(keys.shape)}")
    bad = (keys < 0) | (keys > queries) | (queries >= len(tokens))
    if bad.any():
        index = int(np.flatnonzero(bad)[0])
        raise RelationError(f"pair (q={queries[index]}, k={keys[index]}) is not a causal pair of a sequence of "
                            f"{len(tokens)} tokens: expected 0 <= k <= q < {len(tokens)}")
    query_token, key_token = tokens[queries], tokens[keys]
    before_key = tokens[np.maximum(keys - 1, 0)]
    relation = np.full(len(queries), OTHER, dtype=np.int64)
    # Assigned from the weakest to the strongest precedence, so the strongest that applies wins.
    relation[(key_token == query_token) & (keys < queries)] = DUPLICATE
    relation[(before_key == query_token) & (keys >= 1)] = INDUCTION
    relation[keys == queries - 1] = PREVIOUS
    relation[keys == 0] = SINK
    return PairLabels(relation, queries - keys, query_token, key_token)


def sample_pairs(tokens: np.ndarray, queries: np.ndarray, per_relation: int, rng: np.random.Generator
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (query, key) ``[N]`` of the sequence `tokens` ``[T]`` with queries among `queries`
    and keys before them (k < q): up to `per_relation` of each relation, drawn without replacement
    among all such pairs (fewer where a relation has fewer), in order of query then key."""
    all_queries, all_keys = np.nonzero(np.tril(np.ones((len(tokens), len(tokens)), dtype=bool), k=-1))
    keep = np.isin(all_queries, queries)
    all_queries, all_keys = all_queries[keep], all_keys[keep]
    relation = relations_of(tokens, all_queries, all_keys).relation
    chosen = []
    for value in range(len(RELATIONS)):
        candidates = np.flatnonzero(relation == value)
        chosen.append(rng.choice(candidates, size=min(per_relation, len(candidates)), replace=False))
    chosen = np.sort(np.concatenate(chosen))
    return all_queries[chosen], all_keys[chosen]
