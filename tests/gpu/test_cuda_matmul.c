/*
 * test_cuda_matmul.c -- ifkc_matmul (kernels/cuda/matmul.cu) for every weight type against the
 * CPU references on random data with a fixed seed: ifk_qmatmul_ref for the quantized types,
 * ifk_matmul on the scalar path (IFK_ISA_SCALAR) for F32 / F16 / BF16; both sum in double.
 * Needs a GPU: without one it fails at once, saying so. Run by `make check-gpu`.
 *
 * Covered: all 12 weight types; T = 1, 2, 3, 8 (the matrix-vector kernels, TM = 1, 2, 4, 8) and
 * T = 9, 64 (cuBLAS); N = 1, 37, 300, 1000; K = 32, 37, 64, 172, 1000, 4096 (37 and 172 leave
 * a partial last block for every quantized type, and send F16 / BF16 (and for 37 F32) to the
 * element-wise kernel); strided x and y (ldx > K, ldy > N; y's columns past N must stay
 * untouched); x not 16-byte aligned (a copy to scratch first); a quantized matrix larger than
 * one prefill tile; the argument checks (an unsupported type code is IFKC_EUNSUPPORTED and the
 * message names it; bad shapes and NULL pointers are IFKC_EINVAL); and N = 4096, K = 11008 at
 * T = 1 and 64 for Q4_B64, Q8_B64 and F16, whose decode speed is printed (not checked); and
 * ifkc_matmul_glu (the gated FFN's gate and up products with SiLU in one kernel) bit for bit
 * against the three operations it stands for, and ifkc_matmul_qkv (three matrices in one
 * launch) bit for bit against three ifkc_matmul calls; and all of them with overlapped launches
 * (ifkc_set_overlap) bit for bit against themselves without. (The warp-tile layout's products:
 * test_cuda_tiled.c.)
 *
 * Tolerances, per output y[t][n], with w' the decoded weights and
 *     S  = sum_k |w'_k x_k|,       S' = sum_k (|min_b(k)| + q_k delta_b(k)) |x_k|
 * (S' = S for F32 / F16 / BF16; for quantized blocks S' bounds the magnitude of both terms of
 * min * sum(x) + delta * sum(q x), which is how the kernels compute a block):
 *     T <= 8, every type (F32 accumulation, another order):  |y - ref| <= 1e-5 * S'
 *     T > 8, F32 (SGEMM, no TF32):                            |y - ref| <= 1e-5 * S
 *     T > 8, F16 weights (x rounded once to F16, 2^-11):      |y - ref| <= 2e-3 * S
 *     T > 8, quantized (w' and x rounded to F16, 2 x 2^-11):  |y - ref| <= 2e-3 * S
 *     T > 8, BF16 weights (x rounded once to BF16, 2^-8):     |y - ref| <= 5e-3 * S
 * Float sums of up to 11008 terms are ~1e-6 of S; any indexing error (a wrong level, block,
 * row or element of x) is of the order of S itself. A build whose decode kernels round x to
 * int8 (IFKC_MV_DP4A=1, ifkc_matvec_int8_x) adds that rounding's bound for T <= 8:
 * 1.01 * sum_k S'_k max|x|_block(k) / 254 (half a step of the block's scale).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/cuda_kernels.h"
#include "libcore/base/dtype.h"
#include "tests/gpu/gpulib.h"


static const int all_types[] = { IFK_F32, IFK_F16, IFK_BF16, IFK_Q8_B32, IFK_Q8_B64, IFK_Q6_B64,
                                 IFK_Q5_B64, IFK_Q4_B32, IFK_Q4_B64, IFK_Q3H_B64, IFK_Q3_B32, IFK_Q2_B32 };
#define N_TYPES ((int)(sizeof all_types / sizeof all_types[0]))

/* ---- helpers ----------------------------------------------------------------------------- */




static const char *tname(int type)
{
    const char *s = iflow_dtype_name(type);
    return s ? s : "?";
}

