/*
 * ops_avx2.c -- the elementwise kernels and attention with AVX2 + FMA + F16C.
 *
 * The same plan as ops_avx512.c: attention walks the keys in chunks with an online softmax (a
 * chunk that raises a query's running maximum rescales what was accumulated), from packed
 * copies of the chunk's K and V rows when several queries share them; chunk boundaries depend
 * on head_dim alone (kernels.h's batch invariance).
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/vec_avx2.h"

#define ATT_CHUNK 64    /* most keys a chunk */
#define ATT_PACK 2048   /* floats of K (and of V) copied a chunk, when packing */

/* y, x: [n]. */
void ifk_avx2_exp(float *y, const float *x, int n)
{
    for (int i = 0; i < n; i += 8) {
        int r = n - i < 8 ? n - i : 8;
        v8_store_part(y + i, r, v8_exp(v8_load_part(x + i, r)));
    }
}

/* out: [K] = W[row] as F32; W: [*][K] of wtype. */
void ifk_avx2_get_row(float *out, const void *W, int wtype, size_t row, int K)
{
    if (wtype != IFK_F32 && wtype != IFK_F16 && wtype != IFK_BF16) {
        ifk_ref_get_row(out, W, wtype, row, K);
        return;
    }
    size_t base = row * (size_t)K;
    int k = 0;
    for (; k + 8 <= K; k += 8)
        _mm256_storeu_ps(out + k, v8_load_w(W, wtype, base + k));
    if (k < K)
        v8_store_part(out + k, K - k, v8_load_w_part(W, wtype, base + k, K - k));
}

/* y, x, w: [n]. */
void ifk_avx2_rmsnorm(float *y, const float *x, const float *w, int n, float eps)
{
    if (n <= 0)
        return;
    __m256d a0 = _mm256_setzero_pd(), a1 = a0;   /* sum of squares in double, as ref.c */
    for (int i = 0; i < n; i += 8) {
        __m256 v = v8_load_part(x + i, n - i < 8 ? n - i : 8);
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        a0 = _mm256_fmadd_pd(lo, lo, a0);
        a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    double ss = v4d_hsum(_mm256_add_pd(a0, a1));
    __m256 inv = _mm256_set1_ps((float)(1.0 / sqrt(ss / n + (double)eps)));
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv),
                                              _mm256_loadu_ps(w + i)));
    if (i < n) {
        int r = n - i;
        v8_store_part(y + i, r, _mm256_mul_ps(_mm256_mul_ps(v8_load_part(x + i, r), inv),
                                              v8_load_part(w + i, r)));
    }
}

/* max of x[0..n); n >= 1. */
static float vmax(const float *x, int n)
{
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
    float m = v8_hmax(mv);
    for (; i < n; i++)
        m = x[i] > m ? x[i] : m;
    return m;
}

/* x[i] = e^(x[i] - mx) for i < n; returns their sum (added in double when wide). */
static double exp_sub_sum(float *x, int n, float mx, int wide)
{
    const __m256 mv = _mm256_set1_ps(mx);
    __m256 sum = _mm256_setzero_ps();
    __m256d dsum = _mm256_setzero_pd();
    for (int i = 0; i < n; i += 8) {
        int r = n - i < 8 ? n - i : 8;
        __m256 e = _mm256_and_ps(v8_exp(_mm256_sub_ps(v8_load_part(x + i, r), mv)), _mm256_castsi256_ps(v8_mask(r)));
        if (wide)
            dsum = _mm256_add_pd(dsum, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(e)),
                                                     _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1))));
        else
            sum = _mm256_add_ps(sum, e);
        v8_store_part(x + i, r, e);
    }
    return wide ? v4d_hsum(dsum) : v8_hsum(sum);
}

/* x: [n], in place. */
void ifk_avx2_softmax(float *x, int n)
{
    if (n <= 0)
        return;
    double sum = exp_sub_sum(x, n, vmax(x, n), 1);
    __m256 inv = _mm256_set1_ps((float)(1.0 / sum));
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    if (i < n)
        v8_store_part(x + i, n - i, _mm256_mul_ps(v8_load_part(x + i, n - i), inv));
}

/* g, u: [n]; g = g / (1 + e^-g) * u. */
void ifk_avx2_silu_mul(float *g, const float *u, int n)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int i = 0; i < n; i += 8) {
        int r = n - i < 8 ? n - i : 8;
        __m256 gv = v8_load_part(g + i, r);
        __m256 e = v8_exp(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        v8_store_part(g + i, r, _mm256_mul_ps(s, v8_load_part(u + i, r)));
    }
}

