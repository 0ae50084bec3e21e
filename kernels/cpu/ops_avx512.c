/*
 * ops_avx512.c -- the elementwise kernels and attention with AVX-512.
 *
 * Attention walks the keys in chunks with an online softmax: each chunk's scores sit in a
 * stack buffer; when a chunk raises a query's running maximum, what was accumulated so far is
 * rescaled by e^(old max - new max). Up to one chunk of keys this is the plain max-subtracted
 * softmax. Head sizes 64 and 128 get code with q in registers and no masks. Chunk boundaries
 * depend on head_dim alone, so a query's result does not depend on the batch it came in
 * (kernels.h's batch invariance).
 */
#include <math.h>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/vec_avx512.h"

#define ATT_CHUNK 64    /* most keys a chunk */
#define ATT_PACK 2048   /* floats of K (and of V) copied a chunk, when packing */

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
    __m512d a0 = _mm512_setzero_pd(), a1 = a0;   /* sum of squares in double, as ref.c */
    for (int i = 0; i < n; i += 16) {
        __m512 v = _mm512_maskz_loadu_ps(v16_mask(n - i < 16 ? n - i : 16), x + i);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v)), hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
        a0 = _mm512_fmadd_pd(lo, lo, a0);
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    double ss = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    __m512 inv = _mm512_set1_ps((float)(1.0 / sqrt(ss / n + (double)eps)));
    for (int i = 0; i < n; i += 16) {
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
    __m512d sum = _mm512_setzero_pd();           /* in double, as ref.c */
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = v16_mask(n - i < 16 ? n - i : 16);
        __m512 e = _mm512_maskz_mov_ps(m, v16_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mx)));
        sum = _mm512_add_pd(sum, _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(e)),
                                               _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1))));
        _mm512_mask_storeu_ps(x + i, m, e);
    }
    __m512 inv = _mm512_set1_ps((float)(1.0 / _mm512_reduce_add_pd(sum)));
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

/* 16 values (mask m) of F16 from p, as F32. */
IFK_INLINE __m512 h16(const uint16_t *p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }

/* y's 16 columns (mask m) at yn: + a (add), or a. */
IFK_INLINE void put16(float *yn, __mmask16 m, __m512 a, int add)
{
    _mm512_mask_storeu_ps(yn, m, add ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, yn), a) : a);
}

/* ifk_lowrank_up (kernels.h, impl.h): a whole tile's 64 columns in four independent chains (the
 * chain of one column in q order, as ifk_ref_lowrank_up's) reading the tile as one run; the last,
 * narrower tile 16 columns at a time, masked. */
void ifk_avx512_lowrank_up(float *y, size_t ldy, const uint16_t *bt, const float *t, size_t ldt, int T, int N, int r,
                           int add)
{
    const __mmask16 all = 0xffff;
    for (int c0 = 0; c0 < N; c0 += IFK_LR_TILE) {
        const int w = N - c0 < IFK_LR_TILE ? N - c0 : IFK_LR_TILE;
        const uint16_t *tile = bt + (size_t)c0 * r;
        for (int i = 0; i < T; i++) {
            const float *ti = t + (size_t)i * ldt;
            float *yi = y + (size_t)i * ldy + c0;
            if (w == IFK_LR_TILE) {
                __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (int q = 0; q < r; q++) {
                    const __m512 tq = _mm512_set1_ps(ti[q]);
                    const uint16_t *row = tile + (size_t)q * IFK_LR_TILE;
                    a0 = _mm512_fmadd_ps(tq, h16(row, all), a0);
                    a1 = _mm512_fmadd_ps(tq, h16(row + 16, all), a1);
                    a2 = _mm512_fmadd_ps(tq, h16(row + 32, all), a2);
                    a3 = _mm512_fmadd_ps(tq, h16(row + 48, all), a3);
                }
                put16(yi, all, a0, add);
                put16(yi + 16, all, a1, add);
                put16(yi + 32, all, a2, add);
                put16(yi + 48, all, a3, add);
                continue;
            }
            for (int n = 0; n < w; n += 16) {
                const __mmask16 m = v16_mask(w - n < 16 ? w - n : 16);
                __m512 a = _mm512_setzero_ps();
                for (int q = 0; q < r; q++)
                    a = _mm512_fmadd_ps(_mm512_set1_ps(ti[q]), h16(tile + (size_t)q * w + n, m), a);
                put16(yi + n, m, a, add);
            }
        }
    }
}

