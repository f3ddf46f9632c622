/* float32 and bfloat16 linears on the CPU (float_linear.py), float32 in and out: built into the
   int4 library with the other kernels (build.py).

   At one row a float32 step is a read of every weight, and oneDNN's prepacked GEMV read them at
   ~22-27 GB/s on a 2-core AVX-512 CPU where llama.cpp's f32 reads ~33. Here the weights are
   in blocks of 16 outputs, k-major: lane o of the block's k-th vector is output o's weight k, so
   a row's x[k] broadcast against it adds 16 products to 16 sums that stay in one register, and
   a block is one stream of K * 64 bytes. Up to ROWS rows share each vector read; more rows take
   the block again from the cache. A block's 16 lanes are one zmm with AVX-512, two ymm with
   AVX2. Measured on the 0.5b shape's matrices, 2 threads (docs/engine.md, "float32 and
   bfloat16 in our kernel"): ~35 GB/s at one row against oneDNN's ~26, and at 64-352 rows
   oneDNN's speed (both at the FMA units' peak), on both paths. bfloat16 weights are blocks of the same 16
   outputs in 2 bytes a weight, in pairs along the input (a 32-bit lane holds output o's weights
   2j and 2j+1): with AVX512-BF16 one vdpbf16ps takes 32 products against the rows' pairs
   rounded to bfloat16 (exact for a bfloat16 model's activations); without it the pairs are
   widened exactly to float32 and meet float32 activations. Half the read. */

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define BLOCK 16 /* outputs a block */
#ifdef __AVX512F__
#define ROWS 8 /* 8 rows' sums and the weights: 9 of 32 zmm */
#else
#define ROWS 6 /* 6 rows' sums (12 ymm), the weights (2) and a broadcast: 15 of 16 */
#endif


/* A block's 16 float32 outputs for rows m0..m0+mt-1, into sums: mt a constant where inlined, so
   that the accumulators stay in registers. */
static inline __attribute__((always_inline)) void block_rows(int mt, int m0, int K, const float *blk,
                                                             const float *x, float (*sums)[BLOCK]) {
    const float *xr = x + (size_t)m0 * K;
#ifdef __AVX512F__
    __m512 acc[ROWS];
    for (int r = 0; r < mt; r++) acc[r] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        const __m512 w = _mm512_loadu_ps(blk + (size_t)k * BLOCK);
        for (int r = 0; r < mt; r++) acc[r] = _mm512_fmadd_ps(w, _mm512_set1_ps(xr[(size_t)r * K + k]), acc[r]);
    }
    for (int r = 0; r < mt; r++) _mm512_storeu_ps(sums[r], acc[r]);
#else
    __m256 lo[ROWS], hi[ROWS];
    for (int r = 0; r < mt; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int k = 0; k < K; k++) {
        const __m256 wl = _mm256_loadu_ps(blk + (size_t)k * BLOCK), wh = _mm256_loadu_ps(blk + (size_t)k * BLOCK + 8);
        for (int r = 0; r < mt; r++) {
            const __m256 xb = _mm256_broadcast_ss(xr + (size_t)r * K + k);
            lo[r] = _mm256_fmadd_ps(wl, xb, lo[r]);
            hi[r] = _mm256_fmadd_ps(wh, xb, hi[r]);
        }
    }
    for (int r = 0; r < mt; r++) {
        _mm256_storeu_ps(sums[r], lo[r]);
        _mm256_storeu_ps(sums[r] + 8, hi[r]);
    }
#endif
}

/* The same for bfloat16 weights, whose block holds pairs: 32 bits a lane, output o's weights
   2j (low half) and 2j+1 (high half). xp: the rows in pairs, K2 of them a row (bfloat16 pairs
   with AVX512-BF16, float32 pairs without). */
