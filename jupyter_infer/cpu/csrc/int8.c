/* 8-bit weights in groups of 32 (llama.cpp's q8_0: an int8 each and a float16 scale a group,
   8.5 bits a weight) times 8-bit activations, on an x86 CPU with AVX2 (int8_linear.py).

   The weights are stored in blocks of 16 outputs: for a block and a group, eight 64-byte words
   where lane o (4 bytes) holds output o's weights 4j..4j+3 (j the word), then the block's 16
   scales of that group side by side. A row's activations, quantized to int8 per group in their
   natural order, are broadcast four at a time against a word: one dpbusd (VNNI) sums 4
   products for 16 outputs, a group is 8 of them, and its int32 sums meet the two scales in one
   FMA. The same loop serves one row (a stream of the weights, in order) and many (8 rows share
   each word from registers). int4.c keeps its nibbles in the same blocks.

   dpbusd multiplies unsigned by signed bytes: the weights (signed, -127..127) are flipped to
   q + 128 as they are loaded, and 128 times the group's sum of activations taken off the int32
   sum, exactly. Without VNNI, AVX2's maddubs takes |q| against the activations with q's sign. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"

#define GROUP 32
#define BLOCK 16                      /* outputs a block */
#define WORDS (GROUP / 4)             /* 64-byte words a group of a block */
#define BLOCK_GROUP (WORDS * 64)      /* bytes of weights a group of a block */


#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define ROWS 8
/* Rows m0..m0+mt of one block: out[t] = sum over groups of scale * xd * dot. */
static inline __attribute__((always_inline)) void block_rows(int mt, int m0, int K, const int8_t *blk,
                                                             const uint16_t *sc, const uint16_t *mn, const int8_t *xq, const float *xd,
                                                             const int32_t *xs, __m512 *out) {
    (void)mn; /* q8_0 has no minimums */
    const int G = K / GROUP;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[ROWS];
    for (int t = 0; t < mt; t++) acc[t] = _mm512_setzero_ps();
    for (int g = 0; g < G; g++) {
        const int8_t *wg = blk + (size_t)g * BLOCK_GROUP;
        _mm_prefetch((const char *)(wg + 4096), _MM_HINT_T0);
        _mm_prefetch((const char *)(wg + 4096 + 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(wg + 4096 + 128), _MM_HINT_T0);
        _mm_prefetch((const char *)(wg + 4096 + 192), _MM_HINT_T0);
        _mm_prefetch((const char *)(wg + 4096 + 256), _MM_HINT_T0);
        _mm_prefetch((const char *)(wg + 4096 + 320), _MM_HINT_T0);
        _mm_prefetch((const char *)(wg + 4096 + 384), _MM_HINT_T0);
        _mm_prefetch((const char *)(wg + 4096 + 448), _MM_HINT_T0);
        __m512i w[WORDS];
        for (int j = 0; j < WORDS; j++) w[j] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(wg + 64 * j)), flip);
        const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + (size_t)g * BLOCK)));
        for (int t = 0; t < mt; t++) {
            const size_t m = (size_t)(m0 + t);
            const int8_t *x = xq + m * K + g * GROUP;
            __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
            for (int j = 0; j < WORDS; j += 2) {
                d0 = _mm512_dpbusd_epi32(d0, w[j], _mm512_set1_epi32(*(const int32_t *)(x + 4 * j)));
                d1 = _mm512_dpbusd_epi32(d1, w[j + 1], _mm512_set1_epi32(*(const int32_t *)(x + 4 * j + 4)));
            }
            const __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(d0, d1), _mm512_set1_epi32(xs[m * G + g] * 128));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s, _mm512_set1_ps(xd[m * G + g])), acc[t]);
        }
    }
    for (int t = 0; t < mt; t++) out[t] = acc[t];
}

#else
#define ROWS 4
/* The same with 256-bit registers: a block's 16 outputs are two halves of 8. */
#if defined(__AVXVNNI__)
#define DOT4(acc, w, x) _mm256_dpbusd_avx_epi32(acc, _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80)), x)
#define FLIPPED 1
#else
#define DOT4(acc, w, x) \
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)), \
                                            _mm256_set1_epi16(1)))
