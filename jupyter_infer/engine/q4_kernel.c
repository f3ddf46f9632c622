/* 4-bit weights times 8-bit activations on an x86 CPU with AVX2 (jupyter_infer/engine/q4_linear.py).

   Weights: groups of 32 along K, each 16 bytes of nibbles (byte j: element j in its low
   nibble, element j + 16 in its high one, as in GGUF's q4_0/q4_1) and a float16 scale; with a
   float16 min too, w = q * scale + min (q4_1's 5 bits a weight), without, w = (q - 8) * scale
   (q4_0's 4.5 bits: the min is -8 * scale, read from nothing), q in 0..15. Activations are
   quantized per call to int8 in the same groups (one float scale each, as llama.cpp's q8_0), so a group's dot product is
   integer work: maddubs (u8 x s8 -> s16 pairs) and madd (-> s32), or VNNI's dpbusd, then one FMA with the two
   scales. The min's share is min * x_scale * sum(x_q), summed per group.

   y[m, n] = sum_g scale[n,g] * xd[m,g] * dot(q[n,g], xq[m,g]) + min[n,g] * xd[m,g] * xs[m,g]

   Each group of weights is unpacked once and used for up to TILE rows of activations, so a
   batch reads the weights once. Threads (OpenMP, the same runtime as torch's) split N. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define TILE 4
#define GROUP 32

/* Sums of u8 x s8 products, four at a time, into 8 int32: one instruction with VNNI, two
   (maddubs to s16 pairs, madd to s32) without; the sums fit s16 (2 x 15 x 128 < 2^15). */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DOT2(lo, x0, hi, x1) _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, x0), hi, x1)
#elif defined(__AVXVNNI__)
#define DOT2(lo, x0, hi, x1) _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), lo, x0), hi, x1)
#else
#define DOT2(lo, x0, hi, x1) \
    _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1)), _mm256_set1_epi16(1))
#endif

/* With AVX-512 (VNNI and BW), a 64-byte load unpacks four groups of weights at once. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define WIDE 1
#define QUAD 4
#else
#define WIDE 0
#define QUAD 2  /* no quads: the pairs' layout throughout */
#endif
#define PREFETCH 2048  /* bytes of nibbles a thread asks for ahead of its reads (measured: 512 to 4096) */

/* One group of 32 activations as int8, in order (rounded to nearest, even on ties, as lrintf):
   its scale (max |v| / 127) and the sum of its ints. Shared with q8_kernel.c. */
float q8_group(const float *v, int8_t *out, int32_t *sum) {
    const __m256 sign = _mm256_set1_ps(-0.f);
    __m256 a[4];
    for (int j = 0; j < 4; j++) a[j] = _mm256_loadu_ps(v + 8 * j);
    const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, a[0]), _mm256_andnot_ps(sign, a[1])),
                                   _mm256_max_ps(_mm256_andnot_ps(sign, a[2]), _mm256_andnot_ps(sign, a[3])));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
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

/* One row of activations: int8 per group of 32, stored four (AVX-512) or two groups at a time
   in the order the unpacked weights come in (for a pair: g's elements 0..15, g+1's 0..15, g's
   16..31, g+1's 16..31; a quad likewise),
   the group's scale, and its scale times the sum of its ints (what the weights' mins meet). */
/* Where a quantized row keeps group g's elements 0..15 (*lo) and 16..31 (*hi), of G groups:
   quads (AVX-512) or pairs are interleaved by halves, as a 64- or 32-byte load of weights
   unpacks; a last odd group keeps its own order. Shared with q4_gemm.c. */
void q4_halves(int G, int g, int *lo, int *hi) {
    if (g < (G & ~(QUAD - 1))) {
        *lo = (g & ~(QUAD - 1)) * GROUP + (g & (QUAD - 1)) * 16;
        *hi = *lo + QUAD * 16;
    } else if ((g | 1) < G) {
        *lo = (g & ~1) * GROUP + (g & 1) * 16;
        *hi = *lo + 32;
    } else {
        *lo = g * GROUP;
        *hi = *lo + 16;
    }
}

