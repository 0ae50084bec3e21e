/* kvcache.c -- the paged KV cache's kernels. See kvcache.h.
 *
 * Portable C compiled three times (GCC target clones: x86-64-v4, x86-64-v3, baseline) and
 * picked at load time. Sums are written as 16 explicit lanes added in a fixed tree, and the
 * file is compiled without FMA contraction (-std=c11), so every clone gives the same bits.
 */
#include "kernels/cpu/kvcache.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/pool.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && !defined(IFK_NO_SIMD)
#define KV_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KV_CLONES
#endif

/* ---- layout --------------------------------------------------------------------------- */

int ifk_kv_group(int head_dim) { return head_dim % 32 == 0 ? 32 : head_dim; }

static const char *const type_names[] = {"f32", "f16", "q8"};

const char *ifk_kv_type_name(int type)
{
    return type >= 0 && type <= IFK_KV_Q8 ? type_names[type] : NULL;
}

int ifk_kv_type_from_name(const char *name)
{
    for (int t = 0; t <= IFK_KV_Q8; t++)
        if (strcmp(name, type_names[t]) == 0)
            return t;
    return -1;
}

size_t ifk_kv_row_bytes(const ifk_kv_layout *L)
{
    size_t kv = (size_t)L->n_kv_heads * L->head_dim;
    switch (L->type) {
    case IFK_KV_F32: return kv * 4;
    case IFK_KV_F16: return kv * 2;
    case IFK_KV_Q8: return kv + kv / (size_t)L->group * 2;
    default: return 0;
    }
}

size_t ifk_kv_pool_bytes(const ifk_kv_layout *L)
{
    return (size_t)L->n_blocks * (size_t)L->block * ifk_kv_row_bytes(L);
}

/* The pool row of position pos of a sequence. */
static inline size_t row_of(const ifk_kv_layout *L, const int32_t *table, int pos)
{
    return (size_t)table[pos / L->block] * (size_t)L->block + (size_t)(pos % L->block);
}

/* ---- half precision (exact both ways; round to nearest even into half) ------------------ */

static inline float h2f(uint16_t h)
{
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0) {
        float f = (float)m * 0x1p-24f;
        return s ? -f : f;
    }
    if (e == 31)
        bits = s | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0);
    else
        bits = s | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t f2h(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t s = (x >> 16) & 0x8000, a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) /* inf, NaN */
        return (uint16_t)(s | 0x7c00 | (a > 0x7f800000u ? 0x200 : 0));
    if (a >= 0x477ff000u) /* rounds to >= 65520: inf */
        return (uint16_t)(s | 0x7c00);
    if (a < 0x38800000u) { /* subnormal half (or zero): round a * 2^24 to an integer, RNE */
        float v;
        memcpy(&v, &a, 4);
        return (uint16_t)(s | (uint32_t)nearbyintf(v * 0x1p24f));
    }
    uint32_t r = a - 0x38000000u; /* rebias 127 -> 15 */
    r += 0xfff + ((r >> 13) & 1);
    return (uint16_t)(s | (r >> 13));
}

/* ---- one head of one position, to F32 ----------------------------------------------------- */

/* out [head_dim] = head g of pool row r. */
static inline void load_head(float *out, const void *pool, const ifk_kv_layout *L, size_t r, int g)
{
    const int hd = L->head_dim, KV = L->n_kv_heads * hd;
    const size_t off = r * (size_t)KV + (size_t)g * hd;
    switch (L->type) {
    case IFK_KV_F32:
        memcpy(out, (const float *)pool + off, (size_t)hd * sizeof(float));
        break;
    case IFK_KV_F16: {
        const uint16_t *h = (const uint16_t *)pool + off;
        for (int d = 0; d < hd; d++)
            out[d] = h2f(h[d]);
        break;
    }
    case IFK_KV_Q8: {
        const int8_t *q = (const int8_t *)pool + off;
        const uint16_t *sc = (const uint16_t *)((const int8_t *)pool + (size_t)L->n_blocks * L->block * KV) +
                             r * (size_t)(KV / L->group) + (size_t)g * (hd / L->group);
        for (int d0 = 0; d0 < hd; d0 += L->group) {
            const float s = h2f(sc[d0 / L->group]);
            for (int d = d0; d < d0 + L->group; d++)
                out[d] = (float)q[d] * s;
        }
        break;
    }
    default:
        memset(out, 0, (size_t)hd * sizeof(float));
    }
}

