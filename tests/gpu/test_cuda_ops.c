/*
 * test_cuda_ops.c -- the CUDA attention, cache-store and per-token kernels (kernels/cuda/
 * attention.cu, ops.cu) against their scalar CPU references on random data with a fixed seed.
 * Needs a GPU: without one it fails at once, saying so. Run by `make check-gpu`.
 *
 * Covered: decoding attention (F32 and F16 caches, head_dim 8/16/32/64/80/96/128/256, GQA ratios 1, 2,
 * 4, 8, 3, 6, 7, 16, contexts of 1, 17 and 4097 keys, long contexts of 16384 and 40000 keys, a group larger
 * than one block's 8 heads, a padded and an unaligned row stride), prefill attention (T = 2,
 * 17, 100 at pos0 = 0 and pos0 > 0, the same shapes), the argument checks, kv_shift (against
 * the CPU's ifk_kv_shift: keys within 1e-5 relative, values bit for bit), kv_store (F32 and
 * F16, bit-exact), rmsnorm, rope (both layouts, freq_scale or not, partial rot_dim, several
 * positions), silu_mul, add, add_bias, argmax (ties, n = 1, a vocabulary of 151936), and
 * recording (ifkc_graph_*): three recordings of the same ops with other lengths give the ops'
 * results exactly, set up one graph and update it twice; a download while recording is
 * refused; an aborted recording runs nothing. The fused ops (add_rmsnorm, rope_store) and a
 * positional recording (ifkc_graph_begin_at) replayed at 259 next positions, against the ops;
 * a second key's recording and a plain one leave the first key's graph to replay. Overlapped
 * launches (ifkc_set_overlap): a decode layer of fused ops, F16 and Q4_B64 weights, op by op
 * and replayed, gives the bits it gives without them.
 *
 * Tolerances (the CPU reference accumulates dot products and sums in double):
 *   attention:  |o - ref| <= 1e-4 * max |v| (5e-3 where it runs on tensor cores, which
 *               round Q and the probabilities to F16). The GPU sums in F32 in another order: scores
 *               (head_dim terms), probabilities and weighted V (up to 40000 terms, split over
 *               chunks and lanes); the float error of such sums is ~1e-6 relative, 1e-4 leaves
 *               room for the longest sums while any indexing or masking error (a wrong key,
 *               a missing rescale) is far larger.
 *   rmsnorm, add_rmsnorm:
 *               |y - ref| <= 1e-6 * |ref| + 1e-30: both sum squares in double; only the
 *               float rounding of 1/sqrt may differ (1 ulp = 1.2e-7 relative).
 *   rope:       |x - ref| <= 1e-6 absolute for |x| <= 1: angles, cos and sin in double on both
 *               sides, rounded once to float; CUDA's double pow/sincos may differ from libm by
 *               an ulp of double, which changes the float cos/sin at most by 1 float ulp.
 *   silu_mul:   |g - ref| <= 1e-6 * |ref| + 1e-30: CUDA's expf is within 2 ulp, glibc's 1.
 *   kv_store, add, add_bias, argmax: exact.
 *   Fused ops against the ops they stand for, a positional recording's replays against the
 *   ops run at each position, and overlapped launches against plain ones: exact (the same
 *   operations in the same order).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/kvcache.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/cuda_kernels.h"
#include "libcore/base/dtype.h"
#include "tests/gpu/gpulib.h"


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




static const char *kvname(int kv_type)
{
    return kv_type == IFK_F32 ? "f32" : "f16";
}

/* ---- attention --------------------------------------------------------------------------- */

enum { VIA_DISPATCH, VIA_DIRECT };

/* One attention case: T queries at pos0 over a cache of pos0 + T rows of stride kv_ld
 * (n_kv*head_dim + pad). via: through ifkc_attention or the decode / prefill entry itself. */
static void attn_case(int kv_type, int head_dim, int n_heads, int n_kv, int T, int pos0, size_t pad, int via)
{
    const size_t kv_ld = (size_t)n_kv * head_dim + pad, n_ctx = (size_t)pos0 + T;
    const size_t nq = (size_t)T * n_heads * head_dim, nkv = n_ctx * kv_ld;
    const float scale = 1.0f / sqrtf((float)head_dim);
    float *q = gpu_xmalloc(nq * 4), *k = gpu_xmalloc(nkv * 4), *v = gpu_xmalloc(nkv * 4);
    float *ref = gpu_xmalloc(nq * 4), *got = gpu_xmalloc(nq * 4);
    fill(q, nq, -3.0f, 3.0f); /* scores of a few units: a softmax neither flat nor one-hot */
    fill(k, nkv, -1.0f, 1.0f);
    fill(v, nkv, -1.0f, 1.0f);
    const void *k_up = k, *v_up = v;
    uint16_t *kh = NULL, *vh = NULL;
    if (kv_type == IFK_F16) { /* the reference reads the same F16 values */
        kh = gpu_xmalloc(nkv * 2);
        vh = gpu_xmalloc(nkv * 2);
        for (size_t i = 0; i < nkv; i++) {
            kh[i] = iflow_f32_to_f16(k[i]);
            vh[i] = iflow_f32_to_f16(v[i]);
            k[i] = ifk_f16_to_f32(kh[i]);
            v[i] = ifk_f16_to_f32(vh[i]);
        }
        k_up = kh;
        v_up = vh;
    }
    float vmax = 0.0f;
    for (size_t i = 0; i < nkv; i++)
        vmax = fmaxf(vmax, fabsf(v[i]));
    ifk_attention(ref, q, k, v, kv_ld, T, pos0, n_heads, n_kv, head_dim, scale, 0);

    const size_t es = kv_type == IFK_F32 ? 4 : 2;
    float *dq = gpu_dup(q, nq * 4), *dout = gpu_dup(NULL, nq * 4);
    void *dk = gpu_dup(k_up, nkv * es), *dv = gpu_dup(v_up, nkv * es);
    int rc;
    if (via == VIA_DISPATCH)
        rc = ifkc_attention(dev, dout, dq, dk, dv, kv_type, kv_ld, T, pos0, n_heads, n_kv, head_dim, scale);
    else if (T == 1)
        rc = ifkc_attention_decode(dev, dout, dq, dk, dv, kv_type, kv_ld, pos0 + 1, n_heads, n_kv, head_dim, scale);
    else
        rc = ifkc_attention_prefill(dev, dout, dq, dk, dv, kv_type, kv_ld, T, pos0, n_heads, n_kv, head_dim, scale);
    CHECK(rc == 0, "attention %s d%d %d/%d T%d pos0 %d: %s", kvname(kv_type), head_dim, n_heads, n_kv, T, pos0,
          ifkc_errmsg());
    if (rc == 0 && gpu_fetch(got, dout, nq * 4) == 0) {
        double worst = 0.0;
        size_t at = 0;
        for (size_t i = 0; i < nq; i++) {
            double e = fabs((double)got[i] - ref[i]);
            if (!(e <= worst)) { /* NaN counts as worst */
                worst = isnan(e) ? INFINITY : e;
                at = i;
            }
        }
        /* tensor cores (a build with IFKC_PF_TC=1 or IFKC_DEC_TC=1) round Q and P to F16 */
        const int tc = T > 1 ? ifkc_attention_prefill_tensor_cores(kv_type, head_dim, T)
                             : ifkc_attention_decode_tensor_cores(kv_type, head_dim, n_heads / n_kv);
        const double tol = tc ? 5e-3 : 1e-4;
        CHECK(worst <= tol * vmax,
              "attention %s d%d heads %d/%d T%d pos0 %d ld %zu: |err| %.3g at %zu (got %g, ref %g; max |v| %g)",
              kvname(kv_type), head_dim, n_heads, n_kv, T, pos0, kv_ld, worst, at, got[at], ref[at], vmax);
    }
    ifkc_free(dev, dq);
    ifkc_free(dev, dout);
    ifkc_free(dev, dk);
    ifkc_free(dev, dv);
    free(q);
    free(k);
    free(v);
    free(ref);
    free(got);
    free(kh);
    free(vh);
}

