/* A prompt's attention in bfloat16 (issue 49): causal, grouped heads, without the score matrix.

   At 8k tokens a 1.5B model's prompt spent 45 % of its time in attention: torch's CPU flash
   kernel runs ~60-70 G multiply-adds/s on two cores in float32 and no faster in bfloat16,
   where the machine's bf16 dot (`vdpbf16ps`) peaks near 230. Here queries, keys and values are
   rounded to bfloat16 (llama.cpp keeps its cache in f16 for the same reason), their products
   summed in float32, and the softmax is online (flash attention's): a task is one query head's
   BQ rows against the keys BK at a time, its scores never more than BQ x BK floats.

   Keys are packed once a call, per key/value head, for the dot: a block of 16 keys is D/2
   64-byte words, lane c of word p holding key c's dims 2p, 2p+1, so one `vdpbf16ps` with a
   query's broadcast pair steps 16 keys' scores. Values are packed by key pairs: word (pair,
   16 dims) holds, per dim, the pair's two values, which a row's two probabilities (a bf16 pair,
   broadcast) meet. Every query head of a group reads the same packed keys and values.

   q [T, heads, D] (row q_row floats from the next), k and v [kv_heads, L, D] (a head kv_head
   floats from the next, a row D): the T queries are the last T positions of the L keys (query
   i sees keys 0 .. L - T + i). out [T, heads, D]. Where this build has no AVX512-BF16, or D is
   not a multiple of 64, attention_f32.c's float32 kernel serves; it returns -1 where D is not a
   multiple of 16 either (the caller runs SDPA instead). Returns 0 otherwise. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)

#define BQ 64 /* query rows a task */
#define BK 64 /* keys a tile: four blocks of 16 */
#define RG 4  /* rows a register tile */

static inline uint16_t bf16_of(float f) { /* round to nearest, even on ties */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* exp(x) in sixteen lanes: layer_ops.c's Cephes polynomial, 512 bits wide.
   Kept apart from vec8.h's exp8 on purpose: one helper for both widths would be a macro of intrinsics. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
    const __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                           _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(x, x), x), _mm512_set1_ps(1.f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

/* Keys and values of every key/value head in their packed forms (Lp: L rounded up to BK; the
   padding is zeros, and masked anyway). */
static void pack(const float *k, const float *v, int kv_heads, long kv_head, int L, int Lp, int D,
                 uint16_t *kp, uint16_t *vp) {
    const int blocks = Lp / 16;
#pragma omp parallel for schedule(static)
    for (int task = 0; task < kv_heads * blocks; task++) {
        const int kvh = task / blocks, b = task % blocks;
        uint16_t *kb = kp + ((size_t)kvh * Lp + (size_t)b * 16) * D; /* block b: D/2 words of 16 pairs */
        uint16_t *vb = vp + ((size_t)kvh * Lp + (size_t)b * 16) * D; /* 8 key pairs of D dims each */
        for (int c = 0; c < 16; c++) {
            const int key = b * 16 + c;
            const float *kr = k + (size_t)kvh * kv_head + (size_t)key * D;
            const float *vr = v + (size_t)kvh * kv_head + (size_t)key * D;
            for (int p = 0; p < D / 2; p++) {
                kb[((size_t)p * 16 + c) * 2] = key < L ? bf16_of(kr[2 * p]) : 0;
                kb[((size_t)p * 16 + c) * 2 + 1] = key < L ? bf16_of(kr[2 * p + 1]) : 0;
            }
            for (int d = 0; d < D; d++) vb[((size_t)(c / 2) * D + d) * 2 + c % 2] = key < L ? bf16_of(vr[d]) : 0;
        }
    }
}

/* Scores of rows r0..r0+3 against the tile's 64 keys (kt: its first block's packed words). */
static inline void scores(const uint32_t *qb, int r0, int D, const uint16_t *kt, float *s) {
    __m512 acc[RG][4];
    for (int r = 0; r < RG; r++)
        for (int b = 0; b < 4; b++) acc[r][b] = _mm512_setzero_ps();
    for (int p = 0; p < D / 2; p++) {
        __m512bh w[4];
        for (int b = 0; b < 4; b++) w[b] = (__m512bh)_mm512_loadu_si512((const void *)(kt + ((size_t)b * D / 2 + p) * 32));
        for (int r = 0; r < RG; r++) {
            const __m512bh x = (__m512bh)_mm512_set1_epi32((int)qb[(size_t)(r0 + r) * (D / 2) + p]);
            for (int b = 0; b < 4; b++) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], x, w[b]);
        }
    }
    for (int r = 0; r < RG; r++)
        for (int b = 0; b < 4; b++) _mm512_storeu_ps(s + (size_t)(r0 + r) * BK + 16 * b, acc[r][b]);
}

