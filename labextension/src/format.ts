// Numbers as a person reads them, shared by the panel and the timeline.

import type { ILoading, IMetrics, IStatus } from './api';

/** A duration in milliseconds: "850 ms", "1.2 s", "45 s", "2 min 5 s". */
export function formatMs(ms: number | null | undefined): string {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) {
    return '–';
  }
  const abs = Math.abs(ms);
  if (abs < 1000) {
    return `${Math.round(ms)} ms`;
  }
  if (abs < 10_000) {
    return `${(ms / 1000).toFixed(1)} s`;
  }
  if (abs < 120_000) {
    return `${Math.round(ms / 1000)} s`;
  }
  const minutes = Math.trunc(ms / 60_000);
  const seconds = Math.round((abs % 60_000) / 1000);
  return seconds ? `${minutes} min ${seconds} s` : `${minutes} min`;
}

/** A rate or count with a sensible number of digits; "–" when unknown. */
export function formatNumber(value: number | null | undefined, digits = 1): string {
  if (value === null || value === undefined || !Number.isFinite(value)) {
    return '–';
  }
  return Math.abs(value) >= 100 ? String(Math.round(value)) : value.toFixed(digits).replace(/\.0+$/, '');
}

/** How the model is held: its format (int4, not the compute dtype), its bytes and the process's. */
export function describeWeights(s: IStatus): string | null {
  const d = (s.details ?? {}) as Record<string, unknown>;
  const quantize = typeof d.quantize === 'string' && d.quantize !== 'none' ? d.quantize : null;
  const held = quantize ?? s.dtype;
  if (!held) {
    return null;
  }
  const sizes: string[] = [];
  if (typeof d.weight_bytes === 'number') {
    sizes.push(`${formatBytes(d.weight_bytes)} of weights`);
  }
  if (typeof d.rss_after_load_bytes === 'number') {
    sizes.push(`${formatBytes(d.rss_after_load_bytes)} resident`);
  }
  return sizes.length ? `${held} (${sizes.join(', ')})` : held;
}

/** Where loading is: its phase, how far, the seconds so far and (where counted) left. */
export function describeLoading(l: ILoading): string {
  const count = l.total ? `: ${l.done} of ${l.total} ${l.unit}` : '';
  const left = l.phase_left_s !== null ? `, about ${Math.round(l.phase_left_s)} s left` : '';
  return `${l.phase}${count} (${l.elapsed_s} s so far${left})`;
}

function formatBytes(n: number): string {
  return n >= 2 ** 30 ? `${(n / 2 ** 30).toFixed(2)} GiB` : `${Math.round(n / 2 ** 20)} MiB`;
}

/**
 * The status bar's line for a ready server: "infer: ready · 3 running · 2 queued · 41 tok/s"
 * while generating, "infer: ready · 3 queued" while requests only wait (queued, or parked for
 * another user's), "infer: ready · idle" when nothing runs or waits. The rate shows only while
 * something runs: the server's `recent_tokens_per_s` keeps the last burst's figure after it
 * ended (its window is only trimmed when a step runs), which read as a stale "47 tok/s".
 */
export function readyLine(m: IMetrics, simulated = false): string {
  const running = m.requests?.running ?? 0;
  const queued = m.requests?.queued ?? m.queue_depth ?? 0;
  const parts: string[] = [];
  if (running > 0) {
    parts.push(`${running} running`);
  }
  if (queued > 0) {
    parts.push(`${queued} queued`);
  }
  if ((m.requests?.parked ?? 0) > 0) {
    parts.push(`${m.requests.parked} parked`);
  }
  if (running > 0) {
    parts.push(`${Math.round(m.recent_tokens_per_s ?? 0)} tok/s`);
  }
  // The simulated engine answers fluently with no model: the bar says so, not only the panel.
  const who = simulated ? 'ready (simulated engine)' : 'ready';
  return `infer: ${who} · ${parts.length ? parts.join(' · ') : 'idle'}`;
}