/* Head g of pool row r as F32: in place for an F32 pool, else converted into buf [head_dim]. */
static inline const float *head_of(float *buf, const void *pool, const ifk_kv_layout *L, size_t r, int g)
{
    if (L->type == IFK_KV_F32)
        return (const float *)pool + r * (size_t)L->n_kv_heads * L->head_dim + (size_t)g * L->head_dim;
    load_head(buf, pool, L, r, g);
    return buf;
}

void ifk_kv_load_row(float *out, const void *pool, const ifk_kv_layout *L, const int32_t *table, int pos)
{
    size_t r = row_of(L, table, pos);
    for (int g = 0; g < L->n_kv_heads; g++)
        load_head(out + (size_t)g * L->head_dim, pool, L, r, g);
}

/* ---- store ---------------------------------------------------------------------------- */

/* Pool row r = x [KV]. */
static void store_row(void *pool, const ifk_kv_layout *L, size_t r, const float *x)
{
    const int KV = L->n_kv_heads * L->head_dim;
    switch (L->type) {
    case IFK_KV_F32:
        memcpy((float *)pool + r * KV, x, (size_t)KV * sizeof(float));
        break;
    case IFK_KV_F16: {
        uint16_t *h = (uint16_t *)pool + r * KV;
        for (int i = 0; i < KV; i++)
            h[i] = f2h(x[i]);
        break;
    }
    case IFK_KV_Q8: {
        const int G = L->group;
        int8_t *q = (int8_t *)pool + r * KV;
        uint16_t *sc = (uint16_t *)((int8_t *)pool + (size_t)L->n_blocks * L->block * KV) + r * (size_t)(KV / G);
        for (int i0 = 0; i0 < KV; i0 += G) {
            float amax = 0.0f;
            for (int i = i0; i < i0 + G; i++)
                amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
            uint16_t hs = f2h(amax / 127.0f);
            float s = h2f(hs), inv = s > 0.0f ? 1.0f / s : 0.0f;
            sc[i0 / G] = hs;
            for (int i = i0; i < i0 + G; i++) {
                float v = nearbyintf(x[i] * inv);
                q[i] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : v);
            }
        }
        break;
    }
    default:
        break;
    }
}

KV_CLONES
void ifk_kv_store(void *pool, const ifk_kv_layout *L, const ifk_kv_seq *seqs, int n_seqs, const float *x, size_t ldx,
                  int n_threads)
{
    for (int s = 0; s < n_seqs; s++)
        for (int i = 0; i < seqs[s].n_rows; i++)
            store_row(pool, L, row_of(L, seqs[s].table, seqs[s].pos0 + i), x + (size_t)(seqs[s].row0 + i) * ldx);
}

void ifk_kv_block_extent(const ifk_kv_layout *L, int64_t blk, size_t *val, size_t *val_bytes, size_t *scale,
                         size_t *scale_bytes)
{
    const size_t KV = (size_t)L->n_kv_heads * L->head_dim, rows = (size_t)L->block, r0 = (size_t)blk * rows;
    size_t elt = L->type == IFK_KV_F32 ? 4 : L->type == IFK_KV_F16 ? 2 : 1;
    *val = r0 * KV * elt;
    *val_bytes = rows * KV * elt;
    *scale = *scale_bytes = 0;
    if (L->type == IFK_KV_Q8) {
        size_t ns = KV / (size_t)L->group;
        *scale = (size_t)L->n_blocks * rows * KV + r0 * ns * 2;
        *scale_bytes = rows * ns * 2;
    }
}

/* ---- context shift ------------------------------------------------------------------------ */

/* Pool row dst = pool row src, as stored (values, and Q8's scales). */
static void copy_row(void *pool, const ifk_kv_layout *L, size_t dst, size_t src)
{
    const size_t KV = (size_t)L->n_kv_heads * L->head_dim;
    switch (L->type) {
    case IFK_KV_F32: memmove((float *)pool + dst * KV, (float *)pool + src * KV, KV * sizeof(float)); break;
    case IFK_KV_F16: memmove((uint16_t *)pool + dst * KV, (uint16_t *)pool + src * KV, KV * 2); break;
    case IFK_KV_Q8: {
        const size_t ns = KV / (size_t)L->group;
        uint16_t *sc = (uint16_t *)((int8_t *)pool + (size_t)L->n_blocks * L->block * KV);
        memmove((int8_t *)pool + dst * KV, (int8_t *)pool + src * KV, KV);
        memmove(sc + dst * ns, sc + src * ns, ns * 2);
        break;
    }
    default: break;
    }
}

