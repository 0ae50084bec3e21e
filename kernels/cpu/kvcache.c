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
 * A row's keys come in parts of IFK_KV_PART (merge_part): with few units a thread (one sequence's
 * decoding step, 4 kv heads) each part is a unit of its own and a second job merges them
 * (paged_combine); an item then holds a run of parts, each of which requests the next one's first
 * chunk, so a part does not start on a cold cache.
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

/* The attention over a Q8 pool is compiled once more, for AVX-512 with AVX512_VNNI
 * (attend_rows_vnni, KV_VNNI_TARGET), where GCC optimizes: the two instructions it needs that
 * GCC's vector extensions do not give (kv_dpbusd, kv_i8_to_i32) are inline assembly, which the
 * other instances hold as dead code (an intrinsic there would not compile). */
#if defined(__GNUC__) && !defined(__clang__) && !defined(IFK_NO_SIMD) && defined(__x86_64__) && defined(__OPTIMIZE__)
#define KV_VNNI 1
#define KV_VNNI_TARGET __attribute__((target("arch=x86-64-v4,avx512vnni")))
#else
#define KV_VNNI 0
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

/* *acc += the dword-wise dot products of k's unsigned bytes with q4's four signed bytes
 * (vpdpbusd; called only where vnni is 1, see KV_VNNI). */
static inline __attribute__((always_inline)) void kv_dpbusd(kv_i16x *acc, const kv_i16x *k, int32_t q4)
{
#if KV_VNNI
    const kv_i16x qv = (kv_i16x){0} + q4;
    kv_i16x a = *acc;
    __asm__("vpdpbusd %2, %1, %0" : "+v"(a) : "v"(*k), "v"(qv));
    *acc = a;
#else
    for (int b = 0; b < 4; b++)
        *acc += (int32_t)(signed char)(q4 >> 8 * b) * ((*k >> 8 * b) & 0xff);
#endif
}

/* *w = p[0 .. 16) widened to int32 (vpmovsxbd; called only where vnni is 1: GCC 12 widens a
 * vector of 16 int8 in 8 instructions, or a lane at a time). */
static inline __attribute__((always_inline)) void kv_i8_to_i32(kv_i16x *w, const int8_t *p)
{
#if KV_VNNI
    kv_i8x16 b;
    memcpy(&b, p, sizeof b);
    __asm__("vpmovsxbd %1, %0" : "=v"(*w) : "v"(b));
#else
    for (int i = 0; i < 16; i++)
        (*w)[i] = p[i];
#endif
}

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

/* Byte offset into a Q8 pool of the scale of group i (0 .. KV / group - 1) of pool row r: the
 * scales follow every row's values, a block's together, group by group (kvcache.h). */
static inline size_t scale_at(const ifk_kv_layout *L, size_t r, size_t i)
{
    const size_t KV = (size_t)L->n_kv_heads * L->head_dim, B = (size_t)L->block;
    return (size_t)L->n_blocks * B * KV + ((r / B * (KV / L->group) + i) * B + r % B) * 2;
}

/* Where kv head g is, as byte offsets into a pool: pool row r's values at val0 + r val_r; in a Q8
 * pool, the scale of its group gi at slot o of block b at sc0 + b sc_b + gi sc_g + 2 o. Taken once
 * a call: the scales' offsets take divisions (two a key were a tenth of a decoding row's
 * attention over a Q8 pool). */
typedef struct {
    size_t val0, val_r, sc0, sc_b, sc_g;
} kv_at;

static inline kv_at head_at(const ifk_kv_layout *L, int g)
{
    const size_t KV = (size_t)L->n_kv_heads * L->head_dim, vb = value_bytes(L);
    kv_at a = {(size_t)g * L->head_dim * vb, KV * vb, 0, 0, 0};
    if (L->type == IFK_KV_Q8) {
        a.sc0 = scale_at(L, 0, (size_t)g * (L->head_dim / L->group));
        a.sc_b = KV / L->group * L->block * 2;
        a.sc_g = (size_t)L->block * 2;
    }
    return a;
}

/* rows[i] = row_of(pos0 + i) for i < n, with one division (a division a key was a tenth of a
 * decoding row's attention over a Q8 pool); and (a Q8 pool) scs[i]: the byte offset of the scale
 * of that row's first group of the head at `at`. */
