"""Reading a codes file: latent codes and labels as numpy arrays, filtered by site and split."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from latentcode.store.compact import CompactCodes
from latentcode.store.schema import CODES, EXTRA, LABELS, PREDICTION, TARGET, CodeFileError
from latentcode.store.site import Site
from latentcode.store.validation import ROWS_PER_READ, Contents, validate

if TYPE_CHECKING:
    import pandas as pd

#: examples of each split that analysis (probes, pictures, reports) reads by default: memory is
#: bounded by this cap, not by the file (about 20 MB for 128 floats a row); `subsample` draws them
DEFAULT_MAX_ROWS = 20_000


class CodeFile:
    """Read a codes file: latent codes and labels as numpy arrays, filtered by site and split.

    >>> codes = CodeFile("codes.h5")
    >>> codes.sites, codes.label_names, codes.splits, len(codes)
    >>> codes.codes(Site(1, 35, 35), split="ood")      # [N_ood, H]
    >>> codes.layer_codes(1, split="ood")               # [N_ood, n_sites_of_layer_1 * H]
    >>> codes.labels("query_rule", split="ood")         # [N_ood, M]
    >>> codes.split_seeds                               # {"ood": [seed, ...]}: one per write
    >>> codes.compact.rows(layer, [q]), .column, .block, .layer_pattern, .top_keys   # a compact store's
    >>> codes.codes(Site(layer, q, k))                  # any pair of its layers, rebuilt on demand

    A file that refers to other files (external links, virtual datasets, external storage) is
    refused unless `allow_external=True`: h5py would read those files without a word.
    """

    def __init__(self, path: str | Path, *, allow_external: bool = False):
        self.path = Path(path)
        self._take(validate(self.path, allow_external=allow_external))

    def open_hdf5(self) -> h5py.File:
        """The codes as an open, read-only `h5py.File` (close it when done)."""
        return h5py.File(self.path, "r")

    def _take(self, contents: Contents) -> None:
        """What `validate` found, as this reader's attributes."""
        self.attrs = contents.attrs
        self.shards = contents.shards
        self.sites = contents.sites
        self.heads_of = contents.heads_of
        self.label_names = contents.label_names
        self.extra_names = contents.extra_names
        self.has_prediction = contents.has_prediction
        self.has_target = contents.has_target
        self._split_index = contents.split_index  # [N_file] int16, into self.splits
        self._rows: np.ndarray | None = None  # the file rows this view reads, sorted (None: all)
        self.subsampled: dict[str, tuple[int, int]] = {}  # split -> (examples in the file, examples read)
        self.value_names = contents.value_names
        self.column_names = contents.column_names
        self.writes: list[dict[str, Any]] = contents.writes
        values = contents.values
        self.n_heads = values["n_heads"]
        self.splits = values["splits"]
        self.model_config = values["model_config"]
        self.task_config = values["task_config"]
        self.selector = values["selector"]
        self.task_analysis = values["task_analysis"]
        self.prediction_kind = values["prediction_kind"]
        self.attention_layers = values["attention_layers"]
        self.split_descriptions = values["split_descriptions"]
        self.position_names = values["position_names"]
        self.token_names = values["token_names"]  # text of each id of extra("token_ids"), where recorded
        # The compact store (latentcode.store.compact): codes of any pair of its layers, rebuilt on demand.
        self.compact = CompactCodes(self.path, values["compact"], values["score"] or "pattern", self.open_hdf5) \
            if values["compact"] else None
        self.model_name = values["model_name"] or self.model_config.get("attention", "model")
        if isinstance(self.model_name, list):
            self.model_name = "+".join(self.model_name)
        if not self.writes:  # written before /provenance: one write, from the root seed
            self.writes = [{"rows": [0, len(self)], "splits": list(self.splits),
                            "seed": values["seed"], "reconstructed": True}]

    @property
    def split_seeds(self) -> dict[str, list[Any]]:
        """The sample seed of each write that added examples to a split, in write order (a seed
        listed twice for one split means those examples were drawn twice)."""
        seeds: dict[str, list[Any]] = {split: [] for split in self.splits}
        for write in self.writes:
            for split in write["splits"]:
                seeds.setdefault(split, []).append(write["seed"])
        return seeds

    def __len__(self) -> int:
        return len(self._split_index) if self._rows is None else len(self._rows)

    def _view_split_index(self) -> np.ndarray:
        return self._split_index if self._rows is None else self._split_index[self._rows]

    def subsample(self, max_rows: int, seed: int = 0) -> CodeFile:
        """A view of this file that reads at most `max_rows` examples of each split, drawn at random
        (numpy seed `seed`) and kept in file order; splits of at most `max_rows` are read whole.
        Memory then grows with `max_rows`, not with the file. `subsampled` names what was cut."""
        if max_rows < 1:
            raise CodeFileError(f"max_rows must be a positive number of examples, got {max_rows}")
        rng = np.random.default_rng(seed)
        kept, subsampled = [], {}
        index = self._view_split_index()
        counts = np.bincount(index, minlength=len(self.splits))
        for number, split in enumerate(self.splits):
            ranks = np.arange(counts[number])  # which of the split's examples, in order
            if counts[number] > max_rows:
                subsampled[split] = (int(counts[number]), max_rows)
                ranks = np.sort(rng.choice(counts[number], size=max_rows, replace=False))
            kept.append(_positions_of_ranks(index, number, ranks))
        view = copy.copy(self)
        rows = np.sort(np.concatenate(kept)) if kept else np.zeros(0, dtype=np.int64)
        view._rows = rows if self._rows is None else self._rows[rows]
        view.subsampled = {**self.subsampled, **subsampled}
        return view

    def __repr__(self) -> str:
        return (f"CodeFile({str(self.path)!r}: {len(self)} examples, splits {self.splits}, "
                f"{len(self.sites)} sites, {self.n_heads} heads, labels {self.label_names})")

    @property
    def layers(self) -> list[int]:
        return sorted({site.layer for site in self.sites})

    def sites_of_layer(self, layer: int) -> list[Site]:
        sites = [site for site in self.sites if site.layer == layer]
        if not sites:
            raise CodeFileError(f"{self.path} has no sites in layer {layer}; its layers are {self.layers}")
        return sites

    def split_mask(self, split: str | Iterable[str] | None) -> np.ndarray:
        """Boolean `[N]`: the examples of `split` (a name or several; None: all)."""
        if split is None:
            return np.ones(len(self), dtype=bool)
        wanted = [split] if isinstance(split, str) else list(split)
        unknown = [name for name in wanted if name not in self.splits]
        if unknown:
            raise CodeFileError(f"{self.path} has no split {unknown[0]!r}; its splits are {self.splits}")
        return np.isin(self._view_split_index(), [self.splits.index(name) for name in wanted])

    def split_of_examples(self, split: str | Iterable[str] | None = None) -> np.ndarray:
        """str `[n]`: the split of each example of `split` (None: all)."""
        return np.asarray(self.splits, dtype=str)[self._view_split_index()[self.split_mask(split)]]

    def _read(self, name: str, split) -> np.ndarray:
        mask = self.split_mask(split)
        rows = np.flatnonzero(mask) if self._rows is None else self._rows[mask]
        with self.open_hdf5() as file:
            dataset = file[name]
            if len(rows) == dataset.shape[0]:
                return dataset[:]
            # Whole blocks of rows, masked in memory: far faster than h5py's point selection, and
            # memory is the rows wanted plus one block, however long the file.
            out = np.empty((len(rows), *dataset.shape[1:]), dtype=dataset.dtype)
            starts = np.searchsorted(rows, np.arange(0, dataset.shape[0] + ROWS_PER_READ, ROWS_PER_READ))
            for block, (first, last) in enumerate(zip(starts, starts[1:], strict=False)):
                if first < last:
                    offset = block * ROWS_PER_READ
                    out[first:last] = dataset[offset:int(rows[last - 1]) + 1][rows[first:last] - offset]
            return out

    def codes(self, site: Site | str, split: str | Iterable[str] | None = None) -> np.ndarray:
        """float32 `[N, H]`: the latent codes at one site."""
        site = Site.from_name(site) if isinstance(site, str) else site
        if site not in self.sites and self.compact is not None and site.layer in self.compact.layers:
            return self.compact.codes(site.layer, site.query, site.key, np.flatnonzero(self.split_mask(split)))
        if site not in self.sites:
            raise CodeFileError(f"{self.path} has no site {site}; its sites are {[s.name for s in self.sites]}")
        return self._read(f"{CODES.group}/{site.name}", split)

    def layer_codes(self, layer: int, split: str | Iterable[str] | None = None) -> np.ndarray:
        """float32 `[N, n_sites * H]`: the codes of every site of a layer, concatenated."""
        return np.concatenate([self.codes(site, split) for site in self.sites_of_layer(layer)], axis=1)

    def labels(self, name: str, split: str | Iterable[str] | None = None) -> np.ndarray:
        if name not in self.label_names:
            raise CodeFileError(f"{self.path} has no label {name!r}; its labels are {self.label_names}")
        return self._read(f"{LABELS.group}/{name}", split)

    def extra(self, name: str, split: str | Iterable[str] | None = None) -> np.ndarray:
        if name not in self.extra_names:
            raise CodeFileError(f"{self.path} has no extra array {name!r}; it has {self.extra_names}")
        return self._read(f"{EXTRA.group}/{name}", split)

    def prediction(self, split: str | Iterable[str] | None = None) -> np.ndarray:
        if not self.has_prediction:
            raise CodeFileError(f"{self.path} holds no predictions")
        return self._read(PREDICTION.name, split)

    def target(self, split: str | Iterable[str] | None = None) -> np.ndarray:
        if not self.has_target:
            raise CodeFileError(f"{self.path} holds no targets")
        return self._read(TARGET.name, split)

    def to_dataframe(self, sites: Sequence[Site | str] | None = None, split: str | Iterable[str] | None = None
                     ) -> pd.DataFrame:
        """A pandas DataFrame, one row per example: `split`, one column per label (multi-column
        labels flattened as `name[i]` / `name[i,j]`), and one column per code entry `<site>.h<head>`."""
        import pandas as pd

        columns: dict[str, np.ndarray] = {"split": self.split_of_examples(split)}

        def add(name: str, values: np.ndarray) -> None:
            if values.ndim == 1:
                columns[name] = values
                return
            flat = values.reshape(len(values), -1)
            for index, column in zip(np.ndindex(values.shape[1:]), flat.T, strict=True):
                columns[f"{name}[{','.join(map(str, index))}]"] = column

        for name in self.label_names:
            add(name, self.labels(name, split))
        for site in sites or self.sites:
            site = Site.from_name(site) if isinstance(site, str) else site
            codes = self.codes(site, split)
            for head in range(self.heads_of[site]):
                columns[f"{site.name}.h{head}"] = codes[:, head]
        return pd.DataFrame(columns)


def _positions_of_ranks(index: np.ndarray, number: int, ranks: np.ndarray) -> np.ndarray:
    """The positions in `index` of its `ranks`-th entries equal to `number` (`ranks` sorted), found a
    block at a time: memory is the block and the answer, not an array the length of the file."""
    found, seen = [np.zeros(0, dtype=np.int64)], 0
    for start in range(0, len(index), ROWS_PER_READ):
        positions = np.flatnonzero(index[start:start + ROWS_PER_READ] == number)
        first, last = np.searchsorted(ranks, [seen, seen + len(positions)])
        found.append(start + positions[ranks[first:last] - seen])
        seen += len(positions)
    return np.concatenate(found)