void ifk_kv_shift(void *k, void *v, const ifk_kv_layout *L, const int32_t *table, int n_past, int keep, int discard,
                  const ifk_rope_params *rp, float *tmp)
{
    if (discard <= 0 || keep < 0 || keep + discard > n_past)
        return;
    for (int p = keep + discard; p < n_past; p++) {
        size_t src = row_of(L, table, p), dst = row_of(L, table, p - discard);
        ifk_kv_load_row(tmp, k, L, table, p);
        ifk_rope(tmp, L->n_kv_heads, L->head_dim, rp->rot_dim, -discard, rp->theta, rp->freq_scale, rp->layout);
        store_row(k, L, dst, tmp);
        copy_row(v, L, dst, src);
    }
}

/* ---- attention ---------------------------------------------------------------------------- */

/* GCC's vector types (the width the clone's target allows; plain code where it has none). */
typedef float kv_f16x __attribute__((vector_size(64)));
typedef float kv_f8x __attribute__((vector_size(32)));
typedef float kv_f4x __attribute__((vector_size(16)));
typedef int32_t kv_i16x __attribute__((vector_size(64)));

/* e^x per lane for the softmax's arguments (x <= 0, or -inf), within ~2 ulp of expf: Cody-Waite
 * reduction x = n ln2 + r (|r| <= ln2 / 2, n rounded to nearest even by the 1.5 * 2^23 trick), a
 * degree-6 polynomial for e^r (vec_avx512.h's v16_exp's coefficients), 2^n from its bits. Below
 * -87.3 (where 2^n leaves the normal range) and for -inf or NaN, 0: such a weight is below 1e-38
 * of the largest, which is 1. Plain multiplies and adds, no FMA (this file is compiled without
 * contraction), so every clone computes the same bits. */
static inline __attribute__((always_inline)) void exp16(kv_f16x *v)
{
    kv_f16x x = *v;
    const kv_f16x lo = x - x - 87.3f;
    kv_i16x keep = x >= lo, xi; /* -1 where the result is not 0 (false for -inf and NaN) */
    memcpy(&xi, &x, sizeof xi);
    xi &= keep;
    memcpy(&x, &xi, sizeof x);
    kv_f16x n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    kv_f16x r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    kv_f16x p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r;
    p = p + 1.0f;
    kv_i16x bits = (__builtin_convertvector(n, kv_i16x) + 127) << 23;
    kv_f16x two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    p = p * two_n;
    kv_i16x pi;
    memcpy(&pi, &p, sizeof pi);
    pi &= keep;
    memcpy(v, &pi, sizeof pi);
}

/* e^x for one value, as exp16 computes it. */
static inline __attribute__((always_inline)) float exp1(float x)
{
    kv_f16x v = {0};
    v[0] = x;
    exp16(&v);
    return v[0];
}

/* v[j] = e^(v[j] - mx) for j < n, 16 at a time (exp16). */
static inline __attribute__((always_inline)) void exp_minus(float *v, int n, float mx)
{
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        kv_f16x t;
        memcpy(&t, v + j, sizeof t);
        t -= mx;
        exp16(&t);
        memcpy(v + j, &t, sizeof t);
    }
    if (j < n) {
        kv_f16x t = {0};
        memcpy(&t, v + j, (size_t)(n - j) * sizeof(float));
        t -= mx;
        exp16(&t);
        memcpy(v + j, &t, (size_t)(n - j) * sizeof(float));
    }
}

/* a . b over n, as 16 lanes summed in a fixed tree: lane u sums the products of elements
 * i = u (mod 16) in order, then lanes u and u + w are added for w = 8, 4, 2, 1. Written with
 * vector types so that the tree stays in registers; the values are those of the scalar loops
 * (no contraction in -std=c11). */
static inline float dot(const float *a, const float *b, int n)
{
    kv_f16x acc = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        kv_f16x va, vb;
        memcpy(&va, a + i, sizeof va);
        memcpy(&vb, b + i, sizeof vb);
        acc += va * vb;
    }
    for (; i < n; i++)
        acc[i & 15] += a[i] * b[i];
    kv_f8x h8 = __builtin_shufflevector(acc, acc, 0, 1, 2, 3, 4, 5, 6, 7) +
                __builtin_shufflevector(acc, acc, 8, 9, 10, 11, 12, 13, 14, 15);
    kv_f4x h4 = __builtin_shufflevector(h8, h8, 0, 1, 2, 3) + __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
    float h2[2] = {h4[0] + h4[2], h4[1] + h4[3]};
    return h2[0] + h2[1];
}

