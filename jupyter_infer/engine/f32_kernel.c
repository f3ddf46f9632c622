/* float32 linears on the CPU, for a decode step's few rows (f32_linear.py): built into the int4
   library with the other kernels (q4_linear.py builds it).

   At one row a float32 step is a read of every weight, and oneDNN's prepacked GEMV read them at
   ~22-27 GB/s on a 2-core AVX-512 CPU where llama.cpp's f32 reads ~33. Here the weights are
   in blocks of 16 outputs, k-major: lane o of the block's k-th vector is output o's weight k, so
   a row's x[k] broadcast against it adds 16 products to 16 sums that stay in one register, and
   a block is one stream of K * 64 bytes. Up to ROWS rows share each vector read; more rows take
   the block again from the cache. Written with GCC's vector extensions: one zmm a vector with
   AVX-512, two ymm with AVX2. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 16 /* outputs a block */
#ifdef __AVX512F__
#define ROWS 8
#else
#define ROWS 4 /* 16 ymm: 4 rows' sums (8), the weights (2) and room to spare */
#endif

typedef float v16 __attribute__((vector_size(64)));

float *way_in(const float *x, int M, int K, const float *norm, float eps, int gated);

/* The sums of a block's 16 outputs for rows m0..m0+mt-1: mt a constant where inlined. */
static inline __attribute__((always_inline)) void block_rows(int mt, int m0, int K, const float *blk,
                                                             const float *x, v16 *acc) {
    const float *xr[ROWS];
    for (int r = 0; r < mt; r++) {
        acc[r] = (v16){0};
        xr[r] = x + (size_t)(m0 + r) * K;
    }
    for (int k = 0; k < K; k++) {
        v16 w;
        memcpy(&w, blk + (size_t)k * BLOCK, sizeof w);
        for (int r = 0; r < mt; r++) acc[r] += w * xr[r][k];
    }
}

static void store(const v16 *acc, int mt, float *y, int width, int n, const float *b, int accumulate) {
    for (int r = 0; r < mt; r++) {
        float *yr = y + (size_t)r * width;
        for (int o = 0; o < n; o++) {
            const float v = acc[r][o] + (b ? b[o] : 0.f);
            yr[o] = accumulate ? yr[o] + v : v;
        }
    }
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
        v16 acc[ROWS];
        for (int m0 = 0; m0 < M; m0 += ROWS) {
            const int mt = M - m0 < ROWS ? M - m0 : ROWS;
            switch (mt) { /* each a constant: the sums stay in registers */
#define PASS(r) case r: block_rows(r, m0, K, blk, x, acc); break;
            PASS(1) PASS(2) PASS(3) PASS(4)
#if ROWS == 8
            PASS(5) PASS(6) PASS(7) PASS(8)
#endif
#undef PASS
            }
            store(acc, mt, y + (size_t)m0 * width + offset[w] + n0, width, n, bias[w] ? bias[w] + n0 : NULL,
                  accumulate);
        }
    }
    free(normed);
}
