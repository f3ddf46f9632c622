// The "Inference" side panel: status, live figures, the server-wide batch timeline and a
// prompt box. It draws an `InferenceModel`; the prompt box streams through the same API.

import { Widget } from '@lumino/widgets';
import { InferError, IGenerateResult, IMetrics, IModelEntry, IStatus } from './api';
import { describeWeights, formatMs, formatNumber } from './format';
import { InferenceModel } from './model';
import { LiveTimelineView } from './livetimeline';
import {
  canLoad,
  childInTrouble,
  childSummary,
  childTail,
  isSettling,
  loadFailure,
  loadOptions,
  modelLabel,
  modelMeta,
  modelName,
  settlingNotice,
  WEIGHT_CHOICES
} from './shelf';

export const PANEL_ID = 'jupyter-infer';

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  parent?: Element,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  if (parent) {
    parent.appendChild(node);
  }
  return node;
}

/** A label/value pair whose value the panel updates. */
function field(parent: Element, label: string, name: string): HTMLElement {
  const row = el('div', 'ji-field', parent);
  row.dataset.field = name;
  el('span', 'ji-field-label', row, label);
  return el('span', 'ji-field-value', row, '–');
}

/** "104 / 180 ms": two durations that share a unit when they can. */
export function formatPair(summary: { p50: number | null; p95: number | null } | undefined): string {
  if (!summary || summary.p50 == null || summary.p95 == null) {
    return '–';
  }
  const [a, b] = [summary.p50, summary.p95];
  if (b < 1000) {
    return `${Math.round(a)} / ${Math.round(b)} ms`;
  }
  if (a >= 1000 && b < 100_000) {
    return `${(a / 1000).toFixed(1)} / ${(b / 1000).toFixed(1)} s`;
  }
  return `${formatMs(a)} / ${formatMs(b)}`;
}

export class InferencePanel extends Widget {
  readonly model: InferenceModel;
  readonly timeline: LiveTimelineView;
  private _state: HTMLElement;
  private _notice: HTMLElement;
  private _fields = new Map<string, HTMLElement>();
  private _figures = new Map<string, HTMLElement>();
  private _windowTitle: HTMLElement;
  private _flash: HTMLElement;
  private _flashTimer = 0;
  private _prompt: PromptBox;
  private _child: ChildServerBlock;
  private _models: ModelsSection;
  private _openWide: (() => void) | null;

  constructor(model: InferenceModel, openWide: (() => void) | null = null) {
    super();
    this._openWide = openWide;
    this.model = model;
    this.id = PANEL_ID;
    this.addClass('ji-panel');
    this.title.caption = 'Inference';
    const root = this.node;

    const header = el('div', 'ji-header', root);
    el('h2', 'ji-heading', header, 'Inference');
    this._state = el('span', 'ji-state', header, 'connecting…');
    this._notice = el('div', 'ji-notice', root);
    this._notice.hidden = true;
    this._flash = el('div', 'ji-notice ji-flash', root);
    this._flash.hidden = true;

    const status = el('section', 'ji-section ji-status', root);
    for (const [label, name] of [
      ['Engine', 'engine'],
      ['Model', 'model'],
      ['Device', 'device'],
      ['Weights', 'weights'],
      ['Mode', 'mode'],
      ['Limits', 'limits']
    ]) {
      this._fields.set(name, field(status, label, name));
    }
    this._child = new ChildServerBlock(el('section', 'ji-section ji-child', root));
    this._models = new ModelsSection(model, el('section', 'ji-section ji-models', root));

    const figures = el('section', 'ji-section ji-figures', root);
    for (const [label, name] of [
      ['queued', 'queue'],
      ['running', 'running'],
      ['tokens/s', 'rate'],
      ['TTFT p50 / p95', 'ttft'],
      ['latency p50 / p95', 'latency'],
      ['finished requests', 'outcomes']
    ]) {
      const card = el('div', `ji-figure ji-figure-${name}`, figures);
      card.dataset.figure = name;
      this._figures.set(name, el('div', 'ji-figure-value', card, '–'));
      el('div', 'ji-figure-label', card, label);
    }

    const section = el('section', 'ji-section ji-live', root);
    const head = el('div', 'ji-section-head', section);
    this._windowTitle = el('h3', 'ji-subheading', head, 'Timeline');
    const wide = el('button', 'ji-link', head, 'wide view ⤢');
    wide.title = 'Open the live timeline in the main area';
    wide.addEventListener('click', () => this._openWide?.());
    el('div', 'ji-hint', section, 'Hover a row for details; click one of your running rows to cancel it.');
    const host = el('div', 'ji-timeline-host', section);
    this.timeline = new LiveTimelineView(host, model, (text, kind) => this._showFlash(text, kind), 360);

    this._prompt = new PromptBox(model, el('section', 'ji-section ji-prompt', root));
    model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    window.clearTimeout(this._flashTimer);
    this.model.changed.disconnect(this._render, this);
    this.timeline.dispose();
    super.dispose();
  }