/* out[j] = dot(q, k[j], n) * scale for 16 keys, n a multiple of 16: each key's 16 lanes exactly
 * as dot() sums them, and the 16 trees of dot() taken together, pairs of vectors at a time (the
 * same additions of the same lanes, so the same bits, in about a third of the instructions). */
static inline __attribute__((always_inline)) void dot16(float *out, const float *q, const float *const *k, int n, float scale)
{
    kv_f16x a[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++)
        a[j] = (kv_f16x){0};
    for (int i = 0; i + 16 <= n; i += 16) { /* 16 independent sums, q's step loaded once */
        kv_f16x va, vb;
        memcpy(&va, q + i, sizeof va);
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) {
            memcpy(&vb, k[j] + i, sizeof vb);
            a[j] += va * vb;
        }
    }
    kv_f16x b[8], c[4], d[2], e;
    for (int m = 0; m < 8; m++) /* w = 8: lanes 0-7 key 2m, 8-15 key 2m + 1 */
        b[m] = __builtin_shufflevector(a[2 * m], a[2 * m + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(a[2 * m], a[2 * m + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int m = 0; m < 4; m++) /* w = 4: 4 lanes a key, keys 4m .. 4m + 3 */
        c[m] = __builtin_shufflevector(b[2 * m], b[2 * m + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               __builtin_shufflevector(b[2 * m], b[2 * m + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    for (int m = 0; m < 2; m++) /* w = 2: 2 lanes a key, keys 8m .. 8m + 7 */
        d[m] = __builtin_shufflevector(c[2 * m], c[2 * m + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
               __builtin_shufflevector(c[2 * m], c[2 * m + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    /* w = 1: lane j is key j */
    e = __builtin_shufflevector(d[0], d[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
        __builtin_shufflevector(d[0], d[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    e *= scale;
    memcpy(out, &e, sizeof e);
}

/* o[d] += p[0] * v[0][d], then + p[1] * v[1][d], ... in that order for every d < hd (the
 * values of the plain loop), with o held in registers across the nj rows.  v: [nj] rows. */
static inline void add_weighted(float *restrict o, const float *const *v, const float *p, int nj, int hd)
{
    int d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64) { /* four named sums: an array of them stayed in memory */
        kv_f16x a0, a1, a2, a3, t0, t1, t2, t3;
        memcpy(&a0, o + d0, sizeof a0);
        memcpy(&a1, o + d0 + 16, sizeof a1);
        memcpy(&a2, o + d0 + 32, sizeof a2);
        memcpy(&a3, o + d0 + 48, sizeof a3);
        for (int j = 0; j < nj; j++) {
            const float *vj = v[j] + d0;
            memcpy(&t0, vj, sizeof t0);
            memcpy(&t1, vj + 16, sizeof t1);
            memcpy(&t2, vj + 32, sizeof t2);
            memcpy(&t3, vj + 48, sizeof t3);
            a0 += p[j] * t0;
            a1 += p[j] * t1;
            a2 += p[j] * t2;
            a3 += p[j] * t3;
        }
        memcpy(o + d0, &a0, sizeof a0);
        memcpy(o + d0 + 16, &a1, sizeof a1);
        memcpy(o + d0 + 32, &a2, sizeof a2);
        memcpy(o + d0 + 48, &a3, sizeof a3);
    }
    for (; d0 + 16 <= hd; d0 += 16) {
        kv_f16x a, t;
        memcpy(&a, o + d0, sizeof a);
        for (int j = 0; j < nj; j++) {
            memcpy(&t, v[j] + d0, sizeof t);
            a += p[j] * t;
        }
        memcpy(o + d0, &a, sizeof a);
    }
    for (; d0 < hd; d0++) {
        float a = o[d0];
        for (int j = 0; j < nj; j++)
            a += p[j] * v[j][d0];
        o[d0] = a;
    }
}

/* add_weighted for 8 heads at once, hd a multiple of 16: o + i hd of head i with its weights
 * p + i IFK_KV_CHUNK (every (head, element) gets the same operations in the same order as
 * add_weighted gives it; only the loads of v are shared). */
static inline __attribute__((always_inline)) void add_weighted8(float *restrict o, const float *const *v, const float *p, int nj, int hd)
{
    for (int d0 = 0; d0 + 16 <= hd; d0 += 16) {
        kv_f16x a0, a1, a2, a3, a4, a5, a6, a7, t;
        memcpy(&a0, o + d0, sizeof a0);
        memcpy(&a1, o + hd + d0, sizeof a1);
        memcpy(&a2, o + 2 * hd + d0, sizeof a2);
        memcpy(&a3, o + 3 * hd + d0, sizeof a3);
        memcpy(&a4, o + 4 * hd + d0, sizeof a4);
        memcpy(&a5, o + 5 * hd + d0, sizeof a5);
        memcpy(&a6, o + 6 * hd + d0, sizeof a6);
        memcpy(&a7, o + 7 * hd + d0, sizeof a7);
        for (int j = 0; j < nj; j++) {
            memcpy(&t, v[j] + d0, sizeof t);
            a0 += p[j] * t;
            a1 += p[IFK_KV_CHUNK + j] * t;
            a2 += p[2 * IFK_KV_CHUNK + j] * t;
            a3 += p[3 * IFK_KV_CHUNK + j] * t;
            a4 += p[4 * IFK_KV_CHUNK + j] * t;
            a5 += p[5 * IFK_KV_CHUNK + j] * t;
            a6 += p[6 * IFK_KV_CHUNK + j] * t;
            a7 += p[7 * IFK_KV_CHUNK + j] * t;
        }
        memcpy(o + d0, &a0, sizeof a0);
        memcpy(o + hd + d0, &a1, sizeof a1);
        memcpy(o + 2 * hd + d0, &a2, sizeof a2);
        memcpy(o + 3 * hd + d0, &a3, sizeof a3);
        memcpy(o + 4 * hd + d0, &a4, sizeof a4);
        memcpy(o + 5 * hd + d0, &a5, sizeof a5);
        memcpy(o + 6 * hd + d0, &a6, sizeof a6);
        memcpy(o + 7 * hd + d0, &a7, sizeof a7);
    }
}

/* The nh query heads of kv head g for one query row that attends to keys first .. n_keys - 1.
 * q, out: [nh][hd] (the row's heads g*nh ..). Online softmax over chunks of IFK_KV_CHUNK keys;
 * within a chunk each head takes the chunk's keys (scores) and values (sums) in key order, so
 * a head's output depends only on its query and the keys, whatever the order of the heads. An
 * F32 pool is read in place; other types are converted a chunk at a time. */
KV_CLONES
static void attend(float *restrict out, const float *restrict q, const void *k, const void *v, const ifk_kv_layout *L,
                   const int32_t *table, int first, int n_keys, int g, int nh, float scale)
{
    const int hd = L->head_dim, conv = L->type != IFK_KV_F32;
    float kbuf[conv ? IFK_KV_CHUNK * hd : 1], vbuf[conv ? IFK_KV_CHUNK * hd : 1];
    float m[nh], l[nh], s[nh][IFK_KV_CHUNK];
    const float *kr[IFK_KV_CHUNK], *vr[IFK_KV_CHUNK];
    for (int h = 0; h < nh; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
        memset(out + (size_t)h * hd, 0, (size_t)hd * sizeof(float));
    }
    for (int j0 = first; j0 < n_keys; j0 += IFK_KV_CHUNK) {
        const int nj = n_keys - j0 < IFK_KV_CHUNK ? n_keys - j0 : IFK_KV_CHUNK;
        for (int j = 0; j < nj; j++) {
            const size_t r = row_of(L, table, j0 + j);
            kr[j] = head_of(kbuf + (conv ? (size_t)j * hd : 0), k, L, r, g);
            vr[j] = head_of(vbuf + (conv ? (size_t)j * hd : 0), v, L, r, g);
        }
        /* the scores of every head, 16 keys at a time: their rows stay in L1 across the heads */
        int j = 0;
        if (hd % 16 == 0)
            for (; j + 16 <= nj; j += 16)
                for (int h = 0; h < nh; h++) { /* the common sizes as constants: unrolled */
                    if (hd == 64)
                        dot16(s[h] + j, q + (size_t)h * hd, kr + j, 64, scale);
                    else if (hd == 128)
                        dot16(s[h] + j, q + (size_t)h * hd, kr + j, 128, scale);
                    else
                        dot16(s[h] + j, q + (size_t)h * hd, kr + j, hd, scale);
                }
        for (; j < nj; j++)
            for (int h = 0; h < nh; h++)
                s[h][j] = dot(q + (size_t)h * hd, kr[j], hd) * scale;
        for (int h = 0; h < nh; h++) {
            if (L->softcap > 0) /* Gemma 2's attention soft-capping */
                for (int j = 0; j < nj; j++)
                    s[h][j] = L->softcap * tanhf(s[h][j] / L->softcap);
            float mx = m[h];
            for (int j = 0; j < nj; j++)
                mx = s[h][j] > mx ? s[h][j] : mx;
            const float corr = exp1(m[h] - mx); /* 0 on the first chunk (m = -inf) */
            float *o = out + (size_t)h * hd;
#pragma omp simd
            for (int d = 0; d < hd; d++)
                o[d] *= corr;
            l[h] *= corr;
            m[h] = mx;
            exp_minus(s[h], nj, mx);
        }
        /* l[h] += the weights in key order, the heads' sums interleaved (independent chains) */
        for (int j = 0; j < nj; j++)
            for (int h = 0; h < nh; h++)
                l[h] += s[h][j];
        /* the values, weighted: 8 heads at a time read each value row once */
        int h = 0;
        if (hd % 16 == 0)
            for (; h + 8 <= nh; h += 8) {
                if (hd == 64)
                    add_weighted8(out + (size_t)h * hd, vr, s[h], nj, 64);
                else if (hd == 128)
                    add_weighted8(out + (size_t)h * hd, vr, s[h], nj, 128);
                else
                    add_weighted8(out + (size_t)h * hd, vr, s[h], nj, hd);
            }
        for (; h < nh; h++)
            add_weighted(out + (size_t)h * hd, vr, s[h], nj, hd);
    }
    for (int h = 0; h < nh; h++) {
        float *o = out + (size_t)h * hd;
        const float inv = 1.0f / l[h];
        for (int d = 0; d < hd; d++)
            o[d] *= inv;
    }
}

/* Paged attention on the pool (pool.h): item i is units [i * upi, (i + 1) * upi) of
 * (query row, kv head), in place. */
typedef struct {
    float *out;
    const float *q;
    size_t ld;
    const void *k, *v;
    const ifk_kv_layout *L;
    const ifk_kv_seq *seqs;
    const int *first; /* [n_seqs + 1] unit index of each sequence's first row */
    int n_kv, nh, hd, units, upi;
    float scale;
} paged_args;

KV_CLONES
static void paged_run(const void *args, const void *in, int item, float *unused)
{
    const paged_args *a = args;
    int u1 = (item + 1) * a->upi < a->units ? (item + 1) * a->upi : a->units;
    int s = 0;
    for (int u = item * a->upi; u < u1; u++) {
        while (a->first[s + 1] <= u)
            s++;
        const int i = (u - a->first[s]) / a->n_kv, g = (u - a->first[s]) % a->n_kv;
        const size_t off = (size_t)(a->seqs[s].row0 + i) * a->ld + (size_t)g * a->nh * a->hd;
        const int n_keys = a->seqs[s].pos0 + (a->L->bidirectional ? a->seqs[s].n_rows : i + 1), w = a->L->window;
        attend(a->out + off, a->q + off, a->k, a->v, a->L, a->seqs[s].table, w > 0 && n_keys > w ? n_keys - w : 0,
               n_keys, g, a->nh, a->scale);
    }
}

void ifk_attention_paged(float *out, const float *q, size_t ld, const void *k, const void *v,
                         const ifk_kv_layout *L, const ifk_kv_seq *seqs, int n_seqs, int n_heads,
                         float scale, int n_threads)
{
    const int n_kv = L->n_kv_heads, hd = L->head_dim;
    if (n_seqs <= 0 || n_kv <= 0 || n_heads % n_kv)
        return;
    const int nh = n_heads / n_kv;
    int first[n_seqs + 1];
    first[0] = 0;
    for (int s = 0; s < n_seqs; s++)
        first[s + 1] = first[s] + seqs[s].n_rows * n_kv;
    const int units = first[n_seqs];
    int nt = n_threads > 0 ? n_threads : omp_get_num_procs();
    if (nt > units)
        nt = units;
    const int upi = (units + IFK_POOL_MAX_ITEMS - 1) / IFK_POOL_MAX_ITEMS;
    paged_args a = {out, q, ld, k, v, L, seqs, first, n_kv, nh, hd, units, upi, scale};
    ifk_pool_run(&(ifk_pool_job){.run = paged_run, .args = &a, .args_size = sizeof a,
                                 .n_items = (units + upi - 1) / upi, .max_threads = nt});
}