/* s[j] = scale * (q . k_j) for j < nj.  q: [head_dim]; k: nj rows of [head_dim] at stride
 * kv_ld; s: [nj]. Called with a constant hd (a multiple of 16, at most 128) it keeps q in
 * registers and needs no masks; hd == 0 means any head_dim. */
IFK_INLINE void scores(int hd, float *s, const float *q, const float *k, size_t kv_ld, int nj,
                       int head_dim, float scale)
{
    const int fixed = hd > 0;
    if (!fixed)
        hd = head_dim;
    __m512 qr[8];
    if (fixed)
#pragma GCC unroll 8
        for (int d = 0; d < hd; d += 16)
            qr[d / 16] = _mm512_loadu_ps(q + d);
    const __m128 sc = _mm_set1_ps(scale);
    int j = 0;
    for (; j + 4 <= nj; j += 4) {
        const float *k0 = k + (size_t)j * kv_ld, *k1 = k0 + kv_ld, *k2 = k1 + kv_ld, *k3 = k2 + kv_ld;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#pragma GCC unroll 8
        for (int d = 0; d < hd; d += 16) {
            __mmask16 m = fixed ? (__mmask16)0xffff : v16_mask(hd - d < 16 ? hd - d : 16);
            __m512 qv = fixed ? qr[d / 16] : _mm512_maskz_loadu_ps(m, q + d);
            a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, k0 + d), qv, a0);
            a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, k1 + d), qv, a1);
            a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, k2 + d), qv, a2);
            a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, k3 + d), qv, a3);
        }
        _mm_storeu_ps(s + j, _mm_mul_ps(v16_hsum4(a0, a1, a2, a3), sc));
    }
    for (; j < nj; j++) {
        const float *k0 = k + (size_t)j * kv_ld;
        __m512 a0 = _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int d = 0; d < hd; d += 16) {
            __mmask16 m = fixed ? (__mmask16)0xffff : v16_mask(hd - d < 16 ? hd - d : 16);
            __m512 qv = fixed ? qr[d / 16] : _mm512_maskz_loadu_ps(m, q + d);
            a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, k0 + d), qv, a0);
        }
        s[j] = _mm512_reduce_add_ps(a0) * scale;
    }
}

/* out[d] = c * out[d] + sum_j p[j] v_j[d].  out: [head_dim]; p: [nj]; v: nj rows of
 * [head_dim] at stride kv_ld. hd as for scores(). */
IFK_INLINE void accumulate_v(int hd, float *out, float c, const float *p, const float *v, size_t kv_ld,
                             int nj, int head_dim)
{
    const int fixed = hd > 0;
    if (!fixed)
        hd = head_dim;
    const __m512 cv = _mm512_set1_ps(c);
    for (int d = 0; d < hd; d += 128) {         /* up to 8 registers of out at a time */
        const int nr = fixed ? (hd - d < 128 ? hd - d : 128) / 16 : 8;
        __mmask16 m[8];
        __m512 acc[8];
#pragma GCC unroll 8
        for (int i = 0; i < nr; i++) {
            int left = hd - d - 16 * i;
            m[i] = fixed ? (__mmask16)0xffff : v16_mask(left <= 0 ? 0 : left < 16 ? left : 16);
            acc[i] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m[i], out + d + 16 * i), cv);
        }
        const float *vd = v + d;
        for (int j = 0; j < nj; j++, vd += kv_ld) {
            __m512 pj = _mm512_set1_ps(p[j]);
#pragma GCC unroll 8
            for (int i = 0; i < nr; i++)
                acc[i] = _mm512_fmadd_ps(pj, _mm512_maskz_loadu_ps(m[i], vd + 16 * i), acc[i]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < nr; i++)
            _mm512_mask_storeu_ps(out + d + 16 * i, m[i], acc[i]);
    }
}

