// jupyter_infer's JupyterLab extension: the "Inference" side panel (with its palette command
// and settings) and a status-bar item. Both draw one InferenceModel, which follows the server.

import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Token } from '@lumino/coreutils';
import { inferIcon } from './icon';
import { DEFAULT_SETTINGS, InferenceModel } from './model';
import { InferencePanel, PANEL_ID } from './panel';
import { TimelineWidget } from './livetimeline';
import { MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';
import { InferStatusItem } from './statusbar';

const PLUGIN_ID = 'jupyter-infer:plugin';
export const OPEN_COMMAND = 'jupyter-infer:open';
export const TIMELINE_COMMAND = 'jupyter-infer:open-timeline';

/** The live model of the inference server, for other plugins (the status bar). */
export const IInferenceModel = new Token<InferenceModel>('jupyter-infer:model', 'The live jupyter_infer server model.');

const panelPlugin: JupyterFrontEndPlugin<InferenceModel> = {
  id: PLUGIN_ID,
  description: 'The Inference side panel: status, live figures, batch timeline, prompt box.',
  autoStart: true,
  provides: IInferenceModel,
  optional: [ICommandPalette, ISettingRegistry, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    registry: ISettingRegistry | null,
    restorer: ILayoutRestorer | null
  ): InferenceModel => {
    const model = new InferenceModel();
    const panel = new InferencePanel(model, () => void app.commands.execute(TIMELINE_COMMAND));
    panel.title.icon = inferIcon;
    app.shell.add(panel, 'right', { rank: 600, type: 'Inference' });
    restorer?.add(panel, PANEL_ID);

    app.commands.addCommand(OPEN_COMMAND, {
      label: 'Open the Inference Panel',
      caption: 'Show jupyter_infer status, live figures, the batch timeline and a prompt box',
      icon: inferIcon,
      execute: () => app.shell.activateById(PANEL_ID)
    });
    palette?.addItem({ command: OPEN_COMMAND, category: 'Inference' });

    // The live timeline, full width in the main area (one at a time).
    const tracker = new WidgetTracker<MainAreaWidget<TimelineWidget>>({ namespace: 'jupyter-infer-timeline' });
    app.commands.addCommand(TIMELINE_COMMAND, {
      label: 'Open the Inference Timeline',
      caption: 'The live batch timeline of every request on this server, full width',
      icon: inferIcon,
      execute: () => {
        let widget = tracker.currentWidget;
        if (!widget || widget.isDisposed) {
          widget = new MainAreaWidget({ content: new TimelineWidget(model) });
          widget.id = 'jupyter-infer-timeline';
          widget.title.icon = inferIcon;
          void tracker.add(widget);
          app.shell.add(widget, 'main', { mode: 'split-bottom' });
        }
        app.shell.activateById(widget.id);
      }
    });
    palette?.addItem({ command: TIMELINE_COMMAND, category: 'Inference' });
    restorer?.restore(tracker, { command: TIMELINE_COMMAND, name: () => 'timeline' });

    if (registry) {
      registry
        .load(PLUGIN_ID)
        .then(settings => {
          const apply = (): void =>
            model.configure({
              refreshInterval: (settings.get('refreshInterval').composite as number) ?? DEFAULT_SETTINGS.refreshInterval,
              timeWindow: (settings.get('timeWindow').composite as number) ?? DEFAULT_SETTINGS.timeWindow
            });
          apply();
          settings.changed.connect(apply);
        })
        .catch(reason => console.warn('jupyter-infer: settings could not be loaded; using defaults.', reason));
    }
    model.start();
    return model;
  }
};

const statusPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-infer:status-bar',
  description: 'A status-bar item with the inference server state; a click opens the panel.',
  autoStart: true,
  requires: [IInferenceModel],
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, model: InferenceModel, statusBar: IStatusBar | null): void => {
    if (!statusBar) {
      return;
    }
    const item = new InferStatusItem(model, () => void app.commands.execute(OPEN_COMMAND));
    statusBar.registerStatusItem('jupyter-infer:status', {
      item,
      align: 'left',
      rank: 50,
      isActive: () => true
    });
  }
};

export default [panelPlugin, statusPlugin];
