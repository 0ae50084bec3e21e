/*
 * qmatmul_avx2.c -- the quantized matrix product with AVX2 (+ FMA, F16C).
 *
 * The plan of qmatmul_avx512.c with 8-lane registers and no VNNI: the u8 x s8 dot product is
 * maddubs (pairs to int16) + madd with ones (to int32 lanes of 4 bytes); for the int8-x types
 * (4 bits and fewer) maddubs cannot saturate (2 * 31 * 127 bounds every level they have), and
 * the two maddubs results of a 64-block share one madd (4 * 31 * 127 < 32768). Q8, Q6 and Q5 take int16 x: the levels widened
 * to int16, then madd (s16 x s16 pairs to int32).
 *
 * Decode reads one row at a time (one forward stream, prefetched) and converts each block's
 * header on its own; prefill decodes chunks of 64 blocks of 2 rows once (levels to bytes,
 * headers 8 per gather) and passes tiles of 2 tokens over them. Both sum each output in the
 * same order (qmatmul_avx512.c's, with 8 lanes; see tile), so row t of y depends only on W
 * and x[t] (kernels.h's batch invariance).
 *
 * A model's Q4 and Q8 matrices are packed at load and multiplied by qpack_avx2.c instead
 * (qpack.h; 1.6-2 times this file's prefill); this file serves the other types, and Q4 and Q8
 * where packing is off (IFLOW_PACK=0) or the matrix is not a model's.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/qimpl.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/vec_avx2.h"

#define QK_INLINE static inline __attribute__((always_inline))

/* ---- activation quantization ------------------------------------------------------------- */

/* 8 floats of x from element k (lanes at or past K are 0).  x: [K]. */
QK_INLINE __m256 load_x8(const float *x, int k, int K)
{
    if (k + 8 <= K)
        return _mm256_loadu_ps(x + k);
    return v8_load_part(x + k, K - k);
}

QK_INLINE __m256 abs8(__m256 v)
{
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

QK_INLINE float hmax8(__m256 v)
{
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

QK_INLINE float hsum8(__m256 v)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* A group whose max |x| is below 2^-64 is scaled by 2^64 first (exactly), so that
 * top / amax cannot overflow. */
QK_INLINE float prescale(float amax)
{
    return amax < 0x1p-64f ? 0x1p64f : 1.0f;
}

/* top / (amax * prescale) (top = 127 for int8, 32767 for int16), or 0 when amax is 0. */
QK_INLINE float inv_scale(float amax, float top)
{
    return amax > 0.0f ? top / (amax * prescale(amax)) : 0.0f;
}

/* round(v[i] * pre[i] * inv[i]) for 4 vectors of 8 -> 32 int8 in order, stored at q: [32]. */
QK_INLINE void store_i8x32(int8_t *q, const __m256 v[4], const __m256 pre[4], const __m256 inv[4])
{
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(v[0], pre[0]), inv[0]));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(v[1], pre[1]), inv[1]));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(v[2], pre[2]), inv[2]));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(v[3], pre[3]), inv[3]));
    /* packs work within 128-bit lanes: 0 1 4 5 | 2 3 6 7 (in 4-element runs), then
     * 0 4 1 5 2 6 3 7 ... undone by one dword permutation */
    __m256i s01 = _mm256_packs_epi32(i0, i1), s23 = _mm256_packs_epi32(i2, i3);
    __m256i b = _mm256_packs_epi16(s01, s23);
    b = _mm256_max_epi8(b, _mm256_set1_epi8(-127));
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_store_si256((__m256i *)q, b);
}

/* Elements [k0, k0 + 32) of x as one group.  q: [32]; s, sum: one float each. */
QK_INLINE void quantize32(const float *x, int K, int k0, int8_t *q, float *s, float *sum)
{
    __m256 v[4], pre[4], inv[4];
    for (int i = 0; i < 4; i++)
        v[i] = load_x8(x, k0 + 8 * i, K);
    float amax = hmax8(_mm256_max_ps(_mm256_max_ps(abs8(v[0]), abs8(v[1])), _mm256_max_ps(abs8(v[2]), abs8(v[3]))));
    for (int i = 0; i < 4; i++) {
        pre[i] = _mm256_set1_ps(prescale(amax));
        inv[i] = _mm256_set1_ps(inv_scale(amax, 127.0f));
    }
    store_i8x32(q, v, pre, inv);
    *s = amax / 127.0f;
    *sum = hsum8(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])));
}