/* o[r] = o[r] * alpha[r] + P[r] V over the tile, rows r0..r0+3, dims d0..d0+63 (vt: the tile's
   first key pair's packed words; pb: the rows' probabilities, bf16, BK a row). */
static inline void weigh(const uint16_t *pb, const float *alpha, int r0, int d0, int D, const uint16_t *vt, float *o) {
    __m512 acc[RG][4];
    for (int r = 0; r < RG; r++) {
        const __m512 a = _mm512_set1_ps(alpha[r0 + r]);
        for (int b = 0; b < 4; b++) acc[r][b] = _mm512_mul_ps(_mm512_loadu_ps(o + (size_t)(r0 + r) * D + d0 + 16 * b), a);
    }
    for (int kp = 0; kp < BK / 2; kp++) {
        __m512bh w[4];
        for (int b = 0; b < 4; b++)
            w[b] = (__m512bh)_mm512_loadu_si512((const void *)(vt + ((size_t)kp * D + d0 + 16 * b) * 2));
        for (int r = 0; r < RG; r++) {
            const __m512bh x = (__m512bh)_mm512_set1_epi32((int)((const uint32_t *)(pb + (size_t)(r0 + r) * BK))[kp]);
            for (int b = 0; b < 4; b++) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], x, w[b]);
        }
    }
    for (int r = 0; r < RG; r++)
        for (int b = 0; b < 4; b++) _mm512_storeu_ps(o + (size_t)(r0 + r) * D + d0 + 16 * b, acc[r][b]);
}

/* The online softmax over one tile for row i (limit: its last visible key in the tile, BK - 1
   when it sees them all): running max m and sum l, the factor its sums so far are scaled by,
   and its probabilities as bf16. */
static inline void soften(float *s, int limit, float *m, float *l, float *alpha, uint16_t *pb) {
    __m512 v[4];
    __mmask16 keep[4];
    for (int b = 0; b < 4; b++) {
        const int n = limit + 1 - 16 * b; /* visible keys in this block */
        keep[b] = n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1u);
        v[b] = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), keep[b], s + 16 * b);
    }
    const float top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(v[0], v[1]), _mm512_max_ps(v[2], v[3])));
    const float next = top > *m ? top : *m;
    /* The first tile: exp(-inf) = 0 (o and l are zeros anyway); a padding row sees nothing at
       all (next = -inf): 0 too, not exp of -inf - -inf. */
    *alpha = next == -INFINITY ? 0.f : expf(*m - next);
    __m512 total = _mm512_setzero_ps();
    for (int b = 0; b < 4; b++) {
        const __m512 p = _mm512_maskz_mov_ps(keep[b], exp16(_mm512_sub_ps(v[b], _mm512_set1_ps(next))));
        total = _mm512_add_ps(total, p);
        _mm256_storeu_si256((__m256i *)(pb + 16 * b), (__m256i)_mm512_cvtneps_pbh(p));
    }
    *l = *l * *alpha + _mm512_reduce_add_ps(total);
    *m = next;
}