static const int head_dims[] = {8, 16, 32, 64, 80, 96, 128, 256};
static const int ratios[] = {1, 2, 4, 8}; /* the decode kernel's heads per block: 1, 2, 4, 8 */

static void test_attention_decode(void)
{
    printf("OBSERVED decoding attention on tensor cores (F16 cache, head_dim 128, groups of 4): %s\n",
           ifkc_attention_decode_tensor_cores(IFK_F16, 128, 4) ? "yes" : "no");
    static const int ctx[] = {1, 17, 4097};
    for (int kt = IFK_F32; kt <= IFK_F16; kt++)
        for (size_t di = 0; di < sizeof head_dims / sizeof *head_dims; di++)
            for (size_t ri = 0; ri < sizeof ratios / sizeof *ratios; ri++)
                for (size_t ci = 0; ci < sizeof ctx / sizeof *ctx; ci++)
                    attn_case(kt, head_dims[di], 2 * ratios[ri], 2, 1, ctx[ci] - 1, 0,
                              ci % 2 ? VIA_DIRECT : VIA_DISPATCH);
}

static void test_attention_decode_long(void)
{
    /* A Llama-3-8B layer (32 heads, 8 kv heads): several chunks on every SM. */
    attn_case(IFK_F16, 128, 32, 8, 1, 16383, 0, VIA_DISPATCH);
    attn_case(IFK_F32, 128, 32, 8, 1, 16383, 0, VIA_DIRECT);
    /* Long enough that chunks reach their maximum length (1024 keys) on any GPU. */
    attn_case(IFK_F16, 64, 8, 8, 1, 39999, 0, VIA_DISPATCH);
    /* Groups of 7 (Qwen2.5-7B) and of 16 (two head slices of one kv head). */
    attn_case(IFK_F16, 128, 28, 4, 1, 5000, 0, VIA_DISPATCH);
    attn_case(IFK_F32, 128, 32, 2, 1, 3000, 0, VIA_DISPATCH);
    attn_case(IFK_F16, 64, 16, 1, 1, 700, 0, VIA_DIRECT);
    /* Groups of 3 and 6: blocks of 4 and 8 heads, one and two of them idle. */
    attn_case(IFK_F32, 64, 6, 2, 1, 3000, 0, VIA_DISPATCH);
    attn_case(IFK_F16, 128, 12, 2, 1, 9000, 0, VIA_DIRECT);
    /* Llama-2-7B: no grouping (32 heads, 32 kv heads), one head a block, several chunks. */
    attn_case(IFK_F16, 128, 32, 32, 1, 4500, 0, VIA_DISPATCH);
    /* A padded row stride that keeps rows 16-byte aligned (the fast kernel) ... */
    attn_case(IFK_F32, 96, 8, 2, 1, 2000, 8, VIA_DISPATCH);
    attn_case(IFK_F16, 80, 8, 2, 1, 2000, 16, VIA_DISPATCH);
    /* ... and strides that do not (the fallback). */
    attn_case(IFK_F16, 128, 8, 2, 1, 1500, 4, VIA_DISPATCH);
    attn_case(IFK_F32, 64, 4, 4, 1, 300, 1, VIA_DIRECT);
}

static void test_attention_prefill(void)
{
    printf("OBSERVED prefill attention on tensor cores (F16 cache, head_dim 128, T 512): %s\n",
           ifkc_attention_prefill_tensor_cores(IFK_F16, 128, 512) ? "yes" : "no");
    static const int Ts[] = {2, 17, 100};
    static const int pos0s[] = {0, 45};
    for (int kt = IFK_F32; kt <= IFK_F16; kt++)
        for (size_t di = 0; di < sizeof head_dims / sizeof *head_dims; di++)
            for (size_t ri = 0; ri < sizeof ratios / sizeof *ratios; ri++)
                for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++)
                    for (size_t pi = 0; pi < sizeof pos0s / sizeof *pos0s; pi++)
                        attn_case(kt, head_dims[di], 2 * ratios[ri], 2, Ts[ti], pos0s[pi], 0,
                                  (ti + pi) % 2 ? VIA_DIRECT : VIA_DISPATCH);
    /* Padded and unaligned strides, a long prompt after a long context, T = 1 through the
     * prefill entry. */
    attn_case(IFK_F32, 128, 8, 2, 33, 70, 24, VIA_DISPATCH);
    attn_case(IFK_F16, 64, 4, 1, 40, 10, 3, VIA_DIRECT);
    attn_case(IFK_F16, 128, 8, 8, 300, 1000, 0, VIA_DISPATCH);
    attn_case(IFK_F32, 256, 2, 1, 65, 0, 0, VIA_DISPATCH);
    attn_case(IFK_F32, 64, 4, 2, 1, 77, 0, VIA_DIRECT); /* T == 1: the decode entry */
    {
        const int hd = 96, nh = 4, nkv = 2, T = 1, pos0 = 50;
        const size_t ld = (size_t)nkv * hd, n_ctx = (size_t)pos0 + T;
        float *q = gpu_xmalloc((size_t)nh * hd * 4), *k = gpu_xmalloc(n_ctx * ld * 4), *v = gpu_xmalloc(n_ctx * ld * 4);
        float *ref = gpu_xmalloc((size_t)nh * hd * 4), *got = gpu_xmalloc((size_t)nh * hd * 4);
        fill(q, (size_t)nh * hd, -1, 1);
        fill(k, n_ctx * ld, -1, 1);
        fill(v, n_ctx * ld, -1, 1);
        ifk_attention(ref, q, k, v, ld, T, pos0, nh, nkv, hd, 0.1f, 0);
        float *dq = gpu_dup(q, (size_t)nh * hd * 4), *dout = gpu_dup(NULL, (size_t)nh * hd * 4);
        float *dk = gpu_dup(k, n_ctx * ld * 4), *dv = gpu_dup(v, n_ctx * ld * 4);
        int rc = ifkc_attention_prefill(dev, dout, dq, dk, dv, IFK_F32, ld, T, pos0, nh, nkv, hd, 0.1f);
        CHECK(rc == 0, "prefill with T = 1: %s", ifkc_errmsg());
        if (rc == 0 && gpu_fetch(got, dout, (size_t)nh * hd * 4) == 0) {
            double worst = 0.0;
            for (int i = 0; i < nh * hd; i++)
                worst = fmax(worst, fabs((double)got[i] - ref[i]));
            CHECK(worst <= 1e-4, "prefill with T = 1: |err| %g", worst);
        }
        ifkc_free(dev, dq);
        ifkc_free(dev, dout);
        ifkc_free(dev, dk);
        ifkc_free(dev, dv);
        free(q);
        free(k);
        free(v);
        free(ref);
        free(got);
    }
}

static void test_attention_args(void)
{
    float *buf = gpu_dup(NULL, 1 << 20);
    int rc = ifkc_attention(dev, buf, buf, buf, buf, IFK_F32, 2 * 72, 1, 0, 4, 2, 72, 1.0f);
    CHECK(rc == IFKC_EUNSUPPORTED && strstr(ifkc_errmsg(), "head_dim 72"), "head_dim 72: %d %s", rc, ifkc_errmsg());
    rc = ifkc_attention(dev, buf, buf, buf, buf, IFK_BF16, 2 * 64, 3, 0, 4, 2, 64, 1.0f);
    CHECK(rc == IFKC_EUNSUPPORTED && strstr(ifkc_errmsg(), "type"), "bf16 cache: %d %s", rc, ifkc_errmsg());
    rc = ifkc_attention(dev, buf, buf, buf, buf, IFK_F32, 3 * 64, 1, 0, 4, 3, 64, 1.0f);
    CHECK(rc == IFKC_EINVAL && *ifkc_errmsg(), "4 heads over 3 kv heads: %d %s", rc, ifkc_errmsg());
    rc = ifkc_attention(dev, buf, buf, buf, buf, IFK_F32, 64, 1, 0, 4, 2, 64, 1.0f);
    CHECK(rc == IFKC_EINVAL && *ifkc_errmsg(), "kv_ld too short: %d %s", rc, ifkc_errmsg());
    rc = ifkc_attention_decode(dev, buf, buf, buf, buf, IFK_F32, 128, 0, 2, 2, 64, 1.0f);
    CHECK(rc == IFKC_EINVAL && *ifkc_errmsg(), "decode of 0 keys: %d %s", rc, ifkc_errmsg());
    rc = ifkc_attention(dev, buf, NULL, buf, buf, IFK_F32, 128, 1, 0, 2, 2, 64, 1.0f);
    CHECK(rc == IFKC_EINVAL && *ifkc_errmsg(), "NULL q: %d %s", rc, ifkc_errmsg());
    rc = ifkc_kv_store(dev, buf, IFK_BF16, 64, 0, buf, 64, 1, 64);
    CHECK(rc == IFKC_EUNSUPPORTED, "kv_store bf16: %d %s", rc, ifkc_errmsg());
    CHECK(ifkc_sync(dev) == 0, "sync after argument errors: %s", ifkc_errmsg());
    ifkc_free(dev, buf);
}

