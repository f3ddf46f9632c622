/* The library's self-test: every kind of kernel once, on small made-up inputs, in the process
   that calls it. build.py runs it in a child process before a server loads the library, so an
   instruction this CPU advertises but does not run (AMX, or AVX-512 in a VM that hides it) kills
   the child, not the Jupyter server. Built with -DJI_PROBE_TRAP it dies at once (SIGILL), which
   the tests use to stand for such a CPU. Returns 0 when every output is a finite number. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define PN 32 /* outputs: two blocks of 16 */
#define PK 64 /* inputs: two groups of 32 */
#define PM 9  /* rows: past the kernels' register tiles (8 on AVX-512, 4-6 on AVX2), and a tail */

static int not_finite(const float *y, int n) {
    for (int i = 0; i < n; i++)
        if (!isfinite(y[i])) return 1;
    return 0;
}

int ji_probe(void) {
#ifdef JI_PROBE_TRAP
    __builtin_trap();
#endif
    static float w[PN * PK], x[PM * 2 * PK], y[PM * PN], norm[PK];
    static uint8_t nibbles[PN * PK / 2];
    static int8_t q8[PN * PK];
    static uint16_t scales[PN * PK / 32], bf16[PN * PK];
    for (int i = 0; i < PN * PK; i++) w[i] = (float)((i * 37) % 17 - 8) / 16.f;
    for (int i = 0; i < PM * 2 * PK; i++) x[i] = (float)((i * 11) % 13 - 6) / 8.f;
    for (int i = 0; i < PK; i++) norm[i] = 1.f;
    for (int i = 0; i < PN * PK; i++) bf16[i] = 0x3f80; /* 1.0 */
    const int n = PN;
    const uint16_t *no_mins = NULL; /* each linear's optional arrays: none */
    const void *no_extra = NULL;
    const float *no_bias = NULL;
    int bad = 0;
    for (int m = 1; m <= PM; m += PM - 1) { /* one row (decode) and many (prefill) */
        q4_quantize(w, PN, PK, nibbles, scales);
        const uint8_t *qw4 = nibbles;
        const uint16_t *sc = scales;
        q4_linears(x, m, PK, 1, &qw4, &sc, &no_mins, &n, &no_bias, y, 0, norm, 1e-6f, 0);
        bad |= not_finite(y, m * PN);
        q4_linears(x, m, PK, 1, &qw4, &sc, &no_mins, &n, &no_bias, y, 0, NULL, 0.f, 1); /* gated: x is 2K wide */
        bad |= not_finite(y, m * PN);
        q8_quantize(w, PN, PK, q8, scales);
        const int8_t *qw8 = q8;
        q8_linears(x, m, PK, 1, &qw8, &sc, &no_mins, &n, &no_bias, y, 0, NULL, 0.f, 0);
        bad |= not_finite(y, m * PN);
        const void *qf = w, *qb = bf16;
        f32_linears(x, m, PK, 1, &qf, &no_extra, &no_extra, &n, &no_bias, y, 0, NULL, 0.f, 0);
        bad |= not_finite(y, m * PN);
        bf16_linears(x, m, PK, 1, &qb, &no_extra, &no_extra, &n, &no_bias, y, 0, NULL, 0.f, 0);
        bad |= not_finite(y, m * PN);
    }
    /* the small ops: a norm, SwiGLU, RoPE over 2 heads of 32, attention of 2 rows over 4 columns */
    ji_rms_norm(x, 2, PK, norm, 1e-6f, y);
    ji_swiglu(x, 2, PK, y);
    static float c[2 * 32], s[2 * 32], kv[2 * 1 * 4 * 32], out[2 * 2 * 32];
    for (int i = 0; i < 2 * 32; i++) c[i] = 1.f, s[i] = 0.f;
    for (int i = 0; i < 2 * 4 * 32; i++) kv[i] = (float)(i % 7) / 7.f;
    ji_rope(x, 2, 2, PK, 32, c, s);
    ji_attend_decode(x, 2, 2, 1, 32, PK, kv, kv, 4 * 32, 4 * 32, 4, NULL, 0.125f, out);
    bad |= not_finite(out, 2 * 2 * 32);
    return bad;
}
