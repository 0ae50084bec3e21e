/*
 * qpack_avx2.c -- the product over packed 16-row tiles (qpack.h) with AVX2 (+ FMA, F16C):
 * Q4_B32 and Q4_B64 on int8 x, Q8_B32 and Q8_B64 on int16 x (the AVX2 path's modes, qimpl.h:
 * without vpdpbusd, Q8 keeps int16 x).
 *
 * qpack_avx512.c's plan with 8-lane registers. A tile's 16 rows are two halves of 8, each read
 * as a group of its own: half h is bytes 32 h .. 32 h + 31 of every 64-byte unit of levels (row
 * r's dword at 4 r, as in qpack.h) and 16 h bytes into the deltas and the mins. Per block and
 * half, each slab is unpacked once into its two operands (8 rows x 4 levels as bytes, or x 2 as
 * int16), and every token of the tile adds both against its x broadcast. The products differ,
 * for want of VNNI:
 *   int8 x (Q4): vpmaddubsw (u8 levels x s8 x, pairs to int16), summed in int16 over the slabs
 *     of the block: a lane gains 2 products a slab, 16 over the first (or second) halves of the
 *     8 slabs of B = 64, and 16 over both halves of the 4 slabs of B = 32 (whose one x scale
 *     lets the two go into one sum); 16 * 15 * 127 = 30480 < 32768, so the int16 sums are
 *     exact, and one vpmaddwd with ones makes them qpack.h's int32 a0, a1 (or a0 + a1).
 *   int16 x (Q8): the levels widened (the even bytes of a dword, then the odd: the int16 pair
 *     order) and vpmaddwd against pairs of x, into int32.
 * From the int32 sums on, the float operations are qpack.h's arithmetic, lane for lane those of
 * qpack_avx512.c, so the two kernels give the same bits (tests/unit/test_qkernels.c checks it
 * where a CPU has both), and y[t] depends only on W and x[t] (kernels.h's batch invariance).
 *
 * Token tiles of C = 4, 2, 1; decode (C = 1) reads the tiles as one forward stream, or
 * qx->streams groups side by side, with qx->ahead bytes of software prefetch, as qpack_avx512.c.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/qimpl.h"
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/vec_avx2.h"

#define QA_INLINE static inline __attribute__((always_inline))

/* Bytes of a tile (qpack.h): 16 rows x one block. */
QA_INLINE size_t tile_bytes(const int type)
{
    return 16 * (size_t)ifk_qtype_block_bytes(type);
}

/* The 4 bytes at p in every dword (vpbroadcastd from memory). */
QA_INLINE __m256i bcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Slab s of half of a tile's levels (lv: tile + 64 + 32 h) as its two operands, 8 rows in the 8
 * dword lanes: *w0 against x elements per s .. per s + per / 2 - 1 and *w1 against the rest
 * (per = 8 for int8 x, 4 for int16 x). Q4: the low nibbles, the high nibbles; Q8: the even
 * bytes, the odd bytes, as int16. */
QA_INLINE void slab_operands(__m256i *w0, __m256i *w1, const uint8_t *lv, const int s, const int type)
{
    const __m256i v = _mm256_loadu_si256((const __m256i *)(lv + 64 * s));
    if (type == IFK_Q8_B32 || type == IFK_Q8_B64) {
        *w0 = _mm256_and_si256(v, _mm256_set1_epi16(0x00FF));
        *w1 = _mm256_srli_epi16(v, 8);
        return;
    }
    const __m256i nib = _mm256_set1_epi8(15);
    *w0 = _mm256_and_si256(v, nib);
    *w1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
}

/* Whether block sums stay two (a0, a1: int8 x with B = 64, one x scale per group) rather than
 * one (a0 + a1: int16 x, or B = 32). */
QA_INLINE int two_sums(const int type)
{
    return !ifk_qx_x16(type) && ifk_qtype_block(type) == 64;
}

/* One slab against 4 tokens (x_j = p + j ld): OP (vpmaddubsw or vpmaddwd) of w0 with x_j[0..3]
 * and of w1 with x_j[4..7] (4-byte broadcasts), added by ADD (vpaddw or vpaddd) into S0[j] and
 * S1[j] (QA_SLAB4_TWO) or both into S0[j] (QA_SLAB4_ONE). In assembly because GCC (12) did not
 * keep the 8 sums in registers: it copied each sum to a new register and back after every add
 * and spilled one (Q4_B64 prefill, 1 thread: 118 GFLOPs with intrinsics, 212 so). ld3 = 3 ld;
 * t0, t1 are scratch. x is only read while the kernel runs, so the statement declares no memory
 * operand (as qpack_avx512.c's). */
