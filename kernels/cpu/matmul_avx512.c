/*
 * matmul_avx512.c -- y = x W^T with AVX-512, for F32 / F16 / BF16 weights.
 *
 * Decode (T == 1) is a matrix-vector product bounded by memory bandwidth: the weights are
 * streamed once against the vector x, several rows interleaved (see gemv below).
 *
 * Prefill (T > 1) is compute-bound. The rows are taken in blocks of PF_NB and K in chunks of
 * PF_KC; a block's chunk stays in L2 while every token passes over it, 4 rows x 4 tokens at a
 * time (16 accumulators in registers; F16 / BF16 converted in registers as they are loaded,
 * which measured as fast as converting the block once into a buffer). While the first tokens
 * pass, the next block is prefetched, so DRAM and the FMA units work at the same time. Partial
 * sums over K chunks are added into y.
 *
 * Batch invariance (kernels.h): decode and prefill compute each output y[t][n] with the same
 * float operations in the same order (K chunks of PF_KC, one FMA chain of 16 lanes per chunk,
 * v16_hsum4's tree, chunk sums added in order), so y[t] is bit-identical whatever T, the
 * token's place in the batch and the rows' split between threads.
 */
#include "kernels/cpu/impl.h"
#include "kernels/cpu/vec_avx512.h"

/* ---- decode ------------------------------------------------------------------------------ */

/* Decode computes every output with exactly the arithmetic of prefill's gemm (below), so that
 * y[t] depends only on W and x[t] (kernels.h): K in chunks of PF_KC elements; per chunk one
 * accumulator of 16 lanes per output, fmadd(w, x) over steps of 16 from the chunk's start
 * (the last step masked: w and x lanes past K are 0), summed by v16_hsum4's tree; the chunk
 * sums added into y in order (y = s_0, then y = y + s_c). Only the traversal differs: prefill
 * passes tiles of 4 rows x 4 tokens over a block held in L2, decode streams the rows, one FMA
 * chain each.
 *
 * Measured on Zen 4 (one thread, weights from DRAM): the weights stream fastest while x stays
 * in L1 between rows; once a row plus x overflow L1, x is refetched from L2 for every row and
 * the stream slows by a third. Long rows are therefore read 16 at a time (each x load then
 * serves 16 rows), shorter ones 4 at a time from 8 KiB a row, else one after another (one
 * forward stream; interleaving 4 F16 rows of 4 KiB measured a quarter slower, 4 F32 rows of
 * 8 KiB a tenth faster than one at a time). */
#define PF_KC 1024         /* K elements per chunk (prefill's blocking; decode sums the same way) */
#define SEQ_BYTES 24576    /* rows with K * (4 + weight size) up to this are read 1 or 4 at a time */
#define MULTI_BYTES 8192   /* ... 4 at a time from this many bytes a row */
#define WIDE 16            /* rows read together otherwise */

/* out[i] = W[w[i]] . x for R rows (R = 1, or a multiple of 4 up to WIDE; rows may repeat:
 * callers pad a short group that way).  W: [*][K] of wt (w[i]: the row's first element); x: [K]; out: [R]. */
IFK_INLINE void gemv_tile(int wt, const int R, float *out, const void *W, const size_t *w, const float *x, int K)
{
    for (int k0 = 0; k0 < K; k0 += PF_KC) {
        const int kc = K - k0 < PF_KC ? K - k0 : PF_KC, len16 = kc & ~15;
        __m512 acc[WIDE];
#pragma GCC unroll 16
        for (int i = 0; i < R; i++)
            acc[i] = _mm512_setzero_ps();
        int k = 0;
        for (; k < len16; k += 16) {
            __m512 xv = _mm512_loadu_ps(x + k0 + k);
#pragma GCC unroll 16
            for (int i = 0; i < R; i++)
                acc[i] = _mm512_fmadd_ps(v16_load_w(W, wt, w[i] + k0 + k), xv, acc[i]);
        }
        if (k < kc) {
            __mmask16 m = v16_mask(kc - k);
            __m512 xv = _mm512_maskz_loadu_ps(m, x + k0 + k);
#pragma GCC unroll 16
            for (int i = 0; i < R; i++)
                acc[i] = _mm512_fmadd_ps(v16_load_w_mask(W, wt, w[i] + k0 + k, m), xv, acc[i]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < R; i += 4) {
            float s[4];
            if (R == 1) /* the same tree for one vector */
                _mm_storeu_ps(s, v16_hsum4(acc[0], acc[0], acc[0], acc[0]));
            else
                _mm_storeu_ps(s, v16_hsum4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]));
            for (int j = 0; j < (R < 4 ? R : 4); j++)
                out[i + j] = k0 == 0 ? s[j] : out[i + j] + s[j];
        }
    }
}

