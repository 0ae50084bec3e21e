/*
 * test_qkernels.c -- the block-quantized types of kernels/cpu/quant.h: the reference
 * quantizer against the paper's worked example (Table 2) and sizes (Table 3), its error bound
 * on random data, edge blocks, and (below) every SIMD path of ifk_qmatmul against the oracle.
 *
 * Tolerances:
 *   Table 2 dequantized values: |w' - paper| <= 0.0005 (the paper's 3 decimals)
 *                                + |f16(min) - min| + q |f16(delta) - delta|   (FP16 storage)
 *   quantize -> dequantize:     |w - w'| <= delta/2 (rounding to a level)
 *                                + 2^-11 (|min| + (L-1) delta) + 2^-25 L        (FP16 storage)
 *                                + 2^-23 max|w|                                 (float arithmetic)
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/quant.h"
#include "tests/unit/check.h"

/* ---- helpers ----------------------------------------------------------------------------- */

static const int all_types[] = { IFK_Q8_B32, IFK_Q8_B64, IFK_Q6_B64, IFK_Q5_B64, IFK_Q4_B32,
                                 IFK_Q4_B64, IFK_Q3H_B64, IFK_Q3_B32, IFK_Q2_B32 };
#define N_TYPES ((int)(sizeof all_types / sizeof all_types[0]))

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* uniform in (0, 1) */
static double rnd_unit(void)
{
    return ((double)(rnd_u32() & 0xffffff) + 0.5) / 16777216.0;
}

/* standard normal (Box-Muller) */
static float rnd_normal(void)
{
    return (float)(sqrt(-2.0 * log(rnd_unit())) * cos(6.283185307179586 * rnd_unit()));
}

static uint16_t rd16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

/* delta and min of block b of a quantized row. */
static float blk_delta(const void *row, int type, int b)
{
    return ifk_f16_to_f32(rd16((const uint8_t *)row + (size_t)b * ifk_qtype(type)->block_bytes));
}

static float blk_min(const void *row, int type, int b)
{
    return ifk_f16_to_f32(rd16((const uint8_t *)row + (size_t)b * ifk_qtype(type)->block_bytes + 2));
}

/* The level of element i, recovered from the decoded value (exact: w' = min + q delta). */
static int level_of(const void *row, int type, const float *dq, int i)
{
    int B = ifk_qtype(type)->block;
    float d = blk_delta(row, type, i / B), m = blk_min(row, type, i / B);
    return d > 0.0f ? (int)lrint(((double)dq[i] - m) / d) : 0;
}

/* ---- (a) the paper's Table 2 ------------------------------------------------------------- */

static void check_table2(int type, const int *q_paper, const double *w_paper, double avg_paper)
{
    static const float w[12] = { -1.0f, -0.9f, -0.6f, -0.4f, -0.2f, 0.0f, 0.1f, 0.5f, 0.7f, 1.0f, 1.3f, 1.5f };
    const ifk_qtype_info *t = ifk_qtype(type);
    uint8_t blk[68];
    float dq[12];
    memset(blk, 0xAA, sizeof blk);
    ifk_quantize_row(blk, type, w, 12);
    ifk_dequantize_row(dq, type, blk, 12);
    double delta = 2.5 / (t->levels - 1);
    float d16 = blk_delta(blk, type, 0), m16 = blk_min(blk, type, 0);
    double err = 0.0;
    for (int i = 0; i < 12; i++) {
        int q = level_of(blk, type, dq, i);
        CHECK(q == q_paper[i], "%s: w=%g: q=%d, paper %d", t->name, w[i], q, q_paper[i]);
        double tol = 0.0005 + fabs(m16 - -1.0) + q * fabs(d16 - delta);
        CHECK(fabs(dq[i] - w_paper[i]) <= tol, "%s: w=%g: w'=%.6f, paper %.3f", t->name, w[i], dq[i], w_paper[i]);
        err += fabs(dq[i] - w[i]);
    }
    err /= 12;
    CHECK(fabs(err - avg_paper) <= 0.0005, "%s: average |error| %.5f, paper %.3f", t->name, err, avg_paper);
    /* the padding levels of the block are 0: the whole block decodes to min there */
    float full[64];
    ifk_dequantize_row(full, type, blk, t->block);
    for (int i = 12; i < t->block; i++)
        CHECK(full[i] == m16, "%s: padding element %d decodes to %g, not min", t->name, i, full[i]);
}

