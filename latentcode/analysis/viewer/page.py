"""The viewer's page: one self-contained HTML file (plotly's own bundle inlined from the plotly
package, the data as a JSON block, the glue of `glue.js`), which makes no network request: its
Content-Security-Policy allows nothing but the inline scripts and styles and `data:` images.

>>> viewer = build_viewer("codes.h5")       # in Jupyter, the last expression displays it inline
>>> viewer.save("codes.html")                # or `latentcode view codes.h5`
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path

from latentcode.analysis.embed import Embedding
from latentcode.analysis.viewer.data import DEFAULT_MAX_INSTANCES, viewer_data
from latentcode.analysis.viewer.tables import patching_map, probe_table, read_table
from latentcode.files import AtomicOutputs, check_replaceable
from latentcode.store import CodeFile

__all__ = ["Viewer", "build_viewer", "write_viewer"]

# Nothing from outside the page: scripts and styles inline, images as data: URLs (plotly's logo and
# modebar icons are inline SVG), no fetch, no frames, no fonts.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                           "img-src data: blob:; connect-src 'none'")

STYLE = """
body { font-family: system-ui, sans-serif; margin: 12px 18px; color: #222; }
h1 { font-size: 17px; margin: 4px 0 8px; } h3 { font-size: 14px; margin: 6px 0; }
#controls { display: flex; flex-wrap: wrap; gap: 6px 16px; align-items: center; font-size: 13px;
  padding: 6px 8px; background: #f4f4f4; border-radius: 4px; }
#controls select { max-width: 360px; }
.row { display: flex; gap: 12px; margin-top: 8px; }
#embedding { flex: 3; height: 520px; min-width: 0; }
#instance { flex: 1.3; font-size: 12px; overflow: auto; max-height: 520px; border-left: 1px solid #ddd; padding-left: \
10px; }
#instance th { text-align: left; padding-right: 8px; vertical-align: top; white-space: nowrap; }
#grid { flex: 1; height: 360px; min-width: 0; } #attention { flex: 1.6; height: 360px; min-width: 0; }
.plot { height: 360px; }
table.data { border-collapse: collapse; font-size: 12px; margin-bottom: 10px; }
table.data td, table.data th { border: 1px solid #ddd; padding: 2px 6px; text-align: right; }
#layer-note { font-size: 13px; margin: 6px 2px 0; color: #444; } #layer-note.constant { color: #8a3b00; }
footer { margin-top: 14px; font-size: 12px; color: #555; border-top: 1px solid #ddd; padding-top: 6px; }
"""

BODY = """<h1>{title}</h1>
<div id="controls">
 <label>layer <select id="layer"></select></label>
 <label>embedding <select id="projection"></select></label>
 <label>colour by <select id="colour"></select></label>
 <label>filter <select id="filter-label"></select> = <select id="filter-value"><option \
value="">(all)</option></select></label>
 <span><span id="shown-count"></span> of {n_shown} instances shown</span>
 <label>site <select id="site"></select></label>
 <label>grid <select id="grid-mode"><option value="instance">selected instance</option>
  <option value="mean">mean of the shown instances</option></select></label>
</div>
<p id="layer-note"></p>
<div class="row"><div id="embedding"></div><div id="instance"></div></div>
<div class="row"><div id="grid"></div><div id="attention"></div></div>
<div id="tables"></div>
<footer>{footer}</footer>"""

SIZE_PLACEHOLDER = "@@FILE_SIZE@@"


class Viewer:
    """One viewer page (`html`: the whole document); `save` writes it, Jupyter displays it inline."""

    def __init__(self, html_text: str, title: str):
        self.html = html_text
        self.title = title

    def __repr__(self) -> str:
        return f"Viewer({self.title!r}, {len(self.html.encode()) / 1e6:.1f} MB)"

    def _repr_html_(self) -> str:
        # An iframe of the whole page: its own document, so plotly meets no require.js of the
        # notebook, the page's CSP applies, and nothing is fetched (the notebook's own files aside).
        return (f'<iframe srcdoc="{html.escape(self.html, quote=True)}" title="{html.escape(self.title)}" '
                'style="width: 100%; height: 1100px; border: 1px solid #ddd" sandbox="allow-scripts"></iframe>')

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        """Write the page to `path` (atomically; an existing file only with `overwrite`)."""
        path = Path(path)
        check_replaceable(path, "the viewer page")
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path} exists; pass overwrite=True (--overwrite) to replace it")
        with AtomicOutputs(lock=path, purpose="latentcode view") as outputs:
            if path.exists() and not overwrite:  # checked under the lock: a second writer finds the first's file
                raise FileExistsError(f"{path} exists; pass overwrite=True (--overwrite) to replace it")
            outputs.write_text(path, self.html)
        return path


def build_viewer(
    code_file: CodeFile | str | Path,
    split: str | None = None,
    max_instances: int | None = DEFAULT_MAX_INSTANCES,
    seed: int = 0,
    embeddings: Sequence[Embedding] = (),
    probe_tables: Sequence | Mapping = (),
    patching: Sequence | Mapping = (),
    label: str | None = None,
    token_names: Sequence[str] | None = None,
) -> Viewer:
    """The viewer of one codes file (see `viewer_data` for the sample, `tables` for the tables).

    probe_tables / patching: paths of `latentcode probe` / `latentcode patch` CSV tables, pandas
    tables, or a mapping of title -> either. label: the label to colour by first (default: the
    task's picture label where the file names one). token_names: the text of each token id, where
    the file keeps its input tokens but not their names (see `viewer_data`).
    """
    import plotly
    from plotly.offline import get_plotlyjs

    code_file = code_file if isinstance(code_file, CodeFile) else CodeFile(code_file)
    payload = viewer_data(code_file, split, max_instances, seed, embeddings, token_names=token_names)
    glue = resources.files("latentcode.analysis.viewer").joinpath("glue.js").read_text(encoding="utf-8")
    payload["default_label"] = label or code_file.task_analysis.get("picture_label")
    probes = [(title, read_table(table, "probe table")) for title, table in _titled(probe_tables)]  # read once
    payload["tables"] = [probe_table(frame, title) for title, frame in probes]
    best = _best_probe_layer(probes, payload["layers"])
    if best is not None:
        payload["default_layer"], payload["default_layer_reason"] = best
    payload["patching"] = [patching_map(table, title) for title, table in _titled(patching)]
    title = (f"{payload['model']} · {code_file.path.name} · {split or 'all splits'} · latent codes "
             f"of {len(payload['sites'])} sites in {len(payload['layers'])} layers, {payload['heads']} heads")
    capped = payload["n_shown"] < payload["n_total"]
    footer = (f"{payload['n_shown']} of {payload['n_total']} instances shown"
              + (f" (cap {max_instances}, drawn uniformly with seed {seed})" if capped
                 else f" (cap {max_instances}: all)")
              + f"; codes rounded to {payload['decimals']} decimals for display; this file {SIZE_PLACEHOLDER}, "
              f"self-contained (plotly.js {plotly.__version__ if hasattr(plotly, '__version__') else ''} inline, no "
              "network requests). Hover a point for its labels and the model's answer; click it to select it.")
    data = json.dumps(payload, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")  # no "</" ends the element
    document = (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CONTENT_SECURITY_POLICY}\">"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        + BODY.format(title=html.escape(title), n_shown=payload["n_shown"], footer=html.escape(footer))
        # The scripts last: the title, controls and footer are painted while plotly.js is parsed.
        + f"<script type=\"application/json\" id=\"viewer-data\">{data}</script>"
        f"<script>{get_plotlyjs()}</script><script>{glue}</script></body></html>\n"
    )
    size = len(document.encode("utf-8")) - len(SIZE_PLACEHOLDER)
    document = document.replace(SIZE_PLACEHOLDER, f"{size / 1e6:.1f} MB", 1)
    return Viewer(document, title)


def _best_probe_layer(tables: list[tuple[str, object]], layers: Sequence[int]) -> tuple[int, str] | None:
    """The layer where the first probe table given (`latentcode probe`'s: columns layer, metric, value)
    decodes best on its first metric, with the reason shown on the page; None without such a table."""
    for title, frame in tables:
        if not {"layer", "metric", "value"} <= set(frame.columns):
            continue
        rows = frame[(frame["metric"] == frame["metric"].iloc[0])
                     & frame["layer"].isin(list(layers))].dropna(subset=["value"])
        if len(rows):
            row = rows.loc[rows["value"].idxmax()]
            return int(row["layer"]), (f"the layer where the probe table {title} decodes best "
                                       f"({row['metric']} {row['value']:.3f})")
    return None


def _titled(tables: Sequence | Mapping) -> list[tuple[str, object]]:
    if isinstance(tables, Mapping):
        return list(tables.items())
    return [(Path(table).stem if isinstance(table, str | Path) else f"table {index + 1}", table)
            for index, table in enumerate(tables)]


def write_viewer(code_file: CodeFile | str | Path, out: str | Path, overwrite: bool = False, **options) -> Path:
    """`build_viewer(code_file, **options)` saved to `out`; returns the path."""
    return build_viewer(code_file, **options).save(out, overwrite=overwrite)