/* y, x: [n]. */
void ifk_avx2_add(float *y, const float *x, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    for (; i < n; i++)
        y[i] += x[i];
}

/* 8 values of F16 from p, as F32. */
static inline __m256 h8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* y's 8 columns at yn: + a (add), or a. */
static inline void put8(float *yn, __m256 a, int add)
{
    _mm256_storeu_ps(yn, add ? _mm256_add_ps(_mm256_loadu_ps(yn), a) : a);
}

/* ifk_lowrank_up (kernels.h, impl.h): a tile 32 columns at a time in four independent chains
 * (each column's chain in q order), then 8 at a time, the last few in scalar code (fmaf: the
 * same bits as the vector FMA). */
void ifk_avx2_lowrank_up(float *y, size_t ldy, const uint16_t *bt, const float *t, size_t ldt, int T, int N, int r,
                         int add)
{
    for (int c0 = 0; c0 < N; c0 += IFK_LR_TILE) {
        const int w = N - c0 < IFK_LR_TILE ? N - c0 : IFK_LR_TILE;
        const uint16_t *tile = bt + (size_t)c0 * r;
        for (int i = 0; i < T; i++) {
            const float *ti = t + (size_t)i * ldt;
            float *yi = y + (size_t)i * ldy + c0;
            int n = 0;
            for (; n + 32 <= w; n += 32) {
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (int q = 0; q < r; q++) {
                    const __m256 tq = _mm256_set1_ps(ti[q]);
                    const uint16_t *row = tile + (size_t)q * w + n;
                    a0 = _mm256_fmadd_ps(tq, h8(row), a0);
                    a1 = _mm256_fmadd_ps(tq, h8(row + 8), a1);
                    a2 = _mm256_fmadd_ps(tq, h8(row + 16), a2);
                    a3 = _mm256_fmadd_ps(tq, h8(row + 24), a3);
                }
                put8(yi + n, a0, add);
                put8(yi + n + 8, a1, add);
                put8(yi + n + 16, a2, add);
                put8(yi + n + 24, a3, add);
            }
            for (; n + 8 <= w; n += 8) {
                __m256 a = _mm256_setzero_ps();
                for (int q = 0; q < r; q++)
                    a = _mm256_fmadd_ps(_mm256_set1_ps(ti[q]), h8(tile + (size_t)q * w + n), a);
                put8(yi + n, a, add);
            }
            for (; n < w; n++) {
                float a = 0.0f;
                for (int q = 0; q < r; q++)
                    a = fmaf(ti[q], ifk_f16_to_f32(tile[(size_t)q * w + n]), a);
                yi[n] = add ? yi[n] + a : a;
            }
        }
    }
}

/* s[j] = scale * (q . k_j) for j < nj.  q: [hd]; k: nj rows of [hd] at stride kv_ld; s: [nj]. */
static void scores(float *s, const float *q, const float *k, size_t kv_ld, int nj, int hd, float scale)
{
    int j = 0;
    for (; j + 4 <= nj; j += 4) {
        const float *k0 = k + (size_t)j * kv_ld, *k1 = k0 + kv_ld, *k2 = k1 + kv_ld, *k3 = k2 + kv_ld;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int d = 0; d < hd; d += 8) {
            int r = hd - d < 8 ? hd - d : 8;
            __m256 qv = v8_load_part(q + d, r);
            a0 = _mm256_fmadd_ps(v8_load_part(k0 + d, r), qv, a0);
            a1 = _mm256_fmadd_ps(v8_load_part(k1 + d, r), qv, a1);
            a2 = _mm256_fmadd_ps(v8_load_part(k2 + d, r), qv, a2);
            a3 = _mm256_fmadd_ps(v8_load_part(k3 + d, r), qv, a3);
        }
        _mm_storeu_ps(s + j, _mm_mul_ps(v8_hsum4(a0, a1, a2, a3), _mm_set1_ps(scale)));
    }
    for (; j < nj; j++) {
        const float *k0 = k + (size_t)j * kv_ld;
        __m256 a0 = _mm256_setzero_ps();
        for (int d = 0; d < hd; d += 8) {
            int r = hd - d < 8 ? hd - d : 8;
            a0 = _mm256_fmadd_ps(v8_load_part(k0 + d, r), v8_load_part(q + d, r), a0);
        }
        s[j] = v8_hsum(a0) * scale;
    }
}

