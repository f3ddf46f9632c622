// The notebook's batch timeline (anywidget): the same renderer as the side panel, drawing the
// model's traits `requests`, `batches`, `now` and `title` (jupyter_infer/kernel/widgets/timeline.py).
// Bundled by scripts/build-widget.mjs into jupyter_infer/kernel/widgets/static/timeline.js.

import { TimelineView } from './render';
import { ITimelineBatch, ITimelineRow } from './types';

interface IModel {
  get(name: string): unknown;
  on(event: string, callback: () => void): void;
  off(event: string, callback: () => void): void;
}

const TRAITS = ['requests', 'batches', 'now', 'title'];

function render({ model, el }: { model: IModel; el: HTMLElement }): () => void {
  const view = new TimelineView(el, { maxRowsHeight: 600 });
  const redraw = (): void =>
    view.update({
      rows: (model.get('requests') as ITimelineRow[]) || [],
      batches: (model.get('batches') as ITimelineBatch[]) || [],
      now: (model.get('now') as number | null) ?? null,
      title: (model.get('title') as string) || ''
    });
  for (const name of TRAITS) {
    model.on(`change:${name}`, redraw);
  }
  redraw();
  return () => {
    for (const name of TRAITS) {
      model.off(`change:${name}`, redraw);
    }
    view.dispose();
  };
}

export default { render };
