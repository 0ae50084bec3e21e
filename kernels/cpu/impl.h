/*
 * impl.h -- what dispatch.c needs from each instruction-set path (internal to kernels/cpu).
 *
 * Every path X in {ref, avx2, avx512} provides the same single-threaded pieces; dispatch.c
 * picks one set at run time and does all the threading, so a path never sees n_threads:
 *
 *   ifk_X_matmul_rows   rows n0 <= n < n1 of the product of ifk_matmul, all T tokens:
 *                         y[t][n] = sum_k W[n][k] * x[t][k]
 *   ifk_X_attend        a block of queries that share one kv head (nt consecutive tokens x
 *                       nh consecutive query heads) against the cache, causally:
 *                       out = softmax(scale * K q) V over the rows each query may see
 *   ifk_X_rmsnorm, _softmax, _silu_mul, _add, _get_row   as in kernels.h
 *
 * RoPE has only the scalar version (ifk_ref_rope): it is cheap next to the matmuls.
 * The SIMD files are compiled with their ISA flags (see the Makefile) and are left out of the
 * -DIFK_NO_SIMD build, so nothing outside them may reference their symbols in that build.
 */
#ifndef IFK_IMPL_H
#define IFK_IMPL_H

#include <stddef.h>
#include <stdint.h>

/* W: [N][K] of wtype; x: [T][K] at stride ldx; y: [T][N] at stride ldy; only n0 <= n < n1. */
#define IFK_DECL_MATMUL_ROWS(name)                                                          \
    void name(float *y, size_t ldy, const void *W, int wtype, const float *x, size_t ldx,   \
              int T, int n0, int n1, int K)

/* Query (i, h), 0 <= i < nt, 0 <= h < nh, is q + i*ld + h*head_dim ([head_dim]); its result
 * goes to out + i*ld + h*head_dim. It sees cache rows 0 .. pos + i: k, v are those rows of
 * [head_dim] at stride kv_ld (the kv head's columns already selected). nt * nh <= IFK_ATT_MAXQ. */
#define IFK_ATT_MAXQ 16
#define IFK_DECL_ATTEND(name)                                                               \
    void name(float *out, const float *q, size_t ld, const float *k, const float *v,        \
              size_t kv_ld, int nt, int nh, int pos, int head_dim, float scale)

