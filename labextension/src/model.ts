// What the side panel and the status-bar item show, kept live: the server's status, its
// metrics (polled) and the server-wide timeline (from `infer/events`), reconnecting when the
// server goes away and comes back.

import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';
import { ILoadOptions, IMetrics, IModelsAnswer, InferApi, IStatus } from './api';
import { readyLine } from './format';
import { isSettling } from './shelf';
import { LiveTimeline, ServerEvent } from './live';

export type Connection = 'connecting' | 'connected' | 'reconnecting';

export interface IModelSettings {
  /** How often metrics are fetched and the timeline redrawn (ms). */
  refreshInterval: number;
  /** Seconds of history the live timeline shows. */
  timeWindow: number;
}

export const DEFAULT_SETTINGS: IModelSettings = { refreshInterval: 500, timeWindow: 60 };
/** Request records (constraints, forced tokens) are fetched at most this often (ms). */
const RECORDS_MS = 1000;

const sleep = (ms: number, signal: AbortSignal): Promise<void> =>
  new Promise(resolve => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => {
      clearTimeout(timer);
      resolve();
    });
  });

export class InferenceModel implements IDisposable {
  readonly api: InferApi;
  readonly live = new LiveTimeline();
  status: IStatus | null = null;
  metrics: IMetrics | null = null;
  error: string | null = null;
  connection: Connection = 'connecting';
  /** When this page first saw the engine loading (ms since epoch), for "loading for 12 s". */
  loadingSince: number | null = null;
  settings: IModelSettings = { ...DEFAULT_SETTINGS };
  /** `GET infer/models`: the models this machine can serve (fetched when the state changes). */
  models: IModelsAnswer | null = null;
  /** The model this page asked to load (until the server answers), or "" while unloading. */
  pending: string | null = null;
  /** Why the last load or unload from this page failed (the server's message). */
  modelsError: string | null = null;
  /** Why `GET infer/models` failed, the last time it did. */
  listError: string | null = null;
  /** The model that load was for ("" for an unload). */
  modelsFailed = '';
  private _changed = new Signal<this, void>(this);
  private _stop = new AbortController();
  private _stream: AbortController | null = null;
  private _started = false;
  private _recordsAt = 0;
  private _seen = ''; // the state and model the models list was last fetched for

  constructor(api?: InferApi) {
    this.api = api ?? new InferApi();
  }

  /** Emitted when status, metrics or the connection changed (not on every event). */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get isDisposed(): boolean {
    return this._stop.signal.aborted;
  }

  /** One line for the status bar: "infer: ready · 3 running · 41 tok/s", "infer: ready · idle"
   * (no rate when nothing runs: see `readyLine`). */
  get summary(): string {
    if (this.connection !== 'connected') {
      return this.connection === 'connecting' ? 'infer: connecting…' : 'infer: offline';
    }
    const state = this.status?.state ?? '…';
    const m = this.metrics;
    if (!m || state !== 'ready') {
      return `infer: ${state}`;
    }
    return readyLine(m, this.status?.engine === 'simulated');
  }

  configure(settings: Partial<IModelSettings>): void {
    this.settings = { ...this.settings, ...settings };
    this._changed.emit();
  }

  start(): void {
    if (this._started) {
      return;
    }
    this._started = true;
    void this._follow();
    void this._poll();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._stop.abort();
    this._stream?.abort();
    Signal.clearData(this);
  }

  async refreshStatus(): Promise<void> {
    try {
      this.status = await this.api.status();
      this.error = null;
      if (this.status.state !== 'loading') {
        this.loadingSince = null;
      } else if (this.loadingSince === null) {
        this.loadingSince = Date.now();
      }
    } catch (err) {
      this.error = (err as Error).message;
    }
    this._changed.emit();
    // Another client (a notebook's %infer_model, another page) may have switched the model.
    const seen = `${this.status?.state}|${this.status?.model}`;
    const settled = !isSettling(this.status?.state) || this.models === null; // a first list in any case
    if (this.status && seen !== this._seen && this.pending === null && settled) {
      this._seen = seen;
      await this.refreshModels();
    }
  }

