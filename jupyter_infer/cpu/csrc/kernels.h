/* Every entry point of the CPU kernel library, and the pieces its files share: one place for
   the C side of what kernels.py declares to Python (jupyter_infer/cpu/kernels.py). The library
   is built from every .c file here into one shared object (build.py). */

#ifndef JUPYTER_INFER_KERNELS_H
#define JUPYTER_INFER_KERNELS_H

#include <stdint.h>

/* -- linears over one input (a joint: q/k/v, gate/up), one kind a joint ----------------------
   x [M, K] float32; nw linears with weights qw[i] (and scales, mins: the format's), N[i]
   outputs and an optional float32 bias each; y [M, sum N] (added to with accumulate); norm
   (RMSNorm weight, eps) on the way in, or gated: x is [M, 2K] gate | up, the linears read
   swiglu(x). */
void q4_linears(const float *x, int M, int K, int nw, const uint8_t *const *qw, const uint16_t *const *scales,
                const uint16_t *const *mins, const int *N, const float *const *bias, float *y, int accumulate,
                const float *norm, float eps, int gated);
void q8_linears(const float *x, int M, int K, int nw, const int8_t *const *qw, const uint16_t *const *scales,
                const uint16_t *const *mins, const int *N, const float *const *bias, float *y, int accumulate,
                const float *norm, float eps, int gated);
void f32_linears(const float *x, int M, int K, int nw, const void *const *qw, const void *const *scales,
                 const void *const *mins, const int *N, const float *const *bias, float *y, int accumulate,
                 const float *norm, float eps, int gated);
void bf16_linears(const float *x, int M, int K, int nw, const void *const *qw, const void *const *scales,
                  const void *const *mins, const int *N, const float *const *bias, float *y, int accumulate,
                  const float *norm, float eps, int gated);
/* One int4 linear (int4.c) and the two formats' quantizers. */
void q4_linear(const float *x, int M, int K, const uint8_t *qw, const uint16_t *scales, const uint16_t *mins,
               int N, const float *bias, float *y);
void q4_quantize(const float *w, int N, int K, uint8_t *nibbles, uint16_t *scales);
void q8_quantize(const float *w, int N, int K, int8_t *blocks, uint16_t *scales);

/* -- the decoder's small ops (layer_ops.c) ---------------------------------------------------- */
void ji_rms_norm(const float *x, int M, int K, const float *w, float eps, float *y);
void ji_swiglu(const float *x, int M, int K, float *y);
void ji_head_norm(float *x, int T, int stride, int first, int heads, int D, const float *w, float eps);
void ji_rope(float *x, int T, int heads, int stride, int D, const float *cos, const float *sin);
void ji_attend_decode(const float *q, int rows, int heads, int kv_heads, int D, long q_stride, const float *k,
                      const float *v, long kv_row, long kv_head, int L, const uint8_t *mask, float scale, float *out);
/* A prompt's causal attention in bfloat16 (attention.c): 0, or -1 where this build cannot. */
int ji_attend_prompt(const float *q, int T, int heads, long q_row, const float *k, const float *v, int kv_heads,
                     long kv_head, int L, int D, float scale, float *out);
/* The same in float32 with AVX2 (attention_f32.c): where the build has no bfloat16 dot. */
int ji_attend_prompt_f32(const float *q, int T, int heads, long q_row, const float *k, const float *v, int kv_heads,
                         long kv_head, int L, int D, float scale, float *out);

/* -- a decode step's layers in one call (decode_layers.c) ----------------------------------------
   Linears over one input, as q4_linears (bits 4), q8_linears (bits 8), bf16_linears (bits 16) or
   f32_linears (bits 32) takes them (q/k/v, o, gate/up, down). Python declares this struct and
   layer_args once, in kernels.py (JointArgs, LayerArgs): a change here is a change there. */
typedef struct {
    int bits;
    int nw;
    const uint8_t *const *qw;
    const uint16_t *const *scales;
    const uint16_t *const *mins;
    const int *N;
    const float *const *bias;
} joint_args;

/* One decoder layer: its linears, its two norms (and Qwen3's per-head q and k norms; NULL: none),
   and its KV cache buffers [rows, kv_heads, capacity, D] (a row kv_row floats from the next, a
   head kv_head). */
typedef struct {
    joint_args qkv, o, gate_up, down;
    const float *input_norm, *post_norm, *q_norm, *k_norm;
    float input_eps, post_eps, head_eps;
    float *keys, *values;
    long kv_row, kv_head;
} layer_args;

void ji_decode_layers(int n_layers, const layer_args *layers, int rows, int hidden, int heads, int kv_heads, int D,
                      int intermediate, float *h, const float *cos, const float *sin, int column,
                      const uint8_t *mask, float scale);

/* -- the build's self-test, run in a child process before a server loads the library (probe.c) */
int ji_probe(void);
/* -- the machine's multiply-add peak, for the bench (peak.c): kind 0 int8, 1 bfloat16, 2 float32;
   every thread runs iters rounds; returns the multiply-adds done */
double ji_peak(int kind, long iters);

/* -- shared between the files ------------------------------------------------------------------- */
/* The rows' way in (layer_ops.c): the decoder's norm, or SwiGLU of gate and up. */
float *way_in(const float *x, int M, int K, const float *norm, float eps, int gated);
void way_in_row(const float *x, int m, int K, const float *norm, float eps, int gated, float *row);

/* A joint of nw <= 8 linears (q/k/v, gate/up) whose outputs sit side by side in y: its blocks of 16
   outputs are numbered across the weights, as every kernel's parallel loop takes them
   (layer_ops.c). */
typedef struct {
    int blocks, width;       /* blocks in all; y's width, the sum of N */
    int first[9], offset[9]; /* weight w's first block; its first column of y */
    const int *N;
    const float *const *bias; /* bias[w]: NULL for none */
    float *y;
    int accumulate; /* y += instead of y = */
} joint;
typedef struct {
    int w, b, n0, n; /* weight w's block b: its outputs n0..n0+n-1 (n <= 16) */
} joint_block;
/* Rows a kernel takes a tile at a time (all its blocks over one tile, then the next): as many as
   keep bytes_per * K bytes a row within TILE_BYTES, a multiple of 24 (every kernel's register
   tile, 4, 6 or 8 rows, divides it), all M when they fit. */
#ifndef TILE_BYTES
#define TILE_BYTES (256 * 1024)
#endif
static inline int row_tile(int M, int K, int bytes_per) {
    int rows = TILE_BYTES / (K * bytes_per) / 24 * 24;
    if (rows < 24) rows = 24;
    return rows < M ? rows : M;
}
joint joint_of(int nw, const int *N, const float *const *bias, float *y, int accumulate);
joint_block joint_block_at(const joint *j, int block);
/* A block's sums for rows m0..m0+mt-1 into y (plus the bias, added to y with accumulate). */
void joint_store(const joint *j, joint_block at, const float (*sums)[16], int m0, int mt);
/* int4.c: one row as int8 per group in natural order, each group's scale and sum of ints. */
void q8_row(const float *x, int K, int8_t *xq, float *xd, int32_t *xs);

/* The rows q4_linears and q8_linears read (int4.c): x through its way in (norm or SwiGLU), then
   int8 per group of 32 in natural order, each group's scale and sum of ints. */
typedef struct {
    int8_t *xq;
    float *xd;
    int32_t *xs;
} q8_rows;
q8_rows q8_rows_of(const float *x, int M, int K, const float *norm, float eps, int gated);
void q8_rows_free(q8_rows *rows);

#endif
