import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { axisLabel, legendText, layoutTimeline, PartKind } from '../src/timeline/layout';
import { ITimelineState } from '../src/timeline/types';

/** The fallback colour style/timeline.css gives a custom property (`--ji-prefill` …). */
const CSS = readFileSync(join(__dirname, '..', 'style', 'timeline.css'), 'utf8');
function fallback(prop: string): string {
  const m = new RegExp(`${prop}:\\s*var\\([^,]+,\\s*(#[0-9a-fA-F]{6})\\)`).exec(CSS);
  if (!m) {
    throw new Error(`no ${prop} in timeline.css`);
  }
  return m[1];
}
/** Which colour word a hex colour is: "grey", "orange" or "blue" (enough for these). */
function colourName(hex: string): string {
  const [r, g, b] = [1, 3, 5].map(i => parseInt(hex.slice(i, i + 2), 16) / 255);
  const max = Math.max(r, g, b);
  const min = Math.min(r, g, b);
  if (max - min < 0.1) {
    return 'grey';
  }
  const hue = max === r ? (60 * (g - b)) / (max - min) : max === g ? 60 * ((b - r) / (max - min) + 2) : 60 * ((r - g) / (max - min) + 4);
  const h = (hue + 360) % 360;
  return h >= 15 && h < 50 ? 'orange' : h >= 190 && h < 250 ? 'blue' : `hue ${Math.round(h)}`;
}

describe('the timeline legend names the colours the drawing uses', () => {
  it('calls prefill orange, waiting grey and decoding blue, as timeline.css draws them', () => {
    expect(colourName(fallback('--ji-prefill'))).toBe('orange');
    expect(legendText('prefill')).toBe(`${colourName(fallback('--ji-prefill'))} = prefill`);
    expect(legendText('waiting')).toMatch(new RegExp(`^${colourName(fallback('--ji-waiting'))} = `));
    for (const bin of [0, 1, 2, 3]) {
      expect(colourName(fallback(`--ji-size-${bin}`))).toBe('blue');
    }
    expect(legendText('decode')).toMatch(/^blue = decoding/);
    expect(legendText('queued')).toMatch(/^hatched .*= queued/);
    for (const kind of ['queued', 'waiting', 'prefill', 'decode', 'decode-unknown', 'parked'] as PartKind[]) {
      expect(legendText(kind)).not.toMatch(/\blight = prefill/);
    }
  });
});

describe('the time axis', () => {
  const burst: ITimelineState = {
    rows: [
      { id: 'a', queued_at: 990, admitted_at: 990.1, first_token_at: 990.4, finished_at: 996, outcome: 'ok', batch_ids: [1] },
      { id: 'b', queued_at: 992, admitted_at: 992.1, first_token_at: 992.3, outcome: 'running', batch_ids: [1] }
    ],
    batches: [{ id: 1, size: 2, started_at: 990.1, ended_at: null, steps: 40, tokens: 60 }],
    now: 1000
  };

  it('in the "last 60 s" window labels no negative seconds and nothing before the window starts', () => {
    for (const width of [320, 480, 900]) {
      for (const now of [1000, 1003.7, 1030, 1059.9]) {
        const layout = layoutTimeline({ ...burst, now }, { width, windowS: 60 });
        expect(layout.ticks.length).toBeGreaterThan(1);
        for (const tick of layout.ticks) {
          expect(tick.label).not.toMatch(/^[-−]/);
          expect(tick.x).toBeGreaterThanOrEqual(layout.plotLeft);
          expect(tick.x).toBeLessThanOrEqual(layout.plotRight + 0.5);
        }
        expect(layout.ticks[layout.ticks.length - 1].label).toBe('now');
        // The others say how long ago, e.g. "8 s ago", no more than the window shows.
        for (const tick of layout.ticks.slice(0, -1)) {
          const m = /^(\d+(?:\.\d+)?) (ms|s|min) ago$/.exec(tick.label);
          expect(m, tick.label).not.toBeNull();
          const s = Number(m![1]) * (m![2] === 'min' ? 60 : m![2] === 'ms' ? 0.001 : 1);
          expect(s).toBeLessThanOrEqual(layout.t1 - layout.t0 + 1e-6);
        }
      }
    }
  });

  it('labels a tick by seconds since the start, or in live mode by seconds before now', () => {
    expect(axisLabel(92, 100, 2, true)).toBe('8 s ago');
    expect(axisLabel(99.5, 100, 2, true)).toBe('now');
    expect(axisLabel(100 + 1e-12, 100, 2, true)).toBe('now');
    expect(axisLabel(40, 100, 60, true)).toBe('60 s ago');
    expect(axisLabel(-80, 100, 60, true)).toBe('3 min ago');
    expect(axisLabel(5, 0, 5, false)).toBe('5 s');
    expect(axisLabel(-1e-8, 0, 10, false)).toBe('0 s'); // a rounding error is no "-0 s"
  });

  it('outside live mode counts up from the start: 0 s first, never negative', () => {
    const layout = layoutTimeline(burst, { width: 600 });
    expect(layout.ticks[0].label).toBe('0 s');
    expect(layout.ticks.every(t => !/^[-−]/.test(t.label))).toBe(true);
  });
});
