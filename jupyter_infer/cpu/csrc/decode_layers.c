/* A decode step's decoder layers in one call, for the Llama family with our int4, int8 or
   float32 linears (float32 activations): built into one library with the kernels and
   layer_ops.c (build.py).

   At one row the kernels are ~7.5 ms of a 0.5 B model's step, and calling them from Python,
   layer by layer, added ~1 ms: seven calls a layer with their argument checks, views and the
   cache's bookkeeping. Here a step's layers are one loop over the same functions, in the same
   order, with the same inputs: the result is the per-layer path's to the bit
   (decode_layers.py). */

#include <stdlib.h>
#include <string.h>

#include "kernels.h"

static void run(const joint_args *j, const float *x, int M, int K, float *y, int accumulate, const float *norm,
                float eps, int gated) {
    if (j->bits == 16)
        bf16_linears(x, M, K, j->nw, (const void *const *)j->qw, (const void *const *)j->scales,
                     (const void *const *)j->mins, j->N, j->bias, y, accumulate, norm, eps, gated);
    else if (j->bits == 32)
        f32_linears(x, M, K, j->nw, (const void *const *)j->qw, (const void *const *)j->scales,
                    (const void *const *)j->mins, j->N, j->bias, y, accumulate, norm, eps, gated);
    else if (j->bits == 8)
        q8_linears(x, M, K, j->nw, (const int8_t *const *)j->qw, j->scales, j->mins, j->N, j->bias,
                   y, accumulate, norm, eps, gated);
    else
        q4_linears(x, M, K, j->nw, j->qw, j->scales, j->mins, j->N, j->bias, y, accumulate, norm, eps, gated);
}

/* h[rows, hidden] (the residual stream, updated in place) through n_layers layers, one new token
   a row: norm, q/k/v (and their per-head norms), RoPE (cos and sin [rows, D]), the new key and value written at `column` of
   each layer's cache, attention over columns 0..column (mask [rows, column + 1], NULL: every
   one), o added into h, norm, gate/up, down of SwiGLU added into h. */
void ji_decode_layers(int n_layers, const layer_args *layers, int rows, int hidden, int heads, int kv_heads, int D,
                      int intermediate, float *h, const float *cos, const float *sin, int column,
                      const uint8_t *mask, float scale) {
    const int width = (heads + 2 * kv_heads) * D;
    float *qkv = malloc(sizeof(float) * (size_t)rows * width);
    float *attn = malloc(sizeof(float) * (size_t)rows * heads * D);
    float *gate_up = malloc(sizeof(float) * (size_t)rows * 2 * intermediate);
    for (int l = 0; l < n_layers; l++) {
        const layer_args *L = layers + l;
        run(&L->qkv, h, rows, hidden, qkv, 0, L->input_norm, L->input_eps, 0);
        if (L->q_norm) {
            ji_head_norm(qkv, rows, width, 0, heads, D, L->q_norm, L->head_eps);
            ji_head_norm(qkv, rows, width, heads, kv_heads, D, L->k_norm, L->head_eps);
        }
        ji_rope(qkv, rows, heads + kv_heads, width, D, cos, sin);
        for (int r = 0; r < rows; r++) {
            for (int g = 0; g < kv_heads; g++) {
                const size_t at = (size_t)r * L->kv_row + (size_t)g * L->kv_head + (size_t)column * D;
                memcpy(L->keys + at, qkv + (size_t)r * width + (size_t)(heads + g) * D, sizeof(float) * D);
                memcpy(L->values + at, qkv + (size_t)r * width + (size_t)(heads + kv_heads + g) * D, sizeof(float) * D);
            }
        }
        ji_attend_decode(qkv, rows, heads, kv_heads, D, width, L->keys, L->values, L->kv_row, L->kv_head, column + 1, mask,
                  scale, attn);
        run(&L->o, attn, rows, heads * D, h, 1, NULL, 0.f, 0);
        run(&L->gate_up, h, rows, hidden, gate_up, 0, L->post_norm, L->post_eps, 0);
        run(&L->down, gate_up, rows, intermediate, h, 1, NULL, 0.f, 1);
    }
    free(qkv);
    free(attn);
    free(gate_up);
}
