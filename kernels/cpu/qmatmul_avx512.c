/*
 * qmatmul_avx512.c -- the quantized matrix product with AVX-512 and AVX512_VNNI.
 *
 * Per weight block, dot(w', x) = min * sum(x) + delta * sum_i q_i x_i, and with x rounded to
 * int8 (qimpl.h's ifk_qx) the second sum is vpdpbusd (unsigned levels x signed x) into int32
 * lanes, converted to float and scaled by delta * the x scale of the lane's group, plus
 * delta * the rounding residual's correction (qimpl.h). The levels
 * are unpacked to bytes in registers (shifts, masks, mask-register adds; Q3H's 7-bit codes
 * are split into c / 11 and c % 11 with a multiply-shift).
 *
 * Decode (T == 1) is bound by memory bandwidth: each row is read as one forward stream (rows
 * one after another, a software prefetch 2 KiB ahead), and each block's header is converted
 * on its own, [d, m, d, d] * {s0, sum, s1, cor}, which is cheaper than gathering the headers of
 * several blocks (a gather is ~2 cycles per element on Zen 4, and the hardware prefetcher does
 * not follow it).
 *
 * Prefill (T > 1) is compute-bound: rows go by 4, K by chunks of 64 blocks whose levels
 * (as bytes) and headers (as F32, 16 per gather) are decoded once into L1; then every tile of
 * 2 tokens passes over the chunk, 4 rows x 2 tokens x 2 accumulators.
 *
 * Batch invariance (kernels.h): decode and prefill compute each output with the same float
 * operations in the same order (see tile: per chunk, two FMA chains of delta terms by block
 * parity, two add chains of min terms likewise, then hsum512 and the chunk sums added in
 * order), and x is rounded per token, so row t of y depends only on W and x[t].
 *
 * Every function here carries target("avx512vnni") on top of the file's -mavx512* flags;
 * qdispatch.c calls this path only on CPUs that have it. qmatmul_avx512gfni.c compiles this
 * file again with QK_GFNI = 1: target("avx512vnni,gfni") and the ifk_avx512gfni_* names,
 * where the high bits of Q3H's codes are unpacked with a GF(2) bit transpose
 * (levels_q3h_gfni) instead of three mask-register adds.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/qimpl.h"
#include "kernels/cpu/quant.h"

#ifndef QK_GFNI
#define QK_GFNI 0
#endif
#if QK_GFNI
#define QK_TARGET "avx512vnni,gfni"
#define QK_NAME(name) ifk_avx512gfni_##name
#else
#define QK_TARGET "avx512vnni"
#define QK_NAME(name) ifk_avx512_##name
#endif
#define QK_INLINE static inline __attribute__((always_inline, target(QK_TARGET)))
#define QK_FN __attribute__((target(QK_TARGET)))

/* ---- activation quantization ------------------------------------------------------------- */

/* Lanes 0..n-1 (0 <= n <= 16). */
QK_INLINE __mmask16 mask16(int n)
{
    return (__mmask16)((1u << n) - 1u);
}

/* 16 floats of x from element k (lanes at or past K are 0).  x: [K]. */
QK_INLINE __m512 load_x16(const float *x, int k, int K)
{
    if (k + 16 <= K)
        return _mm512_loadu_ps(x + k);
    return _mm512_maskz_loadu_ps(mask16(K - k > 0 ? K - k : 0), x + k);
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

/* round(v * pre * inv) as 16 int8. */
QK_INLINE __m128i to_i8(__m512 v, __m512 pre, __m512 inv)
{
    return _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(v, pre), inv)));
}

/* Block b of a 32-block type.  x: [K]; q: [32] of the block; s, sum: the block's entries. */
QK_INLINE void quantize_b32(const float *x, int K, int b, int8_t *q, float *s, float *sum)
{
    __m512 v0 = load_x16(x, b * 32, K), v1 = load_x16(x, b * 32 + 16, K);
    __m512 a = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
    float amax = _mm512_reduce_max_ps(a);
    __m512 pre = _mm512_set1_ps(prescale(amax)), inv = _mm512_set1_ps(inv_scale(amax, 127.0f));
    _mm_store_si128((__m128i *)q, to_i8(v0, pre, inv));
    _mm_store_si128((__m128i *)(q + 16), to_i8(v1, pre, inv));
    *s = amax / 127.0f;
    *sum = _mm512_reduce_add_ps(_mm512_add_ps(v0, v1));
}

