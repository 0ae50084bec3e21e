/*
 * ops.cu -- element-wise and per-token operations: RMS norm, RoPE, SwiGLU's silu_mul, adds,
 * argmax. Contract: cuda_kernels.h; references: ifk_rmsnorm, ifk_rope, ifk_silu_mul, ifk_add
 * (kernels/cpu/ref.c).
 *
 * Plan
 *   rmsnorm:  one block per row; each thread loads its values of x and w into registers (all
 *             before any store), sums their squares in double, the block adds the partial
 *             sums (warp shuffles, then shared memory) in double, and 1 / sqrt(ss / n + eps)
 *             is rounded to float as the reference does; then y = x * inv * w in the
 *             reference's order. add_rmsnorm first adds the residual (x += r, stored) in the
 *             same pass: the residual add and the next block's norm in one launch.
 *   rope:     one block per token; its threads compute the token's angles, cos and sin in
 *             double like the reference (rounded to float once), one pair each, into shared
 *             memory, then rotate every (head, pair) at once. The products are written with
 *             __fmul_rn / __fadd_rn so nvcc does not fuse them (the reference's x0*c - x1*s
 *             rounds each product). rope_store: q's and k's RoPE and the cache store of k and
 *             v in one launch, the same values as the three operations; a block per token
 *             and group of heads (about 256 pairs a block).
 *   silu_mul, add, add_bias: grid-stride loops, one element per thread per step.
 *   argmax:   stage 1: block b reduces a contiguous span of x to (value, index); stage 2: one
 *             block reduces the per-block pairs; the index is copied to the host. The order
 *             is "larger value, then lower index", so ties give the lowest index; NaNs are
 *             never chosen (all NaN gives 0). Scratch: slot IFKC_SCRATCH_MISC.
 */
#include "kernels/cuda/common.cuh"

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/norm.cuh"

enum { OPS_THREADS = 256, OPS_MAX_BLOCKS = 8192 };

/* Blocks for a grid-stride loop over n elements. */
static unsigned ops_blocks(size_t n)
{
    size_t b = (n + OPS_THREADS - 1) / OPS_THREADS;
    return (unsigned)(b < 1 ? 1 : b > OPS_MAX_BLOCKS ? OPS_MAX_BLOCKS : b);
}

/* ---- rmsnorm ------------------------------------------------------------------------------ */

/* y, x: [T][n] (one block per row; y may equal x); w: [n]. Rows longer than RMS_THREADS *
 * RMS_PT_MAX values: x is read twice. */
__global__ void rmsnorm_rows(float *y, const float *x, const float *w, int n, float eps)
{
    ifkc_grid_begin();
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    double ss = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const double xi = xr[i];
        ss += xi * xi;
    }
    /* Every thread has read its x before the barriers inside: y may overwrite x after. */
    ss = block_sum_double(ss);
    const float inv = (float)(1.0 / sqrt(ss / n + (double)eps));
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = __fmul_rn(__fmul_rn(xr[i], inv), w[i]);
}

/* The norm of row blockIdx.x (norm.cuh's norm_row_reg). */
template <int PT>
__global__ void __launch_bounds__(RMS_THREADS) rmsnorm_rows_reg(float *y, float *x, const float *r, const float *w,
                                                                int n, float eps)
{
    ifkc_grid_begin();
    norm_row_reg<PT>(y, x, r, w, n, eps);
}

