/* The decoder's small ops in C, for the int4 path's lean forward (llama_forward.py): built into
   one library with int4.c (build.py builds them, kernels.py declares them). Each would be several
   torch ops of a few microseconds' dispatch each on a few thousand floats; a one-row decode step
   runs ~200 of them.

   - RMSNorm and SwiGLU, applied by q4_linears to a row on its way in (and alone, for tests):
     torch's arithmetic but for the order of the norm's sum and the last bits of exp;
   - RoPE in place, to the bit what transformers computes;
   - attention for one new token a row over its KV cache (decode), masked columns skipped. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "vec8.h"
#include "kernels.h"

/* RMSNorm of one row, as torch computes it in float32 (x * rsqrt(mean(x^2) + eps) * w, each
   product rounded to float) except for the order of the sum of squares: eight float lanes
   here, torch's own cascade there. A row's result depends on that row alone. */
void rms_row(const float *x, int K, const float *w, float eps, float *y) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= K; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
    }
    float ss = hsum8(acc);
    for (; i < K; i++) ss += x[i] * x[i];
    const float r = 1.f / sqrtf(ss / (float)K + eps);
    const __m256 vr = _mm256_set1_ps(r);
    for (i = 0; i + 8 <= K; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vr), _mm256_loadu_ps(w + i)));
    for (; i < K; i++) y[i] = (x[i] * r) * w[i];
}

/* SwiGLU of one row: y[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)) as torch
   writes it (its exp is Sleef's; ours above: the last bits can differ). x = [gate | up]. */
void swiglu_row(const float *x, int K, float *y) {
    const float *gate = x, *up = x + K;
    const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
    int i = 0;
    for (; i + 8 <= K; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_xor_ps(g, sign))));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
    for (; i < K; i++) y[i] = gate[i] / (1.f + expf(-gate[i])) * up[i];
}

/* Row m of x[M, K] (gated: [M, 2K], gate and up) on a kernel's way in, into row[K]: RMS-normalized
   with norm's weights, or SwiGLU'd; the caller asks only when one of them is wanted. */
void way_in_row(const float *x, int m, int K, const float *norm, float eps, int gated, float *row) {
    if (gated) swiglu_row(x + (size_t)m * 2 * K, K, row);
    else rms_row(x + (size_t)m * K, K, norm, eps, row);
}

/* The rows x[M, K] on a kernel's way in (way_in_row), into a new buffer the caller frees; NULL
   when neither a norm nor SwiGLU is asked. */
float *way_in(const float *x, int M, int K, const float *norm, float eps, int gated) {
    if (!norm && !gated) return NULL;
    float *out = malloc(sizeof(float) * (size_t)M * K);
#pragma omp parallel for schedule(static) if (M * K > 16384)
    for (int m = 0; m < M; m++) way_in_row(x, m, K, norm, eps, gated, out + (size_t)m * K);
    return out;
}

joint joint_of(int nw, const int *N, const float *const *bias, float *y, int accumulate) {
    joint j = {.N = N, .bias = bias, .y = y, .accumulate = accumulate};
    for (int w = 0; w < nw; w++) {
        j.first[w] = j.blocks;
        j.offset[w] = j.width;
        j.blocks += (N[w] + 15) / 16;
        j.width += N[w];
    }
    j.first[nw] = j.blocks;
    return j;
}

joint_block joint_block_at(const joint *j, int block) {
    int w = 0;
    while (block >= j->first[w + 1]) w++;
    const int b = block - j->first[w], n0 = b * 16, left = j->N[w] - n0;
    return (joint_block){.w = w, .b = b, .n0 = n0, .n = left < 16 ? left : 16};
}

/* Row r's n outputs (n <= 16) are sums[r] plus the bias (if any), written to y's row m0 + r at
   the block's columns, or added to what is there with accumulate. Every kernel's blocks end here. */