/* Block b of a 64-block type: group 0 is lanes 0-3, 8-11 of each 16 (the even runs of 4). */
QK_INLINE void quantize_b64(const float *x, int K, int b, int8_t *q, float *s0, float *s1, float *sum)
{
    __m512 v[4];
    for (int i = 0; i < 4; i++)
        v[i] = load_x16(x, b * 64 + 16 * i, K);
    __m512 a = _mm512_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])),
                             _mm512_max_ps(_mm512_abs_ps(v[2]), _mm512_abs_ps(v[3])));
    float amax0 = _mm512_mask_reduce_max_ps(0x0F0F, a), amax1 = _mm512_mask_reduce_max_ps(0xF0F0, a);
    __m512 inv = _mm512_mask_blend_ps(0x0F0F, _mm512_set1_ps(inv_scale(amax1, 127.0f)),
                                      _mm512_set1_ps(inv_scale(amax0, 127.0f)));
    __m512 pre = _mm512_mask_blend_ps(0x0F0F, _mm512_set1_ps(prescale(amax1)), _mm512_set1_ps(prescale(amax0)));
    for (int i = 0; i < 4; i++)
        _mm_store_si128((__m128i *)(q + 16 * i), to_i8(v[i], pre, inv));
    *s0 = amax0 / 127.0f;
    *s1 = amax1 / 127.0f;
    *sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(v[0], v[1]), _mm512_add_ps(v[2], v[3])));
}

/* Block b of an int16 type: one group, the block of B (32 or 64).  q: [B] of the block. */
QK_INLINE void quantize_x16(const float *x, int K, int b, int B, int16_t *q, float *s, float *sum)
{
    __m512 v[4], a = _mm512_setzero_ps(), t = _mm512_setzero_ps();
    for (int i = 0; i < B / 16; i++) {
        v[i] = load_x16(x, b * B + 16 * i, K);
        a = _mm512_max_ps(a, _mm512_abs_ps(v[i]));
        t = _mm512_add_ps(t, v[i]);
    }
    float amax = _mm512_reduce_max_ps(a);
    __m512 pre = _mm512_set1_ps(prescale(amax)), inv = _mm512_set1_ps(inv_scale(amax, 32767.0f));
    for (int i = 0; i < B / 16; i++)
        _mm256_store_si256((__m256i *)(q + 16 * i),
                           _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(v[i], pre), inv))));
    *s = amax / 32767.0f;
    *sum = _mm512_reduce_add_ps(t);
}

/* s0 X0 + s1 X1: the rounded x of one int8 block back in F32, X0 and X1 the sums of xq over
 * its groups (qimpl.h: the even and odd runs of 4 for B = 64, whose dwords alternate).  q: [B],
 * 64-byte aligned. */
QK_INLINE float rounded_sum(const int8_t *q, int B, float s0, float s1)
{
    const __m512i ones = _mm512_set1_epi8(1);
    if (B == 32)
        return s0 * (float)_mm512_reduce_add_epi32(
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_zextsi256_si512(_mm256_load_si256((const __m256i *)q))));
    const __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_load_si512(q)); /* dword k: bytes 4k..4k+3 */
    return s0 * (float)_mm512_mask_reduce_add_epi32(0x5555, d) + s1 * (float)_mm512_mask_reduce_add_epi32(0xAAAA, d);
}

#if !QK_GFNI /* the GFNI build uses this one */
QK_FN IFK_DECL_QX_QUANTIZE(ifk_avx512_qx_quantize)
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
                quantize_b32(xt, qx->K, b, q + 32 * b, s0 + b, sum + b);
                s1[b] = 0.0f;
            } else {
                quantize_b64(xt, qx->K, b, q + 64 * b, s0 + b, s1 + b, sum + b);
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

#endif

/* ---- unpacking the levels of one block to bytes ------------------------------------------ */

/* Every int16 lane of the low 256 bits shifted by a, of the high 256 by b. */
QK_INLINE __m512i srl16_halves(__m512i v, int a, int b)
{
    return _mm512_srlv_epi16(v, _mm512_inserti64x4(_mm512_set1_epi16((short)a), _mm256_set1_epi16((short)b), 1));
}

/* 32 bytes lo[j] & 15 then lo[j] >> 4 (j < 32): the nibble planes of Q4_B64, Q5, Q6.  p: [32]. */
QK_INLINE __m512i nibbles64(const uint8_t *p)
{
    __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_and_si512(srl16_halves(v, 0, 4), _mm512_set1_epi8(15));
}

/* 16 bytes lo[j] & 15 then lo[j] >> 4.  p: [16]. */
QK_INLINE __m256i nibbles32(const uint8_t *p)
{
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    v = _mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4));
    return _mm256_and_si256(v, _mm256_set1_epi8(15));
}

/* Bytes 8L + j = (p[j] >> 2L) & 3 for L < 4, j < 8: the 2-bit planes of Q3_B32, Q2_B32. */
QK_INLINE __m256i crumbs32(const uint8_t *p)
{
    long long u;
    memcpy(&u, p, 8);
    __m256i v = _mm256_srlv_epi64(_mm256_set1_epi64x(u), _mm256_setr_epi64x(0, 2, 4, 6));
    return _mm256_and_si256(v, _mm256_set1_epi8(3));
}

/* Q3H's 32 codes c = 11 a + b (c <= 120, one per byte) as the 64 levels a, b at bytes 2i,
 * 2i+1: a = (c * 187) >> 11 = mulhi(c, 5984), and the int16 lane (b << 8) | a is
 * (c << 8) - 2815 a. */
