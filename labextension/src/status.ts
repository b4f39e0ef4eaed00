// The status bar item: the current kernel's sandbox (or its absence), its deadline and memory limit,
// from the host's facts. A click says what this mode does not stop.
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { IHostFacts, bytesText, kernelRequest, secondsText } from './api';

export function statusLine(facts: IHostFacts): string {
  const parts = [facts.sandboxed ? 'ivralo: sandboxed' : 'ivralo: NOT sandboxed'];
  parts.push(facts.deadline_ms ? `deadline ${secondsText(facts.deadline_ms)}` : 'no deadline');
  if (facts.memory_limit_bytes) {
    parts.push(`memory ${bytesText(facts.memory_limit_bytes)}`);
  }
  return parts.join(' · ');
}

export class SandboxStatus extends Widget {
  private facts: IHostFacts | null = null;
  private panel: NotebookPanel | null = null;

  constructor(private tracker: INotebookTracker) {
    super();
    this.addClass('jp-ivralo-SandboxStatus');
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this.node.addEventListener('click', () => void this.explain());
    this.node.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        void this.explain();
      }
    });
    tracker.currentChanged.connect(this.follow, this);
    this.follow();
  }

  private follow(): void {
    if (this.panel) {
      this.panel.sessionContext.kernelChanged.disconnect(this.refresh, this);
    }
    this.panel = this.tracker.currentWidget;
    if (this.panel) {
      this.panel.sessionContext.kernelChanged.connect(this.refresh, this);
    }
    void this.refresh();
  }

  private async refresh(): Promise<void> {
    const kernel = this.panel?.sessionContext.session?.kernel;
    this.facts = null;
    if (kernel) {
      try {
        this.facts = await kernelRequest<IHostFacts>(kernel.id, 'facts');
      } catch (error) {
        console.warn('ivralo: no host facts', error);
      }
    }
    // Text only: the words come from the host, and are still never treated as HTML.
    this.node.textContent = this.facts ? statusLine(this.facts) : '';
    this.node.classList.toggle('jp-ivralo-mod-unsandboxed', this.facts?.sandboxed === false);
    this.node.title = this.facts ? `${this.facts.mode}. Click: what this mode does not stop` : '';
    this.setHidden(this.facts === null);
  }

  private async explain(): Promise<void> {
    const facts = this.facts;
    if (!facts) {
      return;
    }
    const body = document.createElement('div');
    body.className = 'jp-ivralo-SandboxDialog';
    for (const text of [
      facts.mode,
      `Not stopped in this mode: ${facts.not_stopped}.`,
      facts.doctor
    ]) {
      const p = document.createElement('p');
      p.textContent = text;
      body.appendChild(p);
    }
    await showDialog({
      title: statusLine(facts),
      body: new Widget({ node: body }),
      buttons: [Dialog.okButton({ label: 'Close' })]
    });
  }
}
