/*
 * test_cuda_tiled.c -- the warp-tile products (kernels/cuda/qtiled.cu: ifkc_tile_pack and
 * ifkc_matmul on IFKC_TILED + Q4_B32, Q4_B64, Q8_B32, Q8_B64) against independent references,
 * on random data with a fixed seed. Needs a GPU (or the emulation); run by `make check-gpu`.
 *
 * Products, for T = 1, 2, 3, 8 (decode: int8 x) and 9, 64 (cuBLAS on rows dequantized from the
 * tiles); N = 37, 300; K with 4, 36 and 64 blocks (one short tile, a whole tile and a short one,
 * two whole tiles) and K = 36 B - 5 (the last block cut short); x normal with outliers three
 * ways (x_make), strided (ldx > K) and not 16-byte aligned.
 * With w' the decoded weights, S' = sum_k (|min_b(k)| + q_k delta_b(k)) |x_k| (as in
 * test_cuda_matmul.c), c = (L - 1) / 2 and s_g(k) = max|x| / 127 over element k's group of x
 * (kernels/cpu/qimpl.h's groups; an upper bound of the step the kernel uses, which takes the
 * outliers out first):
 *   - decode against the F32 oracle ifk_qmatmul_ref: |y - ref| <= 1e-5 S' + 1.01 sum_k |delta_b(k)|
 *     c s_g(k) / 2 (the int8 rounding left after the residual's correction is delta sum (q - c) r
 *     with |q - c| <= c and |r| <= s / 2);
 *   - decode against the CPU's own int8 product ifk_qmatmul, where it rounds x the same way
 *     (int8 x with the outliers taken out: ifk_qx_split > 0 and not ifk_qx_int16; the AVX512_VNNI
 *     paths): |y - cpu| <= 1e-5 S' (the same int8 values and outliers; float sums in another
 *     order);
 *   - prefill bit for bit against ifkc_matmul on the row layout (the same F16 tiles, the same
 *     cuBLAS call);
 *   - ifkc_matmul_glu and ifkc_matmul_qkv on tiles bit for bit against their operations apart;
 *   - with overlapped launches (ifkc_set_overlap) bit for bit against without;
 *   - the norms that also round for the tiles (ifkc_tile_norm): the norm's output and the
 *     products of it bit for bit what they are apart, and a launch in between (an add into
 *     the output) makes the product round again;
 *   - packing: other types and K whose blocks are not a multiple of 4 are left as they are
 *     (*out NULL, type unchanged, 0); tiled weights not 16-byte aligned and a tiled code with K
 *     that cannot be tiled are IFKC_EINVAL.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/qimpl.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/cuda_kernels.h"
#include "libcore/base/dtype.h"
#include "tests/gpu/gpulib.h"

static const int tile_types[] = { IFK_Q4_B32, IFK_Q4_B64, IFK_Q8_B32, IFK_Q8_B64 };
#define N_TILE ((int)(sizeof tile_types / sizeof tile_types[0]))

static const char *tname(int type)
{
    const char *s = iflow_dtype_name(type);
    return s ? s : "?";
}

/* ---- a matrix in both layouts ---------------------------------------------------------------- */

typedef struct {
    int type, N, K;
    size_t rs;        /* bytes a row */
    uint8_t *host;    /* [N][rs] the row layout */
    void *rowdev;     /* the same on the device */
    void *tiledev;    /* ifkc_tile_pack's copy; its code IFKC_TILED + type */
    float *dq;        /* [N][K] w' */
    float *mag;       /* [N][K] |min| + q delta */
    float *dlt;       /* [N][K] |delta| of the element's block */
} tmat;