/* Block b of a 64-block type: group 0 is lanes 0-3 of each 8 (the even runs of 4). */
QK_INLINE void quantize64(const float *x, int K, int b, int8_t *q, float *s0, float *s1, float *sum)
{
    __m256 v[8];
    for (int i = 0; i < 8; i++)
        v[i] = load_x8(x, b * 64 + 8 * i, K);
    __m256 a = abs8(v[0]);
    for (int i = 1; i < 8; i++)
        a = _mm256_max_ps(a, abs8(v[i]));
    __m128 a0 = _mm256_castps256_ps128(a), a1 = _mm256_extractf128_ps(a, 1);
    a0 = _mm_max_ps(a0, _mm_movehl_ps(a0, a0));
    a1 = _mm_max_ps(a1, _mm_movehl_ps(a1, a1));
    float amax0 = _mm_cvtss_f32(_mm_max_ss(a0, _mm_movehdup_ps(a0)));
    float amax1 = _mm_cvtss_f32(_mm_max_ss(a1, _mm_movehdup_ps(a1)));
    float i0 = inv_scale(amax0, 127.0f), i1 = inv_scale(amax1, 127.0f), p0 = prescale(amax0), p1 = prescale(amax1);
    __m256 pre[4], inv[4];
    for (int i = 0; i < 4; i++) {
        pre[i] = _mm256_setr_ps(p0, p0, p0, p0, p1, p1, p1, p1);
        inv[i] = _mm256_setr_ps(i0, i0, i0, i0, i1, i1, i1, i1);
    }
    store_i8x32(q, v, pre, inv);
    store_i8x32(q + 32, v + 4, pre, inv);
    *s0 = amax0 / 127.0f;
    *s1 = amax1 / 127.0f;
    __m256 s = v[0];
    for (int i = 1; i < 8; i++)
        s = _mm256_add_ps(s, v[i]);
    *sum = hsum8(s);
}

/* Block b of an int16 type: one group, the block of B (32 or 64).  q: [B] of the block. */
QK_INLINE void quantize_x16(const float *x, int K, int b, int B, int16_t *q, float *s, float *sum)
{
    __m256 v[8], a = _mm256_setzero_ps(), t = _mm256_setzero_ps();
    for (int i = 0; i < B / 8; i++) {
        v[i] = load_x8(x, b * B + 8 * i, K);
        a = _mm256_max_ps(a, abs8(v[i]));
        t = _mm256_add_ps(t, v[i]);
    }
    float amax = hmax8(a);
    __m256 pre = _mm256_set1_ps(prescale(amax)), inv = _mm256_set1_ps(inv_scale(amax, 32767.0f));
    for (int i = 0; i < B / 8; i += 2) {
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(v[i], pre), inv));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(v[i + 1], pre), inv));
        /* packs works within 128-bit lanes: 0-3 8-11 | 4-7 12-15, put back in order */
        _mm256_store_si256((__m256i *)(q + 8 * i), _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), 0xD8));
    }
    *s = amax / 32767.0f;
    *sum = hsum8(t);
}

/* s0 X0 + s1 X1: the rounded x of one int8 block back in F32, X0 and X1 the sums of xq over
 * its groups (qimpl.h: the even and odd runs of 4 for B = 64, whose dwords alternate).  q: [B],
 * 32-byte aligned. */
QK_INLINE float rounded_sum(const int8_t *q, int B, float s0, float s1)
{
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    __m256i d = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, _mm256_load_si256((const __m256i *)q)), ones16);
    if (B == 64) /* dword k of either half: bytes 4k..4k+3 of it, group k % 2 */
        d = _mm256_add_epi32(d, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, _mm256_load_si256((const __m256i *)(q + 32))), ones16));
    _Alignas(32) int32_t v[8];
    _mm256_store_si256((__m256i *)v, d);
    const int32_t x0 = v[0] + v[2] + v[4] + v[6], x1 = v[1] + v[3] + v[5] + v[7];
    return B == 32 ? s0 * (float)(x0 + x1) : s0 * (float)x0 + s1 * (float)x1;
}

IFK_DECL_QX_QUANTIZE(ifk_avx2_qx_quantize)
{
    const size_t used = (size_t)qx->nb * qx->B * (qx->x16 ? 2 : 1); /* bytes of q per token */
    for (int t = t0; t < t1; t++) {
        const float *xt = x + (size_t)t * ldx;                  /* [K] */
        int8_t *q = qx->q + (size_t)t * qx->q_ld;               /* [q_ld] */
        float *s0 = qx->s0 + (size_t)t * qx->s_ld, *s1 = qx->s1 + (size_t)t * qx->s_ld;
        float *sum = qx->sum + (size_t)t * qx->s_ld;            /* each [s_ld] */
        for (int b = 0; b < qx->nb; b++) {
            if (qx->x16) {
                quantize_x16(xt, qx->K, b, qx->B, (int16_t *)q + (size_t)qx->B * b, s0 + b, sum + b);
                s1[b] = 0.0f;
            } else if (qx->B == 32) {
                quantize32(xt, qx->K, b * 32, q + 32 * b, s0 + b, sum + b);
                s1[b] = 0.0f;
            } else {
                quantize64(xt, qx->K, b, q + 64 * b, s0 + b, s1 + b, sum + b);
            }
            if (!qx->x16) /* ifk_qx_finish makes it the residual's correction */
                qx->cor[(size_t)t * qx->s_ld + b] = rounded_sum(q + (size_t)qx->B * b, qx->B, s0[b], s1[b]);
        }
        memset(q + used, 0, qx->q_ld - used);
        for (size_t b = (size_t)qx->nb; b < qx->s_ld; b++)
            s0[b] = s1[b] = sum[b] = 0.0f;
        ifk_qx_finish(qx, t);
    }
}

