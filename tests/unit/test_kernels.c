/*
 * test_kernels.c -- the CPU kernels: the scalar reference against hand-computed values and
 * direct formulas, then every SIMD path this CPU has against the reference on random data of
 * awkward shapes (K not a multiple of the vector width, odd N, short token tails, padded
 * strides, pos0 > 0, contexts longer than the attention chunk, rows long enough for the
 * interleaved decode path and for several K chunks in prefill).
 *
 * Tolerances (SIMD vs reference; the reference accumulates dot products in double):
 *   matmul:                     |y - ref| <= 1e-5 * sum_k |w_k x_k|   (seen: 1.1e-7 * that sum)
 *   matmul on the BF16 dot product (F16 / BF16 weights where ifk_bf16_dot says so; kernels.h):
 *     against the reference on x and W rounded to BF16 (the products are then exact, so only
 *     the F32 sums err): |y - ref'| <= n 2^-24 * sum_k |w'_k x'_k|, n = 2 ceil(min(K, 2048) / 32)
 *     + ceil(K / 2048) + 5, the additions a product goes through plus the reference's own
 *     rounding (seen: 0.2 of that); against the reference on the original x and W:
 *     |y - ref| <= (u + u_w + u u_w) sum_k |w_k x_k| + that, u = 2^-8 (x's rounding), u_w =
 *     2^-8 for F16 and 0 for BF16 (seen: 0.7 of that; K = 1 comes close to the bound); both on
 *     the path and with ifk_set_qx_f32(1), which must give the F32 product's 1e-5 again;
 *   x rounded to BF16: bit-exact against iflow_f32_to_bf16 (subnormals to zero)
 *   attention output:           |o - ref| <= 2e-5 * max |v|           (seen: 4.2e-7 * max |v|)
 *   rmsnorm, softmax, silu_mul: |y - ref| <= 1e-6 * |ref| + 1e-30     (seen: 2.5e-7 * |ref|)
 *   vector exp:                 |e - exp| <= 2.5e-7 * exp              (seen: 8.4e-8, < 1 ulp)
 *   get_row, add:               bit-exact
 *   lowrank_up (a LoRA delta's b (a x)): bit-exact against its contract written out here (one
 *     fmaf chain per element in q order, then one add; iflow_f16_to_f32 for the weights) on
 *     every path, on 1 and 2 threads, with padded strides; and within 1e-6 of the double sum
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/quant.h"
#include "libcore/base/dtype.h"
#include "tests/unit/check.h"

/* ---- helpers ----------------------------------------------------------------------------- */


/* uniform in [lo, hi) */
static float rnd(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rnd_u32() & 0xffffff) / 16777216.0f;
}

static void fill(float *a, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        a[i] = rnd(lo, hi);
}

static size_t wsize(int wtype)
{
    return wtype == IFK_F32 ? 4 : 2;
}

/* Random weights of magnitude about 2^-6 .. 2^2 with random signs and mantissas; the F16 and
 * BF16 ones are drawn as bit patterns so no float->half conversion is needed. */
static void fill_w(void *W, int wtype, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t r = rnd_u32();
        if (wtype == IFK_F32)
            ((float *)W)[i] = rnd(-4.0f, 4.0f);
        else if (wtype == IFK_F16)  /* exponent field 9..17 */
            ((uint16_t *)W)[i] = (uint16_t)(((r & 1) << 15) | ((9 + (r >> 1) % 9) << 10) | ((r >> 8) & 0x3ff));
        else                        /* exponent field 121..129 */
            ((uint16_t *)W)[i] = (uint16_t)(((r & 1) << 15) | ((121 + (r >> 1) % 9) << 7) | ((r >> 8) & 0x7f));
    }
}

static float wval(const void *W, int wtype, size_t i)
{
    if (wtype == IFK_F32)
        return ((const float *)W)[i];
    if (wtype == IFK_F16)
        return ifk_f16_to_f32(((const uint16_t *)W)[i]);
    return ifk_bf16_to_f32(((const uint16_t *)W)[i]);
}

static const char *wname(int wtype)
{
    return wtype == IFK_F32 ? "f32" : wtype == IFK_F16 ? "f16" : "bf16";
}

static int n_isas(void)
{
    return ifk_isa_detect() + 1;
}

static const float GUARD = 12345.0f;

/* ---- reference, by hand ------------------------------------------------------------------ */

static void test_f16_bf16_conversion(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
        double want = e == 0 ? ldexp((double)m, -24) : e == 31 ? (m ? NAN : INFINITY)
                                                               : ldexp(1024.0 + m, (int)e - 25);
        if (s)
            want = -want;
        float got = ifk_f16_to_f32((uint16_t)h);
        if (isnan(want) ? !isnan(got) : (double)got != want || !signbit(got) != !signbit(want))
            bad++;
    }
    CHECK(bad == 0, "f16 -> f32: %d of 65536 wrong", bad);
    CHECK(ifk_bf16_to_f32(0x3f80) == 1.0f && ifk_bf16_to_f32(0xc040) == -3.0f &&
              ifk_bf16_to_f32(0x3e20) == 0.15625f && isinf(ifk_bf16_to_f32(0x7f80)),
          "bf16 -> f32 hand values");
}