static int is_quant(int type)
{
    return ifk_qtype(type) != NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- a weight matrix on both sides ------------------------------------------------------- */

typedef struct {
    int type, N, K;
    size_t row_bytes;
    void *host;   /* [N][row_bytes] in the type's layout */
    void *dev;    /* the same on the device */
    float *dq;    /* [N][K] decoded weights w' */
    float *mag;   /* [N][K] |w'| (float types) or |min_b| + q delta_b (quantized) */
} wmat;

static size_t row_bytes_of(int type, int K)
{
    if (is_quant(type))
        return ifk_qrow_bytes(type, K);
    return (size_t)K * (type == IFK_F32 ? 4 : 2);
}

/* Random N x K weights of a type (normal * 0.05, a few larger), uploaded. */
static wmat wmat_make(int type, int N, int K)
{
    wmat w = { type, N, K, row_bytes_of(type, K), NULL, NULL, NULL, NULL };
    w.host = gpu_xmalloc((size_t)N * w.row_bytes);
    w.dq = gpu_xmalloc((size_t)N * K * sizeof(float));
    w.mag = gpu_xmalloc((size_t)N * K * sizeof(float));
    float *src = gpu_xmalloc((size_t)K * sizeof(float));
    for (int n = 0; n < N; n++) {
        for (int k = 0; k < K; k++)
            src[k] = 0.05f * rnd_normal() * (rnd_u32() % 64 == 0 ? 8.0f : 1.0f);
        uint8_t *row = (uint8_t *)w.host + (size_t)n * w.row_bytes;
        float *dq = w.dq + (size_t)n * K, *mag = w.mag + (size_t)n * K;
        if (type == IFK_F32) {
            memcpy(row, src, (size_t)K * 4);
        } else if (type == IFK_F16 || type == IFK_BF16) {
            uint16_t *h = (uint16_t *)row;
            for (int k = 0; k < K; k++)
                h[k] = type == IFK_F16 ? iflow_f32_to_f16(src[k]) : iflow_f32_to_bf16(src[k]);
        } else {
            ifk_quantize_row(row, type, src, K);
        }
        if (is_quant(type)) {
            const ifk_qtype_info *qt = ifk_qtype(type);
            ifk_dequantize_row(dq, type, row, K);
            for (int k = 0; k < K; k++) {
                const uint8_t *blk = row + (size_t)(k / qt->block) * qt->block_bytes;
                float mn = ifk_f16_to_f32((uint16_t)(blk[2] | blk[3] << 8));
                mag[k] = fabsf(mn) + (dq[k] - mn); /* q delta = w' - min */
            }
        } else {
            for (int k = 0; k < K; k++) {
                dq[k] = type == IFK_F32    ? src[k]
                        : type == IFK_F16 ? ifk_f16_to_f32(((uint16_t *)row)[k])
                                          : ifk_bf16_to_f32(((uint16_t *)row)[k]);
                mag[k] = fabsf(dq[k]);
            }
        }
    }
    free(src);
    w.dev = gpu_dup(w.host, (size_t)N * w.row_bytes);
    return w;
}

static void wmat_free(wmat *w)
{
    ifkc_free(dev, w->dev);
    free(w->host);
    free(w->dq);
    free(w->mag);
}

/* Random activations x: [T][ldx] (normal, the padding past K NaN so that reading it shows). */
static float *x_make(int T, int K, size_t ldx)
{
    float *x = gpu_xmalloc((size_t)T * ldx * sizeof(float));
    for (int t = 0; t < T; t++)
        for (size_t k = 0; k < ldx; k++)
            x[(size_t)t * ldx + k] = k < (size_t)K ? rnd_normal() : NAN;
    return x;
}

/* The CPU reference yref: [T][N] (stride N). */
static void reference(float *yref, const wmat *w, const float *x, size_t ldx, int T)
{
    if (!is_quant(w->type)) {
        ifk_matmul(yref, (size_t)w->N, w->host, w->type, x, ldx, T, w->N, w->K, 0);
        return;
    }
    /* the oracle is single-threaded: rows in parallel chunks */
    const int chunk = 16, nc = (w->N + chunk - 1) / chunk;
#pragma omp parallel for schedule(dynamic, 1)
    for (int c = 0; c < nc; c++) {
        int n0 = c * chunk, nr = w->N - n0 < chunk ? w->N - n0 : chunk;
        ifk_qmatmul_ref(yref + n0, (size_t)w->N, (const uint8_t *)w->host + (size_t)n0 * w->row_bytes, w->type, x,
                        ldx, T, nr, w->K);
    }
}

/* The tolerance factor of quant.h's table at the top for this path. */
static double tol_factor(int type, int T)
{
    if (T <= IFKC_MATVEC_MAX_T || type == IFK_F32)
        return 1e-5;
    return type == IFK_BF16 ? 5e-3 : 2e-3;
}

/* Worst |y - ref| / tolerance seen per type and path (0: matvec, 1: cuBLAS), for the report. */
static double worst[IFK_QTYPE_END_][2];

/* One product: W (uploaded) times x [T][ldx] into y [T][ldy] on the device; x at a float
 * offset xoff inside its device buffer (1: not 16-byte aligned). Compares every output. */
static void run_case(const wmat *w, const float *x, size_t ldx, int T, size_t ldy, int xoff)
{
    const int N = w->N, K = w->K;
    const size_t nx = (size_t)T * ldx, ny = (size_t)T * ldy;
    float *xd = gpu_dup(NULL, (nx + (size_t)xoff) * sizeof(float));
    CHECK(ifkc_upload(dev, xd + xoff, x, nx * sizeof(float)) == 0, "upload x: %s", ifkc_errmsg());
    const float sentinel = 12345.5f;
    float *y = gpu_xmalloc(ny * sizeof(float)), *yref = gpu_xmalloc((size_t)T * N * sizeof(float));
    for (size_t i = 0; i < ny; i++)
        y[i] = sentinel;
    float *yd = gpu_dup(y, ny * sizeof(float));

    int rc = ifkc_matmul(dev, yd, ldy, w->dev, w->type, xd + xoff, ldx, T, N, K);
    CHECK(rc == 0, "%s T=%d N=%d K=%d: ifkc_matmul: %d %s", tname(w->type), T, N, K, rc, ifkc_errmsg());
    rc = rc ? rc : ifkc_download(dev, y, yd, ny * sizeof(float));
    CHECK(rc == 0, "%s T=%d N=%d K=%d: download: %s", tname(w->type), T, N, K, ifkc_errmsg());
    if (rc == 0) {
        reference(yref, w, x, ldx, T);
        const double f = tol_factor(w->type, T);
        const int gemm = T > IFKC_MATVEC_MAX_T, i8 = !gemm && ifkc_matvec_int8_x(w->type);
        int bad = 0, bad_pad = 0;
        double wr = 0.0;
#pragma omp parallel for reduction(+ : bad, bad_pad) reduction(max : wr)
        for (int n = 0; n < N; n++)
            for (int t = 0; t < T; t++) {
                const float *xt = x + (size_t)t * ldx, *dq = w->dq + (size_t)n * K, *mg = w->mag + (size_t)n * K;
                double s = 0.0, s2 = 0.0, s8 = 0.0, amax = 0.0;
                for (int k = 0; k < K; k++) {
                    s += fabs((double)dq[k] * xt[k]);
                    s2 += (double)mg[k] * fabs(xt[k]);
                    if (i8 && k % 32 == 0) { /* x rounded to int8 in blocks of 32: half a step of its block */
                        amax = 0.0;
                        for (int kk = k; kk < K && kk < k + 32; kk++)
                            amax = fmax(amax, fabs(xt[kk]));
                    }
                    s8 += (double)mg[k] * amax / 254.0;
                }
                double tol = f * (gemm ? s : s2) + (i8 ? 1.01 * s8 : 0.0) + 1e-30;
                double e = fabs((double)y[(size_t)t * ldy + n] - yref[(size_t)t * N + n]);
                if (!(e <= tol)) {
                    bad++;
                    e = isnan(e) ? INFINITY : e;
                }
                wr = fmax(wr, e / tol);
            }
        for (int t = 0; t < T; t++)
            for (size_t n = (size_t)N; n < ldy; n++)
                bad_pad += y[(size_t)t * ldy + n] != sentinel;
        CHECK(bad == 0, "%s T=%d N=%d K=%d ldx=%zu ldy=%zu xoff=%d: %d of %d outputs off (worst %.3g x tolerance)",
              tname(w->type), T, N, K, ldx, ldy, xoff, bad, T * N, wr);
        CHECK(bad_pad == 0, "%s T=%d N=%d K=%d: %d elements of y past N were written", tname(w->type), T, N, K,
              bad_pad);
        if (wr > worst[w->type][gemm])
            worst[w->type][gemm] = wr;
    }
    ifkc_free(dev, xd);
    ifkc_free(dev, yd);
    free(y);
    free(yref);
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_supports(void)
{
    for (int i = 0; i < N_TYPES; i++)
        CHECK(ifkc_supports_wtype(all_types[i]) == 1, "%s is supported", tname(all_types[i]));
    CHECK(!ifkc_supports_wtype(3) && !ifkc_supports_wtype(IFK_QTYPE_END_) && !ifkc_supports_wtype(-1),
          "codes 3, 25, -1 are not weight types");
}

static void test_shapes(void)
{
    static const int Ns[] = { 1, 37, 300, 1000 }, Ks[] = { 32, 37, 64, 172, 1000, 4096 },
                     Ts[] = { 1, 2, 3, 8, 9, 64 };
    for (int ti = 0; ti < N_TYPES; ti++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
            for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
                wmat w = wmat_make(all_types[ti], Ns[ni], Ks[ki]);
                float *x = x_make(64, Ks[ki], (size_t)Ks[ki]);
                for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
                    run_case(&w, x, (size_t)Ks[ki], Ts[i], (size_t)Ns[ni], 0);
                free(x);
                wmat_free(&w);
            }
}

/* ldx > K, ldy > N; x not 16-byte aligned; ldx not a multiple of 4. */
static void test_strides(void)
{
    static const int Ts[] = { 1, 3, 8, 9 };
    for (int ti = 0; ti < N_TYPES; ti++)
        for (int K = 172; K <= 1000; K += 828) {
            wmat w = wmat_make(all_types[ti], 300, K);
            for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
                float *x = x_make(Ts[i], K, (size_t)K + 3);
                run_case(&w, x, (size_t)K + 3, Ts[i], 300 + 5, 0); /* ldx odd: x copied for T > 1 */
                run_case(&w, x, (size_t)K + 3, Ts[i], 300 + 5, 1); /* x + 1 float: unaligned */
                free(x);
                x = x_make(Ts[i], K, (size_t)K + 4);
                run_case(&w, x, (size_t)K + 4, Ts[i], 300 + 8, 0); /* aligned strides, in place */
                free(x);
            }
            wmat_free(&w);
        }
}

/* A quantized matrix of more rows than one 64 MiB F16 tile (K = 8192: 4096 rows per tile). */
static void test_tiles(void)
{
    wmat w = wmat_make(IFK_Q4_B32, 4096 + 100, 8192);
    float *x = x_make(16, 8192, 8192);
    run_case(&w, x, 8192, 16, 4096 + 100, 0);
    free(x);
    wmat_free(&w);
}

static void test_errors(void)
{
    float *buf = gpu_dup(NULL, 4096);
    int rc = ifkc_matmul(dev, buf, 8, buf, 3, buf, 8, 1, 8, 8);
    CHECK(rc == IFKC_EUNSUPPORTED, "weight type 3: rc %d, want IFKC_EUNSUPPORTED", rc);
    CHECK(strstr(ifkc_errmsg(), "type 3") != NULL, "the message names the type code: %s", ifkc_errmsg());
    rc = ifkc_matmul(dev, buf, 8, buf, IFK_QTYPE_END_, buf, 8, 1, 8, 8);
    CHECK(rc == IFKC_EUNSUPPORTED, "weight type %d: rc %d", IFK_QTYPE_END_, rc);
    CHECK(strstr(ifkc_errmsg(), "type 25") != NULL, "the message names the type code: %s", ifkc_errmsg());
    rc = ifkc_matmul(dev, buf, 8, buf, IFK_F32, buf, 8, 0, 8, 8);
    CHECK(rc == IFKC_EINVAL, "T = 0: rc %d, want IFKC_EINVAL", rc);
    rc = ifkc_matmul(dev, buf, 8, buf, IFK_Q4_B64, buf, 8, 1, -1, 8);
    CHECK(rc == IFKC_EINVAL, "N = -1: rc %d", rc);
    rc = ifkc_matmul(dev, buf, 8, buf, IFK_F16, buf, 8, 1, 8, 0);
    CHECK(rc == IFKC_EINVAL, "K = 0: rc %d", rc);
    rc = ifkc_matmul(dev, NULL, 8, buf, IFK_F32, buf, 8, 1, 8, 8);
    CHECK(rc == IFKC_EINVAL, "y NULL: rc %d", rc);
    rc = ifkc_matmul(dev, buf, 8, NULL, IFK_Q8_B32, buf, 8, 1, 8, 8);
    CHECK(rc == IFKC_EINVAL, "W NULL: rc %d", rc);
    rc = ifkc_matmul(dev, buf, 8, buf, IFK_F32, NULL, 8, 1, 8, 8);
    CHECK(rc == IFKC_EINVAL, "x NULL: rc %d", rc);
    rc = ifkc_matmul(dev, buf, 8, buf, IFK_F32, buf, 4, 2, 8, 8);
    CHECK(rc == IFKC_EINVAL, "ldx < K with T = 2: rc %d", rc);
    CHECK(ifkc_sync(dev) == 0, "the device is still usable: %s", ifkc_errmsg());
    ifkc_free(dev, buf);
}

/* Average seconds of one ifkc_matmul over reps calls (after a warm-up). */
static double time_matmul(const wmat *w, float *yd, const float *xd, int T, int reps)
{
    ifkc_matmul(dev, yd, (size_t)w->N, w->dev, w->type, xd, (size_t)w->K, T, w->N, w->K);
    ifkc_sync(dev);
    double t0 = now_s();
    for (int i = 0; i < reps; i++)
        ifkc_matmul(dev, yd, (size_t)w->N, w->dev, w->type, xd, (size_t)w->K, T, w->N, w->K);
    ifkc_sync(dev);
    return (now_s() - t0) / reps;
}

/* N = 4096, K = 11008 (a 7B model's down projection) for Q4_B64, Q8_B64, F16: checked at
 * T = 1 and 64; decode (T = 1) bandwidth printed against the device's peak (not on the CPU
 * emulation of make check-emu, IFLOW_EMU set). */
static void test_large(void)
{
    static const int types[] = { IFK_Q4_B64, IFK_Q8_B64, IFK_F16 };
    const int N = 4096, K = 11008;
    ifkc_device_info info;
    double peak = ifkc_device_info_get(0, &info) == 0 ? info.mem_bw_peak : 0.0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        wmat w = wmat_make(types[i], N, K);
        float *x = x_make(64, K, K);
        run_case(&w, x, K, 1, N, 0);
        run_case(&w, x, K, 64, N, 0);
        if (getenv("IFLOW_EMU")) { /* the CPU emulation (make check-emu): its times mean nothing */
            free(x);
            wmat_free(&w);
            continue;
        }
        float *xd = gpu_dup(x, (size_t)64 * K * sizeof(float)), *yd = gpu_dup(NULL, (size_t)64 * N * 4);
        double s1 = time_matmul(&w, yd, xd, 1, 200), s64 = time_matmul(&w, yd, xd, 64, 20);
        double bytes = (double)N * w.row_bytes;
        printf("  %-7s %dx%d  T=1: %7.1f us, %6.0f GB/s (%.0f%% of the %.0f GB/s peak)   T=64: %7.1f us\n",
               tname(types[i]), N, K, s1 * 1e6, bytes / s1 / 1e9, peak > 0 ? 100.0 * bytes / s1 / peak : 0.0,
               peak / 1e9, s64 * 1e6);
        ifkc_free(dev, xd);
        ifkc_free(dev, yd);
        free(x);
        wmat_free(&w);
    }
}