static tmat tmat_make(int type, int N, int K)
{
    const ifk_qtype_info *qt = ifk_qtype(type);
    tmat w = { type, N, K, ifk_qrow_bytes(type, K), NULL, NULL, NULL, NULL, NULL, NULL };
    w.host = gpu_xmalloc((size_t)N * w.rs);
    w.dq = gpu_xmalloc((size_t)N * K * sizeof(float));
    w.mag = gpu_xmalloc((size_t)N * K * sizeof(float));
    w.dlt = gpu_xmalloc((size_t)N * K * sizeof(float));
    float *src = gpu_xmalloc((size_t)K * sizeof(float));
    for (int n = 0; n < N; n++) {
        for (int k = 0; k < K; k++)
            src[k] = 0.05f * rnd_normal() * (rnd_u32() % 64 == 0 ? 8.0f : 1.0f);
        uint8_t *row = w.host + (size_t)n * w.rs;
        ifk_quantize_row(row, type, src, K);
        ifk_dequantize_row(w.dq + (size_t)n * K, type, row, K);
        for (int k = 0; k < K; k++) {
            const uint8_t *blk = row + (size_t)(k / qt->block) * qt->block_bytes;
            const float d = iflow_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)),
                        m = iflow_f16_to_f32((uint16_t)(blk[2] | blk[3] << 8));
            const float q = d != 0.0f ? roundf((w.dq[(size_t)n * K + k] - m) / d) : 0.0f;
            w.mag[(size_t)n * K + k] = fabsf(m) + q * fabsf(d);
            w.dlt[(size_t)n * K + k] = fabsf(d);
        }
    }
    free(src);
    w.rowdev = gpu_dup(w.host, (size_t)N * w.rs);
    int ptype = -1, rc = ifkc_tile_pack(dev, &w.tiledev, &ptype, w.host, type, N, K);
    CHECK(rc == 0 && w.tiledev && ptype == IFKC_TILED + type, "ifkc_tile_pack %s N %d K %d: rc %d, type %d: %s",
          tname(type), N, K, rc, ptype, ifkc_errmsg());
    return w;
}

static void tmat_free(tmat *w)
{
    ifkc_free(dev, w->rowdev);
    ifkc_free(dev, w->tiledev);
    free(w->host), free(w->dq), free(w->mag), free(w->dlt);
}

/* x [T][ldx], normal, and by token t % 3 (the rounding kernel's three ways to its outliers):
 * 0: channels 5 and K / 2 thirty times larger (two stand out: ranked in one warp);
 * 1: 24 channels 5-50 times larger (more stand out than are taken: the warp ranks them);
 * 2: every 16th channel 0, so the least lane maximum is 0 and every value stands out (past 256
 *    candidates: block-wide rounds). Past K: 7 (never read). */
static float *x_make(int T, int K, size_t ldx)
{
    float *x = gpu_xmalloc((size_t)T * ldx * sizeof(float));
    for (int t = 0; t < T; t++) {
        float *xt = x + (size_t)t * ldx;
        for (size_t k = 0; k < ldx; k++)
            xt[k] = k < (size_t)K ? rnd_normal() : 7.0f;
        if (t % 3 == 0)
            xt[5] *= 30.0f, xt[K / 2] *= 30.0f;
        for (int j = 0; t % 3 == 1 && j < 24; j++)
            xt[rnd_u32() % (unsigned)K] *= 5.0f + 45.0f * rnd_unit();
        for (int k = 0; t % 3 == 2 && k < K; k += 16)
            xt[k] = 0.0f;
    }
    return x;
}

/* The step bound of element k of token x (int8 groups of qimpl.h: B = 64 the alternating runs
 * of 4, B = 32 the block): max |x| of the group / 127. */
static double group_step(const float *x, int K, int B, int k)
{
    const int b0 = k / B * B;
    double amax = 0.0;
    for (int i = b0; i < b0 + B && i < K; i++)
        if (B == 32 || ((i - b0) / 4) % 2 == ((k - b0) / 4) % 2)
            amax = fmax(amax, fabs(x[i]));
    return amax / 127.0;
}

/* ---- tests ----------------------------------------------------------------------------------- */

static double worst_ref, worst_cpu;

