/* kvcache.c -- the paged KV cache's kernels. See kvcache.h.
 *
 * Portable C compiled three times (GCC target clones: x86-64-v4, x86-64-v3, baseline) and
 * picked at load time. Sums are written as 16 explicit lanes added in a fixed tree; the file is
 * compiled without FMA contraction (-std=c11), and the products that are fused say so (KV_FMA:
 * fmaf, exact in every clone), so every clone gives the same bits.
 *
 * Decoding speed (docs/PERFORMANCE.md, "Decoding attention on the CPU"): a row's attention walks
 * one kv head's slice of every cached position. The cache is in huge pages (the engine allocates
 * it with bigmem.h), the next chunk's slices are requested from inside this chunk's loops
 * (kv_pf), and the 16 x 16 transposes of the keys are unrolled so that they stay in registers.
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

/* GCC's vector types (the width the clone's target allows; plain code where it has none). */
typedef float kv_f16x __attribute__((vector_size(64)));
typedef float kv_f8x __attribute__((vector_size(32)));
typedef float kv_f4x __attribute__((vector_size(16)));
typedef signed char kv_i8x16 __attribute__((vector_size(16)));
typedef short kv_s16x16 __attribute__((vector_size(32)));
typedef int32_t kv_i16x __attribute__((vector_size(64)));

/* acc += s * v lane by lane, each lane one fused multiply-add (one rounding): fmaf, which GCC
 * makes vfmadd in the clones that have FMA and the C library computes exactly in the one that
 * has not, so every clone still gives the same bits. A function that uses it is inlined into the
 * clones (always_inline): out of line it is compiled for baseline x86-64 and calls fmaf a lane. */
#define KV_FMA(acc, s, v)                                                                          \
    do {                                                                                           \
        const float kv_s_ = (s);                                                                   \
        for (int kv_i_ = 0; kv_i_ < 16; kv_i_++)                                                   \
            (acc)[kv_i_] = __builtin_fmaf(kv_s_, (v)[kv_i_], (acc)[kv_i_]);                        \
    } while (0)

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

/* Bytes of one cached value (a Q8 pool's scales aside). */
static inline size_t value_bytes(const ifk_kv_layout *L)
{
    return L->type == IFK_KV_F32 ? 4 : L->type == IFK_KV_F16 ? 2 : 1;
}

/* Byte offsets into a pool of head g of row r: its values, and (Q8) its group scales, which
 * follow every row's values. */
static inline size_t head_values_at(const ifk_kv_layout *L, size_t r, int g)
{
    return (r * L->n_kv_heads * L->head_dim + (size_t)g * L->head_dim) * value_bytes(L);
}

static inline size_t head_scales_at(const ifk_kv_layout *L, size_t r, int g)
{
    const size_t KV = (size_t)L->n_kv_heads * L->head_dim;
    return (size_t)L->n_blocks * L->block * KV + (r * (KV / L->group) + (size_t)g * (L->head_dim / L->group)) * 2;
}

/* rows[i] = row_of(pos0 + i) for i < n, with one division (a division a key was a tenth of a
 * decoding row's attention over a Q8 pool). */