void joint_store(const joint *j, joint_block at, const float (*sums)[16], int m0, int mt) {
    const int width = j->width, n = at.n;
    const float *b = j->bias[at.w] ? j->bias[at.w] + at.n0 : NULL;
    float *y = j->y + (size_t)m0 * width + j->offset[at.w] + at.n0;
#ifdef __AVX512F__
    const __mmask16 live = (__mmask16)((1u << n) - 1u);
    const __m512 bias = b ? _mm512_maskz_loadu_ps(live, b) : _mm512_setzero_ps();
    for (int r = 0; r < mt; r++) {
        float *yr = y + (size_t)r * width;
        __m512 v = _mm512_add_ps(_mm512_loadu_ps(sums[r]), bias);
        if (j->accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(live, yr));
        _mm512_mask_storeu_ps(yr, live, v);
    }
#else
    for (int r = 0; r < mt; r++) {
        float *yr = y + (size_t)r * width;
        for (int o = 0; o < n; o++) {
            const float v = sums[r][o] + (b ? b[o] : 0.f);
            yr[o] = j->accumulate ? yr[o] + v : v;
        }
    }
#endif
}

/* y[M, K] = rms_row of each row of x: the norm q4_linears applies, on its own (for tests). */
void ji_rms_norm(const float *x, int M, int K, const float *w, float eps, float *y) {
    for (int m = 0; m < M; m++) rms_row(x + (size_t)m * K, K, w, eps, y + (size_t)m * K);
}

/* y[M, K] = swiglu_row of each row of x [M, 2K]: what q4_linears reads when gated (for tests). */
void ji_swiglu(const float *x, int M, int K, float *y) {
    for (int m = 0; m < M; m++) swiglu_row(x + (size_t)m * 2 * K, K, y + (size_t)m * K);
}

/* Per-head RMSNorm in place (Qwen3's q_norm and k_norm): heads first..first+heads-1 of each of T
   tokens, a token's heads `stride` floats apart, each head D floats normalized with w [D]. */
void ji_head_norm(float *x, int T, int stride, int first, int heads, int D, const float *w, float eps) {
    for (int t = 0; t < T; t++)
        for (int h = first; h < first + heads; h++) {
            float *v = x + (size_t)t * stride + (size_t)h * D;
            rms_row(v, D, w, eps, v);  /* in place: the sum is taken before any write */
        }
}

/* RoPE in place, as transformers computes it (x * cos + rotate_half(x) * sin, each product
   and the sum rounded to float32: no fused multiply-adds, so the result is torch's to the
   bit): the first `heads` heads of each of T tokens, a token's heads `stride` floats apart,
   cos and sin [T, D]. The int4 decode path's rotation (llama_forward.py): one call for q and
   k instead of six torch ops. */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
void ji_rope(float *x, int T, int heads, int stride, int D, const float *cos, const float *sin) {
#ifdef __clang__
#pragma clang fp contract(off)
#endif
    const int half = D / 2;
    for (int t = 0; t < T; t++) {
        const float *c = cos + (size_t)t * D, *s = sin + (size_t)t * D;
        for (int h = 0; h < heads; h++) {
            float *v = x + (size_t)t * stride + (size_t)h * D;
            for (int i = 0; i < half; i++) {
                const float a = v[i], b = v[i + half];
                const float a_cos = a * c[i], b_sin = -b * s[i];
                const float b_cos = b * c[i + half], a_sin = a * s[i + half];
                v[i] = a_cos + b_sin;
                v[i + half] = b_cos + a_sin;
            }
        }
    }
}
#pragma GCC pop_options

/* Attention for a decode step: each of `rows` rows has one new query token (q: a row's heads
   `q_stride` floats apart from the next row's, each head D floats) and its keys and values
   [kv_heads, L, D] (row r's at k + r * kv_row, head h's kv_head apart, a column D floats on);
   query head h reads key/value head h / (heads / kv_heads). mask [rows, L] (NULL: every
   column): 0 hides a column (a left-padded row's padding). out [rows, heads, D], contiguous.
   softmax(q . k * scale) . v, in float32; SDPA's order of sums differs, so the last bits can. */
