/*
 * quant_search.c -- error-minimizing block parameters: ifk_quantize_row_search (quant.h).
 *
 * The block layouts and the decoding w' = min + q * delta are quant.h's, unchanged; only the
 * choice of the two FP16 numbers and the levels differs from the paper's rule. For a block of n
 * weights x with importances w (all 1 without an importance matrix), the search minimizes
 *     E = sum_i w_i (x_i - w'_i)^2
 * in four steps:
 *   1. Grid. For each of NGRID + 1 steps delta_j = (max - min) / (top + RMIN + RSTEP j) (top =
 *      L - 1; RMIN < 0 leaves levels unused, > 0 clips the extremes), the levels
 *      l = round(clamp((x - min) / delta_j, 0, top)), then the weighted least-squares (min,
 *      delta) for those levels (a 2x2 system, closed form) and its E. Keep the best.
 *   2. Refinement (Lloyd): from the best, levels <- nearest levels of (min, delta), then (min,
 *      delta) <- least squares again, at most NREFINE times, while E falls.
 *   3. FP16. delta and min are rounded to FP16 and each weight gets its nearest decoded level;
 *      then min is re-fitted to the stored delta and levels and rounded again. E is evaluated
 *      exactly on the decoded float weights, in double.
 *   4. The paper's FP16 delta and min (as ifk_qblock_minmax rounds them), with nearest levels,
 *      are a candidate too. The block stored is the candidate with the smallest exact E. As the
 *      min/max rule's own levels are nearest levels or worse, E never exceeds the rule's for
 *      any block (same weighting).
 * Steps 1-2 work in level units of each candidate (v = (x - origin) / delta; the residual
 * r = v - l is O(1), so the sums that give E do not cancel) in float, in 4 lanes (SSE2, or
 * the same arithmetic in plain C elsewhere and with -DIFK_NO_SIMD; both give the same bits:
 * measured, the same squared error to 17 digits over every weight of xs-ckpt). Cost per weight: up to NGRID + 1 + NREFINE passes
 * of ~13 flops, plus three exact passes (docs/QUANTIZATION.md gives the measured time).
 *
 * The result depends only on the block (float arithmetic in a fixed order, no FMA contraction
 * under -std=c11), so it does not depend on threads, and not on the CPU for one binary.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/qblock.h"
#include "kernels/cpu/quant.h"

#if defined(__SSE2__) && !defined(IFK_NO_SIMD)
#include <emmintrin.h>
#endif

#define LANES   4
#define NGRID   8         /* grid steps: NGRID + 1 candidates, from top - 1 ...          */
#define RMIN    (-1.0f)   /* ... steps over the block's range ...                        */
#define RSTEP   0.25f     /* ... to top + 1                                              */
#define NREFINE 4
#define MAGIC   12582912.0f /* 1.5 * 2^23: (v + MAGIC) - MAGIC rounds 0 <= v < 2^22 to an integer */

/* One block, padded to a multiple of LANES with weight-0 copies of its first element. */
typedef struct {
    _Alignas(16) float x[IFK_QMAX_BLOCK];  /* [npad] weights                        */
    _Alignas(16) float w[IFK_QMAX_BLOCK];  /* [npad] importances (0 on the padding) */
    int   n, npad;
    double sw;                /* sum of w                                    */
    float top;                /* L - 1                                       */
} qblk;

/* The weighted least-squares fit of v = (x - o) * s by a + b l over the levels
 * l = round(clamp(v, 0, top)), written with r = v - l and b = 1 + c. */
typedef struct {
    double d, m;              /* the fit in weight units: delta = b / s, min = o + a / s   */
    double err;               /* its E in weight units                                     */
} fit;

/* The five weighted sums over the block of l, l^2, r, l r, r^2 (weighted by w): S[5]. Each of
 * LANES lanes sums every LANES-th element in element order; then lanes (0 + 2) + (1 + 3). */
