// The server's `infer/` routes (docs: DESIGN.md "Public contract"), every call through
// JupyterLab's ServerConnection so that the token, cookie and XSRF header are Jupyter's.

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { ISSEEvent, readEventStream } from './sse';
import { ITimelineBatch, ITimelineRow } from './timeline/types';

export interface IStatus {
  state: string; // stopped | starting | switching | loading | ready | failed | unloaded
  load_error: string | null;
  mode: string;
  engine: string | null;
  model: string | null;
  device: string | null;
  dtype: string | null;
  max_context: number | null;
  fallback_reason: string | null;
  details?: Record<string, unknown>;
  limits: Record<string, number>;
  queue_depth: number;
  running: number;
  configured?: { engine: string; model: string; [option: string]: unknown };
  /** How loading goes (while state is "loading"), or what it took (once done). */
  loading?: ILoading;
  /** The serving engine this server started as a child (vLLM, llama.cpp...), when it did. */
  child_server?: IChildServer;
}

/** A managed child server (`InferApp.engine = "vllm"` and the like), as `infer/status` says. */
export interface IChildServer {
  kind: string;
  command: string;
  pid: number | null;
  url: string | null;
  state: string;
  restarts: number;
  error: string | null;
  log: string | null;
  log_tail: string[];
}

/** One model this machine can serve (`GET infer/models`). */
export interface IModelEntry {
  id: string;
  path: string;
  source: string; // huggingface | folder | gguf | ollama | configured | loaded
  size_bytes: number | null;
  loaded: boolean;
  configured: boolean;
}

export interface IModelsAnswer {
  state: string;
  model: string | null;
  models: IModelEntry[];
  load_on_demand: boolean;
  unload_after_s: number;
}

/** What `POST infer/models` takes besides the model. */
export interface ILoadOptions {
  quantize?: string;
  dtype?: string;
}

export interface ILoading {
  model: string;
  phase: string;
  done: number;
  total: number;
  unit: string;
  elapsed_s: number;
  phase_s: number;
  phase_left_s: number | null;
  phases: { phase: string; s: number }[];
}

export interface ISummary {
  p50: number | null;
  p95: number | null;
  p99: number | null;
  mean: number | null;
}

export interface IMetrics {
  requests: {
    ok: number;
    failed: number;
    cancelled: number;
    rejected: number;
    queued: number;
    running: number;
    /** Fair share: requests sitting out while another user's have their rows (older servers: absent). */
    parked?: number;
  };
  tokens: { prompt: number; completion: number };
  ttft_ms: ISummary;
  latency_ms: ISummary;
  queue_ms: ISummary;
  tokens_per_s: number | null;
  recent_tokens_per_s: number;
  mean_batch_size: number | null;
  queue_depth: number;
  uptime_s: number;
}

export interface IBatchesAnswer {
  batches: ITimelineBatch[];
  requests: (ITimelineRow & { completion_tokens?: number })[];
  running: string[];
  waiting: string[];
  mode: string;
  now: number;
}

export interface IGenerateBody {
  prompt: string;
  max_tokens?: number;
  temperature?: number;
}

/** The final JSON of a stream (`event: result`). */
export interface IGenerateResult {
  id: string;
  text: string;
  finish_reason: string;
  usage: { prompt_tokens: number; completion_tokens: number };
  batch: { id: number | null; size: number };
  timings: { queued_ms: number; ttft_ms: number | null; total_ms: number };
}

/** A failed call, with the server's own message when it sent one. */
export class InferError extends Error {
  constructor(
    message: string,
    readonly status: number | null = null
  ) {
    super(message);
  }
}

async function errorFrom(response: Response): Promise<InferError> {
  let message = `${response.status} ${response.statusText}`.trim();
  try {
    const body = await response.json();
    message = body?.message || body?.error?.message || message;
  } catch {
    // not JSON: keep the status line
  }
  return new InferError(message, response.status);
}

export class InferApi {
  readonly settings: ServerConnection.ISettings;

  constructor(settings?: ServerConnection.ISettings) {
    this.settings = settings ?? ServerConnection.makeSettings();
  }

  url(path: string): string {
    return URLExt.join(this.settings.baseUrl, 'infer', path);
  }

  async request(path: string, init: RequestInit = {}): Promise<Response> {
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(this.url(path), init, this.settings);
    } catch (err) {
      if ((err as Error)?.name === 'AbortError') {
        throw err;
      }
      throw new InferError(`The Jupyter server cannot be reached (${(err as Error)?.message ?? err}).`);
    }
    if (!response.ok) {
      throw await errorFrom(response);
    }
    return response;
  }

  async json<T>(path: string, init: RequestInit = {}): Promise<T> {
    return (await (await this.request(path, init)).json()) as T;
  }

  status(): Promise<IStatus> {
    return this.json<IStatus>('status');
  }

  metrics(): Promise<IMetrics> {
    return this.json<IMetrics>('metrics');
  }

  batches(limit = 200, requests = 400): Promise<IBatchesAnswer> {
    return this.json<IBatchesAnswer>(`batches?limit=${limit}&requests=${requests}`);
  }

  /** The models this machine can serve and which one is loaded (`GET infer/models`). */
  models(): Promise<IModelsAnswer> {
    return this.json<IModelsAnswer>('models');
  }

  /** Load `model` in place of the loaded one; answers once it is ready (`POST infer/models`). */
  loadModel(model: string, options: ILoadOptions = {}): Promise<IModelsAnswer> {
    return this.json<IModelsAnswer>('models', {
      method: 'POST',
      body: JSON.stringify({ model, ...options }),
      headers: { 'Content-Type': 'application/json' }
    });
  }

  /** Unload the model; the next request loads it again (`DELETE infer/models`). */
  unloadModel(): Promise<IModelsAnswer> {
    return this.json<IModelsAnswer>('models', { method: 'DELETE' });
  }

  /** Cancel one queued or running request (`DELETE infer/requests/{id}`). */
  cancel(id: string): Promise<{ id: string; cancelled: boolean }> {
    return this.json(`requests/${encodeURIComponent(id)}`, { method: 'DELETE' });
  }

  /** Follow `infer/events` until the stream ends (server gone) or `signal` aborts. */
  async events(signal: AbortSignal, onEvent: (event: ISSEEvent) => void): Promise<void> {
    const response = await this.request('events', { signal, headers: { Accept: 'text/event-stream' } });
    await readEventStream(response, onEvent);
  }

  /**
   * Stream one generation (`POST infer/generate_stream`): `onEvent` sees `token`, `result`,
   * `done` and `error` events. The request id (X-Request-Id) is passed to `onId` as soon as
   * the answer starts, so that a Stop button can cancel it by id.
   */
  async generateStream(
    body: IGenerateBody,
    signal: AbortSignal,
    onEvent: (event: ISSEEvent) => void,
    onId?: (id: string) => void
  ): Promise<void> {
    const response = await this.request('generate_stream', {
      method: 'POST',
      body: JSON.stringify(body),
      signal,
      headers: { 'Content-Type': 'application/json', Accept: 'text/event-stream' }
    });
    const id = response.headers.get('X-Request-Id');
    if (id && onId) {
      onId(id);
    }
    await readEventStream(response, onEvent);
  }
}
