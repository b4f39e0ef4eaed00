import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';

import { kernelRequest } from './api';
import { RestoreAction, followEffects } from './effects';
import { followQuestions } from './questions';
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

/** Restore through the host (the server extension), never through the kernel. */
function restoreThroughHost(kernelId: string): RestoreAction {
  return async (path: string, copy: string) => {
    const answer = await kernelRequest<{ text: string }>(kernelId, 'restore', {
      method: 'POST',
      body: JSON.stringify({ path, copy })
    });
    return answer?.text ?? 'not restored: not an ivralo kernel';
  };
}

const effects: JupyterFrontEndPlugin<void> = {
  id: 'ivralo-labextension:effects',
  description: 'Beside each cell: the files, hosts, brokered calls and processes it touched',
  autoStart: true,
  requires: [INotebookTracker],
  activate: (app: JupyterFrontEnd, tracker: INotebookTracker) => {
    const follow = (_: unknown, panel: NotebookPanel): void => followEffects(panel, restoreThroughHost);
    tracker.forEach(panel => follow(null, panel));
    tracker.widgetAdded.connect(follow);
  }
};

const questions: JupyterFrontEndPlugin<void> = {
  id: 'ivralo-labextension:questions',
  description: "The host's egress question as a dialog (Allow once, Allow always, Deny)",
  autoStart: true,
  requires: [INotebookTracker],
  activate: (app: JupyterFrontEnd, tracker: INotebookTracker) => {
    tracker.forEach(panel => followQuestions(panel));
    tracker.widgetAdded.connect((_, panel) => followQuestions(panel));
  }
};

export default [status, effects, questions];
