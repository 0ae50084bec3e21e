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
 *   ifk_qmatmul, SIMD paths (x rounded to integers: int8 per group of 32, or int16 per block
 *   for Q8, Q6 and Q5; exact F32 block sums for the min term), per output y[t][n]:
 *     against the oracle ifk_qmatmul_ref (quant.h's bound):
 *       |y - ref| <= sum_i |q_i - c| delta_b(i) amax_b(i) / (2 top) * (1 + 1e-3)
 *                    + 1e-5 sum_i (|min_b(i)| + (q_i + c) delta_b(i)) |x_i|
 *       (top = 127 or 32767: each x_i is off by at most half its group's step, and the
 *       group's max |x| is at most its block's, amax_b; c = (L - 1) / 2 for int8 x, whose
 *       rounding residual's share at the middle level is corrected (qimpl.h), else 0; then
 *       float summation)
 *     against model_dot, the same integer arithmetic (the correction included) in double:
 *       |y - model| <= 1e-5 * the sum of the terms' magnitudes          (float summation)
 *     scalar path: the oracle itself, bit-exact. The largest error relative to
 *     sum |w'_i x_i| on rows of K >= 1024 is printed.
 *   ifk_qget_row: bit-exact to ifk_dequantize_row on every path.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/qimpl.h"
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/quant.h"
#include "tests/unit/check.h"

/* ---- helpers ----------------------------------------------------------------------------- */

static const int all_types[] = { IFK_Q8_B32, IFK_Q8_B64, IFK_Q6_B64, IFK_Q5_B64, IFK_Q4_B32,
                                 IFK_Q4_B64, IFK_Q3H_B64, IFK_Q3_B32, IFK_Q2_B32 };
#define N_TYPES ((int)(sizeof all_types / sizeof all_types[0]))



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

/* ---- (c) ifk_qmatmul on every path against the oracle ----------------------------------- */

static const int isas[] = { IFK_ISA_SCALAR, IFK_ISA_AVX2, IFK_ISA_AVX512, IFK_ISA_AVX512GFNI, IFK_ISA_AMX };
#define N_ISAS 4

/* Largest error / sum |w'x| against the oracle, per path and type, for rows of K >= 1024:
 * [0] normal x and weights, [1] with outliers (printed by test_qmatmul_large); worst_rel8 the
 * same in the other mode of the types of ifk_qx_x16 (alt_mode). */
static double worst_rel[2][N_ISAS][N_TYPES], worst_rel8[2][N_ISAS][N_TYPES];

/* The mode that gives a type of ifk_qx_x16 the other x: Q8 takes int8 x by default (with the
 * split), so IFK_QX_INT16; Q6 and Q5 take int16 x by default, so IFK_QX_INT8. */
static int alt_mode(int type)
{
    return ifk_qx_splits(type) ? IFK_QX_INT16 : IFK_QX_INT8;
}

/* Random weights: normal, optionally with a few outliers (they set the blocks' ranges). */
static void fill_weights(float *w, size_t n, float scale, int outliers)
{
    for (size_t i = 0; i < n; i++)
        w[i] = scale * rnd_normal() * (outliers && rnd_u32() % 61 == 0 ? 8.0f : 1.0f);
}

/* The SIMD paths' arithmetic, in double: x rounded per group (qimpl.h: int8 per 32 elements,
 * the block for B = 32 and the alternating runs of 4 for B = 64; int16 per block when x16, as
 * ifk_qx_int16 says for the type) exactly as the kernels round it (float ops, ties to even), and
 * per block min sum(x) + delta sum(q xq s). *mag gets the sum of the terms' magnitudes (for the
 * float summation tolerance).  row: one quantized row; dq: [K] its decoded values; x: [K]. */
static double model_dot_rounded(const uint8_t *row, int type, int x16, const float *dq, const float *x, int K, double *mag)
{
    const ifk_qtype_info *qt = ifk_qtype(type);
    const float top = x16 ? 32767.0f : 127.0f;
    double y = 0.0, a = 0.0;
    for (int k0 = 0; k0 < K; k0 += qt->block) {
        int b = k0 / qt->block, kn = K - k0 < qt->block ? K - k0 : qt->block;
        double d = blk_delta(row, type, b), m = blk_min(row, type, b);
        float amax[2] = { 0.0f, 0.0f };
        double sx = 0.0, sxa = 0.0;
        for (int i = 0; i < kn; i++) {
            int g = qt->block == 64 && !x16 ? (i / 4) % 2 : 0;
            amax[g] = fmaxf(amax[g], fabsf(x[k0 + i]));
            sx += x[k0 + i];
            sxa += fabs(x[k0 + i]);
        }
        y += m * sx;
        a += fabs(m) * sxa;
        double rx = sx, rxa = 0.0; /* the residual sum(x - xq s), and the magnitude of its terms */
        for (int i = 0; i < kn; i++) {
            int g = qt->block == 64 && !x16 ? (i / 4) % 2 : 0;
            float pre = amax[g] < 0x1p-64f ? 0x1p64f : 1.0f;
            float inv = amax[g] > 0.0f ? top / (amax[g] * pre) : 0.0f, sc = amax[g] / top;
            double xq = nearbyintf(x[k0 + i] * pre * inv);
            int q = level_of(row, type, dq, k0 + i);
            y += d * q * xq * sc;
            a += d * fabs((double)q * xq * sc);
            rx -= xq * sc;
            rxa += fabs(xq * sc);
        }
        if (!x16) { /* the residual's correction (qimpl.h): delta * c * sum(x - xq s) */
            double c = 0.5 * (qt->levels - 1);
            y += d * c * rx;
            a += d * c * (sxa + rxa);
        }
    }
    *mag = a;
    return y;
}

/* qimpl.h's outliers of x: of the k elements of largest |x| (ties: the lower i), those with
 * |x| >= IFK_QX_SPLIT_RATIO L, L the least over the lanes i % 16 of the lane's largest |x|
 * (L = 0 for K < 16), in picked[K] (1 = picked); returns how many. */
static int pick_ref(const float *x, int K, int k, char *picked)
{
    float L = INFINITY;
    for (int l = 0; l < 16; l++) {
        float m = 0.0f;
        for (int i = l; i < K; i += 16)
            m = fmaxf(m, fabsf(x[i]));
        L = fminf(L, m);
    }
    const float thr = K >= 16 ? IFK_QX_SPLIT_RATIO * L : 0.0f;
    int n = 0;
    memset(picked, 0, (size_t)K);
    for (int j = 0; j < k && j < K; j++) {
        int b = -1;
        for (int i = 0; i < K; i++)
            if (!picked[i] && (b < 0 || fabsf(x[i]) > fabsf(x[b])))
                b = i;
        if (!(fabsf(x[b]) >= thr))
            break;
        picked[b] = 1;
        n++;
    }
    return n;
}

/* As model_dot_rounded, with qimpl.h's split when k > 0: the k outliers of x multiplied in F32
 * with the decoded weights, the rest rounded. */
static double model_dot(const uint8_t *row, int type, int x16, int k, const float *dq, const float *x, int K, double *mag)
{
    if (!k)
        return model_dot_rounded(row, type, x16, dq, x, K, mag);
    float *xs = malloc((size_t)K * sizeof *xs);
    char *picked = malloc((size_t)K);
    pick_ref(x, K, k, picked);
    double y = 0.0, a = 0.0;
    for (int i = 0; i < K; i++) {
        xs[i] = picked[i] ? 0.0f : x[i];
        if (picked[i]) {
            y += (double)x[i] * dq[i];
            a += fabs((double)x[i] * dq[i]);
        }
    }
    y += model_dot_rounded(row, type, x16, dq, xs, K, mag);
    *mag += a;
    free(xs);
    free(picked);
    return y;
}

/* Compares ifk_qmatmul on every available path with the oracle (within the int8 bound of
 * quant.h) and with model_dot (within float summation error) for one shape. ldx >= K, ldy >= N
 * pad the strides. xscale: magnitude of x; outliers: a few weights x8 and x x10. */
static void check_qmatmul(int ti, int T, int N, int K, size_t ldx, size_t ldy, int threads, float xscale, int outliers)
{
    int type = all_types[ti];
    const ifk_qtype_info *qt = ifk_qtype(type);
    size_t rb = ifk_qrow_bytes(type, K);
    float *w = malloc((size_t)N * K * sizeof *w), *wd = malloc((size_t)N * K * sizeof *wd);
    uint8_t *W = malloc((size_t)N * rb);
    float *x = malloc((size_t)T * ldx * sizeof *x);
    float *ref = malloc((size_t)T * ldy * sizeof *ref), *y = malloc((size_t)T * ldy * sizeof *y);
    fill_weights(w, (size_t)N * K, 0.05f, outliers);
    for (int n = 0; n < N; n++) {
        ifk_quantize_row(W + n * rb, type, w + (size_t)n * K, K);
        ifk_dequantize_row(wd + (size_t)n * K, type, W + n * rb, K);
    }
    for (size_t i = 0; i < (size_t)T * ldx; i++)
        x[i] = xscale * rnd_normal() * (outliers && rnd_u32() % 97 == 0 ? 10.0f : 1.0f);
    for (size_t i = 0; i < (size_t)T * ldy; i++)
        ref[i] = -1.0f;
    ifk_qmatmul_ref(ref, ldy, W, type, x, ldx, T, N, K);
    /* the row layout, then the packed copy (qpack.h): on the paths that have a kernel for it
     * (ifk_qpath_packed) that kernel, on the others the rows unpacked again */
    uint8_t *P = NULL;
    if (ifk_qpack_base(IFK_QPACKED + type) == type) {
        P = malloc(ifk_qpack_bytes(type, N, K));
        ifk_qpack(P, W, type, N, K);
    }
    /* each layout and path in the default mode, and for the types of ifk_qx_x16 in their other
     * mode too (alt_mode: int8 x for Q6 and Q5, int16 x for Q8, where the path has vpdpbusd:
     * ifk_qx_int16) */
    for (int lp = 0; lp < (P ? 2 : 1) * N_ISAS * 2; lp++) {
        const int alt = lp % 2, layout = lp / (2 * N_ISAS), p = lp / 2 % N_ISAS; /* alt: the other mode */
        if ((alt && !ifk_qx_x16(type)) || ifk_set_isa(isas[p]) != isas[p])
            continue;
        ifk_set_qx_mode(alt ? alt_mode(type) : IFK_QX_DEFAULT);
        const int x16 = ifk_qx_int16(type), split = ifk_qx_split(type, K);
        const char *mname = alt_mode(type) == IFK_QX_INT16 ? " int16-mode" : " int8-mode";
        char lname[40];
        snprintf(lname, sizeof lname, "%s%s", layout ? " packed" : "", alt ? mname : "");
        for (size_t i = 0; i < (size_t)T * ldy; i++)
            y[i] = -1.0f;
        if (layout)
            ifk_qmatmul(y, ldy, P, IFK_QPACKED + type, x, ldx, T, N, K, threads);
        else
            ifk_qmatmul(y, ldy, W, type, x, ldx, T, N, K, threads);
        int bad = 0, bad_model = 0, pad_ok = 1;
        for (int t = 0; t < T; t++) {
            const float *xt = x + t * ldx;
            for (int n = 0; n < N; n++) {
                const float *wn = wd + (size_t)n * K;
                const uint8_t *row = W + n * rb;
                double r = ref[(size_t)t * ldy + n], v = y[(size_t)t * ldy + n], e = fabs(v - r);
                if (isas[p] == IFK_ISA_SCALAR) {
                    bad += !(v == r);
                    continue;
                }
                /* quant.h's bound against the oracle */
                double bound = 0.0, a = 0.0, mag = 0.0;
                /* int8 x: the middle level's share of the rounding is corrected (qimpl.h) */
                const double c = x16 ? 0.0 : 0.5 * (qt->levels - 1);
                for (int k0 = 0; k0 < K; k0 += qt->block) {
                    int kn = K - k0 < qt->block ? K - k0 : qt->block;
                    double amax = 0.0, sw = 0.0;
                    float mn = blk_min(row, type, k0 / qt->block), dl = blk_delta(row, type, k0 / qt->block);
                    for (int i = k0; i < k0 + kn; i++) {
                        amax = fmax(amax, fabs(xt[i]));
                        sw += fabs(wn[i] - mn - c * dl);
                        a += (fabs(mn) + fabs(wn[i] - mn) + c * dl) * fabs(xt[i]);
                        mag += fabs((double)wn[i] * xt[i]);
                    }
                    bound += sw * amax / (x16 ? 65534.0 : 254.0);
                }
                double tol = bound * (1 + 1e-3) + 1e-5 * a + 1e-30;
                if (xscale > 1e-35f && !(e <= tol) && bad++ < 3)
                    CHECK(0, "%s %s%s T=%d N=%d K=%d thr=%d: y[%d][%d] = %.9g, oracle %.9g, error %.3g > %.3g",
                          ifk_isa_name(isas[p]), qt->name, lname, T, N, K, threads, t, n, v, r, e, tol);
                if (K >= 1024 && !layout) {
                    double *wr = alt ? &worst_rel8[outliers][p][ti] : &worst_rel[outliers][p][ti];
                    *wr = fmax(*wr, e / (mag + 1e-30));
                }
                /* the int8 arithmetic itself, up to float summation order */
                double mm, model = model_dot(row, type, x16, split, wn, xt, K, &mm);
                double em = fabs(v - model), tm = 1e-5 * mm + 1e-30;
                if (!(em <= tm) && bad_model++ < 3)
                    CHECK(0, "%s %s%s T=%d N=%d K=%d thr=%d: y[%d][%d] = %.9g, int8 model %.9g, error %.3g > %.3g",
                          ifk_isa_name(isas[p]), qt->name, lname, T, N, K, threads, t, n, v, model, em, tm);
            }
            for (size_t n = (size_t)N; n < ldy; n++)
                pad_ok &= y[(size_t)t * ldy + n] == -1.0f;
        }
        CHECK(bad == 0 && bad_model == 0, "%s %s%s T=%d N=%d K=%d: %d outputs off the oracle, %d off the model",
              ifk_isa_name(isas[p]), qt->name, lname, T, N, K, bad, bad_model);
        ifk_set_qx_mode(IFK_QX_DEFAULT);
        if (alt) { /* the F32-activation path below is the same in either mode */
            CHECK(pad_ok, "%s %s%s: wrote past N in a padded row of y", ifk_isa_name(isas[p]), qt->name, lname);
            continue;
        }
        /* the F32-activation path (ifk_set_qx_f32): the oracle up to float summation order */
        for (size_t i = 0; i < (size_t)T * ldy; i++)
            y[i] = -1.0f;
        ifk_set_qx_f32(1);
        ifk_qmatmul(y, ldy, layout ? (const void *)P : W, layout ? IFK_QPACKED + type : type, x, ldx, T, N, K, threads);
        ifk_set_qx_f32(0);
        int bad_f32 = 0;
        for (int t = 0; t < T; t++) {
            const float *xt = x + t * ldx;
            for (int n = 0; n < N; n++) {
                const float *wn = wd + (size_t)n * K;
                double mag = 0.0, r = ref[(size_t)t * ldy + n], v = y[(size_t)t * ldy + n];
                for (int k = 0; k < K; k++)
                    mag += fabs((double)wn[k] * xt[k]);
                double tol = 2e-6 * mag * (1 + K / 1024.0) + 1e-37;
                if (!(fabs(v - r) <= tol) && bad_f32++ < 3)
                    CHECK(0, "%s %s%s f32 x T=%d N=%d K=%d thr=%d: y[%d][%d] = %.9g, oracle %.9g, error %.3g > %.3g",
                          ifk_isa_name(isas[p]), qt->name, lname, T, N, K, threads, t, n, v, r, fabs(v - r), tol);
            }
            for (size_t n = (size_t)N; n < ldy; n++)
                pad_ok &= y[(size_t)t * ldy + n] == -1.0f;
        }
        CHECK(bad_f32 == 0, "%s %s%s f32 x T=%d N=%d K=%d: %d outputs off the oracle", ifk_isa_name(isas[p]),
              qt->name, lname, T, N, K, bad_f32);
        CHECK(pad_ok, "%s %s%s: wrote past N in a padded row of y", ifk_isa_name(isas[p]), qt->name, lname);
    }
    free(P);
    ifk_set_isa(IFK_ISA_AUTO);
    free(w);
    free(wd);
    free(W);
    free(x);
    free(ref);
    free(y);
}

static void test_qmatmul_paths(void)
{
    static const int Ks[] = { 172, 64, 96, 2049, 33, 32, 1, 1100 };
    static const int Ns[] = { 1, 3, 17, 37 };
    static const int Ts[] = { 1, 2, 3, 7, 17, 64 };
    for (int ti = 0; ti < N_TYPES; ti++)
        for (size_t a = 0; a < sizeof Ks / sizeof *Ks; a++)
            for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
                for (size_t c = 0; c < sizeof Ts / sizeof *Ts; c++) {
                    int K = Ks[a], N = Ns[b], T = Ts[c];
                    if ((double)T * N * K > 3e6 && !(N == 17 && T == 7))
                        continue; /* keep the oracle's time down; one large shape per K */
                    int pad = (int)(a + b + c) % 3 == 0 ? 5 : 0;
                    check_qmatmul(ti, T, N, K, (size_t)K + pad, (size_t)N + pad, (int)(a + c) % 3 + 1, 1.0f,
                                  (int)(a + b + c) % 2);
                }
    ifk_set_isa(IFK_ISA_AUTO);
}

/* Larger shapes with threads (the row split) and decode-sized rows. */
static void test_qmatmul_large(void)
{
    for (int ti = 0; ti < N_TYPES; ti++) {
        for (int outliers = 0; outliers < 2; outliers++) {
            check_qmatmul(ti, 1, 300, 2048, 2048, 300, 2, 1.0f, outliers);
            check_qmatmul(ti, 5, 64, 5632, 5632, 64, 2, 1.0f, outliers);
        }
    }
    printf("test_qkernels: max |y - oracle| / sum |w'x|, K >= 1024, normal data [with outliers]:");
    for (int p = 1; p < N_ISAS; p++) {
        if (ifk_set_isa(isas[p]) != isas[p])
            continue;
        printf("\n  %-7s", ifk_isa_name(isas[p]));
        for (int ti = 0; ti < N_TYPES; ti++)
            printf(" %s %.1e [%.1e]", ifk_qtype(all_types[ti])->name, worst_rel[0][p][ti], worst_rel[1][p][ti]);
        printf("\n  %-7s other mode (Q8 IFK_QX_INT16, Q6 and Q5 IFK_QX_INT8):", ifk_isa_name(isas[p]));
        for (int ti = 0; ti < N_TYPES; ti++)
            if (ifk_qx_x16(all_types[ti]))
                printf(" %s %.1e [%.1e]", ifk_qtype(all_types[ti])->name, worst_rel8[0][p][ti], worst_rel8[1][p][ti]);
    }
    printf("\n");
    ifk_set_isa(IFK_ISA_AUTO);
}

/* ---- (e) edge inputs through ifk_qmatmul ------------------------------------------------- */

static void test_qmatmul_edges(void)
{
    enum { N = 5, K = 130, T = 3 };
    for (int ti = 0; ti < N_TYPES; ti++) {
        int type = all_types[ti];
        const char *name = ifk_qtype(type)->name;
        size_t rb = ifk_qrow_bytes(type, K);
        uint8_t W[N * 300];
        float w[N * K], x[T * K], y[T * N];
        /* zero x, zero weights: exact zeros, no NaN */
        memset(x, 0, sizeof x);
        fill_weights(w, N * K, 1.0f, 1);
        for (int n = 0; n < N; n++)
            ifk_quantize_row(W + n * rb, type, w + n * K, K);
        for (int p = 0; p < N_ISAS; p++) {
            if (ifk_set_isa(isas[p]) != isas[p])
                continue;
            ifk_qmatmul(y, N, W, type, x, K, T, N, K, 1);
            int ok = 1;
            for (int i = 0; i < T * N; i++)
                ok &= y[i] == 0.0f;
            CHECK(ok, "%s %s: x = 0 gives y = 0", ifk_isa_name(isas[p]), name);
        }
        memset(w, 0, sizeof w);
        for (int n = 0; n < N; n++)
            ifk_quantize_row(W + n * rb, type, w + n * K, K);
        for (int i = 0; i < T * K; i++)
            x[i] = rnd_normal();
        for (int p = 0; p < N_ISAS; p++) {
            if (ifk_set_isa(isas[p]) != isas[p])
                continue;
            ifk_qmatmul(y, N, W, type, x, K, T, N, K, 1);
            int ok = 1;
            for (int i = 0; i < T * N; i++)
                ok &= y[i] == 0.0f;
            CHECK(ok, "%s %s: W = 0 gives y = 0", ifk_isa_name(isas[p]), name);
        }
        ifk_set_isa(IFK_ISA_AUTO);
        /* x of huge and of tiny magnitude; constant weight blocks; huge weights */
        for (int n = 0; n < N; n++)
            ifk_set_isa(IFK_ISA_AUTO);
        check_qmatmul(ti, 3, 7, 200, 200, 7, 1, 1e30f, 1);
        check_qmatmul(ti, 3, 7, 200, 200, 7, 1, 1e-30f, 1);
        check_qmatmul(ti, 2, 3, 100, 100, 3, 1, 1e-40f, 0); /* subnormal x: the model only */
    }
}

/* ---- (f) packed copies (qpack.h) ---------------------------------------------------------- */

/* Packing and unpacking give back the rows byte for byte; the rows of the last group past N are
 * zero bytes (they must add nothing). */
static void test_qpack_roundtrip(void)
{
    static const int shapes[][2] = { { 1, 64 }, { 16, 172 }, { 37, 2049 }, { 48, 32 }, { 5, 1 } };
    for (int type = IFK_Q8_B32; type < IFK_QTYPE_END_; type++) {
        if (ifk_qpack_base(IFK_QPACKED + type) != type)
            continue;
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            int N = shapes[s][0], K = shapes[s][1];
            size_t rb = ifk_qrow_bytes(type, K), pb = ifk_qpack_bytes(type, N, K);
            CHECK(pb == (size_t)((N + 15) / 16 * 16) * rb, "%s N=%d K=%d: packed bytes %zu", ifk_qtype(type)->name, N, K, pb);
            float *w = malloc((size_t)N * K * sizeof *w);
            uint8_t *W = malloc((size_t)N * rb), *P = malloc(pb), *U = malloc((size_t)N * rb);
            fill_weights(w, (size_t)N * K, 0.05f, 1);
            for (int n = 0; n < N; n++)
                ifk_quantize_row(W + n * rb, type, w + (size_t)n * K, K);
            memset(P, 0xA5, pb);
            ifk_qpack(P, W, type, N, K);
            ifk_qunpack_rows(U, P, IFK_QPACKED + type, 0, N, K);
            CHECK(!memcmp(U, W, (size_t)N * rb), "%s N=%d K=%d: unpack(pack(W)) != W", ifk_qtype(type)->name, N, K);
            if (N > 2) {
                ifk_qunpack_rows(U, P, IFK_QPACKED + type, 1, 3, K);
                CHECK(!memcmp(U, W + rb, 2 * rb), "%s N=%d K=%d: rows 1..2 unpacked alone", ifk_qtype(type)->name, N, K);
            }
            if (N % 16) { /* the padding rows of the last group: unpacked, all zero bytes */
                uint8_t *pad = calloc(rb, 1), *row = malloc(rb);
                int zero = 1;
                for (int n = N; n < (N + 15) / 16 * 16; n++) {
                    ifk_qunpack_rows(row, P, IFK_QPACKED + type, n, n + 1, K);
                    zero &= !memcmp(row, pad, rb);
                }
                CHECK(zero, "%s N=%d K=%d: padding rows are not zero", ifk_qtype(type)->name, N, K);
                free(pad);
                free(row);
            }
            free(w);
            free(W);
            free(P);
            free(U);
        }
    }
    CHECK(ifk_qpack_base(IFK_Q4_B64) == -1 && ifk_qpack_base(IFK_QPACKED + IFK_QTYPE_END_) == -1 &&
              ifk_qpack_base(IFK_QPACKED) == -1,
          "only packed codes of quantized types have a base");
}

