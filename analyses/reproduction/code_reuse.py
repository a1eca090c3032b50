"""Issue 36's section: does code reuse predict compositional generalization? Read from the tables that
`python analyses/code_reuse.py` records under analyses/results/code_reuse/."""

from __future__ import annotations

from . import RESULTS

REUSE = RESULTS / "code_reuse"


def _number(value: float, digits: int = 3) -> str:
    return "–" if value != value else f"{value:.{digits}f}"  # NaN: not measured


def code_reuse_table() -> str:
    """One row per model: what it is, OOD R², each part beside its baseline, the score."""
    import pandas as pd

    path = REUSE / "code_reuse.csv"
    if not path.is_file():
        return "Not measured yet: `python analyses/code_reuse.py` writes analyses/results/code_reuse/."
    table = pd.read_csv(path).sort_values("ood_r2", ascending=False)
    lines = ["| model | attention | heads | held out | steps | OOD R² (%) | (a) probe bal. acc. / baseline | "
             "(b) reconstruction R² / baseline | (c) follow donor / third donor | score |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for _, row in table.iterrows():
        lines.append(
            f"| {row['model']} | {row['attention']} | {row['heads']} | {int(round(100 * row['frac_test']))}% | "
            f"{row['steps']:,} | {100 * row['ood_r2']:.1f} | {_number(row['decodability'])} / "
            f"{_number(row['decodability_baseline'])} | {_number(row['reconstruction'])} / "
            f"{_number(row['reconstruction_baseline'])} | {_number(row['transplant'])} / "
            f"{_number(row['transplant_baseline'])} | **{_number(row['score'])}** |")
    return "\n".join(lines)


def correlations_table() -> str:
    import pandas as pd

    path = REUSE / "correlations.csv"
    if not path.is_file():
        return ""
    table = pd.read_csv(path)
    lines = ["| predictor of OOD R² | Spearman ρ | p (two-sided) | n models |", "|---|---|---|---|"]
    for _, row in table.iterrows():
        lines.append(f"| {row['predictor']} | {_number(row['spearman_rho_vs_ood_r2'], 2)} | "
                     f"{_number(row['p_two_sided'], 3)} | {row['n_models']} |")
    return "\n".join(lines)


def code_reuse_findings() -> str:
    """The answer in numbers, from the tables (nothing tuned to agree)."""
    import pandas as pd

    if not (REUSE / "correlations.csv").is_file():
        return ""
    correlation = pd.read_csv(REUSE / "correlations.csv").set_index("predictor")
    table = pd.read_csv(REUSE / "code_reuse.csv")

    def rho(name: str) -> str:
        row = correlation.loc[name]
        return f"ρ = {row['spearman_rho_vs_ood_r2']:.2f} (p = {row['p_two_sided']:.3f}, n = {int(row['n_models'])})"

    above = {part: int((table[f"{part}_excess"] >= 0.05).sum())
             for part in ("decodability", "reconstruction", "transplant")}
    n = len(table)
    transfer = table["transplant"] - table["transplant_baseline"]
    return "\n".join([
        f"- **The combined score against OOD R²**: {rho('score (combined)')}.",
        f"- **Probe accuracy alone** (part a's value): {rho('probe accuracy alone (a, value)')}; "
        f"reconstruction R² (part b's value): {rho('reconstruction R² (b, value)')}; "
        f"transplant follow (part c's value): {rho('transplant follow (c, value)')}.",
        f"- **Clearly above the baseline** (excess at least 0.05): decodability in {above['decodability']} of {n} "
        f"models, reconstruction in {above['reconstruction']} of {n}, transplant in {above['transplant']} of {n} "
        f"(follow minus third-donor follow from {transfer.min():+.3f} to {transfer.max():+.3f}).",
    ])
