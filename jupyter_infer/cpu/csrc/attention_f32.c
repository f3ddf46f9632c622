/* A prompt's attention in float32 with AVX2 and FMA (issue 58): attention.c's kernel for the
   CPUs without a bfloat16 dot, every AVX2 machine (most laptops and desktops) among them.

   There torch's SDPA took ~30 % of a 3k-token prompt of the 0.5b shape; this is 1.3-1.6x it
   (docs/benchmark.md). Same plan as attention.c: causal, grouped heads, the online softmax
   (flash attention's), a task one query head's BQ rows against BK keys at a time, its scores
   never more than BQ x BK floats; here every product and sum is float32, so it is as exact as
   SDPA (the order of its sums aside).

   Keys are packed once a call, per key/value head, for the dot: a block of 8 keys is D 32-byte
   words, word d holding the 8 keys' dim d, so a query's broadcast dim meets 8 keys in one FMA;
   a register tile is RG rows x 16 keys. Values are read where they are (a row's D floats are
   contiguous): a row's broadcast probability meets 16 dims of a key's value per two FMAs.
   Every query head of a group reads the same packed keys.

   The arguments are attention.c's (ji_attend_prompt). Returns 0, or -1 where D is not a
   multiple of 16 (the caller runs SDPA instead). */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec8.h"
#include "kernels.h"

#define BQ 60 /* query rows a task: ten register tiles */
#define BK 64 /* keys a tile: eight blocks of 8 */
#define RG 6  /* rows a register tile: 12 accumulators, 2 weights, 1 broadcast of 16 registers */

/* Keys of every key/value head in blocks of 8 (Lp: L rounded up to BK; the padding is zeros,
   and masked anyway). */
static void pack_keys(const float *k, int kv_heads, long kv_head, int L, int Lp, int D, float *kp) {
    const int blocks = Lp / 8;
#pragma omp parallel for schedule(static)
    for (int task = 0; task < kv_heads * blocks; task++) {
        const int kvh = task / blocks, b = task % blocks;
        float *kb = kp + ((size_t)kvh * Lp + (size_t)b * 8) * D;
        for (int c = 0; c < 8; c++) {
            const int key = b * 8 + c;
            const float *kr = k + (size_t)kvh * kv_head + (size_t)key * D;
            for (int d = 0; d < D; d++) kb[(size_t)d * 8 + c] = key < L ? kr[d] : 0.f;
        }
    }
}

/* Scores of rows r0..r0+RG-1 against keys 16j..16j+15 of the tile, for each j < pairs (kt: the
   tile's first block). */