static inline __attribute__((always_inline)) void rows_of(size_t *rows, const ifk_kv_layout *L, const int32_t *table,
                                                         int pos0, int n)
{
    int b = pos0 / L->block, o = pos0 % L->block;
    for (int i = 0; i < n; i++) {
        rows[i] = (size_t)table[b] * (size_t)L->block + (size_t)o;
        if (++o == L->block)
            o = 0, b++;
    }
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
static inline __attribute__((always_inline)) void load_head(float *out, const void *pool, const ifk_kv_layout *L, size_t r,
                                                          int g)
{
    const int hd = L->head_dim, KV = L->n_kv_heads * hd;
    const size_t off = r * (size_t)KV + (size_t)g * hd;
    switch (L->type) {
    case IFK_KV_F32:
        memcpy(out, (const float *)pool + off, (size_t)hd * sizeof(float));
        break;
    case IFK_KV_F16: /* the kernel path's row conversion: vcvtph2ps, 16 or 8 at a time (exact, as h2f;
                      * h2f one value at a time cost more than the half of the bytes saved) */
        ifk_get_row(out, (const uint16_t *)pool + off, IFK_F16, 0, hd);
        break;
    case IFK_KV_Q8: {
        const int8_t *q = (const int8_t *)pool + off;
        const uint16_t *sc = (const uint16_t *)((const char *)pool + head_scales_at(L, r, g));
        for (int d0 = 0; d0 < hd; d0 += L->group) {
            const float s = h2f(sc[d0 / L->group]);
            int d = d0;
            for (; d + 16 <= d0 + L->group; d += 16) { /* the loop below, 16 at a time (it stayed scalar) */
                kv_i8x16 v;
                memcpy(&v, q + d, sizeof v);
                /* through int16 and int32: GCC 12 turned int8 -> float (and int8 -> int32) into
                 * a scalar conversion a lane */
                const kv_f16x y =
                    __builtin_convertvector(__builtin_convertvector(__builtin_convertvector(v, kv_s16x16), kv_i16x),
                                            kv_f16x) * s;
                memcpy(out + d, &y, sizeof y);
            }
            for (; d < d0 + L->group; d++)
                out[d] = (float)q[d] * s;
        }
        break;
    }
    default:
        memset(out, 0, (size_t)hd * sizeof(float));
    }
}

/* ---- prefetch: the next chunk's rows while this one is computed ------------------------- */

/* A kv head's values are a slice of every pool row (n_kv_heads slices a row): a stride the
 * hardware's prefetchers follow poorly, so a decoding row's attention waited on memory most of
 * its time. The cache lines of the next chunk's K and V slices (and a Q8 pool's scales) are
 * listed when a chunk starts and requested one at a time from inside the chunk's loops (one an
 * iteration of the scores' and of the weighted values' loops): issued all at once, most of them
 * were dropped. */
#define KV_PF_MAX (4 * IFK_KV_CHUNK) /* a chunk's K and V slices, and a Q8 pool's two scale runs */
typedef struct {
    const char *at[KV_PF_MAX]; /* start of each slice */
    int lines[KV_PF_MAX];      /* its cache lines     */
    int n, e, l;               /* slices; the next one to request, and its next line */
} kv_pf;

/* Head g of pool row r (values, then a Q8 pool's scales) onto the list. */
static inline __attribute__((always_inline)) void pf_add(kv_pf *pf, const void *pool, const ifk_kv_layout *L, size_t r,
                                                        int g)
{
    pf->at[pf->n] = (const char *)pool + head_values_at(L, r, g);
    pf->lines[pf->n++] = (int)(((size_t)L->head_dim * value_bytes(L) + 63) / 64);
    if (L->type == IFK_KV_Q8) {
        pf->at[pf->n] = (const char *)pool + head_scales_at(L, r, g);
        pf->lines[pf->n++] = 1;
    }
}

/* The next line of the list into the L2 cache (pf NULL or done: nothing). */
static inline __attribute__((always_inline)) void pf_step(kv_pf *pf)
{
    if (pf && pf->e < pf->n) {
        __builtin_prefetch(pf->at[pf->e] + 64 * pf->l, 0, 2);
        if (++pf->l == pf->lines[pf->e])
            pf->l = 0, pf->e++;
    }
}

/* The lines the loops did not get to. */
static inline __attribute__((always_inline)) void pf_rest(kv_pf *pf)
{
    while (pf->e < pf->n)
        pf_step(pf);
}

/* Head g of pool row r as F32: in place for an F32 pool, else converted into buf [head_dim]. */
static inline __attribute__((always_inline)) const float *head_of(float *buf, const void *pool, const ifk_kv_layout *L,
                                                                 size_t r, int g)
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
    const size_t elt = value_bytes(L);
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

/* Scores against keys held transposed: kt[d * IFK_KV_CHUNK + j] is key j's element d. Each
 * lane is a key, so a head's score is one lane's sum over d in order (q[0] k[0] + q[1] k[1] + ...,
 * then times scale), with no reduction across lanes; the heads share each load of kt. */

/* 16x16 transpose of r[0..15] (rows) in place: four rounds that swap the off-diagonal w x w
 * blocks, w = 8, 4, 2, 1. */
#define KV_SWAP(w, lo, hi)                                                                         \
    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++)                                          \
        if (!(i & (w))) {                                                                          \
            kv_f16x a = r[i], b = r[i + (w)];                                                      \
            r[i] = __builtin_shufflevector(a, b, lo);                                              \
            r[i + (w)] = __builtin_shufflevector(a, b, hi);                                        \
        }
