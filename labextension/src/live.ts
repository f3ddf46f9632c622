// The server-wide live timeline: request rows and batch spans kept up to date from the
// `infer/events` stream, seeded from `infer/batches`, on the server's clock.
//
// Event shapes (jupyter_infer/scheduler/recorder.py, `Recorder._emit`; behind a router every
// event also names its `route`): ready {engine, model, mode}, queued {id, priority,
// prompt_tokens, at, owner}, admitted {id, batch_id, at, owner}, token {id, index, text}, finished {id,
// outcome, finish_reason, completion_tokens, at, error}, batch {state: open|closed, and the
// batch record: id, mode, members, size, started_at, ended_at, steps, prefill_steps, tokens,
// prompt_tokens, forced_tokens, source}, step {step_id, kind, chunk, members, tokens, forced,
// batch_id, started_at, ended_at}, parked {id, owner, at} and resumed {id, owner, at} (fair
// share: it sat out for another user's request). shutdown {} comes from the server extension as it stops
// (server/app.py).
//
// A request's constraint and its forced tokens are in its record (`infer/batches`), not in
// these events (a `constraint` on queued or a `forced_tokens` on finished is taken if a server
// sends one): the rows that lack them are `wanted`, and the model merges their records in.

import type { IBatchesAnswer } from './api';
import { isLive } from './timeline/layout';
import { ITimelineBatch, ITimelineRow, ITimelineState, ITimelineStep } from './timeline/types';

/** On a shared server another user's request shows as an anonymous row: an opaque id that no
 * route accepts (jupyter_infer/server/viewer.py), no prompt, no text. */
export const ANONYMOUS_LABEL = 'another user';

export function isAnonymous(id: string): boolean {
  return id.startsWith('anon-');
}

