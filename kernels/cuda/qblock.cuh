/*
 * qblock.cuh -- decoders of one block of the quantized weight types (kernels/cpu/quant.h), for
 * the CUDA kernels and, unchanged, for a CPU test.
 *
 * Contract
 *   Plain C11 that nvcc also compiles as CUDA C++: every function is IFKC_HD, which is
 *   `static __host__ __device__ __forceinline__` under nvcc and `static inline` under a C
 *   compiler, so tests/unit/test_cuda_qblock.c checks on the CPU the very code the kernels run
 *   (the only device-specific lines are the loads (__ldg), f16 -> f32 (__half2float) and the
 *   byte -> float trick (__byte_perm), each with an equivalent host branch). No allocation,
 *   no failure; the caller guarantees a known type code and indices in range.
 *
 *   blk points at one block (quant.h: f16 delta at 0, f16 min at 2, levels from 4) and must be
 *   4-byte aligned: every block size is a multiple of 4, so this holds for every block of a
 *   matrix that starts 4-byte aligned (cudaMalloc: 256). Fields are little-endian, as is every
 *   host iflow runs on.
 *
 *   IFKC_QB(t), IFKC_QBB(t)      block size B and block bytes (constant expressions)
 *   ifkc_f16_to_f32(h)           IEEE half -> float, exact (subnormals included)
 *   ifkc_qdelta_min(blk, &d, &m) the block's delta and min as floats
 *   ifkc_qlevel(t, blk, i)       level q (0..L-1) of element i (0 <= i < B), read straight
 *                                from quant.h's table (the slow, obvious decoder)
 *   ifkc_qslice(t, blk, j, &lo, &hi)
 *                                the kernels' decoder: slice j (0 <= j < B/8) is the 8 elements
 *                                4j..4j+3 and B/2+4j..B/2+4j+3; their levels come back as the
 *                                four bytes of lo and of hi (byte e = level of element 4j+e, and
 *                                of element B/2+4j+e). One or two coalesced 32-bit loads of
 *                                level bytes (plus a few shared words for the high bits) and
 *                                some shifts and masks per slice.
 *   ifkc_qbyte_f32(v, e)         byte e of v as a float (0..255), without an int -> float
 *                                conversion instruction: the byte is put in the mantissa of
 *                                2^23 and 2^23 subtracted (exact).
 *   The decoded weight of element i is min + q * delta (= fmaf(q, delta, min), bit-identical to
 *   ifk_dequantize_row since q * delta is exact in float).
 */
#ifndef IFKC_QBLOCK_CUH
#define IFKC_QBLOCK_CUH

#include <stdint.h>
#include <string.h>

#include "kernels/cpu/quant.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define IFKC_HD static __host__ __device__ __forceinline__
#else
#define IFKC_HD static inline
#endif

/* Block size B and bytes per block of a quantized type (0 for others); constant expressions. */
#define IFKC_QB(t)                                                                                \
    ((t) == IFK_Q8_B32 || (t) == IFK_Q4_B32 || (t) == IFK_Q3_B32 || (t) == IFK_Q2_B32   ? 32     \
     : (t) == IFK_Q8_B64 || (t) == IFK_Q6_B64 || (t) == IFK_Q5_B64 || (t) == IFK_Q4_B64 ||        \
             (t) == IFK_Q3H_B64                                                          ? 64     \
                                                                                         : 0)
#define IFKC_QBB(t)                                                                               \
    ((t) == IFK_Q8_B32    ? 36                                                                    \
     : (t) == IFK_Q8_B64  ? 68                                                                    \
     : (t) == IFK_Q6_B64  ? 52                                                                    \
     : (t) == IFK_Q5_B64  ? 44                                                                    \
     : (t) == IFK_Q4_B32  ? 20                                                                    \
     : (t) == IFK_Q4_B64  ? 36                                                                    \
     : (t) == IFK_Q3H_B64 ? 32                                                                    \
     : (t) == IFK_Q3_B32  ? 16                                                                    \
     : (t) == IFK_Q2_B32  ? 12                                                                    \
                          : 0)

/* The little-endian u32 at p (4-byte aligned). On the device through the read-only cache. */
IFKC_HD uint32_t ifkc_ld32(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    return __ldg((const unsigned int *)p);
#else
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
#endif
}

IFKC_HD float ifkc_bits_f32(uint32_t b)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(b);
#else
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
#endif
}