QK_INLINE __m512i q3h_split(__m256i c)
{
    const __m512i c16 = _mm512_cvtepu8_epi16(c);
    const __m512i a = _mm512_mulhi_epu16(c16, _mm512_set1_epi16(5984));
    return _mm512_sub_epi16(_mm512_slli_epi16(c16, 8), _mm512_mullo_epi16(a, _mm512_set1_epi16(2815)));
}

#if QK_GFNI
/* Q3H's 64 levels as bytes with GFNI (the same bytes as levels64's other Q3H path).  Code
 * c[i] (i < 32): the low nibble as nibbles32; bits 4-6 from the three u32 planes P0, P1, P2
 * at bytes 20, 24, 28 of the block: qword j of a register gets the plane bytes
 * [0, P2[j], P1[j], P0[j], 0, 0, 0, 0] (vpshufb), and vgf2p8affineqb with that qword as the
 * matrix and the bytes 1 << i as the data transposes it, putting bit i of P0, P1, P2 at bits
 * 4, 5, 6 of byte i, code 8j + i.  blk: [32], the whole block. */
QK_INLINE __m512i levels_q3h_gfni(const uint8_t *blk)
{
    /* bytes 16..31 of the block in both lanes: ch[0..11] are bytes 4..15 of each lane */
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 16)));
    const __m256i at = _mm256_setr_epi8(-1, 12, 8, 4, -1, -1, -1, -1, -1, 13, 9, 5, -1, -1, -1, -1,
                                        -1, 14, 10, 6, -1, -1, -1, -1, -1, 15, 11, 7, -1, -1, -1, -1);
    const __m256i hi = _mm256_gf2p8affine_epi64_epi8(_mm256_set1_epi64x(0x8040201008040201LL),
                                                     _mm256_shuffle_epi8(t, at), 0);
    return q3h_split(_mm256_or_si256(nibbles32(blk + 4), hi));
}
#endif

/* The 64 levels of a 64-block as bytes.  blk: [block_bytes]. */
QK_INLINE __m512i levels64(int type, const uint8_t *blk)
{
    const uint8_t *lv = blk + 4;
    switch (type) {
    case IFK_Q8_B64:
        return _mm512_loadu_si512(lv);
    case IFK_Q6_B64: {
        /* high 2 bits of level 16L + j: (qh[j] >> 2L) & 3, rotated to bits 4-5 of the byte */
        __m512i h = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(lv + 32)));
        h = _mm512_rolv_epi32(h, _mm512_setr_epi32(4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0, 30, 30, 30, 30));
        return _mm512_ternarylogic_epi32(nibbles64(lv), h, _mm512_set1_epi8(0x30), 0xF8); /* a | b & c */
    }
    case IFK_Q5_B64:
        return _mm512_mask_add_epi8(nibbles64(lv), _cvtu64_mask64(ifk_rd64(lv + 32)), nibbles64(lv),
                                    _mm512_set1_epi8(16));
    case IFK_Q4_B64:
        return nibbles64(lv);
    default: { /* IFK_Q3H_B64 */
#if QK_GFNI
        return levels_q3h_gfni(blk);
#else
        __m256i c = nibbles32(lv);
        c = _mm256_mask_add_epi8(c, _cvtu32_mask32(ifk_rd32(lv + 16)), c, _mm256_set1_epi8(16));
        c = _mm256_mask_add_epi8(c, _cvtu32_mask32(ifk_rd32(lv + 20)), c, _mm256_set1_epi8(32));
        c = _mm256_mask_add_epi8(c, _cvtu32_mask32(ifk_rd32(lv + 24)), c, _mm256_set1_epi8(64));
        return q3h_split(c);
#endif
    }
    }
}

/* The 32 levels of a 32-block as bytes.  blk: [block_bytes]. */
QK_INLINE __m256i levels32(int type, const uint8_t *blk)
{
    const uint8_t *lv = blk + 4;
    switch (type) {
    case IFK_Q8_B32:
        return _mm256_loadu_si256((const __m256i *)lv);
    case IFK_Q4_B32:
        return nibbles32(lv);
    case IFK_Q3_B32: {
        __m256i q = crumbs32(lv);
        return _mm256_mask_add_epi8(q, _cvtu32_mask32(ifk_rd32(lv + 8)), q, _mm256_set1_epi8(4));
    }
    default: /* IFK_Q2_B32 */
        return crumbs32(lv);
    }
}

/* The int32 lanes of one block's levels times x's int16 values (ifk_qx_x16 types: Q8, Q6):
 * the levels widened to int16, vpdpwssd.  blk: [BB]; xq: [B] int16, 64-byte aligned. */
QK_INLINE __m512i dot_x16(int type, const uint8_t *blk, const int16_t *xq)
{
    const uint8_t *lv = blk + 4;
    __m512i lo, hi;
    if (type == IFK_Q8_B32)
        return _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)lv)),
                                   _mm512_load_si512(xq));
    if (type == IFK_Q8_B64) {
        lo = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)lv));
        hi = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(lv + 32)));
    } else {
        __m512i l = levels64(type, blk);
        lo = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(l));
        hi = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(l, 1));
    }
    return _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512(xq)), hi,
                               _mm512_load_si512(xq + 32));
}

