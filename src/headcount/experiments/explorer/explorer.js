
(function () {
"use strict";
var D = JSON.parse(document.getElementById("hc-data").textContent);
var L = D.layers, H = D.heads, Q = D.quantities, A = D.attention;
var NUMERIC = {score: 1, mean: 1, survival: 1, level: 1, step: 1};
var VIRIDIS = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725"];
var CATS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
var hasMlp = Q.some(function (q) { return q.mlps !== null; });
var G = D.kv_heads ? H / D.kv_heads : 0;  // query heads per KV group (decoders with grouped-query attention)
function headName(h) { return G ? "query head " + h + " (KV group " + Math.floor(h / G) + ")" : "head " + h; }
function kvFirst(h) { return G && h > 0 && h < H && h % G === 0 ? " kv-first" : ""; }
var state = {a: 0, b: 0, sel: null, marked: {}, ex: 0};
var cache = {};

function $(id) { return document.getElementById(id); }
function el(tag, attrs, text) {
  var svg = ["svg", "circle", "line", "text", "rect", "g", "title"].indexOf(tag) >= 0;
  var e = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (var k in (attrs || {})) e.setAttribute(k, attrs[k]);
  if (text !== undefined && text !== null) e.textContent = text;
  return e;
}
function numeric(i) { return !!NUMERIC[Q[i].kind]; }
function pick(re, not) {
  for (var i = 0; i < Q.length; i++) if (numeric(i) && i !== not && re.test(Q[i].name)) return i;
  return -1;
}
function pickKind(kind, not) {
  for (var i = 0; i < Q.length; i++) if (i !== not && Q[i].kind === kind) return i;
  return -1;
}
(function defaults() {
  // MLM vs task importance when the page has both (the transfer study's question); else survival
  // across seeds vs attention entropy (the lottery study's: are the heads every seed keeps the
  // focused ones?); else the first two numeric ones
  var a = pick(/mlm/i, -1), b;
  if (a < 0) a = pickKind("survival", -1);
  if (a < 0) a = Math.max(0, pick(/./, -1));
  b = pick(/task/i, a);
  if (b < 0) b = pick(/entropy/i, a);
  if (b < 0) b = pick(/./, a);
  if (b < 0) b = Q.length > 1 ? (a + 1) % Q.length : a;
  state.a = a; state.b = b;
})();

// -- colours ---------------------------------------------------------------------------------------
function hex(c) { return [1, 3, 5].map(function (i) { return parseInt(c.substr(i, 2), 16); }); }
function viridis(t) {
  t = Math.max(0, Math.min(1, t)) * (VIRIDIS.length - 1);
  var i = Math.min(Math.floor(t), VIRIDIS.length - 2), f = t - i, p = hex(VIRIDIS[i]), q = hex(VIRIDIS[i + 1]);
  return "rgb(" + p.map(function (v, k) { return Math.round(v + f * (q[k] - v)); }).join(",") + ")";
}
function extent(values) {
  var lo = Infinity, hi = -Infinity;
  values.forEach(function (v) { if (v !== null) { lo = Math.min(lo, v); hi = Math.max(hi, v); } });
  return lo === Infinity ? [0, 1] : [lo, hi];
}
function flat(q) { return [].concat.apply([], q.heads); }
function colour(q, v, ext) {
  if (v === null) return null;
  if (q.kind === "mask") return v ? "#1f4e79" : "#dde6f0";
  if (q.kind === "pattern") return CATS[v % CATS.length];
  return viridis(ext[1] > ext[0] ? (v - ext[0]) / (ext[1] - ext[0]) : 0.5);
}
function fmt(v) { return v === null ? "n/a" : Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(2) : String(+v.toPrecision(4)); }

// -- grids -----------------------------------------------------------------------------------------
function detail(l, h, qi) { return h === "mlp" ? D.mlp_details[l][qi] : D.details[l][h][qi]; }
function label(l, h, qi) {
  var d = detail(l, h, qi), who = h === "mlp" ? "layer " + l + " MLP" : "layer " + l + ", " + headName(h);
  return who + ": " + Q[qi].name + " = " + d[0] + (d[1] ? " (rank " + d[1] + ")" : "");
}
function buildGrid(side) {
  var box = $("grid-" + side), cols = H + (hasMlp ? 1 : 0);
  box.style.gridTemplateColumns = "2.6em repeat(" + cols + ", var(--cell))";
  box.appendChild(el("span", {"class": "corner", "aria-hidden": "true"}, "L\\H"));
  for (var h = 0; h < H; h++) box.appendChild(el("span", {"class": "colhead" + kvFirst(h), "aria-hidden": "true"}, String(h)));
  if (hasMlp) box.appendChild(el("span", {"class": "colhead", "aria-hidden": "true"}, "MLP"));
  for (var l = 0; l < L; l++) {
    box.appendChild(el("span", {"class": "rowhead", "aria-hidden": "true"}, String(l)));
    for (var c = 0; c < cols; c++) {
      var b = el("button", {type: "button", "class": "cell" + (c === H ? " mlp" : kvFirst(c)), "data-l": l,
                            "data-h": c === H ? "mlp" : c, tabindex: l === 0 && c === 0 ? "0" : "-1"});
      b.addEventListener("click", onCell);
      b.addEventListener("keydown", onKey);
      box.appendChild(b);
    }
  }
}
function cellOf(side, l, h) { return $("grid-" + side).querySelector('.cell[data-l="' + l + '"][data-h="' + h + '"]'); }
function onCell(e) {
  var b = e.currentTarget, h = b.getAttribute("data-h");
  select(+b.getAttribute("data-l"), h === "mlp" ? "mlp" : +h);
}
function onKey(e) {
  var b = e.currentTarget, side = b.parentNode.id.slice(5), l = +b.getAttribute("data-l"), h = b.getAttribute("data-h");
  var c = h === "mlp" ? H : +h, cols = H + (hasMlp ? 1 : 0);
  var move = {ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [-1, 0], ArrowDown: [1, 0]}[e.key];
  if (!move) return;
  e.preventDefault();
  l = Math.max(0, Math.min(L - 1, l + move[0])); c = Math.max(0, Math.min(cols - 1, c + move[1]));
  var next = cellOf(side, l, c === H ? "mlp" : c);
  b.setAttribute("tabindex", "-1"); next.setAttribute("tabindex", "0"); next.focus();
}
function paint(side) {
  var qi = state[side], q = Q[qi], ext = extent(flat(q)), mext = q.mlps ? extent(q.mlps) : null;
  $("grid-" + side).querySelectorAll(".cell").forEach(function (b) {
    var l = +b.getAttribute("data-l"), h = b.getAttribute("data-h"), mlp = h === "mlp";
    var v = mlp ? (q.mlps ? q.mlps[l] : null) : q.heads[l][+h];
    var c = colour(q, v, mlp ? mext : ext);
    b.style.background = c || "";
    b.classList.toggle("none", c === null);
    var text = mlp && !q.mlps ? "layer " + l + " MLP: " + q.name + " has no MLP values" : label(l, mlp ? "mlp" : +h, qi);
    b.title = text; b.setAttribute("aria-label", text);
    b.setAttribute("data-colour", c || "none");
  });
  legend(side, q, ext);
  mark();
}
function legend(side, q, ext) {
  var box = $("legend-" + side);
  box.textContent = "";
  if (q.kind === "pattern" || q.kind === "mask") {
    var cats = q.kind === "mask" ? ["removed", "kept"] : q.categories;
    cats.forEach(function (name, i) {
      var s = el("span", {"class": "swatch"});
      s.style.background = colour(q, i, ext);
      var item = el("span", {"class": "item"}); item.appendChild(s); item.appendChild(document.createTextNode(name));
      box.appendChild(item);
    });
  } else {
    box.appendChild(el("span", {}, fmt(ext[0])));
    var bar = el("span", {"class": "bar"});
    bar.style.background = "linear-gradient(to right," + VIRIDIS.join(",") + ")";
    box.appendChild(bar);
    box.appendChild(el("span", {}, fmt(ext[1]) + (q.kind === "level" || q.kind === "step" ? " (grey: never removed)" : "")));
  }
  if (q.mlps && q.kind !== "mask" && q.kind !== "pattern") box.appendChild(el("span", {"class": "note"}, "MLP column: its own scale"));
}
function mark() {
  document.querySelectorAll(".cell").forEach(function (b) {
    var l = b.getAttribute("data-l"), h = b.getAttribute("data-h"), s = state.sel;
    var on = s !== null && String(s.l) === l && String(s.h) === h;
    b.classList.toggle("selected", on);
    b.setAttribute("aria-pressed", on ? "true" : "false");
    if (s !== null) b.setAttribute("tabindex", on ? "0" : "-1");  // Tab comes back to the selected head
    b.classList.toggle("marked", !!state.marked[l + "." + h]);
  });
  document.querySelectorAll("#scatter circle").forEach(function (c) {
    var k = c.getAttribute("data-k"), s = state.sel;
    c.classList.toggle("selected", s !== null && s.l + "." + s.h === k);
    c.classList.toggle("marked", !!state.marked[k]);
  });
}

// -- scatter ---------------------------------------------------------------------------------------
function rankOf(v) {
  var idx = v.map(function (x, i) { return i; }).sort(function (i, j) { return v[i] - v[j]; }), r = [];
  idx.forEach(function (i, k) { r[i] = k; });
  return r;
}
function spearman(x, y) {
  var rx = rankOf(x), ry = rankOf(y), n = x.length, mx = (n - 1) / 2, sxy = 0, sxx = 0, syy = 0;
  for (var i = 0; i < n; i++) { sxy += (rx[i] - mx) * (ry[i] - mx); sxx += Math.pow(rx[i] - mx, 2); syy += Math.pow(ry[i] - mx, 2); }
  return sxx && syy ? sxy / Math.sqrt(sxx * syy) : NaN;
}
function axis(svg, attrs, name) {  // an axis named by its quantity (shortened to fit; the whole name on hover)
  var short = name.length > 42 ? name.slice(0, 41) + "\u2026" : name, t = el("text", attrs, short);
  t.appendChild(el("title", {}, name));
  svg.appendChild(t);
}
function scatter() {
  var svg = $("scatter"), W = 340, P = 60, B = 36, M = 8, qa = Q[state.a], qb = Q[state.b];
  svg.textContent = "";
  var info = $("scatter-info");
  if (!numeric(state.a) || !numeric(state.b)) { info.textContent = "The scatter needs two numeric quantities."; return; }
  var pts = [];
  for (var l = 0; l < L; l++) for (var h = 0; h < H; h++) {
    var x = qa.heads[l][h], y = qb.heads[l][h];
    if (x !== null && y !== null) pts.push({l: l, h: h, x: x, y: y});
  }
  var ex = extent(pts.map(function (p) { return p.x; })), ey = extent(pts.map(function (p) { return p.y; }));
  function sx(v) { return P + M + (ex[1] > ex[0] ? (v - ex[0]) / (ex[1] - ex[0]) : 0.5) * (W - P - 2 * M); }
  function sy(v) { return W - B - M - (ey[1] > ey[0] ? (v - ey[0]) / (ey[1] - ey[0]) : 0.5) * (W - B - 2 * M); }
  svg.appendChild(el("rect", {x: P, y: 0, width: W - P, height: W - B, "class": "frame"}));
  svg.appendChild(el("text", {x: P, y: W - B + 14}, fmt(ex[0])));
  svg.appendChild(el("text", {x: W - 2, y: W - B + 14, "text-anchor": "end"}, fmt(ex[1])));
  svg.appendChild(el("text", {x: P - 4, y: W - B, "text-anchor": "end"}, fmt(ey[0])));
  svg.appendChild(el("text", {x: P - 4, y: 12, "text-anchor": "end"}, fmt(ey[1])));
  axis(svg, {x: (W + P) / 2, y: W - 4, "text-anchor": "middle", "class": "axis", id: "axis-x"}, qa.name);
  axis(svg, {x: 12, y: (W - B) / 2, transform: "rotate(-90 12 " + (W - B) / 2 + ")", "text-anchor": "middle", "class": "axis", id: "axis-y"}, qb.name);
  pts.forEach(function (p) {
    var c = el("circle", {cx: sx(p.x), cy: sy(p.y), r: 4, "data-k": p.l + "." + p.h});
    c.appendChild(el("title", {}, "layer " + p.l + ", " + headName(p.h) + ": " + fmt(p.x) + ", " + fmt(p.y)));
    c.addEventListener("click", function (e) { e.stopPropagation(); select(p.l, p.h); });
    svg.appendChild(c);
  });
  var rho = spearman(pts.map(function (p) { return p.x; }), pts.map(function (p) { return p.y; }));
  info.textContent = pts.length + " heads; Spearman \u03c1 = " + (isNaN(rho) ? "n/a" : rho.toFixed(3)) + ". Drag to mark heads in both grids; click empty space to clear.";
  brush(svg, pts, sx, sy);
  mark();
}
function brush(svg, pts, sx, sy) {
  var start = null, box = null;
  function at(e) { var r = svg.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; }
  svg.onmousedown = function (e) { if (e.target.tagName === "circle") return; start = at(e); box = el("rect", {"class": "brush"}); svg.appendChild(box); };
  svg.onmousemove = function (e) {
    if (!start) return;
    var p = at(e);
    box.setAttribute("x", Math.min(p[0], start[0])); box.setAttribute("y", Math.min(p[1], start[1]));
    box.setAttribute("width", Math.abs(p[0] - start[0])); box.setAttribute("height", Math.abs(p[1] - start[1]));
  };
  svg.onmouseup = function (e) {
    if (!start) return;
    var p = at(e), x0 = Math.min(p[0], start[0]), x1 = Math.max(p[0], start[0]), y0 = Math.min(p[1], start[1]), y1 = Math.max(p[1], start[1]);
    state.marked = {};
    pts.forEach(function (q) { var x = sx(q.x), y = sy(q.y); if (x >= x0 && x <= x1 && y >= y0 && y <= y1) state.marked[q.l + "." + q.h] = 1; });
    start = null; box.remove();
    $("marked-info").textContent = Object.keys(state.marked).length + " heads marked";
    mark();
  };
}

// -- detail: numbers and attention -------------------------------------------------------------------
function select(l, h, fromHash) {
  state.sel = {l: l, h: h};
  if (!fromHash) {  // the URL names the head: a link to it, and back in the browser's history
    try { history.replaceState(null, "", "#head=" + l + "." + h); } catch (err) { location.hash = "head=" + l + "." + h; }
  }
  mark();
  var mlp = h === "mlp";
  $("detail-title").textContent = mlp ? "Layer " + l + ", MLP" : "Layer " + l + ", " + headName(h);
  $("detail-table").hidden = false;
  var body = $("detail-table").querySelector("tbody");
  body.textContent = "";
  Q.forEach(function (q, qi) {
    var d = detail(l, h, qi), tr = el("tr", {"data-q": qi});
    tr.appendChild(el("td", {}, q.name)); tr.appendChild(el("td", {}, d[0])); tr.appendChild(el("td", {}, d[1] || ""));
    body.appendChild(tr);
  });
  attention();
}
function decode(l, h) {
  var key = l + "." + h;
  if (cache[key]) return cache[key];
  var s = atob(A.heads[l][h]), bytes = new Uint8Array(s.length), pos = 0, out = [];
  for (var i = 0; i < s.length; i++) bytes[i] = s.charCodeAt(i);
  A.examples.forEach(function (ex) {
    var n = ex.tokens.length, counts = bytes.subarray(pos, pos + n), rows = [];
    pos += n;
    for (var r = 0; r < n; r++) {
      var row = [];
      for (var c = 0; c < counts[r]; c++, pos += 2) row.push([bytes[pos], bytes[pos + 1] / 255]);
      rows.push(row);
    }
    out.push(rows);
  });
  return (cache[key] = out);
}
function attention() {
  var s = state.sel, info = $("attn-info"), svg = $("lines"), cv = $("heat");
  svg.textContent = ""; $("heat-info").textContent = ""; $("views").hidden = true;
  if (!A) { info.textContent = "No attention examples on this page (see the notes at the top)."; return; }
  if (s === null || s.h === "mlp") { info.textContent = "Select a head to see its attention."; return; }
  if (A.heads[s.l][s.h] === null) { info.textContent = "This head is pruned from the model: no attention."; return; }
  var rows = decode(s.l, s.h)[state.ex], tokens = A.examples[state.ex].tokens, n = tokens.length, kept = 0;
  rows.forEach(function (r) { r.forEach(function (p) { kept += p[1]; }); });
  info.textContent = "Example " + (state.ex + 1) + " of " + A.examples.length + ", " + n + " tokens; shown: the largest " + A.k +
    " weights of each query (those of at least " + A.min_weight + "), " + Math.round(100 * kept / n) + "% of the attention.";
  $("views").hidden = false;
  var RH = 16, W = 360;
  svg.setAttribute("height", n * RH + 8); svg.setAttribute("width", W);
  var lines = el("g", {"class": "lines"});
  svg.appendChild(lines);
  rows.forEach(function (r, i) {
    r.forEach(function (p) {
      lines.appendChild(el("line", {x1: 122, y1: i * RH + 12, x2: 238, y2: p[0] * RH + 12, "data-q": i,
                                    "stroke-opacity": Math.max(0.04, p[1]).toFixed(3)}));
    });
  });
  tokens.forEach(function (t, i) {
    var a = el("text", {x: 116, y: i * RH + 16, "text-anchor": "end", "class": "tok", "data-q": i}, t);
    a.addEventListener("mouseenter", function () { focusRow(i); });
    a.addEventListener("mouseleave", function () { focusRow(null); });
    svg.appendChild(a);
    svg.appendChild(el("text", {x: 244, y: i * RH + 16, "class": "tok"}, t));
  });
  cv.width = n; cv.height = n;
  var ctx = cv.getContext("2d"), img = ctx.createImageData(n, n);
  for (var p = 0; p < n * n * 4; p += 4) { img.data[p] = img.data[p + 1] = img.data[p + 2] = img.data[p + 3] = 255; }
  rows.forEach(function (r, i) {
    r.forEach(function (q) {
      var o = (i * n + q[0]) * 4, w = Math.sqrt(q[1]);
      img.data[o] = Math.round(255 - w * 247); img.data[o + 1] = Math.round(255 - w * 207); img.data[o + 2] = Math.round(255 - w * 148);
    });
  });
  ctx.putImageData(img, 0, 0);
  cv.onmousemove = function (e) {
    var b = cv.getBoundingClientRect(), i = Math.floor((e.clientY - b.top) / b.height * n), j = Math.floor((e.clientX - b.left) / b.width * n);
    if (i < 0 || j < 0 || i >= n || j >= n) return;
    var w = 0;
    rows[i].forEach(function (q) { if (q[0] === j) w = q[1]; });
    $("heat-info").textContent = "query " + i + " \u201c" + tokens[i] + "\u201d \u2192 key " + j + " \u201c" + tokens[j] + "\u201d: " + w.toFixed(3);
  };
}
function focusRow(i) {
  $("lines").querySelectorAll("line").forEach(function (x) {
    x.style.display = i === null || +x.getAttribute("data-q") === i ? "" : "none";
  });
}

// -- set up ----------------------------------------------------------------------------------------
function options(select, chosen) {
  var groups = {};
  Q.forEach(function (q, i) {
    if (!groups[q.kind]) { groups[q.kind] = el("optgroup", {label: q.kind}); select.appendChild(groups[q.kind]); }
    var o = el("option", {value: i}, q.name);
    if (i === chosen) o.selected = true;
    groups[q.kind].appendChild(o);
  });
}
["a", "b"].forEach(function (side) {
  buildGrid(side);
  options($("q" + side), state[side]);
  $("q" + side).addEventListener("change", function (e) { state[side] = +e.target.value; paint(side); scatter(); });
  paint(side);
});
if (A) {
  A.examples.forEach(function (ex, i) {
    $("ex").appendChild(el("option", {value: i}, (i + 1) + ": " + ex.tokens.slice(0, 12).join(" ") + (ex.tokens.length > 12 ? " \u2026" : "")));
  });
  $("ex").addEventListener("change", function (e) { state.ex = +e.target.value; attention(); });
  $("attn-label").textContent = "Attention: " + A.label + (A.note ? " (" + A.note + ")" : "");
} else {
  $("ex").disabled = true;
  $("attn-label").textContent = "Attention: none on this page.";
}
$("scatter").addEventListener("click", function (e) { if (e.target.tagName === "svg" || e.target.classList.contains("frame")) { state.marked = {}; $("marked-info").textContent = ""; mark(); } });
scatter();
attention();
function fromHash() {  // a link to one head: page.html#head=3.5 (typed, or clicked: select writes it)
  var deep = /^#head=(\d+)\.(\d+|mlp)$/.exec(location.hash);
  if (deep && +deep[1] < L && (deep[2] === "mlp" ? hasMlp : +deep[2] < H)) select(+deep[1], deep[2] === "mlp" ? "mlp" : +deep[2], true);
}
fromHash();
window.addEventListener("hashchange", fromHash);
document.body.setAttribute("data-ready", "1");
})();
