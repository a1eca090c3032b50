"""The token view: one example of a language model's codes file laid out as its tokens; click a token
to make it the query and see where every head of a layer attends (colour under the text, one strip per
head), a layer x head overview of that query, a head's pattern over a window of queries x keys, and
the relations of the chosen pair (previous, duplicate, induction, sink) named.

Two ways to get the rows, one page (`token_view.js`, no library, nothing from outside the page):
- static (`build_token_viewer`): a bounded selection of queries' rows, every layer, embedded at display
  rounding (`DECIMALS`), said on the page; for small files and for sharing.
- served (`latentcode.analysis.viewer.serve`): the page asks a local server for any row, rebuilt
  from the compact store on request, so any query at any length.

>>> build_token_viewer("smol.h5", token_names=names).save("smol.html")
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np

from latentcode.analysis.viewer.page import Viewer
from latentcode.analysis.viewer.token_rows import TokenRows, row_summary
from latentcode.errors import AnalysisError
from latentcode.store import CodeFile

__all__ = ["DECIMALS", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_QUERIES", "build_token_viewer", "token_page"]

DECIMALS = 3  # the static page's rows: codes rounded to 3 decimals, those that round to 0 left out
DEFAULT_MAX_QUERIES = 64  # queries whose rows a static page embeds, at most ...
DEFAULT_MAX_BYTES = 8_000_000  # ... and at most this much of their rows (the page's other parts are small)
WINDOW = 32  # the queries before the default one embedded first: the pattern matrix's first window

STATIC_POLICY = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                 "img-src data: blob:; connect-src 'none'")
SERVED_POLICY = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                 "img-src data: blob:; connect-src 'self'")

STYLE = """
body { font-family: system-ui, sans-serif; margin: 10px 16px; color: #222; }
h1 { font-size: 16px; margin: 4px 0 6px; } h3 { font-size: 13px; margin: 8px 0 4px; }
#controls { display: flex; flex-wrap: wrap; gap: 6px 14px; align-items: center; font-size: 13px;
  padding: 6px 8px; background: #f4f4f4; border-radius: 4px; }
#note { font-size: 12px; color: #555; margin: 4px 0; }
.row { display: flex; gap: 14px; margin-top: 8px; align-items: flex-start; }
#tokens { position: relative; flex: 3; min-width: 0; max-height: 330px; overflow: auto; border: 1px solid #ddd; \
padding: 6px;
  font-family: ui-monospace, monospace; font-size: 12.5px; line-height: 1.55; white-space: pre-wrap;
  word-break: break-all; }
#tokens span { cursor: pointer; border-radius: 2px; }
#tokens span:hover { outline: 1px solid #888; }
#tokens span.query { outline: 2px solid #d6301d; }
#tokens span.key { outline: 2px dashed #1a7f37; }
#tokens span.embedded { text-decoration: underline dotted #999; }
#tokens span.ws { color: #aaa; }
#legend i { display: inline-block; width: 70px; height: 10px; vertical-align: middle; border: 1px solid #ccc;
  background: linear-gradient(to right, rgba(33, 102, 172, 0), rgba(33, 102, 172, 0.85)); }
#side { flex: 2; min-width: 0; font-size: 12px; }
#overview td { width: 22px; height: 15px; font-size: 9px; text-align: center; cursor: pointer; padding: 0;
  border: 1px solid #fff; }
#overview td.chosen { outline: 2px solid #d6301d; }
#overview th { font-size: 9px; font-weight: normal; padding: 0 3px; }
#strips { border-collapse: collapse; font-size: 11px; }
#strips td { padding: 0 4px; white-space: nowrap; } #strips tr.chosen td:first-child { color: #d6301d; font-weight: \
bold; }
#strips canvas { display: block; cursor: crosshair; }
#relations { font-size: 12px; } #relations b { color: #1a7f37; }
#tooltip { position: fixed; pointer-events: none; background: #222; color: #fff; font-size: 11px; padding: 2px 5px;
  border-radius: 3px; display: none; white-space: pre; z-index: 10; }
