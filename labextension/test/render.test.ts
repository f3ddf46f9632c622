// @vitest-environment happy-dom
import { afterEach, describe, expect, it, vi } from 'vitest';
import { TimelineView, contrast, luminance } from '../src/timeline/render';
import widget from '../src/timeline/widget';
import { ITimelineState } from '../src/timeline/types';
import { longHistory } from './fixtures';

const STATE: ITimelineState = {
  rows: [
    { id: 'req-a', label: 'What is a KV cache?', queued_at: 100, admitted_at: 100.05, first_token_at: 100.2, finished_at: 101, batch_ids: [1], outcome: 'ok', tokens: 12 },
    { id: 'req-b', queued_at: 100.1, admitted_at: 100.15, first_token_at: 100.3, batch_ids: [1], outcome: 'running', tokens: 5 }
  ],
  batches: [{ id: 1, size: 2, members: ['req-a', 'req-b'], started_at: 100.05, ended_at: null, steps: 10, tokens: 17 }],
  now: 101.5
};

afterEach(() => {
  document.body.replaceChildren();
});

function view(options = {}) {
  const host = document.createElement('div');
  document.body.appendChild(host);
  const v = new TimelineView(host, options);
  v.update(STATE);
  v.draw();
  return { host, v };
}

describe('TimelineView', () => {
  it('draws a row per request, the batch band and a legend that names the sizes', () => {
    const { host } = view();
    expect(host.querySelectorAll('g.ji-row')).toHaveLength(2);
    expect(host.querySelectorAll('rect.ji-band')).toHaveLength(1);
    expect(host.querySelector('.ji-row-label')!.textContent).toBe('What is a KV cache?');
    const legend = host.querySelector('.ji-legend')!.textContent!;
    expect(legend).toContain('colour = rows in the batch');
    expect(legend).toContain('2 requests · 1 batches');
  });

  it('gives each view its own pattern ids, so removing one keeps the others hatched', () => {
    const one = view();
    const two = view();
    const idOf = (host: HTMLElement) => host.querySelector('pattern')!.getAttribute('id')!;
    expect(idOf(one.host)).not.toBe(idOf(two.host));
    one.v.dispose();
    const fill = two.host.querySelector('rect.ji-queued')!.getAttribute('fill')!;
    expect(document.getElementById(fill.slice(5, -1))).not.toBeNull();
  });

  it('clicking a running row asks to cancel it; a finished row does nothing', () => {
    const onRowClick = vi.fn();
    const { host } = view({ onRowClick, clickable: (r: { outcome?: string | null }) => r.outcome === 'running' });
    const rows = host.querySelectorAll('g.ji-row');
    rows[0].querySelector('rect.ji-part')!.dispatchEvent(new MouseEvent('click', { bubbles: true }));
    expect(onRowClick).not.toHaveBeenCalled();
    rows[1].querySelector('rect.ji-part')!.dispatchEvent(new MouseEvent('click', { bubbles: true }));
    expect(onRowClick).toHaveBeenCalledWith(expect.objectContaining({ id: 'req-b' }));
    expect(rows[1].getAttribute('class')).toContain('ji-clickable');
  });

  it('hovering a row shows its id, timings and batch', () => {
    const { host } = view({ onRowClick: () => undefined, clickable: () => true, clickHint: 'click to cancel' });
    const part = host.querySelectorAll('g.ji-row')[0].querySelector('rect.ji-part')!;
    part.dispatchEvent(new MouseEvent('mousemove', { bubbles: true, clientX: 300, clientY: 60 }));
    const tip = host.querySelector('.ji-tl-tip') as HTMLElement;
    expect(tip.hidden).toBe(false);
    expect(tip.textContent).toContain('req-a · ok · 12 tokens out');
    expect(tip.textContent).toContain('queued 50 ms');
    expect(tip.textContent).toContain('TTFT 200 ms');
    expect(tip.textContent).toContain('batches #1 ×2');
  });

  it('says so when there is nothing to draw', () => {
    const host = document.createElement('div');
    const v = new TimelineView(host, { emptyText: 'Nothing yet.' });
    v.update({ rows: [], batches: [] });
    v.draw();
    expect((host.querySelector('.ji-tl-body') as HTMLElement).dataset.empty).toBe('Nothing yet.');
  });

  it('draws the long history with its idle gaps cut', () => {
    const host = document.createElement('div');
    const v = new TimelineView(host);
    v.update(longHistory());
    v.draw();
    expect(host.querySelectorAll('g.ji-row')).toHaveLength(63);
    expect(host.querySelectorAll('.ji-tl-head g.ji-cut')).toHaveLength(6);
    expect(host.querySelector('.ji-legend-summary')!.textContent).toMatch(/idle cut/);
  });
});