  protected onAfterShow(): void {
    this.timeline.start();
  }

  protected onAfterAttach(): void {
    if (this.isVisible) {
      this.timeline.start(); // a sidebar panel is attached while hidden too
    }
  }

  protected onBeforeHide(): void {
    this.timeline.stop();
  }

  protected onBeforeDetach(): void {
    this.timeline.stop();
  }

  /** What an action did (a cancel), shown for a few seconds. */
  private _showFlash(text: string, kind: 'info' | 'error'): void {
    this._flash.textContent = text;
    this._flash.dataset.kind = kind;
    this._flash.hidden = false;
    window.clearTimeout(this._flashTimer);
    this._flashTimer = window.setTimeout(() => (this._flash.hidden = true), 5000);
  }

  private _setNotice(text: string | null, kind: 'info' | 'warn' | 'error' = 'info'): void {
    this._notice.hidden = !text;
    this._notice.textContent = text ?? '';
    this._notice.dataset.kind = kind;
  }

  private _render(): void {
    const m = this.model;
    this._windowTitle.textContent = `Timeline · last ${formatMs(m.settings.timeWindow * 1000)}`;
    const s: IStatus | null = m.status;
    const state =
      m.connection === 'connected' ? s?.state ?? '…' : m.connection === 'connecting' ? 'connecting…' : 'reconnecting…';
    this._state.textContent = state + (s?.state === 'ready' && s.fallback_reason ? ' (fallback)' : '');
    this._state.dataset.state = m.connection === 'connected' ? s?.state ?? 'unknown' : 'offline';
    if (s) {
      const set = (name: string, value: string | null | undefined): void => {
        const node = this._fields.get(name)!;
        node.textContent = value || '–';
        node.title = value || '';
      };
      set('engine', s.engine ?? (s.configured ? `${s.configured.engine} (configured)` : null));
      set('model', s.model ?? s.configured?.model ?? null);
      set('device', s.device);
      set('weights', describeWeights(s));
      set('mode', s.mode);
      const l = s.limits || {};
      set(
        'limits',
        `batch ≤ ${l.max_batch_size ?? '?'} · queue ≤ ${l.max_queue_size ?? '?'} · ` +
          `${l.max_new_tokens ? `${l.max_new_tokens} new tokens` : 'answers up to the context'} · ` +
          `prompt ≤ ${l.max_prompt_tokens ?? '?'} tokens`
      );
    }
    if (m.connection === 'reconnecting') {
      this._setNotice(`The inference server is not answering${m.error ? ` (${m.error})` : ''}; reconnecting…`, 'warn');
    } else if (m.connection === 'connecting') {
      this._setNotice(null);
    } else if (s?.state === 'failed') {
      this._setNotice(`The engine failed to load: ${s.load_error ?? 'unknown reason'}`, 'error');
    } else if (s && settlingNotice(s, m.pending, null) !== null) {
      const since = m.loadingSince === null ? null : Date.now() - m.loadingSince;
      this._setNotice(settlingNotice(s, m.pending, since), 'info');
    } else if (s?.fallback_reason) {
      this._setNotice(
        `Running the ${s.engine} engine instead of ${s.configured?.engine ?? 'the configured one'}: ${s.fallback_reason}`,
        'warn'
      );
    } else {
      this._setNotice(null);
    }
    this._renderFigures(m.metrics);
    this._child.render(m.connection === 'connected' ? s : null);
    this._models.render();
    this._prompt.render();
  }

  private _renderFigures(metrics: IMetrics | null): void {
    const set = (name: string, value: string): void => {
      this._figures.get(name)!.textContent = value;
    };
    if (!metrics) {
      return;
    }
    set('queue', String(metrics.queue_depth));
    const parked = metrics.requests.parked ? ` (+${metrics.requests.parked} parked)` : '';
    set('running', `${metrics.requests.running}${parked}`);
    set('rate', formatNumber(metrics.recent_tokens_per_s, 0));
    set('ttft', formatPair(metrics.ttft_ms));
    set('latency', formatPair(metrics.latency_ms));
    const r = metrics.requests;
    set('outcomes', `${r.ok} ok · ${r.cancelled} cancelled · ${r.failed} failed`);
  }
}