#define FLIPPED 0
#endif
static inline __attribute__((always_inline)) void block_rows(int mt, int m0, int K, const int8_t *blk,
                                                             const uint16_t *sc, const uint16_t *mn, const int8_t *xq, const float *xd,
                                                             const int32_t *xs, float (*out)[BLOCK]) {
    (void)mn; /* q8_0 has no minimums */
    const int G = K / GROUP;
    __m256 acc[ROWS][2];
    for (int t = 0; t < mt; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int g = 0; g < G; g++) {
        const int8_t *wg = blk + (size_t)g * BLOCK_GROUP;
        _mm_prefetch((const char *)(wg + 4096), _MM_HINT_T0);
        _mm_prefetch((const char *)(wg + 4096 + 256), _MM_HINT_T0);
        const __m256 s0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + (size_t)g * BLOCK)));
        const __m256 s1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + (size_t)g * BLOCK + 8)));
        for (int t = 0; t < mt; t++) {
            const size_t m = (size_t)(m0 + t);
            const int8_t *x = xq + m * K + g * GROUP;
            __m256i d0 = _mm256_setzero_si256(), d1 = _mm256_setzero_si256();
            for (int j = 0; j < WORDS; j++) {
                const __m256i xb = _mm256_set1_epi32(*(const int32_t *)(x + 4 * j));
                d0 = DOT4(d0, _mm256_loadu_si256((const __m256i *)(wg + 64 * j)), xb);
                d1 = DOT4(d1, _mm256_loadu_si256((const __m256i *)(wg + 64 * j + 32)), xb);
            }
            if (FLIPPED) {
                const __m256i off = _mm256_set1_epi32(xs[m * G + g] * 128);
                d0 = _mm256_sub_epi32(d0, off);
                d1 = _mm256_sub_epi32(d1, off);
            }
            const __m256 f = _mm256_set1_ps(xd[m * G + g]);
            acc[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_mul_ps(s0, f), acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_mul_ps(s1, f), acc[t][1]);
        }
    }
    for (int t = 0; t < mt; t++) {
        _mm256_storeu_ps(out[t], acc[t][0]);
        _mm256_storeu_ps(out[t] + 8, acc[t][1]);
    }
}

#endif

#define JOINT_LINEARS q8_linears
#define JOINT_WEIGHT int8_t
#include "q8_joint.h"

/* W [N, K] -> blocks (ceil(N/16) * K * 16 bytes) and their scales (ceil(N/16) * K/32 * 16
   float16): q8_0's rounding (scale = max|w| / 127 as float16, q = round(w / scale)), laid out
   as above; a last block's missing outputs are zero. */
void q8_quantize(const float *w, int N, int K, int8_t *blocks, uint16_t *scales) {
    const int G = K / GROUP, NB = (N + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < NB; b++) {
        for (int g = 0; g < G; g++) {
            int8_t *wg = blocks + ((size_t)b * G + g) * BLOCK_GROUP;
            uint16_t *sg = scales + ((size_t)b * G + g) * BLOCK;
            for (int o = 0; o < BLOCK; o++) {
                const int n = b * BLOCK + o;
                if (n >= N) {
                    sg[o] = 0;
                    for (int i = 0; i < GROUP; i++) wg[64 * (i / 4) + 4 * o + i % 4] = 0;
                    continue;
                }
                const float *v = w + (size_t)n * K + g * GROUP;
                float amax = 0.f;
                for (int i = 0; i < GROUP; i++) amax = fmaxf(amax, fabsf(v[i]));
                sg[o] = _cvtss_sh(amax / 127.f, _MM_FROUND_TO_NEAREST_INT);
                const float d = _cvtsh_ss(sg[o]), inv = d > 0.f ? 1.f / d : 0.f;
                for (int i = 0; i < GROUP; i++) {
                    const float q = fminf(fmaxf(rintf(v[i] * inv), -127.f), 127.f);
                    wg[64 * (i / 4) + 4 * o + i % 4] = (int8_t)q;
                }
            }
        }
    }
}