static void test_table2(void)
{
    static const int q4[12] = { 0, 1, 2, 4, 5, 6, 7, 9, 10, 12, 14, 15 };
    static const double w4[12] = { -1.000, -0.833, -0.667, -0.333, -0.167, 0.000,
                                   0.167, 0.500, 0.667, 1.000, 1.333, 1.500 };
    static const int q3[12] = { 0, 0, 1, 2, 2, 3, 3, 4, 5, 6, 6, 7 };
    static const double w3[12] = { -1.000, -1.000, -0.643, -0.286, -0.286, 0.071,
                                   0.071, 0.429, 0.786, 1.143, 1.143, 1.500 };
    static const int q35[12] = { 0, 0, 2, 2, 3, 4, 4, 6, 7, 8, 9, 10 };
    static const double w35[12] = { -1.000, -1.000, -0.500, -0.500, -0.250, 0.000,
                                    0.000, 0.500, 0.750, 1.000, 1.250, 1.500 };
    check_table2(IFK_Q4_B32, q4, w4, 0.031);
    check_table2(IFK_Q3_B32, q3, w3, 0.075);
    check_table2(IFK_Q3H_B64, q35, w35, 0.046);
}

/* ---- (b) sizes and the error bound ------------------------------------------------------- */

static void test_table3_sizes(void)
{
    static const struct { int type; double bits; } paper[] = {
        { IFK_Q8_B32, 9.0 }, { IFK_Q8_B64, 8.5 }, { IFK_Q6_B64, 6.5 }, { IFK_Q5_B64, 5.5 },
        { IFK_Q4_B32, 5.0 }, { IFK_Q4_B64, 4.5 }, { IFK_Q3H_B64, 4.0 }, { IFK_Q3_B32, 4.0 },
        { IFK_Q2_B32, 3.0 }, /* ours */
    };
    for (size_t i = 0; i < sizeof paper / sizeof paper[0]; i++) {
        const ifk_qtype_info *t = ifk_qtype(paper[i].type);
        CHECK(t != NULL, "type %d has no table entry", paper[i].type);
        if (!t)
            continue;
        CHECK(t->block_bytes * 8.0 / t->block == paper[i].bits, "%s: %g bits/weight, paper %g", t->name,
              t->block_bytes * 8.0 / t->block, paper[i].bits);
        CHECK(ifk_qrow_bytes(paper[i].type, 172) == (size_t)((172 + t->block - 1) / t->block) * t->block_bytes,
              "%s: row bytes of K=172", t->name);
    }
    CHECK(ifk_qtype(15) == NULL && ifk_qtype(IFK_QTYPE_END_) == NULL && ifk_qtype(IFK_F16) == NULL,
          "non-quantized codes have no table entry");
    CHECK(ifk_qrow_bytes(IFK_F32, 64) == 0 && ifk_qrow_bytes(IFK_Q4_B64, 0) == 0, "row bytes of nothing");
}

/* Checks the quantize -> dequantize bound on one row w: [K]; returns the largest error / delta. */
static double check_roundtrip(int type, const float *w, int K, const char *what)
{
    const ifk_qtype_info *t = ifk_qtype(type);
    uint8_t *row = malloc(ifk_qrow_bytes(type, K));
    float *dq = malloc((size_t)K * sizeof *dq);
    ifk_quantize_row(row, type, w, K);
    ifk_dequantize_row(dq, type, row, K);
    double worst = 0.0;
    int fails = 0;
    for (int b = 0; b * t->block < K; b++) {
        int k0 = b * t->block, n = K - k0 < t->block ? K - k0 : t->block;
        double mn = w[k0], mx = w[k0];
        for (int i = 1; i < n; i++) {
            mn = fmin(mn, w[k0 + i]);
            mx = fmax(mx, w[k0 + i]);
        }
        double delta = (mx - mn) / (t->levels - 1), amax = fmax(fabs(mn), fabs(mx));
        double tol = delta / 2 * (1 + 1e-12) + 0x1p-11 * (fabs(mn) + (t->levels - 1) * delta) +
                     0x1p-25 * t->levels + 0x1p-23 * amax;
        for (int i = 0; i < n; i++) {
            double e = fabs((double)dq[k0 + i] - w[k0 + i]);
            if (!(e <= tol) && fails++ < 5)
                CHECK(0, "%s %s: K=%d element %d: w=%.9g w'=%.9g error %.3g > bound %.3g", t->name, what, K,
                      k0 + i, w[k0 + i], dq[k0 + i], e, tol);
            if (delta > 0)
                worst = fmax(worst, e / delta);
        }
    }
    CHECK(fails == 0, "%s %s: %d elements over the bound", t->name, what, fails);
    free(row);
    free(dq);
    return worst;
}

static void test_roundtrip_random(void)
{
    enum { K = 4096 + 37 };
    float *w = malloc(K * sizeof *w);
    for (int ti = 0; ti < N_TYPES; ti++) {
        for (int i = 0; i < K; i++)
            w[i] = 0.02f * rnd_normal();
        double worst = check_roundtrip(all_types[ti], w, K, "normal*0.02");
        /* the bound is reached: some element is about delta/2 off */
        CHECK(worst > 0.45, "%s: max error %.4f delta", ifk_qtype(all_types[ti])->name, worst);
        for (int i = 0; i < K; i++)
            w[i] = 3.0f * rnd_normal() + 1.0f;
        check_roundtrip(all_types[ti], w, K, "normal*3+1");
    }
    free(w);
}