/** A managed child server (vLLM, llama.cpp...): what it is, how it goes, its last log lines,
 * so that a user sees why it did not start. Hidden when the engine runs in this process. */
class ChildServerBlock {
  private _root: HTMLElement;
  private _summary: HTMLElement;
  private _error: HTMLElement;
  private _log: HTMLElement;
  private _where: HTMLElement;
  private _stuck = true;

  constructor(root: HTMLElement) {
    this._root = root;
    root.hidden = true;
    el('h3', 'ji-subheading', root, 'Child server');
    this._summary = el('div', 'ji-child-summary', root);
    this._error = el('div', 'ji-child-error', root);
    this._log = el('pre', 'ji-child-log', root);
    this._log.tabIndex = 0; // scrollable by keyboard
    // Kept at the bottom (the newest lines) unless the reader scrolled up.
    this._log.addEventListener('scroll', () => {
      const log = this._log;
      this._stuck = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    });
    this._where = el('div', 'ji-hint ji-child-where', root);
  }

  render(s: IStatus | null): void {
    const c = s?.child_server;
    this._root.hidden = !c;
    if (!c) {
      return;
    }
    this._root.dataset.state = c.state;
    this._root.dataset.trouble = String(childInTrouble(c));
    this._summary.textContent = childSummary(c);
    this._summary.title = c.command ?? '';
    this._error.textContent = c.error ?? '';
    this._error.hidden = !c.error;
    const tail = childTail(c);
    const text = tail.length ? tail.join('\n') : '(nothing logged yet)';
    if (this._log.textContent !== text) {
      this._log.textContent = text;
    }
    if (this._stuck) {
      this._log.scrollTop = this._log.scrollHeight; // the last line is the one that says why
    }
    this._where.textContent = [c.url, c.log ? `log: ${c.log}` : null].filter(Boolean).join(' · ');
    this._where.title = c.command ?? '';
  }
}

/** The models this machine can serve: pick one (a row, or a path typed in), Load it in place
 * of the loaded one, or Unload; a load's error stays under the buttons. */
class ModelsSection {
  private _model: InferenceModel;
  private _count: HTMLElement;
  private _list: HTMLElement;
  private _input: HTMLInputElement;
  private _weights: HTMLSelectElement;
  private _load: HTMLButtonElement;
  private _unload: HTMLButtonElement;
  private _message: HTMLElement;
  private _drawn = '';
  private _done: string | null = null;
  private _doneFor: string | null | undefined = null; // the model it was said of

  constructor(model: InferenceModel, root: HTMLElement) {
    this._model = model;
    const head = el('div', 'ji-section-head', root);
    el('h3', 'ji-subheading', head, 'Models');
    this._count = el('span', 'ji-hint ji-models-count', head);
    const refresh = el('button', 'ji-link', head, 'refresh');
    refresh.title = 'List the models on this machine again';
    refresh.addEventListener('click', () => void model.refreshModels());
    this._list = el('ul', 'ji-model-list', root);
    this._list.setAttribute('role', 'listbox');
    this._list.setAttribute('aria-label', 'Models on this machine');
    const controls = el('div', 'ji-model-controls', root);
    this._input = el('input', 'ji-model-input jp-mod-styled', controls);
    this._input.name = 'model';
    this._input.placeholder = 'pick one above, or a folder, .gguf or Hub id';
    this._input.spellcheck = false;
    const wrap = el('label', 'ji-number', controls, 'weights');
    this._weights = el('select', 'ji-weights', wrap);
    this._weights.name = 'weights';
    this._weights.title = 'How the weights are held (the hf engine); "as now" keeps the current setting';
    for (const choice of WEIGHT_CHOICES) {
      const option = el('option', '', this._weights, choice.label);
      option.value = choice.value;
    }
    const buttons = el('div', 'ji-prompt-buttons', controls);
    this._load = el('button', 'ji-button ji-load', buttons, 'Load');
    this._load.title = 'Load it in place of the loaded model (for every user of this server)';
    this._unload = el('button', 'ji-button ji-unload', buttons, 'Unload');
    this._unload.title = 'Free the memory; the next request loads the model again';
    this._message = el('div', 'ji-model-message', root);
    this._message.hidden = true;

    this._list.addEventListener('click', event => {
      const row = (event.target as Element).closest<HTMLElement>('.ji-model-row');
      if (row?.dataset.id) {
        this._input.value = row.dataset.id;
        this.render();
      }
    });
    this._input.addEventListener('input', () => this.render());
    this._input.addEventListener('keydown', event => {
      if (event.key === 'Enter') {
        event.preventDefault();
        void this.load();
      }
    });
    this._weights.addEventListener('change', () => this.render());
    this._load.addEventListener('click', () => void this.load());
    this._unload.addEventListener('click', () => void this.unload());
  }

