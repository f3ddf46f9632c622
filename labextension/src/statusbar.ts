// The status-bar item: "infer: ready · 3 running · 41 tok/s" while generating, "infer: ready ·
// idle" when nothing runs or waits (InferenceModel.summary); a click opens the side panel.

import { Widget } from '@lumino/widgets';
import { InferenceModel } from './model';

export class InferStatusItem extends Widget {
  private _model: InferenceModel;

  constructor(model: InferenceModel, open: () => void) {
    super();
    this._model = model;
    this.addClass('ji-status-item');
    this.node.title = 'jupyter_infer: open the Inference panel';
    this.node.setAttribute('role', 'button');
    this.node.addEventListener('click', open);
    model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    this.node.textContent = this._model.summary;
    this.node.dataset.state =
      this._model.connection === 'connected' ? this._model.status?.state ?? 'unknown' : 'offline';
  }
}