/* The AVX2 and AVX512_VNNI kernels of packed Q4 and Q8 (qpack_avx2.c, qpack_avx512.c) carry out
 * qpack.h's arithmetic lane for lane, so on the same tiles and x they give the same bits: Q4 on
 * int8 x, Q8 on int16 x (the mode IFK_QX_INT16 on the VNNI path, the AVX2 path's only one). x is
 * uniform over the multiples of 1/256 in [-1, 1]: its block sums are then exact in F32 whatever
 * the order each path's quantize adds them in, and with K >= 256 no activation stands out enough
 * for the VNNI path's split (qimpl.h: 2 L). Every token tile of either kernel (T = 7) and decode,
 * 1 and 2 threads. Only where the CPU has both paths. */
static void test_qpack_avx2_bits(void)
{
#ifdef IFK_NO_SIMD
    return;
#else
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512vnni") || ifk_set_isa(IFK_ISA_AVX512) != IFK_ISA_AVX512) {
        ifk_set_isa(IFK_ISA_AUTO);
        return;
    }
    static const int types[] = { IFK_Q4_B32, IFK_Q4_B64, IFK_Q8_B32, IFK_Q8_B64 };
    static const int shapes[][3] = { { 7, 40, 320 }, { 1, 33, 2048 }, { 5, 16, 256 } }; /* T, N, K */
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (int threads = 1; threads <= 2; threads++) {
                const int type = types[ti], T = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                const size_t rb = ifk_qrow_bytes(type, K);
                float *w = malloc((size_t)N * K * sizeof *w), *x = malloc((size_t)T * K * sizeof *x);
                float *y2 = malloc((size_t)T * N * sizeof *y2), *y5 = malloc((size_t)T * N * sizeof *y5);
                uint8_t *W = malloc((size_t)N * rb), *P = malloc(ifk_qpack_bytes(type, N, K));
                fill_weights(w, (size_t)N * K, 0.05f, 1);
                for (int n = 0; n < N; n++)
                    ifk_quantize_row(W + n * rb, type, w + (size_t)n * K, K);
                ifk_qpack(P, W, type, N, K);
                for (size_t i = 0; i < (size_t)T * K; i++)
                    x[i] = (float)((int)(rnd_u32() % 511) - 255) / 256.0f;
                ifk_set_qx_mode(ifk_qx_x16(type) ? IFK_QX_INT16 : IFK_QX_DEFAULT);
                ifk_set_isa(IFK_ISA_AVX512);
                ifk_qmatmul(y5, (size_t)N, P, IFK_QPACKED + type, x, (size_t)K, T, N, K, threads);
                ifk_set_isa(IFK_ISA_AVX2);
                const int avx2_packed = ifk_qpath_packed(type);
                ifk_qmatmul(y2, (size_t)N, P, IFK_QPACKED + type, x, (size_t)K, T, N, K, threads);
                ifk_set_qx_mode(IFK_QX_DEFAULT);
                ifk_set_isa(IFK_ISA_AUTO);
                CHECK(avx2_packed, "%s: the AVX2 path has a packed kernel", ifk_qtype(type)->name);
                CHECK(!memcmp(y2, y5, (size_t)T * N * sizeof *y2), "%s T=%d N=%d K=%d thr=%d: AVX2 packed != AVX512 packed",
                      ifk_qtype(type)->name, T, N, K, threads);
                free(w);
                free(x);
                free(y2);
                free(y5);
                free(W);
                free(P);
            }