#if defined(__SSE2__) && !defined(IFK_NO_SIMD)
static void level_sums(const qblk *b, float o, float s, double S[5])
{
    const __m128 vo = _mm_set1_ps(o), vs = _mm_set1_ps(s), top = _mm_set1_ps(b->top), zero = _mm_setzero_ps(),
                 magic = _mm_set1_ps(MAGIC);
    __m128 a0 = zero, a1 = zero, a2 = zero, a3 = zero, a4 = zero;
    for (int i = 0; i < b->npad; i += LANES) {
        __m128 x = _mm_load_ps(b->x + i), w = _mm_load_ps(b->w + i);
        __m128 v = _mm_mul_ps(_mm_sub_ps(x, vo), vs);
        __m128 c = _mm_min_ps(_mm_max_ps(v, zero), top);
        __m128 l = _mm_sub_ps(_mm_add_ps(c, magic), magic);
        __m128 r = _mm_sub_ps(v, l), wl = _mm_mul_ps(w, l), wr = _mm_mul_ps(w, r);
        a0 = _mm_add_ps(a0, wl);
        a1 = _mm_add_ps(a1, _mm_mul_ps(wl, l));
        a2 = _mm_add_ps(a2, wr);
        a3 = _mm_add_ps(a3, _mm_mul_ps(wl, r));
        a4 = _mm_add_ps(a4, _mm_mul_ps(wr, r));
    }
    float lane[5][LANES];
    _mm_storeu_ps(lane[0], a0);
    _mm_storeu_ps(lane[1], a1);
    _mm_storeu_ps(lane[2], a2);
    _mm_storeu_ps(lane[3], a3);
    _mm_storeu_ps(lane[4], a4);
    for (int k = 0; k < 5; k++)
        S[k] = (double)((lane[k][0] + lane[k][2]) + (lane[k][1] + lane[k][3]));
}
#else
static void level_sums(const qblk *b, float o, float s, double S[5])
{
    float lane[5][LANES] = {{0}};
    const float top = b->top;
    for (int i = 0; i < b->npad; i += LANES)
        for (int j = 0; j < LANES; j++) {
            float v = (b->x[i + j] - o) * s;
            float c = v > 0.0f ? v : 0.0f;   /* as _mm_max_ps, _mm_min_ps */
            c = c < top ? c : top;
            float l = (c + MAGIC) - MAGIC;
            float r = v - l, wl = b->w[i + j] * l, wr = b->w[i + j] * r;
            lane[0][j] += wl;
            lane[1][j] += wl * l;
            lane[2][j] += wr;
            lane[3][j] += wl * r;
            lane[4][j] += wr * r;
        }
    for (int k = 0; k < 5; k++)
        S[k] = (double)((lane[k][0] + lane[k][2]) + (lane[k][1] + lane[k][3]));
}
#endif

static fit fit_levels(const qblk *b, float o, float s)
{
    double S[5];
    level_sums(b, o, s, S);
    double swl = S[0], swll = S[1], swr = S[2], swlr = S[3], swrr = S[4];
    /* minimize sum w (r - a - c l)^2: [sw swl; swl swll] [a; c] = [swr; swlr] */
    double D = b->sw * swll - swl * swl, a, c;
    if (D > 1e-9 * b->sw * swll) {
        a = (swll * swr - swl * swlr) / D;
        c = (b->sw * swlr - swl * swr) / D;
    } else { /* one level only: fit the offset */
        a = swr / b->sw;
        c = 0.0;
    }
    double e = swrr - a * swr - c * swlr;
    fit f = {(1.0 + c) / s, o + a / s, (e > 0 ? e : 0) / ((double)s * s)};
    if (!(1.0 + c > 0.0))
        f.err = INFINITY; /* a reversed or zero step: not a candidate */
    return f;
}

/* The exact E of the stored step and minimum (d16, m16) with each weight's nearest decoded
 * level, and those levels q: [B] (0 past n). The nearest of the two levels around
 * (x - min) / delta is picked by its decoded value (min + q * delta in float, as
 * ifk_qblock_decode), so E is never above that of any other levels for (d16, m16). E is summed
 * in double in element order, so the same sum over the decoded block gives the same number. */
static double nearest_levels(const qblk *b, uint16_t d16, uint16_t m16, uint8_t *q)
{
    const float d = ifk_f16_to_f32(d16), m = ifk_f16_to_f32(m16), inv = 1.0f / d, top = b->top;
    float lo[IFK_QMAX_BLOCK];
    double a0[IFK_QMAX_BLOCK], a1[IFK_QMAX_BLOCK], sum = 0.0;
    for (int i0 = 0; i0 < b->npad; i0 += LANES)
        for (int i = i0; i < i0 + LANES; i++) { /* the squared residuals of the levels around t */
            float t = (b->x[i] - m) * inv;
            t = t < 0.0f ? 0.0f : t;
            t = t > top ? top : t;
            float f = (float)(int)t, c = f + 1.0f; /* floor: t >= 0 */
            c = c > top ? top : c;
            lo[i] = f;
            double r0 = (double)b->x[i] - (double)(m + f * d), r1 = (double)b->x[i] - (double)(m + c * d);
            a0[i] = r0 * r0;
            a1[i] = r1 * r1;
        }
    memset(q, 0, IFK_QMAX_BLOCK);
    for (int i = 0; i < b->n; i++) { /* the nearer of the two (at the top both are the top) */
        q[i] = (uint8_t)((int)lo[i] + (a1[i] < a0[i]));
        sum += (double)b->w[i] * (a1[i] < a0[i] ? a1[i] : a0[i]);
    }
    return sum;
}

