/* 4-bit weights times 8-bit activations on an x86 CPU with AVX2 (jupyter_infer/cpu/int4_linear.py).

   Weights: groups of 32 along K, each 16 bytes of nibbles (byte i: element i in its low
   nibble, element i + 16 in its high one, as in GGUF's q4_0/q4_1) and a float16 scale; with a
   float16 min too, w = q * scale + min (q4_1's 5 bits a weight), without, w = (q - 8) * scale
   (q4_0's 4.5 bits: the min is -8 * scale, read from nothing), q in 0..15.

   They are stored in blocks of 16 outputs, as int8.c's int8: for a block and a group, four
   64-byte words where lane o (4 bytes) holds output o's nibble bytes 4j..4j+3 (j the word), so
   its low nibbles are elements 4j..4j+3 and its high ones 16+4j..16+4j+3; then the block's 16
   scales of the group side by side (and its 16 mins). Activations are quantized per call to
   int8 per group in their natural order (one float scale each, as llama.cpp's q8_0), and four
   of them broadcast against a word's unpacked nibbles: one dpbusd (VNNI) sums 4 products for
   16 outputs, a group is 8, and its int32 sums meet the scales in one FMA:

   y[m, n] = sum_g scale[n,g] * xd[m,g] * (dot(q[n,g], xq[m,g]) - 8 * xs[m,g])       (q4_0)
   y[m, n] = sum_g scale[n,g] * xd[m,g] * dot(q[n,g], xq[m,g]) + min[n,g] * xd[m,g] * xs[m,g]

   (xs: the group's sum of int8 activations.) The same loop serves one row (a stream of the
   weights, in order) and many (8 rows, 4 on AVX2, share each word from registers): the layout
   ended a per-call gather of 16 outputs' rows that cost ~25 ms of a 20-row prefill of the 0.5b
   shape (docs/engine.md). Threads (OpenMP, the same runtime as torch's) split the blocks. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"
#include "vec8.h"

#define GROUP 32
#define BLOCK 16                     /* outputs a block */
#define WORDS (GROUP / 8)            /* 64-byte words a group of a block: 8 nibbles a lane each */
#define BLOCK_GROUP (WORDS * 64)     /* bytes of nibbles a group of a block */


/* One group of 32 activations as int8, in order (rounded to nearest, even on ties, as lrintf):
   its scale (max |v| / 127) and the sum of its ints. Shared with int8.c. */
float q8_group(const float *v, int8_t *out, int32_t *sum) {
    const __m256 sign = _mm256_set1_ps(-0.f);
    __m256 a[4];
    for (int j = 0; j < 4; j++) a[j] = _mm256_loadu_ps(v + 8 * j);
    const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, a[0]), _mm256_andnot_ps(sign, a[1])),
                                   _mm256_max_ps(_mm256_andnot_ps(sign, a[2]), _mm256_andnot_ps(sign, a[3])));
    const float amax = hmax8(m);
    const float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
    const __m256 vinv = _mm256_set1_ps(inv);
    __m256i q[4];
    for (int j = 0; j < 4; j++) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(a[j], vinv));
    const __m256i total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    *sum = _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1)));
    const __m256i bytes = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])),
        _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)out, bytes);
    return d;
}

/* One row, natural order: int8 per group, its scale, and the group's sum of ints (what q4_0's
   -8 and q4_1's min meet). Shared with int8.c. */
void q8_row(const float *x, int K, int8_t *xq, float *xd, int32_t *xs) {
    for (int g = 0; g < K / GROUP; g++) xd[g] = q8_group(x + g * GROUP, xq + g * GROUP, xs + g);
}

q8_rows q8_rows_of(const float *x, int M, int K, const float *norm, float eps, int gated) {
    const int G = K / GROUP;
    q8_rows r = {malloc((size_t)M * K), malloc(sizeof(float) * (size_t)M * G), malloc(sizeof(int32_t) * (size_t)M * G)};
    const int way_in = norm || gated;
    /* A norm or SwiGLU goes a row at a time into a thread's own row, quantized from there: a long
       prompt's rows never sit in memory as floats a second time (3k rows of down's 4864: 58 MB). */
#pragma omp parallel if (M * K > 16384)
    {
        float *row = way_in ? malloc(sizeof(float) * (size_t)K) : NULL;
#pragma omp for schedule(static)
        for (int m = 0; m < M; m++) {
            const float *in = x + (size_t)m * K;
            if (way_in) {
                way_in_row(x, m, K, norm, eps, gated, row);
                in = row;
            }
            q8_row(in, K, r.xq + (size_t)m * K, r.xd + (size_t)m * G, r.xs + (size_t)m * G);
        }
        free(row);
    }
    return r;
}