static void test_ref_by_hand(void)
{
    ifk_set_isa(IFK_ISA_SCALAR);
    /* matmul: W = [[1 2 3] [4 5 6]], x = [[1 0 -1] [2 1 0]] -> y = [[-2 -2] [4 13]] */
    float W[6] = {1, 2, 3, 4, 5, 6}, x[6] = {1, 0, -1, 2, 1, 0}, y[4];
    ifk_matmul(y, 2, W, IFK_F32, x, 3, 2, 2, 3, 1);
    CHECK(y[0] == -2 && y[1] == -2 && y[2] == 4 && y[3] == 13, "matmul 2x3: %g %g %g %g", y[0], y[1], y[2], y[3]);
    uint16_t Wh[6] = {0x3c00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600}; /* 1..6 in F16 */
    uint16_t Wb[6] = {0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0}; /* 1..6 in BF16 */
    float yh[4], yb[4];
    ifk_matmul(yh, 2, Wh, IFK_F16, x, 3, 2, 2, 3, 1);
    ifk_matmul(yb, 2, Wb, IFK_BF16, x, 3, 2, 2, 3, 1);
    CHECK(!memcmp(y, yh, sizeof y) && !memcmp(y, yb, sizeof y), "matmul 2x3 f16/bf16");

    /* rmsnorm: x = [3 4], w = [1 2]: rms = sqrt(12.5) */
    float xr[2] = {3, 4}, wr[2] = {1, 2}, yr[2];
    ifk_rmsnorm(yr, xr, wr, 2, 0.0f);
    CHECK(fabsf(yr[0] - 3 / sqrtf(12.5f)) < 1e-6f && fabsf(yr[1] - 8 / sqrtf(12.5f)) < 1e-6f,
          "rmsnorm [3 4]: %g %g", yr[0], yr[1]);
    ifk_rmsnorm(xr, xr, wr, 2, 12.5f); /* in place, eps: rms = 5 */
    CHECK(fabsf(xr[0] - 0.6f) < 1e-6f && fabsf(xr[1] - 1.6f) < 1e-6f, "rmsnorm in place, eps");

    /* softmax: [0, ln 2, -inf-ish] -> [1/3, 2/3, 0]; huge inputs do not overflow */
    float s[3] = {0.0f, logf(2.0f), -1e30f};
    ifk_softmax(s, 3);
    CHECK(fabsf(s[0] - 1 / 3.0f) < 1e-7f && fabsf(s[1] - 2 / 3.0f) < 1e-7f && s[2] == 0.0f,
          "softmax [0 ln2]: %g %g %g", s[0], s[1], s[2]);
    float big[2] = {1000.0f, 1000.0f};
    ifk_softmax(big, 2);
    CHECK(big[0] == 0.5f && big[1] == 0.5f, "softmax of large equal values");

    /* silu_mul: silu(0) = 0, silu(1) = 1 / (1 + 1/e) */
    float g[3] = {0.0f, 1.0f, -1.0f}, u[3] = {5.0f, 2.0f, 1.0f};
    ifk_silu_mul(g, u, 3);
    CHECK(g[0] == 0.0f && fabsf(g[1] - 2.0f / (1.0f + expf(-1.0f))) < 1e-6f &&
              fabsf(g[2] + 1.0f / (1.0f + expf(1.0f))) < 1e-6f,
          "silu_mul: %g %g %g", g[0], g[1], g[2]);

    float a[3] = {1, 2, 3}, b[3] = {0.5f, -2, 4};
    ifk_add(a, b, 3);
    CHECK(a[0] == 1.5f && a[1] == 0 && a[2] == 7, "add");

    float row[3];
    ifk_get_row(row, W, IFK_F32, 1, 3);
    CHECK(row[0] == 4 && row[1] == 5 && row[2] == 6, "get_row f32");
    ifk_get_row(row, Wh, IFK_F16, 1, 3);
    CHECK(row[0] == 4 && row[1] == 5 && row[2] == 6, "get_row f16");
    ifk_get_row(row, Wb, IFK_BF16, 0, 3);
    CHECK(row[0] == 1 && row[1] == 2 && row[2] == 3, "get_row bf16");
    ifk_set_isa(IFK_ISA_AUTO);
}

/* The rotation of kernels.h, written out independently in double. */
static void rope_direct(double *out, const float *x, int n_heads, int hd, int rot, int pos,
                        double theta, const float *fs, int layout)
{
    for (int h = 0; h < n_heads; h++)
        for (int d = 0; d < hd; d++)
            out[h * hd + d] = x[h * hd + d];
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < rot / 2; i++) {
            double ang = pos * pow(theta, -(double)(2 * i) / rot) * (fs ? fs[i] : 1.0);
            int a = layout == IFK_ROPE_HALF ? i : 2 * i, b = layout == IFK_ROPE_HALF ? i + rot / 2 : 2 * i + 1;
            double x0 = x[h * hd + a], x1 = x[h * hd + b];
            out[h * hd + a] = x0 * cos(ang) - x1 * sin(ang);
            out[h * hd + b] = x0 * sin(ang) + x1 * cos(ang);
        }
}

