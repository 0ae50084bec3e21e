/*
 * test_cuda_qblock.c -- the block decoders of kernels/cuda/qblock.cuh, compiled as plain C and
 * run on the CPU, against the reference layouts of kernels/cpu/quant_ref.c.
 *
 * Every check is exact (the decoders must reproduce the reference bit for bit):
 *   - IFKC_QB / IFKC_QBB equal ifk_qtype()'s block and block bytes;
 *   - ifkc_f16_to_f32 equals ifk_f16_to_f32 on all 65536 halves (NaN: both NaN);
 *   - on random rows of every type (K = 172, 1000, 4096 + 37, and one block; some blocks
 *     constant so that delta = 0): fmaf(q, delta, min) from ifkc_qdelta_min and each of
 *     ifkc_qlevel and ifkc_qslice (+ ifkc_qbyte_f32) equals ifk_dequantize_row for every
 *     element < K; padding levels (elements >= K of the last block) and the levels of a
 *     delta = 0 block are 0;
 *   - on rows built from known levels (each block holds 0 and L-1, so delta = 1, min = 0 and the
 *     quantizer keeps the levels exactly): both decoders return those levels;
 *   - the Q3H division by 11 of every code 0..127.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/qblock.cuh"
#include "tests/unit/check.h"

static const int all_types[] = { IFK_Q8_B32, IFK_Q8_B64, IFK_Q6_B64, IFK_Q5_B64, IFK_Q4_B32,
                                 IFK_Q4_B64, IFK_Q3H_B64, IFK_Q3_B32, IFK_Q2_B32 };
#define N_TYPES ((int)(sizeof all_types / sizeof all_types[0]))


static int same_bits(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* A row of ifk_qrow_bytes(type, K) bytes, 4-byte aligned (malloc). */
static uint8_t *alloc_row(int type, int K)
{
    return malloc(ifk_qrow_bytes(type, K));
}

/* Levels of every element of block b from both decoders: by_level[B], by_slice[B]. */
static void decode_block(int type, const uint8_t *blk, int *by_level, int *by_slice)
{
    int B = IFKC_QB(type);
    for (int i = 0; i < B; i++)
        by_level[i] = ifkc_qlevel(type, blk, i);
    for (int j = 0; j < B / 8; j++) {
        uint32_t lo, hi;
        ifkc_qslice(type, blk, j, &lo, &hi);
        for (int e = 0; e < 4; e++) {
            by_slice[4 * j + e] = (int)ifkc_qbyte_f32(lo, e);
            by_slice[B / 2 + 4 * j + e] = (int)ifkc_qbyte_f32(hi, e);
        }
    }
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_block_constants(void)
{
    for (int ti = 0; ti < N_TYPES; ti++) {
        const ifk_qtype_info *t = ifk_qtype(all_types[ti]);
        CHECK(IFKC_QB(all_types[ti]) == t->block, "%s: IFKC_QB %d, block %d", t->name, IFKC_QB(all_types[ti]),
              t->block);
        CHECK(IFKC_QBB(all_types[ti]) == t->block_bytes, "%s: IFKC_QBB %d, block bytes %d", t->name,
              IFKC_QBB(all_types[ti]), t->block_bytes);
    }
    CHECK(IFKC_QB(0) == 0 && IFKC_QBB(1) == 0 && IFKC_QB(IFK_QTYPE_END_) == 0, "non-quantized codes have no block");
}

static void test_f16(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = ifkc_f16_to_f32((uint16_t)h), b = ifk_f16_to_f32((uint16_t)h);
        int ok = isnan(b) ? isnan(a) : same_bits(a, b);
        if (!ok && bad++ < 5)
            CHECK(0, "f16 0x%04x: %.9g, reference %.9g", h, a, b);
    }
    CHECK(bad == 0, "%d halves decode differently", bad);
}

static void test_q3h_split(void)
{
    for (uint32_t c0 = 0; c0 < 128; c0++) {
        uint32_t c1 = 127 - c0;
        uint32_t v = ifkc_q3h_split2(c0 | c1 << 16);
        CHECK((v & 255) == c0 / 11 && (v >> 8 & 255) == c0 % 11 && (v >> 16 & 255) == c1 / 11 &&
                  (v >> 24) == c1 % 11,
              "q3h split of codes %u, %u: 0x%08x", c0, c1, v);
    }
}

static void test_byte_f32(void)
{
    for (uint32_t b = 0; b < 256; b++)
        for (int e = 0; e < 4; e++) {
            uint32_t v = 0xa5a5a5a5u ^ (0xffu << (8 * e));
            v = (v & ~(0xffu << (8 * e))) | b << (8 * e);
            CHECK(ifkc_qbyte_f32(v, e) == (float)b, "byte %d of 0x%08x: %g", e, v, ifkc_qbyte_f32(v, e));
        }
}

