// The server-wide live timeline, wired to an InferenceModel: redrawn at the refresh rate while
// shown, a click on a running row cancels that request. Used by the side panel and by the
// wide view in the main area.

import { Widget } from '@lumino/widgets';
import { formatMs } from './format';
import { isAnonymous } from './live';
import { InferenceModel } from './model';
import { isLive } from './timeline/layout';
import { TimelineView } from './timeline/render';

export type Notify = (text: string, kind: 'info' | 'error') => void;

export class LiveTimelineView {
  readonly view: TimelineView;
  private _model: InferenceModel;
  private _notify: Notify;
  private _timer = 0;
  private _timerMs = 0;

  constructor(host: HTMLElement, model: InferenceModel, notify: Notify, maxRowsHeight: number) {
    this._model = model;
    this._notify = notify;
    this.view = new TimelineView(host, {
      windowS: () => model.settings.timeWindow,
      maxBatchSize: () => model.status?.limits?.max_batch_size ?? null,
      clickable: row => isLive(row) && !isAnonymous(row.id), // another user's: not ours to cancel
      onRowClick: row => void this.cancel(row.id),
      clickHint: 'click to cancel this request',
      emptyText: 'No requests in this window. Requests from every kernel and client show here.',
      maxRowsHeight
    });
    model.changed.connect(this._onChanged, this);
  }

  /** Cancel one request on the server (`DELETE infer/requests/{id}`). */
  async cancel(id: string): Promise<void> {
    try {
      await this._model.api.cancel(id);
      this._notify(`Cancelled ${id}.`, 'info');
    } catch (err) {
      this._notify(`Could not cancel ${id}: ${(err as Error).message}`, 'error');
    }
  }

  /** Redraw at the refresh rate (while the owner is visible). */
  start(): void {
    window.clearInterval(this._timer);
    const draw = (): void => this.view.update(this._model.live.state());
    draw();
    this._timerMs = this._model.settings.refreshInterval;
    this._timer = window.setInterval(draw, Math.max(100, this._timerMs));
  }

  stop(): void {
    window.clearInterval(this._timer);
    this._timer = 0;
  }

  dispose(): void {
    this.stop();
    this._model.changed.disconnect(this._onChanged, this);
    this.view.dispose();
  }

  private _onChanged(): void {
    if (this._timer && this._timerMs !== this._model.settings.refreshInterval) {
      this.start();
    }
  }
}

/** The live timeline on its own, full width, for the main area. */
export class TimelineWidget extends Widget {
  private _live: LiveTimelineView;
  private _heading: HTMLElement;
  private _notice: HTMLElement;
  private _model: InferenceModel;

  constructor(model: InferenceModel) {
    super();
    this._model = model;
    this.addClass('ji-timeline-widget');
    this.title.label = 'Inference timeline';
    this.title.closable = true;
    const head = document.createElement('div');
    head.className = 'ji-section-head';
    this._heading = document.createElement('h3');
    this._heading.className = 'ji-subheading';
    const hint = document.createElement('span');
    hint.className = 'ji-hint';
    hint.textContent = 'every request on this server · hover a row for details · click one of your running rows to cancel it';
    head.append(this._heading, hint);
    this._notice = document.createElement('div');
    this._notice.className = 'ji-notice';
    this._notice.hidden = true;
    const host = document.createElement('div');
    this.node.append(head, this._notice, host);
    this._live = new LiveTimelineView(host, model, (text, kind) => {
      this._notice.textContent = text;
      this._notice.dataset.kind = kind;
      this._notice.hidden = false;
    }, 10_000);
    model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    this._live.dispose();
    super.dispose();
  }

  protected onAfterShow(): void {
    this._live.start();
  }

  protected onAfterAttach(): void {
    if (this.isVisible) {
      this._live.start(); // a sidebar panel is attached while hidden too
    }
  }

  protected onBeforeHide(): void {
    this._live.stop();
  }

  protected onBeforeDetach(): void {
    this._live.stop();
  }

  private _render(): void {
    this._heading.textContent = `Batch timeline · last ${formatMs(this._model.settings.timeWindow * 1000)}`;
  }
}