static inline __attribute__((always_inline)) void block_rows_bf16(int mt, int m0, int K2, const uint32_t *blk,
                                                                  const void *xp, float (*sums)[BLOCK]) {
#if defined(__AVX512BF16__)
    /* one vdpbf16ps: 32 products into 16 float32 sums */
    const uint32_t *xr = (const uint32_t *)xp + (size_t)m0 * K2;
    __m512 acc[ROWS];
    for (int r = 0; r < mt; r++) acc[r] = _mm512_setzero_ps();
    for (int j = 0; j < K2; j++) {
        const __m512bh w = (__m512bh)_mm512_loadu_si512(blk + (size_t)j * BLOCK);
        for (int r = 0; r < mt; r++)
            acc[r] = _mm512_dpbf16_ps(acc[r], w, (__m512bh)_mm512_set1_epi32((int)xr[(size_t)r * K2 + j]));
    }
    for (int r = 0; r < mt; r++) _mm512_storeu_ps(sums[r], acc[r]);
#elif defined(__AVX512F__)
    /* widened exactly: the low half shifted up, the high half masked */
    const float *xr = (const float *)xp + (size_t)m0 * 2 * K2;
    const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 acc[ROWS];
    for (int r = 0; r < mt; r++) acc[r] = _mm512_setzero_ps();
    for (int j = 0; j < K2; j++) {
        const __m512i v = _mm512_loadu_si512(blk + (size_t)j * BLOCK);
        const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), odd = _mm512_castsi512_ps(_mm512_and_si512(v, high));
        for (int r = 0; r < mt; r++) {
            const float *x2 = xr + (size_t)r * 2 * K2 + 2 * j;
            acc[r] = _mm512_fmadd_ps(odd, _mm512_set1_ps(x2[1]), _mm512_fmadd_ps(even, _mm512_set1_ps(x2[0]), acc[r]));
        }
    }
    for (int r = 0; r < mt; r++) _mm512_storeu_ps(sums[r], acc[r]);
#else
    const float *xr = (const float *)xp + (size_t)m0 * 2 * K2;
    const __m256i high = _mm256_set1_epi32((int)0xFFFF0000u);
    __m256 lo[ROWS], hi[ROWS];
    for (int r = 0; r < mt; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int j = 0; j < K2; j++) {
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(blk + (size_t)j * BLOCK));
        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(blk + (size_t)j * BLOCK + 8));
        for (int half = 0; half < 2; half++) { /* weights 2j, then 2j+1: two vectors live, not four */
            const __m256 w0 = _mm256_castsi256_ps(half ? _mm256_and_si256(v0, high) : _mm256_slli_epi32(v0, 16));
            const __m256 w1 = _mm256_castsi256_ps(half ? _mm256_and_si256(v1, high) : _mm256_slli_epi32(v1, 16));
            for (int r = 0; r < mt; r++) {
                const __m256 xb = _mm256_broadcast_ss(xr + (size_t)r * 2 * K2 + 2 * j + half);
                lo[r] = _mm256_fmadd_ps(w0, xb, lo[r]);
                hi[r] = _mm256_fmadd_ps(w1, xb, hi[r]);
            }
        }
    }
    for (int r = 0; r < mt; r++) {
        _mm256_storeu_ps(sums[r], lo[r]);
        _mm256_storeu_ps(sums[r] + 8, hi[r]);
    }
#endif
}

/* x [M, K] as block_rows_bf16 reads it: K2 = ceil(K/2) pairs a row, the last one padded with 0. */
static void *pairs(const float *x, int M, int K, int K2) {
#if defined(__AVX512BF16__)
    /* a pair is two consecutive bfloat16s: the row converted as it lies, 16 at a time */
    uint16_t *xp = malloc(sizeof(uint16_t) * (size_t)M * 2 * K2);
    for (int m = 0; m < M; m++) {
        const float *xr = x + (size_t)m * K;
        uint16_t *out = xp + (size_t)m * 2 * K2;
        int k = 0;
        for (; k + 16 <= K; k += 16) {
            const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(xr + k));
            memcpy(out + k, &h, sizeof h);
        }
        for (; k < 2 * K2; k++) { /* round to nearest even, as vcvtneps2bf16 does */
            const __m128bh h = _mm_cvtneps_pbh(_mm_set_ss(k < K ? xr[k] : 0.f));
            memcpy(out + k, &h, sizeof(uint16_t));
        }
    }
    return xp;
