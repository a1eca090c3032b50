// The token view (token_page.py): the text as tokens, a query chosen by a click, every head's row of
// the chosen layer as colour under the text and as strips, a layer x head overview, a head's pattern
// over a window and the chosen pair's relations. Rows come from the page (static) or from the local
// server that wrote it (served: /rows, /overview, /block, /tokens, same origin only). Plain DOM and
// canvas; every token's text is set as text (textContent), never parsed as HTML.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("token-data").textContent);
  const $ = (id) => document.getElementById(id);
  const T = data.seq_len, H = data.heads, served = data.mode === "served";
  const embedded = data.embedded;
  const embeddedQueries = new Set(embedded ? embedded.queries : []);
  const scaleDecimals = Math.pow(10, data.decimals);
  // pinned: a click fixed the query; until then hovering a token previews it as the query.
  const state = {example: data.example, layer: data.default.layer, head: data.default.head,
                 query: data.default.query, key: null, window: 32, scale: "row", overviewMode: "top", pinned: false};
  let ids = data.ids, texts = data.texts;
  let currentRows = null;  // Float32Array [H * T] of the drawn row
  let spans = [], shownAlpha = new Float32Array(T);
  let drawCount = 0, matrixCount = 0, followUp = null;  // the latest request of each: an older answer is dropped
  window.tokenView = {state: state, timings: [], previews: 0};

  // -- whitespace shown, text as text --------------------------------------------------------------
  function shown(text) {
    if (text === "") return "∅";
    return text.replace(/\t/g, "→\t").replace(/\r/g, "␍").replace(/\n/g, "↵\n");
  }
  function tokenText(position) {
    const text = texts[String(ids[position])];
    return text === undefined ? "#" + ids[position] : text;
  }
  function quoted(position) {
    return "“" + shown(tokenText(position)).replace(/\n/g, "") + "” (" + position + ")";
  }
  function option(select, value, text) {
    const element = document.createElement("option");
    element.value = value;
    element.textContent = text;
    select.appendChild(element);
  }

  // -- rows: from the page or from the server --------------------------------------------------------
  const cache = new Map();
  function remember(key, value) {
    cache.set(key, value);
    if (cache.size > 400) cache.delete(cache.keys().next().value);
    return value;
  }
  function request(path, binary) {
    return fetch(path, {credentials: "omit"}).then((response) => {
      if (!response.ok) return response.text().then((text) => { throw new Error(text); });
      return binary ? response.arrayBuffer() : response.json();
    });
  }
  function decodeEmbedded(layer, query) {
    const rows = embedded.rows[layer + ":" + query];
    if (!rows) return null;
    const out = new Float32Array(H * T);
    for (let h = 0; h < rows.length; h++) {
      const [keys, codes] = rows[h];
      for (let i = 0; i < keys.length; i++) out[h * T + keys[i]] = codes[i] < 0 ? NaN : codes[i] / scaleDecimals;
    }
    if (!data.has_compact) {  // a site file: keys without a site are absent, not 0
      for (let h = 0; h < rows.length; h++) {
        const recorded = new Set(rows[h][0]);
        for (let k = 0; k < T; k++) if (!recorded.has(k)) out[h * T + k] = NaN;
      }
    }
    return out;
  }
  function getRows(layer, query) {
    const key = "r" + state.example + ":" + layer + ":" + query;
    if (cache.has(key)) return Promise.resolve(cache.get(key));
    if (!served) return Promise.resolve(remember(key, decodeEmbedded(layer, query)));
    return request("/rows?example=" + state.example + "&layer=" + layer + "&query=" + query, true)
      .then((buffer) => remember(key, new Float32Array(buffer)));
  }
  function getOverview(query) {
    const key = "o" + state.example + ":" + query;
    if (cache.has(key)) return Promise.resolve(cache.get(key));
    if (!served) return Promise.resolve(embedded.overview[String(query)] || null);
    return request("/overview?example=" + state.example + "&query=" + query, false).then((o) => remember(key, o));
  }
  function getBlock(layer, head, q0, q1) {  // [q1 - q0, q1 - q0]: queries and keys q0..q1-1
    const n = q1 - q0;
    if (served) {
      return request("/block?example=" + state.example + "&layer=" + layer + "&head=" + head + "&q0=" + q0 +
                     "&q1=" + q1 + "&k0=" + q0 + "&k1=" + q1, true).then((b) => new Float32Array(b));
    }
    const out = new Float32Array(n * n).fill(NaN);
    for (let q = q0; q < q1; q++) {
      const rows = decodeEmbedded(layer, q);
      if (!rows) continue;
      for (let k = q0; k < q1; k++) out[(q - q0) * n + (k - q0)] = rows[head * T + k];
    }
    return Promise.resolve(out);
  }

  // -- colours -----------------------------------------------------------------------------------
  function blue(alpha) { return "rgba(33, 102, 172, " + alpha.toFixed(3) + ")"; }
  function heatRGB(value) {  // 0 white .. 1 dark red; NaN grey
    if (!(value === value)) return [217, 217, 217];
    const v = Math.max(0, Math.min(1, value));
    return [Math.round(255 - 77 * v), Math.round(255 - 231 * v), Math.round(255 - 212 * v)];
  }
  function heat(value) { return "rgb(" + heatRGB(value).join(",") + ")"; }
  function headValues(rows, head) {  // [T] of one head, or the max over heads ("all")
    if (head >= 0) return rows.subarray(head * T, head * T + T);
    const out = new Float32Array(T);
    for (let k = 0; k < T; k++) {
      let best = 0;
      for (let h = 0; h < H; h++) { const v = rows[h * T + k]; if (v > best) best = v; }
      out[k] = best;
    }
    return out;
  }
  function maxOf(values) {
    let best = 0;
    for (let k = 0; k < values.length; k++) if (values[k] > best) best = values[k];
    return best;
  }

  // -- the text ----------------------------------------------------------------------------------
  function layOutTokens() {
    const box = $("tokens");
    box.textContent = "";
    const fragment = document.createDocumentFragment();
    spans = new Array(T);
    for (let position = 0; position < T; position++) {
      const span = document.createElement("span");
      const text = tokenText(position);
      span.textContent = shown(text);
      span.dataset.pos = position;
      if (text.trim() === "") span.classList.add("ws");
      if (embeddedQueries.has(position)) span.classList.add("embedded");
      fragment.appendChild(span);
      spans[position] = span;
    }
    box.appendChild(fragment);
    shownAlpha = new Float32Array(T);
  }
  function colourTokens(rows) {
    const values = headValues(rows, state.head);
    const top = state.scale === "row" ? (maxOf(values) || 1) : 1;
    $("legend-top").textContent = top.toFixed(3) + (state.scale === "row" ? " (the row's largest)" : "");
    for (let k = 0; k < T; k++) {
      const v = values[k];
      const alpha = v === v ? Math.sqrt(Math.max(0, v) / top) * 0.85 : 0;
      if (Math.abs(alpha - shownAlpha[k]) > 0.004) {
        spans[k].style.backgroundColor = alpha > 0.004 ? blue(alpha) : "";
        shownAlpha[k] = alpha;
      }
    }
  }
  function markQueryAndKey() {
    for (const span of $("tokens").querySelectorAll("span.query, span.key")) span.classList.remove("query", "key");
    if (spans[state.query]) spans[state.query].classList.add("query");
    const key = chosenKey();
    if (key !== null && spans[key]) spans[key].classList.add("key");
    $("query-label").textContent = "query " + quoted(state.query) + (key === null ? "" : " → key " + quoted(key)) +
      (state.pinned ? " · pinned (Esc or a click on it: hover previews again)" : " · hover a token to preview it, click to pin");
    document.body.dataset.pinned = state.pinned;
  }

  // -- the strips: every head's row over all keys ----------------------------------------------------
  const STRIP_WIDTH = Math.min(1100, Math.max(300, T)), STRIP_HEIGHT = 13;
  function drawStrips(rows) {
    const table = $("strips");
    if (table.rows.length !== H) {
      table.textContent = "";
      for (let h = 0; h < H; h++) {
        const tr = table.insertRow();
        tr.className = "head";
        tr.dataset.head = h;
        tr.insertCell().textContent = "h" + h;
        const canvas = document.createElement("canvas");
        canvas.width = STRIP_WIDTH;
        canvas.height = STRIP_HEIGHT;
        canvas.dataset.head = h;
        tr.insertCell().appendChild(canvas);
        tr.insertCell();
        canvas.addEventListener("mousemove", (event) => stripHover(event, h));
        canvas.addEventListener("mouseleave", hideTip);
        canvas.addEventListener("click", (event) => { state.head = h; $("head").value = h; chooseKey(stripKey(event)); });
      }
    }
    const span = state.query + 1;  // keys after the query are masked: the strip spans 0..query
    for (let h = 0; h < H; h++) {
      const tr = table.rows[h];
      const values = rows.subarray(h * T, h * T + T);
      tr.values = values;  // what is drawn, for a reader of the page (tests)
      tr.classList.toggle("chosen", h === state.head);
      const canvas = tr.cells[1].firstChild, context = canvas.getContext("2d");
      const image = context.createImageData(STRIP_WIDTH, 1);
      const top = state.scale === "row" ? (maxOf(values) || 1) : 1;
      for (let x = 0; x < STRIP_WIDTH; x++) {  // each pixel: the largest code of its keys
        const k0 = Math.floor(x * span / STRIP_WIDTH), k1 = Math.max(k0 + 1, Math.floor((x + 1) * span / STRIP_WIDTH));
        let best = -Infinity;
        for (let k = k0; k < k1 && k < T; k++) if (values[k] > best) best = values[k];
        const colour = heatRGB(best === -Infinity ? NaN : Math.sqrt(Math.max(0, best) / top));
        image.data[4 * x] = colour[0]; image.data[4 * x + 1] = colour[1]; image.data[4 * x + 2] = colour[2];
        image.data[4 * x + 3] = 255;
      }
      for (let y = 0; y < STRIP_HEIGHT; y++) context.putImageData(image, 0, y);
      let topKey = 0;
      for (let k = 1; k < T; k++) if (values[k] > values[topKey]) topKey = k;
      tr.cells[2].textContent = "top " + quoted(topKey) + " " + values[topKey].toFixed(3) + " " +
        relations(state.query, topKey).join(", ");
    }
  }
  function stripKey(event) {
    const x = event.offsetX * STRIP_WIDTH / event.target.clientWidth;
    return Math.min(state.query, Math.floor(x * (state.query + 1) / STRIP_WIDTH));
  }
  function stripHover(event, head) {
    if (!currentRows) return;
    const key = stripKey(event);
    showTip(event, "h" + head + " → " + quoted(key) + ": " + formatCode(currentRows[head * T + key]));
  }

  // -- tooltip -------------------------------------------------------------------------------------
  function formatCode(value) { return value === value ? value.toFixed(3) : "not recorded"; }
  function showTip(event, text) {
    const tip = $("tooltip");
    tip.textContent = text;
    tip.style.left = (event.clientX + 12) + "px";
    tip.style.top = (event.clientY + 12) + "px";
    tip.style.display = "block";
  }
  function hideTip() { $("tooltip").style.display = "none"; }

  // -- relations of a pair -------------------------------------------------------------------------
  function relations(query, key) {
    const names = [];
    if (key === query) names.push("self");
    if (key === query - 1) names.push("previous");
    if (key < query && ids[key] === ids[query]) names.push("duplicate");
    if (key >= 1 && key <= query && ids[key - 1] === ids[query] && key - 1 < query) names.push("induction");
    if (key === 0) names.push("sink");
    return names;
  }
  const MEANING = {self: "the query itself", previous: "the token before the query",
                   duplicate: "an earlier copy of the query's token",
                   induction: "the token after an earlier copy of the query's token", sink: "the first token"};
  function chosenKey() {
    if (state.key !== null && state.key <= state.query) return state.key;
    if (!currentRows) return null;
    const values = headValues(currentRows, state.head);
    let top = 0;
    for (let k = 1; k <= state.query; k++) if (values[k] > values[top]) top = k;
    return top;
  }
  function drawRelations() {
    const box = $("relations");
    box.textContent = "";
    const key = chosenKey();
    if (key === null || !currentRows) return;
    const line = document.createElement("div");
    line.appendChild(document.createTextNode("query " + quoted(state.query) + " → key " + quoted(key) +
      (state.key === null ? " (the top key of " + (state.head < 0 ? "any head" : "h" + state.head) + ")" : "") + ": "));
    const names = relations(state.query, key);
    const bold = document.createElement("b");
    bold.id = "pair-relations";
    bold.textContent = names.length ? names.join(", ") : "none of previous, duplicate, induction, sink";
    line.appendChild(bold);
    box.appendChild(line);
    for (const name of names) {
      const detail = document.createElement("div");
      detail.textContent = name + ": " + MEANING[name];
      box.appendChild(detail);
    }
    const codes = document.createElement("div");
    codes.id = "pair-codes";
    const parts = [];
    for (let h = 0; h < H; h++) parts.push("h" + h + " " + formatCode(currentRows[h * T + key]));
    codes.textContent = "layer " + state.layer + ": " + parts.join(" · ");
    box.appendChild(codes);
  }
  function chooseKey(key) {
    state.key = key;
    state.pinned = true;  // a key of this query chosen: the query stays
    markQueryAndKey();
    drawRelations();
    if (currentRows) drawStrips(currentRows);
    drawMatrix();
  }

  // -- the overview: layer x head of the chosen query ----------------------------------------------
  function drawOverview(summary) {
    const table = $("overview");
    table.textContent = "";
    if (!summary) {
      table.insertRow().insertCell().textContent = served ? "…" : "not embedded for this query";
      return;
    }
    const head = table.insertRow();
    head.appendChild(document.createElement("th"));
    for (let h = 0; h < H; h++) { const th = document.createElement("th"); th.textContent = "h" + h; head.appendChild(th); }
    data.layers.forEach((layer, index) => {
      const tr = table.insertRow();
      const th = document.createElement("th");
      th.textContent = "L" + layer;
      tr.appendChild(th);
      for (let h = 0; h < H; h++) {
        const [key, code, entropy] = summary[index][h];
        const td = tr.insertCell();
        const value = state.overviewMode === "top" ? code : 1 - entropy / Math.log(Math.max(2, state.query + 1));
        td.style.backgroundColor = key < 0 ? "#eee" : heat(value);
        td.style.color = value > 0.6 ? "#fff" : "#222";
        td.textContent = key < 0 ? "" : (key === 0 ? "s" : String(state.query - key));
        td.title = key < 0 ? "not recorded" : "layer " + layer + " h" + h + ": top key " + quoted(key) + " " +
          code.toFixed(3) + "; entropy " + entropy.toFixed(2) + " nats; " + (relations(state.query, key).join(", ") || "-");
        if (layer === state.layer && h === state.head) td.classList.add("chosen");
        td.addEventListener("click", () => { state.layer = layer; state.head = h; $("layer").value = layer;
                                               $("head").value = h; state.key = null; drawQuery(); });
      }
    });
  }

  // -- the pattern: one head over a window of queries x keys ---------------------------------------
  let matrixWindow = null;
  function drawMatrix() {
    const head = Math.max(0, state.head);
    const q1 = state.query + 1, q0 = Math.max(0, q1 - state.window), n = q1 - q0;
    const token = ++matrixCount;
    $("matrix-title").textContent = "pattern of layer " + state.layer + " h" + head + ": queries and keys " + q0 +
      ".." + (q1 - 1) + " (window " + state.window + ")";
    getBlock(state.layer, head, q0, q1).then((block) => {
      if (token !== matrixCount) return;
      matrixWindow = {q0: q0, n: n, block: block};
      const canvas = $("matrix"), context = canvas.getContext("2d");
      const cell = canvas.width / n;
      context.fillStyle = "#fff";
      context.fillRect(0, 0, canvas.width, canvas.height);
      for (let i = 0; i < n; i++) {
        for (let j = 0; j <= i; j++) {
          const value = block[i * n + j];
          context.fillStyle = heat(value === value ? Math.sqrt(Math.max(0, value)) : NaN);
          context.fillRect(j * cell, i * cell, Math.ceil(cell), Math.ceil(cell));
        }
      }
      const key = chosenKey();
      context.strokeStyle = "#d6301d";
      context.strokeRect(0, (state.query - q0) * cell, canvas.width, cell);
      if (key !== null && key >= q0) { context.strokeStyle = "#1a7f37"; context.strokeRect((key - q0) * cell, 0, cell, canvas.height); }
    }).catch(reportError);
  }
  function matrixCell(event) {
    if (!matrixWindow) return null;
    const canvas = $("matrix"), cell = canvas.clientWidth / matrixWindow.n;
    const i = Math.floor(event.offsetY / cell), j = Math.floor(event.offsetX / cell);
    if (i < 0 || j < 0 || i >= matrixWindow.n || j >= matrixWindow.n) return null;
    return {query: matrixWindow.q0 + i, key: matrixWindow.q0 + j, value: matrixWindow.block[i * matrixWindow.n + j]};
  }

  // -- choosing a query ----------------------------------------------------------------------------
  function reportError(error) { $("note").textContent = "error: " + error.message; }
  function drawQuery(startedAt) {
    const started = startedAt === undefined ? performance.now() : startedAt;
    const query = state.query, layer = state.layer, token = ++drawCount;
    markQueryAndKey();
    return getRows(layer, query).then((rows) => {
      if (token !== drawCount) return;
      if (!rows) {
        currentRows = null;
        $("note").textContent = "The rows of query " + quoted(query) + " are not in this page (" +
          embeddedQueries.size + " of " + T + " queries embedded, underlined); latentcode view FILE --serve gives any.";
        document.body.dataset.drawnQuery = "";
        return;
      }
      const arrived = performance.now();
      currentRows = rows;
      colourTokens(rows);
      const coloured = performance.now();
      drawStrips(rows);
      markQueryAndKey();
      drawRelations();
      const drawn = performance.now();
      // The time to the row on screen: the next frame is rendered after requestAnimationFrame's
      // callbacks, and a task queued from one runs once that frame is done.
      requestAnimationFrame(() => setTimeout(() => {
        const ms = performance.now() - started;
        window.tokenView.timings.push({query: query, layer: layer, ms: ms, rows: arrived - started,
                                       text: coloured - arrived, strips: drawn - coloured,
                                       frame: performance.now() - drawn});
        document.body.dataset.drawnQuery = query;
        document.body.dataset.drawnLayer = layer;
        document.body.dataset.drawnMs = ms.toFixed(1);
      }, 0));
      // The pattern and the overview (30 rows at once when served) follow once no other token is being
      // clicked: a quick run of clicks asks for the rows of each, the rest only for the last.
      clearTimeout(followUp);
      followUp = setTimeout(() => {
        if (state.query !== query) return;
        drawMatrix();
        getOverview(query).then((summary) => {
          if (state.query !== query) return;
          drawOverview(summary);
          document.body.dataset.overviewQuery = query;
        }).catch(reportError);
      }, served ? 150 : 0);
    }).catch(reportError);
  }
  function chooseQuery(query, startedAt) {
    state.query = query;
    state.key = null;
    return drawQuery(startedAt);
  }

  // -- hover: a preview of the token under the mouse as the query ------------------------------------
  // Asked only once the mouse rests on a token (HOVER_REST ms): sweeping over the text asks nothing;
  // served, each preview is one /rows request, and an older answer is dropped (drawCount).
  const HOVER_REST = served ? 80 : 30;
  let hovered = null, hoverTimer = null;
  function previewQuery(position) {
    hovered = position;
    clearTimeout(hoverTimer);
    if (!served && !embeddedQueries.has(position)) return;  // a static page has no rows for it
    hoverTimer = setTimeout(() => {
      if (state.pinned || hovered !== position || state.query === position) return;
      window.tokenView.previews += 1;
      chooseQuery(position, performance.now());
    }, HOVER_REST);
  }

  // -- controls ------------------------------------------------------------------------------------
  function setUp() {
    const examples = $("example");
    if (served) { for (let e = 0; e < data.n_examples; e++) option(examples, e, e); } else option(examples, data.example, data.example);
    examples.value = state.example;
    examples.addEventListener("change", () => {
      state.example = +examples.value;
      request("/tokens?example=" + state.example, false).then((tokens) => {
        ids = tokens.ids; texts = tokens.texts; layOutTokens(); chooseQuery(Math.min(state.query, T - 1));
      }).catch(reportError);
    });
    for (const layer of data.layers) option($("layer"), layer, layer);
    $("layer").value = state.layer;
    $("layer").addEventListener("change", () => { state.layer = +$("layer").value; drawQuery(); });
    option($("head"), -1, "all (the largest)");
    for (let h = 0; h < H; h++) option($("head"), h, "h" + h);
    $("head").value = state.head;
    $("head").addEventListener("change", () => { state.head = +$("head").value; state.key = null; drawQuery(); });
    $("scale").addEventListener("change", () => { state.scale = $("scale").value; drawQuery(); });
    $("overview-mode").addEventListener("change", () => {
      state.overviewMode = $("overview-mode").value;
      getOverview(state.query).then(drawOverview);
    });
    for (const size of [8, 16, 32, 64, 128, 256, 512]) if (size <= 2 * T) option($("window"), size, size);
    $("window").value = state.window;
    $("window").addEventListener("change", () => { state.window = +$("window").value; drawMatrix(); });
    const box = $("tokens");
    box.addEventListener("click", (event) => {
      const position = event.target.dataset && event.target.dataset.pos;
      if (position === undefined) return;
      clearTimeout(hoverTimer);
      hovered = null;
      // A click pins the token as the query; a click on the pinned query unpins it (hover previews again).
      state.pinned = !(state.pinned && state.query === +position);
      chooseQuery(+position, performance.now());
    });
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && state.pinned) { state.pinned = false; markQueryAndKey(); }
    });
    box.addEventListener("mousemove", (event) => {
      const position = event.target.dataset && event.target.dataset.pos;
      if (position === undefined) { hideTip(); return; }
      const key = +position;
      if (!state.pinned) {  // the hovered token is the query once the mouse rests on it
        if (key !== hovered) previewQuery(key);
        showTip(event, quoted(key) + (served || embeddedQueries.has(key) ? "\nquery (click to pin)"
                                      : "\nits rows are not in this page (underlined tokens have them)"));
        return;
      }
      let text = quoted(key);
      if (currentRows && key <= state.query) {
        text += state.head >= 0 ? "\nh" + state.head + ": " + formatCode(currentRows[state.head * T + key])
          : "\nlargest over heads: " + formatCode(headValues(currentRows, -1)[key]);
        const names = relations(state.query, key);
        if (names.length) text += "\n" + names.join(", ");
      }
      showTip(event, text);
    });
    box.addEventListener("mouseleave", () => { hideTip(); clearTimeout(hoverTimer); hovered = null; });
    const matrix = $("matrix");
    matrix.addEventListener("mousemove", (event) => {
      const cell = matrixCell(event);
      if (!cell || cell.key > cell.query) { hideTip(); return; }
      showTip(event, quoted(cell.query) + " → " + quoted(cell.key) + ": " + formatCode(cell.value));
    });
    matrix.addEventListener("mouseleave", hideTip);
    matrix.addEventListener("click", (event) => {
      const cell = matrixCell(event);
      if (!cell || cell.key > cell.query) return;
      state.query = cell.query;
      state.key = cell.key;
      state.pinned = true;
      drawQuery();
    });
    $("matrix-help").textContent = "Rows are queries, columns keys (lower triangle: causal). Click a cell to " +
      "choose that query and key; the window (zoom) ends at the chosen query. Colours: √code, white 0, dark red 1.";
    window.tokenView.choose = chooseQuery;
  }

  function fromHash() {
    const hash = new URLSearchParams(location.hash.slice(1));
    for (const name of ["layer", "head", "query", "key", "window"]) {
      if (hash.has(name)) state[name] = +hash.get(name);
    }
    if (hash.has("scale")) state.scale = hash.get("scale");
    state.pinned = hash.has("query");  // a link to a query shows that query until unpinned
    if (hash.has("layer") && data.layers.indexOf(state.layer) < 0) state.layer = data.default.layer;
  }

  fromHash();
  layOutTokens();
  setUp();
  $("head").value = state.head;
  $("layer").value = state.layer;
  $("scale").value = state.scale;
  $("window").value = state.window;
  drawQuery().then(() => {
    const box = $("tokens"), span = spans[state.query];  // the query in view, the page itself unmoved
    if (span) box.scrollTop = Math.max(0, span.offsetTop - box.clientHeight / 2);
    document.body.dataset.ready = "true";
  });
})();