static void quantize_row(const float *x, int K, int8_t *xq, float *xd, float *xc) {
    const int G = K / GROUP;
    for (int g = 0; g < G; g++) {
        int8_t bytes[GROUP];
        int32_t sum;
        const float d = q8_group(x + g * GROUP, bytes, &sum);
        int lo, hi;
        q4_halves(G, g, &lo, &hi);
        _mm_storeu_si128((__m128i *)(xq + lo), _mm_loadu_si128((const __m128i *)bytes));
        _mm_storeu_si128((__m128i *)(xq + hi), _mm_loadu_si128((const __m128i *)(bytes + 16)));
        xd[g] = d;
        xc[g] = d * (float)sum;
    }
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* A chunk of 8 groups' nibbles, scales and mins, PREFETCH bytes of nibbles ahead of group g:
   the hardware's prefetch alone left a thread's stream at ~11 GB/s here. A macro: written as a
   static inline function, GCC 12 at -O3 dropped the prefetches altogether. */
#define PREFETCH_AHEAD(wrow, srow, mrow, g) do { \
        _mm_prefetch((const char *)((wrow) + (g) * 16 + PREFETCH), _MM_HINT_T0); \
        _mm_prefetch((const char *)((wrow) + (g) * 16 + PREFETCH + 64), _MM_HINT_T0); \
        _mm_prefetch((const char *)((srow) + (g) + PREFETCH / 8), _MM_HINT_T0); \
        _mm_prefetch((const char *)((mrow) + (g) + PREFETCH / 8), _MM_HINT_T0); \
    } while (0)

/* Rows m0 .. m0 + mt of y for output n. Inlined with mt a constant (see dot_rows), so its
   accumulators live in registers. */
static inline __attribute__((always_inline)) void dot_tile(int mt, int n, int K, const uint8_t *qw, const uint16_t *scales,
                            const uint16_t *mins, const int8_t *xq, const float *xd,
                            const float *xc, int m0, float *out) {
    const int G = K / GROUP;
    const uint8_t *wrow = qw + (size_t)n * (K / 2);
    /* Without mins (q4_0's form) a group's min is -8 times its scale: the scales are read
       again (from L1) in the mins' place and multiplied by -8, exactly. */
    const uint16_t *srow = scales + (size_t)n * G, *mrow = (mins ? mins : scales) + (size_t)n * G;
    const float mfactor = mins ? 1.f : -8.f;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    /* A chunk's 8 group sums come out of the hadds in the order 0 2 4 6 1 3 5 7. */
    const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    __m256 acc[TILE], macc[TILE];
    float tail[TILE];
    for (int t = 0; t < mt; t++) { acc[t] = _mm256_setzero_ps(); macc[t] = _mm256_setzero_ps(); tail[t] = 0.f; }
    int g = 0;
#if WIDE
    /* Eight groups a pass, four to a 64-byte load: each lane's int32 sum is scaled by its own
       group's factor (scale times the activations' scale), so no horizontal sums until the end. */
    __m512 wacc[TILE];
    for (int t = 0; t < mt; t++) wacc[t] = _mm512_setzero_ps();
    const __m512i m4w = _mm512_set1_epi8(0x0F);
    const __m512i lanes_lo = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i lanes_hi = _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
    for (; g + 8 <= G; g += 8) {
        PREFETCH_AHEAD(wrow, srow, mrow, g);
        const __m256 s8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(srow + g)));
        const __m256 n8 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mrow + g))), _mm256_set1_ps(mfactor));
        const __m512i v0 = _mm512_loadu_si512((const void *)(wrow + g * 16));
        const __m512i v1 = _mm512_loadu_si512((const void *)(wrow + g * 16 + 64));
        const __m512i lo0 = _mm512_and_si512(v0, m4w), hi0 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4w);
        const __m512i lo1 = _mm512_and_si512(v1, m4w), hi1 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4w);
        for (int t = 0; t < mt; t++) {
            const size_t row = (size_t)(m0 + t) * G + g;
            const int8_t *x = xq + (size_t)(m0 + t) * K + g * GROUP;
            const __m512i p0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo0,
                _mm512_loadu_si512((const void *)x)), hi0, _mm512_loadu_si512((const void *)(x + 64)));
            const __m512i p1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo1,
                _mm512_loadu_si512((const void *)(x + 128))), hi1, _mm512_loadu_si512((const void *)(x + 192)));
            const __m512 f = _mm512_castps256_ps512(_mm256_mul_ps(s8, _mm256_loadu_ps(xd + row)));
            wacc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_permutexvar_ps(lanes_lo, f), wacc[t]);
            wacc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_permutexvar_ps(lanes_hi, f), wacc[t]);
            wacc[t] = _mm512_fmadd_ps(_mm512_zextps256_ps512(n8), _mm512_zextps256_ps512(_mm256_loadu_ps(xc + row)), wacc[t]);
        }
    }
    if (g + 4 <= G) {  /* one quad left */
        const __m512i v = _mm512_loadu_si512((const void *)(wrow + g * 16));
        const __m512i lo = _mm512_and_si512(v, m4w), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4w);
        const __m128 s4 = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(srow + g)));
        const __m128 n4 = _mm_mul_ps(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(mrow + g))), _mm_set1_ps(mfactor));
        for (int t = 0; t < mt; t++) {
            const size_t row = (size_t)(m0 + t) * G + g;
            const int8_t *x = xq + (size_t)(m0 + t) * K + g * GROUP;
            const __m512i p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo,
                _mm512_loadu_si512((const void *)x)), hi, _mm512_loadu_si512((const void *)(x + 64)));
            const __m512 f = _mm512_castps128_ps512(_mm_mul_ps(s4, _mm_loadu_ps(xd + row)));
            wacc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_permutexvar_ps(lanes_lo, f), wacc[t]);
            wacc[t] = _mm512_add_ps(wacc[t], _mm512_zextps128_ps512(_mm_mul_ps(n4, _mm_loadu_ps(xc + row))));
        }
        g += 4;
    }
