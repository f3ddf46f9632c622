/* The joint loop of the integer kernels, written once and included by int4.c and int8.c (a
   template, as CPython's Objects/stringlib is): the includer defines GROUP, BLOCK, BLOCK_GROUP,
   ROWS, its block_rows (r rows of one block against int8 rows, r a constant in each call),
   JOINT_LINEARS (the function's name) and JOINT_WEIGHT (a block's byte type).

   Several linears over one input x[M, K] (K a multiple of 32), outputs side by side in y[M, sum
   of N]: q, k and v, or gate and up, read x's quantization once and share one parallel loop.
   With accumulate, y += x @ W^T (a residual added where the output lands). With norm (NULL:
   none), x is first RMS-normalized per row with those weights and eps; with gated, x is [M, 2K],
   gate and up side by side, and the linears read silu(gate) * up (q8_rows_of). Weight w: qw[w]
   its blocks, scales[w] their scales, mins[w] (int4 only; NULL: q4_0's form) blocked as the
   scales, N[w] and bias[w] (NULL: none). */
void JOINT_LINEARS(const float *x, int M, int K, int nw, const JOINT_WEIGHT *const *qw,
                   const uint16_t *const *scales, const uint16_t *const *mins, const int *N,
                   const float *const *bias, float *y, int accumulate, const float *norm, float eps, int gated) {
    const int G = K / GROUP;
    q8_rows rows = q8_rows_of(x, M, K, norm, eps, gated);
    const joint j = joint_of(nw, N, bias, y, accumulate);
    /* Rows a tile at a time, every block over one tile before the next: the tile's int8 rows
       stay in cache while each block's weights stream past (a 3k-token prompt's rows are
       megabytes; read again per block of 16 outputs, they came from memory).
       float.c's linears() writes this loop out too: shared, the hot body would sit behind a callback or macro. */
    const int tile = row_tile(M, K, 1);
#pragma omp parallel
    for (int t0 = 0; t0 < M; t0 += tile) {
        const int t1 = M - t0 < tile ? M : t0 + tile;
#pragma omp for schedule(static) nowait
        for (int block = 0; block < j.blocks; block++) {
            const joint_block at = joint_block_at(&j, block);
            const size_t first = (size_t)at.b * G;
            const JOINT_WEIGHT *blk = qw[at.w] + first * BLOCK_GROUP;
            const uint16_t *sc = scales[at.w] + first * BLOCK;
            const uint16_t *mn = mins && mins[at.w] ? mins[at.w] + first * BLOCK : NULL;
#if ROWS == 8
            __m512 out[ROWS];
#else
            float out[ROWS][BLOCK];
#endif
            for (int m0 = t0; m0 < t1; m0 += ROWS) {
                const int mt = t1 - m0 < ROWS ? t1 - m0 : ROWS;
                switch (mt) { /* each a constant: the accumulators stay in registers */
#define PASS(r) case r: block_rows(r, m0, K, blk, sc, mn, rows.xq, rows.xd, rows.xs, out); break;
                PASS(1) PASS(2) PASS(3) PASS(4)
#if ROWS == 8
                PASS(5) PASS(6) PASS(7) PASS(8)
#endif
#undef PASS
                }
                joint_store(&j, at, (const float (*)[BLOCK])out, m0, mt);
            }
        }
    }
    q8_rows_free(&rows);
}