/* ifkc_matmul_glu against ifkc_matmul (gate), ifkc_matmul (up) and ifkc_silu_mul, bit for bit:
 * every type, T = 1, 2, 3, 8 (one kernel) and 9 (the ops apart), K with and without a partial
 * last block (37: the element-wise F16 / BF16 kernel, computed apart). */
static void test_glu(void)
{
    static const int Ks[] = {64, 37, 1000}, Ts[] = {1, 2, 3, 8, 9};
    const int N = 37;
    for (int ti = 0; ti < N_TYPES; ti++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
            const int K = Ks[ki];
            wmat g = wmat_make(all_types[ti], N, K), u = wmat_make(all_types[ti], N, K);
            float *x = x_make(9, K, (size_t)K), *xd = gpu_dup(x, (size_t)9 * K * 4);
            float *y1 = gpu_dup(NULL, (size_t)9 * N * 4), *u1 = gpu_dup(NULL, (size_t)9 * N * 4);
            float *y2 = gpu_dup(NULL, (size_t)9 * N * 4), *u2 = gpu_dup(NULL, (size_t)9 * N * 4);
            float *h1 = gpu_xmalloc((size_t)9 * N * 4), *h2 = gpu_xmalloc((size_t)9 * N * 4);
            for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
                const int T = Ts[i];
                int rc = ifkc_matmul(dev, y1, N, g.dev, g.type, xd, K, T, N, K);
                if (!rc)
                    rc = ifkc_matmul(dev, u1, N, u.dev, u.type, xd, K, T, N, K);
                if (!rc)
                    rc = ifkc_silu_mul(dev, y1, u1, (size_t)T * N);
                CHECK(rc == 0, "glu %s K %d T %d: the ops apart: %s", tname(g.type), K, T, ifkc_errmsg());
                int rc2 = ifkc_matmul_glu(dev, y2, u2, N, g.dev, u.dev, g.type, xd, K, T, N, K);
                CHECK(rc2 == 0, "glu %s K %d T %d: %s", tname(g.type), K, T, ifkc_errmsg());
                if (rc == 0 && rc2 == 0 && gpu_fetch(h1, y1, (size_t)T * N * 4) == 0 &&
                    gpu_fetch(h2, y2, (size_t)T * N * 4) == 0)
                    CHECK(memcmp(h1, h2, (size_t)T * N * 4) == 0,
                          "glu %s K %d T %d: not the values of the gate and up products and silu_mul", tname(g.type),
                          K, T);
            }
            ifkc_free(dev, xd), ifkc_free(dev, y1), ifkc_free(dev, u1), ifkc_free(dev, y2), ifkc_free(dev, u2);
            free(x), free(h1), free(h2);
            wmat_free(&g);
            wmat_free(&u);
        }
}