#define KV_LO8 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define KV_HI8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define KV_LO4 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27
#define KV_HI4 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define KV_LO2 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define KV_HI2 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define KV_LO1 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30
#define KV_HI1 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31
static inline __attribute__((always_inline)) void transpose16(kv_f16x *r)
{
    KV_SWAP(8, KV_LO8, KV_HI8)
    KV_SWAP(4, KV_LO4, KV_HI4)
    KV_SWAP(2, KV_LO2, KV_HI2)
    KV_SWAP(1, KV_LO1, KV_HI1)
}
#undef KV_SWAP
#undef KV_LO8
#undef KV_HI8
#undef KV_LO4
#undef KV_HI4
#undef KV_LO2
#undef KV_HI2
#undef KV_LO1
#undef KV_HI1

/* kt[d * IFK_KV_CHUNK + j0 + j] = kr[j][d]: a group of nk <= 16 keys of a chunk (rows kr[j] of hd),
 * transposed, keys nk .. 15 of the group zero. */
static inline __attribute__((always_inline)) void transpose_group(float *kt, const float *const *kr, int j0, int nk,
                                                                 int hd)
{
    int d0 = 0;
    for (; d0 + 16 <= hd; d0 += 16) {
        kv_f16x r[16];
        if (nk == 16)
            _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++)
                memcpy(&r[j], kr[j] + d0, sizeof r[j]);
        else
            _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) {
                r[j] = (kv_f16x){0};
                if (j < nk)
                    memcpy(&r[j], kr[j] + d0, sizeof r[j]);
            }
        transpose16(r);
        _Pragma("GCC unroll 16") for (int d = 0; d < 16; d++)
            memcpy(kt + (size_t)(d0 + d) * IFK_KV_CHUNK + j0, &r[d], sizeof r[d]);
    }
    for (; d0 < hd; d0++)
        for (int j = 0; j < 16; j++)
            kt[(size_t)d0 * IFK_KV_CHUNK + j0 + j] = j < nk ? kr[j][d0] : 0.0f;
}

/* s[h * IFK_KV_CHUNK + j] = scale * q_h . key j for H heads (q_h = q + h hd), keys 0 .. n16 - 1
 * (n16 a multiple of 16), 16 at a time (each product's q taken by a broadcast load: two groups of
 * keys sharing one broadcast register measured slower). */
static inline __attribute__((always_inline)) void scores_h(const int H, float *s, const float *q, const float *kt,
                                                            int n16, int hd, float scale, kv_pf *pf)
{
    int j = 0;
    for (; j < n16; j += 16) {
        kv_f16x a[8];
        _Pragma("GCC unroll 8") for (int h = 0; h < H; h++)
            a[h] = (kv_f16x){0};
        for (int d = 0; d < hd; d++) {
            kv_f16x k0;
            pf_step(pf);
            memcpy(&k0, kt + (size_t)d * IFK_KV_CHUNK + j, sizeof k0);
            _Pragma("GCC unroll 8") for (int h = 0; h < H; h++)
                KV_FMA(a[h], q[(size_t)h * hd + d], k0);
        }
        _Pragma("GCC unroll 8") for (int h = 0; h < H; h++) {
            a[h] *= scale;
            memcpy(s + (size_t)h * IFK_KV_CHUNK + j, &a[h], sizeof a[h]);
        }
    }
}