#endif
}

/* ---- (d) ifk_qget_row -------------------------------------------------------------------- */

static void test_qget_row(void)
{
    static const int Ks[] = { 172, 33, 2049, 64, 1 };
    for (int ti = 0; ti < N_TYPES; ti++) {
        int type = all_types[ti];
        const ifk_qtype_info *qt = ifk_qtype(type);
        for (size_t a = 0; a < sizeof Ks / sizeof *Ks; a++) {
            int K = Ks[a], N = 3;
            size_t rb = ifk_qrow_bytes(type, K);
            float *w = malloc((size_t)N * K * sizeof *w), *ref = malloc((size_t)K * sizeof *ref);
            float *out = malloc((size_t)(K + 1) * sizeof *out);
            uint8_t *W = malloc((size_t)N * rb);
            fill_weights(w, (size_t)N * K, 0.1f, 1);
            for (int n = 0; n < N; n++)
                ifk_quantize_row(W + n * rb, type, w + (size_t)n * K, K);
            for (int p = 0; p < N_ISAS; p++) {
                if (ifk_set_isa(isas[p]) != isas[p])
                    continue;
                for (int n = 0; n < N; n++) {
                    ifk_dequantize_row(ref, type, W + n * rb, K);
                    out[K] = 12345.0f;
                    ifk_qget_row(out, W, type, (size_t)n, K);
                    CHECK(memcmp(out, ref, (size_t)K * sizeof *out) == 0 && out[K] == 12345.0f,
                          "%s %s K=%d row %d: qget_row != dequantize_row", ifk_isa_name(isas[p]), qt->name, K, n);
                }
            }
            ifk_set_isa(IFK_ISA_AUTO);
            free(w);
            free(ref);
            free(out);
            free(W);
        }
    }
}