/* y = W x on the tiles (decode) against the oracle and the CPU's int8 product. */
static void check_decode(const tmat *w, const float *x, size_t ldx, int T, int xoff)
{
    const int N = w->N, K = w->K, B = ifk_qtype(w->type)->block;
    const double c = 0.5 * (ifk_qtype(w->type)->levels - 1);
    const size_t nx = (size_t)T * ldx;
    float *xd = gpu_dup(NULL, (nx + (size_t)xoff) * sizeof(float)), *yd = gpu_dup(NULL, (size_t)T * N * 4);
    CHECK(ifkc_upload(dev, xd + xoff, x, nx * sizeof(float)) == 0, "upload x: %s", ifkc_errmsg());
    float *y = gpu_xmalloc((size_t)T * N * 4), *yref = gpu_xmalloc((size_t)T * N * 4), *ycpu = gpu_xmalloc((size_t)T * N * 4);
    int rc = ifkc_matmul(dev, yd, (size_t)N, w->tiledev, IFKC_TILED + w->type, xd + xoff, ldx, T, N, K);
    CHECK(rc == 0, "%s T=%d N=%d K=%d: ifkc_matmul: %s", tname(w->type), T, N, K, ifkc_errmsg());
    if (rc == 0 && gpu_fetch(y, yd, (size_t)T * N * 4) == 0) {
        ifk_qmatmul_ref(yref, (size_t)N, w->host, w->type, x, ldx, T, N, K);
        const int same_rounding = ifk_qx_split(w->type, K) > 0 && !ifk_qx_int16(w->type);
        if (same_rounding)
            ifk_qmatmul(ycpu, (size_t)N, w->host, w->type, x, ldx, T, N, K, 1);
        int bad = 0, bad_cpu = 0;
        double wr = 0.0, wc = 0.0;
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * ldx;
            double *step = gpu_xmalloc((size_t)K * sizeof(double));
            for (int k = 0; k < K; k++)
                step[k] = group_step(xt, K, B, k);
            for (int n = 0; n < N; n++) {
                const float *mg = w->mag + (size_t)n * K, *dl = w->dlt + (size_t)n * K;
                double s2 = 0.0, s8 = 0.0;
                for (int k = 0; k < K; k++) {
                    s2 += (double)mg[k] * fabs(xt[k]);
                    s8 += (double)dl[k] * c * step[k] / 2.0;
                }
                const double v = y[(size_t)t * N + n], tol = 1e-5 * s2 + 1.01 * s8 + 1e-30;
                const double e = fabs(v - yref[(size_t)t * N + n]);
                bad += !(e <= tol);
                wr = fmax(wr, isnan(e) ? INFINITY : e / tol);
                if (same_rounding) {
                    const double ec = fabs(v - ycpu[(size_t)t * N + n]), tc = 1e-5 * s2 + 1e-30;
                    bad_cpu += !(ec <= tc);
                    wc = fmax(wc, isnan(ec) ? INFINITY : ec / tc);
                }
            }
            free(step);
        }
        CHECK(bad == 0, "%s T=%d N=%d K=%d ldx=%zu xoff=%d: %d of %d outputs off the oracle (worst %.3g x tolerance)",
              tname(w->type), T, N, K, ldx, xoff, bad, T * N, wr);
        CHECK(bad_cpu == 0, "%s T=%d N=%d K=%d: %d of %d outputs off the CPU's int8 product (worst %.3g x tolerance)",
              tname(w->type), T, N, K, bad_cpu, T * N, wc);
        worst_ref = fmax(worst_ref, wr);
        worst_cpu = fmax(worst_cpu, wc);
    }
    ifkc_free(dev, xd), ifkc_free(dev, yd);
    free(y), free(yref), free(ycpu);
}

/* T > IFKC_MATVEC_MAX_T: the tiles' product equals the row layout's bit for bit. */
static void check_prefill(const tmat *w, const float *x, size_t ldx, int T)
{
    const int N = w->N, K = w->K;
    float *xd = gpu_dup(x, (size_t)T * ldx * 4), *y1 = gpu_dup(NULL, (size_t)T * N * 4), *y2 = gpu_dup(NULL, (size_t)T * N * 4);
    float *h1 = gpu_xmalloc((size_t)T * N * 4), *h2 = gpu_xmalloc((size_t)T * N * 4);
    int rc = ifkc_matmul(dev, y1, (size_t)N, w->rowdev, w->type, xd, ldx, T, N, K);
    int rc2 = ifkc_matmul(dev, y2, (size_t)N, w->tiledev, IFKC_TILED + w->type, xd, ldx, T, N, K);
    CHECK(rc == 0 && rc2 == 0, "%s T=%d N=%d K=%d: prefill: %s", tname(w->type), T, N, K, ifkc_errmsg());
    if (rc == 0 && rc2 == 0 && gpu_fetch(h1, y1, (size_t)T * N * 4) == 0 && gpu_fetch(h2, y2, (size_t)T * N * 4) == 0)
        CHECK(memcmp(h1, h2, (size_t)T * N * 4) == 0, "%s T=%d N=%d K=%d: the tiles' prefill is not the rows'",
              tname(w->type), T, N, K);
    ifkc_free(dev, xd), ifkc_free(dev, y1), ifkc_free(dev, y2);
    free(h1), free(h2);
}

