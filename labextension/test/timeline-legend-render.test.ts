// @vitest-environment happy-dom
import { afterEach, describe, expect, it } from 'vitest';
import { TimelineView } from '../src/timeline/render';

afterEach(() => {
  document.body.replaceChildren();
});

describe('the drawn timeline', () => {
  it('keys prefill as orange, as its bars are drawn, and labels the live axis in seconds ago', () => {
    const host = document.createElement('div');
    document.body.appendChild(host);
    const view = new TimelineView(host, { windowS: () => 60 });
    view.update({
      rows: [{ id: 'a', queued_at: 990, admitted_at: 990.1, first_token_at: 990.4, outcome: 'running', batch_ids: [1] }],
      batches: [{ id: 1, size: 1, started_at: 990.4, ended_at: null, steps: 9, tokens: 9 }],
      now: 1000
    });
    view.draw();
    const legend = host.querySelector('.ji-legend')!.textContent!;
    expect(legend).toContain('orange = prefill');
    expect(legend).toContain('blue = decoding');
    expect(legend).not.toMatch(/light = prefill/);
    expect(host.querySelector('rect.ji-prefill')).not.toBeNull(); // drawn with --ji-prefill: orange
    const labels = [...host.querySelectorAll('.ji-axis text')].map(t => t.textContent!);
    expect(labels[labels.length - 1]).toBe('now');
    expect(labels.some(l => /^[-−]/.test(l))).toBe(false);
    expect(labels.slice(0, -1).every(l => l.endsWith(' ago'))).toBe(true);
  });
});