/* ---- unpacking the levels of one block to bytes ------------------------------------------ */

/* Bytes i < 32: 0xFF where bit i of u is set, else 0. */
QK_INLINE __m256i bits_to_bytes(uint32_t u)
{
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)u),
                                    _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                     2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* 16 bytes p[j] & 15 then p[j] >> 4 (j < 16).  p: [16]. */
QK_INLINE __m256i nibbles32(const uint8_t *p)
{
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
}

/* Bytes 8L + j = (p[j] >> 2L) & 3 for L < 4, j < 8.  p: [8]. */
QK_INLINE __m256i crumbs32(const uint8_t *p)
{
    long long u;
    memcpy(&u, p, 8);
    __m256i v = _mm256_srlv_epi64(_mm256_set1_epi64x(u), _mm256_setr_epi64x(0, 2, 4, 6));
    return _mm256_and_si256(v, _mm256_set1_epi8(3));
}

/* The 64 levels of a 64-block as two vectors of 32 bytes: l[0] levels 0-31, l[1] 32-63. */
QK_INLINE void levels64(__m256i l[2], int type, const uint8_t *blk)
{
    const uint8_t *lv = blk + 4;
    const __m256i m15 = _mm256_set1_epi8(15);
    if (type == IFK_Q8_B64) {
        l[0] = _mm256_loadu_si256((const __m256i *)lv);
        l[1] = _mm256_loadu_si256((const __m256i *)(lv + 32));
        return;
    }
    if (type == IFK_Q3H_B64) {
        __m256i c = nibbles32(lv);
        c = _mm256_or_si256(c, _mm256_and_si256(bits_to_bytes(ifk_rd32(lv + 16)), _mm256_set1_epi8(16)));
        c = _mm256_or_si256(c, _mm256_and_si256(bits_to_bytes(ifk_rd32(lv + 20)), _mm256_set1_epi8(32)));
        c = _mm256_or_si256(c, _mm256_and_si256(bits_to_bytes(ifk_rd32(lv + 24)), _mm256_set1_epi8(64)));
        /* a = c / 11 = mulhi(c, 5984), and the int16 lane (c << 8) - 2815 a = (b << 8) | a */
        for (int h = 0; h < 2; h++) {
            __m256i c16 = _mm256_cvtepu8_epi16(h ? _mm256_extracti128_si256(c, 1) : _mm256_castsi256_si128(c));
            __m256i a = _mm256_mulhi_epu16(c16, _mm256_set1_epi16(5984));
            l[h] = _mm256_sub_epi16(_mm256_slli_epi16(c16, 8), _mm256_mullo_epi16(a, _mm256_set1_epi16(2815)));
        }
        return;
    }
    /* Q4_B64, Q5_B64, Q6_B64: the low nibbles */
    __m256i v = _mm256_loadu_si256((const __m256i *)lv);
    l[0] = _mm256_and_si256(v, m15);
    l[1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m15);
    if (type == IFK_Q5_B64) {
        const __m256i b4 = _mm256_set1_epi8(16);
        l[0] = _mm256_or_si256(l[0], _mm256_and_si256(bits_to_bytes(ifk_rd32(lv + 32)), b4));
        l[1] = _mm256_or_si256(l[1], _mm256_and_si256(bits_to_bytes(ifk_rd32(lv + 36)), b4));
    } else if (type == IFK_Q6_B64) {
        /* level 16L + j has high bits (qh[j] >> 2L) & 3; moved to bits 4-5 of the byte */
        __m256i h = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(lv + 32)));
        const __m256i m30 = _mm256_set1_epi8(0x30);
        l[0] = _mm256_or_si256(l[0], _mm256_and_si256(_mm256_sllv_epi64(h, _mm256_setr_epi64x(4, 4, 2, 2)), m30));
        l[1] = _mm256_or_si256(l[1], _mm256_and_si256(_mm256_srlv_epi64(h, _mm256_setr_epi64x(0, 0, 2, 2)), m30));
    }
}