#endif
    /* The AVX2 build's chunks of 8 (with WIDE every whole chunk went above, and macc stays 0). */
    for (; g + 8 <= G; g += 8) {
        PREFETCH_AHEAD(wrow, srow, mrow, g);
        const __m256 s8 = _mm256_permutevar8x32_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(srow + g))), order);
        const __m256 n8 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mrow + g))), _mm256_set1_ps(mfactor));
        __m256i lo[4], hi[4];
        for (int j = 0; j < 4; j++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(wrow + (g + 2 * j) * 16));
            lo[j] = _mm256_and_si256(v, m4);
            hi[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        }
        for (int t = 0; t < mt; t++) {
            const size_t row = (size_t)(m0 + t) * G + g;
            const int8_t *x = xq + (size_t)(m0 + t) * K + g * GROUP;
            __m256i p[4];
            for (int j = 0; j < 4; j++)  /* lanes 0-3: group g + 2j's partial sums, 4-7: g + 2j + 1's */
                p[j] = DOT2(lo[j], _mm256_loadu_si256((const __m256i *)(x + 64 * j)), hi[j],
                            _mm256_loadu_si256((const __m256i *)(x + 64 * j + 32)));
            const __m256i sums = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            const __m256 xd8 = _mm256_permutevar8x32_ps(_mm256_loadu_ps(xd + row), order);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(s8, xd8), acc[t]);
            macc[t] = _mm256_fmadd_ps(n8, _mm256_loadu_ps(xc + row), macc[t]);
        }
    }
    for (; g + 2 <= G; g += 2) {  /* the pairs left when G is not a multiple of 8 */
        const float s0 = _cvtsh_ss(srow[g]), s1 = _cvtsh_ss(srow[g + 1]);
        const float n0 = _cvtsh_ss(mrow[g]) * mfactor, n1 = _cvtsh_ss(mrow[g + 1]) * mfactor;
        const __m256i v = _mm256_loadu_si256((const __m256i *)(wrow + g * 16));
        const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        for (int t = 0; t < mt; t++) {
            const size_t row = (size_t)(m0 + t) * G + g;
            const int8_t *x = xq + (size_t)(m0 + t) * K + g * GROUP;
            const __m256 p = _mm256_cvtepi32_ps(DOT2(lo, _mm256_loadu_si256((const __m256i *)x), hi,
                                                     _mm256_loadu_si256((const __m256i *)(x + 32))));
            const __m256 sd = _mm256_set_m128(_mm_set1_ps(s1 * xd[row + 1]), _mm_set1_ps(s0 * xd[row]));
            acc[t] = _mm256_fmadd_ps(p, sd, acc[t]);
            tail[t] += n0 * xc[row] + n1 * xc[row + 1];
        }
    }
    if (g < G) {  /* an odd last group, in its own order: plain C */
        const uint8_t *w = wrow + g * 16;
        const float s = _cvtsh_ss(srow[g]), mn = _cvtsh_ss(mrow[g]) * mfactor;
        for (int t = 0; t < mt; t++) {
            const size_t m = (size_t)(m0 + t);
            const int8_t *x = xq + m * K + g * GROUP;
            int32_t dot = 0;
            for (int i = 0; i < 16; i++) dot += (w[i] & 15) * x[i] + (w[i] >> 4) * x[16 + i];
            tail[t] += s * xd[m * G + g] * (float)dot + mn * xc[m * G + g];
        }
    }
