/*
 * test_invariance.c -- batch invariance of the CPU kernels (kernels.h's contract): row t of a
 * matrix product depends only on W and x[t], and an attention query only on its position and
 * the cache rows it sees, bit for bit, whatever the batch around them.
 *
 * For every ISA path this CPU has (scalar, avx2, avx512, avx512gfni, amx) and every weight type
 * (F32, F16, BF16 (on the BF16 dot product where the CPU has it, and on the F32 product of
 * ifk_set_qx_f32), the 9 quantized types, quantized from random F32 rows by the reference
 * quantizer, and the packed copies of qpack.h, the float pairs of F16 and BF16 too; Q6 and Q5 also in the mode IFK_QX_INT8,
 * quant.h's int8 x for them, and Q8 in the mode IFK_QX_INT16, its int16 x), on odd shapes (N not a multiple of 16 or 4; K with a partial last SIMD step or
 * block; K spanning several of the prefill kernels' K chunks):
 *   - each row of a pool of x rows alone (T = 1) is the reference;
 *   - calls with T = 1..17 rows (and, for packed F16 / BF16, 32, 33 and 40: AMX's two tiles of
 *     16 tokens and the tokens left over) taken from the pool at varying offsets, so that one x row sits
 *     at different places of batches of different sizes, at 1 and 2 threads, must give the
 *     reference's bytes (memcmp) for every row.
 * Attention: for T queries at positions pos0 .. pos0+T-1, output row t must memcmp-equal a
 * T = 1 call for that query at position pos0 + t over the same cache, at 1 and 2 threads.
 * (The tolerances against the scalar oracle are test_kernels.c's and test_qkernels.c's job.)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/qimpl.h" /* ifk_qx_x16, ifk_qx_splits */
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/quant.h"

#define TMAX 17 /* attention's most tokens a call */

static const int isas[] = { IFK_ISA_SCALAR, IFK_ISA_AVX2, IFK_ISA_AVX512, IFK_ISA_AVX512GFNI, IFK_ISA_AMX };

static void fill_normal(float *a, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        a[i] = (float)rnd_normal() * scale;
}

/* Round-to-nearest-even F32 -> F16 / BF16 bits (finite, in range: test data only). */
static uint16_t to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
    if (ax < 0x38800000u) /* below the normal range: flush (test data avoids it) */
        return (uint16_t)sign;
    uint32_t h = (ax >> 13) - (112u << 10), rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

