/* Many rows of activations times 4-bit weights, on a CPU with AVX-512 VNNI: the prefill's and
   a big batch's product (q4_kernel.c calls it from q4_linears for M >= Q4_GEMM_ROWS).

   q4_kernel.c's dot_tile keeps a group's partial sums in four lanes each, so every 64 MACs of
   dpbusd carry ~4 more instructions of float work; past a few rows that, not the memory, is
   the bound. Here sixteen outputs share a register instead: their weights are gathered, once
   per call, into a block where lane o holds output o's four weights k..k+3, and each row's four
   activations k..k+3 are broadcast against it. A group is then eight dpbusd and ~5 float ops
   for 16 outputs of a row, its whole 32 elements summed in one lane, and the block's weights
   are reused by eight rows from registers.

   The weights stay in q4_kernel.c's layout (one copy, one format): the gather costs a few
   cycles per 512 weights, paid once per call and shared by all M rows. */

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)

#define GROUP 32
#define ROWS 8 /* rows a pass: their 8 accumulators, the block's 8 weight registers and the
                  scales fit AVX-512's 32 registers */

void q4_halves(int G, int g, int *lo, int *hi); /* q4_kernel.c: where a quantized row keeps a group's halves */
int joint_blocks(int nw, const int *N, int *first, int *offset); /* layer_ops.c: blocks of 16 */

/* A block of 16 outputs (n0.., fewer at the end of N) for every group: packed[g * 4 + j] holds,
   for output o in lane o, the four bytes 4j..4j+3 of its group's 16 nibble bytes (low nibbles:
   elements 4j..4j+3; high nibbles: 16+4j..16+4j+3); scale[g * 16 + o] its scale, minv its min
   (-8 times the scale in q4_0's form). Lanes past N are zero. */
static void gather_block(const uint8_t *qw, const uint16_t *scales, const uint16_t *mins, int K, int n0, int n,
                         __m512i *packed, float *scale, float *minv) {
    const int G = K / GROUP;
    const __mmask16 live = (__mmask16)((1u << n) - 1u);
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(K / 2));
    const uint8_t *base = qw + (size_t)n0 * (K / 2);
    for (int g = 0; g < G; g++) {
        for (int j = 0; j < 4; j++)
            packed[g * 4 + j] = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, rows,
                                                            (const void *)(base + g * 16 + 4 * j), 1);
        for (int o = 0; o < 16; o++) {
            const float s = o < n ? _cvtsh_ss(scales[(size_t)(n0 + o) * G + g]) : 0.f;
            scale[g * 16 + o] = s;
            minv[g * 16 + o] = o < n ? (mins ? _cvtsh_ss(mins[(size_t)(n0 + o) * G + g]) : -8.f * s) : 0.f;
        }
    }
}

/* Rows m0..m0+mt of the block: out[t] = sum over groups of scale * xd * dot + min * xc. */
static inline __attribute__((always_inline)) void rows_pass(int mt, int m0, int K, const __m512i *packed,
                                                            const float *scale, const float *minv, const int8_t *xq,
                                                            const float *xd, const float *xc, const int *lo,
                                                            const int *hi, __m512 *out) {
    const int G = K / GROUP;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[ROWS];
    for (int t = 0; t < mt; t++) acc[t] = _mm512_setzero_ps();
    for (int g = 0; g < G; g++) {
        __m512i w[8];
        for (int j = 0; j < 4; j++) {
            w[j] = _mm512_and_si512(packed[g * 4 + j], m4);
            w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(packed[g * 4 + j], 4), m4);
        }
        const __m512 s = _mm512_loadu_ps(scale + g * 16), mn = _mm512_loadu_ps(minv + g * 16);
        for (int t = 0; t < mt; t++) {
            const size_t m = (size_t)(m0 + t);
            const int8_t *x = xq + m * K;
            __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();  /* two chains, half as long */
            for (int j = 0; j < 4; j++) {
                d0 = _mm512_dpbusd_epi32(d0, w[j], _mm512_set1_epi32(*(const int32_t *)(x + lo[g] + 4 * j)));
                d1 = _mm512_dpbusd_epi32(d1, w[j + 4], _mm512_set1_epi32(*(const int32_t *)(x + hi[g] + 4 * j)));
            }
            const __m512i dot = _mm512_add_epi32(d0, d1);
            const __m512 f = _mm512_mul_ps(s, _mm512_set1_ps(xd[m * G + g]));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), f, acc[t]);
            acc[t] = _mm512_fmadd_ps(mn, _mm512_set1_ps(xc[m * G + g]), acc[t]);
        }
    }
    for (int t = 0; t < mt; t++) out[t] = acc[t];
}

/* y[M, width] (outputs of weight w from column offset[w]) = xq's rows times the weights, as
   q4_linears computes them (plus bias, plus y with accumulate). xq, xd, xc: q4_kernel.c's
   quantized rows. */
void q4_gemm(int M, int K, int nw, const uint8_t *const *qw, const uint16_t *const *scales,
             const uint16_t *const *mins, const int *N, const float *const *bias, const int8_t *xq, const float *xd,
             const float *xc, float *y, int width, const int *offset, int accumulate) {
    const int G = K / GROUP;
    int first[9];
    joint_blocks(nw, N, first, NULL);
    const int blocks = first[nw];
    int *lo = malloc(sizeof(int) * 2 * (size_t)G), *hi = lo + G;
    for (int g = 0; g < G; g++) q4_halves(G, g, lo + g, hi + g);
#pragma omp parallel
    {
        __m512i *packed = aligned_alloc(64, sizeof(__m512i) * 4 * (size_t)G);
        float *scale = malloc(sizeof(float) * 32 * (size_t)G), *minv = scale + 16 * (size_t)G;
#pragma omp for schedule(static)
        for (int block = 0; block < blocks; block++) {
            int w = 0;
            while (block >= first[w + 1]) w++;
            const int n0 = (block - first[w]) * 16, n = N[w] - n0 < 16 ? N[w] - n0 : 16;
            const __mmask16 live = (__mmask16)((1u << n) - 1u);
            gather_block(qw[w], scales[w], mins[w], K, n0, n, packed, scale, minv);
            const __m512 b = bias[w] ? _mm512_maskz_loadu_ps(live, bias[w] + n0) : _mm512_setzero_ps();
            __m512 out[ROWS];
            for (int m0 = 0; m0 < M; m0 += ROWS) {
                const int mt = M - m0 < ROWS ? M - m0 : ROWS;
                switch (mt) {  /* each a constant: the accumulators stay in registers */
#define PASS(r) case r: rows_pass(r, m0, K, packed, scale, minv, xq, xd, xc, lo, hi, out); break;
                PASS(1) PASS(2) PASS(3) PASS(4) PASS(5) PASS(6) PASS(7) PASS(8)
#undef PASS
                }
                for (int t = 0; t < mt; t++) {
                    float *at = y + (size_t)(m0 + t) * width + offset[w] + n0;
                    __m512 v = _mm512_add_ps(out[t], b);
                    if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(live, at));
                    _mm512_mask_storeu_ps(at, live, v);
                }
            }
        }
        free(packed);
        free(scale);
    }
    free(lo);
}

#endif