static void test_products(void)
{
    static const int Ts[] = { 1, 2, 3, 8 }, Ns[] = { 37, 300 };
    for (int ti = 0; ti < N_TILE; ti++) {
        const int type = tile_types[ti], B = ifk_qtype(type)->block;
        const int Ks[] = { 4 * B, 36 * B, 64 * B, 36 * B - 5 };
        for (int ki = 0; ki < 4; ki++)
            for (int ni = 0; ni < 2; ni++) {
                const int K = Ks[ki], N = Ns[ni];
                if (N == 300 && ki != 1)
                    continue; /* the larger N once a type */
                tmat w = tmat_make(type, N, K);
                if (!w.tiledev) {
                    tmat_free(&w);
                    continue;
                }
                const size_t ldx = (size_t)K + (ki == 3 ? 3 : 0);
                float *x = x_make(64, K, ldx);
                for (int i = 0; i < 4; i++)
                    check_decode(&w, x, ldx, Ts[i], ki == 2 && i == 1 ? 1 : 0);
                check_prefill(&w, x, ldx, 9);
                if (ki == 1)
                    check_prefill(&w, x, ldx, 64);
                free(x);
                tmat_free(&w);
            }
    }
    printf("tiled decode: worst %.3g x the oracle's tolerance, %.3g x the CPU int8 product's\n", worst_ref, worst_cpu);
}

/* GLU and qkv on tiles against the operations apart, bit for bit; then again with overlap. */
static void check_fused(int type, int K, int overlap)
{
    const int N = 64, Nkv = 16;
    overlap = ifkc_set_overlap(dev, overlap); /* 1 only where the device overlaps launches (cc >= 9.0) */
    tmat g = tmat_make(type, N, K), u = tmat_make(type, N, K), wk = tmat_make(type, Nkv, K), wv = tmat_make(type, Nkv, K);
    const int tt = IFKC_TILED + type;
    float *x = x_make(8, K, (size_t)K), *xd = gpu_dup(x, (size_t)8 * K * 4);
    float *a[6], *h1 = gpu_xmalloc((size_t)8 * N * 4), *h2 = gpu_xmalloc((size_t)8 * N * 4);
    for (int i = 0; i < 6; i++)
        a[i] = gpu_dup(NULL, (size_t)8 * N * 4);
    static const int Ts[] = { 1, 3, 8 };
    for (int i = 0; i < 3; i++) {
        const int T = Ts[i];
        const size_t ny = (size_t)T * N * 4;
        int rc = ifkc_matmul(dev, a[0], N, g.tiledev, tt, xd, K, T, N, K);
        rc = rc ? rc : ifkc_matmul(dev, a[1], N, u.tiledev, tt, xd, K, T, N, K);
        rc = rc ? rc : ifkc_silu_mul(dev, a[0], a[1], (size_t)T * N);
        rc = rc ? rc : ifkc_matmul_glu(dev, a[2], a[3], N, g.tiledev, u.tiledev, tt, xd, K, T, N, K);
        CHECK(rc == 0, "glu %s K %d T %d: %s", tname(type), K, T, ifkc_errmsg());
        if (rc == 0 && gpu_fetch(h1, a[0], ny) == 0 && gpu_fetch(h2, a[2], ny) == 0)
            CHECK(memcmp(h1, h2, ny) == 0, "glu %s K %d T %d overlap %d: not the ops apart", tname(type), K, T, overlap);
        /* qkv: q = gate's rows (64), k, v 16 rows; apart into a[0], a[1] (k), a[4] (v) */
        rc = ifkc_matmul(dev, a[0], N, g.tiledev, tt, xd, K, T, N, K);
        rc = rc ? rc : ifkc_matmul(dev, a[1], Nkv, wk.tiledev, tt, xd, K, T, Nkv, K);
        rc = rc ? rc : ifkc_matmul(dev, a[4], Nkv, wv.tiledev, tt, xd, K, T, Nkv, K);
        rc = rc ? rc : ifkc_matmul_qkv(dev, a[2], N, a[3], a[5], Nkv, g.tiledev, wk.tiledev, wv.tiledev, tt, xd, K, T, N, Nkv, K);
        CHECK(rc == 0, "qkv %s K %d T %d: %s", tname(type), K, T, ifkc_errmsg());
        const int pairs[3][2] = { { 0, 2 }, { 1, 3 }, { 4, 5 } };
        for (int p = 0; p < 3 && rc == 0; p++) {
            const size_t n = (size_t)T * (p ? Nkv : N) * 4;
            if (gpu_fetch(h1, a[pairs[p][0]], n) == 0 && gpu_fetch(h2, a[pairs[p][1]], n) == 0)
                CHECK(memcmp(h1, h2, n) == 0, "qkv %s K %d T %d overlap %d: %c differs from its own product", tname(type),
                      K, T, overlap, "qkv"[p]);
        }
    }
    /* with overlap on, the plain product too equals itself without */
    if (overlap) {
        float *y1 = gpu_dup(NULL, (size_t)8 * N * 4);
        int rc = ifkc_matmul(dev, y1, N, g.tiledev, tt, xd, K, 8, N, K);
        rc = rc ? rc : ifkc_set_overlap(dev, 0);
        rc = rc ? rc : ifkc_matmul(dev, a[0], N, g.tiledev, tt, xd, K, 8, N, K);
        CHECK(rc == 0, "overlap %s: %s", tname(type), ifkc_errmsg());
        if (rc == 0 && gpu_fetch(h1, y1, (size_t)8 * N * 4) == 0 && gpu_fetch(h2, a[0], (size_t)8 * N * 4) == 0)
            CHECK(memcmp(h1, h2, (size_t)8 * N * 4) == 0, "%s K %d: overlapped launches change the product", tname(type), K);
        ifkc_free(dev, y1);
    }
    ifkc_set_overlap(dev, 0);
    for (int i = 0; i < 6; i++)
        ifkc_free(dev, a[i]);
    ifkc_free(dev, xd);
    free(x), free(h1), free(h2);
    tmat_free(&g), tmat_free(&u), tmat_free(&wk), tmat_free(&wv);
}

