/*
 * qpack_avx512.c -- the int8 product over packed 16-row tiles (qpack.h) with AVX512_VNNI.
 *
 * A group of 16 rows against a tile of C tokens (C = 8, 4, 2, 1): per block, each slab of the
 * tile (16 rows x 8 elements for int8 x, x 4 for int16 x) is unpacked once into two operands,
 * 16 rows x 4 levels as bytes (vpdpbusd) or x 2 levels as int16 (vpdpwssd), and every token of
 * the tile adds both into its own int32 accumulators against 4 bytes of its x broadcast; at the
 * end of the block the accumulators are converted and scaled into the tokens' 16 outputs
 * (qpack.h's arithmetic, the same for every C). How a slab is unpacked is the type's
 * (slab_operands); the rest is common. Q8, Q6 and Q5 are compiled for both int16 x (the
 * default) and int8 x (the mode IFK_QX_INT8, quant.h: the same tiles, x's bytes in their pair
 * order; qpack.h), picked per call by qx->x16. The first token tile of a group (all of
 * decode) reads the tiles as one forward stream, with a software prefetch qx->ahead bytes ahead
 * where the dispatcher asks for one (qdispatch.c's packed_ahead); the later ones
 * find them in cache. Decode may read qx->streams groups side by side instead, block by block
 * (several streams through memory; qdispatch.c's packed_streams).
 *
 * Compiled twice. Here (QP_GFNI = 0) for Q4 and Q8, with target("avx512vnni") on top of the
 * file's -mavx512* flags: ifk_avx512_qmatmul_packed_rows, which qdispatch.c calls on the VNNI
 * paths. Again as qpack_avx512gfni.c (QP_GFNI = 1) for every packed type, with
 * target("avx512vnni,avx512vbmi,gfni"): ifk_avx512gfni_qmatmul_packed_rows, called on the GFNI
 * path of a CPU with AVX512_VBMI (ifk_qpath_packed). The other types need those: Q3H's codes
 * are split into levels by two 128-entry byte lookups (vpermi2b), and bit fields are moved in
 * one vgf2p8affineqb where shifts and masks would take two.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/qimpl.h"
#include "kernels/cpu/qpack.h"

#ifndef QP_GFNI
#define QP_GFNI 0
#endif
#if QP_GFNI
#define QP_TARGET "avx512vnni,avx512vbmi,gfni"
#define QP_NAME(name) ifk_avx512gfni_##name
#else
#define QP_TARGET "avx512vnni"
#define QP_NAME(name) ifk_avx512_##name
#endif
#define QP_INLINE static inline __attribute__((always_inline, target(QP_TARGET)))
#define QP_FN __attribute__((target(QP_TARGET)))

/* Bytes of a tile (qpack.h): 16 rows x one block. */
QP_INLINE size_t tile_bytes(const int type)
{
    return 16 * (size_t)ifk_qtype_block_bytes(type);
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

/* acc + w . the 4 bytes at p (broadcast) for one token, OP as above; in assembly too, for one
 * reason of the two: GCC loaded every broadcast into a register of its own (vpbroadcastd), an
 * instruction more per product, which decode (one token, 2 products a slab) felt. */
#define QP_DOT1(OP, ACC, WV) __asm__(OP " (%[p])" QP_BC "%[a]" : [a] "+v"(ACC) : [w] "v"(WV), [p] "r"(p))

QP_INLINE __m512i dot1(__m512i acc, __m512i w, const int8_t *p, const int x16)
{
    if (x16)
        QP_DOT1("vpdpwssd", acc, w);
    else
        QP_DOT1("vpdpbusd", acc, w);
    return acc;
}

/* ---- the operands of a slab, per type (qpack.h's layouts) ------------------------------- */

#if QP_GFNI
/* The vgf2p8affineqb matrix that moves bits from .. from + n - 1 of every byte to to .. and
 * clears the others: output bit i is the parity of (matrix byte 7 - i) & the input byte. */
QP_INLINE long long field_matrix(const int from, const int n, const int to)
{
    unsigned long long m = 0;
    for (int k = 0; k < n; k++)
        m |= (1ull << (from + k)) << 8 * (7 - (to + k));
    return (long long)m;
}

/* Bits from .. from + n - 1 of every byte of v at bits to .., the rest 0: one instruction where a
 * shift and a mask would take two. It runs on the pipes of vpdpbusd, though (Zen 4), so Q2 and
 * Q3 (one per product) are faster with crumb(); Q6, Q5 and Q3H (one per two products or fewer)
 * are faster with it: decode from cache, 1 thread, loaded machine, Q2 35 -> 38 GB/s and Q3
 * 33 -> 35 with crumb, Q6 40 -> 44, Q5 35 -> 36 and Q3H 35 -> 36 with field. */
QP_INLINE __m512i field(__m512i v, const int from, const int n, const int to)
{
    return _mm512_gf2p8affine_epi64_epi8(v, _mm512_set1_epi64(field_matrix(from, n, to)), 0);
}

/* Crumb c (bits 2 c, 2 c + 1) of every byte of v: a shift and a mask. */
QP_INLINE __m512i crumb(__m512i v, const int c)
{
    return _mm512_and_si512(c ? _mm512_srli_epi16(v, 2 * c) : v, _mm512_set1_epi8(3));
}

/* ternlog truth tables of its operands a, b, c */
enum { TL_A = 0xF0, TL_B = 0xCC, TL_C = 0xAA };

/* a & c | b: a byte's bits where c is set, b's clean bits added. */
QP_INLINE __m512i and_or(__m512i a, __m512i b, __m512i c)
{
    return _mm512_ternarylogic_epi32(a, b, c, (TL_A & TL_C) | TL_B);
}

QP_INLINE __m512i or3(__m512i a, __m512i b, __m512i c)
{
    return _mm512_ternarylogic_epi32(a, b, c, TL_A | TL_B | TL_C);
}

/* Q3H's code -> level tables for vpermi2b (which reads the low 7 bits of an index byte):
 * a = c / 11 (element 2 i), b = c % 11 (element 2 i + 1); entries past 120 are never read. */
#define QP_T8(f, c) f(c), f(c + 1), f(c + 2), f(c + 3), f(c + 4), f(c + 5), f(c + 6), f(c + 7)
#define QP_T64(f, c) QP_T8(f, c), QP_T8(f, c + 8), QP_T8(f, c + 16), QP_T8(f, c + 24), \
                     QP_T8(f, c + 32), QP_T8(f, c + 40), QP_T8(f, c + 48), QP_T8(f, c + 56)
#define QP_DIV11(c) (uint8_t)((c) / 11)
#define QP_MOD11(c) (uint8_t)((c) % 11)
static const uint8_t q3h_div11[128] __attribute__((aligned(64))) = { QP_T64(QP_DIV11, 0), QP_T64(QP_DIV11, 64) };
static const uint8_t q3h_mod11[128] __attribute__((aligned(64))) = { QP_T64(QP_MOD11, 0), QP_T64(QP_MOD11, 64) };

/* Q3H's code register 7: bit p of each byte is bit 7 of unit p's byte (p < 7).  lv: [7][64]. */
QP_INLINE __m512i q3h_codes7(const uint8_t *lv)
{
    __m512i g[7];
#pragma GCC unroll 7
    for (int p = 0; p < 7; p++)
        g[p] = field(_mm512_loadu_si512(lv + 64 * p), 7, 1, p);
    return or3(or3(or3(g[0], g[1], g[2]), g[3], g[4]), g[5], g[6]);
}
#endif

#if QP_GFNI
/* Q5's and Q6's levels of int16 slab s (elements 4 s .. 4 s + 3, qpack.h) as bytes, 16 rows x 4
 * in the int16 pair order. */
QP_INLINE __m512i q56_levels(const uint8_t *lv, const int s, const int type)
{
    const __m512i nib = _mm512_set1_epi8(15);
    const __m512i u = _mm512_loadu_si512(lv + 64 * (s % 8));
    if (type == IFK_Q5_B64) { /* + 16 where mask s is set */
        const __m512i l = s < 8 ? _mm512_and_si512(u, nib) : field(u, 4, 4, 0);
        return _mm512_mask_add_epi8(l, _load_mask64((__mmask64 *)(lv + 512 + 8 * s)), l, _mm512_set1_epi8(16));
    }
    /* Q6: | crumb s / 4 of unit 8 + s % 4 at bits 4-5 */
    const __m512i hi = field(_mm512_loadu_si512(lv + 512 + 64 * (s % 4)), 2 * (s / 4), 2, 4);
    return and_or(s < 8 ? u : _mm512_srli_epi16(u, 4), hi, nib);
}
#endif

/* Slab s of a tile's levels lv (tile + 64) as the operands of its products, 16 rows in the 16
 * dword lanes: *w0 against x elements per s .. (the first half of the slab: 4 levels as bytes
 * for int8 x, per = 8; 2 levels as int16 for int16 x, per = 4) and *w1 against the second half.
 * For B = 64 and int8 x the halves are the x groups 0 and 1 of qimpl.h. Q8, Q6 and Q5 on int8 x
 * (the mode IFK_QX_INT8): the slab is two of their int16 slabs, 2 s and 2 s + 1, each a
 * register of bytes in the int16 pair order, which x's bytes then follow (qdispatch.c). */
QP_INLINE void slab_operands(__m512i *w0, __m512i *w1, const uint8_t *lv, const int s, const int type, const int x16)
{
    const __m512i nib = _mm512_set1_epi8(15), byte16 = _mm512_set1_epi16(0x00FF);
    switch (type) {
    case IFK_Q4_B32:
    case IFK_Q4_B64: { /* low nibbles, high nibbles */
        const __m512i v = _mm512_loadu_si512(lv + 64 * s);
        *w0 = _mm512_and_si512(v, nib);
        *w1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
        return;
    }
    case IFK_Q8_B32:
    case IFK_Q8_B64: { /* even bytes, odd bytes: int16 pairs; for int8 x units 2 s and 2 s + 1 */
        if (!x16) {
            *w0 = _mm512_loadu_si512(lv + 128 * s);
            *w1 = _mm512_loadu_si512(lv + 128 * s + 64);
            return;
        }
        const __m512i v = _mm512_loadu_si512(lv + 64 * s);
        *w0 = _mm512_and_si512(v, byte16);
        *w1 = _mm512_srli_epi16(v, 8);
        return;
    }
#if QP_GFNI
    case IFK_Q2_B32:
    case IFK_Q3_B32: { /* crumb s of units 0 and 1; Q3: + 4 where masks 2 s, 2 s + 1 are set */
        *w0 = crumb(_mm512_loadu_si512(lv), s);
        *w1 = crumb(_mm512_loadu_si512(lv + 64), s);
        if (type == IFK_Q3_B32) {
            const __m512i four = _mm512_set1_epi8(4);
            *w0 = _mm512_mask_add_epi8(*w0, _load_mask64((__mmask64 *)(lv + 128 + 16 * s)), *w0, four);
            *w1 = _mm512_mask_add_epi8(*w1, _load_mask64((__mmask64 *)(lv + 136 + 16 * s)), *w1, four);
        }
        return;
    }
    case IFK_Q5_B64:
    case IFK_Q6_B64: { /* nibble plane s % 8 of unit s % 8 plus the high bits; int16 pairs */
        if (!x16) {
            *w0 = q56_levels(lv, 2 * s, type);
            *w1 = q56_levels(lv, 2 * s + 1, type);
            return;
        }
        const __m512i l = q56_levels(lv, s, type);
        *w0 = _mm512_and_si512(l, byte16);
        *w1 = _mm512_srli_epi16(l, 8);
        return;
    }
    case IFK_Q3H_B64: { /* code register s; its codes' levels interleaved a, b per 128-bit lane */
        const __m512i c = s < 7 ? _mm512_loadu_si512(lv + 64 * s) : q3h_codes7(lv);
        const __m512i a = _mm512_permutex2var_epi8(_mm512_load_si512(q3h_div11), c, _mm512_load_si512(q3h_div11 + 64));
        const __m512i b = _mm512_permutex2var_epi8(_mm512_load_si512(q3h_mod11), c, _mm512_load_si512(q3h_mod11 + 64));
        *w0 = _mm512_unpacklo_epi8(a, b);
        *w1 = _mm512_unpackhi_epi8(a, b);
        return;
    }
#endif
    default:
        *w0 = *w1 = _mm512_setzero_si512();
        return;
    }
}

/* ---- the product -------------------------------------------------------------------------- */

/* The exact int32 sums of one tile for tokens t0 .. t0 + C - 1, added into a0[j] (the first
 * halves of the slabs) and a1[j] (the second halves): vpdpbusd against int8 x, vpdpwssd against
 * int16 x pairs. With C < 4 the odd slabs go into sums of their own, added (exactly) at the end,
 * so that fewer products wait on the one before (Q8_B32 decode from cache, 1 thread: 49 -> 60
 * GB/s). */
QP_INLINE void tile_sums(__m512i *a0, __m512i *a1, const uint8_t *tile, const ifk_qx *qx, int b, int t0,
                         const int type, const int x16, const int C)
{
    const int B = ifk_qtype_block(type);
    const int per = x16 ? 4 : 8;                         /* elements of the block a slab holds */
    __m512i o0[2] = { _mm512_setzero_si512(), _mm512_setzero_si512() }, o1[2] = { o0[0], o0[1] }; /* [C < 4] */
#pragma GCC unroll 16
    for (int s = 0; s < B / per; s++) {
        __m512i w0, w1;
        slab_operands(&w0, &w1, tile + 64, s, type, x16);
        /* x of token t0 at this slab's 8 (int8) or 4 (int16) elements */
        const int8_t *xs = qx->q + (size_t)t0 * qx->q_ld + (x16 ? 2 : 1) * ((size_t)b * B + (size_t)(per * s));
        if (C == 8 || C == 4) {
            slab(a0, a1, w0, w1, xs, qx->q_ld, x16, C);
            continue;
        }
        __m512i *s0 = s % 2 ? o0 : a0, *s1 = s % 2 ? o1 : a1;
#pragma GCC unroll 2
        for (int j = 0; j < C; j++) {
            s0[j] = dot1(s0[j], w0, xs + (size_t)j * qx->q_ld, x16);
            s1[j] = dot1(s1[j], w1, xs + (size_t)j * qx->q_ld + 4, x16);
        }
    }
    for (int j = 0; j < (C < 4 ? C : 0); j++) { /* (no unroll pragma: GCC warns when C >= 4 drops the loop) */
        a0[j] = _mm512_add_epi32(a0[j], o0[j]);
        a1[j] = _mm512_add_epi32(a1[j], o1[j]);
    }
}

/* Block b of one group (its tile at `tile`) against tokens t0 .. t0 + C - 1 of qx, added into
 * yv[j] (the group's 16 outputs of token t0 + j). One x scale per block (int16 x, or B = 32): the
 * two int32 sums added exactly before the one conversion. */
QP_INLINE void block_step(__m512 *yv, const uint8_t *tile, const ifk_qx *qx, int b, int t0, const int type,
                          const int x16, const int C)
{
    const int B = ifk_qtype_block(type);
    const size_t tb = tile_bytes(type);
    if (t0 == 0 && qx->ahead) /* the group's first pass reads its tiles from memory */
        for (size_t o = 0; o < tb; o += 64)
            _mm_prefetch((const char *)tile + qx->ahead + o, _MM_HINT_T1);
    __m512i a0[8], a1[8]; /* [C] */
#pragma GCC unroll 8
    for (int j = 0; j < C; j++)
        a0[j] = a1[j] = _mm512_setzero_si512();
    tile_sums(a0, a1, tile, qx, b, t0, type, x16, C);
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tile));
    const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + 32)));