static inline void scores(const float *qb, int r0, int D, const float *kt, int pairs, float *s) {
    for (int j = 0; j < pairs; j++) {
        const float *k0 = kt + (size_t)(2 * j) * D * 8, *k1 = k0 + (size_t)D * 8;
        __m256 acc[RG][2];
        for (int r = 0; r < RG; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int d = 0; d < D; d++) {
            const __m256 w0 = _mm256_loadu_ps(k0 + (size_t)d * 8), w1 = _mm256_loadu_ps(k1 + (size_t)d * 8);
            for (int r = 0; r < RG; r++) {
                const __m256 x = _mm256_broadcast_ss(qb + (size_t)(r0 + r) * D + d);
                acc[r][0] = _mm256_fmadd_ps(x, w0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(x, w1, acc[r][1]);
            }
        }
        for (int r = 0; r < RG; r++) {
            _mm256_storeu_ps(s + (size_t)(r0 + r) * BK + 16 * j, acc[r][0]);
            _mm256_storeu_ps(s + (size_t)(r0 + r) * BK + 16 * j + 8, acc[r][1]);
        }
    }
}

/* o[r] = o[r] * alpha[r] + P[r] V over the tile's first nk keys, rows r0..r0+RG-1, dims
   d0..d0+15 (vt: the tile's first key's value; pb: the rows' probabilities, BK a row). */
static inline void weigh(const float *pb, const float *alpha, int r0, int d0, int D, const float *vt, int nk, float *o) {
    __m256 acc[RG][2];
    for (int r = 0; r < RG; r++) {
        const __m256 a = _mm256_set1_ps(alpha[r0 + r]);
        acc[r][0] = _mm256_mul_ps(_mm256_loadu_ps(o + (size_t)(r0 + r) * D + d0), a);
        acc[r][1] = _mm256_mul_ps(_mm256_loadu_ps(o + (size_t)(r0 + r) * D + d0 + 8), a);
    }
    for (int key = 0; key < nk; key++) {
        const __m256 w0 = _mm256_loadu_ps(vt + (size_t)key * D + d0), w1 = _mm256_loadu_ps(vt + (size_t)key * D + d0 + 8);
        for (int r = 0; r < RG; r++) {
            const __m256 x = _mm256_broadcast_ss(pb + (size_t)(r0 + r) * BK + key);
            acc[r][0] = _mm256_fmadd_ps(x, w0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(x, w1, acc[r][1]);
        }
    }
    for (int r = 0; r < RG; r++) {
        _mm256_storeu_ps(o + (size_t)(r0 + r) * D + d0, acc[r][0]);
        _mm256_storeu_ps(o + (size_t)(r0 + r) * D + d0 + 8, acc[r][1]);
    }
}

/* The online softmax over one tile for a row (limit: its last visible key in the tile, -1
   when none): running max m and sum l, the factor its sums so far are scaled by, and its
   probabilities in place of its scores (zeros past the limit). */
static inline void soften(float *s, int limit, float *m, float *l, float *alpha) {
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), ninf = _mm256_set1_ps(-INFINITY);
    const __m256 last = _mm256_set1_ps((float)limit);
    __m256 v[BK / 8], keep[BK / 8], top = ninf;
    for (int b = 0; b < BK / 8; b++) {
        keep[b] = _mm256_cmp_ps(_mm256_add_ps(lane, _mm256_set1_ps((float)(8 * b))), last, _CMP_LE_OQ);
        v[b] = _mm256_blendv_ps(ninf, _mm256_loadu_ps(s + 8 * b), keep[b]);
        top = _mm256_max_ps(top, v[b]);
    }
    const float t = hmax8(top), next = t > *m ? t : *m;
    /* The first tile: exp(-inf) = 0 (o and l are zeros anyway); a padding row sees nothing at
       all (next = -inf): 0 too, not exp of -inf - -inf. */
    *alpha = next == -INFINITY ? 0.f : expf(*m - next);
    const __m256 shift = _mm256_set1_ps(next == -INFINITY ? 0.f : next);
    __m256 total = _mm256_setzero_ps();
    for (int b = 0; b < BK / 8; b++) {
        const __m256 p = _mm256_and_ps(keep[b], exp8(_mm256_sub_ps(v[b], shift)));
        total = _mm256_add_ps(total, p);
        _mm256_storeu_ps(s + 8 * b, p);
    }
    *l = *l * *alpha + hsum8(total);
    *m = next;
}

int ji_attend_prompt_f32(const float *q, int T, int heads, long q_row, const float *k, const float *v, int kv_heads,
                         long kv_head, int L, int D, float scale, float *out) {
    if (D % 16 != 0 || T > L || heads % kv_heads != 0) return -1;
    const int Lp = (L + BK - 1) / BK * BK, group = heads / kv_heads, tiles = (T + BQ - 1) / BQ;
    float *kp = malloc(sizeof(float) * (size_t)kv_heads * Lp * D);
    if (kp == NULL) return -1;
    pack_keys(k, kv_heads, kv_head, L, Lp, D, kp);
    const int past = L - T;
#pragma omp parallel
    {
        float *qb = malloc(sizeof(float) * BQ * (size_t)D), *o = malloc(sizeof(float) * BQ * (size_t)D);
        float *s = malloc(sizeof(float) * BQ * BK);
        float m[BQ], l[BQ], alpha[BQ];
        /* The last query tiles see the most keys: they go first, so the threads end together. */
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < tiles * heads; task++) {
            const int tile = tiles - 1 - task / heads, h = task % heads, kvh = h / group;
            const int q0 = tile * BQ, nq = T - q0 < BQ ? T - q0 : BQ, rows = (nq + RG - 1) / RG * RG;
            for (int i = 0; i < BQ; i++) {
                const float *qi = q + (size_t)(q0 + i) * q_row + (size_t)h * D;
                for (int d = 0; d < D; d++) qb[(size_t)i * D + d] = i < nq ? qi[d] * scale : 0.f;
                m[i] = -INFINITY;
                l[i] = 0.f;
            }
            memset(o, 0, sizeof(float) * BQ * (size_t)D);
            const int seen = past + q0 + nq; /* keys the tile's last row sees */
            for (int k0 = 0; k0 < seen; k0 += BK) {
                const int nk = seen - k0 < BK ? seen - k0 : BK; /* keys of the tile anyone sees */
                const float *kt = kp + ((size_t)kvh * Lp + k0) * D;
                const float *vt = v + (size_t)kvh * kv_head + (size_t)k0 * D; /* no row past L is read */
                for (int r0 = 0; r0 < rows; r0 += RG) scores(qb, r0, D, kt, (nk + 15) / 16, s);
                for (int i = 0; i < rows; i++) {
                    const int last = past + q0 + i - k0; /* row i's last visible key, in the tile */
                    soften(s + (size_t)i * BK, i < nq ? (last < nk - 1 ? last : nk - 1) : -1, &m[i], &l[i], &alpha[i]);
                }
                for (int r0 = 0; r0 < rows; r0 += RG)
                    for (int d0 = 0; d0 < D; d0 += 16) weigh(s, alpha, r0, d0, D, vt, nk, o);
            }
            for (int i = 0; i < nq; i++) {
                const __m256 inv = _mm256_set1_ps(1.f / l[i]);
                float *dst = out + ((size_t)(q0 + i) * heads + h) * D;
                for (int d = 0; d < D; d += 8) _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_loadu_ps(o + (size_t)i * D + d), inv));
            }
        }
        free(qb);
        free(o);
        free(s);
    }
    free(kp);
    return 0;
}
