import { describe, expect, it } from 'vitest';
import { IMetrics, IStatus } from '../src/api';
import { InferenceModel } from '../src/model';

const READY = { state: 'ready' } as unknown as IStatus;

function metrics(running: number, queued: number, rate: number): IMetrics {
  return {
    requests: { ok: 12, failed: 0, cancelled: 0, rejected: 0, queued, running },
    queue_depth: queued,
    recent_tokens_per_s: rate,
    tokens_per_s: 40
  } as unknown as IMetrics;
}

function summary(m: IMetrics, status: IStatus = READY): string {
  const model = new InferenceModel({} as never);
  model.connection = 'connected';
  model.status = status;
  model.metrics = m;
  return model.summary;
}

describe('the status bar item', () => {
  it('says idle, with no stale tokens/s, when nothing runs or waits', () => {
    // The server's recent rate still counts the last burst's tokens for a while after it ended.
    const line = summary(metrics(0, 0, 47.3));
    expect(line).toBe('infer: ready · idle');
    expect(line).not.toMatch(/tok\/s/);
  });

  it('shows no rate while requests only wait in the queue', () => {
    expect(summary(metrics(0, 3, 47.3))).toBe('infer: ready · 3 queued');
    const parked = metrics(0, 0, 47.3);
    parked.requests.parked = 2;
    expect(summary(parked)).toBe('infer: ready · 2 parked');
  });

  it('shows the running and queued counts and the rate while generating', () => {
    expect(summary(metrics(3, 0, 41.4))).toBe('infer: ready · 3 running · 41 tok/s');
    expect(summary(metrics(2, 5, 80))).toBe('infer: ready · 2 running · 5 queued · 80 tok/s');
  });

  it('names the simulated engine, whose fluent answers come from no model', () => {
    const simulated = { state: 'ready', engine: 'simulated' } as unknown as IStatus;
    expect(summary(metrics(0, 0, 0), simulated)).toBe('infer: ready (simulated engine) · idle');
  });
});