void q8_rows_free(q8_rows *r) {
    free(r->xq);
    free(r->xd);
    free(r->xs);
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define ROWS 8
/* Rows m0..m0+mt of one block: out[t] = sum over groups of the terms above. */
static inline __attribute__((always_inline)) void block_rows(int mt, int m0, int K, const uint8_t *blk,
                                                             const uint16_t *sc, const uint16_t *mn,
                                                             const int8_t *xq, const float *xd, const int32_t *xs,
                                                             __m512 *out) {
    const int G = K / GROUP;
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512 acc[ROWS];
    for (int t = 0; t < mt; t++) acc[t] = _mm512_setzero_ps();
    for (int g = 0; g < G; g++) {
        const uint8_t *wg = blk + (size_t)g * BLOCK_GROUP;
        _mm_prefetch((const char *)(wg + 2048), _MM_HINT_T0);
        _mm_prefetch((const char *)(wg + 2048 + 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(wg + 2048 + 128), _MM_HINT_T0);
        _mm_prefetch((const char *)(wg + 2048 + 192), _MM_HINT_T0);
        __m512i lo[WORDS], hi[WORDS];
        for (int j = 0; j < WORDS; j++) {
            const __m512i v = _mm512_loadu_si512((const void *)(wg + 64 * j));
            lo[j] = _mm512_and_si512(v, low);
            hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
        const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + (size_t)g * BLOCK)));
        const __m512 m = mn ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mn + (size_t)g * BLOCK)))
                            : _mm512_setzero_ps();
        for (int t = 0; t < mt; t++) {
            const size_t r = (size_t)(m0 + t);
            const int8_t *x = xq + r * K + g * GROUP;
            __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();  /* two chains, half as long */
            for (int j = 0; j < WORDS; j++) {
                d0 = _mm512_dpbusd_epi32(d0, lo[j], _mm512_set1_epi32(*(const int32_t *)(x + 4 * j)));
                d1 = _mm512_dpbusd_epi32(d1, hi[j], _mm512_set1_epi32(*(const int32_t *)(x + 16 + 4 * j)));
            }
            __m512i dot = _mm512_add_epi32(d0, d1);
            const float f = xd[r * G + g];
            if (!mn) dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(8 * xs[r * G + g]));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s, _mm512_set1_ps(f)), acc[t]);
            if (mn) acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(f * (float)xs[r * G + g]), acc[t]);
        }
    }
    for (int t = 0; t < mt; t++) out[t] = acc[t];
}

#else
#define ROWS 4
/* The same with 256-bit registers: a block's 16 outputs are two halves of 8. The nibbles are
   unsigned (0..15), so AVX2's maddubs takes them as they are: a word's low and high products
   summed in int16 (2 x 2 x 15 x 128 < 2^15), then to int32 once. */
#if defined(__AVXVNNI__)
#define DOT8(acc, lo, x0, hi, x1) \
    _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, lo, x0), hi, x1)
#else
#define DOT8(acc, lo, x0, hi, x1) \
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1)), \
                                            _mm256_set1_epi16(1)))
#endif
static inline __attribute__((always_inline)) void block_rows(int mt, int m0, int K, const uint8_t *blk,
                                                             const uint16_t *sc, const uint16_t *mn,
                                                             const int8_t *xq, const float *xd, const int32_t *xs,
                                                             float (*out)[BLOCK]) {
    const int G = K / GROUP;
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256 acc[ROWS][2];
    for (int t = 0; t < mt; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int g = 0; g < G; g++) {
        const uint8_t *wg = blk + (size_t)g * BLOCK_GROUP;
        _mm_prefetch((const char *)(wg + 2048), _MM_HINT_T0);
        _mm_prefetch((const char *)(wg + 2048 + 128), _MM_HINT_T0);
        const __m256 s0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + (size_t)g * BLOCK)));
        const __m256 s1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + (size_t)g * BLOCK + 8)));
        const __m256 m0v = mn ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mn + (size_t)g * BLOCK)))
                              : _mm256_setzero_ps();
        const __m256 m1v = mn ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mn + (size_t)g * BLOCK + 8)))
                              : _mm256_setzero_ps();
        for (int t = 0; t < mt; t++) {
            const size_t r = (size_t)(m0 + t);
            const int8_t *x = xq + r * K + g * GROUP;
            __m256i d0 = _mm256_setzero_si256(), d1 = _mm256_setzero_si256();
            for (int j = 0; j < WORDS; j++) {
                const __m256i x0 = _mm256_set1_epi32(*(const int32_t *)(x + 4 * j));
                const __m256i x1 = _mm256_set1_epi32(*(const int32_t *)(x + 16 + 4 * j));
                const __m256i v0 = _mm256_loadu_si256((const __m256i *)(wg + 64 * j));
                const __m256i v1 = _mm256_loadu_si256((const __m256i *)(wg + 64 * j + 32));
                d0 = DOT8(d0, _mm256_and_si256(v0, low), x0, _mm256_and_si256(_mm256_srli_epi16(v0, 4), low), x1);
                d1 = DOT8(d1, _mm256_and_si256(v1, low), x0, _mm256_and_si256(_mm256_srli_epi16(v1, 4), low), x1);
            }
            const float f = xd[r * G + g];
            if (!mn) {
                const __m256i off = _mm256_set1_epi32(8 * xs[r * G + g]);
                d0 = _mm256_sub_epi32(d0, off);
                d1 = _mm256_sub_epi32(d1, off);
            }
            const __m256 fv = _mm256_set1_ps(f);
            acc[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_mul_ps(s0, fv), acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_mul_ps(s1, fv), acc[t][1]);
            if (mn) {
                const __m256 c = _mm256_set1_ps(f * (float)xs[r * G + g]);
                acc[t][0] = _mm256_fmadd_ps(m0v, c, acc[t][0]);
                acc[t][1] = _mm256_fmadd_ps(m1v, c, acc[t][1]);
            }
        }
    }
    for (int t = 0; t < mt; t++) {
        _mm256_storeu_ps(out[t], acc[t][0]);
        _mm256_storeu_ps(out[t] + 8, acc[t][1]);
    }
}