/* The 32 levels of a 32-block as bytes. */
QK_INLINE __m256i levels32(int type, const uint8_t *blk)
{
    const uint8_t *lv = blk + 4;
    switch (type) {
    case IFK_Q8_B32:
        return _mm256_loadu_si256((const __m256i *)lv);
    case IFK_Q4_B32:
        return nibbles32(lv);
    case IFK_Q3_B32:
        return _mm256_or_si256(crumbs32(lv), _mm256_and_si256(bits_to_bytes(ifk_rd32(lv + 8)), _mm256_set1_epi8(4)));
    default: /* IFK_Q2_B32 */
        return crumbs32(lv);
    }
}

/* ---- one block ---------------------------------------------------------------------------- */

/* Software prefetch distance in a row stream (bytes); see qmatmul_avx512.c. */
#ifndef PF_AHEAD
#define PF_AHEAD 2048
#endif

/* The levels of one block as bytes: lev[0] (levels 0-31) and lev[1] (32-63, B = 64). */
QK_INLINE void block_levels(__m256i lev[2], int type, const uint8_t *blk)
{
    if (ifk_qtype_block(type) == 64)
        levels64(lev, type, blk);
    else
        lev[0] = levels32(type, blk);
}

/* The int32 lanes of sum_i lev_i * x_i over 4 bytes (lev unsigned, x signed). */
QK_INLINE __m256i dot4(__m256i lev, __m256i x)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(lev, x), _mm256_set1_epi16(1));
}

/* sum of lev_i * x_i over 32 levels (bytes) and 32 int16 x, in 8 int32 lanes.  xq: [32]. */
QK_INLINE __m256i dot_x16_32(__m256i lev, const int16_t *xq)
{
    __m256i lo = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(lev)), hi = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(lev, 1));
    return _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_load_si256((const __m256i *)xq)),
                            _mm256_madd_epi16(hi, _mm256_load_si256((const __m256i *)(xq + 16))));
}

/* One block's levels times x's values, as float lanes. int8 x: lane i holds bytes 4i..4i+3 of
 * each 32 (the two halves of a 64-block share one madd: at most 4 * 31 * 127 < 32768);
 * int16 x (ifk_qx_x16 types): any lane, one x scale per block.  lev: from block_levels;
 * xq: the block's x values ([B] int8 or int16). */
QK_INLINE __m256 block_dot(const __m256i lev[2], const int8_t *xq, const int type)
{
    __m256i p;
    if (ifk_qx_x16(type)) {
        p = dot_x16_32(lev[0], (const int16_t *)xq);
        if (ifk_qtype_block(type) == 64)
            p = _mm256_add_epi32(p, dot_x16_32(lev[1], (const int16_t *)xq + 32));
    } else if (ifk_qtype_block(type) == 64) {
        __m256i x0 = _mm256_load_si256((const __m256i *)xq), x1 = _mm256_load_si256((const __m256i *)(xq + 32));
        p = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lev[0], x0), _mm256_maddubs_epi16(lev[1], x1)),
                              _mm256_set1_epi16(1));
    } else {
        p = dot4(lev[0], _mm256_load_si256((const __m256i *)xq));
    }
    return _mm256_cvtepi32_ps(p);
}

/* Whether a block has one x scale (int16 x, or B = 32) rather than a pair (int8 x, B = 64). */
QK_INLINE int one_scale(int type)
{
    return ifk_qx_x16(type) || ifk_qtype_block(type) == 32;
}

/* The scale of block i for an int32 lane: ds[i] (one_scale), or the pair ds[2i], ds[2i + 1]
 * repeated (the lanes alternate between the block's two x groups). */
QK_INLINE __m256 block_scale(const float *ds, int i, const int type)
{
    if (!one_scale(type))
        return _mm256_castsi256_ps(_mm256_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)(ds + 2 * i))));
    return _mm256_broadcast_ss(ds + i);
}

/* ---- prefill: tiles of R rows x C tokens over chunks of K -------------------------------- */

#define PF_KC 64 /* blocks per chunk of K (levels and headers decoded once per chunk and row) */

/* delta d[i] and min m[i] of blocks c0 + i of a row, i < nc (<= PF_KC; 0 past nc).  row: [nb * BB] bytes; d, m: [PF_KC]. */
QK_INLINE void chunk_headers(float *d, float *m, const uint8_t *row, int c0, int nc, const int type)
{
    const int BB = ifk_qtype_block_bytes(type);
    const __m256i at = _mm256_mullo_epi32(_mm256_set1_epi32(BB), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int g = 0; g < PF_KC; g += 8) {
        int ng = nc - g < 0 ? 0 : nc - g < 8 ? nc - g : 8;
        __m256i h = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)(row + (size_t)(c0 + g) * BB), at,
                                                v8_mask(ng), 1);
        /* u16 halves -> F16: [d0..d3 m0..m3 | d4..d7 m4..m7] -> [d0..d7 | m0..m7] */
        __m256i p = _mm256_packus_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0xffff)), _mm256_srli_epi32(h, 16));
        p = _mm256_permute4x64_epi64(p, 0xD8);
        _mm256_store_ps(d + g, _mm256_cvtph_ps(_mm256_castsi256_si128(p)));
        _mm256_store_ps(m + g, _mm256_cvtph_ps(_mm256_extracti128_si256(p, 1)));
    }
}

