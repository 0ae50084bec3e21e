/*
 * quant_ref.c -- the reference of the block-quantized types of quant.h: the type table,
 * quantization and dequantization of rows, and the scalar matrix product that every fast path
 * is tested against.
 *
 * Written to be obviously correct, not fast. Choices quant.h leaves open, fixed here:
 *   - q = round((w - min) / (max - min) * (L - 1)) is evaluated in double, so it is the
 *     real-number formula (Eq. 1 and quant.h's (w - min) / delta agree there) from the true
 *     float min and max, rounded half away from zero like roundf, then clamped to 0..L-1.
 *   - delta = (max - min) / (L - 1) and min go to FP16 with round-to-nearest-even; a finite
 *     value beyond the FP16 range saturates to +-65504 instead of becoming infinite.
 *   - The decoded weight is f16(min) + q * f16(delta) in float (q * delta is exact in float:
 *     8 bits times 11 bits, so the fast paths' FMA gives the same bits).
 *   - A NaN weight gets level 0; infinities are outside the contract.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/qblock.h"
#include "kernels/cpu/qimpl.h"
#include "kernels/cpu/quant.h"

#define QMAX_BLOCK IFK_QMAX_BLOCK

static const ifk_qtype_info qtypes[IFK_QTYPE_END_ - IFK_Q8_B32] = {
    [IFK_Q8_B32 - IFK_Q8_B32] = { "q8_b32", 32, 256, 36, 8.0 },
    [IFK_Q8_B64 - IFK_Q8_B32] = { "q8_b64", 64, 256, 68, 8.0 },
    [IFK_Q6_B64 - IFK_Q8_B32] = { "q6_b64", 64, 64, 52, 6.0 },
    [IFK_Q5_B64 - IFK_Q8_B32] = { "q5_b64", 64, 32, 44, 5.0 },
    [IFK_Q4_B32 - IFK_Q8_B32] = { "q4_b32", 32, 16, 20, 4.0 },
    [IFK_Q4_B64 - IFK_Q8_B32] = { "q4_b64", 64, 16, 36, 4.0 },
    [IFK_Q3H_B64 - IFK_Q8_B32] = { "q3h", 64, 11, 32, 3.5 },
    [IFK_Q3_B32 - IFK_Q8_B32] = { "q3_b32", 32, 8, 16, 3.0 },
    [IFK_Q2_B32 - IFK_Q8_B32] = { "q2_b32", 32, 4, 12, 2.0 },
};

const ifk_qtype_info *ifk_qtype(int type)
{
    if (type < IFK_Q8_B32 || type >= IFK_QTYPE_END_)
        return NULL;
    return &qtypes[type - IFK_Q8_B32];
}

size_t ifk_qrow_bytes(int type, int K)
{
    const ifk_qtype_info *t = ifk_qtype(type);
    if (!t || K <= 0)
        return 0;
    return (size_t)((K + t->block - 1) / t->block) * (size_t)t->block_bytes;
}

/* ---- FP16 and little-endian fields ------------------------------------------------------- */

/* Round-to-nearest-even float -> IEEE half; finite values past the range saturate to +-65504. */
uint16_t ifk_f32_to_f16_sat(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)                  /* NaN stays a (quiet) NaN */
        return (uint16_t)(sign | 0x7e00);
    if (ax >= 0x477ff000u)                 /* >= 65520 (or inf): saturate */
        return (uint16_t)(sign | 0x7bff);
    if (ax < 0x38800000u) {                /* below 2^-14: subnormal half or zero */
        if (ax < 0x33000000u)              /* < 2^-25: rounds to zero */
            return sign;
        uint32_t e = ax >> 23, man = (ax & 0x7fffff) | 0x800000;
        /* value = man * 2^(e-150) = (man >> (126 - e)) units of 2^-24, shift in 14..24 */
        uint32_t shift = 126 - e;
        uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = ((ax >> 13) - (112u << 10)); /* rebias 127 -> 15, keep 10 mantissa bits */
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++;                               /* may carry into the exponent: still correct */
    return (uint16_t)(sign | h);
}

static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* ---- packing of the levels --------------------------------------------------------------- */

/* Bit b of the little-endian bit field that starts at p. */
static int get_bit(const uint8_t *p, int b)
{
    return (p[b >> 3] >> (b & 7)) & 1;
}

static void set_bit(uint8_t *p, int b, int v)
{
    p[b >> 3] = (uint8_t)((p[b >> 3] & ~(1u << (b & 7))) | (unsigned)(v & 1) << (b & 7));
}

