import { describe, expect, it } from 'vitest';
import { LiveTimeline } from '../src/live';
import { layoutTimeline } from '../src/timeline/layout';

describe('LiveTimeline', () => {
  it('builds rows and batch spans from the server events, on the server clock', () => {
    let clock = 1000; // this page's clock; the server's runs 5 s ahead
    const live = new LiveTimeline(() => clock);
    live.seed({ batches: [], requests: [], running: [], waiting: [], mode: 'continuous', now: 1005 });
    const events = [
      { type: 'queued', id: 'r1', prompt_tokens: 7, at: 1005.0 },
      { type: 'queued', id: 'r2', prompt_tokens: 9, at: 1005.01 },
      { type: 'admitted', id: 'r1', batch_id: 1, at: 1005.02 },
      { type: 'admitted', id: 'r2', batch_id: 1, at: 1005.02 },
      { type: 'batch', state: 'open', id: 1, members: ['r1', 'r2'], size: 2, started_at: 1005.02, ended_at: null },
      { type: 'token', id: 'r1', index: 1, text: 'A' },
      { type: 'step', kind: 'prefill', members: ['r1', 'r2'], tokens: 2, batch_id: 1, started_at: 1005.02, ended_at: 1005.1 },
      { type: 'finished', id: 'r2', outcome: 'cancelled', completion_tokens: 3, at: 1005.3 },
      { type: 'batch', state: 'closed', id: 1, members: ['r1', 'r2'], size: 2, started_at: 1005.02, ended_at: 1005.3 },
      { type: 'batch', state: 'open', id: 2, members: ['r1'], size: 1, started_at: 1005.3, ended_at: null }
    ];
    for (const e of events) {
      live.apply(e);
    }
    clock = 1001;
    const state = live.state();
    expect(state.now).toBeCloseTo(1006);
    const [r1, r2] = state.rows;
    expect(r1).toMatchObject({ outcome: 'running', admitted_at: 1005.02, first_token_at: 1005.1, batch_ids: [1, 2] });
    expect(r2).toMatchObject({ outcome: 'cancelled', finished_at: 1005.3, tokens: 3 });
    expect(live.running).toBe(1);
    // Drawn: r1 runs to now in the open batch 2 (size 1).
    const layout = layoutTimeline(state, { width: 600, windowS: 30 });
    const last = layout.rows[0].parts[layout.rows[0].parts.length - 1];
    expect(last).toMatchObject({ kind: 'decode', batchId: 2, end: 1006 });
  });

  it('forgets what ended before the window, keeps what still runs', () => {
    let clock = 0;
    const live = new LiveTimeline(() => clock);
    live.apply({ type: 'queued', id: 'old', at: 0 });
    live.apply({ type: 'finished', id: 'old', outcome: 'ok', at: 1 });
    live.apply({ type: 'queued', id: 'slow', at: 0 });
    clock = 100;
    live.prune(30);
    expect([...live.rows.keys()]).toEqual(['slow']);
  });

  it('keeps the steps that fast-forwarded tokens and merges in what the events do not say', () => {
    const clock = 1000;
    const live = new LiveTimeline(() => clock);
    live.seed({ batches: [], requests: [], running: [], waiting: [], mode: 'continuous', now: 1000 });
    for (const e of [
      { type: 'queued', id: 'json', prompt_tokens: 1, at: 1000.0 },
      { type: 'queued', id: 'free', prompt_tokens: 3, at: 1000.0 },
      { type: 'admitted', id: 'json', batch_id: 1, at: 1000.01 },
      { type: 'admitted', id: 'free', batch_id: 1, at: 1000.01 },
      { type: 'batch', state: 'open', id: 1, members: ['json', 'free'], size: 2, started_at: 1000.01, ended_at: null, forced_tokens: 0 },
      { type: 'step', kind: 'prefill', members: ['json', 'free'], tokens: 7, forced: 5, batch_id: 1, started_at: 1000.01, ended_at: 1000.02 },
      { type: 'step', kind: 'decode', members: ['json', 'free'], tokens: 2, forced: 0, batch_id: 1, started_at: 1000.02, ended_at: 1000.03 }
    ]) {
      live.apply(e);
    }
    expect(live.steps).toEqual([{ batch_id: 1, at: 1000.02, tokens: 7, forced: 5 }]);
    expect(live.batches.get(1)!.forced_tokens).toBe(5); // counted while the batch is open
    // The events do not name a constraint: both rows want their record.
    expect(live.wanted).toBe(2);
    const record = (id: string, constraint: string | null, forced: number) => ({ id, constraint, forced_tokens: forced, queued_at: 1000 });
    live.merge({ batches: [], requests: [record('json', 'json_schema', 5), record('free', null, 0)], running: [], waiting: [], mode: 'continuous', now: 1000 });
    expect(live.rows.get('json')).toMatchObject({ constraint: 'json_schema', forced_tokens: 5 });
    expect(live.rows.get('free')!.constraint).toBeNull();
    expect(live.wanted).toBe(1); // the constrained row, still running: its count grows
    live.apply({ type: 'finished', id: 'json', outcome: 'ok', completion_tokens: 9, at: 1000.05 });
    live.apply({ type: 'finished', id: 'free', outcome: 'ok', completion_tokens: 4, at: 1000.05 });
    live.apply({ type: 'batch', state: 'closed', id: 1, members: ['json', 'free'], size: 2, started_at: 1000.01, ended_at: 1000.05, forced_tokens: 8 });
    expect(live.batches.get(1)!.forced_tokens).toBe(8); // the server's total
    expect(live.wanted).toBe(1); // its last count
    live.merge({ batches: [], requests: [record('json', 'json_schema', 8)], running: [], waiting: [], mode: 'continuous', now: 1000 });
    expect(live.rows.get('json')!.forced_tokens).toBe(8);
    expect(live.wanted).toBe(0);
    expect(live.state().steps).toHaveLength(1);
    // A server whose events carry them needs no records.
    live.apply({ type: 'queued', id: 'r', at: 1001, constraint: 'choice' });
    live.apply({ type: 'finished', id: 'r', outcome: 'ok', at: 1001.1, forced_tokens: 3 });
    expect(live.rows.get('r')).toMatchObject({ constraint: 'choice', forced_tokens: 3 });
    expect(live.wanted).toBe(0);
  });
});

