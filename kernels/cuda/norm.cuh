/*
 * norm.cuh -- the RMS norm of one row by one block, for ops.cu's norm kernels and qtiled.cu's
 * norm that also rounds its output to int8 (the same code, so the same bits). Internal to
 * kernels/cuda.
 */
#ifndef IFKC_NORM_CUH
#define IFKC_NORM_CUH

#include "kernels/cuda/common.cuh"

#define FULL_MASK 0xffffffffu

enum { RMS_THREADS = 512, RMS_PT_MAX = 16 };

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


/* Row blockIdx.x of y = rmsnorm(x) * w for rows of at most blockDim.x * PT values (blockDim.x <=
 * RMS_THREADS), each thread holding its PT values of x and w in registers, all loaded before anything is stored (so one wait for memory, not one a
 * value: y may alias x, which keeps the compiler from reordering loads past stores). With r:
 * x += r first (stored back to x: the residual add, ifk_add's rounding), then the norm of the
 * sum into y; r may equal y. */
template <int PT>
static __device__ __forceinline__ void norm_row_reg(float *y, float *x, const float *r, const float *w, int n, float eps)
{
    float *xr = x + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    const float *rr = r ? r + (size_t)blockIdx.x * n : NULL;
    float xv[PT], wv[PT];
#pragma unroll
    for (int k = 0; k < PT; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        xv[k] = i < n ? xr[i] : 0.0f;
        wv[k] = i < n ? w[i] : 0.0f;
        if (rr && i < n)
            xv[k] = __fadd_rn(xv[k], rr[i]);
    }
    double ss = 0.0;
#pragma unroll
    for (int k = 0; k < PT; k++)
        ss += (double)xv[k] * (double)xv[k];
    ss = block_sum_double(ss); /* every thread's loads are done past its barriers */
    const float inv = (float)(1.0 / sqrt(ss / n + (double)eps));
#pragma unroll
    for (int k = 0; k < PT; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < n) {
            if (rr)
                xr[i] = xv[k];
            yr[i] = __fmul_rn(__fmul_rn(xv[k], inv), wv[k]);
        }
    }
}

#endif
