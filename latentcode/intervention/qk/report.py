"""`qk_attribution`: one head's score at selected pairs of one sequence as query-side x key-side terms,
as a table and a figure; the function behind `latentcode qk`.

The table (`qk.csv`), one row per entry, means over the pairs with their standard errors:

    kind            query_component  key_component  mean  standard_error  share
    score           -                -              ...                   1        the model's own score
    sum of terms    -                -              ...                            equals the score (exact)
    query marginal  L3.H1            -              ...                            sum_j T_ij
    key marginal    -                L2.mlp         ...                            sum_i T_ij
    term            L3.H1            L2.mlp         ...                            T_ij

with the `top` components of each side (by |mean marginal|) and `other`, the rest summed, so that the
terms of the table add up to the mean score. The figure (`qk.png`, `figure.draw`) shows the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from latentcode.intervention.qk.decomposition import QKTerms, decompose
from latentcode.intervention.qk.pairs import select_pairs
from latentcode.intervention.qk.plan import check_outputs
from latentcode.intervention.qk.reading import read_head, unwrap
from latentcode.validation import check_placement, place


def is_causal(model: Any) -> bool:
    model = unwrap(model)
    config = getattr(model, "config", None)
    return bool(getattr(config, "causal", True)) if hasattr(config, "attention_name") else True


def qk_attribution(model: Any, tokens: Any, layer: int, head: int, pairs: Any = "previous", top: int = 12,
                   out: str | Path | None = None, overwrite: bool = False, title: str | None = None,
                   name: str | None = None, device: str | Any | None = None, dtype: str | Any | None = None
                   ) -> QKTerms:
    """The terms of head `head` of layer `layer` of `model` (ours, a Hugging Face Llama-family LM or
    `Pretrained`, a transformer-lens TransformerBridge) on one sequence `tokens`, at `pairs`: a selector
    (`latentcode.intervention.qk.pairs`: "previous", "induction", "Q:K,...") or an int array `[pair, 2]`. `tokens`: one
    sequence, `[T]` (token ids, or our tasks' `[T, d_in]` inputs). With `out`, writes `out/qk.csv` and `out/qk.png` (the
    `top` components of each side, the rest as `other`; refused if they exist, unless `overwrite`). `name`: the model's
    name in the title. device, dtype: where and in what the model runs (given, it is moved and cast, as `nn.Module.to`
    does; None: where and as it is); the tokens follow it, and the terms are computed in float32 from
    what it computed, whatever its dtype."""
    device, dtype = check_placement(device, dtype)
    place(unwrap(model), device, dtype)
    as_tensor = torch.as_tensor(tokens).cpu()
    if as_tensor.is_floating_point():  # [pos, d_in] or [1, pos, d_in]
        sequence = (as_tensor[0] if as_tensor.ndim == 3 else as_tensor).numpy()
    else:  # [pos] or [1, pos]
        sequence = as_tensor.reshape(-1).numpy()
    if out is not None:
        check_outputs(out, overwrite)  # before the work, not after it
    selector = pairs if isinstance(pairs, str) else None
    if selector is not None:
        pairs = select_pairs(selector, sequence, causal=is_causal(model))
    reading, _ = read_head(model, tokens, layer, head)
    terms = decompose(reading, torch.as_tensor(np.asarray(pairs)))
    if name is not None:
        terms.model = name
    if out is not None:
        write(terms, out, top, selector or f"{len(terms.pairs)} pairs", overwrite, title)
    return terms


def mean_and_error(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean over the first axis and its standard error (NaN for one pair)."""
    n = values.shape[0]
    error = values.std(0, ddof=1) / np.sqrt(n) if n > 1 else np.full(values.shape[1:], np.nan)
    return values.mean(0), error


def top_components(terms: QKTerms, top: int) -> tuple[list[int], list[int]]:
    """Indices of the `top` query-side and key-side components by |mean marginal|."""
    chosen = []
    for marginal in (terms.query_marginal, terms.key_marginal):
        order = torch.argsort(marginal.mean(0).abs(), descending=True)
        chosen.append(order[:top].tolist())
    return chosen[0], chosen[1]


def grouped(terms: QKTerms, top: int) -> tuple[list[str], list[str], np.ndarray]:
    """(query names, key names, terms `[pair, top + 1, top + 1]`): the top components and `other`."""
    query_top, key_top = top_components(terms, top)
    values = terms.terms.double().numpy()
    n_components = len(terms.names)
    query_rest = [i for i in range(n_components) if i not in query_top]
    key_rest = [j for j in range(n_components) if j not in key_top]

    def by_rows(array, chosen, rest, axis):
        parts = [np.take(array, chosen, axis=axis)]
        if rest:
            parts.append(np.take(array, rest, axis=axis).sum(axis=axis, keepdims=True))
        return np.concatenate(parts, axis=axis)

    table = by_rows(by_rows(values, query_top, query_rest, 1), key_top, key_rest, 2)
    query_names = [terms.names[i] for i in query_top] + (["other"] if query_rest else [])
    key_names = [terms.names[j] for j in key_top] + (["other"] if key_rest else [])
    return query_names, key_names, table


def table_of(terms: QKTerms, top: int):
    import pandas as pd

    query_names, key_names, values = grouped(terms, top)
    score_mean, score_error = mean_and_error(terms.scores.double().numpy())
    total_mean, total_error = mean_and_error(values.sum((1, 2)))
    rows = [("score", "", "", score_mean, score_error), ("sum of terms", "", "", total_mean, total_error)]
    query_mean, query_error = mean_and_error(values.sum(2))
    key_mean, key_error = mean_and_error(values.sum(1))
    rows += [("query marginal", name, "", query_mean[i], query_error[i]) for i, name in enumerate(query_names)]
    rows += [("key marginal", "", name, key_mean[j], key_error[j]) for j, name in enumerate(key_names)]
    term_mean, term_error = mean_and_error(values)
    rows += [("term", query, key, term_mean[i, j], term_error[i, j]) for i, query in enumerate(query_names)
             for j, key in enumerate(key_names)]
    table = pd.DataFrame(rows, columns=["kind", "query_component", "key_component", "mean", "standard_error"])
    table["share"] = table["mean"] / score_mean if score_mean != 0 else np.nan
    return table


def write(terms: QKTerms, out: str | Path, top: int, pairs_label: str, overwrite: bool = False,
          title: str | None = None) -> list[Path]:
    """`out/qk.csv` and `out/qk.png` of `terms`, as one set (latentcode.files)."""
    from latentcode.files import AtomicOutputs
    from latentcode.intervention.qk.figure import draw

    out = Path(out)
    targets = check_outputs(out, overwrite)
    query_names, key_names, values = grouped(terms, top)
    title = title or (f"{terms.model}: layer {terms.layer}, head {terms.head}; pairs {pairs_label} "
                      f"(n={len(terms.pairs)})")
    figure = draw(query_names, key_names, values.mean(0), title, float(terms.scores.double().mean()))
    with AtomicOutputs(lock=out / "qk", purpose="latentcode qk") as outputs:
        check_outputs(out, overwrite)  # again under the lock: a second command beside this one is refused
        outputs.write_text(targets[0], table_of(terms, top).to_csv(index=False))
        outputs.write_figure(out / "qk", figure, ("png",), dpi=130)
    import matplotlib.pyplot as plt

    plt.close(figure)
    return targets
