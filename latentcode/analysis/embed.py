"""Two-dimensional embeddings (tSNE, UMAP) of the latent codes of each layer.

Large files are subsampled first: at most `max_points` examples (default `DEFAULT_MAX_POINTS`),
drawn with the seed, uniformly or stratified by a label (each value keeps its share, to within
one example). The same examples are embedded at every layer, so the panels of a figure can be
compared point for point; `Embedding.n_used` of `Embedding.n_total` says how many were used.

Embeddings run on the raw codes (no standardization), the codes of all sites of a layer
concatenated, single-threaded. tSNE is scikit-learn's (Barnes-Hut, PCA initialization); UMAP is
umap-learn's, imported on first use (it compiles with numba on the first call of a process, some
seconds). A layer takes tens of seconds, so `embed` says how far it is on stderr: a bar over the
layers on a terminal, else a plain line as each layer starts and ends; ``progress=False`` says
nothing (`latentcode report` has its own bar).
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits

from latentcode.analysis.labels import select_label
from latentcode.errors import AnalysisError
from latentcode.store import CodeFile

__all__ = ["DEFAULT_MAX_POINTS", "METHODS", "Embedding", "embed", "subsample"]

DEFAULT_MAX_POINTS = 2000
METHODS = ("tsne", "umap")
METHOD_NAMES = {"tsne": "tSNE", "umap": "UMAP"}


@dataclass
class Embedding:
    """The 2-D embedding of the codes of each layer, on one subsample of one split.

    ``coordinates[layer]`` is ``[n_used, 2]``; row i embeds example ``indices[i]`` of the split
    (an index into the arrays ``CodeFile.codes(site, split)`` returns).
    """

    method: str
    model_name: str
    split: str | None
    layers: list[int]
    coordinates: dict[int, np.ndarray]
    indices: np.ndarray
    n_total: int
    max_points: int | None
    seed: int
    stratify: str | None = None
    parameters: dict = field(default_factory=dict)
    constant_layers: list[int] = field(default_factory=list)  # codes all equal: drawn as one point

    @property
    def n_used(self) -> int:
        return len(self.indices)

    def describe(self) -> str:
        """E.g. ``"2000 of 16384 examples (cap 2000, uniform, seed 0)"``."""
        how = f"stratified by {self.stratify}" if self.stratify else "uniform"
        cap = "" if self.n_used == self.n_total else f" (cap {self.max_points}, {how}, seed {self.seed})"
        return f"{self.n_used} of {self.n_total} examples{cap}"


def subsample(n_total: int, max_points: int | None, seed: int = 0, strata: np.ndarray | None = None) -> np.ndarray:
    """Sorted indices of at most `max_points` of `n_total` examples, drawn with `seed`.

    Uniform without replacement, or, given `strata` (``[n_total]`` labels), stratified: each
    value gets its share of `max_points` rounded down, and the examples left over go to the
    values with the largest remainders, so every share is exact to within one.
    """
    if max_points is None or n_total <= max_points:
        return np.arange(n_total)
    if max_points < 1:
        raise AnalysisError(f"max_points={max_points}: need at least 1 point (or None for all)")
    rng = np.random.default_rng(seed)
    if strata is None:
        return np.sort(rng.choice(n_total, size=max_points, replace=False))
    strata = np.asarray(strata)
    if strata.shape != (n_total,):
        raise AnalysisError(f"strata has shape {list(strata.shape)}; expected [{n_total}], one value per example")
    _, inverse, counts = np.unique(strata, return_inverse=True, return_counts=True)
    share = counts * (max_points / n_total)
    take = np.floor(share).astype(np.int64)
    leftover = max_points - int(take.sum())
    take[np.argsort(-(share - take), kind="stable")[:leftover]] += 1
    chosen = [
        rng.choice(np.flatnonzero(inverse == value), size=count, replace=False)
        for value, count in enumerate(take) if count
    ]
    return np.sort(np.concatenate(chosen))


def _embed_array(codes: np.ndarray, method: str, seed: int) -> tuple[np.ndarray, dict]:
    n = len(codes)
    if n < 3:
        raise AnalysisError(f"{method} needs at least 3 examples to embed; got {n}")
    if method == "tsne":
        from sklearn.manifold import TSNE

        # Perplexity must stay below the number of points; 30 is scikit-learn's default.
        parameters = {"perplexity": float(min(30.0, (n - 1) / 3)), "init": "pca"}
        model = TSNE(n_components=2, random_state=seed, n_jobs=1, **parameters)
        return model.fit_transform(codes).astype(np.float32), parameters
    import umap  # slow to import (numba): only when asked for

    parameters = {"n_neighbors": int(min(15, n - 1)), "min_dist": 0.1}
    with warnings.catch_warnings():
        # With random_state set, UMAP runs single-threaded, which is what we ask; and on tiny
        # inputs it warns that the spectral initialisation falls back to random.
        warnings.filterwarnings("ignore", category=UserWarning, module="umap")
        model = umap.UMAP(n_components=2, random_state=seed, n_jobs=1, **parameters)
        return np.asarray(model.fit_transform(codes), dtype=np.float32), parameters


class _Progress:
    """How far an embedding is, on stderr: a tqdm bar over the layers on a terminal, plain lines
    elsewhere, nothing when not `enabled`."""

    def __init__(self, enabled: bool, method: str, model_name: str, n_layers: int, n_points: int):
        self.enabled, self.n_layers, self.done = enabled, n_layers, 0
        self.what = f"{METHOD_NAMES.get(method, method)} of {n_points} {model_name} codes"
        self.bar = None
        self.started = time.perf_counter()
        if enabled and sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=n_layers, desc=self.what, unit="layer")

    def start(self, layer: int, note: str = "") -> None:
        self.started = time.perf_counter()
        if self.bar is not None:
            self.bar.set_postfix_str(f"layer {layer}" + (f" ({note})" if note else ""))
        elif self.enabled:
            print(f"{self.what}: layer {layer} ({self.done + 1} of {self.n_layers})" + (f"; {note}" if note else "")
                  + " ...", file=sys.stderr, flush=True)

    def finish(self, layer: int) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update()
        elif self.enabled:
            print(f"{self.what}: layer {layer} done in {time.perf_counter() - self.started:.1f} s",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def embed(
    code_file: CodeFile | str,
    method: str = "tsne",
    split: str | None = None,
    layers: Sequence[int] | None = None,
    max_points: int | None = DEFAULT_MAX_POINTS,
    seed: int = 0,
    stratify: str | None = None,
    progress: bool = True,
) -> Embedding:
    """tSNE or UMAP of the codes of each layer (all its sites concatenated).

    Args:
        code_file: a codes file (path or `CodeFile`).
        method: ``"tsne"`` or ``"umap"``.
        split: the split to embed (None: every example).
        layers: the layers (default: all), one embedding each, on the same examples.
        max_points: the cap on examples (None: no cap); larger splits are subsampled with `seed`.
        seed: seeds the subsample and the embedding.
        stratify: a label spec (one value per example) to stratify the subsample by.
        progress: say how far it is on stderr (a bar on a terminal, a line per layer's start and
            end elsewhere); False: nothing.
    """
    if method not in METHODS:
        raise AnalysisError(f"method {method!r} is not one of {METHODS}")
    code_file = code_file if isinstance(code_file, CodeFile) else CodeFile(code_file)
    layers = list(code_file.layers if layers is None else layers)
    n_total = len(code_file.split_of_examples(split))
    strata = None
    if stratify is not None:
        strata, stratify = select_label(code_file, stratify, split)
        if strata.ndim != 1:
            raise AnalysisError(f"stratify needs one value per example; label {stratify!r} has shape "
                                f"{list(strata.shape)}")
    indices = subsample(n_total, max_points, seed, strata)
    coordinates, parameters, constant_layers = {}, {}, []
    progress_of = _Progress(progress, method, code_file.model_name, len(layers), len(indices))
    for layer in layers:
        progress_of.start(layer, "importing umap: numba compiles on first use"
                          if method == "umap" and "umap" not in sys.modules else "")
        codes = code_file.layer_codes(layer, split)[indices].astype(np.float64)
        if not np.isfinite(codes).all():
            raise AnalysisError(f"the codes of layer {layer} in split {split!r} contain NaN or inf; cannot embed them")
        # One BLAS / OpenMP thread: at these sizes more threads gain little, and on a busy machine
        # OpenMP's waiting threads make tSNE several times slower.
        if len(codes) and np.ptp(codes, axis=0).max() == 0:
            # Nothing to embed (e.g. HYLA's first layer on a fixed query): every point is the same.
            coordinates[layer] = np.zeros((len(codes), 2), dtype=np.float32)
            constant_layers.append(layer)
        else:
            with threadpool_limits(limits=1):
                coordinates[layer], parameters = _embed_array(codes, method, seed)
        progress_of.finish(layer)
    progress_of.close()
    return Embedding(
        method=method, model_name=code_file.model_name, split=split, layers=layers,
        coordinates=coordinates, indices=indices, n_total=n_total, max_points=max_points, seed=seed,
        stratify=stratify, parameters=parameters, constant_layers=constant_layers,
    )