#matrix { border: 1px solid #ddd; cursor: crosshair; }
footer { margin-top: 12px; font-size: 12px; color: #555; border-top: 1px solid #ddd; padding-top: 6px; }
"""

BODY = """<h1>{title}</h1>
<div id="controls">
 <label>example <select id="example"></select></label>
 <label>layer <select id="layer"></select></label>
 <label>head <select id="head"></select></label>
 <label>colour <select id="scale"><option value="row">relative to the row's largest code</option>
  <option value="absolute">the code itself</option></select></label>
 <span id="legend" title="colour under the text: its opacity is the square root of the code over the scale's top">
  0 <i></i> <span id="legend-top">1</span> (&radic;)</span>
 <label>overview <select id="overview-mode"><option value="top">top key's code</option>
  <option value="entropy">entropy</option></select></label>
 <label>pattern window <select id="window"></select></label>
 <span id="query-label"></span>
</div>
<div id="note">{note}</div>
<div class="row"><div id="tokens"></div>
 <div id="side"><h3>layer &times; head: the chosen query</h3>
 <div style="font-size: 11px; color: #555">each cell: how many tokens before the query its top key is (s: the first
 token); colour: that key's code, or 1 &minus; entropy / log(query + 1); click a cell for its layer and head</div>
 <table id="overview"></table>
 <h3>the chosen pair</h3><div id="relations"></div></div></div>
<h3>every head of the layer: the query's row over all keys</h3><table id="strips"></table>
<div class="row"><div><h3 id="matrix-title">pattern</h3><canvas id="matrix" width="440" height="440"></canvas></div>
 <div id="matrix-help" style="font-size: 12px; max-width: 420px"></div></div>
<div id="tooltip"></div>
<footer>{footer}</footer>"""


def _script() -> str:
    return resources.files("latentcode.analysis.viewer").joinpath("token_view.js").read_text(encoding="utf-8")


def _json_block(payload: dict) -> str:
    """JSON safe inside <script>: no "</" can end the element."""
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


def _sparse(row: np.ndarray) -> list:
    """One head's row `[T]` at display rounding: `[keys, codes x 10^DECIMALS]` of the codes that do not
    round to 0; a key the file does not record (NaN) as code -1."""
    scaled = np.round(np.nan_to_num(row.astype(np.float64), nan=-10.0 ** -DECIMALS) * 10 ** DECIMALS)
    keys = np.flatnonzero(scaled != 0)
    return [keys.tolist(), scaled[keys].astype(np.int64).tolist()]


def default_layer(layers: Sequence[int]) -> int:
    return layers[len(layers) // 2]


def embedded_queries(rows: TokenRows, query: int, max_queries: int) -> list[int]:
    """The order in which a static page embeds queries: `query`, the WINDOW before it (the pattern's
    first window), then queries spread evenly over the sequence."""
    available = rows.queries()
    if not rows.has_compact:
        ordered = [query] + [q for q in reversed(available) if q != query]
        return ordered[:max_queries]
    order = [query] + list(range(query - 1, max(-1, query - WINDOW), -1))
    spread = np.linspace(0, rows.seq_len - 1, max(2, max_queries - len(order))).round().astype(int).tolist()
    for q in spread:
        if q not in order:
            order.append(q)
    return order[:max_queries]


def token_payload(rows: TokenRows, example: int, mode: str, max_queries: int = DEFAULT_MAX_QUERIES,
                  max_bytes: int = DEFAULT_MAX_BYTES, query: int | None = None) -> dict:
    """The page's data: tokens of `example`, and for a static page the embedded rows (`embedded`)."""
    ids = rows.token_ids(example)
    query = (rows.queries()[-1] if query is None else int(query))
    payload = {
        "mode": mode, "file": rows.code_file.path.name, "model": rows.code_file.model_name,
        "n_examples": rows.n_examples, "example": int(example), "seq_len": rows.seq_len,
        "layers": rows.layers, "heads": rows.n_heads, "has_compact": rows.has_compact,
        "ids": ids.tolist(), "texts": {str(i): rows.token_names[i] for i in np.unique(ids).tolist()},
        "default": {"layer": default_layer(rows.layers), "query": query, "head": 0},
        "decimals": DECIMALS, "embedded": None,
    }
    if mode == "served":
        return payload
    # Each layer's rows of every candidate query in one read (its keys read once), kept sparse; then
    # queries are taken in order while their rows fit in max_bytes.
    candidates = embedded_queries(rows, query, max_queries)
    sparse: dict[int, dict[str, list]] = {q: {} for q in candidates}
    overviews: dict[int, list] = {q: [] for q in candidates}
    for layer in rows.layers:
        recorded = [q for q in candidates if rows.has_compact or q in rows.queries(layer)]
        layer_rows = rows.rows(example, layer, recorded) if recorded else None  # [H, Q, T]
        for q in candidates:
            if q not in recorded:
                overviews[q].append([[-1, 0.0, 0.0]] * rows.n_heads)
                continue
            row = layer_rows[:, recorded.index(q)]
            sparse[q][f"{layer}:{q}"] = [_sparse(head) for head in row]
            overviews[q].append(row_summary(row))
    embedded = {"queries": [], "rows": {}, "overview": {}}
    used = 0
    for q in candidates:
        size = len(json.dumps(sparse[q], separators=(",", ":"))) + len(json.dumps(overviews[q]))
        if embedded["queries"] and used + size > max_bytes:
            break
        used += size
        embedded["queries"].append(q)
        embedded["rows"].update(sparse[q])
        embedded["overview"][str(q)] = overviews[q]
    payload["embedded"] = embedded
    return payload


def token_page(payload: dict, title: str, footer: str) -> str:
    """The whole HTML document of the token view for `payload` (static or served)."""
    policy = SERVED_POLICY if payload["mode"] == "served" else STATIC_POLICY
    if payload["mode"] == "served":
        note = ("Served: every row is rebuilt from the file's compact store when a token is clicked (any query, "
                "any layer). Hover a token to preview it as the query, click to pin it; then hover a key for its "
                "code; click a strip or the pattern to choose a key; Esc unpins.")
    else:
        embedded = payload["embedded"]
        note = (f"Static page: the rows of {len(embedded['queries'])} of {payload['seq_len']} queries are embedded "
                f"(every layer and head, codes rounded to {payload['decimals']} decimals; their tokens are "
                "underlined). For any query, run latentcode view FILE --serve. Hover an underlined token to "
                "preview it as the query, click to pin it; then hover a key for its code; Esc unpins.")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{policy}\">"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
            + BODY.format(title=html.escape(title), note=html.escape(note), footer=html.escape(footer))
            + f"<script type=\"application/json\" id=\"token-data\">{_json_block(payload)}</script>"
            f"<script>{_script()}</script></body></html>\n")