static void test_rope(void)
{
    enum { H = 3, HD = 24 };
    float x[H * HD], y[H * HD], fs[HD / 2];
    double want[H * HD];
    fill(x, H * HD, -2, 2);
    fill(fs, HD / 2, 0.25f, 1.0f);
    for (int layout = 0; layout < 2; layout++) {
        memcpy(y, x, sizeof x);
        ifk_rope(y, H, HD, HD, 0, 10000.0f, NULL, layout);
        CHECK(!memcmp(x, y, sizeof x), "rope at pos 0 is the identity (layout %d)", layout);
        static const int rots[] = {HD, 16, 8};
        static const int poss[] = {1, 7, 1000, 32767};
        for (int ri = 0; ri < 3; ri++)
            for (int pi = 0; pi < 4; pi++)
                for (int use_fs = 0; use_fs < 2; use_fs++) {
                    int rot = rots[ri], pos = poss[pi];
                    memcpy(y, x, sizeof x);
                    ifk_rope(y, H, HD, rot, pos, 10000.0f, use_fs ? fs : NULL, layout);
                    rope_direct(want, x, H, HD, rot, pos, 10000.0, use_fs ? fs : NULL, layout);
                    double err = 0;
                    int untouched = 1;
                    for (int i = 0; i < H * HD; i++) {
                        double e = fabs(y[i] - want[i]);
                        err = e > err ? e : err;
                        if (i % HD >= rot && y[i] != x[i])
                            untouched = 0;
                    }
                    CHECK(err < 1e-6, "rope layout %d rot %d pos %d fs %d: max err %g", layout, rot, pos, use_fs, err);
                    CHECK(untouched, "rope layout %d rot %d: dims past rot_dim changed", layout, rot);
                }
    }
    /* layout is about which dims pair up: HALF pairs (0, rot/2), INTERLEAVED pairs (0, 1) */
    float e[4] = {1, 0, 0, 0};
    ifk_rope(e, 1, 4, 4, 1, 10000.0f, NULL, IFK_ROPE_HALF);
    CHECK(fabsf(e[0] - cosf(1)) < 1e-7f && e[1] == 0 && fabsf(e[2] - sinf(1)) < 1e-7f && e[3] == 0,
          "rope half: e0 -> (cos 1, 0, sin 1, 0): %g %g %g %g", e[0], e[1], e[2], e[3]);
    float f[4] = {1, 0, 0, 0};
    ifk_rope(f, 1, 4, 4, 1, 10000.0f, NULL, IFK_ROPE_INTERLEAVED);
    CHECK(fabsf(f[0] - cosf(1)) < 1e-7f && fabsf(f[1] - sinf(1)) < 1e-7f && f[2] == 0 && f[3] == 0,
          "rope interleaved: e0 -> (cos 1, sin 1, 0, 0): %g %g %g %g", f[0], f[1], f[2], f[3]);
}

/* out = softmax(scale K q) V written out in double, for one query against n keys. */
static void attend_direct(double *out, const float *q, const float *k, const float *v, size_t ld,
                          int n, int hd, double scale)
{
    double m = -INFINITY, sum = 0;
    double *s = malloc((size_t)n * sizeof *s);
    for (int j = 0; j < n; j++) {
        s[j] = 0;
        for (int d = 0; d < hd; d++)
            s[j] += (double)q[d] * k[j * ld + d];
        s[j] *= scale;
        m = s[j] > m ? s[j] : m;
    }
    for (int d = 0; d < hd; d++)
        out[d] = 0;
    for (int j = 0; j < n; j++) {
        double e = exp(s[j] - m);
        sum += e;
        for (int d = 0; d < hd; d++)
            out[d] += e * v[j * ld + d];
    }
    for (int d = 0; d < hd; d++)
        out[d] /= sum;
    free(s);
}

static void test_attention_ref(void)
{
    ifk_set_isa(IFK_ISA_SCALAR);
    /* one key: the output is that key's V row, whatever q is */
    float q[8], k[8], v[8], out[8];
    fill(q, 8, -3, 3);
    fill(k, 8, -3, 3);
    fill(v, 8, -3, 3);
    ifk_attention(out, q, k, v, 8, 1, 0, 2, 1, 4, 0.5f, 1);
    CHECK(fabsf(out[0] - v[0]) < 1e-6f && fabsf(out[3] - v[3]) < 1e-6f && fabsf(out[4] - v[0]) < 1e-6f &&
              fabsf(out[7] - v[3]) < 1e-6f,
          "attention with one key returns V (both query heads read kv head 0)");
    /* against the double formula, with scores large enough to overflow expf unless the max is
     * subtracted; GQA 4 query heads over 2 kv heads; pos0 > 0; padded cache rows */
    enum { T = 3, P0 = 5, NH = 4, NKV = 2, HD = 6, LD = NKV * HD + 3 };
    float Q[T * NH * HD], Kc[(P0 + T) * LD], Vc[(P0 + T) * LD], O[T * NH * HD];
    fill(Q, T * NH * HD, -6, 6);
    fill(Kc, (P0 + T) * LD, -6, 6);
    fill(Vc, (P0 + T) * LD, -2, 2);
    ifk_attention(O, Q, Kc, Vc, LD, T, P0, NH, NKV, HD, 2.0f, 2);
    double err = 0, want[HD];
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            int g = h / (NH / NKV);
            attend_direct(want, Q + (t * NH + h) * HD, Kc + g * HD, Vc + g * HD, LD, P0 + t + 1, HD, 2.0);
            for (int d = 0; d < HD; d++) {
                double e = fabs(O[(t * NH + h) * HD + d] - want[d]);
                err = e > err ? e : err;
            }
        }
    CHECK(err < 2e-5, "reference attention vs double formula: max err %g", err);
    ifk_set_isa(IFK_ISA_AUTO);
}

/* ---- SIMD paths against the reference ---------------------------------------------------- */

static void test_isa_selection(void)
{
    int best = ifk_isa_detect();
    CHECK(ifk_set_isa(IFK_ISA_SCALAR) == IFK_ISA_SCALAR, "scalar can always be chosen");
    CHECK(ifk_set_isa(IFK_ISA_AMX + 1) == IFK_ISA_SCALAR, "an unknown path is refused");
    CHECK(ifk_set_isa(IFK_ISA_AUTO) == best, "auto restores %s", ifk_isa_name(best));
    CHECK(!strcmp(ifk_isa_name(IFK_ISA_AVX2), "avx2") && !strcmp(ifk_isa_name(IFK_ISA_AVX512), "avx512") &&
              !strcmp(ifk_isa_name(IFK_ISA_AVX512GFNI), "avx512gfni") && !strcmp(ifk_isa_name(IFK_ISA_AMX), "amx"),
          "isa names");
    printf("test_kernels: this CPU's best path: %s\n", ifk_isa_name(best));
}

