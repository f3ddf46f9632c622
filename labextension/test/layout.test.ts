import { describe, expect, it } from 'vitest';
import { describeBatch, describeRow, describeStepTick, formatTick, layoutTimeline, sizeBins, truncate } from '../src/timeline/layout';
import { longHistory } from './fixtures';

const W = 800;

describe('layoutTimeline', () => {
  it('extends running rows and open batches to now', () => {
    const now = 110;
    const layout = layoutTimeline(
      {
        rows: [
          { id: 'a', queued_at: 100, admitted_at: 100.04, first_token_at: 100.3, batch_ids: [1], outcome: 'running' },
          { id: 'b', queued_at: 100, admitted_at: 100.04, first_token_at: 100.3, finished_at: 102, batch_ids: [1], outcome: 'ok' }
        ],
        batches: [{ id: 1, size: 2, started_at: 100.04, ended_at: null }],
        now
      },
      { width: W, compress: false }
    );
    const [a, b] = layout.rows;
    const last = (r: typeof a) => r.parts[r.parts.length - 1];
    expect(last(a).end).toBe(now);
    expect(last(a).x + last(a).w).toBeCloseTo(layout.x(now), 5);
    expect(last(b).end).toBe(102);
    expect(layout.bands[0].x + layout.bands[0].w).toBeCloseTo(layout.x(now), 5);
  });

  it('shows the queue time the server recorded, not the time to the first token', () => {
    const layout = layoutTimeline(
      { rows: [{ id: 'a', queued_at: 100, admitted_at: 100.04, first_token_at: 100.84, finished_at: 101, outcome: 'ok' }], batches: [] },
      { width: W }
    );
    const queued = layout.rows[0].parts.filter(p => p.kind === 'queued');
    expect(queued).toHaveLength(1);
    expect((queued[0].end - queued[0].start) * 1000).toBeCloseTo(40, 5);
    expect(layout.rows[0].parts.find(p => p.kind === 'prefill')!.end).toBe(100.84);
  });

  it('does not call time queued when the server has not said (client-side facts only)', () => {
    const layout = layoutTimeline(
      { rows: [{ id: 'a', queued_at: 100, first_token_at: 100.8, outcome: 'running' }], batches: [], now: 101 },
      { width: W }
    );
    const kinds = layout.rows[0].parts.map(p => p.kind);
    expect(kinds).not.toContain('queued');
    expect(kinds[0]).toBe('waiting');
    expect(kinds[kinds.length - 1]).toBe('decode-unknown'); // up to now, batch not recorded yet
  });

  it('colours decoding by the size of each batch span the row was in', () => {
    const layout = layoutTimeline(
      {
        rows: [{ id: 'a', queued_at: 0, admitted_at: 0, first_token_at: 0.1, finished_at: 3, batch_ids: [1, 2], outcome: 'ok' }],
        batches: [
          { id: 1, size: 1, started_at: 0, ended_at: 1 },
          { id: 2, size: 16, started_at: 1, ended_at: 3 }
        ]
      },
      { width: W, maxBatchSize: 16 }
    );
    const decode = layout.rows[0].parts.filter(p => p.kind === 'decode');
    expect(decode.map(p => p.batchId)).toEqual([1, 2]);
    expect(decode[0].bin).toBe(0);
    expect(decode[1].bin).toBe(layout.bins.length - 1);
  });

  it('makes a long history readable: idle gaps cut, every burst wide, ticks apart', () => {
    const history = longHistory(); // 63 rows over ~134 s, 7 bursts of ~2 s
    const layout = layoutTimeline(history, { width: W });
    expect(layout.rows).toHaveLength(63);
    expect(layout.cuts).toHaveLength(6);
    expect(layout.cutS).toBeGreaterThan(100);
    // Without the cuts a 2 s burst would get ~2/134 of the plot (~11 px); with them, ~1/7.
    for (const band of layout.bands) {
      expect(band.w).toBeGreaterThan(60);
      expect(band.label).toBe(`#${band.batch.id} ×9`);
    }
    const xs = layout.ticks.map(t => t.x);
    for (let i = 1; i < xs.length; i++) {
      expect(xs[i] - xs[i - 1]).toBeGreaterThanOrEqual(40);
    }
    // Times after a cut keep their real offsets.
    const lastBurst = layout.rows[62];
    expect(layout.x(lastBurst.row.queued_at as number)).toBeGreaterThan(layout.plotLeft + 0.8 * (layout.plotRight - layout.plotLeft));
  });

  it('truncates labels with an ellipsis and keeps the full text', () => {
    const layout = layoutTimeline(longHistory(1, 1), { width: 400 });
    const row = layout.rows[0];
    expect(row.label.endsWith('…')).toBe(true);
    expect(row.label.length).toBeLessThan(row.fullLabel.length);
    expect(row.fullLabel).toBe('#1 Explain how a transformer attends to earlier tokens');
    expect(truncate('short', 10)).toBe('short');
    expect(truncate('What is dynamic batching in LLM serving', 16)).toBe('What is dynamic…');
  });

  it('in live mode shows the last N seconds, scrolling, and drops what ended before', () => {
    const layout = layoutTimeline(
      {
        rows: [
          { id: 'old', queued_at: 10, admitted_at: 10, first_token_at: 10.1, finished_at: 11, outcome: 'ok' },
          { id: 'new', queued_at: 95, admitted_at: 95, first_token_at: 95.1, outcome: 'running' }
        ],
        batches: [],
        now: 100
      },
      { width: W, windowS: 30 }
    );
    expect(layout.live).toBe(true);
    expect(layout.t1).toBe(100);
    expect(layout.t0).toBeCloseTo(100 - 5 * 1.08); // 5 s of history, drawn wide, not 30 s
    expect(layout.rows.map(r => r.row.id)).toEqual(['new']);
    expect(layout.ticks[layout.ticks.length - 1].label).toBe('now');
    expect(layout.cuts).toHaveLength(0);
    const later = layoutTimeline(
      { rows: [{ id: 'r', queued_at: 40, admitted_at: 40, first_token_at: 41, outcome: 'running' }], batches: [], now: 100 },
      { width: W, windowS: 30 }
    );
    expect(later.t0).toBe(70); // a long history: the last 30 s, scrolling
  });

  it('marks cancelled and failed rows', () => {
    const layout = layoutTimeline(
      {
        rows: [
          { id: 'c', queued_at: 0, admitted_at: 0, first_token_at: 0.1, finished_at: 0.5, outcome: 'cancelled' },
          { id: 'f', queued_at: 0, admitted_at: 0, finished_at: 0.2, outcome: 'failed' }
        ],
        batches: []
      },
      { width: W }
    );
    expect(layout.rows.map(r => r.marker?.kind)).toEqual(['cancelled', 'failed']);
  });
});