/* Levels q: [B] -> the level bytes lv of one block (quant.h's table). */
static void pack_levels(uint8_t *lv, int type, const uint8_t *q)
{
    switch (type) {
    case IFK_Q8_B32:
    case IFK_Q8_B64:
        memcpy(lv, q, type == IFK_Q8_B32 ? 32 : 64);
        break;
    case IFK_Q6_B64:
        for (int j = 0; j < 32; j++)
            lv[j] = (uint8_t)((q[j] & 15) | (q[j + 32] & 15) << 4);
        for (int j = 0; j < 16; j++)
            lv[32 + j] = (uint8_t)((q[j] >> 4) | (q[j + 16] >> 4) << 2 | (q[j + 32] >> 4) << 4 |
                                   (q[j + 48] >> 4) << 6);
        break;
    case IFK_Q5_B64:
        for (int j = 0; j < 32; j++)
            lv[j] = (uint8_t)((q[j] & 15) | (q[j + 32] & 15) << 4);
        for (int i = 0; i < 64; i++)
            set_bit(lv + 32, i, q[i] >> 4);
        break;
    case IFK_Q4_B32:
        for (int j = 0; j < 16; j++)
            lv[j] = (uint8_t)(q[j] | q[j + 16] << 4);
        break;
    case IFK_Q4_B64:
        for (int j = 0; j < 32; j++)
            lv[j] = (uint8_t)(q[j] | q[j + 32] << 4);
        break;
    case IFK_Q3H_B64: {
        uint8_t c[32];
        for (int i = 0; i < 32; i++)
            c[i] = (uint8_t)(q[2 * i] * 11 + q[2 * i + 1]);
        for (int j = 0; j < 16; j++)
            lv[j] = (uint8_t)((c[j] & 15) | (c[j + 16] & 15) << 4);
        for (int p = 0; p < 3; p++)
            for (int i = 0; i < 32; i++)
                set_bit(lv + 16 + 4 * p, i, c[i] >> (4 + p));
        break;
    }
    case IFK_Q3_B32:
        for (int j = 0; j < 8; j++)
            lv[j] = (uint8_t)((q[j] & 3) | (q[j + 8] & 3) << 2 | (q[j + 16] & 3) << 4 | (q[j + 24] & 3) << 6);
        for (int i = 0; i < 32; i++)
            set_bit(lv + 8, i, q[i] >> 2);
        break;
    case IFK_Q2_B32:
        for (int j = 0; j < 8; j++)
            lv[j] = (uint8_t)(q[j] | q[j + 8] << 2 | q[j + 16] << 4 | q[j + 24] << 6);
        break;
    default:
        break;
    }
}

/* The level bytes lv of one block -> levels q: [B]. */
static void unpack_levels(uint8_t *q, int type, const uint8_t *lv)
{
    switch (type) {
    case IFK_Q8_B32:
    case IFK_Q8_B64:
        memcpy(q, lv, type == IFK_Q8_B32 ? 32 : 64);
        break;
    case IFK_Q6_B64:
        for (int i = 0; i < 64; i++)
            q[i] = (uint8_t)((i < 32 ? lv[i] & 15 : lv[i - 32] >> 4) | ((lv[32 + i % 16] >> (2 * (i / 16))) & 3) << 4);
        break;
    case IFK_Q5_B64:
        for (int i = 0; i < 64; i++)
            q[i] = (uint8_t)((i < 32 ? lv[i] & 15 : lv[i - 32] >> 4) | get_bit(lv + 32, i) << 4);
        break;
    case IFK_Q4_B32:
        for (int i = 0; i < 32; i++)
            q[i] = (uint8_t)(i < 16 ? lv[i] & 15 : lv[i - 16] >> 4);
        break;
    case IFK_Q4_B64:
        for (int i = 0; i < 64; i++)
            q[i] = (uint8_t)(i < 32 ? lv[i] & 15 : lv[i - 32] >> 4);
        break;
    case IFK_Q3H_B64:
        for (int i = 0; i < 32; i++) {
            int c = (i < 16 ? lv[i] & 15 : lv[i - 16] >> 4);
            for (int p = 0; p < 3; p++)
                c |= get_bit(lv + 16 + 4 * p, i) << (4 + p);
            q[2 * i] = (uint8_t)(c / 11);
            q[2 * i + 1] = (uint8_t)(c % 11);
        }
        break;
    case IFK_Q3_B32:
        for (int i = 0; i < 32; i++)
            q[i] = (uint8_t)(((lv[i % 8] >> (2 * (i / 8))) & 3) | get_bit(lv + 8, i) << 2);
        break;
    case IFK_Q2_B32:
        for (int i = 0; i < 32; i++)
            q[i] = (uint8_t)((lv[i % 8] >> (2 * (i / 8))) & 3);
        break;
    default:
        memset(q, 0, QMAX_BLOCK);
        break;
    }
}

