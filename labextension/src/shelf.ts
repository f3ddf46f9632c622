// What the panel's Models section and child-server block say, as plain functions (no DOM, no
// Lumino: the vitest tests import this module as is). The server side is
// jupyter_infer/service/model_shelf.py (`infer/models`) and upstream/managed_server.py.

import type { IChildServer, ILoadOptions, IModelEntry, IStatus } from './api';
import { describeLoading, formatMs } from './format';

/** Bytes as a person reads them: "820 KiB", "2.9 MiB", "1.45 GiB"; "" when unknown. */
export function formatSize(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n) || n < 0) {
    return '';
  }
  if (n < 1024) {
    return `${n} B`;
  }
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let value = n / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  const digits = value >= 100 ? 0 : value >= 10 ? 1 : unit >= 2 ? 2 : 1;
  return `${value.toFixed(digits)} ${units[unit]}`;
}

/** A filesystem path rather than a Hub id or Ollama's name:tag. */
export function isPath(id: string): boolean {
  return /^(\/|~|\.{1,2}[\\/]|[A-Za-z]:[\\/]|\\\\)/.test(id);
}

/** The short name a row shows: a folder's or file's last component, else the id itself. */
export function modelName(entry: Pick<IModelEntry, 'id'>): string {
  if (!isPath(entry.id)) {
    return entry.id;
  }
  const parts = entry.id.split(/[\\/]+/).filter(Boolean);
  return parts.length ? parts[parts.length - 1] : entry.id;
}

const SOURCES: Record<string, string> = {
  huggingface: 'HF cache',
  folder: 'folder',
  gguf: 'GGUF',
  ollama: 'Ollama'
};

/**
 * Where a model was found and its size: "folder · 2.9 MiB", "HF cache · 1.45 GiB". The server
 * also lists the configured and the loaded model where no folder holds them (source
 * "configured" or "loaded"): those say what they are, a path, a Hub id or the simulated engine.
 */
export function modelMeta(entry: Pick<IModelEntry, 'id' | 'source' | 'size_bytes'>): string {
  const size = formatSize(entry.size_bytes);
  let source = SOURCES[entry.source];
  if (source === undefined) {
    const standIn = entry.source === 'configured' || entry.source === 'loaded';
    source = !standIn ? entry.source : entry.id === 'simulated' ? 'simulated engine' : isPath(entry.id) ? 'path' : 'Hub id';
  }
  return size ? `${source} · ${size}` : source;
}

/** One line for a row (its tooltip and accessible name): "tiny (folder · 2.9 MiB, loaded)". */
export function modelLabel(entry: IModelEntry): string {
  const marks = [modelMeta(entry)];
  if (entry.loaded) {
    marks.push('loaded');
  } else if (entry.configured) {
    marks.push('configured');
  }
  return `${modelName(entry)} (${marks.join(', ')})`;
}

/** The weights a load may ask for (`POST infer/models` options); '' keeps what is set now. */
export const WEIGHT_CHOICES: { value: string; label: string; options: ILoadOptions }[] = [
  { value: '', label: 'as now', options: {} },
  { value: 'float32', label: 'float32', options: { quantize: 'none', dtype: 'float32' } },
  { value: 'bf16', label: 'bfloat16', options: { quantize: 'none', dtype: 'bfloat16' } },
  { value: 'int8', label: 'int8', options: { quantize: 'int8' } },
  { value: 'int4', label: 'int4', options: { quantize: 'int4' } }
];

export function loadOptions(choice: string): ILoadOptions {
  return { ...(WEIGHT_CHOICES.find(c => c.value === choice)?.options ?? {}) };
}

/**
 * Whether Load may be pressed for `name` with the weights `choice`: something named, nothing
 * loading, and not the loaded model again with the same weights (a no-op that reloads it).
 * `loaded`: the names the loaded model goes by (its listed id, its path).
 */
export function canLoad(name: string, loaded: (string | null | undefined)[], choice: string, busy: boolean): boolean {
  const wanted = name.trim();
  if (!wanted || busy) {
    return false;
  }
  return choice !== '' || !loaded.includes(wanted);
}

/** States in which the model is being changed: no second load or unload meanwhile. */
export function isSettling(state: string | null | undefined): boolean {
  return state === 'switching' || state === 'loading' || state === 'starting';
}

/**
 * The panel's notice while the model is not (yet) serving: switching, starting a child
 * server, loading (with its phase and progress) or unloaded; null in the other states.
 * `pending` is the model this page asked for (the server's `configured` names the one it
 * started with, not the one a switch loads).
 */
export function settlingNotice(s: IStatus, pending: string | null, loadingForMs: number | null): string | null {
  const name = (id: string | null | undefined): string => (id ? modelName({ id }) : 'the model');
  const target = pending || s.loading?.model || s.configured?.model || null;
  if (s.state === 'switching') {
    return `Switching to ${name(target)}: the requests on the loaded model finish first…`;
  }
  if (s.state === 'starting') {
    const child = s.child_server;
    return child
      ? `Starting the ${child.kind} server for ${name(s.configured?.model)} (${child.state})…`
      : `Starting the engine for ${name(target)}…`;
  }
  if (s.state === 'loading') {
    const engine = !pending && s.configured?.engine ? ` into the ${s.configured.engine} engine` : '';
    const since = loadingForMs === null ? '' : ` (${formatMs(loadingForMs)} so far)`;
    return `Loading ${name(target)}${engine}: ${s.loading ? describeLoading(s.loading) : `starting${since}`}`;
  }
  if (s.state === 'unloaded') {
    return `No model in memory: the next request loads ${name(s.configured?.model)} again.`;
  }
  return null;
}

/** The child server in one line: "vllm · failed · 2 restarts · pid 4242". */
export function childSummary(c: IChildServer): string {
  const parts = [c.kind, c.state];
  const n = c.restarts ?? 0;
  parts.push(n === 0 ? 'no restarts' : n === 1 ? '1 restart' : `${n} restarts`);
  if (c.pid !== null && c.pid !== undefined) {
    parts.push(`pid ${c.pid}`);
  }
  return parts.join(' · ');
}

/** What the Models section says when a load failed: the server's reason, or (when the panel's
 * notice already shows it: the engine is now in the failed state) a pointer to it. */
export function loadFailure(name: string, message: string, s: IStatus | null): string {
  const what = name ? `Could not load ${modelName({ id: name })}` : 'Could not unload the model';
  if (s?.state === 'failed' && s.load_error) {
    return `${what}: the reason is above.`;
  }
  return `${what}: ${message}`;
}

/** The last `n` lines of its log, trailing blank lines dropped. */
export function childTail(c: IChildServer, n = 8): string[] {
  const lines = [...(c.log_tail ?? [])];
  while (lines.length && !lines[lines.length - 1].trim()) {
    lines.pop();
  }
  return lines.slice(-n);
}

/** Whether the child server's block should draw attention (it is not serving). */
export function childInTrouble(c: IChildServer): boolean {
  return c.state === 'failed' || c.state === 'restarting' || !!c.error;
}