#if WIDE
    /* acc holds a last pair's sums (past the quads), if there is one */
    const int pair = (G & (QUAD - 1)) >= 2;
    for (int t = 0; t < mt; t++) out[t] = _mm512_reduce_add_ps(wacc[t]) + (pair ? hsum(acc[t]) : 0.f) + tail[t];
#else
    for (int t = 0; t < mt; t++) out[t] = hsum(acc[t]) + hsum(macc[t]) + tail[t];
#endif
}

/* The rows' way in (layer_ops.c): the decoder's norm, or SwiGLU of gate and up. */
float *way_in(const float *x, int M, int K, const float *norm, float eps, int gated);
int joint_blocks(int nw, const int *N, int *first, int *offset);

#if WIDE
/* Many rows: q4_gemm.c's blocked product (from q4_gemm_rows rows on; settable for tests). */
void q4_gemm(int M, int K, int nw, const uint8_t *const *qw, const uint16_t *const *scales,
             const uint16_t *const *mins, const int *N, const float *const *bias, const int8_t *xq, const float *xd,
             const float *xc, float *y, int width, const int *offset, int accumulate);
#endif
int q4_gemm_rows = 32;

/* Several linears over one input x[M, K] (K a multiple of 32), their outputs side by side in
   y[M, sum of N]: q, k and v, or gate and up, read x's quantization once and share one
   parallel loop. With accumulate, y += x @ W^T (a residual added where the output lands).
   With norm (NULL: none), x is first RMS-normalized per row with those weights and eps: the
   decoder's norm before q/k/v or gate/up, in the same call. With gated, x is [M, 2K], gate and
   up side by side, and the linears read silu(gate) * up: the MLP's down projection.
   Weight w's arguments are qw[w], scales[w], mins[w] (NULL: q4_0's form), N[w] and bias[w]
   (NULL: none). */
void q4_linears(const float *x, int M, int K, int nw, const uint8_t *const *qw, const uint16_t *const *scales,
                const uint16_t *const *mins, const int *N, const float *const *bias, float *y, int accumulate,
                const float *norm, float eps, int gated) {
    const int G = K / GROUP;
    float *normed = way_in(x, M, K, norm, eps, gated);
    if (normed) x = normed;
    int8_t *xq = malloc((size_t)M * K);
    float *xd = malloc(sizeof(float) * (size_t)M * G);
    float *xc = malloc(sizeof(float) * (size_t)M * G);
    int first_block[9], offset[9];
    const int width = joint_blocks(nw, N, first_block, offset);
    int blocks = first_block[nw];
#pragma omp parallel for schedule(static) if (M * K > 16384)
    for (int m = 0; m < M; m++)
        quantize_row(x + (size_t)m * K, K, xq + (size_t)m * K, xd + (size_t)m * G, xc + (size_t)m * G);
#if WIDE
    if (M >= q4_gemm_rows) {
        q4_gemm(M, K, nw, qw, scales, mins, N, bias, xq, xd, xc, y, width, offset, accumulate);
        blocks = 0;  /* done: the loop below has nothing to do */
    }
#endif
    /* Blocks of 16 outputs: a block's weights stay in L1 while every row tile passes. */
#pragma omp parallel for schedule(static)
    for (int block = 0; block < blocks; block++) {
        int w = 0;
        while (block >= first_block[w + 1]) w++;
        const int nb = block - first_block[w], n_end = nb * 16 + 16 < N[w] ? nb * 16 + 16 : N[w];
        const float *b = bias[w];
        float out[TILE];
        for (int m0 = 0; m0 < M; m0 += TILE) {
            const int mt = M - m0 < TILE ? M - m0 : TILE;
            for (int n = nb * 16; n < n_end; n++) {
                switch (mt) {
                case 1: dot_tile(1, n, K, qw[w], scales[w], mins[w], xq, xd, xc, m0, out); break;
                case 2: dot_tile(2, n, K, qw[w], scales[w], mins[w], xq, xd, xc, m0, out); break;
                case 3: dot_tile(3, n, K, qw[w], scales[w], mins[w], xq, xd, xc, m0, out); break;
                default: dot_tile(TILE, n, K, qw[w], scales[w], mins[w], xq, xd, xc, m0, out);
                }
                const float add = b ? b[n] : 0.f;
                for (int t = 0; t < mt; t++) {
                    float *at = y + (size_t)(m0 + t) * width + offset[w] + n;
                    *at = out[t] + add + (accumulate ? *at : 0.f);
                }
            }
        }
    }
    free(normed);
    free(xq);
    free(xd);
    free(xc);
}

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