/* ---- blocks ------------------------------------------------------------------------------ */

/* One block of n (1..B) weights w: [n] -> blk: [block_bytes]; levels past n are 0. */
void ifk_qblock_minmax(uint8_t *blk, int type, const float *w, int n)
{
    const ifk_qtype_info *t = ifk_qtype(type);
    float mn = w[0], mx = w[0];
    for (int i = 1; i < n; i++) {
        mn = w[i] < mn ? w[i] : mn;
        mx = w[i] > mx ? w[i] : mx;
    }
    uint8_t q[QMAX_BLOCK] = { 0 };
    const int top = t->levels - 1;
    if (mx > mn) {
        double range = (double)mx - (double)mn;
        for (int i = 0; i < n; i++) {
            double r = round(((double)w[i] - (double)mn) / range * top);
            q[i] = (uint8_t)(r >= 0.0 ? (r <= top ? r : top) : 0); /* NaN -> 0 */
        }
    }
    ifk_qblock_store(blk, type, ifk_f32_to_f16_sat((float)(((double)mx - (double)mn) / top)), ifk_f32_to_f16_sat(mn), q);
}

void ifk_qblock_store(uint8_t *blk, int type, uint16_t d16, uint16_t m16, const uint8_t *q)
{
    put_u16(blk, d16);
    put_u16(blk + 2, m16);
    pack_levels(blk + 4, type, q);
}

/* One block blk -> its first n (1..B) decoded weights w: [n]. */
void ifk_qblock_decode(float *w, int type, const uint8_t *blk, int n)
{
    uint8_t q[QMAX_BLOCK];
    unpack_levels(q, type, blk + 4);
    float d = ifk_f16_to_f32(get_u16(blk)), m = ifk_f16_to_f32(get_u16(blk + 2));
    for (int i = 0; i < n; i++)
        w[i] = m + (float)q[i] * d;
}

/* ---- rows -------------------------------------------------------------------------------- */

/* dst: [ifk_qrow_bytes(type, K)]; src: [K]. */
void ifk_quantize_row(void *dst, int type, const float *src, int K)
{
    const ifk_qtype_info *t = ifk_qtype(type);
    if (!t)
        return;
    uint8_t *out = dst;
    for (int k = 0; k < K; k += t->block) {
        int n = K - k < t->block ? K - k : t->block;
        ifk_qblock_minmax(out, type, src + k, n);
        out += t->block_bytes;
    }
}

/* dst: [K]; src: [ifk_qrow_bytes(type, K)]. */
void ifk_dequantize_row(float *dst, int type, const void *src, int K)
{
    const ifk_qtype_info *t = ifk_qtype(type);
    if (!t) {
        for (int k = 0; k < K; k++)
            dst[k] = 0.0f;
        return;
    }
    const uint8_t *in = src;
    for (int k = 0; k < K; k += t->block) {
        int n = K - k < t->block ? K - k : t->block;
        ifk_qblock_decode(dst + k, type, in, n);
        in += t->block_bytes;
    }
}

/* sum_k dequant(row)[k] * x[k] in double.  row: [ifk_qrow_bytes(type, K)]; x: [K]. */
static double qdot_ref(const uint8_t *row, int type, const ifk_qtype_info *t, const float *x, int K)
{
    float w[QMAX_BLOCK];
    double s = 0.0;
    for (int k = 0; k < K; k += t->block) {
        int n = K - k < t->block ? K - k : t->block;
        ifk_qblock_decode(w, type, row, n);
        for (int i = 0; i < n; i++)
            s += (double)w[i] * x[k + i];
        row += t->block_bytes;
    }
    return s;
}

/* W: [N][ifk_qrow_bytes(type, K)]; x: [T][K] at stride ldx; y: [T][N] at stride ldy; only
 * rows n0 <= n < n1. An unknown type gives zeros. */
void ifk_qmatmul_ref_rows(float *y, size_t ldy, const void *W, int type, const float *x, size_t ldx,
                          int T, int n0, int n1, int K)
{
    const ifk_qtype_info *t = ifk_qtype(type);
    size_t rb = ifk_qrow_bytes(type, K);
    for (int n = n0; n < n1; n++)
        for (int j = 0; j < T; j++)
            y[(size_t)j * ldy + n] =
                t ? (float)qdot_ref((const uint8_t *)W + (size_t)n * rb, type, t, x + (size_t)j * ldx, K) : 0.0f;
}

void ifk_qmatmul_ref(float *y, size_t ldy, const void *W, int type, const float *x, size_t ldx,
                     int T, int N, int K)
{
    ifk_qmatmul_ref_rows(y, ldy, W, type, x, ldx, T, 0, N, K);
}
