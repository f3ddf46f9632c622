// The batch timeline as SVG: the one renderer behind both the JupyterLab side panel and the
// notebook's anywidget (`widget.ts`). It draws a `layoutTimeline` result; colours come from
// CSS classes (`style/timeline.css`) built on JupyterLab's theme variables.

import {
  BADGE_W,
  describeBatch,
  describeStepTick,
  describeRow,
  IRowLayout,
  ITimelineLayout,
  layoutTimeline,
  legendText,
  TICK_W,
  PartKind
} from './layout';
import { ITimelineBatch, ITimelineRow, ITimelineState } from './types';
import { formatMs } from '../format';

const NS = 'http://www.w3.org/2000/svg';
const AXIS_H = 18;
const TRACK_H = 18;
const HEAD_H = AXIS_H + TRACK_H + 4;

export interface ITimelineOptions {
  /** Live mode: the seconds of history to show, scrolling up to `now`. */
  windowS?: () => number | null;
  /** Colour bins reach this batch size (e.g. the server's max_batch_size). */
  maxBatchSize?: () => number | null;
  /** Rows (requests) a click may act on, e.g. cancel the running ones. */
  clickable?: (row: ITimelineRow) => boolean;
  onRowClick?: (row: ITimelineRow) => void;
  /** What the hover box says a click does, e.g. "click to cancel". */
  clickHint?: string;
  emptyText?: string;
  /** Height of the rows area before it scrolls (px). */
  maxRowsHeight?: number;
}

let views = 0;

function svgEl<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | number>,
  parent?: Element
): SVGElementTagNameMap[K] {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    node.setAttribute(k, String(v));
  }
  if (parent) {
    parent.appendChild(node);
  }
  return node;
}

function htmlEl<K extends keyof HTMLElementTagNameMap>(tag: K, className: string, parent?: Element): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (parent) {
    parent.appendChild(node);
  }
  return node;
}