/* ---- prefill: tiles of R rows x C tokens over chunks of K -------------------------------- */

/* Software prefetch distance in a row stream (bytes): measured on Zen 4 (one thread, DRAM),
 * Q4_B64 decode reads ~14 GB/s without it, ~19 with it. */
#ifndef PF_AHEAD
#define PF_AHEAD 2048
#endif

QK_INLINE float hsum512(__m512 v)
{
    __m256 s = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

#define PF_KC 64 /* prefill: blocks per chunk of K (headers converted once per chunk and row) */

/* delta d[i] and min m[i] of blocks c0 + i of a row, i < nc (<= PF_KC; 0 past nc).
 * row: [nb * BB] bytes; d, m: [PF_KC]. */
QK_INLINE void chunk_headers(float *d, float *m, const uint8_t *row, int c0, int nc, const int type)
{
    const int BB = ifk_qtype_block_bytes(type);
    const __m512i at = _mm512_mullo_epi32(_mm512_set1_epi32(BB),
                                          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    for (int g = 0; g < PF_KC; g += 16) {
        int ng = nc - g < 0 ? 0 : nc - g < 16 ? nc - g : 16;
        __m512i h = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask16(ng), at, row + (size_t)(c0 + g) * BB, 1);
        _mm512_store_ps(d + g, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)));
        _mm512_store_ps(m + g, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16))));
    }
}

/* The delta terms of block i of the chunk (block b of the row) for R rows x C tokens, added
 * into a[r][j]: the integer dot product as float, fmadd by delta * the x scale(s) (ds from
 * tile's prologue). For int8 x and B = 32 only the low 256 bits of a are meaningful. */
QK_INLINE void tile_block(__m512 (*a)[2], const uint8_t (*lv)[PF_KC * 64], const ifk_qx *qx, int t0, size_t b, int i,
                          const float (*ds)[2][2 * PF_KC], const int type, const int x16, const int R, const int C)
{
    const int B = ifk_qtype_block(type);
    if (x16) {
        __m512i l16[4][2]; /* [R]: the levels as int16, elements 0-31 and 32-63 */
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            l16[r][0] = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)(lv[r] + (size_t)i * B)));
            l16[r][1] = B == 64 ? _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)(lv[r] + (size_t)i * B + 32)))
                                : l16[r][0];
        }
#pragma GCC unroll 2
        for (int j = 0; j < C; j++) {
            const int16_t *xq = (const int16_t *)(qx->q + (size_t)(t0 + j) * qx->q_ld) + b * B;
            __m512i x0 = _mm512_load_si512(xq), x1 = B == 64 ? _mm512_load_si512(xq + 32) : x0;
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m512i p = _mm512_dpwssd_epi32(_mm512_setzero_si512(), l16[r][0], x0);
                if (B == 64)
                    p = _mm512_dpwssd_epi32(p, l16[r][1], x1);
                a[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_set1_ps(ds[r][j][i]), a[r][j]);
            }
        }
    } else if (B == 64) {
        __m512i lev[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            lev[r] = _mm512_load_si512(lv[r] + (size_t)i * 64);
#pragma GCC unroll 2
        for (int j = 0; j < C; j++) {
            __m512i xv = _mm512_load_si512(qx->q + (size_t)(t0 + j) * qx->q_ld + b * 64);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lev[r], xv));
                __m512 sc = _mm512_castsi512_ps(_mm512_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)(ds[r][j] + 2 * i))));
                a[r][j] = _mm512_fmadd_ps(p, sc, a[r][j]);
            }
        }
    } else {
        __m256i lev[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            lev[r] = _mm256_load_si256((const __m256i *)(lv[r] + (size_t)i * 32));
#pragma GCC unroll 2
        for (int j = 0; j < C; j++) {
            __m256i xv = _mm256_load_si256((const __m256i *)(qx->q + (size_t)(t0 + j) * qx->q_ld + b * 32));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256 p = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lev[r], xv));
                a[r][j] = _mm512_castps256_ps512(
                    _mm256_fmadd_ps(p, _mm256_broadcast_ss(ds[r][j] + i), _mm512_castps512_ps256(a[r][j])));
            }
        }
    }
}

/* [v[a], v[a + 1], v[b], v[b + 1]] in every 128-bit lane: two blocks of tokens t0 and
 * t0 + C - 1 (tile's min-term lanes).  v: qx->sum or qx->cor. */
QK_INLINE __m512 pair4(const float *v, size_t a, size_t b)
{
    return _mm512_broadcast_f32x4(_mm_loadh_pi(_mm_castpd_ps(_mm_load_sd((const double *)(v + a))), (const __m64 *)(v + b)));
}

/* [v[a], 0, v[b], 0] in every 128-bit lane: the chunk's last, unpaired block. */
QK_INLINE __m512 single4(const float *v, size_t a, size_t b)
{
    return _mm512_broadcast_f32x4(_mm_setr_ps(v[a], 0.0f, v[b], 0.0f));
}

