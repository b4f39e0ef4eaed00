// Beside each code cell, after its input and never as an output (nothing of it is in the notebook's
// model, so nothing is saved into the .ipynb): what the cell did, from its execute_reply's
// metadata.ivralo.effects. That metadata is written by the kernel, so it is untrusted: every value is
// checked for its type, cut to a length, and rendered as text only (textContent, never HTML).
import { Cell, CodeCell } from '@jupyterlab/cells';
import { NotebookPanel } from '@jupyterlab/notebook';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { PanelLayout, Widget } from '@lumino/widgets';

import { bytesText } from './api';

const MAX_ITEMS = 50; // per list; the rest is counted
const MAX_TEXT = 300; // characters per item

export interface ICall {
  what: string;
  credential: string;
  seconds: number;
}

export interface IEffects {
  created: string[];
  changed: string[];
  deleted: string[];
  history: Record<string, string>;
  hosts: [string, string][];
  calls: ICall[];
  processes: string[];
  peakRss: number | null;
  wall: number | null;
  filesNote: string;
}

function text(value: unknown): string | null {
  return typeof value === 'string' ? value.slice(0, MAX_TEXT) : null;
}

function texts(value: unknown): string[] {
  if (!Array.isArray(value)) {
    return [];
  }
  return value.map(text).filter((v): v is string => v !== null);
}

function num(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0 ? value : null;
}

function record(value: unknown): Record<string, unknown> {
  return value && typeof value === 'object' && !Array.isArray(value) ? (value as Record<string, unknown>) : {};
}

/** The effects in a reply's metadata, as checked values; null when there are none. */
export function readEffects(metadata: unknown): IEffects | null {
  const raw = record(record(record(metadata).ivralo).effects);
  if (Object.keys(raw).length === 0) {
    return null;
  }
  const files = record(raw.files);
  const history: Record<string, string> = {};
  for (const [path, id] of Object.entries(record(raw.history))) {
    const copy = text(id);
    if (copy !== null) {
      history[path.slice(0, MAX_TEXT)] = copy;
    }
  }
  const hosts: [string, string][] = [];
  for (const [host, what] of Object.entries(record(raw.hosts))) {
    const decided = text(what);
    if (decided !== null) {
      hosts.push([host.slice(0, MAX_TEXT), decided]);
    }
  }
  const calls: ICall[] = [];
  for (const call of Array.isArray(raw.calls) ? raw.calls : []) {
    const c = record(call);
    const what = text(c.what);
    if (what !== null) {
      calls.push({ what, credential: text(c.credential) ?? '', seconds: num(c.seconds) ?? 0 });
    }
  }
  return {
    created: texts(files.created),
    changed: texts(files.changed),
    deleted: texts(files.deleted),
    history,
    hosts,
    calls,
    processes: texts(raw.processes),
    peakRss: num(raw.peak_rss_bytes),
    wall: num(raw.wall_s),
    filesNote: text(raw.files_note) ?? ''
  };
}

/** Whether anything worth a line happened: files, hosts, brokered calls or processes. */
export function notable(e: IEffects): boolean {
  return (
    e.created.length + e.changed.length + e.deleted.length + e.hosts.length + e.calls.length + e.processes.length > 0
  );
}

function listed(verb: string, items: string[]): string | null {
  if (items.length === 0) {
    return null;
  }
  const shown = items.slice(0, 3).join(', ');
  return `${verb} ${shown}${items.length > 3 ? ` and ${items.length - 3} more` : ''}`;
}

/** The compact line: what the cell did, in a few words. */
export function summary(e: IEffects): string {
  const parts = [
    listed('created', e.created),
    listed('changed', e.changed),
    listed('deleted', e.deleted),
    e.hosts.length ? `hosts: ${e.hosts.map(([host, what]) => `${host} ${what}`).join(', ')}` : null,
    e.calls.length ? `${e.calls.length} brokered call${e.calls.length > 1 ? 's' : ''}` : null,
    e.processes.length ? `${e.processes.length} process${e.processes.length > 1 ? 'es' : ''} started` : null,
    e.peakRss !== null ? `peak ${bytesText(e.peakRss)}` : null,
    e.wall !== null ? `${e.wall.toFixed(e.wall < 10 ? 2 : 1)} s` : null
  ];
  return parts.filter(p => p !== null).join(' · ');
}

export type RestoreAction = (path: string, copy: string) => Promise<string>;

/** The line under a cell's input: the summary, and on click (or Enter) the full lists. */
export class EffectsLine extends Widget {
  private readonly line: HTMLElement;
  private readonly details: HTMLElement;