describe('constraint and fast-forward marks', () => {
  const constrained: ITimelineState = {
    rows: [
      STATE.rows[0],
      { id: 'req-j', label: 'Answer in JSON', queued_at: 100.2, admitted_at: 100.25, first_token_at: 100.3, finished_at: 100.5, batch_ids: [1], outcome: 'ok', tokens: 9, constraint: 'json_schema', forced_tokens: 8 }
    ],
    batches: [{ ...STATE.batches[0], forced_tokens: 8 }],
    steps: [{ batch_id: 1, at: 100.3, tokens: 2, forced: 8 }],
    now: 101.5
  };

  it('badges and outlines a constrained row, ticks its forced steps, keys both in the legend', () => {
    const host = document.createElement('div');
    document.body.appendChild(host);
    const v = new TimelineView(host);
    v.update(constrained);
    v.draw();
    const rows = host.querySelectorAll('g.ji-row');
    expect(rows[0].querySelector('.ji-constraint-badge')).toBeNull();
    const row = host.querySelector('g.ji-row[data-constraint="json_schema"]')!;
    expect(row.getAttribute('class')).toContain('ji-constrained');
    expect(row.getAttribute('aria-label')).toBe('Answer in JSON: ok, JSON schema');
    expect(row.querySelector('.ji-constraint-badge text')!.textContent).toBe('{}');
    expect(row.querySelectorAll('rect.ji-constraint-outline')).toHaveLength(1);
    expect(host.querySelectorAll('.ji-tl-head .ji-ff-tick')).toHaveLength(1);
    expect(host.querySelector('.ji-tl-head rect.ji-band')!.getAttribute('class')).toContain('ji-ff-band');
    const legend = host.querySelector('.ji-legend')!.textContent!;
    expect(legend).toContain('constrained: JSON schema');
    expect(legend).toContain('fast-forwarded');
    // Hover: the row says its kind and share, the tick its count.
    row.querySelector('rect.ji-part')!.dispatchEvent(new MouseEvent('mousemove', { bubbles: true, clientX: 300, clientY: 60 }));
    const tip = host.querySelector('.ji-tl-tip') as HTMLElement;
    expect(tip.textContent).toContain('constrained: JSON schema · 8 of 9 tokens fast-forwarded');
    host.querySelector('.ji-tl-head .ji-ff-tick')!.dispatchEvent(new MouseEvent('mousemove', { bubbles: true, clientX: 300, clientY: 20 }));
    expect(tip.textContent).toBe('a step fast-forwarded 8 tokens (forced by a grammar, not sampled)');
  });

  it('draws a step that kept guesses as a hollow tick, keyed in the legend', () => {
    const host = document.createElement('div');
    document.body.appendChild(host);
    const v = new TimelineView(host);
    v.update({
      ...STATE,
      batches: [{ ...STATE.batches[0], draft_tokens: 9, accepted_tokens: 6 }],
      steps: [{ batch_id: 1, at: 100.3, tokens: 7, forced: 0, accepted: 6 }],
      now: 101.5
    });
    v.draw();
    const ticks = host.querySelectorAll('.ji-tl-head .ji-guess-tick');
    expect(ticks).toHaveLength(1);
    expect(ticks[0].getAttribute('aria-label')).toBe('a step kept 6 tokens from guesses the model accepted (speculative decoding)');
    const legend = host.querySelector('.ji-legend')!.textContent!;
    expect(legend).toContain('guessed: steps that kept accepted guesses');
    expect(legend).not.toContain('fast-forwarded');
    expect(host.querySelector('.ji-guess-chip')!.textContent).toBe('\u25b3'); // the key is the mark's shape
  });

  it('keeps a band its tooltip over its whole height and draws solid ticks over hollow ones', () => {
    const host = document.createElement('div');
    document.body.appendChild(host);
    const v = new TimelineView(host);
    v.update({
      ...STATE,
      steps: [
        { batch_id: 1, at: 100.3, tokens: 3, forced: 2 },
        { batch_id: 1, at: 100.6, tokens: 7, forced: 0, accepted: 6 }
      ],
      now: 101.5
    });
    v.draw();
    const band = host.querySelector('.ji-tl-head rect.ji-band')!;
    const bandBottom = Number(band.getAttribute('y')) + Number(band.getAttribute('height'));
    for (const hit of host.querySelectorAll('.ji-tl-head rect[data-tick]')) {
      expect(Number(hit.getAttribute('y'))).toBeGreaterThanOrEqual(bandBottom - 2); // below the band, not over it
    }
    const marks = [...host.querySelectorAll('.ji-tl-head polygon.ji-ff-tick')];
    expect(marks.map(m => m.classList.contains('ji-guess-tick'))).toEqual([true, false]); // the solid one last: on top
  });

  it('leaves a run without constraints as it was', () => {
    const { host } = view();
    expect(host.querySelectorAll('.ji-constraint-badge, .ji-constraint-outline, .ji-ff-tick')).toHaveLength(0);
    expect(host.querySelector('.ji-legend')!.textContent).not.toContain('constrained');
  });
});

describe('the anywidget view', () => {
  it('draws the model, redraws on change, and cleans up', () => {
    const handlers = new Map<string, () => void>();
    const state: Record<string, unknown> = { requests: STATE.rows, batches: STATE.batches, now: null, title: 'burst' };
    const model = {
      get: (k: string) => state[k],
      on: (e: string, f: () => void) => handlers.set(e, f),
      off: (e: string) => handlers.delete(e)
    };
    const el = document.createElement('div');
    const cleanup = widget.render({ model, el });
    // The first draw is scheduled for the next frame; force frames synchronously here.
    return new Promise<void>(resolve =>
      requestAnimationFrame(() => {
        expect(el.querySelector('.ji-title')!.textContent).toBe('burst');
        expect(el.querySelectorAll('g.ji-row')).toHaveLength(2);
        state.requests = STATE.rows.slice(0, 1);
        handlers.get('change:requests')!();
        requestAnimationFrame(() => {
          expect(el.querySelectorAll('g.ji-row')).toHaveLength(1);
          cleanup();
          expect(handlers.size).toBe(0);
          expect(el.querySelector('.ji-timeline')).toBeNull();
          resolve();
        });
      })
    );
  });
});

describe('contrast-aware ink', () => {
  it('reads colours and compares them', () => {
    expect(luminance('#ffffff')).toBeCloseTo(1);
    expect(luminance('rgb(0, 0, 0)')).toBe(0);
    expect(luminance('not a colour')).toBeNull();
    expect(contrast(luminance('#bbdefb')!, luminance('#000000')!)).toBeGreaterThan(
      contrast(luminance('#bbdefb')!, luminance('#ffffff')!)
    );
  });
});