/* ifkc_matmul_qkv against three ifkc_matmul calls, bit for bit: every type, T = 1, 2, 3, 8 (one
 * launch) and 9 (apart), strided outputs, rows that a warp's pair divides (Nq 64, Nkv 16) and
 * that it does not (Nq 37: computed apart). */
static void test_qkv(void)
{
    static const int Ks[] = {64, 1000}, Ts[] = {1, 2, 3, 8, 9}, Nqs[] = {64, 37};
    const int Nkv = 16;
    for (int ti = 0; ti < N_TYPES; ti++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
            for (size_t qi = 0; qi < sizeof Nqs / sizeof Nqs[0]; qi++) {
                const int K = Ks[ki], Nq = Nqs[qi];
                const size_t ldq = (size_t)Nq + 3, ldkv = (size_t)Nkv + 5, nq = 9 * ldq, nkv = 9 * ldkv;
                wmat wq = wmat_make(all_types[ti], Nq, K), wk = wmat_make(all_types[ti], Nkv, K),
                     wv = wmat_make(all_types[ti], Nkv, K);
                float *x = x_make(9, K, (size_t)K), *xd = gpu_dup(x, (size_t)9 * K * 4);
                float *q1 = gpu_dup(NULL, nq * 4), *k1 = gpu_dup(NULL, nkv * 4), *v1 = gpu_dup(NULL, nkv * 4);
                float *q2 = gpu_dup(NULL, nq * 4), *k2 = gpu_dup(NULL, nkv * 4), *v2 = gpu_dup(NULL, nkv * 4);
                float *h1 = gpu_xmalloc(nq * 4), *h2 = gpu_xmalloc(nq * 4);
                for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
                    const int T = Ts[i];
                    /* the same NaN-free start in both, so the strides' gaps compare too */
                    CHECK(ifkc_memset0(dev, q1, nq * 4) == 0 && ifkc_memset0(dev, q2, nq * 4) == 0 &&
                              ifkc_memset0(dev, k1, nkv * 4) == 0 && ifkc_memset0(dev, k2, nkv * 4) == 0 &&
                              ifkc_memset0(dev, v1, nkv * 4) == 0 && ifkc_memset0(dev, v2, nkv * 4) == 0,
                          "qkv: memset: %s", ifkc_errmsg());
                    int rc = ifkc_matmul(dev, q1, ldq, wq.dev, wq.type, xd, K, T, Nq, K);
                    if (!rc)
                        rc = ifkc_matmul(dev, k1, ldkv, wk.dev, wk.type, xd, K, T, Nkv, K);
                    if (!rc)
                        rc = ifkc_matmul(dev, v1, ldkv, wv.dev, wv.type, xd, K, T, Nkv, K);
                    CHECK(rc == 0, "qkv %s K %d T %d: the three apart: %s", tname(wq.type), K, T, ifkc_errmsg());
                    int rc2 = ifkc_matmul_qkv(dev, q2, ldq, k2, v2, ldkv, wq.dev, wk.dev, wv.dev, wq.type, xd, K, T,
                                              Nq, Nkv, K);
                    CHECK(rc2 == 0, "qkv %s K %d T %d: %s", tname(wq.type), K, T, ifkc_errmsg());
                    const char *what = NULL;
                    if (rc == 0 && rc2 == 0) {
                        if (gpu_fetch(h1, q1, nq * 4) == 0 && gpu_fetch(h2, q2, nq * 4) == 0 && memcmp(h1, h2, nq * 4))
                            what = "q";
                        if (!what && gpu_fetch(h1, k1, nkv * 4) == 0 && gpu_fetch(h2, k2, nkv * 4) == 0 &&
                            memcmp(h1, h2, nkv * 4))
                            what = "k";
                        if (!what && gpu_fetch(h1, v1, nkv * 4) == 0 && gpu_fetch(h2, v2, nkv * 4) == 0 &&
                            memcmp(h1, h2, nkv * 4))
                            what = "v";
                    }
                    CHECK(!what, "qkv %s K %d Nq %d T %d: %s differs from its own product", tname(wq.type), K, Nq,
                          T, what);
                }
                if (ti == 0 && ki == 0 && qi == 0) /* no rows: the three products' shape error, no launch */
                    CHECK(ifkc_matmul_qkv(dev, q2, ldq, k2, v2, ldkv, wq.dev, wk.dev, wv.dev, wq.type, xd, K, 0, Nq, Nkv,
                                          K) == IFKC_EINVAL,
                          "qkv with T = 0: %s", ifkc_errmsg());
                ifkc_free(dev, xd), ifkc_free(dev, q1), ifkc_free(dev, k1), ifkc_free(dev, v1);
                ifkc_free(dev, q2), ifkc_free(dev, k2), ifkc_free(dev, v2);
                free(x), free(h1), free(h2);
                wmat_free(&wq), wmat_free(&wk), wmat_free(&wv);
            }
}