/* The levels of blocks c0 .. c0 + nc - 1 of a row as bytes.
 * row: [nb * BB]; lv: [nc][B]. */
QK_INLINE void chunk_levels(uint8_t *lv, const uint8_t *row, int c0, int nc, const int type)
{
    const int B = ifk_qtype_block(type), BB = ifk_qtype_block_bytes(type);
    for (int i = 0; i < nc; i++) {
        const uint8_t *blk = row + (size_t)(c0 + i) * BB;
        __m256i l[2];
        _mm_prefetch((const char *)blk + PF_AHEAD, _MM_HINT_T0);
        block_levels(l, type, blk);
        for (int h = 0; h < B / 32; h++)
            _mm256_store_si256((__m256i *)(lv + (size_t)i * B + 32 * h), l[h]);
    }
}

/* The delta terms of block i of the chunk (block b of the row) for R rows x C tokens, added
 * into a[r][j]: block_dot fmadd block_scale.  lv, ds as in tile. */
QK_INLINE void tile_block(__m256 (*a)[2], const uint8_t (*lv)[PF_KC * 64], const ifk_qx *qx, int t0, size_t b, int i,
                          const float (*ds)[2][2 * PF_KC], const int type, const int R, const int C)
{
    const int B = ifk_qtype_block(type);
    __m256i lev[2][2];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int h = 0; h < B / 32; h++)
            lev[r][h] = _mm256_load_si256((const __m256i *)(lv[r] + (size_t)i * B + 32 * h));
#pragma GCC unroll 2
    for (int j = 0; j < C; j++) {
        const int8_t *xq = qx->q + (size_t)(t0 + j) * qx->q_ld + b * B * (ifk_qx_x16(type) ? 2 : 1);
#pragma GCC unroll 2
        for (int r = 0; r < R; r++)
            a[r][j] = _mm256_fmadd_ps(block_dot(lev[r], xq, type), block_scale(ds[r][j], i, type), a[r][j]);
    }
}

/* [v[a], v[a + 1], v[b], v[b + 1]] in both 128-bit lanes: two blocks of tokens t0 and
 * t0 + C - 1 (tile's min-term lanes).  v: qx->sum or qx->cor. */
QK_INLINE __m256 pair4(const float *v, size_t a, size_t b)
{
    __m128 p = _mm_loadh_pi(_mm_castpd_ps(_mm_load_sd((const double *)(v + a))), (const __m64 *)(v + b));
    return _mm256_set_m128(p, p);
}

/* [v[a], 0, v[b], 0] in both 128-bit lanes: the chunk's last, unpaired block. */
QK_INLINE __m256 single4(const float *v, size_t a, size_t b)
{
    __m128 p = _mm_setr_ps(v[a], 0.0f, v[b], 0.0f);
    return _mm256_set_m128(p, p);
}

/* The blocks c0 .. c0 + nc - 1 of rows n .. n + R - 1 (R <= 2) against tokens t0 .. t0 + C - 1
 * (C <= 2): y[t0 + j][n + r] = (first ? 0 : y[t0 + j][n + r]) + their part of the product.
 * y: [T][N] at stride ldy; lv: [R][PF_KC][B] from chunk_levels; d: [R][PF_KC] from
 * chunk_headers; mt, dt: [PF_KC / 2][8] the mins and the deltas laid out by chunk_mins.
 *
 * The arithmetic, which decode (gemv_row) repeats exactly, per output: the delta terms go into
 * two accumulators, blocks 0, 2, 4, ... of the chunk into the first and 1, 3, 5, ... into the
 * second (fmadd); the min terms m_i * sum_i (rounded) likewise into two sums, even and odd
 * blocks, each added in block order, and with int8 x the residual's corrections d_i * cor_i
 * (qimpl.h) the same way; the result is hsum8(first + second) + ((even mins + odd mins) +
 * (even corrections + odd corrections)). Two chains each, so that decode, one row at a time, is not bound by the FMA and add
 * latencies. Here the min terms of the R x C outputs go 8 lanes at a time, lane
 * 4 r + 2 j + (block parity), one vector multiply and add per pair of blocks. */