#pragma GCC unroll 8
    for (int j = 0; j < C; j++) {
        const size_t o = (size_t)(t0 + j) * qx->s_ld + (size_t)b;
        /* p: the block's product before the weight scales (qpack.h's arithmetic), with int8 x
         * the residual's correction (qimpl.h) added in the first multiply's place */
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

/* y[t0 + j][n0 + r] for j < C, r < nr (<= 16) from yv[j]. */
QP_INLINE void store_outputs(float *y, size_t ldy, const __m512 *yv, int n0, int nr, int t0, const int C)
{
#pragma GCC unroll 8
    for (int j = 0; j < C; j++) {
        float *yp = y + (size_t)(t0 + j) * ldy + n0;
        if (nr == 16)
            _mm512_storeu_ps(yp, yv[j]);
        else
            _mm512_mask_storeu_ps(yp, (__mmask16)((1u << nr) - 1u), yv[j]);
    }
}

/* y[t0 + j][n0 + r] for j < C, r < nr (<= 16): the 16 rows of the group whose tiles start at
 * tg ([nb][tile_bytes] bytes) against tokens t0 .. t0 + C - 1 of qx. */
QP_INLINE void group_tile(float *y, size_t ldy, const uint8_t *tg, const ifk_qx *qx, int n0, int nr, int t0,
                          const int type, const int x16, const int C)
{
    const size_t tb = tile_bytes(type);
    __m512 yv[8];
#pragma GCC unroll 8
    for (int j = 0; j < C; j++)
        yv[j] = _mm512_setzero_ps();
    for (int b = 0; b < qx->nb; b++)
        block_step(yv, tg + (size_t)b * tb, qx, b, t0, type, x16, C);
    store_outputs(y, ldy, yv, n0, nr, t0, C);
}

/* group_tile for one token (T = 1) and S groups at once, block by block (S streams through
 * memory): group s's tiles at tg[s], its rows from n[s] (nr of them for the last, 16 for the
 * others); each output the same operations as alone. */
QP_INLINE void group_multi1(float *y, const uint8_t *const *tg, const int *n, int nr, const ifk_qx *qx,
                            const int type, const int x16, const int S)
{
    const size_t tb = tile_bytes(type);
    __m512 yv[4];
#pragma GCC unroll 4
    for (int i = 0; i < S; i++)
        yv[i] = _mm512_setzero_ps();
    for (int b = 0; b < qx->nb; b++)
#pragma GCC unroll 4
        for (int i = 0; i < S; i++)
            block_step(&yv[i], tg[i] + (size_t)b * tb, qx, b, 0, type, x16, 1);
#pragma GCC unroll 4
    for (int i = 0; i < S; i++)
        store_outputs(y, 0, &yv[i], n[i], i == S - 1 ? nr : 16, 0, 1);
}

/* Rows n0 <= n < n1 (n0 a multiple of 16), every token, of a packed matrix of one type. */
QP_INLINE void packed_rows(float *y, size_t ldy, const uint8_t *P, const ifk_qx *qx, int n0, int n1, const int type,
                           const int x16)
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
            case 4: group_multi1(y, tg, n, nr, qx, type, x16, 4); break;
            case 3: group_multi1(y, tg, n, nr, qx, type, x16, 3); break;
            case 2: group_multi1(y, tg, n, nr, qx, type, x16, 2); break;
            default: group_multi1(y, tg, n, nr, qx, type, x16, 1); break;
            }
        }
        return;
    }
    for (int n = n0; n < n1; n += 16) {
        const uint8_t *tg = P + (size_t)(n / 16) * group_bytes;
        const int nr = n1 - n < 16 ? n1 - n : 16;
        int t = 0;
        for (; t + 8 <= qx->T; t += 8)
            group_tile(y, ldy, tg, qx, n, nr, t, type, x16, 8);
        if (t + 4 <= qx->T)
            group_tile(y, ldy, tg, qx, n, nr, t, type, x16, 4), t += 4;
        if (t + 2 <= qx->T)
            group_tile(y, ldy, tg, qx, n, nr, t, type, x16, 2), t += 2;
        if (t < qx->T)
            group_tile(y, ldy, tg, qx, n, nr, t, type, x16, 1);
    }
}