#define QA_BC(D, X, T) "vpbroadcastd " D "(%[p]" X "), %[" T "]\n\t"
#define QA_X0 ""
#define QA_X1 ",%[ld],1"
#define QA_X2 ",%[ld],2"
#define QA_X3 ",%[ld3],1"
#define QA_TWO(OP, ADD, X, A, B)                                                              \
    QA_BC("", X, "t0") QA_BC("4", X, "t1") OP " %[t0], %[w0], %[t0]\n\t" OP " %[t1], %[w1], %[t1]\n\t" \
    ADD " %[t0], %[" A "], %[" A "]\n\t" ADD " %[t1], %[" B "], %[" B "]\n\t"
#define QA_ONE(OP, ADD, X, A)                                                                 \
    QA_BC("", X, "t0") QA_BC("4", X, "t1") OP " %[t0], %[w0], %[t0]\n\t" OP " %[t1], %[w1], %[t1]\n\t" \
    ADD " %[t1], %[t0], %[t0]\n\t" ADD " %[t0], %[" A "], %[" A "]\n\t"
#define QA_SLAB4_TWO(OP, ADD, S0, S1)                                                               \
    __asm__(QA_TWO(OP, ADD, QA_X0, "a0", "b0") QA_TWO(OP, ADD, QA_X1, "a1", "b1")                   \
                QA_TWO(OP, ADD, QA_X2, "a2", "b2") QA_TWO(OP, ADD, QA_X3, "a3", "b3")               \
            : [a0] "+x"(S0[0]), [a1] "+x"(S0[1]), [a2] "+x"(S0[2]), [a3] "+x"(S0[3]), [b0] "+x"(S1[0]), \
              [b1] "+x"(S1[1]), [b2] "+x"(S1[2]), [b3] "+x"(S1[3]), [t0] "=&x"(t0), [t1] "=&x"(t1)    \
            : [w0] "x"(w0), [w1] "x"(w1), [p] "r"(xs), [ld] "r"(ld), [ld3] "r"(ld3))
#define QA_SLAB4_ONE(OP, ADD, S0)                                                                    \
    __asm__(QA_ONE(OP, ADD, QA_X0, "a0") QA_ONE(OP, ADD, QA_X1, "a1") QA_ONE(OP, ADD, QA_X2, "a2")   \
                QA_ONE(OP, ADD, QA_X3, "a3")                                                         \
            : [a0] "+x"(S0[0]), [a1] "+x"(S0[1]), [a2] "+x"(S0[2]), [a3] "+x"(S0[3]), [t0] "=&x"(t0), \
              [t1] "=&x"(t1)                                                                         \
            : [w0] "x"(w0), [w1] "x"(w1), [p] "r"(xs), [ld] "r"(ld), [ld3] "r"(ld3))

/* The exact int32 sums of half of block b (lv as slab_operands) for tokens t0 .. t0 + C - 1:
 * a0[j] and a1[j] (two_sums), else a0[j] = a0 + a1. */
QA_INLINE void half_sums(__m256i *a0, __m256i *a1, const uint8_t *lv, const ifk_qx *qx, int b, int t0,
                         const int type, const int C)
{
    const int B = ifk_qtype_block(type), x16 = ifk_qx_x16(type);
    const int per = x16 ? 4 : 8; /* elements of the block a slab holds */
    __m256i s0[4], s1[4];        /* [C]: int16 sums (int8 x), int32 (int16 x) */
#pragma GCC unroll 4
    for (int j = 0; j < C; j++)
        s0[j] = s1[j] = _mm256_setzero_si256();
#pragma GCC unroll 1 /* unrolled, GCC interleaved the slabs and spilled their sums to the stack */
    for (int s = 0; s < B / per; s++) {
        __m256i w0, w1;
        slab_operands(&w0, &w1, lv, s, type);
        /* x of token t0 at this slab's elements */
        const int8_t *xs = qx->q + (size_t)t0 * qx->q_ld + (x16 ? 2 : 1) * ((size_t)b * B + (size_t)(per * s));
        if (C == 4) {
            const size_t ld = qx->q_ld, ld3 = 3 * ld;
            __m256i t0, t1;
            if (x16)
                QA_SLAB4_ONE("vpmaddwd", "vpaddd", s0);
            else if (two_sums(type))
                QA_SLAB4_TWO("vpmaddubsw", "vpaddw", s0, s1);
            else
                QA_SLAB4_ONE("vpmaddubsw", "vpaddw", s0);
            continue;
        }
#pragma GCC unroll 4
        for (int j = 0; j < C; j++) {
            const __m256i x0 = bcast4(xs + (size_t)j * qx->q_ld), x1 = bcast4(xs + (size_t)j * qx->q_ld + 4);
            if (x16) {
                s0[j] = _mm256_add_epi32(s0[j], _mm256_add_epi32(_mm256_madd_epi16(w0, x0), _mm256_madd_epi16(w1, x1)));
            } else if (two_sums(type)) {
                s0[j] = _mm256_add_epi16(s0[j], _mm256_maddubs_epi16(w0, x0));
                s1[j] = _mm256_add_epi16(s1[j], _mm256_maddubs_epi16(w1, x1));
            } else {
                s0[j] = _mm256_add_epi16(s0[j], _mm256_add_epi16(_mm256_maddubs_epi16(w0, x0), _mm256_maddubs_epi16(w1, x1)));
            }
        }
    }
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int j = 0; j < C; j++) {
        a0[j] = x16 ? s0[j] : _mm256_madd_epi16(s0[j], ones);
        if (two_sums(type))
            a1[j] = _mm256_madd_epi16(s1[j], ones);
    }
}

