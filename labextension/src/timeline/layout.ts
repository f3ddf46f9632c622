// The timeline's geometry as plain data: which parts of which rows go where, the time axis
// (with idle gaps cut out of long histories), the batch bands and the colour bins.
// No DOM here, so the layout is unit-tested directly; `render.ts` turns it into SVG.

import { formatMs } from '../format';
import { ITimelineBatch, ITimelineRow, ITimelineState, ITimelineStep } from './types';

export interface ILayoutOptions {
  /** Width of the whole drawing in px. */
  width: number;
  /** Live mode: show the last `windowS` seconds up to `now`, scrolling. */
  windowS?: number | null;
  /** Cut idle gaps out of the axis (default: on, except in live mode). */
  compress?: boolean;
  /** Largest batch size the colour bins must hold (default: the largest batch drawn). */
  maxBatchSize?: number | null;
  rowHeight?: number;
  rowGap?: number;
  /** Average width of one label character in px (11 px UI font). */
  charWidth?: number;
}

/** queued: waiting for admission; waiting: sent, not yet answered, and the server's split
 * into queue and prefill is not known yet; prefill; decode (in a recorded batch span);
 * decode-unknown: generating, but the batch span is not recorded (yet); parked: sitting out
 * while another user's request has its row (fair share). */
export type PartKind = 'queued' | 'waiting' | 'prefill' | 'decode' | 'decode-unknown' | 'parked';

/** How the legend keys each part kind: the colour (or look) `render.ts` and
 * `style/timeline.css` draw it in, "=", what it means. Prefill is orange (--jp-warn-color1),
 * decoding blue, light (few rows in the batch) to dark (many: --jp-brand-color3 … 0), waiting
 * grey, queued hatched grey: the same in JupyterLab's light and dark themes. */
const LEGEND: Record<PartKind, [string, string]> = {
  queued: ['hatched', 'queued'],
  waiting: ['grey', 'sent, awaiting first token'],
  prefill: ['orange', 'prefill'],
  decode: ['blue', 'decoding, colour = rows in the batch:'],
  'decode-unknown': ['striped blue', 'batch not recorded yet'],
  parked: ['dashed', "parked (another user's request has its row)"]
};

/** A part kind's legend text: "orange = prefill". */
export function legendText(kind: PartKind): string {
  const [look, meaning] = LEGEND[kind];
  return `${look} = ${meaning}`;
}

export interface IPart {
  kind: PartKind;
  x: number;
  w: number;
  start: number;
  end: number;
  /** Colour bin of the batch size (decode parts). */
  bin?: number;
  batchId?: number;
}

/** A constrained row's mark: a badge at the end of its label, an outline round its bar. */
export interface IConstraintMark extends IConstraintKind {
  /** x of the badge (its left edge, in the label column). */
  x: number;
  /** The bar's outline: one box per run of adjacent parts (a cut splits it). */
  outline: { x: number; w: number }[];
}

export interface IRowLayout {
  row: ITimelineRow;
  y: number;
  label: string;
  fullLabel: string;
  /** Still queued or running. */
  live: boolean;
  end: number;
  parts: IPart[];
  marker: { x: number; kind: 'cancelled' | 'failed' } | null;
  constraint: IConstraintMark | null;
}

export interface IBandLayout {
  batch: ITimelineBatch;
  x: number;
  w: number;
  bin: number;
  label: string | null;
  /** Tokens grammars forced in this batch (0: none, or not recorded). */
  forced: number;
}

/** Steps that emitted several tokens a row (a grammar's forced ones, or draft guesses the
 * model accepted), as ticks on the batch track (steps a pixel or two apart share one tick). */
export interface IStepTick {
  x: number;
  /** Forced tokens, accepted guesses and steps the tick stands for. */
  forced: number;
  accepted: number;
  steps: number;
}

export interface ITick {
  x: number;
  label: string;
  /** Where the axis resumes after a cut: the label starts at the tick, right of the cut. */
  resume?: boolean;
}

/** An idle gap cut out of the axis, drawn as a narrow break of width `w`. */
export interface ICut {
  x: number;
  w: number;
  idleS: number;
}

export interface ISizeBin {
  min: number;
  max: number;
  label: string;
}

