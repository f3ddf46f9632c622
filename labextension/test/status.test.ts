import { describe, expect, it } from 'vitest';
import { IStatus } from '../src/api';
import { describeLoading, describeWeights } from '../src/format';

const base = { state: 'ready', dtype: 'float32' } as unknown as IStatus;

describe('the panel says how the model is held and how loading goes', () => {
  it('shows an int4 model as int4 with its bytes, not as its compute dtype', () => {
    const s = { ...base, details: { quantize: 'int4', weight_bytes: 3 * 2 ** 29, rss_after_load_bytes: 2 ** 31 } };
    expect(describeWeights(s)).toBe('int4 (1.50 GiB of weights, 2.00 GiB resident)');
    expect(describeWeights({ ...base, details: { quantize: 'none' } })).toBe('float32');
  });

  it('says the phase, how far and what is left', () => {
    const loading = {
      model: 'm', phase: 'reading the linears into int4', done: 42, total: 168, unit: 'linears',
      elapsed_s: 12.5, phase_s: 10, phase_left_s: 30.2, phases: []
    };
    expect(describeLoading(loading)).toBe('reading the linears into int4: 42 of 168 linears (12.5 s so far, about 30 s left)');
    expect(describeLoading({ ...loading, total: 0, phase_left_s: null })).toBe('reading the linears into int4 (12.5 s so far)');
  });
});
