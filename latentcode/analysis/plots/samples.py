"""A grid of raw latent codes: one panel per label value, examples by heads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from latentcode.analysis.captions import codes_context, position_ranges, wrap_lines
from latentcode.analysis.labels import display_value, select_label, value_names
from latentcode.analysis.picture_plan import plan_picture
from latentcode.analysis.plots.colours import colour_scale
from latentcode.analysis.plots.figure import new_figure, one_column, save_figure
from latentcode.errors import AnalysisError
from latentcode.store import CodeFile

__all__ = ["plot_code_samples"]


def plot_code_samples(
    code_file: CodeFile | str,
    label: str,
    path_stem: str | Path,
    layer: int | None = None,
    split: str | None = None,
    n_samples: int = 8,
    seed: int = 0,
    max_values: int = 12,
    max_sites: int = 16,
    formats: Sequence[str] = ("png",),
    figsize: tuple[float, float] | None = None,
    dpi: float = 100,
) -> list[Path]:
    """A grid of raw latent codes: one panel per value of an integer label (the `max_values` most
    frequent, if there are more), showing up to `n_samples` random examples (rows, drawn with
    `seed`) by heads (columns), on one shared colour scale. The codes are those of all sites of
    `layer` (default: the last), side by side. Signed codes (HYLA, linear attention) are drawn
    on a diverging scale with 0 white; non-negative ones (softmax) on a sequential scale from 0.

    A layer of more than `max_sites` sites (a language model's query over 128 recent keys: 512
    columns, too many to draw as columns of a panel) is shown through a window, its last
    `max_sites` sites (for recent keys, those nearest the query), grouped by head, and the title
    names the window and what it leaves out."""
    plan = plan_picture(code_file, label, path_stem, kind="samples", split=split, layer=layer, formats=formats,
                        overwrite=True)
    code_file, label = plan.code_files[0], plan.label  # checked as `latentcode samples` checks them
    layer = code_file.layers[-1] if layer is None else layer
    values, label = select_label(code_file, label, split)
    values = one_column(values, label)
    if values.dtype.kind not in "iub":
        raise AnalysisError(f"label {label!r} is not integer-valued; the sample grid needs one panel per value")
    codes = code_file.layer_codes(layer, split)  # [N, site * head]
    sites = code_file.sites_of_layer(layer)
    window = _site_window(sites, max_sites)
    names = value_names(code_file, label)
    rng = np.random.default_rng(seed)
    categories, counts = np.unique(values, return_counts=True)
    n_values = len(categories)
    if n_values > max_values:  # the most frequent values, in their natural order
        categories = np.sort(categories[np.argsort(-counts, kind="stable")[:max_values]])
    samples = []
    for category in categories:
        members = np.flatnonzero(values == category)
        chosen = np.sort(rng.choice(members, size=min(n_samples, len(members)), replace=False))
        samples.append((category, len(members), window.columns(codes[chosen], code_file.n_heads)))
    n_columns = min(4, len(categories))
    n_rows = -(-len(categories) // n_columns)
    width = 3.4 * n_columns + 1.0
    figure = new_figure(figsize or (width, 2.2 * n_rows + 1.3), dpi)
    axes = figure.subplots(n_rows, n_columns, squeeze=False).ravel()
    shown = np.concatenate([block for _, _, block in samples])
    norm, colours = colour_scale(shown, "magma", from_zero=True)
    signed = colours == "RdBu_r"
    separator = "black" if signed else "white"
    for axis, (category, count, block) in zip(axes, samples, strict=False):
        image = axis.imshow(block, cmap=colours, norm=norm, aspect="auto", interpolation="nearest")
        # wrapped to the panel: a fuzzy-logic task's name is its whole function
        axis.set_title(wrap_lines([f"{label} = {display_value(category, names)} (n={count})"], 3.2,
                                  fontsize_points=9), fontsize="small")
        axis.set(ylabel="example", yticks=range(len(block)))
        axis.tick_params(labelsize="x-small")
        window.label_axis(axis, code_file.n_heads, separator, code_file.position_names)
    for axis in axes[len(samples):]:
        axis.set_visible(False)
    scale = "signed: 0 is white" if signed else "non-negative"
    figure.colorbar(image, ax=list(axes[: len(samples)]), label=f"latent code ({scale})", shrink=0.8)
    constant = np.ptp(codes, axis=0).max() == 0 if len(codes) else False
    figure.suptitle(wrap_lines([
        f"{code_file.model_name}: raw latent codes at layer {layer}, up to {n_samples} random examples per {label}"
        + (f" ({len(categories)} most frequent of {n_values} values)" if n_values > len(categories) else ""),
        codes_context(code_file, split, layer),
        window.description,
        f"layer {layer}'s codes are the same for every example" if constant else "",
    ], width, fontsize_points=10), fontsize="medium")
    return save_figure(figure, path_stem, formats, dpi)


@dataclass(frozen=True)
class _SiteWindow:
    """The sites of a layer a sample grid shows: all of them side by side (site × head), or, for
    many, a window of them grouped by head (head × site) so that each head's block reads as a row
    of positions."""

    n_sites: int  # of the layer
    shown: list  # the sites shown, in the layer's order
    description: str = ""  # for the title: what the window holds and leaves out

    @property
    def by_head(self) -> bool:
        return bool(self.description)

    def columns(self, codes: np.ndarray, n_heads: int) -> np.ndarray:
        """``[n, site * head]`` codes of the layer -> the columns drawn, ``[n, shown site * head]``
        or, by head, ``[n, head * shown site]``."""
        blocks = codes.reshape(len(codes), self.n_sites, n_heads)[:, self.n_sites - len(self.shown):]
        return (blocks.transpose(0, 2, 1) if self.by_head else blocks).reshape(len(codes), -1)

    def label_axis(self, axis, n_heads: int, separator: str, position_names: Sequence[str] = ()) -> None:
        """Ticks and lines between the blocks: a block per head (by head) or per site, each block
        named under it (its key, by the task's name of the position where the file has one), so a
        reader knows which side of a divider is which."""
        per_block = len(self.shown) if self.by_head else n_heads
        n_blocks = n_heads if self.by_head else len(self.shown)
        for boundary in range(1, n_blocks):
            axis.axvline(boundary * per_block - 0.5, color=separator, linewidth=1)
        if not self.by_head and len(self.shown) == 1:
            axis.set_xlabel("head")
            return
        if not self.by_head:
            centres = [block * per_block + (per_block - 1) / 2 for block in range(n_blocks)]
            axis.set_xticks(centres, [_site_name(site, position_names, short=n_blocks > 3) for site in self.shown],
                            fontsize="x-small", rotation=0 if n_blocks <= 3 else 60)
            axis.set_xticks(range(per_block * n_blocks), minor=True)
            # the query is the title's (sites: query → keys); the panel names the blocks
            axis.set_xlabel(f"key (heads 0–{n_heads - 1} in each block)", fontsize="small")
            return
        axis.set_xticks([block * per_block + (per_block - 1) / 2 for block in range(n_heads)],
                        [f"h{head}" for head in range(n_heads)])
        axis.set_xlabel(f"head; in each, {_positions_text(self.shown)}")


def _site_name(site, position_names: Sequence[str], short: bool) -> str:
    """A block's tick: its key by name on two lines (``"panel (3,1) slot 3\n(key 27)"``), or
    ``"k27"`` where many blocks share the axis."""
    if short:
        return f"k{site.key}"
    if site.key < len(position_names):
        return f"{position_names[site.key]}\n(key {site.key})"
    return f"key {site.key}"


def _positions_text(sites) -> str:
    """``"keys 496–511"`` where the sites share their query, else ``"16 sites"``."""
    if len({site.query for site in sites}) == 1:
        return "keys " + position_ranges([site.key for site in sites])
    return f"{len(sites)} sites"


def _site_window(sites, max_sites: int) -> _SiteWindow:
    if max_sites < 1:
        raise AnalysisError(f"max_sites={max_sites}: the grid needs at least 1 site")
    if len(sites) <= max_sites:
        return _SiteWindow(len(sites), list(sites))
    shown, hidden = list(sites[-max_sites:]), list(sites[:-max_sites])
    return _SiteWindow(len(sites), shown, (
        f"{_positions_text(shown)} shown, the last {len(shown)} of the layer's {len(sites)} sites "
        f"({_positions_text(hidden)} not shown: too many to draw as columns); grouped by head"))
