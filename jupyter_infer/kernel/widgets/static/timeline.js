// Built from labextension/src/timeline/ by `npm run build` (labextension/README.md); do not edit.

// src/format.ts
function formatMs(ms) {
  if (ms === null || ms === void 0 || !Number.isFinite(ms)) {
    return "\u2013";
  }
  const abs = Math.abs(ms);
  if (abs < 1e3) {
    return `${Math.round(ms)} ms`;
  }
  if (abs < 1e4) {
    return `${(ms / 1e3).toFixed(1)} s`;
  }
  if (abs < 12e4) {
    return `${Math.round(ms / 1e3)} s`;
  }
  const minutes = Math.trunc(ms / 6e4);
  const seconds = Math.round(abs % 6e4 / 1e3);
  return seconds ? `${minutes} min ${seconds} s` : `${minutes} min`;
}

// src/timeline/layout.ts
var LEGEND = {
  queued: ["hatched", "queued"],
  waiting: ["grey", "sent, awaiting first token"],
  prefill: ["orange", "prefill"],
  decode: ["blue", "decoding, colour = rows in the batch:"],
  "decode-unknown": ["striped blue", "batch not recorded yet"],
  parked: ["dashed", "parked (another user's request has its row)"]
};
function legendText(kind) {
  const [look, meaning] = LEGEND[kind];
  return `${look} = ${meaning}`;
}
var CUT_W = 14;
var BADGE_W = 18;
var MIN_LIVE_S = 3;
var MIN_TICK_PX = 72;
var CHAR_W = 6.2;
function sizeBins(maxSize) {
  const max = Math.max(1, Math.round(maxSize));
  const bin = (min, hi) => ({
    min,
    max: hi,
    label: min === hi ? `${min}` : `${min}\u2013${hi}`
  });
  if (max <= 4) {
    return Array.from({ length: max }, (_, i) => bin(i + 1, i + 1));
  }
  const a = Math.max(2, Math.round(Math.cbrt(max)));
  const b = Math.max(a + 1, Math.min(max - 1, Math.round(Math.cbrt(max) ** 2)));
  return [bin(1, 1), bin(2, a), bin(a + 1, b), bin(b + 1, max)];
}
function binOf(size, bins) {
  for (let i = 0; i < bins.length; i++) {
    if (size <= bins[i].max) {
      return i;
    }
  }
  return bins.length - 1;
}
function niceStep(raw) {
  const pow = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) {
    if (m * pow >= raw) {
      return m * pow;
    }
  }
  return 10 * pow;
}
function formatTick(v, step) {
  if (Math.abs(v) < 1e-9) {
    return "0 s";
  }
  if (step < 1 && Math.abs(v) < 1) {
    return `${Math.round(v * 1e3)} ms`;
  }
  if (step >= 60 && Math.abs(v) >= 120) {
    const minutes = v / 60;
    return `${Number.isInteger(Math.round(minutes * 10) / 10) ? Math.round(minutes) : minutes.toFixed(1)} min`;
  }
  const digits = step >= 1 ? 0 : step >= 0.1 ? 1 : 2;
  return `${v.toFixed(digits)} s`;
}
function truncate(text, maxChars) {
  if (text.length <= maxChars) {
    return text;
  }
  if (maxChars <= 1) {
    return "\u2026";
  }
  const cut = text.slice(0, maxChars - 1);
  const space = cut.lastIndexOf(" ");
  const head = space >= maxChars * 0.6 ? cut.slice(0, space) : cut;
  return head.replace(/[\s.,;:·-]+$/, "") + "\u2026";
}
var isNum = (v) => typeof v === "number" && Number.isFinite(v);
var LIVE = /* @__PURE__ */ new Set(["queued", "running"]);
function isLive(row) {
  return !isNum(row.finished_at) && (row.outcome == null || LIVE.has(row.outcome));
}
var CONSTRAINTS = {
  json_schema: ["JSON schema", "{}"],
  json_object: ["JSON object", "{}"],
  regex: ["regex", ".*"],
  choice: ["choice", "a|b"],
  grammar: ["grammar", "::="],
  tools: ["tool calls", "\u0192()"]
};
function constraintKind(kind) {
  if (!kind) {
    return null;
  }
  const [name, badge] = CONSTRAINTS[kind] ?? [kind.replace(/_/g, " "), "{}"];
  return { kind, name, badge };
}
function forcedText(forced, tokens) {
  if (!isNum(forced)) {
    return null;
  }
  const total = Math.max(forced, isNum(tokens) ? tokens : 0);
  return `${forced} of ${total} token${total === 1 ? "" : "s"} fast-forwarded`;
}
function rowStart(row) {
  for (const t of [row.queued_at, row.admitted_at, row.first_token_at, row.finished_at]) {
    if (isNum(t)) {
      return t;
    }
  }
  return null;
}
function batchSize(b) {
  return b.size ?? b.members?.length ?? 1;
}
function activity(rows, batches, endOf, tEnd) {
  const spans = [];
  for (const r of rows) {
    const s = rowStart(r);
    if (s !== null) {
      spans.push([s, Math.max(s, endOf(r))]);
    }
  }
  for (const b of batches) {
    if (isNum(b.started_at)) {
      spans.push([b.started_at, isNum(b.ended_at) ? b.ended_at : tEnd]);
    }
  }
  spans.sort((p, q) => p[0] - q[0]);
  const merged = [];
  for (const [s, e] of spans) {
    const last = merged[merged.length - 1];
    if (last && s <= last[1]) {
      last[1] = Math.max(last[1], e);
    } else {
      merged.push([s, e]);
    }
  }
  return merged;
}
function frameOf(options) {
  const width = Math.max(240, Math.round(options.width));
  const labelWidth = Math.round(Math.min(180, Math.max(72, width * 0.26)));
  return {
    width,
    rowHeight: options.rowHeight ?? 16,
    rowGap: options.rowGap ?? 3,
    charW: options.charWidth ?? CHAR_W,
    labelWidth,
    plotLeft: labelWidth,
    plotRight: width - 10,
    live: isNum(options.windowS) && options.windowS > 0
  };
}
function recordedTimes(rows, batches) {
  const times = [];
  for (const r of rows) {
    for (const t of [r.queued_at, r.admitted_at, r.first_token_at, r.finished_at]) {
      if (isNum(t)) {
        times.push(t);
      }
    }
  }
  for (const b of batches) {
    times.push(b.started_at);
    if (isNum(b.ended_at)) {
      times.push(b.ended_at);
    }
  }
  return times;
}
function timeSpan(times, now, windowS) {
  let t1 = now ?? (times.length ? Math.max(...times) : 0);
  if (windowS !== null) {
    const recent = times.filter((t) => t >= t1 - windowS);
    const span = recent.length ? (t1 - Math.min(...recent)) * 1.08 : windowS;
    return [t1 - Math.min(windowS, Math.max(span, Math.min(windowS, MIN_LIVE_S))), t1];
  }
  const t0 = times.length ? Math.min(...times) : t1 - 1;
  if (now !== null && times.length) {
    t1 = Math.max(t1, Math.max(...times));
  }
  if (t1 - t0 < 0.05) {
    t1 = t0 + 0.05;
  }
  return [t0, t1];
}
function rowEnds(batchById, t1) {
  return (r) => {
    if (isNum(r.finished_at)) {
      return r.finished_at;
    }
    if (isLive(r)) {
      return t1;
    }
    const ends = (r.batch_ids || []).map((id) => batchById.get(id)?.ended_at).filter(isNum);
    const known = [r.queued_at, r.admitted_at, r.first_token_at].filter(isNum);
    return Math.max(...ends, ...known, -Infinity);
  };
}
function shownRows(rows, endOf, live, t0, t1) {
  return rows.filter((r) => rowStart(r) !== null).filter((r) => !live || endOf(r) >= t0 && rowStart(r) <= t1).sort((p, q) => rowStart(p) - rowStart(q) || (p.id < q.id ? -1 : 1));
}
function shownStretches(active, t0, t1) {
  const minGap = Math.max(1, 0.03 * (t1 - t0));
  const gaps = [];
  for (let i = 1; i < active.length; i++) {
    if (active[i][0] - active[i - 1][1] > minGap) {
      gaps.push([active[i - 1][1], active[i][0]]);
    }
  }
  const idle = gaps.reduce((sum, [a, b]) => sum + (b - a), 0);
  if (!(gaps.length && idle > 0.15 * (t1 - t0))) {
    return { stretches: [[t0, t1]], cutS: 0 };
  }
  const stretches = [];
  let start = t0;
  for (const [a, b] of gaps) {
    stretches.push([start, a]);
    start = b;
  }
  stretches.push([start, t1]);
  return { stretches, cutS: idle };
}
function layoutAxis(stretches, plotLeft, plotRight) {
  const nCuts = stretches.length - 1;
  const shownS = stretches.reduce((sum, [a, b]) => sum + (b - a), 0) || 1e-3;
  const pxPerS = (plotRight - plotLeft - nCuts * CUT_W) / shownS;
  const segments = [];
  const cuts = [];
  let cursor = plotLeft;
  stretches.forEach(([a, b], i) => {
    segments.push({ a, b, x: cursor });
    cursor += (b - a) * pxPerS;
    if (i < nCuts) {
      cuts.push({ x: cursor, w: CUT_W, idleS: stretches[i + 1][0] - b });
      cursor += CUT_W;
    }
  });
  const x = (t) => {
    if (t <= segments[0].a) {
      return plotLeft;
    }
    for (const s of segments) {
      if (t <= s.b) {
        return s.x + Math.max(0, t - s.a) * pxPerS;
      }
    }
    return plotRight;
  };
  return { segments, cuts, pxPerS, shownS, x };
}
function pieces(axis, start, end) {
  const out = [];
  for (const s of axis.segments) {
    const a = Math.max(start, s.a);
    const b = Math.min(end, s.b);
    if (b > a || b === a && start === end && a >= s.a && a <= s.b) {
      out.push({ x: axis.x(a), w: Math.max(1, (b - a) * axis.pxPerS), start: a, end: b });
    }
  }
  return out;
}
function axisLabel(t, ref, step, live) {
  const v = Math.max(0, live ? ref - t : t - ref);
  if (live) {
    return v < step / 2 ? "now" : `${formatTick(v, step)} ago`;
  }
  return formatTick(v, step);
}
function axisTicks(axis, live, t0, t1, plotRight) {
  const ticks = [];
  const step = niceStep(MIN_TICK_PX / axis.pxPerS);
  const ref = live ? t1 : t0;
  const tickLabel = (t) => axisLabel(t, ref, step, live);
  let lastX = -Infinity;
  axis.segments.forEach((s, i) => {
    if (i > 0) {
      while (ticks.length && s.x - ticks[ticks.length - 1].x < MIN_TICK_PX * 0.75) {
        ticks.pop();
      }
      ticks.push({ x: s.x, label: tickLabel(s.a), resume: true });
      lastX = s.x + MIN_TICK_PX * 0.3;
    }
    for (let k = Math.ceil((s.a - ref) / step - 1e-9); ; k++) {
      const t = ref + k * step;
      if (t > s.b + 1e-9) {
        break;
      }
      if (t < t0 - 1e-9 * step) {
        continue;
      }
      const px = axis.x(t);
      if (px - lastX >= MIN_TICK_PX * 0.6 && px <= plotRight + 0.5) {
        ticks.push({ x: px, label: tickLabel(t) });
        lastX = px;
      }
    }
  });
  return ticks;
}
function bandLabel(b, size, forced, room, charW) {
  const ff = forced > 0 ? ` \xBB${forced}` : "";
  const candidates = ff ? [`#${b.id} \xD7${size}${ff}`, `\xD7${size}${ff}`, `\xD7${size}`] : [`#${b.id} \xD7${size}`, `\xD7${size}`];
  return candidates.find((text) => text.length * charW <= room) ?? null;
}
function layoutBands(batches, at) {
  const { t0, t1 } = at;
  const charW = at.frame.charW;
  const bands = [];
  for (const b of [...batches].sort((p, q) => p.started_at - q.started_at)) {
    const end = isNum(b.ended_at) ? b.ended_at : t1;
    if (end < t0 || b.started_at > t1) {
      continue;
    }
    const size = batchSize(b);
    const forced = isNum(b.forced_tokens) ? b.forced_tokens : 0;
    for (const p of pieces(at.axis, b.started_at, end)) {
      const label = bandLabel(b, size, forced, p.w - 6, charW);
      bands.push({ batch: b, x: p.x, w: p.w, bin: binOf(size, at.bins), label, forced });
    }
  }
  return bands;
}
var TICK_W = 6;
function stepTicks(steps, at) {
  const ticks = [];
  const shown = steps.filter((s) => isNum(s.at) && (s.forced > 0 || (s.accepted ?? 0) > 0) && s.at >= at.t0 && s.at <= at.t1).filter((s) => at.axis.segments.some((seg) => s.at >= seg.a && s.at <= seg.b)).sort((p, q) => p.at - q.at);
  for (const s of shown) {
    const x = at.axis.x(s.at);
    const last = ticks[ticks.length - 1];
    if (last && x - last.x < TICK_W) {
      last.forced += s.forced;
      last.accepted += s.accepted ?? 0;
      last.steps += 1;
    } else {
      ticks.push({ x, forced: s.forced, accepted: s.accepted ?? 0, steps: 1 });
    }
  }
  return ticks;
}
function waitingParts(row, end, add) {
  const { queued_at: q, admitted_at: a, first_token_at: f } = row;
  if (!isNum(a) && row.outcome === "queued") {
    add("queued", q, end);
  } else if (isNum(a)) {
    add("queued", q, a);
    add("prefill", a, isNum(f) ? f : end);
  } else {
    add("waiting", q, isNum(f) ? f : end);
  }
}
function parkedSpans(row, end) {
  const resumed = row.resumed_at || [];
  return (row.parked_at || []).map((p, i) => [p, isNum(resumed[i]) ? resumed[i] : end]);
}
function decodingParts(row, f, end, at, add) {
  const parked = parkedSpans(row, end);
  const gap = (s, e) => {
    let t = s;
    for (const [p, r] of parked) {
      const lo = Math.max(p, t);
      const hi = Math.min(r, e);
      if (hi <= lo) {
        continue;
      }
      if (lo > t + 1e-6) {
        add("decode-unknown", t, lo);
      }
      add("parked", lo, hi);
      t = hi;
    }
    if (e > t + 1e-6) {
      add("decode-unknown", t, e);
    }
  };
  const spans = (row.batch_ids || []).map((id) => at.batchById.get(id)).filter((b) => b !== void 0).sort((p, q) => p.started_at - q.started_at);
  let done = f;
  for (const b of spans) {
    const s = Math.max(b.started_at, f);
    const e = Math.min(isNum(b.ended_at) ? b.ended_at : end, end);
    if (e <= s) {
      continue;
    }
    if (s > done + 1e-6) {
      gap(done, s);
    }
    add("decode", s, e, { bin: binOf(batchSize(b), at.bins), batchId: b.id });
    done = Math.max(done, e);
  }
  if (end > done + 1e-6) {
    gap(done, end);
  }
}
function rowParts(row, end, at) {
  const parts = [];
  const add = (kind, start, stop, extra = {}) => {
    if (!isNum(start) || stop < start || stop === start && kind !== "decode") {
      return;
    }
    const lo = Math.max(start, at.t0);
    const hi = Math.min(stop, at.t1);
    if (hi >= lo) {
      for (const p of pieces(at.axis, lo, hi)) {
        parts.push({ kind, ...p, ...extra });
      }
    }
  };
  waitingParts(row, end, add);
  if (isNum(row.first_token_at)) {
    decodingParts(row, row.first_token_at, end, at, add);
  }
  return parts;
}
function rowMarker(row, end, at) {
  const outcome = row.outcome || "";
  const failed = outcome === "failed" || outcome === "error";
  if (outcome !== "cancelled" && !failed) {
    return null;
  }
  const x = Math.min(at.axis.x(Math.min(end, at.t1)) + 2, at.frame.plotRight - 8);
  return { x, kind: failed ? "failed" : "cancelled" };
}
function barRuns(parts) {
  const runs = [];
  for (const p of [...parts].sort((a, b) => a.x - b.x)) {
    const last = runs[runs.length - 1];
    if (last && p.x <= last.x + last.w + 0.5) {
      last.w = Math.max(last.w, p.x + p.w - last.x);
    } else {
      runs.push({ x: p.x, w: p.w });
    }
  }
  return runs;
}
function constraintMark(row, parts, at) {
  const kind = constraintKind(row.constraint);
  if (!kind) {
    return null;
  }
  return { ...kind, x: at.frame.labelWidth - BADGE_W - 4, outline: barRuns(parts) };
}
function layoutRow(row, index, end, maxChars, at) {
  const full = row.label || row.id;
  const parts = rowParts(row, end, at);
  const constraint = constraintMark(row, parts, at);
  const chars = constraint ? Math.max(3, maxChars - Math.ceil((BADGE_W + 2) / at.frame.charW)) : maxChars;
  return {
    row,
    y: index * (at.frame.rowHeight + at.frame.rowGap),
    label: truncate(full, chars),
    fullLabel: full,
    live: isLive(row),
    end,
    parts,
    marker: rowMarker(row, end, at),
    constraint
  };
}
function layoutTimeline(state, options) {
  const frame = frameOf(options);
  const { live, rowHeight, rowGap } = frame;
  const batches = (state.batches || []).filter((b) => isNum(b.started_at));
  const batchById = new Map(batches.map((b) => [b.id, b]));
  const now = isNum(state.now) ? state.now : null;
  const [t0, t1] = timeSpan(recordedTimes(state.rows || [], batches), now, live ? options.windowS : null);
  const endOf = rowEnds(batchById, t1);
  const rows = shownRows(state.rows || [], endOf, live, t0, t1);
  const { stretches, cutS } = !live && options.compress !== false ? shownStretches(activity(rows, batches, endOf, t1), t0, t1) : { stretches: [[t0, t1]], cutS: 0 };
  const axis = layoutAxis(stretches, frame.plotLeft, frame.plotRight);
  const bins = sizeBins(options.maxBatchSize || Math.max(1, ...batches.map(batchSize)));
  const at = { frame, t0, t1, axis, batchById, bins };
  const maxChars = Math.max(4, Math.floor((frame.labelWidth - 10) / frame.charW));
  const rowLayouts = rows.map((row, i) => {
    const end = Math.max(endOf(row), rowStart(row));
    return layoutRow(row, i, end, maxChars, at);
  });
  const bands = layoutBands(batches, at);
  const ticks = stepTicks(state.steps || [], at);
  return {
    width: frame.width,
    labelWidth: frame.labelWidth,
    plotLeft: frame.plotLeft,
    plotRight: frame.plotRight,
    t0,
    t1,
    live,
    rowHeight,
    rowGap,
    rowsHeight: rowLayouts.length * (rowHeight + rowGap),
    ticks: axisTicks(axis, live, t0, t1, frame.plotRight),
    cuts: axis.cuts,
    bands,
    rows: rowLayouts,
    bins,
    kinds: new Set(rowLayouts.flatMap((r) => r.parts.map((p) => p.kind))),
    stepTicks: ticks,
    constraints: new Set(rowLayouts.flatMap((r) => r.constraint ? [r.constraint.kind] : [])),
    fastForwarded: ticks.some((t) => t.forced > 0) || bands.some((b) => b.forced > 0) || rowLayouts.some((r) => (r.row.forced_tokens ?? 0) > 0),
    guessed: ticks.some((t) => t.accepted > 0),
    shownS: axis.shownS,
    cutS,
    x: axis.x
  };
}
function describeRow(row, batches, now) {
  const lines = [];
  if (row.label && row.label !== row.id) {
    lines.push(row.label);
  }
  const outcome = row.outcome || (isLive(row) ? "running" : "done");
  lines.push(`${row.id} \xB7 ${outcome} \xB7 ${row.tokens ?? 0} tokens out${isNum(row.prompt_tokens) ? `, ${row.prompt_tokens} in` : ""}`);
  const kind = constraintKind(row.constraint);
  if (kind) {
    const forced = forcedText(row.forced_tokens, row.tokens);
    lines.push(`constrained: ${kind.name}${forced ? ` \xB7 ${forced}${isLive(row) ? " so far" : ""}` : ""}`);
  }
  const q = row.queued_at;
  const end = isNum(row.finished_at) ? row.finished_at : now;
  const timing = [];
  if (isNum(q) && isNum(row.admitted_at)) {
    timing.push(`queued ${formatMs((row.admitted_at - q) * 1e3)}`);
  } else if (isNum(q) && row.outcome === "queued" && isNum(now)) {
    timing.push(`queued ${formatMs((now - q) * 1e3)} so far`);
  }
  if (isNum(q) && isNum(row.first_token_at)) {
    timing.push(`TTFT ${formatMs((row.first_token_at - q) * 1e3)}`);
  }
  if (isNum(q) && isNum(end)) {
    timing.push(`${isNum(row.finished_at) ? "total" : "running for"} ${formatMs((end - q) * 1e3)}`);
  }
  if (timing.length) {
    lines.push(timing.join(" \xB7 "));
  }
  const ids = row.batch_ids || [];
  if (ids.length) {
    const shown = ids.slice(0, 6).map((id) => {
      const b = batches.get(id);
      return b ? `#${id} \xD7${b.size ?? b.members?.length ?? "?"}` : `#${id}`;
    });
    lines.push(`batches ${shown.join(", ")}${ids.length > 6 ? ` +${ids.length - 6} more` : ""}`);
  }
  return lines;
}
function describeBatch(batch, now) {
  const end = isNum(batch.ended_at) ? batch.ended_at : now;
  const size = batch.size ?? batch.members?.length ?? 0;
  const span = isNum(batch.started_at) && isNum(end) ? ` \xB7 ${formatMs((end - batch.started_at) * 1e3)}${isNum(batch.ended_at) ? "" : " so far"}` : "";
  const forced = batch.forced_tokens ? `, ${batch.forced_tokens} fast-forwarded` : "";
  const guessed = batch.accepted_tokens ? `, ${batch.accepted_tokens} from guesses the model accepted (of ${batch.draft_tokens ?? batch.accepted_tokens} proposed)` : "";
  return `batch #${batch.id} \xB7 ${size} row${size === 1 ? "" : "s"} \xB7 ${batch.steps ?? 0} steps \xB7 ${batch.tokens ?? 0} tokens${forced}${guessed}${span}`;
}
function describeStepTick(tick) {
  const steps = tick.steps === 1 ? "a step" : `${tick.steps} steps`;
  const tokens = (n) => `${n} token${n === 1 ? "" : "s"}`;
  const parts = [
    ...tick.forced > 0 ? [`fast-forwarded ${tokens(tick.forced)} (forced by a grammar, not sampled)`] : [],
    ...tick.accepted > 0 ? [`kept ${tokens(tick.accepted)} from guesses the model accepted (speculative decoding)`] : []
  ];
  return `${steps} ${parts.join(" and ")}`;
}