/* y[n] = W[n] . x for n0 <= n < n1, R rows at a time (the rows left over 4 at a time, the
 * last group padded).  W: [N][K] of wt; x: [K]; y: [N]. */
IFK_INLINE void gemv_rows(int wt, const int R, float *y, const void *W, const float *x, int n0, int n1, int K)
{
    size_t w[WIDE];
    int n = n0;
    for (; n + R <= n1; n += R) {
        for (int i = 0; i < R; i++)
            w[i] = (size_t)(n + i) * K;
        gemv_tile(wt, R, y + n, W, w, x, K);
    }
    for (; n < n1; n += 4) {
        const int rr = n1 - n < 4 ? n1 - n : 4;
        float out[4];
        for (int i = 0; i < 4; i++)
            w[i] = (size_t)(n + (i < rr ? i : rr - 1)) * K;
        gemv_tile(wt, 4, out, W, w, x, K);
        for (int i = 0; i < rr; i++)
            y[n + i] = out[i];
    }
}

IFK_INLINE void gemv(int wt, float *y, const void *W, const float *x, int n0, int n1, int K)
{
    const size_t row_bytes = (size_t)K * (wt == IFK_F32 ? 4 : 2);
    if (row_bytes + (size_t)K * 4 > SEQ_BYTES)
        gemv_rows(wt, WIDE, y, W, x, n0, n1, K);
    else if (row_bytes >= MULTI_BYTES)
        gemv_rows(wt, 4, y, W, x, n0, n1, K);
    else
        gemv_rows(wt, 1, y, W, x, n0, n1, K);
}

/* ---- prefill ----------------------------------------------------------------------------- */

#define PF_NB 32   /* rows per block */

/* s[i][j] = w_i . x_j over len elements, for 4 rows w_i = W + w[i] (elements of type wt) and 4
 * tokens x_j (rows and tokens may repeat: callers pad a short block that way). x: 4 x [len].
 * Each step of 16 elements also prefetches pf_lines lines of pw. */
