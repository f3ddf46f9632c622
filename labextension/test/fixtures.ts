import { ITimelineBatch, ITimelineRow } from '../src/timeline/types';

/** A long history like the issue's: `bursts` bursts of `perBurst` requests, `gapS` apart,
 * each burst one window batch of all its requests. */
export function longHistory(bursts = 7, perBurst = 9, gapS = 22, t0 = 1000) {
  const rows: ITimelineRow[] = [];
  const batches: ITimelineBatch[] = [];
  for (let k = 0; k < bursts; k++) {
    const start = t0 + k * gapS;
    const members: string[] = [];
    for (let i = 0; i < perBurst; i++) {
      const id = `req-${k}${i}abcdef01`;
      members.push(id);
      rows.push({
        id,
        label: `#${k * perBurst + i + 1} Explain how a transformer attends to earlier tokens`,
        queued_at: start + i * 0.01,
        admitted_at: start + 0.1,
        first_token_at: start + 0.3,
        finished_at: start + 1.5 + i * 0.05,
        batch_ids: [k + 1],
        outcome: 'ok',
        tokens: 32
      });
    }
    batches.push({ id: k + 1, size: perBurst, members, started_at: start + 0.1, ended_at: start + 1.5 + perBurst * 0.05, steps: 32, tokens: 288 });
  }
  return { rows, batches, now: null };
}