#endif

#define JOINT_LINEARS q4_linears
#define JOINT_WEIGHT uint8_t
#include "q8_joint.h"

/* y[M, N] = x[M, K] @ W^T (+ bias): one linear. */
void q4_linear(const float *x, int M, int K, const uint8_t *qw, const uint16_t *scales,
               const uint16_t *mins, int N, const float *bias, float *y) {
    q4_linears(x, M, K, 1, &qw, &scales, &mins, &N, &bias, y, 0, NULL, 0.f, 0);
}

/* round(clamp(t, 0, 15)), written so that the compiler vectorizes the loops around it. */
static inline int nibble(float t) {
    t = t < 0.f ? 0.f : (t > 15.f ? 15.f : t);
    return (int)(t + 0.5f);
}

static inline float through_half(float v, uint16_t *h) {
    *h = _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT);
    return _cvtsh_ss(*h);
}

/* Squared error of a group stored with scale d in q4_0's form (nearest q in 0..15 for each). */
static inline float sym_error(const float *v, float d) {
    const float inv = d != 0.f ? 1.f / d : 0.f;
    float err = 0.f;
    for (int i = 0; i < GROUP; i++) {
        const float e = (float)(nibble(v[i] * inv + 8.f) - 8) * d - v[i];
        err += e * e;
    }
    return err;
}

/* W [N, K] -> nibbles [N, K/2] and scales [N, K/32] (float16) in q4_0's form, w = (q - 8) *
   scale: 4.5 bits a weight. llama.cpp's q4_0 takes scale = -max/8 (max: the group's value of
   largest magnitude, which lands on -8). Here nine candidates around it are each refit by
   least squares to the levels they give (llama.cpp's make_qx_quants idea), and the one whose
   float16 scale, as it will be stored, leaves the least squared error is kept: never worse
   than q4_0's own choice, which is among them. */
void q4_quantize(const float *w, int N, int K, uint8_t *nibbles, uint16_t *scales) {
    const int G = K / GROUP;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        for (int g = 0; g < G; g++) {
            const float *v = w + (size_t)n * K + g * GROUP;
            float mx = 0.f;
            for (int i = 0; i < GROUP; i++) if (fabsf(v[i]) > fabsf(mx)) mx = v[i];
            uint16_t best_h;
            float best = sym_error(v, through_half(mx / -8.f, &best_h));
            for (int c = -4; c <= 4 && mx != 0.f; c++) {
                const float iscale = -(8.f + 0.2f * (float)c) / mx;
                float lx = 0.f, l2 = 0.f;
                for (int i = 0; i < GROUP; i++) {
                    const float l = (float)(nibble(v[i] * iscale + 8.f) - 8);
                    lx += l * v[i];
                    l2 += l * l;
                }
                if (l2 <= 0.f) continue;
                uint16_t h;
                const float err = sym_error(v, through_half(lx / l2, &h));
                if (err < best) { best = err; best_h = h; }
            }
            const float d = _cvtsh_ss(best_h), inv = d != 0.f ? 1.f / d : 0.f;
            uint8_t *out = nibbles + (size_t)n * (K / 2) + g * 16;
            for (int i = 0; i < 16; i++)
                out[i] = (uint8_t)(nibble(v[i] * inv + 8.f) | (nibble(v[i + 16] * inv + 8.f) << 4));
            scales[(size_t)n * G + g] = best_h;
        }
    }
}
