/*
 * qpack_avx512.c -- the int8 product over packed 16-row tiles (qpack.h) with AVX512_VNNI.
 *
 * A group of 16 rows against a tile of C tokens (C = 8, 4, 2, 1): per block, each Q4 slab of 64
 * bytes is split into its low and high nibbles (two k-steps, 16 rows x 4 levels each) once,
 * and every token of the tile adds both into its own int32 accumulators with vpdpbusd against
 * 4 bytes of its x broadcast; at the end of the block the accumulators are converted and
 * scaled into the tokens' 16 outputs (qpack.h's arithmetic, the same for every C). Q8 slabs
 * are split into their even and odd bytes, int16 pairs for vpdpwssd against int16 x. The first
 * token tile of a group (all of decode) reads the tiles as one forward stream with a software
 * prefetch ahead; the later ones find them in cache.
 *
 * Every function carries target("avx512vnni") on top of the file's -mavx512* flags;
 * qdispatch.c calls them only on CPUs that have it (ifk_qpath_vnni).
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/qimpl.h"
#include "kernels/cpu/qpack.h"

#define QP_INLINE static inline __attribute__((always_inline, target("avx512vnni")))
#define QP_FN __attribute__((target("avx512vnni")))

/* Bytes of software prefetch ahead of the tile being read. TinyLlama Q4_B64 decode at 1 thread:
 * 33 tok/s at 2 KiB, 35 at 8 KiB, no better at 16 KiB. */
enum { QP_AHEAD = 8192 };

/* Bytes of a tile (qpack.h): 16 rows x one block of B, Q4 or Q8 (x16). */
QP_INLINE size_t tile_bytes(const int B, const int x16)
{
    return 64 + (x16 ? 16 : 8) * (size_t)B;
}

/* 4 bytes of x as one int32, broadcast. */
QP_INLINE __m512i bcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* One slab against 8 tokens: a0[j] += w0 . x_j[0..3], a1[j] += w1 . x_j[4..7] (x_j = p + j ld,
 * 4-byte broadcasts), OP vpdpbusd (Q4) or vpdpwssd (Q8). In assembly because GCC (12) keeps
 * neither the 16 accumulators in registers nor the broadcasts inside the instructions: it copied
 * accumulators around the products and loaded each x into a register of its own. Written out,
 * the slab is its 16 products and nothing else: Q4_B64 prefill, 1 thread, 345 -> 365 GOP/s.
 * p4 = p + 4 ld, ld3 = 3 ld: the 8 rows of x are reached with 2 bases and 2 indices. x is only
 * read while the kernel runs, so the statement declares no memory operand. */
#define QP_BC "%{1to16%}, %[w], "
#define QP_SLAB8(OP, ACC, WV, D)                                                                    \
    __asm__(OP " " D "(%[p])" QP_BC "%[a0]\n\t" OP " " D "(%[p],%[ld],1)" QP_BC "%[a1]\n\t"      \
            OP " " D "(%[p],%[ld],2)" QP_BC "%[a2]\n\t" OP " " D "(%[p],%[ld3],1)" QP_BC "%[a3]\n\t" \
            OP " " D "(%[q])" QP_BC "%[a4]\n\t" OP " " D "(%[q],%[ld],1)" QP_BC "%[a5]\n\t"      \
            OP " " D "(%[q],%[ld],2)" QP_BC "%[a6]\n\t" OP " " D "(%[q],%[ld3],1)" QP_BC "%[a7]"   \
            : [a0] "+v"(ACC[0]), [a1] "+v"(ACC[1]), [a2] "+v"(ACC[2]), [a3] "+v"(ACC[3]),            \
              [a4] "+v"(ACC[4]), [a5] "+v"(ACC[5]), [a6] "+v"(ACC[6]), [a7] "+v"(ACC[7])             \
            : [w] "v"(WV), [p] "r"(p), [q] "r"(p4), [ld] "r"(ld), [ld3] "r"(ld3))

