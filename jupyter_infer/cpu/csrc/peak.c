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
/* Twelve chains as twelve variables (an array of them would live in memory). CHAINS declares the
   operands a (a0) and b (b0, constant), of type operand, and the chains, of type chain (SET: a
   chain's start); each round steps every chain by one dot instruction (OP; both defined where
   CHAINS is used), then the chains and a are made opaque to the compiler (an empty asm, free at
   run time), so it can neither fold the loop nor hoist an instruction out of it. It returns the
   multiply-adds done: lanes a step in each of ACC chains. */
#define EACH(f) f(0) f(1) f(2) f(3) f(4) f(5) f(6) f(7) f(8) f(9) f(10) f(11)
#define INIT(i) c##i = SET(i),
#define STEP(i) c##i = OP(c##i);
#define OPAQUE(i) __asm__ volatile("" : "+v"(c##i));
#define CHAINS(chain, operand, a0, b0, lanes)      \
    operand a = a0;                                \
    const operand b = b0;                          \
    chain EACH(INIT) unused_ = SET(0);             \
    (void)unused_;                                 \
    for (long n = 0; n < iters; n++) {             \
        EACH(STEP)                                 \
        EACH(OPAQUE)                               \
        __asm__ volatile("" : "+v"(a));            \
    }                                              \
    return (lanes) * ACC * (double)iters;

static double int8_chains(long iters, uint32_t seed) {
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#define SET(i) _mm512_set1_epi32(i)
#define OP(c) _mm512_dpbusd_epi32(c, a, b)
    CHAINS(__m512i, __m512i, _mm512_set1_epi32((int)seed), _mm512_set1_epi32((int)(seed >> 1)), 64.0)
#elif defined(__AVXVNNI__)
#define SET(i) _mm256_set1_epi32(i)
#define OP(c) _mm256_dpbusd_avx_epi32(c, a, b)
    CHAINS(__m256i, __m256i, _mm256_set1_epi32((int)seed), _mm256_set1_epi32((int)(seed >> 1)), 32.0)
#else /* AVX2: two instructions for 32 multiply-adds, as our AVX2 kernels pay them */
    const __m256i one = _mm256_set1_epi16(1);
#define SET(i) _mm256_set1_epi32(i)
#define OP(c) _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), one))
    CHAINS(__m256i, __m256i, _mm256_set1_epi32((int)seed), _mm256_set1_epi32((int)(seed >> 1)), 32.0)
#endif
#undef SET
#undef OP
}

static double float_chains(long iters, int bf16) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    if (bf16) {
#define SET(i) _mm512_set1_ps((float)(i))
#define OP(c) _mm512_dpbf16_ps(c, a, b)
        CHAINS(__m512, __m512bh, (__m512bh)_mm512_set1_epi32(0x3f803f80), (__m512bh)_mm512_set1_epi32(0x00010001), 32.0)
#undef SET
#undef OP
    }
#else
    (void)bf16; /* our bf16 kernel widens to float32 FMAs here: that is its peak */
#endif
#if defined(__AVX512F__)
#define SET(i) _mm512_set1_ps((float)(i))
#define OP(c) _mm512_fmadd_ps(c, a, b)
    CHAINS(__m512, __m512, _mm512_set1_ps(0.999f), _mm512_set1_ps(1e-7f), 16.0)
#else
#define SET(i) _mm256_set1_ps((float)(i))
#define OP(c) _mm256_fmadd_ps(c, a, b)
    CHAINS(__m256, __m256, _mm256_set1_ps(0.999f), _mm256_set1_ps(1e-7f), 8.0)
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