static inline __attribute__((always_inline)) void rows_of(size_t *rows, size_t *scs, const ifk_kv_layout *L,
                                                         const kv_at *at, const int32_t *table, int pos0, int n)
{
    int b = pos0 / L->block, o = pos0 % L->block;
    for (int i = 0; i < n; i++) {
        rows[i] = (size_t)table[b] * (size_t)L->block + (size_t)o;
        scs[i] = at->sc0 + (size_t)table[b] * at->sc_b + (size_t)o * 2;
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

/* *out = h2f of 16 halves at once (their bits in the low 16 bits of each lane of h). */
static inline __attribute__((always_inline)) void h2f16(kv_f16x *out, const kv_i16x *hp)
{
    const kv_i16x h = *hp;
    const kv_i16x a = h & 0x7fff, m = h & 0x3ff, s = (h & 0x8000) << 16;
    const kv_i16x normal = s | ((a << 13) + (112 << 23)), e0 = a < 0x400, e31 = a >= 0x7c00;
    const kv_i16x special = s | 0x7f800000 | (m << 13) | ((m != 0) & 0x400000);
    kv_f16x f = __builtin_convertvector(m, kv_f16x) * 0x1p-24f; /* exponent 0: m 2^-24, exact */
    kv_i16x b;
    memcpy(&b, &f, sizeof b);
    b = (e0 & (s | b)) | (e31 & special) | (~(e0 | e31) & normal);
    memcpy(out, &b, sizeof b);
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

/* out[i] = q[i] * s, i < n. */
static inline __attribute__((always_inline)) void q8_floats(float *out, const int8_t *q, int n, float s,
                                                            const int vnni)
{
    int i = 0;
    for (; i + 16 <= n; i += 16) { /* the loop below, 16 at a time (it stayed scalar) */
        kv_i16x w;
        if (vnni)
            kv_i8_to_i32(&w, q + i);
        else { /* through int16: GCC 12 turned int8 -> int32 into a conversion a lane */
            kv_i8x16 v;
            memcpy(&v, q + i, sizeof v);
            w = __builtin_convertvector(__builtin_convertvector(v, kv_s16x16), kv_i16x);
        }
        const kv_f16x y = __builtin_convertvector(w, kv_f16x) * s;
        memcpy(out + i, &y, sizeof y);
    }
    for (; i < n; i++)
        out[i] = (float)q[i] * s;
}

/* out [head_dim] = the head at `at` of pool row r (sco: a Q8 pool's offset of its first scale). */
static inline __attribute__((always_inline)) void load_head(float *out, const void *pool, const ifk_kv_layout *L,
                                                          const kv_at *at, size_t r, size_t sco)
{
    const int hd = L->head_dim;
    const char *x = (const char *)pool + at->val0 + r * at->val_r;
    switch (L->type) {
    case IFK_KV_F32:
        memcpy(out, x, (size_t)hd * sizeof(float));
        break;
    case IFK_KV_F16: /* the kernel path's row conversion: vcvtph2ps, 16 or 8 at a time (exact, as h2f;
                      * h2f one value at a time cost more than the half of the bytes saved) */
        ifk_get_row(out, (const uint16_t *)x, IFK_F16, 0, hd);
        break;
    case IFK_KV_Q8: {
        for (int d0 = 0; d0 < hd; d0 += L->group) {
            uint16_t sc;
            memcpy(&sc, (const char *)pool + sco + (size_t)(d0 / L->group) * at->sc_g, sizeof sc);
            q8_floats(out + d0, (const int8_t *)x + d0, L->group, h2f(sc), 0);
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

/* The head at `at` of pool row r onto the list: its values, and (a Q8 pool, sc_line) the lines of
 * its scales, each group's from sco on (the next rows' scales follow them in a block: the caller
 * asks for them once a line). */
static inline __attribute__((always_inline)) void pf_add(kv_pf *pf, const void *pool, const ifk_kv_layout *L,
                                                        const kv_at *at, size_t r, size_t sco, int sc_line)
{
    pf->at[pf->n] = (const char *)pool + at->val0 + r * at->val_r;
    pf->lines[pf->n++] = (int)(((size_t)L->head_dim * value_bytes(L) + 63) / 64);
    if (L->type == IFK_KV_Q8 && sc_line)
        for (int gi = 0; gi < L->head_dim / L->group && pf->n < KV_PF_MAX; gi++) {
            pf->at[pf->n] = (const char *)pool + sco + (size_t)gi * at->sc_g;
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

/* The head at `at` of pool row r as F32: in place for an F32 pool, else converted into buf [head_dim]
 * (an F16 pool's: a Q8 pool's rows take q8_keys and q8_values). */
static inline __attribute__((always_inline)) const float *head_of(float *buf, const void *pool, const ifk_kv_layout *L,
                                                                 const kv_at *at, size_t r)
{
    if (L->type == IFK_KV_F32)
        return (const float *)((const char *)pool + at->val0 + r * at->val_r);
    load_head(buf, pool, L, at, r, 0);
    return buf;
}

void ifk_kv_load_row(float *out, const void *pool, const ifk_kv_layout *L, const int32_t *table, int pos)
{
    size_t r = row_of(L, table, pos);
    for (int g = 0; g < L->n_kv_heads; g++) {
        const kv_at at = head_at(L, g);
        load_head(out + (size_t)g * L->head_dim, pool, L, &at, r,
                  L->type == IFK_KV_Q8 ? scale_at(L, r, (size_t)g * (L->head_dim / L->group)) : 0);
    }
}

/* ---- store ---------------------------------------------------------------------------- */

/* The largest |x[i]|, i < n (a Q8 group's, for its scale). */
static inline __attribute__((always_inline)) float amax_of(const float *x, int n)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    return amax;
}

/* q[i] = x[i] * inv rounded to the nearest int8 in -127 .. 127 (ties to even), i < n: inv is at
 * most 127 / max |x|, so |x[i] * inv| < 2^22, where adding and taking back 1.5 * 2^23 rounds to
 * the nearest integer as nearbyintf does (for which GCC called libm, once a value). */
static inline __attribute__((always_inline)) void round_i8(int8_t *q, const float *x, int n, float inv)
{
    for (int i = 0; i < n; i++) {
        const float v = (x[i] * inv + 12582912.0f) - 12582912.0f;
        q[i] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : v);
    }
}

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
        uint16_t *sc = (uint16_t *)((char *)pool + scale_at(L, r, 0)); /* group i at sc[i * block] */
        for (int i0 = 0; i0 < KV; i0 += G) {
            uint16_t hs = f2h(amax_of(x + i0, G) / 127.0f);
            float s = h2f(hs), inv = s > 0.0f ? 1.0f / s : 0.0f;
            sc[(size_t)(i0 / G) * L->block] = hs;
            round_i8(q + i0, x + i0, G, inv);
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
        *scale = scale_at(L, r0, 0);
        *scale_bytes = rows * (KV / (size_t)L->group) * 2;
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
    case IFK_KV_Q8:
        memmove((int8_t *)pool + dst * KV, (int8_t *)pool + src * KV, KV);
        for (size_t i = 0; i < KV / (size_t)L->group; i++)
            memmove((char *)pool + scale_at(L, dst, i), (char *)pool + scale_at(L, src, i), 2);
        break;
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
        if (v) /* NULL: values kept in the keys' rows (latent attention) */
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

/* ---- a Q8 pool's keys against an int8 query -------------------------------------------- */

/* Over a Q8 pool the query is rounded to int8 as well, each group of L->group values of a head
 * with its own F32 scale (maxabs / 127, as llama.cpp rounds the query for its q8_0 keys), so that
 * a group's product of query and key is an exact integer, sum_d q_d k_d (|q_d|, |k_d| <= 127;
 * groups of up to 1024 values stay below 2^24). A head's score is then, group by group in order,
 *     a = fmaf(q_scale[g], (float)sum_g * k_scale[g], a),   then a * scale.
 * With AVX512_VNNI (vpdpbusd) the sums take one instruction per 4 values of 16 keys, over keys
 * held as dwords of 4 values transposed (ktq[w * IFK_KV_CHUNK + j]: key j's values 4w .. 4w + 3),
 * 0x80 added to each byte (vpdpbusd multiplies unsigned by signed bytes), and the sums started
 * at -128 * the group's sum of q, which takes that back out. Elsewhere the same integers are
 * summed as floats (every partial sum is an integer below 2^24: exact in any order), over keys
 * converted unscaled and transposed as the other pools' are. Both give the same bits. */
#define KV_Q8_BIAS ((int32_t)0x80808080u) /* the keys' bytes + 128 */

/* Whether a pool of layout L takes the int8 query (a group a whole number of dwords). */
static inline int q8_int(const ifk_kv_layout *L)
{
    return L->type == IFK_KV_Q8 && L->group % 4 == 0 && L->group <= 1024;
}

/* A query row's nh heads [nh][hd] rounded for a Q8 pool: qi [nh][hd] (int8), and as floats qf
 * [nh][hd] (NULL: not wanted), the groups' scales qs [nh][ng] and VNNI's starting sums qb [nh][ng]. */
static inline __attribute__((always_inline)) void q8_query(int8_t *qi, float *qf, float *qs, int32_t *qb,
                                                          const float *q, int nh, int hd, int G)
{
    for (int i0 = 0; i0 < nh * hd; i0 += G) {
        const float d = amax_of(q + i0, G) / 127.0f;
        round_i8(qi + i0, q + i0, G, d > 0.0f ? 1.0f / d : 0.0f);
        int32_t sum = 0;
        for (int i = i0; i < i0 + G; i++) {
            sum += qi[i];
            if (qf)
                qf[i] = qi[i];
        }
        qs[i0 / G] = d;
        qb[i0 / G] = -128 * sum;
    }
}

/* Whether the n scales at scs[0 .. n) are 16 adjacent ones (within a block, or over blocks
 * that follow each other in the pool). */
static inline __attribute__((always_inline)) int adjacent16(const size_t *scs, int n)
{
    int adj = n == 16;
    for (int j = 1; j < 16 && adj; j++)
        adj = scs[j] == scs[0] + 2 * (size_t)j;
    return adj;
}

/* sc[0 .. 16) = the scales at byte offsets pool + scs[j] + goff for j < n (<= 16; F16 -> F32),
 * 0 for the rest: loaded at once when adjacent (adjacent16), else one at a time. */
typedef unsigned short kv_u16x16 __attribute__((vector_size(32)));
static inline __attribute__((always_inline)) void q8_scales(float *sc, const void *pool, const size_t *scs, int n,
                                                           int adj, size_t goff)
{
    kv_i16x h = {0};
    if (adj) {
        kv_u16x16 x;
        memcpy(&x, (const char *)pool + scs[0] + goff, sizeof x);
        h = __builtin_convertvector(x, kv_i16x);
    } else
        for (int j = 0; j < n; j++) {
            uint16_t x;
            memcpy(&x, (const char *)pool + scs[j] + goff, sizeof x);
            h[j] = x;
        }
    kv_f16x f;
    h2f16(&f, &h);
    memcpy(sc, &f, sizeof f);
}

/* Keys j0 .. j0 + nk - 1 of a chunk (pool rows rows[0 .. nk), scales scs (rows_of), the head at
 * `at`; nk <= 16, the rest of the 16 zero) for the int8 query: their group scales into
 * ks[gi * IFK_KV_CHUNK + j0 + j], their values into kt: as ktq (vnni; int32 [hd / 4][IFK_KV_CHUNK],
 * see above) or unscaled and transposed as floats (float [hd][IFK_KV_CHUNK]; kbuf: scratch
 * [16][hd]). */
static inline __attribute__((always_inline)) void q8_keys(void *kt, float *ks, float *kbuf, const void *pool,
                                                         const ifk_kv_layout *L, const kv_at *at, const size_t *rows,
                                                         const size_t *scs, int j0, int nk, const int vnni)
{
    const int hd = L->head_dim, ng = hd / L->group;
    const int8_t *kr8[16];
    for (int j = 0; j < 16; j++)
        kr8[j] = j < nk ? (const int8_t *)pool + at->val0 + rows[j] * at->val_r : NULL;
    const int adj = adjacent16(scs, nk);
    for (int gi = 0; gi < ng; gi++)
        q8_scales(ks + (size_t)gi * IFK_KV_CHUNK + j0, pool, scs, nk, adj, (size_t)gi * at->sc_g);
    if (vnni) {
        int32_t *ktq = kt;
        int w0 = 0;
        for (; w0 + 16 <= hd / 4; w0 += 16) { /* 16 keys x 16 dwords: one transpose */
            kv_f16x r[16];
            _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) {
                r[j] = (kv_f16x){0};
                if (j < nk)
                    memcpy(&r[j], kr8[j] + 4 * w0, sizeof r[j]);
            }
            transpose16(r);
            _Pragma("GCC unroll 16") for (int w = 0; w < 16; w++) {
                kv_i16x t;
                memcpy(&t, &r[w], sizeof t);
                t ^= KV_Q8_BIAS;
                memcpy(ktq + (size_t)(w0 + w) * IFK_KV_CHUNK + j0, &t, sizeof t);
            }
        }
        for (; w0 < hd / 4; w0++)
            for (int j = 0; j < 16; j++) {
                int32_t x = 0;
                if (j < nk)
                    memcpy(&x, kr8[j] + 4 * w0, sizeof x);
                ktq[(size_t)w0 * IFK_KV_CHUNK + j0 + j] = x ^ KV_Q8_BIAS;
            }
        return;
    }
    const float *kr[16];
    for (int j = 0; j < nk; j++) {
        q8_floats(kbuf + (size_t)j * hd, kr8[j], hd, 1.0f, 0);
        kr[j] = kbuf + (size_t)j * hd;
    }
    transpose_group(kt, kr, j0, nk, hd);
}

/* A chunk's nj value rows (pool rows rows[0 .. nj), scales scs, the head at `at`) of a Q8 pool:
 * their scales into sc [hd / group][IFK_KV_CHUNK], and as F32 into vbuf [nj][hd] (NULL: not). */
static inline __attribute__((always_inline)) void q8_values(float *vbuf, float *sc, const void *pool,
                                                           const ifk_kv_layout *L, const kv_at *at,
                                                           const size_t *rows, const size_t *scs, int nj,
                                                           const int vnni)
{
    const int hd = L->head_dim, G = L->group, ng = hd / G;
    for (int a = 0; a < nj; a += 16) {
        const int n = nj - a < 16 ? nj - a : 16, adj = adjacent16(scs + a, n);
        for (int gi = 0; gi < ng; gi++)
            q8_scales(sc + (size_t)gi * IFK_KV_CHUNK + a, pool, scs + a, n, adj, (size_t)gi * at->sc_g);
    }
    for (int j = 0; j < nj && vbuf; j++) {
        const int8_t *x = (const int8_t *)pool + at->val0 + rows[j] * at->val_r;
        for (int gi = 0; gi < ng; gi++)
            q8_floats(vbuf + (size_t)j * hd + gi * G, x + gi * G, G, sc[(size_t)gi * IFK_KV_CHUNK + j], vnni);
    }
}

/* s[h * IFK_KV_CHUNK + j] = scale * (query head h . key j) for H heads of a row rounded by
 * q8_query (its qi, qf, qs, qb from head 0 of the H), over keys 0 .. n16 - 1 held by q8_keys. */
static inline __attribute__((always_inline)) void scores_q8_h(const int H, float *s, const int8_t *qi, const float *qf,
                                                               const float *qs, const int32_t *qb, const void *kt,
                                                               const float *ks, int n16, int hd, int G, float scale,
                                                               kv_pf *pf, const int vnni)
{
    const int ng = hd / G;
    for (int j = 0; j < n16; j += 16) {
        kv_f16x a[8];
        _Pragma("GCC unroll 8") for (int h = 0; h < H; h++)
            a[h] = (kv_f16x){0};
        for (int gi = 0; gi < ng; gi++) {
            kv_f16x sum[8], k0;
            if (vnni) {
                kv_i16x is[8] = {{0}}, kq; /* (all 8 set: GCC 12 warned of the unused ones) */
                _Pragma("GCC unroll 8") for (int h = 0; h < H; h++)
                    is[h] = (kv_i16x){0} + qb[h * ng + gi];
                for (int w = gi * G / 4; w < (gi + 1) * G / 4; w++) {
                    pf_step(pf);
                    memcpy(&kq, (const int32_t *)kt + (size_t)w * IFK_KV_CHUNK + j, sizeof kq);
                    _Pragma("GCC unroll 8") for (int h = 0; h < H; h++) {
                        int32_t q4;
                        memcpy(&q4, qi + (size_t)h * hd + 4 * w, sizeof q4);
                        kv_dpbusd(&is[h], &kq, q4);
                    }
                }
                _Pragma("GCC unroll 8") for (int h = 0; h < H; h++)
                    sum[h] = __builtin_convertvector(is[h], kv_f16x);
            } else {
                _Pragma("GCC unroll 8") for (int h = 0; h < H; h++)
                    sum[h] = (kv_f16x){0};
                for (int d = gi * G; d < (gi + 1) * G; d++) {
                    pf_step(pf);
                    memcpy(&k0, (const float *)kt + (size_t)d * IFK_KV_CHUNK + j, sizeof k0);
                    _Pragma("GCC unroll 8") for (int h = 0; h < H; h++)
                        KV_FMA(sum[h], qf[(size_t)h * hd + d], k0);
                }
            }
            memcpy(&k0, ks + (size_t)gi * IFK_KV_CHUNK + j, sizeof k0);
            _Pragma("GCC unroll 8") for (int h = 0; h < H; h++) {
                sum[h] *= k0;
                KV_FMA(a[h], qs[h * ng + gi], sum[h]);
            }
        }
        _Pragma("GCC unroll 8") for (int h = 0; h < H; h++) {
            a[h] *= scale;
            memcpy(s + (size_t)h * IFK_KV_CHUNK + j, &a[h], sizeof a[h]);
        }
    }
}

/* A Q8 pool's query rows rounded (q8_query; qf NULL with VNNI), a chunk's key scales (q8_keys),
 * and its value rows as int8 with their scales (v8 NULL: converted, in vr). */
typedef struct {
    const int8_t *qi;
    const float *qf, *qs;
    const int32_t *qb;
    const float *ks;
    const int8_t *const *v8;
    const float *vs;
} kv_q8q;

/* Scores of heads h .. h + H - 1 of a row: scores_h over keys kt, or over a Q8 pool (q8 not NULL)
 * scores_q8_h with the row's rounded query. */
static inline __attribute__((always_inline)) void scores_of(const int H, int h, float *s, const float *q,
                                                             const kv_q8q *q8, const void *kt, int n16, int hd, int G,
                                                             float scale, kv_pf *pf, const int vnni)
{
    if (q8) {
        const int ng = hd / G;
        scores_q8_h(H, s + (size_t)h * IFK_KV_CHUNK, q8->qi + (size_t)h * hd, q8->qf ? q8->qf + (size_t)h * hd : NULL,
                    q8->qs + h * ng, q8->qb + h * ng, kt, q8->ks, n16, hd, G, scale, pf, vnni);
    } else
        scores_h(H, s + (size_t)h * IFK_KV_CHUNK, q + (size_t)h * hd, kt, n16, hd, scale, pf);
}

/* A row's scores for its nh heads: 8, then 4, then one at a time. */
static inline __attribute__((always_inline)) void scores(float *s, const float *q, const kv_q8q *q8, const void *kt,
                                                          int n16, int nh, int hd, int G, float scale, kv_pf *pf,
                                                          const int vnni)
{
    int h = 0;
    for (; h + 8 <= nh; h += 8)
        scores_of(8, h, s, q, q8, kt, n16, hd, G, scale, pf, vnni);
    for (; h + 4 <= nh; h += 4)
        scores_of(4, h, s, q, q8, kt, n16, hd, G, scale, pf, vnni);
    for (; h < nh; h++)
        scores_of(1, h, s, q, q8, kt, n16, hd, G, scale, pf, vnni);
}

/* Values d0 .. d0 + 15 of row j into *t: from v, or (v8 not NULL) a Q8 pool's row converted as
 * q8_floats converts it (vs [IFK_KV_CHUNK]: the rows' scales of the group of d0, group_scales;
 * G a multiple of 16). */
static inline __attribute__((always_inline)) void value16(kv_f16x *t, const float *const *v, const int8_t *const *v8,
                                                          const float *vs, int G, int j, int d0, const int vnni)
{
    if (v8)
        q8_floats((float *)t, v8[j] + d0, 16, vs[j], vnni);
    else
        memcpy(t, v[j] + d0, sizeof *t);
}

/* The scales of the group of value d0 (value16's vs), taken before a loop over the rows: GCC left
 * the division inside it, one a row. */
static inline __attribute__((always_inline)) const float *group_scales(const float *vs, int G, int d0)
{
    return vs ? vs + (size_t)(d0 / G) * IFK_KV_CHUNK : NULL;
}

/* o[d] += p[0] * v[0][d], then + p[1] * v[1][d], ... in that order for every d < hd (the
 * values of the plain loop), with o held in registers across the nj rows.  v: [nj] rows; or v8,
 * vs, G: as value16's (hd a multiple of 16). */
static inline __attribute__((always_inline)) void add_weighted(float *restrict o, const float *const *v,
                                                                const int8_t *const *v8, const float *vs, int G,
                                                                const float *p, int nj, int hd, kv_pf *pf,
                                                                const int vnni)
{
    int d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64) { /* four named sums: an array of them stayed in memory */
        kv_f16x a0, a1, a2, a3, t0, t1, t2, t3;
        memcpy(&a0, o + d0, sizeof a0);
        memcpy(&a1, o + d0 + 16, sizeof a1);
        memcpy(&a2, o + d0 + 32, sizeof a2);
        memcpy(&a3, o + d0 + 48, sizeof a3);
        const float *s0 = group_scales(vs, G, d0), *s1 = group_scales(vs, G, d0 + 16);
        const float *s2 = group_scales(vs, G, d0 + 32), *s3 = group_scales(vs, G, d0 + 48);
        for (int j = 0; j < nj; j++) {
            pf_step(pf);
            value16(&t0, v, v8, s0, G, j, d0, vnni);
            value16(&t1, v, v8, s1, G, j, d0 + 16, vnni);
            value16(&t2, v, v8, s2, G, j, d0 + 32, vnni);
            value16(&t3, v, v8, s3, G, j, d0 + 48, vnni);
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
        const float *s0 = group_scales(vs, G, d0);
        for (int j = 0; j < nj; j++) {
            value16(&t, v, v8, s0, G, j, d0, vnni);
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
 * add_weighted gives it; only the loads of v are shared). v8: a Q8 pool's rows instead of v, each
 * 16 values converted where they are used (as q8_floats would: vs [hd / G][IFK_KV_CHUNK] their
 * scales, G a multiple of 16), else NULL. */
static inline __attribute__((always_inline)) void add_weighted8(float *restrict o, const float *const *v,
                                                                 const int8_t *const *v8, const float *vs, int G,
                                                                 const float *p, int nj, int hd, kv_pf *pf,
                                                                 const int vnni)
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
        const float *s0 = group_scales(vs, G, d0);
        for (int j = 0; j < nj; j++) {
            pf_step(pf);
            value16(&t, v, v8, s0, G, j, d0, vnni);
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
                                                                const float *const *vr, const int8_t *const *v8,
                                                                const float *vs, int G, int nj, int nh, int hd,
                                                                float softcap, kv_pf *pf, const int vnni)
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
    /* the values, weighted: 8 heads at a time read each value row once (v8: all of them, or the one) */
    int h = 0;
    if (hd % 16 == 0)
        for (; h + 8 <= nh; h += 8)
            add_weighted8(out + (size_t)h * hd, vr, v8, vs, G, s + (size_t)h * IFK_KV_CHUNK, nj, hd, pf, vnni);
    for (; h < nh; h++)
        add_weighted(out + (size_t)h * hd, vr, v8, vs, G, s + (size_t)h * IFK_KV_CHUNK, nj, hd, pf, vnni);
}

/* A row's share of a chunk of nj keys (transposed in kt, values vr): its scores, then the softmax
 * step (s: scratch [nh][IFK_KV_CHUNK]). q8: the row's rounded query over a Q8 pool, else NULL. */
static inline __attribute__((always_inline)) void row_step(float *restrict out, const float *q, const kv_q8q *q8,
                                                            const float *kt, float *s, float *m, float *l,
                                                            const float *const *vr, int nj, int nh, int hd, int G,
                                                            float scale, float softcap, kv_pf *pf, const int vnni)
{
    scores(s, q, q8, kt, (nj + 15) & ~15, nh, hd, G, scale, pf, vnni);
    softmax_step(out, s, m, l, vr, q8 ? q8->v8 : NULL, q8 ? q8->vs : NULL, G, nj, nh, hd, softcap, pf, vnni);
}

/* A part's result (po: unnormalized sums [nh][hd], maxima pm, sums pl) merged into the running
 * one (o, m, l): both rescaled to the larger maximum, then added. The one merge of the parts of a
 * row's keys, whether one unit takes them in turn or each part is a unit of its own (combine). */
static inline __attribute__((always_inline)) void merge_part(float *restrict o, float *m, float *l,
                                                              const float *restrict po, const float *pm,
                                                              const float *pl, int nh, int hd)
{
    for (int h = 0; h < nh; h++) {
        const float mx = pm[h] > m[h] ? pm[h] : m[h], ca = exp1(m[h] - mx), cp = exp1(pm[h] - mx);
        float *oh = o + (size_t)h * hd;
        const float *ph = po + (size_t)h * hd;
        int d = 0;
        for (; d + 16 <= hd; d += 16) {
            kv_f16x a, b;
            memcpy(&a, oh + d, sizeof a);
            memcpy(&b, ph + d, sizeof b);
            a = a * ca + b * cp;
            memcpy(oh + d, &a, sizeof a);
        }
        for (; d < hd; d++)
            oh[d] = oh[d] * ca + ph[d] * cp;
        l[h] = l[h] * ca + pl[h] * cp;
        m[h] = mx;
    }
}

/* A head's softmax sum l (over scores of maximum m) with its attention sink when the layout has
 * them (query head g * nh + h): the sink's exp joins the sum, no value with it. */
static inline float sink_sum(const ifk_kv_layout *L, int g, int nh, int h, float m, float l)
{
    return L->sinks ? l + expf(L->sinks[g * nh + h] - m) : l;
}

/* A row's running softmax (nh heads: sums c [nh][hd], maxima m, sums l) before its first key. */
static inline __attribute__((always_inline)) void part_reset(float *c, float *m, float *l, int nh, int hd)
{
    for (int h = 0; h < nh; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }
    memset(c, 0, (size_t)nh * hd * sizeof(float));
}

/* Rows of one sequence for kv head g: row r (its nh query heads at q + r ld) attends to keys
 * first .. n_keys[r] - 1. Online softmax over chunks of IFK_KV_CHUNK keys from `first`; each
 * chunk's keys are converted (pools other than F32) and transposed once for all the rows, and each
 * row then takes the same operations it would take alone: its scores (scores(); over a Q8 pool
 * with its query rounded once), softmax_step over its own keys of the chunk. The keys are taken in
 * parts of IFK_KV_PART from `first`, each part's softmax from scratch, and the parts merged in
 * order (merge_part). So a row's output depends only on its query, its position and the cache,
 * whatever rows share the call, and heads only on their own query.
 *   ml NULL: out rows (stride ldo) receive the attention's output, the parts merged here;
 *   ml not NULL (the caller keeps the keys within one part): out rows receive the part's
 *   unnormalized sums and ml [R][2][nh] its maxima and sums (a sum 0: the row has no keys in it).
 * vnni: the Q8 pool's products on vpdpbusd (the same bits). Compiled as attend_rows (the clones)
 * and attend_rows_vnni. */
#define ATTEND_ROWS 16         /* rows that share a chunk's transposed keys */
#define ATTEND_Q8_BYTES 65536 /* at most for a unit's rounded queries (fewer rows a unit when more) */
#define ATTEND_PART_BYTES 65536 /* at most for a unit's part sums when it merges parts itself */
static inline __attribute__((always_inline)) void attend_body(float *restrict out, size_t ldo, float *restrict ml,
                                                               const float *restrict q, size_t ld, int R,
                                                               const void *k, const void *v, const ifk_kv_layout *L,
                                                               const int32_t *table, int first, const int *n_keys,
                                                               int pf_last, int g, int nh, float scale,
                                                               const int vnni)
{
    const int hd = L->head_dim, conv = L->type != IFK_KV_F32, q8 = vnni || q8_int(L), G = L->group;
    const int ng = q8 ? hd / G : 1, QH = q8 ? nh * hd : 1, QG = q8 ? nh * ng : 1;
    /* a Q8 pool's values converted where they are used, for one row (more convert them once for
     * all: into vbuf) when every head takes them 8 at a time, or there is one */
    const int v8 = q8 && R == 1 && (nh % 8 == 0 || nh == 1) && hd % 16 == 0 && G % 16 == 0;
    const kv_at at = head_at(L, g); /* the K and V pools' layout is one */
    int last = 0;
    for (int r = 0; r < R; r++)
        last = n_keys[r] > last ? n_keys[r] : last;
    /* more than one part merged here: each part's sums in cur, the merged ones in out (am, al) */
    const int split = !ml && last - first > IFK_KV_PART;
    const size_t ldc = split ? (size_t)nh * hd : ldo;
    float pbuf[split ? (size_t)R * nh * hd : 1], am[R][nh], al[R][nh];
    float *cur = split ? pbuf : out;
    float kbuf[conv ? 16 * hd : 1], vbuf[conv ? IFK_KV_CHUNK * hd : 1], vsc[(size_t)ng * IFK_KV_CHUNK];
    float kt[(size_t)hd * IFK_KV_CHUNK] __attribute__((aligned(64))); /* q8 with VNNI: int32 [hd / 4][CHUNK] */
    float ks[(size_t)ng * IFK_KV_CHUNK] __attribute__((aligned(64)));
    int8_t qi[R * QH] __attribute__((aligned(64)));
    float qf[vnni ? 1 : R * QH], qs[R * QG];
    int32_t qb[R * QG];
    float m[R][nh], l[R][nh], s[(size_t)nh * IFK_KV_CHUNK] __attribute__((aligned(64)));
    const float *kr[IFK_KV_CHUNK], *vr[IFK_KV_CHUNK];
    const int8_t *vr8[IFK_KV_CHUNK];
    kv_pf pf;
    size_t rows_a[IFK_KV_CHUNK], rows_b[IFK_KV_CHUNK], *rows = rows_a, *rows_nn = rows_b; /* pool rows */
    size_t scs_a[IFK_KV_CHUNK], scs_b[IFK_KV_CHUNK], *scs = scs_a, *scs_nn = scs_b;     /* their scales */
    for (int r = 0; r < R; r++) {
        part_reset(cur + (size_t)r * ldc, m[r], l[r], nh, hd);
        if (q8)
            q8_query(qi + r * QH, vnni ? NULL : qf + r * QH, qs + r * QG, qb + r * QG, q + (size_t)r * ld, nh, hd, G);
    }
    for (int j0 = first; j0 < last; j0 += IFK_KV_CHUNK) {
        const int nj = last - j0 < IFK_KV_CHUNK ? last - j0 : IFK_KV_CHUNK;
        if (split && j0 > first && (j0 - first) % IFK_KV_PART == 0) /* a part ends: into out */
            for (int r = 0; r < R; r++) {
                if (n_keys[r] <= j0 - IFK_KV_PART)
                    continue; /* done with an earlier part */
                float *o = out + (size_t)r * ldo, *c = cur + (size_t)r * ldc;
                if (j0 - IFK_KV_PART == first) {
                    memcpy(o, c, (size_t)nh * hd * sizeof(float));
                    memcpy(am[r], m[r], sizeof am[r]);
                    memcpy(al[r], l[r], sizeof al[r]);
                } else {
                    merge_part(o, am[r], al[r], c, m[r], l[r], nh, hd);
                }
                if (n_keys[r] > j0) /* the next part from scratch */
                    part_reset(c, m[r], l[r], nh, hd);
            }
        pf.n = pf.e = pf.l = 0; /* the next chunk's K slices, then its V slices */
        const int pl = pf_last > last ? pf_last : last; /* the next chunk: this part's, or the next part's first */
        const int nn = pl - j0 - nj < IFK_KV_CHUNK ? pl - j0 - nj : IFK_KV_CHUNK;
        size_t *was = rows, *was_sc = scs; /* this chunk's rows: the last chunk's next ones */
        rows = rows_nn, rows_nn = was, scs = scs_nn, scs_nn = was_sc;
        if (j0 == first)
            rows_of(rows, scs, L, &at, table, j0, nj);
        rows_of(rows_nn, scs_nn, L, &at, table, j0 + nj, nn);
        for (int w = 0; w < 2; w++)
            for (int j = 0; j < nn; j++) /* a Q8 pool's scales: a line's once */
                pf_add(&pf, w ? v : k, L, &at, rows_nn[j], scs_nn[j],
                       j == 0 || scs_nn[j] != scs_nn[j - 1] + 2 || scs_nn[j] % 64 == 0);
        if (q8)
            q8_values(v8 ? NULL : vbuf, vsc, v, L, &at, rows, scs, nj, vnni);
        for (int j = 0; j < nj; j++) {
            if (v8)
                vr8[j] = (const int8_t *)v + at.val0 + rows[j] * at.val_r;
            vr[j] = q8 ? vbuf + (size_t)j * hd : head_of(vbuf + (conv ? (size_t)j * hd : 0), v, L, &at, rows[j]);
            if (!conv) /* the pool's own row */
                kr[j] = head_of(kbuf, k, L, &at, rows[j]);
        }
        for (int a = 0; a < nj; a += 16) { /* the keys 16 at a time: a pool other than F32 converts */
            const int nk = nj - a < 16 ? nj - a : 16; /* them into a buffer of 16 rows, which stays in L1 */
            if (q8) {
                q8_keys(kt, ks, kbuf, k, L, &at, rows + a, scs + a, a, nk, vnni);
                continue;
            }
            if (conv)
                for (int j = 0; j < nk; j++)
                    kr[a + j] = head_of(kbuf + (size_t)j * hd, k, L, &at, rows[a + j]);
            transpose_group(kt, kr + a, a, nk, hd);
        }
        for (int r = 0; r < R; r++) {
            const int nr = n_keys[r] - j0 < IFK_KV_CHUNK ? n_keys[r] - j0 : IFK_KV_CHUNK;
            if (nr <= 0)
                continue;
            const float *qr = q + (size_t)r * ld;
            float *o = cur + (size_t)r * ldc;
            const kv_q8q rq = {qi + r * QH, vnni ? NULL : qf + r * QH, qs + r * QG, qb + r * QG, ks,
                               v8 ? vr8 : NULL, vsc};
            const kv_q8q *q8r = q8 ? &rq : NULL;
            kv_pf *p = pf.e == 0 && pf.l == 0 ? &pf : NULL; /* the first row's loops request the lines */
            if (hd == 64) /* the common sizes as constants: unrolled */
                row_step(o, qr, q8r, kt, s, m[r], l[r], vr, nr, nh, 64, G, scale, L->softcap, p, vnni);
            else if (hd == 128)
                row_step(o, qr, q8r, kt, s, m[r], l[r], vr, nr, nh, 128, G, scale, L->softcap, p, vnni);
            else
                row_step(o, qr, q8r, kt, s, m[r], l[r], vr, nr, nh, hd, G, scale, L->softcap, p, vnni);
        }
        pf_rest(&pf);
    }
    if (ml) { /* a part of its own: the combine merges it */
        for (int r = 0; r < R; r++) {
            memcpy(ml + (size_t)r * 2 * nh, m[r], sizeof m[r]);
            memcpy(ml + (size_t)r * 2 * nh + nh, l[r], sizeof l[r]);
        }
        return;
    }
    if (split) /* the last part (rows with keys in it) into out */
        for (int r = 0, p0 = first + (last - first - 1) / IFK_KV_PART * IFK_KV_PART; r < R; r++)
            if (n_keys[r] > p0)
                merge_part(out + (size_t)r * ldo, am[r], al[r], cur + (size_t)r * ldc, m[r], l[r], nh, hd);
    for (int r = 0; r < R; r++)
        for (int h = 0; h < nh; h++)
            scale_row(out + (size_t)r * ldo + (size_t)h * hd, hd,
                      1.0f / sink_sum(L, g, nh, h, split ? am[r][h] : m[r][h], split ? al[r][h] : l[r][h]));
}

#define ATTEND_ARGS                                                                                \
    float *restrict out, size_t ldo, float *restrict ml, const float *restrict q, size_t ld, int R, const void *k, \
        const void *v, const ifk_kv_layout *L, const int32_t *table, int first, const int *n_keys, int pf_last,   \
        int g, int nh, float scale
KV_CLONES
static void attend_rows(ATTEND_ARGS)
{
    attend_body(out, ldo, ml, q, ld, R, k, v, L, table, first, n_keys, pf_last, g, nh, scale, 0);
}

#if KV_VNNI
KV_VNNI_TARGET
static void attend_rows_vnni(ATTEND_ARGS)
{
    attend_body(out, ldo, ml, q, ld, R, k, v, L, table, first, n_keys, pf_last, g, nh, scale, 1);
}
#endif
#undef ATTEND_ARGS

/* Whether this process's Q8 pools take attend_rows_vnni: the CPU has AVX-512 and AVX512_VNNI and
 * no narrower path is forced (ifk_set_isa: tests compare the two). */
static int use_vnni(const ifk_kv_layout *L)
{
#if KV_VNNI
    return q8_int(L) && ifk_isa_current() >= IFK_ISA_AVX512 && __builtin_cpu_supports("x86-64-v4") &&
           __builtin_cpu_supports("avx512vnni");
#else
    (void)L;
    return 0;
#endif
}

/* Paged attention on the pool (pool.h). A unit is `rows` (up to ATTEND_ROWS) consecutive query
 * rows of one sequence for one kv head; in a split call, a sequence whose keys span parts[s] > 1
 * parts (IFK_KV_PART) has a unit for each part of each of those, which leaves its unnormalized
 * result in the work (a slot of `slot` floats a unit), and a second job merges each unit's parts
 * into the output (combine). Item i is units [i * upi, (i + 1) * upi). */
typedef struct {
    float *out;
    const float *q;
    size_t ld;
    const void *k, *v;
    const ifk_kv_layout *L;
    const ifk_kv_seq *seqs;
    const int *first;  /* [n_seqs + 1] unit index of each sequence's first unit (parts counted) */
    const int *gfirst; /* [n_seqs + 1] the same without parts (the combine's units)            */
    const int *parts;  /* [n_seqs] parts a unit of the sequence has in this call (1: none)     */
    float *work;       /* split: [units][slot]: a part's sums [rows][nh * head_dim], then [rows][2][nh] */
    size_t slot;
    int n_kv, nh, rows, units, upi;
    float scale;
    int vnni; /* Q8: attend_rows_vnni */
} paged_args;

/* The sequence of unit u (a prefix table f [n_seqs + 1]), from s on. */
static inline int seq_of(const int *f, int u, int s)
{
    while (f[s + 1] <= u)
        s++;
    return s;
}

/* The end of item i's units (item i is units [i * upi, end)). */
static inline int item_end(const paged_args *a, int item)
{
    return (item + 1) * a->upi < a->units ? (item + 1) * a->upi : a->units;
}

/* Unit gu of sequence q, parts not counted: its kv head *g and first row *i0; returns its rows. */
static inline int unit_rows(const paged_args *a, const ifk_kv_seq *q, int gu, int *g, int *i0)
{
    *g = gu % a->n_kv;
    *i0 = gu / a->n_kv * a->rows;
    return q->n_rows - *i0 < a->rows ? q->n_rows - *i0 : a->rows;
}

/* Row i0's n_keys (R rows from i0 of sequence q) and the first key they see. */
static inline int keys_of(int *n_keys, const ifk_kv_layout *L, const ifk_kv_seq *q, int i0, int R)
{
    for (int r = 0; r < R; r++)
        n_keys[r] = q->pos0 + (L->bidirectional ? q->n_rows : i0 + r + 1);
    return L->window > 0 && n_keys[0] > L->window ? n_keys[0] - L->window : 0;
}

KV_CLONES
static void paged_run(const void *args, const void *in, int item, float *unused)
{
    const paged_args *a = args;
    const ifk_kv_layout *L = a->L;
    const int hd = L->head_dim, u1 = item_end(a, item);
    int s = 0;
    for (int u = item * a->upi; u < u1; u++) {
        s = seq_of(a->first, u, s);
        const ifk_kv_seq *q = &a->seqs[s];
        const int np = a->parts[s], p = (u - a->first[s]) % np;
        int g, i0;
        const int R = unit_rows(a, q, (u - a->first[s]) / np, &g, &i0);
        int n_keys[ATTEND_ROWS], first = keys_of(n_keys, L, q, i0, R);
        const size_t off = (size_t)(q->row0 + i0) * a->ld + (size_t)g * a->nh * hd;
        float *o = a->out + off, *ml = NULL;
        size_t ldo = a->ld;
        int pf_last = 0;
        if (np > 1) { /* part p alone: keys first + p PART .. first + (p + 1) PART - 1 */
            first += p * IFK_KV_PART;
            pf_last = u + 1 < u1 && p + 1 < np ? n_keys[R - 1] : 0; /* this item's next unit: the next part */
            for (int r = 0; r < R; r++)
                n_keys[r] = n_keys[r] < first + IFK_KV_PART ? n_keys[r] : first + IFK_KV_PART;
            o = a->work + (size_t)u * a->slot;
            ml = o + (size_t)a->rows * a->nh * hd;
            ldo = (size_t)a->nh * hd;
        }
#if KV_VNNI
        if (a->vnni) {
            attend_rows_vnni(o, ldo, ml, a->q + off, a->ld, R, a->k, a->v, L, q->table, first, n_keys, pf_last, g,
                             a->nh, a->scale);
            continue;
        }
#endif
        attend_rows(o, ldo, ml, a->q + off, a->ld, R, a->k, a->v, L, q->table, first, n_keys, pf_last, g, a->nh,
                    a->scale);
    }
}

/* The combine of a split call: unit u (gfirst's numbering) of a sequence with parts: each row's
 * parts merged in order (merge_part, as attend_body merges them), then normalized. */
KV_CLONES
static void paged_combine(const void *args, const void *in, int item, float *unused)
{
    const paged_args *a = args;
    const int hd = a->L->head_dim, nh = a->nh, H = nh * hd, u1 = item_end(a, item);
    int s = 0;
    for (int u = item * a->upi; u < u1; u++) {
        s = seq_of(a->gfirst, u, s);
        const int np = a->parts[s];
        if (np == 1)
            continue; /* paged_run's output is final */
        const ifk_kv_seq *q = &a->seqs[s];
        const int gu = u - a->gfirst[s];
        int g, i0;
        const int R = unit_rows(a, q, gu, &g, &i0);
        const float *w = a->work + (size_t)(a->first[s] + gu * np) * a->slot;
        for (int r = 0; r < R; r++) {
            float *o = a->out + (size_t)(q->row0 + i0 + r) * a->ld + (size_t)g * H, m[nh], l[nh];
            const float *ml = w + (size_t)a->rows * H + (size_t)r * 2 * nh;
            memcpy(o, w + (size_t)r * H, (size_t)H * sizeof(float));
            memcpy(m, ml, sizeof m);
            memcpy(l, ml + nh, sizeof l);
            for (int p = 1; p < np; p++) {
                const float *pw = w + (size_t)p * a->slot, *pml = pw + (size_t)a->rows * H + (size_t)r * 2 * nh;
                if (pml[nh] > 0) /* the row has keys in part p */
                    merge_part(o, m, l, pw + (size_t)r * H, pml, pml + nh, nh, hd);
            }
            for (int h = 0; h < nh; h++)
                scale_row(o + (size_t)h * hd, hd, 1.0f / sink_sum(a->L, g, nh, h, m[h], l[h]));
        }
    }
}

/* A call's units: rows a unit, each sequence's parts (1 unless split), the prefix tables first
 * (with parts) and gfirst (without); returns the work floats of a split call, 0 when not split.
 * Split when the work (at most work_floats) lets the parts of long rows be units of their own and
 * there are fewer than 8 units a thread without. Nothing here changes a row's bits. */
typedef struct {
    int rows, units, gunits, nt;
    size_t slot, work;
} paged_plan;

static void plan_of(paged_plan *P, int *first, int *gfirst, int *parts, const ifk_kv_layout *L,
                    const ifk_kv_seq *seqs, int n_seqs, int nh, int nt, size_t work_floats)
{
    const int n_kv = L->n_kv_heads, hd = L->head_dim;
    int n_rows = 0, long_rows = 0;
    for (int s = 0; s < n_seqs; s++) {
        n_rows += seqs[s].n_rows;
        const int nk = seqs[s].pos0 + seqs[s].n_rows, span = L->window > 0 && nk > L->window ? L->window : nk;
        parts[s] = (span + IFK_KV_PART - 1) / IFK_KV_PART;
        long_rows |= parts[s] > 1;
    }
    /* rows a unit: up to ATTEND_ROWS while every thread keeps about 8 units (a row's result does
     * not depend on it); with a window, each row has its own first key */
    int rows = n_rows * n_kv / (8 * nt);
    rows = L->window > 0 || rows < 1 ? 1 : rows > ATTEND_ROWS ? ATTEND_ROWS : rows;
    if (q8_int(L)) { /* a row's rounded query: qi, qf [nh][hd]; qs, qb [nh][hd / group] */
        const size_t row_bytes = (size_t)nh * hd * 5 + (size_t)nh * (hd / L->group) * 8;
        while (rows > 1 && (size_t)rows * row_bytes > ATTEND_Q8_BYTES)
            rows--;
    }
    while (long_rows && rows > 1 && (size_t)rows * nh * hd * sizeof(float) > ATTEND_PART_BYTES)
        rows--; /* a unit's part sums (attend_body's pbuf) */
    gfirst[0] = 0;
    for (int s = 0; s < n_seqs; s++)
        gfirst[s + 1] = gfirst[s] + (seqs[s].n_rows + rows - 1) / rows * n_kv;
    const size_t slot = (size_t)rows * (nh * hd + 2 * nh);
    size_t part_units = 0; /* units when split */
    for (int s = 0; s < n_seqs; s++)
        part_units += (size_t)(gfirst[s + 1] - gfirst[s]) * parts[s];
    const size_t work = part_units * slot;
    const int split = nt > 1 && long_rows && gfirst[n_seqs] < 8 * nt && work <= work_floats;
    first[0] = 0;
    for (int s = 0; s < n_seqs; s++) {
        parts[s] = split ? parts[s] : 1;
        first[s + 1] = first[s] + (gfirst[s + 1] - gfirst[s]) * parts[s];
    }
    *P = (paged_plan){rows, first[n_seqs], gfirst[n_seqs], nt, slot, split ? work : 0};
}

/* Threads for a call of n_threads (<= 0: every core). */
static int threads_of(int n_threads) { return n_threads > 0 ? n_threads : omp_get_num_procs(); }

size_t ifk_attention_work(const ifk_kv_layout *L, const ifk_kv_seq *seqs, int n_seqs, int n_heads, int n_threads)
{
    if (n_seqs <= 0 || L->n_kv_heads <= 0 || n_heads % L->n_kv_heads)
        return 0;
    int first[n_seqs + 1], gfirst[n_seqs + 1], parts[n_seqs];
    paged_plan P;
    plan_of(&P, first, gfirst, parts, L, seqs, n_seqs, n_heads / L->n_kv_heads, threads_of(n_threads),
            IFK_KV_WORK_MAX);
    return P.work;
}

void ifk_attention_paged(float *out, const float *q, size_t ld, const void *k, const void *v,
                         const ifk_kv_layout *L, const ifk_kv_seq *seqs, int n_seqs, int n_heads,
                         float scale, int n_threads, float *work, size_t work_floats)
{
    const int n_kv = L->n_kv_heads;
    if (n_seqs <= 0 || n_kv <= 0 || n_heads % n_kv)
        return;
    const int nh = n_heads / n_kv;
    int first[n_seqs + 1], gfirst[n_seqs + 1], parts[n_seqs];
    paged_plan P;
    plan_of(&P, first, gfirst, parts, L, seqs, n_seqs, nh, threads_of(n_threads), work ? work_floats : 0);
    int nt = P.nt < P.units ? P.nt : P.units;
    int upi = (P.units + IFK_POOL_MAX_ITEMS - 1) / IFK_POOL_MAX_ITEMS;
    if (P.work && upi < P.units / (4 * nt)) /* about 4 items a thread, each a run of parts, */
        upi = P.units / (4 * nt);          /* which prefetches its next part's first keys  */
    paged_args a = {out, q, ld, k, v, L, seqs, first, gfirst, parts, work, P.slot, n_kv, nh, P.rows, P.units, upi,
                    scale, use_vnni(L)};
    ifk_pool_run(&(ifk_pool_job){.run = paged_run, .args = &a, .args_size = sizeof a,
                                 .n_items = (P.units + upi - 1) / upi, .max_threads = nt});
    if (!P.work)
        return;
    a.units = P.gunits; /* the combine: one unit for each (rows, kv head) */
    a.upi = upi = (P.gunits + IFK_POOL_MAX_ITEMS - 1) / IFK_POOL_MAX_ITEMS;
    nt = P.nt < P.gunits ? P.nt : P.gunits;
    ifk_pool_run(&(ifk_pool_job){.run = paged_combine, .args = &a, .args_size = sizeof a,
                                 .n_items = (P.gunits + upi - 1) / upi, .max_threads = nt});
}