/* Block b of one group (its tile at `tile`) against tokens t0 .. t0 + C - 1 of qx, added into
 * yv[j][h] (the outputs of rows 8 h .. 8 h + 7 of the group, token t0 + j): qpack.h's
 * arithmetic, as qpack_avx512.c's block_step. */
QA_INLINE void block_step(__m256 (*yv)[2], const uint8_t *tile, const ifk_qx *qx, int b, int t0, const int type,
                          const int C)
{
    const size_t tb = tile_bytes(type);
    if (t0 == 0 && qx->ahead) /* the group's first pass reads its tiles from memory */
        for (size_t o = 0; o < tb; o += 64)
            _mm_prefetch((const char *)tile + qx->ahead + o, _MM_HINT_T1);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m256i a0[4], a1[4]; /* [C] */
        half_sums(a0, a1, tile + 64 + 32 * h, qx, b, t0, type, C);
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tile + 16 * h)));
        const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tile + 32 + 16 * h)));
#pragma GCC unroll 4
        for (int j = 0; j < C; j++) {
            const size_t o = (size_t)(t0 + j) * qx->s_ld + (size_t)b;
            __m256 p; /* the block's product before the weight scales; int8 x adds the residual's correction */
            if (ifk_qx_x16(type))
                p = _mm256_mul_ps(_mm256_cvtepi32_ps(a0[j]), _mm256_set1_ps(qx->s0[o]));
            else if (!two_sums(type))
                p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0[j]), _mm256_set1_ps(qx->s0[o]), _mm256_set1_ps(qx->cor[o]));
            else
                p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a1[j]), _mm256_set1_ps(qx->s1[o]),
                                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0[j]), _mm256_set1_ps(qx->s0[o]),
                                                    _mm256_set1_ps(qx->cor[o])));
            yv[j][h] = _mm256_fmadd_ps(p, dv, yv[j][h]);
            yv[j][h] = _mm256_fmadd_ps(mv, _mm256_set1_ps(qx->sum[o]), yv[j][h]);
        }
    }
}

/* y[t0 + j][n0 + r] for j < C, r < nr (<= 16) from yv[j]. */
QA_INLINE void store_outputs(float *y, size_t ldy, __m256 (*yv)[2], int n0, int nr, int t0, const int C)
{
#pragma GCC unroll 4
    for (int j = 0; j < C; j++) {
        float *yp = y + (size_t)(t0 + j) * ldy + n0;
        for (int h = 0; h < 2; h++) {
            const int n = nr - 8 * h;
            if (n >= 8)
                _mm256_storeu_ps(yp + 8 * h, yv[j][h]);
            else if (n > 0)
                v8_store_part(yp + 8 * h, n, yv[j][h]);
        }
    }
}

/* y[t0 + j][n0 + r] for j < C, r < nr (<= 16): the group whose tiles start at tg
 * ([nb][tile_bytes] bytes) against tokens t0 .. t0 + C - 1 of qx. */
