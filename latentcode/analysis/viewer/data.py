"""What the viewer shows, as plain JSON-ready data read from one codes file: a sample of instances
(at most a cap, drawn with a seed), their codes rounded for display, their labels as text (value and
column names as the file records them), the model's answer and the target, and 2-D embeddings of the
codes of each layer (PCA here; tSNE or UMAP where an `Embedding` of the same sample is given).

Nothing here knows a task by name: every name comes from the file (`CodeFile.value_names`,
`column_names`, `position_names`, the selector's sites).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from latentcode.analysis.embed import METHOD_NAMES, Embedding, subsample
from latentcode.analysis.labels import available_labels, display_value, select_label
from latentcode.errors import AnalysisError
from latentcode.store import CodeFile

__all__ = ["DEFAULT_MAX_INSTANCES", "DECIMALS", "MAX_FILTER_VALUES", "viewer_data"]

DEFAULT_MAX_INSTANCES = 1000
DECIMALS = 3
# A label with more distinct values than this (a continuous target, say) is shown, not filtered by.
MAX_FILTER_VALUES = 400
# A per-example array wider than this (a window's input tokens, `token_ids` [N, T]) is no label to read in
# a hover: left out (the tokens at the recorded positions are shown as `tokens` instead).
MAX_LABEL_COLUMNS = 64
TOKEN_IDS = "token_ids"  # the extra array of each example's input tokens [N, T], where a file keeps them
# A layer whose codes differ by no more than this between any two instances (at every site and head) has
# the same code for every instance.
CONSTANT_SPREAD = 1e-6


def _number(value: float) -> str:
    return f"{value:.{DECIMALS}g}" if np.isfinite(value) else str(value)


def _label_texts(code_file: CodeFile, name: str, values: np.ndarray) -> list[str]:
    """One text per instance: `values` `[n]` or `[n, ...]` with the file's value or column names."""
    value_names = code_file.value_names.get(name)
    column_names = code_file.column_names.get(name)
    if values.ndim == 1:
        if values.dtype.kind == "f" and not np.all(values == np.round(values)):
            return [_number(float(value)) for value in values]
        return [display_value(value, value_names) for value in values]
    flat = values.reshape(len(values), -1)
    if value_names is not None:
        return [" | ".join(display_value(value, value_names) for value in row) for row in flat]
    if column_names is not None and len(column_names) == flat.shape[1]:
        if np.isin(flat, (0, 1)).all():  # multi-hot: the columns present
            return [", ".join(column for column, value in zip(column_names, row, strict=True) if value) or "none"
                    for row in flat]
        return [", ".join(f"{column}={_number(float(value))}" for column, value in zip(column_names, row, strict=True)
                          if value != 0) for row in flat]
    if values.ndim == 3 and values.dtype.kind in "biu":  # e.g. negation bits [n, terms, variables]
        return [" | ".join("".join(str(int(v)) for v in part) for part in row) for row in values]
    return ["[" + ", ".join(_number(float(value)) for value in row) + "]" for row in flat]


def _categories(texts: list[str]) -> dict:
    """The distinct texts (sorted, numbers by value) and each instance's index into them."""
    distinct = sorted(set(texts), key=lambda text: (_as_number(text) is None, _as_number(text) or 0, text))
    position = {text: index for index, text in enumerate(distinct)}
    return {"values": distinct, "index": [position[text] for text in texts]}


def _as_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _answers(code_file: CodeFile, rows: np.ndarray, split, token_names: Sequence[str] = ()
             ) -> tuple[list[str], list[str]]:
    """The model's answer and the target of each sampled instance, as text ("" where absent). Logits
    answer their argmax, a token's text where `token_names` name the classes; the target is shown at
    the positions the prediction was recorded at (the last P of its T: a language model's codes file
    keeps the logits of the last position only)."""
    n = len(rows)
    answers, targets = [""] * n, [""] * n
    classes, positions = None, None
    if code_file.has_prediction:
        prediction = code_file.prediction(split)[rows]  # [n, P, C]
        positions = prediction.shape[1] if prediction.ndim == 3 else None
        if code_file.prediction_kind.startswith("logits"):  # e.g. "logits of the byte after the last token"
            if len(token_names) and prediction.shape[-1] == len(token_names):
                classes = token_names
            prediction = prediction.argmax(axis=-1)
        answers = _texts(code_file, "prediction", prediction.reshape(n, -1), classes)
    if code_file.has_target:
        target = code_file.target(split)[rows].reshape(n, -1)
        if positions is not None and target.shape[1] > positions:
            target = target[:, -positions:]
        targets = _texts(code_file, "target", target, classes)
    return answers, targets