/* Quantize a random row (blocks listed in flat[] are made constant: delta 0) and compare every
 * decoder with ifk_dequantize_row. */
static void check_random_row(int type, int K)
{
    const ifk_qtype_info *t = ifk_qtype(type);
    int B = t->block, nb = (K + B - 1) / B;
    float *w = malloc((size_t)K * sizeof *w), *ref = malloc((size_t)K * sizeof *ref);
    uint8_t *row = alloc_row(type, K);
    for (int k = 0; k < K; k++)
        w[k] = 0.05f * rnd_normal() + (k % 7 == 0 ? 0.01f : 0.0f);
    /* every third block constant (delta 0), one of them negative, one zero */
    for (int b = 1; b < nb; b += 3)
        for (int k = b * B; k < K && k < (b + 1) * B; k++)
            w[k] = b % 2 ? -0.375f : 0.0f;
    ifk_quantize_row(row, type, w, K);
    ifk_dequantize_row(ref, type, row, K);
    int bad = 0, n_flat = 0;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + (size_t)b * t->block_bytes;
        float d, m;
        ifkc_qdelta_min(blk, &d, &m);
        n_flat += d == 0.0f;
        int ql[64], qs[64];
        decode_block(type, blk, ql, qs);
        for (int i = 0; i < B; i++) {
            int k = b * B + i;
            if (k >= K || d == 0.0f) { /* padding, or a constant block: level 0 */
                if ((ql[i] != 0 || qs[i] != 0) && bad++ < 5)
                    CHECK(0, "%s K=%d element %d (block %d, delta %g): levels %d, %d, want 0", t->name, K, k,
                          b, d, ql[i], qs[i]);
                if (k >= K)
                    continue;
            }
            float a = fmaf((float)ql[i], d, m), s = fmaf((float)qs[i], d, m);
            if ((!same_bits(a, ref[k]) || !same_bits(s, ref[k])) && bad++ < 5)
                CHECK(0, "%s K=%d element %d: level %d -> %.9g, slice %d -> %.9g, reference %.9g", t->name, K,
                      k, ql[i], a, qs[i], s, ref[k]);
        }
    }
    CHECK(bad == 0, "%s K=%d: %d mismatches", t->name, K, bad);
    CHECK(nb < 2 || n_flat > 0, "%s K=%d: no block with delta 0 was tested", t->name, K);
    free(w);
    free(ref);
    free(row);
}

static void test_random_rows(void)
{
    static const int Ks[] = { 172, 1000, 4096 + 37, 32, 64, 1 };
    for (int ti = 0; ti < N_TYPES; ti++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
            check_random_row(all_types[ti], Ks[ki]);
}

/* Rows from chosen levels: each block holds 0 and L-1 (so delta = 1, min = 0 exactly) and
 * random levels elsewhere; both decoders must return them. */
static void test_known_levels(void)
{
    enum { NB = 16 };
    for (int ti = 0; ti < N_TYPES; ti++) {
        int type = all_types[ti];
        const ifk_qtype_info *t = ifk_qtype(type);
        int B = t->block, K = NB * B, L = t->levels;
        float *w = malloc((size_t)K * sizeof *w);
        int *q = malloc((size_t)K * sizeof *q);
        uint8_t *row = alloc_row(type, K);
        for (int b = 0; b < NB; b++)
            for (int i = 0; i < B; i++) {
                int v = (int)(rnd_u32() % (uint32_t)L);
                if (i == (b * 5) % B)
                    v = 0;
                else if (i == (b * 11 + 3) % B)
                    v = L - 1;
                q[b * B + i] = v;
                w[b * B + i] = (float)v;
            }
        ifk_quantize_row(row, type, w, K);
        int bad = 0;
        for (int b = 0; b < NB; b++) {
            const uint8_t *blk = row + (size_t)b * t->block_bytes;
            float d, m;
            ifkc_qdelta_min(blk, &d, &m);
            CHECK(d == 1.0f && m == 0.0f, "%s block %d: delta %g min %g, want 1 and 0", t->name, b, d, m);
            int ql[64], qs[64];
            decode_block(type, blk, ql, qs);
            for (int i = 0; i < B; i++)
                if ((ql[i] != q[b * B + i] || qs[i] != q[b * B + i]) && bad++ < 5)
                    CHECK(0, "%s block %d element %d: level %d, slice %d, want %d", t->name, b, i, ql[i], qs[i],
                          q[b * B + i]);
        }
        CHECK(bad == 0, "%s: %d wrong levels", t->name, bad);
        free(w);
        free(q);
        free(row);
    }
}

int main(void)
{
    RUN(test_block_constants);
    RUN(test_f16);
    RUN(test_q3h_split);
    RUN(test_byte_f32);
    RUN(test_random_rows);
    RUN(test_known_levels);
    return check_summary("test_cuda_qblock");
}