/* The decode products with overlapped launches (ifkc_set_overlap: each prefetches its rows into
 * L2 and may start while the launch before it ends) give the bits they give without: every
 * type, T = 1, 2, 3, 8, a chain in which each product reads what the one before wrote: y = W x
 * (K x K), then from y a plain product of 37 rows (the last warp's rows past N), the GLU pair
 * and the three segments of ifkc_matmul_qkv. */
static void test_overlap(void)
{
    static const int Ks[] = {37, 1000}, Ts[] = {1, 2, 3, 8};
    const int N = 37, Nq = 64, Nkv = 16;
    for (int ti = 0; ti < N_TYPES; ti++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
            const int K = Ks[ki], type = all_types[ti];
            wmat w = wmat_make(type, K, K), g = wmat_make(type, N, K), u = wmat_make(type, N, K);
            wmat wq = wmat_make(type, Nq, K), wk = wmat_make(type, Nkv, K), wv = wmat_make(type, Nkv, K);
            /* outputs, [8] rows each: y [K], z [N], gate [N], up [N], q [Nq], k [Nkv], v [Nkv] */
            const size_t nout = (size_t)8 * (K + 3 * N + Nq + 2 * Nkv);
            float *x = x_make(8, K, (size_t)K), *xd = gpu_dup(x, (size_t)8 * K * 4), *outd = gpu_dup(NULL, nout * 4);
            float *yd = outd, *zd = yd + 8 * K, *gd = zd + 8 * N, *ud = gd + 8 * N, *qd = ud + 8 * N,
                  *kd = qd + 8 * Nq, *vd = kd + 8 * Nkv;
            float *ref = gpu_xmalloc(nout * 4), *got = gpu_xmalloc(nout * 4);
            int on = 0;
            for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
                const int T = Ts[i];
                for (int mode = 0; mode < 2; mode++) {
                    on = ifkc_set_overlap(dev, mode);
                    int rc = ifkc_memset0(dev, outd, nout * 4);
                    if (!rc)
                        rc = ifkc_matmul(dev, yd, K, w.dev, type, xd, K, T, K, K);
                    if (!rc)
                        rc = ifkc_matmul(dev, zd, N, g.dev, type, yd, K, T, N, K);
                    if (!rc)
                        rc = ifkc_matmul_glu(dev, gd, ud, N, g.dev, u.dev, type, yd, K, T, N, K);
                    if (!rc)
                        rc = ifkc_matmul_qkv(dev, qd, Nq, kd, vd, Nkv, wq.dev, wk.dev, wv.dev, type, yd, K, T, Nq,
                                             Nkv, K);
                    CHECK(rc == 0, "overlap %s K %d T %d (overlap %d): %s", tname(type), K, T, mode, ifkc_errmsg());
                    if (rc || gpu_fetch(mode ? got : ref, outd, nout * 4))
                        break;
                    if (mode)
                        CHECK(memcmp(ref, got, nout * 4) == 0,
                              "overlap %s K %d T %d: the products differ from those without overlap", tname(type), K,
                              T);
                }
                ifkc_set_overlap(dev, 0);
            }
            if (ti == 0 && ki == 0)
                printf("OBSERVED overlap: decode products with overlapped launches %s\n",
                       on ? "on" : "not available (compute capability below 9.0)");
            ifkc_free(dev, xd), ifkc_free(dev, outd);
            free(x), free(ref), free(got);
            wmat_free(&w), wmat_free(&g), wmat_free(&u), wmat_free(&wq), wmat_free(&wk), wmat_free(&wv);
        }
}

int main(void)
{
    if (!gpu_open("test_cuda_matmul"))
        return check_summary("test_cuda_matmul");
    ifk_set_isa(IFK_ISA_SCALAR); /* the CPU side is the scalar reference */

    RUN(test_supports);
    RUN(test_errors);
    RUN(test_shapes);
    RUN(test_strides);
    RUN(test_tiles);
    RUN(test_glu);
    RUN(test_qkv);
    RUN(test_overlap);
    RUN(test_large);

    printf("  worst |y - ref| / tolerance:\n");
    for (int i = 0; i < N_TYPES; i++)
        printf("    %-7s matvec %.3g   cublas %.3g\n", tname(all_types[i]), worst[all_types[i]][0],
               worst[all_types[i]][1]);
    ifkc_close(dev);
    return check_summary("test_cuda_matmul");
}