/** Relative luminance of a CSS colour ("#rgb", "#rrggbb", "rgb(…)"); null if unknown. */
export function luminance(colour: string): number | null {
  const c = colour.trim().toLowerCase();
  let rgb: number[] | null = null;
  const hex = /^#([0-9a-f]{3}|[0-9a-f]{6})$/.exec(c);
  if (hex) {
    const h = hex[1].length === 3 ? hex[1].replace(/./g, d => d + d) : hex[1];
    rgb = [0, 2, 4].map(i => parseInt(h.slice(i, i + 2), 16));
  } else {
    const m = /^rgba?\(\s*([\d.]+)[\s,]+([\d.]+)[\s,]+([\d.]+)/.exec(c);
    if (m) {
      rgb = [m[1], m[2], m[3]].map(Number);
    }
  }
  if (!rgb) {
    return null;
  }
  const [r, g, b] = rgb.map(v => {
    const s = v / 255;
    return s <= 0.03928 ? s / 12.92 : Math.pow((s + 0.055) / 1.055, 2.4);
  });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}

export function contrast(l1: number, l2: number): number {
  const [hi, lo] = l1 > l2 ? [l1, l2] : [l2, l1];
  return (hi + 0.05) / (lo + 0.05);
}

/** The constraint and fast-forward marks, in the accent colour (green in JupyterLab's themes;
 * the decoding blues, prefill orange and error red stay theirs). Inline, so that the marks
 * need nothing from the stylesheet; their classes (ji-constraint-*, ji-ff-*) let a theme
 * restyle them. */
const ACCENT = 'var(--jp-accent-color1, #388e3c)';
const MARK_STYLE = {
  outline: `fill: none; stroke: ${ACCENT}; stroke-width: 1.5px; pointer-events: none`,
  badge: `fill: var(--jp-layout-color1, #ffffff); stroke: ${ACCENT}; stroke-width: 1px`,
  badgeText: `fill: ${ACCENT}; font-size: 9px; font-weight: 700; font-family: var(--jp-code-font-family, monospace); pointer-events: none`,
  tick: `fill: ${ACCENT}; stroke: var(--jp-layout-color1, #ffffff); stroke-width: 0.75px`,
  // A step that kept guesses: the same wedge, hollow (tokens the model computed, not forced).
  guessTick: `fill: var(--jp-layout-color1, #ffffff); stroke: ${ACCENT}; stroke-width: 1.25px`,
  tickHit: 'fill: transparent',
  legendBadge:
    `display: inline-block; padding: 0 2px; border: 1px solid ${ACCENT}; border-radius: 2px; color: ${ACCENT}; ` +
    'font: 700 9px var(--jp-code-font-family, monospace); line-height: 11px',
  legendTick: `display: inline-block; width: 0; height: 0; border: 4px solid transparent; border-top: 0; border-bottom: 6px solid ${ACCENT}`,
  legendGuessTick: `color: ${ACCENT}; font-size: 9px; line-height: 9px`
};

/** A timeline drawn into `host`; `update(state)` redraws it (at most once per frame). */
export class TimelineView {
  readonly node: HTMLDivElement;
  private _options: ITimelineOptions;
  private _state: ITimelineState = { rows: [], batches: [], now: null, title: '' };
  private _layout: ITimelineLayout | null = null;
  private _batches = new Map<number, ITimelineBatch>();
  private _inks = new Map<number, string | null>();
  private _uid: string;
  private _frame = 0;
  private _drawnWidth = 0;
  private _hover: { kind: 'row' | 'band' | 'tick'; key: string; x: number; y: number } | null = null;
  private _observer: ResizeObserver | null = null;
  private _title: HTMLDivElement;
  private _box: HTMLDivElement;
  private _head: SVGSVGElement;
  private _body: HTMLDivElement;
  private _rows: SVGSVGElement;
  private _tip: HTMLDivElement;
  private _legend: HTMLDivElement;

  constructor(host: HTMLElement, options: ITimelineOptions = {}) {
    this._options = options;
    // Ids inside an SVG are global to the page: each view gets its own, so that one
    // view going away cannot take another's hatching with it.
    this._uid = `ji-tl-${++views}-${Math.random().toString(36).slice(2, 8)}`;
    this.node = htmlEl('div', 'ji-timeline', host);
    this._title = htmlEl('div', 'ji-title', this.node);
    this._box = htmlEl('div', 'ji-tl-box', this.node);
    this._head = svgEl('svg', { class: 'ji-tl-head' }, this._box);
    this._body = htmlEl('div', 'ji-tl-body', this._box);
    this._body.style.maxHeight = `${options.maxRowsHeight ?? 420}px`;
    this._rows = svgEl('svg', { class: 'ji-tl-rows' }, this._body);
    this._tip = htmlEl('div', 'ji-tl-tip', this._box);
    this._tip.hidden = true;
    this._legend = htmlEl('div', 'ji-legend', this.node);

    this._rows.addEventListener('mousemove', this._onMove);
    this._head.addEventListener('mousemove', this._onMove);
    this._rows.addEventListener('mouseleave', this._onLeave);
    this._head.addEventListener('mouseleave', this._onLeave);
    this._rows.addEventListener('click', this._onClick);
    if (typeof ResizeObserver !== 'undefined') {
      // Redraw on real width changes only: a container that shrink-wraps its content
      // must not start a resize → redraw → resize loop.
      this._observer = new ResizeObserver(() => {
        if (Math.abs(this._width() - this._drawnWidth) > 4) {
          this.schedule();
        }
      });
      this._observer.observe(this.node);
    }
  }

  get layout(): ITimelineLayout | null {
    return this._layout;
  }

  update(state: ITimelineState): void {
    this._state = state;
    this.schedule();
  }

  /** Redraw at the next animation frame (once, however many updates came). */
  schedule(): void {
    if (this._frame) {
      return;
    }
    if (typeof requestAnimationFrame === 'undefined') {
      this.draw();
      return;
    }
    this._frame = requestAnimationFrame(() => {
      this._frame = 0;
      this.draw();
    });
  }

  dispose(): void {
    if (this._frame && typeof cancelAnimationFrame !== 'undefined') {
      cancelAnimationFrame(this._frame);
    }
    this._frame = 0;
    this._observer?.disconnect();
    this.node.remove();
  }

  private _width(): number {
    return this.node.clientWidth || this.node.parentElement?.clientWidth || 640;
  }

  /** Draw now. */
  draw(): void {
    const state = this._state;
    const opts = this._options;
    const width = this._width();
    this._drawnWidth = width;
    this._title.textContent = state.title || '';
    this._title.hidden = !state.title;
    this._batches = new Map((state.batches || []).map(b => [b.id, b]));
    this._inks.clear(); // the theme may have changed since the last draw
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

  private _drawHead(layout: ITimelineLayout): void {
    const svg = this._head;
    svg.replaceChildren();
    svg.setAttribute('width', String(layout.width));
    svg.setAttribute('height', String(HEAD_H));
    svg.setAttribute('viewBox', `0 0 ${layout.width} ${HEAD_H}`);
    this._drawCuts(svg, layout, 0, HEAD_H, true);
    const axis = svgEl('g', { class: 'ji-axis' }, svg);
    for (const t of layout.ticks) {
      svgEl('line', { x1: t.x, x2: t.x, y1: AXIS_H - 4, y2: HEAD_H, class: 'ji-grid' }, axis);
      const anchor =
        t.x > layout.plotRight - 20 ? 'end' : t.resume || t.x < layout.plotLeft + 14 ? 'start' : 'middle';
      svgEl('text', { x: t.resume ? t.x + 2 : t.x, y: AXIS_H - 6, 'text-anchor': anchor }, axis).textContent = t.label;
    }
    const track = svgEl('g', { class: 'ji-batches' }, svg);
    svgEl('text', { x: 4, y: AXIS_H + 13, class: 'ji-track-label' }, track).textContent = 'batches';
    layout.bands.forEach((band, i) => {
      const rect = svgEl(
        'rect',
        { x: band.x, y: AXIS_H + 1, width: band.w, height: TRACK_H - 2, class: `ji-band ji-size-${band.bin}`, 'data-band': i },
        track
      );
      rect.setAttribute('aria-label', describeBatch(band.batch, layout.live ? layout.t1 : null));
      if (band.label) {
        const text = svgEl('text', { x: band.x + 3, y: AXIS_H + 13, class: 'ji-band-label', 'data-band': i }, track);
        text.textContent = band.label;
        const ink = this._ink(band.bin);
        if (ink) {
          text.setAttribute('style', `fill: ${ink}`);
        }
      }
      if (band.forced > 0) {
        rect.classList.add('ji-ff-band');
      }
    });
    this._drawStepTicks(svg, layout);
  }

  /** A tick under the batch track per step that fast-forwarded tokens (a solid wedge) or kept
   * accepted guesses only (hollow): it points up at its batch, clear of the band's label. */
  private _drawStepTicks(svg: SVGSVGElement, layout: ITimelineLayout): void {
    if (!layout.stepTicks.length) {
      return;
    }
    const g = svgEl('g', { class: 'ji-ff-ticks' }, svg);
    const top = AXIS_H + TRACK_H - 2;
    // Hollow (guesses only) first, solid on top: a fast-forward mark is never hidden.
    const order = layout.stepTicks.map((tick, i) => [tick, i] as const).sort(([p], [q]) => Number(p.forced > 0) - Number(q.forced > 0));
    for (const [tick, i] of order) {
      // Its hover area is the wedge's own, below the band: the band keeps its tooltip.
      svgEl('rect', { x: tick.x - TICK_W / 2, y: top, width: TICK_W, height: HEAD_H - top, style: MARK_STYLE.tickHit, 'data-tick': i }, g);
      const points = `${tick.x - TICK_W / 2},${HEAD_H} ${tick.x + TICK_W / 2},${HEAD_H} ${tick.x},${top}`;
      const guessed = tick.forced === 0;
      const mark = svgEl('polygon', {
        points,
        class: guessed ? 'ji-ff-tick ji-guess-tick' : 'ji-ff-tick',
        style: guessed ? MARK_STYLE.guessTick : MARK_STYLE.tick,
        'data-tick': i
      }, g);
      mark.setAttribute('aria-label', describeStepTick(tick));
    }
  }

  private _drawCuts(svg: SVGSVGElement, layout: ITimelineLayout, y: number, h: number, labelled: boolean): void {
    for (const cut of layout.cuts) {
      const g = svgEl('g', { class: 'ji-cut' }, svg);
      svgEl('rect', { x: cut.x + 2, y, width: cut.w - 4, height: h, class: 'ji-cut-bg' }, g);
      svgEl('line', { x1: cut.x + 4, x2: cut.x + 4, y1: y, y2: y + h, class: 'ji-cut-edge' }, g);
      svgEl('line', { x1: cut.x + cut.w - 4, x2: cut.x + cut.w - 4, y1: y, y2: y + h, class: 'ji-cut-edge' }, g);
      if (labelled) {
        svgEl('title', {}, g).textContent = `${formatMs(cut.idleS * 1000)} idle, cut from the axis`;
      }
    }
  }

  private _drawRows(layout: ITimelineLayout): void {
    const svg = this._rows;
    svg.replaceChildren();
    const opts = this._options;
    if (!layout.rows.length) {
      svg.setAttribute('width', '0');
      svg.setAttribute('height', '0');
      this._body.dataset.empty = opts.emptyText ?? 'No requests yet.';
      return;
    }
    delete this._body.dataset.empty;
    const height = layout.rowsHeight + 2;
    svg.setAttribute('width', String(layout.width));
    svg.setAttribute('height', String(height));
    svg.setAttribute('viewBox', `0 0 ${layout.width} ${height}`);
    const defs = svgEl('defs', {}, svg);
    const hatch = svgEl(
      'pattern',
      { id: `${this._uid}-queued`, width: 6, height: 6, patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)' },
      defs
    );
    svgEl('rect', { width: 6, height: 6, class: 'ji-hatch-bg' }, hatch);
    svgEl('line', { x1: 0, y1: 0, x2: 0, y2: 6, class: 'ji-hatch-line' }, hatch);
    const dots = svgEl('pattern', { id: `${this._uid}-unknown`, width: 4, height: 4, patternUnits: 'userSpaceOnUse' }, defs);
    svgEl('rect', { width: 4, height: 4, class: 'ji-unknown-bg' }, dots);
    svgEl('rect', { width: 2, height: 4, class: 'ji-unknown-line' }, dots);

    const grid = svgEl('g', { class: 'ji-axis' }, svg);
    for (const t of layout.ticks) {
      svgEl('line', { x1: t.x, x2: t.x, y1: 0, y2: height, class: 'ji-grid' }, grid);
    }
    this._drawCuts(svg, layout, 0, height, false);
    const h = layout.rowHeight;
    layout.rows.forEach((r, i) => {
      const clickable = !!(opts.onRowClick && opts.clickable?.(r.row));
      const ended = r.marker ? ` ji-ended-${r.marker.kind}` : '';
      const constrained = r.constraint ? ' ji-constrained' : '';
      const g = svgEl('g', { class: `ji-row${clickable ? ' ji-clickable' : ''}${r.live ? ' ji-live' : ''}${ended}${constrained}`, 'data-row': i }, svg);
      g.setAttribute('data-id', r.row.id);
      g.setAttribute('aria-label', `${r.fullLabel}: ${r.row.outcome ?? 'running'}${r.constraint ? `, ${r.constraint.name}` : ''}`);
      svgEl('rect', { x: 0, y: r.y - 1, width: layout.width, height: h + 2, class: 'ji-row-bg' }, g);
      svgEl('text', { x: 4, y: r.y + h - 4, class: 'ji-row-label' }, g).textContent = r.label;
      for (const p of r.parts) {
        const attrs: Record<string, string | number> = { x: p.x, y: r.y, width: p.w, height: h, class: `ji-part ji-${p.kind}` };
        if (p.kind === 'queued') {
          attrs.fill = `url(#${this._uid}-queued)`;
        } else if (p.kind === 'decode-unknown') {
          attrs.fill = `url(#${this._uid}-unknown)`;
        } else if (p.kind === 'decode') {
          attrs.class += ` ji-size-${p.bin}`;
        }
        svgEl('rect', attrs, g);
      }
      if (r.constraint) {
        this._drawConstraint(g, r, h);
      }
      if (r.marker) {
        const m = svgEl('text', { x: r.marker.x, y: r.y + h - 4, class: `ji-marker ji-${r.marker.kind}` }, g);
        m.textContent = r.marker.kind === 'cancelled' ? '⊘' : '✕';
      }
    });
  }

  /** A constrained row: its bar outlined, a badge with the kind's glyph ending its label. */
  private _drawConstraint(g: SVGGElement, r: IRowLayout, h: number): void {
    const mark = r.constraint!;
    g.setAttribute('data-constraint', mark.kind);
    for (const box of mark.outline) {
      svgEl('rect', { x: box.x - 0.75, y: r.y - 0.75, width: box.w + 1.5, height: h + 1.5, class: 'ji-constraint-outline', style: MARK_STYLE.outline }, g);
    }
    const badge = svgEl('g', { class: 'ji-constraint-badge' }, g);
    svgEl('rect', { x: mark.x, y: r.y + 1.5, width: BADGE_W, height: h - 3, rx: 2, style: MARK_STYLE.badge }, badge);
    const text = svgEl('text', { x: mark.x + BADGE_W / 2, y: r.y + h / 2 + 3, 'text-anchor': 'middle', style: MARK_STYLE.badgeText }, badge);
    text.textContent = mark.badge;
  }

  private _drawLegend(layout: ITimelineLayout): void {
    const legend = this._legend;
    legend.replaceChildren();
    const item = (swatchClass: string, text: string, title?: string): void => {
      const span = htmlEl('span', 'ji-legend-item', legend);
      htmlEl('span', `ji-swatch ${swatchClass}`, span);
      span.appendChild(document.createTextNode(text));
      if (title) {
        span.title = title;
      }
    };
    for (const kind of ['queued', 'waiting', 'prefill'] as PartKind[]) {
      if (layout.kinds.has(kind) || kind !== 'waiting') {
        item(`ji-swatch-${kind}`, legendText(kind));
      }
    }
    const sizes = htmlEl('span', 'ji-legend-item ji-legend-sizes', legend);
    sizes.appendChild(document.createTextNode(legendText('decode')));
    layout.bins.forEach((bin, i) => {
      const s = htmlEl('span', `ji-size-chip ji-size-${i}`, sizes);
      s.textContent = bin.label;
      const ink = this._ink(i);
      if (ink) {
        s.style.color = ink;
      }
    });
    if (layout.kinds.has('decode-unknown')) {
      item('ji-swatch-decode-unknown', legendText('decode-unknown'));
    }
    if (layout.kinds.has('parked')) {
      item('ji-swatch-parked', legendText('parked'));
    }
    this._drawMarksKey(legend, layout);
    const outcomes = new Set(layout.rows.map(r => r.marker?.kind).filter(Boolean));
    if (outcomes.has('cancelled')) {
      htmlEl('span', 'ji-legend-item ji-marker-key ji-cancelled', legend).textContent = '⊘ cancelled';
    }
    if (outcomes.has('failed')) {
      htmlEl('span', 'ji-legend-item ji-marker-key ji-failed', legend).textContent = '✕ failed';
    }
    const batchIds = new Set(layout.bands.map(b => b.batch.id));
    const summary = htmlEl('span', 'ji-legend-item ji-legend-summary', legend);
    const span = layout.live
      ? `last ${formatMs((layout.t1 - layout.t0) * 1000)}`
      : formatMs((layout.t1 - layout.t0) * 1000) + (layout.cutS > 0 ? ` (${formatMs(layout.cutS * 1000)} idle cut)` : '');
    summary.textContent = `${layout.rows.length} requests · ${batchIds.size} batches · ${span}`;
  }

  /** The legend's keys to the constraint badge and the fast-forward marks, when drawn. */
  private _drawMarksKey(legend: HTMLDivElement, layout: ITimelineLayout): void {
    if (layout.constraints.size) {
      const names = new Map(layout.rows.flatMap(r => (r.constraint ? [[r.constraint.kind, r.constraint] as const] : [])));
      const span = htmlEl('span', 'ji-legend-item ji-constraint-key', legend);
      const badges = [...new Set([...names.values()].map(c => c.badge))];
      for (const glyph of badges) {
        const chip = htmlEl('span', 'ji-constraint-chip', span);
        chip.setAttribute('style', MARK_STYLE.legendBadge);
        chip.textContent = glyph;
      }
      span.appendChild(document.createTextNode(`constrained: ${[...names.values()].map(c => c.name).join(', ')}`));
    }
    if (layout.guessed) {
      const span = htmlEl('span', 'ji-legend-item ji-guess-key', legend);
      const chip = htmlEl('span', 'ji-guess-chip', span);
      chip.setAttribute('style', MARK_STYLE.legendGuessTick);
      chip.textContent = '\u25b3'; // a hollow wedge, as on the track
      span.appendChild(document.createTextNode('guessed: steps that kept accepted guesses'));
      span.title =
        'Speculative decoding: a row proposes tokens (prompt lookup or a draft model) and the step verifies them; ' +
        'the model keeps those it agrees with, so one step can emit several tokens of a row.';
    }
    if (layout.fastForwarded) {
      const span = htmlEl('span', 'ji-legend-item ji-ff-key', legend);
      if (layout.stepTicks.some(t => t.forced > 0)) {
        htmlEl('span', 'ji-ff-chip', span).setAttribute('style', MARK_STYLE.legendTick);
      }
      span.appendChild(document.createTextNode('» fast-forwarded: tokens a grammar forced, not sampled'));
      span.title = 'Where a grammar allows one token only, the server appends it without sampling: one step can emit several tokens.';
    }
  }

  /** The theme's text colour that reads best on bin `bin`'s fill (null when unknown). */
  private _ink(bin: number): string | null {
    if (!this._inks.has(bin)) {
      this._inks.set(bin, this._resolveInk(bin));
    }
    return this._inks.get(bin) ?? null;
  }

  private _resolveInk(bin: number): string | null {
    if (typeof getComputedStyle === 'undefined') {
      return null;
    }
    const style = getComputedStyle(this.node);
    const fill = luminance(style.getPropertyValue(`--ji-size-${bin}`));
    if (fill === null) {
      return null;
    }
    let best: string | null = null;
    let bestContrast = 0;
    for (const name of ['--jp-ui-font-color0', '--jp-ui-inverse-font-color0']) {
      const l = luminance(style.getPropertyValue(name));
      if (l !== null && contrast(fill, l) > bestContrast) {
        bestContrast = contrast(fill, l);
        best = `var(${name})`;
      }
    }
    return best;
  }

  // -- hover and click -----------------------------------------------------------------------
  private _target(event: Event): { kind: 'row' | 'band' | 'tick'; index: number } | null {
    const el = (event.target as Element | null)?.closest?.('[data-row],[data-band],[data-tick]');
    if (!el) {
      return null;
    }
    const row = el.getAttribute('data-row');
    if (row !== null) {
      return { kind: 'row', index: Number(row) };
    }
    const tick = el.getAttribute('data-tick');
    if (tick !== null) {
      return { kind: 'tick', index: Number(tick) };
    }
    return { kind: 'band', index: Number(el.getAttribute('data-band')) };
  }

  private _onMove = (event: MouseEvent): void => {
    const target = this._target(event);
    const layout = this._layout;
    if (!target || !layout) {
      this._onLeave();
      return;
    }
    const box = this._box.getBoundingClientRect();
    const key =
      target.kind === 'row'
        ? layout.rows[target.index]?.row.id
        : target.kind === 'tick'
          ? layout.stepTicks[target.index] && String(target.index)
          : layout.bands[target.index] && String(layout.bands[target.index].batch.id);
    if (key === undefined) {
      this._onLeave();
      return;
    }
    this._hover = { kind: target.kind, key, x: event.clientX - box.left, y: event.clientY - box.top };
    this._refreshTip();
  };

  private _onLeave = (): void => {
    this._hover = null;
    this._tip.hidden = true;
  };

  private _onClick = (event: MouseEvent): void => {
    const target = this._target(event);
    const opts = this._options;
    if (!target || target.kind !== 'row' || !this._layout || !opts.onRowClick) {
      return;
    }
    const row = this._layout.rows[target.index]?.row;
    if (row && opts.clickable?.(row)) {
      opts.onRowClick(row);
    }
  };

  private _refreshTip(): void {
    const hover = this._hover;
    const layout = this._layout;
    if (!hover || !layout) {
      this._tip.hidden = true;
      return;
    }
    const now = layout.live || (this._state.now ?? null) !== null ? layout.t1 : null;
    let lines: string[] | null = null;
    if (hover.kind === 'row') {
      const r: IRowLayout | undefined = layout.rows.find(x => x.row.id === hover.key);
      if (r) {
        lines = describeRow(r.row, this._batches, now);
        if (this._options.onRowClick && this._options.clickable?.(r.row) && this._options.clickHint) {
          lines.push(this._options.clickHint);
        }
      }
    } else if (hover.kind === 'tick') {
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
        const div = htmlEl('div', i === 0 ? 'ji-tip-head' : '');
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
}