def page_title(rows: TokenRows, example: int) -> str:
    source = "compact store: every pair exact" if rows.has_compact else "the recorded sites only"
    return (f"{rows.code_file.model_name} · {rows.code_file.path.name} · example {example} of {rows.n_examples} · "
            f"{rows.seq_len} tokens · {len(rows.layers)} layers × {rows.n_heads} heads ({source})")


def build_token_viewer(code_file: CodeFile | str | Path, example: int = 0, token_names: Sequence[str] | None = None,
                       max_queries: int = DEFAULT_MAX_QUERIES, max_bytes: int = DEFAULT_MAX_BYTES,
                       query: int | None = None) -> Viewer:
    """The static token view of one example of a codes file that keeps its token ids (see the module).

    token_names: the text of each token id where the file does not keep it (a tokenizer's
    `[decode([id]) for id in range(vocabulary)]`). query: the query shown first (default: the last)."""
    code_file = code_file if isinstance(code_file, CodeFile) else CodeFile(code_file)
    rows = TokenRows(code_file, token_names)
    if query is not None and not 0 <= int(query) < rows.seq_len:
        raise AnalysisError(f"query {query} is outside the {rows.seq_len} tokens; expected 0..{rows.seq_len - 1}")
    payload = token_payload(rows, example, "static", max_queries, max_bytes, query)
    title = page_title(rows, example)
    footer = (f"Self-contained page: no network request, no library (its script is latentcode's token_view.js). "
              f"Rows of {len(payload['embedded']['queries'])} queries embedded (cap {max_queries} queries and "
              f"{max_bytes / 1e6:.0f} MB of rows).")
    return Viewer(token_page(payload, title, footer), title)