  /** Fetch the models list (`GET infer/models`); a failure leaves the last one. */
  async refreshModels(): Promise<void> {
    try {
      this.models = await this.api.models();
      this.listError = null;
    } catch (err) {
      this.listError = `The models could not be listed: ${(err as Error).message}`;
    }
    this._changed.emit();
  }

  /** Load `name` in place of the loaded model; resolves once the server answered. */
  async loadModel(name: string, options: ILoadOptions = {}): Promise<boolean> {
    return this._changeModel(name, () => this.api.loadModel(name, options));
  }

  /** Unload the model (the next request loads it again). */
  async unloadModel(): Promise<boolean> {
    return this._changeModel('', () => this.api.unloadModel());
  }

  private async _changeModel(pending: string, call: () => Promise<IModelsAnswer>): Promise<boolean> {
    if (this.pending !== null) {
      return false;
    }
    this.pending = pending;
    this.modelsError = null;
    this._changed.emit();
    let ok = true;
    try {
      this.models = await call();
    } catch (err) {
      ok = false;
      this.modelsError = (err as Error).message;
      this.modelsFailed = pending;
    } finally {
      this.pending = null;
    }
    await this.refreshStatus();
    this._seen = `${this.status?.state}|${this.status?.model}`;
    if (!ok) {
      await this.refreshModels();
    }
    this._changed.emit();
    return ok;
  }

  /** Follow `infer/events`; on a dropped stream, reconnect with backoff and reseed. */
  private async _follow(): Promise<void> {
    let delay = 500;
    const stop = this._stop.signal;
    while (!stop.aborted) {
      const stream = new AbortController();
      this._stream = stream;
      try {
        await this.refreshStatus();
        if (this.error) {
          throw new Error(this.error);
        }
        this.live.seed(await this.api.batches());
        this.connection = 'connected';
        this._changed.emit();
        delay = 500;
        await this.api.events(stream.signal, event => this._onEvent(event.event, event.data));
      } catch (err) {
        if (stop.aborted) {
          break;
        }
        this.error = (err as Error).message;
      }
      if (stop.aborted) {
        break;
      }
      this.connection = 'reconnecting';
      this._seen = ''; // list the models again once it is back
      this._changed.emit();
      await sleep(delay, stop);
      delay = Math.min(delay * 2, 5000);
    }
  }

  private _onEvent(type: string, data: string): void {
    let event: ServerEvent;
    try {
      event = JSON.parse(data);
    } catch {
      return;
    }
    event.type = event.type ?? type;
    this.live.apply(event);
    if (event.type === 'ready') {
      void this.refreshStatus();
    } else if (event.type === 'shutdown') {
      this.connection = 'reconnecting';
      this._changed.emit();
    }
  }

  /** The records of the rows the live timeline wants them for (what the events do not say:
   * constraints, forced tokens): the newest few, at most once a second, only when wanted. */
  private async _mergeRecords(): Promise<void> {
    if (!this.live.wanted || Date.now() - this._recordsAt < RECORDS_MS) {
      return;
    }
    this._recordsAt = Date.now();
    this.live.merge(await this.api.batches(1, this.live.recordsToAsk()));
  }

  /** Metrics every refresh interval; status too while it may still change by itself. */
  private async _poll(): Promise<void> {
    const stop = this._stop.signal;
    let tick = 0;
    while (!stop.aborted) {
      if (this.connection === 'connected') {
        try {
          this.metrics = await this.api.metrics();
          this.live.prune(this.settings.timeWindow);
          await this._mergeRecords();
        } catch (err) {
          this.error = (err as Error).message;
        }
        // While a load from this page runs, every other tick: its progress moves fast.
        const settling = this.pending !== null || (this.status && this.status.state !== 'ready');
        if (settling && tick % (this.pending !== null ? 2 : 4) === 0) {
          await this.refreshStatus();
        }
        this._changed.emit();
      }
      tick++;
      await sleep(Math.max(100, this.settings.refreshInterval), stop);
    }
  }
}
