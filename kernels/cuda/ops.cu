/*
 * ops.cu -- element-wise and per-token operations: RMS norm, RoPE, SwiGLU's silu_mul, adds,
 * argmax. Contract: cuda_kernels.h; references: ifk_rmsnorm, ifk_rope, ifk_silu_mul, ifk_add
 * (kernels/cpu/ref.c).
 *
 * Plan
 *   rmsnorm:  one block per row; each thread sums squares of a strided slice in double, the
 *             block adds the partial sums (warp shuffles, then shared memory) in double, and
 *             1 / sqrt(ss / n + eps) is rounded to float as the reference does; then
 *             y = x * inv * w in the reference's order.
 *   rope:     one thread per (token, pair); it computes the angle, cos and sin in double like
 *             the reference (rounded to float once) and rotates that pair in every head.
 *             The products are written with __fmul_rn / __fadd_rn so nvcc does not fuse them
 *             (the reference's x0*c - x1*s rounds each product).
 *   silu_mul, add, add_bias: grid-stride loops, one element per thread per step.
 *   argmax:   stage 1: block b reduces a contiguous span of x to (value, index); stage 2: one
 *             block reduces the per-block pairs; the index is copied to the host. The order
 *             is "larger value, then lower index", so ties give the lowest index; NaNs are
 *             never chosen (all NaN gives 0). Scratch: slot IFKC_SCRATCH_MISC.
 */
#include "kernels/cuda/common.cuh"

#include <math.h>
#include <stdint.h>

#include "kernels/cpu/kernels.h"

#define FULL_MASK 0xffffffffu

enum { OPS_THREADS = 256, OPS_MAX_BLOCKS = 8192 };

/* Blocks for a grid-stride loop over n elements. */
static unsigned ops_blocks(size_t n)
{
    size_t b = (n + OPS_THREADS - 1) / OPS_THREADS;
    return (unsigned)(b < 1 ? 1 : b > OPS_MAX_BLOCKS ? OPS_MAX_BLOCKS : b);
}

/* ---- rmsnorm ------------------------------------------------------------------------------ */

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it. */
static __device__ double block_sum_double(double v)
{
    __shared__ double part[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(FULL_MASK, v, off);
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nw ? part[lane] : 0.0;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            v += __shfl_xor_sync(FULL_MASK, v, off);
        if (lane == 0)
            part[0] = v;
    }
    __syncthreads();
    return part[0];
}

/* y, x: [T][n] (one block per row; y may equal x); w: [n]. */
__global__ void rmsnorm_rows(float *y, const float *x, const float *w, int n, float eps)
{
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

extern "C" int ifkc_rmsnorm(ifkc_dev *d, float *y, const float *x, const float *w, int T, int n, float eps)
{
    if (!d || !y || !x || !w)
        return ifkc_seterr(IFKC_EINVAL, "rmsnorm: a NULL handle or pointer");
    if (T < 0 || n < 0)
        return ifkc_seterr(IFKC_EINVAL, "rmsnorm: bad shape (T %d, n %d)", T, n);
    if (T == 0 || n == 0)
        return 0;
    rmsnorm_rows<<<(unsigned)T, OPS_THREADS, 0, d->stream>>>(y, x, w, n, eps);
    IFKC_CKL("rmsnorm_rows");
    return 0;
}

/* ---- rope --------------------------------------------------------------------------------- */

/* x: [T][ld], token t holding n_heads heads of head_dim from x + t*ld; fs: [rot_dim/2] or NULL.
 * One thread per (token, pair i < rot_dim/2). */
__global__ void rope_pairs(float *x, size_t ld, int T, int n_heads, int head_dim, int rot_dim, int pos0,
                           float theta, const float *fs, int interleaved)
{
    const int half = rot_dim / 2;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * half)
        return;
    const int t = (int)(idx / half), i = (int)(idx % half);
    float c, s;
    int ia, ib;
    ifkc_rope_pair((double)(pos0 + t), i, rot_dim, theta, fs, interleaved, &c, &s, &ia, &ib);
    float *xt = x + (size_t)t * ld;
    for (int h = 0; h < n_heads; h++) {
        float *xh = xt + (size_t)h * head_dim;
        ifkc_rotate(xh[ia], xh[ib], c, s, &xh[ia], &xh[ib]);
    }
}

extern "C" int ifkc_rope(ifkc_dev *d, float *x, size_t ld, int T, int n_heads, int head_dim, int rot_dim, int pos0,
                         float theta, const float *freq_scale, int layout)
{
    if (!d || !x)
        return ifkc_seterr(IFKC_EINVAL, "rope: a NULL handle or pointer");
    if (layout != IFK_ROPE_HALF && layout != IFK_ROPE_INTERLEAVED)
        return ifkc_seterr(IFKC_EINVAL, "rope: unknown layout %d", layout);
    if (T < 0 || n_heads < 0 || head_dim < 0 || rot_dim < 0 || pos0 < 0 || (long long)pos0 + T > INT32_MAX ||
        (T > 1 && ld < (size_t)n_heads * head_dim))
        return ifkc_seterr(IFKC_EINVAL, "rope: bad shape (T %d, %d heads of %d, rot_dim %d, position %d, stride %zu)",
                           T, n_heads, head_dim, rot_dim, pos0, ld);
    if (rot_dim > head_dim)
        rot_dim = head_dim;
    const size_t n = (size_t)T * (rot_dim / 2);
    if (n == 0 || n_heads == 0)
        return 0;
    rope_pairs<<<ifkc_cdiv(n, OPS_THREADS), OPS_THREADS, 0, d->stream>>>(x, ld, T, n_heads, head_dim, rot_dim, pos0,
                                                                         theta, freq_scale,
                                                                         layout == IFK_ROPE_INTERLEAVED);
    IFKC_CKL("rope_pairs");
    return 0;
}

/* ---- element-wise ------------------------------------------------------------------------- */

/* g, u: [n]. */
__global__ void silu_mul_n(float *g, const float *u, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float v = g[i];
        g[i] = __fmul_rn(v / (1.0f + expf(-v)), u[i]);
    }
}

/* y, x: [n]. */
__global__ void add_n(float *y, const float *x, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

/* y: [T][ldy], n values a row; b: [n]. */
__global__ void add_bias_rows(float *y, size_t ldy, const float *b, int T, int n)
{
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
    silu_mul_n<<<ops_blocks(n), OPS_THREADS, 0, d->stream>>>(g, u, n);
    IFKC_CKL("silu_mul_n");
    return 0;
}

extern "C" int ifkc_add(ifkc_dev *d, float *y, const float *x, size_t n)
{
    if (!d || (n && (!y || !x)))
        return ifkc_seterr(IFKC_EINVAL, "add: a NULL handle or pointer");
    if (n == 0)
        return 0;
    add_n<<<ops_blocks(n), OPS_THREADS, 0, d->stream>>>(y, x, n);
    IFKC_CKL("add_n");
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
    add_bias_rows<<<ops_blocks((size_t)T * n), OPS_THREADS, 0, d->stream>>>(y, ldy, b, T, n);
    IFKC_CKL("add_bias_rows");
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
    argmax_partial<<<(unsigned)nb, OPS_THREADS, 0, d->stream>>>(part_v, part_i, x, n, span);
    IFKC_CKL("argmax_partial");
    argmax_final<<<1, OPS_THREADS, 0, d->stream>>>(res, part_v, part_i, nb, n);
    IFKC_CKL("argmax_final");
    d->argmax_res = res;
    return 0;
}
