// The viewer's glue: reads the JSON data block and links plotly views. Plotly (inlined above) does
// the drawing; this file only wires selections, filters and hovers between the views.
(function () {
  "use strict";
  const timings = {glue_start: performance.now()};
  const data = JSON.parse(document.getElementById("viewer-data").textContent);
  const $ = (id) => document.getElementById(id);
  const n = data.n_shown;
  const H = data.heads;
  const state = {selected: 0, layer: data.default_layer !== undefined ? data.default_layer : data.layers[0], projection: "PCA", colour: null,
                 filterLabel: "", filterValue: "", site: null, gridMode: "instance"};
  const config = {displaylogo: false, responsive: true};
  // A legend of more values than this is a long list nobody reads (and slow to lay out): the hover
  // and the filter name the values instead.
  const MAX_LEGEND = 24;
  const small = {displayModeBar: false, responsive: true};
  // Blue below 0, white at 0, red above (matplotlib's RdBu_r): a code of 0 is white, as on the bar.
  const DIVERGING = [[0, "#2166ac"], [0.25, "#92c5de"], [0.5, "#f7f7f7"], [0.75, "#f4a582"], [1, "#b2182b"]];

  function option(select, value, text) {
    const element = document.createElement("option");
    element.value = value;
    element.textContent = text;
    select.appendChild(element);
  }
  function escapeHtml(text) {
    return String(text).replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
  }
  // A position named the task's way: its token in the selected instance (language), else the task's
  // name of the position (SRAVEN panels and features), else its number. Plain text: escape it for HTML.
  const tokenColumn = data.tokens ? new Map(data.tokens.positions.map((p, column) => [p, column])) : null;
  function positionName(position, i) {
    if (tokenColumn && tokenColumn.has(position)) {
      return "“" + data.tokens.texts[i === undefined ? state.selected : i][tokenColumn.get(position)] + "” (" + position + ")";
    }
    return instanceFreeName(position);
  }
  // Where tokens differ by instance (the site menu, the mean over instances): the position itself.
  function instanceFreeName(position) {
    return data.positions[position] !== undefined ? data.positions[position] + " (" + position + ")" : "position " + position;
  }
  function labelText(name, i) {
    const label = data.labels[name];
    return label.values[label.index[i]];
  }
  function code(i, siteIndex, head) {
    return data.codes[i][siteIndex * H + head];
  }
  function colourOf(k, count) {
    const hue = (k * 137.508) % 360;
    return "hsl(" + hue.toFixed(1) + "," + (55 + 20 * (k % 2)) + "%," + (38 + 14 * (k % 3)) + "%)";
  }

  // -- which instances are shown --------------------------------------------------------------------
  function visible() {
    const shown = [];
    const label = data.labels[state.filterLabel];
    const wanted = label ? label.values.indexOf(state.filterValue) : -1;
    for (let i = 0; i < n; i++) {
      if (!label || state.filterValue === "" || label.index[i] === wanted) shown.push(i);
    }
    return shown;
  }

  // -- the embedding ---------------------------------------------------------------------------------
  function hoverText(i) {
    const lines = ["<b>instance " + data.instances.row[i] + "</b> (" + escapeHtml(data.instances.split[i]) + ")"];
    for (const name of Object.keys(data.labels)) {
      if (name === "split") continue;
      lines.push(escapeHtml(name) + ": " + escapeHtml(labelText(name, i)));
    }
    if (data.instances.answer[i] !== "") lines.push("model's answer: " + escapeHtml(data.instances.answer[i]));
    if (data.instances.target[i] !== "") lines.push("target: " + escapeHtml(data.instances.target[i]));
    return lines.join("<br>");
  }
  const hoverTexts = Array.from({length: n}, (_, i) => hoverText(i));

  function drawEmbedding() {
    const projection = data.embeddings[state.projection][state.layer];
    const shown = visible();
    const label = data.labels[state.colour];
    const groups = new Map();
    for (const i of shown) {
      const key = label ? label.index[i] : 0;
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(i);
    }
    const keys = Array.from(groups.keys()).sort((a, b) => a - b);
    const count = label ? label.values.length : 1;
    const traces = keys.map((key) => {
      const members = groups.get(key);
      return {type: "scatter", mode: "markers", name: label ? label.values[key] : "instances",
              x: members.map((i) => projection.x[i]), y: members.map((i) => projection.y[i]),
              customdata: members, text: members.map((i) => hoverTexts[i]), hovertemplate: "%{text}<extra></extra>",
              marker: {size: 6, color: colourOf(key, count), opacity: 0.8}};
    });
    const s = state.selected;
    traces.push({type: "scatter", mode: "markers", name: "selected", showlegend: false, hoverinfo: "skip",
                 x: [projection.x[s]], y: [projection.y[s]], customdata: [s],
                 marker: {size: 16, color: "rgba(0,0,0,0)", line: {color: "black", width: 2}}});
    const lines = [data.model + " · layer " + state.layer + " · " + state.projection + " of the codes · " +
      (data.split || "all splits") + " · " + shown.length + " of " + n + " shown" +
      (state.filterValue !== "" ? " (" + state.filterLabel + " = " + state.filterValue + ")" : "")];
    if (label && keys.length > MAX_LEGEND) lines.push("colour: " + keys.length + " values of " + state.colour + " (hover a point, or filter)");
    const title = lines.map(escapeHtml).join("<br>");
    Plotly.react("embedding", traces, {
      title: {text: title, font: {size: 13}}, hovermode: "closest", uirevision: state.projection + state.layer,
      xaxis: {title: {text: projection.axes[0]}, zeroline: false}, yaxis: {title: {text: projection.axes[1]}, zeroline: false},
      showlegend: keys.length <= MAX_LEGEND, legend: {title: {text: escapeHtml(state.colour || "")}, font: {size: 9}}, margin: {t: 40, r: 10, b: 45, l: 50},
    }, config);
    $("shown-count").textContent = shown.length;
  }

  // -- the selected instance -------------------------------------------------------------------------
  function drawInstance() {
    const i = state.selected;
    let html = "<h3>instance " + data.instances.row[i] + " <small>(" + escapeHtml(data.instances.split[i]) + ")</small></h3><table>";
    for (const name of Object.keys(data.labels)) {
      html += "<tr><th>" + escapeHtml(name) + "</th><td>" + escapeHtml(labelText(name, i)) + "</td></tr>";
    }
    // a file without predictions or targets (a pretrained model's) has no rows for them
    if (data.instances.answer[i] !== "") html += "<tr><th>model's answer</th><td>" + escapeHtml(data.instances.answer[i]) + "</td></tr>";
    if (data.instances.target[i] !== "") html += "<tr><th>target</th><td>" + escapeHtml(data.instances.target[i]) + "</td></tr>";
    if (data.tokens) {
      const [query] = state.site.split(":").map(Number);
      const keys = data.sites.filter((s) => s.query === query).map((s) => s.key);
      const named = Array.from(new Set(keys)).sort((a, b) => a - b).map((key) =>
        "<span class='token' data-position='" + key + "'>" + escapeHtml(positionName(key, i)) + "</span>");
      html += "<tr><th>query</th><td class='token'>" + escapeHtml(positionName(query, i)) + "</td></tr>";
      html += "<tr><th>keys</th><td id='key-tokens'>" + named.join(" ") + "</td></tr>";
    }
    html += "</table>";
    $("instance").innerHTML = html;
    $("instance").dataset.row = data.instances.row[i];
  }

  const codeRange = (function () {
    let low = Infinity, high = -Infinity;
    for (const row of data.codes) for (const value of row) if (value !== null) { low = Math.min(low, value); high = Math.max(high, value); }
    if (low >= 0) return {zmin: 0, zmax: high > 0 ? high : 1, colorscale: "Viridis"};
    const limit = Math.max(-low, high);
    return {zmin: -limit, zmax: limit, colorscale: DIVERGING};
  })();

  function siteKey(site) { return site.query + ":" + site.key; }

  function drawGrid() {
    const [query, key] = state.site.split(":").map(Number);
    const shown = visible();
    const z = data.layers.map((layer) => {
      const index = data.sites.findIndex((s) => s.layer === layer && s.query === query && s.key === key);
      return Array.from({length: H}, (_, head) => {
        if (index < 0) return null;
        if (state.gridMode === "instance") return code(state.selected, index, head);
        let total = 0, count = 0;
        for (const i of shown) { const v = code(i, index, head); if (v !== null) { total += v; count++; } }
        return count ? total / count : null;
      });
    });
    const what = state.gridMode === "instance" ? "instance " + data.instances.row[state.selected]
      : "mean of the " + shown.length + " shown" + (state.filterValue !== "" ? " (" + state.filterLabel + " = " + state.filterValue + ")" : "");
    Plotly.react("grid", [{type: "heatmap", z: z, x: Array.from({length: H}, (_, h) => String(h)),
      y: data.layers.map((l) => "layer " + l), hovertemplate: "%{y}, head %{x}: %{z:.3f}<extra></extra>",
      zmin: codeRange.zmin, zmax: codeRange.zmax, colorscale: codeRange.colorscale,
      colorbar: {title: {text: "code"}}}], {
      title: {text: escapeHtml("codes, layer × head, " + (state.gridMode === "instance"
                 ? positionName(query) + " → " + positionName(key) : instanceFreeName(query) + " → " + instanceFreeName(key))) + "<br>" +
               escapeHtml(what), font: {size: 12}},
      margin: {t: 50, r: 10, b: 40, l: 70}, yaxis: {autorange: "reversed"}, xaxis: {title: {text: "head"}, type: "category"},
    }, small);
  }

  function drawAttention() {
    const [query] = state.site.split(":").map(Number);
    const indices = [];
    data.sites.forEach((s, index) => { if (s.layer === state.layer && s.query === query) indices.push(index); });
    indices.sort((a, b) => data.sites[a].key - data.sites[b].key);
    const i = state.selected;
    const z = Array.from({length: H}, (_, head) => indices.map((index) => code(i, index, head)));
    Plotly.react("attention", [{type: "heatmap", z: z, x: indices.map((index) => escapeHtml(positionName(data.sites[index].key))),
      y: Array.from({length: H}, (_, h) => "head " + h), hovertemplate: "%{y} → key %{x}: %{z:.3f}<extra></extra>",
      zmin: codeRange.zmin, zmax: codeRange.zmax, colorscale: codeRange.colorscale,
      colorbar: {title: {text: "code"}}}], {
      title: {text: escapeHtml("instance " + data.instances.row[i] + " · layer " + state.layer + " · from " +
                               positionName(query) + " to every recorded key, per head"), font: {size: 12}},
      margin: {t: 40, r: 10, b: 90, l: 60}, yaxis: {autorange: "reversed"}, xaxis: {tickangle: -60, tickfont: {size: 9}},
    }, small);
  }

  function select(i) {
    state.selected = i;
    drawInstance();
    drawEmbedding();
    drawGrid();
    drawAttention();
  }

  // -- probe tables and the patching map -------------------------------------------------------------
  function drawTables() {
    for (const [index, table] of (data.tables || []).entries()) {
      let html = "<h3>" + escapeHtml(table.title) + "</h3><table class='data'><tr>" +
        table.columns.map((c) => "<th>" + escapeHtml(c) + "</th>").join("") + "</tr>";
      for (const row of table.rows) html += "<tr>" + row.map((v) => "<td>" + escapeHtml(v) + "</td>").join("") + "</tr>";
      const element = document.createElement("div");
      element.id = "table-" + index;
      element.innerHTML = html + "</table>";
      $("tables").appendChild(element);
    }
    for (const [index, map] of (data.patching || []).entries()) {
      const element = document.createElement("div");
      element.id = "patching-" + index;
      element.className = "plot";
      $("tables").appendChild(element);
      const limit = Math.max(0.1, ...map.values.flat().filter((v) => v !== null).map(Math.abs));
      const trace = map.kind === "grid"
        ? {type: "heatmap", z: map.values, x: map.columns, y: map.rows, zmin: -limit, zmax: limit, colorscale: DIVERGING, colorbar: {title: {text: map.value}}, hovertemplate: "%{y}, %{x}: %{z:.3f}<extra></extra>"}
        : {type: "bar", orientation: "h", x: map.values[0], y: map.rows, error_x: {type: "data", array: map.errors, visible: true},
           hovertemplate: "%{y}: %{x:.3f}<extra></extra>"};
      Plotly.newPlot(element, [trace], {title: {text: escapeHtml(map.title), font: {size: 12}},
        margin: {t: 40, r: 10, b: 40, l: 120}, yaxis: {autorange: "reversed"}}, config);
    }
  }

  // -- what the page says about the layer shown --------------------------------------------------------
  function noteLayer() {
    const constant = data.constant_layers || [];
    const parts = [];
    if (state.layer === data.default_layer && data.default_layer_reason) {
      parts.push("Opened on layer " + state.layer + ": " + data.default_layer_reason + ".");
    }
    if (constant.includes(state.layer)) {
      parts.push("Layer " + state.layer + "'s codes are identical across the " + n + " shown instances: its embedding is " +
                 "one point, and the codes carry nothing that tells the instances apart (e.g. a query that can only " +
                 "attend to tokens that are the same in every instance).");
    } else if (constant.length) {
      parts.push("The codes of layer" + (constant.length > 1 ? "s " : " ") + constant.join(", ") +
                 " are identical across the shown instances.");
    }
    $("layer-note").textContent = parts.join(" ");
    $("layer-note").className = constant.includes(state.layer) ? "constant" : "";
  }

  // -- controls --------------------------------------------------------------------------------------
  function setUp() {
    const constant = new Set(data.constant_layers || []);
    data.layers.forEach((layer) => option($("layer"), layer, "layer " + layer + (constant.has(layer) ? " (same code for every instance)" : "")));
    $("layer").value = state.layer;
    Object.keys(data.embeddings).forEach((name) => option($("projection"), name, name));
    const names = Object.keys(data.labels);
    names.forEach((name) => option($("colour"), name, name));
    state.colour = data.default_label && data.labels[data.default_label] ? data.default_label : names[0] || null;
    if (state.colour) $("colour").value = state.colour;
    option($("filter-label"), "", "(no filter)");
    names.filter((name) => data.labels[name].filter).forEach((name) => option($("filter-label"), name, name));
    const seen = new Set();
    data.sites.forEach((s) => {
      if (seen.has(siteKey(s))) return;
      seen.add(siteKey(s));
      option($("site"), siteKey(s), instanceFreeName(s.query) + " → " + instanceFreeName(s.key));
    });
    state.site = data.default_site || siteKey(data.sites[data.sites.length - 1]);
    $("site").value = state.site;

    $("layer").onchange = () => { state.layer = Number($("layer").value); noteLayer(); drawEmbedding(); drawAttention(); };
    noteLayer();
    $("projection").onchange = () => { state.projection = $("projection").value; drawEmbedding(); };
    $("colour").onchange = () => { state.colour = $("colour").value; drawEmbedding(); };
    $("site").onchange = () => { state.site = $("site").value; drawInstance(); drawGrid(); drawAttention(); };
    $("grid-mode").onchange = () => { state.gridMode = $("grid-mode").value; drawGrid(); };
    $("filter-label").onchange = () => {
      state.filterLabel = $("filter-label").value;
      state.filterValue = "";
      const values = $("filter-value");
      values.innerHTML = "";
      option(values, "", "(all " + (data.labels[state.filterLabel] ? data.labels[state.filterLabel].values.length : 0) + " values)");
      if (data.labels[state.filterLabel]) data.labels[state.filterLabel].values.forEach((v) => option(values, v, v));
      drawEmbedding(); drawGrid();
    };
    $("filter-value").onchange = () => {
      state.filterValue = $("filter-value").value;
      const shown = visible();
      if (shown.length && !shown.includes(state.selected)) { select(shown[0]); return; }
      drawEmbedding(); drawGrid();
    };
  }

  timings.data_parsed = performance.now();
  setUp();
  select(0);
  timings.views_drawn = performance.now();
  drawTables();
  $("embedding").on("plotly_click", (event) => {
    const point = event.points[0];
    if (point && point.customdata !== undefined) select(point.customdata);
  });
  timings.ready = performance.now();
  document.body.dataset.timings = JSON.stringify(timings);
  document.body.dataset.readyMs = timings.ready.toFixed(0);
  document.body.dataset.ready = "true";
})();
