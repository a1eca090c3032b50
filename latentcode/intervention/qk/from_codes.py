"""Query-key attribution of the codes of a compact store (`latentcode qk CODES.h5`).

The compact store keeps each recorded layer's queries and keys after RoPE (`latentcode.store.compact`),
not the residual stream they were computed from, and a query or key cannot be split into the earlier
components that wrote it without that stream. So the components are recovered by running the model
again on the example's stored token ids (`/extra/token_ids`): the model is the one the file names
(`model_path`, its weights checked against `checkpoint_sha256`) or one the
user passes. Before decomposing, the head's recomputed queries and keys are compared with the stored ones;
if they differ by more than `tolerance` (relative to the largest stored value) the file's codes did not
come from this model and these tokens, and the command refuses in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from latentcode.intervention.qk.components import CannotDecompose
from latentcode.intervention.qk.decomposition import QKTerms

TOLERANCE = 1e-4  # float32 recomputation of q_proj/k_proj and RoPE: about 1e-6 on the tests' models


def stored_sequence(codes, example: int, layer: int, head: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token ids `[T]`, stored queries `[T, d]`, stored keys `[T, d]`) of one example of a codes file."""
    if codes.compact is None:
        raise CannotDecompose(f"{codes.path} has no compact store (no stored queries and keys); expected a file "
                              f"written by `latentcode extract` of a causal LM (--compact, its default)")
    if not 0 <= example < len(codes):
        raise CannotDecompose(f"example {example} is outside the {len(codes)} examples of {codes.path}")
    if "token_ids" not in codes.extra_names:
        raise CannotDecompose(f"{codes.path} records no token ids (/extra/token_ids): the model cannot be run again "
                              f"on its examples to recover the residual stream")
    token_ids = codes.extra("token_ids")
    if layer not in codes.compact.layers:
        raise CannotDecompose(f"{codes.path} stores no queries and keys of layer {layer}; its compact layers are "
                              f"{codes.compact.layers}")
    queries, keys, valid = codes.compact.queries_and_keys(layer, example, head)
    if not valid.all():
        raise CannotDecompose(f"example {example} of {codes.path} is padded ({int((~valid).sum())} padding tokens); "
                              f"expected an unpadded example")
    return np.asarray(token_ids[example], np.int64), queries, keys


def qk_from_codes(path: str | Path, layer: int, head: int, pairs: Any = "previous", example: int = 0,
                  model: Any = None, top: int = 12, out: str | Path | None = None, overwrite: bool = False,
                  tolerance: float = TOLERANCE) -> QKTerms:
    """The terms of (layer, head) at `pairs` of example `example` of the codes file `path` (compact store):
    the model (`model`, or the file's `model_path`) run again on the stored token ids, its queries and keys
    checked against the stored ones within `tolerance`, then `qk_attribution`."""
    from latentcode.intervention.qk.reading import read_head
    from latentcode.intervention.qk.report import qk_attribution
    from latentcode.store import CodeFile

    codes = CodeFile(path)
    tokens, stored_queries, stored_keys = stored_sequence(codes, example, layer, head)
    model_path = str(codes.attrs.get("model_path", "") or "")
    name = codes.model_name or Path(model_path or str(path)).name
    if model is None:
        if not model_path:
            raise CannotDecompose(f"{path} names no model file (model_path); pass the model the codes came from")
        from latentcode.pretrained import checkpoint_sha256, load_pretrained

        recorded = str(codes.attrs.get("checkpoint_sha256", "") or "")
        if recorded and checkpoint_sha256(Path(model_path)) != recorded:
            raise CannotDecompose(f"the weights at {model_path} are not the ones {path} was extracted from "
                                  f"(checkpoint_sha256 differs); pass the model the codes came from")
        model = load_pretrained(model_path, progress=False)
    reading, _ = read_head(model, torch.as_tensor(tokens), layer, head)
    scale = max(float(np.abs(stored_queries).max()), float(np.abs(stored_keys).max()), 1e-12)
    gap = max(float((reading.queries - torch.as_tensor(stored_queries)).abs().max()),
              float((reading.keys - torch.as_tensor(stored_keys)).abs().max())) / scale
    if gap > tolerance:
        raise CannotDecompose(f"the model's recomputed queries/keys of L{layer}.H{head} differ from those {path} "
                              f"stores by {gap:.1e} (relative; tolerance {tolerance:.0e}): not the model or tokens the "
                              f"codes came from")
    terms = qk_attribution(model, tokens, layer, head, pairs, top=top, out=out, overwrite=overwrite, name=name)
    terms.stored_gap = gap
    return terms