static int rmsnorm_launch(ifkc_dev *d, float *y, float *x, const float *r, const float *w, int T, int n, float eps)
{
    const int tiled = tiled_norm(d, y, x, r, w, T, n, eps); /* the norm that also rounds for tiles */
    if (tiled)
        return tiled < 0 ? tiled : 0;
    const int pt = (n + RMS_THREADS - 1) / RMS_THREADS;
    const unsigned g = (unsigned)T;
    cudaError_t e;
    if (pt <= 1) /* a short row (a head's qk norm): as many threads as it has values */
        e = ifkc_launch(d, rmsnorm_rows_reg<1>, g, (n + 31) / 32 * 32, 0, y, x, r, w, n, eps);
    else if (pt <= 2)
        e = ifkc_launch(d, rmsnorm_rows_reg<2>, g, RMS_THREADS, 0, y, x, r, w, n, eps);
    else if (pt <= 4)
        e = ifkc_launch(d, rmsnorm_rows_reg<4>, g, RMS_THREADS, 0, y, x, r, w, n, eps);
    else if (pt <= 8)
        e = ifkc_launch(d, rmsnorm_rows_reg<8>, g, RMS_THREADS, 0, y, x, r, w, n, eps);
    else if (pt <= RMS_PT_MAX)
        e = ifkc_launch(d, rmsnorm_rows_reg<RMS_PT_MAX>, g, RMS_THREADS, 0, y, x, r, w, n, eps);
    else { /* longer rows: the residual added first (ifkc_add), then x read twice */
        int rc = r ? ifkc_add(d, x, r, (size_t)T * n) : 0;
        if (rc)
            return rc;
        e = ifkc_launch(d, rmsnorm_rows, g, OPS_THREADS, 0, y, x, w, n, eps);
    }
    IFKC_CKL(e, "rmsnorm_rows");
    return 0;
}

extern "C" int ifkc_rmsnorm(ifkc_dev *d, float *y, const float *x, const float *w, int T, int n, float eps)
{
    if (!d || !y || !x || !w)
        return ifkc_seterr(IFKC_EINVAL, "rmsnorm: a NULL handle or pointer");
    if (T < 0 || n < 0)
        return ifkc_seterr(IFKC_EINVAL, "rmsnorm: bad shape (T %d, n %d)", T, n);
    if (T == 0 || n == 0)
        return 0;
    return rmsnorm_launch(d, y, (float *)x, NULL, w, T, n, eps);
}

extern "C" int ifkc_add_rmsnorm(ifkc_dev *d, float *x, float *y, const float *w, int T, int n, float eps)
{
    if (!d || !y || !x || !w)
        return ifkc_seterr(IFKC_EINVAL, "add_rmsnorm: a NULL handle or pointer");
    if (T < 0 || n < 0 || x == y)
        return ifkc_seterr(IFKC_EINVAL, "add_rmsnorm: bad shape (T %d, n %d%s)", T, n, x == y ? ", x = y" : "");
    if (T == 0 || n == 0)
        return 0;
    return rmsnorm_launch(d, y, x, y, w, T, n, eps);
}

/* ---- rope --------------------------------------------------------------------------------- */

enum { ROPE_THREADS = 256, ROPE_HALF_MAX = 128 };

/* The cosines and sines of token t's pairs into c, s [half] (shared), then a barrier. */
static __device__ __forceinline__ void rope_angles(float *c, float *s, double pos, int half, int rot_dim, float theta,
                                                   const float *fs, int interleaved)
{
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        int ia, ib;
        ifkc_rope_pair(pos, i, rot_dim, theta, fs, interleaved, &c[i], &s[i], &ia, &ib);
    }
    __syncthreads();
}

/* Pair i of a head: the offsets of its two values. */
static __device__ __forceinline__ void rope_index(int i, int half, int interleaved, int *ia, int *ib)
{
    *ia = interleaved ? 2 * i : i;
    *ib = interleaved ? 2 * i + 1 : i + half;
}

/* x: [T][ld], token t holding n_heads heads of head_dim from x + t*ld; fs: [rot_dim/2] or NULL.
 * One block per token: its threads compute the token's angles (one pair each), then rotate
 * every (head, pair) of the token at once. Position: *pos_dev when not NULL, else pos0. */