/* scores_h for nh heads: 8, then 4, then one at a time. */
static inline __attribute__((always_inline)) void scores(float *s, const float *q, const float *kt, int n16, int nh,
                                                          int hd, float scale, kv_pf *pf)
{
    int h = 0;
    for (; h + 8 <= nh; h += 8)
        scores_h(8, s + (size_t)h * IFK_KV_CHUNK, q + (size_t)h * hd, kt, n16, hd, scale, pf);
    for (; h + 4 <= nh; h += 4)
        scores_h(4, s + (size_t)h * IFK_KV_CHUNK, q + (size_t)h * hd, kt, n16, hd, scale, pf);
    for (; h < nh; h++)
        scores_h(1, s + (size_t)h * IFK_KV_CHUNK, q + (size_t)h * hd, kt, n16, hd, scale, pf);
}

/* o[d] += p[0] * v[0][d], then + p[1] * v[1][d], ... in that order for every d < hd (the
 * values of the plain loop), with o held in registers across the nj rows.  v: [nj] rows. */
static inline __attribute__((always_inline)) void add_weighted(float *restrict o, const float *const *v, const float *p,
                                                                int nj, int hd, kv_pf *pf)
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
            pf_step(pf);
            memcpy(&t0, vj, sizeof t0);
            memcpy(&t1, vj + 16, sizeof t1);
            memcpy(&t2, vj + 32, sizeof t2);
            memcpy(&t3, vj + 48, sizeof t3);
            KV_FMA(a0, p[j], t0);
            KV_FMA(a1, p[j], t1);
            KV_FMA(a2, p[j], t2);
            KV_FMA(a3, p[j], t3);
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
            KV_FMA(a, p[j], t);
        }
        memcpy(o + d0, &a, sizeof a);
    }
    for (; d0 < hd; d0++) {
        float a = o[d0];
        for (int j = 0; j < nj; j++)
            a = __builtin_fmaf(p[j], v[j][d0], a);
        o[d0] = a;
    }
}

/* add_weighted for 8 heads at once, hd a multiple of 16: o + i hd of head i with its weights
 * p + i IFK_KV_CHUNK (every (head, element) gets the same operations in the same order as
 * add_weighted gives it; only the loads of v are shared). */
static inline __attribute__((always_inline)) void add_weighted8(float *restrict o, const float *const *v, const float *p,
                                                                 int nj, int hd, kv_pf *pf)
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
            pf_step(pf);
            memcpy(&t, v[j] + d0, sizeof t);
            KV_FMA(a0, p[j], t);
            KV_FMA(a1, p[IFK_KV_CHUNK + j], t);
            KV_FMA(a2, p[2 * IFK_KV_CHUNK + j], t);
            KV_FMA(a3, p[3 * IFK_KV_CHUNK + j], t);
            KV_FMA(a4, p[4 * IFK_KV_CHUNK + j], t);
            KV_FMA(a5, p[5 * IFK_KV_CHUNK + j], t);
            KV_FMA(a6, p[6 * IFK_KV_CHUNK + j], t);
            KV_FMA(a7, p[7 * IFK_KV_CHUNK + j], t);
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

/* o[0 .. n) *= c. */
static inline __attribute__((always_inline)) void scale_row(float *o, int n, float c)
{
    int d = 0;
    for (; d + 16 <= n; d += 16) {
        kv_f16x t;
        memcpy(&t, o + d, sizeof t);
        t *= c;
        memcpy(o + d, &t, sizeof t);
    }
    for (; d < n; d++)
        o[d] *= c;
}

/* The sum of v[0 .. n16) (n16 a multiple of 16): 16 lanes over the groups in order, then the
 * lanes added pairwise (w = 8, 4, 2, 1). */