#ifndef IFK_NO_SIMD
static void test_vector_exp(void)
{
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    for (int i = 0; i < N; i++)
        x[i] = -87.0f + 175.5f * (float)i / N; /* -87 .. 88.5, normal results only */
    for (int isa = IFK_ISA_AVX2; isa < n_isas(); isa++) {
        if (isa == IFK_ISA_AVX2)
            ifk_avx2_exp(y, x, N);
        else
            ifk_avx512_exp(y, x, N);
        double worst = 0;
        for (int i = 0; i < N; i++) {
            double want = exp((double)x[i]), e = fabs(y[i] - want) / want;
            worst = e > worst ? e : worst;
        }
        CHECK(worst < 2.5e-7, "%s exp: max relative error %.3g", ifk_isa_name(isa), worst);
        printf("test_kernels: %s vector exp max relative error %.3g\n", ifk_isa_name(isa), worst);
        float sp[6] = {-INFINITY, -120.0f, -100.0f, 89.0f, INFINITY, NAN}, sy[6];
        if (isa == IFK_ISA_AVX2)
            ifk_avx2_exp(sy, sp, 6);
        else
            ifk_avx512_exp(sy, sp, 6);
        CHECK(sy[0] == 0 && sy[1] == 0 && fabs(sy[2] - exp(-100.0)) < 1e-45 && isinf(sy[3]) && isinf(sy[4]) &&
                  isnan(sy[5]),
              "%s exp special values: %g %g %g %g %g %g", ifk_isa_name(isa), sy[0], sy[1], sy[2], sy[3], sy[4], sy[5]);
    }
    free(x);
    free(y);
}
#endif

/* Per output of y = x W^T (W: [N][K] of wt, x: [T][ldx]): sum_k |w_k x_k| into sabs ([T][N]). */
static void abs_sums(double *sabs, const void *W, int wt, const float *x, size_t ldx, int T, int N, int K)
{
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += fabs((double)wval(W, wt, (size_t)n * K + k) * x[t * ldx + k]);
            sabs[t * N + n] = s;
        }
}

/* The inputs of the BF16 dot product as the kernel sees them: W rounded to BF16 (wb: [N][K]) and
 * x rounded to BF16, as F32 values (xr: [T][ldx]), both to nearest even by libcore's converter. */
static void round_inputs(uint16_t *wb, float *xr, const void *W, int wt, const float *x, size_t ldx, int T, int N,
                         int K)
{
    for (size_t i = 0; i < (size_t)N * K; i++)
        wb[i] = wt == IFK_BF16 ? ((const uint16_t *)W)[i] : iflow_f32_to_bf16(wval(W, wt, i));
    for (size_t i = 0; i < (size_t)T * ldx; i++)
        xr[i] = iflow_bf16_to_f32(iflow_f32_to_bf16(x[i]));
}

/* Counts the outputs with |y - ref| > tol_rel * sabs + 1e-30 (and the worst ratio); y: [T][ldy]
 * with a guard past N that must hold GUARD. */
static int count_bad(const float *y, const float *ref, size_t ldy, const double *sabs, double tol_rel, int T, int N,
                     double *worst, int *guard_ok)
{
    int bad = 0;
    for (int t = 0; t < T; t++) {
        for (int n = 0; n < N; n++) {
            double e = fabs((double)y[t * ldy + n] - ref[t * ldy + n]) / (tol_rel * sabs[t * N + n] + 1e-30);
            *worst = e > *worst ? e : *worst;
            bad += !(e <= 1.0);
        }
        for (size_t n = (size_t)N; n < ldy; n++)
            *guard_ok &= y[t * ldy + n] == GUARD;
    }
    return bad;
}

/* The packed copy of an F16 / BF16 matrix (qpack.h's pairs; fpack_avx512bf16.c): unpacked it
 * gives back W's bytes; its product against the same references as the row layout's, with the
 * bound of one chain per output (K additions: kernels.h's gamma for a chain of K), on every
 * path (the exact product unpacks it). loose: scratch. */