/* The blocks c0 .. c0 + nc - 1 of rows n .. n + R - 1 against tokens t0 .. t0 + C - 1 (C <= 2):
 * y[t0 + j][n + r] = (first ? 0 : y[t0 + j][n + r]) + their part of the product.
 * y: [T][N] at stride ldy; lv: [R][PF_KC][B] the chunk's levels as bytes; d: [R][PF_KC] from
 * chunk_headers; mt, dt: [PF_KC / 2][16] the mins and the deltas laid out by chunk_mins.
 *
 * The arithmetic, which decode (gemv_row) repeats exactly, per output: the delta terms go into
 * two accumulators, blocks 0, 2, 4, ... of the chunk into the first and 1, 3, 5, ... into the
 * second (fmadd); the min terms m_i * sum_i (rounded) likewise into two sums, even and odd
 * blocks, each added in block order, and with int8 x the residual's corrections d_i * cor_i
 * (qimpl.h) the same way; the result is hsum512(first + second) + ((even mins + odd mins) +
 * (even corrections + odd corrections)). Two chains each, so that decode, one row at a time,
 * is not bound by the FMA and add latencies. Here the min terms (and the corrections) of the
 * R x C outputs go 16 lanes at a time, lane 4 r + 2 j + (block parity), one vector multiply and
 * add per pair of blocks. */
QK_INLINE void tile(float *y, size_t ldy, const uint8_t (*lv)[PF_KC * 64], const ifk_qx *qx, int n, int t0, int c0,
                    int nc, int first, const float (*d)[PF_KC], const float (*mt)[16], const float (*dt)[16],
                    const int type, const int x16, const int R, const int C)
{
    const int B = ifk_qtype_block(type), one = B == 32 || x16; /* one x scale per block */
    __m512 acc[2][4][2]; /* [chain][R][C]: the delta terms (low halves for int8 x, B = 32) */
    /* delta * x scale per row, token and block of the chunk: [PF_KC] (one), or [PF_KC][2]
     * pairs (int8 x, B = 64: x groups 0 and 1) */
    _Alignas(64) float ds[4][2][2 * PF_KC];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int j = 0; j < C; j++) {
            const size_t st = (size_t)(t0 + j) * qx->s_ld + (size_t)c0;
            acc[0][r][j] = acc[1][r][j] = _mm512_setzero_ps();
            for (int g = 0; g < nc; g += 16) {
                __m512 dv = _mm512_load_ps(d[r] + g);
                __m512 d0 = _mm512_mul_ps(dv, _mm512_loadu_ps(qx->s0 + st + g));
                if (one) {
                    _mm512_store_ps(ds[r][j] + g, d0);
                } else {
                    __m512 d1 = _mm512_mul_ps(dv, _mm512_loadu_ps(qx->s1 + st + g));
                    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
                    _mm512_store_ps(ds[r][j] + 2 * g, _mm512_permutex2var_ps(d0, lo, d1));
                    _mm512_store_ps(ds[r][j] + 2 * g + 16,
                                    _mm512_permutex2var_ps(d0, _mm512_add_epi32(lo, _mm512_set1_epi32(8)), d1));
                }
            }
        }
    const float(*dsc)[2][2 * PF_KC] = (const float(*)[2][2 * PF_KC])ds;
    /* x sums and residual corrections (qimpl.h) of tokens t0 and t0 + C - 1 from block c0
     * (each [nc]) */
    const size_t o0 = (size_t)t0 * qx->s_ld + c0, o1 = (size_t)(t0 + C - 1) * qx->s_ld + c0;
    /* lane 4 r + 2 j + p: the min terms (am) and the corrections (ac) of blocks of parity p */
    __m512 am = _mm512_setzero_ps(), ac = am;
    int i = 0;
    for (; i + 2 <= nc; i += 2) {
        tile_block(acc[0], lv, qx, t0, (size_t)(c0 + i), i, dsc, type, x16, R, C);
        tile_block(acc[1], lv, qx, t0, (size_t)(c0 + i + 1), i + 1, dsc, type, x16, R, C);
        /* [v_0[i], v_0[i+1], v_1[i], v_1[i+1]] in every 128-bit lane */
        am = _mm512_add_ps(am, _mm512_mul_ps(_mm512_load_ps(mt[i / 2]), pair4(qx->sum, o0 + i, o1 + i)));
        if (!x16)
            ac = _mm512_add_ps(ac, _mm512_mul_ps(_mm512_load_ps(dt[i / 2]), pair4(qx->cor, o0 + i, o1 + i)));
    }
    if (i < nc) {
        tile_block(acc[0], lv, qx, t0, (size_t)(c0 + i), i, dsc, type, x16, R, C);
        am = _mm512_mask_add_ps(am, 0x5555, am, _mm512_mul_ps(_mm512_load_ps(mt[i / 2]), single4(qx->sum, o0 + i, o1 + i)));
        if (!x16)
            ac = _mm512_mask_add_ps(ac, 0x5555, ac, _mm512_mul_ps(_mm512_load_ps(dt[i / 2]), single4(qx->cor, o0 + i, o1 + i)));
    }
    _Alignas(64) float mins[16], cors[16];
    _mm512_store_ps(mins, am);
    _mm512_store_ps(cors, ac);