#define IFK_DECL_PATH(X)                                                                    \
    IFK_DECL_MATMUL_ROWS(ifk_##X##_matmul_rows);                                            \
    IFK_DECL_ATTEND(ifk_##X##_attend);                                                      \
    void ifk_##X##_rmsnorm(float *y, const float *x, const float *w, int n, float eps);     \
    void ifk_##X##_softmax(float *x, int n);                                                \
    void ifk_##X##_silu_mul(float *g, const float *u, int n);                               \
    void ifk_##X##_add(float *y, const float *x, int n);                                    \
    void ifk_##X##_get_row(float *out, const void *W, int wtype, size_t row, int K);        \
    void ifk_##X##_lowrank_up(float *y, size_t ldy, const uint16_t *bt, const float *t, size_t ldt, int T, int N, \
                              int r, int add);

IFK_DECL_PATH(ref)
IFK_DECL_PATH(avx2)
IFK_DECL_PATH(avx512)

/* ifk_X_lowrank_up: ifk_lowrank_up's sums (kernels.h) for the N columns of tiles bt, added into
 * y (add 1) or stored there (add 0: what a stolen pool item computes, added by its commit with
 * the same one addition). */

/* The matmul_rows of the path in use (dispatch.c), for the quantized product's F32-activation
 * path (qdispatch.c), which calls it from its own pool items. */
IFK_DECL_MATMUL_ROWS(ifk_path_matmul_rows);

/* The BF16 dot product of F16 and BF16 weights (matmul_avx512bf16.c: AVX512_BF16, vdpbf16ps),
 * which dispatch.c uses where ifk_bf16_dot() (kernels.h) says:
 *   ifk_avx512bf16_round_x      xb[t][k] = x[t][k] rounded to BF16 (to nearest even; F32
 *                               subnormals become 0) for k < K, 0 for K <= k < ldxb; ldxb a
 *                               multiple of 32. xb: [T][ldxb]; x: [T][K] at stride ldx.
 *   ifk_avx512bf16_matmul_rows  rows n0 <= n < n1 of y[t][n] = sum_k bf16(W[n][k]) * x[t][k]
 *                               for all T tokens; x: [T][ldx] from round_x; F16 W rounded to
 *                               BF16 likewise, BF16 W as it is, another type gives zeros;
 *                               summed as matmul_avx512.c says. */
void ifk_avx512bf16_round_x(uint16_t *xb, size_t ldxb, const float *x, size_t ldx, int T, int K);
#define IFK_DECL_BF16_ROWS(name)                                                            \
    void name(float *y, size_t ldy, const void *W, int wtype, const uint16_t *x, size_t ldx,  \
              int T, int n0, int n1, int K)
IFK_DECL_BF16_ROWS(ifk_avx512bf16_matmul_rows);
/* The same over a packed F16 / BF16 matrix (qpack.h's pairs; fpack_avx512bf16.c): W the packed
 * matrix, wtype its packed code, n0 a multiple of 16. */
IFK_DECL_BF16_ROWS(ifk_avx512bf16_fpack_rows);
/* The same on AMX tiles (fpack_amx.c; the IFK_ISA_AMX path): a different summation order. */
IFK_DECL_BF16_ROWS(ifk_amx_fpack_rows);

/* y[t][n] = 0 for t < T, n0 <= n < n1: a product over K = 0. */
static inline void ifk_zero_rows(float *y, size_t ldy, int T, int n0, int n1)
{
    for (int t = 0; t < T; t++)
        for (int n = n0; n < n1; n++)
            y[(size_t)t * ldy + n] = 0.0f;
}

/* A per-thread scratch buffer of at least `bytes` (64-byte aligned; it grows, never shrinks,
 * and is freed when the thread ends), or NULL when it cannot grow. One per thread, shared by
 * the quantized product's x (qdispatch.c) and the BF16 product's x (dispatch.c): a thread
 * holds one of them at a time. */
void *ifk_thread_scratch(size_t bytes);

/* y[i] = e^x[i] with the path's vector exp (tests measure its error against exp()). */
void ifk_avx2_exp(float *y, const float *x, int n);
void ifk_avx512_exp(float *y, const float *x, int n);

void ifk_ref_rope(float *x, int n_heads, int head_dim, int rot_dim, int pos, float theta,
                  const float *freq_scale, int layout);

/* A walk over the cache lines of a block of weights (rows of `bytes` bytes at stride `stride`),
 * which the prefill kernels prefetch into L2 a few lines at a time while they compute on the
 * block before it. */
typedef struct {
    const char *row; /* start of the current row */
    size_t stride;   /* bytes from one row to the next */
    size_t off;      /* offset of the next line in the row */
    size_t bytes;    /* bytes per row */
    int rows;        /* rows left, counting the current one; 0: done */
} ifk_prefetch_walk;

static inline void ifk_prefetch_next(ifk_prefetch_walk *pw, int lines)
{
    for (int i = 0; i < lines && pw->rows > 0; i++) {
        __builtin_prefetch(pw->row + pw->off, 0, 2);
        pw->off += 64;
        if (pw->off >= pw->bytes) {
            pw->off = 0;
            pw->row += pw->stride;
            pw->rows--;
        }
    }
}

/* Exact scalar conversions (ref.c): IEEE half (subnormals, inf, NaN) and bfloat16 to float. */
float ifk_f16_to_f32(uint16_t h);
float ifk_bf16_to_f32(uint16_t b);

#endif