#define QP_SLAB4(OP, ACC, WV, D)                                                                    \
    __asm__(OP " " D "(%[p])" QP_BC "%[a0]\n\t" OP " " D "(%[p],%[ld],1)" QP_BC "%[a1]\n\t"      \
            OP " " D "(%[p],%[ld],2)" QP_BC "%[a2]\n\t" OP " " D "(%[p],%[ld3],1)" QP_BC "%[a3]"   \
            : [a0] "+v"(ACC[0]), [a1] "+v"(ACC[1]), [a2] "+v"(ACC[2]), [a3] "+v"(ACC[3])             \
            : [w] "v"(WV), [p] "r"(p), [ld] "r"(ld), [ld3] "r"(ld3))

/* One slab against C = 8 or 4 tokens (QP_SLAB8 / QP_SLAB4). */
QP_INLINE void slab(__m512i *a0, __m512i *a1, __m512i w0, __m512i w1, const int8_t *p, size_t ld, const int x16,
                    const int C)
{
    const int8_t *p4 = p + 4 * ld;
    const size_t ld3 = 3 * ld;
    if (C == 8 && x16) {
        QP_SLAB8("vpdpwssd", a0, w0, "");
        QP_SLAB8("vpdpwssd", a1, w1, "4");
    } else if (C == 8) {
        QP_SLAB8("vpdpbusd", a0, w0, "");
        QP_SLAB8("vpdpbusd", a1, w1, "4");
    } else if (x16) {
        QP_SLAB4("vpdpwssd", a0, w0, "");
        QP_SLAB4("vpdpwssd", a1, w1, "4");
    } else {
        QP_SLAB4("vpdpbusd", a0, w0, "");
        QP_SLAB4("vpdpbusd", a1, w1, "4");
    }
}

/* The exact int32 sums of one tile for tokens t0 .. t0 + C - 1, into a0[j] and a1[j].
 * Q4: B / 8 slabs of 8 levels a row; a0 over the low nibbles (the even k-steps), a1 over the
 *     high nibbles, vpdpbusd against int8 x.
 * Q8 (x16): B / 4 slabs of 4 levels a row; a0 over the even bytes (levels 4 s, 4 s + 1 as an
 *     int16 pair), a1 over the odd bytes (4 s + 2, 4 s + 3), vpdpwssd against int16 x pairs. */
QP_INLINE void tile_sums(__m512i *a0, __m512i *a1, const uint8_t *tile, const ifk_qx *qx, int b, int t0, const int B,
                         const int x16, const int C)
{
    const __m512i lo = x16 ? _mm512_set1_epi16(0x00FF) : _mm512_set1_epi8(15);
    const int per = x16 ? 4 : 8; /* elements of the block a slab holds */
    for (int s = 0; s < B / per; s++) {
        const __m512i v = _mm512_loadu_si512(tile + 64 + 64 * s);
        const __m512i w0 = _mm512_and_si512(v, lo);
        const __m512i w1 = x16 ? _mm512_srli_epi16(v, 8) : _mm512_and_si512(_mm512_srli_epi16(v, 4), lo);
        /* x of token t0 at this slab's 8 (Q4) or 4 (Q8) elements */
        const int8_t *xs = qx->q + (size_t)t0 * qx->q_ld + (x16 ? 2 : 1) * ((size_t)b * B + (size_t)(per * s));
        if (C == 8 || C == 4) {
            slab(a0, a1, w0, w1, xs, qx->q_ld, x16, C);
            continue;
        }
#pragma GCC unroll 8
        for (int j = 0; j < C; j++) {
            const int8_t *xq = xs + (size_t)j * qx->q_ld;
            a0[j] = x16 ? _mm512_dpwssd_epi32(a0[j], w0, bcast4(xq)) : _mm512_dpbusd_epi32(a0[j], w0, bcast4(xq));
            a1[j] = x16 ? _mm512_dpwssd_epi32(a1[j], w1, bcast4(xq + 4)) : _mm512_dpbusd_epi32(a1[j], w1, bcast4(xq + 4));
        }
    }
}

/* y[t0 + j][n0 + r] for j < C, r < nr (<= 16): the 16 rows of the group whose tiles start at
 * tg ([nb][16 BB] bytes) against tokens t0 .. t0 + C - 1 of qx; Q4, or Q8 (x16: int16 x, one
 * x scale per block, the two int32 sums added exactly before the one conversion). */