QK_INLINE void tile(float *y, size_t ldy, const uint8_t (*lv)[PF_KC * 64], const ifk_qx *qx, int n, int t0, int c0,
                    int nc, int first, const float (*d)[PF_KC], const float (*mt)[8], const float (*dt)[8],
                    const int type, const int R, const int C)
{
    __m256 acc[2][2][2]; /* [chain][R][C] the delta terms */
    /* delta * x scale per row, token and block: [PF_KC] (one_scale) or [PF_KC][2] pairs */
    _Alignas(32) float ds[2][2][2 * PF_KC];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int j = 0; j < C; j++) {
            const size_t st = (size_t)(t0 + j) * qx->s_ld + (size_t)c0;
            for (int g = 0; g < nc; g += 8) {
                __m256 dv = _mm256_load_ps(d[r] + g);
                __m256 d0 = _mm256_mul_ps(dv, _mm256_loadu_ps(qx->s0 + st + g));
                if (one_scale(type)) {
                    _mm256_store_ps(ds[r][j] + g, d0);
                } else {
                    __m256 d1 = _mm256_mul_ps(dv, _mm256_loadu_ps(qx->s1 + st + g));
                    __m256 lo = _mm256_unpacklo_ps(d0, d1), hi = _mm256_unpackhi_ps(d0, d1);
                    _mm256_store_ps(ds[r][j] + 2 * g, _mm256_permute2f128_ps(lo, hi, 0x20));
                    _mm256_store_ps(ds[r][j] + 2 * g + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
                }
            }
            acc[0][r][j] = acc[1][r][j] = _mm256_setzero_ps();
        }
    const float(*dsc)[2][2 * PF_KC] = (const float(*)[2][2 * PF_KC])ds;
    /* x sums and residual corrections (qimpl.h) of tokens t0 and t0 + C - 1 from block c0
     * (each [nc]) */
    const size_t o0 = (size_t)t0 * qx->s_ld + c0, o1 = (size_t)(t0 + C - 1) * qx->s_ld + c0;
    const int x16 = ifk_qx_x16(type);
    /* lane 4 r + 2 j + p: the min terms (am) and the corrections (ac) of blocks of parity p */
    __m256 am = _mm256_setzero_ps(), ac = am;
    int i = 0;
    for (; i + 2 <= nc; i += 2) {
        tile_block(acc[0], lv, qx, t0, (size_t)(c0 + i), i, dsc, type, R, C);
        tile_block(acc[1], lv, qx, t0, (size_t)(c0 + i + 1), i + 1, dsc, type, R, C);
        am = _mm256_add_ps(am, _mm256_mul_ps(_mm256_load_ps(mt[i / 2]), pair4(qx->sum, o0 + i, o1 + i)));
        if (!x16)
            ac = _mm256_add_ps(ac, _mm256_mul_ps(_mm256_load_ps(dt[i / 2]), pair4(qx->cor, o0 + i, o1 + i)));
    }
    if (i < nc) {
        tile_block(acc[0], lv, qx, t0, (size_t)(c0 + i), i, dsc, type, R, C);
        __m256 p = _mm256_mul_ps(_mm256_load_ps(mt[i / 2]), single4(qx->sum, o0 + i, o1 + i));
        am = _mm256_blend_ps(am, _mm256_add_ps(am, p), 0x55); /* the even lanes only */
        if (!x16) {
            p = _mm256_mul_ps(_mm256_load_ps(dt[i / 2]), single4(qx->cor, o0 + i, o1 + i));
            ac = _mm256_blend_ps(ac, _mm256_add_ps(ac, p), 0x55);
        }
    }
    _Alignas(32) float mins[8], cors[8];
    _mm256_store_ps(mins, am);
    _mm256_store_ps(cors, ac);
#pragma GCC unroll 2
    for (int j = 0; j < C; j++)
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            float *yp = y + (size_t)(t0 + j) * ldy + n + r;
            const int l = 4 * r + 2 * j;
            const float m = mins[l] + mins[l + 1];
            *yp = (first ? 0.0f : *yp) + (hsum8(_mm256_add_ps(acc[0][r][j], acc[1][r][j])) +
                                          (x16 ? m : m + (cors[l] + cors[l + 1])));
        }
}

/* mt[k][4 r + 2 j + p] = m[min(r, R - 1)][2 k + p] for k < PF_KC / 2, r, j, p < 2: the mins of
 * the chunk's blocks in the lanes of tile's min terms.  m: [R][PF_KC]. */
QK_INLINE void chunk_mins(float (*mt)[8], const float (*m)[PF_KC], int nc, const int R)
{
    const float *m0 = m[0], *m1 = m[R > 1 ? 1 : 0];
    for (int k = 0; 2 * k < nc; k++) {
        __m128 a = _mm_castpd_ps(_mm_load1_pd((const double *)(m0 + 2 * k)));
        __m128 b = _mm_castpd_ps(_mm_load1_pd((const double *)(m1 + 2 * k)));
        _mm256_store_ps(mt[k], _mm256_set_m128(b, a));
    }
}

/* Prefill: rows n .. n + R - 1 against all tokens, K in chunks of PF_KC blocks decoded once
 * (into L1) for every token tile (C = 2, then single tokens). */