/* out[d] = c * out[d] + sum_j p[j] v_j[d].  out: [hd]; v: nj rows of [hd] at stride kv_ld. */
static void accumulate_v(float *out, float c, const float *p, const float *v, size_t kv_ld, int nj, int hd)
{
    const __m256 cv = _mm256_set1_ps(c);
    for (int d = 0; d < hd; d += 32) {          /* 4 registers of out at a time */
        __m256i m[4];
        __m256 acc[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            int left = hd - d - 8 * i;
            m[i] = v8_mask(left <= 0 ? 0 : left < 8 ? left : 8);
            acc[i] = _mm256_mul_ps(_mm256_maskload_ps(out + d + 8 * i, m[i]), cv);
        }
        const float *vd = v + d;
        for (int j = 0; j < nj; j++, vd += kv_ld) {
            __m256 pj = _mm256_set1_ps(p[j]);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                acc[i] = _mm256_fmadd_ps(pj, _mm256_maskload_ps(vd + 8 * i, m[i]), acc[i]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            _mm256_maskstore_ps(out + d + 8 * i, m[i], acc[i]);
    }
}

/* dst[j][d] = src[j * kv_ld + d] for j < nj, d < hd.  dst: [nj][hd]. */
static void pack_rows(float *dst, const float *src, size_t kv_ld, int nj, int hd)
{
    for (int j = 0; j < nj; j++, dst += hd, src += kv_ld)
        memcpy(dst, src, (size_t)hd * sizeof *dst);
}

/* See IFK_DECL_ATTEND in impl.h. The keys go by in chunks, and every query of the block uses a
 * chunk before the next: each query keeps a running max m, a running sum l and its
 * unnormalised output in out. When several queries share the chunks, each chunk's K and V rows
 * are first copied side by side into stack buffers (ATT_PACK floats each), which stay in L1
 * while every query uses them; the cache rows themselves are kv_ld apart, often a power of
 * two, and crowd a few sets of L1. (Measured: a third less time for GQA decode attention.)
 * A query's arithmetic depends only on its position and head_dim: chunk boundaries are
 * multiples of a step fixed by head_dim, packing copies values exactly, and the queries of a
 * block never mix, so its result is the same in any block of any call. */
IFK_DECL_ATTEND(ifk_avx2_attend)
{
    _Alignas(32) float s[ATT_CHUNK], kbuf[ATT_PACK], vbuf[ATT_PACK];
    const int packable = head_dim * 4 <= ATT_PACK, pack = nt * nh > 1 && packable;
    /* Keys a chunk: a function of head_dim alone, never of the block (whether it packs), so
     * that a query's result does not depend on the batch it came in (kernels.h). */
    int step = packable ? ATT_PACK / head_dim : ATT_CHUNK;
    step = step < ATT_CHUNK ? step : ATT_CHUNK;
    float m[IFK_ATT_MAXQ], l[IFK_ATT_MAXQ];
    for (int qi = 0; qi < nt * nh; qi++) {
        float *o = out + (size_t)(qi / nh) * ld + (size_t)(qi % nh) * head_dim;
        for (int d = 0; d < head_dim; d++)
            o[d] = 0.0f;
        m[qi] = -INFINITY;
        l[qi] = 0.0f;
    }
    for (int j0 = 0; j0 < pos + nt; j0 += step) {
        const float *kc = k + (size_t)j0 * kv_ld, *vc = v + (size_t)j0 * kv_ld;
        size_t cld = kv_ld;
        if (pack) {
            int nj = pos + nt - j0 < step ? pos + nt - j0 : step;
            pack_rows(kbuf, kc, kv_ld, nj, head_dim);
            pack_rows(vbuf, vc, kv_ld, nj, head_dim);
            kc = kbuf;
            vc = vbuf;
            cld = (size_t)head_dim;
        }
        for (int qi = 0; qi < nt * nh; qi++) {
            const int i = qi / nh, n_keys = pos + i + 1;
            if (j0 >= n_keys)
                continue;
            const int nj = n_keys - j0 < step ? n_keys - j0 : step;
            const size_t off = (size_t)i * ld + (size_t)(qi % nh) * head_dim;
            scores(s, q + off, kc, cld, nj, head_dim, scale);
            float cmx = vmax(s, nj);
            float c = 1.0f;                      /* rescales what earlier chunks summed */
            if (cmx > m[qi]) {
                c = j0 == 0 ? 0.0f : expf(m[qi] - cmx);
                m[qi] = cmx;
            }
            l[qi] = l[qi] * c + (float)exp_sub_sum(s, nj, m[qi], 0);
            accumulate_v(out + off, c, s, vc, cld, nj, head_dim);
        }
    }
    for (int qi = 0; qi < nt * nh; qi++) {
        float *o = out + (size_t)(qi / nh) * ld + (size_t)(qi % nh) * head_dim;
        const float inv = 1.0f / l[qi];
        for (int d = 0; d < head_dim; d++)
            o[d] *= inv;
    }
}