/** One `infer/events` event: its `type` and the fields listed above. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type ServerEvent = { type: string } & Record<string, any>;

const MAX_ROWS = 400;
const MAX_STEPS = 2000;

export class LiveTimeline {
  readonly rows = new Map<string, ITimelineRow>();
  readonly batches = new Map<number, ITimelineBatch>();
  /** Steps that fast-forwarded tokens, oldest first. */
  readonly steps: ITimelineStep[] = [];
  /** Labels for requests this page knows more about (its own prompts). */
  readonly labels = new Map<string, string>();
  /** Server clock minus this page's clock, in seconds. */
  offset = 0;
  /** Rows whose record should be merged in: constraint not known yet, or constrained and
   * still running (its forced count grows), or ended with its last count not known. */
  private _wanted = new Set<string>();

  constructor(private _clock: () => number = () => Date.now() / 1000) {}

  /** Now, on the server's clock (epoch s). */
  now(): number {
    return this._clock() + this.offset;
  }

  clear(): void {
    this.rows.clear();
    this.batches.clear();
    this.steps.length = 0;
    this._wanted.clear();
  }

  /** Start over from an `infer/batches` answer (at connect and after a reconnect). */
  seed(answer: IBatchesAnswer): void {
    this.clear();
    if (typeof answer.now === 'number') {
      this.offset = answer.now - this._clock();
    }
    for (const b of answer.batches || []) {
      this.batches.set(b.id, { ...b });
    }
    for (const r of answer.requests || []) {
      this.rows.set(r.id, {
        id: r.id,
        queued_at: r.queued_at ?? null,
        admitted_at: r.admitted_at ?? null,
        first_token_at: r.first_token_at ?? null,
        finished_at: r.finished_at ?? null,
        batch_ids: [...(r.batch_ids || [])],
        outcome: r.outcome ?? null,
        tokens: r.completion_tokens ?? r.tokens ?? 0,
        prompt_tokens: r.prompt_tokens ?? null,
        constraint: r.constraint ?? null,
        forced_tokens: r.forced_tokens ?? 0,
        parked_at: [...(r.parked_at || [])],
        resumed_at: [...(r.resumed_at || [])]
      });
      this._want(this.rows.get(r.id)!);
    }
  }

  /** How many rows want their record merged in (`merge`); 0: none. */
  get wanted(): number {
    return this._wanted.size;
  }

  /** How many of the newest request records to ask `infer/batches` for, to cover them. */
  recordsToAsk(): number {
    return Math.min(MAX_ROWS, this._wanted.size + this.running + this.queued + 8);
  }

  /** Take what the events do not say from an `infer/batches` answer: each known row's
   * constraint and forced tokens. An ended row its answer does not hold is not asked again. */
  merge(answer: IBatchesAnswer): void {
    const seen = new Set<string>();
    for (const r of answer.requests || []) {
      const row = this.rows.get(r.id);
      if (!row) {
        continue;
      }
      seen.add(r.id);
      row.constraint = r.constraint ?? null;
      if (typeof r.forced_tokens === 'number') {
        row.forced_tokens = r.forced_tokens;
      }
    }
    for (const id of [...this._wanted]) {
      const row = this.rows.get(id);
      if (!row || (!seen.has(id) && !isLive(row))) {
        this._wanted.delete(id);
      } else if (seen.has(id)) {
        this._wanted.delete(id);
        this._want(row);
      }
    }
  }

  /** Apply one live event; returns whether anything the timeline draws changed. */
  apply(event: ServerEvent): boolean {
    const row = typeof event.id === 'string' ? this.rows.get(event.id) : undefined;
    switch (event.type) {
      case 'queued':
        if (typeof event.prompt === 'string' && !this.labels.has(event.id)) {
          this.labels.set(event.id, event.prompt); // a server that shares the prompt's start
        }
        this.rows.set(event.id, {
          id: event.id,
          queued_at: event.at,
          batch_ids: [],
          outcome: 'queued',
          tokens: 0,
          prompt_tokens: event.prompt_tokens ?? null,
          ...('constraint' in event ? { constraint: event.constraint ?? null, forced_tokens: 0 } : {})
        });
        this._want(this.rows.get(event.id)!);
        this._cap();
        return true;
      case 'admitted':
        if (!row) {
          return false;
        }
        row.admitted_at = event.at;
        row.outcome = 'running';
        this._join(row, event.batch_id);
        return true;
      case 'batch': {
        const { state: _state, type: _type, ...batch } = event;
        this.batches.set(batch.id, { ...this.batches.get(batch.id), ...(batch as ITimelineBatch) });
        for (const member of (batch.members as string[]) || []) {
          const r = this.rows.get(member);
          if (r) {
            this._join(r, batch.id);
          }
        }
        return true;
      }
      case 'step':
        // A row's first token comes with the first step it takes part in (its prefill).
        for (const member of (event.members as string[]) || []) {
          const r = this.rows.get(member);
          if (r && r.first_token_at == null && r.admitted_at != null && event.tokens > 0) {
            r.first_token_at = event.ended_at;
          }
        }
        this._countStep(event);
        this._multiTokenStep(event);
        return true;
      case 'token':
        if (row && typeof event.index === 'number') {
          row.tokens = Math.max(row.tokens ?? 0, event.index);
        }
        return false;
      case 'parked':
      case 'resumed': {
        if (!row || typeof event.at !== 'number') {
          return false;
        }
        const key = event.type === 'parked' ? 'parked_at' : 'resumed_at';
        (row[key] ??= []).push(event.at);
        return true;
      }
      case 'finished':
        if (!row) {
          return false;
        }
        row.finished_at = event.at;
        row.outcome = event.outcome;
        row.tokens = event.completion_tokens ?? row.tokens;
        if (typeof event.forced_tokens === 'number') {
          row.forced_tokens = event.forced_tokens;
          this._wanted.delete(row.id);
        } else if (row.constraint !== null) {
          this._wanted.add(row.id); // its last forced count (or its constraint) is in its record
        }
        return true;
      default:
        return false;
    }
  }

  /** Forget what ended before the window (plus a margin); keep whatever still runs. */
  prune(windowS: number): void {
    const horizon = this.now() - windowS - 5;
    for (const [id, r] of this.rows) {
      if (!isLive(r) && (r.finished_at ?? r.queued_at ?? 0) < horizon) {
        this.rows.delete(id);
        this.labels.delete(id);
        this._wanted.delete(id);
      }
    }
    const old = this.steps.findIndex(s => s.at >= horizon);
    this.steps.splice(0, old < 0 ? this.steps.length : old);
    for (const [id, b] of this.batches) {
      if (b.ended_at != null && b.ended_at < horizon) {
        this.batches.delete(id);
      }
    }
  }

  get running(): number {
    let n = 0;
    for (const r of this.rows.values()) {
      n += r.outcome === 'running' ? 1 : 0;
    }
    return n;
  }

  get queued(): number {
    let n = 0;
    for (const r of this.rows.values()) {
      n += r.outcome === 'queued' ? 1 : 0;
    }
    return n;
  }

  state(): ITimelineState {
    const rows = [...this.rows.values()].map(r => ({
      ...r,
      label: this.labels.get(r.id) ?? (isAnonymous(r.id) ? ANONYMOUS_LABEL : r.id)
    }));
    return { rows, batches: [...this.batches.values()], steps: [...this.steps], now: this.now() };
  }

  /** Does the timeline still need this row's record? Its constraint is not known, or it is
   * constrained and its forced count may still change. */
  private _want(row: ITimelineRow): void {
    if (row.constraint === undefined || (row.constraint && (isLive(row) || row.forced_tokens == null))) {
      this._wanted.add(row.id);
    }
  }

  /** A step of an open batch: counted in it at once, so its tooltip's steps and tokens grow
   * with its guessed and forced ones (the closing record brings the server's totals). */
  private _countStep(event: ServerEvent): void {
    const batch = typeof event.batch_id === 'number' ? this.batches.get(event.batch_id) : undefined;
    if (batch && batch.ended_at == null) {
      batch.steps = (batch.steps ?? 0) + 1;
      batch.tokens = (batch.tokens ?? 0) + (Number(event.tokens) || 0);
      // Every step's guesses, refused ones too: "N accepted (of M proposed)" stays true.
      batch.draft_tokens = (batch.draft_tokens ?? 0) + (Number(event.drafted) || 0);
    }
  }

  /** A step that forced tokens or kept accepted guesses: kept for its tick, and counted in its
   * open batch at once (the batch's closing record then brings the server's own totals). */
  private _multiTokenStep(event: ServerEvent): void {
    const forced = Number(event.forced) || 0;
    const accepted = Number(event.accepted) || 0;
    if ((forced <= 0 && accepted <= 0) || typeof event.ended_at !== 'number') {
      return;
    }
    const step: ITimelineStep = { batch_id: event.batch_id ?? null, at: event.ended_at, tokens: event.tokens, forced };
    if (accepted > 0) {
      step.accepted = accepted;
    }
    this.steps.push(step);
    if (this.steps.length > MAX_STEPS) {
      this.steps.splice(0, this.steps.length - MAX_STEPS);
    }
    const batch = typeof event.batch_id === 'number' ? this.batches.get(event.batch_id) : undefined;
    if (batch && batch.ended_at == null) {
      batch.forced_tokens = (batch.forced_tokens ?? 0) + forced;
      if (accepted > 0) {
        batch.accepted_tokens = (batch.accepted_tokens ?? 0) + accepted;
      }
    }
  }

  private _join(row: ITimelineRow, batchId: number | null | undefined): void {
    if (typeof batchId !== 'number') {
      return;
    }
    const ids = row.batch_ids ?? (row.batch_ids = []);
    if (!ids.includes(batchId)) {
      ids.push(batchId);
      ids.sort((a, b) => a - b);
    }
  }

  private _cap(): void {
    if (this.rows.size <= MAX_ROWS) {
      return;
    }
    for (const [id, r] of this.rows) {
      if (this.rows.size <= MAX_ROWS) {
        break;
      }
      if (!isLive(r)) {
        this.rows.delete(id);
        this._wanted.delete(id);
      }
    }
  }
}