/* ---- kv_store ---------------------------------------------------------------------------- */

static void test_kv_store(void)
{
    const int T = 5, n = 300, pos0 = 3, rows = 10;
    const size_t ld_src = 310, ld_dst = 320;
    float *src = gpu_xmalloc((size_t)T * ld_src * 4);
    fill(src, (size_t)T * ld_src, -70000.0f, 70000.0f);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < n; i += 3)
            src[(size_t)t * ld_src + i] *= 1e-4f; /* most values finite in F16 too */
    /* Values that exercise F16 rounding: ties to even, subnormals, overflow, signed zero. */
    const float special[] = {0.0f, -0.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 0x1p-20f, -0x1.8p-24f, 0x1p-26f,
                             65504.0f, 65520.0f, -1e6f, 3.14159265f, 1e-3f};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++)
        src[i * 7 + 1] = special[i];
    float *dsrc = gpu_dup(src, (size_t)T * ld_src * 4);
    for (int kt = IFK_F32; kt <= IFK_F16; kt++) {
        const size_t es = kt == IFK_F32 ? 4 : 2, bytes = rows * ld_dst * es;
        unsigned char *guard = gpu_xmalloc(bytes), *got = gpu_xmalloc(bytes);
        memset(guard, 0x5a, bytes);
        void *dc = gpu_dup(guard, bytes);
        int rc = ifkc_kv_store(dev, dc, kt, ld_dst, pos0, dsrc, ld_src, T, n);
        CHECK(rc == 0, "kv_store %s: %s", kvname(kt), ifkc_errmsg());
        if (rc == 0 && gpu_fetch(got, dc, bytes) == 0) {
            int bad = 0;
            for (int r = 0; r < rows && !bad; r++)
                for (size_t i = 0; i < ld_dst && !bad; i++) {
                    const size_t at = (r * ld_dst + i) * es;
                    const int inside = r >= pos0 && r < pos0 + T && i < (size_t)n;
                    unsigned char want[4];
                    if (!inside) {
                        memcpy(want, guard + at, es);
                    } else if (kt == IFK_F32) {
                        memcpy(want, &src[(size_t)(r - pos0) * ld_src + i], 4);
                    } else {
                        uint16_t h = iflow_f32_to_f16(src[(size_t)(r - pos0) * ld_src + i]);
                        memcpy(want, &h, 2);
                    }
                    if (memcmp(want, got + at, es)) {
                        bad = 1;
                        CHECK(0, "kv_store %s: row %d element %zu differs (%s)", kvname(kt), r, i,
                              inside ? "stored value" : "outside the stored rows");
                    }
                }
            CHECK(!bad, "kv_store %s bit-exact", kvname(kt));
        }
        ifkc_free(dev, dc);
        free(guard);
        free(got);
    }
    ifkc_free(dev, dsrc);
    free(src);
}

/* ---- kv_shift: against the CPU kernel (kernels/cpu/kvcache.h) ---------------------------- */

static void test_kv_shift(void)
{
    enum { NKV = 2, HD = 64, KV = NKV * HD, ROWS = 100, NPAST = 90, KEEP = 4, DISCARD = 29 };
    float fs[HD / 2];
    for (int i = 0; i < HD / 2; i++)
        fs[i] = 0.5f + (float)i / HD;
    float *dfs = gpu_dup(fs, sizeof fs);
    for (int kt = IFK_F32; kt <= IFK_F16; kt++)
        for (int layout = IFK_ROPE_HALF; layout <= IFK_ROPE_INTERLEAVED; layout++)
            for (int rot = 32; rot <= 64; rot += 32) {
                ifk_kv_layout L = {.type = kt == IFK_F32 ? IFK_KV_F32 : IFK_KV_F16, .block = ROWS, .n_kv_heads = NKV,
                                   .head_dim = HD, .group = ifk_kv_group(HD), .n_blocks = 1};
                const size_t bytes = ifk_kv_pool_bytes(&L);
                unsigned char *k = gpu_xmalloc(bytes), *v = gpu_xmalloc(bytes), *gk = gpu_xmalloc(bytes),
                              *gv = gpu_xmalloc(bytes);
                float row[KV], tmp[KV];
                int32_t table[1] = {0};
                for (int p = 0; p < ROWS; p++) {
                    ifk_kv_seq s = {.row0 = 0, .n_rows = 1, .pos0 = p, .table = table};
                    fill(row, KV, -2.0f, 2.0f);
                    ifk_kv_store(k, &L, &s, 1, row, KV, 1);
                    fill(row, KV, -2.0f, 2.0f);
                    ifk_kv_store(v, &L, &s, 1, row, KV, 1);
                }
                void *dk = gpu_dup(k, bytes), *dv = gpu_dup(v, bytes);
                ifk_rope_params rp = {rot, 10000.0f, fs, layout};
                ifk_kv_shift(k, v, &L, table, NPAST, KEEP, DISCARD, &rp, tmp);
                int rc = ifkc_kv_shift(dev, dk, dv, kt, KV, NKV, HD, rot, NPAST, KEEP, DISCARD, 10000.0f, dfs, layout);
                CHECK(rc == 0, "kv_shift %s: %s", kvname(kt), ifkc_errmsg());
                if (rc == 0 && gpu_fetch(gk, dk, bytes) == 0 && gpu_fetch(gv, dv, bytes) == 0) {
                    double worst = 0;
                    for (int p = 0; p < ROWS; p++) {
                        float a[KV], b[KV];
                        ifk_kv_load_row(a, k, &L, table, p);
                        ifk_kv_load_row(b, gk, &L, table, p);
                        for (int i = 0; i < KV; i++)
                            worst = fmax(worst, fabs((double)a[i] - b[i]) / (fabs(a[i]) + 1e-3));
                    }
                    CHECK(worst < 1e-5, "kv_shift %s layout %d rot %d: keys differ from the CPU's by %.3g (relative)",
                          kvname(kt), layout, rot, worst);
                    CHECK(memcmp(gv, v, bytes) == 0, "kv_shift %s: values not moved as the CPU moves them", kvname(kt));
                }
                ifkc_free(dev, dk);
                ifkc_free(dev, dv);
                free(k), free(v), free(gk), free(gv);
            }
    ifkc_free(dev, dfs);
    CHECK(ifkc_kv_shift(dev, dfs, dfs, IFK_F32, 64, 1, 64, 64, 10, 4, 7, 1e4f, NULL, IFK_ROPE_HALF) == IFKC_EINVAL,
          "kv_shift: dropping past the end is refused");
}

/* ---- rmsnorm ----------------------------------------------------------------------------- */

