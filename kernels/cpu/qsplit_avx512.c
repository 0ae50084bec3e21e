/*
 * qsplit_avx512.c -- the outliers of int8 activations (qimpl.h, "Outliers"): those of each
 * token's k largest |x_i| that stand out are picked and taken out of what is rounded, then
 * added back in F32 against the weights' decoded values, for Q8 and Q4 in packed tiles
 * (qpack.h) or rows (quant.h).
 *
 * Picking reads x twice: the first pass copies it and keeps the largest |x| of each of the 16
 * lanes (i % 16); the least of those 16, L, is the reference of qimpl.h's rule (an outlier has
 * |x| >= 2 L), and the second pass ranks only the elements at or above 2 L (none in most rows of
 * normal values).
 *
 * Adding back decodes, for every 16 rows, the columns su of the tile (or rows) into a buffer
 * once for all tokens, then each token's outliers are added with one FMA per 16 rows each, in
 * ascending i: a token's result depends on its own x alone.
 *
 * Measured (TinyLlama shape with random weights, Q8_B64, prefill of 128 tokens, 1 / 2 threads):
 * 2026-11-27, every token taking its 8 largest, 126 / 253 tok/s against 151 / 279 for int8 x
 * without the split and 97 / 177 for int16 x; 2026-11-28, under qimpl.h's rule (nothing stands
 * out in most of those rows), 152-154 / 278-284. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/qblock.h"
#include "kernels/cpu/qimpl.h"
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/quant.h"

enum { KMAX = 16 };

/* a before b in the order of picking: larger |x| first, then the lower i */
static int ranks_before(float av, int ai, float bv, int bi)
{
    return av > bv || (av == bv && ai < bi);
}

void ifk_avx512_qsplit_pick(const float *x, int K, int k, float *xm, int32_t *idx, float *val)
{
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    if (k > KMAX)
        k = KMAX;
    if (k > K)
        k = K;
    /* pass 1: x to xm, and the lane-wise max |x| over the whole row */
    __m512 lm = _mm512_setzero_ps();
    for (int off = 0; off < K; off += 16) {
        const __mmask16 mk = K - off >= 16 ? 0xFFFF : (__mmask16)((1u << (K - off)) - 1);
        const __m512 a = _mm512_maskz_loadu_ps(mk, x + off);
        _mm512_mask_storeu_ps(xm + off, mk, a);
        lm = _mm512_max_ps(lm, _mm512_and_ps(a, absmask));
    }
    /* the 16 lane maxima are 16 distinct elements, so the least of them, L, is at most the
     * k-th largest element (k <= 16); an outlier stands out: |x| >= IFK_QX_SPLIT_RATIO L
     * (qimpl.h) */
    const float thr = K >= 16 ? IFK_QX_SPLIT_RATIO * _mm512_reduce_min_ps(lm) : 0.0f;
    /* pass 2: the candidates (|x| >= thr), kept ranked, k at most */
    const __m512 vthr = _mm512_set1_ps(thr);
    int ci[KMAX], n = 0;
    float cv[KMAX];
    for (int off = 0; off < K; off += 16) {
        const __mmask16 mk = K - off >= 16 ? 0xFFFF : (__mmask16)((1u << (K - off)) - 1);
        const __m512 va = _mm512_and_ps(_mm512_maskz_loadu_ps(mk, x + off), absmask);
        for (unsigned bits = _mm512_mask_cmp_ps_mask(mk, va, vthr, _CMP_GE_OQ); bits; bits &= bits - 1) {
            const int i = off + __builtin_ctz(bits);
            const float a = fabsf(x[i]);
            if (n == k && !ranks_before(a, i, cv[k - 1], ci[k - 1]))
                continue;
            int p = n < k ? n++ : k - 1;
            while (p > 0 && ranks_before(a, i, cv[p - 1], ci[p - 1])) {
                cv[p] = cv[p - 1];
                ci[p] = ci[p - 1];
                p--;
            }
            cv[p] = a;
            ci[p] = i;
        }
    }
    for (int a = 1; a < n; a++) /* by i ascending */
        for (int b = a; b > 0 && ci[b] < ci[b - 1]; b--) {
            int t = ci[b];
            ci[b] = ci[b - 1];
            ci[b - 1] = t;
        }
    for (int j = 0; j < n; j++) {
        idx[j] = ci[j];
        val[j] = x[ci[j]];
        xm[ci[j]] = 0.0f;
    }
    for (int j = n; j < k; j++) { /* fewer stand out (or NaN in x): unused entries */
        idx[j] = -1;
        val[j] = 0.0f;
    }
}