IFK_INLINE void dot4x4(int wt, __m128 s[4], const void *W, const size_t w[4], const float *const x[4],
                       int len, ifk_prefetch_walk *pw, int pf_lines)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            acc[i][j] = _mm512_setzero_ps();
    const int len16 = len & ~15;
    int k = 0;
    for (; k < len16; k += 16) {
        ifk_prefetch_next(pw, pf_lines);
        __m512 xv[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            xv[j] = _mm512_loadu_ps(x[j] + k);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            __m512 wv = v16_load_w(W, wt, w[i] + k);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                acc[i][j] = _mm512_fmadd_ps(wv, xv[j], acc[i][j]);
        }
    }
    if (k < len) {
        __mmask16 m = v16_mask(len - k);
        __m512 xv[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            xv[j] = _mm512_maskz_loadu_ps(m, x[j] + k);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            __m512 wv = v16_load_w_mask(W, wt, w[i] + k, m);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                acc[i][j] = _mm512_fmadd_ps(wv, xv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        s[i] = v16_hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
}

/* y[t][n] = W[n] . x[t] for all t < T, n0 <= n < n1.  W: [N][K] of wt; x: [T][K] at stride
 * ldx; y: [T][N] at stride ldy. */
IFK_INLINE void gemm(int wt, float *y, size_t ldy, const void *W, const float *x, size_t ldx,
                     int T, int n0, int n1, int K)
{
    const size_t es = wt == IFK_F32 ? 4 : 2;
    for (int nb = n0; nb < n1; nb += PF_NB) {
        const int nr = n1 - nb < PF_NB ? n1 - nb : PF_NB;
        for (int k0 = 0; k0 < K; k0 += PF_KC) {
            const int kc = K - k0 < PF_KC ? K - k0 : PF_KC;
            const size_t wrow = (size_t)nb * K + k0;  /* the block's first element */
            /* The next block: the next K chunk of these rows, else the next rows' first. */
            int nb2 = nb, k02 = k0 + PF_KC;
            if (k02 >= K) {
                nb2 = nb + PF_NB;
                k02 = 0;
            }
            ifk_prefetch_walk pw = {(const char *)W + ((size_t)nb2 * K + k02) * es, (size_t)K * es, 0,
                                    (size_t)(K - k02 < PF_KC ? K - k02 : PF_KC) * es,
                                    nb2 < n1 ? (n1 - nb2 < PF_NB ? n1 - nb2 : PF_NB) : 0};
            /* A step of dot4x4 reads es lines of this block (4 rows x 16 elements); it
             * prefetches as many of the next, which has the same shape or a smaller one. */
            const int pf_lines = (int)es;
            for (int t = 0; t < T; t += 4) {
                const int nt = T - t < 4 ? T - t : 4;
                const float *xp[4];
                for (int j = 0; j < 4; j++)
                    xp[j] = x + (size_t)(t + (j < nt ? j : nt - 1)) * ldx + k0;
                for (int r = 0; r < nr; r += 4) {
                    const int rr = nr - r < 4 ? nr - r : 4;
                    size_t wp[4];
                    for (int i = 0; i < 4; i++)
                        wp[i] = wrow + (size_t)(r + (i < rr ? i : rr - 1)) * K;
                    __m128 s[4];
                    dot4x4(wt, s, W, wp, xp, kc, &pw, pf_lines);
                    float out[4][4];
                    for (int i = 0; i < 4; i++)
                        _mm_storeu_ps(out[i], s[i]);
                    for (int j = 0; j < nt; j++) {
                        float *yt = y + (size_t)(t + j) * ldy + nb + r;
                        for (int i = 0; i < rr; i++)
                            yt[i] = k0 == 0 ? out[i][j] : yt[i] + out[i][j];
                    }
                }
            }
        }
    }
}

/* ---- entry ------------------------------------------------------------------------------- */

IFK_DECL_MATMUL_ROWS(ifk_avx512_matmul_rows)
{
    if (K <= 0) {
        for (int t = 0; t < T; t++)
            for (int n = n0; n < n1; n++)
                y[(size_t)t * ldy + n] = 0.0f;
        return;
    }
    if (wtype != IFK_F32 && wtype != IFK_F16 && wtype != IFK_BF16) {
        ifk_ref_matmul_rows(y, ldy, W, wtype, x, ldx, T, n0, n1, K);
        return;
    }
    if (T == 1) {
        switch (wtype) {
        case IFK_F32: gemv(IFK_F32, y, W, x, n0, n1, K); break;
        case IFK_F16: gemv(IFK_F16, y, W, x, n0, n1, K); break;
        default: gemv(IFK_BF16, y, W, x, n0, n1, K); break;
        }
        return;
    }
    switch (wtype) {
    case IFK_F32: gemm(IFK_F32, y, ldy, W, x, ldx, T, n0, n1, K); break;
    case IFK_F16: gemm(IFK_F16, y, ldy, W, x, ldx, T, n0, n1, K); break;
    default: gemm(IFK_BF16, y, ldy, W, x, ldx, T, n0, n1, K); break;
    }
}
