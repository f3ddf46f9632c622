// The batch timeline view (anywidget ESM, shipped with the Python package; no CDN).
// It only draws the model's state: `requests` (rows), `batches`, `now`, `title`.
const NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2",
                 "#eeca3b", "#9d755d", "#ff9da6", "#bab0ac"];
const LABEL_W = 170, ROW_H = 16, ROW_GAP = 3, TRACK_H = 20, AXIS_H = 18, PAD_R = 12;

const colour = (batchId) => PALETTE[(batchId - 1 + PALETTE.length * 1000) % PALETTE.length];

function el(tag, attrs, parent) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function tip(node, text) {
  el("title", {}, node).textContent = text;
  return node;
}

function fmt(ms) {
  return ms >= 1000 ? `${(ms / 1000).toFixed(ms >= 10000 ? 0 : 1)} s` : `${Math.round(ms)} ms`;
}

function niceStep(span, target) {
  const raw = span / Math.max(target, 1);
  const pow = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (m * pow >= raw) return m * pow;
  return 10 * pow;
}

function draw(model, root) {
  const rows = model.get("requests") || [];
  const batches = model.get("batches") || [];
  const now = model.get("now");
  const title = model.get("title");
  root.replaceChildren();
  if (title) {
    const t = document.createElement("div");
    t.className = "ji-title";
    t.textContent = title;
    root.appendChild(t);
  }
  if (!rows.length) {
    const empty = document.createElement("div");
    empty.className = "ji-empty";
    empty.textContent = "No requests yet.";
    root.appendChild(empty);
    return;
  }
  const byId = new Map(batches.map((b) => [b.id, b]));
  const times = [];
  for (const r of rows) for (const k of ["queued_at", "admitted_at", "first_token_at", "finished_at"]) if (r[k]) times.push(r[k]);
  for (const b of batches) { if (b.started_at) times.push(b.started_at); if (b.ended_at) times.push(b.ended_at); }
  if (now) times.push(now);
  const t0 = Math.min(...times);
  let t1 = Math.max(...times);
  if (t1 - t0 < 0.05) t1 = t0 + 0.05;
  const width = Math.max(420, root.clientWidth || 820);
  root.dataset.drawnWidth = String(root.clientWidth || 820);
  const plotW = width - LABEL_W - PAD_R;
  const x = (t) => LABEL_W + ((t - t0) / (t1 - t0)) * plotW;
  const ms = (t) => (t - t0) * 1000;
  const top = AXIS_H + TRACK_H + 6;
  const height = top + rows.length * (ROW_H + ROW_GAP) + 4;
  const svg = el("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
  const defs = el("defs", {}, svg);
  const hatch = el("pattern", { id: "ji-hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" }, defs);
  el("rect", { width: 6, height: 6, fill: "#eee" }, hatch);
  el("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#bbb", "stroke-width": 2 }, hatch);

  // Axis with ticks in ms or s.
  const axis = el("g", { class: "ji-axis" }, svg);
  const spanMs = (t1 - t0) * 1000;
  const step = niceStep(spanMs, Math.max(2, Math.floor(plotW / 90)));
  for (let v = 0; v <= spanMs + 1e-6; v += step) {
    const px = LABEL_W + (v / spanMs) * plotW;
    el("line", { x1: px, x2: px, y1: AXIS_H - 4, y2: height, stroke: "#e4e4e4" }, axis);
    const label = el("text", { x: px, y: AXIS_H - 7, "text-anchor": "middle" }, axis);
    label.textContent = fmt(v);
  }

  // The batch track: one bar per batch, labelled with its id and size.
  const track = el("g", { class: "ji-batches" }, svg);
  const trackLabel = el("text", { x: 4, y: AXIS_H + 14 }, track);
  trackLabel.textContent = "batches";
  for (const b of batches) {
    const start = b.started_at, end = b.ended_at || now || t1;
    if (!start) continue;
    const bx = x(start), bw = Math.max(1.5, x(end) - bx);
    tip(el("rect", { x: bx, y: AXIS_H + 2, width: bw, height: TRACK_H - 4, fill: colour(b.id), opacity: 0.85, stroke: "#fff", "stroke-width": 0.5 }, track),
      `batch #${b.id} · size ${b.size} · ${b.steps || 0} steps · ${fmt(ms(start))}–${fmt(ms(end))}`);
    if (bw > 34) {
      const t = el("text", { x: bx + 3, y: AXIS_H + 13, fill: "#fff", style: "fill:#fff" }, track);
      t.textContent = `#${b.id}×${b.size}`;
    }
  }

  // One row per request.
  rows.forEach((r, i) => {
    const y = top + i * (ROW_H + ROW_GAP);
    const g = el("g", { class: "ji-row" }, svg);
    const name = el("text", { x: 4, y: y + ROW_H - 4 }, g);
    const label = r.label || r.id;
    name.textContent = label.length > 26 ? label.slice(0, 25) + "…" : label;
    tip(name, `${r.id} · ${r.outcome} · ${r.tokens || 0} tokens · batches ${(r.batch_ids || []).map((b) => "#" + b).join(" ") || "–"}`);
    const end = r.finished_at || now || t1;
    const admitted = r.admitted_at;
    const first = r.first_token_at;
    // queued: arrival → admission (or, unknown admission, → first token)
    const queuedEnd = admitted || first || end;
    if (r.queued_at && queuedEnd > r.queued_at) {
      tip(el("rect", { x: x(r.queued_at), y, width: Math.max(1, x(queuedEnd) - x(r.queued_at)), height: ROW_H, fill: "url(#ji-hatch)", stroke: "#ccc", "stroke-width": 0.5 }, g),
        `${label}: queued ${fmt((queuedEnd - r.queued_at) * 1000)}`);
    }
    // prefill: admission → first token, in the colour of the batch it joined, lighter
    const firstBatch = (r.batch_ids || []).length ? r.batch_ids[0] : null;
    if (admitted && (first || end) > admitted) {
      const pe = first || end;
      tip(el("rect", { x: x(admitted), y, width: Math.max(1, x(pe) - x(admitted)), height: ROW_H, fill: firstBatch ? colour(firstBatch) : "#999", opacity: 0.45 }, g),
        `${label}: prefill ${fmt((pe - admitted) * 1000)}${firstBatch ? ` in batch #${firstBatch}` : ""}`);
    }
    // decoding: one segment per batch span it was a member of
    const decodeStart = first || admitted;
    if (decodeStart) {
      const spans = (r.batch_ids || []).map((id) => byId.get(id)).filter(Boolean);
      if (!spans.length && end > decodeStart) {
        tip(el("rect", { x: x(decodeStart), y, width: Math.max(1, x(end) - x(decodeStart)), height: ROW_H, fill: "#888" }, g),
          `${label}: decoding ${fmt((end - decodeStart) * 1000)}`);
      }
      for (const b of spans) {
        const s = Math.max(b.started_at || decodeStart, decodeStart);
        const e = Math.min(b.ended_at || end, end);
        if (e <= s) continue;
        tip(el("rect", { x: x(s), y, width: Math.max(1, x(e) - x(s)), height: ROW_H, fill: colour(b.id) }, g),
          `${label}: decoding in batch #${b.id} (size ${b.size}) ${fmt(ms(s))}–${fmt(ms(e))}`);
      }
    }
    if (r.outcome === "cancelled" || r.outcome === "failed" || r.outcome === "error") {
      const m = el("text", { x: x(end) + 2, y: y + ROW_H - 4, style: "fill:#d62728;font-weight:700" }, g);
      m.textContent = r.outcome === "cancelled" ? "⊘" : "✕";
      tip(m, `${label}: ${r.outcome}`);
    }
  });
  root.appendChild(svg);

  const legend = document.createElement("div");
  legend.className = "ji-legend";
  legend.innerHTML =
    '<span><span class="ji-swatch" style="background:repeating-linear-gradient(45deg,#eee 0 3px,#bbb 3px 4px)"></span>queued</span>' +
    '<span><span class="ji-swatch" style="background:#4c78a8;opacity:.45"></span>prefill</span>' +
    '<span><span class="ji-swatch" style="background:#4c78a8"></span>decoding (colour = batch)</span>' +
    `<span>${rows.length} requests · ${batches.length} batches · ${fmt((t1 - t0) * 1000)}</span>`;
  root.appendChild(legend);
}

function render({ model, el: host }) {
  const root = document.createElement("div");
  root.className = "ji-timeline";
  host.appendChild(root);
  let pending = false;
  const redraw = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; draw(model, root); });
  };
  for (const name of ["requests", "batches", "now", "title"]) model.on(`change:${name}`, redraw);
  draw(model, root);
  // Redraw on real width changes only: a container that shrink-wraps its content must not
  // start a resize → redraw → resize loop.
  const onResize = () => {
    if (Math.abs((root.clientWidth || 0) - Number(root.dataset.drawnWidth || 0)) > 8) redraw();
  };
  const observer = typeof ResizeObserver !== "undefined" ? new ResizeObserver(onResize) : null;
  if (observer) observer.observe(root);
  return () => {
    if (observer) observer.disconnect();
    for (const name of ["requests", "batches", "now", "title"]) model.off(`change:${name}`, redraw);
  };
}

export default { render };