/* rows_TYPE_X16: one type on int8 x (X16 = 0) or int16 x (X16 = 1, the types of ifk_qx_x16;
 * their int8 variant serves the mode IFK_QX_INT8). */
#define QP_ROWS_FN(TYPE, X16)                                                                        \
    QP_FN static void rows_##TYPE##_##X16(float *y, size_t ldy, const uint8_t *P, const ifk_qx *qx, int n0, \
                                          int n1)                                                    \
    {                                                                                                \
        packed_rows(y, ldy, P, qx, n0, n1, TYPE, X16);                                               \
    }
#define QP_ROWS_FN2(TYPE) QP_ROWS_FN(TYPE, 0) QP_ROWS_FN(TYPE, 1)
/* The types this compilation multiplies: Q4 and Q8 (AVX512_VNNI), and with GFNI every type;
 * QP_TYPES8 on int8 x only, QP_TYPES16 on either. */
#if QP_GFNI
#define QP_TYPES8(X) X(IFK_Q4_B32) X(IFK_Q4_B64) X(IFK_Q3H_B64) X(IFK_Q3_B32) X(IFK_Q2_B32)
#define QP_TYPES16(X) X(IFK_Q8_B32) X(IFK_Q8_B64) X(IFK_Q6_B64) X(IFK_Q5_B64)
#else
#define QP_TYPES8(X) X(IFK_Q4_B32) X(IFK_Q4_B64)
#define QP_TYPES16(X) X(IFK_Q8_B32) X(IFK_Q8_B64)
#endif
#define QP_ROWS_FN8(TYPE) QP_ROWS_FN(TYPE, 0)
QP_TYPES8(QP_ROWS_FN8)
QP_TYPES16(QP_ROWS_FN2)

QP_FN IFK_DECL_QMATMUL_ROWS(QP_NAME(qmatmul_packed_rows))
{
#define QP_CASE8(TYPE)                          \
    case TYPE:                                  \
        rows_##TYPE##_0(y, ldy, W, qx, n0, n1); \
        break;
#define QP_CASE16(TYPE)                                                        \
    case TYPE:                                                                 \
        (qx->x16 ? rows_##TYPE##_1 : rows_##TYPE##_0)(y, ldy, W, qx, n0, n1); \
        break;
    switch (qx->type) {
        QP_TYPES8(QP_CASE8)
        QP_TYPES16(QP_CASE16)
    default:
        break;
    }
#undef QP_CASE8
#undef QP_CASE16
}