static void check_packed(const void *W, int wt, const float *x, size_t ldx, float *y, size_t ldy, const float *yr,
                         const float *yrr, const double *sabs, const double *sabs_r, double *loose, int T, int N, int K,
                         int *bf16_seen)
{
    static const int threads[] = {1, 2, 0};
    const int pt = IFK_QPACKED + wt;
    void *P = malloc(ifk_qpack_bytes(wt, N, K)), *back = malloc((size_t)N * K * 2);
    ifk_qpack(P, W, wt, N, K);
    ifk_qunpack_rows(back, P, pt, 0, N, K);
    CHECK(memcmp(back, W, (size_t)N * K * 2) == 0, "%s N=%d K=%d: packed and unpacked, not W", wname(wt), N, K);
    if (N > 3) { /* rows from the middle of a group */
        ifk_qunpack_rows(back, P, pt, 3, N, K);
        CHECK(memcmp(back, (const uint16_t *)W + 3 * (size_t)K, (size_t)(N - 3) * K * 2) == 0,
              "%s N=%d K=%d: rows 3.. unpacked", wname(wt), N, K);
    }
    const double gamma = (K + 6.0) * 0x1p-24, u = 0x1p-8, uw = wt == IFK_F16 ? u : 0;
    for (size_t i = 0; i < (size_t)T * N; i++)
        loose[i] = (u + uw + u * uw) * sabs[i] + gamma * sabs_r[i];
    for (int isa = IFK_ISA_SCALAR; isa < n_isas(); isa++) {
        ifk_set_isa(isa);
        for (int exact = 0; exact <= 1; exact++) {
            ifk_set_qx_f32(exact);
            const int bf16 = ifk_bf16_dot(wt);
            *bf16_seen += bf16;
            for (int ti = 0; ti < 3; ti++) {
                for (size_t i = 0; i < (size_t)T * ldy; i++)
                    y[i] = GUARD;
                ifk_matmul(y, ldy, P, pt, x, ldx, T, N, K, threads[ti]);
                int guard_ok = 1, bad;
                double worst = 0;
                if (!bf16) {
                    bad = count_bad(y, yr, ldy, sabs, 1e-5, T, N, &worst, &guard_ok);
                } else {
                    bad = count_bad(y, yrr, ldy, sabs_r, gamma, T, N, &worst, &guard_ok);
                    bad += count_bad(y, yr, ldy, loose, 1.0, T, N, &worst, &guard_ok);
                }
                CHECK(bad == 0 && guard_ok,
                      "matmul %s %s packed (%s) T=%d N=%d K=%d threads=%d: %d wrong, worst %.3g x tol%s",
                      ifk_isa_name(isa), wname(wt), bf16 ? "bf16 dot" : "f32", T, N, K, threads[ti], bad, worst,
                      guard_ok ? "" : ", wrote past N");
            }
        }
        ifk_set_qx_f32(0);
    }
    free(P);
    free(back);
}

static void test_matmul(void)
{
    static const int shapes[][3] = { /* T, N, K */
        {1, 1, 1}, {1, 7, 8}, {1, 33, 172}, {1, 17, 2049}, {1, 64, 256}, {1, 5, 15},
        {3, 9, 172}, {2, 4, 16}, {17, 37, 100}, {64, 40, 33}, {5, 70, 1100}, {64, 67, 2049},
        {17, 3, 1}, {4, 129, 520}, {1, 37, 4099}, {1, 16, 6000}, {2, 21, 4500},
        {7, 19, 1057}, {2, 45, 31}, {3, 35, 2048}, {7, 50, 1024}, {64, 33, 95}};
    static const int threads[] = {1, 2, 0};
    int bf16_seen = 0;
    double seen_r = 0, seen = 0; /* the worst BF16 errors, as fractions of their bounds */
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int T = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        size_t ldx = (size_t)K + 3, ldy = (size_t)N + 5;
        float *x = malloc((size_t)T * ldx * sizeof *x), *xr = malloc((size_t)T * ldx * sizeof *xr);
        float *yr = malloc((size_t)T * ldy * sizeof *yr), *y = malloc((size_t)T * ldy * sizeof *y);
        float *yrr = malloc((size_t)T * ldy * sizeof *yrr);
        double *sabs = malloc((size_t)T * N * sizeof *sabs), *sabs_r = malloc((size_t)T * N * sizeof *sabs_r);
        double *loose = malloc((size_t)T * N * sizeof *loose);
        uint16_t *wb = malloc((size_t)N * K * sizeof *wb);
        fill(x, (size_t)T * ldx, -1, 1);
        /* the additions a product goes through in the BF16 dot product, and the reference's rounding */
        const int chunk = K < 2048 ? K : 2048;
        const double gamma = (2.0 * ((chunk + 31) / 32) + (K + 2047) / 2048 + 5) * 0x1p-24;
        for (int wt = IFK_F32; wt <= IFK_BF16; wt++) {
            void *W = malloc((size_t)N * K * wsize(wt));
            fill_w(W, wt, (size_t)N * K);
            abs_sums(sabs, W, wt, x, ldx, T, N, K);
            ifk_set_isa(IFK_ISA_SCALAR);
            ifk_matmul(yr, ldy, W, wt, x, ldx, T, N, K, 1);
            /* the reference on the rounded inputs, for the BF16 dot product */
            round_inputs(wb, xr, W, wt, x, ldx, T, N, K);
            abs_sums(sabs_r, wb, IFK_BF16, xr, ldx, T, N, K);
            ifk_matmul(yrr, ldy, wb, IFK_BF16, xr, ldx, T, N, K, 1);
            /* the same bound in terms of the original inputs: the accuracy kernels.h states */
            const double u = 0x1p-8, uw = wt == IFK_F16 ? u : 0;
            for (size_t i = 0; i < (size_t)T * N; i++)
                loose[i] = (u + uw + u * uw) * sabs[i] + gamma * sabs_r[i];
            for (int isa = IFK_ISA_SCALAR; isa < n_isas(); isa++) {
                ifk_set_isa(isa);
                const int has_bf16 = ifk_bf16_dot(wt);
                for (int exact = 0; exact <= has_bf16; exact++) { /* ifk_set_qx_f32(1): the F32 product */
                    ifk_set_qx_f32(exact);
                    const int bf16 = ifk_bf16_dot(wt);
                    CHECK(bf16 == (has_bf16 && !exact), "ifk_set_qx_f32(%d) leaves the bf16 dot product %s", exact,
                          bf16 ? "on" : "off");
                    bf16_seen += bf16;
                    for (int ti = 0; ti < 3; ti++) {
                        for (size_t i = 0; i < (size_t)T * ldy; i++)
                            y[i] = GUARD;
                        ifk_matmul(y, ldy, W, wt, x, ldx, T, N, K, threads[ti]);
                        int guard_ok = 1;
                        double worst = 0, worst_r = 0;
                        const char *how = bf16 ? "bf16 dot" : "f32";
                        if (!bf16) {
                            int bad = count_bad(y, yr, ldy, sabs, 1e-5, T, N, &worst, &guard_ok);
                            CHECK(bad == 0, "matmul %s %s (%s) T=%d N=%d K=%d threads=%d: %d wrong, worst %.3g x tol",
                                  ifk_isa_name(isa), wname(wt), how, T, N, K, threads[ti], bad, worst);
                        } else {
                            int bad_r = count_bad(y, yrr, ldy, sabs_r, gamma, T, N, &worst_r, &guard_ok);
                            CHECK(bad_r == 0,
                                  "matmul %s %s (%s) T=%d N=%d K=%d threads=%d: %d wrong against the rounded inputs, "
                                  "worst %.3g x tol", ifk_isa_name(isa), wname(wt), how, T, N, K, threads[ti], bad_r,
                                  worst_r);
                            int bad = count_bad(y, yr, ldy, loose, 1.0, T, N, &worst, &guard_ok);
                            seen_r = worst_r > seen_r ? worst_r : seen_r;
                            seen = worst > seen ? worst : seen;
                            CHECK(bad == 0, "matmul %s %s (%s) T=%d N=%d K=%d threads=%d: %d wrong, worst %.3g x tol",
                                  ifk_isa_name(isa), wname(wt), how, T, N, K, threads[ti], bad, worst);
                        }
                        CHECK(guard_ok, "matmul %s %s (%s) T=%d N=%d K=%d: wrote past N", ifk_isa_name(isa), wname(wt),
                              how, T, N, K);
                    }
                }
                ifk_set_qx_f32(0);
            }
            if (wt != IFK_F32)
                check_packed(W, wt, x, ldx, y, ldy, yr, yrr, sabs, sabs_r, loose, T, N, K, &bf16_seen);
            free(W);
        }
        free(x);
        free(xr);
        free(yr);
        free(yrr);
        free(y);
        free(sabs);
        free(sabs_r);
        free(loose);
        free(wb);
    }
    ifk_set_isa(IFK_ISA_AUTO);
    printf("test_kernels: %d products checked on the BF16 dot product%s; worst error %.3g of its bound on the "
           "rounded inputs, %.3g on the original ones\n", bf16_seen * 3, bf16_seen ? "" : " (this CPU has no AVX512_BF16)",
           seen_r, seen);
}