/* Levels of column e of a tile's 16 rows (qpack.h's layouts), as floats:
 *   Q8: unit e / 4, byte 4 r + (0, 2, 1, 3)[e % 4] of row r's dword (the int16 pair order);
 *   Q4: unit e / 8, byte 4 r + e % 4 of row r's dword, its high nibble where e % 8 >= 4. */
static __m512 packed_levels(const uint8_t *tile, int type, int e)
{
    static const int pair[4] = {0, 2, 1, 3};
    const int q8 = type == IFK_Q8_B32 || type == IFK_Q8_B64;
    const int unit = q8 ? e / 4 : e / 8, shift = q8 ? 8 * pair[e % 4] : 8 * (e % 4) + 4 * (e % 8 >= 4);
    const __m512i lv = _mm512_loadu_si512(tile + 64 + 64 * unit);
    return _mm512_cvtepi32_ps(
        _mm512_and_si512(_mm512_srl_epi32(lv, _mm_cvtsi32_si128(shift)), _mm512_set1_epi32(q8 ? 0xFF : 0x0F)));
}

/* Column i of rows r < nr in the row layout (rb bytes a row): w'[r][i], 0 past nr, as
 * quant_ref.c decodes a block (qblock.h). */
static __m512 row_column(const uint8_t *rows, size_t rb, int nr, int type, int B, int BB, int i)
{
    float w[16] = {0}, blk[IFK_QMAX_BLOCK];
    const int b = i / B, e = i % B;
    for (int r = 0; r < nr; r++) {
        ifk_qblock_decode(blk, type, rows + (size_t)r * rb + (size_t)b * BB, e + 1);
        w[r] = blk[e];
    }
    return _mm512_loadu_ps(w);
}

/* Every index read from qx (su, spos) is checked before it addresses memory: a worker whose
 * item was taken back (pool.h) may read the pool's copy of the input after the next job has
 * overwritten it, and its result is then discarded, but it must not read outside W or wbuf.
 * Valid entries (spos ascending per token) take the ascending order; invalid ones are skipped. */
void ifk_avx512_qsplit_rows(float *y, size_t ldy, const void *W, int packed, const ifk_qx *qx, int n0, int n1)
{
    enum { UC = 512 }; /* columns decoded at a time (all of them, mostly) */
    const int B = qx->B, BB = ifk_qtype_block_bytes(qx->type), k = qx->k;
    const size_t rb = (size_t)qx->nb * BB;
    __attribute__((aligned(64))) float wbuf[UC][16];
    for (int n = n0; n < n1; n += 16) {
        const int nr = n1 - n < 16 ? n1 - n : 16;
        const __mmask16 mk = (__mmask16)((1u << nr) - 1);
        const uint8_t *rows = (const uint8_t *)W + (size_t)n * rb; /* a tile group when packed */
        for (int u0 = 0; u0 < qx->nu; u0 += UC) {
            const int u1 = u0 + UC < qx->nu ? u0 + UC : qx->nu;
            int bl = -1; /* the block whose delta and min d, m hold (su ascending: few loads) */
            __m512 d = _mm512_setzero_ps(), m = d;
            for (int u = u0; u < u1; u++) {
                const int i = qx->su[u] >= 0 && qx->su[u] < qx->K ? qx->su[u] : 0; /* see above */
                if (!packed) {
                    _mm512_store_ps(wbuf[u - u0], row_column(rows, rb, nr, qx->type, B, BB, i));
                    continue;
                }
                const uint8_t *tile = rows + (size_t)(i / B) * 16 * BB;
                if (i / B != bl) {
                    bl = i / B;
                    d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tile));
                    m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + 32)));
                }
                _mm512_store_ps(wbuf[u - u0], _mm512_add_ps(m, _mm512_mul_ps(packed_levels(tile, qx->type, i % B), d)));
            }
            for (int t = 0; t < qx->T; t++) {
                const int32_t *pos = qx->spos + (size_t)t * k;
                const float *val = qx->sval + (size_t)t * k;
                float *yt = y + (size_t)t * ldy + n;
                __m512 acc = _mm512_maskz_loadu_ps(mk, yt);
                int any = 0;
                for (int j = 0; j < k; j++) {
                    const unsigned p = (unsigned)(pos[j] - u0); /* < u1 - u0: in this chunk */
                    if (p < (unsigned)(u1 - u0)) {
                        acc = _mm512_fmadd_ps(_mm512_set1_ps(val[j]), _mm512_load_ps(wbuf[p]), acc);
                        any = 1;
                    }
                }
                if (any)
                    _mm512_mask_storeu_ps(yt, mk, acc);
            }
        }
    }
}
