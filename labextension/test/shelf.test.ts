import { describe, expect, it } from 'vitest';
import { IChildServer, IModelEntry, IStatus } from '../src/api';
import {
  canLoad,
  childInTrouble,
  childSummary,
  childTail,
  formatSize,
  isSettling,
  loadFailure,
  loadOptions,
  modelLabel,
  modelMeta,
  modelName,
  settlingNotice
} from '../src/shelf';

const entry = (over: Partial<IModelEntry> = {}): IModelEntry => ({
  id: '/home/me/models/tiny',
  path: '/home/me/models/tiny',
  source: 'folder',
  size_bytes: 3_040_000,
  loaded: false,
  configured: false,
  ...over
});

describe('a model row names the model, where it was found and its size', () => {
  it('formats sizes in binary units with sensible digits', () => {
    expect(formatSize(512)).toBe('512 B');
    expect(formatSize(820 * 1024)).toBe('820 KiB');
    expect(formatSize(3_040_000)).toBe('2.9 MiB');
    expect(formatSize(1.45 * 2 ** 30)).toBe('1.45 GiB');
    expect(formatSize(14.2 * 2 ** 30)).toBe('14.2 GiB');
    expect(formatSize(null)).toBe('');
    expect(formatSize(undefined)).toBe('');
  });

  it('shows a folder or a .gguf by its last component, Hub ids and Ollama tags whole', () => {
    expect(modelName(entry())).toBe('tiny');
    expect(modelName({ id: '/data/llama-3.2-1b.Q4_0.gguf' })).toBe('llama-3.2-1b.Q4_0.gguf');
    expect(modelName({ id: '/models/tiny/' })).toBe('tiny');
    expect(modelName({ id: 'C:\\models\\tiny' })).toBe('tiny');
    expect(modelName({ id: 'Qwen/Qwen2.5-0.5B-Instruct' })).toBe('Qwen/Qwen2.5-0.5B-Instruct');
    expect(modelName({ id: 'llama3.2:1b' })).toBe('llama3.2:1b');
    expect(modelName({ id: 'simulated' })).toBe('simulated');
  });

  it('says the source and size, and marks the loaded or configured one', () => {
    expect(modelMeta(entry())).toBe('folder · 2.9 MiB');
    expect(modelMeta(entry({ source: 'huggingface', size_bytes: 1.45 * 2 ** 30 }))).toBe('HF cache · 1.45 GiB');
    expect(modelMeta(entry({ source: 'configured', size_bytes: null }))).toBe('path');
    expect(modelLabel(entry({ loaded: true, configured: true }))).toBe('tiny (folder · 2.9 MiB, loaded)');
    expect(modelLabel(entry({ configured: true }))).toBe('tiny (folder · 2.9 MiB, configured)');
    expect(modelLabel(entry({ source: 'ollama', id: 'qwen3:0.6b', size_bytes: 522 * 2 ** 20 }))).toBe(
      'qwen3:0.6b (Ollama · 522 MiB)'
    );
  });
});