#ifndef IFK_NO_SIMD
/* x rounded to BF16 for the BF16 dot product: to nearest even (ties both ways), bit for bit as
 * libcore's iflow_f32_to_bf16, except that F32 subnormals become a zero of their sign; NaN stays
 * a quiet NaN; zeros from K to the padded row length. */
static void test_bf16_round(void)
{
    ifk_set_isa(IFK_ISA_AUTO);
    if (!ifk_bf16_dot(IFK_BF16)) {
        printf("test_kernels: no AVX512_BF16 here: the rounding of x is not tested\n");
        return;
    }
    enum { T = 3, K = 77, LDX = 80, LDXB = 96 };
    static const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f808001u, 0x7f7fffffu, 0x7f800000u,
                                       0xff800000u, 0x7fc00001u, 0x7f800001u, 0x00000001u, 0x807fffffu, 0x00800000u,
                                       0x80000000u, 0x477fe000u, 0x3f7fffffu};
    float x[T * LDX];
    uint16_t xb[T * LDXB];
    for (int i = 0; i < T * LDX; i++) {
        uint32_t b = i < (int)(sizeof special / sizeof *special) ? special[i] : rnd_u32();
        memcpy(&x[i], &b, 4);
    }
    memset(xb, 0xAB, sizeof xb);
    ifk_avx512bf16_round_x(xb, LDXB, x, LDX, T, K);
    int bad = 0;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < LDXB; k++) {
            uint32_t b = 0;
            if (k < K)
                memcpy(&b, &x[t * LDX + k], 4);
            uint16_t want = k >= K                                ? 0
                            : (b & 0x7f800000u) == 0 && (b << 1) ? (uint16_t)(b >> 16 & 0x8000)
                                                                  : iflow_f32_to_bf16(x[t * LDX + k]);
            if (xb[t * LDXB + k] != want && bad++ < 3)
                CHECK(0, "bf16 rounding of x[%d][%d] = 0x%08x: 0x%04x, want 0x%04x", t, k, (unsigned)b,
                      xb[t * LDXB + k], want);
        }
    CHECK(bad == 0, "bf16 rounding of x: %d of %d wrong", bad, T * LDXB);
}
#endif