#else
    float *xp = malloc(sizeof(float) * (size_t)M * 2 * K2);
    for (int m = 0; m < M; m++) {
        memcpy(xp + (size_t)m * 2 * K2, x + (size_t)m * K, sizeof(float) * K);
        if (K % 2) xp[(size_t)m * 2 * K2 + K] = 0.f;
    }
    return xp;
#endif
}

/* y[M, sum N] (=, or += with accumulate) x[M, K] @ [W_0; W_1; ...]^T + bias, with the weights
   as f32_linear.pack lays them out, in float32 or (half) bfloat16 pairs. norm: x RMS-normalized
   per row first (NULL: not); gated: x is [M, 2K] gate | up and the linears read swiglu(x). */
static inline __attribute__((always_inline)) void linears(const float *x, int M, int K, int nw,
                                                          const void *const *qw, const int *N,
                                                          const float *const *bias, float *y, int accumulate,
                                                          const float *norm, float eps, int gated, int half) {
    float *normed = way_in(x, M, K, norm, eps, gated);
    if (normed) x = normed;
    const int K2 = (K + 1) / 2;
    void *xp = half ? pairs(x, M, K, K2) : NULL;
    const joint j = joint_of(nw, N, bias, y, accumulate);
    /* Rows a tile at a time, every block over one tile before the next (q8_joint.h says why).
       The loop is q8_joint.h's, written out in each: shared, the hot body would sit behind a callback or macro. */
    const int tile = row_tile(M, K, half ? 2 : 4);
#pragma omp parallel
    for (int t0 = 0; t0 < M; t0 += tile) {
        const int t1 = M - t0 < tile ? M : t0 + tile;
#pragma omp for schedule(static) nowait
        for (int block = 0; block < j.blocks; block++) {
            const joint_block at = joint_block_at(&j, block);
            const float *blk = (const float *)qw[at.w] + (size_t)at.b * K * BLOCK;
            const uint32_t *pblk = (const uint32_t *)qw[at.w] + (size_t)at.b * K2 * BLOCK;
            float sums[ROWS][BLOCK];
            for (int m0 = t0; m0 < t1; m0 += ROWS) {
                const int mt = t1 - m0 < ROWS ? t1 - m0 : ROWS;
                switch (mt) { /* each a constant: the sums stay in registers */
#define PASS(r)                                                        \
    case r:                                                            \
        if (half) block_rows_bf16(r, m0, K2, pblk, xp, sums);          \
        else block_rows(r, m0, K, blk, x, sums);                       \
        break;
                PASS(1) PASS(2) PASS(3) PASS(4) PASS(5) PASS(6)
#if ROWS == 8
                PASS(7) PASS(8)
#endif
#undef PASS
                }
                joint_store(&j, at, (const float (*)[BLOCK])sums, m0, mt);
            }
        }
    }
    free(xp);
    free(normed);
}

/* The arguments are q8_linears' (scales and mins unused), so that JointLinears and
   decode_layers.c call any of them. */
void f32_linears(const float *x, int M, int K, int nw, const void *const *qw, const void *const *scales,
                 const void *const *mins, const int *N, const float *const *bias, float *y, int accumulate,
                 const float *norm, float eps, int gated) {
    (void)scales;
    (void)mins;
    linears(x, M, K, nw, qw, N, bias, y, accumulate, norm, eps, gated, 0);
}

void bf16_linears(const float *x, int M, int K, int nw, const void *const *qw, const void *const *scales,
                  const void *const *mins, const int *N, const float *const *bias, float *y, int accumulate,
                  const float *norm, float eps, int gated) {
    (void)scales;
    (void)mins;
    linears(x, M, K, nw, qw, N, bias, y, accumulate, norm, eps, gated, 1);
}
