// The host's egress question as a dialog. The page says which of its kernel connections shows the
// host's questions as dialogs; the host then keeps such a question for the page to fetch and answer
// through the server extension (ivralo_kernel/host/jupyter/person_dialogs.py), instead of sending it
// as an input_request: neither the question nor the answer passes through the kernel. The question's
// words are the host's; they are still shown as text only.
import { Dialog } from '@jupyterlab/apputils';
import { NotebookPanel } from '@jupyterlab/notebook';
import { Kernel } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { kernelRequest } from './api';

const POLL_MS = 250; // while the kernel is busy: how often the page looks for the host's questions

interface IQuestion {
  id: string;
  question: string;
  choices: string[];
}

const LABELS: Record<string, string> = { yes: 'Allow once', always: 'Allow always', no: 'Deny' };

function askPerson(question: IQuestion): Dialog<unknown> {
  const body = document.createElement('div');
  body.className = 'jp-ivralo-Question';
  const text = document.createElement('p');
  text.textContent = `${question.question}.`;
  body.appendChild(text);
  // Deny first and the default: Escape and a bare Enter both say no. Tab reaches the others.
  const offered = ['no', ...question.choices.filter(c => c !== 'no' && LABELS[c])];
  const buttons = offered.map(choice =>
    choice === 'no'
      ? Dialog.cancelButton({ label: LABELS[choice], caption: choice })
      : Dialog.okButton({ label: LABELS[choice], caption: choice })
  );
  return new Dialog({
    title: 'ivralo: allow this connection?',
    body: new Widget({ node: body }),
    buttons,
    defaultButton: 0,
    hasClose: true // Escape and the close button: Deny
  });
}

function choiceOf(question: IQuestion, result: Dialog.IResult<unknown>): string {
  const chosen = result.button.caption;
  return result.button.accept && question.choices.includes(chosen) ? chosen : 'no';
}

/** Register the panel's kernel connection for dialogs, and answer the host's questions while it runs. */
export function followQuestions(panel: NotebookPanel): void {
  let kernel: Kernel.IKernelConnection | null = null;
  let timer: number | null = null;
  const shown = new Set<string>();
  const open = new Map<string, Dialog<unknown>>(); // the dialogs on screen, by question id

  const poll = async (): Promise<void> => {
    timer = null;
    const current = kernel;
    if (!current) {
      return;
    }
    let questions: IQuestion[] | null = null;
    try {
      questions = await kernelRequest<IQuestion[]>(current.id, 'questions');
    } catch (error) {
      console.warn('ivralo: could not fetch the host questions', error);
    }
    const listed = new Set((questions ?? []).map(q => q.id));
    for (const [id, dialog] of open) {
      if (questions !== null && !listed.has(id)) {
        dialog.dispose(); // the question ended (the cell ended or was interrupted): nobody's to answer
        open.delete(id);
      }
    }
    for (const question of questions ?? []) {
      if (shown.has(question.id)) {
        continue;
      }
      shown.add(question.id);
      const dialog = askPerson(question);
      open.set(question.id, dialog);
      void dialog.launch().then(result => {
        open.delete(question.id);
        return kernelRequest(current.id, `questions/${question.id}`, {
          method: 'POST',
          body: JSON.stringify({ answer: choiceOf(question, result) })
        }).catch(() => undefined); // the question ended meanwhile: nobody's to answer now
      }, () => undefined); // disposed above: its question ended
    }
    if (current === kernel && current.status === 'busy') {
      timer = window.setTimeout(() => void poll(), POLL_MS);
    }
  };

  const onStatus = (connection: Kernel.IKernelConnection, status: Kernel.Status): void => {
    // Busy: look for questions until idle; idle with a dialog still open: one look more, to close it.
    if (timer === null && (status === 'busy' || open.size > 0)) {
      void poll();
    }
  };

  const follow = async (): Promise<void> => {
    kernel?.statusChanged.disconnect(onStatus);
    panel.node.removeAttribute('data-ivralo-dialogs');
    kernel = panel.sessionContext.session?.kernel ?? null;
    if (!kernel) {
      return;
    }
    kernel.statusChanged.connect(onStatus);
    const registered = await kernelRequest(kernel.id, 'dialogs', {
      method: 'POST',
      body: JSON.stringify({ client: kernel.clientId })
    }).then(
      answer => answer !== null,
      () => false
    );
    // For tests and for styling: this page answers the host's questions as dialogs.
    if (registered) {
      panel.node.setAttribute('data-ivralo-dialogs', 'on');
    }
  };

  panel.sessionContext.kernelChanged.connect(() => void follow());
  panel.sessionContext.ready.then(() => follow()).catch(() => undefined);
  panel.disposed.connect(() => kernel?.statusChanged.disconnect(onStatus));
}