QK_INLINE void gemm_rows(float *y, size_t ldy, const uint8_t *W, const ifk_qx *qx, int n, const int type, const int R)
{
    const int T = qx->T, nb = qx->nb;
    const size_t rb = (size_t)nb * ifk_qtype_block_bytes(type);
    _Alignas(32) float d[2][PF_KC], m[2][PF_KC], mt[PF_KC / 2][8], dt[PF_KC / 2][8];
    _Alignas(32) uint8_t lv[2][PF_KC * 64];
    for (int c0 = 0; c0 < nb; c0 += PF_KC) {
        const int nc = nb - c0 < PF_KC ? nb - c0 : PF_KC;
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            chunk_headers(d[r], m[r], W + (size_t)(n + r) * rb, c0, nc, type);
            chunk_levels(lv[r], W + (size_t)(n + r) * rb, c0, nc, type);
        }
        chunk_mins(mt, (const float(*)[PF_KC])m, nc, R);
        if (!ifk_qx_x16(type))
            chunk_mins(dt, (const float(*)[PF_KC])d, nc, R);
        const float(*dc)[PF_KC] = (const float(*)[PF_KC])d, (*mtc)[8] = (const float(*)[8])mt, (*dtc)[8] = (const float(*)[8])dt;
        const uint8_t(*lc)[PF_KC * 64] = (const uint8_t(*)[PF_KC * 64])lv;
        int t = 0;
        for (; t + 2 <= T; t += 2)
            tile(y, ldy, lc, qx, n, t, c0, nc, c0 == 0, dc, mtc, dtc, type, R, 2);
        for (; t < T; t++)
            tile(y, ldy, lc, qx, n, t, c0, nc, c0 == 0, dc, mtc, dtc, type, R, 1);
    }
}

/* ---- decode: one row at a time, with prefill's arithmetic ------------------------------- */

/* As in qmatmul_avx512.c: decode (T == 1) computes every output with exactly tile()'s float
 * operations in the same order (per chunk of PF_KC blocks: the delta terms of even and odd
 * blocks in two FMA chains, the min terms m * sum of even and odd blocks in two add chains,
 * hsum8(even + odd) + ((even mins + odd mins) + (even corrections + odd corrections)) added
 * into y chunk after chunk), so y[t] depends only on W and x[t]. Each row is read as one forward
 * stream (prefetched), and each block's header is converted on its own:
 * [d, m, d, d] * {s0, sum, s1, cor} gives tile's delta * scale products, the min term m * sum
 * and the correction d * cor. */

/* acc + the delta term of one block, *am + its min term and its residual's correction (lanes
 * 1 and 3; lanes 0 and 2 collect junk that is never read).  blk: [BB]; xq: the block's x
 * values ([B] int8 or int16); sx: [4] = { s0, sum, s1, cor }. */
QK_INLINE __m256 gemv_block(__m256 acc, __m128 *am, const uint8_t *blk, const int8_t *xq, const float *sx, const int type)
{
    _mm_prefetch((const char *)blk + PF_AHEAD, _MM_HINT_T0);
    /* [d, m, d, d] * {s0, sum, s1, cor} = [d s0, m sum, d s1, d cor] */
    const __m128 r = _mm_mul_ps(_mm_cvtph_ps(_mm_shufflelo_epi16(_mm_cvtsi32_si128((int)ifk_rd32(blk)), 0x04)), _mm_load_ps(sx));
    *am = _mm_add_ps(*am, r);
    __m256 sc = one_scale(type) ? _mm256_broadcastss_ps(r)
                                : _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(_mm_permute_ps(r, 0x88))));
    __m256i lev[2];
    block_levels(lev, type, blk);
    return _mm256_fmadd_ps(block_dot(lev, xq, type), sc, acc);
}

/* W[row] . x for T = 1.  row: [nb * BB] bytes. */
QK_INLINE float gemv_row(const uint8_t *row, const ifk_qx *qx, const int type)
{
    const int BB = ifk_qtype_block_bytes(type), nb = qx->nb;
    const size_t xb = (size_t)ifk_qtype_block(type) * (ifk_qx_x16(type) ? 2 : 1); /* bytes of x per block */
    float y = 0.0f;
    for (int c0 = 0; c0 < nb; c0 += PF_KC) {
        const int nc = nb - c0 < PF_KC ? nb - c0 : PF_KC;
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
        __m128 am0 = _mm_setzero_ps(), am1 = am0;
        const uint8_t *blk = row + (size_t)c0 * BB;
        const int8_t *xq = qx->q + (size_t)c0 * xb;
        const float *sx = qx->blk + 4 * (size_t)c0;
        int i = 0;
        for (; i + 2 <= nc; i += 2) {
            acc0 = gemv_block(acc0, &am0, blk + (size_t)i * BB, xq + (size_t)i * xb, sx + 4 * i, type);
            acc1 = gemv_block(acc1, &am1, blk + (size_t)(i + 1) * BB, xq + (size_t)(i + 1) * xb, sx + 4 * (i + 1), type);
        }
        if (i < nc)
            acc0 = gemv_block(acc0, &am0, blk + (size_t)i * BB, xq + (size_t)i * xb, sx + 4 * i, type);
        const __m128 h = _mm_movehdup_ps(_mm_add_ps(am0, am1)); /* [mins, mins, cors, cors] */
        const float mins = ifk_qx_x16(type) ? _mm_cvtss_f32(h) : _mm_cvtss_f32(_mm_add_ss(h, _mm_movehl_ps(h, h)));
        y = (c0 == 0 ? 0.0f : y) + (hsum8(_mm256_add_ps(acc0, acc1)) + mins);
    }
    return y;
}