static void test_get_row(void)
{
    /* every F16 and BF16 bit pattern, as one row of 65536; then rows of awkward length */
    uint16_t *all = malloc(65536 * sizeof *all);
    float *want = malloc(65536 * sizeof *want), *got = malloc(65536 * sizeof *got);
    for (int i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    for (int wt = IFK_F16; wt <= IFK_BF16; wt++) {
        ifk_set_isa(IFK_ISA_SCALAR);
        ifk_get_row(want, all, wt, 0, 65536);
        for (int isa = IFK_ISA_AVX2; isa < n_isas(); isa++) {
            ifk_set_isa(isa);
            ifk_get_row(got, all, wt, 0, 65536);
            int bad = 0;
            for (int i = 0; i < 65536; i++)
                bad += isnan(want[i]) ? !isnan(got[i]) : memcmp(&want[i], &got[i], 4) != 0;
            CHECK(bad == 0, "get_row %s %s: %d of 65536 bit patterns differ", ifk_isa_name(isa), wname(wt), bad);
        }
    }
    static const int Ks[] = {1, 7, 16, 33, 2049};
    for (int wt = IFK_F32; wt <= IFK_BF16; wt++)
        for (int ki = 0; ki < 5; ki++) {
            int K = Ks[ki];
            void *W = malloc((size_t)3 * K * wsize(wt));
            fill_w(W, wt, (size_t)3 * K);
            ifk_set_isa(IFK_ISA_SCALAR);
            ifk_get_row(want, W, wt, 2, K);
            for (int isa = IFK_ISA_AVX2; isa < n_isas(); isa++) {
                ifk_set_isa(isa);
                for (int i = 0; i <= K; i++)
                    got[i] = GUARD;
                ifk_get_row(got, W, wt, 2, K);
                CHECK(!memcmp(got, want, (size_t)K * 4) && got[K] == GUARD, "get_row %s %s K=%d",
                      ifk_isa_name(isa), wname(wt), K);
            }
            free(W);
        }
    free(all);
    free(want);
    free(got);
    ifk_set_isa(IFK_ISA_AUTO);
}

/* max over i of |a - b| / (rel |b| + 1e-30), which must be <= 1 */
static double rel_excess(const float *a, const float *b, int n, double rel)
{
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]) / (rel * fabs(b[i]) + 1e-30);
        worst = e > worst || isnan(e) ? e : worst;
    }
    return worst;
}

static void test_elementwise(void)
{
    static const int ns[] = {1, 7, 8, 16, 17, 100, 2048, 2049, 32003};
    enum { MAXN = 32003 + 1 };
    float *x = malloc(MAXN * sizeof *x), *u = malloc(MAXN * sizeof *u), *w = malloc(MAXN * sizeof *w);
    float *r = malloc(MAXN * sizeof *r), *y = malloc(MAXN * sizeof *y);
    for (int ni = 0; ni < 9; ni++) {
        int n = ns[ni];
        fill(x, (size_t)n, -3, 3);
        fill(u, (size_t)n, -2, 2);
        fill(w, (size_t)n, 0.5f, 1.5f);
        x[0] = n > 1 ? 60.0f : x[0];           /* silu far out on both sides, large logits */
        x[n - 1] = n > 2 ? -95.0f : x[n - 1];
        for (int isa = IFK_ISA_AVX2; isa < n_isas(); isa++) {
            const char *nm = ifk_isa_name(isa);
            /* rmsnorm */
            ifk_set_isa(IFK_ISA_SCALAR);
            ifk_rmsnorm(r, x, w, n, 1e-5f);
            ifk_set_isa(isa);
            y[n] = GUARD;
            ifk_rmsnorm(y, x, w, n, 1e-5f);
            CHECK(rel_excess(y, r, n, 1e-6) <= 1 && y[n] == GUARD, "rmsnorm %s n=%d: %.3g x tol", nm, n,
                  rel_excess(y, r, n, 1e-6));
            /* softmax */
            ifk_set_isa(IFK_ISA_SCALAR);
            memcpy(r, x, (size_t)n * 4);
            ifk_softmax(r, n);
            ifk_set_isa(isa);
            memcpy(y, x, (size_t)n * 4);
            ifk_softmax(y, n);
            double sum = 0;
            for (int i = 0; i < n; i++)
                sum += y[i];
            CHECK(rel_excess(y, r, n, 1e-6) <= 1 && fabs(sum - 1) < 1e-5, "softmax %s n=%d: %.3g x tol, sum %.9g",
                  nm, n, rel_excess(y, r, n, 1e-6), sum);
            /* silu_mul */
            ifk_set_isa(IFK_ISA_SCALAR);
            memcpy(r, x, (size_t)n * 4);
            ifk_silu_mul(r, u, n);
            ifk_set_isa(isa);
            memcpy(y, x, (size_t)n * 4);
            y[n] = GUARD;
            ifk_silu_mul(y, u, n);
            CHECK(rel_excess(y, r, n, 1e-6) <= 1 && y[n] == GUARD, "silu_mul %s n=%d: %.3g x tol", nm, n,
                  rel_excess(y, r, n, 1e-6));
            /* add: exact */
            for (int i = 0; i < n; i++)
                r[i] = x[i] + u[i];
            memcpy(y, x, (size_t)n * 4);
            y[n] = GUARD;
            ifk_add(y, u, n);
            CHECK(!memcmp(y, r, (size_t)n * 4) && y[n] == GUARD, "add %s n=%d", nm, n);
        }
    }
    free(x);
    free(u);
    free(w);
    free(r);
    free(y);
    ifk_set_isa(IFK_ISA_AUTO);
}