__global__ void __launch_bounds__(ROPE_THREADS) rope_rows(float *x, size_t ld, int n_heads, int head_dim, int rot_dim,
                                                          int pos0, const int *pos_dev, float theta, const float *fs,
                                                          int interleaved)
{
    ifkc_grid_begin();
    __shared__ float c[ROPE_HALF_MAX], s[ROPE_HALF_MAX];
    const int half = rot_dim / 2, t = blockIdx.x;
    const int pos = (pos_dev ? *pos_dev : pos0) + t;
    rope_angles(c, s, (double)pos, half, rot_dim, theta, fs, interleaved);
    float *xt = x + (size_t)t * ld;
    for (int idx = threadIdx.x; idx < n_heads * half; idx += blockDim.x) {
        const int h = idx / half, i = idx % half;
        int ia, ib;
        rope_index(i, half, interleaved, &ia, &ib);
        float *xh = xt + (size_t)h * head_dim;
        ifkc_rotate(xh[ia], xh[ib], c[i], s[i], &xh[ia], &xh[ib]);
    }
}

static int rope_check(const char *what, int T, int n_heads, int head_dim, int rot_dim, int pos0, size_t ld, int layout)
{
    if (layout != IFK_ROPE_HALF && layout != IFK_ROPE_INTERLEAVED)
        return ifkc_seterr(IFKC_EINVAL, "%s: unknown layout %d", what, layout);
    if (T < 0 || n_heads < 0 || head_dim < 0 || rot_dim < 0 || pos0 < 0 || (long long)pos0 + T > INT32_MAX ||
        (T > 1 && ld < (size_t)n_heads * head_dim))
        return ifkc_seterr(IFKC_EINVAL, "%s: bad shape (T %d, %d heads of %d, rot_dim %d, position %d, stride %zu)",
                           what, T, n_heads, head_dim, rot_dim, pos0, ld);
    if ((rot_dim < head_dim ? rot_dim : head_dim) > 2 * ROPE_HALF_MAX)
        return ifkc_seterr(IFKC_EUNSUPPORTED, "%s: %d rotated dimensions (at most %d)", what,
                           rot_dim < head_dim ? rot_dim : head_dim, 2 * ROPE_HALF_MAX);
    return 0;
}

extern "C" int ifkc_rope(ifkc_dev *d, float *x, size_t ld, int T, int n_heads, int head_dim, int rot_dim, int pos0,
                         float theta, const float *freq_scale, int layout)
{
    if (!d || !x)
        return ifkc_seterr(IFKC_EINVAL, "rope: a NULL handle or pointer");
    int rc = rope_check("rope", T, n_heads, head_dim, rot_dim, pos0, ld, layout);
    if (rc)
        return rc;
    if (rot_dim > head_dim)
        rot_dim = head_dim;
    if (T == 0 || rot_dim / 2 == 0 || n_heads == 0)
        return 0;
    IFKC_CKL(ifkc_launch(d, rope_rows, (unsigned)T, ROPE_THREADS, 0, x, ld, n_heads, head_dim, rot_dim, pos0,
                         ifkc_pos_slot(d), theta, freq_scale, layout == IFK_ROPE_INTERLEAVED),
             "rope_rows");
    return 0;
}

/* RoPE of q and k, then k and v stored into the cache, for token t = blockIdx.x and the heads
 * of block blockIdx.y (heads 0 .. nq-1 are q's, nq .. nq+nkv-1 k's, hpb a block): what
 * rope_rows on q, rope_rows on k and kv_store_rows on k and v compute, in one launch. Each block
 * computes the token's angles itself (half pairs, in double); spreading the heads over blocks
 * keeps the work of one thread to a pair or two (one block for 64 heads of 128 took 10 us on
 * an H200). k's rotated values go to the cache and back to k. */