/* Rows n0 <= n < n1, all tokens, of one type: decode row by row, prefill in tiles of 2 rows x
 * 2 tokens (two chains: 8 accumulators, 4 level and 1 x register, about the 16 ymm registers). */
QK_INLINE void rows_of(float *y, size_t ldy, const uint8_t *W, const ifk_qx *qx, int n0, int n1, const int type)
{
    int n = n0;
    if (qx->T == 1) {
        const size_t rb = (size_t)qx->nb * ifk_qtype_block_bytes(type);
        for (; n < n1; n++)
            y[n] = gemv_row(W + (size_t)n * rb, qx, type);
        return;
    }
    for (; n + 2 <= n1; n += 2)
        gemm_rows(y, ldy, W, qx, n, type, 2);
    for (; n < n1; n++)
        gemm_rows(y, ldy, W, qx, n, type, 1);
}

#define QK_ROWS_FN(TYPE)                                                                          \
    static void rows_##TYPE(float *y, size_t ldy, const uint8_t *W, const ifk_qx *qx, int n0, int n1) \
    {                                                                                             \
        rows_of(y, ldy, W, qx, n0, n1, TYPE);                                                     \
    }
QK_ROWS_FN(IFK_Q8_B32)
QK_ROWS_FN(IFK_Q8_B64)
QK_ROWS_FN(IFK_Q6_B64)
QK_ROWS_FN(IFK_Q5_B64)
QK_ROWS_FN(IFK_Q4_B32)
QK_ROWS_FN(IFK_Q4_B64)
QK_ROWS_FN(IFK_Q3H_B64)
QK_ROWS_FN(IFK_Q3_B32)
QK_ROWS_FN(IFK_Q2_B32)

IFK_DECL_QMATMUL_ROWS(ifk_avx2_qmatmul_rows)
{
    const uint8_t *w = W;
    switch (qx->type) {
    case IFK_Q8_B32: rows_IFK_Q8_B32(y, ldy, w, qx, n0, n1); break;
    case IFK_Q8_B64: rows_IFK_Q8_B64(y, ldy, w, qx, n0, n1); break;
    case IFK_Q6_B64: rows_IFK_Q6_B64(y, ldy, w, qx, n0, n1); break;
    case IFK_Q5_B64: rows_IFK_Q5_B64(y, ldy, w, qx, n0, n1); break;
    case IFK_Q4_B32: rows_IFK_Q4_B32(y, ldy, w, qx, n0, n1); break;
    case IFK_Q4_B64: rows_IFK_Q4_B64(y, ldy, w, qx, n0, n1); break;
    case IFK_Q3H_B64: rows_IFK_Q3H_B64(y, ldy, w, qx, n0, n1); break;
    case IFK_Q3_B32: rows_IFK_Q3_B32(y, ldy, w, qx, n0, n1); break;
    case IFK_Q2_B32: rows_IFK_Q2_B32(y, ldy, w, qx, n0, n1); break;
    default: break;
    }
}

/* ---- one row decoded to F32 -------------------------------------------------------------- */

IFK_DECL_QGET_ROW(ifk_avx2_qget_row)
{
    const int B = ifk_qtype_block(type), BB = ifk_qtype_block_bytes(type);
    const uint8_t *blk = row;  /* [nb][BB] */
    for (int k = 0; k < K; k += B, blk += BB) {
        __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)ifk_rd32(blk)));
        __m256 d = _mm256_broadcastss_ps(dm), m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
        _Alignas(32) uint8_t q[64];
        if (B == 64) {
            __m256i l[2];
            levels64(l, type, blk);
            _mm256_store_si256((__m256i *)q, l[0]);
            _mm256_store_si256((__m256i *)(q + 32), l[1]);
        } else {
            _mm256_store_si256((__m256i *)q, levels32(type, blk));
        }
        for (int i = 0; i < B && k + i < K; i += 8) {
            __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + i)))), d, m);
            if (K - k - i >= 8)
                _mm256_storeu_ps(out + k + i, v);
            else
                v8_store_part(out + k + i, K - k - i, v);
        }
    }
}