def _texts(code_file: CodeFile, name: str, flat: np.ndarray, classes: Sequence[str] | None) -> list[str]:
    """One text per row of `flat` `[n, m]`: the class names where given, else as labels are shown."""
    if classes is not None:
        return [" | ".join(classes[int(value)] for value in row) for row in flat]
    return _label_texts(code_file, name, flat.squeeze(1) if flat.shape[1] == 1 else flat)


def _pca(codes: np.ndarray) -> tuple[np.ndarray, list[float]]:
    """The first two principal components of `codes` `[n, d]` and their shares of the variance."""
    centred = codes - codes.mean(axis=0)
    _, singular, basis = np.linalg.svd(centred, full_matrices=False)
    total = float((singular ** 2).sum())
    coordinates = centred @ basis[:2].T
    if coordinates.shape[1] < 2:  # one code dimension: the second axis is 0
        coordinates = np.pad(coordinates, ((0, 0), (0, 2 - coordinates.shape[1])))
    shares = [float(s ** 2 / total) if total > 0 else 0.0 for s in singular[:2]]
    return coordinates, shares + [0.0] * (2 - len(shares))


def _rounded(array: np.ndarray, decimals: int) -> list:
    """Nested lists of `array` rounded; NaN (a head a site does not have) as None."""
    rounded = np.round(array.astype(np.float64), decimals)
    listed = rounded.tolist()
    if np.isnan(rounded).any():
        listed = [[None if value != value else value for value in row] for row in listed]
    return listed


def _tokens(code_file: CodeFile, rows: np.ndarray, split, sites, token_names: Sequence[str] | None) -> dict | None:
    """The text of each sampled instance's token at every recorded position (a query or key of a
    site): `{positions, texts [n][positions]}`, where the file keeps the input tokens (`token_ids`)
    and their names are known (the file's `token_names`, else `token_names` given); else None."""
    names = list(token_names or code_file.token_names)
    if TOKEN_IDS not in code_file.extra_names or not names:
        return None
    positions = sorted({site.query for site in sites} | {site.key for site in sites})
    ids = code_file.extra(TOKEN_IDS, split)[rows][:, positions]  # [n, positions]
    if ids.size and (ids.min() < 0 or ids.max() >= len(names)):
        raise AnalysisError(f"{code_file.path}: token ids from {ids.min()} to {ids.max()}, but {len(names)} token "
                            "names; expected a name for every id")
    return {"positions": positions, "texts": [[names[token] for token in row] for row in ids.tolist()]}