// src/timeline/render.ts
var NS = "http://www.w3.org/2000/svg";
var AXIS_H = 18;
var TRACK_H = 18;
var HEAD_H = AXIS_H + TRACK_H + 4;
var views = 0;
function svgEl(tag, attrs, parent) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    node.setAttribute(k, String(v));
  }
  if (parent) {
    parent.appendChild(node);
  }
  return node;
}
function htmlEl(tag, className, parent) {
  const node = document.createElement(tag);
  node.className = className;
  if (parent) {
    parent.appendChild(node);
  }
  return node;
}
function luminance(colour) {
  const c = colour.trim().toLowerCase();
  let rgb = null;
  const hex = /^#([0-9a-f]{3}|[0-9a-f]{6})$/.exec(c);
  if (hex) {
    const h = hex[1].length === 3 ? hex[1].replace(/./g, (d) => d + d) : hex[1];
    rgb = [0, 2, 4].map((i) => parseInt(h.slice(i, i + 2), 16));
  } else {
    const m = /^rgba?\(\s*([\d.]+)[\s,]+([\d.]+)[\s,]+([\d.]+)/.exec(c);
    if (m) {
      rgb = [m[1], m[2], m[3]].map(Number);
    }
  }
  if (!rgb) {
    return null;
  }
  const [r, g, b] = rgb.map((v) => {
    const s = v / 255;
    return s <= 0.03928 ? s / 12.92 : Math.pow((s + 0.055) / 1.055, 2.4);
  });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}
function contrast(l1, l2) {
  const [hi, lo] = l1 > l2 ? [l1, l2] : [l2, l1];
  return (hi + 0.05) / (lo + 0.05);
}
var ACCENT = "var(--jp-accent-color1, #388e3c)";
var MARK_STYLE = {
  outline: `fill: none; stroke: ${ACCENT}; stroke-width: 1.5px; pointer-events: none`,
  badge: `fill: var(--jp-layout-color1, #ffffff); stroke: ${ACCENT}; stroke-width: 1px`,
  badgeText: `fill: ${ACCENT}; font-size: 9px; font-weight: 700; font-family: var(--jp-code-font-family, monospace); pointer-events: none`,
  tick: `fill: ${ACCENT}; stroke: var(--jp-layout-color1, #ffffff); stroke-width: 0.75px`,
  // A step that kept guesses: the same wedge, hollow (tokens the model computed, not forced).
  guessTick: `fill: var(--jp-layout-color1, #ffffff); stroke: ${ACCENT}; stroke-width: 1.25px`,
  tickHit: "fill: transparent",
  legendBadge: `display: inline-block; padding: 0 2px; border: 1px solid ${ACCENT}; border-radius: 2px; color: ${ACCENT}; font: 700 9px var(--jp-code-font-family, monospace); line-height: 11px`,
  legendTick: `display: inline-block; width: 0; height: 0; border: 4px solid transparent; border-top: 0; border-bottom: 6px solid ${ACCENT}`,
  legendGuessTick: `color: ${ACCENT}; font-size: 9px; line-height: 9px`
};
var TimelineView = class {
  constructor(host, options = {}) {
    this._state = { rows: [], batches: [], now: null, title: "" };
    this._layout = null;
    this._batches = /* @__PURE__ */ new Map();
    this._inks = /* @__PURE__ */ new Map();
    this._frame = 0;
    this._drawnWidth = 0;
    this._hover = null;
    this._observer = null;
    this._onMove = (event) => {
      const target = this._target(event);
      const layout = this._layout;
      if (!target || !layout) {
        this._onLeave();
        return;
      }
      const box = this._box.getBoundingClientRect();
      const key = target.kind === "row" ? layout.rows[target.index]?.row.id : target.kind === "tick" ? layout.stepTicks[target.index] && String(target.index) : layout.bands[target.index] && String(layout.bands[target.index].batch.id);
      if (key === void 0) {
        this._onLeave();
        return;
      }
      this._hover = { kind: target.kind, key, x: event.clientX - box.left, y: event.clientY - box.top };
      this._refreshTip();
    };
    this._onLeave = () => {
      this._hover = null;
      this._tip.hidden = true;
    };
    this._onClick = (event) => {
      const target = this._target(event);
      const opts = this._options;
      if (!target || target.kind !== "row" || !this._layout || !opts.onRowClick) {
        return;
      }
      const row = this._layout.rows[target.index]?.row;
      if (row && opts.clickable?.(row)) {
        opts.onRowClick(row);
      }
    };
    this._options = options;
    this._uid = `ji-tl-${++views}-${Math.random().toString(36).slice(2, 8)}`;
    this.node = htmlEl("div", "ji-timeline", host);
    this._title = htmlEl("div", "ji-title", this.node);
    this._box = htmlEl("div", "ji-tl-box", this.node);
    this._head = svgEl("svg", { class: "ji-tl-head" }, this._box);
    this._body = htmlEl("div", "ji-tl-body", this._box);
    this._body.style.maxHeight = `${options.maxRowsHeight ?? 420}px`;
    this._rows = svgEl("svg", { class: "ji-tl-rows" }, this._body);
    this._tip = htmlEl("div", "ji-tl-tip", this._box);
    this._tip.hidden = true;
    this._legend = htmlEl("div", "ji-legend", this.node);
    this._rows.addEventListener("mousemove", this._onMove);
    this._head.addEventListener("mousemove", this._onMove);
    this._rows.addEventListener("mouseleave", this._onLeave);
    this._head.addEventListener("mouseleave", this._onLeave);
    this._rows.addEventListener("click", this._onClick);
    if (typeof ResizeObserver !== "undefined") {
      this._observer = new ResizeObserver(() => {
        if (Math.abs(this._width() - this._drawnWidth) > 4) {
          this.schedule();
        }
      });
      this._observer.observe(this.node);
    }
  }
  get layout() {
    return this._layout;
  }
  update(state) {
    this._state = state;
    this.schedule();
  }
  /** Redraw at the next animation frame (once, however many updates came). */
  schedule() {
    if (this._frame) {
      return;
    }
    if (typeof requestAnimationFrame === "undefined") {
      this.draw();
      return;
    }
    this._frame = requestAnimationFrame(() => {
      this._frame = 0;
      this.draw();
    });
  }
  dispose() {
    if (this._frame && typeof cancelAnimationFrame !== "undefined") {
      cancelAnimationFrame(this._frame);
    }
    this._frame = 0;
    this._observer?.disconnect();
    this.node.remove();
  }
  _width() {
    return this.node.clientWidth || this.node.parentElement?.clientWidth || 640;
  }
  /** Draw now. */
  draw() {
    const state = this._state;
    const opts = this._options;
    const width = this._width();
    this._drawnWidth = width;
    this._title.textContent = state.title || "";
    this._title.hidden = !state.title;
    this._batches = new Map((state.batches || []).map((b) => [b.id, b]));
    this._inks.clear();
    const many = (state.rows || []).length > 30;
    const layout = layoutTimeline(state, {
      width,
      windowS: opts.windowS?.() ?? null,
      maxBatchSize: opts.maxBatchSize?.() ?? null,
      rowHeight: many ? 13 : 16,
      rowGap: many ? 2 : 3
    });
    this._layout = layout;
    this._drawHead(layout);
    this._drawRows(layout);
    this._drawLegend(layout);
    this._refreshTip();
  }
  _drawHead(layout) {
    const svg = this._head;
    svg.replaceChildren();
    svg.setAttribute("width", String(layout.width));
    svg.setAttribute("height", String(HEAD_H));
    svg.setAttribute("viewBox", `0 0 ${layout.width} ${HEAD_H}`);
    this._drawCuts(svg, layout, 0, HEAD_H, true);
    const axis = svgEl("g", { class: "ji-axis" }, svg);
    for (const t of layout.ticks) {
      svgEl("line", { x1: t.x, x2: t.x, y1: AXIS_H - 4, y2: HEAD_H, class: "ji-grid" }, axis);
      const anchor = t.x > layout.plotRight - 20 ? "end" : t.resume || t.x < layout.plotLeft + 14 ? "start" : "middle";
      svgEl("text", { x: t.resume ? t.x + 2 : t.x, y: AXIS_H - 6, "text-anchor": anchor }, axis).textContent = t.label;
    }
    const track = svgEl("g", { class: "ji-batches" }, svg);
    svgEl("text", { x: 4, y: AXIS_H + 13, class: "ji-track-label" }, track).textContent = "batches";
    layout.bands.forEach((band, i) => {
      const rect = svgEl(
        "rect",
        { x: band.x, y: AXIS_H + 1, width: band.w, height: TRACK_H - 2, class: `ji-band ji-size-${band.bin}`, "data-band": i },
        track
      );
      rect.setAttribute("aria-label", describeBatch(band.batch, layout.live ? layout.t1 : null));
      if (band.label) {
        const text = svgEl("text", { x: band.x + 3, y: AXIS_H + 13, class: "ji-band-label", "data-band": i }, track);
        text.textContent = band.label;
        const ink = this._ink(band.bin);
        if (ink) {
          text.setAttribute("style", `fill: ${ink}`);
        }
      }
      if (band.forced > 0) {
        rect.classList.add("ji-ff-band");
      }
    });
    this._drawStepTicks(svg, layout);
  }
  /** A tick under the batch track per step that fast-forwarded tokens (a solid wedge) or kept
   * accepted guesses only (hollow): it points up at its batch, clear of the band's label. */
  _drawStepTicks(svg, layout) {
    if (!layout.stepTicks.length) {
      return;
    }
    const g = svgEl("g", { class: "ji-ff-ticks" }, svg);
    const top = AXIS_H + TRACK_H - 2;
    const order = layout.stepTicks.map((tick, i) => [tick, i]).sort(([p], [q]) => Number(p.forced > 0) - Number(q.forced > 0));
    for (const [tick, i] of order) {
      svgEl("rect", { x: tick.x - TICK_W / 2, y: top, width: TICK_W, height: HEAD_H - top, style: MARK_STYLE.tickHit, "data-tick": i }, g);
      const points = `${tick.x - TICK_W / 2},${HEAD_H} ${tick.x + TICK_W / 2},${HEAD_H} ${tick.x},${top}`;
      const guessed = tick.forced === 0;
      const mark = svgEl("polygon", {
        points,
        class: guessed ? "ji-ff-tick ji-guess-tick" : "ji-ff-tick",
        style: guessed ? MARK_STYLE.guessTick : MARK_STYLE.tick,
        "data-tick": i
      }, g);
      mark.setAttribute("aria-label", describeStepTick(tick));
    }
  }
  _drawCuts(svg, layout, y, h, labelled) {
    for (const cut of layout.cuts) {
      const g = svgEl("g", { class: "ji-cut" }, svg);
      svgEl("rect", { x: cut.x + 2, y, width: cut.w - 4, height: h, class: "ji-cut-bg" }, g);
      svgEl("line", { x1: cut.x + 4, x2: cut.x + 4, y1: y, y2: y + h, class: "ji-cut-edge" }, g);
      svgEl("line", { x1: cut.x + cut.w - 4, x2: cut.x + cut.w - 4, y1: y, y2: y + h, class: "ji-cut-edge" }, g);
      if (labelled) {
        svgEl("title", {}, g).textContent = `${formatMs(cut.idleS * 1e3)} idle, cut from the axis`;
      }
    }
  }
  _drawRows(layout) {
    const svg = this._rows;
    svg.replaceChildren();
    const opts = this._options;
    if (!layout.rows.length) {
      svg.setAttribute("width", "0");
      svg.setAttribute("height", "0");
      this._body.dataset.empty = opts.emptyText ?? "No requests yet.";
      return;
    }
    delete this._body.dataset.empty;
    const height = layout.rowsHeight + 2;
    svg.setAttribute("width", String(layout.width));
    svg.setAttribute("height", String(height));
    svg.setAttribute("viewBox", `0 0 ${layout.width} ${height}`);
    const defs = svgEl("defs", {}, svg);
    const hatch = svgEl(
      "pattern",
      { id: `${this._uid}-queued`, width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" },
      defs
    );
    svgEl("rect", { width: 6, height: 6, class: "ji-hatch-bg" }, hatch);
    svgEl("line", { x1: 0, y1: 0, x2: 0, y2: 6, class: "ji-hatch-line" }, hatch);
    const dots = svgEl("pattern", { id: `${this._uid}-unknown`, width: 4, height: 4, patternUnits: "userSpaceOnUse" }, defs);
    svgEl("rect", { width: 4, height: 4, class: "ji-unknown-bg" }, dots);
    svgEl("rect", { width: 2, height: 4, class: "ji-unknown-line" }, dots);
    const grid = svgEl("g", { class: "ji-axis" }, svg);
    for (const t of layout.ticks) {
      svgEl("line", { x1: t.x, x2: t.x, y1: 0, y2: height, class: "ji-grid" }, grid);
    }
    this._drawCuts(svg, layout, 0, height, false);
    const h = layout.rowHeight;
    layout.rows.forEach((r, i) => {
      const clickable = !!(opts.onRowClick && opts.clickable?.(r.row));
      const ended = r.marker ? ` ji-ended-${r.marker.kind}` : "";
      const constrained = r.constraint ? " ji-constrained" : "";
      const g = svgEl("g", { class: `ji-row${clickable ? " ji-clickable" : ""}${r.live ? " ji-live" : ""}${ended}${constrained}`, "data-row": i }, svg);
      g.setAttribute("data-id", r.row.id);
      g.setAttribute("aria-label", `${r.fullLabel}: ${r.row.outcome ?? "running"}${r.constraint ? `, ${r.constraint.name}` : ""}`);
      svgEl("rect", { x: 0, y: r.y - 1, width: layout.width, height: h + 2, class: "ji-row-bg" }, g);
      svgEl("text", { x: 4, y: r.y + h - 4, class: "ji-row-label" }, g).textContent = r.label;
      for (const p of r.parts) {
        const attrs = { x: p.x, y: r.y, width: p.w, height: h, class: `ji-part ji-${p.kind}` };
        if (p.kind === "queued") {
          attrs.fill = `url(#${this._uid}-queued)`;
        } else if (p.kind === "decode-unknown") {
          attrs.fill = `url(#${this._uid}-unknown)`;
        } else if (p.kind === "decode") {
          attrs.class += ` ji-size-${p.bin}`;
        }
        svgEl("rect", attrs, g);
      }
      if (r.constraint) {
        this._drawConstraint(g, r, h);
      }
      if (r.marker) {
        const m = svgEl("text", { x: r.marker.x, y: r.y + h - 4, class: `ji-marker ji-${r.marker.kind}` }, g);
        m.textContent = r.marker.kind === "cancelled" ? "\u2298" : "\u2715";
      }
    });
  }
  /** A constrained row: its bar outlined, a badge with the kind's glyph ending its label. */
  _drawConstraint(g, r, h) {
    const mark = r.constraint;
    g.setAttribute("data-constraint", mark.kind);
    for (const box of mark.outline) {
      svgEl("rect", { x: box.x - 0.75, y: r.y - 0.75, width: box.w + 1.5, height: h + 1.5, class: "ji-constraint-outline", style: MARK_STYLE.outline }, g);
    }
    const badge = svgEl("g", { class: "ji-constraint-badge" }, g);
    svgEl("rect", { x: mark.x, y: r.y + 1.5, width: BADGE_W, height: h - 3, rx: 2, style: MARK_STYLE.badge }, badge);
    const text = svgEl("text", { x: mark.x + BADGE_W / 2, y: r.y + h / 2 + 3, "text-anchor": "middle", style: MARK_STYLE.badgeText }, badge);
    text.textContent = mark.badge;
  }
  _drawLegend(layout) {
    const legend = this._legend;
    legend.replaceChildren();
    const item = (swatchClass, text, title) => {
      const span2 = htmlEl("span", "ji-legend-item", legend);
      htmlEl("span", `ji-swatch ${swatchClass}`, span2);
      span2.appendChild(document.createTextNode(text));
      if (title) {
        span2.title = title;
      }
    };
    for (const kind of ["queued", "waiting", "prefill"]) {
      if (layout.kinds.has(kind) || kind !== "waiting") {
        item(`ji-swatch-${kind}`, legendText(kind));
      }
    }
    const sizes = htmlEl("span", "ji-legend-item ji-legend-sizes", legend);
    sizes.appendChild(document.createTextNode(legendText("decode")));
    layout.bins.forEach((bin, i) => {
      const s = htmlEl("span", `ji-size-chip ji-size-${i}`, sizes);
      s.textContent = bin.label;
      const ink = this._ink(i);
      if (ink) {
        s.style.color = ink;
      }
    });
    if (layout.kinds.has("decode-unknown")) {
      item("ji-swatch-decode-unknown", legendText("decode-unknown"));
    }
    if (layout.kinds.has("parked")) {
      item("ji-swatch-parked", legendText("parked"));
    }
    this._drawMarksKey(legend, layout);
    const outcomes = new Set(layout.rows.map((r) => r.marker?.kind).filter(Boolean));
    if (outcomes.has("cancelled")) {
      htmlEl("span", "ji-legend-item ji-marker-key ji-cancelled", legend).textContent = "\u2298 cancelled";
    }
    if (outcomes.has("failed")) {
      htmlEl("span", "ji-legend-item ji-marker-key ji-failed", legend).textContent = "\u2715 failed";
    }
    const batchIds = new Set(layout.bands.map((b) => b.batch.id));
    const summary = htmlEl("span", "ji-legend-item ji-legend-summary", legend);
    const span = layout.live ? `last ${formatMs((layout.t1 - layout.t0) * 1e3)}` : formatMs((layout.t1 - layout.t0) * 1e3) + (layout.cutS > 0 ? ` (${formatMs(layout.cutS * 1e3)} idle cut)` : "");
    summary.textContent = `${layout.rows.length} requests \xB7 ${batchIds.size} batches \xB7 ${span}`;
  }
  /** The legend's keys to the constraint badge and the fast-forward marks, when drawn. */
  _drawMarksKey(legend, layout) {
    if (layout.constraints.size) {
      const names = new Map(layout.rows.flatMap((r) => r.constraint ? [[r.constraint.kind, r.constraint]] : []));
      const span = htmlEl("span", "ji-legend-item ji-constraint-key", legend);
      const badges = [...new Set([...names.values()].map((c) => c.badge))];
      for (const glyph of badges) {
        const chip = htmlEl("span", "ji-constraint-chip", span);
        chip.setAttribute("style", MARK_STYLE.legendBadge);
        chip.textContent = glyph;
      }
      span.appendChild(document.createTextNode(`constrained: ${[...names.values()].map((c) => c.name).join(", ")}`));
    }
    if (layout.guessed) {
      const span = htmlEl("span", "ji-legend-item ji-guess-key", legend);
      const chip = htmlEl("span", "ji-guess-chip", span);
      chip.setAttribute("style", MARK_STYLE.legendGuessTick);
      chip.textContent = "\u25B3";
      span.appendChild(document.createTextNode("guessed: steps that kept accepted guesses"));
      span.title = "Speculative decoding: a row proposes tokens (prompt lookup or a draft model) and the step verifies them; the model keeps those it agrees with, so one step can emit several tokens of a row.";
    }
    if (layout.fastForwarded) {
      const span = htmlEl("span", "ji-legend-item ji-ff-key", legend);
      if (layout.stepTicks.some((t) => t.forced > 0)) {
        htmlEl("span", "ji-ff-chip", span).setAttribute("style", MARK_STYLE.legendTick);
      }
      span.appendChild(document.createTextNode("\xBB fast-forwarded: tokens a grammar forced, not sampled"));
      span.title = "Where a grammar allows one token only, the server appends it without sampling: one step can emit several tokens.";
    }
  }
  /** The theme's text colour that reads best on bin `bin`'s fill (null when unknown). */
  _ink(bin) {
    if (!this._inks.has(bin)) {
      this._inks.set(bin, this._resolveInk(bin));
    }
    return this._inks.get(bin) ?? null;
  }
  _resolveInk(bin) {
    if (typeof getComputedStyle === "undefined") {
      return null;
    }
    const style = getComputedStyle(this.node);
    const fill = luminance(style.getPropertyValue(`--ji-size-${bin}`));
    if (fill === null) {
      return null;
    }
    let best = null;
    let bestContrast = 0;
    for (const name of ["--jp-ui-font-color0", "--jp-ui-inverse-font-color0"]) {
      const l = luminance(style.getPropertyValue(name));
      if (l !== null && contrast(fill, l) > bestContrast) {
        bestContrast = contrast(fill, l);
        best = `var(${name})`;
      }
    }
    return best;
  }
  // -- hover and click -----------------------------------------------------------------------
  _target(event) {
    const el = event.target?.closest?.("[data-row],[data-band],[data-tick]");
    if (!el) {
      return null;
    }
    const row = el.getAttribute("data-row");
    if (row !== null) {
      return { kind: "row", index: Number(row) };
    }
    const tick = el.getAttribute("data-tick");
    if (tick !== null) {
      return { kind: "tick", index: Number(tick) };
    }
    return { kind: "band", index: Number(el.getAttribute("data-band")) };
  }
  _refreshTip() {
    const hover = this._hover;
    const layout = this._layout;
    if (!hover || !layout) {
      this._tip.hidden = true;
      return;
    }
    const now = layout.live || (this._state.now ?? null) !== null ? layout.t1 : null;
    let lines = null;
    if (hover.kind === "row") {
      const r = layout.rows.find((x) => x.row.id === hover.key);
      if (r) {
        lines = describeRow(r.row, this._batches, now);
        if (this._options.onRowClick && this._options.clickable?.(r.row) && this._options.clickHint) {
          lines.push(this._options.clickHint);
        }
      }
    } else if (hover.kind === "tick") {
      const tick = layout.stepTicks[Number(hover.key)];
      if (tick) {
        lines = [describeStepTick(tick)];
      }
    } else {
      const b = this._batches.get(Number(hover.key));
      if (b) {
        lines = [describeBatch(b, now)];
      }
    }
    if (!lines) {
      this._tip.hidden = true;
      return;
    }
    this._tip.replaceChildren(
      ...lines.map((line, i) => {
        const div = htmlEl("div", i === 0 ? "ji-tip-head" : "");
        div.textContent = line;
        return div;
      })
    );
    this._tip.hidden = false;
    const boxW = this._box.clientWidth || layout.width;
    const tipW = Math.min(320, this._tip.offsetWidth || 260);
    const left = Math.max(0, Math.min(hover.x + 12, boxW - tipW - 4));
    this._tip.style.left = `${left}px`;
    this._tip.style.top = `${hover.y + 14}px`;
  }
};

// src/timeline/widget.ts
var TRAITS = ["requests", "batches", "now", "title"];
function render({ model, el }) {
  const view = new TimelineView(el, { maxRowsHeight: 600 });
  const redraw = () => view.update({
    rows: model.get("requests") || [],
    batches: model.get("batches") || [],
    now: model.get("now") ?? null,
    title: model.get("title") || ""
  });
  for (const name of TRAITS) {
    model.on(`change:${name}`, redraw);
  }
  redraw();
  return () => {
    for (const name of TRAITS) {
      model.off(`change:${name}`, redraw);
    }
    view.dispose();
  };
}
var widget_default = { render };
export {
  widget_default as default
};