describe('loading a model from the panel', () => {
  it('asks for the weights chosen, nothing when kept as now', () => {
    expect(loadOptions('')).toEqual({});
    expect(loadOptions('int4')).toEqual({ quantize: 'int4' });
    expect(loadOptions('bf16')).toEqual({ quantize: 'none', dtype: 'bfloat16' });
    expect(loadOptions('nonsense')).toEqual({});
  });

  it('allows Load for a named model that is not the loaded one, or with other weights', () => {
    const loaded = ['simulated', 'simulated'];
    expect(canLoad('/m/tiny', loaded, '', false)).toBe(true);
    expect(canLoad('  ', loaded, '', false)).toBe(false);
    expect(canLoad('/m/tiny', loaded, '', true)).toBe(false);
    expect(canLoad('simulated', loaded, '', false)).toBe(false);
    expect(canLoad('simulated', loaded, 'int8', false)).toBe(true);
  });

  it('says what happens while the model changes, naming the model this page asked for', () => {
    const s = { state: 'switching', configured: { engine: 'simulated', model: 'simulated' } } as unknown as IStatus;
    expect(settlingNotice(s, '/m/tiny', null)).toBe('Switching to tiny: the requests on the loaded model finish first…');
    const loading = {
      model: '/m/tiny', phase: 'reading the weights', done: 3, total: 12, unit: 'files',
      elapsed_s: 1.5, phase_s: 1, phase_left_s: null, phases: []
    };
    expect(settlingNotice({ ...s, state: 'loading', loading }, '/m/tiny', 2000)).toBe(
      'Loading tiny: reading the weights: 3 of 12 files (1.5 s so far)'
    );
    // Loading at start-up (no load from this page): the configured model and engine.
    const boot = { state: 'loading', configured: { engine: 'hf', model: 'Qwen/Qwen3-0.6B' } } as unknown as IStatus;
    expect(settlingNotice(boot, null, 3000)).toBe('Loading Qwen/Qwen3-0.6B into the hf engine: starting (3.0 s so far)');
    expect(settlingNotice({ ...boot, state: 'unloaded' }, null, null)).toBe(
      'No model in memory: the next request loads Qwen/Qwen3-0.6B again.'
    );
    expect(settlingNotice({ ...boot, state: 'ready' }, null, null)).toBeNull();
    expect(isSettling('switching')).toBe(true);
    expect(isSettling('unloaded')).toBe(false);
  });
});

describe('a managed child server says why it is not serving', () => {
  const child: IChildServer = {
    kind: 'vllm',
    command: 'vllm serve Qwen/Qwen3-0.6B --port 8123 --api-key <key>',
    pid: 4242,
    url: 'http://127.0.0.1:8123/v1',
    state: 'restarting',
    restarts: 2,
    error: 'vllm exited (code 1) before it answered',
    log: '/tmp/jupyter-infer/vllm.log',
    log_tail: ['INFO starting', 'Traceback (most recent call last):', 'torch.OutOfMemoryError: CUDA out of memory', '', '']
  };

  it('sums it up in one line', () => {
    expect(childSummary(child)).toBe('vllm · restarting · 2 restarts · pid 4242');
    expect(childSummary({ ...child, state: 'ready', restarts: 0 })).toBe('vllm · ready · no restarts · pid 4242');
    expect(childSummary({ ...child, state: 'failed', restarts: 1, pid: null })).toBe('vllm · failed · 1 restart');
  });

  it('keeps the last log lines, without trailing blank ones', () => {
    expect(childTail(child, 2)).toEqual(['Traceback (most recent call last):', 'torch.OutOfMemoryError: CUDA out of memory']);
    expect(childTail({ ...child, log_tail: [] })).toEqual([]);
    expect(childInTrouble(child)).toBe(true);
    expect(childInTrouble({ ...child, state: 'ready', error: null })).toBe(false);
  });
});

describe('what the Models section says about stand-ins and failures', () => {
  it('names what a listed stand-in is', () => {
    const standIn = { source: 'configured', size_bytes: null };
    expect(modelMeta({ ...standIn, id: 'simulated' })).toBe('simulated engine');
    expect(modelMeta({ ...standIn, id: 'Qwen/Qwen3-0.6B' })).toBe('Hub id');
    expect(modelMeta({ ...standIn, id: '/srv/models/x', source: 'loaded' })).toBe('path');
  });

  it("gives the server's reason, or points at the notice that already shows it", () => {
    const ready = { state: 'ready', load_error: null } as unknown as IStatus;
    expect(loadFailure('/m/x', 'A load may set quantize, dtype.', ready)).toBe(
      'Could not load x: A load may set quantize, dtype.'
    );
    const failed = { state: 'failed', load_error: 'ModelNotFound: No model at /m/x' } as unknown as IStatus;
    expect(loadFailure('/m/x', 'The engine is not available: ModelNotFound', failed)).toBe(
      'Could not load x: the reason is above.'
    );
    expect(loadFailure('', 'Forbidden', ready)).toBe('Could not unload the model: Forbidden');
  });
});