  private get _busy(): boolean {
    const m = this._model;
    return m.pending !== null || m.connection !== 'connected' || isSettling(m.status?.state);
  }

  render(): void {
    const m = this._model;
    const answer = m.models;
    const models = answer?.models ?? [];
    const selected = this._input.value.trim();
    const key = JSON.stringify([models, m.pending, selected]);
    if (key !== this._drawn) {
      this._drawn = key;
      this._drawList(models, selected, m.pending);
    }
    this._count.textContent = answer ? `${models.length} on this machine` : '';
    const loaded = models.find(e => e.loaded);
    const names = loaded ? [loaded.id, loaded.path] : [answer?.model];
    this._load.disabled = !canLoad(selected, names, this._weights.value, this._busy);
    this._load.textContent = m.pending ? 'Loading…' : 'Load';
    this._unload.disabled = this._busy || m.status?.state !== 'ready';
    this._unload.textContent = m.pending === '' ? 'Unloading…' : 'Unload';
    if (m.modelsError) {
      this._showMessage(loadFailure(m.modelsFailed, m.modelsError, m.status), 'error');
    } else if (m.listError) {
      this._showMessage(m.listError, 'error');
    } else if (this._done && this._doneFor === m.status?.model) {
      this._showMessage(this._done, 'info');
    } else {
      this._showMessage(null);
    }
  }

  async load(): Promise<void> {
    const name = this._input.value.trim();
    const m = this._model;
    const names = (m.models?.models ?? []).filter(e => e.loaded).flatMap(e => [e.id, e.path]);
    if (!canLoad(name, names, this._weights.value, this._busy)) {
      return;
    }
    this._done = null;
    const started = Date.now();
    if (await m.loadModel(name, loadOptions(this._weights.value))) {
      this._done = `Loaded ${modelName({ id: name })} in ${formatMs(Date.now() - started)}.`;
      this._doneFor = m.status?.model;
      this._weights.value = '';
    }
    this.render();
  }

  async unload(): Promise<void> {
    this._done = null;
    if (await this._model.unloadModel()) {
      this._done = 'Unloaded: the next request loads the model again.';
      this._doneFor = this._model.status?.model;
    }
    this.render();
  }

  private _showMessage(text: string | null, kind: 'info' | 'error' = 'info'): void {
    this._message.hidden = !text;
    this._message.textContent = text ?? '';
    this._message.dataset.kind = kind;
  }

  private _drawList(models: IModelEntry[], selected: string, pending: string | null): void {
    this._list.replaceChildren();
    if (!models.length) {
      el('li', 'ji-hint ji-model-empty', this._list, this._model.models ? 'No models found here.' : 'listing…');
      return;
    }
    for (const entry of models) {
      const row = el('li', 'ji-model-row', this._list);
      row.dataset.id = entry.id;
      row.dataset.loaded = String(entry.loaded);
      row.setAttribute('role', 'option');
      const isSelected = selected === entry.id || selected === entry.path;
      row.setAttribute('aria-selected', String(isSelected));
      row.setAttribute('aria-label', modelLabel(entry));
      row.title = entry.path === entry.id ? entry.path : `${entry.id}\n${entry.path}`;
      el('span', 'ji-model-name', row, modelName(entry));
      el('span', 'ji-model-meta', row, modelMeta(entry));
      const switching = pending !== null && pending !== ''; // the old model goes while another loads
      const loading = switching && (pending === entry.id || pending === entry.path);
      const loaded = entry.loaded && !switching;
      const badge = loading ? 'loading…' : loaded ? 'loaded' : entry.configured && !switching ? 'configured' : '';
      if (badge) {
        el('span', `ji-model-badge ji-badge-${loading ? 'loading' : badge}`, row, badge);
      }
    }
  }
}

/** The prompt box: max tokens, temperature, Send/Stop, the answer streaming in. */
class PromptBox {
  private _model: InferenceModel;
  private _text: HTMLTextAreaElement;
  private _maxTokens: HTMLInputElement;
  private _temperature: HTMLInputElement;
  private _send: HTMLButtonElement;
  private _stop: HTMLButtonElement;
  private _output: HTMLElement;
  private _result: HTMLElement;
  private _abort: AbortController | null = null;
  private _id: string | null = null;