#pragma GCC unroll 2
    for (int j = 0; j < C; j++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 a = _mm512_add_ps(acc[0][r][j], acc[1][r][j]);
            if (!x16 && B == 32)
                a = _mm512_zextps256_ps512(_mm512_castps512_ps256(a));
            float *yp = y + (size_t)(t0 + j) * ldy + n + r;
            const int l = 4 * r + 2 * j;
            const float m = mins[l] + mins[l + 1];
            *yp = (first ? 0.0f : *yp) + (hsum512(a) + (x16 ? m : m + (cors[l] + cors[l + 1])));
        }
}

/* mt[k][4 r + 2 j + p] = m[min(r, R - 1)][2 k + p] for k < PF_KC / 2, r < 4, j, p < 2: the
 * mins of the chunk's blocks in the lanes of tile's min terms.  m: [R][PF_KC]. */
QK_INLINE void chunk_mins(float (*mt)[16], const float (*m)[PF_KC], int nc, const int R)
{
    for (int g = 0; g < nc; g += 16) {
        /* pairs g/2 .. g/2 + 7 are the qwords of these */
        __m512i v0 = _mm512_load_si512(m[0] + g), v1 = _mm512_load_si512(m[R > 1 ? 1 : 0] + g);
        __m512i v2 = _mm512_load_si512(m[R > 2 ? 2 : R - 1] + g), v3 = _mm512_load_si512(m[R > 3 ? 3 : R - 1] + g);
        for (int k = 0; k < 8; k++) {
            const __m512i idx = _mm512_setr_epi64(k, k, 8 + k, 8 + k, k, k, 8 + k, 8 + k);
            __m512i a = _mm512_permutex2var_epi64(v0, idx, v1), b = _mm512_permutex2var_epi64(v2, idx, v3);
            _mm512_store_si512(mt[g / 2 + k], _mm512_shuffle_i64x2(a, b, 0x44));
        }
    }
}

/* The levels of blocks c0 .. c0 + nc - 1 of a row as bytes.  row: [nb * BB]; lv: [nc][B]. */
QK_INLINE void chunk_levels(uint8_t *lv, const uint8_t *row, int c0, int nc, const int type)
{
    const int BB = ifk_qtype_block_bytes(type);
    for (int i = 0; i < nc; i++) {
        const uint8_t *blk = row + (size_t)(c0 + i) * BB;
        _mm_prefetch((const char *)blk + PF_AHEAD, _MM_HINT_T0);
        if (ifk_qtype_block(type) == 64)
            _mm512_store_si512(lv + (size_t)i * 64, levels64(type, blk));
        else
            _mm256_store_si256((__m256i *)(lv + (size_t)i * 32), levels32(type, blk));
    }
}

/* Prefill: rows n .. n + R - 1 against all tokens, K in chunks of PF_KC blocks whose levels
 * and headers are decoded once (into L1) and serve every token tile (C = 4, then single
 * tokens). */
QK_INLINE void gemm_rows(float *y, size_t ldy, const uint8_t *W, const ifk_qx *qx, int n, const int type, const int x16,
                         const int R)
{
    const int T = qx->T, nb = qx->nb;
    const size_t rb = (size_t)nb * ifk_qtype_block_bytes(type);
    _Alignas(64) float d[4][PF_KC], m[4][PF_KC], mt[PF_KC / 2][16], dt[PF_KC / 2][16];
    _Alignas(64) uint8_t lv[4][PF_KC * 64];
    for (int c0 = 0; c0 < nb; c0 += PF_KC) {
        const int nc = nb - c0 < PF_KC ? nb - c0 : PF_KC;
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            chunk_headers(d[r], m[r], W + (size_t)(n + r) * rb, c0, nc, type);
            chunk_levels(lv[r], W + (size_t)(n + r) * rb, c0, nc, type);
        }
        const float(*dc)[PF_KC] = (const float(*)[PF_KC])d;
        chunk_mins(mt, (const float(*)[PF_KC])m, nc, R);
        if (!x16)
            chunk_mins(dt, (const float(*)[PF_KC])d, nc, R);
        const float(*dtc)[16] = (const float(*)[16])dt;
        const float(*mtc)[16] = (const float(*)[16])mt;
        const uint8_t(*lc)[PF_KC * 64] = (const uint8_t(*)[PF_KC * 64])lv;
        int t = 0;
        for (; t + 2 <= T; t += 2)
            tile(y, ldy, lc, qx, n, t, c0, nc, c0 == 0, dc, mtc, dtc, type, x16, R, 2);
        for (; t < T; t++)
            tile(y, ldy, lc, qx, n, t, c0, nc, c0 == 0, dc, mtc, dtc, type, x16, R, 1);
    }
}