static void test_rmsnorm(void)
{
    static const int ns[] = {1, 7, 1000, 4096, 5120, 8192, 10000}; /* 10000: the two-pass kernel */
    const int T = 3;
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
        for (int inplace = 0; inplace <= 1; inplace++) {
            const int n = ns[ni];
            const size_t tn = (size_t)T * n;
            float *x = gpu_xmalloc(tn * 4), *w = gpu_xmalloc((size_t)n * 4), *ref = gpu_xmalloc(tn * 4), *got = gpu_xmalloc(tn * 4);
            fill(x, tn, -2.0f, 2.0f);
            fill(w, n, 0.5f, 1.5f);
            for (int t = 0; t < T; t++)
                ifk_rmsnorm(ref + (size_t)t * n, x + (size_t)t * n, w, n, 1e-5f);
            float *dx = gpu_dup(x, tn * 4), *dw = gpu_dup(w, (size_t)n * 4);
            float *dy = inplace ? dx : gpu_dup(NULL, tn * 4);
            int rc = ifkc_rmsnorm(dev, dy, dx, dw, T, n, 1e-5f);
            CHECK(rc == 0, "rmsnorm n %d: %s", n, ifkc_errmsg());
            if (rc == 0 && gpu_fetch(got, dy, tn * 4) == 0) {
                size_t bad = tn;
                for (size_t i = 0; i < tn && bad == tn; i++)
                    if (!(fabsf(got[i] - ref[i]) <= 1e-6f * fabsf(ref[i]) + 1e-30f))
                        bad = i;
                CHECK(bad == tn, "rmsnorm n %d%s: element %zu is %g, reference %g", n, inplace ? " in place" : "",
                      bad, bad < tn ? got[bad] : 0.0f, bad < tn ? ref[bad] : 0.0f);
            }
            if (!inplace)
                ifkc_free(dev, dy);
            ifkc_free(dev, dx);
            ifkc_free(dev, dw);
            free(x);
            free(w);
            free(ref);
            free(got);
        }
}

/* ---- rope -------------------------------------------------------------------------------- */

static void rope_case(int head_dim, int rot_dim, int pos0, int layout, int with_fs)
{
    const int T = 4, n_heads = 3;
    const size_t ld = (size_t)n_heads * head_dim + 5, n = (size_t)T * ld;
    const float theta = 10000.0f;
    float *x = gpu_xmalloc(n * 4), *ref = gpu_xmalloc(n * 4), *got = gpu_xmalloc(n * 4), fs[128];
    fill(x, n, -1.0f, 1.0f);
    fill(fs, 128, 0.25f, 1.0f);
    memcpy(ref, x, n * 4);
    for (int t = 0; t < T; t++)
        ifk_rope(ref + (size_t)t * ld, n_heads, head_dim, rot_dim, pos0 + t, theta, with_fs ? fs : NULL, layout);
    float *dx = gpu_dup(x, n * 4), *dfs = gpu_dup(fs, sizeof fs);
    int rc = ifkc_rope(dev, dx, ld, T, n_heads, head_dim, rot_dim, pos0, theta, with_fs ? dfs : NULL, layout);
    CHECK(rc == 0, "rope: %s", ifkc_errmsg());
    if (rc == 0 && gpu_fetch(got, dx, n * 4) == 0) {
        double worst = 0.0;
        for (size_t i = 0; i < n; i++)
            worst = fmax(worst, fabs((double)got[i] - ref[i])); /* padding: ref == x, so checked too */
        CHECK(worst <= 1e-6, "rope d%d rot %d pos0 %d %s%s: |err| %g", head_dim, rot_dim, pos0,
              layout == IFK_ROPE_HALF ? "half" : "interleaved", with_fs ? " freq_scale" : "", worst);
    }
    ifkc_free(dev, dx);
    ifkc_free(dev, dfs);
    free(x);
    free(ref);
    free(got);
}

static void test_rope(void)
{
    static const int pos[] = {0, 7, 4095, 100000};
    for (int layout = IFK_ROPE_HALF; layout <= IFK_ROPE_INTERLEAVED; layout++)
        for (int fs = 0; fs <= 1; fs++)
            for (size_t pi = 0; pi < sizeof pos / sizeof *pos; pi++) {
                rope_case(128, 128, pos[pi], layout, fs);
                rope_case(64, 32, pos[pi], layout, fs); /* partial rotary */
                rope_case(80, 24, pos[pi], layout, fs);
            }
    rope_case(64, 200, 5, IFK_ROPE_HALF, 0); /* rot_dim past head_dim: the whole head */
}

/* ---- element-wise ------------------------------------------------------------------------ */

static void test_silu_mul_add(void)
{
    const size_t n = 1000003;
    float *g = gpu_xmalloc(n * 4), *u = gpu_xmalloc(n * 4), *ref = gpu_xmalloc(n * 4), *got = gpu_xmalloc(n * 4);
    fill(g, n, -20.0f, 20.0f);
    fill(u, n, -3.0f, 3.0f);
    float *dg = gpu_dup(g, n * 4), *du = gpu_dup(u, n * 4);

    memcpy(ref, g, n * 4);
    ifk_silu_mul(ref, u, (int)n);
    int rc = ifkc_silu_mul(dev, dg, du, n);
    CHECK(rc == 0, "silu_mul: %s", ifkc_errmsg());
    if (rc == 0 && gpu_fetch(got, dg, n * 4) == 0) {
        size_t bad = n;
        for (size_t i = 0; i < n && bad == n; i++)
            if (!(fabsf(got[i] - ref[i]) <= 1e-6f * fabsf(ref[i]) + 1e-30f))
                bad = i;
        CHECK(bad == n, "silu_mul: element %zu is %g, reference %g", bad, bad < n ? got[bad] : 0.0f,
              bad < n ? ref[bad] : 0.0f);
    }

    /* add: y = the CPU's silu result (on both sides: the two silu results may differ in the
     * last bit) + u */
    rc = ifkc_upload(dev, dg, ref, n * 4);
    CHECK(rc == 0, "add: upload: %s", ifkc_errmsg());
    ifk_add(ref, u, (int)n);
    rc = ifkc_add(dev, dg, du, n);
    CHECK(rc == 0, "add: %s", ifkc_errmsg());
    if (rc == 0 && gpu_fetch(got, dg, n * 4) == 0)
        CHECK(memcmp(got, ref, n * 4) == 0, "add: not bit-exact");
    ifkc_free(dev, dg);
    ifkc_free(dev, du);
    free(g);
    free(u);
    free(ref);
    free(got);
}

static void test_add_bias(void)
{
    const int T = 3, n = 1000;
    const size_t ldy = 1024, ny = (size_t)T * ldy;
    float *y = gpu_xmalloc(ny * 4), *b = gpu_xmalloc((size_t)n * 4), *ref = gpu_xmalloc(ny * 4), *got = gpu_xmalloc(ny * 4);
    fill(y, ny, -5.0f, 5.0f);
    fill(b, n, -1.0f, 1.0f);
    memcpy(ref, y, ny * 4);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < n; i++)
            ref[(size_t)t * ldy + i] += b[i];
    float *dy = gpu_dup(y, ny * 4), *db = gpu_dup(b, (size_t)n * 4);
    int rc = ifkc_add_bias(dev, dy, ldy, db, T, n);
    CHECK(rc == 0, "add_bias: %s", ifkc_errmsg());
    if (rc == 0 && gpu_fetch(got, dy, ny * 4) == 0)
        CHECK(memcmp(got, ref, ny * 4) == 0, "add_bias: not bit-exact (or padding touched)");
    ifkc_free(dev, dy);
    ifkc_free(dev, db);
    free(y);
    free(b);
    free(ref);
    free(got);
}

/* ---- argmax ------------------------------------------------------------------------------ */

static int host_argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

static void argmax_case(const float *x, int n, const char *what)
{
    float *dx = gpu_dup(x, (size_t)n * 4);
    int32_t got = -1;
    int rc = ifkc_argmax(dev, &got, dx, n);
    CHECK(rc == 0, "argmax %s: %s", what, ifkc_errmsg());
    CHECK(rc != 0 || got == host_argmax(x, n), "argmax %s: %d, expected %d", what, (int)got, host_argmax(x, n));
    ifkc_free(dev, dx);
}