/* IEEE half -> float, exact for every finite value (NaN stays NaN, inf stays inf). */
IFKC_HD float ifkc_f16_to_f32(uint16_t h)
{
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(h));
#else
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f)                     /* inf or NaN */
        return ifkc_bits_f32(sign | 0x7f800000u | man << 13);
    if (exp != 0)                        /* normal: rebias 15 -> 127 */
        return ifkc_bits_f32(sign | (exp + 112) << 23 | man << 13);
    float f = (float)man * 0x1p-24f;     /* zero or subnormal: exact */
    return sign ? -f : f;
#endif
}

/* The block's delta and min. blk: [IFKC_QBB(type)]. */
IFKC_HD void ifkc_qdelta_min(const uint8_t *blk, float *delta, float *min)
{
    uint32_t dm = ifkc_ld32(blk);
    *delta = ifkc_f16_to_f32((uint16_t)(dm & 0xffffu));
    *min = ifkc_f16_to_f32((uint16_t)(dm >> 16));
}

/* Bit b of the little-endian bit field starting at p. */
IFKC_HD int ifkc_bit(const uint8_t *p, int b)
{
    return (p[b >> 3] >> (b & 7)) & 1;
}

/* Level of element i (0 <= i < B) of a block, straight from quant.h's table. blk: [block bytes]. */
IFKC_HD int ifkc_qlevel(int type, const uint8_t *blk, int i)
{
    const uint8_t *lv = blk + 4;
    switch (type) {
    case IFK_Q8_B32:
    case IFK_Q8_B64:
        return lv[i];
    case IFK_Q6_B64:
        return (i < 32 ? lv[i] & 15 : lv[i - 32] >> 4) | ((lv[32 + i % 16] >> (2 * (i / 16))) & 3) << 4;
    case IFK_Q5_B64:
        return (i < 32 ? lv[i] & 15 : lv[i - 32] >> 4) | ifkc_bit(lv + 32, i) << 4;
    case IFK_Q4_B32:
        return i < 16 ? lv[i] & 15 : lv[i - 16] >> 4;
    case IFK_Q4_B64:
        return i < 32 ? lv[i] & 15 : lv[i - 32] >> 4;
    case IFK_Q3H_B64: {
        int ci = i / 2;
        int c = ci < 16 ? lv[ci] & 15 : lv[ci - 16] >> 4;
        for (int p = 0; p < 3; p++)
            c |= ifkc_bit(lv + 16 + 4 * p, ci) << (4 + p);
        return i % 2 ? c % 11 : c / 11;
    }
    case IFK_Q3_B32:
        return ((lv[i % 8] >> (2 * (i / 8))) & 3) | ifkc_bit(lv + 8, i) << 2;
    case IFK_Q2_B32:
        return (lv[i % 8] >> (2 * (i / 8))) & 3;
    default:
        return 0;
    }
}

/* The 4 low bits of n (0..15) moved to bit 0 of bytes 0..3: bit b -> bit 8b. */
IFKC_HD uint32_t ifkc_spread4(uint32_t n)
{
    return (n * 0x00204081u) & 0x01010101u;
}

/* The 2 low bits of n moved to bit 0 of the two 16-bit halves: bit b -> bit 16b. */
IFKC_HD uint32_t ifkc_spread2(uint32_t n)
{
    return (n & 1u) | (n & 2u) << 15;
}

/* Two Q3H codes (0..120) in the 16-bit halves of c -> their four levels as bytes:
 * byte 0 = c0 / 11, byte 1 = c0 % 11, byte 2 = c1 / 11, byte 3 = c1 % 11.
 * c / 11 == (c * 187) >> 11 for 0 <= c < 128; the products stay below 2^16 per half. */
IFKC_HD uint32_t ifkc_q3h_split2(uint32_t c)
{
    uint32_t quo = ((c * 187u) >> 11) & 0x001f001fu;
    uint32_t rem = c - quo * 11u;
    return quo | rem << 8;
}

/* Levels of slice j (0 <= j < B/8) of a block: lo's byte e = level of element 4j+e, hi's byte
 * e = level of element B/2+4j+e (e = 0..3). blk: [block bytes], 4-byte aligned. */