int ji_attend_prompt(const float *q, int T, int heads, long q_row, const float *k, const float *v, int kv_heads,
                     long kv_head, int L, int D, float scale, float *out) {
    if (D % 64 != 0) return ji_attend_prompt_f32(q, T, heads, q_row, k, v, kv_heads, kv_head, L, D, scale, out);
    if (T > L || heads % kv_heads != 0) return -1;
    const int Lp = (L + BK - 1) / BK * BK, group = heads / kv_heads, tiles = (T + BQ - 1) / BQ;
    uint16_t *kp = malloc(sizeof(uint16_t) * (size_t)kv_heads * Lp * D);
    uint16_t *vp = malloc(sizeof(uint16_t) * (size_t)kv_heads * Lp * D);
    pack(k, v, kv_heads, kv_head, L, Lp, D, kp, vp);
    const int past = L - T;
#pragma omp parallel
    {
        uint32_t *qb = malloc(sizeof(uint32_t) * BQ * (size_t)(D / 2));
        float *s = malloc(sizeof(float) * BQ * BK), *o = malloc(sizeof(float) * BQ * (size_t)D);
        uint16_t *pb = malloc(sizeof(uint16_t) * BQ * BK);
        float m[BQ], l[BQ], alpha[BQ];
        /* The last query tiles see the most keys: they go first, so the threads end together. */
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < tiles * heads; task++) {
            const int tile = tiles - 1 - task / heads, h = task % heads, kvh = h / group;
            const int q0 = tile * BQ, nq = T - q0 < BQ ? T - q0 : BQ, rows = (nq + RG - 1) / RG * RG;
            for (int i = 0; i < BQ; i++) {
                const float *qi = q + (size_t)(q0 + i) * q_row + (size_t)h * D;
                for (int p = 0; p < D / 2; p++)
                    qb[(size_t)i * (D / 2) + p] = i < nq ? bf16_of(qi[2 * p] * scale) | (uint32_t)bf16_of(qi[2 * p + 1] * scale) << 16 : 0;
                m[i] = -INFINITY;
                l[i] = 0.f;
            }
            memset(o, 0, sizeof(float) * BQ * (size_t)D);
            const int seen = past + q0 + nq; /* keys the tile's last row sees */
            for (int k0 = 0; k0 < seen; k0 += BK) {
                const uint16_t *kt = kp + ((size_t)kvh * Lp + k0) * D, *vt = vp + ((size_t)kvh * Lp + k0) * D;
                for (int r0 = 0; r0 < rows; r0 += RG) scores(qb, r0, D, kt, s);
                for (int i = 0; i < rows; i++) {
                    const int last = past + q0 + i - k0; /* row i's last visible key, in the tile */
                    soften(s + (size_t)i * BK, i < nq ? (last < BK - 1 ? last : BK - 1) : -1, &m[i], &l[i], &alpha[i],
                           pb + (size_t)i * BK);
                }
                for (int r0 = 0; r0 < rows; r0 += RG)
                    for (int d0 = 0; d0 < D; d0 += 64) weigh(pb, alpha, r0, d0, D, vt, o);
            }
            for (int i = 0; i < nq; i++) {
                const __m512 inv = _mm512_set1_ps(1.f / l[i]);
                float *dst = out + ((size_t)(q0 + i) * heads + h) * D;
                for (int d = 0; d < D; d += 16) _mm512_storeu_ps(dst + d, _mm512_mul_ps(_mm512_loadu_ps(o + (size_t)i * D + d), inv));
            }
        }
        free(qb);
        free(s);
        free(o);
        free(pb);
    }
    free(kp);
    free(vp);
    return 0;
}

#else

int ji_attend_prompt(const float *q, int T, int heads, long q_row, const float *k, const float *v, int kv_heads,
                     long kv_head, int L, int D, float scale, float *out) {
    return ji_attend_prompt_f32(q, T, heads, q_row, k, v, kv_heads, kv_head, L, D, scale, out); /* no bf16 dot here */
}

#endif