static void test_lowrank_up(void)
{
    static const int Ns[] = {1, 7, 8, 17, 63, 64, 65, 200, 5000, 5632}, rs[] = {1, 4, 16, 64};
    enum { MAXT = 3, LDT = 70, PAD = 5 };
    const size_t ysize = sizeof(float) * MAXT * (5632 + PAD);
    float t[MAXT * LDT], *y0 = malloc(ysize), *y = malloc(ysize), *want = malloc(ysize);
    uint16_t *bt = malloc(sizeof(uint16_t) * 64 * 5632);
    for (int ni = 0; ni < 10; ni++)
        for (int ri = 0; ri < 4; ri++)
            for (int T = 1; T <= MAXT; T += 2) {
                const int N = Ns[ni], r = rs[ri];
                const size_t ldy = (size_t)N + PAD, ldt = ri % 2 ? (size_t)r : LDT;
                fill(t, MAXT * LDT, -2, 2);
                fill(y0, (size_t)MAXT * ldy, -1, 1);
                for (size_t k = 0; k < (size_t)r * N; k++)
                    bt[k] = iflow_f32_to_f16(rnd(-0.5f, 0.5f));
                double worst = 0;
                for (int i = 0; i < T; i++)
                    for (int n = 0; n < N; n++) {
                        float acc = 0.0f;
                        double d = 0, mag = 0;
                        for (int q = 0; q < r; q++) {
                            const float b = iflow_f16_to_f32(bt[ifk_lr_at((size_t)n, (size_t)q, (size_t)N, (size_t)r)]);
                            const float v = t[(size_t)i * ldt + q];
                            acc = fmaf(v, b, acc);
                            d += (double)v * b, mag += fabs((double)v * b);
                        }
                        want[(size_t)i * ldy + n] = y0[(size_t)i * ldy + n] + acc;
                        worst = fmax(worst, fabs(acc - d) / (mag + 1e-30));
                    }
                CHECK(worst <= 1e-6, "N=%d r=%d: the contract's sums within 1e-6 of double (%.3g)", N, r, worst);
                for (int isa = IFK_ISA_SCALAR; isa < n_isas(); isa++)
                    for (int nt = 1; nt <= 2; nt++) {
                        ifk_set_isa(isa);
                        memcpy(y, y0, sizeof(float) * (size_t)MAXT * ldy);
                        ifk_lowrank_up(y, ldy, bt, t, ldt, T, N, r, nt);
                        int same = 1;
                        for (int i = 0; i < MAXT; i++)
                            for (size_t n = 0; n < ldy; n++) { /* the padding and rows past T untouched */
                                const float *w = i < T && n < (size_t)N ? want : y0;
                                same &= memcmp(&y[i * ldy + n], &w[i * ldy + n], sizeof(float)) == 0;
                            }
                        CHECK(same, "lowrank_up %s, %d thread(s): N=%d r=%d T=%d, bit-exact", ifk_isa_name(isa), nt, N,
                              r, T);
                    }
            }
    ifk_set_isa(IFK_ISA_AUTO);
    free(y0);
    free(y);
    free(want);
    free(bt);
}

static void test_attention(void)
{
    static const int cases[][5] = { /* T, pos0, n_heads, n_kv_heads, head_dim */
        {1, 0, 4, 4, 64}, {3, 5, 8, 2, 64}, {17, 0, 6, 1, 80}, {1, 600, 4, 2, 64},
        {5, 1100, 2, 1, 128}, {4, 3, 3, 3, 8}, {2, 9, 2, 2, 1}, {64, 0, 4, 2, 17}, {1, 2047, 2, 2, 64}};
    static const int threads[] = {1, 2, 0};
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        int T = cases[ci][0], P0 = cases[ci][1], NH = cases[ci][2], NKV = cases[ci][3], HD = cases[ci][4];
        size_t qld = (size_t)NH * HD, kv_ld = (size_t)NKV * HD + 7;
        size_t rows = (size_t)P0 + T;
        float *q = malloc((size_t)T * qld * sizeof *q), *k = malloc(rows * kv_ld * sizeof *k);
        float *v = malloc(rows * kv_ld * sizeof *v);
        float *ref = malloc((size_t)T * qld * sizeof *ref), *out = malloc((size_t)T * qld * sizeof *out);
        fill(q, (size_t)T * qld, -1, 1);
        fill(k, rows * kv_ld, -1, 1);
        fill(v, rows * kv_ld, -2, 2);
        /* a few cache rows with big scores, so that later chunks raise the running max */
        for (size_t j = 0; j < rows; j += 97)
            for (int c = 0; c < NKV * HD; c++)
                k[j * kv_ld + c] *= 6.0f;
        float scale = 3.0f / sqrtf((float)HD);
        ifk_set_isa(IFK_ISA_SCALAR);
        ifk_attention(ref, q, k, v, kv_ld, T, P0, NH, NKV, HD, scale, 1);
        for (int isa = IFK_ISA_AVX2; isa < n_isas(); isa++) {
            ifk_set_isa(isa);
            for (int ti = 0; ti < 3; ti++) {
                ifk_attention(out, q, k, v, kv_ld, T, P0, NH, NKV, HD, scale, threads[ti]);
                double worst = 0;
                for (size_t i = 0; i < (size_t)T * qld; i++) {
                    double e = fabs((double)out[i] - ref[i]);
                    worst = e > worst || isnan(e) ? e : worst;
                }
                CHECK(worst <= 2e-5 * 2.0, "attention %s T=%d pos0=%d heads=%d/%d hd=%d threads=%d: max err %.3g",
                      ifk_isa_name(isa), T, P0, NH, NKV, HD, threads[ti], worst);
            }
        }
        free(q);
        free(k);
        free(v);
        free(ref);
        free(out);
    }
    ifk_set_isa(IFK_ISA_AUTO);
}

int main(void)
{
    RUN(test_f16_bf16_conversion);
    RUN(test_ref_by_hand);
    RUN(test_rope);
    RUN(test_attention_ref);
    RUN(test_isa_selection);
#ifndef IFK_NO_SIMD
    RUN(test_vector_exp);
#endif
    RUN(test_get_row);
#ifndef IFK_NO_SIMD
    RUN(test_bf16_round);
#endif
    RUN(test_matmul);
    RUN(test_elementwise);
    RUN(test_lowrank_up);
    RUN(test_attention);
    return check_summary("test_kernels");
}