/* Q3H: the multiply-shift split of the 7-bit codes, exhaustively; then every (q[2i], q[2i+1])
 * pair through every path's unpacking (get_row) and product. */
static void test_q3h_codes(void)
{
    int bad = 0;
    for (int c = 0; c <= 120; c++)
        bad += (c * 5984) >> 16 != c / 11 || (c << 8) - 2815 * ((c * 5984) >> 16) != ((c % 11) << 8 | c / 11);
    CHECK(bad == 0, "c / 11 = mulhi(c, 5984) and (c << 8) - 2815 a = (b << 8) | a for c <= 120");
    enum { K = 4 * 64 };
    float w[K], ref[K], out[K];
    int pair = 0;
    for (int b = 0; b < 4; b++) {
        for (int i = 0; i < 32; i++, pair++) {
            int c = pair < 121 ? pair : 120 - pair % 121;
            w[b * 64 + 2 * i] = (float)(c / 11) - 5.0f;
            w[b * 64 + 2 * i + 1] = (float)(c % 11) - 5.0f;
        }
        w[b * 64] = -5.0f;  /* each block spans all 11 levels: delta 1, min -5 */
        w[b * 64 + 1] = 5.0f;
    }
    uint8_t W[4 * 32];
    ifk_quantize_row(W, IFK_Q3H_B64, w, K);
    ifk_dequantize_row(ref, IFK_Q3H_B64, W, K);
    CHECK(memcmp(ref, w, sizeof w) == 0, "Q3H reference round trip of all codes");
    for (int p = 0; p < N_ISAS; p++) {
        if (ifk_set_isa(isas[p]) != isas[p])
            continue;
        ifk_qget_row(out, W, IFK_Q3H_B64, 0, K);
        CHECK(memcmp(out, w, sizeof w) == 0, "%s: Q3H get_row of all codes", ifk_isa_name(isas[p]));
    }
    ifk_set_isa(IFK_ISA_AUTO);
}