export interface ITimelineLayout {
  width: number;
  labelWidth: number;
  plotLeft: number;
  plotRight: number;
  t0: number;
  t1: number;
  live: boolean;
  rowHeight: number;
  rowGap: number;
  rowsHeight: number;
  ticks: ITick[];
  cuts: ICut[];
  bands: IBandLayout[];
  rows: IRowLayout[];
  bins: ISizeBin[];
  kinds: Set<PartKind>;
  stepTicks: IStepTick[];
  /** The constraint kinds of the rows shown, whether anything shown was fast-forwarded, and
   * whether a step shown kept guesses (speculative decoding). */
  constraints: Set<string>;
  fastForwarded: boolean;
  guessed: boolean;
  /** Seconds the axis shows, and idle seconds cut out of it. */
  shownS: number;
  cutS: number;
  /** x of a time (a time inside a cut maps to the cut's left edge). */
  x: (t: number) => number;
}

export const CUT_W = 14;
/** Width of a constrained row's badge (px), at the end of its label. */
export const BADGE_W = 18;
/** The shortest span the live timeline shows (s). */
const MIN_LIVE_S = 3;
const MIN_TICK_PX = 72;
const CHAR_W = 6.2;

interface ISegment {
  a: number;
  b: number;
  x: number; // px where the segment starts
}

/** Colour bins for batch sizes 1..max: exact sizes up to 4, else 1 | 2–a | a+1–b | b+1–max
 * with a, b log-spaced, so a burst of 16 and a lone request never share a colour. */
export function sizeBins(maxSize: number): ISizeBin[] {
  const max = Math.max(1, Math.round(maxSize));
  const bin = (min: number, hi: number): ISizeBin => ({
    min,
    max: hi,
    label: min === hi ? `${min}` : `${min}–${hi}`
  });
  if (max <= 4) {
    return Array.from({ length: max }, (_, i) => bin(i + 1, i + 1));
  }
  const a = Math.max(2, Math.round(Math.cbrt(max)));
  const b = Math.max(a + 1, Math.min(max - 1, Math.round(Math.cbrt(max) ** 2)));
  return [bin(1, 1), bin(2, a), bin(a + 1, b), bin(b + 1, max)];
}

export function binOf(size: number, bins: ISizeBin[]): number {
  for (let i = 0; i < bins.length; i++) {
    if (size <= bins[i].max) {
      return i;
    }
  }
  return bins.length - 1;
}

function niceStep(raw: number): number {
  const pow = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) {
    if (m * pow >= raw) {
      return m * pow;
    }
  }
  return 10 * pow;
}

/** A time's label, with as many digits as the tick step needs: "10 s", "1.5 s", "250 ms". */
export function formatTick(v: number, step: number): string {
  if (Math.abs(v) < 1e-9) {
    return '0 s';
  }
  if (step < 1 && Math.abs(v) < 1) {
    return `${Math.round(v * 1000)} ms`;
  }
  if (step >= 60 && Math.abs(v) >= 120) {
    const minutes = v / 60;
    return `${Number.isInteger(Math.round(minutes * 10) / 10) ? Math.round(minutes) : minutes.toFixed(1)} min`;
  }
  const digits = step >= 1 ? 0 : step >= 0.1 ? 1 : 2;
  return `${v.toFixed(digits)} s`;
}

/** Truncate to `maxChars` with an ellipsis, at a word boundary when one is near. */
export function truncate(text: string, maxChars: number): string {
  if (text.length <= maxChars) {
    return text;
  }
  if (maxChars <= 1) {
    return '…';
  }
  const cut = text.slice(0, maxChars - 1);
  const space = cut.lastIndexOf(' ');
  const head = space >= maxChars * 0.6 ? cut.slice(0, space) : cut;
  return head.replace(/[\s.,;:·-]+$/, '') + '…';
}

const isNum = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);
const LIVE = new Set(['queued', 'running']);

/** Is the row still queued or running (so it extends to "now")? */
export function isLive(row: ITimelineRow): boolean {
  return !isNum(row.finished_at) && (row.outcome == null || LIVE.has(row.outcome));
}

export interface IConstraintKind {
  kind: string;
  /** How tooltips and the legend name it: "JSON schema", "tool calls". */
  name: string;
  /** The badge's text, a glyph or two. */
  badge: string;
}

const CONSTRAINTS: Record<string, [string, string]> = {
  json_schema: ['JSON schema', '{}'],
  json_object: ['JSON object', '{}'],
  regex: ['regex', '.*'],
  choice: ['choice', 'a|b'],
  grammar: ['grammar', '::='],
  tools: ['tool calls', 'ƒ()']
};

