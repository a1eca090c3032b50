"""The latent codes of every layer at key-query pairs drawn per relation from token sequences."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import nn

from latentcode.analysis.token_relations import RELATIONS, relations_of, sample_pairs
from latentcode.intervention.patching import record_codes
from latentcode.sources.sites import block

__all__ = ["RelationCodes", "relation_codes"]


@dataclass
class RelationCodes:
    """Codes and labels of N pairs: ``codes`` float32 ``[N, layer, head]`` (``a[:, q, k]`` of each
    layer); ``relation`` (index into `RELATIONS`), ``distance`` (q - k), ``query_token``,
    ``key_token``, ``sequence`` (row of the tokens), ``query``, ``key``: ``[N]``."""

    codes: np.ndarray
    relation: np.ndarray
    distance: np.ndarray
    query_token: np.ndarray
    key_token: np.ndarray
    sequence: np.ndarray
    query: np.ndarray
    key: np.ndarray

    def __len__(self) -> int:
        return len(self.relation)

    def counts(self) -> dict[str, int]:
        return {name: int(np.sum(self.relation == index)) for index, name in enumerate(RELATIONS)}

    def subset(self, rows: np.ndarray) -> RelationCodes:
        return RelationCodes(**{field.name: getattr(self, field.name)[rows] for field in fields(self)})


def relation_codes(model: nn.Module, tokens: np.ndarray, queries: Sequence[int], per_relation: int, seed: int = 0,
                   batch_size: int = 8) -> RelationCodes:
    """For each sequence of `tokens` ``[n, T]``: up to `per_relation` pairs of each relation with
    queries among `queries` and keys before them (`sample_pairs`, ``np.random.default_rng(seed)``),
    and the codes of every layer there, read by the model's attention source (SDPA interception for
    Hugging Face models: exact) from the whole rows of `queries`."""
    queries = np.asarray(sorted(set(int(query) for query in queries)))
    rng = np.random.default_rng(seed)
    parts = []
    for start in range(0, len(tokens), batch_size):
        batch = tokens[start:start + batch_size]
        inputs = {"input_ids": torch.as_tensor(batch)}
        if "logits_to_keep" in inspect.signature(model.forward).parameters:
            inputs["logits_to_keep"] = 1  # only the codes are wanted: skip most of the unembedding
        layer_codes, positions = record_codes(model, inputs, block(None, queries.tolist(), None))
        layers = sorted(layer_codes)
        seq_len = batch.shape[1]
        for row, sequence in enumerate(batch):
            query, key = sample_pairs(sequence, queries, per_relation, rng)
            labels = relations_of(sequence, query, key)
            codes = []
            for layer in layers:
                column = np.full((seq_len, seq_len), -1)
                layer_queries, layer_keys = (p.cpu().numpy() for p in positions[layer])
                column[layer_queries, layer_keys] = np.arange(len(layer_queries))
                codes.append(layer_codes[layer][row][:, column[query, key]].T.float().cpu().numpy())  # [pairs, head]
            parts.append(RelationCodes(np.stack(codes, axis=1).astype(np.float32), labels.relation, labels.distance,
                                       labels.query_token, labels.key_token, np.full(len(query), start + row),
                                       query, key))
    return RelationCodes(**{field.name: np.concatenate([getattr(part, field.name) for part in parts])
                            for field in fields(RelationCodes)})