  constructor(private readonly restore: RestoreAction | null) {
    super();
    this.addClass('jp-ivralo-Effects');
    this.line = document.createElement('div');
    this.line.className = 'jp-ivralo-Effects-line';
    this.line.setAttribute('role', 'button');
    this.line.tabIndex = 0;
    this.line.setAttribute('aria-expanded', 'false');
    this.details = document.createElement('div');
    this.details.className = 'jp-ivralo-Effects-details';
    this.details.hidden = true;
    this.node.append(this.line, this.details);
    this.line.addEventListener('click', () => this.toggle());
    this.line.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        this.toggle();
      }
    });
    this.hide();
  }

  toggle(): void {
    this.details.hidden = !this.details.hidden;
    this.line.setAttribute('aria-expanded', String(!this.details.hidden));
  }

  show_effects(effects: IEffects | null): void {
    if (effects === null || !notable(effects)) {
      this.hide(); // quiet: nothing notable happened
      return;
    }
    this.line.textContent = `ivralo: ${summary(effects)}`;
    this.details.replaceChildren();
    const row = (label: string, value: string): HTMLElement => {
      const div = document.createElement('div');
      div.className = 'jp-ivralo-Effects-row';
      div.textContent = `${label}: ${value}`;
      this.details.appendChild(div);
      return div;
    };
    const more = (items: unknown[]): string => (items.length > MAX_ITEMS ? ` (and ${items.length - MAX_ITEMS} more)` : '');
    for (const path of effects.created.slice(0, MAX_ITEMS)) {
      row('created', path);
    }
    for (const path of effects.changed.slice(0, MAX_ITEMS)) {
      const div = row('changed', path);
      const copy = effects.history[path];
      if (copy && this.restore) {
        div.appendChild(this.restoreButton(path, copy));
      }
    }
    for (const path of effects.deleted.slice(0, MAX_ITEMS)) {
      row('deleted', path);
    }
    for (const [host, what] of effects.hosts.slice(0, MAX_ITEMS)) {
      row('host', `${host} ${what}`);
    }
    for (const call of effects.calls.slice(0, MAX_ITEMS)) {
      row('brokered call', `${call.what} (${call.credential}, ${call.seconds.toFixed(2)} s)`);
    }
    for (const process of effects.processes.slice(0, MAX_ITEMS)) {
      row('process', process);
    }
    const all = [effects.created, effects.changed, effects.deleted, effects.processes];
    const cut = all.map(more).join('');
    if (cut) {
      row('not listed', cut.trim());
    }
    if (effects.filesNote) {
      row('files', effects.filesNote);
    }
    this.show();
  }

  private restoreButton(path: string, copy: string): HTMLElement {
    const button = document.createElement('button');
    button.className = 'jp-ivralo-Effects-restore jp-mod-styled';
    button.textContent = 'Restore';
    button.title = `Put back the version of ${path} from before this cell`;
    button.addEventListener('click', async event => {
      event.stopPropagation();
      button.disabled = true;
      const note = document.createElement('span');
      note.className = 'jp-ivralo-Effects-note';
      try {
        note.textContent = await this.restore!(path, copy);
      } catch (error) {
        note.textContent = `not restored: ${error}`;
        button.disabled = false;
      }
      button.after(note);
    });
    return button;
  }
}

const lines = new WeakMap<Cell, EffectsLine>();

function lineOf(cell: CodeCell, restore: RestoreAction | null): EffectsLine {
  let line = lines.get(cell);
  if (!line) {
    line = new EffectsLine(restore);
    lines.set(cell, line);
    const layout = cell.layout as PanelLayout;
    // Before the output wrapper: after the input, outside the outputs (and so outside the model).
    const at = layout.widgets.indexOf(cell.outputArea.parent as Widget);
    layout.insertWidget(at >= 0 ? at : layout.widgets.length, line);
  }
  return line;
}

/** Follow a notebook's kernel: each execute_reply's effects go to the cell that sent the request. */
export function followEffects(panel: NotebookPanel, restore: (kernel: string) => RestoreAction): void {
  let kernel: Kernel.IKernelConnection | null = null;
  const onMessage = (_: Kernel.IKernelConnection, args: Kernel.IAnyMessageArgs): void => {
    const msg = args.msg;
    if (args.direction !== 'recv' || msg.header.msg_type !== 'execute_reply') {
      return;
    }
    const parent = (msg.parent_header as KernelMessage.IHeader).msg_id;
    for (const cell of panel.content.widgets) {
      if (cell instanceof CodeCell && cell.outputArea.future?.msg.header.msg_id === parent) {
        lineOf(cell, kernel ? restore(kernel.id) : null).show_effects(readEffects(msg.metadata));
        return;
      }
    }
  };
  const follow = (): void => {
    kernel?.anyMessage.disconnect(onMessage);
    kernel = panel.sessionContext.session?.kernel ?? null;
    kernel?.anyMessage.connect(onMessage);
  };
  panel.sessionContext.kernelChanged.connect(follow);
  panel.sessionContext.ready.then(follow).catch(() => undefined);
  panel.disposed.connect(() => kernel?.anyMessage.disconnect(onMessage));
  follow();
}