/* One query's pass over one chunk of nj keys: scores, softmax update, V sum.  o, q:
 * [head_dim]; kc, vc: nj rows at stride kv_ld; m, l: the query's running max and sum. */
IFK_INLINE void attend_chunk(int hd, float *o, const float *q, const float *kc, const float *vc,
                             size_t kv_ld, int nj, int head_dim, float scale, int first,
                             float *m, float *l)
{
    _Alignas(64) float s[ATT_CHUNK];
    scores(hd, s, q, kc, kv_ld, nj, head_dim, scale);
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < nj; j += 16) {
        __mmask16 mk = v16_mask(nj - j < 16 ? nj - j : 16);
        mv = _mm512_mask_max_ps(mv, mk, mv, _mm512_maskz_loadu_ps(mk, s + j));
    }
    float cmx = _mm512_reduce_max_ps(mv);
    float c = 1.0f;                              /* rescales what earlier chunks summed */
    if (cmx > *m) {
        c = first ? 0.0f : expf(*m - cmx);
        *m = cmx;
    }
    __m512 mxv = _mm512_set1_ps(*m), sv = _mm512_setzero_ps();
    for (int j = 0; j < nj; j += 16) {
        __mmask16 mk = v16_mask(nj - j < 16 ? nj - j : 16);
        __m512 e = v16_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j), mxv));
        sv = _mm512_mask_add_ps(sv, mk, sv, e);
        _mm512_mask_storeu_ps(s + j, mk, e);
    }
    *l = *l * c + _mm512_reduce_add_ps(sv);
    accumulate_v(hd, o, c, s, vc, kv_ld, nj, head_dim);
}

static void attend_chunk_64(float *o, const float *q, const float *kc, const float *vc, size_t kv_ld,
                            int nj, int head_dim, float scale, int first, float *m, float *l)
{
    attend_chunk(64, o, q, kc, vc, kv_ld, nj, head_dim, scale, first, m, l);
}

static void attend_chunk_128(float *o, const float *q, const float *kc, const float *vc, size_t kv_ld,
                             int nj, int head_dim, float scale, int first, float *m, float *l)
{
    attend_chunk(128, o, q, kc, vc, kv_ld, nj, head_dim, scale, first, m, l);
}

static void attend_chunk_any(float *o, const float *q, const float *kc, const float *vc, size_t kv_ld,
                             int nj, int head_dim, float scale, int first, float *m, float *l)
{
    attend_chunk(0, o, q, kc, vc, kv_ld, nj, head_dim, scale, first, m, l);
}

/* dst[j][d] = src[j * kv_ld + d] for j < nj, d < hd.  dst: [nj][hd]. */
static void pack_rows(float *dst, const float *src, size_t kv_ld, int nj, int hd)
{
    for (int j = 0; j < nj; j++, dst += hd, src += kv_ld)
        for (int d = 0; d < hd; d += 16) {
            __mmask16 mk = v16_mask(hd - d < 16 ? hd - d : 16);
            _mm512_mask_storeu_ps(dst + d, mk, _mm512_maskz_loadu_ps(mk, src + d));
        }
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
IFK_DECL_ATTEND(ifk_avx512_attend)
{
    _Alignas(64) float kbuf[ATT_PACK], vbuf[ATT_PACK];
    void (*chunk)(float *, const float *, const float *, const float *, size_t, int, int, float, int,
                  float *, float *) =
        head_dim == 64 ? attend_chunk_64 : head_dim == 128 ? attend_chunk_128 : attend_chunk_any;
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
            chunk(out + off, q + off, kc, vc, cld, nj, head_dim, scale, j0 == 0, &m[qi], &l[qi]);
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