template <typename KV>
__global__ void __launch_bounds__(ROPE_THREADS) rope_store_rows(float *q, size_t ldq, int nq, float *k, const float *v,
                                                                size_t ldkv, int nkv, KV *kc, KV *vc, size_t ldc,
                                                                int pos0, const int *pos_dev, int head_dim,
                                                                int rot_dim, float theta, const float *fs,
                                                                int interleaved, int hpb)
{
    ifkc_grid_begin();
    __shared__ float c[ROPE_HALF_MAX], s[ROPE_HALF_MAX];
    const int half = rot_dim / 2, t = blockIdx.x;
    const int h0 = blockIdx.y * hpb, h1 = min(h0 + hpb, nq + nkv);
    const int pos = (pos_dev ? *pos_dev : pos0) + t;
    rope_angles(c, s, (double)pos, half, rot_dim, theta, fs, interleaved);
    float *qt = q + (size_t)t * ldq, *kt = k + (size_t)t * ldkv;
    const float *vt = v + (size_t)t * ldkv;
    KV *kr = kc + (size_t)pos * ldc, *vr = vc + (size_t)pos * ldc;
    for (int idx = threadIdx.x; idx < (h1 - h0) * half; idx += blockDim.x) {
        const int h = h0 + idx / half, i = idx % half;
        int ia, ib;
        rope_index(i, half, interleaved, &ia, &ib);
        if (h < nq) {
            float *xh = qt + (size_t)h * head_dim;
            ifkc_rotate(xh[ia], xh[ib], c[i], s[i], &xh[ia], &xh[ib]);
        } else {
            const size_t o = (size_t)(h - nq) * head_dim;
            float y0, y1;
            ifkc_rotate(kt[o + ia], kt[o + ib], c[i], s[i], &y0, &y1);
            kt[o + ia] = y0, kt[o + ib] = y1;
            ifkc_kv_put(kr + o + ia, y0);
            ifkc_kv_put(kr + o + ib, y1);
        }
    }
    /* the block's kv heads: the key values past rot_dim as they are, and the values */
    const int k0 = max(h0, nq) - nq, k1 = h1 - nq;
    for (int e = k0 * head_dim + threadIdx.x; e < k1 * head_dim; e += blockDim.x) {
        if (e % head_dim >= 2 * half)
            ifkc_kv_put(kr + e, kt[e]);
        ifkc_kv_put(vr + e, vt[e]);
    }
}

extern "C" int ifkc_rope_store(ifkc_dev *d, float *q, size_t ldq, int nq, float *k, const float *v, size_t ldkv,
                               int nkv, void *kcache, void *vcache, int kv_type, size_t ldc, int T, int head_dim,
                               int rot_dim, int pos0, float theta, const float *freq_scale, int layout)
{
    if (!d || !q || !k || !v || !kcache || !vcache)
        return ifkc_seterr(IFKC_EINVAL, "rope and store: a NULL handle or pointer");
    if (kv_type != IFK_F32 && kv_type != IFK_F16)
        return ifkc_seterr(IFKC_EUNSUPPORTED, "rope and store: kv cache type %d is not supported (f32 or f16)", kv_type);
    int rc = rope_check("rope and store", T, nq, head_dim, rot_dim, pos0, ldq, layout);
    if (!rc)
        rc = rope_check("rope and store", T, nkv, head_dim, rot_dim, pos0, ldkv, layout);
    if (rc)
        return rc;
    if (ldc < (size_t)nkv * head_dim)
        return ifkc_seterr(IFKC_EINVAL, "rope and store: cache stride %zu is below a row of %d", ldc, nkv * head_dim);
    if (rot_dim > head_dim)
        rot_dim = head_dim;
    if (T == 0 || nq + nkv == 0) /* nothing to do (a grid of no blocks is an error) */
        return 0;
    const int il = layout == IFK_ROPE_INTERLEAVED;
    /* heads a block: about ROPE_THREADS pairs (and at least one head) */
    const int hpb = rot_dim / 2 >= ROPE_THREADS ? 1 : ROPE_THREADS / (rot_dim / 2 > 0 ? rot_dim / 2 : 1);
    const dim3 grid((unsigned)T, ifkc_cdiv((size_t)(nq + nkv), (size_t)hpb));
    const cudaError_t e =
        kv_type == IFK_F32
            ? ifkc_launch(d, rope_store_rows<float>, grid, ROPE_THREADS, 0, q, ldq, nq, k, v, ldkv, nkv, (float *)kcache,
                          (float *)vcache, ldc, pos0, ifkc_pos_slot(d), head_dim, rot_dim, theta, freq_scale, il, hpb)
            : ifkc_launch(d, rope_store_rows<__half>, grid, ROPE_THREADS, 0, q, ldq, nq, k, v, ldkv, nkv,
                          (__half *)kcache, (__half *)vcache, ldc, pos0, ifkc_pos_slot(d), head_dim, rot_dim, theta,
                          freq_scale, il, hpb);
    IFKC_CKL(e, "rope_store_rows");
    return 0;
}