def viewer_data(
    code_file: CodeFile | str,
    split: str | None = None,
    max_instances: int | None = DEFAULT_MAX_INSTANCES,
    seed: int = 0,
    embeddings: Sequence[Embedding] = (),
    decimals: int = DECIMALS,
    token_names: Sequence[str] | None = None,
) -> dict:
    """The viewer's data for at most `max_instances` instances of `split` (None: every split), drawn
    uniformly with `seed` (`latentcode.analysis.embed.subsample`, as `embed` draws them, so an
    `Embedding` made with the same split, cap and seed covers the same instances).

    Returns a JSON-ready dict: `model`, `file`, `split`, `n_total`, `n_shown`, `cap`, `seed`,
    `decimals`, `layers`, `sites` (`[{layer, query, key, heads}]`), `positions` (name of each
    position, where the file names them), `heads` (the widest code), `instances`
    (`{row, split, answer, target}` lists), `labels` (`{name: {values, index, filter}}`), `codes`
    (`[n_shown][n_sites * heads]`, rounded; null where a site has fewer heads) and `embeddings`
    (`{method: {layer: {x, y, axes}}}`, PCA first), `tokens` (each instance's token text at every
    recorded position, where the file keeps its input tokens: `_tokens`; else null), `default_layer` and
    `default_site` (where the page opens: the layer, and its (query, key) pair, whose codes vary most over
    the instances), `layer_spread` (the mean standard deviation of each layer's codes) and
    `constant_layers` (layers whose codes are the same for every instance).

    token_names: the text of each token id where the file does not name them (a pretrained
    model's tokenizer: `[tokenizer.decode([id]) for id in range(vocabulary)]`).
    """
    code_file = code_file if isinstance(code_file, CodeFile) else CodeFile(code_file)
    mask = code_file.split_mask(split)
    n_total = int(mask.sum())
    if n_total == 0:
        raise AnalysisError(f"{code_file.path} has no instances in split {split!r}")
    rows = subsample(n_total, max_instances, seed)
    for embedding in embeddings:
        if embedding.split != split or not np.array_equal(embedding.indices, rows):
            raise AnalysisError(
                f"the {METHOD_NAMES[embedding.method]} embedding covers {embedding.describe()} of split "
                f"{embedding.split!r}; the viewer shows {len(rows)} of {n_total} of split {split!r} (cap "
                f"{max_instances}, seed {seed}): embed with the same split, max_points and seed")
    sites = code_file.sites
    heads = max(code_file.heads_of[site] for site in sites)
    codes = np.full((len(rows), len(sites), heads), np.nan, dtype=np.float32)
    for index, site in enumerate(sites):
        codes[:, index, : code_file.heads_of[site]] = code_file.codes(site, split)[rows]

    split_of = code_file.split_of_examples(split)[rows]
    labels = {}
    if len(set(split_of)) > 1:
        labels["split"] = {**_categories([str(name) for name in split_of]), "filter": True}
    for name in available_labels(code_file):
        if name in ("prediction", "target"):
            continue
        values, _ = select_label(code_file, name, split)
        if name == TOKEN_IDS or values[:1].size > MAX_LABEL_COLUMNS:
            continue
        categories = _categories(_label_texts(code_file, name, values[rows]))
        categories["filter"] = len(categories["values"]) <= MAX_FILTER_VALUES
        labels[name] = categories
    answers, targets = _answers(code_file, rows, split, list(token_names or code_file.token_names))

    projections: dict[str, dict] = {"PCA": {}}
    for layer in code_file.layers:
        in_layer = [index for index, site in enumerate(sites) if site.layer == layer]
        layer_codes = np.nan_to_num(codes[:, in_layer].reshape(len(rows), -1))
        coordinates, shares = _pca(layer_codes)
        projections["PCA"][layer] = {"x": _rounded(coordinates[:, 0], 4), "y": _rounded(coordinates[:, 1], 4),
                                     "axes": [f"PC1 ({shares[0]:.0%} of variance)", f"PC2 ({shares[1]:.0%})"]}
    for embedding in embeddings:
        name = METHOD_NAMES[embedding.method]
        projections[name] = {layer: {"x": _rounded(points[:, 0], 4), "y": _rounded(points[:, 1], 4),
                                     "axes": [f"{name} 1", f"{name} 2"]}
                             for layer, points in embedding.coordinates.items()}

    positions = code_file.position_names
    # The page opens on the layer, and its (query, key) pair, whose codes vary most over the instances: a
    # constant one (a fixed query on tokens that do not vary) shows nothing; constant layers are named on the page.
    spread = np.nan_to_num(np.nanstd(codes.astype(np.float64), axis=0))  # [n_sites, heads]; float32 sums are not exact
    # constant: max - min, since a standard deviation of equal float32 values need not be 0
    code_range = np.nan_to_num(np.nanmax(codes, axis=0) - np.nanmin(codes, axis=0))  # [n_sites, heads]
    layer_of = np.array([site.layer for site in sites])
    layer_spread = {layer: float(spread[layer_of == layer].mean()) for layer in code_file.layers}
    constant_layers = [layer for layer in code_file.layers
                       if float(code_range[layer_of == layer].max()) <= CONSTANT_SPREAD]
    default_layer = max(code_file.layers, key=lambda layer: layer_spread[layer])  # the first of equals
    site_spread = spread.mean(axis=1)  # [n_sites]
    pairs = sorted({(site.query, site.key) for site in sites})

    def pair_spread(pair, layer=None):
        chosen = [i for i, s in enumerate(sites) if (s.query, s.key) == pair and (layer is None or s.layer == layer)]
        return float(site_spread[chosen].mean()) if chosen else -1.0

    default_pair = max(pairs, key=lambda pair: (pair_spread(pair, default_layer), pair_spread(pair)))
    return {
        "model": code_file.model_name,
        "file": code_file.path.name,
        "split": split,
        "n_total": n_total,
        "n_shown": len(rows),
        "cap": max_instances,
        "seed": seed,
        "decimals": decimals,
        "layers": code_file.layers,
        "sites": [{"layer": site.layer, "query": site.query, "key": site.key, "heads": code_file.heads_of[site]}
                  for site in sites],
        "positions": list(positions),
        "default_site": f"{default_pair[0]}:{default_pair[1]}",
        "default_layer": default_layer,
        "default_layer_reason": "the layer whose codes vary most across the shown instances",
        "layer_spread": {str(layer): round(value, 6) for layer, value in layer_spread.items()},
        "constant_layers": constant_layers,
        "heads": heads,
        "instances": {"row": np.flatnonzero(mask)[rows].tolist(), "split": [str(s) for s in split_of],
                      "answer": answers, "target": targets},
        "labels": labels,
        "codes": _rounded(codes.reshape(len(rows), -1), decimals),
        "embeddings": projections,
        "tokens": _tokens(code_file, rows, split, sites, token_names),
    }
