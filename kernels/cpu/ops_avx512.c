/*
 * ops_avx512.c -- the elementwise kernels and attention with AVX-512.
 *
 * Attention walks the keys in chunks of ATT_CHUNK with an online softmax: each chunk's scores
 * sit in a stack buffer; when a chunk raises the running maximum, what was accumulated so far
 * is rescaled by e^(old max - new max). Up to ATT_CHUNK keys this is the plain max-subtracted
 * softmax.
 */
#include <math.h>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/vec_avx512.h"

#define ATT_CHUNK 64

/* y, x: [n]. */
void ifk_avx512_exp(float *y, const float *x, int n)
{
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = v16_mask(n - i < 16 ? n - i : 16);
        _mm512_mask_storeu_ps(y + i, m, v16_exp(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

/* out: [K] = W[row] as F32; W: [*][K] of wtype. */
void ifk_avx512_get_row(float *out, const void *W, int wtype, size_t row, int K)
{
    if (wtype != IFK_F32 && wtype != IFK_F16 && wtype != IFK_BF16) {
        ifk_ref_get_row(out, W, wtype, row, K);
        return;
    }
    size_t base = row * (size_t)K;
    int k = 0;
    for (; k + 16 <= K; k += 16)
        _mm512_storeu_ps(out + k, v16_load_w(W, wtype, base + k));
    if (k < K)
        _mm512_mask_storeu_ps(out + k, v16_mask(K - k), v16_load_w_mask(W, wtype, base + k, v16_mask(K - k)));
}

/* y, x, w: [n]. */
void ifk_avx512_rmsnorm(float *y, const float *x, const float *w, int n, float eps)
{
    if (n <= 0)
        return;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 v0 = _mm512_loadu_ps(x + i), v1 = _mm512_loadu_ps(x + i + 16);
        a0 = _mm512_fmadd_ps(v0, v0, a0);
        a1 = _mm512_fmadd_ps(v1, v1, a1);
    }
    for (; i < n; i += 16) {
        __m512 v = _mm512_maskz_loadu_ps(v16_mask(n - i < 16 ? n - i : 16), x + i);
        a0 = _mm512_fmadd_ps(v, v, a0);
    }
    float ss = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    __m512 inv = _mm512_set1_ps((float)(1.0 / sqrt((double)ss / n + (double)eps)));
    for (i = 0; i < n; i += 16) {
        __mmask16 m = v16_mask(n - i < 16 ? n - i : 16);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
    }
}

/* x: [n], in place. */
void ifk_avx512_softmax(float *x, int n)
{
    if (n <= 0)
        return;
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = v16_mask(n - i < 16 ? n - i : 16);
        mv = _mm512_mask_max_ps(mv, m, mv, _mm512_maskz_loadu_ps(m, x + i));
    }
    __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
    __m512 sum = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = v16_mask(n - i < 16 ? n - i : 16);
        __m512 e = v16_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mx));
        sum = _mm512_mask_add_ps(sum, m, sum, e);
        _mm512_mask_storeu_ps(x + i, m, e);
    }
    __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = v16_mask(n - i < 16 ? n - i : 16);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
    }
}

/* g, u: [n]; g = g / (1 + e^-g) * u. */
void ifk_avx512_silu_mul(float *g, const float *u, int n)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = v16_mask(n - i < 16 ? n - i : 16);
        __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
        __m512 e = v16_exp(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
    }
}

/* y, x: [n]. */
void ifk_avx512_add(float *y, const float *x, int n)
{
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = v16_mask(n - i < 16 ? n - i : 16);
        _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i),
                                                      _mm512_maskz_loadu_ps(m, x + i)));
    }
}

/* s[j] = scale * (q . k_j) for j < nj.  q: [hd]; k: nj rows of [hd] at stride kv_ld; s: [nj]. */
static void scores(float *s, const float *q, const float *k, size_t kv_ld, int nj, int hd, float scale)
{
    const __m512 sc = _mm512_set1_ps(scale);
    int j = 0;
    for (; j + 4 <= nj; j += 4) {
        const float *k0 = k + (size_t)j * kv_ld, *k1 = k0 + kv_ld, *k2 = k1 + kv_ld, *k3 = k2 + kv_ld;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int d = 0; d < hd; d += 16) {
            __mmask16 m = v16_mask(hd - d < 16 ? hd - d : 16);
            __m512 qv = _mm512_maskz_loadu_ps(m, q + d);
            a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, k0 + d), qv, a0);
            a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, k1 + d), qv, a1);
            a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, k2 + d), qv, a2);
            a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, k3 + d), qv, a3);
        }
        _mm_storeu_ps(s + j, _mm_mul_ps(v16_hsum4(a0, a1, a2, a3), _mm512_castps512_ps128(sc)));
    }
    for (; j < nj; j++) {
        const float *k0 = k + (size_t)j * kv_ld;
        __m512 a0 = _mm512_setzero_ps();
        for (int d = 0; d < hd; d += 16) {
            __mmask16 m = v16_mask(hd - d < 16 ? hd - d : 16);
            a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, k0 + d), _mm512_maskz_loadu_ps(m, q + d), a0);
        }
        s[j] = _mm512_reduce_add_ps(a0) * scale;
    }
}

