"""The viewer's tables: a probe table (`latentcode probe`'s CSV) as rows of text, and a patching
result (`latentcode patch`'s CSV) as a map: layer × head, (layer, query) × key block, or one bar
per site group, as `latentcode patch` draws it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from latentcode.errors import AnalysisError

__all__ = ["patching_map", "probe_table", "read_table"]

# What `latentcode patch` writes in every table, whichever grid it ran.
PATCHING_COLUMNS = ("group", "transfer", "transfer se")


def read_table(table, what: str):
    """`table` itself if it is a pandas table, else the CSV file it names, read; refused in one line
    where it is missing or no CSV."""
    import pandas as pd

    if isinstance(table, pd.DataFrame):
        return table
    path = Path(table)
    try:
        return pd.read_csv(path)
    except FileNotFoundError:
        raise AnalysisError(f"the {what} {path} does not exist; expected a CSV table written by latentcode") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise AnalysisError(f"the {what} {path} is not a CSV table ({error}); "
                            "expected one written by latentcode") from None


def _text(value) -> str:
    if isinstance(value, float | np.floating):
        return "" if np.isnan(value) else f"{value:.3f}"
    return str(value)


def probe_table(table, title: str) -> dict:
    """`{title, columns, rows}`: every cell as text, numbers to 3 decimals."""
    frame = read_table(table, "probe table")
    return {"title": title, "columns": [str(column) for column in frame.columns],
            "rows": [[_text(value) for value in row] for row in frame.itertuples(index=False)]}


def patching_map(table, title: str) -> dict:
    """`{title, kind, rows, columns, values, errors, value}`: kind "grid" (values `[rows][columns]`,
    null where not patched) or "bars" (values `[[transfer of each group]]`, errors their s.e.)."""
    frame = read_table(table, "patching table")
    missing = [column for column in PATCHING_COLUMNS if column not in frame.columns]
    if missing:
        raise AnalysisError(f"the patching table {title!r} has no column(s) {missing}; expected a table written by "
                            f"latentcode patch (columns {list(PATCHING_COLUMNS)}, ...)")
    if {"layer", "head"} <= set(frame.columns):
        rows = [f"layer {layer}" for layer in sorted(frame["layer"].unique())]
        columns = [f"head {head}" for head in range(int(frame["head"].max()) + 1)]
        cell = [(f"layer {r.layer}", f"head {int(r.head)}", r.transfer) for r in frame.itertuples()]
    elif {"layer", "query", "key_start", "key_stop"} <= set(frame.columns):
        rows = [f"layer {layer}, query {query}"
                for layer, query in sorted(set(zip(frame["layer"], frame["query"], strict=True)))]
        blocks = sorted(set(zip(frame["key_start"], frame["key_stop"], strict=True)))
        columns = [f"keys {start}–{stop - 1}" for start, stop in blocks]
        cell = [(f"layer {r.layer}, query {r.query}", f"keys {r.key_start}–{r.key_stop - 1}", r.transfer)
                for r in frame.itertuples()]
    else:
        return {"title": title, "kind": "bars", "rows": [str(group) for group in frame["group"]], "columns": [],
                "values": [[float(value) for value in frame["transfer"]]],
                "errors": [float(value) for value in frame["transfer se"]], "value": "transfer"}
    grid = [[None] * len(columns) for _ in rows]
    for row, column, value in cell:
        grid[rows.index(row)][columns.index(column)] = None if np.isnan(value) else round(float(value), 4)
    return {"title": title, "kind": "grid", "rows": rows, "columns": columns, "values": grid, "errors": [],
            "value": "transfer"}