IFKC_HD void ifkc_qslice(int type, const uint8_t *blk, int j, uint32_t *lo, uint32_t *hi)
{
    const uint8_t *lv = blk + 4;
    switch (type) {
    case IFK_Q8_B32:
        *lo = ifkc_ld32(lv + 4 * j);
        *hi = ifkc_ld32(lv + 16 + 4 * j);
        break;
    case IFK_Q8_B64:
        *lo = ifkc_ld32(lv + 4 * j);
        *hi = ifkc_ld32(lv + 32 + 4 * j);
        break;
    case IFK_Q4_B32:
    case IFK_Q4_B64: { /* byte k = q[k] | q[k + B/2] << 4 */
        uint32_t w = ifkc_ld32(lv + 4 * j);
        *lo = w & 0x0f0f0f0fu;
        *hi = (w >> 4) & 0x0f0f0f0fu;
        break;
    }
    case IFK_Q6_B64: { /* ql as Q4_B64; qh byte (4j+e) % 16 has 2 bits of each quarter */
        uint32_t w = ifkc_ld32(lv + 4 * j), h = ifkc_ld32(lv + 32 + 4 * (j % 4));
        int s = 2 * (j / 4);               /* quarter of element 4j+e: j/4; of 32+4j+e: 2 + j/4 */
        *lo = (w & 0x0f0f0f0fu) | ((h >> s) & 0x03030303u) << 4;
        *hi = ((w >> 4) & 0x0f0f0f0fu) | ((h >> (s + 4)) & 0x03030303u) << 4;
        break;
    }
    case IFK_Q5_B64: { /* ql as Q4_B64; bit i of the u64 at 32 = q[i] >> 4 */
        uint32_t w = ifkc_ld32(lv + 4 * j), hl = ifkc_ld32(lv + 32), hh = ifkc_ld32(lv + 36);
        *lo = (w & 0x0f0f0f0fu) | ifkc_spread4((hl >> (4 * j)) & 15u) << 4;
        *hi = ((w >> 4) & 0x0f0f0f0fu) | ifkc_spread4((hh >> (4 * j)) & 15u) << 4;
        break;
    }
    case IFK_Q3H_B64: {
        /* codes 2j, 2j+1 (elements 4j..4j+3) and 16+2j, 17+2j (elements 32+4j..): low nibbles
         * and high nibbles of cl bytes 2j, 2j+1; bits 4..6 from the three planes */
        uint32_t w = ifkc_ld32(lv + 4 * (j / 2)) >> (16 * (j % 2));
        uint32_t b2 = (w & 0xffu) | (w & 0xff00u) << 8;           /* the two bytes, one per half */
        uint32_t c01 = b2 & 0x000f000fu, c23 = (b2 >> 4) & 0x000f000fu;
        for (int p = 0; p < 3; p++) {
            uint32_t pl = ifkc_ld32(lv + 16 + 4 * p);
            c01 |= ifkc_spread2((pl >> (2 * j)) & 3u) << (4 + p);
            c23 |= ifkc_spread2((pl >> (16 + 2 * j)) & 3u) << (4 + p);
        }
        *lo = ifkc_q3h_split2(c01);
        *hi = ifkc_q3h_split2(c23);
        break;
    }
    case IFK_Q3_B32:
    case IFK_Q2_B32: { /* byte k % 8, bits 2 (k / 8): element 4j+e is byte 4 (j%2) + e, bits 2 (j/2) */
        uint32_t w = ifkc_ld32(lv + 4 * (j % 2));
        int s = 2 * (j / 2);
        uint32_t l = (w >> s) & 0x03030303u, u = (w >> (s + 4)) & 0x03030303u;
        if (type == IFK_Q3_B32) { /* bit i of the u32 at 8 = q[i] >> 2 */
            uint32_t h = ifkc_ld32(lv + 8);
            l |= ifkc_spread4((h >> (4 * j)) & 15u) << 2;
            u |= ifkc_spread4((h >> (16 + 4 * j)) & 15u) << 2;
        }
        *lo = l;
        *hi = u;
        break;
    }
    default:
        *lo = *hi = 0;
        break;
    }
}

/* Byte e (0..3) of v as a float: the byte becomes the low mantissa bits of 2^23, then 2^23 is
 * subtracted (exact). One byte-permute and one add instead of an int -> float conversion. */
IFKC_HD float ifkc_qbyte_f32(uint32_t v, int e)
{
#ifdef __CUDA_ARCH__
    /* result bytes: [v.byte e, 0, 0, 0x4b] from {0x4b000000 : v} (selector nibbles 7,4,4,e) */
    return __uint_as_float(__byte_perm(v, 0x4b000000u, 0x7440u | (unsigned)e)) - 8388608.0f;
#else
    return ifkc_bits_f32(0x4b000000u | ((v >> (8 * e)) & 0xffu)) - 8388608.0f;
#endif
}

#endif
