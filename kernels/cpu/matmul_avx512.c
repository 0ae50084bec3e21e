/*
 * matmul_avx512.c -- y = x W^T with AVX-512, for F32 / F16 / BF16 weights; compiled a second
 * time as matmul_avx512bf16.c (MM_BF16 = 1) for the BF16 dot product of F16 / BF16 weights.
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
 * The two products. A step is the elements one instruction takes from a row (and a chunk is
 * PF_KC elements: 1024 for FMA, 2048 for BF16, whose blocks are PF_NB = 32 and 16 rows):
 *   FMA (MM_BF16 = 0):  16 elements, x in F32, weights converted to F32 (exact), vfmadd231ps;
 *   BF16 (MM_BF16 = 1): 32 elements, x rounded to BF16 by the caller (ifk_avx512bf16_round_x),
 *                       weights in BF16, vdpbf16ps (lane j adds the products of elements 2j
 *                       and 2j + 1, each exact in F32). BF16 weights are used as stored; F16
 *                       ones are rounded to BF16 (to nearest even: 3 of their 11 significant
 *                       bits go), in registers in decode, a block at a time into a buffer in
 *                       prefill (tile), so that every token of the call reuses the conversion.
 *                       Twice the multiply-adds per instruction: the roof is twice FMA's.
 *
 * Batch invariance (kernels.h): decode and prefill compute each output y[t][n] with the same
 * float operations in the same order (K chunks of PF_KC, one chain of 16 lanes per chunk over
 * steps from the chunk's start, v16_hsum4's tree, chunk sums added in order), so y[t] is
 * bit-identical whatever T, the token's place in the batch and the rows' split between threads.
 */
#include "kernels/cpu/impl.h"
#include "kernels/cpu/vec_avx512.h"

#ifndef MM_BF16
#define MM_BF16 0
#endif

/* ---- a step: STEP elements of a row of W and of x, and their product into 16 lanes -------- */

#if MM_BF16
#define STEP 32
typedef __m512bh vstep; /* a step of weights or of x in a register */
typedef uint16_t xelem; /* an element of x as the kernel reads it: BF16 */

IFK_INLINE __mmask32 step_mask(int n) /* lanes 0..n-1 of a step (0 <= n <= 32) */
{
    return n >= 32 ? ~(__mmask32)0 : ((__mmask32)1 << n) - 1;
}

/* 32 F32 as BF16, rounded to nearest even (vcvtne2ps2bf16: lo into lanes 0..15). */
IFK_INLINE vstep step_round(__m512 lo, __m512 hi)
{
    return _mm512_cvtne2ps_pbh(hi, lo);
}

/* The first n weights of the step at element i of W (F16 rounded to BF16), 0 past them;
 * nothing past them is read. */
IFK_INLINE vstep step_w_n(const void *W, int wt, size_t i, int n)
{
    const uint16_t *p = (const uint16_t *)W + i;
    __mmask32 m = step_mask(n);
    if (wt == IFK_BF16)
        return (vstep)(n >= 32 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(m, p));
    return step_round(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)m, p)),
                      _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)(m >> 16), p + 16)));
}

IFK_INLINE vstep step_x_n(const xelem *x, int n)
{
    return (vstep)(n >= 32 ? _mm512_loadu_si512(x) : _mm512_maskz_loadu_epi16(step_mask(n), x));
}

IFK_INLINE __m512 step_madd(__m512 acc, vstep w, vstep x)
{
    return _mm512_dpbf16_ps(acc, w, x);
}
#else
#define STEP 16
typedef __m512 vstep;
typedef float xelem;

IFK_INLINE vstep step_w_n(const void *W, int wt, size_t i, int n)
{
    return n >= 16 ? v16_load_w(W, wt, i) : v16_load_w_mask(W, wt, i, v16_mask(n));
}

IFK_INLINE vstep step_x_n(const xelem *x, int n)
{
    return n >= 16 ? _mm512_loadu_ps(x) : _mm512_maskz_loadu_ps(v16_mask(n), x);
}