/* ---- decode: one row at a time, with prefill's arithmetic ------------------------------- */

/* Decode (T == 1) computes every output with exactly tile()'s float operations in the same
 * order, so that y[t] depends only on W and x[t] (kernels.h): per chunk of PF_KC blocks, the
 * delta terms of the even and the odd blocks in two FMA chains, the min terms and the
 * corrections in two add chains, hsum512(even + odd) + (mins + corrections) added into y chunk
 * after chunk. Each row is read as one forward stream (software prefetch PF_AHEAD ahead;
 * interleaving several of these short rows measured much slower), and each block's header is
 * converted on its own, as [d, m, d, d] * {s0, sum, s1, cor} (tile's delta * scale products, its
 * min term and its correction): cheaper than gathering the headers of several blocks (a gather
 * is ~2 cycles per element on Zen 4, and the hardware prefetcher does not follow it). */

/* The block's header as [d, m, d, d] (F32).  blk: [BB]. */
QK_INLINE __m128 dmdd(const uint8_t *blk)
{
    return _mm_cvtph_ps(_mm_shufflelo_epi16(_mm_cvtsi32_si128((int)ifk_rd32(blk)), 0x04));
}

/* acc + the delta term of one block, *am + its min term and its residual's correction (lanes 1
 * and 3 of [d s0, m sum, d s1, d cor]; lanes 0 and 2 collect junk that is never read).
 * blk: [BB]; xq: the block's x values ([B] int8, or int16 for x16 types); sx: [4] =
 * { s0, sum, s1, cor }. For B = 32 and int8 x only the low 256 bits of acc are meaningful (as
 * in tile). */
QK_INLINE __m512 gemv_block(__m512 acc, __m128 *am, const uint8_t *blk, const int8_t *xq, const float *sx,
                            const int type, const int x16)
{
    _mm_prefetch((const char *)blk + PF_AHEAD, _MM_HINT_T0);
    const __m128 r = _mm_mul_ps(dmdd(blk), _mm_load_ps(sx)); /* [d s0, m sum, d s1, d cor] */
    *am = _mm_add_ps(*am, r);
    if (x16) /* one x scale per block */
        return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_x16(type, blk, (const int16_t *)xq)), _mm512_broadcastss_ps(r), acc);
    if (ifk_qtype_block(type) == 64) { /* lanes alternate between the block's x groups 0 and 1 */
        __m512 sc = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2), _mm512_castps128_ps512(r));
        __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), levels64(type, blk), _mm512_load_si512(xq));
        return _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc);
    }
    __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), levels32(type, blk), _mm256_load_si256((const __m256i *)xq));
    return _mm512_castps256_ps512(_mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcastss_ps(r), _mm512_castps512_ps256(acc)));
}

/* W[row] . x for T = 1.  row: [nb * BB] bytes. */
QK_INLINE float gemv_row(const uint8_t *row, const ifk_qx *qx, const int type, const int x16)
{
    const int BB = ifk_qtype_block_bytes(type), nb = qx->nb;
    const size_t xb = (size_t)ifk_qtype_block(type) * (x16 ? 2 : 1); /* bytes of x per block */
    float y = 0.0f;
    for (int c0 = 0; c0 < nb; c0 += PF_KC) {
        const int nc = nb - c0 < PF_KC ? nb - c0 : PF_KC;
        __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
        __m128 am0 = _mm_setzero_ps(), am1 = am0;
        const uint8_t *blk = row + (size_t)c0 * BB;
        const int8_t *xq = qx->q + (size_t)c0 * xb;
        const float *sx = qx->blk + 4 * (size_t)c0;
        int i = 0;
        for (; i + 2 <= nc; i += 2) {
            acc0 = gemv_block(acc0, &am0, blk + (size_t)i * BB, xq + (size_t)i * xb, sx + 4 * i, type, x16);
            acc1 = gemv_block(acc1, &am1, blk + (size_t)(i + 1) * BB, xq + (size_t)(i + 1) * xb, sx + 4 * (i + 1), type, x16);
        }
        if (i < nc)
            acc0 = gemv_block(acc0, &am0, blk + (size_t)i * BB, xq + (size_t)i * xb, sx + 4 * i, type, x16);
        __m512 a = _mm512_add_ps(acc0, acc1);
        if (ifk_qtype_block(type) == 32 && !x16)
            a = _mm512_zextps256_ps512(_mm512_castps512_ps256(a));
        const __m128 h = _mm_movehdup_ps(_mm_add_ps(am0, am1)); /* [mins, mins, cors, cors] */
        const float mins = x16 ? _mm_cvtss_f32(h) : _mm_cvtss_f32(_mm_add_ss(h, _mm_movehl_ps(h, h)));
        y = (c0 == 0 ? 0.0f : y) + (hsum512(a) + mins);
    }
    return y;
}