static void test_argmax(void)
{
    const int n = 151936;
    float *x = gpu_xmalloc((size_t)n * 4);
    fill(x, n, -10.0f, 10.0f);
    argmax_case(x, n, "random 151936");
    x[123456] = 50.0f;
    x[1000] = 50.0f; /* a tie in another block: the lower index wins */
    x[150000] = 50.0f;
    argmax_case(x, n, "ties across blocks");
    x[1001] = 50.0f; /* a tie in the same block */
    x[999] = 50.0f;
    argmax_case(x, n, "ties in a block");
    x[n - 1] = 60.0f;
    argmax_case(x, n, "last element");
    for (int i = 0; i < n; i++)
        x[i] = -1.0f;
    argmax_case(x, n, "all equal");
    x[0] = 3.0f;
    argmax_case(x, 1, "n = 1");
    x[0] = -INFINITY;
    x[1] = -INFINITY;
    argmax_case(x, 2, "all -inf");
    fill(x, 1000, -1.0f, 1.0f);
    x[777] = 2.0f;
    argmax_case(x, 1000, "n = 1000");
    const int big = 300007; /* more elements than the blocks' minimum share x the maximum blocks */
    float *y = gpu_xmalloc((size_t)big * 4);
    fill(y, big, -1.0f, 1.0f);
    y[big - 2] = 1.5f;
    argmax_case(y, big, "300007");
    free(y);
    free(x);
    int32_t got;
    CHECK(ifkc_argmax(dev, &got, NULL, 5) == IFKC_EINVAL, "argmax of NULL");
}

/* ---- recording (CUDA graphs) ------------------------------------------------------------- */

static void test_graph(void)
{
    const size_t n = 4096;
    float *x = gpu_xmalloc(n * 4), *y = gpu_xmalloc(n * 4), *got = gpu_xmalloc(n * 4);
    fill(x, n, -1.0f, 1.0f);
    fill(y, n, -1.0f, 1.0f);
    float *dx = gpu_dup(x, n * 4), *dy = gpu_dup(y, n * 4);
    int32_t am;
    CHECK(ifkc_argmax(dev, &am, dy, (int)n) == 0, "graph: argmax before recording: %s", ifkc_errmsg());
    ifkc_graph_stats st0, st;
    ifkc_graph_stats_get(dev, &st0);
    for (int round = 0; round < 3; round++) {
        size_t m = n - (size_t)round * 7; /* other lengths: other kernel arguments, same nodes */
        int rc = ifkc_graph_begin(dev);
        CHECK(rc == 0, "graph: begin: %s", ifkc_errmsg());
        if (rc)
            break;
        float one;
        CHECK(ifkc_download(dev, &one, dx, 4) == IFKC_EUNSUPPORTED, "graph: a download while recording is refused");
        rc = ifkc_add(dev, dy, dx, m);
        if (rc == 0)
            rc = ifkc_argmax_start(dev, dy, (int)m);
        if (rc == 0)
            rc = ifkc_graph_end(dev);
        else
            ifkc_graph_abort(dev);
        CHECK(rc == 0, "graph: round %d: %s", round, ifkc_errmsg());
        if (rc)
            break;
        CHECK(ifkc_argmax_fetch(dev, &am) == 0, "graph: fetch: %s", ifkc_errmsg());
        int best = 0;
        for (size_t i = 0; i < m; i++) {
            y[i] += x[i];
            if (y[i] > y[best])
                best = (int)i;
        }
        if (gpu_fetch(got, dy, n * 4) == 0)
            CHECK(memcmp(got, y, n * 4) == 0, "graph: round %d: the recorded add is not the add", round);
        CHECK(am == best, "graph: round %d: argmax %d, expected %d", round, (int)am, best);
    }
    ifkc_graph_stats_get(dev, &st);
    CHECK(st.launches - st0.launches == 3 && st.instantiations - st0.instantiations == 1,
          "graph: %ld launches, %ld instantiations (expected 3 and 1: the later recordings update the graph)",
          st.launches - st0.launches, st.instantiations - st0.instantiations);
    /* abort: nothing recorded runs */
    CHECK(ifkc_graph_begin(dev) == 0, "graph: begin: %s", ifkc_errmsg());
    CHECK(ifkc_add(dev, dy, dx, n) == 0, "graph: add: %s", ifkc_errmsg());
    ifkc_graph_abort(dev);
    if (gpu_fetch(got, dy, n * 4) == 0)
        CHECK(memcmp(got, y, n * 4) == 0, "graph: an aborted recording changed y");
    ifkc_graph_stats_get(dev, &st0);
    CHECK(st0.aborts - st.aborts == 1, "graph: the abort was not counted");
    ifkc_free(dev, dx);
    ifkc_free(dev, dy);
    free(x);
    free(y);
    free(got);
}

/* ---- fused ops ---------------------------------------------------------------------------- */

/* add_rmsnorm: x += r stored bit for bit as ifk_add; y against the CPU's rmsnorm of the sum, and
 * bit for bit against ifkc_add then ifkc_rmsnorm (y = r, as the engine calls it). */
static void test_add_rmsnorm(void)
{
    static const int ns[] = {1, 7, 64, 1000, 4096, 5120, 8192, 10000}; /* 10000: two launches */
    const int T = 3;
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
        const int n = ns[ni];
        const size_t tn = (size_t)T * n;
        float *x = gpu_xmalloc(tn * 4), *r = gpu_xmalloc(tn * 4), *w = gpu_xmalloc((size_t)n * 4);
        float *sum = gpu_xmalloc(tn * 4), *ref = gpu_xmalloc(tn * 4), *gx = gpu_xmalloc(tn * 4), *gy = gpu_xmalloc(tn * 4);
        float *ux = gpu_xmalloc(tn * 4), *uy = gpu_xmalloc(tn * 4);
        fill(x, tn, -2.0f, 2.0f);
        fill(r, tn, -2.0f, 2.0f);
        fill(w, n, 0.5f, 1.5f);
        memcpy(sum, x, tn * 4);
        ifk_add(sum, r, tn);
        for (int t = 0; t < T; t++)
            ifk_rmsnorm(ref + (size_t)t * n, sum + (size_t)t * n, w, n, 1e-5f);
        float *dx = gpu_dup(x, tn * 4), *dr = gpu_dup(r, tn * 4), *dw = gpu_dup(w, (size_t)n * 4);
        float *ex = gpu_dup(x, tn * 4), *er = gpu_dup(r, tn * 4);
        int rc = ifkc_add_rmsnorm(dev, dx, dr, dw, T, n, 1e-5f);
        CHECK(rc == 0, "add_rmsnorm n %d: %s", n, ifkc_errmsg());
        int rc2 = ifkc_add(dev, ex, er, tn);
        if (rc2 == 0)
            rc2 = ifkc_rmsnorm(dev, er, ex, dw, T, n, 1e-5f);
        CHECK(rc2 == 0, "add then rmsnorm n %d: %s", n, ifkc_errmsg());
        if (rc == 0 && rc2 == 0 && gpu_fetch(gx, dx, tn * 4) == 0 && gpu_fetch(gy, dr, tn * 4) == 0 &&
            gpu_fetch(ux, ex, tn * 4) == 0 && gpu_fetch(uy, er, tn * 4) == 0) {
            CHECK(memcmp(gx, sum, tn * 4) == 0, "add_rmsnorm n %d: x + r is not ifk_add's", n);
            size_t bad = tn;
            for (size_t i = 0; i < tn && bad == tn; i++)
                if (!(fabsf(gy[i] - ref[i]) <= 1e-6f * fabsf(ref[i]) + 1e-30f))
                    bad = i;
            CHECK(bad == tn, "add_rmsnorm n %d: element %zu is %g, reference %g", n, bad, bad < tn ? gy[bad] : 0.0f,
                  bad < tn ? ref[bad] : 0.0f);
            CHECK(memcmp(gx, ux, tn * 4) == 0 && memcmp(gy, uy, tn * 4) == 0,
                  "add_rmsnorm n %d: not the values of ifkc_add then ifkc_rmsnorm", n);
        }
        ifkc_free(dev, dx), ifkc_free(dev, dr), ifkc_free(dev, dw), ifkc_free(dev, ex), ifkc_free(dev, er);
        free(x), free(r), free(w), free(sum), free(ref), free(gx), free(gy), free(ux), free(uy);
    }
    float *d1 = gpu_dup(NULL, 64);
    CHECK(ifkc_add_rmsnorm(dev, d1, d1, d1, 1, 16, 1e-5f) == IFKC_EINVAL, "add_rmsnorm with y = x is refused");
    ifkc_free(dev, d1);
}