describe('constrained rows and fast-forwarded tokens', () => {
  const state = {
    rows: [
      { id: 'free', label: 'What is a KV cache and why does it matter?', queued_at: 0, admitted_at: 0, first_token_at: 0.1, finished_at: 1, batch_ids: [1], outcome: 'ok', tokens: 20, constraint: null },
      { id: 'json', label: 'What is a KV cache and why does it matter?', queued_at: 0, admitted_at: 0, first_token_at: 0.1, finished_at: 0.6, batch_ids: [1], outcome: 'ok', tokens: 9, constraint: 'json_schema', forced_tokens: 8 },
      { id: 'tool', queued_at: 0.2, admitted_at: 0.2, first_token_at: 0.3, batch_ids: [1], outcome: 'running', tokens: 4, constraint: 'tools', forced_tokens: 2 }
    ],
    batches: [{ id: 1, size: 3, started_at: 0, ended_at: null, steps: 12, tokens: 33, forced_tokens: 10 }],
    steps: [
      { batch_id: 1, at: 0.1, tokens: 3, forced: 6 },
      { batch_id: 1, at: 0.1004, tokens: 3, forced: 2 }, // a pixel from the one before: one tick
      { batch_id: 1, at: 0.5, tokens: 3, forced: 2 },
      { batch_id: 1, at: 0.7, tokens: 3, forced: 0 }
    ],
    now: 1.2
  };

  it('gives a constrained row a badge with its kind and outlines its bar', () => {
    const layout = layoutTimeline(state, { width: W, compress: false });
    const [free, json, tool] = layout.rows;
    expect(free.constraint).toBeNull();
    expect(json.constraint).toMatchObject({ kind: 'json_schema', name: 'JSON schema', badge: '{}' });
    expect(tool.constraint).toMatchObject({ name: 'tool calls' });
    // The badge ends the label column; the label gives up that room.
    expect(json.constraint!.x + 18).toBeLessThanOrEqual(layout.plotLeft);
    expect(json.label.length).toBeLessThan(free.label.length);
    // One outline round the whole bar, from its first part to its last.
    const first = json.parts[0];
    const last = json.parts[json.parts.length - 1];
    expect(json.constraint!.outline).toHaveLength(1);
    expect(json.constraint!.outline[0].x).toBeCloseTo(first.x);
    expect(json.constraint!.outline[0].w).toBeCloseTo(last.x + last.w - first.x);
    expect([...layout.constraints].sort()).toEqual(['json_schema', 'tools']);
    expect(layout.fastForwarded).toBe(true);
  });

  it('ticks the steps that fast-forwarded tokens and counts them in the band label', () => {
    const layout = layoutTimeline(state, { width: W, compress: false });
    expect(layout.stepTicks.map(t => [t.forced, t.steps])).toEqual([
      [8, 2],
      [2, 1]
    ]);
    expect(layout.stepTicks[0].x).toBeCloseTo(layout.x(0.1), 0);
    expect(layout.bands[0].forced).toBe(10);
    expect(layout.bands[0].label).toBe('#1 ×3 »10');
    // A narrow band keeps the count before the id.
    const narrow = layoutTimeline(
      {
        rows: [],
        batches: [
          { id: 123, size: 3, started_at: 0, ended_at: 0.17, forced_tokens: 10 },
          { id: 124, size: 1, started_at: 0.17, ended_at: 2 }
        ]
      },
      { width: W, compress: false }
    );
    expect(narrow.bands.map(b => b.label)).toEqual(['×3 »10', '#124 ×1']);
  });

  it('says the kind and "N of M tokens fast-forwarded" on hover', () => {
    const batches = new Map([[1, state.batches[0]]]);
    expect(describeRow(state.rows[1], batches, null)).toContain('constrained: JSON schema · 8 of 9 tokens fast-forwarded');
    expect(describeRow(state.rows[2], batches, 1.2)).toContain('constrained: tool calls · 2 of 4 tokens fast-forwarded so far');
    expect(describeRow(state.rows[0], batches, null).join(' ')).not.toContain('constrained');
    expect(describeRow({ id: 'x', constraint: 'regex' }, batches, null)).toContain('constrained: regex');
    expect(describeBatch(state.batches[0], 1.2)).toContain('33 tokens, 10 fast-forwarded');
  });

  it('says how many of a batch’s tokens came from accepted guesses (speculative decoding)', () => {
    const batch = { id: 7, size: 1, started_at: 1, ended_at: 2, steps: 10, tokens: 24, draft_tokens: 20, accepted_tokens: 14 };
    expect(describeBatch(batch, 2)).toContain('24 tokens, 14 from guesses the model accepted (of 20 proposed)');
    expect(describeBatch({ ...batch, draft_tokens: 0, accepted_tokens: 0 }, 2)).not.toContain('guesses');
  });

  it('ticks the steps that kept guesses apart from the fast-forwarded ones', () => {
    const guessing = {
      ...state,
      rows: [state.rows[0]],
      batches: [{ id: 1, size: 1, started_at: 0, ended_at: null, steps: 12, tokens: 33, draft_tokens: 30, accepted_tokens: 21 }],
      steps: [
        { batch_id: 1, at: 0.2, tokens: 5, forced: 0, accepted: 4 },
        { batch_id: 1, at: 0.2003, tokens: 3, forced: 0, accepted: 2 }, // one tick with the one before
        { batch_id: 1, at: 0.6, tokens: 8, forced: 0, accepted: 7 }
      ]
    };
    const layout = layoutTimeline(guessing, { width: W, compress: false });
    expect(layout.stepTicks.map(t => [t.forced, t.accepted, t.steps])).toEqual([
      [0, 6, 2],
      [0, 7, 1]
    ]);
    expect(layout.guessed).toBe(true);
    // Nearly every step keeps guesses: ticks a few pixels apart merge instead of overlapping.
    const dense = layoutTimeline(
      { ...guessing, steps: Array.from({ length: 40 }, (_, i) => ({ batch_id: 1, at: 0.2 + i * 0.004, tokens: 3, forced: 0, accepted: 2 })) },
      { width: W, compress: false }
    );
    const xs = dense.stepTicks.map(t => t.x);
    expect(xs.slice(1).every((x, i) => x - xs[i] >= 6)).toBe(true);
    expect(dense.stepTicks.reduce((n, t) => n + t.accepted, 0)).toBe(80);
    expect(layout.fastForwarded).toBe(false); // nothing here was forced by a grammar
    expect(describeStepTick(layout.stepTicks[0])).toBe(
      '2 steps kept 6 tokens from guesses the model accepted (speculative decoding)'
    );
    expect(describeStepTick({ x: 0, forced: 2, accepted: 3, steps: 1 })).toBe(
      'a step fast-forwarded 2 tokens (forced by a grammar, not sampled) and kept 3 tokens from guesses the model accepted (speculative decoding)'
    );
  });

  it('draws nothing extra for free rows', () => {
    const layout = layoutTimeline(longHistory(), { width: W });
    expect(layout.rows.every(r => r.constraint === null)).toBe(true);
    expect(layout.stepTicks).toEqual([]);
    expect(layout.fastForwarded).toBe(false);
    expect(layout.bands.every(b => !b.label?.includes('»'))).toBe(true);
  });
});

describe('sizeBins', () => {
  it('covers 1..max without overlap, exact sizes when few', () => {
    expect(sizeBins(3).map(b => b.label)).toEqual(['1', '2', '3']);
    for (const max of [5, 8, 16, 32, 64]) {
      const bins = sizeBins(max);
      expect(bins[0].min).toBe(1);
      expect(bins[bins.length - 1].max).toBe(max);
      for (let i = 1; i < bins.length; i++) {
        expect(bins[i].min).toBe(bins[i - 1].max + 1);
      }
    }
    expect(sizeBins(16).map(b => b.label)).toEqual(['1', '2–3', '4–6', '7–16']);
  });
});

describe('formatTick', () => {
  it('uses the digits the step needs', () => {
    expect(formatTick(-5, 5)).toBe('-5 s');
    expect(formatTick(1.5, 0.5)).toBe('1.5 s');
    expect(formatTick(0.25, 0.05)).toBe('250 ms');
    expect(formatTick(0, 1)).toBe('0 s');
    expect(formatTick(180, 60)).toBe('3 min');
  });
});