static void test_fused(void)
{
    for (int ti = 0; ti < N_TILE; ti++) {
        const int B = ifk_qtype(tile_types[ti])->block;
        check_fused(tile_types[ti], 36 * B - 5, 0);
        check_fused(tile_types[ti], 4 * B, 1);
    }
}

/* The norms that round for the tiles (ifkc_tile_norm): y and the tiled products of y (plain,
 * GLU, qkv) bit for bit what they are with the norm and the rounding apart; a launch between
 * the norm and the product (here an add into y) makes the product round y again. */
static void check_norm_rounding(int type, int D, int T)
{
    const int N = 64;
    tmat g = tmat_make(type, N, D), u = tmat_make(type, N, D), wk = tmat_make(type, 16, D), wv = tmat_make(type, 16, D);
    const int tt = IFKC_TILED + type;
    float *x0 = x_make(T, D, (size_t)D), *w = x_make(1, D, (size_t)D), *r = x_make(T, D, (size_t)D);
    float *xd = gpu_dup(x0, (size_t)T * D * 4), *wd = gpu_dup(w, (size_t)D * 4), *rd = gpu_dup(r, (size_t)T * D * 4);
    float *yd = gpu_dup(NULL, (size_t)T * D * 4), *o1 = gpu_dup(NULL, (size_t)T * N * 4), *o2 = gpu_dup(NULL, (size_t)T * N * 4);
    float *o3 = gpu_dup(NULL, (size_t)T * N * 4);
    float *h[2] = { gpu_xmalloc((size_t)T * N * 4), gpu_xmalloc((size_t)T * N * 4) };
    float *hy[2] = { gpu_xmalloc((size_t)T * D * 4), gpu_xmalloc((size_t)T * D * 4) };
    /* what: 0 plain product, 1 GLU, 2 qkv (q from g), 3 add into y between norm and product;
     * norm: 0 ifkc_rmsnorm, 1 ifkc_add_rmsnorm (x reset first: it adds into x) */
    for (int what = 0; what < 4; what++)
        for (int norm = 0; norm < 2; norm++) {
            int rc = 0;
            for (int fused = 0; fused < 2 && !rc; fused++) {
                rc = ifkc_tile_norm(dev, fused ? type : 0);
                rc = rc ? rc : ifkc_upload(dev, xd, x0, (size_t)T * D * 4);
                rc = rc ? rc : ifkc_upload(dev, yd, r, (size_t)T * D * 4);
                rc = rc ? rc : norm ? ifkc_add_rmsnorm(dev, xd, yd, wd, T, D, 1e-5f) : ifkc_rmsnorm(dev, yd, xd, wd, T, D, 1e-5f);
                if (!rc && what == 3)
                    rc = ifkc_add(dev, yd, rd, (size_t)T * D);
                if (!rc && (what == 0 || what == 3))
                    rc = ifkc_matmul(dev, o1, N, g.tiledev, tt, yd, D, T, N, D);
                else if (!rc && what == 1)
                    rc = ifkc_matmul_glu(dev, o1, o2, N, g.tiledev, u.tiledev, tt, yd, D, T, N, D);
                else if (!rc)
                    rc = ifkc_matmul_qkv(dev, o1, N, o2, o3, 16, g.tiledev, wk.tiledev, wv.tiledev, tt, yd, D, T, N, 16, D);
                rc = rc ? rc : gpu_fetch(h[fused], o1, (size_t)T * N * 4);
                rc = rc ? rc : gpu_fetch(hy[fused], yd, (size_t)T * D * 4);
            }
            CHECK(rc == 0, "%s D %d T %d case %d/%d: %s", tname(type), D, T, what, norm, ifkc_errmsg());
            if (rc == 0)
                CHECK(!memcmp(h[0], h[1], (size_t)T * N * 4) && !memcmp(hy[0], hy[1], (size_t)T * D * 4),
                      "%s D %d T %d case %d/%d: the norm's rounding gives other bits than the product's own", tname(type), D,
                      T, what, norm);
        }
    ifkc_tile_norm(dev, 0);
    ifkc_free(dev, xd), ifkc_free(dev, wd), ifkc_free(dev, rd), ifkc_free(dev, yd);
    ifkc_free(dev, o1), ifkc_free(dev, o2), ifkc_free(dev, o3);
    free(x0), free(w), free(r), free(h[0]), free(h[1]), free(hy[0]), free(hy[1]);
    tmat_free(&g), tmat_free(&u), tmat_free(&wk), tmat_free(&wv);
}