/* ---- element-wise ------------------------------------------------------------------------- */

/* g, u: [n]. */
__global__ void silu_mul_n(float *g, const float *u, size_t n)
{
    ifkc_grid_begin();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float v = g[i];
        g[i] = __fmul_rn(v / (1.0f + expf(-v)), u[i]);
    }
}

/* y, x: [n]. */
__global__ void add_n(float *y, const float *x, size_t n)
{
    ifkc_grid_begin();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

/* y: [T][ldy], n values a row; b: [n]. */
__global__ void add_bias_rows(float *y, size_t ldy, const float *b, int T, int n)
{
    ifkc_grid_begin();
    const size_t total = (size_t)T * n;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t t = idx / n, i = idx % n;
        y[t * ldy + i] += b[i];
    }
}

extern "C" int ifkc_silu_mul(ifkc_dev *d, float *g, const float *u, size_t n)
{
    if (!d || (n && (!g || !u)))
        return ifkc_seterr(IFKC_EINVAL, "silu_mul: a NULL handle or pointer");
    if (n == 0)
        return 0;
    IFKC_CKL(ifkc_launch(d, silu_mul_n, ops_blocks(n), OPS_THREADS, 0, g, u, n), "silu_mul_n");
    return 0;
}

extern "C" int ifkc_add(ifkc_dev *d, float *y, const float *x, size_t n)
{
    if (!d || (n && (!y || !x)))
        return ifkc_seterr(IFKC_EINVAL, "add: a NULL handle or pointer");
    if (n == 0)
        return 0;
    IFKC_CKL(ifkc_launch(d, add_n, ops_blocks(n), OPS_THREADS, 0, y, x, n), "add_n");
    return 0;
}

extern "C" int ifkc_add_bias(ifkc_dev *d, float *y, size_t ldy, const float *b, int T, int n)
{
    if (!d || !y || !b)
        return ifkc_seterr(IFKC_EINVAL, "add_bias: a NULL handle or pointer");
    if (T < 0 || n < 0 || (T > 1 && ldy < (size_t)n))
        return ifkc_seterr(IFKC_EINVAL, "add_bias: bad shape (T %d, n %d, stride %zu)", T, n, ldy);
    if (T == 0 || n == 0)
        return 0;
    IFKC_CKL(ifkc_launch(d, add_bias_rows, ops_blocks((size_t)T * n), OPS_THREADS, 0, y, ldy, b, T, n), "add_bias_rows");
    return 0;
}

/* ---- argmax ------------------------------------------------------------------------------- */

enum { AM_BLOCKS_MAX = 256 };