/* ---- (e) edge blocks --------------------------------------------------------------------- */

static void test_edge_blocks(void)
{
    enum { K = 200 };
    float w[K], dq[K];
    uint8_t row[4096];
    for (int ti = 0; ti < N_TYPES; ti++) {
        int type = all_types[ti];
        const char *name = ifk_qtype(type)->name;
        /* constant: delta 0, every element decodes to f16(c) */
        for (int i = 0; i < K; i++)
            w[i] = 0.3f;
        ifk_quantize_row(row, type, w, K);
        ifk_dequantize_row(dq, type, row, K);
        int ok = 1;
        for (int i = 0; i < K; i++)
            ok &= dq[i] == blk_min(row, type, 0) && fabsf(dq[i] - 0.3f) <= 0.3f * 0x1p-11f;
        CHECK(ok && blk_delta(row, type, 0) == 0.0f, "%s: constant block", name);
        /* zeros: exact zeros, no NaN */
        memset(w, 0, sizeof w);
        ifk_quantize_row(row, type, w, K);
        ifk_dequantize_row(dq, type, row, K);
        ok = 1;
        for (int i = 0; i < K; i++)
            ok &= dq[i] == 0.0f;
        CHECK(ok, "%s: zeros decode to zeros", name);
        /* large (to 6e4), tiny (FP16 subnormal deltas) and mixed blocks */
        for (int i = 0; i < K; i++)
            w[i] = 3e4f * rnd_normal();
        for (int i = 0; i < K; i++)
            w[i] = fmaxf(-6.5e4f, fminf(6.5e4f, w[i]));
        check_roundtrip(type, w, K, "large");
        for (int i = 0; i < K; i++)
            w[i] = 1e-6f * rnd_normal();
        check_roundtrip(type, w, K, "tiny");
        for (int i = 0; i < K; i++)
            w[i] = (i % 64 < 32 ? 1e-5f : 1e3f) * rnd_normal();
        check_roundtrip(type, w, K, "mixed");
        /* beyond FP16: min and delta saturate to 65504, every value stays finite */
        for (int i = 0; i < K; i++)
            w[i] = (i & 1 ? 1e6f : -1e6f) * (float)rnd_unit();
        ifk_quantize_row(row, type, w, K);
        ifk_dequantize_row(dq, type, row, K);
        ok = 1;
        for (int i = 0; i < K; i++)
            ok &= isfinite(dq[i]);
        CHECK(ok, "%s: out-of-range weights decode to finite values", name);
        /* a NaN weight gets level 0 and leaves its block decodable */
        for (int i = 0; i < K; i++)
            w[i] = (float)i;
        w[5] = NAN;
        ifk_quantize_row(row, type, w, K);
        ifk_dequantize_row(dq, type, row, K);
        CHECK(dq[5] == blk_min(row, type, 0), "%s: NaN weight -> level 0", name);
    }
}

/* Every level of every type survives pack -> unpack: a block whose levels are chosen, built by
 * quantizing min + q * delta with exact small-integer deltas. */
static void test_all_levels(void)
{
    for (int ti = 0; ti < N_TYPES; ti++) {
        int type = all_types[ti];
        const ifk_qtype_info *t = ifk_qtype(type);
        int L = t->levels, B = t->block, bad = 0;
        for (int rep = 0; rep < 50; rep++) {
            float w[64], dq[64];
            int q[64];
            for (int i = 0; i < B; i++)
                q[i] = (int)(rnd_u32() % (unsigned)L);
            int i0 = (int)(rnd_u32() % (unsigned)B), i1 = (i0 + 1 + (int)(rnd_u32() % (unsigned)(B - 1))) % B;
            q[i0] = 0;     /* min and max present at distinct places */
            q[i1] = L - 1;
            for (int i = 0; i < B; i++)
                w[i] = (float)q[i] - 7.0f;      /* delta 1, min -7: all exact in FP16 */
            uint8_t blk[68];
            ifk_quantize_row(blk, type, w, B);
            ifk_dequantize_row(dq, type, blk, B);
            for (int i = 0; i < B; i++)
                bad += dq[i] != w[i];
        }
        CHECK(bad == 0, "%s: %d levels did not survive packing", t->name, bad);
    }
}

int main(void)
{
    RUN(test_table2);
    RUN(test_table3_sizes);
    RUN(test_roundtrip_random);
    RUN(test_edge_blocks);
    RUN(test_all_levels);
    return check_summary("test_qkernels");
}