/* out[d] = c * out[d] + sum_j p[j] v_j[d].  out: [hd]; v: nj rows of [hd] at stride kv_ld. */
static void accumulate_v(float *out, float c, const float *p, const float *v, size_t kv_ld, int nj, int hd)
{
    const __m512 cv = _mm512_set1_ps(c);
    for (int d = 0; d < hd; d += 64) {          /* 4 registers of out at a time */
        __mmask16 m[4];
        __m512 acc[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            int left = hd - d - 16 * i;
            m[i] = v16_mask(left <= 0 ? 0 : left < 16 ? left : 16);
            acc[i] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m[i], out + d + 16 * i), cv);
        }
        const float *vd = v + d;
        for (int j = 0; j < nj; j++, vd += kv_ld) {
            __m512 pj = _mm512_set1_ps(p[j]);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                acc[i] = _mm512_fmadd_ps(pj, _mm512_maskz_loadu_ps(m[i], vd + 16 * i), acc[i]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            _mm512_mask_storeu_ps(out + d + 16 * i, m[i], acc[i]);
    }
}

/* See IFK_DECL_ATTEND in impl.h. The keys go by in chunks of ATT_CHUNK rows (which stay in L1
 * while every query of the block uses them); each query keeps a running max m, a running sum
 * l and its unnormalised output in out. */
IFK_DECL_ATTEND(ifk_avx512_attend)
{
    _Alignas(64) float s[ATT_CHUNK];
    float m[IFK_ATT_MAXQ], l[IFK_ATT_MAXQ];
    for (int qi = 0; qi < nt * nh; qi++) {
        float *o = out + (size_t)(qi / nh) * ld + (size_t)(qi % nh) * head_dim;
        for (int d = 0; d < head_dim; d++)
            o[d] = 0.0f;
        m[qi] = -INFINITY;
        l[qi] = 0.0f;
    }
    for (int j0 = 0; j0 < pos + nt; j0 += ATT_CHUNK) {
        const float *kc = k + (size_t)j0 * kv_ld, *vc = v + (size_t)j0 * kv_ld;
        for (int qi = 0; qi < nt * nh; qi++) {
            const int i = qi / nh, n_keys = pos + i + 1;
            if (j0 >= n_keys)
                continue;
            const int nj = n_keys - j0 < ATT_CHUNK ? n_keys - j0 : ATT_CHUNK;
            const size_t off = (size_t)i * ld + (size_t)(qi % nh) * head_dim;
            scores(s, q + off, kc, kv_ld, nj, head_dim, scale);
            __m512 mv = _mm512_set1_ps(-INFINITY);
            for (int j = 0; j < nj; j += 16) {
                __mmask16 mk = v16_mask(nj - j < 16 ? nj - j : 16);
                mv = _mm512_mask_max_ps(mv, mk, mv, _mm512_maskz_loadu_ps(mk, s + j));
            }
            float cmx = _mm512_reduce_max_ps(mv);
            float c = 1.0f;                      /* rescales what earlier chunks summed */
            if (cmx > m[qi]) {
                c = j0 == 0 ? 0.0f : expf(m[qi] - cmx);
                m[qi] = cmx;
            }
            __m512 mxv = _mm512_set1_ps(m[qi]), sv = _mm512_setzero_ps();
            for (int j = 0; j < nj; j += 16) {
                __mmask16 mk = v16_mask(nj - j < 16 ? nj - j : 16);
                __m512 e = v16_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j), mxv));
                sv = _mm512_mask_add_ps(sv, mk, sv, e);
                _mm512_mask_storeu_ps(s + j, mk, e);
            }
            l[qi] = l[qi] * c + _mm512_reduce_add_ps(sv);
            accumulate_v(out + off, c, s, vc, kv_ld, nj, head_dim);
        }
    }
    for (int qi = 0; qi < nt * nh; qi++) {
        float *o = out + (size_t)(qi / nh) * ld + (size_t)(qi % nh) * head_dim;
        const __m512 inv = _mm512_set1_ps(1.0f / l[qi]);
        for (int d = 0; d < head_dim; d += 16) {
            __mmask16 mk = v16_mask(head_dim - d < 16 ? head_dim - d : 16);
            _mm512_mask_storeu_ps(o + d, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, o + d), inv));
        }
    }
}
