/* float32 linears on the CPU (f32_linear.py): built into the int4 library with the other
   kernels (q4_linear.py builds it).

   At one row a float32 step is a read of every weight, and oneDNN's prepacked GEMV read them at
   ~22-27 GB/s on a 2-core AVX-512 CPU where llama.cpp's f32 reads ~33. Here the weights are
   in blocks of 16 outputs, k-major: lane o of the block's k-th vector is output o's weight k, so
   a row's x[k] broadcast against it adds 16 products to 16 sums that stay in one register, and
   a block is one stream of K * 64 bytes. Up to ROWS rows share each vector read; more rows take
   the block again from the cache. A block's 16 lanes are one zmm with AVX-512, two ymm with
   AVX2. Measured on the 0.5b shape's matrices, 2 threads (docs/engine.md, "float32 in our
   kernel"): ~35 GB/s at one row against oneDNN's ~26, and at 64-352 rows oneDNN's speed (both
   at the FMA units' peak), on both paths. */

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#define BLOCK 16 /* outputs a block */
#ifdef __AVX512F__
#define ROWS 8 /* 8 rows' sums and the weights: 9 of 32 zmm */
#else
#define ROWS 6 /* 6 rows' sums (12 ymm), the weights (2) and a broadcast: 15 of 16 */
#endif

float *way_in(const float *x, int M, int K, const float *norm, float eps, int gated);

/* y's row r (=, or += with accumulate) the block's sums for row r and the bias, n outputs. */
static void store(const float (*sums)[BLOCK], int mt, float *y, int width, int n, const float *b, int accumulate) {
    for (int r = 0; r < mt; r++) {
        float *yr = y + (size_t)r * width;
        for (int o = 0; o < n; o++) {
            const float v = sums[r][o] + (b ? b[o] : 0.f);
            yr[o] = accumulate ? yr[o] + v : v;
        }
    }
}

/* A block's 16 outputs for rows m0..m0+mt-1, into sums: mt a constant where inlined, so that
   the accumulators stay in registers. */
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

/* y[M, sum N] (=, or += with accumulate) x[M, K] @ [W_0; W_1; ...]^T + bias, with the weights
   as f32_pack lays them out; the arguments are q8_linears' (scales and mins unused), so that
   Int4Linears and decode_layers.c call either. norm: x RMS-normalized per row first (NULL:
   not); gated: x is [M, 2K] gate | up and the linears read swiglu(x). */
void f32_linears(const float *x, int M, int K, int nw, const float *const *qw, const void *const *scales,
                 const void *const *mins, const int *N, const float *const *bias, float *y, int accumulate,
                 const float *norm, float eps, int gated) {
    (void)scales;
    (void)mins;
    float *normed = way_in(x, M, K, norm, eps, gated);
    if (normed) x = normed;
    int first[9], offset[9], width = 0, blocks = 0; /* nw <= 8 */
    for (int w = 0; w < nw; w++) {
        first[w] = blocks;
        offset[w] = width;
        blocks += (N[w] + BLOCK - 1) / BLOCK;
        width += N[w];
    }
    first[nw] = blocks;
#pragma omp parallel for schedule(static)
    for (int block = 0; block < blocks; block++) {
        int w = 0;
        while (block >= first[w + 1]) w++;
        const int b = block - first[w], n0 = b * BLOCK, n = N[w] - n0 < BLOCK ? N[w] - n0 : BLOCK;
        const float *blk = qw[w] + (size_t)b * K * BLOCK;
        float sums[ROWS][BLOCK];
        for (int m0 = 0; m0 < M; m0 += ROWS) {
            const int mt = M - m0 < ROWS ? M - m0 : ROWS;
            switch (mt) { /* each a constant: the sums stay in registers */
#define PASS(r) case r: block_rows(r, m0, K, blk, x, sums); break;
            PASS(1) PASS(2) PASS(3) PASS(4) PASS(5) PASS(6)
#if ROWS == 8
            PASS(7) PASS(8)
#endif
#undef PASS
            }
            store(sums, mt, y + (size_t)m0 * width + offset[w] + n0, width, n, bias[w] ? bias[w] + n0 : NULL,
                  accumulate);
        }
    }
    free(normed);
}