/* Rows n0 <= n < n1, all tokens, of one type. */
QK_INLINE void rows_of(float *y, size_t ldy, const uint8_t *W, const ifk_qx *qx, int n0, int n1, const int type,
                       const int x16)
{
    const int T = qx->T;
    int n = n0;
    if (T == 1) {
        const size_t rb = (size_t)qx->nb * ifk_qtype_block_bytes(type);
        for (; n < n1; n++)
            y[n] = gemv_row(W + (size_t)n * rb, qx, type, x16);
        return;
    }
    for (; n + 4 <= n1; n += 4)
        gemm_rows(y, ldy, W, qx, n, type, x16, 4);
    for (; n < n1; n++)
        gemm_rows(y, ldy, W, qx, n, type, x16, 1);
}

/* rows_TYPE_X16: one type on int8 x (X16 = 0) or int16 x (X16 = 1); Q8, Q6 and Q5 have both
 * (int8 x in the mode IFK_QX_INT8, quant.h), the others int8 only. */
#define QK_ROWS_FN(TYPE, X16)                                                                     \
    QK_FN static void rows_##TYPE##_##X16(float *y, size_t ldy, const uint8_t *W, const ifk_qx *qx, int n0, int n1) \
    {                                                                                             \
        rows_of(y, ldy, W, qx, n0, n1, TYPE, X16);                                                \
    }
QK_ROWS_FN(IFK_Q8_B32, 1)
QK_ROWS_FN(IFK_Q8_B64, 1)
QK_ROWS_FN(IFK_Q6_B64, 1)
QK_ROWS_FN(IFK_Q5_B64, 1)
QK_ROWS_FN(IFK_Q8_B32, 0)
QK_ROWS_FN(IFK_Q8_B64, 0)
QK_ROWS_FN(IFK_Q6_B64, 0)
QK_ROWS_FN(IFK_Q5_B64, 0)
QK_ROWS_FN(IFK_Q4_B32, 0)
QK_ROWS_FN(IFK_Q4_B64, 0)
QK_ROWS_FN(IFK_Q3H_B64, 0)
QK_ROWS_FN(IFK_Q3_B32, 0)
QK_ROWS_FN(IFK_Q2_B32, 0)

QK_FN IFK_DECL_QMATMUL_ROWS(QK_NAME(qmatmul_rows))
{
    const uint8_t *w = W;
    const int x16 = qx->x16;
    switch (qx->type) {
    case IFK_Q8_B32: (x16 ? rows_IFK_Q8_B32_1 : rows_IFK_Q8_B32_0)(y, ldy, w, qx, n0, n1); break;
    case IFK_Q8_B64: (x16 ? rows_IFK_Q8_B64_1 : rows_IFK_Q8_B64_0)(y, ldy, w, qx, n0, n1); break;
    case IFK_Q6_B64: (x16 ? rows_IFK_Q6_B64_1 : rows_IFK_Q6_B64_0)(y, ldy, w, qx, n0, n1); break;
    case IFK_Q5_B64: (x16 ? rows_IFK_Q5_B64_1 : rows_IFK_Q5_B64_0)(y, ldy, w, qx, n0, n1); break;
    case IFK_Q4_B32: rows_IFK_Q4_B32_0(y, ldy, w, qx, n0, n1); break;
    case IFK_Q4_B64: rows_IFK_Q4_B64_0(y, ldy, w, qx, n0, n1); break;
    case IFK_Q3H_B64: rows_IFK_Q3H_B64_0(y, ldy, w, qx, n0, n1); break;
    case IFK_Q3_B32: rows_IFK_Q3_B32_0(y, ldy, w, qx, n0, n1); break;
    case IFK_Q2_B32: rows_IFK_Q2_B32_0(y, ldy, w, qx, n0, n1); break;
    default: break;
    }
}

/* ---- one row decoded to F32 -------------------------------------------------------------- */

/* out: [n] (n <= 16) = m + q * d for 16 levels. */
QK_INLINE void store_dq16(float *out, __m128i q, __m512 d, __m512 m, int n)
{
    __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)), d, m);
    if (n >= 16)
        _mm512_storeu_ps(out, v);
    else
        _mm512_mask_storeu_ps(out, mask16(n), v);
}

QK_FN IFK_DECL_QGET_ROW(QK_NAME(qget_row))
{
    const int B = ifk_qtype_block(type), BB = ifk_qtype_block_bytes(type);
    const uint8_t *blk = row;  /* [nb][BB] */
    for (int k = 0; k < K; k += B, blk += BB) {
        uint16_t h[2];
        memcpy(h, blk, 4);
        __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)h[0]));
        __m512 m = _mm512_cvtph_ps(_mm256_set1_epi16((short)h[1]));
        _Alignas(64) uint8_t q[64];
        if (B == 64)
            _mm512_store_si512(q, levels64(type, blk));
        else
            _mm256_store_si256((__m256i *)q, levels32(type, blk));
        for (int i = 0; i < B && k + i < K; i += 16)
            store_dq16(out + k + i, _mm_load_si128((const __m128i *)(q + i)), d, m, K - k - i);
    }
}
