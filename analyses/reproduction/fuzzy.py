"""Fuzzy logic: the paper's Table A1 (fuzzy-logic column, ablations included) and Fig. 2C, from the recorded runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .plan import ABLATIONS, ATTENTIONS
from .recorded import mean_and_error, minutes, ood_r2, summary_of

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# The paper's Table A1, fuzzy-logic column (OOD R², %; mean ± standard error over seeds where given).
PAPER_TABLE_A1 = {
    "softmax": "63.28 ± 2.31", "linear": "59.89 ± 5.22", "hyla": "81.13 ± 7.77", "linear_rmshead": "68.93",
    "linear_rmshead_relu": "56.91", "hyla_no_rmshead": "81.27", "hyla_no_relu": "84.54",
    "hyla_no_relu_no_rmshead": "79.42", "hyla_softmax_instead": "70.98", "hyla_deep": "87.65", "hyla_softmax": "82.47",
}


def table_a1() -> str:
    """OOD R² per attention over seeds 0-2, and each ablation (seed 0), beside the paper's."""
    lines = ["| attention | ours: OOD R² (%) | seeds | paper (%) | median wall time per run (min) |",
             "|---|---|---|---|---|"]
    for attention in ATTENTIONS:
        names = [f"fuzzy-{attention}-f0.7-s{seed}" for seed in (0, 1, 2)]
        values = [value for value in map(ood_r2, names) if value is not None]
        seeds = ", ".join(str(seed) for seed, name in zip((0, 1, 2), names, strict=True) if summary_of(name))
        lines.append(f"| {attention} | {mean_and_error(values)} | {seeds or '–'} | {PAPER_TABLE_A1[attention]} | "
                     f"{minutes(names)} |")
    for attention in ABLATIONS:
        name = f"fuzzy-{attention}-f0.7-s0"
        value = ood_r2(name)
        lines.append(f"| {attention} | {mean_and_error([value] if value is not None else [])} | "
                     f"{'0' if value is not None else '–'} | {PAPER_TABLE_A1[attention]} | {minutes([name])} |")
    return "\n".join(lines)


def fig2c() -> tuple[str, Figure]:
    """OOD R² against the fraction of term combinations held out (seed 0): the table and its figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fractions = (0.3, 0.5, 0.7)
    lines = ["| attention | " + " | ".join(f"{f:.0%} held out" for f in fractions) + " |", "|---" * 4 + "|"]
    figure = Figure(figsize=(5, 3.6), dpi=110)
    FigureCanvasAgg(figure)
    axis = figure.subplots()
    for attention in ATTENTIONS:
        values = [ood_r2(f"fuzzy-{attention}-f{f}-s0") for f in fractions]
        lines.append(f"| {attention} | " + " | ".join("–" if v is None else f"{v:.2f}" for v in values) + " |")
        points = [(f, v) for f, v in zip(fractions, values, strict=True) if v is not None]
        if points:
            axis.plot(*zip(*points, strict=True), marker="o", label=attention)
    axis.set(xlabel="fraction of term combinations held out", ylabel="OOD R² (%)", xticks=fractions,
             title="Fuzzy logic (L=4, K=2, N=32), seed 0, scale cpu")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    return "\n".join(lines), figure