static uint16_t to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* W: [N][K] of wtype made from random floats (quantized types: by ifk_quantize_row; packed
 * codes: the base type's rows packed, qpack.h); malloc'd. */
static void *make_weights(int wtype, int N, int K)
{
    if (ifk_qpack_base(wtype) >= 0 || ifk_fpack_base(wtype) >= 0) {
        int base = ifk_qpack_base(wtype) >= 0 ? ifk_qpack_base(wtype) : ifk_fpack_base(wtype);
        void *W = make_weights(base, N, K), *P = malloc(ifk_qpack_bytes(base, N, K));
        ifk_qpack(P, W, base, N, K);
        free(W);
        return P;
    }
    float *row = malloc((size_t)K * sizeof *row);
    size_t rb = ifk_qtype(wtype) ? ifk_qrow_bytes(wtype, K) : (size_t)K * (wtype == IFK_F32 ? 4 : 2);
    uint8_t *W = malloc((size_t)N * rb);
    for (int n = 0; n < N; n++) {
        fill_normal(row, (size_t)K, 0.05f);
        uint8_t *dst = W + (size_t)n * rb;
        if (ifk_qtype(wtype))
            ifk_quantize_row(dst, wtype, row, K);
        else if (wtype == IFK_F32)
            memcpy(dst, row, rb);
        else
            for (int k = 0; k < K; k++) {
                uint16_t h = wtype == IFK_F16 ? to_f16(row[k]) : to_bf16(row[k]);
                memcpy(dst + 2 * (size_t)k, &h, 2);
            }
    }
    free(row);
    return W;
}

static const char *type_name(int wtype)
{
    static const char *packed[IFK_QTYPE_END_] = {
        [IFK_Q4_B32] = "q4_b32 packed", [IFK_Q4_B64] = "q4_b64 packed",
        [IFK_Q8_B32] = "q8_b32 packed", [IFK_Q8_B64] = "q8_b64 packed",
        [IFK_Q6_B64] = "q6_b64 packed", [IFK_Q5_B64] = "q5_b64 packed", [IFK_Q3H_B64] = "q3h packed",
        [IFK_Q3_B32] = "q3_b32 packed", [IFK_Q2_B32] = "q2_b32 packed",
    };
    if (ifk_qpack_base(wtype) >= 0)
        return packed[ifk_qpack_base(wtype)] ? packed[ifk_qpack_base(wtype)] : "packed";
    if (ifk_fpack_base(wtype) >= 0)
        return ifk_fpack_base(wtype) == IFK_F16 ? (ifk_bf16_dot(IFK_F16) ? "f16 packed (bf16 dot)" : "f16 packed")
                                                : (ifk_bf16_dot(IFK_BF16) ? "bf16 packed (bf16 dot)" : "bf16 packed");
    if (ifk_qtype(wtype))
        return ifk_qtype(wtype)->name;
    if (wtype == IFK_F32)
        return "f32";
    if (ifk_bf16_dot(wtype)) /* kernels.h: x rounded to BF16, vdpbf16ps */
        return wtype == IFK_F16 ? "f16 (bf16 dot)" : "bf16 (bf16 dot)";
    return wtype == IFK_F16 ? "f16" : "bf16";
}

/* " int8-mode" / " int16-mode" while the quantized types run in the mode IFK_QX_INT8 /
 * IFK_QX_INT16, else "" (for messages). */
static const char *mode_tag = "";

/* One weight type and shape on the current path. x rows have a stride of K + 3 (not a multiple
 * of anything), y rows of N + 5; the padding of y must stay untouched. */
static void check_matmul(int wtype, int N, int K, const int *Ts, int n_Ts)
{
    int tmax = 0;
    for (int i = 0; i < n_Ts; i++)
        tmax = Ts[i] > tmax ? Ts[i] : tmax;
    const int pool = tmax + 7; /* x rows in the pool; a call takes T of them from an offset */
    const size_t ldx = (size_t)K + 3, ldy = (size_t)N + 5;
    void *W = make_weights(wtype, N, K);
    float *x = malloc((size_t)pool * ldx * sizeof *x);      /* [pool][ldx] */
    float *ref = malloc((size_t)pool * N * sizeof *ref);    /* [pool][N]   */
    float *y = malloc((size_t)tmax * ldy * sizeof *y);      /* [tmax][ldy] */
    fill_normal(x, (size_t)pool * ldx, 1.0f);
    for (int p = 0; p < pool; p++) /* a few rows with outliers, one all zero */
        if (p % 7 == 3)
            x[(size_t)p * ldx + (size_t)(p * 31) % K] = 40.0f;
    memset(x + 5 * ldx, 0, (size_t)K * sizeof *x);
    for (int p = 0; p < pool; p++)
        ifk_matmul(ref + (size_t)p * N, (size_t)N, W, wtype, x + (size_t)p * ldx, ldx, 1, N, K, 1);
    int bad = 0, calls = 0, pad_bad = 0;
    for (int ti = 0; ti < n_Ts; ti++)
        for (int threads = 1; threads <= 2; threads++) {
            const int T = Ts[ti];
            for (int off = (T * 5 + threads) % (pool - T + 1), rep = 0; rep < 2; rep++, off = (off + 7) % (pool - T + 1)) {
                for (size_t i = 0; i < (size_t)tmax * ldy; i++)
                    y[i] = -12345.0f;
                ifk_matmul(y, ldy, W, wtype, x + (size_t)off * ldx, ldx, T, N, K, threads);
                calls++;
                for (int t = 0; t < T; t++) {
                    if (memcmp(y + (size_t)t * ldy, ref + (size_t)(off + t) * N, (size_t)N * sizeof *y)) {
                        int n = 0;
                        while (!memcmp(y + (size_t)t * ldy + n, ref + (size_t)(off + t) * N + n, sizeof *y))
                            n++;
                        if (bad++ < 3)
                            CHECK(0, "%s %s%s N=%d K=%d: x row %d at place %d of T=%d (%d threads): y[%d] = %.9g, alone %.9g",
                                  ifk_isa_name(ifk_isa_current()), type_name(wtype), mode_tag, N, K, off + t, t, T, threads, n,
                                  y[(size_t)t * ldy + n], ref[(size_t)(off + t) * N + n]);
                    }
                    for (int n = N; n < (int)ldy; n++)
                        pad_bad += y[(size_t)t * ldy + n] != -12345.0f;
                }
            }
        }
    CHECK(bad == 0, "%s %s%s N=%d K=%d: %d of the rows of %d calls differ from the row alone",
          ifk_isa_name(ifk_isa_current()), type_name(wtype), mode_tag, N, K, bad, calls);
    CHECK(pad_bad == 0, "%s %s N=%d K=%d: wrote past N", ifk_isa_name(ifk_isa_current()), type_name(wtype), N, K);
    free(W);
    free(x);
    free(ref);
    free(y);
}

static void test_matmul_invariance(void)
{
    static const int all_T[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17 };
    static const int some_T[] = { 1, 2, 3, 5, 8, 16, 17 };
    static const int tile_T[] = { 1, 32, 33, 40 };
    const int ftypes[] = { IFK_F32, IFK_F16, IFK_BF16 };
    int paths = 0;
    for (size_t p = 0; p < sizeof isas / sizeof *isas; p++) {
        if (ifk_set_isa(isas[p]) != isas[p])
            continue;
        paths++;
        for (int f = 0; f < 3; f++)
            for (int exact = 0; exact <= ifk_bf16_dot(ftypes[f]); exact++) { /* the BF16 dot product, then F32 */
                ifk_set_qx_f32(exact);
                /* K = 77: one chunk, a partial SIMD step; 3000: several 1024-element chunks, rows
                 * read 4 at a time in decode (F32); 4200: rows read 16 (8) at a time */
                check_matmul(ftypes[f], 45, 77, all_T, 17);
                check_matmul(ftypes[f], 45, 3000, some_T, 7);
                check_matmul(ftypes[f], 37, 4200, some_T, 7);
                if (ftypes[f] != IFK_F32) { /* packed pairs (qpack.h): K odd; K over several chunks; on
                                             * AMX, 2 tiles of 16 tokens and the tokens left over */
                    check_matmul(IFK_QPACKED + ftypes[f], 45, 77, all_T, 17);
                    check_matmul(IFK_QPACKED + ftypes[f], 37, 3001, some_T, 7);
                    check_matmul(IFK_QPACKED + ftypes[f], 33, 1100, tile_T, 4);
                }
                ifk_set_qx_f32(0);
            }
        for (int q = IFK_Q8_B32; q < IFK_QTYPE_END_; q++)
            for (int alt = 0; alt <= ifk_qx_x16(q); alt++) { /* Q8, Q6, Q5: the default, then the other x */
                const int other = ifk_qx_splits(q) ? IFK_QX_INT16 : IFK_QX_INT8; /* Q8: int8 x by default */
                ifk_set_qx_mode(alt ? other : IFK_QX_DEFAULT);
                mode_tag = !alt ? "" : other == IFK_QX_INT16 ? " int16-mode" : " int8-mode";
                /* K = 77: a partial last block; 8529: several chunks of 64 blocks, a partial block */
                check_matmul(q, 45, 77, all_T, 17);
                check_matmul(q, 37, 8529, some_T, 7);
                if (ifk_qpack_base(IFK_QPACKED + q) == q) { /* packed (qpack.h): its own kernel where the path has one */
                    check_matmul(IFK_QPACKED + q, 45, 77, all_T, 17);
                    check_matmul(IFK_QPACKED + q, 37, 8529, some_T, 7);
                }
                ifk_set_qx_mode(IFK_QX_DEFAULT);
                mode_tag = "";
            }
    }
    ifk_set_isa(IFK_ISA_AUTO);
    CHECK(paths >= 1, "no ISA path could be selected");
}

/* ---- attention ---------------------------------------------------------------------------- */

static void check_attention(int n_heads, int n_kv, int head_dim, int n_ctx)
{
    const size_t ld = (size_t)n_heads * head_dim, kv_ld = (size_t)n_kv * head_dim + 8;
    const int Ts[] = { 1, 2, 3, 5, 16, 17 }, pos0s[] = { 0, 31, 70, 200 };
    float *k = malloc((size_t)n_ctx * kv_ld * sizeof *k), *v = malloc((size_t)n_ctx * kv_ld * sizeof *v);
    float *q = malloc((size_t)TMAX * ld * sizeof *q), *out = malloc((size_t)TMAX * ld * sizeof *out);
    float *one = malloc(ld * sizeof *one);
    fill_normal(k, (size_t)n_ctx * kv_ld, 1.0f);
    fill_normal(v, (size_t)n_ctx * kv_ld, 1.0f);
    fill_normal(q, (size_t)TMAX * ld, 0.5f);
    const float scale = 1.0f / sqrtf((float)head_dim);
    int bad = 0, calls = 0;
    for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++)
        for (size_t pi = 0; pi < sizeof pos0s / sizeof *pos0s; pi++)
            for (int threads = 1; threads <= 2; threads++) {
                const int T = Ts[ti], pos0 = pos0s[pi];
                if (pos0 + T > n_ctx)
                    continue;
                ifk_attention(out, q, k, v, kv_ld, T, pos0, n_heads, n_kv, head_dim, scale, threads);
                calls++;
                for (int t = 0; t < T; t++) {
                    ifk_attention(one, q + (size_t)t * ld, k, v, kv_ld, 1, pos0 + t, n_heads, n_kv, head_dim, scale,
                                  3 - threads);
                    if (memcmp(one, out + (size_t)t * ld, ld * sizeof *one) && bad++ < 3) {
                        size_t i = 0;
                        while (one[i] == out[(size_t)t * ld + i])
                            i++;
                        CHECK(0, "%s heads %d/%d x %d: query %d of T=%d at pos %d (%d threads): out[%zu] = %.9g, alone %.9g",
                              ifk_isa_name(ifk_isa_current()), n_heads, n_kv, head_dim, t, T, pos0 + t, threads, i,
                              out[(size_t)t * ld + i], one[i]);
                    }
                }
            }
    CHECK(bad == 0, "%s heads %d/%d x %d: %d query rows of %d calls differ from the query alone",
          ifk_isa_name(ifk_isa_current()), n_heads, n_kv, head_dim, bad, calls);
    free(k);
    free(v);
    free(q);
    free(out);
    free(one);
}

static void test_attention_invariance(void)
{
    for (size_t p = 0; p < sizeof isas / sizeof *isas; p++) {
        if (ifk_set_isa(isas[p]) != isas[p])
            continue;
        check_attention(8, 2, 64, 240);   /* GQA, the fixed-size code */
        check_attention(4, 4, 128, 240);  /* one query head per kv head */
        check_attention(6, 2, 40, 240);   /* head_dim not a multiple of 16 */
        check_attention(2, 1, 600, 240);  /* heads too large to pack into the chunk buffers */
    }
    ifk_set_isa(IFK_ISA_AUTO);
}

int main(void)
{
    RUN(test_matmul_invariance);
    RUN(test_attention_invariance);
    return check_summary("test_invariance");
}