/* (bv, bi) := the better of (bv, bi) and (v, i): larger value, then lower index. */
static __device__ __forceinline__ void am_take(float &bv, int &bi, float v, int i)
{
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

/* The block's best pair into every thread's (bv, bi). */
static __device__ void am_block(float &bv, int &bi)
{
    __shared__ float sv[32];
    __shared__ int si[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        am_take(bv, bi, __shfl_xor_sync(FULL_MASK, bv, off), __shfl_xor_sync(FULL_MASK, bi, off));
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = -INFINITY;
        bi = INT32_MAX;
        if (lane < nw) {
            bv = sv[lane];
            bi = si[lane];
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            am_take(bv, bi, __shfl_xor_sync(FULL_MASK, bv, off), __shfl_xor_sync(FULL_MASK, bi, off));
        if (lane == 0) {
            sv[0] = bv;
            si[0] = bi;
        }
    }
    __syncthreads();
    bv = sv[0];
    bi = si[0];
}

/* x: [n]; part_v, part_i: [gridDim.x]. Block b covers x[b*span .. min(n, (b+1)*span)). */
__global__ void argmax_partial(float *part_v, int *part_i, const float *x, int n, int span)
{
    ifkc_grid_begin();
    const int lo = blockIdx.x * span, hi = min(n, lo + span);
    float bv = -INFINITY;
    int bi = INT32_MAX;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x)
        am_take(bv, bi, x[i], i);
    am_block(bv, bi);
    if (threadIdx.x == 0) {
        part_v[blockIdx.x] = bv;
        part_i[blockIdx.x] = bi;
    }
}

/* part_v, part_i: [nb]; res: [1], the index (0 when nothing was chosen: all NaN). */
__global__ void argmax_final(int *res, const float *part_v, const int *part_i, int nb, int n)
{
    ifkc_grid_begin();
    float bv = -INFINITY;
    int bi = INT32_MAX;
    for (int b = threadIdx.x; b < nb; b += blockDim.x)
        am_take(bv, bi, part_v[b], part_i[b]);
    am_block(bv, bi);
    if (threadIdx.x == 0)
        res[0] = bi < n ? bi : 0;
}

extern "C" int ifkc_argmax(ifkc_dev *d, int32_t *out, const float *x, int n)
{
    if (!out)
        return ifkc_seterr(IFKC_EINVAL, "argmax: a NULL handle or pointer");
    int rc = ifkc_argmax_start(d, x, n);
    return rc ? rc : ifkc_argmax_fetch(d, out);
}

extern "C" int ifkc_argmax_fetch(ifkc_dev *d, int32_t *out)
{
    if (!d || !out || !d->argmax_res)
        return ifkc_seterr(IFKC_EINVAL, "argmax: nothing was started");
    int32_t r;
    int rc = ifkc_download(d, &r, d->argmax_res, sizeof r);
    if (rc)
        return rc;
    *out = r;
    return 0;
}

extern "C" int ifkc_argmax_start(ifkc_dev *d, const float *x, int n)
{
    if (!d || !x)
        return ifkc_seterr(IFKC_EINVAL, "argmax: a NULL handle or pointer");
    if (n <= 0)
        return ifkc_seterr(IFKC_EINVAL, "argmax: %d values (at least 1)", n);
    /* Blocks of at least 4 elements a thread; at most AM_BLOCKS_MAX of them. */
    int nb = (int)ifkc_cdiv((size_t)n, (size_t)OPS_THREADS * 4);
    if (nb > AM_BLOCKS_MAX)
        nb = AM_BLOCKS_MAX;
    const int span = (int)ifkc_cdiv((size_t)n, (size_t)nb);
    void *p;
    int rc = ifkc_scratch(d, IFKC_SCRATCH_MISC, (size_t)nb * (sizeof(float) + sizeof(int)) + sizeof(int), &p);
    if (rc)
        return rc;
    float *part_v = (float *)p;
    int *part_i = (int *)(part_v + nb);
    int *res = part_i + nb;
    IFKC_CKL(ifkc_launch(d, argmax_partial, (unsigned)nb, OPS_THREADS, 0, part_v, part_i, x, n, span), "argmax_partial");
    IFKC_CKL(ifkc_launch(d, argmax_final, 1, OPS_THREADS, 0, res, part_v, part_i, nb, n), "argmax_final");
    d->argmax_res = res;
    return 0;
}