/* rope_store: q, k and both caches bit for bit as ifkc_rope on q and k, then ifkc_kv_store of k
 * and v (cache rows outside the step untouched by both). */
static void rope_store_case(int kv_type, int head_dim, int rot_dim, int T, int pos0, int layout, int with_fs)
{
    const int nq = 6, nkv = 2, rows = pos0 + T + 3;
    const size_t ldq = (size_t)nq * head_dim, ldkv = (size_t)nkv * head_dim, ldc = ldkv + 8;
    const size_t es = kv_type == IFK_F32 ? 4 : 2, nqv = (size_t)T * ldq, nkvv = (size_t)T * ldkv, cb = rows * ldc * es;
    float *q = gpu_xmalloc(nqv * 4), *k = gpu_xmalloc(nkvv * 4), *v = gpu_xmalloc(nkvv * 4), fs[128];
    unsigned char *cache = gpu_xmalloc(cb), *a = gpu_xmalloc(cb), *b = gpu_xmalloc(cb);
    fill(q, nqv, -1.0f, 1.0f);
    fill(k, nkvv, -1.0f, 1.0f);
    fill(v, nkvv, -1.0f, 1.0f);
    fill(fs, 128, 0.25f, 1.0f);
    for (size_t i = 0; i < cb; i++)
        cache[i] = (unsigned char)(i * 37 + 11);
    float *dfs = gpu_dup(fs, sizeof fs), *fsp = with_fs ? dfs : NULL;
    float *q1 = gpu_dup(q, nqv * 4), *k1 = gpu_dup(k, nkvv * 4), *v1 = gpu_dup(v, nkvv * 4);
    float *q2 = gpu_dup(q, nqv * 4), *k2 = gpu_dup(k, nkvv * 4), *v2 = gpu_dup(v, nkvv * 4);
    void *kc1 = gpu_dup(cache, cb), *vc1 = gpu_dup(cache, cb), *kc2 = gpu_dup(cache, cb), *vc2 = gpu_dup(cache, cb);
    int rc = ifkc_rope(dev, q1, ldq, T, nq, head_dim, rot_dim, pos0, 10000.0f, fsp, layout);
    if (!rc)
        rc = ifkc_rope(dev, k1, ldkv, T, nkv, head_dim, rot_dim, pos0, 10000.0f, fsp, layout);
    if (!rc)
        rc = ifkc_kv_store(dev, kc1, kv_type, ldc, pos0, k1, ldkv, T, (int)ldkv);
    if (!rc)
        rc = ifkc_kv_store(dev, vc1, kv_type, ldc, pos0, v1, ldkv, T, (int)ldkv);
    CHECK(rc == 0, "rope then store: %s", ifkc_errmsg());
    int rc2 = ifkc_rope_store(dev, q2, ldq, nq, k2, v2, ldkv, nkv, kc2, vc2, kv_type, ldc, T, head_dim, rot_dim, pos0,
                              10000.0f, fsp, layout);
    CHECK(rc2 == 0, "rope_store: %s", ifkc_errmsg());
    if (rc == 0 && rc2 == 0) {
        const char *what = NULL;
        float *g1 = gpu_xmalloc(nqv * 4), *g2 = gpu_xmalloc(nqv * 4);
        if (gpu_fetch(g1, q1, nqv * 4) == 0 && gpu_fetch(g2, q2, nqv * 4) == 0 && memcmp(g1, g2, nqv * 4))
            what = "q";
        if (!what && gpu_fetch(g1, k1, nkvv * 4) == 0 && gpu_fetch(g2, k2, nkvv * 4) == 0 && memcmp(g1, g2, nkvv * 4))
            what = "k";
        if (!what && gpu_fetch(a, kc1, cb) == 0 && gpu_fetch(b, kc2, cb) == 0 && memcmp(a, b, cb))
            what = "the key cache";
        if (!what && gpu_fetch(a, vc1, cb) == 0 && gpu_fetch(b, vc2, cb) == 0 && memcmp(a, b, cb))
            what = "the value cache";
        CHECK(!what, "rope_store %s d%d rot %d T %d pos0 %d %s%s: %s differs from rope then store", kvname(kv_type),
              head_dim, rot_dim, T, pos0, layout == IFK_ROPE_HALF ? "half" : "interleaved", with_fs ? " freq_scale" : "",
              what);
        free(g1), free(g2);
    }
    ifkc_free(dev, dfs), ifkc_free(dev, q1), ifkc_free(dev, k1), ifkc_free(dev, v1), ifkc_free(dev, q2);
    ifkc_free(dev, k2), ifkc_free(dev, v2), ifkc_free(dev, kc1), ifkc_free(dev, vc1), ifkc_free(dev, kc2);
    ifkc_free(dev, vc2);
    free(q), free(k), free(v), free(cache), free(a), free(b);
}

static void test_rope_store(void)
{
    for (int kt = IFK_F32; kt <= IFK_F16; kt++)
        for (int layout = IFK_ROPE_HALF; layout <= IFK_ROPE_INTERLEAVED; layout++) {
            rope_store_case(kt, 64, 64, 1, 0, layout, 0);
            rope_store_case(kt, 128, 128, 1, 4095, layout, 1);
            rope_store_case(kt, 64, 32, 5, 37, layout, 0); /* partial rotary: the rest stored as it is */
            rope_store_case(kt, 8, 8, 17, 3, layout, 1);
            rope_store_case(kt, 256, 256, 2, 100000, layout, 0);
        }
}

/* ---- a step recorded once, run again at the next positions (ifkc_graph_begin_at) -------------- */

/* A decode step's position-dependent ops (rope_store, then attention of the one token) for
 * positions 0 .. n_steps - 1: op by op with their own positions, and as one positional
 * recording replayed at each next position. Outputs bit for bit equal at every position (the
 * attention's chunks are the same: 1 to 5 chunks of 64 keys here), the caches too. */
