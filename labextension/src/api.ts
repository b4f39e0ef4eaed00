// The extension's server side (ivralo_kernel/host/jupyter/lab_server.py): host facts only, never
// the kernel's own word.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export interface IHostFacts {
  sandboxed: boolean;
  mode: string;
  not_stopped: string;
  doctor: string;
  deadline_ms: number | null;
  memory_limit_bytes: number | null;
  memory_hard_limit_bytes: number | null;
}

const settings = ServerConnection.makeSettings();

/** GET/POST one of the extension's endpoints for a kernel; null on a 404 (not an ivralo kernel). */
export async function kernelRequest<T>(
  kernelId: string,
  path: string,
  init: RequestInit = {}
): Promise<T | null> {
  const url = URLExt.join(settings.baseUrl, 'ivralo', 'kernels', kernelId, path);
  const response = await ServerConnection.makeRequest(url, init, settings);
  if (response.status === 404) {
    return null;
  }
  if (!response.ok) {
    throw new Error(`${url}: ${response.status}`);
  }
  return (await response.json()) as T;
}

export function bytesText(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}

export function secondsText(ms: number): string {
  const s = ms / 1000;
  return s >= 1 ? `${Number.isInteger(s) ? s : s.toFixed(1)} s` : `${ms} ms`;
}