QP_INLINE void group_tile(float *y, size_t ldy, const uint8_t *tg, const ifk_qx *qx, int n0, int nr, int t0,
                          const int B, const int x16, const int C)
{
    const int nb = qx->nb;
    const size_t tb = tile_bytes(B, x16);
    __m512 yv[8];
#pragma GCC unroll 8
    for (int j = 0; j < C; j++)
        yv[j] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *tile = tg + (size_t)b * tb;
        if (t0 == 0) /* the group's first pass reads its tiles from memory */
            for (size_t o = 0; o < tb; o += 64)
                _mm_prefetch((const char *)tile + QP_AHEAD + o, _MM_HINT_T0);
        __m512i a0[8], a1[8]; /* [C] */
#pragma GCC unroll 8
        for (int j = 0; j < C; j++)
            a0[j] = a1[j] = _mm512_setzero_si512();
        tile_sums(a0, a1, tile, qx, b, t0, B, x16, C);
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tile));
        const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + 32)));
#pragma GCC unroll 8
        for (int j = 0; j < C; j++) {
            const size_t o = (size_t)(t0 + j) * qx->s_ld + (size_t)b;
            /* p: the block's product before the weight scales (qpack.h's arithmetic), with
             * int8 x the residual's correction (qimpl.h) added in the first multiply's place */
            __m512 p;
            if (x16)
                p = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0[j], a1[j])), _mm512_set1_ps(qx->s0[o]));
            else if (B == 32)
                p = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0[j], a1[j])), _mm512_set1_ps(qx->s0[o]),
                                    _mm512_set1_ps(qx->cor[o]));
            else
                p = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1[j]), _mm512_set1_ps(qx->s1[o]),
                                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0[j]), _mm512_set1_ps(qx->s0[o]),
                                                    _mm512_set1_ps(qx->cor[o])));
            yv[j] = _mm512_fmadd_ps(p, dv, yv[j]);
            yv[j] = _mm512_fmadd_ps(mv, _mm512_set1_ps(qx->sum[o]), yv[j]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < C; j++) {
        float *yp = y + (size_t)(t0 + j) * ldy + n0;
        if (nr == 16)
            _mm512_storeu_ps(yp, yv[j]);
        else
            _mm512_mask_storeu_ps(yp, (__mmask16)((1u << nr) - 1u), yv[j]);
    }
}

/* Rows n0 <= n < n1 (n0 a multiple of 16), every token, of a packed matrix of block B. */
QP_INLINE void packed_rows(float *y, size_t ldy, const uint8_t *P, const ifk_qx *qx, int n0, int n1, const int B,
                           const int x16)
{
    const size_t group_bytes = (size_t)qx->nb * tile_bytes(B, x16);
    for (int n = n0; n < n1; n += 16) {
        const uint8_t *tg = P + (size_t)(n / 16) * group_bytes;
        const int nr = n1 - n < 16 ? n1 - n : 16;
        int t = 0;
        for (; t + 8 <= qx->T; t += 8)
            group_tile(y, ldy, tg, qx, n, nr, t, B, x16, 8);
        if (t + 4 <= qx->T)
            group_tile(y, ldy, tg, qx, n, nr, t, B, x16, 4), t += 4;
        if (t + 2 <= qx->T)
            group_tile(y, ldy, tg, qx, n, nr, t, B, x16, 2), t += 2;
        if (t < qx->T)
            group_tile(y, ldy, tg, qx, n, nr, t, B, x16, 1);
    }
}

#define QP_ROWS_FN(name, B, x16)                                                                   \
    QP_FN static void name(float *y, size_t ldy, const uint8_t *P, const ifk_qx *qx, int n0, int n1) \
    {                                                                                              \
        packed_rows(y, ldy, P, qx, n0, n1, B, x16);                                                \
    }
QP_ROWS_FN(rows_q4_b32, 32, 0)
QP_ROWS_FN(rows_q4_b64, 64, 0)
QP_ROWS_FN(rows_q8_b32, 32, 1)
QP_ROWS_FN(rows_q8_b64, 64, 1)

QP_FN IFK_DECL_QMATMUL_ROWS(ifk_avx512_qmatmul_packed_rows)
{
    if (qx->x16)
        (qx->B == 64 ? rows_q8_b64 : rows_q8_b32)(y, ldy, W, qx, n0, n1);
    else
        (qx->B == 64 ? rows_q4_b64 : rows_q4_b32)(y, ldy, W, qx, n0, n1);
}