  constructor(model: InferenceModel, root: HTMLElement) {
    this._model = model;
    el('h3', 'ji-subheading', root, 'Prompt');
    this._text = el('textarea', 'ji-prompt-text jp-mod-styled', root);
    this._text.rows = 3;
    this._text.placeholder = 'Ask the model something… (Ctrl+Enter sends)';
    this._text.value = 'What is continuous batching?';
    const controls = el('div', 'ji-prompt-controls', root);
    const number = (label: string, value: string, attrs: Record<string, string>): HTMLInputElement => {
      const wrap = el('label', 'ji-number', controls, label);
      const input = el('input', 'jp-mod-styled', wrap);
      input.type = 'number';
      input.value = value;
      for (const [k, v] of Object.entries(attrs)) {
        input.setAttribute(k, v);
      }
      return input;
    };
    this._maxTokens = number('max tokens', '128', { min: '1', step: '1', name: 'max_tokens' });
    this._temperature = number('temperature', '0.7', { min: '0', max: '2', step: '0.1', name: 'temperature' });
    const buttons = el('div', 'ji-prompt-buttons', controls);
    this._send = el('button', 'ji-button ji-send', buttons, 'Send');
    this._stop = el('button', 'ji-button ji-stop', buttons, 'Stop');
    this._stop.disabled = true;
    this._output = el('div', 'ji-output', root);
    this._result = el('div', 'ji-result', root);
    this._send.addEventListener('click', () => void this.send());
    this._stop.addEventListener('click', () => void this.stop());
    this._text.addEventListener('keydown', event => {
      if (event.key === 'Enter' && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        void this.send();
      }
    });
  }

  render(): void {
    const ready = this._model.connection === 'connected' && this._model.status?.state === 'ready';
    this._send.disabled = !!this._abort || !ready;
  }

  async send(): Promise<void> {
    const prompt = this._text.value.trim();
    if (!prompt || this._abort) {
      return;
    }
    const body = {
      prompt,
      max_tokens: Math.max(1, Number(this._maxTokens.value) || 128),
      temperature: Math.max(0, Number(this._temperature.value) || 0)
    };
    const abort = new AbortController();
    this._abort = abort;
    this._id = null;
    this._output.textContent = '';
    this._output.dataset.state = 'streaming';
    this._result.textContent = 'waiting for the first token…';
    this._send.disabled = true;
    this._stop.disabled = false;
    let finished = false;
    try {
      await this._model.api.generateStream(
        body,
        abort.signal,
        event => {
          if (event.event === 'token') {
            if (!this._output.textContent) {
              this._result.textContent = 'streaming…';
            }
            this._output.textContent += event.data;
          } else if (event.event === 'result') {
            this._showResult(JSON.parse(event.data) as IGenerateResult);
          } else if (event.event === 'error') {
            let message = event.data;
            try {
              message = JSON.parse(event.data).message ?? message;
            } catch {
              // plain text
            }
            this._result.textContent = `error: ${message}`;
            this._output.dataset.state = 'error';
            finished = true;
          } else if (event.event === 'done') {
            finished = true;
          }
        },
        id => {
          this._id = id;
          this._model.live.labels.set(id, prompt.length > 80 ? prompt.slice(0, 80) + '…' : prompt);
        }
      );
      if (this._output.dataset.state === 'streaming') {
        this._output.dataset.state = finished ? 'done' : 'stopped';
        if (!this._result.textContent?.includes('tokens')) {
          this._result.textContent = finished ? 'done' : 'the stream ended early';
        }
      }
    } catch (err) {
      if (abort.signal.aborted) {
        this._output.dataset.state = 'stopped';
        this._result.textContent = 'stopped';
      } else {
        this._output.dataset.state = 'error';
        this._result.textContent = `error: ${err instanceof InferError ? err.message : (err as Error).message}`;
      }
    } finally {
      this._abort = null;
      this._stop.disabled = true;
      this.render();
    }
  }

  /** Stop: cancel by id on the server (counted there), and stop reading. */
  async stop(): Promise<void> {
    const abort = this._abort;
    if (!abort) {
      return;
    }
    if (this._id) {
      try {
        await this._model.api.cancel(this._id);
        return; // the stream ends by itself with the cancelled result
      } catch {
        // older server without the route: closing the stream cancels the request too
      }
    }
    abort.abort();
  }

  private _showResult(result: IGenerateResult): void {
    const t = result.timings || ({} as IGenerateResult['timings']);
    const batch = result.batch?.id != null ? ` · batch #${result.batch.id} ×${result.batch.size}` : '';
    this._result.textContent =
      `${result.finish_reason} · ${result.usage?.completion_tokens ?? 0} tokens · ` +
      `TTFT ${formatMs(t.ttft_ms)} · total ${formatMs(t.total_ms)}${batch}`;
    if (result.finish_reason === 'cancelled') {
      this._output.dataset.state = 'stopped';
    }
  }
}