static void test_graph_at(void)
{
    enum { NQ = 32, NKV = 4, HD = 64, MAX_POS = 300, STEPS = 260 };
    const size_t ld = (size_t)NKV * HD, ldq = (size_t)NQ * HD, cb = (size_t)MAX_POS * ld * 2;
    float *q = gpu_xmalloc(ldq * 4), *kv = gpu_xmalloc(2 * ld * 4), *o1 = gpu_xmalloc(ldq * 4), *o2 = gpu_xmalloc(ldq * 4);
    float *dq[2] = {gpu_dup(NULL, ldq * 4), gpu_dup(NULL, ldq * 4)}, *dk[2] = {gpu_dup(NULL, ld * 4), gpu_dup(NULL, ld * 4)};
    float *dv[2] = {gpu_dup(NULL, ld * 4), gpu_dup(NULL, ld * 4)}, *dout[2] = {gpu_dup(NULL, ldq * 4), gpu_dup(NULL, ldq * 4)};
    void *kc[2] = {gpu_dup(NULL, cb), gpu_dup(NULL, cb)}, *vc[2] = {gpu_dup(NULL, cb), gpu_dup(NULL, cb)};
    const unsigned long long key = 0x1234;
    ifkc_graph_stats st0, st;
    ifkc_graph_stats_get(dev, &st0);
    int bad = 0, recorded = 0, retries = 0;
    for (int pos = 0; pos < STEPS && !bad; pos++) {
        fill(q, ldq, -1.0f, 1.0f);
        fill(kv, 2 * ld, -1.0f, 1.0f);
        for (int i = 0; i < 2; i++) /* the step's inputs, as the embedding and projections would leave them */
            if (ifkc_upload(dev, dq[i], q, ldq * 4) || ifkc_upload(dev, dk[i], kv, ld * 4) ||
                ifkc_upload(dev, dv[i], kv + ld, ld * 4))
                bad = 1;
        int rc = ifkc_rope_store(dev, dq[0], ldq, NQ, dk[0], dv[0], ld, NKV, kc[0], vc[0], IFK_F16, ld, 1, HD, HD, pos,
                                 10000.0f, NULL, IFK_ROPE_HALF);
        if (!rc)
            rc = ifkc_attention(dev, dout[0], dq[0], kc[0], vc[0], IFK_F16, ld, 1, pos, NQ, NKV, HD, 0.125f);
        CHECK(rc == 0, "graph_at: op by op at %d: %s", pos, ifkc_errmsg());
        rc = recorded ? ifkc_graph_replay(dev, pos, key) : 1;
        CHECK(rc >= 0, "graph_at: replay at %d: %s", pos, ifkc_errmsg());
        if (rc == 1) { /* record; a first try may lack scratch (the partials of 5 chunks) */
            CHECK(!recorded, "graph_at: replay at %d refused", pos);
            for (int tries = 0; tries < 2 && rc != 0; tries++) {
                rc = ifkc_graph_begin_at(dev, pos, MAX_POS, key);
                CHECK(rc == 0, "graph_at: begin at %d: %s", pos, ifkc_errmsg());
                if (rc)
                    break;
                rc = ifkc_rope_store(dev, dq[1], ldq, NQ, dk[1], dv[1], ld, NKV, kc[1], vc[1], IFK_F16, ld, 1, HD, HD,
                                     pos, 10000.0f, NULL, IFK_ROPE_HALF);
                if (!rc)
                    rc = ifkc_attention(dev, dout[1], dq[1], kc[1], vc[1], IFK_F16, ld, 1, pos, NQ, NKV, HD, 0.125f);
                if (!rc)
                    rc = ifkc_graph_end(dev);
                else {
                    ifkc_graph_abort(dev);
                    retries++;
                }
            }
            CHECK(rc == 0, "graph_at: recording at %d: %s", pos, ifkc_errmsg());
            recorded = rc == 0;
            bad |= rc != 0;
        }
        if (!bad && gpu_fetch(o1, dout[0], ldq * 4) == 0 && gpu_fetch(o2, dout[1], ldq * 4) == 0 &&
            memcmp(o1, o2, ldq * 4)) {
            CHECK(0, "graph_at: the output at position %d differs from the ops run one by one", pos);
            bad = 1;
        }
    }
    unsigned char *c1 = gpu_xmalloc(cb), *c2 = gpu_xmalloc(cb);
    if (!bad && gpu_fetch(c1, kc[0], cb) == 0 && gpu_fetch(c2, kc[1], cb) == 0)
        CHECK(memcmp(c1, c2, (size_t)STEPS * ld * 2) == 0, "graph_at: the key caches differ");
    ifkc_graph_stats_get(dev, &st);
    CHECK(bad || st.replays - st0.replays == STEPS - 1, "graph_at: %ld replays, expected %d", st.replays - st0.replays,
          STEPS - 1);
    printf("OBSERVED graph_at: %d positions, %ld replays, %d recordings dropped for scratch\n", STEPS,
           st.replays - st0.replays, retries);
    CHECK(ifkc_graph_replay(dev, 5, key + 1) == 1, "graph_at: a replay under another key runs nothing");
    CHECK(ifkc_graph_replay(dev, MAX_POS, key) == 1, "graph_at: a replay past max_pos runs nothing");
    CHECK(ifkc_graph_begin_at(dev, MAX_POS, MAX_POS, key) == IFKC_EINVAL, "graph_at: a recording at max_pos is refused");
    /* another key's recording and a plain one keep the first key's graph (contexts taking turns) */
    int rc = ifkc_graph_begin_at(dev, STEPS, MAX_POS, key + 7);
    if (rc == 0) {
        rc = ifkc_rope_store(dev, dq[0], ldq, NQ, dk[0], dv[0], ld, NKV, kc[0], vc[0], IFK_F16, ld, 1, HD, HD, STEPS,
                             10000.0f, NULL, IFK_ROPE_HALF);
        if (rc == 0)
            rc = ifkc_graph_end(dev);
        else
            ifkc_graph_abort(dev);
    }
    CHECK(rc == 0, "graph_at: a second key's recording: %s", ifkc_errmsg());
    if (ifkc_graph_begin(dev) == 0) {
        if (ifkc_add(dev, dout[0], dout[1], 8) == 0)
            CHECK(ifkc_graph_end(dev) == 0, "graph_at: plain recording: %s", ifkc_errmsg());
        else
            ifkc_graph_abort(dev);
    }
    CHECK(ifkc_graph_replay(dev, STEPS + 1, key) == 0, "graph_at: the first key's graph kept");
    CHECK(ifkc_graph_replay(dev, STEPS + 2, key + 7) == 0, "graph_at: the second key's graph kept");
    CHECK(ifkc_sync(dev) == 0, "graph_at: sync: %s", ifkc_errmsg());
    for (int i = 0; i < 2; i++)
        ifkc_free(dev, dq[i]), ifkc_free(dev, dk[i]), ifkc_free(dev, dv[i]), ifkc_free(dev, dout[i]),
            ifkc_free(dev, kc[i]), ifkc_free(dev, vc[i]);
    free(q), free(kv), free(o1), free(o2), free(c1), free(c2);
}

/* ---- overlapped launches (ifkc_set_overlap) -------------------------------------------------- */

/* A decode layer as the engine runs it on a GPU (fused ops), where every kernel reads what the
 * one before it wrote: add_rmsnorm, qkv, rope_store, attention, wo, add_rmsnorm, glu, down. */
typedef struct {
    int D, NQ, NKV, HD, F, wtype, max_pos;
    void *wq, *wk, *wv, *wo, *wg, *wu, *wd, *kc, *vc;
    float *norm1, *norm2, *x, *xb, *q, *k, *v, *att, *gate, *up;
} ov_layer;

/* N x K random weights (normal * 0.05 / sqrt(K / 64)) of wtype (F16 or quantized) on the device. */
static void *ov_weights(int wtype, int N, int K)
{
    const size_t rb = wtype == IFK_F16 ? (size_t)K * 2 : ifk_qrow_bytes(wtype, K);
    uint8_t *h = gpu_xmalloc((size_t)N * rb);
    float *src = gpu_xmalloc((size_t)K * 4);
    const float sd = 0.05f / sqrtf((float)K / 64.0f);
    for (int n = 0; n < N; n++) {
        for (int k = 0; k < K; k++)
            src[k] = sd * rnd_normal();
        if (wtype == IFK_F16)
            for (int k = 0; k < K; k++)
                ((uint16_t *)(h + (size_t)n * rb))[k] = iflow_f32_to_f16(src[k]);
        else
            ifk_quantize_row(h + (size_t)n * rb, wtype, src, K);
    }
    void *p = gpu_dup(h, (size_t)N * rb);
    free(h), free(src);
    return p;
}