IFK_INLINE __m512 step_madd(__m512 acc, vstep w, vstep x)
{
    return _mm512_fmadd_ps(w, x, acc);
}
#endif

/* ---- decode ------------------------------------------------------------------------------ */

/* Decode computes every output with exactly the arithmetic of prefill's gemm (below), so that
 * y[t] depends only on W and x[t] (kernels.h): K in chunks of PF_KC elements; per chunk one
 * accumulator of 16 lanes per output, step_madd(w, x) over steps from the chunk's start
 * (the last step partial: w and x lanes past K are 0), summed by v16_hsum4's tree; the chunk
 * sums added into y in order (y = s_0, then y = y + s_c). Only the traversal differs: prefill
 * passes tiles of 4 rows x 4 tokens over a block held in L2, decode streams the rows, one chain
 * each.
 *
 * Measured on Zen 4 (one thread, weights from DRAM): the weights stream fastest while x stays
 * in L1 between rows; once a row plus x overflow L1, x is refetched from L2 for every row and
 * the stream slows by a third. Long rows are therefore read 16 at a time (each x load then
 * serves 16 rows), shorter ones 4 at a time from 8 KiB a row, else one after another (one
 * forward stream; interleaving 4 F16 rows of 4 KiB measured a quarter slower, 4 F32 rows of
 * 8 KiB a tenth faster than one at a time). */
/* K elements per chunk (prefill's blocking; decode sums the same way). The BF16 product takes
 * twice as many, as its steps are twice as wide: its horizontal sums and adds into y per chunk
 * then cost as much per multiply-add as FMA's (measured: +8 % on a 2048 x 2048 prefill). */
#define PF_KC (MM_BF16 ? 2048 : 1024)
#define SEQ_BYTES 24576    /* rows with K * (weight size + x size) up to this are read 1 or 4 at a time */
#define MULTI_BYTES 8192   /* ... 4 at a time from this many bytes a row */
#define WIDE 16            /* rows read together otherwise */

/* out[i] = W[w[i]] . x for R rows (R = 1, or a multiple of 4 up to WIDE; rows may repeat:
 * callers pad a short group that way).  W: [*][K] of wt (w[i]: the row's first element); x: [K]; out: [R]. */