static inline __attribute__((always_inline)) float sum16(const float *v, int n16)
{
    kv_f16x acc = {0}, t;
    for (int j = 0; j < n16; j += 16) {
        memcpy(&t, v + j, sizeof t);
        acc += t;
    }
    kv_f8x h8 = __builtin_shufflevector(acc, acc, 0, 1, 2, 3, 4, 5, 6, 7) +
                __builtin_shufflevector(acc, acc, 8, 9, 10, 11, 12, 13, 14, 15);
    kv_f4x h4 = __builtin_shufflevector(h8, h8, 0, 1, 2, 3) + __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
    return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

/* One step of the online softmax for a row's nh heads over a chunk of nj keys, their scores in
 * s [nh][IFK_KV_CHUNK]: the running maxima m, sums l and outputs out [nh][hd] rescaled to the new
 * maxima, then the chunk's weights (left in s, zero from nj to the next multiple of 16) added:
 * to l as one sum16 a chunk, to out as the weighted values vr[j] in key order. The maxima and the
 * exponentials are taken 16 keys at a time over all the heads (independent work in flight). */
static inline __attribute__((always_inline)) void softmax_step(float *restrict out, float *s, float *m, float *l,
                                                                const float *const *vr, int nj, int nh, int hd,
                                                                float softcap, kv_pf *pf)
{
    const int n16 = (nj + 15) & ~15;
    kv_i16x tail; /* lanes of the last 16 keys that are keys of the chunk */
    for (int i = 0; i < 16; i++)
        tail[i] = i < nj - (n16 - 16) ? -1 : 0;
    const kv_i16x ninf = (kv_i16x){0} + (int32_t)0xff800000u;
    float mx[nh];
    for (int h = 0; h < nh; h++) {
        float *sh = s + (size_t)h * IFK_KV_CHUNK;
        if (softcap > 0) /* Gemma 2's attention soft-capping */
            for (int j = 0; j < nj; j++)
                sh[j] = softcap * tanhf(sh[j] / softcap);
        kv_i16x last;
        memcpy(&last, sh + n16 - 16, sizeof last);
        last = (last & tail) | (ninf & ~tail);
        kv_f16x vmax;
        memcpy(&vmax, &last, sizeof vmax);
        for (int j = 0; j + 16 < n16; j += 16) {
            kv_f16x t;
            memcpy(&t, sh + j, sizeof t);
            kv_i16x gt = t > vmax, tb, vb; /* the larger, lane by lane: exact in any order */
            memcpy(&tb, &t, sizeof tb);
            memcpy(&vb, &vmax, sizeof vb);
            vb = (tb & gt) | (vb & ~gt);
            memcpy(&vmax, &vb, sizeof vmax);
        }
        float x = m[h];
        for (int i = 0; i < 16; i++)
            x = vmax[i] > x ? vmax[i] : x;
        mx[h] = x;
    }
    for (int h = 0; h < nh; h++) {
        float *sh = s + (size_t)h * IFK_KV_CHUNK;
        for (int j = 0; j < n16; j += 16) {
            kv_f16x t;
            memcpy(&t, sh + j, sizeof t);
            t -= mx[h];
            exp16(&t);
            if (j + 16 == n16) { /* the padding's weights: 0 */
                kv_i16x b;
                memcpy(&b, &t, sizeof b);
                b &= tail;
                memcpy(&t, &b, sizeof t);
            }
            memcpy(sh + j, &t, sizeof t);
        }
    }
    for (int h = 0; h < nh; h++) {
        const float corr = exp1(m[h] - mx[h]); /* 0 on the first chunk (m = -inf) */
        m[h] = mx[h];
        scale_row(out + (size_t)h * hd, hd, corr);
        l[h] = l[h] * corr + sum16(s + (size_t)h * IFK_KV_CHUNK, n16);
    }
    /* the values, weighted: 8 heads at a time read each value row once */
    int h = 0;
    if (hd % 16 == 0)
        for (; h + 8 <= nh; h += 8)
            add_weighted8(out + (size_t)h * hd, vr, s + (size_t)h * IFK_KV_CHUNK, nj, hd, pf);
    for (; h < nh; h++)
        add_weighted(out + (size_t)h * hd, vr, s + (size_t)h * IFK_KV_CHUNK, nj, hd, pf);
}

/* A row's share of a chunk of nj keys (transposed in kt, values vr): its scores, then the softmax
 * step (s: scratch [nh][IFK_KV_CHUNK]). */
static inline __attribute__((always_inline)) void row_step(float *restrict out, const float *q, const float *kt,
                                                            float *s, float *m, float *l, const float *const *vr,
                                                            int nj, int nh, int hd, float scale, float softcap,
                                                            kv_pf *pf)
{
    scores(s, q, kt, (nj + 15) & ~15, nh, hd, scale, pf);
    softmax_step(out, s, m, l, vr, nj, nh, hd, softcap, pf);
}

/* Rows of one sequence for kv head g: row r (its nh query heads at q + r ld, out + r ld) attends to
 * keys first .. n_keys[r] - 1. Online softmax over chunks of IFK_KV_CHUNK keys from `first`; each
 * chunk's keys are converted (pools other than F32) and transposed once for all the rows, and each
 * row then takes the same operations it would take alone: its scores (scores()), softmax_step over
 * its own keys of the chunk. So a row's output depends only on its query, its position and the
 * cache, whatever rows share the call, and heads only on their own query. */
#define ATTEND_ROWS 16 /* rows that share a chunk's transposed keys */
KV_CLONES
static void attend_rows(float *restrict out, const float *restrict q, size_t ld, int R, const void *k, const void *v,
                        const ifk_kv_layout *L, const int32_t *table, int first, const int *n_keys, int g, int nh,
                        float scale)
{
    const int hd = L->head_dim, conv = L->type != IFK_KV_F32;
    float kbuf[conv ? 16 * hd : 1], vbuf[conv ? IFK_KV_CHUNK * hd : 1];
    float kt[(size_t)hd * IFK_KV_CHUNK] __attribute__((aligned(64)));
    float m[R][nh], l[R][nh], s[(size_t)nh * IFK_KV_CHUNK] __attribute__((aligned(64)));
    const float *kr[IFK_KV_CHUNK], *vr[IFK_KV_CHUNK];
    kv_pf pf;
    size_t rows_a[IFK_KV_CHUNK], rows_b[IFK_KV_CHUNK], *rows = rows_a, *rows_nn = rows_b; /* pool rows */
    int last = 0;
    for (int r = 0; r < R; r++) {
        last = n_keys[r] > last ? n_keys[r] : last;
        for (int h = 0; h < nh; h++) {
            m[r][h] = -INFINITY;
            l[r][h] = 0.0f;
        }
        memset(out + (size_t)r * ld, 0, (size_t)nh * hd * sizeof(float));
    }
    for (int j0 = first; j0 < last; j0 += IFK_KV_CHUNK) {
        const int nj = last - j0 < IFK_KV_CHUNK ? last - j0 : IFK_KV_CHUNK;
        pf.n = pf.e = pf.l = 0; /* the next chunk's K slices, then its V slices */
        const int nn = last - j0 - nj < IFK_KV_CHUNK ? last - j0 - nj : IFK_KV_CHUNK;
        size_t *was = rows; /* this chunk's rows: the last chunk's next ones */
        rows = rows_nn, rows_nn = was;
        if (j0 == first)
            rows_of(rows, L, table, j0, nj);
        rows_of(rows_nn, L, table, j0 + nj, nn);
        for (int w = 0; w < 2; w++)
            for (int j = 0; j < nn; j++)
                pf_add(&pf, w ? v : k, L, rows_nn[j], g);
        for (int j = 0; j < nj; j++) {
            vr[j] = head_of(vbuf + (conv ? (size_t)j * hd : 0), v, L, rows[j], g);
            if (!conv) /* the pool's own row */
                kr[j] = head_of(kbuf, k, L, rows[j], g);
        }
        for (int a = 0; a < nj; a += 16) { /* the keys 16 at a time: a pool other than F32 converts */
            const int nk = nj - a < 16 ? nj - a : 16; /* them into a buffer of 16 rows, which stays in L1 */
            if (conv)
                for (int j = 0; j < nk; j++)
                    kr[a + j] = head_of(kbuf + (size_t)j * hd, k, L, rows[a + j], g);
            transpose_group(kt, kr + a, a, nk, hd);
        }
        for (int r = 0; r < R; r++) {
            const int nr = n_keys[r] - j0 < IFK_KV_CHUNK ? n_keys[r] - j0 : IFK_KV_CHUNK;
            if (nr <= 0)
                continue;
            const float *qr = q + (size_t)r * ld;
            float *o = out + (size_t)r * ld;
            kv_pf *p = pf.e == 0 && pf.l == 0 ? &pf : NULL; /* the first row's loops request the lines */
            if (hd == 64) /* the common sizes as constants: unrolled */
                row_step(o, qr, kt, s, m[r], l[r], vr, nr, nh, 64, scale, L->softcap, p);
            else if (hd == 128)
                row_step(o, qr, kt, s, m[r], l[r], vr, nr, nh, 128, scale, L->softcap, p);
            else
                row_step(o, qr, kt, s, m[r], l[r], vr, nr, nh, hd, scale, L->softcap, p);
        }
        pf_rest(&pf);
    }
    for (int r = 0; r < R; r++)
        for (int h = 0; h < nh; h++)
            scale_row(out + (size_t)r * ld + (size_t)h * hd, hd, 1.0f / l[r][h]);
}

/* Paged attention on the pool (pool.h): a unit is `rows` (up to ATTEND_ROWS) consecutive query
 * rows of one sequence for one kv head; item i is units [i * upi, (i + 1) * upi). */
typedef struct {
    float *out;
    const float *q;
    size_t ld;
    const void *k, *v;
    const ifk_kv_layout *L;
    const ifk_kv_seq *seqs;
    const int *first; /* [n_seqs + 1] unit index of each sequence's first unit */
    int n_kv, nh, rows, units, upi;
    float scale;
} paged_args;

KV_CLONES
static void paged_run(const void *args, const void *in, int item, float *unused)
{
    const paged_args *a = args;
    const ifk_kv_layout *L = a->L;
    int u1 = (item + 1) * a->upi < a->units ? (item + 1) * a->upi : a->units;
    int s = 0;
    for (int u = item * a->upi; u < u1; u++) {
        while (a->first[s + 1] <= u)
            s++;
        const ifk_kv_seq *q = &a->seqs[s];
        const int i0 = (u - a->first[s]) / a->n_kv * a->rows, g = (u - a->first[s]) % a->n_kv;
        const int R = q->n_rows - i0 < a->rows ? q->n_rows - i0 : a->rows;
        int n_keys[ATTEND_ROWS], w = L->window;
        for (int r = 0; r < R; r++)
            n_keys[r] = q->pos0 + (L->bidirectional ? q->n_rows : i0 + r + 1);
        const size_t off = (size_t)(q->row0 + i0) * a->ld + (size_t)g * a->nh * L->head_dim;
        attend_rows(a->out + off, a->q + off, a->ld, R, a->k, a->v, L, q->table,
                    w > 0 && n_keys[0] > w ? n_keys[0] - w : 0, n_keys, g, a->nh, a->scale);
    }
}

void ifk_attention_paged(float *out, const float *q, size_t ld, const void *k, const void *v,
                         const ifk_kv_layout *L, const ifk_kv_seq *seqs, int n_seqs, int n_heads,
                         float scale, int n_threads)
{
    const int n_kv = L->n_kv_heads;
    if (n_seqs <= 0 || n_kv <= 0 || n_heads % n_kv)
        return;
    const int nh = n_heads / n_kv;
    int nt = n_threads > 0 ? n_threads : omp_get_num_procs(), n_rows = 0;
    for (int s = 0; s < n_seqs; s++)
        n_rows += seqs[s].n_rows;
    /* rows a unit: up to ATTEND_ROWS while every thread keeps about 8 units (a row's result does
     * not depend on it); with a window, each row has its own first key */
    int rows = n_rows * n_kv / (8 * nt);
    rows = L->window > 0 || rows < 1 ? 1 : rows > ATTEND_ROWS ? ATTEND_ROWS : rows;
    int first[n_seqs + 1];
    first[0] = 0;
    for (int s = 0; s < n_seqs; s++)
        first[s + 1] = first[s] + (seqs[s].n_rows + rows - 1) / rows * n_kv;
    const int units = first[n_seqs];
    if (nt > units)
        nt = units;
    const int upi = (units + IFK_POOL_MAX_ITEMS - 1) / IFK_POOL_MAX_ITEMS;
    paged_args a = {out, q, ld, k, v, L, seqs, first, n_kv, nh, rows, units, upi, scale};
    ifk_pool_run(&(ifk_pool_job){.run = paged_run, .args = &a, .args_size = sizeof a,
                                 .n_items = (units + upi - 1) / upi, .max_threads = nt});
}