QA_INLINE void group_tile(float *y, size_t ldy, const uint8_t *tg, const ifk_qx *qx, int n0, int nr, int t0,
                          const int type, const int C)
{
    const size_t tb = tile_bytes(type);
    __m256 yv[4][2];
#pragma GCC unroll 4
    for (int j = 0; j < C; j++)
        yv[j][0] = yv[j][1] = _mm256_setzero_ps();
    for (int b = 0; b < qx->nb; b++)
        block_step(yv, tg + (size_t)b * tb, qx, b, t0, type, C);
    store_outputs(y, ldy, yv, n0, nr, t0, C);
}

/* group_tile for one token and S groups at once, block by block (S streams through memory):
 * group s's tiles at tg[s], its rows from n[s] (nr of them for the last, 16 for the others). */
QA_INLINE void group_multi1(float *y, const uint8_t *const *tg, const int *n, int nr, const ifk_qx *qx,
                            const int type, const int S)
{
    const size_t tb = tile_bytes(type);
    __m256 yv[4][2];
#pragma GCC unroll 4
    for (int i = 0; i < S; i++)
        yv[i][0] = yv[i][1] = _mm256_setzero_ps();
    for (int b = 0; b < qx->nb; b++)
#pragma GCC unroll 4
        for (int i = 0; i < S; i++)
            block_step(&yv[i], tg[i] + (size_t)b * tb, qx, b, 0, type, 1);
#pragma GCC unroll 4
    for (int i = 0; i < S; i++)
        store_outputs(y, 0, &yv[i], n[i], i == S - 1 ? nr : 16, 0, 1);
}

/* Rows n0 <= n < n1 (n0 a multiple of 16), every token, of a packed matrix of one type. */
QA_INLINE void packed_rows(float *y, size_t ldy, const uint8_t *P, const ifk_qx *qx, int n0, int n1, const int type)
{
    const size_t group_bytes = (size_t)qx->nb * tile_bytes(type);
    if (qx->T == 1 && qx->streams > 1) { /* S streams: groups i, i + h, i + 2 h, ... */
        const int S = qx->streams < 4 ? qx->streams : 4, h = ifk_qpack_stream_rounds(n0, n1, S);
        for (int i = 0; i < h; i++) {
            const uint8_t *tg[4] = { 0 };
            int n[4] = { 0 }, nr;
            const int k = ifk_qpack_stream_round(i, n0, n1, S, n, &nr);
            for (int s = 0; s < k; s++)
                tg[s] = P + (size_t)(n[s] / 16) * group_bytes;
            switch (k) {
            case 4: group_multi1(y, tg, n, nr, qx, type, 4); break;
            case 3: group_multi1(y, tg, n, nr, qx, type, 3); break;
            case 2: group_multi1(y, tg, n, nr, qx, type, 2); break;
            default: group_multi1(y, tg, n, nr, qx, type, 1); break;
            }
        }
        return;
    }
    for (int n = n0; n < n1; n += 16) {
        const uint8_t *tg = P + (size_t)(n / 16) * group_bytes;
        const int nr = n1 - n < 16 ? n1 - n : 16;
        int t = 0;
        for (; t + 4 <= qx->T; t += 4)
            group_tile(y, ldy, tg, qx, n, nr, t, type, 4);
        if (t + 2 <= qx->T)
            group_tile(y, ldy, tg, qx, n, nr, t, type, 2), t += 2;
        if (t < qx->T)
            group_tile(y, ldy, tg, qx, n, nr, t, type, 1);
    }
}

#define QA_ROWS_FN(TYPE)                                                                              \
    static void rows_##TYPE(float *y, size_t ldy, const uint8_t *P, const ifk_qx *qx, int n0, int n1) \
    {                                                                                                 \
        packed_rows(y, ldy, P, qx, n0, n1, TYPE);                                                     \
    }
QA_ROWS_FN(IFK_Q4_B32)
QA_ROWS_FN(IFK_Q4_B64)
QA_ROWS_FN(IFK_Q8_B32)
QA_ROWS_FN(IFK_Q8_B64)

/* Q8 is read on int16 x only: the dispatcher (qdispatch.c) never gives the AVX2 path int8 x for
 * it. */
IFK_DECL_QMATMUL_ROWS(ifk_avx2_qmatmul_packed_rows)
{
    switch (qx->type) {
    case IFK_Q4_B32: rows_IFK_Q4_B32(y, ldy, W, qx, n0, n1); break;
    case IFK_Q4_B64: rows_IFK_Q4_B64(y, ldy, W, qx, n0, n1); break;
    case IFK_Q8_B32: rows_IFK_Q8_B32(y, ldy, W, qx, n0, n1); break;
    case IFK_Q8_B64: rows_IFK_Q8_B64(y, ldy, W, qx, n0, n1); break;
    default: break;
    }
}