/* n (1..B) weights x: [n], importances w: [n] or NULL -> blk: [block_bytes]. */
static void search_block(uint8_t *blk, int type, int levels, const float *x, const float *w, int n)
{
    qblk b = {.n = n, .npad = (n + LANES - 1) / LANES * LANES, .top = (float)(levels - 1)};
    float mn = x[0], mx = x[0];
    int finite = 1;
    for (int i = 0; i < n; i++) {
        b.x[i] = x[i];
        b.w[i] = w ? w[i] : 1.0f;
        b.sw += b.w[i];
        finite &= isfinite(x[i]) && isfinite(b.w[i]) && b.w[i] >= 0.0f;
        mn = x[i] < mn ? x[i] : mn;
        mx = x[i] > mx ? x[i] : mx;
    }
    for (int i = n; i < b.npad; i++) {
        b.x[i] = x[0];
        b.w[i] = 0.0f;
    }
    /* the paper's step and minimum, exactly as ifk_qblock_minmax rounds them */
    uint16_t d16 = ifk_f32_to_f16_sat((float)(((double)mx - (double)mn) / b.top)), m16 = ifk_f32_to_f16_sat(mn);
    if (!finite || !(mx > mn) || !(b.sw > 0.0) || !(ifk_f16_to_f32(d16) > 0.0f) || !isfinite(ifk_f16_to_f32(d16))) {
        ifk_qblock_minmax(blk, type, x, n); /* nothing to search: the paper's block */
        return;
    }
    uint8_t q[IFK_QMAX_BLOCK], qc[IFK_QMAX_BLOCK];
    double e = nearest_levels(&b, d16, m16, q);

    /* 1. the grid */
    fit best = {0, 0, INFINITY};
    for (int j = 0; j <= NGRID; j++) {
        float s = (b.top + RMIN + RSTEP * (float)j) / (mx - mn);
        fit f = fit_levels(&b, mn, s);
        if (f.err < best.err)
            best = f;
    }
    /* 2. refinement */
    for (int it = 0; it < NREFINE && best.d > 0.0; it++) {
        fit f = fit_levels(&b, (float)best.m, (float)(1.0 / best.d));
        if (!(f.err < best.err))
            break;
        best = f;
    }
    /* 3. FP16: as fitted, then with the minimum re-fitted to the stored step and levels */
    uint16_t cd = ifk_f32_to_f16_sat((float)best.d), cm = ifk_f32_to_f16_sat((float)best.m);
    float fd = ifk_f16_to_f32(cd), fm = ifk_f16_to_f32(cm);
    if (best.err < INFINITY && fd > 0.0f && isfinite(fd) && isfinite(fm)) {
        double ec = nearest_levels(&b, cd, cm, qc), wres = 0.0;
        if (ec < e) {
            e = ec;
            d16 = cd;
            m16 = cm;
            memcpy(q, qc, sizeof q);
        }
        for (int i = 0; i < n; i++)
            wres += (double)b.w[i] * ((double)x[i] - (double)(fm + (float)qc[i] * fd));
        uint16_t cm2 = ifk_f32_to_f16_sat((float)(fm + wres / b.sw));
        if (cm2 != cm && isfinite(ifk_f16_to_f32(cm2)) && (ec = nearest_levels(&b, cd, cm2, qc)) < e) {
            e = ec;
            d16 = cd;
            m16 = cm2;
            memcpy(q, qc, sizeof q);
        }
    }
    /* 4. the best of these; the paper's step and minimum with nearest levels is among them, and
     * its E is at most the paper's block's (whose levels are the nearest ones or worse) */
    ifk_qblock_store(blk, type, d16, m16, q);
}

/* dst: [ifk_qrow_bytes(type, K)]; src: [K]; imp: [K] or NULL. */
void ifk_quantize_row_search(void *dst, int type, const float *src, const float *imp, int K)
{
    const ifk_qtype_info *t = ifk_qtype(type);
    if (!t)
        return;
    uint8_t *out = dst;
    for (int k = 0; k < K; k += t->block) {
        int n = K - k < t->block ? K - k : t->block;
        search_block(out, type, t->levels, src + k, imp ? imp + k : NULL, n);
        out += t->block_bytes;
    }
}