describe('steps that kept guesses (speculative decoding)', () => {
  it('keeps them for their ticks and counts them in the open batch', () => {
    const live = new LiveTimeline(() => 1000);
    live.seed({ batches: [], requests: [], running: [], waiting: [], mode: 'continuous', now: 1000 });
    for (const e of [
      { type: 'queued', id: 'a', prompt_tokens: 40, at: 1000.0 },
      { type: 'admitted', id: 'a', batch_id: 1, at: 1000.01 },
      { type: 'batch', state: 'open', id: 1, members: ['a'], size: 1, started_at: 1000.01, ended_at: null },
      { type: 'step', kind: 'decode', members: ['a'], tokens: 5, forced: 0, drafted: 6, accepted: 4, batch_id: 1, started_at: 1000.02, ended_at: 1000.03 },
      { type: 'step', kind: 'decode', members: ['a'], tokens: 1, forced: 0, drafted: 3, accepted: 0, batch_id: 1, started_at: 1000.03, ended_at: 1000.04 },
      { type: 'step', kind: 'decode', members: ['a'], tokens: 1, forced: 0, batch_id: 1, started_at: 1000.04, ended_at: 1000.05 }
    ]) {
      live.apply(e);
    }
    // Only the step that emitted more than one token a row: the refused guesses made none.
    expect(live.steps).toEqual([{ batch_id: 1, at: 1000.03, tokens: 5, forced: 0, accepted: 4 }]);
    // Its steps and tokens count while it runs, so its tooltip's figures agree with each other.
    // Proposed counts the refused guesses too (6 + 3).
    expect(live.batches.get(1)).toMatchObject({ accepted_tokens: 4, draft_tokens: 9, steps: 3, tokens: 7 });
  });
});

describe('another user’s requests', () => {
  it('show as anonymous rows labelled "another user"', () => {
    const live = new LiveTimeline(() => 1000);
    live.apply({ type: 'queued', id: 'anon-0123456789ab', owner: 'another user', at: 999, prompt_tokens: 4 });
    live.apply({ type: 'queued', id: 'req-mine', owner: 'alice', at: 999.5, prompt_tokens: 4 });
    const [theirs, mine] = live.state().rows;
    expect(theirs.label).toBe('another user');
    expect(mine.label).toBe('req-mine');
  });
});

describe('a row parked for another user', () => {
  it('is drawn as parked while it sat out, not as an unrecorded batch', () => {
    const live = new LiveTimeline(() => 1010);
    live.seed({
      batches: [
        { id: 1, members: ['r'], size: 1, started_at: 1001, ended_at: 1003 },
        { id: 3, members: ['r'], size: 1, started_at: 1005, ended_at: null }
      ],
      requests: [{ id: 'r', queued_at: 1000, admitted_at: 1000.5, first_token_at: 1001, batch_ids: [1, 3], outcome: 'running' }],
      running: ['r'], waiting: [], mode: 'continuous', now: 1010
    });
    live.apply({ type: 'parked', id: 'r', owner: 'alice', at: 1003 });
    live.apply({ type: 'resumed', id: 'r', owner: 'alice', at: 1005 });
    const layout = layoutTimeline(live.state(), { width: 600, compress: false });
    const kinds = layout.rows[0].parts.map(p => p.kind);
    expect(kinds).toContain('parked');
    expect(kinds).not.toContain('decode-unknown');
    expect(layout.kinds.has('parked')).toBe(true);
  });
});
