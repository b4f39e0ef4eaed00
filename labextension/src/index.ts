import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';

import { SandboxStatus } from './status';

const status: JupyterFrontEndPlugin<void> = {
  id: 'ivralo-labextension:status',
  description: "The current kernel's sandbox, deadline and memory limit in the status bar",
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null
  ) => {
    if (!statusBar) {
      return; // Notebook 7's notebook page has no status bar
    }
    statusBar.registerStatusItem('ivralo-labextension:status', {
      item: new SandboxStatus(tracker),
      align: 'left',
      rank: 10
    });
  }
};

export default [status];