/* The layer's step at position pos (its ops with their own positions). */
static int ov_step(const ov_layer *L, int pos)
{
    const size_t ldq = (size_t)L->NQ * L->HD, ldkv = (size_t)L->NKV * L->HD;
    int rc = ifkc_add_rmsnorm(dev, L->x, L->xb, L->norm1, 1, L->D, 1e-5f);
    if (!rc)
        rc = ifkc_matmul_qkv(dev, L->q, ldq, L->k, L->v, ldkv, L->wq, L->wk, L->wv, L->wtype, L->xb, L->D, 1,
                             (int)ldq, (int)ldkv, L->D);
    if (!rc)
        rc = ifkc_rope_store(dev, L->q, ldq, L->NQ, L->k, L->v, ldkv, L->NKV, L->kc, L->vc, IFK_F16, ldkv, 1, L->HD,
                             L->HD, pos, 10000.0f, NULL, IFK_ROPE_HALF);
    if (!rc)
        rc = ifkc_attention(dev, L->att, L->q, L->kc, L->vc, IFK_F16, ldkv, 1, pos, L->NQ, L->NKV, L->HD,
                            1.0f / sqrtf((float)L->HD));
    if (!rc)
        rc = ifkc_matmul(dev, L->xb, L->D, L->wo, L->wtype, L->att, ldq, 1, L->D, (int)ldq);
    if (!rc)
        rc = ifkc_add_rmsnorm(dev, L->x, L->xb, L->norm2, 1, L->D, 1e-5f);
    if (!rc)
        rc = ifkc_matmul_glu(dev, L->gate, L->up, L->F, L->wg, L->wu, L->wtype, L->xb, L->D, 1, L->F, L->D);
    if (!rc)
        rc = ifkc_matmul(dev, L->xb, L->D, L->wd, L->wtype, L->gate, L->F, 1, L->D, L->F);
    return rc;
}

/* steps positions from the same start: op by op (replay 0) or recorded at 0 and replayed. The
 * residual stream x and the last output xb carry over from step to step. Results into out:
 * [D] x, [D] xb, then the key and value caches of `steps` positions as bytes. */
static int ov_run(const ov_layer *L, int steps, int replay, const float *x0, unsigned char *out)
{
    const size_t ldkv = (size_t)L->NKV * L->HD, cb = (size_t)L->max_pos * ldkv * 2;
    int rc = ifkc_upload(dev, L->x, x0, (size_t)L->D * 4);
    if (!rc)
        rc = ifkc_upload(dev, L->xb, x0 + L->D, (size_t)L->D * 4);
    if (!rc)
        rc = ifkc_memset0(dev, L->kc, cb);
    if (!rc)
        rc = ifkc_memset0(dev, L->vc, cb);
    const unsigned long long key = 0x0e71a9ULL + (unsigned)L->wtype;
    for (int pos = 0; pos < steps && !rc; pos++) {
        if (!replay || pos == 0) {
            rc = replay ? ifkc_graph_begin_at(dev, pos, L->max_pos, key) : 0;
            if (!rc)
                rc = ov_step(L, pos);
            if (replay && !rc)
                rc = ifkc_graph_end(dev);
            else if (replay && rc)
                ifkc_graph_abort(dev);
        } else if ((rc = ifkc_graph_replay(dev, pos, key)) == 1) {
            rc = IFKC_EINVAL; /* the recording should have stayed */
        }
    }
    const size_t kvb = (size_t)steps * ldkv * 2;
    if (!rc)
        rc = ifkc_download(dev, out, L->x, (size_t)L->D * 4);
    if (!rc)
        rc = ifkc_download(dev, out + (size_t)L->D * 4, L->xb, (size_t)L->D * 4);
    if (!rc)
        rc = ifkc_download(dev, out + (size_t)L->D * 8, L->kc, kvb);
    if (!rc)
        rc = ifkc_download(dev, out + (size_t)L->D * 8 + kvb, L->vc, kvb);
    return rc;
}

/* The layer op by op without overlap, op by op with it, and recorded with it and replayed at
 * each next position: the same bits (a kernel that read its input before waiting for the kernel
 * writing it would read stale values on a GPU where launches overlap). The TinyLlama-1.1B
 * layer's shape on a GPU; a smaller one on the CPU emulation. */
static void test_overlap(void)
{
    const int emu = getenv("IFLOW_EMU") != NULL;
    const int D = emu ? 512 : 2048, NQ = emu ? 8 : 32, NKV = emu ? 2 : 4, F = emu ? 1408 : 5632, steps = emu ? 5 : 40;
    static const int wtypes[] = {IFK_F16, IFK_Q4_B64};
    for (int w = 0; w < 2; w++) {
        ov_layer L = {.D = D, .NQ = NQ, .NKV = NKV, .HD = 64, .F = F, .wtype = wtypes[w], .max_pos = 64};
        const size_t ldq = (size_t)NQ * 64, ldkv = (size_t)NKV * 64, cb = (size_t)L.max_pos * ldkv * 2;
        L.wq = ov_weights(L.wtype, (int)ldq, D), L.wk = ov_weights(L.wtype, (int)ldkv, D);
        L.wv = ov_weights(L.wtype, (int)ldkv, D), L.wo = ov_weights(L.wtype, D, (int)ldq);
        L.wg = ov_weights(L.wtype, F, D), L.wu = ov_weights(L.wtype, F, D), L.wd = ov_weights(L.wtype, D, F);
        L.kc = gpu_dup(NULL, cb), L.vc = gpu_dup(NULL, cb);
        float *h = gpu_xmalloc((size_t)2 * D * 4);
        fill(h, 2 * D, 0.5f, 1.5f);
        L.norm1 = gpu_dup(h, (size_t)D * 4), L.norm2 = gpu_dup(h + D, (size_t)D * 4);
        fill(h, 2 * D, -1.0f, 1.0f); /* x0 and the first step's xb */
        L.x = gpu_dup(NULL, (size_t)D * 4), L.xb = gpu_dup(NULL, (size_t)D * 4);
        L.q = gpu_dup(NULL, ldq * 4), L.k = gpu_dup(NULL, ldkv * 4), L.v = gpu_dup(NULL, ldkv * 4);
        L.att = gpu_dup(NULL, ldq * 4), L.gate = gpu_dup(NULL, (size_t)F * 4), L.up = gpu_dup(NULL, (size_t)F * 4);
        const size_t nout = (size_t)D * 8 + 2 * (size_t)steps * ldkv * 2;
        unsigned char *ref = gpu_xmalloc(nout), *got = gpu_xmalloc(nout);
        const char *wn = L.wtype == IFK_F16 ? "f16" : "q4_b64";
        ifkc_set_overlap(dev, 0);
        int rc = ov_run(&L, steps, 0, h, ref);
        CHECK(rc == 0, "overlap %s: the layer without overlap: %s", wn, ifkc_errmsg());
        const int on = ifkc_set_overlap(dev, 1);
        printf("OBSERVED overlap: %s layer (%d values, %d steps), overlapped launches %s\n", wn, D, steps,
               on ? "on" : "not available (compute capability below 9.0)");
        for (int replay = 0; replay < 2 && rc == 0; replay++) {
            int r2 = ov_run(&L, steps, replay, h, got);
            CHECK(r2 == 0, "overlap %s%s: %s", wn, replay ? ", replayed" : "", ifkc_errmsg());
            if (r2 == 0) {
                const float *xr = (const float *)ref, *xg = (const float *)got;
                CHECK(memcmp(ref, got, nout) == 0, "overlap %s%s: results differ from those without overlap (x[0] %.9g, %.9g)",
                      wn, replay ? ", replayed" : "", xr[0], xg[0]);
            }
        }
        ifkc_set_overlap(dev, 0);
        void *bufs[] = {L.wq, L.wk, L.wv, L.wo, L.wg, L.wu, L.wd, L.kc, L.vc, L.norm1, L.norm2, L.x, L.xb,
                        L.q, L.k, L.v, L.att, L.gate, L.up};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            ifkc_free(dev, bufs[i]);
        free(h), free(ref), free(got);
    }
}

int main(void)
{
    if (!gpu_open("test_cuda_ops"))
        return check_summary("test_cuda_ops");
    ifk_set_isa(IFK_ISA_SCALAR); /* the CPU side is the scalar reference */

    RUN(test_attention_args);
    RUN(test_attention_decode);
    RUN(test_attention_decode_long);
    RUN(test_attention_prefill);
    RUN(test_kv_store);
    RUN(test_kv_shift);
    RUN(test_rmsnorm);
    RUN(test_rope);
    RUN(test_silu_mul_add);
    RUN(test_add_bias);
    RUN(test_argmax);
    RUN(test_graph);
    RUN(test_add_rmsnorm);
    RUN(test_rope_store);
    RUN(test_graph_at);
    RUN(test_overlap);

    ifkc_close(dev);
    return check_summary("test_cuda_ops");
}