IFK_INLINE void gemv_tile(int wt, const int R, float *out, const void *W, const size_t *w, const xelem *x, int K)
{
    for (int k0 = 0; k0 < K; k0 += PF_KC) {
        const int kc = K - k0 < PF_KC ? K - k0 : PF_KC;
        __m512 acc[WIDE];
#pragma GCC unroll 16
        for (int i = 0; i < R; i++)
            acc[i] = _mm512_setzero_ps();
        int k = 0;
        for (; k + STEP <= kc; k += STEP) {
            vstep xv = step_x_n(x + k0 + k, STEP);
#pragma GCC unroll 16
            for (int i = 0; i < R; i++)
                acc[i] = step_madd(acc[i], step_w_n(W, wt, w[i] + k0 + k, STEP), xv);
        }
        if (k < kc) {
            vstep xv = step_x_n(x + k0 + k, kc - k);
#pragma GCC unroll 16
            for (int i = 0; i < R; i++)
                acc[i] = step_madd(acc[i], step_w_n(W, wt, w[i] + k0 + k, kc - k), xv);
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
IFK_INLINE void gemv_rows(int wt, const int R, float *y, const void *W, const xelem *x, int n0, int n1, int K)
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

IFK_INLINE void gemv(int wt, float *y, const void *W, const xelem *x, int n0, int n1, int K)
{
    const size_t row_bytes = (size_t)K * (wt == IFK_F32 ? 4 : 2);
    if (row_bytes + (size_t)K * sizeof(xelem) > SEQ_BYTES)
        gemv_rows(wt, WIDE, y, W, x, n0, n1, K);
    else if (row_bytes >= MULTI_BYTES)
        gemv_rows(wt, 4, y, W, x, n0, n1, K);
    else
        gemv_rows(wt, 1, y, W, x, n0, n1, K);
}

/* ---- prefill ----------------------------------------------------------------------------- */

#define PF_NB (MM_BF16 ? 16 : 32) /* rows per block: 32 KiB (F32 64 KiB) of weights per block */

/* acc[i][j] += the step at element k of row w_i and token x_j (its first n elements, n <= STEP). */
IFK_INLINE void dot4x4_step(int wt, __m512 acc[4][4], const void *W, const size_t w[4], const xelem *const x[4],
                            int k, int n)
{
    vstep xv[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
        xv[j] = step_x_n(x[j] + k, n);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        vstep wv = step_w_n(W, wt, w[i] + k, n);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            acc[i][j] = step_madd(acc[i][j], wv, xv[j]);
    }
}

/* s[i][j] = w_i . x_j over len elements, for 4 rows w_i = W + w[i] (elements of type wt) and 4
 * tokens x_j (rows and tokens may repeat: callers pad a short block that way). x: 4 x [len].
 * Each step also prefetches pf_lines lines of pw. */
IFK_INLINE void dot4x4(int wt, __m128 s[4], const void *W, const size_t w[4], const xelem *const x[4],
                       int len, ifk_prefetch_walk *pw, int pf_lines)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            acc[i][j] = _mm512_setzero_ps();
    int k = 0;
    for (; k + STEP <= len; k += STEP) {
        ifk_prefetch_next(pw, pf_lines);
        dot4x4_step(wt, acc, W, w, x, k, STEP);
    }
    if (k < len)
        dot4x4_step(wt, acc, W, w, x, k, len - k);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        s[i] = v16_hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
}

#if MM_BF16
/* tile[r][k] = W[n + r][k0 + k] rounded to BF16, for r < nr, k < kc (a row of the tile is
 * TILE_LD elements: 64 bytes more than a chunk, so that its rows do not fall on the same L1
 * sets, as rows 4 KiB apart do).  W: [*][K] of F16. */
#define TILE_LD (PF_KC + 32)
IFK_INLINE void tile_round(uint16_t *tile, const void *W, int n, int nr, int k0, int kc, int K)
{
    for (int r = 0; r < nr; r++)
        for (int k = 0; k < kc; k += STEP)
            _mm512_storeu_si512(tile + (size_t)r * TILE_LD + k,
                                (__m512i)step_w_n(W, IFK_F16, (size_t)(n + r) * K + k0 + k, kc - k));
}
#endif

/* y[t][n] = W[n] . x[t] for all t < T, n0 <= n < n1.  W: [N][K] of wt; x: [T][K] at stride
 * ldx; y: [T][N] at stride ldy. tile: [PF_NB][PF_KC] for F16 weights of the BF16 product
 * (rounded a block at a time), else unused. */
IFK_INLINE void gemm(int wt, float *y, size_t ldy, const void *W, const xelem *x, size_t ldx,
                     int T, int n0, int n1, int K, uint16_t *tile)
{
    const size_t es = wt == IFK_F32 ? 4 : 2;
    for (int nb = n0; nb < n1; nb += PF_NB) {
        const int nr = n1 - nb < PF_NB ? n1 - nb : PF_NB;
        for (int k0 = 0; k0 < K; k0 += PF_KC) {
            const int kc = K - k0 < PF_KC ? K - k0 : PF_KC;
            /* The block: its rows at stride bstride from element wrow of Wb, of type bt. */
            const void *Wb = W;
            size_t wrow = (size_t)nb * K + k0, bstride = (size_t)K;
            int bt = wt;
#if MM_BF16
            if (wt == IFK_F16) {
                tile_round(tile, W, nb, nr, k0, kc, K);
                Wb = tile, wrow = 0, bstride = TILE_LD, bt = IFK_BF16;
            }
#endif
            /* The next block: the next K chunk of these rows, else the next rows' first. */
            int nb2 = nb, k02 = k0 + PF_KC;
            if (k02 >= K) {
                nb2 = nb + PF_NB;
                k02 = 0;
            }
            ifk_prefetch_walk pw = {(const char *)W + ((size_t)nb2 * K + k02) * es, (size_t)K * es, 0,
                                    (size_t)(K - k02 < PF_KC ? K - k02 : PF_KC) * es,
                                    nb2 < n1 ? (n1 - nb2 < PF_NB ? n1 - nb2 : PF_NB) : 0};
            /* A step of dot4x4 reads es * STEP / 16 lines of this block (4 rows x STEP
             * elements; the same from a rounded F16 tile); it prefetches as many of the next,
             * which has the same shape or a smaller one. */
            const int pf_lines = (int)es * STEP / 16;
            for (int t = 0; t < T; t += 4) {
                const int nt = T - t < 4 ? T - t : 4;
                const xelem *xp[4];
                for (int j = 0; j < 4; j++)
                    xp[j] = x + (size_t)(t + (j < nt ? j : nt - 1)) * ldx + k0;
                for (int r = 0; r < nr; r += 4) {
                    const int rr = nr - r < 4 ? nr - r : 4;
                    size_t wp[4];
                    for (int i = 0; i < 4; i++)
                        wp[i] = wrow + (size_t)(r + (i < rr ? i : rr - 1)) * bstride;
                    __m128 s[4];
                    dot4x4(bt, s, Wb, wp, xp, kc, &pw, pf_lines);
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

#if MM_BF16
void ifk_avx512bf16_round_x(uint16_t *xb, size_t ldxb, const float *x, size_t ldx, int T, int K)
{
    for (int t = 0; t < T; t++)
        for (size_t k = 0; k < ldxb; k += STEP) {
            const int n = (size_t)K > k ? (int)((size_t)K - k) : 0; /* elements of x left */
            __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
            if (n > 0)
                lo = _mm512_maskz_loadu_ps(v16_mask(n < 16 ? n : 16), x + (size_t)t * ldx + k);
            if (n > 16)
                hi = _mm512_maskz_loadu_ps(v16_mask(n < 32 ? n - 16 : 16), x + (size_t)t * ldx + k + 16);
            _mm512_storeu_si512(xb + (size_t)t * ldxb + k, (__m512i)step_round(lo, hi));
        }
}

#define MM_ROWS IFK_DECL_BF16_ROWS(ifk_avx512bf16_matmul_rows)
#define MM_TYPE_OK(wt) ((wt) == IFK_F16 || (wt) == IFK_BF16)
#else
#define MM_ROWS IFK_DECL_MATMUL_ROWS(ifk_avx512_matmul_rows)
#define MM_TYPE_OK(wt) ((wt) == IFK_F32 || (wt) == IFK_F16 || (wt) == IFK_BF16)
#endif

/* x: [T][ldx] of xelem (MM_BF16: the caller's x rounded to BF16). Another weight type: the
 * scalar reference (FMA), zeros (BF16: it has none). */
MM_ROWS
{
    if (K <= 0 || (MM_BF16 && !MM_TYPE_OK(wtype))) {
        for (int t = 0; t < T; t++)
            for (int n = n0; n < n1; n++)
                y[(size_t)t * ldy + n] = 0.0f;
        return;
    }
#if !MM_BF16
    if (!MM_TYPE_OK(wtype)) {
        ifk_ref_matmul_rows(y, ldy, W, wtype, x, ldx, T, n0, n1, K);
        return;
    }
#endif
    if (T == 1) {
        if (wtype == IFK_F16)
            gemv(IFK_F16, y, W, x, n0, n1, K);
        else if (wtype == IFK_BF16)
            gemv(IFK_BF16, y, W, x, n0, n1, K);
        else if (!MM_BF16)
            gemv(IFK_F32, y, W, x, n0, n1, K);
        return;
    }
    if (wtype == IFK_F16) {
        _Alignas(64) uint16_t tile[MM_BF16 ? PF_NB * (PF_KC + 32) : 1]; /* 65 KiB in the BF16 product */
        gemm(IFK_F16, y, ldy, W, x, ldx, T, n0, n1, K, tile);
    } else if (wtype == IFK_BF16) {
        gemm(IFK_BF16, y, ldy, W, x, ldx, T, n0, n1, K, NULL);
    } else if (!MM_BF16) {
        gemm(IFK_F32, y, ldy, W, x, ldx, T, n0, n1, K, NULL);
    }
}
