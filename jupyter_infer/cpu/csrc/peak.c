/* The machine's multiply-add peak, measured (issue 49): what the bench holds our linears
   against, instead of a figure from a datasheet. Each thread runs `iters` rounds of ACC
   independent chains of the widest instruction this build has for the kind, with nothing else
   in the loop (no loads, no stores); the caller times the call.

   kind 0: int8 (AVX-512 VNNI `vpdpbusd` zmm, AVX-VNNI ymm, else AVX2 `vpmaddubsw` + `vpmaddwd`:
   two instructions for 32 multiply-adds, as our AVX2 kernels pay them). kind 1: bfloat16
   (`vdpbf16ps` zmm where AVX512-BF16 builds, else float32 FMA, which is what our bf16 kernel
   runs there). kind 2: float32 FMA. Returns the multiply-adds done, in all threads. */

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include "kernels.h"

#define ACC 12 /* independent chains: more than a dot unit's latency times its ports */
/* Twelve chains as twelve variables (an array of them would live in memory). Each round steps
   every chain by one dot instruction (OP, defined where it is used); then the chains and x are
   made opaque to the compiler (an empty asm, free at run time), so it can neither fold the loop
   nor hoist an instruction out of it. */
#define EACH(f) f(0) f(1) f(2) f(3) f(4) f(5) f(6) f(7) f(8) f(9) f(10) f(11)
#define INIT(i) c##i = SET(i),
#define STEP(i) c##i = OP(c##i);
#define OPAQUE(i) __asm__ volatile("" : "+v"(c##i));
#define ROUNDS(type, x)                            \
    type EACH(INIT) unused_ = SET(0);              \
    (void)unused_;                                 \
    for (long n = 0; n < iters; n++) {             \
        EACH(STEP)                                 \
        EACH(OPAQUE)                               \
        __asm__ volatile("" : "+v"(x));            \
    }

static double int8_chains(long iters, uint32_t seed) {
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
    __m512i a = _mm512_set1_epi32((int)seed);
    const __m512i b = _mm512_set1_epi32((int)(seed >> 1));
#define SET(i) _mm512_set1_epi32(i)
#define OP(c) _mm512_dpbusd_epi32(c, a, b)
    ROUNDS(__m512i, a)
    return 64.0 * ACC * (double)iters;
#elif defined(__AVXVNNI__)
    __m256i a = _mm256_set1_epi32((int)seed);
    const __m256i b = _mm256_set1_epi32((int)(seed >> 1));
#define SET(i) _mm256_set1_epi32(i)
#define OP(c) _mm256_dpbusd_avx_epi32(c, a, b)
    ROUNDS(__m256i, a)
    return 32.0 * ACC * (double)iters;
#else /* AVX2: two instructions for 32 multiply-adds, as our AVX2 kernels pay them */
    __m256i a = _mm256_set1_epi32((int)seed);
    const __m256i b = _mm256_set1_epi32((int)(seed >> 1)), one = _mm256_set1_epi16(1);
#define SET(i) _mm256_set1_epi32(i)
#define OP(c) _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), one))
    ROUNDS(__m256i, a)
    return 32.0 * ACC * (double)iters;
#endif
#undef SET
#undef OP
}

static double float_chains(long iters, int bf16) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    if (bf16) {
        __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);
        const __m512bh b = (__m512bh)_mm512_set1_epi32(0x00010001);
#define SET(i) _mm512_set1_ps((float)(i))
#define OP(c) _mm512_dpbf16_ps(c, a, b)
        ROUNDS(__m512, a)
#undef SET
#undef OP
        return 32.0 * ACC * (double)iters;
    }
#else
    (void)bf16; /* our bf16 kernel widens to float32 FMAs here: that is its peak */
#endif
#if defined(__AVX512F__)
    __m512 a = _mm512_set1_ps(0.999f);
    const __m512 b = _mm512_set1_ps(1e-7f);
#define SET(i) _mm512_set1_ps((float)(i))
#define OP(c) _mm512_fmadd_ps(c, a, b)
    ROUNDS(__m512, a)
    return 16.0 * ACC * (double)iters;
#else
    __m256 a = _mm256_set1_ps(0.999f);
    const __m256 b = _mm256_set1_ps(1e-7f);
#define SET(i) _mm256_set1_ps((float)(i))
#define OP(c) _mm256_fmadd_ps(c, a, b)
    ROUNDS(__m256, a)
    return 8.0 * ACC * (double)iters;
#endif
#undef SET
#undef OP
}

double ji_peak(int kind, long iters) {
    double done = 0.0;
#pragma omp parallel reduction(+ : done)
    done += kind == 0 ? int8_chains(iters, 0x01020304u + (uint32_t)omp_get_thread_num()) : float_chains(iters, kind == 1);
    return done;
}