/** A constraint kind as the timeline shows it (null: the row was free text). */
export function constraintKind(kind: string | null | undefined): IConstraintKind | null {
  if (!kind) {
    return null;
  }
  const [name, badge] = CONSTRAINTS[kind] ?? [kind.replace(/_/g, ' '), '{}'];
  return { kind, name, badge };
}

/** "8 of 9 tokens fast-forwarded" (null when the count is not known). */
export function forcedText(forced: number | null | undefined, tokens: number | null | undefined): string | null {
  if (!isNum(forced)) {
    return null;
  }
  const total = Math.max(forced, isNum(tokens) ? tokens : 0);
  return `${forced} of ${total} token${total === 1 ? '' : 's'} fast-forwarded`;
}

function rowStart(row: ITimelineRow): number | null {
  for (const t of [row.queued_at, row.admitted_at, row.first_token_at, row.finished_at]) {
    if (isNum(t)) {
      return t;
    }
  }
  return null;
}

/** How many rows a batch ran (one when the record does not say). */
function batchSize(b: ITimelineBatch): number {
  return b.size ?? b.members?.length ?? 1;
}

/** Merged [start, end] intervals in which something happened. */
function activity(rows: ITimelineRow[], batches: ITimelineBatch[], endOf: (r: ITimelineRow) => number, tEnd: number) {
  const spans: [number, number][] = [];
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
  const merged: [number, number][] = [];
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

/** The drawing's fixed geometry, from the options alone. */
interface IFrame {
  width: number;
  rowHeight: number;
  rowGap: number;
  charW: number;
  labelWidth: number;
  plotLeft: number;
  plotRight: number;
  live: boolean;
}

function frameOf(options: ILayoutOptions): IFrame {
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

/** Every time the rows and batches recorded. */
function recordedTimes(rows: ITimelineRow[], batches: ITimelineBatch[]): number[] {
  const times: number[] = [];
  for (const r of rows) {
    for (const t of [r.queued_at, r.admitted_at, r.first_token_at, r.finished_at]) {
      if (isNum(t)) {
        times.push(t);
      }
    }
  }
  for (const b of batches) {
    times.push(b.started_at as number);
    if (isNum(b.ended_at)) {
      times.push(b.ended_at);
    }
  }
  return times;
}

/** The span [t0, t1] the axis covers: everything recorded, up to `now` when given; in live
 * mode (`windowS`) the last `windowS` seconds up to now. */
function timeSpan(times: number[], now: number | null, windowS: number | null): [number, number] {
  let t1 = now ?? (times.length ? Math.max(...times) : 0);
  if (windowS !== null) {
    // Less than the window while the history is shorter, so that a burst that just started
    // is drawn wide rather than as a sliver at the right edge.
    const recent = times.filter(t => t >= t1 - windowS);
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

/** Where a row's bar ends, as a function of the row (`t1`: the end of the axis). */
function rowEnds(batchById: Map<number, ITimelineBatch>, t1: number): (r: ITimelineRow) => number {
  return (r: ITimelineRow): number => {
    if (isNum(r.finished_at)) {
      return r.finished_at;
    }
    if (isLive(r)) {
      return t1; // still running: up to "now" (or the latest thing recorded)
    }
    // Finished, end not recorded: its last batch span's end, else its last known time.
    const ends = (r.batch_ids || []).map(id => batchById.get(id)?.ended_at).filter(isNum);
    const known = [r.queued_at, r.admitted_at, r.first_token_at].filter(isNum);
    return Math.max(...ends, ...known, -Infinity);
  };
}

/** Rows in arrival order; in live mode only those that overlap the window. */
function shownRows(rows: ITimelineRow[], endOf: (r: ITimelineRow) => number, live: boolean, t0: number, t1: number) {
  return rows
    .filter(r => rowStart(r) !== null)
    .filter(r => !live || (endOf(r) >= t0 && (rowStart(r) as number) <= t1))
    .sort((p, q) => (rowStart(p) as number) - (rowStart(q) as number) || (p.id < q.id ? -1 : 1));
}

/** The stretches of [t0, t1] the axis shows. A long history that is mostly idle (bursts
 * minutes apart) would leave each burst a sliver, so idle gaps longer than 1 s and 3 % of
 * the span are cut out, once they add up to over 15 % of it. `cutS`: the seconds cut. */
function shownStretches(active: [number, number][], t0: number, t1: number) {
  const minGap = Math.max(1.0, 0.03 * (t1 - t0));
  const gaps: [number, number][] = [];
  for (let i = 1; i < active.length; i++) {
    if (active[i][0] - active[i - 1][1] > minGap) {
      gaps.push([active[i - 1][1], active[i][0]]);
    }
  }
  const idle = gaps.reduce((sum, [a, b]) => sum + (b - a), 0);
  if (!(gaps.length && idle > 0.15 * (t1 - t0))) {
    return { stretches: [[t0, t1]] as [number, number][], cutS: 0 };
  }
  const stretches: [number, number][] = [];
  let start = t0;
  for (const [a, b] of gaps) {
    stretches.push([start, a]);
    start = b;
  }
  stretches.push([start, t1]);
  return { stretches, cutS: idle };
}

/** The time axis: the shown stretches laid end to end, a cut of `CUT_W` px between two. */
interface IAxis {
  segments: ISegment[];
  cuts: ICut[];
  /** The same in every segment, so one tick step fits the whole axis. */
  pxPerS: number;
  shownS: number;
  x: (t: number) => number;
}

function layoutAxis(stretches: [number, number][], plotLeft: number, plotRight: number): IAxis {
  const nCuts = stretches.length - 1;
  const shownS = stretches.reduce((sum, [a, b]) => sum + (b - a), 0) || 1e-3;
  const pxPerS = (plotRight - plotLeft - nCuts * CUT_W) / shownS;
  const segments: ISegment[] = [];
  const cuts: ICut[] = [];
  let cursor = plotLeft;
  stretches.forEach(([a, b], i) => {
    segments.push({ a, b, x: cursor });
    cursor += (b - a) * pxPerS;
    if (i < nCuts) {
      cuts.push({ x: cursor, w: CUT_W, idleS: stretches[i + 1][0] - b });
      cursor += CUT_W;
    }
  });
  const x = (t: number): number => {
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

/** A time span as drawn pieces: one per axis segment it overlaps (an instant inside a
 * segment is one piece of width 1). */
function pieces(axis: IAxis, start: number, end: number): { x: number; w: number; start: number; end: number }[] {
  const out = [];
  for (const s of axis.segments) {
    const a = Math.max(start, s.a);
    const b = Math.min(end, s.b);
    if (b > a || (b === a && start === end && a >= s.a && a <= s.b)) {
      out.push({ x: axis.x(a), w: Math.max(1, (b - a) * axis.pxPerS), start: a, end: b });
    }
  }
  return out;
}

/** A tick's label on the axis: seconds since the start ("0 s", "2.5 s"), or in live mode how
 * long before now ("8 s ago", "now"). Never negative: `t` before `ref` (live: after `ref`,
 * by a rounding error) reads as 0. */
export function axisLabel(t: number, ref: number, step: number, live: boolean): string {
  const v = Math.max(0, live ? ref - t : t - ref);
  if (live) {
    return v < step / 2 ? 'now' : `${formatTick(v, step)} ago`;
  }
  return formatTick(v, step);
}

/** Ticks at one nice step, counted from the start (live: back from now, labelled "now",
 * "10 s ago" …), none before the start of the axis. */
function axisTicks(axis: IAxis, live: boolean, t0: number, t1: number, plotRight: number): ITick[] {
  const ticks: ITick[] = [];
  const step = niceStep(MIN_TICK_PX / axis.pxPerS);
  const ref = live ? t1 : t0;
  const tickLabel = (t: number): string => axisLabel(t, ref, step, live);
  let lastX = -Infinity;
  axis.segments.forEach((s, i) => {
    if (i > 0) {
      // Where the axis resumes after a cut: always labelled, so every stretch has a time.
      while (ticks.length && s.x - ticks[ticks.length - 1].x < MIN_TICK_PX * 0.75) {
        ticks.pop();
      }
      ticks.push({ x: s.x, label: tickLabel(s.a), resume: true });
      lastX = s.x + MIN_TICK_PX * 0.3; // its label starts here and reads to the right
    }
    for (let k = Math.ceil((s.a - ref) / step - 1e-9); ; k++) {
      const t = ref + k * step;
      if (t > s.b + 1e-9) {
        break;
      }
      if (t < t0 - 1e-9 * step) {
        continue; // before the window's start: not on the axis
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

/** What placing bands and rows needs besides the frame. */
interface IPlacement {
  frame: IFrame;
  t0: number;
  t1: number;
  axis: IAxis;
  batchById: Map<number, ITimelineBatch>;
  bins: ISizeBin[];
}

/** A band's label, the longest that fits: "#id ×size", then "×size"; with "»N" after the
 * size where grammars forced N of its tokens (kept before the id, which the tooltip has). */
function bandLabel(b: ITimelineBatch, size: number, forced: number, room: number, charW: number): string | null {
  const ff = forced > 0 ? ` »${forced}` : '';
  const candidates = ff ? [`#${b.id} ×${size}${ff}`, `×${size}${ff}`, `×${size}`] : [`#${b.id} ×${size}`, `×${size}`];
  return candidates.find(text => text.length * charW <= room) ?? null;
}

/** The batch track: a band per batch (per axis segment it spans), in start order, labelled
 * as `bandLabel` says where that fits, else not at all. */
function layoutBands(batches: ITimelineBatch[], at: IPlacement): IBandLayout[] {
  const { t0, t1 } = at;
  const charW = at.frame.charW;
  const bands: IBandLayout[] = [];
  for (const b of [...batches].sort((p, q) => (p.started_at as number) - (q.started_at as number))) {
    const end = isNum(b.ended_at) ? b.ended_at : t1;
    if (end < t0 || (b.started_at as number) > t1) {
      continue;
    }
    const size = batchSize(b);
    const forced = isNum(b.forced_tokens) ? b.forced_tokens : 0;
    for (const p of pieces(at.axis, b.started_at as number, end)) {
      const label = bandLabel(b, size, forced, p.w - 6, charW);
      bands.push({ batch: b, x: p.x, w: p.w, bin: binOf(size, at.bins), label, forced });
    }
  }
  return bands;
}

/** A tick on the batch track per step that forced tokens or kept guesses, inside [t0, t1]
 * and off the cuts; ticks closer than a wedge's width merge, so a run of steps (with guesses
 * on, nearly every decode step keeps some) reads as marks with their sums, not a sawtooth. */
export const TICK_W = 6; // a step tick's width (px): closer ticks merge

function stepTicks(steps: ITimelineStep[], at: IPlacement): IStepTick[] {
  const ticks: IStepTick[] = [];
  const shown = steps
    .filter(s => isNum(s.at) && (s.forced > 0 || (s.accepted ?? 0) > 0) && s.at >= at.t0 && s.at <= at.t1)
    .filter(s => at.axis.segments.some(seg => s.at >= seg.a && s.at <= seg.b))
    .sort((p, q) => p.at - q.at);
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

/** Adds the pieces of one part of a row over [start, stop], clipped to the axis. */
type AddPart = (kind: PartKind, start: number | null | undefined, stop: number, extra?: Partial<IPart>) => void;

/** Before the first token: queued then prefill where the server recorded the admission,
 * else all "waiting" (the server's records will split it). */
function waitingParts(row: ITimelineRow, end: number, add: AddPart): void {
  const { queued_at: q, admitted_at: a, first_token_at: f } = row;
  if (!isNum(a) && row.outcome === 'queued') {
    add('queued', q, end);
  } else if (isNum(a)) {
    add('queued', q, a);
    add('prefill', a, isNum(f) ? f : end);
  } else {
    add('waiting', q, isNum(f) ? f : end);
  }
}

/** The times a row sat out (fair share): [parked, resumed or `end`] pairs. */
function parkedSpans(row: ITimelineRow, end: number): [number, number][] {
  const resumed = row.resumed_at || [];
  return (row.parked_at || []).map((p, i) => [p, isNum(resumed[i]) ? resumed[i] : end] as [number, number]);
}

/** From the first token `f` to `end`: a part per recorded batch span, coloured by its size,
 * "parked" where it sat out, and "decode-unknown" wherever else no span is recorded (yet). */
function decodingParts(row: ITimelineRow, f: number, end: number, at: IPlacement, add: AddPart): void {
  const parked = parkedSpans(row, end);
  const gap = (s: number, e: number): void => {
    let t = s;
    for (const [p, r] of parked) {
      const lo = Math.max(p, t);
      const hi = Math.min(r, e);
      if (hi <= lo) {
        continue;
      }
      if (lo > t + 1e-6) {
        add('decode-unknown', t, lo);
      }
      add('parked', lo, hi);
      t = hi;
    }
    if (e > t + 1e-6) {
      add('decode-unknown', t, e);
    }
  };
  const spans = (row.batch_ids || [])
    .map(id => at.batchById.get(id))
    .filter((b): b is ITimelineBatch => b !== undefined)
    .sort((p, q) => (p.started_at as number) - (q.started_at as number));
  let done = f;
  for (const b of spans) {
    const s = Math.max(b.started_at as number, f);
    const e = Math.min(isNum(b.ended_at) ? b.ended_at : end, end);
    if (e <= s) {
      continue;
    }
    if (s > done + 1e-6) {
      gap(done, s);
    }
    add('decode', s, e, { bin: binOf(batchSize(b), at.bins), batchId: b.id });
    done = Math.max(done, e);
  }
  if (end > done + 1e-6) {
    gap(done, end);
  }
}

/** A row's parts in time order, clipped to [t0, t1]; only a decode part may be an instant. */
function rowParts(row: ITimelineRow, end: number, at: IPlacement): IPart[] {
  const parts: IPart[] = [];
  const add: AddPart = (kind, start, stop, extra = {}) => {
    if (!isNum(start) || stop < start || (stop === start && kind !== 'decode')) {
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

/** The mark just after the end of a cancelled or failed row (⊘ or ✕), kept inside the plot. */
function rowMarker(row: ITimelineRow, end: number, at: IPlacement): IRowLayout['marker'] {
  const outcome = row.outcome || '';
  const failed = outcome === 'failed' || outcome === 'error';
  if (outcome !== 'cancelled' && !failed) {
    return null;
  }
  const x = Math.min(at.axis.x(Math.min(end, at.t1)) + 2, at.frame.plotRight - 8);
  return { x, kind: failed ? 'failed' : 'cancelled' };
}

/** Runs of adjacent parts, as boxes (a cut between two parts ends a run). */
function barRuns(parts: IPart[]): { x: number; w: number }[] {
  const runs: { x: number; w: number }[] = [];
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

/** A constrained row's mark: its badge right-aligned in the label column, its bar outlined. */
function constraintMark(row: ITimelineRow, parts: IPart[], at: IPlacement): IConstraintMark | null {
  const kind = constraintKind(row.constraint);
  if (!kind) {
    return null;
  }
  return { ...kind, x: at.frame.labelWidth - BADGE_W - 4, outline: barRuns(parts) };
}

function layoutRow(row: ITimelineRow, index: number, end: number, maxChars: number, at: IPlacement): IRowLayout {
  const full = row.label || row.id;
  const parts = rowParts(row, end, at);
  const constraint = constraintMark(row, parts, at);
  // A badge takes the end of the label column: the label gives up that room.
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

/** The whole layout, in order: the time span, the rows it shows, the axis (idle gaps cut),
 * its ticks, the colour bins, the batch bands, the fast-forward ticks and the request rows. */
export function layoutTimeline(state: ITimelineState, options: ILayoutOptions): ITimelineLayout {
  const frame = frameOf(options);
  const { live, rowHeight, rowGap } = frame;
  const batches = (state.batches || []).filter(b => isNum(b.started_at));
  const batchById = new Map(batches.map(b => [b.id, b]));
  const now = isNum(state.now) ? state.now : null;
  const [t0, t1] = timeSpan(recordedTimes(state.rows || [], batches), now, live ? (options.windowS as number) : null);
  const endOf = rowEnds(batchById, t1);
  const rows = shownRows(state.rows || [], endOf, live, t0, t1);
  // Never cut in live mode: the window is a fixed span of time, scrolling.
  const { stretches, cutS } =
    !live && options.compress !== false
      ? shownStretches(activity(rows, batches, endOf, t1), t0, t1)
      : { stretches: [[t0, t1]] as [number, number][], cutS: 0 };
  const axis = layoutAxis(stretches, frame.plotLeft, frame.plotRight);
  const bins = sizeBins(options.maxBatchSize || Math.max(1, ...batches.map(batchSize)));
  const at: IPlacement = { frame, t0, t1, axis, batchById, bins };
  const maxChars = Math.max(4, Math.floor((frame.labelWidth - 10) / frame.charW));
  const rowLayouts = rows.map((row, i) => {
    const end = Math.max(endOf(row), rowStart(row) as number);
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
    kinds: new Set(rowLayouts.flatMap(r => r.parts.map(p => p.kind))),
    stepTicks: ticks,
    constraints: new Set(rowLayouts.flatMap(r => (r.constraint ? [r.constraint.kind] : []))),
    fastForwarded:
      ticks.some(t => t.forced > 0) || bands.some(b => b.forced > 0) || rowLayouts.some(r => (r.row.forced_tokens ?? 0) > 0),
    guessed: ticks.some(t => t.accepted > 0),
    shownS: axis.shownS,
    cutS,
    x: axis.x
  };
}

/** What hovering a row shows: its id and label, timings, tokens and batches. */
export function describeRow(row: ITimelineRow, batches: Map<number, ITimelineBatch>, now: number | null): string[] {
  const lines: string[] = [];
  if (row.label && row.label !== row.id) {
    lines.push(row.label);
  }
  const outcome = row.outcome || (isLive(row) ? 'running' : 'done');
  lines.push(`${row.id} · ${outcome} · ${row.tokens ?? 0} tokens out${isNum(row.prompt_tokens) ? `, ${row.prompt_tokens} in` : ''}`);
  const kind = constraintKind(row.constraint);
  if (kind) {
    const forced = forcedText(row.forced_tokens, row.tokens);
    lines.push(`constrained: ${kind.name}${forced ? ` · ${forced}${isLive(row) ? ' so far' : ''}` : ''}`);
  }
  const q = row.queued_at;
  const end = isNum(row.finished_at) ? row.finished_at : now;
  const timing: string[] = [];
  if (isNum(q) && isNum(row.admitted_at)) {
    timing.push(`queued ${formatMs((row.admitted_at - q) * 1000)}`);
  } else if (isNum(q) && row.outcome === 'queued' && isNum(now)) {
    timing.push(`queued ${formatMs((now - q) * 1000)} so far`);
  }
  if (isNum(q) && isNum(row.first_token_at)) {
    timing.push(`TTFT ${formatMs((row.first_token_at - q) * 1000)}`);
  }
  if (isNum(q) && isNum(end)) {
    timing.push(`${isNum(row.finished_at) ? 'total' : 'running for'} ${formatMs((end - q) * 1000)}`);
  }
  if (timing.length) {
    lines.push(timing.join(' · '));
  }
  const ids = row.batch_ids || [];
  if (ids.length) {
    const shown = ids.slice(0, 6).map(id => {
      const b = batches.get(id);
      return b ? `#${id} ×${b.size ?? b.members?.length ?? '?'}` : `#${id}`;
    });
    lines.push(`batches ${shown.join(', ')}${ids.length > 6 ? ` +${ids.length - 6} more` : ''}`);
  }
  return lines;
}

/** What hovering a batch band shows. */
export function describeBatch(batch: ITimelineBatch, now: number | null): string {
  const end = isNum(batch.ended_at) ? batch.ended_at : now;
  const size = batch.size ?? batch.members?.length ?? 0;
  const span =
    isNum(batch.started_at) && isNum(end)
      ? ` · ${formatMs((end - batch.started_at) * 1000)}${isNum(batch.ended_at) ? '' : ' so far'}`
      : '';
  const forced = batch.forced_tokens ? `, ${batch.forced_tokens} fast-forwarded` : '';
  const guessed = batch.accepted_tokens
    ? `, ${batch.accepted_tokens} from guesses the model accepted (of ${batch.draft_tokens ?? batch.accepted_tokens} proposed)`
    : '';
  return (
    `batch #${batch.id} · ${size} row${size === 1 ? '' : 's'} · ${batch.steps ?? 0} steps · ` +
    `${batch.tokens ?? 0} tokens${forced}${guessed}${span}`
  );
}

/** What hovering a step tick shows. */
export function describeStepTick(tick: IStepTick): string {
  const steps = tick.steps === 1 ? 'a step' : `${tick.steps} steps`;
  const tokens = (n: number) => `${n} token${n === 1 ? '' : 's'}`;
  const parts = [
    ...(tick.forced > 0 ? [`fast-forwarded ${tokens(tick.forced)} (forced by a grammar, not sampled)`] : []),
    ...(tick.accepted > 0 ? [`kept ${tokens(tick.accepted)} from guesses the model accepted (speculative decoding)`] : [])
  ];
  return `${steps} ${parts.join(' and ')}`;
}