static inline __m256 sums8(const __m256 a[8]) {  /* the eight vectors' sums, in order */
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

void ji_attend_decode(const float *q, int rows, int heads, int kv_heads, int D, long q_stride, const float *k,
               const float *v, long kv_row, long kv_head, int L, const uint8_t *mask, float scale, float *out) {
    const int group = heads / kv_heads;
    /* A task is a row's key/value head and the `group` query heads that read it: its keys and
       values are read from memory once, then from L1 for each query head. */
#pragma omp parallel for schedule(static) if ((long)rows * heads * L * D > 65536)
    for (int task = 0; task < rows * kv_heads; task++) {
        const int r = task / kv_heads, kvh = task % kv_heads;
        const float *kh = k + (size_t)r * kv_row + (size_t)kvh * kv_head;
        const float *vh = v + (size_t)r * kv_row + (size_t)kvh * kv_head;
        const uint8_t *keep = mask ? mask + (size_t)r * L : NULL;
        float *p = malloc(sizeof(float) * (size_t)L);
        for (int g = 0; g < group; g++) {
            const int h = kvh * group + g;
            const float *qv = q + (size_t)r * q_stride + (size_t)h * D;
            int j = 0;
            if (D % 8 == 0) {
                for (; j + 8 <= L; j += 8) {  /* eight keys' dot products at once */
                    __m256 acc[8];
                    for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_ps();
                    for (int i = 0; i < D; i += 8) {
                        const __m256 qi = _mm256_loadu_ps(qv + i);
                        for (int c = 0; c < 8; c++)
                            acc[c] = _mm256_fmadd_ps(qi, _mm256_loadu_ps(kh + (size_t)(j + c) * D + i), acc[c]);
                    }
                    _mm256_storeu_ps(p + j, _mm256_mul_ps(sums8(acc), _mm256_set1_ps(scale)));
                }
            }
            for (; j < L; j++) {
                float dot = 0.f;
                for (int i = 0; i < D; i++) dot += qv[i] * kh[(size_t)j * D + i];
                p[j] = dot * scale;
            }
            float top = -INFINITY;
            for (j = 0; j < L; j++)
                if (!keep || keep[j]) top = fmaxf(top, p[j]);
            float total = 0.f;
            for (j = 0; j + 8 <= L; j += 8) {
                const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + j), _mm256_set1_ps(top)));
                _mm256_storeu_ps(p + j, e);
            }
            for (; j < L; j++) p[j] = expf(p[j] - top);
            for (j = 0; j < L; j++) {
                if (keep && !keep[j]) p[j] = 0.f;  /* a hidden column weighs nothing */
                total += p[j];
            }
            float *o = out + ((size_t)r * heads + h) * D;
            const float inv = 1.f / total;
            int i = 0;
            if (D % 8 == 0) {
                for (; i < D; i += 64) {  /* up to 64 columns at once: eight independent sums */
                    const int n = D - i < 64 ? (D - i) / 8 : 8;
                    __m256 acc[8];
                    for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_ps();
                    for (j = 0; j < L; j++) {
                        const __m256 w = _mm256_set1_ps(p[j]);
                        const float *vj = vh + (size_t)j * D + i;
                        for (int c = 0; c < n; c++) acc[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vj + 8 * c), acc[c]);
                    }
                    for (int c = 0; c < n; c++) _mm256_storeu_ps(o + i + 8 * c, _mm256_mul_ps(acc[c], _mm256_set1_ps(inv)));
                }
            }
            for (; i < D; i++) {
                float acc = 0.f;
                for (j = 0; j < L; j++) acc += p[j] * vh[(size_t)j * D + i];
                o[i] = acc * inv;
            }
        }
        free(p);
    }
}
