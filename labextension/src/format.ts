// Numbers as a person reads them, shared by the panel and the timeline.

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