/* qimpl.h's split: the AVX-512 pick against pick_ref (ties to the lower i, x copied with the
 * picked set to 0, their i ascending), on rows with ties, outliers and zeros. */
static void test_qsplit_pick(void)
{
#ifndef IFK_NO_SIMD
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) {
        printf("SKIP test_qsplit_pick: no AVX-512 here\n");
        return;
    }
    static const int Ks[] = {1, 2, 15, 16, 17, 63, 64, 100, 192, 576, 2049, 5632};
    int picks = 0, edge = 0;
    for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
        for (int k = 1; k <= 8; k++)
            for (int rep = 0; rep < 5; rep++) {
                const int K = Ks[ki];
                if (k > K)
                    continue;
                float *x = malloc((size_t)K * sizeof *x), *xm = malloc((size_t)K * sizeof *xm);
                char *picked = malloc((size_t)K);
                int32_t idx[8];
                float val[8];
                for (int i = 0; i < K; i++) {
                    float v = rnd_normal();
                    if (rep == 1) /* ties: few distinct magnitudes, both signs */
                        v = (float)((int)(rnd_u32() % 5) - 2);
                    if (rep == 2 && rnd_u32() % 50 == 0) /* outliers */
                        v *= 40.0f;
                    if (rep == 3 && i % 3) /* mostly zeros */
                        v = 0.0f;
                    if (rep == 4) /* the rule's edge: L = 1, one element at 2 L, one just under */
                        v = rnd_u32() % 2 ? 1.0f : -1.0f;
                    x[i] = v;
                }
                if (rep == 4 && K >= 32) {
                    x[K / 3] = -2.0f;
                    x[2 * K / 3] = nextafterf(2.0f, 0.0f);
                }
                ifk_avx512_qsplit_pick(x, K, k, xm, idx, val);
                const int n = pick_ref(x, K, k, picked);
                int ok = 1;
                for (int j = 0; j < n; j++) {
                    ok &= idx[j] >= 0 && idx[j] < K && picked[idx[j]] && val[j] == x[idx[j]];
                    ok &= j == 0 || idx[j] > idx[j - 1];
                }
                for (int j = n; j < k; j++) /* unused entries */
                    ok &= idx[j] == -1 && val[j] == 0.0f;
                picks += n;
                if (rep == 4 && K >= 32)
                    edge += idx[0] == K / 3 && (k == 1 || idx[1] == -1);
                for (int i = 0; i < K; i++)
                    ok &= xm[i] == (picked[i] ? 0.0f : x[i]);
                CHECK(ok, "qsplit pick K=%d k=%d rep %d: not the reference's outliers", K, k, rep);
                free(x);
                free(xm);
                free(picked);
            }
    CHECK(picks > 100, "qsplit pick: the rows with outliers gave %d picks", picks);
    CHECK(edge == 7 * 8, "qsplit pick: 2 L taken, just under 2 L left, in %d of 56 rows", edge);
#endif
}

int main(void)
{
    RUN(test_table2);
    RUN(test_table3_sizes);
    RUN(test_roundtrip_random);
    RUN(test_edge_blocks);
    RUN(test_all_levels);
    RUN(test_q3h_codes);
    RUN(test_qget_row);
    RUN(test_qpack_roundtrip);
    RUN(test_qpack_avx2_bits);
    RUN(test_qsplit_pick);
    RUN(test_qmatmul_edges);
    RUN(test_qmatmul_paths);
    RUN(test_qmatmul_large);
    return check_summary("test_qkernels");
}