static void test_norm_rounding(void)
{
    for (int ti = 0; ti < N_TILE; ti++) {
        check_norm_rounding(tile_types[ti], 1024, 1);
        check_norm_rounding(tile_types[ti], 2048 + 256, 3);
    }
    CHECK(ifkc_tile_norm(dev, IFK_Q6_B64) == IFKC_EINVAL, "ifkc_tile_norm of a type without tiles");
}

static void test_errors(void)
{
    uint8_t *W = gpu_xmalloc(ifk_qrow_bytes(IFK_Q6_B64, 4096) * 4);
    memset(W, 0, ifk_qrow_bytes(IFK_Q6_B64, 4096) * 4);
    void *out = (void *)1;
    int ptype = -1;
    CHECK(ifkc_tile_pack(dev, &out, &ptype, W, IFK_Q6_B64, 4, 4096) == 0 && !out && ptype == IFK_Q6_B64,
          "a Q6 matrix is left as it is");
    out = (void *)1;
    CHECK(ifkc_tile_pack(dev, &out, &ptype, W, IFK_Q4_B64, 4, 64 * 6) == 0 && !out && ptype == IFK_Q4_B64,
          "6 blocks a row are left as they are");
    CHECK(ifkc_tile_pack(dev, NULL, &ptype, W, IFK_Q4_B64, 4, 256) == IFKC_EINVAL, "NULL out");
    tmat w = tmat_make(IFK_Q4_B64, 8, 256);
    float *xd = gpu_dup(NULL, 256 * 4), *yd = gpu_dup(NULL, 8 * 4);
    CHECK(ifkc_memset0(dev, xd, 256 * 4) == 0, "memset");
    CHECK(ifkc_matmul(dev, yd, 8, (char *)w.tiledev + 4, IFKC_TILED + IFK_Q4_B64, xd, 256, 1, 7, 256) == IFKC_EINVAL &&
              strstr(ifkc_errmsg(), "16-byte"),
          "tiles not 16-byte aligned: %s", ifkc_errmsg());
    CHECK(ifkc_matmul(dev, yd, 8, w.tiledev, IFKC_TILED + IFK_Q4_B64, xd, 256, 1, 8, 192) == IFKC_EINVAL &&
              strstr(ifkc_errmsg(), "K = 192"),
          "a tiled code with K = 192 (3 blocks): %s", ifkc_errmsg());
    CHECK(!ifkc_supports_wtype(IFKC_TILED + IFK_Q6_B64) && ifkc_supports_wtype(IFKC_TILED + IFK_Q8_B32),
          "ifkc_supports_wtype of tiled codes");
    ifkc_free(dev, xd), ifkc_free(dev, yd);
    tmat_free(&w);
    free(W);
}

int main(void)
{
    if (!gpu_open("test_cuda_tiled"))
        return check_summary("test_cuda_tiled");
    RUN(test_errors);
    RUN(test_products);
    RUN(test_fused);
    RUN(test_norm_rounding);
    ifkc_close(dev);
    return check_summary("test_cuda_tiled");
}
