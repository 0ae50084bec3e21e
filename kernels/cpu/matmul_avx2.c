/*
 * matmul_avx2.c -- y = x W^T with AVX2 + FMA + F16C, for F32 / F16 / BF16 weights.
 *
 * The same plan as matmul_avx512.c with 8-lane registers. Prefill passes every token over a
 * block of PF_NB rows x PF_KC columns (kept in L2, the next one prefetched meanwhile), 4 rows x
 * 3 tokens at a time: 12 accumulators + 3 token registers + 1 weight register = the 16 ymm
 * registers. The same guarantee too (kernels.h): decode and prefill compute each output with
 * the same float operations in the same order, so y[t] is bit-identical whatever T, the
 * token's place in the batch and the rows' split between threads.
 */
#include "kernels/cpu/impl.h"
#include "kernels/cpu/vec_avx2.h"

/* ---- decode ------------------------------------------------------------------------------ */

/* As in matmul_avx512.c: decode computes every output with exactly prefill's arithmetic (K in
 * chunks of PF_KC; per chunk one 8-lane accumulator, fmadd(w, x) over steps of 8 from the
 * chunk's start, the last step a partial load with the other lanes 0; v8_hsum4's tree; chunk
 * sums added in order), so y[t] depends only on W and x[t]. It streams rows one at a time while
 * a row and x fit in L1 together, otherwise WIDE rows interleaved, one FMA chain each (each x
 * load then serves WIDE rows). */
#define PF_KC 1024      /* K elements per chunk (prefill's blocking; decode sums the same way) */
#define SEQ_BYTES 24576 /* rows with K * (4 + weight size) up to this are read one at a time */
#define WIDE 8          /* rows read together otherwise */

/* out[i] = W[w[i]] . x for R rows (R = 1, 4 or 8; rows may repeat: callers pad a short group
 * that way).  W: [*][K] of wt (w[i]: the row's first element); x: [K]; out: [R]. */
IFK_INLINE void gemv_tile(int wt, const int R, float *out, const void *W, const size_t *w, const float *x, int K)
{
    for (int k0 = 0; k0 < K; k0 += PF_KC) {
        const int kc = K - k0 < PF_KC ? K - k0 : PF_KC, len8 = kc & ~7;
        __m256 acc[WIDE];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            acc[i] = _mm256_setzero_ps();
        int k = 0;
        for (; k < len8; k += 8) {
            __m256 xv = _mm256_loadu_ps(x + k0 + k);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++)
                acc[i] = _mm256_fmadd_ps(v8_load_w(W, wt, w[i] + k0 + k), xv, acc[i]);
        }
        if (k < kc) {
            __m256 xv = v8_load_part(x + k0 + k, kc - k);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++)
                acc[i] = _mm256_fmadd_ps(v8_load_w_part(W, wt, w[i] + k0 + k, kc - k), xv, acc[i]);
        }
#pragma GCC unroll 2
        for (int i = 0; i < R; i += 4) {
            float s[4];
            if (R == 1) /* the same tree for one vector */
                _mm_storeu_ps(s, v8_hsum4(acc[0], acc[0], acc[0], acc[0]));
            else
                _mm_storeu_ps(s, v8_hsum4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]));
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
    if ((size_t)K * (4 + (wt == IFK_F32 ? 4 : 2)) <= SEQ_BYTES)
        gemv_rows(wt, 1, y, W, x, n0, n1, K);
    else
        gemv_rows(wt, WIDE, y, W, x, n0, n1, K);
}

/* ---- prefill ----------------------------------------------------------------------------- */

#define PF_NB 16   /* rows per block */
#define MR 4       /* rows per micro-tile */
#define MT 3       /* tokens per micro-tile */

/* s[i][j] = w_i . x_j over len elements, for MR rows w_i = W + w[i] (elements of type wt) and
 * MT tokens x_j (rows and tokens may repeat: callers pad a short tile that way).
 * x: MT x [len]. Each step of 8 elements also prefetches pf_lines lines of pw. */
IFK_INLINE void dot_tile(int wt, float s[MR][MT], const void *W, const size_t w[MR],
                         const float *const x[MT], int len, ifk_prefetch_walk *pw, int pf_lines)
{
    __m256 acc[MR][MT];
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < MT; j++)
            acc[i][j] = _mm256_setzero_ps();
    const int len8 = len & ~7;
    int k = 0;
    for (; k < len8; k += 8) {
        ifk_prefetch_next(pw, pf_lines);
        __m256 xv[MT];
#pragma GCC unroll 4
        for (int j = 0; j < MT; j++)
            xv[j] = _mm256_loadu_ps(x[j] + k);
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
            __m256 wv = v8_load_w(W, wt, w[i] + k);
#pragma GCC unroll 4
            for (int j = 0; j < MT; j++)
                acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
        }
    }
    if (k < len) {
        __m256 xv[MT];
#pragma GCC unroll 4
        for (int j = 0; j < MT; j++)
            xv[j] = v8_load_part(x[j] + k, len - k);
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
            __m256 wv = v8_load_w_part(W, wt, w[i] + k, len - k);
#pragma GCC unroll 4
            for (int j = 0; j < MT; j++)
                acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < MT; j++) {
        float col[4];
        _mm_storeu_ps(col, v8_hsum4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]));
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++)
            s[i][j] = col[i];
    }
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
            /* A step of dot_tile reads es/2 lines of this block (4 rows x 8 elements); it
             * prefetches as many of the next, which has the same shape or a smaller one. */
            const int pf_lines = (int)es / 2;
            for (int t = 0; t < T; t += MT) {
                const int nt = T - t < MT ? T - t : MT;
                const float *xp[MT];
                for (int j = 0; j < MT; j++)
                    xp[j] = x + (size_t)(t + (j < nt ? j : nt - 1)) * ldx + k0;
                for (int r = 0; r < nr; r += MR) {
                    const int rr = nr - r < MR ? nr - r : MR;
                    size_t wp[MR];
                    for (int i = 0; i < MR; i++)
                        wp[i] = wrow + (size_t)(r + (i < rr ? i : rr - 1)) * K;
                    float s[MR][MT];
                    dot_tile(wt, s, W, wp, xp, kc, &pw, pf_lines);
                    for (int j = 0; j < nt; j++) {
                        float *yt = y + (size_t)(t + j) * ldy + nb + r;
                        for (int i = 0; i < rr; i++)
                            yt[i] = k0 == 0 ? s[i][j] : yt[i] + s[i][j];
                    }
                }
            }
        }
    }
}

/* ---- entry ------------------------------------------------------------------------------- */

IFK_DECL_MATMUL_ROWS(ifk_avx2_matmul_rows)
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
